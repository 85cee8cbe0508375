"""The subcommands of ``python -m lightning_pfd`` (the ``lightning-pfd`` console script), one
module each, and what they share.

- ``fit`` (and LightningCLI's ``validate``, ``test``, ``predict``): :mod:`lightning_pfd.commands.fit`
  (LightningCLI and the validation phase before anything is written);
- ``report``: :mod:`lightning_pfd.commands.report` (the report of a run, or of a sweep directory);
- ``icr-sweep``: :mod:`lightning_pfd.commands.icr_sweep` (ICR and a linear probe over sigma);
- ``pite``: :mod:`lightning_pfd.commands.pite` (the SBM vs LIM tail-metric table);
- ``sweep``: :mod:`lightning_pfd.commands.sweep` (a grid of fits on Ray Tune).

A command is a module with ``main(argv) -> int`` (the exit status); a new one is one module plus
one :class:`Command` line in :data:`COMMANDS`. Shared by all of them:

* **errors** (:func:`run_guarded`): an expected user error, a
  :class:`~lightning_pfd.errors.ConfigError`, is printed as one short block on stderr and the
  exit status is 2; ``--debug`` (anywhere on the command line) or ``LIGHTNING_PFD_DEBUG=1``
  re-raises it with its traceback (``report`` prints the bare one-line block, without the
  program name and the hint, as its documented output). Option errors come from
  :class:`~lightning_pfd.errors.ShortErrorParser` (one block, status 2, "did you mean"), and an
  option's range is its argparse type (:func:`typed`, from the restricted types of
  :mod:`lightning_pfd.validation`), shown by ``--help``;
* **threads** (:func:`configure_threads`): ``--threads N|auto`` (or ``LIGHTNING_PFD_THREADS``) is
  taken off the command line and, for a command that computes on this process's CPU
  (:attr:`Command.threaded`), the choice of :mod:`lightning_pfd.threads` is applied and printed
  as the run's first line.

Nothing here imports Lightning or torch: ``report`` starts without them.
"""
from __future__ import annotations

import contextvars
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["Command", "COMMANDS", "LIGHTNING_SUBCOMMANDS", "PROG", "CONFIG_DIR", "DEFAULT_CONFIG",
           "USER_ERROR", "main", "command_for", "run_guarded", "print_user_error", "debug_enabled",
           "pop_flag", "configure_threads", "print_extra_help", "print_main_help", "quiet_known_noise",
           "typed"]

PROG = "python -m lightning_pfd"
#: the embedded configs (``--config quickstart`` names ``CONFIG_DIR / "quickstart.yaml"``)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
#: the config a bare ``python -m lightning_pfd`` / ``fit`` without ``--config`` runs
DEFAULT_CONFIG = CONFIG_DIR / "quickstart.yaml"
#: the exit status of a user error (argparse's)
USER_ERROR = 2
#: LightningCLI's own subcommands: all handled by :mod:`lightning_pfd.commands.fit`
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
DEBUG_ENV = "LIGHTNING_PFD_DEBUG"

_DEBUG = contextvars.ContextVar("lightning_pfd_debug", default=False)


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, the module whose ``main(argv) -> int`` runs it, the help line,
    and whether it computes on this process's CPU threads (``--threads`` applies)."""

    name: str
    module: str
    help: str
    threaded: bool = False

    @property
    def prog(self) -> str:
        return f"{PROG} {self.name}"

    def main(self) -> Callable[[Sequence[str]], int]:
        return getattr(importlib.import_module(self.module), "main")


#: the registry: name -> :class:`Command` (``fit`` stands for LightningCLI's subcommands too)
COMMANDS = {c.name: c for c in (
    Command("fit", "lightning_pfd.commands.fit",
            "train (LightningCLI; also validate, test, predict)", threaded=True),
    Command("report", "lightning_pfd.commands.report",
            "figures + markdown summary of a run (or of a sweep directory)"),
    Command("icr-sweep", "lightning_pfd.commands.icr_sweep",
            "ICR and linear probe over a sigma grid", threaded=True),
    Command("pite", "lightning_pfd.commands.pite",
            "SBM vs LIM tail comparison (PITE table)", threaded=True),
    Command("sweep", "lightning_pfd.commands.sweep",
            "grid of fit runs on Ray Tune (N x model size x seeds)"),
)}


