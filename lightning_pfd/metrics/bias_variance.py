"""Bias-variance decomposition of the generalization error ("Understanding Generalization in
Diffusion Distillation via Probability Flow Distance", Def. 3, eq. 9, 45).

With K students trained on independent data sets and the mean map
m(x_T) = (1/K) sum_k Psi(Phi_{theta_k}(x_T)) (eq. 45 uses K = 2):

    E_bias = ( E_x ||Psi(Phi_data(x_T)) - m(x_T)||^2 )^{1/2}
    E_var  = (1/K) sum_k E_x ||Psi(Phi_{theta_k}(x_T)) - m(x_T)||^2
    (1/K) sum_k E_gen(theta_k)^2 = E_bias^2 + E_var        (eq. 9, exact on the sample)

These are the paper's plug-in estimates (``correction="plug_in"``, the default). With m the
mean of K students drawn independently, E[E_var] = (K-1)/K Var and E[E_bias^2] = Bias^2 + Var/K
(Var = E||Psi_k - E Psi_k||^2, the variance over training sets), so at K = 2 the plug-in E_bias^2
carries half of the variance. ``correction="unbiased"`` (a named variant) reports
E_var' = K/(K-1) E_var and E_bias'^2 = E_bias^2 - E_var/(K-1), unbiased for Var and Bias^2; the
identity still holds (E_bias'^2 + E_var' = E_bias^2 + E_var), and E_bias'^2 can be negative on a
sample (``e_bias`` is then 0; ``e_bias_sq`` keeps the sign).

The class and its functional twin share :func:`_bias_variance_update` (float64 sums of one batch
of features) and :func:`_bias_variance_compute` (the decomposition from the summed states).
"""
from __future__ import annotations

from typing import Dict, Literal, Tuple

import torch
from torchmetrics import Metric

from ..validation import PositiveInt, check_args
from .descriptors import build_descriptor

__all__ = ["BiasVarianceDecomposition", "bias_variance_decomposition", "CORRECTIONS"]

#: the estimates of Def. 3: the paper's plug-in (default) or unbiased for Bias^2 and Var
Correction = Literal["plug_in", "unbiased"]
CORRECTIONS = ("plug_in", "unbiased")


def _check_shapes(reference: torch.Tensor, students: torch.Tensor, num_students: int) -> None:
    if students.shape != (num_students, *reference.shape):
        raise ValueError(f"student_endpoints: expected shape {(num_students, *reference.shape)} "
                         f"(K={num_students} students x reference shape), got {tuple(students.shape)}")


