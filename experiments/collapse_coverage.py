"""Calibration of the sweep report's collapse fit on synthetic sweeps: interval coverage under a
randomized generator family, and the size and power of the goodness-of-fit (GOF) test.

Design of the recorded ``mtog_digits`` sweep: 4 widths (|θ| = 29,600 … 636,864), N = 2⁵ … 2¹²,
K = 2 repeats, then 2 random cells removed and one random cell with a single repeat. With
x' = log₂N − γ (log₂|θ| − mean log₂|θ|) − c, E_gen = floor_w(N) + F(x'), F one of

- ``logistic``: A σ(−x'/w), w ~ U(0.6, 1.0);
- ``knee`` (a power law in N with a knee): A (1 + e^{x'/h})^{−β}, h ~ U(0.6, 1.0), β ~ U(0.6, 1.2);

A ~ U(1.6, 2.4), c ~ 7.5 + U(−0.5, 0.5), floors 2.7, 2.0, 1.6, 1.5 (the recorded ones) + U(−0.1, 0.1).
**Floor drift**: floor_w(N) = floor_w + D u_w (log₂N − 12), u_w ~ U(−1, 1) per width, D ~ U(0, 0.02)
per octave (coverage settings; the GOF settings have D = 0). **Noise**: Student t(5) scaled to
unit variance, cell sd = b (1 + κ |F'(x')| / max|F'|) e^{0.3 ξ}, b ~ U(0.03, 0.05), κ ~ U(1, 3)
(larger where the curve is steep; rms ≈ the recorded 0.067 per repeat).

Coverage settings (γ, shape), each sweep with freshly drawn parameters: TUNE = (0.3 logistic,
0.7 logistic, 0 knee, 0.5 knee) chose the weight c of the between-width variance; HELD_OUT =
(0 logistic, 0.5 logistic, 0.3 knee, 0.7 knee) report it. GOF settings (no drift, same noise):
``collapse`` (γ ~ U(0, 0.7) and the shape drawn per sweep: the test must accept), and three mild
non-collapses at γ = 0.5 it must reject: ``crossing`` (per-width steepness w_w = w (1 + 0.3 u_w),
u_w = −1, −⅓, ⅓, 1 from the narrowest width: the curves cross), ``exponents`` (width-dependent
exponents γ_w = 0.5 + 0.3 u_w: the transition moves with width but no single γ aligns it),
``shapes`` (every width draws its own shape and parameters). These four chose the GOF statistic
(the deformation test of :func:`lightning_pfd.analysis.scaling.deformation_test`); six held-out
settings, defined before that test was run on them, report it:

- true collapses: ``collapse_skew`` (a Richards curve A (1 + ν e^{x'/w})^{−1/ν}, ν ~ U(0.5, 2),
  skewed noise (Gamma(4) − 4)/2, K = 3 repeats, one missing cell, no single-repeat cell) and
  ``collapse_heavy`` (t(3) noise, κ ~ U(3, 5): noise up to 6× larger where steep, γ ~ U(−0.2, 0.9));
- non-collapses at γ = ½: ``amplitudes`` (per-width height A_w = A (1 + 0.25 u_w)),
  ``knee_tails`` (knee curves with per-width tail exponent β_w = β (1 + 0.4 u_w)), ``one_width``
  (the second width's transition 0.6 octave away from where γ puts it), ``shape_by_width`` (the
  two narrow widths logistic, the two wide ones a knee with β = 1).

For every sweep the report's fit runs (:func:`lightning_pfd.analysis.scaling.bootstrap_collapse`
on E_gen − floor_w, floors fitted with γ, ``model`` bootstrap with B resamples, jackknife over
widths); each sweep's γ̂, bootstrap sd, jackknife se, percentile interval and GOF p-value are
stored, so the interval for any weight c is recomputed from them (and the p-value of the earlier
statistic S(γ̂), computed on the same bootstrap sweeps, beside the deformation test's).

    python experiments/collapse_coverage.py --sweeps 200 --bootstrap 50 --out experiments/results/collapse_coverage.json

Single-threaded (OMP_NUM_THREADS=1); per sweep 1 + B + 4 fits of ≈ 7 ms and 1 + B deformation
tests of ≈ 2 ms. Results and wall time:
docs/sweeps_analysis.md ("Calibration").
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy.stats import norm

from lightning_pfd.analysis.scaling import bootstrap_collapse, group_cells

LOG2_PARAMS = np.log2([29600, 67200, 191552, 636864])
LOG2_N = np.arange(5, 13)
FLOORS = (2.7, 2.0, 1.6, 1.5)
U_W = np.array([-1.0, -1 / 3, 1 / 3, 1.0])     # width index mapped to [−1, 1]

TUNE = [("logistic", 0.3), ("logistic", 0.7), ("knee", 0.0), ("knee", 0.5)]
HELD_OUT = [("logistic", 0.0), ("logistic", 0.5), ("knee", 0.3), ("knee", 0.7)]
#: GOF settings: name -> (role, true collapse?, sweep maker). The tuning half chose the test's
#: statistic (the deformation test's three components and their combination); the held-out half
#: was defined before any test was run on it.
GOF_SETTINGS = {
    "collapse": ("tune", True, lambda r: synthetic_sweep(r, None, r.uniform(0, 0.7), drift=0.0)),
    "crossing": ("tune", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="crossing")),
    "exponents": ("tune", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="exponents")),
    "shapes": ("tune", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="shapes")),
    "collapse_skew": ("held_out", True, lambda r: synthetic_sweep(
        r, "richards", r.uniform(0, 0.7), drift=0.0, K=3, missing=1, single=0, noise="gamma")),
    "collapse_heavy": ("held_out", True, lambda r: synthetic_sweep(
        r, None, r.uniform(-0.2, 0.9), drift=0.0, noise="t3", kappa=(3.0, 5.0))),
    "amplitudes": ("held_out", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="amplitudes")),
    "knee_tails": ("held_out", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="knee_tails")),
    "one_width": ("held_out", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0, alternative="one_width")),
    "shape_by_width": ("held_out", False, lambda r: synthetic_sweep(r, None, 0.5, drift=0.0,
                                                                     alternative="shape_by_width")),
}
GOF = list(GOF_SETTINGS)
ALTERNATIVES = ("crossing", "exponents", "shapes", "amplitudes", "knee_tails", "one_width", "shape_by_width")


def _logistic(A, w):
    """A σ(−x/w) and its derivative."""
    return (lambda x: A / (1 + np.exp(x / w)),
            lambda x: -A * np.exp(x / w) / (w * (1 + np.exp(x / w)) ** 2))


def _knee(A, h, beta):
    """A (1 + e^{x/h})^{−β} (a power law with a knee) and its derivative."""
    return (lambda x: A * (1 + np.exp(x / h)) ** (-beta),
            lambda x: -A * beta / h * np.exp(x / h) * (1 + np.exp(x / h)) ** (-beta - 1))


def _richards(A, w, nu):
    """A (1 + ν e^{x/w})^{−1/ν} and its derivative."""
    return (lambda x: A * (1 + nu * np.exp(x / w)) ** (-1 / nu),
            lambda x: -A * np.exp(x / w) / w * (1 + nu * np.exp(x / w)) ** (-1 / nu - 1))


def _shape(rng, kind=None):
    """A master curve F(x') and its derivative, shape and parameters drawn."""
    kind = kind or ("logistic" if rng.random() < 0.5 else "knee")
    A = rng.uniform(1.6, 2.4)
    if kind == "logistic":
        f, df = _logistic(A, rng.uniform(0.6, 1.0))
    elif kind == "richards":
        w, nu = rng.uniform(0.6, 1.0), rng.uniform(0.5, 2.0)
        f, df = _richards(A, w, nu)
    else:
        h, beta = rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.2)
        f, df = _knee(A, h, beta)
    return kind, f, df


