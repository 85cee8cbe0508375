"""U-Net family of the PFD paper (Table 2): EDM's SongUNet "ddpm++" layout.

Own implementation of the architecture described by Song et al. (2021) as configured by
Karras et al. (2022) for CIFAR-10 ("ddpm++"):

* c_noise -> positional (or Fourier) embedding -> 2-layer MLP -> ``emb`` (SiLU after each);
* every residual ``UNetBlock``: GroupNorm -> SiLU -> conv3x3 -> (+ affine(emb), or adaptive
  scale/shift) -> GroupNorm -> SiLU -> dropout -> conv3x3, plus a 1x1 skip conv when the
  channel count changes or the block resamples; the sum is scaled by sqrt(1/2); optional
  single-head self-attention after the residual part (also scaled by sqrt(1/2));
* encoder: conv3x3 stem, then per level ``num_blocks`` blocks (the first levels after 0 are
  preceded by a down-sampling block: 2x2 average pooling + conv);
* decoder: at the lowest level two blocks ``in0`` (with attention) and ``in1``; at the other
  levels an up-sampling block (nearest x2 + conv); at every level ``num_blocks + 1`` blocks
  that consume the encoder skips; attention in the last decoder block of the listed
  resolutions and in every encoder block of them; output GroupNorm -> SiLU -> conv3x3.

Module names follow EDM ("enc.32x32_block0", "dec.16x16_block1", "dec.8x8_in0", ...), so the
ICR tap of "Evaluating the Representation Space of Diffusion Models via Self-Supervised
Principles" (``dec.16x16_block1``) is addressed by the same string.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, did_you_mean
from .layers import TappedNetwork, as_noise_labels, group_norm, init_xavier, make_noise_embedding

__all__ = ["UNet", "UNetBlock", "UNET_PRESETS"]

# PFD paper Table 2: width per level = model_channels * channel_mult.
UNET_PRESETS: Dict[str, dict] = {
    "unet1": dict(model_channels=16, channel_mult=(2, 2, 2), num_blocks=4),    # 0.9M
    "unet2": dict(model_channels=32, channel_mult=(2, 2, 2), num_blocks=4),    # 3.5M
    "unet3": dict(model_channels=48, channel_mult=(2, 2, 2), num_blocks=4),    # 7.9M
    "unet4": dict(model_channels=64, channel_mult=(2, 2, 2), num_blocks=4),    # 14.0M
    # unet5: widths 80,160,160. model_channels=80 with [1,2,2] (embedding 320 wide) gives
    # 17.06M = Table 2's 17.1M; model_channels=40 with [2,4,4] would give 16.19M (-5 %).
    "unet5": dict(model_channels=80, channel_mult=(1, 2, 2), num_blocks=4),    # 17.1M
    "unet6": dict(model_channels=80, channel_mult=(2, 2, 2), num_blocks=3),    # 17.8M
    "unet7": dict(model_channels=80, channel_mult=(2, 2, 2), num_blocks=4),    # 21.8M
    "unet8": dict(model_channels=96, channel_mult=(2, 2, 2), num_blocks=4),    # 31.3M
    "unet9": dict(model_channels=112, channel_mult=(2, 2, 2), num_blocks=4),   # 42.7M
    "unet10": dict(model_channels=128, channel_mult=(2, 2, 2), num_blocks=4),  # 55.7M
}

# Reference parameter counts at 32x32x3 (PFD paper Table 2).
UNET_PRESET_PARAMS: Dict[str, float] = {
    "unet1": 0.881e6, "unet2": 3.5e6, "unet3": 7.9e6, "unet4": 14.0e6, "unet5": 17.1e6,
    "unet6": 17.8e6, "unet7": 21.8e6, "unet8": 31.3e6, "unet9": 42.7e6, "unet10": 55.73e6,
}

_SKIP_SCALE = math.sqrt(0.5)
_INIT_ZERO = 1e-5           # EDM's "init_zero": output layers start almost (not exactly) at 0
_INIT_ATTN = math.sqrt(0.2)


def _conv(cin: int, cout: int, kernel: int, gain: float = 1.0) -> nn.Conv2d:
    return init_xavier(nn.Conv2d(cin, cout, kernel, padding=kernel // 2), gain)


def _resample(x: torch.Tensor, up: bool, down: bool) -> torch.Tensor:
    """EDM's [1,1] resample filter: nearest x2 up-sampling or 2x2 average-pool down-sampling."""
    if up:
        return F.interpolate(x, scale_factor=2, mode="nearest")
    if down:
        return F.avg_pool2d(x, 2)
    return x