def typed(annotation) -> Callable[[str], Any]:
    """An argparse ``type=`` for an option whose values are declared by a restricted number type
    of :mod:`lightning_pfd.validation` (``typed(PositiveInt)``): argparse refuses a value outside
    it naming the option, the value and the range in words (``--batch-size: must be an integer
    > 0; got '0'``, exit status 2). The value is returned as a plain ``int``/``float``; the range
    in words is the function's ``words`` (for the option's help)."""
    import argparse

    from ..validation import describe

    base = int if issubclass(annotation, int) else float
    words = describe(annotation)

    def convert(text: str):
        try:
            value = base(text)
            annotation(value)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {words}; got {text!r}") from None
        return value

    convert.__name__ = convert.words = words
    return convert


def command_for(argv: Sequence[str]) -> Command:
    """The command ``argv`` runs: a registered name, else ``fit`` (LightningCLI parses the rest:
    its subcommands, ``--help``, or nothing at all, which runs the quickstart)."""
    return COMMANDS.get(argv[0] if argv else "fit", COMMANDS["fit"])


# ----------------------------------------------------------------------------- errors
def debug_enabled(argv: Sequence[str] = ()) -> bool:
    """``--debug`` in ``argv``, given to the dispatcher, or ``LIGHTNING_PFD_DEBUG`` set (not 0)."""
    return "--debug" in argv or _DEBUG.get() or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def pop_flag(argv: list, flag: str) -> bool:
    """Remove every ``flag`` from ``argv``; True when there was one."""
    found = flag in argv
    while flag in argv:
        argv.remove(flag)
    return found


def print_user_error(err: BaseException, prog: Optional[str] = PROG, hint: bool = True) -> int:
    """Print an expected user error as one short block on stderr; return :data:`USER_ERROR`.

    The block is ``"<prog>: error: <field>: <problem>"`` with the bad value, what is accepted and
    a suggestion on the following lines (:meth:`ConfigError.block`); ``prog`` None leaves the
    prefix out, ``hint`` adds the line saying how to see the traceback."""
    from ..errors import ConfigError

    text = err.block() if isinstance(err, ConfigError) else f"error: {err}"
    if prog:
        text = f"{prog}: {text}"
    if hint:
        text += f"\n(run with --debug or {DEBUG_ENV}=1 for the traceback)"
    print(text, file=sys.stderr, flush=True)
    return USER_ERROR


def run_guarded(body: Callable[[list], Optional[int]], argv: Optional[Sequence[str]] = None,
                prog: Optional[str] = PROG, hint: bool = True) -> int:
    """``body(argv)`` (``--debug`` removed; ``argv`` None: ``sys.argv[1:]``) as an exit status:
    a :class:`~lightning_pfd.errors.ConfigError` is printed by :func:`print_user_error` (status 2),
    or re-raised with its traceback under ``--debug`` / ``LIGHTNING_PFD_DEBUG``; an option
    refused by the command's parser (printed by it) is status 2 too. Every command's ``main``
    runs its body through this."""
    from ..errors import ConfigError, UsageExit

    args = list(sys.argv[1:] if argv is None else argv)
    debug = debug_enabled(args)
    pop_flag(args, "--debug")
    token = _DEBUG.set(debug)  # a nested command (the dispatcher's) sees it
    try:
        return int(body(args) or 0)
    except ConfigError as err:
        if debug:
            raise
        return print_user_error(err, prog, hint)
    except UsageExit as err:
        return int(err.code)
    finally:
        _DEBUG.reset(token)


# ----------------------------------------------------------------------------- threads
def configure_threads(argv: list) -> None:
    """Pop ``--threads`` and, for a computing command, set the CPU threads (one printed line:
    :meth:`lightning_pfd.threads.ThreadChoice.line`). ``--help`` computes nothing."""
    from ..threads import apply_threads, pop_threads_arg

    value = pop_threads_arg(argv)
    name = argv[0] if argv else "fit"
    threaded = name in LIGHTNING_SUBCOMMANDS or (name in COMMANDS and COMMANDS[name].threaded)
    if threaded and not any(a in ("-h", "--help") for a in argv):
        apply_threads(value, announce=os.environ.get("LOCAL_RANK", "0") == "0")


# ----------------------------------------------------------------------------- dispatch
def print_extra_help() -> None:
    """The options of lightning_pfd itself, the commands beside LightningCLI's and the embedded
    configs (after ``--help``)."""
    from ..errors import COMMON_OPTIONS_HELP

    print("\n" + COMMON_OPTIONS_HELP)
    print("  --overwrite           fit: start a fresh run in a checkpoint directory that holds an "
          "earlier run's\n                        checkpoints (moved to <dirpath>/overwritten-<time>/)")
    print("  --allow-data-change   fit --ckpt_path: continue on data that differ from the "
          "checkpoint's\n                        (a datamodule value or file; refused without it)")
    print("  --run_dir PATH        fit: every output of the run (logs, checkpoints, per-unit records, "
          "report,\n                        W&B run name) in PATH")
    print("\nExtra commands:")
    for c in COMMANDS.values():
        if c.name != "fit":
            print(f"  {c.name:<10} {c.help}  ({c.prog} --help)")
    print(f"\nEmbedded configs ({CONFIG_DIR}): "
          + ", ".join(sorted(q.stem for q in CONFIG_DIR.glob('*.yaml'))))


