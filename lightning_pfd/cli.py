"""`python -m lightning_pfd fit|validate|test|... --config X.yaml` and the extra commands.

LightningCLI drives training; ``report``, ``icr-sweep`` and ``pite`` are dispatched to their own
``main(argv) -> int`` functions. With no arguments the embedded ``configs/quickstart.yaml`` runs.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "quickstart.yaml"
PROG = "python -m lightning_pfd"

EXTRA_COMMANDS = {
    "report": ("lightning_pfd.analysis.report", "main", "figures + markdown summary of a run"),
    "icr-sweep": ("lightning_pfd.callbacks.icr_sweep", "main", "ICR and linear probe over a sigma grid"),
    "pite": ("lightning_pfd.experiments_cli", "main", "SBM vs LIM tail comparison (PITE table)"),
    "sweep": ("lightning_pfd.sweeps.command", "main", "grid of fit runs on Ray Tune (N x model size x seeds)"),
}


def wandb_has_credentials() -> bool:
    """True when W&B could log online (``callbacks.wandb_setup.has_wandb_credentials``)."""
    from .callbacks.wandb_setup import has_wandb_credentials  # lazy: `report` needs no Lightning
    return has_wandb_credentials()


def ensure_wandb_mode() -> str:
    """Switch W&B to offline mode when no credentials exist (unless WANDB_MODE is set)."""
    if "WANDB_MODE" not in os.environ and not wandb_has_credentials():
        os.environ["WANDB_MODE"] = "offline"
    return os.environ.get("WANDB_MODE", "online")


def resolve_config_path(value: str) -> str:
    """Accept a path, or the bare name of an embedded config (``quickstart`` / ``quickstart.yaml``)."""
    p = Path(value)
    if p.exists():
        return value
    for cand in (CONFIG_DIR / value, CONFIG_DIR / f"{value}.yaml"):
        if cand.exists():
            return str(cand)
    from .errors import ConfigError

    embedded = sorted(q.stem for q in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError("--config", "no such file, and not the name of an embedded config",
                      value=value, accepted=embedded)


def _rewrite_configs(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = resolve_config_path(out[i + 1])
        elif a.startswith("--config="):
            out[i] = "--config=" + resolve_config_path(a.split("=", 1)[1])
    return out


def _needs_default_config(argv: list[str]) -> bool:
    """A subcommand given without --config and without choosing model/data classes."""
    if argv[0] not in ("fit", "validate", "test", "predict"):
        return False
    rest = argv[1:]
    if any(a in ("-h", "--help") for a in rest):
        return False
    chosen = ("--config", "-c", "--model", "--data")
    return not any(a in chosen or a.startswith(tuple(c + "=" for c in chosen)) for a in rest)


def _print_extra_help() -> None:
    print("\nExtra commands:")
    for name, (_, _, text) in EXTRA_COMMANDS.items():
        print(f"  {name:<10} {text}  ({PROG} {name} --help)")
    print(f"\nEmbedded configs ({CONFIG_DIR}): "
          + ", ".join(sorted(q.stem for q in CONFIG_DIR.glob('*.yaml'))))


def run_lightning_cli(argv: Sequence[str], overwrite: bool = False):
    from .lightning_cli import PFDLightningCLI

    ensure_wandb_mode()
    saved = sys.argv
    sys.argv = [PROG] + list(argv)  # LightningCLI warns when both sys.argv and args are given
    try:
        return PFDLightningCLI(args=None, overwrite=overwrite)
    finally:
        sys.argv = saved


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--key -1e-3`` → ``--key=-1e-3``: argparse takes a token that starts with '-' and is not a
    plain integer/decimal (``-1e-3``) for an option and fails with "expected one argument"."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if a.startswith("--") and "=" not in a and nxt is not None and nxt.startswith("-") \
                and _is_number(nxt):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def debug_enabled(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("LIGHTNING_PFD_DEBUG", "") not in ("", "0")


def _pop_flag(argv: list[str], flag: str) -> bool:
    found = flag in argv
    while flag in argv:
        argv.remove(flag)
    return found


def report_user_error(err: BaseException) -> int:
    """Print an expected user error as one short block on stderr; return the exit status 2."""
    from .errors import ConfigError

    text = err.block() if isinstance(err, ConfigError) else f"error: {err}"
    print(f"{PROG}: {text}\n(run with --debug or LIGHTNING_PFD_DEBUG=1 for the traceback)",
          file=sys.stderr, flush=True)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .errors import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_enabled(argv)
    _pop_flag(argv, "--debug")
    try:
        return _main(argv)
    except ConfigError as err:
        if debug:
            raise
        return report_user_error(err)


#: commands that compute on this process's CPU threads (``--threads`` applies to them)
THREADED_COMMANDS = ("fit", "validate", "test", "predict", "icr-sweep", "pite")


def _configure_threads(argv: list[str]) -> None:
    """Pop ``--threads`` and, for a computing command, set the CPU threads (one printed line)."""
    from .threads import apply_threads, pop_threads_arg

    value = pop_threads_arg(argv)
    command = argv[0] if argv else "fit"
    if command in THREADED_COMMANDS and not any(a in ("-h", "--help") for a in argv):
        apply_threads(value, announce=os.environ.get("LOCAL_RANK", "0") == "0")


def _main(argv: list[str]) -> int:
    _configure_threads(argv)
    if argv and argv[0] in EXTRA_COMMANDS:
        module, fn, _ = EXTRA_COMMANDS[argv[0]]
        return int(getattr(importlib.import_module(module), fn)(argv[1:]) or 0)
    overwrite = _pop_flag(argv, "--overwrite")
    if not argv:
        argv = ["fit"]
    if _needs_default_config(argv):
        argv = [argv[0], "--config", str(DEFAULT_CONFIG), *argv[1:]]
        print(f"[lightning_pfd] no --config: using the embedded quickstart ({DEFAULT_CONFIG})")
    try:
        run_lightning_cli(join_negative_values(_rewrite_configs(argv)), overwrite=overwrite)
    finally:
        if argv[0] in ("-h", "--help"):
            _print_extra_help()
    return 0
