"""Synthetic Gaussian-mixture data whose law is known exactly (the teacher is the true law)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..diffusion import GaussianMixtureDenoiser
from ..validation import NonNegativeInt, PositiveInt, check_args
from .base import TensorDataModule

__all__ = ["GaussianMixtureDataModule", "random_gmm", "check_disjoint_ranges"]


def check_disjoint_ranges(*ranges: tuple[str, int, str, int]) -> None:
    """Raise ValueError unless the half-open seed ranges [offset, offset + count) are pairwise
    disjoint. Each range is ``(offset_name, offset, count_name, count)``: an integer offset >= 0
    and count >= 1 (the callers declare them so: ``NonNegativeInt``, ``PositiveInt``)."""
    for i, (a, oa, ca, na) in enumerate(ranges):
        for b, ob, cb, nb in ranges[i + 1:]:
            if oa < ob + nb and ob < oa + na:
                raise ValueError(
                    f"{a}, {b}: seed ranges overlap: [{a}, {a} + {ca}) = [{oa}, {oa + na}) and "
                    f"[{b}, {b} + {cb}) = [{ob}, {ob + nb}); choose offsets so the ranges are disjoint")


def random_gmm(n_components: int = 5, dim: int = 5, seed: int = 0, mean_scale: float = 2.0,
               cov_scale: float = 0.5, shape: Optional[Sequence[int]] = None) -> GaussianMixtureDenoiser:
    """A random, well-conditioned GMM: weights ~ U(0.5, 1.5) normalised, means ~ N(0, mean_scale^2 I),
    covs = cov_scale * (A A^T / dim + 0.1 I) with A standard normal (float64, seeded)."""
    if n_components < 1:
        raise ValueError(f"n_components: must be >= 1, got {n_components}")
    if dim < 1:
        raise ValueError(f"dim: must be >= 1, got {dim}")
    g = torch.Generator().manual_seed(int(seed))
    w = torch.rand(n_components, generator=g, dtype=torch.float64) + 0.5
    means = mean_scale * torch.randn(n_components, dim, generator=g, dtype=torch.float64)
    A = torch.randn(n_components, dim, dim, generator=g, dtype=torch.float64)
    covs = cov_scale * (A @ A.transpose(-1, -2) / dim + 0.1 * torch.eye(dim, dtype=torch.float64))
    return GaussianMixtureDenoiser(w / w.sum(), means, covs, shape=shape)


class GaussianMixtureDataModule(TensorDataModule):
    """Exact samples of a Gaussian mixture; ``teacher`` is its exact denoiser.

    Give ``weights``/``means``/``covs`` or draw a random mixture (``n_components``, ``dim``,
    ``gmm_seed``). Sample i of the training set is ``teacher.sample([train_seed_offset + i])``;
    validation uses the disjoint range starting at ``val_seed_offset``.

    ``value_range`` defaults to None (only the finite-values check): the samples are exact draws
    of the given law, whose Gaussian tails have no bound (the default random mixture reaches
    about +-6).
    """

    def __init__(self, weights: Optional[list] = None, means: Optional[list] = None,
                 covs: Optional[list] = None, n_components: PositiveInt = 5, dim: PositiveInt = 5, gmm_seed: int = 0,
                 shape: Optional[list[int]] = None, n_train: PositiveInt = 1024, n_val: PositiveInt = 1024,
                 train_seed_offset: NonNegativeInt = 0, val_seed_offset: NonNegativeInt = 1_000_000,
                 batch_size: PositiveInt = 128, val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = None):
        check_args(GaussianMixtureDataModule.__init__, locals())
        check_disjoint_ranges(("train_seed_offset", train_seed_offset, "n_train", n_train),
                              ("val_seed_offset", val_seed_offset, "n_val", n_val))
        given = [p is not None for p in (weights, means, covs)]
        if any(given) and not all(given):
            raise ValueError("weights, means, covs: give all three GMM parameters or none (random GMM)")
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size, num_workers=num_workers,
                         samples_per_epoch=samples_per_epoch, n_train=n_train, seed=seed,
                         value_range=value_range)
        self.save_hyperparameters()
        if all(given):
            self.teacher = GaussianMixtureDenoiser(torch.as_tensor(weights), torch.as_tensor(means),
                                                   torch.as_tensor(covs), shape=shape)
        else:
            self.teacher = random_gmm(n_components, dim, gmm_seed, shape=shape)
        self.n_val = n_val
        self.train_seed_offset, self.val_seed_offset = train_seed_offset, val_seed_offset

    @property
    def train_seeds(self) -> torch.Tensor:
        return torch.arange(self.train_seed_offset, self.train_seed_offset + self.n_train)

    @property
    def val_seeds(self) -> torch.Tensor:
        return torch.arange(self.val_seed_offset, self.val_seed_offset + self.n_val)

    def load_splits(self):
        x = self.teacher.sample(self.train_seeds)
        v = self.teacher.sample(self.val_seeds)
        return x, None, v, None
