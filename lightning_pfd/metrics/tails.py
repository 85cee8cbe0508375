"""Tail metrics on a scalar physical observable (PITE strategy of the blog post on evaluating
heavy-tailed diffusion models, "A Physically Interpretable Evaluation Strategy").

RMSQE (Blanchard et al. 2022; the blog's equation "RMSQE")
----------------------------------------------------------
The blog defines, for 1-D laws p, q and a threshold eta (eta = 0.975 in its experiment),

    RMSQE(p, q) := int_eta^1 |F_p^{-1}(u) - F_q^{-1}(u)|^2 du,

"where F^{-1} denotes the pseudo-inverse of the CDF", approximated "using empirical quantiles".
The name says *root mean* squared but the formula has **no root and no normalisation by
1 - eta**; we follow the formula (``definition="blog"``, the default), so the value has the
squared units of the observable. F^{-1} is the pseudo-inverse of the *empirical* CDF, i.e. the
left-continuous generalized inverse F_n^{-1}(u) = inf{x : F_n(x) >= u} = x_(ceil(n u)) (the
ceil(n u)-th order statistic, u in (0, 1]). Both empirical quantile functions are step functions,
so the integral is computed *exactly*: the breakpoints k/n and j/m of the two samples split
[eta, 1] into segments on which both are constant (integer arithmetic in units of 1/lcm(n, m)),
and the sum of (difference^2 x segment length) is the integral. The top segment (u in
(1 - 1/n, 1]) compares the sample maxima: for t_3 vs N(0, 1) (population integral 0.3829 by
quadrature) 33 % of the integral lies beyond u = 1 - 1/9050 and 58 % beyond 1 - 1/1000, which is
why no upper cut-off is applied. The price: for heavy tails the empirical value converges slowly
(the top cell of a t_3 sample: relative error ~ n^(-1/3)).

``definition="root_mean_levels"`` is a named variant: the root mean over K
uniform levels u_k = linspace(eta, u_max, K) of (Q_gen(u_k) - Q_ref(u_k))^2, u_max = 1 - 1/n_min
by default, type-7 interpolated quantiles (``torch.quantile(..., interpolation="linear")``,
``QUANTILE_METHOD``). It ignores everything above u_max, including the sample maxima.

LOADER (Mohamad & Sapsis 2018; the blog's equation "LOADER")
------------------------------------------------------------
LOADER(p, q) := int_R |log p(x) - log q(x)| dx with Gaussian KDE densities and quadrature.
Conventions (the blog gives none beyond "KDE accelerated with FFT" and "Gaussian quadrature"):

* **Bandwidth** h: one value for both KDEs, chosen on the *reference* (a model sample with wild
  outliers would otherwise inflate its own rule-of-thumb bandwidth and flatten its density).
  Rules: ``"silverman"`` = Silverman's rule of thumb 0.9 min(sigma, IQR/1.34) n^(-1/5) (default),
  ``"scott"`` / ``"normal_reference"`` = the normal-reference rule 1.06 sigma n^(-1/5), ``"ISJ"``
  (Improved Sheather-Jones, KDEpy), or a positive number. sigma: sample standard deviation
  (ddof = 1), IQR: interquartile range (linear interpolation).
* **Density floor** f > 0: densities below f are raised to f, i.e. the integrand is
  |log max(p, f) - log max(q, f)|. Default f = 1e-3 x the peak of the reference KDE
  (``relative_floor=True``), or an absolute density. The floor makes the integral over the real
  line finite (far from the data the two Gaussian KDEs' log ratio grows linearly) and caps the
  log ratio where one sample has no mass at all. Where the model puts mass beyond the data
  (p > f, q < f) the integrand is log(p/f) > 0, so generated mass beyond the reference maximum
  always *adds* to LOADER.
* **Window**: ``window=None`` (default) integrates over the whole real line. Because a Gaussian
  KDE is below f farther than R = h sqrt(2 log(1/(f h sqrt(2 pi)))) from every sample (any KDE
  is at most one kernel at the nearest sample), the integrand vanishes outside the union of
  [x_i - R, x_i + R] over *both* samples, so the effective window is
  [min - R, max + R] over the union of the samples (R ~ 4 h for the default floor) and the
  integral over R is computed exactly on it, not truncated. ``window="reference"`` is the
  variant [min ref, max ref] (blind to generated mass beyond the reference's range); a
  pair (lo, hi) is an explicit window.
* **KDE evaluation**: exact Gaussian kernel sums, kernels truncated where they are below 1e-12 of
  the floor (>= 9 h), in coordinates local to each cluster of samples so that values of any
  magnitude keep their resolution. (The FFT of the blog is only a way to speed up these sums.)
* **Quadrature**: composite Gauss-Legendre on each cluster of samples (panels of width
  h/``panels``, ``nodes`` nodes each), with extra panel edges at every kink of the integrand
  (where p = q, p = f or q = f; located by the Illinois method), so each panel integrates a
  smooth function. ``return_details=True`` reports the effective window, the floor, the reach R,
  and the fraction of the window where each density was at the floor.

``same_law_floor`` reports the noise floor of a metric: the score of a perfect model with n_gen
samples, i.e. the metric between random n_gen-subsets of the reference (drawn without
replacement) and the remaining n_ref - n_gen points, with the same explicit settings as the
model score. ``matched_score`` scores a model against the same remaining subsets, so model and
floor are compared on identical terms.

Like torchmetrics, each metric is a pair of primitives that the functional form and the class
both call: ``_tail_update`` (the observables as a flat float64 tensor: what ``update`` appends
to the state) and ``_rmsqe_compute`` / ``_loader_compute`` / ``_matched_compute`` (the value
from the gathered samples; they check that the samples are non-empty and finite). So
``rmsqe(gen, ref)`` and ``RootMeanSquaredQuantileError().update(gen, ref); .compute()`` run
the same code on the same numbers.

The torchmetrics classes keep "cat" states of the per-sample *scalar* observables (a few
thousand floats): quantiles and KDEs need the whole sample, and gathering the scalars makes
the synced value exactly the single-process value under DDP (the only reduction is a
concatenation; order does not matter for quantiles or KDEs). Update the reference on one
rank only (or pass it to the constructor) so that it is not duplicated world-size times.
"""
from __future__ import annotations

