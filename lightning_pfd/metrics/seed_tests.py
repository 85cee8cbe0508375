"""Exact tests for comparing two rows of scores over training seeds (docs/levy.md, "Tests of the
claims"), pure numpy.

A claim such as "LIM has a lower RMSQE than SBM" is judged on a handful of training seeds per
row. Two exact tests, chosen by the design:

* **paired** (:func:`sign_flip_test`): the rows share their training seeds unit by unit (same
  model class, same initialisation, batch order and noise streams), so the per-seed log-ratios
  d_i = log(x_i / y_i) are compared with their sign-flip permutation distribution (exact: all
  2^n sign vectors; Fisher's randomization test of a paired design, statistic sum d_i). With n
  pairs the smallest two-sided p-value is 2^(1-n) (1/16 with 5 seeds).
* **unpaired** (:func:`rank_sum_test`): the Mann–Whitney / Wilcoxon rank-sum test, exact over all
  C(n+m, n) splits of the pooled values with mid-ranks for ties (Mann & Whitney 1947, "On a
  test of whether one of two random variables is stochastically larger than the other"). The
  smallest two-sided p-value with 5 against 5 is 2/252 = 0.0079.

Two-sided p-values are 2 min(P(T <= t), P(T >= t)) capped at 1 (scipy's convention).
Effect sizes: the probability of superiority P(X < Y) + P(X = Y)/2 over all (x, y) pairs
(McGraw & Wong 1992, the "common language effect size"; = 1 - U_X/(n m)) and the
Hodges–Lehmann ratio exp(median of log(x_i/y_j)) (unpaired) or exp(median of d_i) (paired).
:func:`compare` applies the chosen test and turns it into a verdict at a stated level.
"""
from __future__ import annotations

import itertools
import math
from typing import Literal, Sequence

import numpy as np

__all__ = ["sign_flip_test", "rank_sum_test", "prob_superiority", "hodges_lehmann_ratio",
           "holm", "compare", "LEVEL", "MAX_ENUMERATION"]

#: the significance level of the verdicts (two-sided)
LEVEL = 0.05
#: the most sign vectors / splits enumerated exactly
MAX_ENUMERATION = 2_000_000
_TOL = 1e-9  # relative tolerance when comparing permutation statistics with the observed one


