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
- ``fitted_long_excluded``: the same fit on lags 1..h_s plus six lags up to 40, each read only
  from the third differences whose evaluations avoid the planted double descent's span
  (evaluations 225–375, given: an oracle of where the event is), at its point estimate;

and, to locate what the estimator lacks, two oracles that are given what the simulation knows
(for both double descent and early learning):

- ``oracle``: every leg's training variance is the exact variance of its contrast under the
  simulated noise (AR(1) with φ and the schedule's sd at each evaluation): the power the leg
  design reaches with a perfect training-noise estimate;
- ``oracle_shape``: the release's estimate at lag 1 and its local scale, but the variogram's shape
  beyond lag 1 is the simulated AR(1)'s, V(h) = V(1)·(1 − φ^h)/(1 − φ) (a saturating variogram
  known exactly up to its level).

and, to bound what any estimator of the long-lag shape could do, ``long_lag_precision``: on pure
stationary AR(1) noise (φ 0.9, 500 evaluations, no trend, no seed noise, no event: the best
case), the log of the MAD estimate of Var(D_h)/Var(D_10) at h = 20, 30, 40 over 400 draws, from
every third difference (``all``) and from those whose span avoids the planted double descent's
evaluations 225–375 (``excluded``: what reading the long lags away from a candidate event
leaves, its location given); ``walk_over_ar1``: how much larger the ratio is for a random walk.
A shape bound at its 95 % point that stays below a walk's needs the 95 % quantile of the log
error below log(walk_over_ar1). ``fitted_shape_nulls``: the false events per run of
``fitted_shape`` (not a bound) on the random-walk and fBm null families ``NULLS``, 300 runs each.

The variants are set on the module for this measurement only (they are not options of the
package). Writes ``experiments/results/cosine_power_variants.json``::

    OMP_NUM_THREADS=1 python experiments/cosine_power_variants.py --runs 40 --null-runs 300
