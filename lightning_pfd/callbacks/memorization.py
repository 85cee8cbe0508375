"""MemorizationMonitor: the memorization ratio of seeded samples every k epochs.

On every ``every_n_epochs``-th validation pass (the first always; every n-th training epoch when
the fit has no validation loop; ``_schedule.py``), the module draws
``num_samples`` PF-ODE samples from fixed seeds (``pl_module.generate(seeds)``, EMA weights; the
seeds are sharded across ranks by the code) and counts those that copy a training sample with
:class:`~lightning_pfd.metrics.MemorizationRatio` (``cosine`` > 0.6 in a descriptor space, as in
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, or the
pixel-space nearest-neighbour ratio d_1/d_2 < 1/3 of Gu et al., the default here because no
SSCD-like descriptor ships offline). ``descriptor`` may be a callable / nn.Module or a name /
path understood by :func:`lightning_pfd.metrics.descriptors.build_descriptor` ("identity",
"efficientnet_lite0", a local TorchScript file). The training set is embedded once per fit and
kept in memory; with a descriptor, the embedding is also cached on disk (key: the datamodule's
``fingerprint()`` + the descriptor's fingerprint; atomic write, verified load).

Non-finite samples (a diverged model): their fraction is logged as ``mem/nonfinite`` (0.0 when
all are finite) and, when it is > 0, ``mem/ratio`` is NaN -- not a ratio over the finite part,
which would look like a plausible value (a NaN sample neither copies nor avoids the training set).
The branch is decided on the all-reduced count, so every rank takes it; one warning line the
first time. Works with any module that has ``generate(seeds, batch_size=...)``
(``DiffusionModule``, ``LevyItoModule``); :meth:`MemorizationMonitor.check_setup` refuses other
modules, a training set too small for the criterion, fewer samples than ranks, a descriptor that
fails on the data and another monitor logging the same keys.

Logged: ``mem/ratio`` and ``mem/nonfinite`` (``<name>/...`` with ``name``), synced over ranks.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Union

import lightning.pytorch as pl
import torch

from ..errors import ConfigError
from ..metrics.memorization import CRITERIA, MemorizationRatio, embed
from ._schedule import (ScheduledMonitor, callback_field, check_metric_prefix, check_unique_metric_names,
                        global_sum, require_train_data)
from .icr import _positive_int, train_data_of

__all__ = ["MemorizationMonitor", "GENERATING_MODULES"]

#: what the sampling monitors accept as a LightningModule, for error messages
GENERATING_MODULES = ("a module with generate(seeds, batch_size=...): "
                      "lightning_pfd.modules.DiffusionModule or LevyItoModule")


class MemorizationMonitor(ScheduledMonitor):
    """Log ``mem/ratio`` from seeded samples every ``every_n_epochs`` epochs.

    Args:
        num_samples: generated samples per measurement (seeds ``seed .. seed + num_samples - 1``).
        every_n_epochs: measure on every n-th validation pass (the first always), or every n-th
            training epoch when the fit has no validation loop.
        criterion, threshold, descriptor, chunk_size: passed to :class:`MemorizationRatio`
            (threshold None: 0.6 for cosine, 1/3 for nn_ratio).
        seed: first sample seed (the same seeds at every measurement).
        batch_size: sampler batch size.
        cache: cache the training-set embedding on disk (with a descriptor).
        name: metric namespace (default ``"mem"``: ``mem/ratio``, ``mem/nonfinite``).
    """

    _DEFAULT_NAME = "mem"

    def __init__(self, num_samples: int = 256, every_n_epochs: int = 5,
                 criterion: str = "nn_ratio", threshold: Optional[float] = None,
                 descriptor: Union[str, Callable, None] = None, chunk_size: int = 4096,
                 seed: int = 20_000_000, batch_size: int = 256, cache: bool = True,
                 name: str = "mem"):
        super().__init__()
        _positive_int("num_samples", num_samples, 1, self)
        _positive_int("every_n_epochs", every_n_epochs, 1, self)
        _positive_int("batch_size", batch_size, 1, self)
        _positive_int("seed", seed, 0, self)
        self.name = check_metric_prefix(self, "name", name)
        self.descriptor_spec = descriptor if isinstance(descriptor, str) or descriptor is None \
            else type(descriptor).__name__
        if isinstance(descriptor, str):  # built now: a bad name / missing file fails early
            from ..metrics.descriptors import build_descriptor

            descriptor = None if descriptor == "identity" else build_descriptor(descriptor)
        # validates criterion / threshold / chunk_size / descriptor before any training
        if criterion not in CRITERIA:
            raise ConfigError(callback_field(self, "criterion"), "unknown memorization criterion",
                              value=criterion, accepted=list(CRITERIA))
        try:
            MemorizationRatio(threshold, criterion, descriptor, chunk_size)
        except ValueError as e:  # "<arg>: <problem>" from the metric
            arg, _, problem = str(e).partition(": ")
            raise ConfigError(callback_field(self, arg), problem or str(e)) from e
        self.cache = bool(cache)
        self.num_samples, self.every_n_epochs = num_samples, every_n_epochs
        self.criterion, self.threshold, self.descriptor = criterion, threshold, descriptor
        self.chunk_size, self.seed, self.batch_size = chunk_size, seed, batch_size
        self.history: List[Dict[str, float]] = []
        self._reference: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ names, state key, checks
    def key(self, leaf: str) -> str:
        """Logged name of ``leaf`` (ratio, nonfinite) in this namespace."""
        return f"{self.name}/{leaf}"

    def metric_names(self) -> List[str]:
        return [self.key("ratio"), self.key("nonfinite")]

    @property
    def state_key(self) -> str:
        """Built from the arguments that define the measurement (namespace, criterion,
        threshold, descriptor, samples): several monitors keep and resume their own state."""
        return self._generate_state_key(name=self.name, criterion=self.criterion, threshold=self.threshold,
                                        descriptor=self.descriptor_spec or "identity",
                                        num_samples=self.num_samples, seed=self.seed)

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", datamodule: Any) -> None:
        """Raise :class:`ConfigError` for: a module without ``generate``; no training set, or one
        too small for the criterion (nn_ratio needs two training samples); fewer samples than
        ranks; a descriptor that fails on the training samples; another monitor's keys."""
        if not callable(getattr(pl_module, "generate", None)):
            raise ConfigError("model", f"MemorizationMonitor samples with generate(seeds); "
                              f"{type(pl_module).__name__} has no generate method",
                              value=type(pl_module).__name__, accepted=GENERATING_MODULES)
        data = require_train_data(self, datamodule)
        need = 2 if self.criterion == "nn_ratio" else 1
        if len(data) < need:
            raise ConfigError(callback_field(self, "criterion"), f"{self.criterion} needs at least {need} "
                              f"training samples; the training set has {len(data)}", value=self.criterion,
                              accepted=["cosine"] if need == 2 else None)
        if self.num_samples < trainer.world_size:
            raise ConfigError(callback_field(self, "num_samples"), f"every rank needs at least one sample "
                              f"(world size {trainer.world_size})", value=self.num_samples,
                              accepted=f"an integer >= {trainer.world_size}")
        check_unique_metric_names(self, trainer)
        self._check_descriptor(data)

    def _check_descriptor(self, data: torch.Tensor) -> None:
        if self.descriptor is None:
            return
        try:
            f = embed(data[:2], self.descriptor)
        except Exception as e:  # e.g. an image network given vector data
            raise ConfigError(callback_field(self, "descriptor"), f"fails on training samples of shape "
                              f"{tuple(data.shape[1:])}: {type(e).__name__}: {e}",
                              value=self.descriptor_spec) from e
        if f.shape[0] != min(2, len(data)) or f.shape[1] < 1:
            raise ConfigError(callback_field(self, "descriptor"), "must map a batch (B, ...) to features "
                              f"(B, D); got shape {tuple(f.shape)}", value=self.descriptor_spec)

    # ------------------------------------------------------------------ measurement
    def _metric(self, trainer: "pl.Trainer", device) -> MemorizationRatio:
        m = MemorizationRatio(self.threshold, self.criterion, self.descriptor,
                              self.chunk_size).to(device)
        if self._reference is None:  # embed the training set once per fit
            self._reference = self._cached_reference(trainer, m, device)
        m.set_reference(self._reference, features=True)
        return m

    def _cache_path_key(self, trainer: "pl.Trainer"):
        """(path, key) of the on-disk embedding, or None when it is not worth / not possible."""
        fingerprint = getattr(getattr(trainer, "datamodule", None), "fingerprint", None)
        if not self.cache or self.descriptor is None or not callable(fingerprint):
            return None  # pixel space: the "embedding" is the data itself
        from ..cache import cache_dir, hash_key
        from ..metrics.descriptors import descriptor_fingerprint

        if not isinstance(self.descriptor, torch.nn.Module):
            return None  # a plain function has no reliable fingerprint
        key = hash_key("memorization-reference", fingerprint(), descriptor_fingerprint(self.descriptor))
        return cache_dir() / "memorization" / f"{key}.pt", key

    def _cached_reference(self, trainer: "pl.Trainer", m: MemorizationRatio, device) -> torch.Tensor:
        from ..cache import load_tensor_verified, save_tensor_atomic

        where = self._cache_path_key(trainer)
        if where is not None:
            hit = load_tensor_verified(where[0], where[1])
            if hit is not None:
                return hit["reference"].to(device)
        m.set_reference(train_data_of(trainer).to(device))
        if where is not None and trainer.global_rank == 0:
            where[0].parent.mkdir(parents=True, exist_ok=True)
            save_tensor_atomic(where[0], {"reference": m.reference.cpu()}, where[1])
        return m.reference

    @torch.no_grad()
    def measure(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Dict[str, float]:
        """Synced ``ratio`` and ``nonfinite`` (every rank must call this); ratio NaN when any
        sample is non-finite (decided on the all-reduced count: every rank takes that branch)."""
        rank, world = trainer.global_rank, trainer.world_size
        seeds = torch.arange(self.seed, self.seed + self.num_samples)[rank::world]
        metric = self._metric(trainer, pl_module.device)
        samples = pl_module.generate(seeds, batch_size=self.batch_size) if seeds.numel() else None
        n_bad = 0.0
        if samples is not None:
            n_bad = float((~torch.isfinite(samples.reshape(samples.shape[0], -1)).all(1)).sum())
        n_bad = global_sum(n_bad, world, pl_module.device)
        fraction = n_bad / self.num_samples
        if n_bad > 0:
            return {"ratio": math.nan, "nonfinite": fraction}
        if samples is not None:
            metric.update(samples)
        return {"ratio": float(metric.compute()), "nonfinite": fraction}

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reference = None  # a new fit may bring new data: embed again (once)

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        logs = {self.key(leaf): v for leaf, v in self.measure(trainer, pl_module).items()}
        self._warn_nonfinite(trainer, logs[self.key("nonfinite")], "samples", [self.key("ratio")],
                             self.key("nonfinite"))
        for name, value in logs.items():
            pl_module.log(name, torch.tensor(value, dtype=torch.float32), sync_dist=False)
        self.history.append({"epoch": trainer.current_epoch, **logs})

    def state_dict(self) -> dict:
        return {"history": list(self.history), **self.schedule_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
