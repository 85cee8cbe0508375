"""Base LightningDataModule over in-memory tensors (the shared datamodule contract).

After ``setup()`` every datamodule exposes ``train_data`` (float32, (N, *data_shape): the exact N
training samples), ``val_data``, ``train_labels`` / ``val_labels`` (long or None), ``data_shape``,
``teacher`` (None unless the data come from a known law) and ``fingerprint()`` (a hash of the
training set). Loaders yield ``(x, label)`` with label = -1 when the data have none.

Subclasses implement :meth:`TensorDataModule.load_splits` (full train / val splits); the base
applies the seeded size-N subset (``n_train``) used in memorization studies, checks that the data
are finite and inside the declared ``value_range`` (:func:`check_data`, a ``ConfigError`` before
any training step) and builds loaders whose order is a pure function of (seed, epoch).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Optional, Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from ..cache import hash_key
from ..errors import ConfigError
from ..validation import NonNegativeInt, PositiveInt, check_args

__all__ = ["TensorDataModule", "BatchedTensorDataset", "batched_collate", "SeededReplacementSampler",
           "SeededPermutationSampler", "epoch_seed", "seeded_subset_indices", "seeded_split", "check_data",
           "DEFAULT_VALUE_RANGE", "RANGE_TOLERANCE", "data_fingerprint", "data_changes"]

#: the range every image datamodule maps its data to (x / 127.5 - 1 for 8-bit pixels)
DEFAULT_VALUE_RANGE = (-1.0, 1.0)
#: slack allowed on each side of a declared range, as a fraction of its width (float rounding)
RANGE_TOLERANCE = 1e-3
_CHECK_CHUNK = 1 << 20  # elements per chunk of check_data (4 MiB of float32)
_MASK64 = (1 << 64) - 1


def seeded_subset_indices(n_available: int, n: int, seed: int) -> torch.Tensor:
    """``n`` distinct indices out of ``range(n_available)`` drawn with a seeded permutation, sorted."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(int(n_available), generator=g)[: int(n)].sort().values


def seeded_split(n_total: int, n_val: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded disjoint (train_idx, val_idx) split of ``range(n_total)`` with ``n_val`` val items."""
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(int(n_total), generator=g)
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed that is a pure function of (seed, epoch), decorrelated across both.

    Two rounds of the splitmix64 finaliser, so that (seed, epoch + 1) and (seed + 1, epoch) give
    unrelated streams (plain ``seed + epoch`` would make run seed=1 replay run seed=0 one epoch
    later).
    """
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) + 0x632BE59BD9B4E019) & _MASK64
    for _ in range(2):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


class _EpochSeededSampler(Sampler):
    """Common part of the seeded samplers: ``set_epoch`` (called by Lightning at every epoch start,
    also after a resume, with the number of completed epochs) selects the epoch's generator.

    Deliberately not a ``RandomSampler`` subclass: under DDP Lightning then wraps the sampler in a
    ``DistributedSamplerWrapper`` (which forwards ``set_epoch``) instead of replacing it, so the
    epoch length and the seeding survive.
    """

    def __init__(self, n: int, seed: int = 0):
        if n < 1:
            raise ValueError(f"n: the dataset must not be empty, got {n}")
        self.n, self.seed, self.epoch = int(n), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        """Select epoch ``epoch``'s order (Lightning calls this before each training epoch)."""
        self.epoch = int(epoch)

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))


class SeededPermutationSampler(_EpochSeededSampler):
    """Every index once per epoch, in an order that is a pure function of (seed, epoch).

    Unlike ``DataLoader(shuffle=True, generator=g)`` (whose order depends on how often ``g`` was
    used before), a run resumed from an epoch-end checkpoint sees exactly the order the
    uninterrupted run would have seen.
    """

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self._generator()).tolist())


class SeededReplacementSampler(_EpochSeededSampler):
    """Draws ``num_samples`` indices with replacement; epoch e uses the seed ``epoch_seed(seed, e)``.

    Lets a tiny training set (N = 64) have epochs of a meaningful length.
    """

    def __init__(self, n: int, num_samples: int, seed: int = 0):
        super().__init__(n, seed)
        if num_samples < 1:
            raise ValueError(f"samples_per_epoch: must be >= 1, got {num_samples}")
        self.num_samples = int(num_samples)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        return iter(torch.randint(self.n, (self.num_samples,), generator=self._generator()).tolist())


