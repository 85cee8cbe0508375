"""MemorizationMonitor: the memorization ratio of seeded samples during training.

*What* is measured -- ``num_samples`` PF-ODE samples from fixed seeds (``pl_module.generate``, EMA
weights), compared with the training set in a descriptor space (exact nearest-neighbour ratio
d_1/d_2 < 1/3 by default, or cosine > 0.6), the training embedding cached on disk -- is
:class:`~lightning_pfd.evaluation.memorization.MemorizationEvaluation` (same arguments); this
callback decides *when* (:mod:`lightning_pfd.callbacks.base`) and *where* to log. The seeds are
split over ranks and the counts added through ``trainer.strategy``; the training set is embedded
once per fit.

Logged: ``mem/ratio`` and ``mem/nonfinite`` (``<name>/...`` with ``name``). Non-finite samples (a
diverged model): ``mem/ratio`` is NaN and ``mem/nonfinite`` their fraction (0.0 when all are
finite); one warning line the first time.

:meth:`MemorizationMonitor.check_setup` refuses before training: a module without ``generate``, a
training set too small for the criterion (nn_ratio needs two samples), fewer samples than ranks,
a descriptor that fails on the data, and another monitor logging the same keys.

MemorizationMonitor is :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor` on
:class:`~lightning_pfd.evaluation.memorization.MemorizationMeasure` (the measurement contract), with the
arguments, metric names and checkpoint state key of this monitor.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from .. import keys
from ..errors import renamed_fields
from ..evaluation.base import strategy_comm
from ..evaluation.memorization import MemorizationEvaluation, MemorizationMeasure, resolve_descriptor
from ..metrics.memorization import Criterion, resolve_threshold
from ..validation import NonNegativeInt, PositiveInt, check_args
from .base import check_metric_prefix, check_unique_metric_names, require_train_data
from .monitor import EvaluationMonitor
from .state import callback_field

__all__ = ["MemorizationMonitor"]

_LEAVES = MemorizationMeasure.LEAVES
_ARGS = ("num_samples", "criterion", "threshold", "descriptor", "chunk_size", "seed", "batch_size")


class MemorizationMonitor(EvaluationMonitor):
    """Log ``mem/ratio`` from seeded samples (module docstring).

    Args: those of :class:`MemorizationEvaluation` (``threshold`` None: 0.6 for cosine, 1/3 for
    nn_ratio; ``cache``: the training embedding on disk, with a descriptor), plus
    ``every_n_epochs`` / ``schedule`` (:mod:`lightning_pfd.callbacks.base`) and ``name``, the
    metric namespace (default ``"mem"``).
    """

    _DEFAULT_NAME = "mem"

    def __init__(self, num_samples: PositiveInt = 256, every_n_epochs: int = 5,
                 criterion: Criterion = "nn_ratio", threshold: Optional[float] = None,
                 descriptor: Union[str, Callable, None] = None, chunk_size: PositiveInt = 4096,
                 seed: NonNegativeInt = 20_000_000, batch_size: PositiveInt = 256, cache: bool = True,
                 name: str = "mem", schedule: Union[str, List[int]] = "every_n_epochs"):
        super().__init__(None, every_n_epochs=every_n_epochs, schedule=schedule)
        with self._fields():
            check_args(MemorizationMonitor.__init__, locals())
            resolve_threshold(criterion, threshold)
            self.descriptor = resolve_descriptor(descriptor)  # built now: a bad name fails early
        self.name = check_metric_prefix(self, "name", name)
        self.descriptor_spec = descriptor if isinstance(descriptor, str) or descriptor is None \
            else type(descriptor).__name__
        self.num_samples, self.criterion, self.threshold = num_samples, criterion, threshold
        self.chunk_size, self.seed, self.batch_size, self.cache = chunk_size, seed, batch_size, bool(cache)
        self.protocol = MemorizationMeasure(
            dict(num_samples=num_samples, criterion=criterion, threshold=threshold, descriptor=self.descriptor,
                 chunk_size=chunk_size, seed=seed, batch_size=batch_size, cache=self.cache), fields=self._fields)
        self.last_flags = self.last_seeds = None  # the last measurement's per-sample indicators

    def _fields(self):
        return renamed_fields(lambda arg: callback_field(self, arg), _ARGS)

    def key(self, leaf: str) -> str:
        """Logged name of ``leaf`` (ratio, nonfinite) in this namespace."""
        return f"{self.name}/{leaf}"

    def metric_keys(self) -> List[keys.MetricKey]:
        """The display / direction of ``mem/*`` under this monitor's namespace
        (:func:`lightning_pfd.keys.collect`; none for the default namespace)."""
        if self.name == self._DEFAULT_NAME:
            return []
        return [keys.get(f"mem/{leaf}").renamed(self.key(leaf)) for leaf in _LEAVES]

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in _LEAVES]

    def _state_key_args(self) -> Dict[str, Any]:
        return dict(name=self.name, criterion=self.criterion, threshold=self.threshold,
                    descriptor=self.descriptor_spec or "identity", num_samples=self.num_samples,
                    seed=self.seed)

    def evaluation(self, datamodule: Any) -> MemorizationEvaluation:
        """The evaluation object on the datamodule's training set (one per fit and training set:
        the training embedding is computed, or read from the cache, once)."""
        require_train_data(self, datamodule)
        return self.protocol.use(datamodule)

    def check_setup(self, trainer, pl_module, datamodule: Any) -> None:
        with self._fields():
            MemorizationEvaluation.check_model(pl_module)
            self.evaluation(datamodule).check_world(trainer.world_size)
        check_unique_metric_names(self, trainer)
        with self._fields():
            self.protocol.evaluation.check_descriptor()

    def setup(self, trainer, pl_module, stage: str) -> None:
        super(EvaluationMonitor, self).setup(trainer, pl_module, stage)  # the embedding is kept until on_fit_start

    def on_fit_start(self, trainer, pl_module) -> None:
        self.protocol.reset()  # a new fit may bring new data: embed again (once)

    def prepare(self, trainer, pl_module, comm) -> None:
        self.evaluation(getattr(trainer, "datamodule", None))

    def measure(self, trainer, pl_module) -> Dict[str, float]:
        """Global ``ratio``, its standard error ``ratio_se`` (sd of the per-sample indicators /
        sqrt(n)) and ``nonfinite`` (every rank must call this); the gathered per-sample
        indicators are kept in ``self.last_flags`` (all seeds, global order)."""
        comm = strategy_comm(trainer)
        self.prepare(trainer, pl_module, comm)
        return self._keep(self.protocol.measure(pl_module, comm)).values

    def _keep(self, m):
        units = m.units["ratio"]
        self.last_flags, self.last_seeds = units.values, units.ids
        return m

    def _inspect(self, trainer, m) -> None:
        self._keep(m)
