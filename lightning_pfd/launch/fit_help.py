"""The start of ``python -m lightning_pfd fit --help`` (and of ``validate``, ``test``,
``predict``): a short usage line and what most runs need, before LightningCLI's full option
list. Given to each subcommand's parser through LightningCLI's ``parser_kwargs`` (argparse's
``usage``, ``description`` and ``formatter_class``). No Lightning import here."""
from __future__ import annotations

import argparse
import functools

__all__ = ["parser_kwargs", "subcommand_parser_kwargs", "usage", "help_formatter", "HELP_HEAD"]

#: the description of a subcommand's parser: printed after the usage line, before the options
HELP_HEAD = """LightningCLI with lightning_pfd's checks (docs/configuration.md).

Most runs need only:
  --config FILE|NAME        a run config, or an embedded one (quickstart, edm_cifar10, ...)
  --trainer.max_epochs N    any config value, by its dotted key (--model.init_args.lr 1e-3)
  --ckpt_path last          resume the run of this config from its newest checkpoint
  --run_dir PATH            every output of the run (logs, checkpoints, report) in PATH
{overwrite}  --threads N|auto          CPU threads (also LIGHTNING_PFD_THREADS)
  --debug                   show the traceback of an error (also LIGHTNING_PFD_DEBUG=1)
  --print_config            print the full config this command line gives, then exit

All options (LightningCLI) follow."""

_OVERWRITE = ("  --overwrite               replace an earlier run's checkpoints in the same directory\n"
              "                            (they move to <dirpath>/overwritten-<time>/)\n"
              "  --allow-data-change       with --ckpt_path: continue on changed data (else refused)\n"
              "  --allow-optimizer-change  with --ckpt_path: another optimizer / schedule (else refused)\n")


def usage(prog: str, subcommand: str) -> str:
    """One usage line instead of argparse's list of every option (about 60 lines)."""
    extra = " [--overwrite]" if subcommand == "fit" else ""
    return (f"{prog} {subcommand} [--config FILE|NAME] [--KEY VALUE ...] [--ckpt_path PATH]"
            f"{extra} [--threads N|auto] [--debug]")


@functools.lru_cache(maxsize=None)
def help_formatter():
    """jsonargparse's help formatter, keeping the description's line breaks (a subcommand's
    parser takes its parent's formatter, so both get this one)."""
    from jsonargparse import DefaultHelpFormatter

    class RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        """jsonargparse's help formatter that keeps the description's line breaks."""

    return RawDescriptionFormatter


def subcommand_parser_kwargs(prog: str, subcommand: str) -> dict:
    """``parser_kwargs[subcommand]`` of LightningCLI: usage, the help head, no abbreviations."""
    head = HELP_HEAD.format(overwrite=_OVERWRITE if subcommand == "fit" else "")
    return {"allow_abbrev": False, "usage": usage(prog, subcommand), "description": head,
            "formatter_class": help_formatter()}


def parser_kwargs(prog: str, subcommands) -> dict:
    """LightningCLI's ``parser_kwargs``: the top-level parser's and each subcommand's."""
    return {"prog": prog, "allow_abbrev": False, "formatter_class": help_formatter(),
            **{c: subcommand_parser_kwargs(prog, c) for c in subcommands}}
