"""Sigma grids and deterministic PF-ODE solvers (EDM Alg. 1 without churn; REFERENCE §4).

Solvers have the k-diffusion shape ``sample(denoiser, x_T, sigmas) -> x_0`` where ``x_T`` is
already scaled by ``sigmas[0]`` and the ODE is dx/dsigma = (x - D(x; sigma)) / sigma
(PFD paper eq. 1 with the EDM schedule). The state is kept in float64; the denoiser may
compute in lower precision, its output is promoted back.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .noise import seeded_noise
from .streams import stream

__all__ = ["karras_sigmas", "heun_sample", "euler_sample", "sample_endpoints", "clamp_sigmas",
           "SAMPLERS"]


def karras_sigmas(num_steps: int = 18, sigma_min: float = 0.002, sigma_max: float = 80.0,
                  rho: float = 7.0) -> torch.Tensor:
    """EDM time steps (EDM eq. 5), float64, length num_steps + 1, the last entry 0.

    t_i = (s_max^{1/rho} + i/(N-1) (s_min^{1/rho} - s_max^{1/rho}))^rho, i = 0..N-1; t_N = 0.
    """
    if int(num_steps) < 1:
        raise ValueError(f"num_steps: must be >= 1, got {num_steps}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"sigma_min/sigma_max: need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    if rho <= 0:
        raise ValueError(f"rho: must be > 0, got {rho}")
    if num_steps == 1:
        t = torch.tensor([sigma_max], dtype=torch.float64)
    else:
        i = torch.arange(num_steps, dtype=torch.float64)
        t = (sigma_max ** (1 / rho) + i / (num_steps - 1)
             * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([t, t.new_zeros(1)])


def clamp_sigmas(sigmas: torch.Tensor, denoiser) -> torch.Tensor:
    """Clamp the positive part of a grid to the denoiser's supported [sigma_min, sigma_max]."""
    lo = float(getattr(denoiser, "sigma_min", 0.0) or 0.0)
    hi = float(getattr(denoiser, "sigma_max", math.inf))
    pos = sigmas > 0
    return torch.where(pos, sigmas.clamp(min=lo if lo > 0 else None, max=hi), sigmas)


def module_device(denoiser, default) -> torch.device:
    """Device of a denoiser's first parameter or buffer (exact denoisers hold only buffers)."""
    if isinstance(denoiser, torch.nn.Module):
        for t in list(denoiser.parameters()) + list(denoiser.buffers()):
            return t.device
    return torch.device(default)


def _d(denoiser, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """ODE direction (x - D(x; sigma)) / sigma in float64."""
    D = denoiser(x, sigma.to(x.dtype)).to(torch.float64)
    return (x - D) / sigma


@torch.no_grad()
def euler_sample(denoiser: Callable, x_T: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """First-order Euler solver of the PF-ODE on the grid ``sigmas`` (NFE = len(sigmas) - 1)."""
    sigmas = sigmas.to(device=x_T.device, dtype=torch.float64)
    x = x_T.to(torch.float64)
    for i in range(len(sigmas) - 1):
        x = x + (sigmas[i + 1] - sigmas[i]) * _d(denoiser, x, sigmas[i])
    return x


@torch.no_grad()
def heun_sample(denoiser: Callable, x_T: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Deterministic 2nd-order Heun solver (EDM Alg. 1, S_churn = 0).

    Euler predictor then trapezoidal corrector on every step except the last (to sigma = 0),
    which is a plain Euler step; NFE = 2(len(sigmas) - 1) - 1 = 35 for the 18-step grid.
    """
    sigmas = sigmas.to(device=x_T.device, dtype=torch.float64)
    x = x_T.to(torch.float64)
    for i in range(len(sigmas) - 1):
        t_cur, t_next = sigmas[i], sigmas[i + 1]
        d_cur = _d(denoiser, x, t_cur)
        x_next = x + (t_next - t_cur) * d_cur
        if t_next > 0:
            d_next = _d(denoiser, x_next, t_next)
            x_next = x + (t_next - t_cur) * (0.5 * d_cur + 0.5 * d_next)
        x = x_next
    return x


SAMPLERS = {"heun": heun_sample, "euler": euler_sample}


def resolve_sampler(sampler) -> Callable:
    if callable(sampler):
        return sampler
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: unknown {sampler!r}; accepted: {sorted(SAMPLERS)}")
    return SAMPLERS[sampler]


@torch.no_grad()
def sample_endpoints(denoiser: Callable, seeds: Sequence[int] | torch.Tensor, shape: Sequence[int],
                     sigmas: torch.Tensor | None = None, sampler="heun", batch_size: int = 256,
                     device=None, out_device="cpu") -> torch.Tensor:
    """PF-ODE endpoints Phi(x_T) for x_T = sigmas[0] * seeded_noise(seeds), in batches.

    Memory is bounded by ``batch_size``; row i depends only on seeds[i] (not on the batch
    size or device). Returns float64 on ``out_device``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    sampler = resolve_sampler(sampler)
    sigmas = clamp_sigmas(karras_sigmas() if sigmas is None else sigmas, denoiser)
    seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    if device is None:
        device = module_device(denoiser, torch.device("cpu"))
    out = []
    for chunk in seeds.split(batch_size):
        x_T = seeded_noise(chunk, shape, device=device, stream=stream("pf_ode.x_T")) * sigmas[0]
        out.append(sampler(denoiser, x_T, sigmas).to(out_device))
    if not out:
        return torch.empty(0, *shape, dtype=torch.float64, device=out_device)
    return torch.cat(out)
