"""Representation features of a preconditioned denoiser at a named tap (Sec. 2 and App. C of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

The network is fed what it sees inside the denoiser, ``(c_in x, c_noise) =
denoiser.network_input(x, sigma)``, and the output of the module ``net.feature_taps[tap]`` is
returned, mean-pooled over space for (B, C, H, W) activations (App. C). When the net offers
``forward_features(x_in, c_noise, tap)`` (UNet, MLPNet) the forward stops right after the tap;
otherwise a forward hook captures the tap output and aborts the rest of the forward pass with an
internal exception, so the decoder after the tap is never computed either way.

A fixed Gaussian random projection (Johnson-Lindenstrauss) reduces d when the number of images is
not several times the feature dimension (a project choice: the ICR paper estimates ICR from
N = 4096 training images, App. C, many times the channel count of its tap; small runs cannot); it
is seeded, so the same projection is used at every epoch and in every process. Pure torch (no
Lightning import).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..validation import PositiveInt, check_args
from .noise import seeded_noise
from .streams import stream

__all__ = ["extract_features", "tap_features", "random_projection", "resolve_tap"]


class _StopAtTap(Exception):
    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value


def resolve_tap(net: nn.Module, tap: Optional[str]) -> Optional[str]:
    """The tap name to use: ``tap`` or ``net.default_tap``; validated against ``net.feature_taps``."""
    taps = getattr(net, "feature_taps", None)
    name = tap if tap is not None else getattr(net, "default_tap", None)
    if name is None:
        raise ValueError("tap: the net has no `default_tap`; pass a tap name")
    if taps is not None and name not in taps:
        raise ValueError(f"tap: unknown name {name!r}; accepted: {sorted(taps)}")
    return name


def tap_features(net: nn.Module, x_in: torch.Tensor, c_noise: torch.Tensor,
                 tap: Optional[str] = None) -> torch.Tensor:
    """Raw activation of ``net`` at ``tap`` for network input (x_in, c_noise), forward stopped there."""
    name = resolve_tap(net, tap)
    if hasattr(net, "forward_features"):
        return net.forward_features(x_in, c_noise, name)
    taps = getattr(net, "feature_taps", None)
    if taps is None:
        raise ValueError("net: has neither `forward_features` nor `feature_taps`")

    def hook(_module, _inputs, output):
        raise _StopAtTap(output)

    handle = taps[name].register_forward_hook(hook)
    try:
        net(x_in, c_noise)
    except _StopAtTap as stop:
        return stop.value
    finally:
        handle.remove()
    raise RuntimeError(f"tap {name!r} was not reached by the forward pass")


@torch.no_grad()
def extract_features(denoiser: nn.Module, x: torch.Tensor, sigma, tap: Optional[str] = None,
                     batch_size: PositiveInt = 256, pool: bool = True) -> torch.Tensor:
    """Features h(x) at ``tap`` of ``denoiser.net`` fed ``denoiser.network_input(x, sigma)``.

    Returns float64 (B, C) (mean-pooled over space when ``pool``) on x's device. Chunked in
    ``batch_size`` rows; the net runs in whatever mode it is in (pass an eval-mode EMA denoiser).
    """
    if not hasattr(denoiser, "network_input") or not hasattr(denoiser, "net"):
        raise ValueError("denoiser: must be a preconditioned denoiser with `.net` and "
                         "`.network_input(x, sigma)` (a family's PreconditionedDenoiser)")
    check_args(extract_features, {"batch_size": batch_size})
    resolve_tap(denoiser.net, tap)
    sig = torch.as_tensor(sigma, dtype=torch.float64)
    out = []
    for i in range(0, x.shape[0], batch_size):
        xb = x[i:i + batch_size]
        sb = sig if sig.ndim == 0 else sig[i:i + batch_size]
        x_in, c_noise = denoiser.network_input(xb, sb)
        h = tap_features(denoiser.net, x_in, c_noise, tap)
        if pool and h.ndim > 2:
            h = h.flatten(2).mean(-1)
        out.append(h.to(torch.float64))
    return torch.cat(out)


def random_projection(d: int, d_proj: PositiveInt, seed: int = 0, device=None) -> torch.Tensor:
    """Fixed Gaussian projection matrix (d, d_proj), entries N(0, 1/d_proj), float64, seeded."""
    check_args(random_projection, {"d_proj": d_proj})
    z = seeded_noise([int(seed)], (d, d_proj), dtype=torch.float64, device=device,
                     stream=stream("icr.projection"))
    return z[0] / d_proj ** 0.5
