"""``python -m lightning_pfd fit|validate|test|predict``: the command around
:class:`~lightning_pfd.launch.cli.PFDLightningCLI` (the launch layer: LightningCLI validated
before anything is written): the embedded quickstart when no ``--config`` is given, signals
(exit 130 / 143 with the resume command), a finished run (nothing to train), a full disk.
User errors: one block, exit status 2 (:func:`lightning_pfd.launch.run_guarded`).
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from ..launch import DEFAULT_CONFIG, PROG, debug_enabled, pop_flag, run_guarded
from ..launch.cli import (DISK_ERRNOS, RUNNING, RunFinished, disk_error, join_negative_values,
                          needs_default_config, rewrite_configs, run_lightning_cli)
from ..launch.interrupts import interrupt_status, lost_peer, lost_peer_status, signal_guard
from ..locks import release_all as release_locks
from . import print_extra_help

__all__ = ["main", "DIVERGED", "diverged_status"]

#: exit status of a fit whose model diverged (2: a user error, 130 / 143: a signal)
DIVERGED = 3


def _fit(argv: list) -> int:
    overwrite = pop_flag(argv, "--overwrite")
    allow_data_change = pop_flag(argv, "--allow-data-change")
    allow_optimizer_change = pop_flag(argv, "--allow-optimizer-change")
    if not argv:
        argv = ["fit"]
    if needs_default_config(argv):
        argv = [argv[0], "--config", str(DEFAULT_CONFIG), *argv[1:]]
        print(f"[lightning_pfd] no --config: using the embedded quickstart ({DEFAULT_CONFIG})")
    RUNNING.clear()
    cli = None
    with signal_guard() as received:  # SIGTERM / SIGINT: exit 143 / 130 with the resume command
        try:
            cli = run_lightning_cli(join_negative_values(rewrite_configs(argv)), overwrite=overwrite,
                                    allow_data_change=allow_data_change,
                                    allow_optimizer_change=allow_optimizer_change)
        except (SystemExit, KeyboardInterrupt):
            if received.signum is None:
                raise
            return interrupt_status(received, RUNNING.get("trainer"), argv, PROG)
        except RunFinished as done:  # fit --ckpt_path of a finished run: nothing written
            print(str(done), flush=True)
            return 0
        except OSError as e:  # a full disk or a file-size limit while the run writes
            if e.errno not in DISK_ERRNOS or debug_enabled():
                raise
            return disk_error(e, RUNNING.get("trainer"), argv)
        except RuntimeError as e:  # DDP: another rank died, so this rank's collective failed
            if debug_enabled() or not lost_peer(e, RUNNING.get("trainer")):
                raise
            return lost_peer_status(e, RUNNING.get("trainer"), argv, PROG)
        finally:
            release_locks()
            if argv[0] in ("-h", "--help"):
                print_extra_help()
    if received.signum is not None:  # a signal after the trainer returned (its last hooks)
        return interrupt_status(received, RUNNING.get("trainer"), argv, PROG)
    return diverged_status(getattr(cli, "model", None))


def diverged_status(model) -> int:
    """:data:`DIVERGED` after a fit whose model diverged (``model.diverged``, said on stderr), else 0."""
    if not getattr(model, "diverged", False):
        return 0
    why = getattr(model, "diverged_reason", None) or "non-finite loss or gradients"
    print(f"[lightning_pfd] the run DIVERGED ({why}): its report says so, no "
          f"event is confirmed after it; exit status {DIVERGED}", file=sys.stderr, flush=True)
    return DIVERGED


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lightning_pfd [fit|validate|test|predict] ...``; ``argv`` starts with the
    subcommand (none: ``fit`` on the embedded quickstart). Returns the exit status."""
    return run_guarded(_fit, argv, PROG)