def _bias_variance_update(reference_features: torch.Tensor, student_features: torch.Tensor
                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Sums of one batch: (sum ||ref - m||^2, (1/K) sum_k ||stu_k - m||^2, per-student
    sum ||stu_k - ref||^2 (K,), B) from features ``(B, F)`` and ``(K, B, F)`` (eq. 45)."""
    ref = reference_features.to(torch.float64)
    stu = student_features.to(device=ref.device, dtype=torch.float64)
    mean = stu.mean(0)  # m(x_T), eq. 45
    return ((ref - mean).square().sum(), (stu - mean).square().sum() / stu.shape[0],
            (stu - ref).square().sum((1, 2)), int(ref.shape[0]))


def _bias_variance_compute(bias_sq_sum: torch.Tensor, var_sum: torch.Tensor, gen_sq_sum: torch.Tensor,
                           count, correction: str = "plug_in") -> Dict[str, torch.Tensor]:
    """``{"e_bias", "e_bias_sq", "e_var", "e_gen_sq_mean", "e_gen"}`` from the summed states
    (Def. 3), plug-in or unbiased (module docstring)."""
    gen_sq = gen_sq_sum / count
    bias_sq, var = bias_sq_sum / count, var_sum / count
    if correction == "unbiased":
        k = gen_sq_sum.shape[0]
        bias_sq, var = bias_sq - var / (k - 1), var * k / (k - 1)
    return {"e_bias": bias_sq.clamp_min(0.0).sqrt(), "e_bias_sq": bias_sq, "e_var": var,
            "e_gen_sq_mean": gen_sq.mean(), "e_gen": gen_sq.sqrt()}


def _features(descriptor, reference_endpoints: torch.Tensor, student_endpoints: torch.Tensor):
    """Psi of the reference (B, F) and of the K students (K, B, F)."""
    K, B = student_endpoints.shape[0], reference_endpoints.shape[0]
    ref = descriptor(reference_endpoints).reshape(B, -1)
    stu = descriptor(student_endpoints.reshape(K * B, *reference_endpoints.shape[1:])).reshape(K, B, -1)
    return ref, stu


class BiasVarianceDecomposition(Metric):
    """E_bias, E_var and mean E_gen^2 over K students on shared noise (Def. 3).

    ``update(reference_endpoints (B, ...), student_endpoints (K, B, ...))``: row i of every tensor
    comes from the same x_T^(i). States are float64 sums (exact under DDP). ``compute()`` returns
    ``{"e_bias", "e_var", "e_gen_sq_mean", "e_gen"}`` where ``e_gen`` holds the K individual
    E_gen(theta_k) = PFD(p_theta_k, p_data), and ``e_bias_sq`` = E_bias^2. Note E_var is a squared
    quantity, as in the paper. ``correction``: ``"plug_in"`` (the paper's eq. 45, default) or
    ``"unbiased"`` (needs K >= 2; module docstring).
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, num_students: PositiveInt, descriptor=None, correction: Correction = "plug_in", **kwargs):
        check_args(BiasVarianceDecomposition.__init__, locals())
        _check_correction(correction, num_students)
        super().__init__(**kwargs)
        self.num_students = int(num_students)
        self.correction = correction
        self.descriptor = build_descriptor(descriptor)
        z = lambda *s: torch.zeros(s, dtype=torch.float64)  # noqa: E731
        self.add_state("bias_sq_sum", z(), dist_reduce_fx="sum")
        self.add_state("var_sum", z(), dist_reduce_fx="sum")
        self.add_state("gen_sq_sum", z(self.num_students), dist_reduce_fx="sum")
        self.add_state("count", z(), dist_reduce_fx="sum")

    def update(self, reference_endpoints: torch.Tensor, student_endpoints: torch.Tensor) -> None:
        _check_shapes(reference_endpoints, student_endpoints, self.num_students)
        bias_sq, var, gen_sq, count = _bias_variance_update(
            *_features(self.descriptor, reference_endpoints, student_endpoints))
        self.bias_sq_sum += bias_sq.to(self.bias_sq_sum.device)
        self.var_sum += var.to(self.var_sum.device)
        self.gen_sq_sum += gen_sq.to(self.gen_sq_sum.device)
        self.count += count

    def compute(self) -> Dict[str, torch.Tensor]:
        if float(self.count) == 0:  # NaN before any update (torchmetrics warns), as every metric here
            nan = torch.full_like(self.bias_sq_sum, float("nan"))
            return _bias_variance_compute(nan, nan, torch.full_like(self.gen_sq_sum, float("nan")),
                                          torch.ones_like(self.count), self.correction)
        return _bias_variance_compute(self.bias_sq_sum, self.var_sum, self.gen_sq_sum, self.count,
                                      self.correction)


@torch.no_grad()
def bias_variance_decomposition(reference_endpoints: torch.Tensor, student_endpoints: torch.Tensor,
                                descriptor=None, correction: Correction = "plug_in") -> Dict[str, torch.Tensor]:
    """Functional twin of :class:`BiasVarianceDecomposition` (one batch)."""
    if student_endpoints.ndim < 2 or int(student_endpoints.shape[0]) < 1:
        raise ValueError(f"student_endpoints: expected shape (K, B, ...) with K >= 1, got "
                         f"{tuple(student_endpoints.shape)}")
    _check_correction(correction, int(student_endpoints.shape[0]))
    _check_shapes(reference_endpoints, student_endpoints, int(student_endpoints.shape[0]))
    bias_sq, var, gen_sq, count = _bias_variance_update(
        *_features(build_descriptor(descriptor), reference_endpoints, student_endpoints))
    return _bias_variance_compute(bias_sq, var, gen_sq, torch.tensor(float(count), dtype=torch.float64),
                                  correction)


def _check_correction(correction, num_students) -> None:
    from ..errors import ConfigError

    if correction not in CORRECTIONS:
        raise ConfigError("correction", "unknown value", value=correction, accepted=list(CORRECTIONS))
    if correction == "unbiased" and int(num_students) < 2:
        raise ConfigError("correction", "'unbiased' needs K >= 2 students", value=num_students)
