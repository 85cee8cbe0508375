"""Building blocks shared by the U-Net and the MLP denoiser (pure torch).

Noise embeddings of c_noise (the scalar the preconditioning hands to the raw network,
EDM paper Table 1), group-norm with an automatic group count, and the EDM-style weight
initialisation (xavier-uniform, biases 0, "almost zero" output layers).
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "PositionalEmbedding",
    "FourierEmbedding",
    "make_noise_embedding",
    "group_norm",
    "init_xavier",
    "count_parameters",
    "as_noise_labels",
]


def as_noise_labels(c_noise, batch: int, device, dtype=torch.float32) -> torch.Tensor:
    """Turn a scalar, (B,) or (B, 1, ...) c_noise into a flat (B,) float tensor."""
    c = torch.as_tensor(c_noise, device=device, dtype=dtype)
    if c.ndim == 0 or c.numel() == 1:
        return c.reshape(1).expand(batch)
    c = c.reshape(-1)
    if c.shape[0] != batch:
        raise ValueError(
            f"c_noise: expected a scalar or {batch} values (one per sample), got shape "
            f"{tuple(torch.as_tensor(c_noise).shape)}")
    return c


class PositionalEmbedding(nn.Module):
    """Transformer-style sinusoidal embedding of c_noise (DDPM / EDM "positional").

    freqs_j = (1/max_positions)^(j/(C/2-1)), j = 0..C/2-1 (the "endpoint" variant, so the
    lowest frequency is exactly 1/max_positions); output [cos(c f), sin(c f)], shape (B, C).
    No parameters.
    """

    def __init__(self, num_channels: int, max_positions: int = 10000):
        super().__init__()
        if num_channels < 2 or num_channels % 2:
            raise ValueError(f"num_channels: must be an even integer >= 2, got {num_channels}")
        self.num_channels = int(num_channels)
        self.max_positions = int(max_positions)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        half = self.num_channels // 2
        j = torch.arange(half, dtype=torch.float32, device=c.device)
        freqs = (1.0 / self.max_positions) ** (j / max(half - 1, 1))
        arg = c.to(torch.float32)[:, None] * freqs[None, :]
        return torch.cat([arg.cos(), arg.sin()], dim=1)


class FourierEmbedding(nn.Module):
    """Random Fourier features of c_noise (NCSN++ style): [cos(2π c f), sin(2π c f)], f ~ N(0, s²).

    The frequencies are a fixed buffer drawn from a dedicated seeded generator, so two nets built
    with the same arguments embed identically.
    """

    def __init__(self, num_channels: int, scale: float = 16.0, seed: int = 0):
        super().__init__()
        if num_channels < 2 or num_channels % 2:
            raise ValueError(f"num_channels: must be an even integer >= 2, got {num_channels}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        freqs = torch.randn(num_channels // 2, generator=gen, device="cpu") * scale
        self.register_buffer("freqs", freqs.to(torch.get_default_device()))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        arg = (2 * math.pi) * c.to(torch.float32)[:, None] * self.freqs.to(c.device)[None, :]
        return torch.cat([arg.cos(), arg.sin()], dim=1)


def make_noise_embedding(kind: str, num_channels: int) -> nn.Module:
    """Factory: ``"positional"`` (EDM ddpm++) or ``"fourier"`` (EDM ncsn++)."""
    if kind == "positional":
        return PositionalEmbedding(num_channels)
    if kind == "fourier":
        return FourierEmbedding(num_channels)
    raise ValueError(f"embedding_type: must be 'positional' or 'fourier', got {kind!r}")


def group_norm(num_channels: int, eps: float = 1e-6, min_channels_per_group: int = 4) -> nn.GroupNorm:
    """GroupNorm with EDM's group count min(32, C // 4), lowered to the nearest divisor of C."""
    groups = max(1, min(32, num_channels // min_channels_per_group))
    while num_channels % groups:
        groups -= 1
    return nn.GroupNorm(groups, num_channels, eps=eps)


@torch.no_grad()
def init_xavier(module: nn.Module, gain: float = 1.0) -> nn.Module:
    """EDM initialisation: xavier-uniform weights scaled by ``gain``, zero biases."""
    if module.weight.device.type != "meta":
        nn.init.xavier_uniform_(module.weight)
        module.weight.mul_(gain)
        if module.bias is not None:
            module.bias.zero_()
    return module


def count_parameters(net: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters of ``net`` (works on the meta device, shared tensors counted once)."""
    seen, total = set(), 0
    for p in net.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


class TappedNetwork(nn.Module):
    """Base of the raw networks ``net(x_in, c_noise) -> F``: subclasses implement
    ``_run(x, c_noise, stop_at)`` and fill ``feature_taps`` / ``default_tap``."""

    def forward(self, x_in: torch.Tensor, c_noise) -> torch.Tensor:
        """F(x_in; c_noise), same shape as x_in (the raw network of EDM eq. 7)."""
        return self._run(x_in, c_noise, stop_at=None)

    def forward_features(self, x_in: torch.Tensor, c_noise, tap=None) -> torch.Tensor:
        """Output of the ``tap`` module (default: ``default_tap``), computing nothing after it."""
        tap = self.default_tap if tap is None else tap
        if tap not in self.feature_taps:
            raise ValueError(f"tap: unknown name {tap!r}; accepted: {sorted(self.feature_taps)}")
        return self._run(x_in, c_noise, stop_at=tap)