import math
import typing
from typing import Literal, Optional, Sequence

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from .. import keys
from ..errors import ConfigError
from ..validation import FinitePositiveFloat, OpenUnitInterval, PositiveInt, check_args
from .kde import (_KDE_TRUNCATION, BANDWIDTH_RULES, Bandwidth, _bandwidth, _check_window, _kde_peak, _loader_details, _TruncatedKDE,
                  bandwidth_rule, integrate_abs_log_ratio)

__all__ = [
    "rmsqe", "loader", "same_law_floor", "matched_score", "reference_splits", "loader_settings",
    "rmsqe_options", "loader_options",
    "kde_density", "integrate_abs_log_ratio", "bandwidth_rule", "quantile_step_integral",
    "quantile_step_contributions", "matched_rmsqe_contributions", "top_share", "hill_tail_index",
    "hill_bootstrap", "image_tiles",
    "RootMeanSquaredQuantileError", "LogAbsoluteDensityRatio", "QUANTILE_METHOD",
    "RMSQE_DEFINITIONS", "BANDWIDTH_RULES", "QUANTILE_CONVENTION",
]

QUANTILE_METHOD = "linear"  # torch.quantile interpolation of the "root_mean_levels" variant
QUANTILE_CONVENTION = "left-continuous inverse of the empirical CDF: x_(ceil(n u))"
#: the RMSQE definitions (:func:`rmsqe`)
Definition = Literal["blog", "root_mean_levels"]
RMSQE_DEFINITIONS = typing.get_args(Definition)


def _tail_update(x, name: str) -> torch.Tensor:
    """The *update* primitive shared by the functional metrics and the classes: the scalar
    observables ``x`` as a flat float64 tensor (tensors keep their device; lists and arrays
    become CPU tensors). Raises ConfigError naming ``name`` for what is not numbers."""
    if torch.is_tensor(x):
        return x.detach().to(torch.float64).reshape(-1)
    try:  # lists / arrays straight to float64 (torch.as_tensor would make a list float32)
        return torch.from_numpy(np.array(x, dtype=np.float64).reshape(-1))
    except (TypeError, ValueError):
        raise ConfigError(name, "must be a 1-D array of numbers", value=type(x).__name__) from None


def _check_sample(t: torch.Tensor, name: str) -> torch.Tensor:
    """What every *compute* primitive needs: a non-empty, finite sample, on the CPU."""
    if t.numel() == 0:
        raise ConfigError(name, "must contain at least one sample, got an empty array")
    if not bool(torch.isfinite(t).all()):
        raise ConfigError(name, "must be finite (found NaN or inf); drop non-finite samples first")
    return t.cpu()


def _as_1d(x, name: str) -> torch.Tensor:
    return _check_sample(_tail_update(x, name), name)


# ----------------------------------------------------------------------------- RMSQE
def quantile_step_integral(gen, ref, lo: float, hi: float = 1.0) -> float:
    """Exact int_lo^hi (Q_gen(u) - Q_ref(u))^2 du of the empirical quantile functions: the sum
    of :func:`quantile_step_contributions` (see there)."""
    with np.errstate(over="ignore"):  # astronomically large observables: inf is the honest value
        return float(np.sum(quantile_step_contributions(gen, ref, lo, hi)))


