"""Base LightningDataModule over in-memory tensors (the shared datamodule contract).

After ``setup()`` every datamodule exposes ``train_data`` (float32, (N, *data_shape): the exact N
training samples), ``val_data``, ``train_labels`` / ``val_labels`` (long or None), ``data_shape``,
``teacher`` (None unless the data come from a known law) and ``fingerprint()`` (a hash of the
training set). Loaders yield ``(x, label)`` with label = -1 when the data have none.

Subclasses implement :meth:`TensorDataModule.load_splits` (full train / val splits); the base
applies the seeded size-N subset (``n_train``) used in memorization studies and builds loaders.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from ..cache import hash_key

__all__ = ["TensorDataModule", "SeededReplacementSampler", "seeded_subset_indices", "seeded_split"]


def seeded_subset_indices(n_available: int, n: int, seed: int) -> torch.Tensor:
    """``n`` distinct indices out of ``range(n_available)`` drawn with a seeded permutation, sorted."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(int(n_available), generator=g)[: int(n)].sort().values


def seeded_split(n_total: int, n_val: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded disjoint (train_idx, val_idx) split of ``range(n_total)`` with ``n_val`` val items."""
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(int(n_total), generator=g)
    return perm[n_val:].sort().values, perm[:n_val].sort().values


class SeededReplacementSampler(Sampler):
    """Draws ``num_samples`` indices with replacement; epoch e uses the generator seed ``seed + e``.

    Lets a tiny training set (N = 64) have epochs of a meaningful length. It is deliberately not
    a ``RandomSampler`` subclass: under DDP Lightning then wraps it in a
    ``DistributedSamplerWrapper`` (which forwards ``set_epoch``) instead of replacing it, so the
    epoch length and the seeding survive.
    """

    def __init__(self, n: int, num_samples: int, seed: int = 0):
        if n < 1:
            raise ValueError(f"n: the dataset must not be empty, got {n}")
        if num_samples < 1:
            raise ValueError(f"samples_per_epoch: must be >= 1, got {num_samples}")
        self.n, self.num_samples, self.seed, self.epoch = int(n), int(num_samples), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randint(self.n, (self.num_samples,), generator=g).tolist())


def _check_optional_int(name: str, value, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum} or None, got {value!r}")


def _as_labels(labels, n: int, name: str) -> Optional[torch.Tensor]:
    if labels is None:
        return None
    labels = torch.as_tensor(labels)
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dtype.is_complex:
        raise ValueError(f"{name}: must be integer class labels, got dtype {labels.dtype}")
    labels = labels.reshape(-1).long()
    if labels.shape[0] != n:
        raise ValueError(f"{name}: has {labels.shape[0]} entries, expected {n} (one per sample)")
    return labels


class TensorDataModule(pl.LightningDataModule):
    """A datamodule over in-memory tensors; also the base class of every lightning_pfd datamodule.

    Args:
        train_data, val_data: optional tensors (N, *data_shape) when used directly.
        train_labels, val_labels: optional integer labels.
        batch_size: training batch size (``val_batch_size`` defaults to it).
        num_workers: DataLoader workers (0: the data are already in memory).
        samples_per_epoch: if set, every epoch draws this many samples with replacement
            (seeded by ``seed`` and the epoch).
        n_train: use a seeded subset of exactly ``n_train`` training samples (memorization
            studies); None = all. Must be in [1, available].
        subset_seed: the seed choosing that subset.
        seed: seeds the training shuffle / replacement sampler.
    """

    def __init__(self, train_data: Optional[torch.Tensor] = None, val_data: Optional[torch.Tensor] = None,
                 train_labels: Optional[torch.Tensor] = None, val_labels: Optional[torch.Tensor] = None,
                 batch_size: int = 128, val_batch_size: Optional[int] = None, num_workers: int = 0,
                 samples_per_epoch: Optional[int] = None, n_train: Optional[int] = None,
                 subset_seed: int = 0, seed: int = 0):
        super().__init__()
        _check_optional_int("batch_size", batch_size, 1)
        _check_optional_int("val_batch_size", val_batch_size, 1)
        _check_optional_int("num_workers", num_workers, 0)
        _check_optional_int("samples_per_epoch", samples_per_epoch, 1)
        _check_optional_int("n_train", n_train, 1)
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.samples_per_epoch = samples_per_epoch
        self.n_train = n_train
        self.subset_seed = int(subset_seed)
        self.seed = int(seed)
        self._given = (train_data, train_labels, val_data, val_labels)
        if train_data is not None:  # direct use: validate now, before any training
            self._check_n_train(len(train_data))
        self.train_data: Optional[torch.Tensor] = None
        self.val_data: Optional[torch.Tensor] = None
        self.train_labels: Optional[torch.Tensor] = None
        self.val_labels: Optional[torch.Tensor] = None
        self.train_indices: Optional[torch.Tensor] = None  # rows of the full split kept by n_train
        self.data_shape: Optional[tuple] = None
        self.teacher = None
        self._is_setup = False
        self._fingerprint: Optional[str] = None

    # ---- to override -------------------------------------------------------------------------
    def load_splits(self):
        """Return ``(train_x, train_y, val_x, val_y)`` of the full splits (y may be None)."""
        train_x, train_y, val_x, val_y = self._given
        if train_x is None:
            raise ValueError("train_data: TensorDataModule needs `train_data` (or use a subclass)")
        return train_x, train_y, val_x, val_y

    def available_train(self) -> Optional[int]:
        """Size of the full training split if known without loading (for early n_train checks)."""
        return None

    # ---- contract ----------------------------------------------------------------------------
    def _check_n_train(self, available: int) -> None:
        if self.n_train is not None and not 1 <= self.n_train <= available:
            raise ValueError(f"n_train: must be in [1, {available}] (the size of the training split), "
                             f"got {self.n_train}")

    def setup(self, stage: Optional[str] = None) -> None:
        if self._is_setup:
            return
        train_x, train_y, val_x, val_y = self.load_splits()
        train_x = torch.as_tensor(train_x)
        if train_x.ndim < 2 or train_x.shape[0] < 1:
            raise ValueError(f"train_data: expected shape (N, *data_shape) with N >= 1, got {tuple(train_x.shape)}")
        self._check_n_train(train_x.shape[0])
        train_y = _as_labels(train_y, train_x.shape[0], "train_labels")
        if self.n_train is not None and self.n_train < train_x.shape[0]:
            idx = seeded_subset_indices(train_x.shape[0], self.n_train, self.subset_seed)
            train_x = train_x[idx]
            train_y = None if train_y is None else train_y[idx]
            self.train_indices = idx
        self.data_shape = tuple(train_x.shape[1:])
        self.train_data = train_x.to(torch.float32).contiguous()
        self.train_labels = train_y
        if val_x is not None:
            val_x = torch.as_tensor(val_x)
            if tuple(val_x.shape[1:]) != self.data_shape:
                raise ValueError(f"val_data: sample shape {tuple(val_x.shape[1:])} differs from the "
                                 f"training data's {self.data_shape}")
            self.val_data = val_x.to(torch.float32).contiguous()
            self.val_labels = _as_labels(val_y, val_x.shape[0], "val_labels")
        self._is_setup = True

    def fingerprint(self) -> str:
        """sha256 of the training set (data and labels): changes iff the N samples change."""
        if self.train_data is None:
            self.setup()
        if self._fingerprint is None:  # the training set is fixed after setup: hash it once
            self._fingerprint = hash_key("train_set", self.train_data, self.train_labels)
        return self._fingerprint

    @property
    def n_samples(self) -> int:
        """N, the number of training samples (after setup)."""
        return 0 if self.train_data is None else int(self.train_data.shape[0])

    # ---- loaders -----------------------------------------------------------------------------
    @staticmethod
    def _dataset(x: torch.Tensor, y: Optional[torch.Tensor]) -> TensorDataset:
        if y is None:
            y = torch.full((x.shape[0],), -1, dtype=torch.long)
        return TensorDataset(x, y)

    def train_dataloader(self) -> DataLoader:
        if self.train_data is None:
            self.setup("fit")
        ds = self._dataset(self.train_data, self.train_labels)
        if self.samples_per_epoch is not None:
            sampler = SeededReplacementSampler(len(ds), self.samples_per_epoch, seed=self.seed)
            return DataLoader(ds, batch_size=self.batch_size, sampler=sampler,
                              num_workers=self.num_workers, drop_last=False)
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(ds, batch_size=self.batch_size, shuffle=True, generator=g,
                          num_workers=self.num_workers, drop_last=False)

    def val_dataloader(self) -> DataLoader:
        if self.train_data is None:
            self.setup("validate")
        if self.val_data is None:
            return []
        return DataLoader(self._dataset(self.val_data, self.val_labels), batch_size=self.val_batch_size,
                          shuffle=False, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def state_dict(self) -> dict:
        """Saved in checkpoints: the training-set fingerprint (to detect resuming on other data)."""
        return {"fingerprint": self.fingerprint() if self.train_data is not None else None}

    def load_state_dict(self, state_dict: dict) -> None:
        """Warn when a checkpoint was trained on another training set than this one."""
        saved = state_dict.get("fingerprint")
        if saved is not None and self.train_data is not None and saved != self.fingerprint():
            warnings.warn(f"{type(self).__name__}: the checkpoint was trained on a different training "
                          f"set (fingerprint {saved[:12]}..., now {self.fingerprint()[:12]}...)")


def _scale_uint8(x: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [-1, 1] (REFERENCE §1: x / 127.5 - 1)."""
    return x.to(torch.float32) / 127.5 - 1.0


def _pad_to(x: torch.Tensor, size: int, value: float = -1.0) -> torch.Tensor:
    """Pad (N, C, H, W) images symmetrically to size x size with ``value`` (the background)."""
    h, w = x.shape[-2:]
    if h > size or w > size:
        raise ValueError(f"image_size: {size} is smaller than the native {h}x{w}")
    top, left = (size - h) // 2, (size - w) // 2
    return torch.nn.functional.pad(x, (left, size - w - left, top, size - h - top), value=value)


def _check_choice(name: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: must be one of {list(allowed)}, got {value!r}")
