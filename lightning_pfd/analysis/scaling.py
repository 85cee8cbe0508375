"""Scaling analysis of a sweep over the training-set size N and the model size |θ| (pure numpy/scipy).

Implements the analysis half of the PFD paper's scaling study ("Understanding Generalization in
Diffusion Distillation via Probability Flow Distance"); the definitions, with equations, are in
``docs/sweeps_analysis.md``:

- **Data collapse** (§4.1, Fig. 2): the curves E(N) of several model sizes collapse onto one master
  curve when plotted against x = log₂(N / |θ|^γ) = log₂N − γ·log₂|θ|; the paper reports γ = ½.
  :func:`fit_collapse` estimates γ by minimising a leave-one-curve-out spread
  (:func:`collapse_spread`), :func:`bootstrap_collapse` gives a percentile interval.
- **MtoG transition** (§4.1): the N at which E_gen = E_mem on each model's mean curve
  (:func:`transition_point`), and its position on the collapsed axis.
- **Bias–variance** (§4.3, Def. 3, eq. 9, 45): :func:`bias_variance_cell` decomposes the mean
  E_gen² of K students of one (N, |θ|) cell; it delegates to
  :func:`lightning_pfd.metrics.bias_variance_decomposition` (the metric the project tests), imported
  lazily so that the rest of this module needs no torch.
- **Practical metrics in Ψ space** (App. C.4, Fig. 7): :func:`psi_fid` (Fréchet distance of
  Gaussian fits, FID) and :func:`psi_kid` (unbiased MMD² with the cubic polynomial kernel, KID).

Everything is float64 and deterministic (the bootstrap takes a seeded ``numpy.random.Generator``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError

__all__ = [
    "Cell", "CollapseScore", "CollapseFit", "group_cells", "cell_means", "collapse_coordinate",
    "collapse_spread", "fit_collapse", "bootstrap_collapse", "crossings", "transition_point",
    "bias_variance_cell", "psi_fid", "psi_kid", "REFERENCE_GAMMAS",
]

#: γ values whose spread is always reported: N alone (γ = 0) and the paper's N/√|θ| (γ = ½).
REFERENCE_GAMMAS = (0.0, 0.5)
_EPS = 1e-12


# ----------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class Cell:
    """All successful repeats of one (N, |θ|) point: ``samples`` (K, Q) holds Q quantities
    (e.g. E_gen, E_mem) for each of the K seeds."""

    n_train: int
    n_params: int
    samples: np.ndarray

    @property
    def log2_n(self) -> float:
        return math.log2(self.n_train)

    @property
    def log2_params(self) -> float:
        return math.log2(self.n_params)


def group_cells(n_train: Sequence[int], n_params: Sequence[int], values) -> List[Cell]:
    """Group R repeats into cells by (N, |θ|); ``values`` is (R,) or (R, Q). Rows with a
    non-finite value are dropped (a diverged run has no E_gen). Cells are sorted by (|θ|, N)."""
    n = np.asarray(n_train)
    p = np.asarray(n_params)
    v = np.asarray(values, dtype=np.float64)
    v = v[:, None] if v.ndim == 1 else v
    if n.ndim != 1 or p.shape != n.shape or v.ndim != 2 or v.shape[0] != n.shape[0]:
        raise ConfigError("values", "n_train, n_params and values must have one row per repeat",
                          value=(n.shape, p.shape, v.shape))
    if n.size and (np.any(n < 1) or np.any(p < 1)):
        raise ConfigError("n_train/n_params", "must be positive integers (they enter log₂)",
                          value=(n.min(), p.min()))
    keep = np.isfinite(v).all(1)
    cells = {}
    for ni, pi, vi in zip(n[keep], p[keep], v[keep]):
        cells.setdefault((int(pi), int(ni)), []).append(vi)
    return [Cell(n_train=k[1], n_params=k[0], samples=np.array(cells[k]))
            for k in sorted(cells)]


def cell_means(cells: Sequence[Cell]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log2_n (P,), log2_params (P,), means (P, Q))`` of the cells (mean over seeds)."""
    return (np.array([c.log2_n for c in cells]), np.array([c.log2_params for c in cells]),
            np.array([c.samples.mean(0) for c in cells]))