def quantile_step_contributions(gen, ref, lo: float, hi: float = 1.0) -> np.ndarray:
    """Exact int_lo^hi (Q_gen(u) - Q_ref(u))^2 du of the empirical quantile functions, split by
    generated sample.

    Q(u) = x_(ceil(n u)), the left-continuous inverse of the empirical CDF (step function with
    jumps at k/n). In units of 1/L, L = lcm(n, m), the breakpoints k L/n (gen, n samples) and
    j L/m (ref, m samples) are integers, so the segments on which both steps are constant are
    found exactly; the integral is sum over segments of (difference^2 x length).
    O((1 - lo)(n + m)) after sorting.

    Returns the integral split by generated sample: entry k (float64, length n) is the part of
    the integral over the u-cell ((k-1)/n, k/n] of the k-th smallest generated value (0 below
    lo), so the entries sum to the integral and the largest entry / the sum is the share of
    the score due to one generated sample.
    """
    g = np.sort(np.asarray(gen, dtype=np.float64).reshape(-1))
    r = np.sort(np.asarray(ref, dtype=np.float64).reshape(-1))
    n, m = g.size, r.size
    if not 0.0 <= lo < hi <= 1.0:
        raise ConfigError("u range", "must satisfy 0 <= lo < hi <= 1", value=(lo, hi))
    L = math.lcm(n, m)  # python int: exact
    if L > 2**53:
        raise ConfigError("gen, ref", f"sample sizes {n} and {m} have lcm {L} > 2^53: the exact "
                          "quantile integral needs lcm(n, m) <= 2^53 (subsample one of them)")
    sg, sr = L // n, L // m  # units per quantile step of gen / ref
    lo_units, hi_units = lo * L, hi * L
    kg = np.arange(max(1, int(math.floor(lo * n))), n + 1, dtype=np.int64) * sg
    kr = np.arange(max(1, int(math.floor(lo * m))), m + 1, dtype=np.int64) * sr
    b = np.union1d(kg, kr).astype(np.float64)  # exact below 2**53
    b = b[(b > lo_units) & (b < hi_units)]
    edges = np.concatenate([[lo_units], b, [hi_units]])
    mid = 0.5 * (edges[1:] + edges[:-1])  # strictly inside a segment: no breakpoint in between
    ig = np.clip(np.floor(mid / sg).astype(np.int64), 0, n - 1)  # ceil(u n) - 1 (0-based)
    ir = np.clip(np.floor(mid / sr).astype(np.int64), 0, m - 1)
    with np.errstate(over="ignore"):  # astronomically large observables: inf is the honest value
        return np.bincount(ig, weights=(g[ig] - r[ir]) ** 2 * np.diff(edges), minlength=n) / L


def rmsqe(gen, ref, eta: OpenUnitInterval = 0.975, u_max: float | None = None, num_levels: PositiveInt = 200,
          definition: Definition = "blog") -> torch.Tensor:
    """Tail quantile error between the samples ``gen`` and ``ref`` (float64 scalar).

    ``definition="blog"`` (default): the blog's formula int_eta^1 |F_gen^{-1}(u) -
    F_ref^{-1}(u)|^2 du, no root, no normalisation (module docstring), computed exactly for the
    empirical quantile functions x_(ceil(n u)); any sample sizes >= 1. ``u_max`` (default 1)
    is the upper limit of the integral: a value < 1 truncates the blog's integral and drops the
    sample maxima, so leave it at None unless that is what you want. ``num_levels`` is unused.

    ``definition="root_mean_levels"``: the variant sqrt(mean_k (Q_gen(u_k) -
    Q_ref(u_k))^2), u_k = linspace(eta, u_max, num_levels), linear-interpolated quantiles;
    ``u_max`` defaults to 1 - 1/n_min (n_min = the smaller sample size) and must exceed eta, so
    n_min > 1/(1 - eta) samples are needed (41 for eta = 0.975).
    """
    return _rmsqe_compute(_tail_update(gen, "gen"), _tail_update(ref, "ref"), eta, u_max,
                          num_levels, definition)


def _rmsqe_compute(gen: torch.Tensor, ref: torch.Tensor, eta: OpenUnitInterval = 0.975,
                   u_max: float | None = None, num_levels: PositiveInt = 200,
                   definition: Definition = "blog") -> torch.Tensor:
    """The *compute* primitive of :func:`rmsqe` and :class:`RootMeanSquaredQuantileError`, on
    the flat float64 samples of :func:`_tail_update` (checked here: non-empty, finite)."""
    check_args(_rmsqe_compute, locals())
    eta = float(eta)
    g, r = _check_sample(gen, "gen"), _check_sample(ref, "ref")
    n_min = min(g.numel(), r.numel())
    if definition == "blog":
        hi = 1.0 if u_max is None else float(u_max)
        if not eta < hi <= 1.0:
            raise ConfigError("u_max", f"must lie in (eta, 1] = ({eta}, 1] (None = 1, the blog's "
                              "upper limit)", value=u_max)
        return torch.tensor(quantile_step_integral(g.numpy(), r.numpy(), eta, hi),
                            dtype=torch.float64)
    if u_max is None:
        u_max = 1.0 - 1.0 / n_min
    u_max = float(u_max)
    if not eta < u_max <= 1.0:
        raise ConfigError("u_max", f"must lie in (eta, 1] = ({eta}, 1] (with the default "
                          f"1 - 1/n_min, need more than {1 / (1 - eta):.0f} samples; the smaller "
                          f"sample has {n_min})", value=u_max)
    u = torch.linspace(eta, u_max, int(num_levels), dtype=torch.float64)
    qg = torch.quantile(g, u, interpolation=QUANTILE_METHOD)
    qr = torch.quantile(r, u, interpolation=QUANTILE_METHOD)
    return (qg - qr).square().mean().sqrt()


