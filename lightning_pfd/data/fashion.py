"""Fashion-MNIST from local IDX files (Debian package ``dataset-fashion-mnist``), no download.

The IDX format: two zero bytes, a type byte (0x08 = uint8, ...), a byte with the number of
dimensions, then one big-endian int32 per dimension, then the data (big-endian). Files may be
gzip-compressed (Debian recompressed them, so no md5 check is done).
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..validation import NonNegativeInt, PositiveInt
from .base import DEFAULT_VALUE_RANGE, TensorDataModule, _check_choice, _pad_to, _scale_uint8

__all__ = ["FashionMNISTDataModule", "read_idx", "FASHION_FILES", "DEFAULT_FASHION_ROOT"]

DEFAULT_FASHION_ROOT = "/usr/share/datasets/fashion-mnist/"
FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse an IDX file (optionally .gz) into a numpy array with its native shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX data type 0x{code:02x}; known: "
                         f"{[hex(c) for c in _IDX_DTYPES]}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: IDX payload has {len(raw) - header} bytes, header {dims} implies {expected}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def _find(root: Path, name: str) -> Optional[Path]:
    """The file ``name`` in ``root``, or its uncompressed twin."""
    for cand in (root / name, root / name.removesuffix(".gz")):
        if cand.is_file():
            return cand
    return None


def fashion_paths(root: str | os.PathLike) -> dict[str, Path]:
    root = Path(root)
    found = {k: _find(root, v) for k, v in FASHION_FILES.items()}
    missing = [FASHION_FILES[k] for k, p in found.items() if p is None]
    if missing:
        raise FileNotFoundError(
            f"root: Fashion-MNIST not found in {str(root)!r}: missing {missing} (expected files "
            f"{list(FASHION_FILES.values())}, gzip or not). Install them with "
            "`apt-get install dataset-fashion-mnist` (-> /usr/share/datasets/fashion-mnist/) or "
            "pass `root=` pointing at a folder holding them.")
    return found


class FashionMNISTDataModule(TensorDataModule):
    """Fashion-MNIST, (1, 28, 28) images in [-1, 1] (or (1, 32, 32) with ``pad_to_32``).

    The official 10k test split is the validation set. ``n_train`` picks a seeded subset of the
    60k training images; ``classes`` keeps only the given labels.
    """

    def __init__(self, root: str = DEFAULT_FASHION_ROOT, pad_to_32: bool = False,
                 classes: Optional[list[int]] = None, batch_size: PositiveInt = 128,
                 val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, n_train: Optional[PositiveInt] = None,
                 subset_seed: int = 0, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = DEFAULT_VALUE_RANGE):
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size, num_workers=num_workers,
                         samples_per_epoch=samples_per_epoch, n_train=n_train,
                         subset_seed=subset_seed, seed=seed, value_range=value_range)
        if classes is not None:
            for c in classes:
                _check_choice("classes", c, range(10))
        self.save_hyperparameters()
        self.root, self.pad_to_32, self.classes = str(root), pad_to_32, classes
        self._paths = fashion_paths(self.root)  # missing files: fail at construction

    def load_splits(self):
        p = self._paths
        out = []
        for img_key, lab_key in (("train_images", "train_labels"), ("test_images", "test_labels")):
            x = torch.from_numpy(read_idx(p[img_key]))
            y = torch.from_numpy(read_idx(p[lab_key]).astype(np.int64))
            if x.ndim != 3 or x.dtype != torch.uint8 or len(y) != len(x):
                raise ValueError(f"root: {p[img_key]} must hold uint8 (N, 28, 28) images matching "
                                 f"{p[lab_key]}; got {tuple(x.shape)} {x.dtype} and {len(y)} labels")
            x = _scale_uint8(x)[:, None]
            if self.pad_to_32:
                x = _pad_to(x, 32, value=-1.0)
            if self.classes is not None:
                keep = torch.isin(y, torch.as_tensor(self.classes))
                x, y = x[keep], y[keep]
            out += [x, y]
        return tuple(out)
