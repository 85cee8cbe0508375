"""ICRMonitor: the Invariant Contamination Ratio of the EMA denoiser, every epoch (ICR paper Sec. 5).

Protocol (ICR paper App. B.6 / C), on every ``every_n_epochs``-th validation pass
(the first always; every n-th training epoch when the fit has no validation loop; ``_schedule.py``):

1. a fixed, seeded subset of the *training* set, the same at every epoch, sharded across ranks
   by the code (no padding sampler): ``num_images`` images, default None = min(4096, N) -- the
   paper's 4096 (App. C), or the whole training set when it is smaller; an explicit integer is
   used exactly (refused when larger than N);
2. for every image, ``views_per_image`` pairs of views: augmentation (level 1-5, App. B.6; default
   3 = crop + flip + colour jitter on RGB, brightness/contrast on other data) **then**
   independent Gaussian noise at sigma* (default 0.29, the paper's value for EDM). Every
   parameter of view v of image i is a pure function of (seed, i, v);
3. features of the EMA denoiser (``pl_module.denoiser``) at the net's default tap (or ``tap``),
   fed ``denoiser.network_input(view, sigma*)``, mean-pooled over space, optionally through a
   fixed random projection to ``d_proj`` dimensions;
4. ICR, Tr(Sigma_s), Tr(Sigma_xi) from :class:`InvariantContaminationRatio` (synced over ranks),
   with its ridge ``tau`` ("auto" by default: 0 unless Sigma_xi is ill-conditioned).

sigma for VP **[choice]**: the VP preconditioning in this project is written in sigma-space
(x = y + sigma n), exactly like EDM, so sigma* = 0.29 means the same noise-to-signal
ratio for both and is passed as is (VPPrecond maps it to its own c_in, c_noise).

Well-posedness: Sigma_s and Sigma_xi are d x d; with n distinct images ~ d the estimate collapses
towards 0. The callback logs n (distinct images) and d and warns once when n < 4 d; reduce d with
``d_proj`` or a narrower ``tap``, and use ``views_per_image > 1`` so Sigma_xi is estimated from
n * views_per_image pairs.

Logged (``pl_module.log``, values already synced): ``icr/icr``, ``icr/trace_s``, ``icr/trace_xi``
(l2-normalized features), ``icr/n``, ``icr/d``, ``icr/nonfinite`` and ``icr/sigma_<value>`` for
every extra sigma in ``sigmas``; ``name`` replaces the ``icr`` namespace (``<name>/icr``, ...), so
two monitors (another sigma*, another tap) can share a Trainer -- each also keeps its own
checkpoint state (``state_key``: name, sigma, tap and the other protocol arguments).

Non-finite features (a diverged model): view pairs with a NaN/inf feature are counted, never fed
to the estimator; if any exists (the all-reduced count, so every rank takes the same branch) the
ICR values of that sigma are NaN -- not an error about positive definiteness, not an ICR > 1 --
and ``icr/nonfinite`` is the fraction of such pairs over all measured noise levels (0.0 when all
are finite); one warning line the first time.

:meth:`ICRMonitor.check_setup` refuses, before training: a module without a sigma-space denoiser,
an unknown ``tap`` (with the net's ``feature_taps`` and the closest name), a sigma outside the
denoiser's range, an explicit ``num_images`` larger than the training set, a subset smaller
than the world size,
an ``image_shape`` whose size differs from the samples', images smaller than 4x4, ``d_proj``
larger than the tap's feature dimension, and another monitor logging the same keys.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..diffusion.augment import AUG_LEVELS, noisy_view
from ..diffusion.features import extract_features, random_projection
from ..diffusion.noise import seeded_uniform
from ..diffusion.streams import stream
from ..errors import ConfigError
from ..metrics.icr import DEFAULT_COND_MAX, InvariantContaminationRatio, check_tau
from ._schedule import (SIGMA_SPACE_MODULES, ScheduledMonitor, callback_field, check_metric_prefix,
                        check_unique_metric_names, global_sum, require_train_data)

__all__ = ["ICRMonitor", "sigma_key", "fixed_subset", "DEFAULT_NUM_IMAGES", "resolve_num_images"]

#: default ICR subset: the paper's 4096 training images (App. C), capped at the training set
DEFAULT_NUM_IMAGES = 4096

_SEED_STRIDE = 1_000_003  # seed of image i under base seed s: s * stride + i
_LEAVES = ("icr", "trace_s", "trace_xi", "n", "d", "nonfinite")


def sigma_key(sigma: float, prefix: str = "icr") -> str:
    """Metric name of an extra noise level, e.g. 0.29 -> ``icr/sigma_0.29``."""
    return f"{prefix}/sigma_{float(sigma):g}"


def fixed_subset(n_available: int, num: int, seed: int) -> torch.Tensor:
    """``min(num, n_available)`` distinct indices from a seeded permutation (same every epoch)."""
    u = seeded_uniform([int(seed)], int(n_available), stream=stream("icr.subset"))[0]
    return u.argsort()[: min(int(num), int(n_available))]


def resolve_num_images(num_images: Optional[int], n_available: int) -> int:
    """``num_images``, or min(DEFAULT_NUM_IMAGES, n_available) when it is None."""
    return min(DEFAULT_NUM_IMAGES, int(n_available)) if num_images is None else int(num_images)


def _positive_int(name: str, value, minimum: int = 1, owner: Any = None) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        field = name if owner is None else callback_field(owner, name)
        raise ConfigError(field, f"must be an integer >= {minimum}", value=value)


def train_data_of(trainer: "pl.Trainer") -> torch.Tensor:
    """``trainer.datamodule.train_data`` (the shared datamodule contract), validated."""
    return require_train_data("the representation callbacks", getattr(trainer, "datamodule", None))


def denoiser_of(pl_module: "pl.LightningModule"):
    """The EMA denoiser (``pl_module.denoiser``), falling back to ``pl_module.precond``."""
    den = getattr(pl_module, "denoiser", None)
    if den is None:
        den = getattr(pl_module, "precond", None)
    if den is None or not hasattr(den, "network_input") or not hasattr(den, "net"):
        raise ConfigError("model", f"ICR needs the features of a sigma-space denoiser (`denoiser` with "
                          f"`.net` and `.network_input(x, sigma)`); {type(pl_module).__name__} has none",
                          value=type(pl_module).__name__, accepted=SIGMA_SPACE_MODULES,
                          suggestion="for LevyItoModule use TailMonitor and MemorizationMonitor")
    return den


class ICRMonitor(ScheduledMonitor):
    """Log ICR of the EMA denoiser on a fixed training subset (module docstring).

    Args:
        num_images: distinct training images in the fixed subset; None (default) = min(4096, N),
            the paper's 4096 capped at the training set's size N; an explicit integer must lie
            in [world size, N].
        sigma: sigma* of the views (sigma-space; 0.29 for EDM and VP, see module docstring).
        sigmas: extra noise levels, each logged as ``<name>/sigma_<value>``.
        level: augmentation level 0-5 (None: 3; colour jitter on RGB, brightness/contrast otherwise).
        vector_jitter: std of the additive jitter for vector data (B, d) (0: noise-only views).
        image_shape: for vector data that are flattened images (e.g. digits as 64-d vectors for an
            MLP): (C, H, W) to reshape to for the augmentation (the net still sees vectors).
        tap: feature tap name (None: ``net.default_tap``).
        d_proj: project features with a fixed seeded Gaussian matrix to this dimension.
        views_per_image: pairs of views per image (> 1 stabilises Sigma_xi when n ~ d).
        tau, normalize, cond_max: passed to :class:`InvariantContaminationRatio` (tau "auto":
            no ridge unless Sigma_xi is ill-conditioned; "relative": always
            1e-3 Tr(Sigma_xi)/d, the former default; or an absolute number).
        seed: selects the subset and seeds every view.
        batch_size: images per forward pass.
        every_n_epochs: measure on every n-th validation pass (the first always), or every n-th
            training epoch when the fit has no validation loop.
        name: metric namespace (default ``"icr"``: ``icr/icr``, ``icr/trace_s``, ...); give a
            second ICRMonitor in the same Trainer another one, e.g. ``"icr_sigma1"``.
    """

    _DEFAULT_NAME = "icr"

    def __init__(self, num_images: Optional[int] = None, sigma: float = 0.29,
                 sigmas: Optional[Sequence[float]] = None, level: Optional[int] = None,
                 vector_jitter: float = 0.0, image_shape: Optional[Sequence[int]] = None,
                 tap: Optional[str] = None,
                 d_proj: Optional[int] = None, views_per_image: int = 1,
                 tau: Any = "auto", normalize: bool = False, seed: int = 0,
                 batch_size: int = 256, every_n_epochs: int = 1, name: str = "icr",
                 cond_max: float = DEFAULT_COND_MAX):
        super().__init__()
        if num_images is not None:
            _positive_int("num_images", num_images, 2, self)
        _positive_int("views_per_image", views_per_image, 1, self)
        _positive_int("batch_size", batch_size, 1, self)
        _positive_int("every_n_epochs", every_n_epochs, 1, self)
        _positive_int("seed", seed, 0, self)
        if d_proj is not None:
            _positive_int("d_proj", d_proj, 1, self)
        if level is not None and level not in AUG_LEVELS:
            raise ConfigError(callback_field(self, "level"), "must be None or an augmentation level",
                              value=level, accepted=list(AUG_LEVELS))
        sig = [float(sigma)] + [float(s) for s in (sigmas or [])]
        if not all(s > 0 for s in sig):
            raise ConfigError(callback_field(self, "sigma, sigmas"), "noise levels must be > 0", value=sig)
        if not vector_jitter >= 0:
            raise ConfigError(callback_field(self, "vector_jitter"), "must be >= 0", value=vector_jitter)
        try:
            tau = check_tau(tau, cond_max=cond_max)
        except ValueError as e:
            field = "cond_max" if str(e).startswith("cond_max") else "tau"
            raise ConfigError(callback_field(self, field), str(e).split(": ", 1)[-1],
                              value=cond_max if field == "cond_max" else tau,
                              accepted=None if field == "cond_max" else
                              ["auto", "relative", "a number >= 0"]) from None
        if image_shape is not None and (len(image_shape) != 3 or min(image_shape) < 1):
            raise ConfigError(callback_field(self, "image_shape"), "must be None or (C, H, W)",
                              value=image_shape)
        if tap is not None and not isinstance(tap, str):
            raise ConfigError(callback_field(self, "tap"), "must be None or a tap name", value=tap)
        self.name = check_metric_prefix(self, "name", name)
        self.image_shape = None if image_shape is None else tuple(int(v) for v in image_shape)
        self.num_images, self.sigma = num_images, float(sigma)
        self.sigmas = [s for s in dict.fromkeys(sig[1:]) if s != self.sigma]
        self.level = 3 if level is None else level
        self.vector_jitter, self.tap, self.d_proj = float(vector_jitter), tap, d_proj
        self.views_per_image, self.tau, self.normalize = views_per_image, tau, normalize
        self.cond_max = float(cond_max)
        self.seed, self.batch_size, self.every_n_epochs = seed, batch_size, every_n_epochs
        self.history: List[Dict[str, float]] = []
        self._warned = False
        self.eigenvalues: Dict[float, torch.Tensor] = {}  # last spectrum per sigma (descending)
        self._projection: Optional[torch.Tensor] = None

    # -- names and state key -----------------------------------------------------------------------
    def key(self, leaf: str) -> str:
        """Logged name of ``leaf`` (icr, trace_s, trace_xi, n, d, nonfinite) in this namespace."""
        return f"{self.name}/{leaf}"

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in _LEAVES] + [sigma_key(s, self.name) for s in self.sigmas]

    @property
    def state_key(self) -> str:
        """Built from the arguments that define the measurement (namespace, sigma*, tap, subset,
        views, projection), not the operational ones (batch_size, every_n_epochs): monitors at
        another sigma* or tap keep and resume their own state, and a resumed run restores the
        history of the same protocol only."""
        return self._generate_state_key(name=self.name, sigma=self.sigma, tap=self.tap,
                                        num_images=self.num_images, level=self.level,
                                        views_per_image=self.views_per_image, d_proj=self.d_proj,
                                        image_shape=self.image_shape, seed=self.seed)

    # -- checks (before training) --------------------------------------------------------------------
    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", datamodule: Any) -> None:
        """Raise :class:`ConfigError` for what is incompatible with this model / data / Trainer
        (module docstring); only ``d_proj`` costs a forward pass of two images."""
        den = denoiser_of(pl_module)
        self._check_tap(den.net)
        self._check_sigma_range(den)
        data = require_train_data(self, datamodule)
        self.check_data(data, trainer.world_size)
        check_unique_metric_names(self, trainer)
        if self.d_proj is not None:
            self._check_d_proj(den, data)

    def _check_tap(self, net) -> None:
        taps = getattr(net, "feature_taps", None)
        if self.tap is None:
            if getattr(net, "default_tap", None) is None:
                raise ConfigError(callback_field(self, "tap"), f"{type(net).__name__} has no `default_tap`: "
                                  "name one", value=None, accepted=sorted(taps) if taps else None)
            return
        if taps is not None and self.tap not in taps:
            raise ConfigError(callback_field(self, "tap"), f"unknown feature tap of {type(net).__name__}",
                              value=self.tap, accepted=sorted(taps))

    def _check_sigma_range(self, den) -> None:
        lo, hi = float(getattr(den, "sigma_min", 0.0) or 0.0), float(getattr(den, "sigma_max", math.inf))
        for s in [self.sigma, *self.sigmas]:
            if not lo <= s <= hi:
                raise ConfigError(callback_field(self, "sigma" if s == self.sigma else "sigmas"),
                                  f"outside the denoiser's noise range [{lo:g}, {hi:g}] ({type(den).__name__})",
                                  value=s, accepted=f"a noise level in [{lo:g}, {hi:g}]")

    def check_data(self, data: torch.Tensor, world_size: int = 1) -> None:
        """``num_images`` vs the training set and the world size; the view shape."""
        n = int(data.shape[0])
        if self.num_images is not None and self.num_images > n:
            raise ConfigError(callback_field(self, "num_images"),
                              f"larger than the training set ({n} samples)", value=self.num_images,
                              accepted=f"an integer in [2, {n}]")
        if resolve_num_images(self.num_images, n) < world_size:
            raise ConfigError(callback_field(self, "num_images"), f"every rank needs at least one image "
                              f"(world size {world_size}; the subset has "
                              f"{resolve_num_images(self.num_images, n)})", value=self.num_images,
                              accepted=f"an integer >= {max(2, world_size)}")
        sample = tuple(data.shape[1:])
        if self.image_shape is not None and math.prod(sample) != math.prod(self.image_shape):
            raise ConfigError(callback_field(self, "image_shape"),
                              f"does not match samples of shape {sample} ({math.prod(sample)} values)",
                              value=list(self.image_shape),
                              accepted=f"a (C, H, W) with C*H*W = {math.prod(sample)}")
        view = self.image_shape or sample
        if len(view) not in (1, 3) or (len(view) == 3 and min(view[1:]) < 4):
            raise ConfigError(callback_field(self, "image_shape"), f"the views must be vectors (d,) or "
                              f"images (C, H, W) of at least 4x4; samples have shape {sample}",
                              value=None if self.image_shape is None else list(self.image_shape))

    @torch.no_grad()
    def _check_d_proj(self, den, data: torch.Tensor) -> None:
        """A projection to more dimensions than the tap has gives singular covariances."""
        was_training = den.training
        den.eval()
        try:
            x0 = data[:2].to(device=_device_of(den), dtype=torch.float32)
            seeds = torch.arange(x0.shape[0], device=x0.device)
            d = int(extract_features(den, self._views(x0, seeds, self.sigma, 0), self.sigma,
                                     tap=self.tap).shape[1])
        finally:
            den.train(was_training)
        if self.d_proj > d:
            raise ConfigError(callback_field(self, "d_proj"), f"larger than the feature dimension d = {d} "
                              f"of tap {self.tap or 'default'!r}: the projected features would have rank "
                              f"{d} < d_proj (singular covariances)", value=self.d_proj,
                              accepted=f"None or an integer in [1, {d}]")

    # -- hooks -----------------------------------------------------------------------------------
    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        results = self.measure(pl_module, train_data_of(trainer), trainer.global_rank,
                               trainer.world_size)
        main = results[self.sigma]
        self.eigenvalues = {s: r["eigenvalues"].cpu() for s, r in results.items()}  # for plots
        n_img, d = int(main["n"]) // self.views_per_image, int(main["d"])
        self._maybe_warn(n_img, d)
        fraction = float(sum(float(r["nonfinite"]) for r in results.values())) / len(results)
        logs = {self.key("icr"): main["icr"], self.key("trace_s"): main["trace_s"],
                self.key("trace_xi"): main["trace_xi"], self.key("n"): float(n_img),
                self.key("d"): float(d), self.key("nonfinite"): fraction}
        logs.update({sigma_key(s, self.name): results[s]["icr"] for s in self.sigmas})
        if fraction > 0:
            nan_keys = [k for k, v in logs.items() if math.isnan(float(v))]
            self._warn_nonfinite(trainer, fraction, "features (view pairs)", nan_keys, self.key("nonfinite"))
        for name, value in logs.items():
            pl_module.log(name, torch.as_tensor(float(value), dtype=torch.float32),
                          sync_dist=False)
        extra = {self.key(k): float(main[k]) for k in ("tau", "cond_xi", "icr_tau_auto",
                                                        "icr_tau_relative") if k in main}
        self.history.append({"epoch": trainer.current_epoch, **{k: float(v) for k, v in logs.items()},
                             **extra})

    # -- measurement -------------------------------------------------------------------------------
    @torch.no_grad()
    def measure(self, pl_module, train_data: torch.Tensor, rank: int = 0,
                world_size: int = 1) -> Dict[float, Dict[str, torch.Tensor]]:
        """ICR dicts per sigma (synced across ranks: every rank must call this).

        Each dict has ``nonfinite``, the fraction of view pairs with a NaN/inf feature; when it is
        > 0 the ICR values (icr, traces, tau) are NaN and ``eigenvalues`` is empty. Besides the
        :class:`InvariantContaminationRatio` keys (``tau`` = the ridge used, ``cond_xi``) each dict
        has ``icr_tau_auto`` and ``icr_tau_relative``: ICR of the same features under both ridge
        rules (NaN when one of them cannot be computed), to measure what tau changes."""
        den = denoiser_of(pl_module)
        was_training = den.training
        den.eval()  # frozen features (the EMA shadow already is in eval mode)
        try:
            return self._measure(den, pl_module.device, train_data, rank, world_size)
        finally:
            den.train(was_training)

    def _measure(self, den, device, train_data, rank, world_size):
        subset = fixed_subset(train_data.shape[0],
                              resolve_num_images(self.num_images, train_data.shape[0]), self.seed)
        if subset.numel() < world_size:  # same decision on every rank: no rank hangs in a sync
            raise ConfigError(callback_field(self, "num_images"), f"every rank needs at least one image; "
                              f"got {subset.numel()} images for world size {world_size}",
                              value=self.num_images)
        shard = subset[rank::world_size]
        metrics = {s: None for s in [self.sigma, *self.sigmas]}
        bad = {s: 0 for s in metrics}
        for i in range(0, shard.numel(), self.batch_size):
            idx = shard[i:i + self.batch_size]
            x0 = train_data[idx].to(device=device, dtype=torch.float32)
            seeds = (self.seed * _SEED_STRIDE + idx).to(device)
            for sigma in metrics:
                for k in range(self.views_per_image):
                    h1, h2 = (self._features(den, x0, seeds, sigma, 2 * k + v) for v in (0, 1))
                    if metrics[sigma] is None:
                        metrics[sigma] = self._new_metric(h1.shape[1], device)
                    ok = torch.isfinite(h1).all(1) & torch.isfinite(h2).all(1)
                    bad[sigma] += int((~ok).sum())
                    if bool(ok.any()):
                        metrics[sigma].update(h1[ok], h2[ok])
        total = subset.numel() * self.views_per_image
        out = {}
        for s, m in metrics.items():
            n_bad = global_sum(bad[s], world_size, device)  # every rank: the same branch below
            out[s] = m.compute() if n_bad == 0 else self._nan_result(total, getattr(m, "_d", None), device)
            if n_bad == 0:
                out[s].update(icr_tau_auto=_icr_or_nan(m, "auto"),
                              icr_tau_relative=_icr_or_nan(m, "relative"))
            out[s]["nonfinite"] = torch.tensor(n_bad / total, dtype=torch.float64)
        return out

    @staticmethod
    def _nan_result(n_pairs: int, d: Optional[int], device) -> Dict[str, torch.Tensor]:
        """The result dict of a measurement with non-finite features: NaN values, n and d kept."""
        nan = torch.tensor(math.nan, dtype=torch.float64, device=device)
        out = {k: nan.clone() for k in ("icr", "trace_s", "trace_xi", "trace_s_raw", "trace_xi_raw", "tau",
                                        "cond_xi", "icr_tau_auto", "icr_tau_relative")}
        out["n"] = torch.tensor(float(n_pairs), dtype=torch.float64, device=device)
        out["d"] = torch.tensor(float(d or 0), dtype=torch.float64, device=device)
        out["eigenvalues"] = torch.empty(0, dtype=torch.float64, device=device)
        return out

    def _views(self, x0: torch.Tensor, seeds: torch.Tensor, sigma: float, view: int) -> torch.Tensor:
        """View ``view`` of every row: augmentation (as ``image_shape`` images) then noise."""
        shape = x0.shape
        if self.image_shape is not None:
            if math.prod(shape[1:]) != math.prod(self.image_shape):
                raise ConfigError(callback_field(self, "image_shape"),
                                  f"does not match samples of shape {tuple(shape[1:])}",
                                  value=list(self.image_shape))
            x0 = x0.reshape(-1, *self.image_shape)
        return noisy_view(x0, seeds, sigma, level=self.level, view=view,
                          vector_jitter=self.vector_jitter).reshape(shape)

    def _features(self, den, x0, seeds, sigma: float, view: int) -> torch.Tensor:
        x = self._views(x0, seeds, sigma, view)
        h = extract_features(den, x, sigma, tap=self.tap, batch_size=self.batch_size)
        if self.d_proj is None:
            return h
        if self._projection is None or self._projection.shape[0] != h.shape[1]:
            self._projection = random_projection(h.shape[1], self.d_proj, self.seed, h.device)
        return h @ self._projection.to(h.device)

    def _new_metric(self, d: int, device) -> InvariantContaminationRatio:
        return InvariantContaminationRatio(tau=self.tau, normalize=self.normalize,
                                           cond_max=self.cond_max, num_features=d).to(device)

    def _maybe_warn(self, n: int, d: int) -> None:
        if n < 4 * d and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"ICRMonitor: n = {n} images for d = {d} feature dimensions (n < 4d): the ICR "
                "estimate is biased towards 0 (d x d covariances from n images). Use more images, "
                "d_proj, a narrower tap, or views_per_image > 1.")

    # -- resume -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": list(self.history), "warned": self._warned, **self.schedule_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
        self._warned = bool(state_dict.get("warned", False))


def _icr_or_nan(metric: InvariantContaminationRatio, tau) -> torch.Tensor:
    """ICR of ``metric``'s state under another ridge rule; NaN when that rule fails (e.g. tau = 0
    on a singular Sigma_xi)."""
    try:
        return metric.icr_at(tau)
    except ValueError:
        return torch.tensor(math.nan, dtype=torch.float64)


def _device_of(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (CPU when it has none)."""
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")
