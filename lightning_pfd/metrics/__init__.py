"""torchmetrics-style metrics and their functional twins (no Lightning import)."""
from .bias_variance import BiasVarianceDecomposition, bias_variance_decomposition
from .descriptors import build_descriptor
from .icr import InvariantContaminationRatio, invariant_contamination_ratio
from .memorization import MemorizationRatio, memorization_ratio
from .observables import OBSERVABLES, get_observable, register_observable
from .pfd import ProbabilityFlowDistance, probability_flow_distance
from .tails import LogAbsoluteDensityRatio, RootMeanSquaredQuantileError, loader, rmsqe, same_law_floor
from .tails import loader_settings, matched_score, reference_splits

__all__ = [
    "ProbabilityFlowDistance", "probability_flow_distance",
    "BiasVarianceDecomposition", "bias_variance_decomposition", "build_descriptor",
    "InvariantContaminationRatio", "invariant_contamination_ratio",
    "MemorizationRatio", "memorization_ratio",
    "RootMeanSquaredQuantileError", "rmsqe", "LogAbsoluteDensityRatio", "loader", "same_law_floor",
    "matched_score", "loader_settings", "reference_splits",
    "OBSERVABLES", "get_observable", "register_observable",
]