class UNetBlock(nn.Module):
    """Residual block with noise conditioning and optional self-attention (SongUNet/ddpm++).

    ``adaptive_scale=False`` (ddpm++): h <- SiLU(GN(h + affine(emb)));
    ``adaptive_scale=True``: h <- SiLU(GN(h) * (1 + scale) + shift) with (scale, shift) = affine(emb).
    """

    def __init__(self, in_channels: int, out_channels: int, emb_channels: int, *,
                 up: bool = False, down: bool = False, attention: bool = False,
                 dropout: float = 0.0, adaptive_scale: bool = False, eps: float = 1e-6):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.up, self.down = up, down
        self.adaptive_scale = adaptive_scale
        self.dropout = float(dropout)
        self.norm0 = group_norm(in_channels, eps)
        self.conv0 = _conv(in_channels, out_channels, 3)
        self.affine = init_xavier(nn.Linear(emb_channels, out_channels * (2 if adaptive_scale else 1)))
        self.norm1 = group_norm(out_channels, eps)
        self.conv1 = _conv(out_channels, out_channels, 3, _INIT_ZERO)
        needs_skip = in_channels != out_channels or up or down
        self.skip = _conv(in_channels, out_channels, 1) if needs_skip else None
        self.attention = attention
        if attention:
            self.norm2 = group_norm(out_channels, eps)
            self.qkv = _conv(out_channels, 3 * out_channels, 1, _INIT_ATTN)
            self.proj = _conv(out_channels, out_channels, 1, _INIT_ZERO)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        orig = x
        x = self.conv0(_resample(F.silu(self.norm0(x)), self.up, self.down))
        params = self.affine(emb)[:, :, None, None].to(x.dtype)
        if self.adaptive_scale:
            scale, shift = params.chunk(2, dim=1)
            x = F.silu(torch.addcmul(shift, self.norm1(x), scale + 1))
        else:
            x = F.silu(self.norm1(x + params))
        x = self.conv1(F.dropout(x, p=self.dropout, training=self.training))
        skip = orig if self.skip is None else self.skip(_resample(orig, self.up, self.down))
        x = (x + skip) * _SKIP_SCALE
        if self.attention:
            x = (x + self._attend(x)) * _SKIP_SCALE
        return x

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        """Single-head self-attention over the H*W positions: softmax(q^T k / sqrt(C)) v."""
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm2(x)).reshape(B, 3, C, H * W).transpose(2, 3).unbind(1)
        a = F.scaled_dot_product_attention(q, k, v)                 # (B, HW, C)
        return self.proj(a.transpose(1, 2).reshape(B, C, H, W))


def _preset_hint(preset) -> str:
    close = did_you_mean(preset, UNET_PRESETS) or did_you_mean(str(preset).replace("-", ""), UNET_PRESETS)
    return (f"did you mean {close!r}? " if close else "") + "(or None for explicit widths)"


