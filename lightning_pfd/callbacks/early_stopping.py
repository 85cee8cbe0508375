"""ICREarlyStopping: stop (after ``patience``) at the ICR minimum (Sec. 5.2 of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

In data-limited training ICR is U-shaped and its minimum precedes the rise of the memorization
ratio, so the minimum is a label-free, sampling-free early-stopping point. This is Lightning's
``EarlyStopping`` on ``icr/icr`` (mode ``min``) with

- ``smoothing`` in [0, 1): an exponential moving average s_e = a s_{e-1} + (1 - a) ICR_e is
  compared instead of the raw value (0 = no smoothing), against epoch-to-epoch estimation noise;
- ``icr/best_epoch``: the epoch of the best (smoothed) value, written to every logger and to
  ``trainer.callback_metrics`` (and ``icr/icr_smooth`` when smoothing);
- the check runs in ``on_validation_end`` (``check_on_train_epoch_end=False``), i.e. after
  ``ICRMonitor`` logged the value of the *same* epoch in ``on_validation_epoch_end``;
- the check runs only after validation passes with a *fresh* value -- Lightning keeps the last
  logged value in ``callback_metrics``, so checking after a pass without a fresh ICR would count a
  stale value as "no improvement". ``every_n_epochs=None`` with an ``ICRMonitor`` among the
  trainer's callbacks (and an ``icr/*`` monitor): exactly the passes where that monitor measured.
  Otherwise (an explicit ``every_n_epochs``, or no ICRMonitor: 1): every n-th validation pass, the
  first included -- the monitors' pass counting (:mod:`lightning_pfd.callbacks.base`), so it also
  holds with ``check_val_every_n_epoch > 1``; following an ICRMonitor also follows its ``"log"`` or
  explicit schedule (the check reads the monitor's public ``schedule.fresh``). ``patience`` counts
  checks, not epochs;
- state (wait count, best score, best epoch, EMA state) in ``state_dict`` for resume, under
  ``state_key`` = (monitor, mode) as for Lightning's EarlyStopping, so one stopper per ICR
  namespace (``ICRMonitor(name=...)``) can coexist;
- **a NaN (or inf) ICR counts as "no improvement"** **[choice]**: Lightning's
  ``EarlyStopping(check_finite=True)`` stops the run at the first non-finite value; here
  ``check_finite`` defaults to False, so a NaN ICR (``ICRMonitor`` logs NaN when the features are
  non-finite, e.g. a diverged model) adds one to the wait count, never becomes the best value
  and leaves the EMA of ``smoothing`` untouched; a run that stays non-finite stops after
  ``patience`` checks. Pass ``check_finite=True`` for Lightning's immediate stop.
  (``DiffusionModule`` has its own divergence stop on non-finite losses);
- ``dry_run=True`` **[observe mode]**: every check runs and is logged as usual, but the run is
  not stopped; the first epoch at which it *would* have stopped is kept in ``would_stop_epoch``
  and logged as ``icr/stop_epoch`` (-1 until then). This lets one run show both the stopping
  decision and what happens after it (e.g. memorization onset), with the same code path;
- ``min_rise_z`` **[significant rise]**: when set, the run stops only if, besides ``patience``
  checks without improvement, ICR now is significantly above its best value: z = (ICR_now −
  ICR_best) / se >= ``min_rise_z``, with se the *paired* delete-a-group jackknife error of the
  difference (ICRMonitor's per-unit records of both epochs in ``<default_root_dir>/per_unit``;
  without them, the unpaired sqrt(se_now² + se_best²) from ``<monitor>_se``). A rise within the
  noise keeps the run going (and is re-tested at every later check); ``icr/rise_z`` is logged;
- :meth:`ICREarlyStopping.check_setup` refuses a ``monitor`` in an ICR namespace that no
  ``ICRMonitor`` of the Trainer logs (e.g. ``icr/icr`` when the only monitor is named
  ``icr_hi``), listing the keys they do log.

Pair it with ``ModelCheckpoint(monitor="icr/icr", mode="min")`` so the checkpoint at the minimum
is kept (``lightning_pfd/callbacks_configs/representation.yaml`` does both). ``icr/best_epoch``
is written through ``logger.log_metrics`` because ``self.log`` is not allowed in
``on_validation_end``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Literal, Optional, Tuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.utilities.rank_zero import rank_prefixed_message, rank_zero_warn

from ..errors import ConfigError, renamed_fields
from ..validation import HalfOpenUnitInterval, NonNegativeFloat, PositiveInt, check_args
from .schedule import MeasurementSchedule
from .state import callback_field, callback_state_key

try:  # Lightning >= 2.5 records why a run stopped
    from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason as _REASONS
except ImportError:  # pragma: no cover - Lightning 2.4
    _REASONS = None

__all__ = ["ICREarlyStopping"]

_LOG = logging.getLogger("lightning.pytorch.callbacks.early_stopping")  # where Lightning's messages go


def _outside_fit(trainer: "pl.Trainer") -> bool:
    from lightning.pytorch.trainer.states import TrainerFn

    return trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking


class ICREarlyStopping(EarlyStopping):
    """EarlyStopping at the ICR minimum (module docstring).

    Extra args: ``smoothing`` (EMA coefficient in [0, 1)), ``every_n_epochs`` (None: follow the
    ICRMonitor that logs ``monitor``), ``dry_run`` (decide and log ``icr/stop_epoch`` but keep
    training), ``min_rise_z`` (stop only on a significant rise). Defaults differ from EarlyStopping: ``monitor="icr/icr"``,
    ``patience=5``, ``check_on_train_epoch_end=False`` and ``check_finite=False`` (a NaN ICR is
    one check without improvement; module docstring).
    """

    def __init__(self, monitor: str = "icr/icr", min_delta: NonNegativeFloat = 0.0, patience: PositiveInt = 5,
                 smoothing: HalfOpenUnitInterval = 0.0, every_n_epochs: Optional[PositiveInt] = None,
                 mode: Literal["min", "max"] = "min", verbose: bool = False,
                 strict: bool = True, check_finite: bool = False,
                 stopping_threshold: Optional[float] = None,
                 divergence_threshold: Optional[float] = None,
                 check_on_train_epoch_end: bool = False, log_rank_zero_only: bool = False,
                 dry_run: bool = False, min_rise_z: Optional[NonNegativeFloat] = None):
        field = lambda arg: callback_field(self, arg)  # noqa: E731
        with renamed_fields(field):
            check_args(ICREarlyStopping.__init__, locals())
        if not isinstance(dry_run, bool):
            raise ConfigError(field("dry_run"), "must be a bool", value=dry_run)
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(field("monitor"), "must be a logged metric name", value=monitor)
        super().__init__(monitor=monitor, min_delta=min_delta, patience=patience, verbose=verbose,
                         mode=mode, strict=strict, check_finite=check_finite,
                         stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold,
                         check_on_train_epoch_end=check_on_train_epoch_end,
                         log_rank_zero_only=log_rank_zero_only)
        self.check_on_train_epoch_end_arg = check_on_train_epoch_end
        self.check_at_train_epoch_end = bool(check_on_train_epoch_end)
        self.smoothing = float(smoothing)
        self.every_n_epochs = every_n_epochs
        self._every = every_n_epochs or 1
        self._schedule = MeasurementSchedule()  # own count of validation passes
        self._source = None  # the ICRMonitor whose fresh measurements are checked (every_n_epochs None)
        self.best_epoch = -1
        self.smoothed: Optional[float] = None
        self.dry_run = dry_run
        self.would_stop_epoch = -1  # dry_run: first epoch at which the run would have stopped
        self.min_rise_z = None if min_rise_z is None else float(min_rise_z)
        self.rise_z: Optional[float] = None
        self._best_value: Optional[float] = None
        self._best_se: Optional[float] = None

    @property
    def best_key(self) -> str:
        return self.monitor.rsplit("/", 1)[0] + "/best_epoch" if "/" in self.monitor else "best_epoch"

    @property
    def stop_key(self) -> str:
        """``icr/stop_epoch`` (dry_run): where the run would have stopped."""
        return self.monitor.rsplit("/", 1)[0] + "/stop_epoch" if "/" in self.monitor else "stop_epoch"

    def _smooth(self, raw: torch.Tensor) -> torch.Tensor:
        if self.smoothing == 0.0 or not torch.isfinite(raw):
            return raw
        value = float(raw) if self.smoothed is None else \
            self.smoothing * self.smoothed + (1 - self.smoothing) * float(raw)
        self.smoothed = value
        return torch.tensor(value, dtype=torch.float64)

    @property
    def state_key(self) -> str:
        """Lightning's EarlyStopping key (monitor, mode): one stopper per monitored ICR key."""
        return callback_state_key(self, monitor=self.monitor, mode=self.mode)

    @staticmethod
    def _icr_monitors(trainer: "pl.Trainer") -> List[Any]:
        from .icr import ICRMonitor  # the producer of icr/* metrics

        return [c for c in getattr(trainer, "callbacks", None) or [] if isinstance(c, ICRMonitor)]

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
            raise ConfigError(callback_field(self, "monitor"), "no ICRMonitor of the Trainer logs this key",
                              value=self.monitor, accepted=logged)

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        given = self.check_on_train_epoch_end_arg
        self.check_at_train_epoch_end = bool(given) if given is not None else (
            trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1)
        if stage == "fit":
            self._schedule.reset()  # a resumed run gets its count back from the checkpoint
            self.check_setup(trainer, pl_module, getattr(trainer, "datamodule", None))
        self._source = None
        if self.every_n_epochs is None:
            producers = [m for m in self._icr_monitors(trainer) if self.monitor in m.metric_names()]
            self._source = producers[0] if producers else None
            self._every = self._source.every_n_epochs if self._source is not None else 1

    def _fresh(self, trainer: "pl.Trainer") -> bool:
        """Whether this validation pass produced a fresh value (counts the pass; call once)."""
        if self._source is not None:  # its on_validation_epoch_end ran before on_validation_end
            return self._source.schedule.fresh
        return self._schedule.due(trainer, self._every)

    # -- the check: Lightning's EarlyStopping rules, on its public attributes ------------------
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.check_at_train_epoch_end and not _outside_fit(trainer):
            self.run_check(trainer)

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not self.check_at_train_epoch_end and not _outside_fit(trainer):
            self.run_check(trainer)

    def _metric_available(self, logs) -> bool:
        """The monitored value is logged; else an error (``strict``) or a warning (``verbose``)."""
        if logs.get(self.monitor) is not None:
            return True
        message = (f"Early stopping conditioned on metric `{self.monitor}` which is not available. Pass in "
                   f"or modify your `EarlyStopping` callback to use any of the following: "
                   f"`{'`, `'.join(list(logs.keys()))}`")
        if self.strict:
            raise RuntimeError(message)
        if self.verbose > 0:
            rank_zero_warn(message, category=RuntimeWarning)
        return False

    def _set_reason(self, name: str) -> None:
        if _REASONS is not None and hasattr(self, "stopping_reason"):  # Lightning >= 2.5
            self.stopping_reason = getattr(_REASONS, name)

    def stopping_decision(self, current: torch.Tensor) -> Tuple[bool, Optional[str]]:
        """(stop, message) for a new value, updating ``best_score`` / ``wait_count``: Lightning's
        EarlyStopping rules (non-finite, stopping / divergence threshold, improvement by more than
        ``min_delta``, else one more check without improvement; stop after ``patience``)."""
        order = self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            self._set_reason("NON_FINITE_METRIC")
            return True, (f"Monitored metric {self.monitor} = {current} is not finite. Previous best value "
                          f"was {self.best_score:.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and self.monitor_op(current, self.stopping_threshold):
            self._set_reason("STOPPING_THRESHOLD")
            return True, (f"Stopping threshold reached: {self.monitor} = {current} {order} "
                          f"{self.stopping_threshold}. Signaling Trainer to stop.")
        if self.divergence_threshold is not None and self.monitor_op(-current, -self.divergence_threshold):
            self._set_reason("DIVERGENCE_THRESHOLD")
            return True, (f"Divergence threshold reached: {self.monitor} = {current} {order} "
                          f"{self.divergence_threshold}. Signaling Trainer to stop.")
        if self.monitor_op(current - self.min_delta, self.best_score.to(current.device)):
            if torch.isfinite(self.best_score):
                reason = (f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >= "
                          f"min_delta = {abs(self.min_delta)}. New best score: {current:.3f}")
            else:
                reason = f"Metric {self.monitor} improved. New best score: {current:.3f}"
            self.best_score, self.wait_count = current, 0
            return False, reason
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._set_reason("PATIENCE_EXHAUSTED")
            return True, (f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} "
                          f"records. Best score: {self.best_score:.3f}. Signaling Trainer to stop.")
        return False, None

    def _info(self, trainer: "pl.Trainer", message: str) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is None or not self.log_rank_zero_only or rank == 0:
            _LOG.info(rank_prefixed_message(message, rank))

    def run_check(self, trainer: "pl.Trainer") -> None:
        """One check after a validation pass with a fresh value (module docstring)."""
        logs = trainer.callback_metrics
        if not self._fresh(trainer):  # no fresh value in this pass
            return
        if trainer.fast_dev_run or not self._metric_available(logs):
            return
        raw = logs[self.monitor].squeeze().detach().to("cpu", torch.float64)
        current = self._smooth(raw)
        before = self.best_score.clone()
        should_stop, reason = self.stopping_decision(current)
        if not torch.equal(self.best_score.to(before.dtype), before):
            self.best_epoch = trainer.current_epoch
            self._best_value, self._best_se = float(raw), self._logged_se(logs)
        if should_stop and self.min_rise_z is not None and self.wait_count >= self.patience:
            self.rise_z = self._rise_z(trainer, float(raw), logs)
            if not self.rise_z >= self.min_rise_z:  # within the noise (or unknown): keep training
                should_stop, reason = False, None
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        if self.dry_run and should_stop and self.would_stop_epoch < 0:
            self.would_stop_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
        self._publish(trainer, current)
        if self.dry_run:
            if reason and self.verbose:
                self._info(trainer, f"[dry run, not stopping] {reason}")
            return
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
        if reason and self.verbose:
            self._info(trainer, reason)

    def _logged_se(self, logs) -> Optional[float]:
        se = logs.get(self.monitor + "_se")
        return None if se is None else float(se)

    def _rise_z(self, trainer: "pl.Trainer", now: float, logs) -> float:
        """z of ICR now minus ICR at the best epoch (module docstring, ``min_rise_z``)."""
        from .base import per_unit_store

        store = per_unit_store(trainer)
        a, b = store.get(self.monitor, self.best_epoch), store.get(self.monitor, trainer.current_epoch)
        if a is not None and b is not None and a.kind == b.kind == "jackknife" and a.values.size == b.values.size:
            d = b.values - a.values
            g = d.size
            se = float((g - 1) / g * ((d - d.mean()) ** 2).sum()) ** 0.5
            diff = b.value - a.value
        else:
            se_now = self._logged_se(logs)
            if se_now is None or self._best_se is None or self._best_value is None:
                return float("nan")
            se, diff = (se_now ** 2 + self._best_se ** 2) ** 0.5, now - self._best_value
        return float("inf") if se == 0 and diff > 0 else diff / se if se > 0 else 0.0

    def _publish(self, trainer: "pl.Trainer", current: torch.Tensor) -> None:
        """icr/best_epoch (+ icr/icr_smooth, icr/rise_z) to callback_metrics and every logger."""
        metrics = {self.best_key: float(self.best_epoch)}
        if self.min_rise_z is not None and self.rise_z is not None:
            metrics[self.monitor.rsplit("/", 1)[0] + "/rise_z" if "/" in self.monitor else "rise_z"] = self.rise_z
        if self.dry_run:
            metrics[self.stop_key] = float(self.would_stop_epoch)
        if self.smoothing > 0:
            metrics[self.monitor + "_smooth"] = float(current)
        for k, v in metrics.items():
            trainer.callback_metrics[k] = torch.tensor(v)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state.update(best_epoch=self.best_epoch, smoothed=self.smoothed, smoothing=self.smoothing,
                     schedule=self._schedule.state_dict(), would_stop_epoch=self.would_stop_epoch,
                     best_value=self._best_value, best_se=self._best_se)
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.best_epoch = int(state_dict.get("best_epoch", -1))
        self.would_stop_epoch = int(state_dict.get("would_stop_epoch", -1))
        self.smoothed = state_dict.get("smoothed")
        self.smoothing = float(state_dict.get("smoothing", self.smoothing))
        self._schedule.load_state_dict(state_dict.get("schedule", {}))
        self._best_value, self._best_se = state_dict.get("best_value"), state_dict.get("best_se")
