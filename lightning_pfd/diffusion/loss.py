"""Denoising score-matching losses in sigma-space (EDM eq. 2, 8; REFERENCE §2-3).

Each loss returns the *per-sample* loss  lambda(sigma) * ||D(y + sigma n; sigma) - y||^2
summed over data dimensions, shape (B,). Noise n and sigma are drawn either from the
global torch RNG (training) or, given ``seeds``, from per-sample seeded streams so the
same sample gets the same (n, sigma) every epoch -- the frozen-noise losses l_train and
l_test of the PFD paper (REFERENCE §7).
"""
from __future__ import annotations

import math

import torch

from .noise import seeded_noise, seeded_uniform
from .streams import stream

__all__ = ["EDMLoss", "VPLoss"]

_NOISE_STREAM, _SIGMA_STREAM = stream("loss.noise"), stream("loss.sigma")


def _weighted_sq_error(denoiser, y, sigma, n, weight):
    s = sigma.reshape(-1, *([1] * (y.ndim - 1)))
    D = denoiser(y + s * n, sigma)
    return weight * (D.to(torch.float32) - y.to(torch.float32)).square().flatten(1).sum(1)


class EDMLoss:
    """EDM loss: ln sigma ~ N(P_mean, P_std^2), lambda = (sigma^2+s_d^2)/(sigma s_d)^2."""

    def __init__(self, P_mean: float = -1.2, P_std: float = 1.2, sigma_data: float = 0.5):
        if P_std <= 0 or sigma_data <= 0:
            raise ValueError("P_std and sigma_data must be > 0")
        self.P_mean, self.P_std, self.sigma_data = float(P_mean), float(P_std), float(sigma_data)

    def draw(self, y: torch.Tensor, seeds=None):
        """(sigma (B,), n like y): from the global RNG, or frozen per-sample given seeds."""
        if seeds is None:
            z = torch.randn(y.shape[0], device=y.device)
            n = torch.randn_like(y, dtype=torch.float32)
        else:
            z = seeded_noise(seeds, (1,), device=y.device, stream=_SIGMA_STREAM)[:, 0]
            n = seeded_noise(seeds, y.shape[1:], device=y.device, stream=_NOISE_STREAM)
        sigma = (z.to(torch.float32) * self.P_std + self.P_mean).exp()
        return sigma, n.to(torch.float32)

    def weight(self, sigma):
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2

    def __call__(self, denoiser, y: torch.Tensor, seeds=None) -> torch.Tensor:
        sigma, n = self.draw(y, seeds)
        return _weighted_sq_error(denoiser, y, sigma, n, self.weight(sigma))


class VPLoss:
    """VP loss: t ~ U(eps_t, 1), sigma = sigma_VP(t), lambda = 1/sigma^2 (EDM Table 1)."""

    def __init__(self, beta_d: float = 19.9, beta_min: float = 0.1, epsilon_t: float = 1e-5):
        if not 0 < epsilon_t < 1:
            raise ValueError(f"epsilon_t: must lie in (0, 1), got {epsilon_t}")
        self.beta_d, self.beta_min, self.epsilon_t = float(beta_d), float(beta_min), float(epsilon_t)

    def sigma(self, t):
        return torch.expm1(0.5 * self.beta_d * t**2 + self.beta_min * t).sqrt()

    def draw(self, y: torch.Tensor, seeds=None):
        if seeds is None:
            u = torch.rand(y.shape[0], device=y.device, dtype=torch.float64)
            n = torch.randn_like(y, dtype=torch.float32)
        else:
            u = seeded_uniform(seeds, 1, device=y.device, stream=_SIGMA_STREAM)[:, 0]
            n = seeded_noise(seeds, y.shape[1:], device=y.device, stream=_NOISE_STREAM)
        t = 1 + u * (self.epsilon_t - 1)
        return self.sigma(t).to(torch.float32), n.to(torch.float32)

    def weight(self, sigma):
        return 1 / sigma**2

    def __call__(self, denoiser, y: torch.Tensor, seeds=None) -> torch.Tensor:
        sigma, n = self.draw(y, seeds)
        return _weighted_sq_error(denoiser, y, sigma, n, self.weight(sigma))
