"""Why double descent under a cosine schedule is hard to find (issue 41 item 3): the power of the
held-out detector at height 0.2, M = 2048, on the ``cosine_m256`` null family with its planted
double descent, for the release's noise model and for two variants that each remove one of the
suspected limits:

- ``bound_5``: the variogram bound V(h) <= Var(D_h)/5 (valid for any non-decreasing concave
  variogram) instead of Var(D_h)/4;
- ``no_shrink``: the local scale of the training noise taken at its point estimate (LOCAL_SHRINK
  = 0) instead of its confidence bound toward 1;
- both together;
- ``fitted_shape``: beyond the short lags, V(h) = V(1)·g(h)/g(1) with the shape g that fits the
  variances of third differences at the short (clean) lags best, at its point estimate (no
  confidence margin, so an upper limit of what such a fit can give): AR(1) 1 − φ^h on a grid of
  φ, a random walk h or the concave power h^1.37, each with a nugget of 0, 1/4 or 1/2 of V(1),
  fitted in log space with the weights 1/sd² of :meth:`NoiseModel._lag_train_var`; never above
  the release's V;

and, to locate what the estimator lacks, two oracles that are given what the simulation knows
(for both double descent and early learning):

- ``oracle``: every leg's training variance is the exact variance of its contrast under the
  simulated noise (AR(1) with φ and the schedule's sd at each evaluation): the power the leg
  design reaches with a perfect training-noise estimate;
- ``oracle_shape``: the release's estimate at lag 1 and its local scale, but the variogram's shape
  beyond lag 1 is the simulated AR(1)'s, V(h) = V(1)·(1 − φ^h)/(1 − φ) (a saturating variogram
  known exactly up to its level).

The variants are set on the module for this measurement only (they are not options of the
package). Writes ``experiments/results/cosine_power_variants.json``::

    OMP_NUM_THREADS=1 python experiments/cosine_power_variants.py --runs 40
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from calibration import FAMILIES, _run_seed, schedule_envelope, simulate_run, wilson_interval  # noqa: E402
from lightning_pfd.analysis import events as E  # noqa: E402
from lightning_pfd.analysis import inference as I  # noqa: E402

VARIANTS = {"release": {}, "bound_5": {"bound": 0.2}, "no_shrink": {"shrink": 0.0},
            "bound_5_no_shrink": {"bound": 0.2, "shrink": 0.0}, "fitted_shape": {"fit": True}}

#: the shapes g(h) of ``fitted_shape`` (a variogram up to its level)
_SHAPES = ([lambda h, p=phi: 1.0 - p ** h for phi in (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.92,
                                                      0.94, 0.96, 0.98)]
           + [lambda h: np.asarray(h, dtype=np.float64), lambda h: np.asarray(h, dtype=np.float64) ** 1.37])


def _fitted_shape(variogram):
    """``variogram`` with its long lags replaced by the best-fitting shape (``fitted_shape``)."""
    def third(g, h):
        return 15 * g(h) - 6 * g(2 * h) + g(3 * h)

    def fitted(curve, **kw):
        out = variogram(curve, **kw)
        n = len(curve)
        if n < 100 or curve.discrete:
            return out
        h_s = int(min(max(2, round(n / 20)), 10))
        lags = np.arange(1, h_s + 1)
        fits = [I.NoiseModel(curve, out, 0.0, 1.0, n, ())._lag_train_var(0, n, int(h)) for h in lags]
        t, sd = np.array([f[0] for f in fits]), np.array([f[1] for f in fits])
        ok = (t > 0) & np.isfinite(sd)
        if ok.sum() < 5:
            return out
        h, lt, w = lags[ok], np.log(t[ok]), 1.0 / sd[ok] ** 2
        best = None
        for g in _SHAPES:
            for share in (0.0, 0.25, 0.5):
                c = share / (1.0 - share) * float(g(np.array([1]))[0])
                gg = (lambda x, g=g, c=c: g(x) + c * (np.asarray(x) > 0))
                lm = np.log(third(gg, h))
                chi = float(np.sum(w * (lt - lm - np.sum(w * (lt - lm)) / np.sum(w)) ** 2))
                if best is None or chi < best[0]:
                    best = (chi, gg)
        hh = np.arange(1, n)
        model = out[1] * best[1](hh) / best[1](np.array([1]))[0]
        out = out.copy()
        out[1:] = np.where(hh > h_s, np.minimum(out[1:], np.maximum(model, out[h_s])), out[1:])
        return np.maximum.accumulate(out)
    return fitted


def _found(fam, family: str, event: str, runs: int, seed0: int) -> int:
    """How many of ``runs`` runs of ``fam`` with ``event`` planted at height 0.2 confirm it."""
    found = 0
    for r in range(runs):
        series, units = simulate_run(fam, _run_seed(seed0, family, r), event, 0.2)
        a = E.analyze_history(series, units=units)
        found += any(e.name == event and e.status == "confirmed" for e in a.events)
    return found


def power(variant: dict, runs: int, family: str = "cosine_m256", seeds: int = 2048, seed0: int = 10_000) -> dict:
    coef, bound = I._DIFF[3]
    shrink = I.LOCAL_SHRINK
    I._DIFF[3] = (coef, variant.get("bound", bound))
    I.LOCAL_SHRINK = variant.get("shrink", shrink)
    variogram = I.variogram
    if variant.get("fit"):
        I.variogram = _fitted_shape(variogram)
    E._CURVES.clear()
    try:
        fam = dataclasses.replace(FAMILIES[family], num_seeds=seeds)
        found = _found(fam, family, "double_descent", runs, seed0)
    finally:
        I._DIFF[3], I.LOCAL_SHRINK, I.variogram = (coef, bound), shrink, variogram
        E._CURVES.clear()
    return {"found": found, "runs": runs, "ci95": list(wilson_interval(found, runs))}


def _oracle_train_var(fam):
    """NoiseModel.train_var for the exact covariance of ``fam``'s simulated training noise."""
    n = fam.n_eval
    sd = fam.noise_sd * schedule_envelope(n, fam.schedule, fam.anneal, fam.restarts)
    t = np.arange(n)
    cov = np.outer(sd, sd) * fam.phi ** np.abs(t[:, None] - t[None, :])

    def train_var(self, c):
        idx = np.flatnonzero(c)
        ep = self.curve.epochs[idx].astype(int)  # the run's evaluation indices (jumps removed)
        return float(c[idx] @ cov[np.ix_(ep, ep)] @ c[idx]), 1.0
    return train_var


