"""Compatibility path of ``icr-sweep``: the computation is :mod:`lightning_pfd.evaluation.icr_sweep`,
the command line :mod:`lightning_pfd.commands.icr_sweep`."""
from ..commands.icr_sweep import (SHORT_NAMES, build_datamodule, check_loaded, format_table, instantiate,
                                  load_module, main, plot, validate_args)
from ..evaluation.icr_sweep import DEFAULT_SIGMAS, linear_probe_accuracy, sweep

__all__ = ["main", "sweep", "linear_probe_accuracy", "DEFAULT_SIGMAS", "validate_args", "check_loaded",
           "build_datamodule", "load_module", "instantiate", "format_table", "plot", "SHORT_NAMES"]
