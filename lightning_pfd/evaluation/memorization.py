"""MemorizationEvaluation: the memorization ratio of a model's seeded samples (pure torch).

The fraction of generated samples that copy a training sample in a descriptor space Psi
(:mod:`lightning_pfd.metrics.memorization`): ``criterion="nn_ratio"`` (default, Gu et al.:
d_1/d_2 < 1/3 with exact nearest-neighbour distances, pixel space when ``descriptor`` is None) or
``"cosine"`` (max cosine similarity > 0.6, footnote 4 of *Evaluating the Representation Space of
Diffusion Models via Self-Supervised Principles*, calibrated for SSCD features)::

    ev = MemorizationEvaluation(train_data, num_samples=256)
    ev.measure(model).values           # {"ratio": ..., "ratio_se": ..., "nonfinite": ...}
    ev.evaluate(model)                 # {"ratio": ..., "nonfinite": ...}

- samples: ``model.generate(seeds, batch_size=...)`` for the fixed seeds ``seed .. seed +
  num_samples - 1`` (any module with ``generate``: DiffusionModule, LevyItoModule), or a plain
  callable ``seeds -> samples``; the seeds are split over processes (``[rank::world]``);
- reference: Psi of the whole training set, embedded once per evaluation object and, with a
  descriptor ``nn.Module`` and a data ``fingerprint``, cached on disk (key: fingerprint + descriptor
  fingerprint; atomic write by rank 0, verified load);
- statistics: float64 counts (memorized, total, non-finite) summed over processes, so a sharded
  measurement equals the single-process one;
- non-finite samples (a diverged model): their fraction is ``nonfinite`` and ``ratio`` is NaN -- not
  a ratio over the finite part, which would look plausible (a NaN sample neither copies nor avoids
  the training set).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ..contracts import GENERATING_MODELS, check_on_samples
from ..errors import ConfigError
from ..metrics.memorization import (Criterion, _is_memorized, _memorization_compute, embed, memorization_scores,
                                    reference_features, resolve_threshold, warn_cosine_on_raw)
from ..validation import NonNegativeInt, PositiveInt, check_args, check_memory
from .base import SINGLE, Comm, Evaluation, Measurement, NonFinite, TorchDistributed, Units, bind_train_data
from .sharding import shard_indices

__all__ = ["MemorizationEvaluation", "resolve_descriptor", "indicator_se"]


def resolve_descriptor(descriptor: Union[str, Callable, None]) -> Optional[Callable]:
    """A descriptor spec as a callable: None / "identity" -> None (pixel space); another name or a
    path -> :func:`~lightning_pfd.metrics.descriptors.build_descriptor`; a callable as is."""
    if isinstance(descriptor, str):
        if descriptor == "identity":
            return None
        from ..metrics.descriptors import build_descriptor

        return build_descriptor(descriptor)
    if descriptor is not None and not callable(descriptor):
        raise ConfigError("descriptor", "must be None (pixel space), a descriptor name / file, or a "
                          "callable batch -> features", value=type(descriptor).__name__)
    return descriptor


class MemorizationEvaluation(Evaluation):
    """Memorization ratio of seeded samples against a training set (module docstring).

    Args:
        train_data: the training set (N, ...); None: the datamodule's ``train_data``, bound by
            :meth:`prepare`.
        num_samples: generated samples per measurement (seeds ``seed .. seed + num_samples - 1``).
        criterion, threshold: ``"nn_ratio"`` (threshold None: 1/3) or ``"cosine"`` (None: 0.6).
        descriptor: Psi: None (pixel space), a name / path for ``build_descriptor``, or a callable.
        chunk_size: reference rows per distance block (memory O(samples x chunk)).
        seed: first sample seed.
        batch_size: sampler batch size.
        cache: cache the training-set embedding on disk (needs ``fingerprint`` and an nn.Module
            descriptor).
        fingerprint: identifies the training set: a string, or a callable returning one (e.g.
            ``datamodule.fingerprint``, called only when the cache is used).

    Under the measurement contract (:mod:`lightning_pfd.evaluation.base`), :meth:`prepare` binds
    the datamodule's training set (again only when it changes: the training set is embedded once
    per binding) and :meth:`measure` returns ``ratio`` (NaN with a non-finite sample),
    ``ratio_se`` (sd of the per-sample indicators / sqrt(n)) and ``nonfinite``, with the
    indicators as the units of ``ratio``.
    """

    #: the values :meth:`measure` returns
    LEAVES = ("ratio", "ratio_se", "nonfinite")
    #: the metric namespace of a monitor of this evaluation (``mem/ratio``, ...)
    default_name = "mem"

    def __init__(self, train_data: Optional[torch.Tensor] = None, num_samples: PositiveInt = 256,
                 criterion: Criterion = "nn_ratio", threshold: Optional[float] = None,
                 descriptor: Union[str, Callable, None] = None,
                 chunk_size: PositiveInt = 4096, seed: NonNegativeInt = 20_000_000, batch_size: PositiveInt = 256,
                 cache: bool = True, fingerprint: Union[str, Callable[[], str], None] = None):
        check_args(MemorizationEvaluation.__init__, locals())
        self.threshold, self._threshold_arg = resolve_threshold(criterion, threshold), threshold
        self.num_samples, self.criterion, self.chunk_size = num_samples, criterion, chunk_size
        self.seed, self.batch_size = seed, batch_size
        self.descriptor_spec = descriptor if isinstance(descriptor, str) or descriptor is None \
            else type(descriptor).__name__
        self.descriptor = resolve_descriptor(descriptor)
        warn_cosine_on_raw(criterion, self.descriptor)  # the ICR paper's cosine needs a descriptor
        self.cache, self.fingerprint = bool(cache), fingerprint
        self.train_data: Optional[torch.Tensor] = None
        self._reference: Optional[torch.Tensor] = None
        if train_data is not None:
            self.bind(train_data, fingerprint)

    def bind(self, train_data: torch.Tensor, fingerprint: Union[str, Callable[[], str], None] = None) -> None:
        """Measure against ``train_data`` (its embedding is computed again on first use)."""
        if not torch.is_tensor(train_data) or train_data.ndim < 2 or train_data.shape[0] == 0:
            raise ConfigError("train_data", "expected a non-empty tensor (N, ...)",
                              value=tuple(train_data.shape) if torch.is_tensor(train_data)
                              else type(train_data).__name__)
        need = 2 if self.criterion == "nn_ratio" else 1
        if len(train_data) < need:
            raise ConfigError("criterion", f"{self.criterion} needs at least {need} training samples; the "
                              f"training set has {len(train_data)}", value=self.criterion,
                              accepted=["cosine"] if need == 2 else None)
        self.train_data, self.fingerprint, self._reference = train_data, fingerprint, None

    # ------------------------------------------------------------------ the measurement contract
    def leaves(self) -> List[str]:
        return list(self.LEAVES)

    def state_key_args(self) -> Dict[str, Any]:
        return dict(criterion=self.criterion, threshold=self._threshold_arg, descriptor=self.descriptor_spec
                    or "identity", num_samples=self.num_samples, seed=self.seed)

    def reset(self) -> None:
        """Forget the training set (a new fit binds and embeds it again)."""
        self.train_data, self._reference = None, None

    def prepare(self, datamodule: Any, model: Any = None, comm: Comm = SINGLE) -> None:
        """Bind the datamodule's training set (kept while it is the same tensor)."""
        bind_train_data(self, datamodule, lambda data: self.bind(data, getattr(datamodule, "fingerprint", None)))

    def check(self, datamodule: Any, model: Any, comm: Comm = SINGLE) -> None:
        """A model without ``generate``, a training set too small for the criterion, fewer samples
        than processes, a descriptor that fails on the data."""
        self.check_model(model)
        self.prepare(datamodule, model, comm)
        self.check_world(comm.world)
        self.check_memory(comm.world)
        self.check_descriptor()

    def measure(self, model: Any, comm: Optional[Comm] = None) -> Measurement:
        """Sample this process's seeds, gather the per-sample indicators (module docstring)."""
        comm = TorchDistributed() if comm is None else comm
        flags = self.shard_flags(model, comm.rank, comm.world)
        flags = comm.gather_rows(flags.reshape(-1, 1), self.num_samples).reshape(-1)
        out: Dict[str, Any] = self.results(self.flag_statistics(flags))
        out["ratio_se"] = indicator_se(flags)
        return Measurement(out, units={"ratio": Units("indicator", flags, self.seeds, out["ratio"])},
                           nonfinite=NonFinite(out["nonfinite"], "samples", ["ratio"]))

    @property
    def seeds(self) -> torch.Tensor:
        """The fixed sample seeds (all processes)."""
        return torch.arange(self.seed, self.seed + self.num_samples)

    # ------------------------------------------------------------------ checks
    def check_world(self, world: int) -> None:
        """Every process needs at least one sample."""
        if self.num_samples < world:
            raise ConfigError("num_samples", f"every rank needs at least one sample (world size {world})",
                              value=self.num_samples, accepted=f"an integer >= {world}")

    def check_memory(self, world: int) -> None:
        """Refuse a ``num_samples`` whose samples do not fit in memory: a process holds its shard
        of generated samples (float32) and their float64 embedding, rank 0 the gathered flags."""
        dim = int(self.train_data[0].numel())
        shard = -(-self.num_samples // world)
        check_memory("num_samples", self.num_samples, shard * (12.0 * dim + 16.0) + 8.0 * self.num_samples,
                     f"{shard} generated samples of {dim} values as float32 and float64, per process")

    @staticmethod
    def check_model(model: Any) -> None:
        """A module needs ``generate(seeds, batch_size=...)``; any other callable is a sampler."""
        if isinstance(model, nn.Module) and not callable(getattr(model, "generate", None)):
            raise ConfigError("model", f"memorization samples with generate(seeds); "
                              f"{type(model).__name__} has no generate method",
                              value=type(model).__name__, accepted=GENERATING_MODELS)
        if not callable(model):
            raise ConfigError("model", "expected a module with generate(seeds) or a callable seeds -> "
                              "samples", value=type(model).__name__, accepted=GENERATING_MODELS)

    def check_descriptor(self) -> None:
        """The descriptor maps two training samples to features (2, D)."""
        if self.descriptor is not None:
            check_on_samples(lambda x: embed(x, self.descriptor), self.train_data, "descriptor",
                             value=type(self.descriptor).__name__, what="training samples")

    # ------------------------------------------------------------------ reference
    def _cache_path_key(self):
        """(path, key) of the on-disk embedding, or None when it is not worth / not possible."""
        if not self.cache or self.fingerprint is None or not isinstance(self.descriptor, nn.Module):
            return None  # pixel space: the "embedding" is the data itself; a function: no fingerprint
        from ..cache import cache_dir, hash_key
        from ..metrics.descriptors import descriptor_fingerprint

        data = self.fingerprint() if callable(self.fingerprint) else self.fingerprint
        key = hash_key("memorization-reference", data, descriptor_fingerprint(self.descriptor))
        return cache_dir() / "memorization" / f"{key}.pt", key

    def reference(self, device: Any = None, write_cache: bool = True) -> torch.Tensor:
        """Psi of the training set, float64 (N, D): embedded once (or read from the cache)."""
        if self._reference is None:
            from ..cache import load_tensor_verified, save_tensor_atomic

            where = self._cache_path_key()
            hit = load_tensor_verified(*where) if where is not None else None
            if hit is not None:
                self._reference = hit["reference"]
            else:
                self._reference = reference_features(self.train_data.to(device), self.descriptor)
                if where is not None and write_cache:
                    where[0].parent.mkdir(parents=True, exist_ok=True)
                    save_tensor_atomic(where[0], {"reference": self._reference.cpu()}, where[1])
        self._reference = self._reference.to(device)
        return self._reference

    # ------------------------------------------------------------------ measuring
    def _generate(self, model: Any, seeds: torch.Tensor) -> torch.Tensor:
        if callable(getattr(model, "generate", None)):
            return model.generate(seeds, batch_size=self.batch_size)
        return model(seeds)

    def sample_flags(self, samples: torch.Tensor, write_cache: bool = True) -> torch.Tensor:
        """Per-sample indicators (float64, (n,)): 1.0 memorized, 0.0 not, NaN for a non-finite
        sample (the per-unit values of the ratio: its standard error and paired tests)."""
        ok = torch.isfinite(samples.reshape(samples.shape[0], -1)).all(1)
        flags = torch.full((samples.shape[0],), math.nan, dtype=torch.float64, device=samples.device)
        if bool(ok.any()):
            ref = self.reference(samples.device, write_cache)
            g = embed(samples[ok], self.descriptor).to(ref.device)
            scores = memorization_scores(g, ref, self.criterion, self.chunk_size)
            flags[ok] = _is_memorized(scores, self.criterion, self.threshold).to(flags)
        return flags

    @staticmethod
    def flag_statistics(flags: torch.Tensor) -> torch.Tensor:
        """float64 [memorized, total, non-finite] of per-sample indicators."""
        ok = torch.isfinite(flags)
        return torch.stack([flags[ok].sum(), ok.sum().to(torch.float64), (~ok).sum().to(torch.float64)])

    def sample_statistics(self, samples: torch.Tensor, write_cache: bool = True) -> torch.Tensor:
        """float64 [memorized, total, non-finite] of ``samples`` (rows) against the reference."""
        return self.flag_statistics(self.sample_flags(samples, write_cache))

    @torch.no_grad()
    def shard_flags(self, model: Any, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This process's per-sample indicators for seeds ``seeds[rank::world]``."""
        if self.train_data is None:
            raise ConfigError("train_data", "no training set to compare with: pass train_data or call "
                              "prepare(datamodule) first")
        self.check_model(model)
        self.check_world(world)
        seeds = self.seeds[shard_indices(self.num_samples, rank, world)]
        return self.sample_flags(self._generate(model, seeds), write_cache=rank == 0)

    @torch.no_grad()
    def shard_statistics(self, model: Any, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This process's [memorized, total, non-finite] for seeds ``seeds[rank::world]`` (not yet
        summed over processes). The cache is written by rank 0 only."""
        return self.flag_statistics(self.shard_flags(model, rank, world))

    def results(self, stats: torch.Tensor) -> Dict[str, float]:
        """``ratio`` (NaN when any sample is non-finite) and ``nonfinite`` from the counts of all
        processes."""
        memorized, total, bad = stats.to(torch.float64)
        ratio = math.nan if float(bad) > 0 else float(_memorization_compute(memorized, total))
        return {"ratio": ratio, "nonfinite": float(bad) / self.num_samples}

    def evaluate(self, model: Any, comm: Optional[Comm] = None) -> Dict[str, float]:
        """``{"ratio", "nonfinite"}`` of ``model``'s samples, this process's seeds counted and the
        counts summed over ``comm`` (default: torch.distributed; every process must call this)."""
        comm = TorchDistributed() if comm is None else comm
        stats = self.shard_statistics(model, comm.rank, comm.world)
        return self.results(comm.reduce_sum(stats) if comm.world > 1 else stats)

    @staticmethod
    def merge(parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """The counts of the union of the shards (what an all-reduce computes)."""
        return torch.stack([p.to(torch.float64).cpu() for p in parts]).sum(0)


def indicator_se(flags: torch.Tensor) -> float:
    """Standard error of a mean of per-sample indicators: sd (n - 1 normalised) / sqrt(n); NaN
    for fewer than 2 or a non-finite indicator."""
    import numpy as np

    v = np.asarray(flags.detach().cpu().numpy(), dtype=np.float64)
    if v.size < 2 or not np.all(np.isfinite(v)):
        return math.nan
    return float(v.std(ddof=1)) / math.sqrt(v.size)
