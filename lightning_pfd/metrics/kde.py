"""The numerics of LOADER (:mod:`lightning_pfd.metrics.tails`): Gaussian kernel density
estimates, their bandwidth rules, the kink-aware Gauss-Legendre quadrature of
int |log max(p, f) - log max(q, f)| dx and the Illinois root finder that places panel edges at
the kinks (p = q, p = f, q = f). Pure numpy on sorted float64 samples; the conventions
(shared bandwidth, density floor, effective window) are documented in the tails module.
"""
from __future__ import annotations

import math
from typing import Literal, Union

import numpy as np

from ..errors import ConfigError
from ..validation import FinitePositiveFloat, PositiveInt, check_args

__all__ = ["bandwidth_rule", "integrate_abs_log_ratio", "BANDWIDTH_RULES"]

BANDWIDTH_RULES = ("silverman", "scott", "normal_reference", "ISJ")
#: a KDE bandwidth: a rule name (:func:`bandwidth_rule`) or a finite number > 0
Bandwidth = Union[Literal[BANDWIDTH_RULES], FinitePositiveFloat]
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_KDE_TRUNCATION = 9.0  # kernels are cut at >= 9 bandwidths (exp(-40.5) = 2.6e-18 of their peak)


# ----------------------------------------------------------------------------- KDE
def bandwidth_rule(x, rule: Literal[BANDWIDTH_RULES] = "silverman") -> float:
    """Rule-of-thumb Gaussian-kernel bandwidth of the 1-D sample ``x``.

    ``"silverman"``: 0.9 min(sigma, IQR/1.34) n^(-1/5) (Silverman 1986, eq. 3.31);
    ``"scott"`` / ``"normal_reference"``: 1.06 sigma n^(-1/5) (normal reference rule);
    ``"ISJ"``: Improved Sheather-Jones (KDEpy). sigma = std with ddof 1. When the IQR is 0
    (ties), Silverman's rule uses sigma. Degenerate samples (n < 2 or all equal) get
    1e-3 max(1, |x_0|).
    """
    check_args(bandwidth_rule, {"rule": rule})
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size < 2 or np.ptp(x) == 0:
        return 1e-3 * max(1.0, abs(float(x[0])))
    n = x.size
    sigma = float(np.std(x, ddof=1))
    if rule == "ISJ":
        from KDEpy.bw_selection import improved_sheather_jones

        bw = float(improved_sheather_jones(x[:, None]))
    elif rule == "silverman":
        q75, q25 = np.percentile(x, [75.0, 25.0])
        iqr = float(q75 - q25) / 1.34
        spread = min(sigma, iqr) if iqr > 0 else sigma
        bw = 0.9 * spread * n ** (-0.2)
    else:  # scott / normal_reference
        bw = 1.06 * sigma * n ** (-0.2)
    return bw if bw > 0 and math.isfinite(bw) else 1e-3 * float(np.ptp(x))


def _bandwidth(x: np.ndarray, bandwidth) -> float:
    """A number (checked by the caller's declared :data:`Bandwidth`) as is, or
    :func:`bandwidth_rule` of ``x`` (a rule name)."""
    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool):
        return float(bandwidth)
    return bandwidth_rule(x, bandwidth)


