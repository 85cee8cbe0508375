"""RepresentationEvaluation: ICR, Tr(Sigma_s), Tr(Sigma_xi) and the spectrum of a model's features.

The protocol of *Evaluating the Representation Space of Diffusion Models via Self-Supervised
Principles* (the ICR paper; Sec. 5, App. B.6 and C), as a plain object (pure torch, no Lightning)::

    ev = RepresentationEvaluation(train_data, sigma=0.29, d_proj=64)
    ev.measure(model).values         # {"icr", "icr_se", "trace_s", "trace_xi", "n", "d", ...}
    out = ev.evaluate(model)         # {sigma: {"icr", "trace_s", "trace_xi", "eigenvalues", ...}}

1. **Fixed subset.** ``num_images`` distinct training images drawn by a seeded permutation (stream
   ``icr.subset``), the same at every call; None (default) = min(4096, N), the paper's 4096 (App. C)
   or the whole training set when it is smaller. An explicit number is used exactly.
2. **Views.** For image i (its index in the training set) and pair k = 0 .. ``views_per_image`` - 1,
   views 2k and 2k + 1 are: augmentation at ``level`` (App. B.6, :mod:`lightning_pfd.diffusion.augment`)
   **then** independent Gaussian noise at sigma. Every parameter of view v of image i is a pure
   function of (``seed`` * 1_000_003 + i, v), so the views do not depend on the batch, the device or
   the number of processes. ``image_shape`` reshapes flattened images for the augmentation. All
   2 x ``views_per_image`` views of a chunk of images are drawn in one vectorised call (one seeded
   stream per row, :meth:`view_parts`) and fed to the net in **one** forward per noise level; the
   augmented views and their unit noise do not depend on sigma or on the model, so they are drawn
   once per chunk for every noise level and, when they fit in :data:`VIEW_CACHE_BYTES`, kept
   between measurements (the subset and its seeds are fixed).
3. **Features.** ``evaluate(model)`` / ``measure(model)`` with a sigma-space denoiser (``.net`` + ``.network_input(x,
   sigma)``, e.g. ``DiffusionModule.denoiser``; an ``nn.Module`` exposing ``.denoiser`` is unwrapped):
   the net's activation at ``tap`` (default ``net.default_tap``) fed ``network_input(view, sigma)``,
   mean-pooled over space (App. C), in eval mode. Any other callable is a *feature function*
   ``(x, sigma) -> (B, d)`` (or (B, C, H, W), pooled). With ``d_proj`` the features are multiplied by
   a fixed Gaussian matrix (d, d_proj) (:meth:`projection`, stream ``icr.projection``).
4. **Statistics.** Per noise level, the float64 sums of :func:`~lightning_pfd.metrics.icr._icr_update`
   over all view pairs; a pair with a NaN/inf feature is counted in ``nonfinite``, never added. The
   sums of several processes add up exactly (:meth:`shard_statistics` on each rank, a sum,
   :meth:`results`), so a sharded measurement equals the single-process one.
5. **Results** (:meth:`results`): the dict of :class:`~lightning_pfd.metrics.InvariantContaminationRatio`
   (``icr`` = eq. 5, ``trace_s`` / ``trace_xi`` on l2-normalized features as in Fig. 8, raw traces,
   ``n`` view pairs, ``d``, the ridge ``tau``, ``cond_xi``, ``eigenvalues`` = the generalized spectrum
   of eq. 4, descending) plus ``icr_tau_auto`` / ``icr_tau_relative`` (the same sums under both ridge
   rules; NaN where a rule fails) and ``nonfinite`` (fraction of non-finite pairs). When any pair is
   non-finite the values are NaN and ``eigenvalues`` is empty: ICR is undefined for such features.

Well-posedness (a project choice, not the paper's): Sigma_s and Sigma_xi are d x d, so with n
distinct images close to d the estimate collapses towards 0; the paper uses N = 4096 images
(App. C), many times the channel count of its tap. Use more images, ``d_proj`` (a
Johnson-Lindenstrauss projection), a narrower ``tap``, or ``views_per_image > 1``.
:func:`well_posed` says whether n >= 4 d.

sigma for VP: the VP preconditioning of this project is written in sigma-space (x = y + sigma n), like
EDM, so sigma* = 0.29 means the same noise-to-signal ratio for both and is passed as is.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple

import torch
from torch import nn

from ..contracts import SIGMA_SPACE_MODELS, denoiser_sigma_range
from ..diffusion.augment import AUG_LEVELS, augment, noisy_view
from ..diffusion.features import extract_features, random_projection, resolve_tap
from ..diffusion.noise import seeded_noise, seeded_uniform
from ..diffusion.streams import STREAMS, stream
from ..errors import ConfigError
from ..metrics.icr import (DEFAULT_COND_MAX, DEFAULT_TAU_REL, ICR_STATES, TauSpec, _icr_at, _icr_compute, unit_traces,
                           _icr_update, _icr_zero_states, check_tau, pool_features)
from ..validation import FinitePositiveFloat, IntAtLeastTwo, NonNegativeFloat, NonNegativeInt, PositiveInt, check_args
from .base import SINGLE, Comm, Evaluation, Measurement, NonFinite, TorchDistributed, Units, bind_train_data
from .sharding import check_world, shard_indices

__all__ = ["RepresentationEvaluation", "ICR_LEAVES", "ICR_HISTORY", "check_representation_settings", "fixed_subset",
           "resolve_num_images", "denoiser_of", "merge_statistics", "well_posed", "sigma_leaf",
           "DEFAULT_NUM_IMAGES", "VIEW_CACHE_BYTES", "MAX_VIEWS_PER_IMAGE"]

#: default subset: the paper's 4096 training images (App. C), capped at the training set
DEFAULT_NUM_IMAGES = 4096
_SEED_STRIDE = 1_000_003  # seed of image i under base seed s: s * stride + i
#: the augmented views and their noise (float32) of one process's subset are kept between
#: measurements when they take at most this many bytes (8 x 2 views_per_image x images x D)
VIEW_CACHE_BYTES = 64 * 2 ** 20
#: the projected features of consecutive chunks are added to the sums together, once they hold
#: this many values (both members of the pairs; float64: 4 MiB): small chunks share one update
_PENDING_VALUES = 2 ** 19
#: view v of an image draws from streams augment.params + v and augment.noise + v (registered
#: ranges of 1000 views): at most 500 pairs per image
MAX_VIEWS_PER_IMAGE = min(STREAMS["augment.params"].width, STREAMS["augment.noise"].width) // 2
#: groups of images for the delete-a-group jackknife of ICR (its standard error and paired tests)
JACKKNIFE_GROUPS = 16
_RESULT_KEYS = ("icr", "trace_s", "trace_xi", "trace_s_raw", "trace_xi_raw", "tau", "cond_xi",
                "icr_tau_auto", "icr_tau_relative")

#: the scalars logged at sigma* (+ ``sigma_<value>`` per extra level), and those kept in the history
ICR_LEAVES = ("icr", "icr_se", "trace_s", "trace_xi", "n", "d", "nonfinite")
ICR_HISTORY = ("tau", "cond_xi", "icr_tau_auto", "icr_tau_relative")

Statistics = Dict[float, Dict[str, torch.Tensor]]


# ----------------------------------------------------------------------------- settings
#: an augmentation level of :func:`~lightning_pfd.diffusion.augment.augment`
AugLevel = Literal[AUG_LEVELS]


def check_representation_settings(num_images: Optional[IntAtLeastTwo] = None, sigma: FinitePositiveFloat = 0.29,
                                  sigmas: Optional[Sequence[float]] = None, level: Optional[AugLevel] = 3,
                                  vector_jitter: NonNegativeFloat = 0.0, image_shape: Optional[Sequence[int]] = None,
                                  tap: Optional[str] = None, d_proj: Optional[PositiveInt] = None,
                                  views_per_image: PositiveInt = 1, tau: TauSpec = "auto", normalize: bool = False,
                                  cond_max: float = DEFAULT_COND_MAX, seed: NonNegativeInt = 0,
                                  batch_size: PositiveInt = 256) -> Dict[str, Any]:
    """The protocol's settings, validated (ConfigError naming the argument: the declared types,
    then the rules between arguments) and normalised: ``level`` None -> 3, ``sigmas`` = the
    extra levels without repeats or ``sigma``, ``tau`` as
    :func:`~lightning_pfd.metrics.icr.check_tau` returns it, ``image_shape`` a tuple."""
    check_args(check_representation_settings, locals())
    if views_per_image > MAX_VIEWS_PER_IMAGE:
        raise ConfigError("views_per_image", "the seeded streams of the views hold "
                          f"{2 * MAX_VIEWS_PER_IMAGE} views per image", value=views_per_image,
                          accepted=f"an integer in [1, {MAX_VIEWS_PER_IMAGE}]")
    level = 3 if level is None else level
    levels = [float(sigma)] + [float(s) for s in (sigmas or [])]
    if not all(s > 0 and math.isfinite(s) for s in levels):
        raise ConfigError("sigmas", "noise levels must be finite and > 0", value=levels)
    tau = check_tau(tau, cond_max=cond_max)
    if image_shape is not None and (len(image_shape) != 3 or min(image_shape) < 1):
        raise ConfigError("image_shape", "must be None or (C, H, W)", value=image_shape)
    if tap is not None and not isinstance(tap, str):
        raise ConfigError("tap", "must be None or a tap name", value=tap)
    if not isinstance(normalize, bool):
        raise ConfigError("normalize", "must be a bool", value=normalize)
    return dict(num_images=num_images, sigma=levels[0],
                sigmas=[s for s in dict.fromkeys(levels[1:]) if s != levels[0]], level=level,
                vector_jitter=float(vector_jitter),
                image_shape=None if image_shape is None else tuple(int(v) for v in image_shape),
                tap=tap, d_proj=d_proj, views_per_image=views_per_image, tau=tau, normalize=normalize,
                cond_max=float(cond_max), seed=seed, batch_size=batch_size)


def fixed_subset(n_available: int, num: int, seed: int) -> torch.Tensor:
    """``min(num, n_available)`` distinct indices from a seeded permutation (the same every call)."""
    u = seeded_uniform([int(seed)], int(n_available), stream=stream("icr.subset"))[0]
    return u.argsort()[: min(int(num), int(n_available))]


def resolve_num_images(num_images: Optional[int], n_available: int) -> int:
    """``num_images``, or min(DEFAULT_NUM_IMAGES, n_available) when it is None."""
    return min(DEFAULT_NUM_IMAGES, int(n_available)) if num_images is None else int(num_images)


def denoiser_of(model: Any) -> nn.Module:
    """The sigma-space denoiser of ``model``: ``model.denoiser`` (the EMA one of a DiffusionModule),
    else ``model`` itself; it must have ``.net`` and ``.network_input``."""
    den = getattr(model, "denoiser", None)
    den = den if den is not None else model
    if den is None or not hasattr(den, "network_input") or not hasattr(den, "net"):
        raise ConfigError("model", f"ICR needs the features of a sigma-space denoiser (`denoiser` with "
                          f"`.net` and `.network_input(x, sigma)`); {type(model).__name__} has none",
                          value=type(model).__name__, accepted=SIGMA_SPACE_MODELS,
                          suggestion="for LevyItoModule use TailMonitor and MemorizationMonitor")
    return den


def sigma_leaf(sigma: float) -> str:
    """The name of ICR at an extra noise level in :meth:`RepresentationEvaluation.summary`:
    0.29 -> ``sigma_0.29``."""
    return f"sigma_{float(sigma):g}"


def well_posed(n_images: int, d: int) -> bool:
    """Whether n distinct images suffice for d x d covariances (n >= 4 d; module docstring)."""
    return n_images >= 4 * d


def merge_statistics(parts: Sequence[Statistics]) -> Statistics:
    """The statistics of the union of the shards (sums of sums): what an all-reduce computes."""
    out: Statistics = {}
    for part in parts:
        for s, states in part.items():
            acc = out.setdefault(s, {})
            for k, v in states.items():
                acc[k] = v.clone() if k not in acc else acc[k] + v.to(acc[k].device)
    return out


def _reduce(stats: Statistics, reduce: Callable[[torch.Tensor], torch.Tensor]) -> Statistics:
    """One all-reduce of every sum: flatten, ``reduce``, unflatten."""
    names = [(s, k) for s in sorted(stats) for k in sorted(stats[s])]
    flat = reduce(torch.cat([stats[s][k].reshape(-1) for s, k in names]))
    out: Statistics = {s: {} for s in stats}
    i = 0
    for s, k in names:
        n = stats[s][k].numel()
        out[s][k] = flat[i:i + n].reshape(stats[s][k].shape)
        i += n
    return out


@contextlib.contextmanager
def _eval_mode(module: Optional[nn.Module]) -> Iterator[None]:
    """Frozen features: eval mode during the measurement, the previous modes afterwards (nothing
    to switch when every submodule is in eval mode already, e.g. an EMA denoiser)."""
    modes = None if module is None else [m.training for m in module.modules()]
    if modes is None or not any(modes):
        yield
        return
    module.eval()
    try:
        yield
    finally:
        for m, mode in zip(module.modules(), modes):
            m.training = mode


def _device_of(module: nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (CPU when it has none)."""
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


