"""TailMonitor: tail metrics of a physical observable on schedule (what is measured and how:
:class:`lightning_pfd.evaluation.tail.TailEvaluation`; when and where to log: the base).

Logs ``<name>/rmsqe``, ``/loader`` (NaN when a sample's observable is non-finite),
``/rmsqe_floor``, ``/loader_floor`` (same-law floors), ``/nonfinite``, the diagnostics
``/rmsqe_clipped``, ``/loader_clipped`` (samples clipped to the data range), ``/above_range``,
``/below_range`` (fractions of samples with a value above / below it) and ``/rmsqe_top_share`` (the RMSQE's share from its largest
single-sample contribution), and the density figure
``/density`` (``log_figure``). Seeds are sharded over ranks, the observables gathered, so the
values are those of :meth:`TailEvaluation.measure` on the same model under any world size.

TailMonitor is :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor` on
:class:`~lightning_pfd.evaluation.tail.TailMeasure` (the measurement contract), with the
arguments, metric names and checkpoint state key of this monitor.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from .. import keys
from ..evaluation.base import strategy_comm
from ..errors import renamed_fields
from ..evaluation.tail import TAIL_LEAVES, ReferenceSplit, TailEvaluation, TailMeasure, TailSettings
from ..metrics.kde import Bandwidth
from ..metrics.tails import Definition
from ..validation import FinitePositiveFloat, IntAtLeastTwo, NonNegativeInt, OpenUnitInterval, PositiveInt, check_args
from .base import check_metric_prefix, check_unique_metric_names
from .monitor import EvaluationMonitor
from .state import callback_field

__all__ = ["TailMonitor"]
_LEAVES = (*TAIL_LEAVES, "density")


class TailMonitor(EvaluationMonitor):
    """Tail metrics of ``observable`` between model samples and the ``reference`` data.

    ``reference`` ("train" or "val"), ``plot``, ``name`` (metric namespace), ``every_n_epochs``
    and ``schedule`` (see :mod:`lightning_pfd.callbacks.base`) are the monitor's; every other
    argument is a field of :class:`~lightning_pfd.evaluation.tail.TailSettings`.
    """

    _DEFAULT_NAME = "tail"

    def __init__(self, every_n_epochs: int = 1, num_samples: IntAtLeastTwo = 512, observable: str = "max",
                 observable_kwargs: Optional[Dict[str, Any]] = None, reference: ReferenceSplit = "train",
                 eta: OpenUnitInterval = 0.975, window: Optional[Sequence[float]] = None,
                 floor: FinitePositiveFloat = 1e-3, relative_floor: bool = True, bandwidth: Bandwidth = "silverman",
                 num_splits: PositiveInt = 8, seed_offset: NonNegativeInt = 50_000_000, batch_size: PositiveInt = 256,
                 num_steps: Optional[PositiveInt] = None, plot: bool = True, name: str = "tail",
                 definition: Definition = "blog", schedule: Union[str, List[int]] = "every_n_epochs"):
        super().__init__(None, every_n_epochs=every_n_epochs, schedule=schedule)
        with renamed_fields(callback_field(self, "")):
            check_args(TailMonitor.__init__, locals())
            self.reference = reference
            self.settings = TailSettings(
                observable, observable_kwargs or {}, num_samples, eta, definition, window=window,
                floor=floor, relative_floor=relative_floor, bandwidth=bandwidth, num_splits=num_splits,
                seed_offset=seed_offset, batch_size=batch_size, num_steps=num_steps)
        self.name, self.plot = check_metric_prefix(self, "name", name), bool(plot)
        self.figure_every_n = 1 if self.plot else 0  # the density figure at every measurement
        self.protocol = TailMeasure(self.settings, self.reference, fields=self._fields)

    def _fields(self):
        """Errors name this monitor's arguments (``model`` stays the model)."""
        return renamed_fields(self._field)

    def _field(self, arg: str) -> str:
        return arg if arg == "model" else callback_field(self, arg)

    @property
    def evaluation(self) -> Optional[TailEvaluation]:
        """The TailEvaluation of the current fit (built by :meth:`check_setup`)."""
        return self.protocol.evaluation

    def key(self, leaf: str) -> str:
        return f"{self.name}/{leaf}"

    def metric_keys(self) -> List[keys.MetricKey]:
        """The display / direction of ``tail/*`` under this monitor's namespace
        (:func:`lightning_pfd.keys.collect`; none for the default namespace)."""
        if self.name == self._DEFAULT_NAME:
            return []
        return [keys.get(f"tail/{leaf}").renamed(self.key(leaf)) for leaf in _LEAVES]

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in _LEAVES]

    def history_key(self, leaf: str) -> str:
        return leaf  # the history rows keep the values under their leaves as well

    def _state_key_args(self) -> Dict[str, Any]:
        s = self.settings
        return dict(name=self.name, observable=s.observable, observable_kwargs=s.observable_kwargs,
                    reference=self.reference, num_samples=s.num_samples, eta=s.eta,
                    seed_offset=s.seed_offset)

    def check_setup(self, trainer: Any, pl_module: Any, datamodule: Any) -> None:
        """ConfigError before training: no ``generate`` (or none taking ``num_steps``), a missing
        reference split, ``num_samples`` >= its size (same-law floors) or < the world size, an
        observable without one scalar per sample, another monitor logging the same keys."""
        self.protocol.check(datamodule, pl_module, strategy_comm(trainer))
        check_unique_metric_names(self, trainer)

    @property
    def floors(self) -> Dict[str, float]:
        """The same-law floors of the current reference (computed on first use)."""
        return self.evaluation.floors() if self.evaluation is not None else {}

    @property
    def last(self) -> Dict[str, float]:
        return self.history[-1] if self.history else {}