# ----------------------------------------------------------------------------- LOADER
def kde_density(samples, points, bandwidth: Bandwidth = "silverman") -> np.ndarray:
    """Gaussian KDE of ``samples`` evaluated at ``points`` (numpy float64, shape of ``points``).

    Exact kernel sums (kernels truncated at 9 bandwidths: relative error < 3e-18 of a kernel's
    peak); ``bandwidth`` is a number or a rule name applied to ``samples`` (:func:`bandwidth_rule`).
    """
    check_args(kde_density, {"bandwidth": bandwidth})
    x = np.sort(_as_1d(samples, "samples").numpy())
    pts = np.asarray(points, dtype=np.float64)
    h = _bandwidth(x, bandwidth)
    return _TruncatedKDE(x, h, _KDE_TRUNCATION * h)(pts.reshape(-1)).reshape(pts.shape)


def _window_arg(window):
    """None / 'reference' / a checked (lo, hi) pair."""
    if window is None or (isinstance(window, str) and window == "reference"):
        return window
    if isinstance(window, str):
        raise ConfigError("window", "unknown window name", value=window,
                          accepted=[None, "reference", "(lo, hi)"])
    return _check_window(window)


def _reference_window(r: np.ndarray) -> tuple[float, float]:
    lo, hi = float(r.min()), float(r.max())
    return (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)


def loader(gen, ref, window: Sequence[float] | str | None = None, floor: FinitePositiveFloat = 1e-3,
           relative_floor: bool = True, bandwidth: Bandwidth = "silverman", panels: PositiveInt = 2,
           nodes: PositiveInt = 8, return_details: bool = False):
    """LOADER = int |log max(p_gen, f) - log max(p_ref, f)| dx with Gaussian KDEs (module docstring).

    Args:
        window: None (default) = the whole real line, computed exactly on the effective window
            [min - R, max + R] over the union of both samples (R: distance at which a KDE falls
            below the floor); ``"reference"`` = [min ref, max ref] (a variant, blind to
            generated mass beyond the reference's range); or an explicit (lo, hi).
        floor: density floor f; with ``relative_floor=True`` (default) ``floor`` x the peak of the
            reference KDE, else an absolute density.
        bandwidth: a number > 0 or a rule ('silverman', 'scott' = 'normal_reference', 'ISJ')
            applied to the *reference*; both KDEs use that one bandwidth.
        panels: Gauss–Legendre panels per bandwidth h (panel width <= h/panels), plus splits at
            every kink of the integrand. nodes: Gauss–Legendre nodes per panel.
        return_details: also return a dict with ``value``, the effective ``window``, absolute
            ``floor``, ``bandwidth``, ``reach`` R, ``covered_length`` (where a KDE can exceed the
            floor) and ``floor_fraction_gen`` / ``_ref`` / ``_both``: the fraction of the
            effective window where p_gen / p_ref / both were at the floor.

    Returns:
        a float64 scalar tensor, or (tensor, details) with ``return_details=True``.
    """
    return _loader_compute(_tail_update(gen, "gen"), _tail_update(ref, "ref"), window, floor,
                           relative_floor, bandwidth, panels, nodes, return_details)


def _loader_compute(gen: torch.Tensor, ref: torch.Tensor,
                    window: Sequence[float] | str | None = None, floor: float = 1e-3,
                    relative_floor: bool = True, bandwidth="silverman", panels: PositiveInt = 2,
                    nodes: PositiveInt = 8, return_details: bool = False):
    """The *compute* primitive of :func:`loader` and :class:`LogAbsoluteDensityRatio`, on the
    flat float64 samples of :func:`_tail_update` (checked here: non-empty, finite)."""
    check_args(_loader_compute, locals())
    g, r = _check_sample(gen, "gen"), _check_sample(ref, "ref")
    panels, nodes = int(panels), int(nodes)
    settings = loader_settings(r, window, floor, relative_floor, bandwidth)
    det = _loader_details(np.sort(g.numpy()), np.sort(r.numpy()), settings["bandwidth"],
                          settings["floor"], settings["window"], panels, nodes)
    val = torch.tensor(det["value"], dtype=torch.float64)
    return (val, det) if return_details else val


_COMPUTE = {"rmsqe": _rmsqe_compute, "loader": _loader_compute}


def _check_n_gen(n_ref: int, n_gen) -> int:
    if n_gen is None:
        return n_ref // 2
    try:
        ok = not isinstance(n_gen, bool) and float(n_gen).is_integer() and 1 <= int(n_gen) <= n_ref - 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError("n_gen", f"must be an integer in [1, n_ref - 1] = [1, {n_ref - 1}] "
                          f"(generated samples; the rest of the reference is the comparison "
                          f"sample)", value=n_gen)
    return int(n_gen)


