"""Baselines PFD is compared against ("Understanding Generalization in Diffusion Distillation via
Probability Flow Distance", the PFD paper: Sec. 2.4, App. B-C.1).

- Closed forms for Gaussians: PFD (eq. 39) and the 2-Wasserstein distance (eq. 41).
- ``sample_w2``: exact W2 between two equal-weight point clouds by optimal transport (POT's
  ``ot.emd2`` on squared Euclidean costs; O(M^2) memory, O(M^3) time -- for experiments only).
- Frechet distance (FID) and kernel distance (KID) computed in the same Psi space as PFD by
  torchmetrics' ``FrechetInceptionDistance`` / ``KernelInceptionDistance`` with a custom feature
  module (never the Inception download path). FID estimates W2^2 of the Gaussian fits.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from .descriptors import build_descriptor

__all__ = ["psd_sqrt", "gaussian_pfd", "gaussian_w2", "sample_w2", "DescriptorFeatures",
           "descriptor_fid", "descriptor_kid", "frechet_distance", "kernel_distance"]


def psd_sqrt(cov: torch.Tensor) -> torch.Tensor:
    """Symmetric square root of a PSD matrix (float64, eigenvalues clamped at 0)."""
    cov = torch.as_tensor(cov, dtype=torch.float64)
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    lam, U = torch.linalg.eigh(cov)
    return (U * lam.clamp(min=0).sqrt().unsqueeze(-2)) @ U.transpose(-1, -2)


def _check_gauss(mu1, cov1, mu2, cov2):
    mu1, mu2 = (torch.as_tensor(m, dtype=torch.float64).reshape(-1) for m in (mu1, mu2))
    cov1, cov2 = (torch.as_tensor(c, dtype=torch.float64) for c in (cov1, cov2))
    d = mu1.shape[0]
    for name, m, c in (("1", mu1, cov1), ("2", mu2, cov2)):
        if m.shape[0] != d or c.shape != (d, d):
            raise ValueError(f"mu{name}/cov{name}: expected shapes ({d},) and ({d}, {d}), got "
                             f"{tuple(m.shape)} and {tuple(c.shape)}")
    return mu1, cov1, mu2, cov2


def gaussian_pfd(mu1, cov1, mu2, cov2) -> torch.Tensor:
    """PFD between N(mu1, S1) and N(mu2, S2) (eq. 39): (||mu1-mu2||^2 + ||S1^1/2 - S2^1/2||_F^2)^1/2."""
    mu1, cov1, mu2, cov2 = _check_gauss(mu1, cov1, mu2, cov2)
    return ((mu1 - mu2).square().sum() + (psd_sqrt(cov1) - psd_sqrt(cov2)).square().sum()).sqrt()


def gaussian_w2(mu1, cov1, mu2, cov2) -> torch.Tensor:
    """W2 between Gaussians (eq. 41): (||mu1-mu2||^2 + Tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2))^1/2."""
    mu1, cov1, mu2, cov2 = _check_gauss(mu1, cov1, mu2, cov2)
    r1 = psd_sqrt(cov1)
    tr = torch.trace(cov1) + torch.trace(cov2) - 2 * torch.trace(psd_sqrt(r1 @ cov2 @ r1))
    return ((mu1 - mu2).square().sum() + tr.clamp(min=0)).sqrt()


def sample_w2(x: torch.Tensor, y: torch.Tensor, num_itermax: int = 10_000_000) -> torch.Tensor:
    """Exact W2 between the empirical measures of ``x`` (M, ...) and ``y`` (M', ...) (POT emd2)."""
    try:
        import ot
    except ImportError as e:
        raise ImportError("sample_w2 needs POT: pip install POT") from e
    xf = torch.as_tensor(x).reshape(len(x), -1).to(torch.float64).cpu()
    yf = torch.as_tensor(y).reshape(len(y), -1).to(torch.float64).cpu()
    if xf.shape[1] != yf.shape[1]:
        raise ValueError(f"x/y: feature dimensions differ ({xf.shape[1]} vs {yf.shape[1]})")
    cost = torch.cdist(xf, yf).square().numpy()
    a = torch.full((len(xf),), 1.0 / len(xf), dtype=torch.float64).numpy()
    b = torch.full((len(yf),), 1.0 / len(yf), dtype=torch.float64).numpy()
    return torch.tensor(float(ot.emd2(a, b, cost, numItermax=num_itermax))).clamp(min=0).sqrt()


class DescriptorFeatures(nn.Module):
    """Feature module for torchmetrics' FID/KID: Psi(x) flattened, float64, with ``num_features``."""

    def __init__(self, descriptor=None, num_features: Optional[int] = None,
                 sample_shape: Optional[Sequence[int]] = None):
        super().__init__()
        self.descriptor = build_descriptor(descriptor)
        if num_features is None:
            num_features = getattr(self.descriptor, "num_features", None)
        if num_features is None:
            if sample_shape is None:
                raise ValueError("num_features: unknown for this descriptor; give num_features or sample_shape")
            with torch.no_grad():
                num_features = self(torch.zeros(2, *sample_shape)).shape[1]
        self.num_features = int(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.descriptor(x).reshape(x.shape[0], -1).to(torch.float64)


def descriptor_fid(descriptor=None, num_features=None, sample_shape=None, **kwargs):
    """torchmetrics ``FrechetInceptionDistance`` in Psi space (update(x, real=bool))."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    return FrechetInceptionDistance(feature=DescriptorFeatures(descriptor, num_features, sample_shape), **kwargs)


def descriptor_kid(descriptor=None, num_features=None, sample_shape=None, **kwargs):
    """torchmetrics ``KernelInceptionDistance`` in Psi space (update(x, real=bool))."""
    from torchmetrics.image.kid import KernelInceptionDistance

    return KernelInceptionDistance(feature=DescriptorFeatures(descriptor, num_features, sample_shape), **kwargs)


@torch.no_grad()
def frechet_distance(real: torch.Tensor, fake: torch.Tensor, descriptor=None) -> torch.Tensor:
    """Frechet distance ||mu_r - mu_f||^2 + Tr(S_r + S_f - 2 (S_r S_f)^1/2) of Psi features (FID)."""
    fid = descriptor_fid(descriptor, sample_shape=tuple(real.shape[1:]), sync_on_compute=False)
    fid.update(real, real=True)
    fid.update(fake, real=False)
    return fid.compute().to(torch.float64)


@torch.no_grad()
def kernel_distance(real: torch.Tensor, fake: torch.Tensor, descriptor=None, subsets: int = 100,
                    subset_size: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KID (mean, std over subsets) of Psi features; subset_size defaults to min(M, 1000)."""
    n = min(len(real), len(fake))
    kid = descriptor_kid(descriptor, sample_shape=tuple(real.shape[1:]), subsets=subsets,
                         subset_size=subset_size or min(n, 1000), sync_on_compute=False)
    kid.update(real, real=True)
    kid.update(fake, real=False)
    return kid.compute()
