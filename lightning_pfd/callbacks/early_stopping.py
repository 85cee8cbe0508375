"""ICREarlyStopping: stop after the ICR minimum once ICR has *significantly* risen (Sec. 5.2 of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

In data-limited training ICR is U-shaped and its minimum precedes the rise of the memorization
ratio, so the minimum is a label-free, sampling-free early-stopping point. A plain patience rule
(stop after ``patience`` checks without a new minimum) stops a run whose ICR is *flat* almost
always: every noisy value is a new chance to "not improve". So by default the run stops only when
both

1. **patience**: ``patience`` checks without an improvement of the (optionally smoothed) value by
   more than ``min_delta`` -- Lightning's ``EarlyStopping`` rule, on plain floats
   (:class:`~lightning_pfd.analysis.early_stop.PatienceRule`); and
2. **a significant rise** (``min_rise_z``, default :data:`DEFAULT_MIN_RISE_Z` = 3): the
   whole-run, selection-corrected rise test of :func:`~lightning_pfd.analysis.early_stop.rise_test`
   on the checks so far gives z >= ``min_rise_z``. The test compares the newest block of
   ``rise_window`` checks with every earlier block (every candidate minimum) using the paired
   delete-a-group jackknife replicates of ``ICRMonitor``'s measurement (its ``latest.units``, in
   memory) plus a fitted training-noise term; the Monte Carlo null of the
   largest standardized rise corrects for choosing the minimum, and a Bonferroni split over the
   run's block ends (``horizon``) for testing many times. z is on the one-sided normal scale; its
   nominal whole-run false-stop rate 1 − Φ(``min_rise_z``) assumes the fitted noise model; the
   measured rates on flat ICRs are 0/300 at z = 3 and at most 4/300 at z = 2 on each of 24 null
   families (tuning and held-out: smooth, random-walk, cyclic, jump, growing training noise), at
   the price of late stops (docs/icr.md, "ICREarlyStopping: the rise test"). It is tested at block ends only;
   a test that cannot be made (no replicates, too few checks, a zero or undefined noise
   estimate) is *undecided*: training goes on and the reason is warned once and kept in
   :attr:`ICREarlyStopping.rise_reason`.

``min_rise_z=None`` is plain patience stopping (the rule without 2.), **not error-controlled**.
``stopping_threshold`` / ``divergence_threshold`` / ``check_finite`` stop at once, as in Lightning.

Also:

- ``smoothing`` in [0, 1): an exponential moving average s_e = a s_{e-1} + (1 - a) ICR_e is
  used by the patience rule (the rise test always uses the raw values and their replicates);
- ``icr/best_epoch`` (epoch of the best value), ``icr/rise_z`` (at block ends, NaN when
  undecided), ``icr/icr_smooth`` (with smoothing) and ``icr/stop_epoch`` (``dry_run``) go to every
  logger (``logger.log_metrics``: ``self.log`` is not allowed in ``on_validation_end``) and to
  ``trainer.callback_metrics``;
- the check runs in ``on_validation_end`` (``check_on_train_epoch_end=False``), after
  ``ICRMonitor`` logged the value of the same epoch, and only after passes with a *fresh* value:
  ``every_n_epochs=None`` with an ``ICRMonitor`` logging ``monitor`` checks when that monitor
  measured at this pass (its :meth:`~lightning_pfd.callbacks.base.MeasurementCallback.measured_now`,
  the one freshness rule); otherwise every n-th validation pass
  (:mod:`lightning_pfd.callbacks.schedule`). ``patience`` and ``rise_window`` count checks;
- ``dry_run=True`` **[observe mode]**: every check runs and is logged, the run is not stopped; the
  first epoch at which it would have stopped is ``would_stop_epoch`` / ``icr/stop_epoch``;
- a NaN ICR is one check without improvement (``check_finite=False``, the default) and is left
  out of the rise test's series;
- the rise test's inputs travel in memory: at a check, the value and jackknife replicates of
  ``monitor`` are the per-unit record made at this epoch and step
  (:func:`~lightning_pfd.callbacks.base.fresh_units`: what a ``MeasurementCallback`` such as
  ``ICRMonitor`` wrote with ``write_units``, or the ``latest.units`` of another callback); without
  one, the logged value and its logged ``<monitor>_se``. The per-unit files are not read: they
  are for ``report``;
- state (patience rule, best epoch, EMA, pass count, the series of values and replicates the rise
  test reads) in ``state_dict`` under ``state_key`` = (monitor, mode), Lightning's key for its
  EarlyStopping, so a resumed run takes the same decisions as an uninterrupted one (the series
  a resume needs is in the checkpoint, nothing is read back from disk);
- several processes: every rank decides, ``trainer.strategy.reduce_boolean_decision(..., all=False)``
  stops all when one does (Lightning's rule); the measurement is the same on every rank (its
  values are global), so every rank runs the same rise test;
- :meth:`ICREarlyStopping.check_setup` refuses a ``monitor`` in an ICR namespace that no
  ``ICRMonitor`` of the Trainer logs, listing the keys they do log.

Pair it with ``ModelCheckpoint(monitor="icr/icr", mode="min")`` so the checkpoint at the minimum
is kept (``lightning_pfd/configs/callbacks/representation.yaml`` does both).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Literal, Optional, Tuple

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_prefixed_message, rank_zero_info, rank_zero_warn

from ..analysis.early_stop import DEFAULT_NOISE_WINDOW, DEFAULT_WINDOW, PatienceRule, RiseTest, rise_test
from ..errors import ConfigError
from ..validation import HalfOpenUnitInterval, NonNegativeFloat, NonNegativeInt, PositiveInt, check_args
from .base import fresh_units
from .schedule import MeasurementSchedule
from .state import callback_state_key

try:  # newer Lightning names why a run stopped; the same names and values otherwise
    from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
except ImportError:  # pragma: no cover - Lightning 2.5.3 (the oldest supported)
    import enum

    class EarlyStoppingReason(enum.Enum):
        """Why the run stopped (Lightning's ``EarlyStoppingReason`` where it exists)."""

        NOT_STOPPED = 0
        STOPPING_THRESHOLD = 1
        DIVERGENCE_THRESHOLD = 2
        PATIENCE_EXHAUSTED = 3
        NON_FINITE_METRIC = 4


__all__ = ["ICREarlyStopping", "DEFAULT_MIN_RISE_Z", "DEFAULT_HORIZON"]

#: the default whole-run z of the rise test (1 − Φ(3) = 0.13 % nominal false stops)
DEFAULT_MIN_RISE_Z = 3.0
#: checks assumed for the Bonferroni split when the Trainer has no finite max_epochs
DEFAULT_HORIZON = 1000

_LOG = logging.getLogger("lightning.pytorch.callbacks.early_stopping")  # where Lightning's messages go


def _outside_fit(trainer: "pl.Trainer") -> bool:
    return trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking


class ICREarlyStopping(Callback):
    """Early stopping at the ICR minimum after a significant rise (module docstring).

    Args (Lightning's EarlyStopping names, defaults ``monitor="icr/icr"``, ``patience=5``,
    ``check_on_train_epoch_end=False``, ``check_finite=False``): ``monitor``, ``min_delta``,
    ``patience``, ``mode``, ``verbose``, ``strict``, ``check_finite``, ``stopping_threshold``,
    ``divergence_threshold``, ``check_on_train_epoch_end``, ``log_rank_zero_only``; and
    ``smoothing`` (EMA coefficient in [0, 1)), ``every_n_epochs`` (None: follow the ICRMonitor
    that logs ``monitor``), ``dry_run`` (decide and log ``icr/stop_epoch`` but keep training),
    ``min_rise_z`` (whole-run z of the rise test; None: plain patience, not error-controlled),
    ``rise_window`` (checks per block of the rise test), ``horizon`` (checks in the run for the
    Bonferroni split; None: from the Trainer's ``max_epochs`` and the schedule), ``seed`` (of the
    test's Monte Carlo draws).
    """

    def __init__(self, monitor: str = "icr/icr", min_delta: NonNegativeFloat = 0.0, patience: PositiveInt = 5,
                 smoothing: HalfOpenUnitInterval = 0.0, every_n_epochs: Optional[PositiveInt] = None,
                 mode: Literal["min", "max"] = "min", verbose: bool = False,
                 strict: bool = True, check_finite: bool = False,
                 stopping_threshold: Optional[float] = None,
                 divergence_threshold: Optional[float] = None,
                 check_on_train_epoch_end: Optional[bool] = False, log_rank_zero_only: bool = False,
                 dry_run: bool = False, min_rise_z: Optional[NonNegativeFloat] = DEFAULT_MIN_RISE_Z,
                 rise_window: PositiveInt = DEFAULT_WINDOW, horizon: Optional[PositiveInt] = None,
                 seed: NonNegativeInt = 0):
        check_args(ICREarlyStopping.__init__, locals())
        if not isinstance(dry_run, bool):
            raise ConfigError("dry_run", "must be a bool", value=dry_run)
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError("monitor", "must be a logged metric name", value=monitor)
        super().__init__()
        self.monitor, self.mode, self.patience = monitor, mode, int(patience)
        self.min_delta, self.verbose, self.strict = float(min_delta), verbose, strict
        self.check_finite, self.log_rank_zero_only = check_finite, log_rank_zero_only
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_on_train_epoch_end_arg = check_on_train_epoch_end
        self.check_at_train_epoch_end = bool(check_on_train_epoch_end)
        self.smoothing = float(smoothing)
        self.every_n_epochs = every_n_epochs
        self.dry_run = dry_run
        self.min_rise_z = None if min_rise_z is None else float(min_rise_z)
        self.rise_window, self.horizon, self.seed = int(rise_window), horizon, int(seed)
        self._rule = self._new_rule()
        self._every = every_n_epochs or 1
        self._schedule = MeasurementSchedule()  # own count of validation passes
        self._source = None  # the ICRMonitor whose fresh measurements are checked (every_n_epochs None)
        self._horizon = horizon or DEFAULT_HORIZON  # resolved in setup
        self._warned: set = set()
        self._reset_run()

    def _new_rule(self) -> PatienceRule:
        return PatienceRule(self.monitor, self.mode, self.min_delta, self.patience, self.check_finite,
                            self.stopping_threshold, self.divergence_threshold)

    def _reset_run(self) -> None:
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: Optional[str] = None
        self.best_epoch = -1
        self.smoothed: Optional[float] = None
        self.would_stop_epoch = -1  # dry_run: first epoch at which the run would have stopped
        self.rise_z: Optional[float] = None
        self.rise_reason = ""
        self.last_test: Optional[RiseTest] = None
        # the rise test's series: one entry per check with a finite value
        self.series_epochs: List[int] = []
        self.series_values: List[float] = []
        self.series_reps: List[Optional[List[float]]] = []
        self.series_se: List[Optional[float]] = []

    # ------------------------------------------------------------------ Lightning-compatible view
    @property
    def wait_count(self) -> int:
        return self._rule.wait_count

    @property
    def best_score(self) -> torch.Tensor:
        return torch.tensor(self._rule.best)

    @property
    def state_key(self) -> str:
        """Lightning's EarlyStopping key (monitor, mode): one stopper per monitored ICR key."""
        return callback_state_key(self, monitor=self.monitor, mode=self.mode)

    def _key(self, leaf: str) -> str:
        return self.monitor.rsplit("/", 1)[0] + "/" + leaf if "/" in self.monitor else leaf

    @property
    def best_key(self) -> str:
        return self._key("best_epoch")

    @property
    def stop_key(self) -> str:
        """``icr/stop_epoch`` (dry_run): where the run would have stopped."""
        return self._key("stop_epoch")

    @property
    def rise_key(self) -> str:
        return self._key("rise_z")

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _icr_monitors(trainer: "pl.Trainer") -> List[Any]:
        from .presets import preset_of  # the producers of icr/* metrics

        return [c for c in getattr(trainer, "callbacks", None) or [] if preset_of(c, "ICRMonitor")]

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", datamodule: Any) -> None:
        """Refuse a ``monitor`` in an ICR namespace (``icr/...`` or an ICRMonitor's ``name``)
        that none of the Trainer's ICRMonitors logs; without ICRMonitor nothing is checked (the
        value may come from elsewhere)."""
        monitors = self._icr_monitors(trainer)
        if not monitors or "/" not in self.monitor:
            return
        namespace = self.monitor.split("/", 1)[0]
        logged = sorted({k for m in monitors for k in m.metric_names()})
        if namespace in {"icr"} | {m.name for m in monitors} and self.monitor not in logged:
            raise ConfigError("monitor", "no ICRMonitor of the Trainer logs this key",
                              value=self.monitor, accepted=logged)

    def _resolve_horizon(self, trainer: "pl.Trainer") -> int:
        """Checks this fit will make: the due passes among ``max_epochs // check_val_every_n_epoch``."""
        if self.horizon is not None:
            return int(self.horizon)
        epochs = getattr(trainer, "max_epochs", None)
        if epochs is None or epochs < 0:
            return DEFAULT_HORIZON
        passes = max(1, int(epochs) // max(1, int(getattr(trainer, "check_val_every_n_epoch", 1) or 1)))
        sched, every = (self._source.schedule, self._source.every_n_epochs) if self._source is not None \
            else (self._schedule, self._every)
        return max(1, sum(sched.is_due(i, every) for i in range(passes)))

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        given = self.check_on_train_epoch_end_arg
        self.check_at_train_epoch_end = bool(given) if given is not None else (
            trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1)
        self._source = None
        if self.every_n_epochs is None:
            producers = [m for m in self._icr_monitors(trainer) if self.monitor in m.metric_names()]
            self._source = producers[0] if producers else None
            self._every = self._source.every_n_epochs if self._source is not None else 1
        if stage == "fit":  # a resumed run gets its state back from the checkpoint afterwards
            self._schedule.reset()
            self._rule = self._new_rule()
            self._warned = set()
            self._reset_run()
            self._horizon = self._resolve_horizon(trainer)
            self.check_setup(trainer, pl_module, getattr(trainer, "datamodule", None))

    def _fresh(self, trainer: "pl.Trainer") -> bool:
        """Whether this validation pass produced a fresh value (counts the pass; call once)."""
        if self._source is not None:  # its on_validation_epoch_end ran before on_validation_end
            return self._source.measured_now(trainer)
        return self._schedule.due(trainer, self._every)

    def _units_now(self, trainer: "pl.Trainer") -> Any:
        """The :class:`~lightning_pfd.analysis.per_unit.UnitRecord` of ``monitor`` measured at this
        pass, in memory (:func:`~lightning_pfd.callbacks.base.fresh_units`); None without one."""
        return fresh_units(trainer).get(self.monitor)

    # ------------------------------------------------------------------ hooks
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.check_at_train_epoch_end and not _outside_fit(trainer):
            self.run_check(trainer)

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not self.check_at_train_epoch_end and not _outside_fit(trainer):
            self.run_check(trainer)

    # ------------------------------------------------------------------ the decision
    def stopping_decision(self, current: Any) -> Tuple[bool, Optional[str]]:
        """The patience rule on one (smoothed) value: ``(stop, message)`` (Lightning's
        EarlyStopping criteria, :class:`~lightning_pfd.analysis.early_stop.PatienceRule`)."""
        stop, reason, message = self._rule.update(float(current))
        if reason is not None:
            self.stopping_reason = EarlyStoppingReason[reason]
        return stop, message

    def _metric_available(self, logs) -> bool:
        if logs.get(self.monitor) is not None:
            return True
        message = (f"Early stopping conditioned on metric `{self.monitor}` which is not available. Pass in "
                   f"or modify your `EarlyStopping` callback to use any of the following: "
                   f"`{'`, `'.join(list(logs.keys()))}`")
        if self.strict:
            raise RuntimeError(message)
        if self.verbose:
            rank_zero_warn(message, category=RuntimeWarning)
        return False

    def _smooth(self, raw: float) -> float:
        if self.smoothing == 0.0 or not math.isfinite(raw):
            return raw
        self.smoothed = raw if self.smoothed is None else self.smoothing * self.smoothed + (1 - self.smoothing) * raw
        return self.smoothed

    def _record(self, trainer: "pl.Trainer", raw: float) -> None:
        """Append this check to the rise test's series: the value and jackknife replicates of this
        pass's measurement (in memory), else the logged value and its logged ``<monitor>_se`` if any."""
        value, reps = raw, None
        se = trainer.callback_metrics.get(self.monitor + "_se")
        se = None if se is None else float(se)
        rec = self._units_now(trainer)
        if rec is not None and rec.kind == "jackknife" and math.isfinite(rec.value):
            value, reps = float(rec.value), [float(v) for v in rec.values]
        if not math.isfinite(value) or (reps is not None and not all(map(math.isfinite, reps))):
            return  # a non-finite check is left out of the series
        self.series_epochs.append(int(trainer.current_epoch))
        self.series_values.append(value)
        self.series_reps.append(reps)
        self.series_se.append(se if se is not None and math.isfinite(se) else None)

    def rise(self) -> RiseTest:
        """The rise test on the series so far (:func:`~lightning_pfd.analysis.early_stop.rise_test`)."""
        n = len(self.series_values)
        reps = None
        if n and all(r is not None for r in self.series_reps) and len({len(r) for r in self.series_reps}) == 1:
            reps = np.array(self.series_reps, dtype=np.float64)
        se = None
        if reps is None and n and all(v is not None for v in self.series_se):
            se = self.series_se  # unpaired: independent errors (conservative for a fixed image subset)
        elif reps is None and n and n % self.rise_window == 0:
            return RiseTest(True, reason=f"no jackknife replicates of {self.monitor} for every check (ICRMonitor "
                                         "measures them): undecided")
        return rise_test(self.series_values, reps, se, horizon=self._horizon, window=self.rise_window, mode=self.mode,
                         noise_window=DEFAULT_NOISE_WINDOW, seed=self.seed, min_z=self.min_rise_z)

    def run_check(self, trainer: "pl.Trainer") -> None:
        """One check after a validation pass with a fresh value (module docstring)."""
        logs = trainer.callback_metrics
        if not self._fresh(trainer):  # no fresh value in this pass
            return
        if trainer.fast_dev_run or not self._metric_available(logs):
            return
        raw = float(logs[self.monitor].squeeze().detach().to("cpu", torch.float64))
        current = self._smooth(raw)
        before = self._rule.best
        should_stop, message = self.stopping_decision(current)
        if self._rule.best != before:
            self.best_epoch = trainer.current_epoch
        tested = False
        if self.min_rise_z is not None:
            self._record(trainer, raw)
            test = self.rise()
            if test.tested:
                tested, self.last_test = True, test
                self.rise_z, self.rise_reason = test.z, test.reason
            if should_stop and self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
                if not (test.tested and test.significant(self.min_rise_z)):
                    should_stop, message = False, None
                    why = test.reason if test.tested and not test.decided else ""
                    if why and why not in self._warned:
                        self._warned.add(why)
                        rank_zero_warn(f"ICREarlyStopping({self.monitor}): patience exhausted at epoch "
                                       f"{trainer.current_epoch} but the rise test cannot decide ({why}); training goes on",
                                       category=RuntimeWarning)
                else:
                    message = (f"{message} The rise over the minimum (checks {test.minimum[0]}-"
                               f"{test.minimum[1]}) has whole-run z = {test.z:.2f} >= {self.min_rise_z}.")
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        if self.dry_run and should_stop and self.would_stop_epoch < 0:
            self.would_stop_epoch = trainer.current_epoch
            self.stopping_reason_message = message
        self._publish(trainer, current, tested)
        if self.dry_run:
            if message and self.verbose:
                self._info(trainer, f"[dry run, not stopping] {message}")
            return
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = message
        if message and self.verbose:
            self._info(trainer, message)

    def _info(self, trainer: "pl.Trainer", message: str) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is None or not self.log_rank_zero_only or rank == 0:
            _LOG.info(rank_prefixed_message(message, rank))

    def _publish(self, trainer: "pl.Trainer", current: float, tested: bool) -> None:
        """icr/best_epoch (+ icr/rise_z, icr/stop_epoch, icr/icr_smooth) to callback_metrics and every logger."""
        metrics = {self.best_key: float(self.best_epoch)}
        if tested:
            metrics[self.rise_key] = float(self.rise_z)
        if self.dry_run:
            metrics[self.stop_key] = float(self.would_stop_epoch)
        if self.smoothing > 0:
            metrics[self.monitor + "_smooth"] = float(current)
        for k, v in metrics.items():
            trainer.callback_metrics[k] = torch.tensor(v)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> Dict[str, Any]:
        return {"wait_count": self._rule.wait_count, "best_score": torch.tensor(self._rule.best),
                "patience": self.patience, "stopped_epoch": self.stopped_epoch,
                "stopping_reason": self.stopping_reason.value, "stopping_reason_message": self.stopping_reason_message,
                "best_epoch": self.best_epoch, "smoothed": self.smoothed, "smoothing": self.smoothing,
                "schedule": self._schedule.state_dict(), "would_stop_epoch": self.would_stop_epoch,
                "rise_z": self.rise_z, "series_epochs": list(self.series_epochs),
                "series_values": list(self.series_values), "series_se": list(self.series_se),
                "series_reps": [None if r is None else list(r) for r in self.series_reps]}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the rule's state. Unlike Lightning's ``EarlyStopping`` (which replaces the
        configured ``patience`` by the checkpoint's), the configured ``patience`` applies, like
        any other changed setting on resume, and a difference is printed; the saved wait count
        is kept. The state key is this class's own (``ICREarlyStopping{monitor, mode}``), so an
        ``EarlyStopping`` entry of another run is never read as this rule's state."""
        saved = state_dict.get("patience")
        if saved is not None and int(saved) != self.patience:
            rank_zero_info(f"[lightning_pfd] ICREarlyStopping({self.monitor}): resuming with patience "
                           f"{self.patience} (the checkpoint had {int(saved)}); the wait count "
                           f"{int(state_dict['wait_count'])} is kept")
        self._rule.load_state_dict({"best": float(state_dict["best_score"]), "wait_count": state_dict["wait_count"]})
        self.stopped_epoch = int(state_dict.get("stopped_epoch", 0))
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")
        self.best_epoch = int(state_dict.get("best_epoch", -1))
        self.would_stop_epoch = int(state_dict.get("would_stop_epoch", -1))
        self.smoothed = state_dict.get("smoothed")
        self.smoothing = float(state_dict.get("smoothing", self.smoothing))
        self._schedule.load_state_dict(state_dict.get("schedule", {}))
        self.rise_z = state_dict.get("rise_z")
        self.series_epochs = [int(e) for e in state_dict.get("series_epochs", [])]
        self.series_values = [float(v) for v in state_dict.get("series_values", [])]
        self.series_reps = [None if r is None else [float(x) for x in r] for r in state_dict.get("series_reps", [])]
        self.series_se = list(state_dict.get("series_se", [None] * len(self.series_values)))