def reference_splits(n_ref: int, n_gen: int, num_splits: PositiveInt = 8, seed: int = 0):
    """``num_splits`` seeded random splits of range(n_ref) into (n_gen indices, the rest).

    Drawn *without* replacement (``torch.randperm``); the same (n_ref, n_gen, num_splits, seed)
    always give the same splits, so :func:`same_law_floor` and :func:`matched_score` share them.
    """
    check_args(reference_splits, locals())
    n_gen = _check_n_gen(int(n_ref), n_gen)
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(int(num_splits)):
        perm = torch.randperm(int(n_ref), generator=gen)
        out.append((perm[:n_gen], perm[n_gen:]))
    return out


def _metric_fn(metric: str, n_gen: int, kwargs: dict, ref: torch.Tensor):
    """The compute primitive of ``metric`` and its explicit settings for n_gen samples."""
    if metric not in _COMPUTE:
        raise ConfigError("metric", "unknown tail metric", value=metric, accepted=sorted(_COMPUTE))
    kwargs = dict(kwargs)
    if metric == "rmsqe":
        if kwargs.get("definition", "blog") == "root_mean_levels" \
                and kwargs.get("u_max") is None:
            # the model score rmsqe(gen, ref) uses 1 - 1/min(n_gen, n_ref) = 1 - 1/n_gen
            kwargs["u_max"] = 1.0 - 1.0 / n_gen
    elif isinstance(kwargs.get("window"), str) and kwargs["window"] == "reference":
        # one window for every split: the range of the *full* reference
        kwargs["window"] = _reference_window(ref.numpy())
    return _COMPUTE[metric], kwargs


def same_law_floor(ref, metric: str = "loader", num_splits: int = 8, seed: int = 0,
                   n_gen: int | None = None, **kwargs) -> torch.Tensor:
    """Same-law noise floor of ``metric`` ('loader' or 'rmsqe'): the score of a *perfect* model.

    For ``num_splits`` seeded random splits of ``ref`` (n_ref samples) into a subset of
    ``n_gen`` samples drawn without replacement (playing the generated sample) and the
    remaining n_ref - n_gen (playing the reference), returns the mean of
    ``metric(ref[subset], ref[rest], **kwargs)``. ``n_gen`` must be the number of generated
    samples of the model score it calibrates (default n_ref // 2: the old half split), in
    [1, n_ref - 1].

    Pass the *same explicit* settings as the model score. RMSQE: the blog definition integrates
    up to u = 1 (no u_max); the "root_mean_levels" variant's u_max defaults here to 1 - 1/n_gen
    (the default of ``rmsqe(gen, ref)`` with n_gen < n_ref). LOADER: the bandwidth and floor
    (:func:`loader_settings` freezes them from the full reference); the default window (None)
    is derived per comparison from both samples, ``window="reference"`` is fixed to the range of
    the full reference. Remaining mismatch when the model is scored against the *full*
    reference: the floor's comparison sample has n_ref - n_gen points instead of n_ref, so the
    floor is slightly above the perfect model's expected score. :func:`matched_score` removes it
    by scoring the model against the same n_ref - n_gen subsets.
    """
    r = _as_1d(ref, "ref")
    if r.numel() < 2:
        raise ConfigError("ref", f"need at least 2 samples to split, got {r.numel()}")
    n_gen = _check_n_gen(r.numel(), n_gen)
    fn, kwargs = _metric_fn(metric, n_gen, kwargs, r)
    vals = [fn(r[a], r[b], **kwargs) for a, b in reference_splits(r.numel(), n_gen, num_splits, seed)]
    return torch.stack(vals).mean()


def matched_score(gen, ref, metric: str = "loader", num_splits: int = 8, seed: int = 0,
                  n_gen: int | None = None, **kwargs) -> torch.Tensor:
    """Model score comparable with :func:`same_law_floor`: mean over the *same* splits of
    ``metric(gen, ref[rest])``, ``rest`` = the n_ref - n_gen reference points of each split.

    With the same (num_splits, seed, n_gen, explicit kwargs) the model and the floor are
    compared with identical reference samples of identical size, so a perfect model (``gen``
    n_gen draws of the reference law) has *exactly* the floor as expected score. ``n_gen``
    defaults to ``len(gen)``; pass the number of samples generated (before dropping non-finite
    ones) to reuse a cached floor.
    """
    return _matched_compute(_tail_update(gen, "gen"), _tail_update(ref, "ref"), metric,
                            num_splits, seed, n_gen, **kwargs)


def _matched_compute(gen: torch.Tensor, ref: torch.Tensor, metric: str, num_splits: int = 8,
                     seed: int = 0, n_gen: int | None = None, **kwargs) -> torch.Tensor:
    """The compute primitive of :func:`matched_score` and of the classes with ``num_splits``."""
    g, r = _check_sample(gen, "gen"), _check_sample(ref, "ref")
    n_gen = _check_n_gen(r.numel(), g.numel() if n_gen is None else n_gen)
    fn, kwargs = _metric_fn(metric, n_gen, kwargs, r)
    vals = [fn(g, r[b], **kwargs) for _, b in reference_splits(r.numel(), n_gen, num_splits, seed)]
    return torch.stack(vals).mean()


