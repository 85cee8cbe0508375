from .early_stopping import ICREarlyStopping  # noqa: E402
from .icr import ICRMonitor  # noqa: E402
from .memorization import MemorizationMonitor  # noqa: E402

__all__ = globals().get("__all__", []) + ["ICRMonitor", "MemorizationMonitor", "ICREarlyStopping"]
from .generalization import GeneralizationMonitor  # noqa: E402

__all__ = __all__ + ["GeneralizationMonitor"]
from .progress import PFDProgressBar  # noqa: E402
from .regime import RegimeMonitor  # noqa: E402
from .wandb_setup import (  # noqa: E402
    AutoWandbLogger,
    LogConfigCallback,
    WandbMetricsSetup,
    default_wandb_logger,
    logger_offline_if_no_credentials,
    setup_wandb_metrics,
)

__all__ = __all__ + ["RegimeMonitor", "PFDProgressBar", "AutoWandbLogger", "LogConfigCallback",
                     "WandbMetricsSetup", "default_wandb_logger",
                     "logger_offline_if_no_credentials", "setup_wandb_metrics"]
from .tail import TailMonitor  # noqa: E402

__all__ = __all__ + ["TailMonitor"]