# ----------------------------------------------------------------------------- collapse
def collapse_coordinate(log2_n, log2_params, gamma: float) -> np.ndarray:
    """x = log₂(N / |θ|^γ) = log₂N − γ·log₂|θ| (PFD paper Fig. 2 right uses γ = ½)."""
    return np.asarray(log2_n, dtype=np.float64) - float(gamma) * np.asarray(log2_params, dtype=np.float64)


@dataclass(frozen=True)
class CollapseScore:
    """The collapse objective at one γ.

    ``spread``: normalised leave-one-curve-out residual (see :func:`collapse_spread`), inf when
    too few points overlap another curve; ``rms``: the un-normalised RMS residual of each
    quantity; ``n_overlap``/``n_points``: points that lie inside another curve's range / all."""

    gamma: float
    spread: float
    rms: Tuple[float, ...]
    n_overlap: int
    n_points: int

    def to_dict(self) -> dict:
        return {"gamma": self.gamma, "spread": _finite_or_none(self.spread),
                "rms": [_finite_or_none(r) for r in self.rms], "n_overlap": self.n_overlap,
                "n_points": self.n_points}


class _Curves:
    """The points grouped by model size, each curve sorted by log₂N (its order does not depend on
    γ: within one model size the shift γ·log₂|θ| is a constant)."""

    def __init__(self, log2_n: np.ndarray, log2_params: np.ndarray, y: np.ndarray):
        self.size, self.n_points, self.q = [], y.shape[0], y.shape[1]
        self.x, self.y, self._cache = [], [], {}
        for v in np.unique(log2_params):
            idx = np.flatnonzero(log2_params == v)
            idx = idx[np.argsort(log2_n[idx], kind="stable")]
            self.size.append(float(v))
            self.x.append(log2_n[idx])
            self.y.append(y[idx])

    def _interpolant(self, m: int):
        """Curve m's interpolant on its own log₂N nodes (built once): PCHIP (shape-preserving
        piecewise cubic, no overshoot), linear for two nodes, constant for one."""
        if m not in self._cache:
            from scipy.interpolate import PchipInterpolator

            x, y = self.x[m], self.y[m]
            if x.size >= 3:
                self._cache[m] = PchipInterpolator(x, y, axis=0, extrapolate=True)
            elif x.size == 2:
                self._cache[m] = lambda u, x=x, y=y: y[0] + ((u - x[0]) / (x[1] - x[0]))[..., None] * (y[1] - y[0])
            else:
                self._cache[m] = lambda u, y=y: np.broadcast_to(y[0], (*np.shape(u), y.shape[1]))
        return self._cache[m]

    def usable(self) -> int:
        """Number of curves with at least two distinct N (a curve needs two to interpolate)."""
        return sum(1 for x in self.x if np.unique(x).size >= 2)

    def residuals(self, gammas: np.ndarray):
        """Leave-one-curve-out residuals for every γ at once: ``(r (G, P, Q), covered (G, P))``.

        A point of curve k at x = log₂N_k − γ s_k is compared with curve l at the same x, i.e. at
        log₂N = log₂N_k − γ (s_k − s_l) on l's own (γ-independent) nodes: one vectorised
        interpolation per pair of curves covers the whole γ grid."""
        G = gammas.size
        r_all, cov_all = [], []
        for k, (xk, yk) in enumerate(zip(self.x, self.y)):
            acc = np.zeros((G, xk.size, self.q))
            cnt = np.zeros((G, xk.size))
            for m, (xl, yl) in enumerate(zip(self.x, self.y)):
                if m == k:
                    continue
                u = xk[None, :] - gammas[:, None] * (self.size[k] - self.size[m])
                inside = (u >= xl[0] - _EPS) & (u <= xl[-1] + _EPS)
                if not inside.any():
                    continue
                val = self._interpolant(m)(np.clip(u, xl[0], xl[-1]))
                acc += np.where(inside[..., None], val, 0.0)
                cnt += inside
            cov = cnt > 0
            r_all.append(np.where(cov[..., None], yk[None] - acc / np.maximum(cnt, 1)[..., None], 0.0))
            cov_all.append(cov)
        return np.concatenate(r_all, axis=1), np.concatenate(cov_all, axis=1)

    def scores(self, gammas, scale: np.ndarray, min_overlap: float) -> List[CollapseScore]:
        """:class:`CollapseScore` of every γ in ``gammas``."""
        gammas = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
        r, cov = self.residuals(gammas)
        n_cov = cov.sum(1)
        ms = (r ** 2).sum(1) / np.maximum(n_cov, 1)[:, None]
        enough = n_cov >= max(3, min_overlap * self.n_points)
        spread = np.where(enough, np.sqrt((ms / scale ** 2).mean(1)), np.inf)
        rms = np.where(enough[:, None], np.sqrt(ms), np.inf)
        return [CollapseScore(float(g), float(s), tuple(rr.tolist()), int(c), self.n_points)
                for g, s, rr, c in zip(gammas, spread, rms, n_cov)]


