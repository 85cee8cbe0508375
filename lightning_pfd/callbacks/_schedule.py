"""When the measurement callbacks measure: every n-th validation pass (the first one always).

Lightning validates only at epochs with ``(epoch + 1) % check_val_every_n_epoch == 0`` (or several
times per epoch with ``val_check_interval < 1``), so a test on ``current_epoch % every_n_epochs``
can miss every validation pass. :class:`MeasurementSchedule` counts the passes instead (sanity
checks excluded) and keeps the count in the callback's ``state_dict``, so a resumed run keeps its
cadence. A fit without a validation loop (no ``validation_step`` / ``val_dataloader``,
``limit_val_batches=0``, or an empty validation set) never calls ``on_validation_epoch_end``:
:class:`ScheduledMonitor` then counts training epochs in ``on_train_epoch_end`` instead.

Outside ``fit`` (``trainer.validate``) every pass measures and the count does not move.
"""
from __future__ import annotations

from typing import Any, Dict

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

__all__ = ["MeasurementSchedule", "ScheduledMonitor", "validation_disabled"]


def validation_disabled(trainer: "pl.Trainer") -> bool:
    """True when this run has no validation loop, i.e. ``on_validation_epoch_end`` never fires."""
    if not trainer.enable_validation:  # no val data / validation_step, or limit_val_batches == 0
        return True
    nv = trainer.num_val_batches  # [] until the validation loop set its data up (then known)
    return bool(nv) and sum(nv) == 0


class MeasurementSchedule:
    """Counter of measurement opportunities ("passes"); due on every ``every_n``-th, from the first.

    Attributes:
        passes: passes counted so far this fit (saved in the owner's ``state_dict``).
        index: the index of the latest pass (0-based; -1 before any).
        fresh: whether the latest pass was due (read by :class:`ICREarlyStopping`).
    """

    def __init__(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def due(self, trainer: "pl.Trainer", every_n: int) -> bool:
        """Count one pass and say whether to measure in it. Call exactly once per pass."""
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != TrainerFn.FITTING:  # an explicit trainer.validate(): always measure
            self.index, self.fresh = self.passes, True
            return True
        self.index, self.fresh = self.passes, self.passes % every_n == 0
        self.passes += 1
        return self.fresh

    def reset(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def state_dict(self) -> Dict[str, Any]:
        return {"passes": self.passes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.passes = int(state.get("passes", 0))


class ScheduledMonitor(Callback):
    """Base of the monitors: calls ``self._measure_and_log(trainer, pl_module)`` on schedule.

    Subclasses set ``self.every_n_epochs`` (read at every pass) and implement
    ``_measure_and_log``; their ``state_dict`` should include ``schedule_state()`` and their
    ``load_state_dict`` call ``load_schedule_state(state)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.schedule = MeasurementSchedule()

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        raise NotImplementedError

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # setup() runs before a checkpoint's callback state is restored: a fresh fit starts its
        # count at 0 (first pass measured), a resumed one gets the saved count back afterwards
        if stage == "fit":
            self.schedule.reset()

    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # without a validation loop Lightning never calls on_validation_epoch_end: measure here
        if validation_disabled(trainer) and self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def schedule_state(self) -> Dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_schedule_state(self, state_dict: Dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict.get("schedule", {}))