class UNet(TappedNetwork):
    """EDM SongUNet "ddpm++" U-Net, ``net(x_in, c_noise) -> F`` with F of the shape of x_in.

    Args:
        preset: ``"unet1"``..``"unet10"`` (PFD paper Table 2) or None. Explicit
            keyword arguments override the preset's values.
        img_resolution: side length H = W; must be divisible by 2**(len(channel_mult)-1)
            (28 works natively with 3 levels: 28 -> 14 -> 7; no padding is done).
        in_channels, out_channels: image channels (out defaults to in).
        model_channels: base width; level i has ``model_channels * channel_mult[i]`` channels.
        channel_mult: per-level multipliers (default (2, 2, 2)).
        num_blocks: residual blocks per encoder level (decoder: num_blocks + 1).
        attn_resolutions: resolutions with self-attention; default = the second level
            (16 for 32x32 input, 14 for 28x28, ...). Each must be one of the level resolutions.
        dropout: dropout probability inside the blocks.
        channel_mult_emb: embedding width = model_channels * channel_mult_emb.
        channel_mult_noise: noise-embedding width = model_channels * channel_mult_noise.
        embedding_type: ``"positional"`` (ddpm++) or ``"fourier"``.
        adaptive_scale: per-block scale/shift conditioning instead of EDM ddpm++'s additive one.

    Without preset and arguments the net is EDM's CIFAR-10 ddpm++ (= ``unet10``, 55.7M params).

    Attributes:
        data_shape: (in_channels, img_resolution, img_resolution).
        feature_taps: dict "enc.<r>x<r>_<name>" / "dec.<r>x<r>_<name>" -> submodule.
        default_tap: ``dec.<r>x<r>_block1`` at the second level r = img_resolution // 2 (the
            level itself when there is only one); for 32x32 input this is EDM's
            ``dec.16x16_block1``, the ICR layer of the paper.
    """

    def __init__(self, preset: Optional[str] = None, img_resolution: int = 32, in_channels: int = 3,
                 out_channels: Optional[int] = None, model_channels: Optional[int] = None,
                 channel_mult: Optional[Sequence[int]] = None, num_blocks: Optional[int] = None,
                 attn_resolutions: Optional[Sequence[int]] = None, dropout: float = 0.10,
                 channel_mult_emb: int = 4, channel_mult_noise: int = 1,
                 embedding_type: str = "positional", adaptive_scale: bool = False):
        super().__init__()
        cfg = _resolve_config(preset, model_channels, channel_mult, num_blocks)
        _validate(img_resolution, in_channels, out_channels, cfg, dropout, channel_mult_emb,
                  channel_mult_noise)
        mc, mult, nb = cfg["model_channels"], cfg["channel_mult"], cfg["num_blocks"]
        res_levels = [img_resolution >> level for level in range(len(mult))]
        attn = _resolve_attention(attn_resolutions, res_levels)
        out_channels = in_channels if out_channels is None else int(out_channels)

        self.preset = preset
        self.img_resolution = img_resolution
        self.in_channels, self.out_channels = in_channels, out_channels
        self.model_channels, self.channel_mult, self.num_blocks = mc, tuple(mult), nb
        self.attn_resolutions = tuple(attn)
        self.data_shape = (in_channels, img_resolution, img_resolution)

        emb_ch, noise_ch = mc * channel_mult_emb, mc * channel_mult_noise
        block = dict(emb_channels=emb_ch, dropout=dropout, adaptive_scale=adaptive_scale)
        self.map_noise = make_noise_embedding(embedding_type, noise_ch)
        self.map_layer0 = init_xavier(nn.Linear(noise_ch, emb_ch))
        self.map_layer1 = init_xavier(nn.Linear(emb_ch, emb_ch))

        self.enc = nn.ModuleDict()
        cout = in_channels
        for level, m in enumerate(mult):
            r = res_levels[level]
            if level == 0:
                self.enc[f"{r}x{r}_conv"] = _conv(cout, mc, 3)
                cout = mc
            else:
                self.enc[f"{r}x{r}_down"] = UNetBlock(cout, cout, down=True, **block)
            for idx in range(nb):
                self.enc[f"{r}x{r}_block{idx}"] = UNetBlock(cout, mc * m, attention=r in attn, **block)
                cout = mc * m
        skips = [_out_channels(b) for b in self.enc.values()]

        self.dec = nn.ModuleDict()
        for level in reversed(range(len(mult))):
            r = res_levels[level]
            if level == len(mult) - 1:
                self.dec[f"{r}x{r}_in0"] = UNetBlock(cout, cout, attention=True, **block)
                self.dec[f"{r}x{r}_in1"] = UNetBlock(cout, cout, **block)
            else:
                self.dec[f"{r}x{r}_up"] = UNetBlock(cout, cout, up=True, **block)
            for idx in range(nb + 1):
                cin = cout + skips.pop()
                cout = mc * mult[level]
                self.dec[f"{r}x{r}_block{idx}"] = UNetBlock(
                    cin, cout, attention=(idx == nb and r in attn), **block)
        r = img_resolution
        self.dec[f"{r}x{r}_aux_norm"] = group_norm(cout)
        self.dec[f"{r}x{r}_aux_conv"] = _conv(cout, out_channels, 3, _INIT_ZERO)

        r2 = res_levels[min(1, len(mult) - 1)]
        self.default_tap = f"dec.{r2}x{r2}_block1"

    @property
    def feature_taps(self) -> Dict[str, nn.Module]:
        """Name -> submodule for forward hooks, in execution order (built on access, so copies
        made by deepcopy / EMA / replication always point at their own modules)."""
        return {**{f"enc.{k}": v for k, v in self.enc.items()},
                **{f"dec.{k}": v for k, v in self.dec.items()}}

    # ------------------------------------------------------------------ forward
    def embed(self, c_noise: torch.Tensor) -> torch.Tensor:
        """c_noise (B,) -> conditioning vector emb (B, model_channels * channel_mult_emb)."""
        emb = self.map_noise(c_noise)
        emb = F.silu(self.map_layer0(emb))
        return F.silu(self.map_layer1(emb))

    def _run(self, x: torch.Tensor, c_noise, stop_at: Optional[str]) -> torch.Tensor:
        self._check_input(x)
        emb = self.embed(as_noise_labels(c_noise, x.shape[0], x.device))
        skips: List[torch.Tensor] = []
        for name, blk in self.enc.items():
            x = blk(x, emb) if isinstance(blk, UNetBlock) else blk(x)
            skips.append(x)
            if stop_at == "enc." + name:
                return x
        for name, blk in self.dec.items():
            if name.endswith("aux_norm"):
                x = blk(x)
            elif name.endswith("aux_conv"):
                x = blk(F.silu(x))
            else:
                if "_block" in name:                    # decoder blocks consume a skip
                    x = torch.cat([x, skips.pop()], dim=1)
                x = blk(x, emb)
            if stop_at == "dec." + name:
                return x
        return x

    def _check_input(self, x: torch.Tensor) -> None:
        if tuple(x.shape[1:]) != self.data_shape:
            raise ValueError(f"x_in: expected shape (B, {', '.join(map(str, self.data_shape))}), "
                             f"got {tuple(x.shape)}")

    def extra_repr(self) -> str:
        return (f"preset={self.preset}, data_shape={self.data_shape}, model_channels="
                f"{self.model_channels}, channel_mult={self.channel_mult}, num_blocks="
                f"{self.num_blocks}, attn_resolutions={self.attn_resolutions}")


