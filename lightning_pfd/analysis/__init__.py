from .events import (  # noqa: E402
    Event,
    Regime,
    RunAnalysis,
    analyze_history,
    classify_regime,
    detect_double_descent,
    detect_early_learning,
    detect_icr_minimum,
    detect_memorization_onset,
)
from .history import History, load_history  # noqa: E402
from .smoothing import estimate_noise, smooth  # noqa: E402

__all__ = globals().get("__all__", []) + [
    "Event", "Regime", "RunAnalysis", "analyze_history", "classify_regime",
    "detect_double_descent", "detect_early_learning", "detect_icr_minimum",
    "detect_memorization_onset", "History", "load_history", "estimate_noise", "smooth",
]
