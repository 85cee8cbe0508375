"""Synthetic spatially correlated heavy-tailed fields with a controllable tail index.

Field i (a pure function of seed i): white noise w = seeded_noise([seed]) on an L x L grid,
a Gaussian random field z = ifft2(fft2(w) H) with H(k) = (|k|^2 + k0^2)^(-slope/4)
normalised so mean(H^2) = 1 (Parseval: every pixel of z is exactly N(0, 1); the power
spectrum is P(k) ~ (|k|^2 + k0^2)^(-slope/2), periodic boundaries), then the marginal
transform x = F^{-1}(Phi(z)):
  * "student_t": Student-t with nu = tail_index degrees of freedom, P(|X| > x) ~ x^(-nu);
  * "gpd": generalised Pareto with shape xi = 1/tail_index (scale 1, location 0), positive,
    P(X > x) ~ x^(-tail_index).
Every pixel then has exactly the chosen marginal, neighbouring pixels are strongly dependent
(Gaussian copula), and thousands of 32 x 32 fields take well under a second.
"""
from __future__ import annotations

import math
import typing
from typing import Literal, Optional

import torch

from ..diffusion.noise import seeded_noise
from ..diffusion.streams import stream
from ..validation import IntAtLeastTwo, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, check_args
from .base import TensorDataModule
from .gmm import check_disjoint_ranges

__all__ = ["heavy_tailed_fields", "gaussian_random_field", "HeavyTailedFieldDataModule",
           "MARGINALS"]

#: the heavy-tailed marginals (module docstring)
Marginal = Literal["student_t", "gpd"]
MARGINALS = typing.get_args(Marginal)


def _filter(size: int, slope: float, k0: float, device=None) -> torch.Tensor:
    k = torch.fft.fftfreq(size, d=1.0 / size, device=device).to(torch.float64)
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    H = (k2 + k0**2).pow(-slope / 4.0)
    return H / H.square().mean().sqrt()


def gaussian_random_field(seeds, size: int = 32, slope: float = 3.0, k0: float = 1.0,
                          device=None, chunk: int = 1024) -> torch.Tensor:
    """(len(seeds), size, size) float64 GRFs with N(0, 1) pixels; row i depends on seeds[i] only."""
    seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    H = _filter(size, slope, k0, device)
    out = []
    for s in seeds.split(chunk):  # bounded memory
        w = seeded_noise(s, (size, size), device=device, stream=stream("data.heavy_tailed"))
        out.append(torch.fft.ifft2(torch.fft.fft2(w) * H).real)
    return torch.cat(out) if out else torch.zeros(0, size, size, dtype=torch.float64)


def _marginal_isf(q: torch.Tensor, marginal: str, tail_index: float) -> torch.Tensor:
    """Inverse survival function F^{-1}(1 - q): exact in the upper tail (q small)."""
    if marginal == "gpd":
        xi = 1.0 / tail_index
        return torch.expm1(-xi * torch.log(q)) / xi  # (q^-xi - 1)/xi
    from scipy.special import stdtrit

    return -torch.from_numpy(stdtrit(tail_index, q.cpu().numpy())).to(q.device)  # symmetric


def heavy_tailed_fields(seeds, size: IntAtLeastTwo = 32, tail_index: PositiveFloat = 3.0,
                        marginal: Marginal = "gpd", slope: NonNegativeFloat = 3.0, k0: PositiveFloat = 1.0,
                        device=None) -> torch.Tensor:
    """(len(seeds), 1, size, size) float64 fields with the chosen heavy-tailed marginal."""
    check_args(heavy_tailed_fields, locals())
    z = gaussian_random_field(seeds, size, slope, k0, device)
    q = (0.5 * torch.erfc(z / math.sqrt(2.0))).clamp(1e-300, 1 - 2.0**-53)  # 1 - Phi(z)
    return _marginal_isf(q, marginal, float(tail_index)).unsqueeze(1)


class HeavyTailedFieldDataModule(TensorDataModule):
    """Seeded heavy-tailed fields (see the module docstring); data = fields / ``scale``.

    ``inverse_transform`` multiplies by ``scale`` again (physical units for observables).
    Training field i uses seed ``train_seed_offset + i``, validation a disjoint range.
    ``value_range`` defaults to None (only the finite-values check): the fields are *not*
    squashed into [-1, 1] (their heavy tails are the point; tail index 3 reaches ~200 in
    256 fields), unlike :class:`PrecipitationDataModule`'s log1p space.
    """

    def __init__(self, size: IntAtLeastTwo = 32, tail_index: PositiveFloat = 3.0, marginal: Marginal = "gpd",
                 slope: NonNegativeFloat = 3.0, k0: PositiveFloat = 1.0, scale: PositiveFloat = 1.0, n_train: PositiveInt = 4096,
                 n_val: PositiveInt = 1024, train_seed_offset: NonNegativeInt = 0, val_seed_offset: NonNegativeInt = 1_000_000,
                 batch_size: PositiveInt = 64, val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = None):
        check_args(HeavyTailedFieldDataModule.__init__, locals())
        check_disjoint_ranges(("train_seed_offset", train_seed_offset, "n_train", n_train),
                              ("val_seed_offset", val_seed_offset, "n_val", n_val))
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size,
                         num_workers=num_workers, samples_per_epoch=samples_per_epoch,
                         n_train=n_train, seed=seed, value_range=value_range)
        self.save_hyperparameters()
        self.size, self.tail_index, self.marginal = size, float(tail_index), marginal
        self.slope, self.k0, self.scale = float(slope), float(k0), float(scale)
        self.n_val = n_val
        self.train_seed_offset, self.val_seed_offset = train_seed_offset, val_seed_offset

    def available_train(self) -> int:
        return self.n_train

    def _fields(self, offset: int, n: int) -> torch.Tensor:
        seeds = torch.arange(offset, offset + n)
        x = heavy_tailed_fields(seeds, self.size, self.tail_index, self.marginal, self.slope, self.k0)
        return (x / self.scale).to(torch.float32)

    def load_splits(self):
        return (self._fields(self.train_seed_offset, self.n_train), None,
                self._fields(self.val_seed_offset, self.n_val), None)

    def inverse_transform(self, y: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(y).to(torch.float64) * self.scale
