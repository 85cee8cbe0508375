"""Closed-form denoiser of a finite training set (PFD paper eq. 46; REFERENCE §5).

For the empirical distribution p_emp = (1/N) sum_i delta(y_i), the noisy density is a mixture of
N isotropic Gaussians and the ideal denoiser is a softmax-weighted average of the training points

    w_i(x, sigma) = softmax_i( -||x - y_i||^2 / (2 sigma^2) ),   D*(x; sigma) = sum_i w_i y_i,

equivalently the score of eq. 46, grad log p_sigma(x) = (D*(x; sigma) - x) / sigma^2.
Its probability-flow ODE ends on a training point, so its endpoints define E_mem (PFD paper
eq. 8 and App. D).
"""
from __future__ import annotations

import contextlib
import hashlib
import math

import torch
from torch import nn

__all__ = ["EmpiricalDenoiser"]


@contextlib.contextmanager
def _no_tf32(device: torch.device):
    """Disable TF32 matmuls on CUDA while inside (the logits are float64 anyway)."""
    if device.type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


class EmpiricalDenoiser(nn.Module):
    """Exact denoiser D*(x; sigma) of the empirical distribution of ``data`` (eq. 46).

    The training set is streamed in chunks of ``chunk_size`` rows with an online log-sum-exp
    (running max m, normaliser l and weighted sum a, rescaled by exp(m_old - m_new) when the
    max grows), so memory is O(B * chunk_size + B * D), never O(B * N * D). Logits are float64:
    at sigma = 0.002 they are of order 1e6 and float32 would pick wrong winners.

    The logit of y_i is (2 x.y_i - ||y_i||^2) / (2 sigma^2): -||x - y_i||^2 / (2 sigma^2) up to the
    term ||x||^2 / (2 sigma^2), which does not depend on i and cancels in the softmax (so there is
    nothing to clamp). ||y_i||^2 is computed once at construction.

    Args:
        data: training set, shape (N, *data_shape); stored flattened in float64.
        chunk_size: rows of the training set processed at once (memory knob).
    """

    sigma_min = 0.0
    sigma_max = math.inf

    def __init__(self, data: torch.Tensor, chunk_size: int = 4096):
        super().__init__()
        data = torch.as_tensor(data)
        if data.ndim < 2 or data.shape[0] < 1:
            raise ValueError(f"data: expected shape (N >= 1, *data_shape), got {tuple(data.shape)}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
        y = data.detach().reshape(data.shape[0], -1).to(torch.float64)
        if not bool(torch.isfinite(y).all()):
            raise ValueError("data: contains NaN or inf")
        self.shape = tuple(data.shape[1:])
        self.chunk_size = int(chunk_size)
        self.register_buffer("data", y.contiguous())
        self.register_buffer("sq_norms", y.square().sum(1))  # ||y_i||^2, once

    @property
    def num_samples(self) -> int:
        return self.data.shape[0]

    def fingerprint(self) -> str:
        """Hash of the training set (order-sensitive, float64 bytes)."""
        h = hashlib.sha256(str(tuple(self.data.shape)).encode())
        h.update(self.data.detach().cpu().numpy().tobytes())
        return "emp-" + h.hexdigest()[:16]

    def _sigma2(self, sigma, B: int, device) -> torch.Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float64, device=device)
        if s.ndim == 0:
            s = s.expand(B)
        s = s.reshape(-1)
        if s.shape[0] != B:
            raise ValueError(f"sigma: expected a scalar or shape ({B},), got {tuple(s.shape)}")
        if bool((s <= 0).any()):
            raise ValueError("sigma: must be > 0 (D* at sigma = 0 is not a function)")
        return (2.0 * s.square()).reshape(-1, 1)  # 2 sigma^2, (B, 1)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """D*(x; sigma) in float64, shape of ``x`` (eq. 46 as a denoiser)."""
        B = x.shape[0]
        xf = x.reshape(B, -1).to(device=self.data.device, dtype=torch.float64)
        if xf.shape[1] != self.data.shape[1]:
            raise ValueError(f"x: {xf.shape[1]} features per sample, training data has {self.data.shape[1]}")
        two_s2 = self._sigma2(sigma, B, xf.device)
        m = torch.full((B, 1), -math.inf, dtype=torch.float64, device=xf.device)  # running max
        l = torch.zeros((B, 1), dtype=torch.float64, device=xf.device)  # running normaliser
        a = torch.zeros_like(xf)  # running weighted sum of y_i
        with _no_tf32(xf.device):
            for y, yy in zip(self.data.split(self.chunk_size), self.sq_norms.split(self.chunk_size)):
                logits = torch.addmm(yy, xf, y.T, beta=-1.0, alpha=2.0).div_(two_s2)  # (B, C)
                m_new = torch.maximum(m, logits.amax(1, keepdim=True))
                scale = torch.exp(m - m_new)  # exp(-inf) = 0 on the first chunk
                p = logits.sub_(m_new).exp_()
                l = l * scale + p.sum(1, keepdim=True)
                a = torch.addmm(a.mul_(scale), p, y)
                m = m_new
        return (a / l).reshape(x.shape).to(x.device)

    def score(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """grad log p_sigma(x) = (D*(x; sigma) - x) / sigma^2 (eq. 46)."""
        s2 = torch.as_tensor(sigma, dtype=torch.float64, device=x.device) ** 2
        s2 = s2.reshape(-1, *([1] * (x.ndim - 1))) if s2.ndim else s2
        return (self.forward(x, sigma) - x.to(torch.float64)) / s2

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest training point of each row of x (chunked, float64)."""
        xf = x.reshape(x.shape[0], -1).to(device=self.data.device, dtype=torch.float64)
        best_v = torch.full((xf.shape[0],), -math.inf, dtype=torch.float64, device=xf.device)
        best_i = torch.zeros(xf.shape[0], dtype=torch.long, device=xf.device)
        for start in range(0, self.num_samples, self.chunk_size):
            y = self.data[start:start + self.chunk_size]
            v = torch.addmm(self.sq_norms[start:start + self.chunk_size], xf, y.T, beta=-1.0, alpha=2.0)
            cv, ci = v.max(1)
            better = cv > best_v
            best_v = torch.where(better, cv, best_v)
            best_i = torch.where(better, ci + start, best_i)
        return best_i