def _noise(rng, kind):
    """One draw of noise and the sd that scales it to unit variance: Student t(5) or t(3), or a
    centred Gamma(4) (skewness 1)."""
    if kind == "gamma":
        return rng.gamma(4.0) - 4.0, 2.0
    dof = 3 if kind == "t3" else 5
    return rng.standard_t(dof), math.sqrt(dof / (dof - 2))


def _width_curve(rng, j, s, sbar, gamma, c, f, df, alternative):
    """E_gen − floor of width j (a function of log₂N) and |dF/dx|: the collapse, or the width's
    departure from it under ``alternative`` (module docstring)."""
    g, fj, dfj, sc, off = gamma, f, df, 1.0, 0.0
    if alternative == "crossing":
        sc = 1 + 0.3 * U_W[j]
    elif alternative == "exponents":
        g = gamma + 0.3 * U_W[j]
    elif alternative == "shapes":
        _, fj, dfj = _shape(rng)
    elif alternative == "one_width" and j == 1:
        off = 0.6
    x = (LOG2_N - g * (s - sbar) - c - off) / sc
    return fj(x), np.abs(dfj(x) / sc)


def synthetic_sweep(rng, shape="logistic", gamma=0.5, *, drift=0.02, alternative=None, K=2,
                    missing=2, single=1, noise="t5", kappa=(1.0, 3.0), truth=None):
    """(n_train, n_params, E_gen) rows of one sweep of the randomized family (module docstring);
    ``alternative``: None (a collapse) or one of :data:`ALTERNATIVES` (no single γ); ``noise``:
    ``t5``, ``t3`` or ``gamma``; ``kappa``: the range of the growth of the noise where steep;
    ``truth``: a dict that receives {(N, |θ|): (noise sd per repeat, noise-free mean, repeats)}."""
    sbar = LOG2_PARAMS.mean()
    c = 7.5 + rng.uniform(-0.5, 0.5)
    floors = np.array(FLOORS) + rng.uniform(-0.1, 0.1, 4)
    D = rng.uniform(0, drift) if drift else 0.0
    slopes = D * rng.uniform(-1, 1, 4)
    base, kap = rng.uniform(0.03, 0.05), rng.uniform(*kappa)
    if alternative == "amplitudes":
        kind, f0, df0 = _shape(rng, shape)
        parts = [(lambda x, a=1 + 0.25 * u: a * f0(x), lambda x, a=1 + 0.25 * u: a * df0(x)) for u in U_W]
    elif alternative == "knee_tails":
        A, h, beta = rng.uniform(1.6, 2.4), rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.2)
        parts = [_knee(A, h, beta * (1 + 0.4 * u)) for u in U_W]
    elif alternative == "shape_by_width":
        A, w = rng.uniform(1.6, 2.4), rng.uniform(0.6, 1.0)
        f, df = _knee(A, w, 1.0)
        knee = (lambda x: f(x + 0.5), lambda x: df(x + 0.5))
        parts = [_logistic(A, w)] * 2 + [knee] * 2
    else:
        kind, f, df = _shape(rng, shape)
        parts = [(f, df)] * 4
    curves = []
    for j, s in enumerate(LOG2_PARAMS):
        fj, dfj = _width_curve(rng, j, s, sbar, gamma, c, *parts[j], alternative)
        curves.append((floors[j] + slopes[j] * (LOG2_N - 12) + fj, dfj))
    steep = max(float(d.max()) for _, d in curves)
    cells = [(j, i) for j in range(4) for i in range(LOG2_N.size)]
    drop = set(rng.choice(len(cells), missing + single, replace=False).tolist())
    drop_list = sorted(drop)
    ones = set(drop_list[:single])
    n, p, v = [], [], []
    for k, (j, i) in enumerate(cells):
        if k in drop and k not in ones:
            continue
        mu, d = curves[j][0][i], curves[j][1][i]
        sd = base * (1 + kap * d / steep) * math.exp(0.3 * rng.standard_normal())
        if truth is not None:
            truth[(int(2 ** LOG2_N[i]), int(round(2 ** LOG2_PARAMS[j])))] = (sd, mu, 1 if k in ones else K)
        for _ in range(1 if k in ones else K):
            n.append(int(2 ** LOG2_N[i]))
            p.append(int(round(2 ** LOG2_PARAMS[j])))
            e, scale = _noise(rng, noise)
            v.append(mu + sd * e / scale)
    return n, p, np.array(v)


