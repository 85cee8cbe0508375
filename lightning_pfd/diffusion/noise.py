"""Per-sample seeded Gaussian noise (the shared x_T of the PFD estimator, eq. 4 of the PFD paper).

PFD compares two flows on the *same* x_T for every seed, so row i of the noise must depend
only on ``seeds[i]`` -- never on the batch it is drawn in, the device or the number of
processes. We use a counter-based generator: every element is a pure function of
``(seed, element index)`` computed with the SplitMix64 finalizer on int64 tensors, then
mapped to N(0, 1) by Box--Muller in float64. Everything is vectorised (no loop over
samples) and bit-identical on CPU and GPU because it is integer arithmetic.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["seeded_noise", "splitmix64", "seeded_uniform"]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_STREAM = 0x632BE59BD9B4E019  # < 2**63, a valid int64 odd constant


def _lshr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 output function applied to int64 states ``x`` (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ _lshr(z, 30)) * _MIX1
    z = (z ^ _lshr(z, 27)) * _MIX2
    return z ^ _lshr(z, 31)


def _as_seed_tensor(seeds: Sequence[int] | torch.Tensor, device) -> torch.Tensor:
    s = torch.as_tensor(seeds, dtype=torch.int64, device=device).reshape(-1)
    if s.numel() and bool((s < 0).any()):
        raise ValueError("seeds: must be non-negative integers")
    return s


def seeded_uniform(seeds, numel: int, device=None, stream: int = 0) -> torch.Tensor:
    """Uniform float64 in (0, 1), shape ``[len(seeds), numel]``; row i depends on seeds[i] only.

    ``stream`` selects an independent sequence for the same seeds (e.g. augmentation
    parameters vs. noise).
    """
    s = _as_seed_tensor(seeds, device)
    idx = torch.arange(numel, dtype=torch.int64, device=s.device)
    key = splitmix64(s * _STREAM + stream)  # decorrelate neighbouring seeds / streams
    bits = splitmix64(key[:, None] + idx[None, :] * _GOLDEN)
    mant = _lshr(bits, 11).to(torch.float64)  # 53 random bits
    return (mant + 0.5) * (1.0 / 9007199254740992.0)  # strictly inside (0, 1)


def seeded_noise(
    seeds: Sequence[int] | torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float64,
    device=None,
    stream: int = 0,
) -> torch.Tensor:
    """Standard normal tensor ``[len(seeds), *shape]`` whose row i depends only on ``seeds[i]``.

    Box--Muller on two independent uniforms per element. Identical across batch sizes,
    devices and process counts.
    """
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    u = seeded_uniform(seeds, 2 * n, device=device, stream=stream)
    u1, u2 = u[:, :n], u[:, n:]
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    return z.reshape(-1, *shape).to(dtype)
