"""Entry point of ``python -m lightning_pfd`` and the ``lightning-pfd`` console script.

The commands (``fit`` and LightningCLI's other subcommands, ``report``, ``icr-sweep``, ``pite``,
``sweep``), their registry, the shared error handling and ``--threads`` are in
:mod:`lightning_pfd.commands`; with no arguments the embedded ``configs/quickstart.yaml`` runs.
The names below stay importable from here; those of ``fit`` load Lightning on first use.
"""
from __future__ import annotations

from .commands import CONFIG_DIR, DEFAULT_CONFIG, PROG, debug_enabled, main

__all__ = ["main", "PROG", "CONFIG_DIR", "DEFAULT_CONFIG", "debug_enabled"]

#: importable from here too (``from lightning_pfd.cli import ensure_wandb_mode``): from ``commands.fit``
_FIT_NAMES = ("resolve_config_path", "join_negative_values", "ensure_wandb_mode",
              "wandb_has_credentials", "run_lightning_cli")


def __getattr__(name: str):
    if name in _FIT_NAMES:  # lazily: `report` starts without Lightning
        from .commands import fit

        return getattr(fit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
