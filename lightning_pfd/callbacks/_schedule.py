"""Compatibility re-export: the schedule and the monitor helpers live in :mod:`.base`.

``ScheduledMonitor`` is :class:`~lightning_pfd.callbacks.base.MeasurementCallback`; import from
``lightning_pfd.callbacks.base`` in new code.
"""
from .base import (SIGMA_SPACE_MODULES, MeasurementCallback, MeasurementSchedule, callback_field,
                   check_metric_prefix, check_unique_metric_names, global_sum, require_train_data,
                   validation_disabled)

ScheduledMonitor = MeasurementCallback

__all__ = ["MeasurementSchedule", "ScheduledMonitor", "validation_disabled", "callback_field",
           "global_sum", "check_unique_metric_names", "check_metric_prefix", "require_train_data",
           "SIGMA_SPACE_MODULES"]