def _scales(y: np.ndarray) -> np.ndarray:
    s = y.std(axis=0)
    return np.where(s > 0, s, 1.0)


def _as_points(log2_n, log2_params, values):
    x0 = np.asarray(log2_n, dtype=np.float64)
    lp = np.asarray(log2_params, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    if x0.ndim != 1 or lp.shape != x0.shape or y.ndim != 2 or y.shape[0] != x0.shape[0]:
        raise ConfigError("values", "log2_n, log2_params and values must have one row per point",
                          value=(x0.shape, lp.shape, y.shape))
    if not (np.isfinite(x0).all() and np.isfinite(lp).all() and np.isfinite(y).all()):
        raise ConfigError("values", "must be finite (drop failed or diverged repeats first)")
    return x0, lp, y


def collapse_spread(log2_n, log2_params, values, gamma: float, *, min_overlap: float = 0.25,
                    scale: Optional[Sequence[float]] = None) -> CollapseScore:
    """The collapse objective S(γ) (docs/sweeps_analysis.md, "Collapse objective").

    Points are cell means (one per (N, |θ|)); ``values`` is (P,) or (P, Q). With x = log₂N −
    γ·log₂|θ|, every point of curve k is compared with the master curve made of the *other*
    curves: the mean of their interpolants (PCHIP: shape-preserving piecewise cubic) at its x,
    over the curves whose x-range contains it (no extrapolation; points outside every other
    curve do not count). Then

        S(γ) = ( (1/Q) Σ_q  mean_overlap r_q² / s_q² )^{1/2},

    s_q = the standard deviation of quantity q over all points (``scale``), so S is
    dimensionless, 0 for a perfect collapse and ≈ 1 when the curves disagree by their own spread;
    with Q > 1 the quantities are collapsed jointly (one γ for E_gen and E_mem, as in Fig. 2).
    S = inf when fewer than max(3, ``min_overlap``·P) points overlap another curve: a γ that
    pushes the curves apart cannot win by comparing a few points of flat tails. (The idea of
    comparing each curve with the others inside their overlap follows Bhattacharjee & Seno 2001,
    "A measure of data collapse for scaling".)
    """
    x0, lp, y = _as_points(log2_n, log2_params, values)
    s = _scales(y) if scale is None else np.asarray(scale, dtype=np.float64).reshape(-1)
    return _Curves(x0, lp, y).scores(float(gamma), s, float(min_overlap))[0]


@dataclass
class CollapseFit:
    """Result of :func:`fit_collapse` (+ :func:`bootstrap_collapse` when ``interval`` is set).

    ``gamma`` is None when no γ in the bounds leaves enough overlap (or fewer than two model
    sizes with two N each). ``references`` maps each γ of :data:`REFERENCE_GAMMAS` to its score."""

    gamma: Optional[float]
    score: Optional[CollapseScore]
    references: Dict[float, CollapseScore]
    grid: np.ndarray
    objective: np.ndarray
    reason: str = ""
    interval: Optional[Tuple[float, float]] = None
    level: Optional[float] = None
    method: Optional[str] = None
    bootstrap: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bootstrap_failed: int = 0

    def to_dict(self) -> dict:
        return {"gamma": self.gamma, "score": None if self.score is None else self.score.to_dict(),
                "references": {str(g): s.to_dict() for g, s in self.references.items()},
                "reason": self.reason, "interval": None if self.interval is None else list(self.interval),
                "level": self.level, "method": self.method, "bootstrap_size": int(self.bootstrap.size),
                "bootstrap_failed": self.bootstrap_failed}


def _check_fit_options(bounds, step, min_overlap):
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ConfigError("bounds", "must be two numbers (lo, hi)", value=bounds) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("bounds", "must be two finite numbers lo < hi", value=tuple(bounds))
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= hi - lo:
        raise ConfigError("step", "must be a number in (0, hi - lo]", value=step)
    if isinstance(min_overlap, bool) or not isinstance(min_overlap, (int, float)) \
            or not 0 <= min_overlap <= 1:
        raise ConfigError("min_overlap", "must be a fraction in [0, 1]", value=min_overlap)
    return lo, hi


#: zoom levels of the refinement: each searches ±1 step of the previous level on a finer grid.
_REFINE = (50, 50)


def fit_collapse(log2_n, log2_params, values, *, bounds=(-0.5, 1.5), step: float = 0.025,
                 min_overlap: float = 0.25) -> CollapseFit:
    """γ̂ = argmin over ``bounds`` of the collapse spread S(γ) (:func:`collapse_spread`).

    A grid of ``step`` (81 points on the default [−0.5, 1.5]) locates the best γ; two zooms then
    search ±1 step around it on grids 50× finer each (resolution step/2500 = 1e-5 by default).
    The objective is piecewise smooth (the overlap set changes with γ), so a grid, not a
    derivative-based search, is used throughout. ``values`` (P,) fits one quantity, (P, Q) the
    quantities jointly. The spreads at γ = 0 and γ = ½ are reported alongside.
    """
    lo, hi = _check_fit_options(bounds, step, min_overlap)
    x0, lp, y = _as_points(log2_n, log2_params, values)
    curves, s, mo = _Curves(x0, lp, y), _scales(y), float(min_overlap)
    refs = dict(zip(REFERENCE_GAMMAS, curves.scores(np.array(REFERENCE_GAMMAS), s, mo)))
    grid = np.linspace(lo, hi, int(round((hi - lo) / step)) + 1)
    if curves.usable() < 2:
        return CollapseFit(None, None, refs, grid, np.full(grid.size, np.inf),
                           reason="needs at least two model sizes with two or more N each")
    scores = curves.scores(grid, s, mo)
    obj = np.array([sc.spread for sc in scores])
    if not np.isfinite(obj).any():
        return CollapseFit(None, None, refs, grid, obj,
                           reason="no γ in the bounds leaves enough points overlapping another curve")
    best = scores[int(np.argmin(obj))]
    h = grid[1] - grid[0] if grid.size > 1 else hi - lo
    for factor in _REFINE:
        fine = np.linspace(max(lo, best.gamma - h), min(hi, best.gamma + h), 2 * factor + 1)
        cand = min(curves.scores(fine, s, mo), key=lambda sc: sc.spread)
        best = cand if cand.spread < best.spread else best
        h /= factor
    return CollapseFit(best.gamma, best, refs, grid, obj)


def _check_bootstrap(B, level, method):
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 1:
        raise ConfigError("B", "must be a positive integer (bootstrap resamples)", value=B)
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ConfigError("level", "must be a probability in (0, 1)", value=level)
    if method not in ("auto", "seeds", "curves"):
        raise ConfigError("method", "unknown bootstrap method", value=method,
                          accepted=["auto", "seeds", "curves"])


def bootstrap_collapse(cells: Sequence[Cell], columns: Optional[Sequence[int]] = None, *,
                       B: int = 200, seed: int = 0, level: float = 0.95, method: str = "auto",
                       **fit_kwargs) -> CollapseFit:
    """:func:`fit_collapse` on the cell means plus a percentile bootstrap interval for γ̂.

    ``columns`` picks the quantities of ``Cell.samples`` (default all, fitted jointly).
    ``method``: ``"seeds"`` resamples the K repeats of every cell with replacement (cells with
    K = 1 stay fixed) and recomputes the cell means (deviations scaled by √(K/(K−1)), see
    :func:`_resampled_mean`); ``"curves"`` resamples whole model sizes with
    replacement and keeps the distinct ones drawn (a duplicate curve collapses onto itself and
    carries no information; draws with fewer than two distinct sizes are redrawn);
    ``"auto"`` = seeds when some cell has K ≥ 2, else curves. The interval is the
    ((1−level)/2, (1+level)/2) percentile interval of the B refits; refits that find no γ are
    counted in ``bootstrap_failed``. ``seed`` seeds a ``numpy.random.Generator``.
    """
    _check_bootstrap(B, level, method)
    cells = list(cells)
    if not cells:
        raise ConfigError("cells", "no cell to fit (no successful repeat)")
    cols = list(range(cells[0].samples.shape[1])) if columns is None else list(columns)
    ln, lp, means = cell_means(cells)
    fit = fit_collapse(ln, lp, means[:, cols], **fit_kwargs)
    if method == "auto":
        method = "seeds" if any(c.samples.shape[0] >= 2 for c in cells) else "curves"
    fit.method, fit.level = method, float(level)
    if fit.gamma is None:
        return fit
    rng = np.random.default_rng(seed)
    sizes = np.unique(lp)
    gammas, failed = [], 0
    for _ in range(int(B)):
        if method == "seeds":
            m = np.array([_resampled_mean(c.samples, rng) for c in cells])
            sel = np.ones(len(cells), dtype=bool)
        else:
            drawn = np.unique(rng.choice(sizes, size=sizes.size, replace=True))
            while drawn.size < 2 and sizes.size >= 2:
                drawn = np.unique(rng.choice(sizes, size=sizes.size, replace=True))
            sel, m = np.isin(lp, drawn), means
        refit = fit_collapse(ln[sel], lp[sel], m[sel][:, cols], **fit_kwargs)
        if refit.gamma is None:
            failed += 1
        else:
            gammas.append(refit.gamma)
    fit.bootstrap = np.array(gammas)
    fit.bootstrap_failed = failed
    if gammas:
        q = np.quantile(fit.bootstrap, [(1 - level) / 2, (1 + level) / 2])
        fit.interval = (float(q[0]), float(q[1]))
    return fit


def _resampled_mean(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mean of K repeats drawn with replacement, its deviation from the cell mean scaled by
    √(K/(K−1)): the plain resampled mean has variance (K−1)/K · s²/K, too small for the few
    seeds of a sweep; the scaled one has the unbiased s²/K (the small-sample correction of
    Davison & Hinkley 1997, §3.3)."""
    K = samples.shape[0]
    if K < 2:
        return samples[0]
    mean = samples.mean(0)
    draw = samples[rng.integers(0, K, K)].mean(0)
    return mean + math.sqrt(K / (K - 1)) * (draw - mean)


# ----------------------------------------------------------------------------- transition
def crossings(x, d) -> List[Tuple[float, str]]:
    """Zero crossings of d(x) on its piecewise-linear interpolant: ``(x*, "down" | "up")`` for each
    segment where d goes from > 0 to ≤ 0 ("down") or from < 0 to ≥ 0 ("up"); ``x`` is sorted."""
    x = np.asarray(x, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    out = []
    for j in range(x.size - 1):
        a, b = d[j], d[j + 1]
        if (a > 0 and b <= 0) or (a < 0 and b >= 0):
            out.append((float(x[j] + a / (a - b) * (x[j + 1] - x[j])), "down" if a > 0 else "up"))
    return out


def transition_point(log2_n, e_gen, e_mem) -> Optional[float]:
    """The MtoG transition of one model size (PFD paper §4.1): the first log₂N at which the mean
    curves cross with E_gen − E_mem going from > 0 (closer to the empirical distribution:
    memorization) to ≤ 0 (closer to the teacher: generalization), by linear interpolation between
    the two N around the sign change; None when the curves do not cross that way."""
    x = np.asarray(log2_n, dtype=np.float64)
    o = np.argsort(x, kind="stable")
    d = np.asarray(e_gen, dtype=np.float64)[o] - np.asarray(e_mem, dtype=np.float64)[o]
    down = [c for c, kind in crossings(x[o], d) if kind == "down"]
    return down[0] if down else None


# ----------------------------------------------------------------------------- bias-variance
def bias_variance_cell(teacher, students) -> dict:
    """Def. 3 of the PFD paper (eq. 9, 45) on one (N, |θ|) cell, from endpoints in Ψ space.

    ``teacher`` (M, d): Ψ(Φ_data(x_T^i)); ``students`` (K, M, d), K ≥ 2: Ψ(Φ_θk(x_T^i)) on the
    same seeds. With m(x_T) = (1/K) Σ_k Ψ_k(x_T):

        E_bias² = mean_i ‖Ψ_teacher − m‖²,   E_var = mean_i (1/K) Σ_k ‖Ψ_k − m‖²,
        E_gen,k = (mean_i ‖Ψ_k − Ψ_teacher‖²)^{1/2}   (eq. 4: the monitor's E_gen)

    and the identity (1/K) Σ_k E_gen,k² = E_bias² + E_var holds exactly on the sample; its
    absolute and relative rounding error are returned. Computed by
    :class:`lightning_pfd.metrics.BiasVarianceDecomposition` (float64).
    """
    import torch

    from ..metrics.bias_variance import bias_variance_decomposition

    t = np.asarray(teacher, dtype=np.float64)
    s = np.asarray(students, dtype=np.float64)
    if t.ndim != 2 or s.ndim != 3 or s.shape[1:] != t.shape:
        raise ConfigError("students", "expected teacher (M, d) and students (K, M, d) on the same seeds",
                          value=(t.shape, s.shape))
    if s.shape[0] < 2:
        raise ConfigError("students", "the bias-variance decomposition needs K >= 2 students",
                          value=s.shape[0])
    out = bias_variance_decomposition(torch.from_numpy(t), torch.from_numpy(s))
    e_bias, e_var = float(out["e_bias"]), float(out["e_var"])
    gen_sq_mean = float(out["e_gen_sq_mean"])
    err = abs(gen_sq_mean - (e_bias ** 2 + e_var))
    return {"k": int(s.shape[0]), "m": int(t.shape[0]), "e_bias": e_bias, "e_bias_sq": e_bias ** 2,
            "e_var": e_var, "e_gen": [float(v) for v in out["e_gen"]], "e_gen_sq_mean": gen_sq_mean,
            "identity_abs_error": err, "identity_rel_error": err / gen_sq_mean if gen_sq_mean > 0 else err}


# ----------------------------------------------------------------------------- FID / KID
def _features(a, name) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ConfigError(name, "expected features (M, d) with M >= 2", value=a.shape)
    if not np.isfinite(a).all():
        raise ConfigError(name, "holds non-finite features")
    return a


def _sqrt_psd(c: np.ndarray) -> np.ndarray:
    lam, U = np.linalg.eigh(0.5 * (c + c.T))
    return (U * np.sqrt(np.clip(lam, 0, None))) @ U.T


def psi_fid(a, b) -> float:
    """FID in Ψ space: the squared Fréchet distance of the Gaussian fits of two samples,
    ‖μ_a − μ_b‖² + Tr(Σ_a + Σ_b − 2 (Σ_a^{1/2} Σ_b Σ_a^{1/2})^{1/2}) (unbiased covariances,
    float64, symmetric eigendecompositions; PFD paper App. C.4 compares it with E_gen, Fig. 7)."""
    a, b = _features(a, "a"), _features(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ConfigError("b", "feature dimensions differ", value=(a.shape[1], b.shape[1]))
    ca, cb = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    ra = _sqrt_psd(ca)
    cross = np.trace(_sqrt_psd(ra @ cb @ ra))
    return float(np.sum((a.mean(0) - b.mean(0)) ** 2) + max(np.trace(ca) + np.trace(cb) - 2 * cross, 0.0))


def _kernel_sum(x, y, d, chunk, skip_diagonal) -> float:
    """Σ_{i,j} k(x_i, y_j) of the cubic kernel (x·y/d + 1)³, in row chunks, diagonal optional."""
    total = 0.0
    for start in range(0, x.shape[0], chunk):
        k = (x[start:start + chunk] @ y.T / d + 1.0) ** 3
        if skip_diagonal:
            r = np.arange(k.shape[0])
            k[r, start + r] = 0.0
        total += float(k.sum())
    return total


def psi_kid(a, b, *, paired: bool = False, max_samples: Optional[int] = None, chunk: int = 1024) -> float:
    """KID in Ψ space: the unbiased MMD² with the cubic polynomial kernel k(x, y) = (x·y/d + 1)³
    (Bińkowski et al. 2018), on all points (no random subsets: deterministic).

    ``paired=False``: (1/(m(m−1))) Σ_{i≠j} k(a_i,a_j) + (1/(n(n−1))) Σ_{i≠j} k(b_i,b_j)
    − (2/(mn)) Σ_{i,j} k(a_i,b_j) — torchmetrics' KID on one subset of all points.
    ``paired=True`` (m = n, a_i and b_i drawn together, e.g. student and teacher endpoints of the
    same seed): the cross sum also skips i = j, (2/(m(m−1))) Σ_{i≠j} k(a_i,b_j) — the U-statistic
    of Gretton et al. 2012 (Lemma 6), unbiased even though a_i and b_i are dependent; the unpaired
    form would include the correlated pairs k(a_i, b_i) and be biased by O(1/m).
    ``max_samples`` keeps the first rows of each (in seed order) to bound the O(m²d) cost.
    """
    a, b = _features(a, "a"), _features(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ConfigError("b", "feature dimensions differ", value=(a.shape[1], b.shape[1]))
    if max_samples is not None:
        if int(max_samples) < 2:
            raise ConfigError("max_samples", "must be >= 2", value=max_samples)
        a, b = a[:int(max_samples)], b[:int(max_samples)]
    if paired and a.shape[0] != b.shape[0]:
        raise ConfigError("b", "paired KID needs the same number of rows (one per seed)",
                          value=(a.shape[0], b.shape[0]))
    if int(chunk) < 1:
        raise ConfigError("chunk", "must be >= 1", value=chunk)
    m, n, d, c = a.shape[0], b.shape[0], a.shape[1], int(chunk)
    kaa = _kernel_sum(a, a, d, c, True) / (m * (m - 1))
    kbb = _kernel_sum(b, b, d, c, True) / (n * (n - 1))
    kab = _kernel_sum(a, b, d, c, True) / (m * (m - 1)) if paired else _kernel_sum(a, b, d, c, False) / (m * n)
    return float(kaa + kbb - 2 * kab)


def _finite_or_none(v):
    return float(v) if v is not None and math.isfinite(v) else None
