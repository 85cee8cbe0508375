"""Coverage study of the sweep report's collapse fit on synthetic sweeps with a known exponent γ.

Each synthetic sweep has the design of the recorded ``mtog_digits`` sweep (4 widths with
|θ| = 29,600 … 636,864, N = 2⁵ … 2¹², K = 2 repeats) and curves that collapse exactly in
x = log₂(N/|θ|^γ) *after* a width-dependent floor (E_gen) or ceiling (E_mem) is removed, with
Gaussian repeat noise of the recorded size (rms per-repeat sd 0.067 for E_gen and 0.090 for E_mem,
heteroscedastic: each cell's sd is that times a log-normal factor). For every sweep the report's
fit (:func:`lightning_pfd.analysis.scaling.bootstrap_collapse`, E_gen − floor, floor = E_gen at
the largest N of each width) runs with B bootstrap resamples; the study records the bias and sd
of γ̂, the coverage of the nominal 90 % percentile interval, and how often S(γ̂) stays under the
within-noise threshold (the curves do collapse, so that is the rate of a correct "within noise").

    python experiments/collapse_coverage.py --sweeps 200 --bootstrap 200 --gammas 0.3 0.5 0.7 --out experiments/results/collapse_coverage.json

Single-threaded; per sweep 1 + B fits of ≈ 10 ms each. The recorded run (three processes, one per
γ, on the shared 2-core machine) took 26–27 min per γ. Results: docs/sweeps_analysis.md.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from lightning_pfd.analysis.scaling import bootstrap_collapse, group_cells

LOG2_PARAMS = np.log2([29600, 67200, 191552, 636864])
LOG2_N = np.arange(5, 13)
FLOORS = (2.7, 2.0, 1.6, 1.5)      # E_gen at large N per width (recorded: 2.71, 2.01, 1.63, 1.53)
CEILINGS = (4.4, 3.6, 3.3, 3.2)    # E_mem at large N per width (recorded: 4.18, 3.57, 3.26, 3.16)
NOISE = (0.067, 0.090)             # rms per-repeat sd of E_gen, E_mem in the recorded sweep


def synthetic_sweep(gamma: float, rng: np.random.Generator, *, K: int = 2, noise=NOISE,
                    hetero: float = 0.7, width: float = 0.8, center: float = 7.5):
    """Rows (n_train, n_params, [E_gen, E_mem]) of one synthetic sweep: with
    x' = log₂N − γ (log₂|θ| − mean log₂|θ|) − ``center``,
    E_gen = floor_w + 2 σ(−x'/width), E_mem = ceiling_w − σ(−(x' − ½)/width), σ the logistic;
    each cell's noise sd = ``noise`` × exp(``hetero`` ξ − hetero²) (ξ ~ N(0, 1), rms ≈ noise)."""
    sbar = LOG2_PARAMS.mean()
    n, p, v = [], [], []
    for s, fl, ce in zip(LOG2_PARAMS, FLOORS, CEILINGS):
        for ln in LOG2_N:
            x = ln - gamma * (s - sbar) - center
            g = fl + 2.0 / (1 + math.exp(x / width))
            m = ce - 1.0 / (1 + math.exp((x - 0.5) / width))
            sd = np.asarray(noise) * math.exp(hetero * rng.standard_normal() - hetero ** 2)
            for _ in range(K):
                n.append(int(2 ** ln))
                p.append(int(round(2 ** s)))
                v.append([g + sd[0] * rng.standard_normal(), m + sd[1] * rng.standard_normal()])
    return n, p, np.array(v)


QUANTITIES = {"e_gen_floor": ([0], 1), "e_mem_floor": ([1], 1)}  # (columns, floor_points)


def run(gammas, sweeps, B, level, seed, quantities, method, shifts):
    out = {}
    for q in quantities:
        cols, fp = QUANTITIES[q]
        for gamma in gammas:
            rng = np.random.default_rng([seed, int(round(1000 * gamma))])
            est, cover, width, within, s_hat, failed = [], 0, [], 0, [], 0
            t0 = time.time()
            for r in range(sweeps):
                cells = group_cells(*synthetic_sweep(gamma, rng))
                f = bootstrap_collapse(cells, cols, B=B, seed=r, level=level, floor_points=fp, method=method,
                                       shifts=shifts)
                if f.gamma is None or f.interval is None:
                    failed += 1
                    continue
                est.append(f.gamma)
                cover += f.interval[0] <= gamma <= f.interval[1]
                width.append(f.interval[1] - f.interval[0])
                within += bool(f.within_noise)
                s_hat.append(f.score.spread)
            n = len(est)
            cov = cover / n
            out[f"{q}@{gamma:g}"] = {
                "quantity": q, "gamma": gamma, "sweeps": sweeps, "fitted": n, "failed": failed,
                "mean_gamma_hat": float(np.mean(est)), "bias": float(np.mean(est) - gamma),
                "sd_gamma_hat": float(np.std(est, ddof=1)),
                "coverage": cov, "coverage_se": math.sqrt(cov * (1 - cov) / n),
                "median_interval_width": float(np.median(width)),
                "within_noise_rate": within / n,
                "s_hat_quantiles_5_50_95": [float(v) for v in np.quantile(s_hat, [0.05, 0.5, 0.95])],
                "seconds": time.time() - t0}
            print(json.dumps(out[f"{q}@{gamma:g}"]), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--level", type=float, default=0.90)
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    ap.add_argument("--quantities", nargs="+", default=["e_gen_floor"], choices=sorted(QUANTITIES))
    ap.add_argument("--method", default="normal", choices=["seeds", "normal"])
    ap.add_argument("--no-shifts", dest="shifts", action="store_false",
                    help="floors from the largest N only (no jointly fitted per-width shifts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = {"config": {k: getattr(a, k) for k in ("sweeps", "bootstrap", "level", "gammas", "quantities",
                                                  "method", "shifts", "seed")},
           "design": {"log2_params": LOG2_PARAMS.tolist(), "log2_n": LOG2_N.tolist(), "K": 2,
                      "floors": FLOORS, "ceilings": CEILINGS, "noise": NOISE, "hetero": 0.7},
           "results": run(a.gammas, a.sweeps, a.bootstrap, a.level, a.seed, a.quantities, a.method, a.shifts)}
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=2)
            fh.write("\n")


if __name__ == "__main__":
    main()
