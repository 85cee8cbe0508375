"""Scaling analysis of a sweep over the training-set size N and the model size |θ| (pure numpy/scipy).

Implements the analysis half of the PFD paper's scaling study ("Understanding Generalization in
Diffusion Distillation via Probability Flow Distance"); the definitions, with equations, are in
``docs/sweeps_analysis.md``:

- **Data collapse** (§4.1, Fig. 2): the curves E(N) of several model sizes collapse onto one master
  curve when plotted against x = log₂(N / |θ|^γ) = log₂N − γ·log₂|θ|; the paper reports γ = ½.
  :func:`fit_collapse` estimates γ by minimising a leave-one-curve-out spread
  (:func:`collapse_spread`); :func:`bootstrap_collapse` tests whether the curves collapse at all
  (a parametric bootstrap of the fitted collapse model, :func:`collapse_model`) and gives an interval
  that includes the between-width error (jackknife over widths, :func:`jackknife_se`).
- **MtoG transition** (§4.1): the N at which E_gen = E_mem on each model's mean curve
  (:func:`transition_point`), and its position on the collapsed axis.
- **Bias–variance** (§4.3, Def. 3): :mod:`lightning_pfd.analysis.bias_variance`.
- **Practical metrics in Ψ space** (App. C.4, Fig. 7): :func:`psi_fid` (Fréchet distance of
  Gaussian fits, FID) and :func:`psi_kid` (unbiased MMD² with the cubic polynomial kernel, KID).

Everything is float64 and deterministic (the bootstrap takes a seeded ``numpy.random.Generator``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Literal, Optional, Sequence, Tuple, get_args

import numpy as np

from ..errors import ConfigError
from ..validation import (ClosedUnitInterval, IntAtLeastTwo, NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveFloat,
                          PositiveInt, check_args, ranged)

__all__ = [
    "Cell", "CollapseScore", "CollapseFit", "group_cells", "cell_means", "collapse_coordinate",
    "overlap_weight", "collapse_spread", "fit_collapse", "within_noise_threshold",
    "cell_standard_errors", "subtract_floors", "bootstrap_collapse", "BOOTSTRAP_METHODS",
    "master_curve", "spline_basis", "collapse_model", "deformation_test", "DeformationTest", "DEFORMATIONS",
    "chi2_log_tail", "GofStatistic", "jackknife_se", "MODEL_ERROR_WEIGHT", "GOF_ALPHA",
    "crossings", "transition_point",
    "psi_fid", "psi_kid", "REFERENCE_GAMMAS",
]

#: γ values whose spread is always reported: N alone (γ = 0) and the paper's N/√|θ| (γ = ½).
REFERENCE_GAMMAS = (0.0, 0.5)
_EPS = 1e-12
#: the overlap taper of the collapse objective, in octaves of N
Octaves = ranged("Octaves", float, [(">=", 0), ("<=", 4)], "a number of octaves in [0, 4]")
#: a sample count that admits an unbiased (U-statistic) estimate


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
    """The collapse objective at one γ (:func:`collapse_spread`).

    ``spread``: S(γ), the weighted root-mean-square of the residuals in standard-error units
    (≈ 1 when the curves agree within their noise), inf when too few points overlap another
    curve; ``rms``: the weighted RMS residual of each quantity in its own units;
    ``n_overlap``: the effective number of overlapping points Σ_i ω_i (continuous in γ);
    ``n_points``: all points; ``max_abs_z``: the largest |residual| / s.e. among overlapping points."""

    gamma: float
    spread: float
    rms: Tuple[float, ...]
    n_overlap: float
    n_points: int
    max_abs_z: float = math.nan
    shifts: Optional[Tuple[Tuple[float, ...], ...]] = None

    def to_dict(self) -> dict:
        return {"gamma": self.gamma, "spread": _finite_or_none(self.spread),
                "rms": [_finite_or_none(r) for r in self.rms], "n_overlap": self.n_overlap,
                "n_points": self.n_points, "max_abs_z": _finite_or_none(self.max_abs_z),
                "shifts": None if self.shifts is None else [list(s) for s in self.shifts]}


def _smoothstep(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def overlap_weight(u, lo: float, hi: float, taper: float) -> np.ndarray:
    """Weight of curve l at its own abscissa u: 0 outside [lo, hi], 1 deeper than ``taper`` inside,
    a C¹ smoothstep ramp 3t² − 2t³ in between (t = distance to the nearer end / taper).
    ``taper = 0``: the hard indicator of [lo, hi] (the overlap set then jumps with γ)."""
    u = np.asarray(u, dtype=np.float64)
    if taper <= 0:
        return ((u >= lo - _EPS) & (u <= hi + _EPS)).astype(np.float64)
    return _smoothstep((u - lo) / taper) * _smoothstep((hi - u) / taper)


class _Curves:
    """The points grouped by model size, each curve sorted by log₂N (its order does not depend on
    γ: within one model size the shift γ·log₂|θ| is a constant). ``var`` (P, Q): the variance
    of each point (its squared standard error), or None for unit variance."""

    def __init__(self, log2_n, log2_params, y, var, taper: float, shifts: bool = False):
        self.size, self.n_points, self.q, self.taper = [], y.shape[0], y.shape[1], float(taper)
        self.shifts = bool(shifts)
        self.x, self.y, self.v, self._cache = [], [], [], {}
        self.unit = var is None
        var = np.ones_like(y) if var is None else var
        self.order = []
        for s in np.unique(log2_params):
            idx = np.flatnonzero(log2_params == s)
            idx = idx[np.argsort(log2_n[idx], kind="stable")]
            self.order.append(idx)
            self.size.append(float(s))
            self.x.append(log2_n[idx])
            self.y.append(y[idx])
            self.v.append(var[idx])

    def _interpolants(self, m: int):
        """Curve m's PCHIP (shape-preserving piecewise cubic, no overshoot) and linear
        interpolants of the values and the linear interpolant of the variances, on its own log₂N
        nodes (built once); a curve with one node is a constant."""
        if m not in self._cache:
            from scipy.interpolate import PchipInterpolator

            x, y, v = self.x[m], self.y[m], self.v[m]

            def lin(u, a, x=x):
                if x.size == 1:
                    return np.broadcast_to(a[0], (*np.shape(u), a.shape[1]))
                return np.stack([np.interp(u, x, a[:, j]) for j in range(a.shape[1])], axis=-1)

            cubic = PchipInterpolator(x, y, axis=0) if x.size >= 3 else (lambda u: lin(u, y))
            self._cache[m] = (cubic, lambda u: lin(u, y), lambda u: lin(u, v))
        return self._cache[m]

    def usable(self) -> int:
        """Number of curves with at least two distinct N (a curve needs two to interpolate)."""
        return sum(1 for x in self.x if np.unique(x).size >= 2)

    def terms(self, gammas: np.ndarray):
        """For every γ at once: ``(r (G, P, Q), Var r (G, P, Q), ω (G, P), A (G, P, C))`` with the
        points in the order of the curves (see :func:`collapse_spread` for the definitions); A
        maps per-curve vertical shifts a (C,) to the change of the residuals, r(a) = r − A a:
        A_ik = 1 for the point's own curve k, A_il = −w_il / W_i for the others.

        A point of curve k at x = log₂N_k − γ s_k is compared with curve l at the same x, i.e. at
        u = log₂N_k − γ (s_k − s_l) on l's own (γ-independent) nodes: one vectorised
        interpolation per pair of curves covers the whole γ grid."""
        G, C = gammas.size, len(self.x)
        r_all, v_all, om_all, a_all = [], [], [], []
        for k, (xk, yk, vk) in enumerate(zip(self.x, self.y, self.v)):
            acc = np.zeros((G, xk.size, self.q))
            wk = np.zeros((G, xk.size, C))
            w2v = np.zeros((G, xk.size, self.q))
            model = np.zeros((G, xk.size, self.q))
            for m, xl in enumerate(self.x):
                if m == k or xl.size < 2:
                    continue
                u = xk[None, :] - gammas[:, None] * (self.size[k] - self.size[m])
                w = overlap_weight(u, xl[0], xl[-1], self.taper)
                if not w.any():
                    continue
                cubic, lin, lin_v = self._interpolants(m)
                uc = np.clip(u, xl[0], xl[-1])
                fc = cubic(uc)
                acc += w[..., None] * fc
                wk[..., m] = w
                w2v += (w ** 2)[..., None] * lin_v(uc)
                model += w[..., None] * (fc - lin(uc)) ** 2
            w_sum = wk.sum(2)
            cov = w_sum > 0
            W = np.where(cov, w_sum, 1.0)[..., None]
            r_all.append(np.where(cov[..., None], yk[None] - acc / W, 0.0))
            v_all.append(np.ones_like(acc) if self.unit else vk[None] + w2v / W ** 2 + model / W)
            om_all.append(np.minimum(w_sum, 1.0))
            A = -wk / W
            A[..., k] = 1.0
            a_all.append(np.where(cov[..., None], A, 0.0))
        return (np.concatenate(r_all, 1), np.concatenate(v_all, 1), np.concatenate(om_all, 1),
                np.concatenate(a_all, 1))

    def _fit_shifts(self, r, var, om, A):
        """Per-curve vertical shifts a (G, C, Q) with Σ_k a_k = 0 that minimise
        Σ_i ω_i (r_i − (A a)_i)² / Var_i at every γ (weighted least squares, closed form)."""
        G, P, C = A.shape
        Z = np.vstack([np.eye(C - 1), -np.ones((1, C - 1))])        # sum-zero basis (C, C-1)
        AZ = A @ Z                                                   # (G, P, C-1)
        out = np.zeros((G, C, self.q))
        for q in range(self.q):
            wt = om / np.maximum(var[..., q], 1e-300)                # (G, P)
            M = np.einsum("gpi,gp,gpj->gij", AZ, wt, AZ)
            rhs = np.einsum("gpi,gp,gp->gi", AZ, wt, r[..., q])
            b = np.einsum("gij,gj->gi", np.linalg.pinv(M, hermitian=True), rhs)
            out[..., q] = b @ Z.T
        return out

    def scores(self, gammas, min_overlap: float) -> List[CollapseScore]:
        """:class:`CollapseScore` of every γ in ``gammas``."""
        gammas = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
        r, var, om, A = self.terms(gammas)
        shifts = None
        if self.shifts and len(self.x) >= 2:
            shifts = self._fit_shifts(r, var, om, A)
            r = r - np.einsum("gpc,gcq->gpq", A, shifts)
        z2 = np.where(om[..., None] > 0, r ** 2 / np.maximum(var, 1e-300), 0.0)
        n_eff = om.sum(1)
        enough = n_eff >= max(3.0, min_overlap * self.n_points)
        den = np.maximum(n_eff, _EPS)
        spread = np.where(enough, np.sqrt((om[..., None] * z2).sum(1).mean(1) / den), np.inf)
        rms = np.where(enough[:, None], np.sqrt((om[..., None] * r ** 2).sum(1) / den[:, None]), np.inf)
        zmax = np.where(om > 0, z2.max(2), 0.0).max(1)
        sh = [None] * gammas.size if shifts is None else [tuple(map(tuple, s.tolist())) for s in shifts]
        return [CollapseScore(float(g), float(s), tuple(rr.tolist()), float(c), self.n_points,
                              float(math.sqrt(zm)) if e else math.nan, h)
                for g, s, rr, c, zm, e, h in zip(gammas, spread, rms, n_eff, zmax, enough, sh)]


def _as_points(log2_n, log2_params, values, se=None):
    x0 = np.asarray(log2_n, dtype=np.float64)
    lp = np.asarray(log2_params, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    if x0.ndim != 1 or lp.shape != x0.shape or y.ndim != 2 or y.shape[0] != x0.shape[0]:
        raise ConfigError("values", "log2_n, log2_params and values must have one row per point",
                          value=(x0.shape, lp.shape, y.shape))
    if not (np.isfinite(x0).all() and np.isfinite(lp).all() and np.isfinite(y).all()):
        raise ConfigError("values", "must be finite (drop failed or diverged repeats first)")
    var = None
    if se is not None:
        s = np.asarray(se, dtype=np.float64)
        s = s[:, None] if s.ndim == 1 else s
        if s.shape != y.shape or not np.isfinite(s).all() or np.any(s < 0):
            raise ConfigError("se", "must be finite standard errors >= 0 of the same shape as values",
                              value=s.shape)
        var = s ** 2
    return x0, lp, y, var


def collapse_spread(log2_n, log2_params, values, gamma: float, *, se=None, taper: Octaves = 0.5,
                    min_overlap: ClosedUnitInterval = 0.25, shifts: bool = False) -> CollapseScore:
    """The collapse objective S(γ) (docs/sweeps_analysis.md, "Collapse objective").

    Points are cell means ȳ_i (one per (N, |θ|)) with standard errors ``se`` (P,) or (P, Q)
    (None: unit, S is then the RMS residual in the quantities' own units); ``values`` is (P,) or
    (P, Q). With x = log₂N − γ·log₂|θ|, every point i of curve k is compared with the master curve
    made of the *other* curves l, each weighted by how deep x_i lies inside its range,
    w_il = :func:`overlap_weight` (1 inside, a C¹ ramp of width ``taper`` octaves at the ends,
    0 outside: no extrapolation):

        M_i = Σ_l w_il f_l(x_i) / W_i,   W_i = Σ_l w_il,   r_i = ȳ_i − M_i,
        Var r_i = se_i² + Σ_l w_il² se_l(x_i)² / W_i² + Σ_l w_il (f_l − g_l)(x_i)² / W_i,

    f_l = PCHIP interpolant of curve l (shape-preserving piecewise cubic), g_l its linear
    interpolant, se_l(x)² the linear interpolant of its variances: the last term is the model
    (interpolation) term, the size of the disagreement of two interpolants. With z = r/√Var and
    ω_i = min(1, W_i),

        S(γ)² = Σ_i ω_i (1/Q) Σ_q z_iq² / Σ_i ω_i.

    S is continuous in γ (every term is); S ≈ 1 when the curves collapse within their noise,
    S = k when they deviate by k standard errors (RMS). S = inf when the effective overlap
    Σ ω_i < max(3, ``min_overlap``·P): a γ that pushes the curves apart cannot win by comparing a
    few points of flat tails. (Comparing each curve with the others inside their overlap follows
    Bhattacharjee & Seno 2001, "A measure of data collapse for scaling".)
    """
    check_args(collapse_spread, locals())
    x0, lp, y, var = _as_points(log2_n, log2_params, values, se)
    return _Curves(x0, lp, y, var, float(taper), shifts).scores(float(gamma), float(min_overlap))[0]


@dataclass
class CollapseFit:
    """Result of :func:`fit_collapse` (+ :func:`bootstrap_collapse` when ``interval`` is set).

    ``gamma`` is None when no γ in the bounds leaves enough overlap (or fewer than two model
    sizes with two N each). ``references`` maps each γ of :data:`REFERENCE_GAMMAS` to its score.
    From the bootstrap: ``interval`` (γ̂ ± z·``gamma_se`` with the model error, or the percentile
    interval without it), ``gamma_se`` (√(sd² + c·se²_widths), or the sd of the refits),
    ``interval_repeats`` and ``se_repeats`` (percentile interval and sd of the refits: the noise
    of the repeats only), ``se_widths`` and ``jackknife`` (the jackknife over widths: {log₂|θ|:
    γ̂ without it}), ``gof_p`` (goodness-of-fit p-value of the ``model`` bootstrap; ``rejected``
    when below ``gof_alpha``; ``gof_statistic`` names the statistic it tests, ``deformation`` is
    the :class:`DeformationTest` of the data and ``bootstrap_deformations`` its statistic T* on
    every bootstrap sweep; ``gof_reason`` says why there is no test when there is none),
    ``spread_null`` (the ``level`` range of S(γ̂) over sweeps that collapse
    exactly: the ``model`` bootstrap gives no interval of S itself, ``spread_intervals`` stays empty),
    ``spread_intervals`` ({"gamma_hat" | "0.0" | "0.5": (lo, hi)} of S), ``critical`` (the
    S below which the residuals are within noise, see :func:`within_noise_threshold`),
    ``floors`` ({log₂|θ|: {"data_rich": [per quantity], "se": [...], "fitted": [...]}} when a floor
    was subtracted: the floor from the largest N, its standard error, and that floor plus the
    jointly fitted shift at γ̂ when ``shifts``)."""

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
    gamma_se: Optional[float] = None
    spread_intervals: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    critical: Optional[float] = None
    floors: Dict[float, dict] = field(default_factory=dict)
    interval_repeats: Optional[Tuple[float, float]] = None
    se_repeats: Optional[float] = None
    se_widths: Optional[float] = None
    jackknife: Dict[float, Optional[float]] = field(default_factory=dict)
    model_error_weight: Optional[float] = None
    gof_p: Optional[float] = None
    gof_alpha: Optional[float] = None
    bootstrap_spreads: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spread_null: Optional[Tuple[float, float]] = None
    gof_statistic: Optional[str] = None
    gof_reason: str = ""
    deformation: Optional[DeformationTest] = None
    bootstrap_deformations: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def rejected(self) -> Optional[bool]:
        """The goodness-of-fit test rejects the collapse (``gof_p < gof_alpha``); None untested."""
        if self.gof_p is None or self.gof_alpha is None:
            return None
        return bool(self.gof_p < self.gof_alpha)

    @property
    def within_noise(self) -> Optional[bool]:
        """S(γ̂) ≤ ``critical``: the curves collapse within their noise (None when unknown)."""
        if self.score is None or self.critical is None or not math.isfinite(self.score.spread):
            return None
        return bool(self.score.spread <= self.critical)

    def z_of(self, gamma: float) -> Optional[float]:
        """(γ − γ̂) / ``gamma_se``: how many bootstrap standard errors γ lies from γ̂."""
        if self.gamma is None or not self.gamma_se:
            return None
        return (float(gamma) - self.gamma) / self.gamma_se

    def to_dict(self) -> dict:
        return {"gamma": self.gamma, "score": None if self.score is None else self.score.to_dict(),
                "references": {str(g): s.to_dict() for g, s in self.references.items()},
                "reason": self.reason, "interval": None if self.interval is None else list(self.interval),
                "level": self.level, "method": self.method, "bootstrap_size": int(self.bootstrap.size),
                "bootstrap_failed": self.bootstrap_failed, "gamma_se": self.gamma_se,
                "spread_intervals": {k: list(v) for k, v in self.spread_intervals.items()},
                "critical": self.critical, "within_noise": self.within_noise,
                "z_of_half": self.z_of(0.5),
                "floors": {str(k): v for k, v in self.floors.items()},
                "interval_repeats": None if self.interval_repeats is None else list(self.interval_repeats),
                "se_repeats": self.se_repeats, "se_widths": self.se_widths,
                "jackknife": {str(k): v for k, v in self.jackknife.items()},
                "model_error_weight": self.model_error_weight, "gof_p": self.gof_p,
                "gof_alpha": self.gof_alpha, "rejected": self.rejected, "gof_statistic": self.gof_statistic,
                "gof_reason": self.gof_reason,
                "deformation": None if self.deformation is None else self.deformation.to_dict(),
                "spread_null": None if self.spread_null is None else list(self.spread_null)}


def _bounds(bounds, step) -> Tuple[float, float]:
    """(lo, hi) of the γ search: two finite numbers lo < hi, at least ``step`` apart."""
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ConfigError("bounds", "must be two numbers (lo, hi)", value=bounds) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("bounds", "must be two finite numbers lo < hi", value=tuple(bounds))
    if step > hi - lo:
        raise ConfigError("step", "must be at most hi - lo of the bounds", value=step)
    return lo, hi


#: zoom levels of the refinement: each searches ±1 step of the previous level on a finer grid.
_REFINE = (25, 25)


def fit_collapse(log2_n, log2_params, values, *, se=None, bounds=(-0.5, 1.5), step: PositiveFloat = 0.025,
                 taper: Octaves = 0.5, min_overlap: ClosedUnitInterval = 0.25, shifts: bool = False) -> CollapseFit:
    """γ̂ = argmin over ``bounds`` of the collapse objective S(γ) (:func:`collapse_spread`).

    A grid of ``step`` (81 points on the default [−0.5, 1.5]) locates the best γ; two zooms then
    search ±1 step around it on grids 25× finer each (resolution step/625 = 4e-5 by default; S
    is continuous in γ, so the zooms converge to the minimum, not to a jump). ``values`` (P,) fits one quantity, (P, Q)
    the quantities jointly. The scores at γ = 0 and γ = ½ are reported alongside.
    """
    check_args(fit_collapse, locals())
    lo, hi = _bounds(bounds, step)
    x0, lp, y, var = _as_points(log2_n, log2_params, values, se)
    curves, mo = _Curves(x0, lp, y, var, float(taper), shifts), float(min_overlap)
    refs = dict(zip(REFERENCE_GAMMAS, curves.scores(np.array(REFERENCE_GAMMAS), mo)))
    grid = np.linspace(lo, hi, int(round((hi - lo) / step)) + 1)
    if curves.usable() < 2:
        return CollapseFit(None, None, refs, grid, np.full(grid.size, np.inf),
                           reason="needs at least two model sizes with two or more N each")
    scores = curves.scores(grid, mo)
    obj = np.array([sc.spread for sc in scores])
    if not np.isfinite(obj).any():
        return CollapseFit(None, None, refs, grid, obj,
                           reason="no γ in the bounds leaves enough points overlapping another curve")
    best = scores[int(np.argmin(obj))]
    h = grid[1] - grid[0] if grid.size > 1 else hi - lo
    for factor in _REFINE:
        fine = np.linspace(max(lo, best.gamma - h), min(hi, best.gamma + h), 2 * factor + 1)
        cand = min(curves.scores(fine, mo), key=lambda sc: sc.spread)
        best = cand if cand.spread < best.spread else best
        h /= factor
    return CollapseFit(best.gamma, best, refs, grid, obj)


def within_noise_threshold(n_eff: float, level: OpenUnitInterval = 0.95, n_fitted: NonNegativeInt = 1) -> float:
    """S below which the residuals are consistent with noise: √(χ²_level(ν)/ν), ν = n_eff −
    n_fitted (the effective number of overlapping points less the fitted γ). Under a perfect
    collapse with correct standard errors, n_eff·S² is approximately χ²(ν) (the residuals of
    neighbouring curves are correlated, so this is a guide; its calibration on synthetic sweeps
    is in docs/sweeps_analysis.md)."""
    from scipy.stats import chi2

    check_args(within_noise_threshold, locals())
    nu = max(float(n_eff) - n_fitted, 1.0)
    return float(math.sqrt(chi2.ppf(level, nu) / nu))


#: the bootstrap of :func:`bootstrap_collapse`; ``auto`` = ``model`` when some cell has K ≥ 2
#: repeats, else ``curves``.
BootstrapMethod = Literal["auto", "model", "seeds", "normal", "curves"]
BOOTSTRAP_METHODS = get_args(BootstrapMethod)


def cell_standard_errors(cells: Sequence[Cell], prior_dof: NonNegativeFloat = 4.0) -> Optional[np.ndarray]:
    """Standard errors (P, Q) of the cell means from the repeats, moderated towards the pooled
    variance: s̃_i² = ((K_i − 1) s_i² + d₀ s₀²) / (K_i − 1 + d₀), se_i = s̃_i / √K_i, with s₀² the
    pooled within-cell variance of the quantity and d₀ = ``prior_dof`` (the moderated variance of
    Smyth 2004, "Linear models and empirical Bayes methods for assessing differential expression",
    eq. 6, with a fixed d₀): with K = 2 a cell's own variance has one degree of freedom and can be
    0 by chance. d₀ = 0: each cell's own variance. None when no cell has K ≥ 2."""
    check_args(cell_standard_errors, locals())
    K = np.array([c.samples.shape[0] for c in cells], dtype=np.float64)
    dof = K - 1
    if not (dof > 0).any():
        return None
    s2 = np.array([c.samples.var(0, ddof=1) if c.samples.shape[0] > 1 else np.zeros(c.samples.shape[1])
                   for c in cells])
    s0 = (dof[:, None] * s2).sum(0) / dof.sum()
    d0 = float(prior_dof)
    if d0 == 0:
        mod = np.where(dof[:, None] > 0, s2, s0[None])
    else:
        mod = (dof[:, None] * s2 + d0 * s0[None]) / (dof[:, None] + d0)
    return np.sqrt(mod / K[:, None])


def subtract_floors(log2_n, log2_params, means, var, floor_points: PositiveInt = 1):
    """Per-width floor from the data-rich end: f_w = mean of the cell means at the
    ``floor_points`` largest N of width w; returns ``(means − f_w, var', floors)`` with
    var'_i = se_i² + Var f_w − 2 Cov(ȳ_i, f_w) (exact for independent cells) and
    floors = {log₂|θ|: (f_w, se f_w)}."""
    check_args(subtract_floors, locals())
    ln = np.asarray(log2_n, dtype=np.float64)
    lp = np.asarray(log2_params, dtype=np.float64)
    y = np.array(means, dtype=np.float64)
    v = np.zeros_like(y) if var is None else np.array(var, dtype=np.float64)
    out_y, out_v, floors = y.copy(), v.copy(), {}
    for s in np.unique(lp):
        idx = np.flatnonzero(lp == s)
        top = idx[np.argsort(ln[idx], kind="stable")][-int(floor_points):]
        nf = top.size
        f = y[top].mean(0)
        vf = v[top].sum(0) / nf ** 2
        out_y[idx] = y[idx] - f
        out_v[idx] = v[idx] + vf
        out_v[top] = v[top] + vf - 2 * v[top] / nf
        floors[float(s)] = (f, np.sqrt(vf))
    return out_y, np.maximum(out_v, 0.0), floors


def _fitted_floors(floors: dict, score: Optional[CollapseScore]) -> Dict[float, dict]:
    """{log₂|θ|: {"data_rich", "se", "fitted"}}: the floor from the largest N, its s.e., and the
    floor + the shift fitted at γ̂ (shifts are in the order of the sorted sizes)."""
    out = {}
    for j, (k, (f, s)) in enumerate(sorted(floors.items())):
        rec = {"data_rich": np.asarray(f).tolist(), "se": np.asarray(s).tolist(), "fitted": None}
        if score is not None and score.shifts is not None:
            rec["fitted"] = (np.asarray(f) + np.asarray(score.shifts[j])).tolist()
        out[k] = rec
    return out


#: the most interior knots of the master curve's spline (:func:`master_curve`)
MASTER_KNOTS = 6


def spline_basis(x, knots: Optional[int] = None):
    """Cubic B-spline design matrix (P, n_coef) on x with ``knots`` interior knots at quantiles of
    the distinct x (default min(:data:`MASTER_KNOTS`, ⌊#distinct x / 4⌋)), and its knot vector;
    None when x has fewer than four distinct values (no cubic to fit)."""
    from scipy.interpolate import BSpline

    ux = np.unique(x)
    lo, hi = float(ux[0]), float(ux[-1])
    if ux.size < 4 or hi - lo < 1e-9:
        return None
    m = min(MASTER_KNOTS, ux.size // 4) if knots is None else int(knots)
    inner = np.unique(np.quantile(ux, np.arange(1, m + 1) / (m + 1))) if m > 0 else np.zeros(0)
    inner = inner[(inner > lo + 1e-9) & (inner < hi - 1e-9)]
    t = np.r_[[lo] * 4, inner, [hi] * 4]
    return BSpline.design_matrix(np.clip(x, lo, hi), t, 3).toarray(), t


def master_curve(x, y, var, knots: Optional[int] = None) -> Callable[[np.ndarray], np.ndarray]:
    """The master curve F of collapsed points (x_i, y_i) (y (P, Q)): a weighted least-squares cubic
    B-spline (weights 1/var; None: unit) with ``knots`` interior knots at quantiles of the distinct
    x (default min(:data:`MASTER_KNOTS`, ⌊#distinct x / 4⌋)); returns F evaluated column-wise, constant beyond the data.
    The parametric bootstrap of :func:`bootstrap_collapse` draws its null sweeps from it."""
    from scipy.interpolate import BSpline

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    w = np.ones_like(y) if var is None else 1.0 / np.maximum(np.asarray(var, dtype=np.float64), 1e-300)
    w = np.broadcast_to(w[:, None] if w.ndim == 1 else w, y.shape)
    w = w / w.mean(0)
    basis = spline_basis(x, knots)
    if basis is None:
        coef = [np.sum(w[:, q] * y[:, q]) / np.sum(w[:, q]) for q in range(y.shape[1])]
        return lambda u: np.broadcast_to(np.array(coef), (*np.shape(u), y.shape[1]))
    D, t = basis
    lo, hi = t[0], t[-1]
    splines = []
    for q in range(y.shape[1]):
        sw = np.sqrt(w[:, q])
        c = np.linalg.lstsq(D * sw[:, None], y[:, q] * sw, rcond=None)[0]
        splines.append(BSpline(t, c, 3, extrapolate=False))
    return lambda u: np.stack([f(np.clip(np.asarray(u, dtype=np.float64), lo, hi)) for f in splines], axis=-1)


def collapse_model(log2_n, log2_params, values, gamma: float, *, se=None, shifts=None) -> np.ndarray:
    """Fitted values (P, Q) of the collapse model at ``gamma``: ŷ_i = F(x_i) + a_{w(i)}, with
    x = log₂N − γ·log₂|θ|, a (C, Q) the per-width shifts (in the order of the sorted sizes; None:
    0) and F the :func:`master_curve` of the shifted points (y_i − a_w, weights 1/se²): the sweep
    that collapses exactly at γ and lies closest to the data."""
    x0, lp, y, var = _as_points(log2_n, log2_params, values, se)
    a = np.zeros((np.unique(lp).size, y.shape[1])) if shifts is None else np.asarray(shifts, dtype=np.float64)
    idx = np.searchsorted(np.unique(lp), lp)
    shifted = y - a[idx]
    x = collapse_coordinate(x0, lp, gamma)
    return master_curve(x, shifted, var)(x) + a[idx]


#: the per-width first-order deformations of the master curve tested by :func:`deformation_test`
DEFORMATIONS = ("location", "stretch", "amplitude")


@dataclass(frozen=True)
class DeformationTest:
    """Result of :func:`deformation_test` at one γ.

    ``lr``: {deformation: likelihood-ratio statistic RSS₀ − RSS_c (in standard-error units)};
    ``df``: {deformation: its degrees of freedom (the rank the columns add)}; ``log_p``:
    {deformation: log of the χ²(df) tail of lr}; ``statistic``: T = −min_c log_p[c], the
    statistic whose null distribution :func:`bootstrap_collapse` draws; ``largest``: the
    deformation that attains it."""

    lr: Dict[str, float]
    df: Dict[str, int]
    log_p: Dict[str, float]
    statistic: float
    largest: str

    def to_dict(self) -> dict:
        return {"lr": dict(self.lr), "df": dict(self.df), "log_p": dict(self.log_p),
                "statistic": self.statistic, "largest": self.largest}


def _weighted_rss(X, y, w) -> Tuple[float, np.ndarray, int]:
    """Σ w_i² (y_i − (Xβ̂)_i)² of the weighted least-squares fit, β̂ and the rank of diag(w) X."""
    beta, _, rank, _ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    r = (y - X @ beta) * w
    return float(r @ r), beta, int(rank)


def chi2_log_tail(x: float, df: int) -> float:
    """log P(χ²(df) ≥ x), finite for every finite x: scipy's ``chi2.logsf`` underflows to −inf
    once the tail is below ~1e-308 (x ≈ 1420–1450 for df ≤ 4); there the leading term of the
    asymptotic expansion of the upper incomplete gamma function, log Γ(k, y) ≈ (k − 1) log y − y
    (k = df/2, y = x/2; DLMF 8.11.2), less log Γ(k), is used (its error in the log is about
    (k − 1)/y, < 0.05 for df ≤ 60)."""
    from scipy.special import gammaln
    from scipy.stats import chi2

    v = float(chi2.logsf(x, df))
    if math.isfinite(v):
        return v
    k, y = df / 2.0, x / 2.0
    return float((k - 1) * math.log(y) - y - gammaln(k))


def deformation_test(log2_n, log2_params, values, gamma: float, *, se, levels: bool = True) -> Optional[DeformationTest]:
    """Does each width follow the collapse, or a deformed copy of the master curve? A
    likelihood-ratio test of the collapse model against its per-width first-order deformations
    (docs/sweeps_analysis.md, "Goodness of fit").

    At x = log₂N − γ·log₂|θ| the collapse model is y_i = F(x_i) + a_w(i) (F a cubic B-spline with
    the knots of :func:`master_curve`, a_w a level per width), fitted by weighted least squares
    (weights 1/se²); F̂ its spline. The null design adds the two directions a refit would move in,
    the common shift F̂'(x) and the change of γ, (log₂|θ| − mean)·F̂'(x) (linearised: γ need not
    be refitted). Each deformation c adds one column per width w but the first:

    - ``location``: 1_w F̂'(x) — the width's transition sits elsewhere than γ puts it;
    - ``stretch``: 1_w (x − x̄) F̂'(x) — the width's curve is steeper or flatter (curves cross);
    - ``amplitude``: 1_w F̂(x) — the width's curve is taller or lower.

    ``levels=False`` (a collapse without per-width levels, the quantities fitted without
    ``shifts``): the null model has no levels and a fourth deformation, ``level`` (1_w), tests them.

    LR_c = RSS₀ − RSS_c in units of se² (summed over the quantities of ``values`` (P, Q)); under
    the collapse LR_c is approximately χ²(df_c), df_c the rank the columns add. The statistic is
    T = max_c −log P(χ²(df_c) ≥ LR_c) (the smallest of the tail probabilities, :func:`chi2_log_tail`:
    the χ² tail only puts the deformations on one scale; the p-value of T comes from the parametric
    bootstrap of :func:`bootstrap_collapse`). None when no deformation adds a column (fewer than two
    widths or four distinct x) or a standard error is 0 (no weight)."""
    from scipy.interpolate import BSpline

    check_args(deformation_test, locals())
    x0, lp, y, var = _as_points(log2_n, log2_params, values, se)
    if var is None:
        raise ConfigError("se", "the deformation test needs standard errors", value=None)
    x = collapse_coordinate(x0, lp, gamma)
    basis = spline_basis(x)
    sizes = np.unique(lp)
    if basis is None or sizes.size < 2 or not (var > 0).all():
        return None
    D, t = basis
    W = (lp[:, None] == sizes[None, 1:]).astype(np.float64)
    null_levels = W if levels else np.zeros((x.size, 0))
    kinds = DEFORMATIONS if levels else DEFORMATIONS + ("level",)
    xc = np.clip(x, t[0], t[-1])
    lr = dict.fromkeys(kinds, 0.0)
    df = dict.fromkeys(kinds, 0)
    for q in range(y.shape[1]):
        w = 1.0 / np.sqrt(var[:, q])
        beta = _weighted_rss(np.hstack([D, null_levels]), y[:, q], w)[1]
        spline = BSpline(t, beta[:D.shape[1]], 3)
        F, dF = spline(xc), spline.derivative()(xc)
        X0 = np.hstack([D, null_levels, ((lp - lp.mean()) * dF)[:, None], dF[:, None]])
        rss0, _, rank0 = _weighted_rss(X0, y[:, q], w)
        xbar = np.average(x, weights=w ** 2)
        columns = {"location": W * dF[:, None], "stretch": W * ((x - xbar) * dF)[:, None],
                   "amplitude": W * F[:, None], "level": W}
        for c in kinds:
            rss, _, rank = _weighted_rss(np.hstack([X0, columns[c]]), y[:, q], w)
            lr[c] += max(rss0 - rss, 0.0)
            df[c] += rank - rank0
    tested = [c for c in kinds if df[c] > 0]
    if not tested:
        return None
    log_p = {c: chi2_log_tail(lr[c], df[c]) for c in tested}
    largest = min(tested, key=lambda c: log_p[c])
    return DeformationTest({c: lr[c] for c in tested}, {c: df[c] for c in tested}, log_p,
                           -log_p[largest], largest)


def _jackknife_widths(ln, lp, y, sd, fit_kwargs) -> Dict[float, Optional[float]]:
    """{log₂|θ|: γ̂ without that width} (None when the rest cannot be fitted)."""
    out = {}
    for s in np.unique(lp):
        keep = lp != s
        f = fit_collapse(ln[keep], lp[keep], y[keep], se=None if sd is None else sd[keep], **fit_kwargs)
        out[float(s)] = f.gamma
    return out


def jackknife_se(values: Sequence[float]) -> Optional[float]:
    """Jackknife standard error √((C−1)/C Σ_j (γ̂_(−j) − γ̄)²) of C leave-one-out estimates
    (Efron & Stein 1981, "The jackknife estimate of variance"); None for fewer than two."""
    v = np.asarray([g for g in values if g is not None], dtype=np.float64)
    if v.size < 2:
        return None
    return float(math.sqrt((v.size - 1) / v.size * np.sum((v - v.mean()) ** 2)))


#: weight c of the between-width (jackknife) variance in the interval's variance
#: se² = sd²_repeats + c·se²_widths; chosen on the tuning half of the generator settings of
#: experiments/collapse_coverage.py (docs/sweeps_analysis.md, "Coverage").
MODEL_ERROR_WEIGHT = 0.5
#: p-value below which the goodness-of-fit test rejects the collapse (docs/sweeps_analysis.md).
GOF_ALPHA = 0.05
#: the statistic of the goodness-of-fit test: ``deformation`` (T of :func:`deformation_test`) or
#: ``spread`` (S(γ̂) of :func:`collapse_spread`, the earlier test; docs/sweeps_analysis.md).
GofStatistic = Literal["deformation", "spread"]


def bootstrap_collapse(cells: Sequence[Cell], columns: Optional[Sequence[int]] = None, *,
                       B: PositiveInt = 200, seed: NonNegativeInt = 0, level: OpenUnitInterval = 0.90,
                       method: BootstrapMethod = "auto", floor_points: Optional[PositiveInt] = None,
                       prior_dof: NonNegativeFloat = 4.0, model_error: bool = True,
                       model_error_weight: NonNegativeFloat = MODEL_ERROR_WEIGHT,
                       gof_alpha: OpenUnitInterval = GOF_ALPHA, gof_statistic: GofStatistic = "deformation",
                       **fit_kwargs) -> CollapseFit:
    """:func:`fit_collapse` on the cell means, in standard-error units, with a bootstrap, a
    goodness-of-fit test and an interval that includes the between-width (model) error.

    ``columns`` picks the quantities of ``Cell.samples`` (default all, fitted jointly). The
    standard errors come from the repeats (:func:`cell_standard_errors`, ``prior_dof``);
    ``floor_points``: subtract each width's floor estimated from its ``floor_points`` largest N
    (:func:`subtract_floors`). With ``shifts`` (per-width levels fitted with γ) the floor only
    sets the starting level: the fitted shift makes it a parameter, and every point keeps the
    variance of its own cell mean (no point is an anchor of variance 0). Without ``shifts`` the
    floor is data: the exact covariance bookkeeping of :func:`subtract_floors` is used and a floor
    made of one point (which is then exactly 0) leaves the fit. ``method``:

    - ``"model"`` (parametric bootstrap of the fitted collapse model): K repeats of every cell from
      N(ŷ_i, K se_i²), ŷ = :func:`collapse_model` at γ̂ (a sweep that collapses exactly at γ̂);
      gives the goodness-of-fit p-value of ``gof_statistic`` against its values on the refitted
      bootstrap sweeps;
    - ``"normal"``: K repeats of every cell from N(ȳ_i, K se_i²) around the observed means;
    - ``"seeds"``: the K repeats drawn with replacement, deviations scaled by √(K/(K−1));
    - ``"curves"``: whole model sizes drawn with replacement and the distinct ones refitted;
    - ``"auto"``: model when some cell has K ≥ 2, else curves.

    In every resample the cell means, their standard errors and the floors are recomputed and γ
    is refitted. ``model_error``: γ is also refitted leaving out each width in turn (jackknife over
    widths, :func:`jackknife_se`); the interval is then γ̂ ± z·√(sd² + c·se²_widths) (z the normal
    quantile of ``level``, sd the bootstrap sd of γ̂, c = ``model_error_weight``), clipped to the
    search bounds; without it (or with fewer than three widths) the percentile interval of the
    bootstrap. The percentile interval is kept as ``interval_repeats``. ``gof_alpha``: the level of
    the test (``gof_p < gof_alpha``: collapse rejected). ``seed`` seeds a ``numpy.random.Generator``.
    """
    check_args(bootstrap_collapse, locals())
    floor_points = None if floor_points is None else int(floor_points)
    shifts = bool(fit_kwargs.get("shifts", False))
    cells = list(cells)
    if not cells:
        raise ConfigError("cells", "no cell to fit (no successful repeat)")
    cols = list(range(cells[0].samples.shape[1])) if columns is None else list(columns)
    cells = [Cell(c.n_train, c.n_params, c.samples[:, cols]) for c in cells]
    ln, lp, means = cell_means(cells)
    se = cell_standard_errors(cells, prior_dof)
    var0 = None if se is None else se ** 2
    keep = np.ones(len(cells), dtype=bool)
    if floor_points == 1 and not shifts:  # the floor point itself is 0 by construction: no data
        for s in np.unique(lp):
            idx = np.flatnonzero(lp == s)
            if idx.size > 1:
                keep[idx[np.argmax(ln[idx])]] = False

    def prepare(m, v):
        if floor_points is None:
            return m, v, {}
        yy, vv, fl = subtract_floors(ln, lp, m, v, floor_points)
        return yy, (v if shifts else vv), fl

    y, var, floors = prepare(means, var0)
    sd = None if var is None else np.sqrt(var)
    lnk, lpk, yk, sdk = ln[keep], lp[keep], y[keep], None if sd is None else sd[keep]
    fit = fit_collapse(lnk, lpk, yk, se=sdk, **fit_kwargs)
    fit.floors = _fitted_floors(floors, fit.score)
    if method == "auto":
        method = "model" if se is not None else "curves"
    if method in ("normal", "model") and se is None:
        raise ConfigError("method", f"'{method}' needs standard errors: no cell has K >= 2 repeats",
                          value=method)
    fit.method, fit.level = method, float(level)
    if fit.gamma is None:
        return fit
    n_fitted = 1 + (np.unique(lp).size - 1) * len(cols) * shifts
    fit.critical = within_noise_threshold(fit.score.n_overlap, n_fitted=n_fitted) if sd is not None else None
    rng = np.random.default_rng(seed)
    sizes = np.unique(lp)
    centre = means
    if method == "model":
        a = None if fit.score.shifts is None else np.asarray(fit.score.shifts)
        fitted = collapse_model(lnk, lpk, yk, fit.gamma, se=sdk, shifts=a)
        centre = means.copy()
        centre[keep] = fitted + (means[keep] - yk)          # back to the units of the cell means
    deform = method == "model" and gof_statistic == "deformation"
    if deform:
        fit.deformation = deformation_test(lnk, lpk, yk, fit.gamma, se=sdk, levels=shifts)
        deform = fit.deformation is not None
        if not deform:
            fit.gof_reason = ("the deformation test needs two widths, four distinct collapsed N and "
                              "standard errors > 0")
    gammas, s_hat, s_ref, t_hat, failed = [], [], [], [], 0
    for _ in range(int(B)):
        if method in ("seeds", "normal", "model"):
            drawn_cells = []
            for c, s_i, mu in zip(cells, se if se is not None else [None] * len(cells), centre):
                if method == "model":
                    rep = mu + math.sqrt(c.samples.shape[0]) * s_i * rng.standard_normal(c.samples.shape)
                else:
                    rep = _resampled_repeats(c.samples, rng, method, s_i)
                drawn_cells.append(Cell(c.n_train, c.n_params, rep))
            m = cell_means(drawn_cells)[2]
            se_b = cell_standard_errors(drawn_cells, prior_dof)
            sel = keep.copy()
        else:
            drawn = np.unique(rng.choice(sizes, size=sizes.size, replace=True))
            while drawn.size < 2 and sizes.size >= 2:
                drawn = np.unique(rng.choice(sizes, size=sizes.size, replace=True))
            sel, m, se_b = np.isin(lp, drawn) & keep, means, se
        yb, vb, _ = prepare(m, None if se_b is None else se_b ** 2)
        sdb = None if vb is None else np.sqrt(vb[sel])
        refit = fit_collapse(ln[sel], lp[sel], yb[sel], se=sdb, **fit_kwargs)
        if refit.gamma is None:
            failed += 1
            continue
        gammas.append(refit.gamma)
        s_hat.append(refit.score.spread)
        if deform:
            t_b = deformation_test(ln[sel], lp[sel], yb[sel], refit.gamma, se=sdb, levels=shifts)
            t_hat.append(math.inf if t_b is None else t_b.statistic)
        if method != "curves":
            s_ref.append([refit.references[g].spread for g in REFERENCE_GAMMAS])
    fit.bootstrap = np.array(gammas)
    fit.bootstrap_spreads = np.array(s_hat)
    fit.bootstrap_deformations = np.array(t_hat)
    fit.bootstrap_failed = failed
    qs = [(1 - level) / 2, (1 + level) / 2]
    if gammas:
        q = np.quantile(fit.bootstrap, qs)
        fit.interval_repeats = (float(q[0]), float(q[1]))
        fit.interval = fit.interval_repeats
        fit.se_repeats = float(np.std(fit.bootstrap, ddof=1)) if len(gammas) > 1 else None
        fit.gamma_se = fit.se_repeats
        if method == "model":  # S* of sweeps that collapse exactly: the null range of S(γ̂), no interval of S
            fit.spread_null = tuple(float(v) for v in np.quantile(s_hat, qs))
        else:
            fit.spread_intervals["gamma_hat"] = tuple(float(v) for v in np.quantile(s_hat, qs))
        if s_ref and method != "model":
            arr = np.array(s_ref)
            for j, g in enumerate(REFERENCE_GAMMAS):
                col = arr[:, j][np.isfinite(arr[:, j])]
                if col.size:
                    fit.spread_intervals[str(g)] = tuple(float(v) for v in np.quantile(col, qs))
        observed, null = ((fit.deformation.statistic, fit.bootstrap_deformations) if deform
                          else (fit.score.spread, fit.bootstrap_spreads))
        if method == "model" and (deform or gof_statistic == "spread") and math.isfinite(observed):
            fit.gof_p = float((1 + np.sum(null >= observed)) / (1 + null.size))
            fit.gof_alpha = float(gof_alpha)
            fit.gof_statistic = gof_statistic
        elif method == "model" and not fit.gof_reason:
            fit.gof_reason = "the statistic is not finite (too little overlap at γ̂)"
    elif method == "model":
        fit.gof_reason = "every bootstrap refit failed"
    if model_error and sizes.size >= 3:
        jk = _jackknife_widths(lnk, lpk, yk, sdk, fit_kwargs)
        fit.jackknife = jk
        fit.se_widths = jackknife_se(list(jk.values()))
        if fit.se_widths is not None and fit.se_repeats is not None:
            from scipy.stats import norm

            tot = math.sqrt(fit.se_repeats ** 2 + float(model_error_weight) * fit.se_widths ** 2)
            z = float(norm.ppf((1 + level) / 2))
            lo, hi = _bounds(fit_kwargs.get("bounds", (-0.5, 1.5)), 0.0)
            fit.gamma_se = tot
            fit.interval = (max(lo, fit.gamma - z * tot), min(hi, fit.gamma + z * tot))
            fit.model_error_weight = float(model_error_weight)
    return fit


def _resampled_repeats(samples: np.ndarray, rng: np.random.Generator, method: str,
                       se: np.ndarray) -> np.ndarray:
    """K new repeats of one cell. ``seeds``: drawn with replacement, their deviations from the
    cell mean scaled by √(K/(K−1)) so that their mean has the unbiased variance s²/K (Davison &
    Hinkley 1997, §3.3; a K = 1 cell stays fixed); ``normal``: drawn from N(ȳ, K·se²), se the
    moderated standard error of the mean (:func:`cell_standard_errors`). The standard errors of
    the resample are then recomputed from these repeats, so the noise of the weights is part of
    the bootstrap distribution."""
    K = samples.shape[0]
    mean = samples.mean(0)
    if method == "normal":
        return mean + math.sqrt(K) * se * rng.standard_normal(samples.shape)
    if K < 2:
        return samples
    return mean + math.sqrt(K / (K - 1)) * (samples[rng.integers(0, K, K)] - mean)


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


def psi_kid(a, b, *, paired: bool = False, max_samples: Optional[IntAtLeastTwo] = None,
            chunk: PositiveInt = 1024) -> float:
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
    check_args(psi_kid, locals())
    a, b = _features(a, "a"), _features(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ConfigError("b", "feature dimensions differ", value=(a.shape[1], b.shape[1]))
    if max_samples is not None:
        a, b = a[:int(max_samples)], b[:int(max_samples)]
    if paired and a.shape[0] != b.shape[0]:
        raise ConfigError("b", "paired KID needs the same number of rows (one per seed)",
                          value=(a.shape[0], b.shape[0]))
    m, n, d, c = a.shape[0], b.shape[0], a.shape[1], int(chunk)
    kaa = _kernel_sum(a, a, d, c, True) / (m * (m - 1))
    kbb = _kernel_sum(b, b, d, c, True) / (n * (n - 1))
    kab = _kernel_sum(a, b, d, c, True) / (m * (m - 1)) if paired else _kernel_sum(a, b, d, c, False) / (m * n)
    return float(kaa + kbb - 2 * kab)


def _finite_or_none(v):
    return float(v) if v is not None and math.isfinite(v) else None
