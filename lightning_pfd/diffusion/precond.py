"""Preconditioned denoisers D(x; sigma) in sigma-space (REFERENCE §1-3).

Every model in the project is a callable ``D(x, sigma) -> x0_hat`` with x = y + sigma * n.
``EDMPrecond`` follows Karras et al. (2022), Table 1; ``VPPrecond`` follows Song et al.
(2021) as written in EDM's Table 1 (VP column). The wrapped network has the signature
``net(x_in, c_noise) -> F`` with F of the shape of x_in.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["EDMPrecond", "VPPrecond", "as_sigma"]


def as_sigma(sigma, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Broadcast a scalar / (B,) sigma to shape (B, 1, ..., 1) matching x."""
    s = torch.as_tensor(sigma, dtype=dtype, device=x.device)
    if s.ndim == 0:
        s = s.expand(x.shape[0])
    return s.reshape(-1, *([1] * (x.ndim - 1)))


class _Preconditioned(nn.Module):
    """D(x; sigma) = c_skip x + c_out F(c_in x; c_noise); subclasses define ``coefficients``."""

    def coefficients(self, sigma: torch.Tensor):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        x = x.to(torch.float32)
        sigma = as_sigma(sigma, x)
        c_skip, c_out, c_in, c_noise = self.coefficients(sigma)
        F_x = self.net(c_in * x, c_noise.flatten())
        return c_skip * x + c_out * F_x.to(torch.float32)  # skip combination in float32

    def network_input(self, x: torch.Tensor, sigma):
        """(c_in x, c_noise): what the raw network sees (used for feature taps)."""
        x = x.to(torch.float32)
        sigma = as_sigma(sigma, x)
        _, _, c_in, c_noise = self.coefficients(sigma)
        return c_in * x, c_noise.flatten()


class EDMPrecond(_Preconditioned):
    """EDM preconditioning: D = c_skip x + c_out F(c_in x; c_noise) (EDM eq. 7, Table 1).

    c_skip = s_d^2/(s^2+s_d^2), c_out = s s_d/sqrt(s^2+s_d^2), c_in = 1/sqrt(s^2+s_d^2),
    c_noise = ln(s)/4. The skip combination is done in float32 even under autocast.
    """

    def __init__(self, net: nn.Module, sigma_data: float = 0.5, sigma_min: float = 0.0,
                 sigma_max: float = float("inf")):
        super().__init__()
        if sigma_data <= 0:
            raise ValueError(f"sigma_data: must be > 0, got {sigma_data}")
        self.net = net
        self.sigma_data = float(sigma_data)
        self.sigma_min = float(sigma_min)
        self.sigma_max = float(sigma_max)

    def coefficients(self, sigma: torch.Tensor):
        sd = self.sigma_data
        c_skip = sd**2 / (sigma**2 + sd**2)
        c_out = sigma * sd / (sigma**2 + sd**2).sqrt()
        c_in = 1 / (sd**2 + sigma**2).sqrt()
        c_noise = sigma.log() / 4
        return c_skip, c_out, c_in, c_noise


class VPPrecond(_Preconditioned):
    """VP preconditioning (EDM Table 1, VP column; REFERENCE §3).

    sigma(t) = sqrt(exp(beta_d t^2/2 + beta_min t) - 1); c_skip = 1, c_out = -sigma,
    c_in = 1/sqrt(sigma^2+1), c_noise = (M-1) sigma^{-1}(sigma).
    """

    def __init__(self, net: nn.Module, beta_d: float = 19.9, beta_min: float = 0.1,
                 M: int = 1000, epsilon_t: float = 1e-5):
        super().__init__()
        if not 0 < epsilon_t < 1:
            raise ValueError(f"epsilon_t: must lie in (0, 1), got {epsilon_t}")
        if beta_d <= 0 or beta_min < 0:
            raise ValueError(f"beta_d > 0 and beta_min >= 0 required, got {beta_d}, {beta_min}")
        self.net = net
        self.beta_d = float(beta_d)
        self.beta_min = float(beta_min)
        self.M = int(M)
        self.epsilon_t = float(epsilon_t)
        self.sigma_min = float(self.sigma(torch.tensor(epsilon_t, dtype=torch.float64)))
        self.sigma_max = float(self.sigma(torch.tensor(1.0, dtype=torch.float64)))

    def sigma(self, t):
        t = torch.as_tensor(t)
        return torch.expm1(0.5 * self.beta_d * t**2 + self.beta_min * t).sqrt()

    def sigma_inv(self, sigma):
        """t(sigma) = (sqrt(b_min^2 + 2 b_d ln(1+sigma^2)) - b_min) / b_d, written without the
        cancellation of the two square roots (accurate in float32 down to sigma ~ 1e-3)."""
        sigma = torch.as_tensor(sigma)
        L = torch.log1p(sigma**2)
        return 2 * L / ((self.beta_min**2 + 2 * self.beta_d * L).sqrt() + self.beta_min)

    def coefficients(self, sigma: torch.Tensor):
        c_skip = torch.ones_like(sigma)
        c_out = -sigma
        c_in = 1 / (sigma**2 + 1).sqrt()
        c_noise = (self.M - 1) * self.sigma_inv(sigma)
        return c_skip, c_out, c_in, c_noise
