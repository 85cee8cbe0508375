"""Seeded, batched view augmentations for ICR (App. B.6, "Aug.1".."Aug.5", of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

Levels (cumulative, as in the paper):

1. random crop: pad by p = max(1, round(H/8)) pixels with black (-1, torchvision's fill=0 on
   [0, 1] images), crop back to H x W at a random integer offset (p = 4 at 32x32, 1 at 8x8);
2. + horizontal flip with probability 1/2;
3. + colour jitter. RGB (C == 3): brightness, contrast, saturation factors in [0.6, 1.4] and a
   hue rotation of up to +-0.1 turn, in this fixed order (torchvision's
   ColorJitter(0.4, 0.4, 0.4, 0.1) draws a random order). **[choice]** The hue shift is a rotation
   of the chroma plane in YIQ space (a linear approximation of the HSV hue shift). One-channel
   (and any non-RGB) data: the jitter that exists without colour, brightness then contrast with
   factors in [0.6, 1.4] (torchvision's ColorJitter(0.4, 0.4) on grayscale; contrast blends with
   the image's mean), so level 3 differs from level 2 on one-channel data too;
4. + random rotation by an angle uniform in [-15, 15] degrees (bilinear, black fill);
5. + centre crop to round(0.875 H) x round(0.875 W), resized back to H x W (bilinear) so the
   network input keeps its shape.

Level 0 is the identity (views differ by the noise only). Vector data (B, d) has no geometric
augmentation: the only option is an additive Gaussian jitter of std ``vector_jitter`` (default 0:
noise-only views).

Every random parameter of row i is a pure function of ``seeds[i]`` and ``stream`` (counter-based
:func:`seeded_uniform`), so a view is reproducible whatever the batch, device or process count.
Images are expected in [-1, 1]; jitter clamps to that range. Pure torch, no torchvision.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .noise import seeded_noise, seeded_uniform
from .streams import stream

__all__ = ["augment", "noisy_view", "AUG_LEVELS", "crop_padding"]

AUG_LEVELS = (0, 1, 2, 3, 4, 5)
_AUG_STREAM = stream("augment.params")  # view v uses AUG + v and NOISE + v (registered ranges)
_NOISE_STREAM = stream("augment.noise")
_NUM_PARAMS = 8
_JITTER = 0.4
_HUE = 0.1
_DEGREES = 15.0
_CENTER = 0.875


def crop_padding(size: int) -> int:
    """Random-crop padding p = max(1, round(size/8)) (4 px at 32, 1 px at 8)."""
    return max(1, int(round(size / 8)))


def _check(x: torch.Tensor, seeds: torch.Tensor, level: int, vector_jitter: float) -> None:
    if level not in AUG_LEVELS:
        raise ValueError(f"level: must be one of {AUG_LEVELS}, got {level!r}")
    if not torch.is_tensor(x) or x.ndim not in (2, 4):
        raise ValueError("x: expected images (B, C, H, W) or vectors (B, d), got "
                         f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
    if seeds.numel() != x.shape[0]:
        raise ValueError(f"seeds: need one seed per row of x ({x.shape[0]}), got {seeds.numel()}")
    if x.ndim == 4 and min(x.shape[-2:]) < 4:
        raise ValueError(f"x: images must be at least 4x4, got {tuple(x.shape[-2:])}")
    if not vector_jitter >= 0:
        raise ValueError(f"vector_jitter: must be >= 0, got {vector_jitter}")


def _random_crop(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Pad with black, then crop H x W at per-sample integer offsets (u in (0,1), shape (B, 2))."""
    B, C, H, W = x.shape
    py, px = crop_padding(H), crop_padding(W)
    xp = F.pad(x, (px, px, py, py), value=-1.0)
    oy = (u[:, 0] * (2 * py + 1)).floor().long().clamp_(0, 2 * py)
    ox = (u[:, 1] * (2 * px + 1)).floor().long().clamp_(0, 2 * px)
    rows = oy[:, None] + torch.arange(H, device=x.device)  # (B, H)
    cols = ox[:, None] + torch.arange(W, device=x.device)  # (B, W)
    b = torch.arange(B, device=x.device)[:, None, None]
    out = xp.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


def _flip(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return torch.where((u < 0.5)[:, None, None, None], x.flip(-1), x)


def _gray(y: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma of RGB in [0, 1], shape (B, 1, H, W)."""
    w = torch.tensor([0.299, 0.587, 0.114], dtype=y.dtype, device=y.device)
    return (y * w[None, :, None, None]).sum(1, keepdim=True)


def _hue_rotate(y: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate the chroma (I, Q) plane of YIQ by 2*pi*turns: approximate hue shift."""
    rgb2yiq = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322],
                            [0.211, -0.523, 0.312]], dtype=y.dtype, device=y.device)
    yiq2rgb = torch.linalg.inv(rgb2yiq)
    a = 2 * math.pi * turns
    c, s = a.cos(), a.sin()
    one, zero = torch.ones_like(c), torch.zeros_like(c)
    rot = torch.stack([torch.stack([one, zero, zero], -1), torch.stack([zero, c, -s], -1),
                       torch.stack([zero, s, c], -1)], -2)  # (B, 3, 3)
    mat = yiq2rgb @ rot @ rgb2yiq
    return torch.einsum("bij,bjhw->bihw", mat, y)