def fit_sweep(rows, B, seed, level):
    f = bootstrap_collapse(group_cells(*rows), B=B, seed=seed, level=level, floor_points=1, shifts=True)
    if f.gamma is None:
        return None
    spreads = f.bootstrap_spreads
    p_spread = float((1 + np.sum(spreads >= f.score.spread)) / (1 + spreads.size)) if spreads.size else None
    return {"gamma_hat": f.gamma, "se_repeats": f.se_repeats, "se_widths": f.se_widths,
            "interval_repeats": f.interval_repeats, "gof_p": f.gof_p, "S": f.score.spread,
            "gof_p_spread": p_spread, "largest": None if f.deformation is None else f.deformation.largest}


def run_setting(name, make, sweeps, B, level, seed, checkpoint=None):
    """``sweeps`` sweeps of one setting; ``checkpoint(partial)`` is called every 10 sweeps."""
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    t0, recs = time.time(), []

    def result():
        return {"name": name, "sweeps": len(recs), "seconds": time.time() - t0,
                "cpu_seconds": time.process_time(), "fits": list(recs), "failed": sum(x is None for x in recs)}

    for r in range(sweeps):
        recs.append(fit_sweep(make(rng), B, r, level))
        if checkpoint is not None and (r + 1) % 10 == 0:
            checkpoint(result())
    return result()


