"""Entry point of ``python -m lightning_pfd`` and the ``lightning-pfd`` console script.

The commands (``fit`` and LightningCLI's other subcommands, ``report``, ``icr-sweep``, ``pite``,
``sweep``), their registry, the shared error handling and ``--threads`` are in
:mod:`lightning_pfd.commands`; with no arguments the embedded ``configs/quickstart.yaml`` runs.
"""
from __future__ import annotations

from .commands import main
from .launch import CONFIG_DIR, DEFAULT_CONFIG, PROG, debug_enabled

__all__ = ["main", "PROG", "CONFIG_DIR", "DEFAULT_CONFIG", "debug_enabled"]
