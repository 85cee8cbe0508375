"""``python -m lightning_pfd sweep --config SWEEP.yaml``: a grid of ``fit`` runs on Ray Tune.

Every trial's config is parsed and checked before anything starts (an unknown key or a bad
value fails the whole sweep, naming the trial and the key); then each trial runs a full
``fit`` in a Ray worker, in ``runs/<sweep>/<trial-id>/``, and ``runs/<sweep>/sweep_results.csv``
/ ``.json`` collect one row per trial from the trials' own histories (:mod:`lightning_pfd.sweeps`).
See docs/sweeps.md. A bad sweep file or option: one block, exit status 2 (``--debug`` shows the
traceback).
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from ..errors import ShortErrorParser
from ..launch import run_guarded
from . import COMMANDS

__all__ = ["main", "build_parser"]

PROG = COMMANDS["sweep"].prog


def build_parser() -> ShortErrorParser:
    p = ShortErrorParser(prog=PROG, description="Run a grid of fit runs (N x model size x seeds) on "
                         "Ray Tune; one row per trial in runs/<sweep>/sweep_results.csv. See docs/sweeps.md.")
    p.add_argument("--config", required=True,
                   help="sweep file (YAML), or the name of an embedded sweep (mtog_digits, mtog_digits_k3, mtog_cifar10)")
    p.add_argument("--name", help="sweep name (directory runs/<name>); default: the file's `name`")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep: finished and failed trials are not run again")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: run the failed trials again")
    p.add_argument("--address", help="join a running Ray cluster (`auto` or HEAD_IP:6379; with a "
                                     "token in ~/.ray/auth_token, RAY_AUTH_MODE=token is set); "
                                     "default: a local Ray with this machine's cores")
    p.add_argument("--cpus-per-trial", type=float, help="CPUs (and torch threads) per trial")
    p.add_argument("--gpus-per-trial", type=float, help="GPUs per trial (0..1; a fraction shares a GPU)")
    p.add_argument("--max-concurrent", type=int, help="at most this many trials at once")
    p.add_argument("--dry-run", action="store_true",
                   help="parse every trial and list them (N, |theta|); run nothing, write nothing")
    p.add_argument("--aggregate-only", action="store_true",
                   help="rewrite sweep_results.csv/.json from the trials on disk; run nothing")
    return p


def _sweep(argv: list) -> int:
    import dataclasses

    from ..sweeps.aggregate import aggregate_sweep
    from ..sweeps.runner import run_sweep
    from ..sweeps.spec import check_resources, load_sweep

    args = build_parser().parse_args(argv)
    if not (args.dry_run or args.aggregate_only):
        from ..sweeps.runner import prepare_ray_auth

        prepare_ray_auth(args.address)  # before Ray is imported
    spec = load_sweep(args.config, name=args.name)
    if args.aggregate_only:
        rows = aggregate_sweep(spec.sweep_dir)
        print(f"[lightning_pfd] {len(rows)} rows -> {spec.sweep_dir / 'sweep_results.csv'} (and .json)")
        missing = [r["trial_id"] for r in rows if r["status"] == "missing"]
        if missing:  # recorded as run before, no result on disk now
            print(f"[lightning_pfd] {len(missing)} trial(s) missing: the earlier results record them as "
                  f"run but their trial_result.json is gone (files deleted or moved), e.g. {missing[0]}: "
                  "restore the files, or run them again with --resume", file=sys.stderr)
        pending = [r["trial_id"] for r in rows if r["status"] == "pending"]
        if pending:  # no result on disk and never recorded: not run yet
            print(f"[lightning_pfd] {len(pending)} trial(s) not run yet (pending), e.g. "
                  f"{pending[0]}: run them with --resume", file=sys.stderr)
        return 0 if all(r["status"] in ("ok", "diverged") for r in rows) else 1
    given = {k: v for k, v in (("cpus_per_trial", args.cpus_per_trial),
                               ("gpus_per_trial", args.gpus_per_trial),
                               ("max_concurrent", args.max_concurrent)) if v is not None}
    resources = check_resources(dataclasses.replace(spec.resources, **given))
    return run_sweep(spec, resources, resume=args.resume, retry_failed=args.retry_failed,
                     address=args.address, dry_run=args.dry_run)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lightning_pfd sweep ...``; returns the exit status (that of
    :func:`lightning_pfd.sweeps.runner.run_sweep`; 2: a bad sweep file or option)."""
    return run_guarded(_sweep, argv, PROG)
