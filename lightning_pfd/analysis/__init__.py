"""Pure numpy/matplotlib analysis: smoothing, event detection, histories, plots, reports."""
from .events import (Event, Regime, RunAnalysis, analyze_history, classify_regime, detect_double_descent,
                     detect_early_learning, detect_icr_minimum, detect_memorization_onset)
from .detectors import register_detector
from .history import History, load_history
from .smoothing import estimate_noise, smooth

__all__ = [
    "Event", "Regime", "RunAnalysis", "analyze_history", "classify_regime",
    "detect_double_descent", "detect_early_learning", "detect_icr_minimum",
    "detect_memorization_onset", "History", "load_history", "estimate_noise", "smooth",
    "register_detector",
]
