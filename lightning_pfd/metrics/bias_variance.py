"""Bias-variance decomposition of the generalization error (PFD paper Def. 3, eq. 9, 45;
REFERENCE §8).

With K students trained on independent data sets and the mean map
m(x_T) = (1/K) sum_k Psi(Phi_{theta_k}(x_T)) (eq. 45 uses K = 2):

    E_bias = ( E_x ||Psi(Phi_data(x_T)) - m(x_T)||^2 )^{1/2}
    E_var  = (1/K) sum_k E_x ||Psi(Phi_{theta_k}(x_T)) - m(x_T)||^2
    (1/K) sum_k E_gen(theta_k)^2 = E_bias^2 + E_var        (eq. 9, exact on the sample)
"""
from __future__ import annotations

from typing import Dict

import torch
from torchmetrics import Metric

from .descriptors import build_descriptor

__all__ = ["BiasVarianceDecomposition", "bias_variance_decomposition"]


class BiasVarianceDecomposition(Metric):
    """E_bias, E_var and mean E_gen^2 over K students on shared noise (Def. 3).

    ``update(reference_endpoints (B, ...), student_endpoints (K, B, ...))``: row i of every tensor
    comes from the same x_T^(i). States are float64 sums (exact under DDP). ``compute()`` returns
    ``{"e_bias", "e_var", "e_gen_sq_mean", "e_gen"}`` where ``e_gen`` holds the K individual
    E_gen(theta_k) = PFD(p_theta_k, p_data). Note E_var is a squared quantity, as in the paper.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, num_students: int, descriptor=None, **kwargs):
        super().__init__(**kwargs)
        if int(num_students) < 1:
            raise ValueError(f"num_students: must be >= 1, got {num_students}")
        self.num_students = int(num_students)
        self.descriptor = build_descriptor(descriptor)
        z = lambda *s: torch.zeros(s, dtype=torch.float64)  # noqa: E731
        self.add_state("bias_sq_sum", z(), dist_reduce_fx="sum")
        self.add_state("var_sum", z(), dist_reduce_fx="sum")
        self.add_state("gen_sq_sum", z(self.num_students), dist_reduce_fx="sum")
        self.add_state("count", z(), dist_reduce_fx="sum")

    def update(self, reference_endpoints: torch.Tensor, student_endpoints: torch.Tensor) -> None:
        K, B = self.num_students, reference_endpoints.shape[0]
        if student_endpoints.shape != (K, *reference_endpoints.shape):
            raise ValueError(f"student_endpoints: expected shape {(K, *reference_endpoints.shape)} "
                             f"(K={K} students x reference shape), got {tuple(student_endpoints.shape)}")
        ref = self.descriptor(reference_endpoints).reshape(B, -1).to(torch.float64)
        stu = self.descriptor(student_endpoints.reshape(K * B, *reference_endpoints.shape[1:]))
        stu = stu.reshape(K, B, -1).to(device=ref.device, dtype=torch.float64)
        mean = stu.mean(0)  # m(x_T), eq. 45
        self.bias_sq_sum += (ref - mean).square().sum()
        self.var_sum += (stu - mean).square().sum() / K
        self.gen_sq_sum += (stu - ref).square().sum((1, 2))
        self.count += B

    def compute(self) -> Dict[str, torch.Tensor]:
        if float(self.count) == 0:
            raise RuntimeError("BiasVarianceDecomposition: compute() called before any update()")
        gen_sq = self.gen_sq_sum / self.count
        return {"e_bias": (self.bias_sq_sum / self.count).sqrt(), "e_var": self.var_sum / self.count,
                "e_gen_sq_mean": gen_sq.mean(), "e_gen": gen_sq.sqrt()}


def bias_variance_decomposition(reference_endpoints: torch.Tensor, student_endpoints: torch.Tensor,
                                descriptor=None) -> Dict[str, torch.Tensor]:
    """Functional twin of :class:`BiasVarianceDecomposition` (one batch)."""
    m = BiasVarianceDecomposition(student_endpoints.shape[0], descriptor=descriptor, sync_on_compute=False)
    m.update(reference_endpoints, student_endpoints)
    return m.compute()
