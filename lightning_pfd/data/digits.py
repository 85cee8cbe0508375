"""UCI handwritten digits (scikit-learn ``load_digits``): the default real dataset, no download.

1797 grayscale 8x8 images with values 0..16, scaled to [-1, 1] as x / 8 - 1 (docs/data.md).
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F

from ..validation import NonNegativeInt, PositiveInt, check_args
from .base import DEFAULT_VALUE_RANGE, TensorDataModule, _pad_to, seeded_split

__all__ = ["DigitsDataModule", "load_digits_tensor"]

N_DIGITS = 1797


def load_digits_tensor() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits as float32 (N, 1, 8, 8) in [-1, 1] and their long labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.as_tensor(d.images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 8.0 - 1.0
    return x, torch.as_tensor(d.target, dtype=torch.long)


def _resize(x: torch.Tensor, image_size: int, mode: str) -> torch.Tensor:
    if image_size == 8:
        return x
    if mode == "pad":
        return _pad_to(x, image_size, value=-1.0)
    return F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False).clamp(-1, 1)


class DigitsDataModule(TensorDataModule):
    """UCI digits as images (1, s, s), s in {8, 16, 32}, or as 64-d vectors (``as_vector``).

    Args:
        image_size: 8 (native), 16 or 32.
        resize: "bilinear" (upsample) or "pad" (centre on a -1 background) for sizes > 8.
        as_vector: flatten each image to a (s*s,) vector (for ``MLPNet``).
        n_val: size of the held-out validation split (seeded by ``split_seed``).
        Remaining arguments: see :class:`TensorDataModule` (``n_train`` picks a seeded subset
            of the 1797 - n_val training images).
    """

    def __init__(self, image_size: Literal[8, 16, 32] = 8, resize: Literal["bilinear", "pad"] = "bilinear",
                 as_vector: bool = False, n_val: PositiveInt = 197, split_seed: int = 0, batch_size: PositiveInt = 128,
                 val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, n_train: Optional[PositiveInt] = None,
                 subset_seed: int = 0, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = DEFAULT_VALUE_RANGE):
        check_args(DigitsDataModule.__init__, locals())
        if n_val >= N_DIGITS:  # the rest is the training split
            raise ValueError(f"n_val: must be an integer in [1, {N_DIGITS - 1}], got {n_val!r}")
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size, num_workers=num_workers,
                         samples_per_epoch=samples_per_epoch, n_train=n_train,
                         subset_seed=subset_seed, seed=seed, value_range=value_range)
        self.save_hyperparameters()
        self.image_size, self.resize, self.as_vector = image_size, resize, as_vector
        self.n_val, self.split_seed = n_val, split_seed
        self._check_n_train(self.available_train())  # fail at construction, before any work

    def available_train(self) -> int:
        return N_DIGITS - self.n_val

    def load_splits(self):
        x, y = load_digits_tensor()
        x = _resize(x, self.image_size, self.resize)
        if self.as_vector:
            x = x.reshape(x.shape[0], -1)
        tr, va = seeded_split(x.shape[0], self.n_val, self.split_seed)
        return x[tr], y[tr], x[va], y[va]
