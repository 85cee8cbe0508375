"""Tail metrics on a scalar physical observable (PITE; REFERENCE §13, blog seed 002).

* RMSQE (Blanchard et al. 2022; blog eq. "RMSQE"): the blog writes the integral
  int_eta^1 |F_p^{-1}(u) - F_q^{-1}(u)|^2 du without root or normalisation. **[choice]** We
  report the *root mean* over K uniform levels u_k = linspace(eta, u_max, K):
  sqrt( (1/K) sum_k (Q_gen(u_k) - Q_ref(u_k))^2 ), with u_max = 1 - 1/n_min by default
  (beyond it one compares sample maxima). Empirical quantiles use ``torch.quantile`` with
  ``interpolation="linear"`` (type 7 of Hyndman & Fan), recorded as ``QUANTILE_METHOD``.
* LOADER (Mohamad & Sapsis 2018; blog eq. "LOADER"): int_Omega |log p_gen - log p_ref| dx
  with FFT Gaussian KDEs (KDEpy ``FFTKDE``, one bandwidth chosen on the reference, evaluated on an equidistant grid that contains
  every data point, then linearly interpolated) and composite Gauss–Legendre quadrature
  (``numpy.polynomial.legendre.leggauss``). Over an unbounded range the integral does not
  converge for heavy tails, so the window Omega is fixed (default: the range of the
  reference sample) and densities are floored (default: 1e-3 x the peak of the reference
  density). ``same_law_floor`` reports the noise floor of a metric: the score of a perfect
  model with n_gen samples, i.e. the metric between random n_gen-subsets of the reference
  (drawn without replacement) and the remaining n_ref - n_gen points, with the same explicit
  settings as the model score. ``matched_score`` scores a model against the same remaining
  subsets, so model and floor are compared on identical terms.

The torchmetrics classes keep "cat" states of the per-sample *scalar* observables (a few
thousand floats): quantiles and KDEs need the whole sample, and gathering the scalars makes
the synced value exactly the single-process value under DDP (the only reduction is a
concatenation; order does not matter for quantiles or KDEs). Update the reference on one
rank only (or pass it to the constructor) so that it is not duplicated world-size times.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

__all__ = [
    "rmsqe", "loader", "same_law_floor", "matched_score", "reference_splits", "loader_settings",
    "kde_density", "integrate_abs_log_ratio",
    "RootMeanSquaredQuantileError", "LogAbsoluteDensityRatio", "QUANTILE_METHOD",
]

QUANTILE_METHOD = "linear"


def _as_1d(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x).detach().to(torch.float64).reshape(-1).cpu()
    if t.numel() == 0:
        raise ValueError(f"{name}: must contain at least one sample, got an empty array")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: must be finite (found NaN or inf)")
    return t


def _check_eta(eta: float) -> float:
    eta = float(eta)
    if not 0.0 < eta < 1.0:
        raise ValueError(f"eta: must lie in (0, 1), got {eta}")
    return eta


def rmsqe(gen, ref, eta: float = 0.975, u_max: float | None = None,
          num_levels: int = 200) -> torch.Tensor:
    """Root mean squared quantile error over the upper tail u in [eta, u_max] (float64 scalar).

    ``u_max`` defaults to 1 - 1/n_min (n_min = the smaller sample size); it must exceed eta,
    so n_min > 1/(1 - eta) samples are needed (41 for eta = 0.975).
    """
    eta = _check_eta(eta)
    g, r = _as_1d(gen, "gen"), _as_1d(ref, "ref")
    if int(num_levels) < 1:
        raise ValueError(f"num_levels: must be >= 1, got {num_levels}")
    n_min = min(g.numel(), r.numel())
    if u_max is None:
        u_max = 1.0 - 1.0 / n_min
    u_max = float(u_max)
    if not eta < u_max <= 1.0:
        raise ValueError(f"u_max: must lie in (eta, 1] = ({eta}, 1], got {u_max} "
                         f"(with the default 1 - 1/n_min, need more than {1 / (1 - eta):.0f} "
                         f"samples; the smaller sample has {n_min})")
    u = torch.linspace(eta, u_max, int(num_levels), dtype=torch.float64)
    qg = torch.quantile(g, u, interpolation=QUANTILE_METHOD)
    qr = torch.quantile(r, u, interpolation=QUANTILE_METHOD)
    return (qg - qr).square().mean().sqrt()


# ----------------------------------------------------------------------------- LOADER
def _bandwidth(x: np.ndarray, bandwidth) -> float:
    from KDEpy.bw_selection import improved_sheather_jones, silvermans_rule, scotts_rule

    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool):
        if not bandwidth > 0:
            raise ValueError(f"bandwidth: must be > 0 or 'silverman'/'scott'/'ISJ', got {bandwidth}")
        return float(bandwidth)
    rules = {"silverman": silvermans_rule, "scott": scotts_rule, "ISJ": improved_sheather_jones}
    if bandwidth not in rules:
        raise ValueError(f"bandwidth: must be > 0 or one of {sorted(rules)}, got {bandwidth!r}")
    if x.size < 2 or np.ptp(x) == 0:
        return 1e-3 * max(1.0, abs(float(x[0])))
    bw = float(rules[bandwidth](x[:, None]))
    return bw if bw > 0 else 1e-3 * float(np.ptp(x))


def kde_density(samples, points, bandwidth="silverman", grid_size: int = 2**14) -> np.ndarray:
    """Gaussian KDE of ``samples`` evaluated at ``points`` (numpy float64).

    KDEpy ``FFTKDE`` (bandwidth from *all* samples) on an equidistant grid spanning the
    points plus 10 bandwidths on each side; every sample within that span lies inside the grid
    (KDEpy requires it). Samples farther away contribute < exp(-50) of a kernel to any point,
    so they are dropped and the density is re-weighted by the kept fraction: the result equals
    the full-sample KDE to ~1e-22 relative, and extreme outliers (a diverging sampler) cannot
    stretch the grid. Linear interpolation to ``points``; zero where no sample is near.
    """
    from KDEpy import FFTKDE

    x = _as_1d(samples, "samples").numpy()
    pts = np.asarray(points, dtype=np.float64)
    bw = _bandwidth(x, bandwidth)
    pad = 10.0 * bw
    lo, hi = float(pts.min()) - pad, float(pts.max()) + pad
    keep = x[(x >= lo) & (x <= hi)]
    if keep.size == 0:
        return np.zeros_like(pts)
    span = max(hi - lo, 1e-12 * max(abs(lo), abs(hi), 1.0))
    eps = 1e-9 * span  # strictly inside the grid despite rounding
    # work in units of the bandwidth around the window's centre (KDEpy's kernel support
    # solver fails for very large bandwidths): x' = (x - c)/bw, p(x) = p'(x')/bw
    c = 0.5 * (lo + hi)
    grid = (np.linspace(min(lo, keep.min()) - eps, max(hi, keep.max()) + eps, int(grid_size)) - c) / bw
    dens = FFTKDE(kernel="gaussian", bw=1.0).fit((keep - c) / bw).evaluate(grid)
    dens = dens * (keep.size / x.size) / bw
    return np.interp((pts - c) / bw, grid, dens, left=0.0, right=0.0)


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


def _check_window(window) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window: must be a pair (lo, hi) of finite numbers, got {window!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"window: must satisfy lo < hi (finite), got {window!r}")
    return lo, hi


def integrate_abs_log_ratio(p, q, window, floor: float, panels: int = 64,
                            nodes: int = 16) -> float:
    """int_window |log max(p, floor) - log max(q, floor)| dx by composite Gauss–Legendre.

    ``p`` and ``q`` are callables mapping a float64 numpy array of points to densities.
    """
    lo, hi = _check_window(window)
    if not floor > 0:
        raise ValueError(f"floor: must be > 0, got {floor}")
    if int(panels) < 1 or int(nodes) < 1:
        raise ValueError(f"panels, nodes: must be >= 1, got {panels}, {nodes}")
    x, w = _legendre_nodes((lo, hi), panels, nodes)
    lp = np.log(np.maximum(np.asarray(p(x), dtype=np.float64), floor))
    lq = np.log(np.maximum(np.asarray(q(x), dtype=np.float64), floor))
    return float(np.sum(w * np.abs(lp - lq)))


def loader(gen, ref, window: Sequence[float] | None = None, floor: float = 1e-3,
           relative_floor: bool = True, bandwidth="silverman", panels: int = 64,
           nodes: int = 16, grid_size: int = 2**14) -> torch.Tensor:
    """LOADER = int_window |log p_gen(x) - log p_ref(x)| dx with KDE densities (float64 scalar).

    ``window``: the integration domain Omega, default the range [min ref, max ref].
    ``floor``: density floor; with ``relative_floor=True`` (default) it is a fraction of the
    peak of the reference KDE, otherwise an absolute density. ``bandwidth``: a positive
    float or a KDEpy rule name ('silverman', 'scott', 'ISJ') applied to the *reference*;
    **[choice]** both KDEs use that one bandwidth, so a model sample with wild outliers
    cannot inflate its own rule-of-thumb bandwidth and flatten its density.
    """
    g, r = _as_1d(gen, "gen"), _as_1d(ref, "ref")
    # window, absolute density floor and the bandwidth shared by both KDEs, all from ref
    settings = loader_settings(r, window, floor, relative_floor, bandwidth, grid_size)
    (lo, hi), floor, bw = settings["window"], settings["floor"], settings["bandwidth"]
    p = lambda x: kde_density(g, x, bw, grid_size)  # noqa: E731
    q = lambda x: kde_density(r, x, bw, grid_size)  # noqa: E731
    return torch.tensor(integrate_abs_log_ratio(p, q, (lo, hi), floor, panels, nodes),
                        dtype=torch.float64)


def _check_n_gen(n_ref: int, n_gen) -> int:
    if n_gen is None:
        return n_ref // 2
    try:
        ok = not isinstance(n_gen, bool) and float(n_gen).is_integer() and 1 <= int(n_gen) <= n_ref - 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"n_gen: must be an integer in [1, n_ref - 1] = [1, {n_ref - 1}] "
                         f"(generated samples; the rest of the reference is the comparison "
                         f"sample), got {n_gen!r}")
    return int(n_gen)


def reference_splits(n_ref: int, n_gen: int, num_splits: int = 8, seed: int = 0):
    """``num_splits`` seeded random splits of range(n_ref) into (n_gen indices, the rest).

    Drawn *without* replacement (``torch.randperm``); the same (n_ref, n_gen, num_splits, seed)
    always give the same splits, so :func:`same_law_floor` and :func:`matched_score` share them.
    """
    n_gen = _check_n_gen(int(n_ref), n_gen)
    if int(num_splits) < 1:
        raise ValueError(f"num_splits: must be >= 1, got {num_splits}")
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(int(num_splits)):
        perm = torch.randperm(int(n_ref), generator=gen)
        out.append((perm[:n_gen], perm[n_gen:]))
    return out


def _metric_fn(metric: str, n_gen: int, kwargs: dict):
    if metric not in ("loader", "rmsqe"):
        raise ValueError(f"metric: must be 'loader' or 'rmsqe', got {metric!r}")
    kwargs = dict(kwargs)
    if metric == "rmsqe" and kwargs.get("u_max") is None:
        # the model score rmsqe(gen, ref) uses 1 - 1/min(n_gen, n_ref) = 1 - 1/n_gen
        kwargs["u_max"] = 1.0 - 1.0 / n_gen
    return (loader if metric == "loader" else rmsqe), kwargs


def same_law_floor(ref, metric: str = "loader", num_splits: int = 8, seed: int = 0,
                   n_gen: int | None = None, **kwargs) -> torch.Tensor:
    """Same-law noise floor of ``metric`` ('loader' or 'rmsqe'): the score of a *perfect* model.

    For ``num_splits`` seeded random splits of ``ref`` (n_ref samples) into a subset of
    ``n_gen`` samples drawn without replacement (playing the generated sample) and the
    remaining n_ref - n_gen (playing the reference), returns the mean of
    ``metric(ref[subset], ref[rest], **kwargs)``. ``n_gen`` must be the number of generated
    samples of the model score it calibrates (default n_ref // 2: the old half split), in
    [1, n_ref - 1].

    Pass the *same explicit* settings as the model score: for RMSQE ``u_max`` (default here
    1 - 1/n_gen, the default of ``rmsqe(gen, ref)`` with n_gen < n_ref); for LOADER the window,
    bandwidth and floor (:func:`loader_settings` freezes them from the full reference; the
    window defaults to the range of the full reference). Remaining mismatch when the model is
    scored against the *full* reference: the floor's comparison sample has n_ref - n_gen points
    instead of n_ref (its empirical quantiles / KDE are slightly noisier), so the floor is
    slightly above the perfect model's expected score (for n_gen << n_ref negligible).
    :func:`matched_score` removes it by scoring the model against the same n_ref - n_gen
    subsets.
    """
    r = _as_1d(ref, "ref")
    if r.numel() < 2:
        raise ValueError(f"ref: need at least 2 samples to split, got {r.numel()}")
    n_gen = _check_n_gen(r.numel(), n_gen)
    fn, kwargs = _metric_fn(metric, n_gen, kwargs)
    if metric == "loader" and kwargs.get("window") is None:
        kwargs["window"] = (float(r.min()), float(r.max())) if r.max() > r.min() else None
    vals = [fn(r[a], r[b], **kwargs) for a, b in reference_splits(r.numel(), n_gen, num_splits, seed)]
    return torch.stack(vals).mean()


def matched_score(gen, ref, metric: str = "loader", num_splits: int = 8, seed: int = 0,
                  n_gen: int | None = None, **kwargs) -> torch.Tensor:
    """Model score comparable with :func:`same_law_floor`: mean over the *same* splits of
    ``metric(gen, ref[rest])``, ``rest`` = the n_ref - n_gen reference points of each split.

    With the same (num_splits, seed, n_gen, explicit kwargs) the model and the floor are
    compared with identical reference samples of identical size, so a perfect model (``gen``
    n_gen draws of the reference law) has *exactly* the floor as expected score (up to the
    window, if it is derived from the data). ``n_gen`` defaults to ``len(gen)``; pass the
    number of samples generated (before dropping non-finite ones) to reuse a cached floor.
    """
    g, r = _as_1d(gen, "gen"), _as_1d(ref, "ref")
    n_gen = _check_n_gen(r.numel(), g.numel() if n_gen is None else n_gen)
    fn, kwargs = _metric_fn(metric, n_gen, kwargs)
    if metric == "loader" and kwargs.get("window") is None:
        kwargs["window"] = (float(r.min()), float(r.max())) if r.max() > r.min() else None
    vals = [fn(g, r[b], **kwargs) for _, b in reference_splits(r.numel(), n_gen, num_splits, seed)]
    return torch.stack(vals).mean()


def loader_settings(ref, window: Sequence[float] | None = None, floor: float = 1e-3,
                    relative_floor: bool = True, bandwidth="silverman",
                    grid_size: int = 2**14) -> dict:
    """Freeze LOADER's data-dependent settings on the full reference ``ref``.

    Returns ``dict(window, floor, relative_floor=False, bandwidth)`` with an explicit window
    (default the range of ``ref``), the bandwidth rule evaluated on ``ref`` and the relative
    floor turned into an absolute density (``floor`` x peak of the reference KDE), exactly
    as ``loader(gen, ref, ...)`` would compute them. Passing this dict to both the model score
    and :func:`same_law_floor` makes the two use the same window / bandwidth / floor.
    """
    r = _as_1d(ref, "ref")
    if window is None:
        window = (float(r.min()), float(r.max()))
        if window[0] == window[1]:
            window = (window[0] - 0.5, window[1] + 0.5)
    lo, hi = _check_window(window)
    if not floor > 0:
        raise ValueError(f"floor: must be > 0, got {floor}")
    bw = _bandwidth(r.numpy(), bandwidth)
    floor = float(floor)
    if relative_floor:
        probe = np.linspace(lo, hi, 2049)
        floor *= max(float(kde_density(r, probe, bw, grid_size).max()), 1e-300)
    return dict(window=(lo, hi), floor=floor, relative_floor=False, bandwidth=bw)


# ------------------------------------------------------------------------ torchmetrics
class _TailMetric(Metric):
    """Shared state handling: 'cat' states of scalar observables (exact under DDP)."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, reference=None, num_splits: int | None = None, n_gen: int | None = None,
                 split_seed: int = 0, **kwargs):
        if num_splits is not None and int(num_splits) < 1:
            raise ValueError(f"num_splits: must be >= 1 (or None = whole reference), got {num_splits}")
        if n_gen is not None and (isinstance(n_gen, bool) or int(n_gen) < 1):
            raise ValueError(f"n_gen: must be an integer >= 1 (or None = len(preds)), got {n_gen!r}")
        super().__init__(**kwargs)
        self.add_state("preds", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self._fixed_ref = None if reference is None else _as_1d(reference, "reference")
        self.num_splits = None if num_splits is None else int(num_splits)
        self.n_gen = None if n_gen is None else int(n_gen)
        self.split_seed = int(split_seed)

    def _score(self, metric: str, p: torch.Tensor, t: torch.Tensor, **kw) -> torch.Tensor:
        """Against the whole reference, or (num_splits set) :func:`matched_score`."""
        if self.num_splits is None:
            return (loader if metric == "loader" else rmsqe)(p, t, **kw)
        return matched_score(p, t, metric, self.num_splits, self.split_seed, self.n_gen, **kw)

    def update(self, preds: torch.Tensor, target: torch.Tensor | None = None) -> None:
        """Add generated observables ``preds`` and (optionally) reference observables."""
        p = torch.as_tensor(preds, dtype=torch.float64, device=self.device).reshape(-1)
        self.preds.append(p)
        if target is not None:
            t = torch.as_tensor(target, dtype=torch.float64, device=self.device).reshape(-1)
            self.target.append(t)

    def _gathered(self):
        p = dim_zero_cat(self.preds) if len(self.preds) else torch.zeros(0, dtype=torch.float64)
        if self._fixed_ref is not None:
            t = self._fixed_ref
        else:
            t = dim_zero_cat(self.target) if len(self.target) else torch.zeros(0, dtype=torch.float64)
        return p.cpu(), t.cpu()

    plot = lambda self, val=None, ax=None: self._plot(val, ax)  # noqa: E731


class RootMeanSquaredQuantileError(_TailMetric):
    """torchmetrics wrapper of :func:`rmsqe` (update(preds=gen observables, target=ref)).

    With ``num_splits`` set, ``compute`` is :func:`matched_score` (same splits as
    ``same_law_floor(ref, "rmsqe", num_splits, split_seed, n_gen)``) instead of rmsqe(gen, ref).
    """

    def __init__(self, eta: float = 0.975, u_max: float | None = None, num_levels: int = 200,
                 reference=None, **kwargs):
        _check_eta(eta)
        if u_max is not None and not _check_eta(eta) < float(u_max) <= 1.0:
            raise ValueError(f"u_max: must lie in (eta, 1], got {u_max}")
        if int(num_levels) < 1:
            raise ValueError(f"num_levels: must be >= 1, got {num_levels}")
        super().__init__(reference=reference, **kwargs)
        self.eta, self.u_max, self.num_levels = float(eta), u_max, int(num_levels)

    def compute(self) -> torch.Tensor:
        p, t = self._gathered()
        return self._score("rmsqe", p, t, eta=self.eta, u_max=self.u_max,
                           num_levels=self.num_levels)


class LogAbsoluteDensityRatio(_TailMetric):
    """torchmetrics wrapper of :func:`loader` (update(preds=gen observables, target=ref)).

    ``num_splits``, ``n_gen``, ``split_seed``: as for :class:`RootMeanSquaredQuantileError`.
    """

    def __init__(self, window: Sequence[float] | None = None, floor: float = 1e-3,
                 relative_floor: bool = True, bandwidth="silverman", panels: int = 64,
                 nodes: int = 16, reference=None, **kwargs):
        if window is not None:
            _check_window(window)
        if not floor > 0:
            raise ValueError(f"floor: must be > 0, got {floor}")
        if isinstance(bandwidth, str) and bandwidth not in ("silverman", "scott", "ISJ"):
            raise ValueError(f"bandwidth: must be > 0 or 'silverman'/'scott'/'ISJ', got {bandwidth!r}")
        super().__init__(reference=reference, **kwargs)
        self.window = None if window is None else tuple(float(v) for v in window)
        self.floor, self.relative_floor, self.bandwidth = float(floor), bool(relative_floor), bandwidth
        self.panels, self.nodes = int(panels), int(nodes)

    def compute(self) -> torch.Tensor:
        p, t = self._gathered()
        return self._score("loader", p, t, window=self.window, floor=self.floor,
                           relative_floor=self.relative_floor, bandwidth=self.bandwidth,
                           panels=self.panels, nodes=self.nodes)