def _color_jitter(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation, hue (u: (B, 4)); images in [-1, 1], RGB only."""
    y = (x + 1) / 2
    k = lambda v: (1 - _JITTER + 2 * _JITTER * v)[:, None, None, None]  # noqa: E731
    y = (y * k(u[:, 0])).clamp(0, 1)
    mean = _gray(y).mean(dim=(1, 2, 3), keepdim=True)
    y = (k(u[:, 1]) * y + (1 - k(u[:, 1])) * mean).clamp(0, 1)
    y = (k(u[:, 2]) * y + (1 - k(u[:, 2])) * _gray(y)).clamp(0, 1)
    y = _hue_rotate(y, _HUE * (2 * u[:, 3] - 1)).clamp(0, 1)
    return 2 * y - 1


def _intensity_jitter(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Brightness then contrast (u: (B, 2)) for non-RGB images in [-1, 1]: factors in
    [0.6, 1.4]; contrast blends with the per-image mean over channels and pixels."""
    y = (x + 1) / 2
    k = lambda v: (1 - _JITTER + 2 * _JITTER * v)[:, None, None, None]  # noqa: E731
    y = (y * k(u[:, 0])).clamp(0, 1)
    mean = y.mean(dim=(1, 2, 3), keepdim=True)
    y = (k(u[:, 1]) * y + (1 - k(u[:, 1])) * mean).clamp(0, 1)
    return 2 * y - 1


def _rotate(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Rotate by an angle uniform in [-15, 15] degrees about the centre, black fill."""
    a = torch.deg2rad(_DEGREES * (2 * u - 1)).to(x.dtype)
    c, s, z = a.cos(), a.sin(), torch.zeros_like(a)
    theta = torch.stack([torch.stack([c, -s, z], -1), torch.stack([s, c, z], -1)], -2)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x + 1, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False) - 1


def _center_crop(x: torch.Tensor) -> torch.Tensor:
    H, W = x.shape[-2:]
    h, w = max(1, round(_CENTER * H)), max(1, round(_CENTER * W))
    top, left = (H - h) // 2, (W - w) // 2
    crop = x[..., top:top + h, left:left + w]
    return F.interpolate(crop, size=(H, W), mode="bilinear", align_corners=False)


def augment(x: torch.Tensor, seeds, level: int = 3, stream: int = 0,
            vector_jitter: float = 0.0) -> torch.Tensor:
    """Augmentation level ``level`` (module docstring) of x, row i seeded by ``seeds[i]``.

    ``stream`` selects independent parameters for the same seeds (view 1 vs view 2).
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64, device=x.device).reshape(-1)
    _check(x, seeds, level, vector_jitter)
    if x.ndim == 2:
        if vector_jitter == 0:
            return x
        z = seeded_noise(seeds, x.shape[1:], dtype=x.dtype, device=x.device,
                         stream=_AUG_STREAM + stream)
        return x + vector_jitter * z
    if level == 0:
        return x
    u = seeded_uniform(seeds, _NUM_PARAMS, device=x.device, stream=_AUG_STREAM + stream)
    u = u.to(x.dtype) if x.is_floating_point() else u
    out = _random_crop(x, u[:, 0:2])
    if level >= 2:
        out = _flip(out, u[:, 2])
    if level >= 3:
        out = _color_jitter(out, u[:, 3:7]) if x.shape[1] == 3 else _intensity_jitter(out, u[:, 3:5])
    if level >= 4:
        out = _rotate(out, u[:, 7])
    if level >= 5:
        out = _center_crop(out)
    return out


def noisy_view(x: torch.Tensor, seeds, sigma: float, level: int = 3, view: int = 0,
               vector_jitter: float = 0.0) -> torch.Tensor:
    """One ICR view: augmentation, **then** independent Gaussian noise at sigma (paper fn. 1).

    ``view`` indexes independent views of the same seeds (augmentation and noise streams differ
    per view), so views 0 and 1 of seeds s are the pair (a_1(x0), a_2(x0)) of App. B.6.
    """
    if not float(sigma) >= 0:
        raise ValueError(f"sigma: must be >= 0, got {sigma}")
    seeds = torch.as_tensor(seeds, dtype=torch.int64, device=x.device).reshape(-1)
    xa = augment(x, seeds, level=level, stream=view, vector_jitter=vector_jitter)
    n = seeded_noise(seeds, x.shape[1:], dtype=torch.float64, device=x.device,
                     stream=_NOISE_STREAM + view)
    return xa + float(sigma) * n.to(xa.dtype)
