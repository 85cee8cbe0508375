"""The subcommands of ``python -m lightning_pfd`` (the ``lightning-pfd`` console script), one
module each, and what they share.

- ``fit`` (and LightningCLI's ``validate``, ``test``, ``predict``): :mod:`lightning_pfd.commands.fit`
  (around :mod:`lightning_pfd.launch.cli`: LightningCLI and the validation phase before anything
  is written);
- ``report``: :mod:`lightning_pfd.commands.report` (the report of a run, or of a sweep directory);
- ``icr-sweep``: :mod:`lightning_pfd.commands.icr_sweep` (ICR and a linear probe over sigma);
- ``pite``: :mod:`lightning_pfd.commands.pite` (the SBM vs LIM tail-metric table);
- ``sweep``: :mod:`lightning_pfd.commands.sweep` (a grid of fits on Ray Tune).

A command is a module with ``main(argv) -> int`` (the exit status); a new one is one module plus
one :class:`Command` line in :data:`COMMANDS`. Shared by all of them:

* **errors** (:func:`lightning_pfd.launch.run_guarded`, the launch layer below the commands and
  the sweeps): an expected user error, a :class:`~lightning_pfd.errors.ConfigError`, is printed
  as one short block on stderr and the exit status is 2; ``--debug`` (anywhere on the command
  line) or ``LIGHTNING_PFD_DEBUG=1`` re-raises it with its traceback (``report`` prints the bare
  one-line block, without the program name and the hint, as its documented output). Option
  errors come from :class:`~lightning_pfd.errors.ShortErrorParser` (one block, status 2, "did
  you mean"), and an option's range is its argparse type (:func:`typed`, from the restricted types of
  :mod:`lightning_pfd.validation`), shown by ``--help``;
* **threads** (:func:`configure_threads`): ``--threads N|auto`` (or ``LIGHTNING_PFD_THREADS``) is
  taken off the command line and, for a command that computes on this process's CPU
  (:attr:`Command.threaded`), the choice of :mod:`lightning_pfd.threads` is applied and printed
  as the run's first line.

Nothing here imports Lightning or torch: ``report`` starts without them.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..launch import CONFIG_DIR, LIGHTNING_SUBCOMMANDS, PROG, quiet_known_noise, run_guarded

__all__ = ["Command", "COMMANDS", "main", "command_for", "configure_threads", "print_extra_help",
           "print_main_help", "typed"]


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
    print("  --allow-optimizer-change  fit --ckpt_path: another optimizer or LR-schedule class than "
          "the checkpoint's,\n                        from its weights with a fresh optimizer state "
          "(refused without it)")
    print("  --run_dir PATH        fit: every output of the run (logs, checkpoints, per-unit records, "
          "report,\n                        W&B run name) in PATH")
    print("\nExtra commands:")
    for c in COMMANDS.values():
        if c.name != "fit":
            print(f"  {c.name:<10} {c.help}  ({c.prog} --help)")
    print(f"\nEmbedded configs ({CONFIG_DIR}): "
          + ", ".join(sorted(q.stem for q in CONFIG_DIR.glob('*.yaml'))))


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
