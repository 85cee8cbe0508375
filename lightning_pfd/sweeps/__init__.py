"""Sweeps on Ray Tune: ``python -m lightning_pfd sweep --config SWEEP.yaml`` (docs/sweeps.md).

- :mod:`.spec`: read a sweep file, expand it into trials (ids, overrides, output directories);
- :mod:`.validate`: check every trial against the ``fit`` parser before anything runs;
- :mod:`.runner`: Ray Tune plumbing (local Ray or ``--address``), resume, failures;
- :mod:`.trial`: one trial = one in-process ``fit`` in ``runs/<sweep>/<trial-id>/``;
- :mod:`.endpoints`: the final student / teacher / empirical endpoints (Def. 3's inputs);
- :mod:`.aggregate`: ``sweep_results.csv`` / ``.json`` from the trials' own histories.

Ray is imported only when a sweep runs.
"""
from .aggregate import ROW_FIELDS, aggregate_sweep
from .spec import SweepSpec, Trial, expand_trials, load_sweep
from .validate import validate_trials

__all__ = ["load_sweep", "expand_trials", "validate_trials", "aggregate_sweep", "run_sweep",
           "SweepSpec", "Trial", "ROW_FIELDS"]


def run_sweep(*args, **kwargs):
    """See :func:`lightning_pfd.sweeps.runner.run_sweep`."""
    from .runner import run_sweep as _run

    return _run(*args, **kwargs)
