"""Exponential moving average of a module's weights (EDM's EMA, Karras et al. 2022, App. F).

Pure torch. The EMA copy is a frozen deep copy of the model; ``update`` blends the live
parameters in with decay beta. ``beta_from_halflife`` converts EDM's half-life in images to
a per-step decay: beta = 0.5 ** (batch_size / halflife_nimg).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..validation import PositiveFloat, check_args

__all__ = ["EMA", "beta_from_halflife", "ema_beta", "sanitize_gradients", "ema_step"]


def beta_from_halflife(batch_size: int, halflife_kimg: PositiveFloat) -> float:
    """beta = 0.5 ** (batch_size / halflife_nimg) with halflife_nimg = 1000 halflife_kimg."""
    check_args(beta_from_halflife, locals())
    return 0.5 ** (batch_size / (halflife_kimg * 1000.0))


def ema_beta(num_updates: int, images_per_step: int, decay: float = 0.999,
             halflife_kimg: float | None = None, rampup: bool = True,
             rampup_ratio: float = 0.05) -> float:
    """Per-step EMA decay with a ramp-up, so early evaluations do not average in the random
    initial weights. **[choice]**

    * half-life mode (EDM): halflife_nimg = min(halflife_kimg * 1000, rampup_ratio * images seen
      after this step) and beta = 0.5 ** (images_per_step / halflife_nimg) (EDM's
      ``ema_rampup_ratio = 0.05``);
    * decay mode: beta = min(decay, (1 + n) / (10 + n)) after n previous updates.
    With a constant beta = 0.995 the shadow would still hold 0.995**250 = 28 % of the initial
    weights after 250 steps.
    """
    if halflife_kimg is not None:
        halflife_nimg = halflife_kimg * 1000.0
        if rampup:
            halflife_nimg = min(halflife_nimg, rampup_ratio * (num_updates + 1) * images_per_step)
        return 0.5 ** (images_per_step / max(halflife_nimg, 1e-8))
    if rampup:
        return min(float(decay), (1.0 + num_updates) / (10.0 + num_updates))
    return float(decay)


def _count_load(module: "EMA", incompatible_keys) -> None:
    """load_state_dict post-hook: the counter may have been overwritten."""
    module.generation += 1


class EMA(nn.Module):
    """Holds ``shadow``, a frozen copy of ``model`` updated as shadow <- b*shadow + (1-b)*model.

    ``generation`` (a host integer) changes whenever ``update`` or ``load_state_dict`` writes
    ``num_updates``: a cached host copy of the counter is valid while it and the counter tensor's
    identity are unchanged."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.shadow = copy.deepcopy(model).eval().requires_grad_(False)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self.generation = 0
        self.register_load_state_dict_post_hook(_count_load)

    @torch.no_grad()
    def update(self, model: nn.Module, beta: float) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"ema decay: must lie in [0, 1], got {beta}")
        dst, src = self._pairs(model)
        if dst:
            # one fused multi-tensor kernel instead of a Python loop over parameters
            torch._foreach_lerp_(dst, [p.detach().to(d.dtype) for p, d in zip(src, dst)], 1.0 - beta)
        for b_dst, b_src in zip(self.shadow.buffers(), model.buffers()):
            b_dst.copy_(b_src)
        self.num_updates += 1
        self.generation += 1

    def _pairs(self, model: nn.Module):
        """(shadow params, model params) matched by name, cached per source model."""
        cache = getattr(self, "_pair_cache", None)
        if cache is None or cache[0] is not model:
            src = dict(model.named_parameters())
            names = [n for n, _ in self.shadow.named_parameters()]
            missing = [n for n in names if n not in src]
            if missing:
                raise ValueError(f"ema: model lacks parameters {missing[:3]}")
            cache = (model, [p for _, p in self.shadow.named_parameters()], [src[n] for n in names])
            object.__setattr__(self, "_pair_cache", cache)
        return cache[1], cache[2]

    def __getstate__(self):  # never copy / pickle the cached references to the live model
        state = self.__dict__.copy()
        state.pop("_pair_cache", None)
        return state

    def train(self, mode: bool = True):  # the shadow always stays in eval mode
        super().train(mode)
        self.shadow.eval()
        return self


def sanitize_gradients(params) -> list:
    """EDM's guard (the EDM training code): NaN gradients -> 0, +-inf -> +-1e5, in place. Returns the
    parameters that have gradients."""
    params = [p for p in params if p.grad is not None]
    for p in params:
        torch.nan_to_num(p.grad, nan=0.0, posinf=1e5, neginf=-1e5, out=p.grad)
    return params


def ema_step(ema: EMA, model: nn.Module, hparams, batch_size: int, world_size: int = 1) -> None:
    """One EMA update after an optimizer step, with the decay of :func:`ema_beta` from the
    module's hyper-parameters (``ema_decay``, ``ema_halflife_kimg``, ``ema_rampup``)."""
    beta = ema_beta(int(ema.num_updates), batch_size * max(1, world_size), hparams.ema_decay,
                    hparams.ema_halflife_kimg, hparams.ema_rampup)
    ema.update(model, beta)
