"""ICRMonitor: the Invariant Contamination Ratio of the EMA denoiser, every epoch (ICR paper Sec. 5).

Protocol (REFERENCE §10, ICR paper App. B.6 / C), on every ``every_n_epochs``-th validation pass
(the first always; every n-th training epoch when the fit has no validation loop; ``_schedule.py``):

1. a fixed, seeded subset of the *training* set (``num_images``, default 1024; the paper uses
   4096), the same at every epoch, sharded across ranks by the code (no padding sampler);
2. for every image, ``views_per_image`` pairs of views: augmentation (level 1-5, App. B.6; default
   3 = crop + flip + colour jitter; colour jitter is skipped for non-RGB data) **then**
   independent Gaussian noise at sigma* (default 0.29, the paper's value for EDM). Every
   parameter of view v of image i is a pure function of (seed, i, v);
3. features of the EMA denoiser (``pl_module.denoiser``) at the net's default tap (or ``tap``),
   fed ``denoiser.network_input(view, sigma*)``, mean-pooled over space, optionally through a
   fixed random projection to ``d_proj`` dimensions;
4. ICR, Tr(Sigma_s), Tr(Sigma_xi) from :class:`InvariantContaminationRatio` (synced over ranks).

sigma for VP **[choice]**: the VP preconditioning in this project is written in sigma-space
(x = y + sigma n, REFERENCE §3), exactly like EDM, so sigma* = 0.29 means the same noise-to-signal
ratio for both and is passed as is (VPPrecond maps it to its own c_in, c_noise).

Well-posedness: Sigma_s and Sigma_xi are d x d; with n distinct images ~ d the estimate collapses
towards 0. The callback logs n (distinct images) and d and warns once when n < 4 d; reduce d with
``d_proj`` or a narrower ``tap``, and use ``views_per_image > 1`` so Sigma_xi is estimated from
n * views_per_image pairs.

Logged (``pl_module.log``, values already synced): ``icr/icr``, ``icr/trace_s``, ``icr/trace_xi``
(l2-normalized features), ``icr/n``, ``icr/d``, and ``icr/sigma_<value>`` for every extra sigma
in ``sigmas``.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..diffusion.augment import AUG_LEVELS, noisy_view
from ..diffusion.features import extract_features, random_projection
from ..diffusion.noise import seeded_uniform
from ..metrics.icr import InvariantContaminationRatio
from ._schedule import ScheduledMonitor

__all__ = ["ICRMonitor", "sigma_key", "fixed_subset"]

_SEED_STRIDE = 1_000_003  # seed of image i under base seed s: s * stride + i


def sigma_key(sigma: float) -> str:
    """Metric name of an extra noise level, e.g. 0.29 -> ``icr/sigma_0.29``."""
    return f"icr/sigma_{float(sigma):g}"


def fixed_subset(n_available: int, num: int, seed: int) -> torch.Tensor:
    """``min(num, n_available)`` distinct indices from a seeded permutation (same every epoch)."""
    u = seeded_uniform([int(seed)], int(n_available), stream=11)[0]
    return u.argsort()[: min(int(num), int(n_available))]


def _positive_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def train_data_of(trainer: "pl.Trainer") -> torch.Tensor:
    """``trainer.datamodule.train_data`` (the shared datamodule contract), validated."""
    dm = getattr(trainer, "datamodule", None)
    data = getattr(dm, "train_data", None)
    if data is None:
        raise ValueError("data: the representation callbacks need a datamodule exposing "
                         "`train_data` after setup() (every lightning_pfd datamodule does)")
    return data


def denoiser_of(pl_module: "pl.LightningModule"):
    """The EMA denoiser (``pl_module.denoiser``), falling back to ``pl_module.precond``."""
    den = getattr(pl_module, "denoiser", None)
    if den is None:
        den = getattr(pl_module, "precond", None)
    if den is None or not hasattr(den, "network_input"):
        raise ValueError("model: needs `denoiser` (EMA preconditioned denoiser with "
                         "`network_input`), e.g. lightning_pfd.modules.DiffusionModule")
    return den


class ICRMonitor(ScheduledMonitor):
    """Log ICR of the EMA denoiser on a fixed training subset (module docstring).

    Args:
        num_images: distinct training images in the fixed subset (default 1024).
        sigma: sigma* of the views (sigma-space; 0.29 for EDM and VP, see module docstring).
        sigmas: extra noise levels, each logged as ``icr/sigma_<value>``.
        level: augmentation level 0-5 (None: 3; colour jitter only for RGB).
        vector_jitter: std of the additive jitter for vector data (B, d) (0: noise-only views).
        image_shape: for vector data that are flattened images (e.g. digits as 64-d vectors for an
            MLP): (C, H, W) to reshape to for the augmentation (the net still sees vectors).
        tap: feature tap name (None: ``net.default_tap``).
        d_proj: project features with a fixed seeded Gaussian matrix to this dimension.
        views_per_image: pairs of views per image (> 1 stabilises Sigma_xi when n ~ d).
        tau, normalize: passed to :class:`InvariantContaminationRatio`.
        seed: selects the subset and seeds every view.
        batch_size: images per forward pass.
        every_n_epochs: measure on every n-th validation pass (the first always), or every n-th
            training epoch when the fit has no validation loop.
    """

    def __init__(self, num_images: int = 1024, sigma: float = 0.29,
                 sigmas: Optional[Sequence[float]] = None, level: Optional[int] = None,
                 vector_jitter: float = 0.0, image_shape: Optional[Sequence[int]] = None,
                 tap: Optional[str] = None,
                 d_proj: Optional[int] = None, views_per_image: int = 1,
                 tau: Optional[float] = None, normalize: bool = False, seed: int = 0,
                 batch_size: int = 256, every_n_epochs: int = 1):
        super().__init__()
        _positive_int("num_images", num_images, 2)
        _positive_int("views_per_image", views_per_image)
        _positive_int("batch_size", batch_size)
        _positive_int("every_n_epochs", every_n_epochs)
        _positive_int("seed", seed, 0)
        if d_proj is not None:
            _positive_int("d_proj", d_proj)
        if level is not None and level not in AUG_LEVELS:
            raise ValueError(f"level: must be None or one of {AUG_LEVELS}, got {level!r}")
        sig = [float(sigma)] + [float(s) for s in (sigmas or [])]
        if not all(s > 0 for s in sig):
            raise ValueError(f"sigma, sigmas: noise levels must be > 0, got {sig}")
        if not vector_jitter >= 0:
            raise ValueError(f"vector_jitter: must be >= 0, got {vector_jitter}")
        if tau is not None and not tau >= 0:
            raise ValueError(f"tau: must be None or >= 0, got {tau}")
        if image_shape is not None and (len(image_shape) != 3 or min(image_shape) < 1):
            raise ValueError(f"image_shape: must be None or (C, H, W), got {image_shape!r}")
        self.image_shape = None if image_shape is None else tuple(int(v) for v in image_shape)
        self.num_images, self.sigma = num_images, float(sigma)
        self.sigmas = [s for s in sig[1:] if s != self.sigma]
        self.level = 3 if level is None else level
        self.vector_jitter, self.tap, self.d_proj = float(vector_jitter), tap, d_proj
        self.views_per_image, self.tau, self.normalize = views_per_image, tau, normalize
        self.seed, self.batch_size, self.every_n_epochs = seed, batch_size, every_n_epochs
        self.history: List[Dict[str, float]] = []
        self._warned = False
        self.eigenvalues: Dict[float, torch.Tensor] = {}  # last spectrum per sigma (descending)
        self._projection: Optional[torch.Tensor] = None

    # -- hooks -----------------------------------------------------------------------------------
    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        results = self.measure(pl_module, train_data_of(trainer), trainer.global_rank,
                               trainer.world_size)
        main = results[self.sigma]
        self.eigenvalues = {s: r["eigenvalues"].cpu() for s, r in results.items()}  # for plots
        n_img, d = int(main["n"]) // self.views_per_image, int(main["d"])
        self._maybe_warn(n_img, d)
        logs = {"icr/icr": main["icr"], "icr/trace_s": main["trace_s"],
                "icr/trace_xi": main["trace_xi"], "icr/n": float(n_img), "icr/d": float(d)}
        logs.update({sigma_key(s): results[s]["icr"] for s in self.sigmas})
        for name, value in logs.items():
            pl_module.log(name, torch.as_tensor(float(value), dtype=torch.float32),
                          sync_dist=False)
        self.history.append({"epoch": trainer.current_epoch, **{k: float(v) for k, v in logs.items()}})

    # -- measurement -------------------------------------------------------------------------------
    @torch.no_grad()
    def measure(self, pl_module, train_data: torch.Tensor, rank: int = 0,
                world_size: int = 1) -> Dict[float, Dict[str, torch.Tensor]]:
        """ICR dicts per sigma (synced across ranks: every rank must call this)."""
        den = denoiser_of(pl_module)
        was_training = den.training
        den.eval()  # frozen features (the EMA shadow already is in eval mode)
        try:
            return self._measure(den, pl_module.device, train_data, rank, world_size)
        finally:
            den.train(was_training)

    def _measure(self, den, device, train_data, rank, world_size):
        subset = fixed_subset(train_data.shape[0], self.num_images, self.seed)
        if subset.numel() < world_size:  # same decision on every rank: no rank hangs in a sync
            raise ValueError(f"num_images: every rank needs at least one image; got "
                             f"{subset.numel()} images for world size {world_size}")
        shard = subset[rank::world_size]
        metrics = {s: None for s in [self.sigma, *self.sigmas]}
        for i in range(0, shard.numel(), self.batch_size):
            idx = shard[i:i + self.batch_size]
            x0 = train_data[idx].to(device=device, dtype=torch.float32)
            seeds = (self.seed * _SEED_STRIDE + idx).to(device)
            for sigma in metrics:
                for k in range(self.views_per_image):
                    h1, h2 = (self._features(den, x0, seeds, sigma, 2 * k + v) for v in (0, 1))
                    if metrics[sigma] is None:
                        metrics[sigma] = self._new_metric(h1.shape[1], device)
                    metrics[sigma].update(h1, h2)
        return {s: m.compute() for s, m in metrics.items()}

    def _features(self, den, x0, seeds, sigma: float, view: int) -> torch.Tensor:
        shape = x0.shape
        if self.image_shape is not None:
            if math.prod(shape[1:]) != math.prod(self.image_shape):
                raise ValueError(f"image_shape: {self.image_shape} does not match samples of "
                                 f"shape {tuple(shape[1:])}")
            x0 = x0.reshape(-1, *self.image_shape)
        x = noisy_view(x0, seeds, sigma, level=self.level, view=view,
                       vector_jitter=self.vector_jitter).reshape(shape)
        h = extract_features(den, x, sigma, tap=self.tap, batch_size=self.batch_size)
        if self.d_proj is None:
            return h
        if self._projection is None or self._projection.shape[0] != h.shape[1]:
            self._projection = random_projection(h.shape[1], self.d_proj, self.seed, h.device)
        return h @ self._projection.to(h.device)

    def _new_metric(self, d: int, device) -> InvariantContaminationRatio:
        return InvariantContaminationRatio(tau=self.tau, normalize=self.normalize,
                                           num_features=d).to(device)

    def _maybe_warn(self, n: int, d: int) -> None:
        if n < 4 * d and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"ICRMonitor: n = {n} images for d = {d} feature dimensions (n < 4d): the ICR "
                "estimate is biased towards 0 (REFERENCE §10). Use more images, d_proj, a narrower "
                "tap, or views_per_image > 1.")

    # -- resume -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": list(self.history), "warned": self._warned, **self.schedule_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
        self._warned = bool(state_dict.get("warned", False))