def matched_rmsqe_contributions(gen, ref, num_splits: int = 8, seed: int = 0,
                                n_gen: int | None = None, eta: OpenUnitInterval = 0.975,
                                u_max: float | None = None, **_ignored) -> torch.Tensor:
    """The blog RMSQE of :func:`matched_score` split by generated sample (float64, length
    len(gen), in the order of ``gen``): entry i is the mean over the splits of the part of
    int_eta^u_max (Q_gen - Q_ref[rest])^2 du over generated sample i's quantile cell
    (:func:`quantile_step_contributions`; ties share by order). The entries sum to the matched
    blog RMSQE, so ``max / sum`` is the share of the score due to its single largest
    contribution."""
    g, r = _check_sample(_tail_update(gen, "gen"), "gen"), _check_sample(_tail_update(ref, "ref"), "ref")
    check_args(matched_rmsqe_contributions, {"eta": eta})
    eta = float(eta)
    hi = 1.0 if u_max is None else float(u_max)
    n_gen = _check_n_gen(r.numel(), g.numel() if n_gen is None else n_gen)
    order = np.argsort(g.numpy(), kind="stable")
    total = np.zeros(g.numel())
    splits = reference_splits(r.numel(), n_gen, num_splits, seed)
    for _, b in splits:
        total[order] += quantile_step_contributions(g.numpy(), r[b].numpy(), eta, hi)
    return torch.from_numpy(total / len(splits))


def top_share(contributions) -> float:
    """Largest entry / sum of non-negative contributions (NaN when the sum is 0 or not finite)."""
    c = torch.as_tensor(contributions, dtype=torch.float64).reshape(-1)
    tot = float(c.sum()) if c.numel() else 0.0
    return float(c.max()) / tot if tot > 0 and math.isfinite(tot) else math.nan


def hill_tail_index(x, k: int, distinct: bool = False) -> dict:
    """Hill's estimator of the tail index from the k largest values (Hill 1975):
    alpha_hat = k / sum_{i=1}^{k} log(X_(n-i+1) / X_(n-k)), X_(j) the order statistics, with its
    asymptotic standard error alpha_hat / sqrt(k). For P(X > x) ~ x^(-alpha), alpha_hat -> alpha;
    comparable with the stability index alpha of alpha-stable noise (P(|eps| > x) ~ x^(-alpha)).

    ``distinct=True``: the estimator on the distinct values (each value once): repeated values,
    e.g. the same peak pixel seen by overlapping crops, otherwise count as several independent
    observations and the standard error alpha_hat/sqrt(k) overstates the precision (an honest
    interval: :func:`hill_bootstrap` over images). k then counts distinct values. Returns
    ``{"k", "alpha", "se", "threshold", "n", "distinct_top"}`` (n: values used; distinct_top:
    distinct values among the k largest); alpha is NaN when X_(n-k) <= 0 (the estimator needs
    positive order statistics) or all k values equal the threshold."""
    v = np.sort(np.asarray(torch.as_tensor(x, dtype=torch.float64).reshape(-1).cpu()))
    v = v[np.isfinite(v)]
    if distinct:
        v = np.unique(v)
    n = v.size
    if isinstance(k, bool) or not float(k).is_integer() or not 1 <= int(k) <= n - 1:
        raise ConfigError("k", f"must be an integer in [1, n - 1] = [1, {n - 1}] (the number of "
                          "upper order statistics)", value=k)
    k = int(k)
    thr = float(v[n - k - 1])
    top = int(np.unique(v[n - k:]).size)
    if not thr > 0:
        return {"k": k, "alpha": math.nan, "se": math.nan, "threshold": thr, "n": n,
                "distinct_top": top}
    s = float(np.sum(np.log(v[n - k:] / thr)))
    a = k / s if s > 0 else math.nan
    return {"k": k, "alpha": a, "se": a / math.sqrt(k), "threshold": thr, "n": n, "distinct_top": top}


