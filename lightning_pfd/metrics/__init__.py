from .icr import InvariantContaminationRatio, invariant_contamination_ratio  # noqa: E402
from .memorization import MemorizationRatio, memorization_ratio  # noqa: E402

__all__ = globals().get("__all__", []) + [
    "InvariantContaminationRatio", "invariant_contamination_ratio",
    "MemorizationRatio", "memorization_ratio",
]
from .pfd import ProbabilityFlowDistance, probability_flow_distance  # noqa: E402
from .bias_variance import BiasVarianceDecomposition, bias_variance_decomposition  # noqa: E402
from .descriptors import build_descriptor  # noqa: E402

__all__ = __all__ + [
    "ProbabilityFlowDistance", "probability_flow_distance",
    "BiasVarianceDecomposition", "bias_variance_decomposition", "build_descriptor",
]
from .tails import (LogAbsoluteDensityRatio, RootMeanSquaredQuantileError, loader,  # noqa: E402
                    rmsqe, same_law_floor)
from .observables import OBSERVABLES, get_observable, register_observable  # noqa: E402

__all__ = __all__ + [
    "RootMeanSquaredQuantileError", "rmsqe", "LogAbsoluteDensityRatio", "loader",
    "same_law_floor", "OBSERVABLES", "get_observable", "register_observable",
]
