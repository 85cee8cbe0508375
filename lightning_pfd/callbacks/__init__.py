"""Lightning glue: when to measure, caching, logging, events, early stopping."""
from .base import MeasurementCallback
from .checkpoint import EpochCheckpoint
from .early_stopping import ICREarlyStopping
from .monitor import EvaluationMonitor
from .presets import GeneralizationMonitor, ICRMonitor, MemorizationMonitor, TailMonitor
from .progress import PFDProgressBar
from .regime import RegimeMonitor
from .wandb_setup import (AutoWandbLogger, LogConfigCallback, WandbMetricsSetup, default_wandb_logger,
                          logger_offline_if_no_credentials, setup_wandb_metrics)

__all__ = [
    "MeasurementCallback", "EvaluationMonitor", "EpochCheckpoint",
    "GeneralizationMonitor", "ICRMonitor", "MemorizationMonitor", "ICREarlyStopping", "TailMonitor",
    "RegimeMonitor", "PFDProgressBar", "AutoWandbLogger", "LogConfigCallback", "WandbMetricsSetup",
    "default_wandb_logger", "logger_offline_if_no_credentials", "setup_wandb_metrics",
]
