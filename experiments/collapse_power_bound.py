"""An upper bound on the power of any goodness-of-fit test of a collapse on the synthetic
non-collapses of ``experiments/collapse_coverage.py`` (docs/sweeps_analysis.md, "Why a deformation
test").

For one sweep with noise-free cell means μ_i and known standard errors se_i = sd_i/√K_i, let
d² = min over γ, a spline master curve F and per-width levels a_w of Σ_i (μ_i − F(x_i) − a_w)²/se_i²
(x = log₂N − γ log₂|θ|; F a cubic B-spline with the knots of ``master_curve``; γ on a 0.005 grid
over [−0.5, 1.5]): the Mahalanobis distance from the sweep to the closest exact collapse of that
class. With Gaussian noise of known variance, no level-α test of "the sweep collapses" can reject
this sweep with probability above that of the Neyman–Pearson test of the closest collapse against
it, Φ(d − z_{1−α}); a richer class of master curves only lowers d, so the bound holds for it too.
It is an upper limit, not a target: the sweeps' noise is t(5), not Gaussian, and a test that does
not know the direction of the departure has less power at the same d.

    python experiments/collapse_power_bound.py --sweeps 200

prints the mean bound per non-collapse setting (the recorded numbers are in docs/sweeps_analysis.md).
"""
from __future__ import annotations

import argparse
import math

import numpy as np
from scipy.stats import norm

from collapse_coverage import ALTERNATIVES, synthetic_sweep
from lightning_pfd.analysis.scaling import spline_basis


def distance2(ln, lp, mu, se, gamma):
    """min over F and a_w of the weighted RSS of the collapse model at γ (least squares)."""
    x = ln - gamma * lp
    D, _ = spline_basis(x)
    sizes = np.unique(lp)
    X = np.hstack([D, (lp[:, None] == sizes[None, 1:]).astype(float)])
    beta = np.linalg.lstsq(X / se[:, None], mu / se, rcond=None)[0]
    r = (mu - X @ beta) / se
    return float(r @ r)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args(argv)
    grid = np.linspace(-0.5, 1.5, 401)
    for name in ALTERNATIVES:
        rng = np.random.default_rng([a.seed, sum(map(ord, name))])
        bound = []
        for _ in range(a.sweeps):
            truth = {}
            synthetic_sweep(rng, None, 0.5, drift=0.0, alternative=name, truth=truth)
            keys = sorted(truth)
            ln = np.log2([k[0] for k in keys])
            lp = np.log2([k[1] for k in keys])
            sd, mu, K = (np.array([truth[k][i] for k in keys], dtype=float) for i in range(3))
            d2 = min(distance2(ln, lp, mu, sd / np.sqrt(K), g) for g in grid)
            bound.append(norm.cdf(math.sqrt(d2) - norm.ppf(1 - a.alpha)))
        b = np.array(bound)
        print(f"{name:15s} mean bound {b.mean():.3f}  10 % quantile {np.quantile(b, 0.1):.3f}  "
              f"sweeps below 0.9: {np.mean(b < 0.9):.3f}", flush=True)


if __name__ == "__main__":
    main()