def _oracle_shape_fit(fam, fit):
    """NoiseModel.fit with V(h) = V(1)·(1 − φ^h)/(1 − φ): the simulated shape, the estimated level."""
    def fitted(curve, *a, **k):
        model = fit(curve, *a, **k)
        h = np.arange(model.V.size, dtype=np.float64)
        model.V = model.V[1] * (1.0 - fam.phi ** h) / (1.0 - fam.phi) if model.V.size > 1 else model.V
        return model
    return fitted


def oracle_power(kind: str, event: str, runs: int, family: str = "cosine_m256", seeds: int = 2048,
                 seed0: int = 10_000) -> dict:
    fam = dataclasses.replace(FAMILIES[family], num_seeds=seeds)
    saved = {k: vars(I.NoiseModel)[k] for k in ("train_var", "fit")}
    if kind == "oracle":
        I.NoiseModel.train_var = _oracle_train_var(fam)
    else:
        I.NoiseModel.fit = staticmethod(_oracle_shape_fit(fam, I.NoiseModel.fit))
    E._CURVES.clear()
    try:
        found = _found(fam, family, event, runs, seed0)
    finally:
        for k, v in saved.items():
            setattr(I.NoiseModel, k, v)
        E._CURVES.clear()
    return {"found": found, "runs": runs, "ci95": list(wilson_interval(found, runs))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments/results/cosine_power_variants.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = {"command": "python experiments/cosine_power_variants.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "family": "cosine_m256", "num_seeds": 2048, "height": 0.2, "event": "double_descent",
           "variants": {name: power(v, args.runs) for name, v in VARIANTS.items()},
           "oracles": {kind: {ev: oracle_power(kind, ev, args.runs) for ev in ("double_descent", "early_learning")}
                       for kind in ("oracle", "oracle_shape")}}
    out["wall_s"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("variants", "oracles")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