def interval(rec, c, level, bounds=(-0.5, 1.5)):
    z = norm.ppf((1 + level) / 2)
    se = math.sqrt(rec["se_repeats"] ** 2 + c * (rec["se_widths"] or 0.0) ** 2)
    return max(bounds[0], rec["gamma_hat"] - z * se), min(bounds[1], rec["gamma_hat"] + z * se)


def coverage(setting, gamma, c, level):
    fits = [x for x in setting["fits"] if x is not None and x["se_repeats"] is not None]
    ivs = [interval(x, c, level) for x in fits]
    cov = sum(lo <= gamma <= hi for lo, hi in ivs)
    n = len(fits)
    g = np.array([x["gamma_hat"] for x in fits])
    cov = int(cov)
    return {"covered": cov, "n": n, "coverage": cov / n, "coverage_se": math.sqrt(cov / n * (1 - cov / n) / n),
            "covered_repeats_only": int(sum(x["interval_repeats"][0] <= gamma <= x["interval_repeats"][1] for x in fits)),
            "mean_gamma_hat": float(g.mean()), "sd_gamma_hat": float(g.std(ddof=1)),
            "median_width": float(np.median([hi - lo for lo, hi in ivs])),
            "min_width": float(min(hi - lo for lo, hi in ivs)),
            "gamma_hat_exactly_zero": int(np.sum(g == 0.0)),
            "gof_rejected": int(sum(x["gof_p"] is not None and x["gof_p"] < 0.05 for x in fits))}