class BatchedTensorDataset(TensorDataset):
    """A ``TensorDataset`` whose batches are one tensor index, not a collate of single samples.

    ``DataLoader`` hands a batch's index list to ``__getitems__``; indexing each tensor once with
    it gives what the default collate makes of the per-sample tuples (a list ``[x[idx], y[idx]]``,
    same values, dtypes and layout) at a fraction of the cost of the per-sample collate. Loaders
    over it use :func:`batched_collate`. Single samples
    (``ds[i]``) are unchanged."""

    def __getitems__(self, indices) -> list:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [t[idx] for t in self.tensors]


def batched_collate(batch):
    """The collate of a :class:`BatchedTensorDataset` loader: the batch is already stacked."""
    return batch


# ---- data checks ---------------------------------------------------------------------------------
def _as_value_range(value_range) -> Optional[tuple[float, float]]:
    """Validate a ``value_range`` argument: None, or a pair (lo, hi) of finite numbers, lo < hi."""
    if value_range is None:
        return None
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ConfigError("value_range", "must be None or a pair [low, high]", value=value_range,
                          accepted="None (no range check) or [low, high] with low < high") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("value_range", "needs finite bounds with low < high", value=value_range,
                          accepted="None (no range check) or [low, high] with low < high")
    return lo, hi


