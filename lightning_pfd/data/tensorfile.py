"""Any dataset saved as a ``.npz`` or torch ``.pt`` file.

Keys (the first present wins): training data ``x`` | ``train`` | ``train_data``; training labels
``y`` | ``labels`` | ``train_labels``; validation data ``val`` | ``x_val`` | ``val_data``;
validation labels ``y_val`` | ``val_labels``. A ``.pt`` file may also hold a bare tensor.
uint8 data are scaled to [-1, 1] (x / 127.5 - 1); float data are used as they are.
Without a validation array, a seeded ``val_fraction`` of the training data is held out.
``setup`` then requires finite values inside ``value_range`` (default [-1, 1]); the error says how
to rescale (e.g. float pixels in [0, 255]: divide by 127.5 and subtract 1).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import MissingFileError
from ..validation import HalfOpenUnitInterval, NonNegativeInt, PositiveInt, check_args
from .base import DEFAULT_VALUE_RANGE, TensorDataModule, _scale_uint8, seeded_split

__all__ = ["TensorFileDataModule", "load_tensor_file"]

KEYS = {
    "train_data": ("x", "train", "train_data"),
    "train_labels": ("y", "labels", "train_labels"),
    "val_data": ("val", "x_val", "val_data"),
    "val_labels": ("y_val", "val_labels"),
}


def _pick(d: dict, field: str):
    for k in KEYS[field]:
        if k in d:
            return d[k]
    return None


def load_tensor_file(path: str | os.PathLike) -> dict[str, Optional[torch.Tensor]]:
    """Read ``path`` into {train_data, train_labels, val_data, val_labels} (missing -> None)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError("path", path, "a .npz or .pt file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                d = {k: z[k] for k in z.files}
        except (ValueError, OSError) as e:
            raise ValueError(f"path: {str(path)!r} is not a readable .npz archive of arrays ({e})") from None
    elif path.suffix in (".pt", ".pth"):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # not a torch file, or objects that weights-only loading refuses
            raise ValueError(f"path: {str(path)!r} is not a torch file of tensors (torch.save of a "
                             "tensor or a dict of tensors; only tensors, lists and dicts are "
                             "loaded, never arbitrary objects)") from None
        d = {"x": obj} if isinstance(obj, torch.Tensor) else obj
        if not isinstance(d, dict):
            raise ValueError(f"path: {path} must hold a tensor or a dict of tensors, got {type(obj).__name__}")
    else:
        raise ValueError(f"path: unsupported file type {path.suffix!r}; accepted: .npz, .pt, .pth")
    out = {f: (None if (v := _pick(d, f)) is None else torch.as_tensor(v)) for f in KEYS}
    if out["train_data"] is None:
        raise ValueError(f"path: {path} has no training array; expected one of the keys "
                         f"{list(KEYS['train_data'])}, found {sorted(d)}")
    return out


def _to_float(x: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 -> [-1, 1]; floats as they are (finiteness and range: checked by ``setup``)."""
    if x.dtype == torch.uint8:
        return _scale_uint8(x)
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name}: must be floating point or uint8, got {x.dtype}")
    return x.to(torch.float32)


class TensorFileDataModule(TensorDataModule):
    """Data from a ``.npz`` / ``.pt`` file (see the module docstring for the accepted keys)."""

    def __init__(self, path: str, val_fraction: HalfOpenUnitInterval = 0.1, split_seed: int = 0,
                 batch_size: PositiveInt = 128, val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, n_train: Optional[PositiveInt] = None,
                 subset_seed: int = 0, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = DEFAULT_VALUE_RANGE):
        check_args(TensorFileDataModule.__init__, locals())
        if not Path(path).is_file():
            raise MissingFileError("path", path, "a .npz or .pt file")
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size, num_workers=num_workers,
                         samples_per_epoch=samples_per_epoch, n_train=n_train,
                         subset_seed=subset_seed, seed=seed, value_range=value_range)
        self.save_hyperparameters()
        self.path, self.val_fraction, self.split_seed = str(path), val_fraction, split_seed

    def range_hint(self) -> str:
        """Where to fix out-of-range values: the file's float arrays are used as they are."""
        return (f"float arrays in {self.path} are used as they are: rescale them in the file "
                "(uint8 arrays are mapped to [-1, 1] automatically)")

    def load_splits(self):
        d = load_tensor_file(self.path)
        x = d["train_data"]
        if x.ndim < 2:
            raise ValueError(f"path: training array must have shape (N, *data_shape), got {tuple(x.shape)}")
        x = _to_float(x, "train_data")
        y, v, vy = d["train_labels"], d["val_data"], d["val_labels"]
        if v is None:
            if vy is not None:
                raise ValueError("val_labels: given without validation data")
            n_val = int(round(self.val_fraction * len(x)))
            if n_val > 0:
                if n_val >= len(x):
                    raise ValueError(f"val_fraction: leaves no training data ({len(x)} samples)")
                tr, va = seeded_split(len(x), n_val, self.split_seed)
                if y is not None and len(y) != len(x):
                    raise ValueError(f"train_labels: has {len(y)} entries, expected {len(x)}")
                x, v = x[tr], x[va]
                y, vy = (None, None) if y is None else (y[tr], y[va])
        else:
            v = _to_float(v, "val_data")
        return x, y, v, vy
