"""The launch layer: what every command and the sweep runner share to start a run, below both
``commands`` and ``sweeps`` (they import it, never each other's internals).

- the program's names and places (:data:`PROG`, :data:`CONFIG_DIR`, :data:`DEFAULT_CONFIG`,
  :data:`LIGHTNING_SUBCOMMANDS`);
- **errors** (:func:`run_guarded`): an expected user error, a
  :class:`~lightning_pfd.errors.ConfigError`, is printed as one short block on stderr and the
  exit status is 2; ``--debug`` (anywhere on the command line) or ``LIGHTNING_PFD_DEBUG=1``
  re-raises it with its traceback;
- the LightningCLI with its validation phase before anything is written (:mod:`.cli`), the
  fit pre-flight and component checks (:mod:`.run_checks`, :mod:`.run_safety`), one folder per
  run (:mod:`.run_dir`), signals (:mod:`.interrupts`) and ``fit --help`` (:mod:`.fit_help`).

Nothing in this ``__init__`` imports Lightning or torch: ``report`` starts without them.
"""
from __future__ import annotations

import contextvars
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["LIGHTNING_SUBCOMMANDS", "PROG", "CONFIG_DIR", "DEFAULT_CONFIG", "USER_ERROR", "DEBUG_ENV",
           "run_guarded", "print_user_error", "debug_enabled", "pop_flag", "quiet_known_noise",
           "RESUMED_CSV_WARNING"]

PROG = "python -m lightning_pfd"
#: the embedded configs (``--config quickstart`` names ``CONFIG_DIR / "quickstart.yaml"``)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
#: the config a bare ``python -m lightning_pfd`` / ``fit`` without ``--config`` runs
DEFAULT_CONFIG = CONFIG_DIR / "quickstart.yaml"
#: the exit status of a user error (argparse's)
USER_ERROR = 2
#: LightningCLI's own subcommands: all handled by :mod:`lightning_pfd.launch.cli`
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
DEBUG_ENV = "LIGHTNING_PFD_DEBUG"

_DEBUG = contextvars.ContextVar("lightning_pfd_debug", default=False)


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