"""
from __future__ import annotations

import argparse
import contextlib
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
            "bound_5_no_shrink": {"bound": 0.2, "shrink": 0.0}, "fitted_shape": {"fit": True},
            "fitted_long_excluded": {"fit": True, "max_lag": 40, "span": (225, 375)}}

#: null families with a walk-like long-lag variogram (random walk, fBm) on which ``fitted_shape``,
#: which is not a bound, is run for its false events (``fitted_shape_nulls``)
NULLS = ("walk_grow2.5_m1024", "fbm_h0.75_m256")

#: the shapes g(h) of ``fitted_shape`` (a variogram up to its level)
_SHAPES = ([lambda h, p=phi: 1.0 - p ** h for phi in (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.92,
                                                      0.94, 0.96, 0.98)]
           + [lambda h: np.asarray(h, dtype=np.float64), lambda h: np.asarray(h, dtype=np.float64) ** 1.37])


def _excluded_train_var(curve, h: int, span) -> tuple:
    """(training part of the MAD variance of third differences at lag ``h`` from those whose
    evaluations avoid the epochs ``span``, the sd of its log: 3·sqrt(h/count)·total/training,
    the count of those differences)."""
    d = I._diff(curve.y, h, 3)
    if d.size < 3:
        return np.nan, np.inf, 0
    i = np.arange(h, h + d.size)
    ep = curve.epochs
    ok = (ep[i + 2 * h] < span[0]) | (ep[i - h] > span[1]) if span is not None else np.ones(d.size, bool)
    count = int(ok.sum())
    if count < 5:
        return np.nan, np.inf, count
    total = I._robust_var(d[ok])
    seed = float(np.mean(curve.unit_var(I._diff(curve.units, h, 3))[ok])) if curve.units is not None else 0.0
    train = total - seed
    return (train, 3.0 * np.sqrt(h / count) * total / train, count) if train > 0 else (np.nan, np.inf, count)


def _fitted_shape(variogram, max_lag: int = 0, span=None):
    """``variogram`` with its long lags replaced by the best-fitting shape (``fitted_shape``):
    fitted on lags 1..h_s, or with ``max_lag`` on lags 1..h_s plus a geometric grid up to
    ``max_lag``, reading only the third differences that avoid the epochs ``span``
    (``fitted_long_excluded``: the planted event's span, given)."""
    def third(g, h):
        return 15 * g(h) - 6 * g(2 * h) + g(3 * h)

    def fitted(curve, **kw):
        out = variogram(curve, **kw)
        n = len(curve)
        if n < 100 or curve.discrete:
            return out
        h_s = int(min(max(2, round(n / 20)), 10))
        lags = np.arange(1, h_s + 1)
        if max_lag:
            lags = np.unique(np.concatenate([lags, np.round(np.geomspace(h_s, max_lag, 6)).astype(int)]))
            fits = [_excluded_train_var(curve, int(h), span)[:2] for h in lags]
        else:
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


@contextlib.contextmanager
def _variant(variant: dict):
    """The package's noise model with ``variant`` set on the module, restored afterwards."""
    coef, bound = I._DIFF[3]
    shrink = I.LOCAL_SHRINK
    I._DIFF[3] = (coef, variant.get("bound", bound))
    I.LOCAL_SHRINK = variant.get("shrink", shrink)
    variogram = I.variogram
    if variant.get("fit"):
        I.variogram = _fitted_shape(variogram, variant.get("max_lag", 0), variant.get("span"))
    E._CURVES.clear()
    try:
        yield
    finally:
        I._DIFF[3], I.LOCAL_SHRINK, I.variogram = (coef, bound), shrink, variogram
        E._CURVES.clear()


def power(variant: dict, runs: int, family: str = "cosine_m256", seeds: int = 2048, seed0: int = 10_000) -> dict:
    with _variant(variant):
        found = _found(dataclasses.replace(FAMILIES[family], num_seeds=seeds), family, "double_descent", runs, seed0)
    return {"found": found, "runs": runs, "ci95": list(wilson_interval(found, runs))}


def null_rate(variant: dict, family: str, runs: int, seed0: int = 10_000) -> dict:
    """Runs of the null ``family`` (no event planted) with any confirmed event under ``variant``."""
    fam = FAMILIES[family]
    bad = 0
    with _variant(variant):
        for r in range(runs):
            series, units = simulate_run(fam, _run_seed(seed0, family, r))
            bad += any(e.status == "confirmed" for e in E.analyze_history(series, units=units).events)
    return {"any_confirmed": bad, "runs": runs, "ci95": list(wilson_interval(bad, runs))}


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


def long_lag_precision(draws: int = 400, n: int = 500, phi: float = 0.9, span=(225, 375), seed: int = 1) -> dict:
    """The best-case precision of a long-lag shape estimate (module docstring)."""
    from calibration import _ar1_cols

    rng = np.random.default_rng(seed)
    lags = (20, 30, 40)

    def third(h):  # Var(D_h) of AR(1) up to its level: 15V(h) - 6V(2h) + V(3h), V(h) = 1 - φ^h
        return 15 * (1 - phi ** h) - 6 * (1 - phi ** (2 * h)) + (1 - phi ** (3 * h))

    def var(y, h, exclude):  # no seed part: the training part is the whole MAD variance
        v, _, count = _excluded_train_var(I.Curve(np.arange(n, dtype=np.float64), y), h, span if exclude else None)
        return v, count

    out = {}
    for exclude in (False, True):
        err = {h: [] for h in lags}
        count = {}
        for _ in range(draws):
            y = _ar1_cols(rng, n, 1, phi)[:, 0]
            v10, _ = var(y, 10, exclude)
            for h in lags:
                v, count[h] = var(y, h, exclude)
                err[h].append(np.log(v / v10 / (third(h) / third(10))))
        out["excluded" if exclude else "all"] = {
            str(h): {"differences": count[h], "sd_log": round(float(np.std(e)), 3),
                     "q95_log": round(float(np.quantile(e, 0.95)), 3)} for h, e in err.items()}
    out["walk_over_ar1"] = {str(h): round((h / 10) / (third(h) / third(10)), 3) for h in lags}
    out["draws"], out["phi"], out["span"] = draws, phi, list(span)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--null-runs", type=int, default=300)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments/results/cosine_power_variants.json")
    args = ap.parse_args(argv)
    for name in ("runs", "null_runs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive number of runs, got {getattr(args, name)}")
    t0 = time.time()
    out = {"command": "python experiments/cosine_power_variants.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "family": "cosine_m256", "num_seeds": 2048, "height": 0.2, "event": "double_descent",
           "variants": {name: power(v, args.runs) for name, v in VARIANTS.items()},
           "oracles": {kind: {ev: oracle_power(kind, ev, args.runs) for ev in ("double_descent", "early_learning")}
                       for kind in ("oracle", "oracle_shape")},
           "long_lag_precision": long_lag_precision(),
           "fitted_shape_nulls": {f: null_rate(VARIANTS["fitted_shape"], f, args.null_runs) for f in NULLS}}
    out["wall_s"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("variants", "oracles", "long_lag_precision", "fitted_shape_nulls")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