def hill_bootstrap(values, groups, k_fraction: float, num_boot: int = 1000, seed: int = 0,
                   level: float = 0.9, distinct: bool = False) -> dict:
    """Hill's tail index of ``values`` with a bootstrap interval over ``groups`` (e.g. images:
    the values of one image share pixels and weather, so images, not values, are the
    independent units). Each resample draws the groups with replacement (seeded) and applies
    :func:`hill_tail_index` with k = round(``k_fraction`` x its number of values) (distinct
    values with ``distinct``); the interval is the percentile interval at ``level``.

    Returns {"alpha" (on all values), "k", "lo", "hi", "boot_sd", "level", "num_boot",
    "groups", "n", "se_asymptotic", "distinct"}. ValueError for a bad fraction, level or
    grouping."""
    v = np.asarray(torch.as_tensor(values, dtype=torch.float64).reshape(-1).cpu())
    g = np.asarray(groups).reshape(-1)
    if g.size != v.size:
        raise ValueError(f"groups: need one group label per value ({v.size}), got {g.size}")
    if not 0.0 < float(k_fraction) < 1.0:
        raise ValueError(f"k_fraction: must lie in (0, 1), got {k_fraction!r}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    if int(num_boot) < 1:
        raise ValueError(f"num_boot: must be >= 1, got {num_boot!r}")
    labels, inv = np.unique(g, return_inverse=True)

    def k_of(x):
        n = np.unique(x[np.isfinite(x)]).size if distinct else int(np.isfinite(x).sum())
        return int(min(max(1, round(float(k_fraction) * n)), n - 1))

    full = hill_tail_index(v, k_of(v), distinct=distinct)
    rng = np.random.default_rng(int(seed))
    boots = np.empty(int(num_boot))
    for b in range(int(num_boot)):
        times = np.bincount(rng.integers(0, labels.size, labels.size), minlength=labels.size)
        x = np.repeat(v, times[inv])  # every value of a group drawn j times, j times
        boots[b] = hill_tail_index(x, k_of(x), distinct=distinct)["alpha"]
    ok = boots[np.isfinite(boots)]
    q = (1.0 - float(level)) / 2.0
    lo, hi = (np.quantile(ok, [q, 1.0 - q]).tolist() if ok.size else [math.nan, math.nan])
    return {"alpha": full["alpha"], "k": full["k"], "lo": float(lo), "hi": float(hi),
            "boot_sd": float(ok.std(ddof=1)) if ok.size > 1 else math.nan, "level": float(level),
            "num_boot": int(num_boot), "groups": int(labels.size), "n": int(v.size),
            "se_asymptotic": full["se"], "distinct": bool(distinct)}


def image_tiles(images, size: int):
    """Non-overlapping ``size`` x ``size`` tiles of images (N, H, W) or (N, C, H, W) (the
    remainder at the right and bottom edges dropped) -> (tiles (N n_tiles, C, size, size),
    image index of every tile). One maximum per tile never shares a pixel with another, unlike
    the maxima of overlapping random crops."""
    x = torch.as_tensor(images)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ValueError(f"images: need shape (N, H, W) or (N, C, H, W), got {tuple(x.shape)}")
    N, C, H, W = x.shape
    size = int(size)
    if not 1 <= size <= min(H, W):
        raise ValueError(f"size: must lie in [1, min(H, W)] = [1, {min(H, W)}], got {size}")
    h, w = H // size, W // size
    t = x[:, :, :h * size, :w * size].reshape(N, C, h, size, w, size).permute(0, 2, 4, 1, 3, 5)
    return t.reshape(N * h * w, C, size, size), torch.arange(N).repeat_interleave(h * w)


def rmsqe_options(eta: OpenUnitInterval = 0.975, u_max: float | None = None, num_levels: PositiveInt = 200,
                  definition: Definition = "blog") -> dict:
    """The RMSQE keyword arguments of :func:`rmsqe`, checked (ConfigError naming the bad one)
    and normalised, before any sample is seen."""
    check_args(rmsqe_options, locals())
    eta = float(eta)
    if u_max is not None:
        try:
            ok = eta < float(u_max) <= 1.0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError("u_max", f"must be None or lie in (eta, 1] = ({eta}, 1]", value=u_max)
        u_max = float(u_max)
    return dict(eta=eta, u_max=u_max, num_levels=int(num_levels), definition=definition)


def loader_options(window: Sequence[float] | str | None = None, floor: FinitePositiveFloat = 1e-3,
                   relative_floor: bool = True, bandwidth: Bandwidth = "silverman") -> dict:
    """The LOADER keyword arguments of :func:`loader_settings`, checked (ConfigError naming the
    bad one) and normalised, before any sample is seen."""
    check_args(loader_options, locals())
    window = _window_arg(window)
    floor = float(floor)
    return dict(window=window, floor=floor, relative_floor=bool(relative_floor),
                bandwidth=float(bandwidth) if not isinstance(bandwidth, str) else bandwidth)


def loader_settings(ref, window: Sequence[float] | str | None = None, floor: FinitePositiveFloat = 1e-3,
                    relative_floor: bool = True, bandwidth: Bandwidth = "silverman") -> dict:
    """Freeze LOADER's reference-dependent settings on the full reference ``ref``.

    Returns ``dict(window, floor, relative_floor=False, bandwidth)``: the bandwidth rule
    evaluated on ``ref``, the relative floor turned into an absolute density (``floor`` x the
    peak of the reference KDE), and the window: None stays None (the whole real line; its
    effective extent depends on both samples and is derived in each comparison), "reference"
    becomes the explicit range of ``ref``, an explicit pair is kept. Exactly what
    ``loader(gen, ref, ...)`` computes, so passing this dict to both the model score and
    :func:`same_law_floor` makes the two use the same bandwidth / floor / window rule.
    """
    check_args(loader_settings, locals())
    r = _as_1d(ref, "ref")
    window = _window_arg(window)
    floor = float(floor)
    rn = np.sort(r.numpy())
    if isinstance(window, str):
        window = _reference_window(rn)
    bw = _bandwidth(rn, bandwidth)
    if relative_floor:
        floor *= max(_kde_peak(rn, bw), 1e-300)
    return dict(window=window, floor=floor, relative_floor=False, bandwidth=bw)


# ------------------------------------------------------------------------ torchmetrics
class _TailMetric(Metric):
    """Shared state handling: 'cat' states of scalar observables (exact under DDP)."""

    is_differentiable = False
    full_state_update = False

    def __init__(self, reference=None, num_splits: Optional[PositiveInt] = None, n_gen: Optional[PositiveInt] = None,
                 split_seed: int = 0, **kwargs):
        check_args(_TailMetric.__init__, locals())
        super().__init__(**kwargs)
        self.add_state("preds", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        # the observables are float64: so is the placeholder torchmetrics syncs for a rank that
        # never updated (float32 by default: gloo then aborts one rank and hangs the other)
        self.set_dtype(torch.float64)
        self._fixed_ref = None if reference is None else _as_1d(reference, "reference")
        self.num_splits = None if num_splits is None else int(num_splits)
        self.n_gen = None if n_gen is None else int(n_gen)
        self.split_seed = int(split_seed)

    def _score(self, metric: str, p: torch.Tensor, t: torch.Tensor, **kw) -> torch.Tensor:
        """Against the whole reference, or (num_splits set) the matched score: the same
        compute primitives as the functional :func:`rmsqe`, :func:`loader`, :func:`matched_score`."""
        if self.num_splits is None:
            return _COMPUTE[metric](p, t, **kw)
        return _matched_compute(p, t, metric, self.num_splits, self.split_seed, self.n_gen, **kw)

    def update(self, preds: torch.Tensor, target: torch.Tensor | None = None) -> None:
        """Add generated observables ``preds`` and (optionally) reference observables."""
        self.preds.append(_tail_update(preds, "preds").to(self.device))
        if target is not None:
            self.target.append(_tail_update(target, "target").to(self.device))

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

    The class keeps the blog's metric name; with the default ``definition="blog"`` its value is
    the blog's formula (integral of the squared quantile difference over [eta, 1], no root).
    With ``num_splits`` set, ``compute`` is :func:`matched_score` (same splits as
    ``same_law_floor(ref, "rmsqe", num_splits, split_seed, n_gen)``) instead of rmsqe(gen, ref).
    """

    higher_is_better = keys.higher_is_better("tail/rmsqe")  # the key table declares it

    def __init__(self, eta: OpenUnitInterval = 0.975, u_max: float | None = None, num_levels: PositiveInt = 200,
                 reference=None, definition: Definition = "blog", **kwargs):
        opts = rmsqe_options(eta, u_max, num_levels, definition)
        super().__init__(reference=reference, **kwargs)
        self.eta, self.u_max, self.num_levels = opts["eta"], opts["u_max"], opts["num_levels"]
        self.definition = opts["definition"]

    def compute(self) -> torch.Tensor:
        p, t = self._gathered()
        if p.numel() == 0:  # nothing observed yet (torchmetrics warns): NaN
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self._score("rmsqe", p, t, eta=self.eta, u_max=self.u_max,
                           num_levels=self.num_levels, definition=self.definition)


class LogAbsoluteDensityRatio(_TailMetric):
    """torchmetrics wrapper of :func:`loader` (update(preds=gen observables, target=ref)).

    ``num_splits``, ``n_gen``, ``split_seed``: as for :class:`RootMeanSquaredQuantileError`.
    Without splits, ``last_details`` holds the details dict of the last ``compute`` (effective
    window, floor, floor fractions; see :func:`loader`).
    """

    higher_is_better = keys.higher_is_better("tail/loader")  # the key table declares it

    def __init__(self, window: Sequence[float] | str | None = None, floor: FinitePositiveFloat = 1e-3,
                 relative_floor: bool = True, bandwidth: Bandwidth = "silverman", panels: PositiveInt = 2,
                 nodes: PositiveInt = 8, reference=None, **kwargs):
        check_args(LogAbsoluteDensityRatio.__init__, locals())
        opts = loader_options(window, floor, relative_floor, bandwidth)
        panels, nodes = int(panels), int(nodes)
        super().__init__(reference=reference, **kwargs)
        self.panels, self.nodes = panels, nodes
        self.window, self.floor = opts["window"], opts["floor"]
        self.relative_floor, self.bandwidth = opts["relative_floor"], opts["bandwidth"]
        self.last_details: dict | None = None

    def compute(self) -> torch.Tensor:
        p, t = self._gathered()
        if p.numel() == 0:  # nothing observed yet (torchmetrics warns): NaN
            return torch.tensor(float("nan"), dtype=torch.float64)
        kw = dict(window=self.window, floor=self.floor, relative_floor=self.relative_floor,
                  bandwidth=self.bandwidth, panels=self.panels, nodes=self.nodes)
        if self.num_splits is None:
            val, self.last_details = _loader_compute(p, t, return_details=True, **kw)
            return val
        return self._score("loader", p, t, **kw)