# ---------------------------------------------------------------------- config helpers
def _out_channels(m: nn.Module) -> int:
    return m.out_channels


def _resolve_config(preset, model_channels, channel_mult, num_blocks) -> dict:
    if preset is None:
        cfg = dict(UNET_PRESETS["unet10"])
    elif preset in UNET_PRESETS:
        cfg = dict(UNET_PRESETS[preset])
    else:
        raise ConfigError("preset", "unknown UNet preset", value=preset, accepted=list(UNET_PRESETS),
                          suggestion=_preset_hint(preset))
    for key, val in (("model_channels", model_channels), ("channel_mult", channel_mult),
                     ("num_blocks", num_blocks)):
        if val is not None:
            cfg[key] = val
    cfg["channel_mult"] = tuple(int(m) for m in cfg["channel_mult"])
    return cfg


def _validate(img_resolution, in_channels, out_channels, cfg, dropout, channel_mult_emb,
              channel_mult_noise) -> None:
    """ConfigError (a ValueError) naming the argument: the command line adds its config path."""
    mult = cfg["channel_mult"]
    if len(mult) < 1 or any(m < 1 for m in mult):
        raise ConfigError("channel_mult", "must be a non-empty list of positive ints", value=list(mult))
    for name in ("model_channels", "num_blocks"):
        if int(cfg[name]) < 1:
            raise ConfigError(name, "must be >= 1", value=cfg[name])
    factor = 2 ** (len(mult) - 1)
    if not isinstance(img_resolution, int) or img_resolution < 1 or img_resolution % factor:
        raise ConfigError("img_resolution", f"must be a positive multiple of 2**(len(channel_mult)-1) = {factor} "
                          f"(e.g. 8, 16, 28, 32 for 3 levels)", value=img_resolution)
    for name, val in (("in_channels", in_channels), ("out_channels", out_channels),
                      ("channel_mult_emb", channel_mult_emb), ("channel_mult_noise", channel_mult_noise)):
        if val is not None and val < 1:
            raise ConfigError(name, "must be >= 1", value=val)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError("dropout", "must lie in [0, 1)", value=dropout)
    if (cfg["model_channels"] * channel_mult_noise) % 2:
        raise ConfigError("model_channels", "times channel_mult_noise must be even (sin/cos pairs)",
                          value=cfg["model_channels"])


def _resolve_attention(attn_resolutions, res_levels: List[int]) -> List[int]:
    if attn_resolutions is None:
        return [res_levels[1]] if len(res_levels) > 1 else []
    attn = [int(r) for r in attn_resolutions]
    bad = [r for r in attn if r not in res_levels]
    if bad:
        raise ConfigError("attn_resolutions", f"{bad} not among the level resolutions", value=attn,
                          accepted=res_levels)
    return attn