class _TruncatedKDE:
    """Gaussian KDE of a sorted sample, evaluated exactly at anchor + t (kernels cut at ``radius``).

    The difference anchor - x_j is formed first, then t is added, so with the anchor a sample
    value and t a small local offset, points next to huge samples keep their resolution.
    """

    _BUDGET = 1 << 21  # (point, sample) pairs per chunk: bounded memory

    def __init__(self, sorted_samples: np.ndarray, h: float, radius: float):
        self.s, self.h, self.radius = sorted_samples, float(h), float(radius)
        self.norm = 1.0 / (sorted_samples.size * self.h * _SQRT_2PI)

    def __call__(self, anchor: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        anchor = np.asarray(anchor, dtype=np.float64).reshape(-1)
        t = np.zeros_like(anchor) if t is None else np.asarray(t, dtype=np.float64).reshape(-1)
        x = anchor + t
        lo = np.searchsorted(self.s, x - self.radius, "left")
        hi = np.searchsorted(self.s, x + self.radius, "right")
        cnt = (hi - lo).astype(np.int64)
        out = np.zeros(x.size)
        csum = np.cumsum(cnt)
        start, Q = 0, x.size
        while start < Q:
            base = int(csum[start - 1]) if start else 0
            stop = max(int(np.searchsorted(csum, base + self._BUDGET, "right")), start + 1)
            c = cnt[start:stop]
            P = int(c.sum())
            if P:
                q = np.repeat(np.arange(stop - start), c)
                first = np.cumsum(c) - c
                idx = lo[start:stop][q] + (np.arange(P) - np.repeat(first, c))
                z = ((anchor[start:stop][q] - self.s[idx]) + t[start:stop][q]) / self.h
                out[start:stop] = np.bincount(q, weights=np.exp(-0.5 * z * z), minlength=stop - start)
            start = stop
        return out * self.norm


def _kde_peak(sorted_ref: np.ndarray, h: float) -> float:
    """Max of the reference KDE: over (up to 257) evenly spaced order statistics, then on a
    grid of step h/16 over +-h around the best of them."""
    kde = _TruncatedKDE(sorted_ref, h, _KDE_TRUNCATION * h)
    idx = np.unique(np.linspace(0, sorted_ref.size - 1, min(sorted_ref.size, 257)).round().astype(np.int64))
    probe = sorted_ref[idx]
    d = kde(probe)
    x0 = probe[int(np.argmax(d))]
    t = np.linspace(-h, h, 33)
    return float(max(d.max(), kde(np.full(t.size, x0), t).max()))


def _legendre_nodes(window: tuple[float, float], panels: int, nodes: int):
    """Composite Gauss–Legendre nodes and weights on [lo, hi] (panels x nodes)."""
    lo, hi = window
    z, w = np.polynomial.legendre.leggauss(int(nodes))
    edges = np.linspace(lo, hi, int(panels) + 1)
    half = 0.5 * np.diff(edges)
    mid = 0.5 * (edges[1:] + edges[:-1])
    x = (mid[:, None] + half[:, None] * z[None, :]).reshape(-1)
    wt = (half[:, None] * w[None, :]).reshape(-1)
    return x, wt


# ----------------------------------------------------------------------------- quadrature
def _check_window(window) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ConfigError("window", "must be None (the whole real line), 'reference' or a pair "
                          "(lo, hi) of finite numbers", value=window) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("window", "must satisfy lo < hi (finite)", value=window)
    return lo, hi


def integrate_abs_log_ratio(p, q, window, floor: FinitePositiveFloat, panels: PositiveInt = 64,
                            nodes: PositiveInt = 16) -> float:
    """int_window |log max(p, floor) - log max(q, floor)| dx by composite Gauss–Legendre.

    ``p`` and ``q`` are callables mapping a float64 numpy array of points to densities
    (a generic helper for analytic densities; LOADER itself uses kink-aware panels).
    """
    check_args(integrate_abs_log_ratio, locals())
    lo, hi = _check_window(window)
    floor, panels, nodes = float(floor), int(panels), int(nodes)
    x, w = _legendre_nodes((lo, hi), panels, nodes)
    lp = np.log(np.maximum(np.asarray(p(x), dtype=np.float64), floor))
    lq = np.log(np.maximum(np.asarray(q(x), dtype=np.float64), floor))
    return float(np.sum(w * np.abs(lp - lq)))


def _floor_reach(h: float, f: float) -> float:
    """R with phi_h(R) = f: any Gaussian KDE of bandwidth h is < f farther than R from its data."""
    a = f * h * _SQRT_2PI
    return h * math.sqrt(2.0 * math.log(1.0 / a)) if a < 1.0 else 0.0


def _illinois(fun, cid, a, b, fa, fb, tol: float, iters: int = 40):
    """Roots of fun(cid, t) bracketed by [a, b] (fa fb < 0), vectorized Illinois method."""
    a, b, fa, fb = a.copy(), b.copy(), fa.copy(), fb.copy()
    side = np.zeros(a.size, dtype=np.int8)
    c = 0.5 * (a + b)
    active = np.ones(a.size, dtype=bool)
    for it in range(iters):
        if not active.any():
            break
        i = np.nonzero(active)[0]
        denom = fa[i] - fb[i]
        cn = np.where(denom != 0, (fa[i] * b[i] - fb[i] * a[i]) / np.where(denom != 0, denom, 1.0),
                      0.5 * (a[i] + b[i]))
        bad = ~((cn > np.minimum(a[i], b[i])) & (cn < np.maximum(a[i], b[i])))
        cn = np.where(bad, 0.5 * (a[i] + b[i]), cn)
        fc = fun(cid[i], cn)
        moved = np.abs(cn - c[i])
        c[i] = cn
        right = fc * fb[i] > 0  # root between a and c: c replaces b
        left = fc * fa[i] > 0  # root between c and b: c replaces a
        # Illinois: halve the retained end's value when the same end is replaced twice
        fa_new = np.where(right & (side[i] == -1), 0.5 * fa[i], fa[i])
        fb_new = np.where(left & (side[i] == 1), 0.5 * fb[i], fb[i])
        b[i] = np.where(right, cn, b[i])
        fb[i] = np.where(right, fc, fb_new)
        a[i] = np.where(left, cn, a[i])
        fa[i] = np.where(left, fc, fa_new)
        side[i] = np.where(right, -1, np.where(left, 1, 0))
        done = (fc == 0) | ((moved <= tol) & (it > 0)) | (np.abs(b[i] - a[i]) <= tol)
        active[i[done]] = False
    return c


def _loader_details(g: np.ndarray, r: np.ndarray, h: float, f: float, window,
                    panels: int, nodes: int) -> dict:
    """LOADER of sorted samples g (model) and r (reference), shared bandwidth h, floor f."""
    u = np.sort(np.concatenate([g, r]))
    R = _floor_reach(h, f)
    # kernel truncation: contributions below 1e-12 f are dropped (>= 9 h)
    trunc = h * max(_KDE_TRUNCATION, math.sqrt(2.0 * math.log(max(1.0, 1e12 / (f * h * _SQRT_2PI)))))
    kp, kq = _TruncatedKDE(g, h, trunc), _TruncatedKDE(r, h, trunc)
    lf = math.log(f)
    if window is None:
        lo, hi = float(u[0]) - R, float(u[-1]) + R
        length = float(u[-1] - u[0]) + 2.0 * R
    else:
        lo, hi = window
        length = hi - lo
    out = dict(window=(lo, hi), floor=f, bandwidth=h, reach=R, covered_length=0.0)
    empty = dict(value=0.0, floor_fraction_gen=1.0, floor_fraction_ref=1.0, floor_fraction_both=1.0)
    if R <= 0.0 or length <= 0.0:
        return {**out, **empty}
    # clusters of samples closer than 2R: outside their [first - R, last + R] both KDEs are < f
    brk = np.nonzero(np.diff(u) > 2.0 * R)[0]
    first = np.concatenate([[0], brk + 1])
    last = np.concatenate([brk, [u.size - 1]])
    anchor = u[first]
    a = np.full(anchor.size, -R)
    b = (u[last] - anchor) + R
    if window is not None:  # (with window None, lo/hi may have lost R to rounding: no clipping)
        a, b = np.maximum(a, lo - anchor), np.minimum(b, hi - anchor)
    keep = a < b
    anchor, a, b = anchor[keep], a[keep], b[keep]
    if anchor.size == 0:
        return {**out, **empty}
    covered = float(np.sum(b - a))

    def logs(cid, t):
        return (np.log(np.maximum(kp(anchor[cid], t), 1e-300)),
                np.log(np.maximum(kq(anchor[cid], t), 1e-300)))

    def kink_functions(lp, lq):  # the integrand |max(lp, lf) - max(lq, lf)| has kinks only at
        return np.stack([lp - lf, lq - lf, lp - lq])  # roots of these (p = f, q = f, p = q)

    # panel edges every <= h/panels on each cluster interval
    n_p = np.maximum(1, np.ceil((b - a) / (h / panels)).astype(np.int64))
    cid = np.repeat(np.arange(anchor.size), n_p + 1)
    k = np.arange(cid.size) - np.repeat(np.cumsum(n_p + 1) - (n_p + 1), n_p + 1)
    t = a[cid] + (b - a)[cid] * (k / n_p[cid])
    vals = kink_functions(*logs(cid, t))  # (3, E)
    same = cid[1:] == cid[:-1]
    which, j = np.nonzero(same[None, :] & (vals[:, :-1] * vals[:, 1:] < 0))
    extra_c, extra_t = [cid], [t]
    if j.size:  # one vectorized Illinois search for all bracketed kinks
        def fun(sel, tq):
            return kink_functions(*logs(cid[j[sel]], tq))[which[sel], np.arange(sel.size)]

        roots = _illinois(fun, np.arange(j.size), t[j], t[j + 1], vals[which, j],
                          vals[which, j + 1], tol=1e-8 * h)
        extra_c.append(cid[j])
        extra_t.append(roots)
    cc, tt = np.concatenate(extra_c), np.concatenate(extra_t)
    order = np.lexsort((tt, cc))
    cc, tt = cc[order], tt[order]
    pan = np.nonzero((cc[1:] == cc[:-1]) & (tt[1:] > tt[:-1]))[0]
    z, w = np.polynomial.legendre.leggauss(nodes)
    half = 0.5 * (tt[pan + 1] - tt[pan])
    mid = 0.5 * (tt[pan + 1] + tt[pan])
    nc = np.repeat(cc[pan], nodes)
    nt = (mid[:, None] + half[:, None] * z[None, :]).reshape(-1)
    wt = (half[:, None] * w[None, :]).reshape(-1)
    lp, lq = logs(nc, nt)
    below_p, below_q = lp < lf, lq < lf
    value = float(np.sum(wt * np.abs(np.maximum(lp, lf) - np.maximum(lq, lf))))
    outside = max(length - covered, 0.0)  # both densities < f there
    frac = lambda m: float((outside + np.sum(wt * m)) / length)  # noqa: E731
    return {**out, "value": value, "covered_length": covered,
            "floor_fraction_gen": frac(below_p), "floor_fraction_ref": frac(below_q),
            "floor_fraction_both": frac(below_p & below_q)}