C_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def summarize(res, level, target=0.90):
    tune = [s for s in res["coverage"] if s["role"] == "tune"]
    # the smallest weight whose pooled coverage on the tuning half reaches the target
    chosen = None
    for c in (C_GRID if tune else ()):
        cov = np.mean([coverage(s, s["gamma"], c, level)["coverage"] for s in tune])
        if cov >= target:
            chosen = c
            break
    chosen = None if not tune else C_GRID[-1] if chosen is None else chosen
    table = []
    for s in res["coverage"]:
        row = {"role": s["role"], "shape": s["shape"], "gamma": s["gamma"], "seconds": s["seconds"],
               **coverage(s, s["gamma"], chosen, level)}
        row["coverage_c0"] = coverage(s, s["gamma"], 0.0, level)["coverage"]
        table.append(row)
    gof = []
    for s in res["gof"]:
        fits = [x for x in s["fits"] if x is not None and x["gof_p"] is not None]
        ps = np.array([x["gof_p"] for x in fits])
        row = {"setting": s["name"], "role": s.get("role"), "collapse": s.get("collapse"), "n": int(ps.size),
               "rejected_at_0.05": int(np.sum(ps < 0.05)), "rate": float(np.mean(ps < 0.05)),
               "median_p": float(np.median(ps)), "seconds": s["seconds"], "failed": s["failed"]}
        sp = np.array([x["gof_p_spread"] for x in fits if x.get("gof_p_spread") is not None])
        if sp.size:
            row.update(spread_rejected=int(np.sum(sp < 0.05)), spread_rate=float(np.mean(sp < 0.05)))
        largest = [x["largest"] for x in fits if x.get("largest") and x["gof_p"] < 0.05]
        row["largest_of_rejected"] = {k: largest.count(k) for k in sorted(set(largest))}
        gof.append(row)
    return {"chosen_model_error_weight": chosen, "coverage": table, "gof": gof}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--bootstrap", type=int, default=50)
    ap.add_argument("--level", type=float, default=0.90)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part", choices=["all", "coverage", "gof"], default="all")
    ap.add_argument("--only", nargs="+", default=None,
                    help="run only these settings (e.g. logistic@0.3 crossing), to split the study over processes")
    ap.add_argument("--merge", nargs="+", default=None, help="merge the JSON files of split runs into --out")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    names = [f"{sh}@{g}" for sh, g in TUNE + HELD_OUT] + GOF
    unknown = sorted(set(a.only or ()) - set(names))
    if unknown:
        ap.error(f"--only: unknown setting(s) {', '.join(unknown)}; the settings are {', '.join(names)}")
    if a.merge:
        parts = [json.load(open(f)) for f in a.merge]
        res = {"config": dict(parts[0]["config"], only=None, merge=a.merge, out=a.out),
               "coverage": [s for p in parts for s in p["coverage"]], "gof": [s for p in parts for s in p["gof"]],
               "wall_seconds_parts": [p["wall_seconds"] for p in parts]}
        order = [f"{sh}@{g}" for sh, g in TUNE + HELD_OUT] + GOF
        res["coverage"].sort(key=lambda s: order.index(s["name"]))
        res["gof"].sort(key=lambda s: order.index(s["name"]))
        res["summary"] = summarize(res, parts[0]["config"]["level"])
        with open(a.out, "w") as fh:
            json.dump(res, fh, default=float)
            fh.write("\n")
        print(json.dumps(res["summary"], indent=1, default=float))
        return res
    t0 = time.time()
    res = {"config": vars(a), "coverage": [], "gof": []}

    def save(partial=None, kind=None, extra=None):
        if not a.out:
            return
        snap = {k: list(v) if isinstance(v, list) else v for k, v in res.items()}
        if partial is not None:
            snap[kind] = snap[kind] + [dict(partial, **extra)]
        snap["wall_seconds"] = time.time() - t0
        with open(a.out + ".tmp", "w") as fh:
            json.dump(snap, fh, default=float)
        import os
        os.replace(a.out + ".tmp", a.out)
    if a.part in ("all", "coverage"):
        for role, settings in (("tune", TUNE), ("held_out", HELD_OUT)):
            for shape, gamma in settings:
                if a.only and f"{shape}@{gamma}" not in a.only:
                    continue
                info = dict(role=role, shape=shape, gamma=gamma)
                s = run_setting(f"{shape}@{gamma}", lambda r, sh=shape, g=gamma: synthetic_sweep(r, sh, g),
                                a.sweeps, a.bootstrap, a.level, a.seed,
                                checkpoint=lambda p, info=info: save(p, "coverage", info))
                s.update(info)
                res["coverage"].append(s)
                print(s["name"], f"{s['seconds']:.0f} s", flush=True)
    if a.part in ("all", "gof"):
        for name in GOF:
            if a.only and name not in a.only:
                continue
            role, null, make = GOF_SETTINGS[name]
            info = dict(role=role, collapse=null)
            s = run_setting(name, make, a.sweeps, a.bootstrap, a.level, a.seed,
                            checkpoint=lambda p, info=info: save(p, "gof", info))
            s.update(info)
            res["gof"].append(s)
            print(name, f"{s['seconds']:.0f} s", flush=True)
    res["wall_seconds"] = time.time() - t0
    res["summary"] = summarize(res, a.level) if res["coverage"] or res["gof"] else None
    save()
    print(json.dumps(res.get("summary"), indent=1, default=float))
    return res


if __name__ == "__main__":
    main()
