"""Residual MLP denoiser network for vector data (GMM, features; REFERENCE §9 last line).

``net(x_in, c_noise) -> F`` with x_in of shape (B, dim). Layout:
c_noise -> positional embedding (emb_dim) -> Linear -> SiLU -> Linear -> SiLU = emb;
x_in -> Linear(dim, hidden) -> ``depth`` residual blocks
[LayerNorm -> SiLU -> Linear -> (+ affine(emb)) -> SiLU -> dropout -> Linear, added to the
stream] -> LayerNorm -> SiLU -> Linear(hidden, dim) (initialised almost at 0, as in EDM).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .layers import TappedNetwork, as_noise_labels, init_xavier, make_noise_embedding

__all__ = ["MLPNet", "MLPBlock"]

_INIT_ZERO = 1e-5


class MLPBlock(nn.Module):
    """Pre-norm residual block conditioned on emb: h + W1 drop(SiLU(W0 SiLU(LN h) + A emb))."""

    def __init__(self, hidden: int, emb_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.lin0 = init_xavier(nn.Linear(hidden, hidden))
        self.affine = init_xavier(nn.Linear(emb_dim, hidden))
        self.lin1 = init_xavier(nn.Linear(hidden, hidden), _INIT_ZERO)
        self.dropout = float(dropout)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        y = self.lin0(F.silu(self.norm(h))) + self.affine(emb)
        y = F.dropout(F.silu(y), p=self.dropout, training=self.training)
        return h + self.lin1(y)


class _Head(nn.Module):
    def __init__(self, hidden: int, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.lin = init_xavier(nn.Linear(hidden, dim), _INIT_ZERO)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lin(F.silu(self.norm(h)))


class MLPNet(TappedNetwork):
    """Residual MLP ``net(x_in, c_noise) -> F`` for vector data of shape (B, dim).

    Args:
        dim: data dimension (>= 1).
        hidden: width of the residual stream (= feature dimension d of every tap).
        depth: number of residual blocks (>= 1).
        emb_dim: width of the noise embedding (even).
        dropout: dropout probability inside the blocks.
        embedding_type: ``"positional"`` or ``"fourier"``.

    Attributes:
        data_shape: (dim,).
        feature_taps: "in" (input projection), "block0".."block{depth-1}", "middle" (alias of
            block[(depth-1)//2], i.e. the residual stream after half of the blocks), "out".
        default_tap: "middle".
    """

    def __init__(self, dim: int, hidden: int = 256, depth: int = 4, emb_dim: int = 64,
                 dropout: float = 0.0, embedding_type: str = "positional"):
        super().__init__()
        _validate(dim, hidden, depth, emb_dim, dropout)
        self.dim, self.hidden = int(dim), int(hidden)
        self.depth, self.emb_dim = int(depth), int(emb_dim)
        self.data_shape = (self.dim,)
        self.map_noise = make_noise_embedding(embedding_type, emb_dim)
        self.map_layer0 = init_xavier(nn.Linear(emb_dim, emb_dim))
        self.map_layer1 = init_xavier(nn.Linear(emb_dim, emb_dim))
        self.inp = init_xavier(nn.Linear(dim, hidden))
        self.blocks = nn.ModuleList(MLPBlock(hidden, emb_dim, dropout) for _ in range(depth))
        self.out = _Head(hidden, dim)
        self._middle = (depth - 1) // 2
        self.default_tap = "middle"

    @property
    def feature_taps(self) -> Dict[str, nn.Module]:
        """Name -> submodule for forward hooks ("middle" aliases block[(depth-1)//2])."""
        return {"in": self.inp, **{f"block{i}": b for i, b in enumerate(self.blocks)},
                "middle": self.blocks[self._middle], "out": self.out}

    def embed(self, c_noise: torch.Tensor) -> torch.Tensor:
        emb = F.silu(self.map_layer0(self.map_noise(c_noise)))
        return F.silu(self.map_layer1(emb))

    def _run(self, x: torch.Tensor, c_noise, stop_at: Optional[str]) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x_in: expected shape (B, {self.dim}), got {tuple(x.shape)}")
        stop = self.feature_taps[stop_at] if stop_at is not None else None
        emb = self.embed(as_noise_labels(c_noise, x.shape[0], x.device))
        h = self.inp(x)
        if stop is self.inp:
            return h
        for blk in self.blocks:
            h = blk(h, emb)
            if stop is blk:
                return h
        return self.out(h)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, depth={self.depth}, emb_dim={self.emb_dim}"


def _validate(dim, hidden, depth, emb_dim, dropout) -> None:
    for name, val in (("dim", dim), ("hidden", hidden), ("depth", depth)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}: must be a positive int, got {val!r}")
    if not isinstance(emb_dim, int) or emb_dim < 2 or emb_dim % 2:
        raise ValueError(f"emb_dim: must be an even int >= 2, got {emb_dim!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: must lie in [0, 1), got {dropout}")