# ----------------------------------------------------------------------------- the evaluation
#: below this total variance of the l2-normalized features (Tr Σ_s + Tr Σ_ξ; a healthy network:
#: ~1e-3 to 1) every image and view has the same feature direction: the outputs collapsed
COLLAPSE_TRACE = 1e-8


def _unit_traces(states: Dict[str, torch.Tensor]) -> Tuple[float, float]:
    """(Tr Σ_s, Tr Σ_ξ) of the l2-normalized features from the ICR sums (as ``_icr_compute``)."""
    if float(states["n"]) < 2:
        return math.nan, math.nan
    trace_s, trace_xi = unit_traces(states)
    return float(trace_s), float(trace_xi)


def collapse_reason(trace_s: float, trace_xi: float) -> Optional[str]:
    """Why the features collapsed (a diverged or dead network: constant features), else None."""
    total = float(trace_s) + float(trace_xi)
    if math.isfinite(total) and abs(total) < COLLAPSE_TRACE:
        return (f"the model's features are the same for every image and view (Tr Σ_s + Tr Σ_ξ = "
                f"{total:.2g} on l2-normalized features, below {COLLAPSE_TRACE:g})")
    return None


class RepresentationEvaluation(Evaluation):
    """ICR and its companions on a fixed training subset (module docstring).

    Args:
        train_data: the training set (N, ...), vectors (N, d) or images (N, C, H, W).
        num_images: distinct images in the subset; None: min(4096, N); at most N.
        sigma: the noise level sigma* of the views (sigma-space; 0.29 for EDM and VP).
        sigmas: extra noise levels, measured with the same views' augmentations and seeds.
        level: augmentation level 0-5 (None: 3; App. B.6).
        vector_jitter: std of the additive jitter of vector data (0: noise-only views).
        image_shape: (C, H, W) of flattened images, for the augmentation.
        tap: feature tap of the denoiser's net (None: ``net.default_tap``).
        d_proj: fixed random projection of the features to this dimension.
        views_per_image: pairs of views per image.
        tau, normalize, cond_max: the ridge rule, feature normalisation and condition limit of
            :class:`~lightning_pfd.metrics.InvariantContaminationRatio`.
        seed: selects the subset and seeds every view and the projection.
        batch_size: rows (views) per forward pass: chunks of max(1, batch_size // (2
            views_per_image)) images, all their views in one forward per noise level (split into
            ``batch_size`` rows only when 2 views_per_image > batch_size).
    """

    #: the metric namespace of a monitor of this evaluation (``icr/icr``, ...)
    default_name = "icr"

    def __init__(self, train_data: Optional[torch.Tensor] = None, num_images: Optional[IntAtLeastTwo] = None,
                 sigma: FinitePositiveFloat = 0.29, sigmas: Optional[Sequence[float]] = None,
                 level: Optional[AugLevel] = 3, vector_jitter: NonNegativeFloat = 0.0,
                 image_shape: Optional[Sequence[int]] = None, tap: Optional[str] = None,
                 d_proj: Optional[PositiveInt] = None, views_per_image: PositiveInt = 1,
                 tau: TauSpec = "auto", normalize: bool = False, cond_max: float = DEFAULT_COND_MAX,
                 seed: NonNegativeInt = 0, batch_size: PositiveInt = 256):
        settings = check_representation_settings(
            num_images=num_images, sigma=sigma, sigmas=sigmas, level=level, vector_jitter=vector_jitter,
            image_shape=image_shape, tap=tap, d_proj=d_proj, views_per_image=views_per_image, tau=tau,
            normalize=normalize, cond_max=cond_max, seed=seed, batch_size=batch_size)
        self.__dict__.update(settings)  # num_images, sigma, sigmas (the extra levels), level, tap, ...
        self.train_data: Optional[torch.Tensor] = None
        self.subset: Optional[torch.Tensor] = None
        self.eigenvalues: Dict[float, torch.Tensor] = {}  # the last measurement's spectrum per sigma
        self._warned = False  # the n < 4 d warning is given once
        if train_data is not None:
            self.bind(train_data)

    def bind(self, train_data: torch.Tensor) -> None:
        """Measure on ``train_data`` (a new fixed subset; the view cache and projection are dropped)."""
        self.train_data = self._check_data(train_data)
        self.subset = fixed_subset(len(train_data), resolve_num_images(self.num_images, len(train_data)), self.seed)
        self._projection: Optional[torch.Tensor] = None
        self._view_cache: Optional[Tuple[Any, List[Tuple[torch.Tensor, torch.Tensor]]]] = None

    @property
    def noise_levels(self) -> List[float]:
        """sigma first, then the extra levels."""
        return [self.sigma, *self.sigmas]

    @property
    def images_per_chunk(self) -> int:
        """Images whose 2 x ``views_per_image`` views share one forward: max(1, batch_size // (2 V))."""
        return max(1, self.batch_size // (2 * self.views_per_image))

    @property
    def num_pairs(self) -> int:
        """View pairs per noise level: images in the subset x ``views_per_image``."""
        return int(self.subset.numel()) * self.views_per_image

    # ------------------------------------------------------------------ checks
    def _check_data(self, data: Any) -> torch.Tensor:
        if not torch.is_tensor(data) or data.ndim < 2 or data.shape[0] == 0:
            raise ConfigError("train_data", "expected a non-empty tensor (N, ...)",
                              value=tuple(data.shape) if torch.is_tensor(data) else type(data).__name__)
        n, sample = int(data.shape[0]), tuple(data.shape[1:])
        if n < 2:
            raise ConfigError("train_data", "ICR needs at least 2 training samples (it estimates covariances "
                              "over images)", value=n, accepted="a training set of 2 or more samples")
        if self.num_images is not None and self.num_images > n:
            raise ConfigError("num_images", f"larger than the training set ({n} samples)",
                              value=self.num_images, accepted=f"an integer in [2, {n}]")
        if self.image_shape is not None and math.prod(sample) != math.prod(self.image_shape):
            raise ConfigError("image_shape", f"does not match samples of shape {sample} "
                              f"({math.prod(sample)} values)", value=list(self.image_shape),
                              accepted=f"a (C, H, W) with C*H*W = {math.prod(sample)}")
        view = self.image_shape or sample
        if len(view) not in (1, 3) or (len(view) == 3 and min(view[1:]) < 4):
            raise ConfigError("image_shape", f"the views must be vectors (d,) or images (C, H, W) of "
                              f"at least 4x4; samples have shape {sample}",
                              value=None if self.image_shape is None else list(self.image_shape))
        return data

    def check_world(self, world: int) -> None:
        """Every process needs at least one image of the subset."""
        if self.subset.numel() < world:
            raise ConfigError("num_images", f"every rank needs at least one image (world size {world}; "
                              f"the subset has {self.subset.numel()})", value=self.num_images,
                              accepted=f"an integer >= {max(2, world)}")

    def check_model(self, model: Any) -> None:
        """Refuse what cannot be measured: a module without a sigma-space denoiser, an unknown
        ``tap``, a noise level outside the denoiser's range, ``d_proj`` > d (costs the features of
        two images)."""
        if isinstance(model, nn.Module):
            den = denoiser_of(model)
            self._check_tap(den.net)
            lo, hi = denoiser_sigma_range(den)
            for s in self.noise_levels:
                if not lo <= s <= hi:
                    raise ConfigError("sigma" if s == self.sigma else "sigmas", f"outside the denoiser's "
                                      f"noise range [{lo:g}, {hi:g}] ({type(den).__name__})", value=s,
                                      accepted=f"a noise level in [{lo:g}, {hi:g}]")
        if self.d_proj is not None:
            d = self.feature_dim(model)
            if self.d_proj > d:
                raise ConfigError("d_proj", f"larger than the feature dimension d = {d} of tap "
                                  f"{self.tap or 'default'!r}: the projected features would have rank "
                                  f"{d} < d_proj (singular covariances)", value=self.d_proj,
                                  accepted=f"None or an integer in [1, {d}]")

    def _check_tap(self, net: nn.Module) -> None:
        taps = getattr(net, "feature_taps", None)
        if self.tap is None and getattr(net, "default_tap", None) is None:
            raise ConfigError("tap", f"{type(net).__name__} has no `default_tap`: name one", value=None,
                              accepted=sorted(taps) if taps else None)
        if self.tap is not None and taps is not None and self.tap not in taps:
            raise ConfigError("tap", f"unknown feature tap of {type(net).__name__}", value=self.tap,
                              accepted=sorted(taps))

    @torch.no_grad()
    def feature_dim(self, model: Any) -> int:
        """d of the (unprojected) features: one forward pass of two images."""
        fn, module, device = self._feature_fn(model)
        with _eval_mode(module):
            idx = self.subset[:2]
            x = self.views(self.train_data[idx].to(device=device, dtype=torch.float32),
                           self.image_seeds(idx).to(device), self.sigma, 0)
            return int(pool_features(fn(x, self.sigma)).shape[1])

    # ------------------------------------------------------------------ the protocol's pieces
    def image_seeds(self, idx: torch.Tensor) -> torch.Tensor:
        """The seed of every image of ``idx`` (training-set indices): seed * 1_000_003 + i."""
        return self.seed * _SEED_STRIDE + idx

    def views(self, x0: torch.Tensor, seeds: torch.Tensor, sigma: float, view: int) -> torch.Tensor:
        """View ``view`` of every row: augmentation (as ``image_shape`` images) then noise at sigma."""
        shape = x0.shape
        if self.image_shape is not None:
            x0 = x0.reshape(-1, *self.image_shape)
        return noisy_view(x0, seeds, sigma, level=self.level, view=view,
                          vector_jitter=self.vector_jitter).reshape(shape)

    def view_parts(self, idx: torch.Tensor, device: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """All 2 x ``views_per_image`` views of the training images ``idx`` before the noise level:
        ``(xa, n)``, float32 (2 V len(idx), *sample) each, row v len(idx) + j = view v of image
        idx[j]: xa its augmentation, n its unit Gaussian noise; view v at sigma is ``xa + sigma * n``,
        bit for bit :meth:`views` (``noisy_view(..., view=v)``). One vectorised draw: row r uses the
        seeded streams augment.params + v and augment.noise + v of its own view v."""
        x0 = self.train_data[idx].to(device=device, dtype=torch.float32)
        seeds = self.image_seeds(idx).to(x0.device)
        nv, b = 2 * self.views_per_image, int(idx.numel())
        view = torch.arange(nv, device=x0.device).repeat_interleave(b)
        x = x0.repeat(nv, *([1] * (x0.ndim - 1)))
        rows = seeds.repeat(nv)
        if self.image_shape is not None:
            x = x.reshape(-1, *self.image_shape)
        xa = augment(x, rows, level=self.level, stream=view, vector_jitter=self.vector_jitter)
        n = seeded_noise(rows, x.shape[1:], dtype=torch.float64, device=x.device,
                         stream=stream("augment.noise") + view)
        shape = (nv * b, *x0.shape[1:])
        return xa.reshape(shape), n.to(xa.dtype).reshape(shape)

    def _view_chunks(self, shard: torch.Tensor, device: torch.device,
                     key: Any) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`view_parts` of every chunk of ``images_per_chunk`` images of ``shard``; kept for
        the next call with the same ``key`` when they take at most :data:`VIEW_CACHE_BYTES`."""
        if self._view_cache is not None and self._view_cache[0] == key:
            yield from self._view_cache[1]
            return
        rows = 2 * self.views_per_image * int(shard.numel())
        keep = 8 * rows * math.prod(self.train_data.shape[1:]) <= VIEW_CACHE_BYTES
        self._view_cache, chunks, c = None, [], self.images_per_chunk
        for i in range(0, shard.numel(), c):
            part = self.view_parts(shard[i:i + c], device)
            if keep:
                chunks.append(part)
            yield part
        if keep:
            self._view_cache = (key, chunks)

    def projection(self, d: int, device: Any = None) -> Optional[torch.Tensor]:
        """The fixed (d, d_proj) Gaussian projection (None without ``d_proj``); seeded, so the same
        matrix at every call and in every process."""
        if self.d_proj is None:
            return None
        if self._projection is None or self._projection.shape[0] != d:
            self._projection = random_projection(d, self.d_proj, self.seed, device)
        return self._projection.to(device)

    def _feature_fn(self, model: Any) -> Tuple[Callable, Optional[nn.Module], torch.device]:
        """(features(x, sigma) -> float64 (B, d) before projection, module to freeze, device)."""
        if isinstance(model, nn.Module):
            den = denoiser_of(model)
            resolve_tap(den.net, self.tap)
            def fn(x: torch.Tensor, sigma: float) -> torch.Tensor:
                return extract_features(den, x, sigma, tap=self.tap, batch_size=self.batch_size)

            return fn, den, _device_of(den)
        if not callable(model):
            raise ConfigError("model", "expected a sigma-space model / denoiser (nn.Module) or a feature "
                              "function (x, sigma) -> features", value=type(model).__name__)
        return (lambda x, s: pool_features(model(x, s)).to(torch.float64)), None, self.train_data.device

    def features(self, model: Any, x: torch.Tensor, sigma: float) -> torch.Tensor:
        """Projected float64 features (B, d or d_proj) of the inputs ``x`` at ``sigma``."""
        fn, module, device = self._feature_fn(model)
        with _eval_mode(module), torch.no_grad():
            h = fn(x.to(device), sigma)
        p = self.projection(h.shape[1], h.device)
        return h if p is None else h @ p

    # ------------------------------------------------------------------ measuring
    @torch.no_grad()
    def shard_statistics(self, model: Any, rank: int = 0, world: int = 1) -> Statistics:
        """This process's sums per noise level (images ``subset[rank::world]``), not yet summed
        over processes: ``{sigma: {<ICR sums>, "nonfinite": count of non-finite pairs}}``."""
        check_world(rank, world)
        self.check_world(world)
        fn, module, device = self._feature_fn(model)
        positions = shard_indices(int(self.subset.numel()), rank, world)
        shard = self.subset[positions]
        groups = (positions % self.num_groups).to(torch.long)  # jackknife group of each image
        stats: Statistics = {}
        pending: Dict[float, List[torch.Tensor]] = {s: [] for s in self.noise_levels}
        labels: Dict[float, List[torch.Tensor]] = {s: [] for s in self.noise_levels}
        V = self.views_per_image
        done = 0
        with _eval_mode(module):
            for xa, n in self._view_chunks(shard, device, (rank, world, str(device))):
                c = xa.shape[0] // (2 * V)
                g = groups[done:done + c].repeat(V)  # pair row k c + j -> image j's group
                done += c
                for sigma in self.noise_levels:
                    h = self._projected(fn(xa + sigma * n, sigma))
                    # row (2k + m) c + j = member m of pair k of image j -> [m, k c + j]
                    pending[sigma].append(h.reshape(V, 2, c, -1).transpose(0, 1).reshape(2, V * c, -1))
                    labels[sigma].append(g)
                    if sum(p.numel() for p in pending[sigma]) >= _PENDING_VALUES:
                        self._accumulate(stats, sigma, pending[sigma], labels[sigma])
                        pending[sigma], labels[sigma] = [], []
        for sigma, parts in pending.items():
            if parts:
                self._accumulate(stats, sigma, parts, labels[sigma])
        return stats

    @property
    def num_groups(self) -> int:
        """Images are split into ``min(JACKKNIFE_GROUPS, n)`` groups (position in the subset mod G)
        for the delete-a-group jackknife standard error of ICR at sigma*."""
        return max(2, min(JACKKNIFE_GROUPS, int(self.subset.numel())))

    def _projected(self, h: torch.Tensor) -> torch.Tensor:
        """h @ P (float64), computed as (P^T h^T)^T: the same dot products, and measured ~2x faster
        with MKL for d_proj << d."""
        p = self.projection(h.shape[1], h.device)
        return h if p is None else (p.T.contiguous() @ h.T).T

    def _accumulate(self, stats: Statistics, sigma: float, parts: List[torch.Tensor],
                    labels: Optional[List[torch.Tensor]] = None) -> None:
        """Add the ICR sums of the view pairs in ``parts`` ((2, pairs, d) each: both members of
        every pair) with finite features; count the others. At sigma* the sums of each jackknife
        group (``labels``: the group of every pair) are kept too (``group_<state>``, (G, ...))."""
        h = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        h1, h2 = h[0], h[1]
        jack = labels is not None and sigma == self.sigma
        if sigma not in stats:
            stats[sigma] = {**_icr_zero_states(h1.shape[1], h1.device),
                            "nonfinite": torch.zeros((), dtype=torch.float64, device=h1.device)}
            if jack:
                zero = _icr_zero_states(h1.shape[1], h1.device)
                stats[sigma].update({f"group_{k}": v.unsqueeze(0).repeat(self.num_groups, *([1] * v.ndim))
                                     for k, v in zero.items()})
        ok = torch.isfinite(h).all(2).all(0)
        n_ok = int(ok.sum())
        stats[sigma]["nonfinite"] += ok.numel() - n_ok
        if n_ok:
            pairs = (h1, h2) if n_ok == ok.numel() else (h1[ok], h2[ok])
            for k, v in _icr_update(*pairs, self.normalize).items():
                stats[sigma][k] += v
            if jack:
                lab = torch.cat(labels).to(h1.device)
                for g in torch.unique(lab[ok]).tolist():
                    sel = ok & (lab == g)
                    for k, v in _icr_update(h1[sel], h2[sel], self.normalize).items():
                        stats[sigma][f"group_{k}"][g] += v

    def jackknife(self, stats: Statistics) -> torch.Tensor:
        """Delete-a-group jackknife replicates of ICR at sigma* (G,): ICR of all images but
        group g's (NaN where it cannot be computed). se = sqrt((G-1)/G sum (r_g - mean r)²)."""
        st = stats[self.sigma]
        out = torch.full((self.num_groups,), math.nan, dtype=torch.float64)
        if "group_n" not in st or float(st["nonfinite"]) > 0:
            return out
        for g in range(self.num_groups):
            states = {k: st[k] - st[f"group_{k}"][g] for k in ICR_STATES}
            out[g] = float(self._icr_or_nan(states, self.tau))
        return out

    def results(self, stats: Statistics) -> Dict[float, Dict[str, torch.Tensor]]:
        """ICR dicts per noise level from the statistics of *all* images (module docstring, 5.)."""
        out = {}
        for s in self.noise_levels:
            states = {k: stats[s][k] for k in ICR_STATES}
            n_bad = float(stats[s]["nonfinite"])
            traces = _unit_traces(states)
            if n_bad == 0 and collapse_reason(*traces):  # constant features: no eigenproblem to solve
                r = self._nan_result(states)
                r["trace_s"], r["trace_xi"] = (torch.tensor(v, dtype=torch.float64) for v in traces)
            elif n_bad == 0:
                r = _icr_compute(states, self.tau, DEFAULT_TAU_REL, self.cond_max)
                for rule in ("auto", "relative"):  # the configured rule is r["icr"] already
                    r[f"icr_tau_{rule}"] = (r["icr"].clone() if self.tau == rule
                                            else self._icr_or_nan(states, rule))
            else:
                r = self._nan_result(states)
            r["nonfinite"] = torch.tensor(n_bad / self.num_pairs, dtype=torch.float64)
            out[s] = r
        reps = self.jackknife(stats)
        g = reps.numel()
        out[self.sigma]["icr_jackknife"] = reps
        out[self.sigma]["icr_se"] = (torch.sqrt((g - 1) / g * ((reps - reps.mean()) ** 2).sum())
                                     if bool(torch.isfinite(reps).all()) else torch.tensor(math.nan, dtype=torch.float64))
        return out

    def summary(self, results: Dict[float, Dict[str, torch.Tensor]]) -> Dict[str, float]:
        """The scalars of a measurement: ``icr``, ``trace_s``, ``trace_xi``, ``tau``, ``cond_xi``,
        ``icr_tau_auto``, ``icr_tau_relative`` at sigma*, ``n`` (distinct images), ``d``,
        ``nonfinite`` (mean over the noise levels) and ``sigma_<value>`` (ICR at every extra level)."""
        main = results[self.sigma]
        out = {k: float(main[k]) for k in ("icr", "trace_s", "trace_xi")}
        out["icr_se"] = float(main.get("icr_se", math.nan))
        out.update(n=float(int(main["n"]) // self.views_per_image), d=float(main["d"]),
                   nonfinite=sum(float(r["nonfinite"]) for r in results.values()) / len(results))
        out.update({sigma_leaf(s): float(results[s]["icr"]) for s in self.sigmas})
        out.update({k: float(main[k]) for k in ("tau", "cond_xi", "icr_tau_auto", "icr_tau_relative")})
        return out

    def evaluate(self, model: Any, comm: Optional[Comm] = None) -> Dict[float, Dict[str, torch.Tensor]]:
        """ICR dicts per noise level of ``model`` (a sigma-space model / denoiser, or a feature
        function): this process's share of the subset, the sums added over ``comm`` in one
        ``reduce_sum`` (default: torch.distributed; every process must call this)."""
        comm = TorchDistributed() if comm is None else comm
        if self.train_data is None:
            raise ConfigError("train_data", "no training set to measure on: pass train_data or call "
                              "prepare(datamodule) first")
        stats = self.shard_statistics(model, comm.rank, comm.world)
        return self.results(_reduce(stats, comm.reduce_sum) if comm.world > 1 else stats)

    # ------------------------------------------------------------------ the measurement contract
    def leaves(self) -> List[str]:
        """``icr``, ``icr_se``, ``trace_s``, ``trace_xi``, ``n``, ``d``, ``nonfinite`` and
        ``sigma_<value>`` per extra level."""
        return [*ICR_LEAVES, *(sigma_leaf(s) for s in self.sigmas)]

    def metric_keys(self, key: Callable[[str], str]) -> List[Any]:
        """The keys a monitor logging ``leaf`` as ``key(leaf)`` declares
        (:func:`lightning_pfd.keys.collect`): the built-in ``icr/*`` under another namespace, and
        one per extra sigma."""
        from .. import keys

        name = key("icr").rsplit("/", 1)[0]
        renamed = [keys.get(f"icr/{leaf}").renamed(key(leaf)) for leaf in ICR_LEAVES if name != "icr"]
        extra = [keys.MetricKey(key(sigma_leaf(s)), f"{name} σ={s:g}", True, description=f"ICR at sigma = {s:g}")
                 for s in self.sigmas]
        return list(keys.KeySet(renamed + extra).all_keys(kind=None))

    def state_dict(self) -> Dict[str, Any]:
        """Whether the n < 4 d warning was given (a monitor's checkpoint state)."""
        return {"warned": self._warned}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._warned = bool(state.get("warned", False))

    def state_key_args(self) -> Dict[str, Any]:
        return dict(sigma=self.sigma, tap=self.tap, num_images=self.num_images, level=self.level,
                    views_per_image=self.views_per_image, d_proj=self.d_proj, image_shape=self.image_shape,
                    seed=self.seed)

    def prepare(self, datamodule: Any, model: Any = None, comm: Comm = SINGLE) -> None:
        """Bind the datamodule's ``train_data`` (kept while it is the same tensor)."""
        bind_train_data(self, datamodule, self.bind)

    def check(self, datamodule: Any, model: Any, comm: Comm = SINGLE) -> None:
        """``num_images`` vs the training set and the world size, the view shape, the model's tap
        and noise range (ConfigError before any work)."""
        self.prepare(datamodule, model, comm)
        self.check_world(comm.world)
        self.check_model(model)

    def measure(self, model: Any, comm: Optional[Comm] = None) -> Measurement:
        """Split the subset over ``comm``, sum the statistics with ``comm.reduce_sum``: ``icr``,
        ``icr_se``, ``trace_s``, ``trace_xi``, ``n``, ``d``, ``nonfinite`` and ``sigma_<value>``
        (ICR paper eq. 3-5); ``tau``, ``cond_xi``, ``icr_tau_auto``, ``icr_tau_relative`` in the
        history; the jackknife replicates of ICR at sigma* as its units; ``raw``: the per-level
        results; a warning the first time n < 4 d (:func:`well_posed`)."""
        comm = TorchDistributed() if comm is None else comm
        results = self.evaluate(model, comm)
        self.eigenvalues = {s: r["eigenvalues"].cpu() for s, r in results.items()}
        values = self.summary(results)
        logged = {leaf: values[leaf] for leaf in self.leaves()}
        reps = results[self.sigma]["icr_jackknife"]  # delete-a-group replicates: se and paired tests
        bad = NonFinite(values["nonfinite"], "features (view pairs)", [k for k, v in logged.items() if v != v])
        notes = [] if self._warned or well_posed(int(values["n"]), int(values["d"])) else [
            f"n = {values['n']:.0f} images for d = {values['d']:.0f} feature dimensions (n < 4d): the ICR "
            "estimate is biased towards 0 (d x d covariances from n images). Use more images, d_proj, a "
            "narrower tap, or views_per_image > 1."]
        self._warned = self._warned or bool(notes)
        return Measurement(logged, units={"icr": Units("jackknife", reps, torch.arange(reps.numel()), values["icr"])},
                           history={k: values[k] for k in ICR_HISTORY}, nonfinite=bad, raw=results, warnings=notes,
                           collapsed=collapse_reason(values["trace_s"], values["trace_xi"]))

    def _icr_or_nan(self, states: Dict[str, torch.Tensor], tau: Any) -> torch.Tensor:
        try:
            return _icr_at(states, tau, DEFAULT_TAU_REL, self.cond_max)
        except ValueError:  # e.g. tau = 0 on a singular Sigma_xi
            return torch.tensor(math.nan, dtype=torch.float64)

    def _nan_result(self, states: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Non-finite features: NaN values, ``n`` (all pairs) and ``d`` kept, no spectrum."""
        dev = states["n"].device
        nan = torch.tensor(math.nan, dtype=torch.float64, device=dev)
        out = {k: nan.clone() for k in _RESULT_KEYS}
        out["n"] = torch.tensor(float(self.num_pairs), dtype=torch.float64, device=dev)
        out["d"] = torch.tensor(float(states["sum_t"].shape[0]), dtype=torch.float64, device=dev)
        out["eigenvalues"] = torch.empty(0, dtype=torch.float64, device=dev)
        return out

