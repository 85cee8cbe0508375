"""EvaluationMonitor: any evaluation (:mod:`lightning_pfd.evaluation.base`) on a schedule.

The one monitor of the package: *when* to measure is the schedule of
:class:`~lightning_pfd.callbacks.base.MeasurementCallback` (``every_n_epochs`` / ``schedule``);
*what* is measured is ``evaluation``, any object with ``prepare(datamodule, model, comm)`` and
``measure(model, comm) -> Measurement``, given in a config by ``class_path``::

    trainer:
      callbacks:
        - class_path: lightning_pfd.callbacks.EvaluationMonitor
          init_args:
            name: nn                      # keys nn/<leaf>
            every_n_epochs: 2
            evaluation:
              class_path: my_metrics.NearestNeighbourDistance
              init_args: {num_samples: 64}

At every due pass the monitor prepares the evaluation on the trainer's datamodule, measures the
EMA model with the trainer's processes (:func:`~lightning_pfd.evaluation.base.strategy_comm`:
``trainer.strategy``'s public ``all_gather`` / ``reduce``; the identity on one process) and

- logs the measurement's values under ``<name>/<leaf>`` with one ``pl_module.log_dict`` (epoch
  level, no sync: the values are global) and appends them to ``history`` (with its history-only
  values);
- writes the per-unit values of every leaf to the run's ``per_unit/``
  (:mod:`lightning_pfd.analysis.per_unit`, rank 0);
- warns once per fit when units are non-finite;
- draws its figures on rank 0 every ``figure_every_n`` passes (0: never) and logs them
  (:func:`~lightning_pfd.callbacks.figures.log_figure`).

``GeneralizationMonitor``, ``ICRMonitor``, ``MemorizationMonitor`` and ``TailMonitor`` are
configurations of this class on the package's four evaluations.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Union

import torch

from .. import keys
from ..errors import ConfigError, renamed_fields
from ..evaluation.base import Comm, Evaluation, Measurement, strategy_comm
from ..validation import NonNegativeInt, check_args
from .base import MeasurementCallback, check_metric_prefix, check_unique_metric_names
from .state import callback_field

__all__ = ["EvaluationMonitor"]


class EvaluationMonitor(MeasurementCallback):
    """Measure ``evaluation`` on schedule and log its values (module docstring).

    Args:
        evaluation: an object of the measurement contract (``prepare`` / ``measure``).
        name: the metric namespace (keys ``<name>/<leaf>``; None: the leaves as they are).
        every_n_epochs, schedule: when to measure (:mod:`lightning_pfd.callbacks.schedule`).
        figure_every_n: draw the measurement's figures on passes whose index is a multiple of
            it (0: never).
    """

    def __init__(self, evaluation: Evaluation, name: Optional[str] = None, every_n_epochs: int = 1,
                 schedule: Union[str, List[int]] = "every_n_epochs", figure_every_n: NonNegativeInt = 1):
        with renamed_fields(functools.partial(callback_field, self)):
            check_args(EvaluationMonitor.__init__, locals())
        super().__init__(every_n_epochs=every_n_epochs, schedule=schedule)
        self.figure_every_n = figure_every_n
        self.protocol: Optional[Evaluation] = None
        if evaluation is not None or type(self) is EvaluationMonitor:
            self.protocol = self._check_evaluation(evaluation)
        self.name = None if name is None else check_metric_prefix(self, "name", name)

    # ------------------------------------------------------------------ configuration
    def _check_evaluation(self, evaluation: Any) -> Evaluation:
        if not (callable(getattr(evaluation, "prepare", None)) and callable(getattr(evaluation, "measure", None))):
            raise ConfigError(callback_field(self, "evaluation"), "must be an evaluation object with "
                              "prepare(datamodule, model, comm) and measure(model, comm)",
                              value=type(evaluation).__name__,
                              accepted="e.g. {class_path: my_pkg.MyEvaluation, init_args: {...}}")
        return evaluation

    def metric_keys(self) -> List[keys.MetricKey]:
        """The logged keys the built-in set does not know (:func:`lightning_pfd.keys.collect`):
        display name = key; direction from the evaluation's ``lower_is_better`` mapping
        leaf -> bool, if it has one."""
        lower = getattr(self.protocol, "lower_is_better", None) or {}
        return [keys.MetricKey(self.key(leaf), self.key(leaf), lower.get(leaf))
                for leaf in self._leaves() if keys.find(self.key(leaf)) is None]

    def key(self, leaf: str) -> str:
        """The logged name of ``leaf``: ``<name>/<leaf>`` (``leaf`` without a name)."""
        return leaf if self.name is None else f"{self.name}/{leaf}"

    def history_key(self, leaf: str) -> str:
        """The history name of a history-only value ``leaf`` (default: :meth:`key`)."""
        return self.key(leaf)

    def _leaves(self) -> List[str]:
        leaves = getattr(self.protocol, "leaves", None)
        return list(leaves()) if callable(leaves) else []

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in self._leaves()]

    def _state_key_args(self) -> Dict[str, Any]:
        extra = getattr(self.protocol, "state_key_args", None)
        return {"name": self.name, "evaluation": type(self.protocol).__name__,
                **(extra() if callable(extra) else {})}

    # ------------------------------------------------------------------ the measurement
    def check_setup(self, trainer, pl_module, datamodule: Any) -> None:
        if self.protocol is None:
            raise ConfigError(callback_field(self, "evaluation"), "is required", value=None)
        check = getattr(self.protocol, "check", None)
        if callable(check):
            check(datamodule, pl_module, strategy_comm(trainer))
        check_unique_metric_names(self, trainer)

    def setup(self, trainer, pl_module, stage: str) -> None:
        reset = getattr(self.protocol, "reset", None)
        if callable(reset):  # a new run may bring new data
            reset()
        super().setup(trainer, pl_module, stage)

    def prepare(self, trainer, pl_module, comm: Comm) -> None:
        """``evaluation.prepare`` on the trainer's datamodule (every rank)."""
        self.protocol.prepare(getattr(trainer, "datamodule", None), pl_module, comm)

    @torch.no_grad()
    def _measure_and_log(self, trainer, pl_module) -> None:
        comm = strategy_comm(trainer)
        self.prepare(trainer, pl_module, comm)
        self.record(trainer, pl_module, self.protocol.measure(pl_module, comm))

    def _inspect(self, trainer, measurement: Measurement) -> None:
        """Look at a measurement before it is logged (subclasses: warnings, state)."""

    def record(self, trainer, pl_module, m: Measurement) -> None:
        """Warn, log, keep the per-unit values and draw the figures of one measurement."""
        self._inspect(trainer, m)
        if m.nonfinite is not None:
            self._warn_nonfinite(trainer, m.nonfinite.fraction, m.nonfinite.what,
                                 [self.key(leaf) for leaf in m.nonfinite.leaves], self.key("nonfinite"))
        self.log_metrics(trainer, pl_module, {self.key(k): v for k, v in m.values.items()},
                         extra={self.history_key(k): v for k, v in m.history.items()} or None)
        for leaf, u in m.units.items():
            value = m.values[leaf] if u.value is None else u.value
            self.write_units(trainer, self.key(leaf), u.kind, u.values, u.ids, value)
        every = self.figure_every_n
        if m.figures and every and self.schedule.index % every == 0 and trainer.is_global_zero:
            for leaf, draw in m.figures.items():
                figure, caption = draw(int(trainer.current_epoch))
                self.log_figure(trainer, self.key(leaf), figure, caption)
