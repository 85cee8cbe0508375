"""The base of every measurement callback: *when* to measure and *where* to log.

The package's monitors are :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor`, which runs
any evaluation of the measurement contract (:mod:`lightning_pfd.evaluation.base`) on this base.
A monitor of another shape subclasses :class:`MeasurementCallback`, implements
``_measure_and_log(trainer, pl_module)`` (measure with an evaluation object, then
:meth:`~MeasurementCallback.log_metrics` / :meth:`~MeasurementCallback.log_figure`) and lists its
distinguishing arguments in ``_state_key_args()``. The base provides:

**Schedule.** Measurements happen at *passes* (validation passes of ``fit``, or training epochs
without a validation loop); ``every_n_epochs`` / ``schedule`` pick the measured ones:
``"every_n_epochs"`` (default), ``"log"`` (about two per doubling of the pass count) or a list
of pass indices (:mod:`lightning_pfd.callbacks.schedule`). The pass count is saved in
``state_dict``; outside ``fit`` every pass measures.

**State.** ``history`` (one dict per measurement: epoch, step and the logged values) and the pass
count are kept in ``state_dict`` (subclass extras via ``_extra_state`` / ``_load_extra_state``);
``state_key`` is built from ``_state_key_args()`` in Lightning's ``_generate_state_key`` format
(the format of the checkpoints written before this base existed), so several monitors of one
class that measure different things keep and resume their own state.

**Processes.** :meth:`MeasurementCallback.comm` is the trainer's
:class:`~lightning_pfd.evaluation.base.Comm` (``trainer.strategy``'s public ``all_gather`` /
``reduce``, :func:`~lightning_pfd.evaluation.base.strategy_comm`): ``shard``, ``gather_rows``,
``all_sum``, ``reduce_sum``, ``all_true``, the identity on one process; with several, every rank
must call them.

**Logging.** :meth:`log_metrics` (one ``pl_module.log_dict`` per epoch + a history row) and
:func:`~lightning_pfd.callbacks.figures.log_figure` (a W&B image with a ``WandbLogger``,
``add_figure`` / ``add_image`` with a ``TensorBoardLogger``, else a PNG ``figures/<key>-epoch<k>.png`` under the logger's ``log_dir`` or
the trainer's ``default_root_dir``; rank 0 only; the figure is closed). Callbacks that are not
monitors (``RegimeMonitor``) use :mod:`lightning_pfd.callbacks.figures`: ``log_figure`` and
``log_to_loggers`` (for hooks where ``pl_module.log`` is not allowed).

**Per-unit records.** :meth:`MeasurementCallback.write_units` writes a measurement's per-unit
values to the run's ``per_unit/`` (:func:`per_unit_store`, rank 0) for resume and ``report``,
and keeps the same records in memory (one conversion, :func:`unit_record`), where the consumers
of the same fit read them (:func:`fresh_units`: ``RegimeMonitor``, ``ICREarlyStopping``). ``on_train_start`` moves an
earlier run's records aside when the fit is fresh (:func:`prepare_per_unit_store`).

**Freshness.** :meth:`MeasurementCallback.measured_now` is the one rule by which a consumer tells
a value measured at this pass from a stale one: ``log_metrics`` / ``write_units`` stamp the pass
(epoch, global step); the rule holds when the stamp is the trainer's and the schedule measured it.

**Checks.** ``check_setup(trainer, pl_module, datamodule)``: every incompatibility a monitor can
detect cheaply, raised as :class:`~lightning_pfd.errors.ConfigError`. The command line calls it for
every callback before any directory, config, checkpoint or cache is written; ``setup`` calls it
again at the start of ``fit`` / ``validate`` for Python-API users. ``metric_names()`` lists the
logged keys (:func:`check_unique_metric_names` refuses two monitors writing one key);
:meth:`_warn_nonfinite` prints one warning line the first time a fit measures NaN/inf.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..analysis.per_unit import STORE_DIR, PerUnitStore, UnitRecord
from ..errors import ConfigError
from ..evaluation.base import Comm, strategy_comm
from .figures import log_figure
from .schedule import MeasurementSchedule, ScheduleSpec, check_schedule
from .state import callback_state_key

__all__ = ["MeasurementCallback", "validation_disabled", "check_unique_metric_names",
           "check_metric_prefix", "per_unit_store", "prepare_per_unit_store",
           "unit_record", "fresh_units"]


# ----------------------------------------------------------------------------- small helpers
def check_metric_prefix(arg: str, prefix: Any) -> str:
    """A metric namespace: a non-empty string without '/' (the keys are ``<prefix>/<name>``)."""
    if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix != prefix.strip():
        raise ConfigError(arg, "must be a non-empty metric namespace "
                          "without '/' or surrounding spaces", value=prefix,
                          accepted="e.g. 'icr' or 'icr_sigma1'")
    return prefix


def check_unique_metric_names(callback: Any, trainer: "pl.Trainer", arg: str = "name") -> None:
    """Refuse another callback of the trainer that logs one of ``callback.metric_names()``."""
    mine = set(callback.metric_names())
    for other in getattr(trainer, "callbacks", None) or []:
        if other is callback or not callable(getattr(other, "metric_names", None)):
            continue
        shared = sorted(mine & set(other.metric_names()))
        if shared:
            raise ConfigError(
                arg,
                f"another callback of the Trainer ({getattr(other, 'display_name', type(other).__name__)}) also logs {shared[:3]} "
                "(two monitors writing one key overwrite each other's curve)",
                value=getattr(callback, arg, None),
                suggestion=f"give one of them a different `{arg}` (its metric namespace)")


def validation_disabled(trainer: "pl.Trainer") -> bool:
    """True when this run has no validation loop, i.e. ``on_validation_epoch_end`` never fires."""
    if not trainer.enable_validation:  # no val data / validation_step, or limit_val_batches == 0
        return True
    nv = trainer.num_val_batches  # [] until the validation loop set its data up (then known)
    return bool(nv) and sum(nv) == 0


# ----------------------------------------------------------------------------- per-unit records
def per_unit_store(trainer: "pl.Trainer") -> PerUnitStore:
    """The run's per-unit records: ``<trainer.default_root_dir>/per_unit``
    (:mod:`lightning_pfd.analysis.per_unit`); no side effect (:func:`prepare_per_unit_store`
    starts a fresh fit's store)."""
    return PerUnitStore(Path(trainer.default_root_dir) / STORE_DIR)


def prepare_per_unit_store(trainer: "pl.Trainer") -> PerUnitStore:
    """:func:`per_unit_store`, after moving the records of an earlier run aside when this is a
    fresh fit (fitting without ``ckpt_path``): ``per_unit`` -> ``per_unit.prev-<time>-<k>``, on
    rank 0, so two runs are never mixed; a resumed fit keeps and extends them.

    Called in ``on_train_start`` by every callback that writes or reads the store (the monitors,
    ``RegimeMonitor``): the checkpoint is restored by then (``trainer.ckpt_path`` is known, for
    every strategy) and nothing of this fit has been written yet (measurements start after it),
    so the first call moves an earlier run's records and the others find none: once per fit,
    without state shared between callbacks or fits."""
    store = per_unit_store(trainer)
    root = store.root
    fresh = getattr(trainer, "ckpt_path", None) is None and getattr(trainer.state, "fn", None) == TrainerFn.FITTING
    if fresh and trainer.is_global_zero and root.is_dir() and any(root.glob("*/epoch_*.npz")):
        stem = f"{STORE_DIR}.prev-{time.strftime('%Y%m%d-%H%M%S')}"
        k = 0
        while root.with_name(f"{stem}-{k}").exists():
            k += 1
        root.rename(root.with_name(f"{stem}-{k}"))
    return store


def unit_record(key: str, epoch: int, step: int, kind: str, values: Any, units: Any,
                value: Any) -> UnitRecord:
    """The :class:`~lightning_pfd.analysis.per_unit.UnitRecord` of per-unit ``values`` (tensors
    or arrays) with their ``units`` ids: what :meth:`MeasurementCallback.write_units` writes and
    what the in-memory consumers keep (the same conversion, so memory equals the files)."""
    as_np = (lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t)
    return UnitRecord(key, int(epoch), int(step), kind, as_np(values), as_np(units), float(value))


def _pass(trainer: "pl.Trainer") -> tuple:
    """The trainer's pass as a measurement stamps it: ``(current_epoch, global_step)``."""
    return int(trainer.current_epoch), int(trainer.global_step)


def fresh_units(trainer: "pl.Trainer") -> Dict[str, UnitRecord]:
    """The per-unit records measured at the trainer's current pass, under their keys, in memory:
    those every :class:`MeasurementCallback` made with :meth:`~MeasurementCallback.write_units`
    when it :meth:`~MeasurementCallback.measured_now` (an ``EvaluationMonitor``'s included), and
    the ``latest.units`` of any other callback that keeps a ``latest`` measurement with ``epoch`` /
    ``step`` (:class:`~lightning_pfd.callbacks.monitor.Latest`) at the trainer's epoch and step."""
    out: Dict[str, UnitRecord] = {}
    for cb in getattr(trainer, "callbacks", None) or []:
        if isinstance(cb, MeasurementCallback):
            out.update(cb.units_now(trainer))
            continue
        latest = getattr(cb, "latest", None)
        if latest is not None and (latest.epoch, latest.step) == _pass(trainer):
            out.update(getattr(latest, "units", None) or {})
    return out


# ----------------------------------------------------------------------------- the base
class MeasurementCallback(Callback):
    """Base of the monitors: calls ``self._measure_and_log(trainer, pl_module)`` on schedule.

    Args:
        every_n_epochs: with ``schedule="every_n_epochs"``, measure on every n-th pass (the
            first always). Subclasses may also set ``self.every_n_epochs`` themselves (it is read
            at every pass).
        schedule: ``"every_n_epochs"`` (default), ``"log"`` or a list of pass indices
            (:mod:`lightning_pfd.callbacks.schedule`).

    Subclasses implement ``_measure_and_log`` and, when several instances may coexist,
    ``_state_key_args()`` (the arguments that distinguish what they measure) and
    ``metric_names()``; extra checkpoint state via ``_extra_state`` / ``_load_extra_state``.
    """

    #: the metric namespace (``name``) of a monitor created without one
    _DEFAULT_NAME: Optional[str] = None

    def __init__(self, every_n_epochs: int = 1, schedule: ScheduleSpec = "every_n_epochs") -> None:
        super().__init__()
        kind, self.every_n_epochs = check_schedule(schedule, every_n_epochs)
        self.schedule = MeasurementSchedule(kind)
        self.history: List[Dict[str, Any]] = []
        self._warned_nonfinite = False
        self._last: tuple = (None, {})  # the pass of the last measurement, its per-unit records

    # ------------------------------------------------------------------ what subclasses provide
    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        raise NotImplementedError

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                    datamodule: Any) -> None:
        """Raise :class:`ConfigError` for what this monitor can tell is incompatible (cheaply)."""

    def metric_names(self) -> List[str]:
        """The keys this monitor logs (used to refuse two monitors writing the same key)."""
        return []

    def _state_key_args(self) -> Dict[str, Any]:
        """The arguments that define what this monitor measures (not the operational ones)."""
        return {}

    def _extra_state(self) -> Dict[str, Any]:
        """Subclass state saved next to the history and the pass count."""
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""

    # ------------------------------------------------------------------ schedule hooks
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # setup() runs before a checkpoint's callback state is restored: a fresh fit starts its
        # count at 0 (first pass measured), a resumed one gets the saved count back afterwards
        if stage == "fit":
            self.schedule.reset()
            self._warned_nonfinite = False
        self._last = (None, {})
        if stage in ("fit", "validate"):  # datamodule.setup() has run: train_data exists
            self.check_setup(trainer, pl_module, getattr(trainer, "datamodule", None))

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        prepare_per_unit_store(trainer)  # a fresh fit: an earlier run's records moved aside

    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not self._skip_diverged(trainer, pl_module) and self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # without a validation loop Lightning never calls on_validation_epoch_end: measure here
        if validation_disabled(trainer) and not self._skip_diverged(trainer, pl_module) \
                and self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def _skip_diverged(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> bool:
        """A diverged model (``pl_module.diverged``) is not measured: its values would be logged as
        ordinary ones (a finite ICR of a dead network). Said once."""
        if not getattr(pl_module, "diverged", False):
            return False
        if not getattr(self, "_said_diverged", False):
            self._said_diverged = True
            rank_zero_info(f"[lightning_pfd] {getattr(self, 'display_name', type(self).__name__)}: not "
                           "measured from here on: the model diverged")
        return True

    # ------------------------------------------------------------------ processes
    @staticmethod
    def comm(trainer: "pl.Trainer") -> Comm:
        """The trainer's processes (:func:`~lightning_pfd.evaluation.base.strategy_comm`): every
        rank must call its collectives."""
        return strategy_comm(trainer)

    # ------------------------------------------------------------------ logging
    def log_metrics(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                    values: Mapping[str, Any], extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Log ``values`` once per epoch on every logger (one ``pl_module.log_dict``, no sync: the
        values are already global) and append a history row ``{"epoch", "step", **values, **extra}``.
        Numbers are logged as float32 tensors, tensors as they are. Returns the row."""
        payload = {key: v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float32)
                   for key, v in values.items()}
        pl_module.log_dict(payload, sync_dist=False, on_step=False, on_epoch=True, batch_size=1)
        row = {"epoch": int(trainer.current_epoch), "step": int(trainer.global_step),
               **{k: float(v) for k, v in values.items()}, **dict(extra or {})}
        self.history.append(row)
        self._stamp(trainer)
        return row

    def write_units(self, trainer: "pl.Trainer", key: str, kind: str, values: Any, units: Any,
                    value: float) -> UnitRecord:
        """This pass's per-unit values of ``key`` (global: the same on every rank) as a
        :func:`unit_record`: kept in memory for the consumers of the same fit
        (:func:`fresh_units`) and written to the run's store on rank 0 (:func:`per_unit_store`,
        for resume and ``report``). Returns the record."""
        rec = unit_record(key, trainer.current_epoch, trainer.global_step, kind, values, units, value)
        self._stamp(trainer)[key] = rec
        if trainer.is_global_zero:
            per_unit_store(trainer).write(rec)
        return rec

    def _stamp(self, trainer: "pl.Trainer") -> Dict[str, UnitRecord]:
        """Stamp the trainer's pass as this callback's last measurement; that pass's records."""
        if self._last[0] != _pass(trainer):
            self._last = (_pass(trainer), {})
        return self._last[1]

    def measured_now(self, trainer: "pl.Trainer") -> bool:
        """Whether this callback measured at the trainer's current pass: the one freshness rule of
        every consumer (``RegimeMonitor``, ``ICREarlyStopping``, :func:`fresh_units`). Its last
        measurement (``log_metrics`` / ``write_units``) is at the trainer's ``current_epoch`` /
        ``global_step`` -- not an earlier pass's value, still in ``callback_metrics`` between the
        passes an ``every_n_epochs`` schedule measures, nor a resumed run's ``history`` -- and
        its schedule measured this pass (two validations can share an epoch and a step)."""
        return self.schedule.fresh and self._last[0] == _pass(trainer)

    def units_now(self, trainer: "pl.Trainer") -> Dict[str, UnitRecord]:
        """The records :meth:`write_units` made at this pass (:meth:`measured_now`); {} when none."""
        return dict(self._last[1]) if self.measured_now(trainer) else {}

    def log_figure(self, trainer: "pl.Trainer", key: str, figure: Any,
                   caption: Optional[str] = None) -> Optional[str]:
        """:func:`~lightning_pfd.callbacks.figures.log_figure` (W&B image, TensorBoard, else
        ``figures/<key>-epoch<k>.png``)."""
        return log_figure(trainer, key, figure, caption)

    def _warn_nonfinite(self, trainer: "pl.Trainer", fraction: float, what: str,
                        nan_keys: List[str], fraction_key: str) -> None:
        """One warning line (rank 0), the first time this fit measures non-finite values."""
        if fraction <= 0 or self._warned_nonfinite:
            return
        self._warned_nonfinite = True
        rank_zero_warn(f"{getattr(self, 'display_name', type(self).__name__)}: non-finite {what}: {100 * fraction:.3g}% are NaN/inf "
                       f"at epoch {trainer.current_epoch} (diverged model?); logging NaN for "
                       f"{', '.join(nan_keys)} and the fraction as {fraction_key} (warned once)",
                       category=RuntimeWarning)

    # ------------------------------------------------------------------ checkpoint state
    @property
    def state_key(self) -> str:
        """``ClassName{args}`` from :meth:`_state_key_args` (the class name alone without args)."""
        args = self._state_key_args()
        return callback_state_key(self, **args) if args else type(self).__qualname__

    def state_dict(self) -> Dict[str, Any]:
        return {"history": list(self.history), **self.schedule_state(), **self._extra_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
        self._load_extra_state(state_dict)

    def schedule_state(self) -> Dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_schedule_state(self, state_dict: Dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict.get("schedule", {}))