def _finite(values, name: str) -> np.ndarray:
    v = np.asarray(list(values), dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ValueError(f"{name}: needs at least one value")
    return v


def _two_sided(dist: np.ndarray, t: float) -> tuple[float, float, float]:
    """(p_less, p_greater, two-sided) of the observed ``t`` in the equally likely ``dist``."""
    tol = _TOL * max(1.0, abs(t))
    p_le = float(np.mean(dist <= t + tol))
    p_ge = float(np.mean(dist >= t - tol))
    return p_le, p_ge, min(1.0, 2.0 * min(p_le, p_ge))


def sign_flip_test(d: Sequence[float]) -> dict:
    """Exact sign-flip permutation test of the paired differences ``d`` (H0: each d_i is
    symmetric about 0), statistic sum d_i over all 2^n sign vectors.

    Returns {"n", "statistic", "p_less", "p_greater", "p"}: p_less = P(T <= t) (the differences
    tend to be negative), p two-sided. NaN p-values when any difference is not finite."""
    v = _finite(d, "d")
    n = v.size
    nan = float("nan")
    if not np.all(np.isfinite(v)):
        return {"n": n, "statistic": nan, "p_less": nan, "p_greater": nan, "p": nan}
    if 2**n > MAX_ENUMERATION:
        raise ValueError(f"d: {n} pairs need 2^{n} sign vectors, more than {MAX_ENUMERATION}")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    dist = signs @ v
    t = float(v.sum())
    p_le, p_ge, p = _two_sided(dist, t)
    return {"n": n, "statistic": t, "p_less": p_le, "p_greater": p_ge, "p": p}


def _midranks(z: np.ndarray) -> np.ndarray:
    order = np.argsort(z, kind="mergesort")
    ranks = np.empty(z.size)
    zs = z[order]
    i = 0
    while i < z.size:
        j = i
        while j + 1 < z.size and zs[j + 1] == zs[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def rank_sum_test(x: Sequence[float], y: Sequence[float]) -> dict:
    """Exact Mann–Whitney test of ``x`` against ``y`` (H0: one law), U_x = R_x - n(n+1)/2 with
    mid-ranks, its permutation distribution over all C(n+m, n) splits of the pooled values.

    Returns {"n", "m", "U", "p_less", "p_greater", "p"}: p_less = P(U <= u) (x tends to be
    smaller), p two-sided. NaN p-values when a value is not finite."""
    a, b = _finite(x, "x"), _finite(y, "y")
    n, m = a.size, b.size
    nan = float("nan")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return {"n": n, "m": m, "U": nan, "p_less": nan, "p_greater": nan, "p": nan}
    if math.comb(n + m, n) > MAX_ENUMERATION:
        raise ValueError(f"x, y: C({n + m}, {n}) splits exceed {MAX_ENUMERATION}")
    r = _midranks(np.concatenate([a, b]))
    u = float(r[:n].sum() - n * (n + 1) / 2)
    idx = np.array(list(itertools.combinations(range(n + m), n)))
    dist = r[idx].sum(1) - n * (n + 1) / 2
    p_le, p_ge, p = _two_sided(dist, u)
    return {"n": n, "m": m, "U": u, "p_less": p_le, "p_greater": p_ge, "p": p}


def prob_superiority(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X < Y) + P(X = Y)/2 over all pairs (x_i, y_j): the probability that a run of ``x`` has
    the lower (better) score; 1 - U_x/(n m). NaN with a non-finite value."""
    a, b = _finite(x, "x"), _finite(y, "y")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("nan")
    lt = (a[:, None] < b[None, :]).mean()
    eq = (a[:, None] == b[None, :]).mean()
    return float(lt + 0.5 * eq)


def hodges_lehmann_ratio(x: Sequence[float], y: Sequence[float], paired: bool = False) -> float:
    """exp(median of log(x_i/y_j)) over all pairs (unpaired) or of log(x_i/y_i) (paired): the
    typical factor between the two rows' scores (< 1: x lower). NaN unless all values are
    finite and > 0."""
    a, b = _finite(x, "x"), _finite(y, "y")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and (a > 0).all() and (b > 0).all()):
        return float("nan")
    if paired:
        if a.size != b.size:
            raise ValueError(f"x, y: paired rows need as many values, got {a.size} and {b.size}")
        return float(np.exp(np.median(np.log(a) - np.log(b))))
    return float(np.exp(np.median(np.log(a)[:, None] - np.log(b)[None, :])))


def holm(pvalues: Sequence[float]) -> list:
    """Holm's step-down adjustment (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): adjusted p_(i) = max_{j <= i} min(1, (k - j + 1) p_(j)); NaN stays NaN and
    does not count."""
    p = np.asarray(list(pvalues), dtype=np.float64)
    out = np.full(p.size, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="mergesort")]
    k, run = order.size, 0.0
    for i, j in enumerate(order):
        run = max(run, min(1.0, (k - i) * p[j]))
        out[j] = run
    return out.tolist()


def compare(better: Sequence[float], worse: Sequence[float],
            design: Literal["paired", "unpaired"] = "unpaired", level: float = LEVEL) -> dict:
    """Test the claim "``better`` has lower scores than ``worse``" (lower is better).

    ``design="paired"``: :func:`sign_flip_test` of log(better_i / worse_i) (the i-th values
    share a training seed); ``"unpaired"``: :func:`rank_sum_test`. Both p-values are computed
    (the other one is reported as ``p_other``); the verdict follows the design's test at
    ``level`` (two-sided): "holds" (p < level, ``better`` lower), "reversed" (p < level,
    ``better`` higher), "undecided" otherwise or with a non-finite / non-positive value. Effect
    sizes: ``prob_better`` (probability of superiority of ``better``) and ``ratio`` (the
    Hodges–Lehmann ratio better/worse, paired or not as the design)."""
    if design not in ("paired", "unpaired"):
        raise ValueError(f"design: must be 'paired' or 'unpaired', got {design!r}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    b, w = _finite(better, "better"), _finite(worse, "worse")
    paired_ok = b.size == w.size
    if design == "paired" and not paired_ok:
        raise ValueError(f"better, worse: a paired design needs as many values, got {b.size} and {w.size}")
    pos = bool(np.all(np.isfinite(b)) and np.all(np.isfinite(w)) and (b > 0).all() and (w > 0).all())
    rs = rank_sum_test(b, w)
    sf = sign_flip_test(np.log(b) - np.log(w)) if (paired_ok and pos) else None
    nan = float("nan")
    if design == "paired":
        test, p_less = "exact sign-flip permutation test of the per-seed log ratios", (sf or {}).get("p_less", nan)
        p, p_other = (sf or {}).get("p", nan), rs["p"]
    else:
        test, p_less, p, p_other = "exact Mann-Whitney rank-sum test", rs["p_less"], rs["p"], \
            (sf["p"] if sf else nan)
    if not math.isfinite(p) or p >= level:
        v = "undecided"
    else:
        v = "holds" if p_less <= 0.5 * p + 1e-12 else "reversed"
    return {"verdict": v, "p": p, "design": design, "test": test, "level": float(level),
            "p_other": p_other, "prob_better": prob_superiority(b, w),
            "ratio": hodges_lehmann_ratio(b, w, paired=design == "paired"),
            "n_better": int(b.size), "n_worse": int(w.size)}
