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

``GeneralizationMonitor``, ``ICRMonitor``, ``MemorizationMonitor`` and ``TailMonitor``
(:mod:`lightning_pfd.callbacks.presets`) are configurations of this class on the package's four
evaluations: functions that build an ``EvaluationMonitor``, usable as a config's ``class_path``.

What an evaluation may add to the contract (all optional): ``check(datamodule, model, comm)``
(refuse a setup before any work), ``reset()`` (forget the data: called at ``setup`` when the
trainer's datamodule or model is not the one the evaluation was last prepared or checked for),
``leaves()`` (the value names, for the duplicate-key check), ``state_key_args()`` (what
distinguishes two instances in a checkpoint), ``default_name`` (the namespace when ``name`` is
None), ``key(leaf, name)`` (its own key naming), ``metric_keys(key)`` (the
:class:`~lightning_pfd.keys.MetricKey` it declares, given the monitor's naming ``key(leaf)``),
``lower_is_better`` (leaf -> bool, for undeclared keys), ``history_under_leaf`` (history rows
also keep the values under their leaves) and ``state_dict()`` / ``load_state_dict(state)`` (its
own entries of the monitor's checkpoint state).

The last measurement stays in memory: :attr:`EvaluationMonitor.latest` is a :class:`Latest`
(epoch, global step, the measurement and its logged keys), what the event callbacks read in
the same epoch; the run's ``per_unit/`` files are for resume and ``report``.
"""
from __future__ import annotations

import dataclasses

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import torch
from lightning.pytorch.utilities import rank_zero_warn

from .. import keys
from ..errors import ConfigError
from ..evaluation.base import Comm, Evaluation, Measurement, strategy_comm
from ..validation import NonNegativeInt, check_args
from .base import MeasurementCallback, check_metric_prefix, check_unique_metric_names

__all__ = ["EvaluationMonitor", "Latest"]


@dataclass(frozen=True)
class Latest:
    """The last measurement of a monitor: at ``epoch`` / ``step`` (the trainer's
    ``current_epoch`` / ``global_step``), with ``values`` and ``units`` under their logged keys
    (``units``: the :class:`~lightning_pfd.analysis.per_unit.UnitRecord` written to ``per_unit/``)."""

    epoch: int
    step: int
    measurement: Measurement
    values: Dict[str, float]
    units: Dict[str, Any]


class EvaluationMonitor(MeasurementCallback):
    """Measure ``evaluation`` on schedule and log its values (module docstring).

    Args:
        evaluation: an object of the measurement contract (``prepare`` / ``measure``).
        name: the metric namespace (keys ``<name>/<leaf>``; None: the evaluation's
            ``default_name``, else the leaves as they are).
        every_n_epochs, schedule: when to measure (:mod:`lightning_pfd.callbacks.schedule`).
        figure_every_n: draw the measurement's figures on passes whose index is a multiple of
            it (0: never).
    """

    def __init__(self, evaluation: Evaluation, name: Optional[str] = None, every_n_epochs: int = 1,
                 schedule: Union[str, List[int]] = "every_n_epochs", figure_every_n: NonNegativeInt = 1):
        check_args(EvaluationMonitor.__init__, locals())
        super().__init__(every_n_epochs=every_n_epochs, schedule=schedule)
        self.figure_every_n = figure_every_n
        self.evaluation = self._check_evaluation(evaluation)
        name = self.evaluation.default_name if name is None else name
        self.name = None if name is None else check_metric_prefix("name", name)
        #: the configuration this monitor was built as (``GeneralizationMonitor``, ...; None: a
        #: plain EvaluationMonitor) and its namespace in the checkpoint state key
        self.preset: Optional[str] = None
        self.preset_namespace: Optional[str] = None
        self.latest: Optional[Latest] = None
        self._bound_to: tuple = ()  # weak references to the (datamodule, model) last prepared for

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _check_evaluation(evaluation: Any) -> Evaluation:
        if not isinstance(evaluation, Evaluation):
            raise ConfigError("evaluation", "must be a lightning_pfd.evaluation.Evaluation (subclass "
                              "it and implement prepare(datamodule, model, comm) and measure(model, "
                              "comm); its other members have defaults)", value=type(evaluation).__name__,
                              accepted="e.g. {class_path: my_pkg.MyEvaluation, init_args: {...}}")
        return evaluation

    @property
    def display_name(self) -> str:
        """The configuration's name (messages): its preset, else the class name."""
        return self.preset or type(self).__name__

    def key(self, leaf: str) -> str:
        """The logged name of ``leaf``: the evaluation's ``key(leaf, name)`` (by default
        ``<name>/<leaf>``, ``leaf`` without a name)."""
        return self.evaluation.key(leaf, self.name)

    def _leaves(self) -> List[str]:
        return list(self.evaluation.leaves())

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in self._leaves()]

    def metric_keys(self) -> List[keys.MetricKey]:
        """The keys the built-in set does not know (:func:`lightning_pfd.keys.collect`): the
        evaluation's ``metric_keys(key)``, else each leaf's built-in key under this namespace
        (``<default_name>/<leaf>`` renamed), or a new key (display name = key; direction from
        the evaluation's ``lower_is_better`` mapping leaf -> bool, if it has one)."""
        declared = self.evaluation.metric_keys(self.key)
        if declared is not None:
            return list(declared)
        default = self.evaluation.default_name
        lower = self.evaluation.lower_is_better or {}
        out = []
        for leaf in self._leaves():
            key = self.key(leaf)
            builtin = keys.find(f"{default}/{leaf}" if default else key)
            if builtin is None:
                out.append(keys.MetricKey(key, key, lower.get(leaf)))
            elif builtin.key != key:
                out.append(builtin.renamed(key))
        return out

    def _state_key_args(self) -> Dict[str, Any]:
        extra = self.evaluation.state_key_args()
        if self.preset is not None:
            return {"name": self.name or self.preset_namespace, **extra}
        return {"name": self.name, "evaluation": type(self.evaluation).__name__, **extra}

    @property
    def state_key(self) -> str:
        """``<preset or class name>{args}`` (:meth:`_state_key_args`): the key of the checkpoints
        written when the presets were classes of their own."""
        return f"{self.display_name}{self._state_key_args()!r}"

    # ------------------------------------------------------------------ the measurement
    def check_setup(self, trainer, pl_module, datamodule: Any) -> None:
        """The evaluation's ``check`` (once per datamodule, model and world size: the command
        line's pre-flight and the ``setup`` that follows check once), then the duplicate keys."""
        comm = strategy_comm(trainer)
        if not self._bound(datamodule, pl_module, comm.world):
            self.evaluation.check(datamodule, pl_module, comm)
            self._bind(datamodule, pl_module, comm.world)
        check_unique_metric_names(self, trainer)

    def _bind(self, datamodule: Any, pl_module: Any, world: Optional[int] = None) -> None:
        """Remember (weakly) the datamodule and model the evaluation is bound to, and the world
        size it was checked for (None: prepared, not checked); nothing for an object without
        weak references (it is checked and reset as if new each time)."""
        try:
            self._bound_to = (*(None if o is None else weakref.ref(o) for o in (datamodule, pl_module)), world)
        except TypeError:
            self._bound_to = ()

    def _bound(self, datamodule: Any, pl_module: Any, world: Optional[int] = None) -> bool:
        if len(self._bound_to) != 3 or (world is not None and self._bound_to[2] != world):
            return False
        return all((r and r()) is o for r, o in zip(self._bound_to, (datamodule, pl_module)))

    def __getstate__(self) -> Dict[str, Any]:
        """A copy (``ddp_spawn`` pickles the callbacks) is bound to nothing and has no latest
        measurement (its figures are functions): each process checks and prepares its
        evaluation with its own objects."""
        return {**self.__dict__, "_bound_to": (), "latest": None}

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self._bound(getattr(trainer, "datamodule", None), pl_module):
            self.evaluation.reset()  # another datamodule or model than the one it was prepared for
            self._bound_to = ()
        if stage == "fit":
            self.latest = None
        super().setup(trainer, pl_module, stage)

    def prepare(self, trainer, pl_module, comm: Optional[Comm] = None) -> None:
        """``evaluation.prepare`` on the trainer's datamodule (every rank)."""
        comm = strategy_comm(trainer) if comm is None else comm
        datamodule = getattr(trainer, "datamodule", None)
        self.evaluation.prepare(datamodule, pl_module, comm)
        if not self._bound(datamodule, pl_module):
            self._bind(datamodule, pl_module)

    @torch.no_grad()
    def _measure_and_log(self, trainer, pl_module) -> None:
        comm = strategy_comm(trainer)
        self.prepare(trainer, pl_module, comm)
        self.record(trainer, pl_module, self.evaluation.measure(pl_module, comm))

    def record(self, trainer, pl_module, m: Measurement) -> None:
        """Warn, log, keep (in memory and in ``per_unit/``) and draw one measurement."""
        for note in m.warnings:  # the evaluation says each once per fit
            rank_zero_warn(f"{self.display_name}: {note}")
        if m.collapsed:  # a dead network's numbers are no measurement: NaN, and the run diverged
            m = self._collapsed(pl_module, m)
        if m.nonfinite is not None:
            self._warn_nonfinite(trainer, m.nonfinite.fraction, m.nonfinite.what,
                                 [self.key(leaf) for leaf in m.nonfinite.leaves], self.key("nonfinite"))
        bare = self.evaluation.history_under_leaf
        row = self.log_metrics(trainer, pl_module, {self.key(k): v for k, v in m.values.items()},
                               extra={(k if bare else self.key(k)): v for k, v in m.history.items()} or None)
        records = {self.key(leaf): self.write_units(trainer, self.key(leaf), u.kind, u.values, u.ids,
                                                    m.values[leaf] if u.value is None else u.value)
                   for leaf, u in m.units.items()}
        self.latest = Latest(int(trainer.current_epoch), int(trainer.global_step), m,
                             {k: row[k] for k in (self.key(leaf) for leaf in m.values)}, records)
        every = self.figure_every_n
        if m.figures and every and self.schedule.index % every == 0 and trainer.is_global_zero:
            for leaf, draw in m.figures.items():
                figure, caption = draw(int(trainer.current_epoch))
                self.log_figure(trainer, self.key(leaf), figure, caption)

    def _collapsed(self, pl_module, m: Measurement) -> Measurement:
        """``m`` with every value NaN (invalid, not a measurement of a model) and no per-unit
        record; the module is declared diverged (``declare_diverged``, cause ``"collapse"``)."""
        rank_zero_warn(f"{self.display_name}: {m.collapsed}; logging NaN and declaring the run diverged",
                       category=RuntimeWarning)
        declare = getattr(pl_module, "declare_diverged", None)
        if callable(declare):
            declare("collapse", f"collapsed outputs ({self.display_name}: {m.collapsed})")
        nan = {k: float("nan") for k in m.values}
        return dataclasses.replace(m, values=nan, units={}, figures={})

    def _extra_state(self) -> Dict[str, Any]:
        return dict(self.evaluation.state_dict())

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        self.evaluation.load_state_dict(state)
