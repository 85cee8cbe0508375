"""Exponential moving average of a module's weights (EDM's EMA; REFERENCE §2).

Pure torch. The EMA copy is a frozen deep copy of the model; ``update`` blends the live
parameters in with decay beta. ``beta_from_halflife`` converts EDM's half-life in images to
a per-step decay: beta = 0.5 ** (batch_size / halflife_nimg).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["EMA", "beta_from_halflife"]


def beta_from_halflife(batch_size: int, halflife_kimg: float) -> float:
    if halflife_kimg <= 0:
        raise ValueError(f"ema_halflife_kimg: must be > 0, got {halflife_kimg}")
    return 0.5 ** (batch_size / (halflife_kimg * 1000.0))


class EMA(nn.Module):
    """Holds ``shadow``, a frozen copy of ``model`` updated as shadow <- b*shadow + (1-b)*model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.shadow = copy.deepcopy(model).eval().requires_grad_(False)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, model: nn.Module, beta: float) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"ema decay: must lie in [0, 1], got {beta}")
        src = dict(model.named_parameters())
        for name, p in self.shadow.named_parameters():
            p.lerp_(src[name].detach().to(p.dtype), 1.0 - beta)
        src_b = dict(model.named_buffers())
        for name, b in self.shadow.named_buffers():
            b.copy_(src_b[name])
        self.num_updates += 1

    def train(self, mode: bool = True):  # the shadow always stays in eval mode
        super().train(mode)
        self.shadow.eval()
        return self