def _scan(x: torch.Tensor, chunk: int) -> tuple[int, int, Optional[int], float, float]:
    """(numel, #non-finite, first sample index holding one, min, max of the finite values).

    Walks ``x`` in slices along dim 0 (views: no copy of the whole tensor), each at most ``chunk``
    elements (one sample at least). One pass per slice when it is finite: ``aminmax`` propagates
    NaN and shows inf, so the finite mask is built only for slices holding a bad value.
    """
    x = x.reshape(1) if x.ndim == 0 else x
    if x.numel() == 0:
        return 0, 0, None, math.inf, -math.inf
    rows = max(1, chunk // max(1, x[:1].numel()))
    bad, first, lo, hi = 0, None, math.inf, -math.inf
    for start in range(0, x.shape[0], rows):
        c = x[start:start + rows]
        if not c.dtype.is_floating_point:
            c = c.to(torch.float64)  # ints / bool: a chunk-sized copy
        cmin, cmax = (float(v) for v in torch.aminmax(c))
        if not (math.isfinite(cmin) and math.isfinite(cmax)):
            finite = torch.isfinite(c)
            bad += int(finite.numel() - finite.sum())
            if first is None:
                first = start + int((~finite).reshape(len(c), -1).any(1).nonzero()[0, 0])
            c = c[finite]
            if not c.numel():
                continue
            cmin, cmax = (float(v) for v in torch.aminmax(c))
        lo, hi = min(lo, cmin), max(hi, cmax)
    return x.numel(), bad, first, lo, hi


def _normalise_hint(mn: float, mx: float, lo: float, hi: float) -> str:
    """How to map observed values [mn, mx] into [lo, hi] (8-bit pixel data: the nominal 0..255)."""
    if mx == mn:
        return (f"all values equal {mn:.6g}: a constant data set cannot be scaled; subtract "
                f"{mn - (lo + hi) / 2:.6g} to centre it in [{lo:g}, {hi:g}]")
    seen = f"values in [{mn:.6g}, {mx:.6g}]"
    if mn >= 0 and 127 < mx <= 255 and float(mx).is_integer() and float(mn).is_integer():
        seen, mn, mx = (f"{seen} (8-bit pixels?)" if (mn, mx) != (0, 255) else seen), 0.0, 255.0
    d = (mx - mn) / (hi - lo)
    b = lo - mn / d
    shift = "" if abs(b) < 1e-12 else f" and {'subtract' if b < 0 else 'add'} {abs(b):.6g}"
    return f"{seen}: divide by {d:.6g}{shift} to map to [{lo:g}, {hi:g}]"


def check_data(x: torch.Tensor, field: str, value_range=DEFAULT_VALUE_RANGE,
               hint: Optional[str] = None, chunk: int = _CHECK_CHUNK) -> None:
    """Raise :class:`ConfigError` unless ``x`` is finite, not one constant value (a training set,
    ``field`` naming it, of two or more samples), and, when ``value_range`` = (lo, hi) is given, inside [lo - t, hi + t] with
    t = ``RANGE_TOLERANCE`` * (hi - lo).

    The message counts the NaN/inf values (and names the first sample holding one) or states the
    observed range and how to normalise it ("values in [0, 255]: divide by 127.5 and subtract 1
    to map to [-1, 1]"); ``hint`` is extra, data-set specific advice. Memory: one ``chunk``-sized
    slice at a time.
    """
    value_range = _as_value_range(value_range)
    numel, bad, first, mn, mx = _scan(torch.as_tensor(x), int(chunk))
    if bad:
        raise ConfigError(field, f"contains {bad} NaN/inf values (of {numel}; the first in sample "
                          f"{first})", accepted="finite values",
                          suggestion="remove those samples or replace the values (e.g. "
                          "torch.nan_to_num) before training")
    if "train" in field and numel > 1 and torch.as_tensor(x).shape[0] > 1 and mn == mx:
        raise ConfigError(field, f"every one of its {numel} values is {mn:.6g}: a constant data set has "
                          "nothing to learn (every sample would count as memorized, or none)",
                          accepted="data whose values vary", suggestion="check the file or the "
                          "preprocessing that produced it (a normalisation that divided by a zero range?)")
    if value_range is None or numel == 0:
        return
    lo, hi = value_range
    tol = RANGE_TOLERANCE * (hi - lo)
    if mn >= lo - tol and mx <= hi + tol:
        return
    advice = _normalise_hint(mn, mx, lo, hi)
    if hint:
        advice = f"{hint}; or {advice}"
    raise ConfigError(field, f"values in [{mn:.6g}, {mx:.6g}] lie outside the declared "
                      f"value_range [{lo:g}, {hi:g}]", accepted=f"finite values in [{lo:g}, {hi:g}]",
                      suggestion=f"{advice} (or declare the data's range with value_range=[low, "
                      "high], or value_range=None to skip the range check)")


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
        seed: seeds the training order: epoch e's order is a pure function of (seed, e), so a
            run resumed from an epoch-end checkpoint sees the same batches as an uninterrupted one.
        value_range: the declared range [low, high] of the training and validation data
            (default [-1, 1], allowing ``RANGE_TOLERANCE`` of the width on each side); ``setup``
            raises :class:`ConfigError` for values outside it or for NaN/inf values, before any
            training step. None keeps only the finite-values check.
    """

    def __init__(self, train_data: Optional[torch.Tensor] = None, val_data: Optional[torch.Tensor] = None,
                 train_labels: Optional[torch.Tensor] = None, val_labels: Optional[torch.Tensor] = None,
                 batch_size: PositiveInt = 128, val_batch_size: Optional[PositiveInt] = None,
                 num_workers: NonNegativeInt = 0, samples_per_epoch: Optional[PositiveInt] = None,
                 n_train: Optional[PositiveInt] = None, subset_seed: int = 0, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = DEFAULT_VALUE_RANGE):
        check_args(TensorDataModule.__init__, locals())
        super().__init__()
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.samples_per_epoch = samples_per_epoch
        self.n_train = n_train
        self.subset_seed = int(subset_seed)
        self.seed = int(seed)
        self.value_range = _as_value_range(value_range)
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

    def range_hint(self) -> Optional[str]:
        """Data-set specific advice added to an out-of-range error (None: the generic advice)."""
        return None

    def available_train(self) -> Optional[int]:
        """Size of the full training split if known without loading (for early n_train checks)."""
        return None

    # ---- contract ----------------------------------------------------------------------------
    def _check_n_train(self, available: int) -> None:
        if self.n_train is not None and not 1 <= self.n_train <= available:
            raise ValueError(f"n_train: must be in [1, {available}] (the size of the training split), "
                             f"got {self.n_train}")

    def check_values(self, x: torch.Tensor, field: str) -> None:
        """:func:`check_data` with this datamodule's ``value_range`` and ``range_hint``."""
        check_data(x, field, self.value_range, hint=self.range_hint())

    def setup(self, stage: Optional[str] = None) -> None:
        """Load the splits, apply ``n_train``, check the values; raises before any training step."""
        if self._is_setup:
            return
        train_x, train_y, val_x, val_y = self.load_splits()
        train_x = torch.as_tensor(train_x)
        if train_x.ndim < 2 or train_x.shape[0] < 1:
            raise ValueError(f"train_data: expected shape (N, *data_shape) with N >= 1, got {tuple(train_x.shape)}")
        self._check_n_train(train_x.shape[0])
        train_y = _as_labels(train_y, train_x.shape[0], "train_labels")
        idx = None
        if self.n_train is not None and self.n_train < train_x.shape[0]:
            idx = seeded_subset_indices(train_x.shape[0], self.n_train, self.subset_seed)
            train_x = train_x[idx]
            train_y = None if train_y is None else train_y[idx]
        train_x = train_x.to(torch.float32).contiguous()
        self.check_values(train_x, "train_data")  # after float32: overflow to inf is caught too
        data_shape = tuple(train_x.shape[1:])
        if val_x is not None:
            val_x = torch.as_tensor(val_x)
            if tuple(val_x.shape[1:]) != data_shape:
                raise ValueError(f"val_data: sample shape {tuple(val_x.shape[1:])} differs from the "
                                 f"training data's {data_shape}")
            val_y = _as_labels(val_y, val_x.shape[0], "val_labels")
            val_x = val_x.to(torch.float32).contiguous()
            self.check_values(val_x, "val_data")
            self.val_data, self.val_labels = val_x, val_y
        self.train_indices, self.data_shape = idx, data_shape
        self.train_data, self.train_labels = train_x, train_y
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
    def _dataset(x: torch.Tensor, y: Optional[torch.Tensor]) -> BatchedTensorDataset:
        if y is None:
            y = torch.full((x.shape[0],), -1, dtype=torch.long)
        return BatchedTensorDataset(x, y)

    def _loader_generator(self) -> torch.Generator:
        """A private generator for a DataLoader: without one, every ``iter(loader)`` draws the
        worker base seed from the *global* torch RNG (even with num_workers=0), shifting the
        model's noise stream by one draw per epoch and per validation run."""
        return torch.Generator().manual_seed(epoch_seed(self.seed, -1))

    def train_dataloader(self) -> DataLoader:
        """Training batches in a seeded per-epoch order (see :class:`SeededPermutationSampler`)."""
        if self.train_data is None:
            self.setup("fit")
        ds = self._dataset(self.train_data, self.train_labels)
        if self.samples_per_epoch is not None:
            sampler = SeededReplacementSampler(len(ds), self.samples_per_epoch, seed=self.seed)
        else:
            sampler = SeededPermutationSampler(len(ds), seed=self.seed)
        return DataLoader(ds, batch_size=self.batch_size, sampler=sampler,
                          generator=self._loader_generator(), num_workers=self.num_workers,
                          drop_last=False, collate_fn=batched_collate)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in their stored order."""
        if self.train_data is None:
            self.setup("validate")
        if self.val_data is None:
            return []
        return DataLoader(self._dataset(self.val_data, self.val_labels), batch_size=self.val_batch_size,
                          shuffle=False, num_workers=self.num_workers,
                          generator=self._loader_generator(), collate_fn=batched_collate)

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
    """uint8 images -> float32 in [-1, 1] as x / 127.5 - 1 (the convention of docs/data.md)."""
    return x.to(torch.float32) / 127.5 - 1.0


def _pad_to(x: torch.Tensor, size: int, value: float = -1.0) -> torch.Tensor:
    """Pad (N, C, H, W) images symmetrically to size x size with ``value`` (the background)."""
    h, w = x.shape[-2:]
    if h > size or w > size:
        raise ValueError(f"image_size: {size} is smaller than the native {h}x{w}")
    top, left = (size - h) // 2, (size - w) // 2
    return torch.nn.functional.pad(x, (left, size - w - left, top, size - h - top), value=value)


def _check_choice(name: str, value, allowed: Sequence) -> None:
    """ConfigError (with a did-you-mean) unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(name, "unknown value", value=value, accepted=list(allowed))


# -- the data a run trained on (stored in its checkpoints, compared on resume) ------------------
#: datamodule arguments that change how the data are loaded, not which data (not fingerprinted)
LOADING_ONLY_ARGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
#: files up to this size are hashed (sha256) in the fingerprint; larger ones: size + mtime only
HASH_LIMIT_BYTES = 64 << 20
_DIR_FILES_MAX = 5000


def _plain(value):
    """A JSON-like copy of ``value`` (checkpoints load with ``weights_only``)."""
    import json

    return json.loads(json.dumps(value, default=str))


def _file_record(path: str) -> dict:
    import hashlib
    import os

    st = os.stat(path)
    rec = {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns), "sha256": None}
    if st.st_size <= HASH_LIMIT_BYTES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        rec["sha256"] = h.hexdigest()
    return rec


