"""Compatibility path of ``python -m lightning_pfd pite``: the command is
:mod:`lightning_pfd.commands.pite`."""
from .commands.pite import (NUM_SPLITS, build_parser, format_table, main, parse_observable,
                            sbm_preconds, tail_evaluations)

__all__ = ["main", "build_parser", "format_table", "tail_evaluations", "NUM_SPLITS",
           "parse_observable", "sbm_preconds"]
