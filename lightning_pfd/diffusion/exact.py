"""Exact (analytic) denoisers: Gaussian and Gaussian mixture (PFD paper eq. 27-41).

Both follow the project interface ``D(x, sigma) -> x0_hat`` in sigma-space and work in
float64. They serve as analytic teachers (exact scores, no training) and as oracles for the
sampler and for PFD.
"""
from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch
from torch import nn

from .noise import seeded_noise, seeded_uniform
from .streams import stream

__all__ = ["GaussianDenoiser", "GaussianMixtureDenoiser"]


def _flat_sigma2(sigma, x: torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(sigma, dtype=torch.float64, device=x.device)
    if s.ndim == 0:
        s = s.expand(x.shape[0])
    return s.reshape(-1, 1) ** 2


def _check_cov(cov: torch.Tensor, name: str) -> None:
    if cov.shape[-1] != cov.shape[-2]:
        raise ValueError(f"{name}: must be square, got shape {tuple(cov.shape)}")
    if not torch.allclose(cov, cov.transpose(-1, -2), atol=1e-10, rtol=1e-8):
        raise ValueError(f"{name}: must be symmetric")


def _fingerprint(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu", torch.float64).contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


class GaussianDenoiser(nn.Module):
    """Exact denoiser of N(mu, Sigma): D(x; s) = mu + Sigma (Sigma + s^2 I)^{-1} (x - mu).

    With Sigma = U diag(lam) U^T the PF-ODE has the closed-form solution of the PFD paper's
    eq. 32, ``flow_map``. ``shape`` lets data be images (flattened internally).
    """

    sigma_range = (0.0, math.inf)  # exact at every noise level: no grid is clamped

    def __init__(self, mean: torch.Tensor, cov: torch.Tensor, shape: Sequence[int] | None = None):
        super().__init__()
        mean = torch.as_tensor(mean, dtype=torch.float64).reshape(-1)
        cov = torch.as_tensor(cov, dtype=torch.float64)
        _check_cov(cov, "cov")
        if cov.shape[0] != mean.shape[0]:
            raise ValueError(f"cov: shape {tuple(cov.shape)} does not match mean of length {mean.shape[0]}")
        lam, U = torch.linalg.eigh(cov)
        if lam.min() < -1e-10 * max(1.0, float(lam.abs().max())):
            raise ValueError("cov: must be positive semi-definite")
        self.register_buffer("mean", mean)
        self.register_buffer("cov", cov)
        self.register_buffer("lam", lam.clamp(min=0))
        self.register_buffer("U", U)
        self.shape = tuple(shape) if shape is not None else (mean.shape[0],)
        if math.prod(self.shape) != mean.shape[0]:
            raise ValueError(f"shape: {self.shape} has {math.prod(self.shape)} elements, mean has {mean.shape[0]}")

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def fingerprint(self) -> str:
        return "gauss-" + _fingerprint(self.mean, self.cov)

    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        xf = x.reshape(x.shape[0], -1).to(torch.float64)
        s2 = _flat_sigma2(sigma, xf)
        proj = (xf - self.mean) @ self.U
        out = self.mean + (proj * self.lam / (self.lam + s2)) @ self.U.T
        return out.reshape(x.shape)

    def score(self, x: torch.Tensor, sigma) -> torch.Tensor:
        s2 = _flat_sigma2(sigma, x.reshape(x.shape[0], -1)).reshape(-1, *([1] * (x.ndim - 1)))
        return (self.forward(x, sigma) - x.to(torch.float64)) / s2

    def flow_map(self, x_T: torch.Tensor, T: float, t: float = 0.0) -> torch.Tensor:
        """Exact PF-ODE solution from time T to t (PFD paper eq. 32):
        x_t = mu + U diag(sqrt((lam + t^2)/(lam + T^2))) U^T (x_T - mu)."""
        xf = x_T.reshape(x_T.shape[0], -1).to(torch.float64)
        scale = ((self.lam + t**2) / (self.lam + T**2)).sqrt()
        out = self.mean + (((xf - self.mean) @ self.U) * scale) @ self.U.T
        return out.reshape(x_T.shape)

    def sqrt_cov(self) -> torch.Tensor:
        return (self.U * self.lam.sqrt()) @ self.U.T

    def sample(self, seeds) -> torch.Tensor:
        """Exact samples mu + Sigma^{1/2} z, one per seed (z = seeded_noise)."""
        z = seeded_noise(seeds, (self.dim,), device=self.mean.device, stream=stream("gmm.noise"))
        return (self.mean + z @ self.sqrt_cov()).reshape(-1, *self.shape)


class GaussianMixtureDenoiser(nn.Module):
    """Exact denoiser of sum_k w_k N(mu_k, Sigma_k) (per component: PFD paper eq. 30).

    D(x; s) = sum_k r_k(x, s) [mu_k + Sigma_k (Sigma_k + s^2 I)^{-1} (x - mu_k)] with
    responsibilities r_k proportional to w_k N(x; mu_k, Sigma_k + s^2 I), computed in the log
    domain from the eigendecomposition of each Sigma_k (done once).
    """

    sigma_range = (0.0, math.inf)  # exact at every noise level: no grid is clamped

    def __init__(self, weights: torch.Tensor, means: torch.Tensor, covs: torch.Tensor,
                 shape: Sequence[int] | None = None):
        super().__init__()
        w = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
        means = torch.as_tensor(means, dtype=torch.float64)
        covs = torch.as_tensor(covs, dtype=torch.float64)
        K = w.shape[0]
        if K < 1 or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise ValueError("weights: need at least one non-negative weight with a positive sum")
        if means.ndim != 2 or means.shape[0] != K:
            raise ValueError(f"means: expected shape ({K}, d), got {tuple(means.shape)}")
        d = means.shape[1]
        if covs.shape != (K, d, d):
            raise ValueError(f"covs: expected shape ({K}, {d}, {d}), got {tuple(covs.shape)}")
        _check_cov(covs, "covs")
        lam, U = torch.linalg.eigh(covs)
        if lam.min() < -1e-10 * max(1.0, float(lam.abs().max())):
            raise ValueError("covs: must be positive semi-definite")
        self.register_buffer("weights", w / w.sum())
        self.register_buffer("means", means)
        self.register_buffer("covs", covs)
        self.register_buffer("lam", lam.clamp(min=0))  # (K, d)
        self.register_buffer("U", U)  # (K, d, d)
        self.shape = tuple(shape) if shape is not None else (d,)
        if math.prod(self.shape) != d:
            raise ValueError(f"shape: {self.shape} has {math.prod(self.shape)} elements, means have {d}")

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    @property
    def num_components(self) -> int:
        return self.means.shape[0]

    def fingerprint(self) -> str:
        return "gmm-" + _fingerprint(self.weights, self.means, self.covs)

    def _components(self, xf: torch.Tensor, s2: torch.Tensor):
        """Per-component projections, shrinkage and log-densities, batched over K."""
        diff = xf[:, None, :] - self.means[None]  # (B, K, d)
        proj = torch.einsum("bkd,kde->bke", diff, self.U)  # coordinates in each eigenbasis
        var = self.lam[None] + s2[:, :, None]  # (B, K, d)
        logdet = var.log().sum(-1)
        maha = (proj.square() / var).sum(-1)
        logp = -0.5 * (maha + logdet + self.dim * math.log(2 * math.pi))  # (B, K)
        return proj, var, logp

    def log_prob(self, x: torch.Tensor, sigma=0.0) -> torch.Tensor:
        """log p_sigma(x) of the mixture convolved with N(0, sigma^2 I)."""
        xf = x.reshape(x.shape[0], -1).to(torch.float64)
        _, _, logp = self._components(xf, _flat_sigma2(sigma, xf))
        return torch.logsumexp(logp + self.weights.log(), dim=1)

    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        xf = x.reshape(x.shape[0], -1).to(torch.float64)
        proj, var, logp = self._components(xf, _flat_sigma2(sigma, xf))
        r = torch.softmax(logp + self.weights.log(), dim=1)  # (B, K)
        shrunk = proj * (self.lam[None] / var)  # (B, K, d)
        x0_k = self.means[None] + torch.einsum("bke,kde->bkd", shrunk, self.U)
        return (r[:, :, None] * x0_k).sum(1).reshape(x.shape)

    def score(self, x: torch.Tensor, sigma) -> torch.Tensor:
        s2 = _flat_sigma2(sigma, x.reshape(x.shape[0], -1)).reshape(-1, *([1] * (x.ndim - 1)))
        return (self.forward(x, sigma) - x.to(torch.float64)) / s2

    def sample(self, seeds) -> torch.Tensor:
        """Exact samples: component by inverse CDF of a seeded uniform, then mu_k + Sigma_k^{1/2} z."""
        dev = self.means.device
        u = seeded_uniform(seeds, 1, device=dev, stream=stream("gmm.component"))[:, 0]
        k = torch.searchsorted(self.weights.cumsum(0), u).clamp(max=self.num_components - 1)
        z = seeded_noise(seeds, (self.dim,), device=dev, stream=stream("gmm.noise"))
        root = self.U * self.lam.sqrt()[:, None, :]  # (K, d, d): U diag(sqrt lam)
        x = self.means[k] + torch.einsum("bij,bj->bi", root[k], z)
        return x.reshape(-1, *self.shape)

    @classmethod
    def fit(cls, data: torch.Tensor, n_components: int = 10, reg_covar: float = 1e-3,
            seed: int = 0, shape: Sequence[int] | None = None) -> "GaussianMixtureDenoiser":
        """Fit a full-covariance GMM to data (scikit-learn EM); e.g. an analytic digits teacher."""
        from sklearn.mixture import GaussianMixture

        X = torch.as_tensor(data).reshape(len(data), -1).double().cpu().numpy()
        if n_components < 1 or n_components > len(X):
            raise ValueError(f"n_components: must be in [1, {len(X)}], got {n_components}")
        gm = GaussianMixture(n_components, covariance_type="full", reg_covar=reg_covar,
                             random_state=seed).fit(X)
        covs = torch.as_tensor(gm.covariances_)
        covs = 0.5 * (covs + covs.transpose(-1, -2))
        return cls(torch.as_tensor(gm.weights_), torch.as_tensor(gm.means_), covs,
                   shape=shape if shape is not None else tuple(data.shape[1:]))
