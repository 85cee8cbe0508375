"""MemorizationMonitor: the memorization ratio of seeded samples every k epochs (REFERENCE §11).

On every ``every_n_epochs``-th validation pass (the first always; every n-th training epoch when
the fit has no validation loop; ``_schedule.py``), the module draws
``num_samples`` PF-ODE samples from fixed seeds (``pl_module.generate(seeds)``, EMA weights; the
seeds are sharded across ranks by the code) and counts those that copy a training sample with
:class:`~lightning_pfd.metrics.MemorizationRatio` (``cosine`` > 0.6 in a descriptor space, or the
pixel-space nearest-neighbour ratio d_1/d_2 < 1/3 of Gu et al., the default here because no
SSCD-like descriptor ships offline). ``descriptor`` may be a callable / nn.Module or a name /
path understood by :func:`lightning_pfd.metrics.descriptors.build_descriptor` ("identity",
"efficientnet_lite0", a local TorchScript file). The training set is embedded once per fit and
kept in memory; with a descriptor, the embedding is also cached on disk (key: the datamodule's
``fingerprint()`` + the descriptor's fingerprint; atomic write, verified load). Non-finite samples (an under-trained net can diverge) count as not memorized and their
fraction is logged as ``mem/nonfinite``.

Logged: ``mem/ratio`` (and ``mem/nonfinite``), synced over ranks.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import lightning.pytorch as pl
import torch

from ..metrics.memorization import MemorizationRatio
from ._schedule import ScheduledMonitor
from .icr import _positive_int, train_data_of

__all__ = ["MemorizationMonitor"]


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
    """

    def __init__(self, num_samples: int = 256, every_n_epochs: int = 5,
                 criterion: str = "nn_ratio", threshold: Optional[float] = None,
                 descriptor: Union[str, Callable, None] = None, chunk_size: int = 4096,
                 seed: int = 20_000_000, batch_size: int = 256, cache: bool = True):
        super().__init__()
        _positive_int("num_samples", num_samples)
        _positive_int("every_n_epochs", every_n_epochs)
        _positive_int("batch_size", batch_size)
        _positive_int("seed", seed, 0)
        if isinstance(descriptor, str):  # built now: a bad name / missing file fails early
            from ..metrics.descriptors import build_descriptor

            descriptor = None if descriptor == "identity" else build_descriptor(descriptor)
        # validates criterion / threshold / chunk_size / descriptor before any training
        MemorizationRatio(threshold, criterion, descriptor, chunk_size)
        self.cache = bool(cache)
        self.num_samples, self.every_n_epochs = num_samples, every_n_epochs
        self.criterion, self.threshold, self.descriptor = criterion, threshold, descriptor
        self.chunk_size, self.seed, self.batch_size = chunk_size, seed, batch_size
        self.history: List[Dict[str, float]] = []
        self._reference: Optional[torch.Tensor] = None

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
        """Synced ``mem/ratio`` and ``mem/nonfinite`` (every rank must call this)."""
        rank, world = trainer.global_rank, trainer.world_size
        seeds = torch.arange(self.seed, self.seed + self.num_samples)[rank::world]
        metric = self._metric(trainer, pl_module.device)
        bad = torch.zeros((), dtype=torch.float64, device=pl_module.device)
        if seeds.numel():
            samples = pl_module.generate(seeds, batch_size=self.batch_size)
            finite = torch.isfinite(samples.reshape(samples.shape[0], -1)).all(1)
            if bool(finite.any()):
                metric.update(samples[finite])
            bad += (~finite).sum()
            metric.total += (~finite).sum()  # non-finite samples count as not memorized
        bad = trainer.strategy.reduce(bad, reduce_op="sum") if world > 1 else bad
        return {"mem/ratio": float(metric.compute()), "mem/nonfinite": float(bad) / self.num_samples}

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reference = None  # a new fit may bring new data: embed again (once)

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        logs = self.measure(trainer, pl_module)
        for name, value in logs.items():
            pl_module.log(name, torch.tensor(value, dtype=torch.float32), sync_dist=False)
        self.history.append({"epoch": trainer.current_epoch, **logs})

    def state_dict(self) -> dict:
        return {"history": list(self.history), **self.schedule_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
