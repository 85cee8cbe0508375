"""When the monitors measure: the pass schedules of
:class:`~lightning_pfd.callbacks.base.MeasurementCallback` and :class:`~lightning_pfd.callbacks.ICREarlyStopping`.

Measurements happen at *passes*: validation passes of ``fit`` (sanity checks excluded; several per
epoch with ``val_check_interval < 1``), or training epochs when the fit has no validation loop (no
``validation_step`` / ``val_dataloader``, ``limit_val_batches=0``, an empty validation set:
Lightning then never calls ``on_validation_epoch_end``). Counting passes rather than testing
``current_epoch % n`` matters: Lightning validates only at epochs with ``(epoch + 1) %
check_val_every_n_epoch == 0``, which an epoch test can miss every time. Pass ``i`` (0-based) is
measured when

- ``schedule="every_n_epochs"`` (default): ``i % every_n_epochs == 0``;
- ``schedule="log"``: ``i`` is in :func:`log_schedule`, i.e. ``i = 0`` or ``i = round(√2^k)``
  for an integer ``k >= 0`` (round half up; duplicates dropped): 0, 1, 2, 3, 4, 6, 8, 11, 16,
  23, 32, 45, 64, 91, 128, 181, 256, 362, 512, … — about two measurements per doubling of the
  pass count, dense where early learning happens and sparse over a long double descent (18
  measurements in 500 passes); ``every_n_epochs`` is ignored;
- ``schedule=[i0, i1, ...]``: exactly the listed pass indices (integers >= 0, no duplicates, any
  order); ``every_n_epochs`` is ignored.

With validation every epoch (the default) or no validation loop, pass ``i`` is epoch ``i``. The
pass count is saved in the owner's ``state_dict``, so a resumed run continues the same sequence.
Outside ``fit`` (an explicit ``trainer.validate``) every pass measures and the count does not move.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple, Union

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from ..errors import ConfigError

__all__ = ["SCHEDULES", "ScheduleSpec", "MeasurementSchedule", "log_schedule", "is_log_pass",
           "check_schedule"]

#: the named schedules (an explicit list of pass indices is the third form)
SCHEDULES = ("every_n_epochs", "log")

ScheduleSpec = Union[str, Sequence[int]]


def _log_pass(k: int) -> int:
    """round(√2^k), round half up (√2^k is an integer for even k, irrational for odd k)."""
    return int(math.floor(math.sqrt(2.0) ** k + 0.5)) if k % 2 else 2 ** (k // 2)


def log_schedule(limit: int) -> List[int]:
    """The ``"log"`` schedule's pass indices below ``limit``: 0 and round(√2^k), k = 0, 1, …
    (deduplicated, increasing)."""
    out, k = [0] if limit > 0 else [], 0
    while True:
        i = _log_pass(k)
        if i >= limit:
            return out
        if i != out[-1]:
            out.append(i)
        k += 1


def is_log_pass(index: int) -> bool:
    """Whether pass ``index`` is in the ``"log"`` schedule."""
    if index < 0:
        return False
    if index == 0:
        return True
    k = max(0, int(2 * math.log2(index)) - 2)  # round(√2^k) ≈ index near k = 2·log2(index)
    while _log_pass(k) <= index:
        if _log_pass(k) == index:
            return True
        k += 1
    return False


def check_schedule(schedule: Any, every_n_epochs: Any) -> Tuple[Union[str, Tuple[int, ...]], int]:
    """Validate ``schedule`` / ``every_n_epochs``: ``(schedule, every_n_epochs)`` with an explicit
    list as a sorted tuple; else ConfigError naming the argument."""
    if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
        raise ConfigError("every_n_epochs", "must be an integer >= 1",
                          value=every_n_epochs, accepted="an integer >= 1")
    accepted = "'every_n_epochs', 'log', or a list of pass indices (integers >= 0)"
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ConfigError("schedule", "unknown schedule", value=schedule,
                              accepted=list(SCHEDULES),
                              suggestion=None if schedule.strip() else accepted)
        return schedule, every_n_epochs
    if isinstance(schedule, (list, tuple)):
        if not schedule:
            raise ConfigError("schedule", "an explicit schedule needs at "
                              "least one pass index", value=list(schedule), accepted=accepted)
        bad = [i for i in schedule if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ConfigError("schedule", f"pass indices must be integers "
                              f">= 0, got {bad[:3]}", value=list(schedule), accepted=accepted)
        dup = sorted({i for i in schedule if list(schedule).count(i) > 1})
        if dup:
            raise ConfigError("schedule", f"pass indices listed twice: "
                              f"{dup[:3]}", value=list(schedule), accepted=accepted)
        return tuple(sorted(schedule)), every_n_epochs
    raise ConfigError("schedule", "must be a schedule name or a list",
                      value=schedule, accepted=accepted)


class MeasurementSchedule:
    """Counter of measurement opportunities ("passes") and the rule that picks the measured ones.

    Args:
        kind: ``"every_n_epochs"``, ``"log"`` or a tuple of pass indices (validated by
            :func:`check_schedule`).

    Attributes:
        passes: passes counted so far this fit (saved in the owner's ``state_dict``).
        index: the index of the latest pass (0-based; -1 before any).
        fresh: whether the latest pass was due (read by the consumers' one freshness rule,
            :meth:`~lightning_pfd.callbacks.base.MeasurementCallback.measured_now`).
    """

    def __init__(self, kind: Union[str, Tuple[int, ...]] = "every_n_epochs") -> None:
        self.kind = kind
        self._listed = frozenset(kind) if isinstance(kind, tuple) else None
        self.passes, self.index, self.fresh = 0, -1, False

    def is_due(self, index: int, every_n: int = 1) -> bool:
        """Whether pass ``index`` is measured (``every_n``: for ``"every_n_epochs"``)."""
        if self._listed is not None:
            return index in self._listed
        if self.kind == "log":
            return is_log_pass(index)
        return index % every_n == 0

    def due(self, trainer: "pl.Trainer", every_n: int = 1) -> bool:
        """Count one pass and say whether to measure in it. Call exactly once per pass."""
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != TrainerFn.FITTING:  # an explicit trainer.validate(): always measure
            self.index, self.fresh = self.passes, True
            return True
        self.index, self.fresh = self.passes, self.is_due(self.passes, every_n)
        self.passes += 1
        return self.fresh

    def reset(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def state_dict(self) -> Dict[str, Any]:
        return {"passes": self.passes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.passes = int(state.get("passes", 0))