#: known start-up messages a user cannot act on: (logger or warning category, message start)
_NOISE_LOG = ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging")
_NOISE_WARNINGS = (
    (r".*isinstance\(treespec, LeafSpec\)` is deprecated.*", None),
    # ModelCheckpoint on the run lock (locks.py) in its directory; an earlier run's checkpoints
    # there are refused (or replaced with --overwrite) before Lightning looks
    (r"Checkpoint directory .* exists and is not empty\.$", "lightning.pytorch.callbacks.model_checkpoint"),
)


#: Lightning's CSV writer, started in a resumed run's own version directory, warns that "Previous
#: log files in this directory will be deleted": untrue on ``fit --ckpt_path``, where
#: :func:`lightning_pfd.callbacks.checkpoint.continue_loggers` moves ``metrics.csv`` aside before
#: the writer starts and writes its rows back (the resume keeps every row up to the checkpoint).
#: Ignored by that exact message around that call only (a fresh run into an existing version
#: directory, where the files are replaced, still shows it).
RESUMED_CSV_WARNING = (r"Experiment logs directory .* exists and is not empty\. Previous log files in "
                       r"this directory will be deleted when the new ones are saved!")


class _DropMessage:
    """A logging filter dropping records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not str(record.getMessage()).startswith(self.prefix)


def quiet_known_noise() -> None:
    """Silence, by exact message, what the libraries print at start-up that a user cannot act on:
    Lightning's advertisement for its cloud logger (an INFO record of its rank-zero logger),
    torch's pytree ``LeafSpec`` deprecation raised inside Lightning, and ModelCheckpoint's
    "directory exists and is not empty", which the run lock's file in that directory would raise
    on every fresh run (an earlier run's checkpoints there are refused by ``fit`` before, unless
    ``--overwrite``). Every other message and warning is left as it is (idempotent)."""
    import logging
    import warnings

    logger = logging.getLogger(_NOISE_LOG[0])
    if not any(isinstance(f, _DropMessage) for f in logger.filters):
        logger.addFilter(_DropMessage(_NOISE_LOG[1]))
    for pattern, module in _NOISE_WARNINGS:
        if module is None:
            warnings.filterwarnings("ignore", message=pattern)
        else:
            warnings.filterwarnings("ignore", message=pattern, module=module)


#: LightningCLI's subcommands and their help lines (the top-level ``--help``, without Lightning)
_LIGHTNING_HELP = {
    "fit": "train: the full optimization routine (default config: quickstart)",
    "validate": "one evaluation epoch over the validation set (a config and a checkpoint)",
    "test": "one evaluation epoch over the test set (a config and a checkpoint)",
    "predict": "inference on the predict set (a config and a checkpoint)",
}


def print_main_help() -> None:
    """``python -m lightning_pfd --help``: the commands and the common options, printed without
    importing Lightning or torch (a subcommand's own ``--help`` lists its options: ``fit --help``
    is LightningCLI's, which needs Lightning)."""
    names = ",".join([*LIGHTNING_SUBCOMMANDS, *(c for c in COMMANDS if c != "fit")])
    print(f"usage: {PROG} [{{{names}}}] ...\n\n"
          "Train and measure diffusion models (PFD, ICR, memorization ratio, tail metrics). With no\n"
          "command: fit on the embedded quickstart config. For a command's options, add it followed\n"
          "by --help.\n\nLightningCLI subcommands:")
    for name, text in _LIGHTNING_HELP.items():
        print(f"  {name:<10} {text}  ({PROG} {name} --help)")
    print_extra_help()


def _dispatch(argv: list) -> int:
    quiet_known_noise()
    configure_threads(argv)
    if argv in (["-h"], ["--help"]):  # the top-level help: no LightningCLI, so no Lightning import
        print_main_help()
        return 0
    command = command_for(argv)
    rest = argv if command.name == "fit" else argv[1:]  # LightningCLI wants its subcommand
    return int(command.main()(rest) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lightning_pfd [COMMAND] [ARGS]``: the threads, then the command's ``main``;
    returns the exit status (with no arguments: ``fit`` on the embedded quickstart config)."""
    return run_guarded(_dispatch, argv, PROG)
