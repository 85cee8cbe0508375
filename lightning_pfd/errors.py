"""Expected user errors: one short block a person reads, never a traceback.

:class:`ConfigError` is raised for a bad value a user typed (a config field, a command-line
option, a file): it names the field, the bad value, what is accepted and, where a name is
close to an accepted one, a "did you mean" suggestion. Every command of the command line
(:func:`lightning_pfd.launch.run_guarded`) prints it as one block and exits with status 2; the
traceback is shown only with ``--debug`` or ``LIGHTNING_PFD_DEBUG=1``.

A class names its own argument only (``lr``, ``tap``; ``model.<arg>`` / ``data.<arg>`` for an
argument it read from the model or the datamodule). Where that argument sits in a config is added
in one place, the command line (:func:`lightning_pfd.launch.paths.config_path`:
``model.init_args.lr``, ``trainer.callbacks[ICRMonitor].tap``); a command with its own flags maps
an argument to its flag at its boundary with :func:`renamed_fields` (``num_samples`` ->
``--num-samples``).

It subclasses ``ValueError`` so Python callers that catch ``ValueError`` keep working.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import re
import sys
from typing import Any, Iterable, Iterator, Mapping, Optional

__all__ = ["ConfigError", "MissingFileError", "did_you_mean", "check_choice", "renamed_fields",
           "ShortErrorParser", "UsageExit"]

_UNSET = object()


def did_you_mean(value: Any, choices: Iterable[Any]) -> Optional[str]:
    """The accepted name closest to ``value`` (difflib ratio >= 0.6), or None."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest_option(typed: str, options: Iterable[str]) -> Optional[str]:
    """The option a mistyped one most likely means: one it abbreviates, else the closest."""
    options = sorted(str(o) for o in options)
    prefixed = [o for o in options if o.startswith(typed) and o != typed]
    return prefixed[0] if prefixed else did_you_mean(typed, options)


class ConfigError(ValueError):
    """A user error with its field, bad value, accepted values and a suggestion.

    Args:
        field: what is refused: a class's own argument (``lr``, ``tap``), ``model.<arg>`` /
            ``data.<arg>`` for an argument of the model / datamodule that a class read, or
            where the user set it (``--ckpt``, ``trainer.max_epochs``); the LightningCLI turns
            the first two into the config path (``model.init_args.lr``,
            ``trainer.callbacks[ICRMonitor].tap``).
        problem: what is wrong, in a short sentence.
        value: the bad value (omitted when there is none, e.g. a missing file).
        accepted: what is accepted (a list of names, or a sentence such as "a number > 0").
        suggestion: how to fix it; when omitted and ``accepted`` is a list, a close name is
            suggested automatically ("did you mean ...").
    """

    def __init__(self, field: str, problem: str, value: Any = _UNSET, accepted: Any = None,
                 suggestion: Optional[str] = None):
        self.field, self.problem, self.accepted = field, problem, accepted
        self.value = None if value is _UNSET else value
        self.has_value = value is not _UNSET
        if suggestion is None and isinstance(accepted, (list, tuple, set, frozenset)) \
                and self.has_value:
            close = did_you_mean(value, accepted)
            if close is not None and close != str(value):
                suggestion = f"did you mean {close!r}?"
        self.suggestion = suggestion
        super().__init__(self.one_line())

    def renamed(self, field: str) -> "ConfigError":
        """This error, in place, under the name its user typed (its class, value, accepted values,
        suggestion and traceback kept): a class names its argument, a caller knows where it sits."""
        kw = dict(accepted=self.accepted, suggestion=self.suggestion)
        if self.has_value:
            kw["value"] = self.value
        ConfigError.__init__(self, field, self.problem, **kw)
        return self

    def one_line(self) -> str:
        parts = [f"{self.field}: {self.problem}"]
        if self.has_value:
            parts.append(f"got {self.value!r}")
        if self.accepted is not None:
            acc = list(self.accepted) if isinstance(self.accepted, (set, frozenset)) else self.accepted
            parts.append(f"accepted: {acc}")
        if self.suggestion:
            parts.append(self.suggestion)
        return "; ".join(parts)

    def block(self) -> str:
        """The multi-line form printed by the command line."""
        lines = [f"error: {self.field}: {self.problem}"]
        if self.has_value:
            lines.append(f"  value:    {self.value!r}")
        if self.accepted is not None:
            acc = sorted(map(str, self.accepted)) if isinstance(self.accepted, (set, frozenset)) \
                else self.accepted
            lines.append(f"  accepted: {acc}")
        if self.suggestion:
            lines.append(f"  hint:     {self.suggestion}")
        return "\n".join(lines)


class MissingFileError(ConfigError, FileNotFoundError):
    """A file the user named does not exist: a ConfigError that is also a FileNotFoundError."""

    def __init__(self, field: str, path: Any, expected: str = "", suggestion: Optional[str] = None):
        problem = "no such file" + (f" (expected {expected})" if expected else "")
        ConfigError.__init__(self, field, problem, value=str(path), suggestion=suggestion)


def check_choice(field: str, value: Any, accepted: Iterable[Any]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``accepted``."""
    accepted = list(accepted)
    if value not in accepted:
        raise ConfigError(field, "unknown value", value=value, accepted=accepted)


@contextlib.contextmanager
def renamed_fields(names: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a :class:`ConfigError` from the block under the name its user typed:
    ``names`` maps an argument to it (``{"num_samples": "--num-samples"}``); an error about any
    other field passes unchanged. For a command that knows its flags (``--tap`` for the ``tap``
    its evaluation refuses); a config path is added by the LightningCLI, not here."""
    if not isinstance(names, Mapping):
        raise TypeError(f"renamed_fields takes a mapping {{argument: name typed}}, got {names!r}")
    table = dict(names)
    try:
        yield
    except ConfigError as e:
        if e.field not in table:
            raise
        raise e.renamed(table[e.field]) from e.__cause__


#: the options every command takes (removed from the command line before a command parses it)
COMMON_OPTIONS_HELP = """options of every command (anywhere on the command line):
  --debug               show the traceback of an error (also LIGHTNING_PFD_DEBUG=1)
  --threads N|auto      CPU threads of a computing command (fit, icr-sweep, pite; also
                        LIGHTNING_PFD_THREADS); auto: the usable cores minus busy ones"""


class UsageExit(SystemExit):
    """The exit (status 2) of a :class:`ShortErrorParser` refusing the command line, after its
    block is printed: a command's ``main`` returns the status instead of exiting."""


class ShortErrorParser(argparse.ArgumentParser):
    """``argparse`` parser for the extra commands: an error is one short block (no usage dump),
    options are never abbreviated, and the exit status is 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("epilog", COMMON_OPTIONS_HELP)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D102 - argparse's hook
        message = re.sub(r"^argument (-[^:/ ]+)(?:/\S+)?: ", r"\1: ", message)  # like a ConfigError
        hint = ""
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            close = suggest_option(m.group(1).split("=", 1)[0], self._option_string_actions.keys())
            hint = f"  hint: did you mean {close}? (options are never abbreviated)\n" if close else ""
        sys.stderr.write(f"{self.prog}: error: {message}\n{hint}  (options: {self.prog} --help)\n")
        raise UsageExit(2)
