"""Compatibility path: the LightningCLI glue lives in :mod:`lightning_pfd.commands.fit`."""
from .commands.fit import (SUBCOMMANDS, PFDArgumentParser, PFDLightningCLI, RunConfigCallback,
                           condense_error)

__all__ = ["PFDLightningCLI", "PFDArgumentParser", "RunConfigCallback", "condense_error", "SUBCOMMANDS"]