def _dir_record(path: str) -> dict:
    """Size and mtime of the files below a directory (the first few thousand), as one digest."""
    import hashlib
    import os

    h, n, size = hashlib.sha256(), 0, 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            if n >= _DIR_FILES_MAX:
                break
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            h.update(f"{os.path.relpath(p, path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            n, size = n + 1, size + int(st.st_size)
    return {"files": n, "size": size, "listing_sha256": h.hexdigest()}


def _paths_in(value, prefix: str):
    """``(argument, path)`` for every string in ``value`` (nested lists/dicts) naming an
    existing file or directory."""
    import os

    if isinstance(value, str) and value and len(value) < 4096 and os.path.exists(value):
        yield prefix, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _paths_in(v, f"{prefix}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths_in(v, f"{prefix}.{k}")


def data_fingerprint(datamodule) -> dict:
    """What a run trains on, cheaply: the datamodule's class, its saved arguments
    (``hparams_initial`` without :data:`LOADING_ONLY_ARGS`) and, for every argument naming a
    file or directory, that file's size, mtime and sha256 (files up to :data:`HASH_LIMIT_BYTES`)
    or the directory's listing (names, sizes, mtimes). Plain types only."""
    import os

    if datamodule is None:
        return {}
    hp = dict(getattr(datamodule, "hparams_initial", None) or {})
    values = {str(k): v for k, v in hp.items() if k not in LOADING_ONLY_ARGS and k != "_class_path"}
    files = {}
    for arg, path in _paths_in(values, ""):
        arg = arg.lstrip(".")
        try:
            rec = _file_record(path) if os.path.isfile(path) else _dir_record(path)
        except OSError:
            continue
        files[arg] = {"path": path, **rec}
    cls = type(datamodule)
    return _plain({"class": f"{cls.__module__}.{cls.__qualname__}", "values": values, "files": files})


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def data_changes(saved: dict, now: dict, name: Callable[[str], str] = "data.{}".format) -> list:
    """What differs between the fingerprint ``saved`` in a checkpoint and ``now`` (one line
    each, naming the datamodule argument ``k`` as ``name(k)``: ``data.k``, the command line's
    config path there); [] when the data are the same (or nothing was saved)."""
    if not saved or not now:
        return []
    out = []
    if saved.get("class") != now.get("class"):
        out.append(f"data class: {saved.get('class')} -> {now.get('class')}")
    old_v, new_v = saved.get("values") or {}, now.get("values") or {}
    for k in sorted(set(old_v) | set(new_v)):
        if old_v.get(k, "<unset>") != new_v.get(k, "<unset>"):
            out.append(f"{name(k)}: {_short(old_v.get(k, '<unset>'))} -> {_short(new_v.get(k, '<unset>'))}")
    old_f, new_f = saved.get("files") or {}, now.get("files") or {}
    for k in sorted(old_f):
        a, b = old_f[k], new_f.get(k)
        where = f"{name(k)} ({a.get('path')})"
        if b is None:
            if old_v.get(k) == new_v.get(k):  # the same argument, the file is gone
                out.append(f"{where}: the file is gone")
            continue
        if "listing_sha256" in a or "listing_sha256" in b:
            if a.get("listing_sha256") != b.get("listing_sha256"):
                out.append(f"{where}: the directory's files changed ({a.get('files')} -> {b.get('files')} "
                           f"files, {a.get('size')} -> {b.get('size')} bytes, or newer files)")
        elif a.get("sha256") and b.get("sha256"):
            if a["sha256"] != b["sha256"]:
                out.append(f"{where}: the file's content changed (sha256 {a['sha256'][:12]} -> "
                           f"{b['sha256'][:12]}, {a.get('size')} -> {b.get('size')} bytes)")
        elif (a.get("size"), a.get("mtime_ns")) != (b.get("size"), b.get("mtime_ns")):
            out.append(f"{where}: the file was replaced or modified ({a.get('size')} -> {b.get('size')} "
                       "bytes, or a newer modification time)")
    return out
