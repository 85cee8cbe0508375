"""Compatibility path of ``python -m lightning_pfd sweep``: the command is
:mod:`lightning_pfd.commands.sweep`."""
from ..commands.sweep import build_parser, main

__all__ = ["main", "build_parser"]
