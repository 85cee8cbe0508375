"""CIFAR-10 from user-provided local files (nothing ships it and nothing is downloaded).

Accepted layouts under ``root`` (first match wins):
1. ``cifar-10-batches-py/`` (or ``root`` itself) with the official pickles ``data_batch_1`` ..
   ``data_batch_5`` and ``test_batch`` (``encoding="latin1"``; ``data`` uint8 (10000, 3072) as
   R, G, B planes of 32x32; ``labels`` a list of ints);
2. the official tarball ``cifar-10-python.tar.gz`` (read in place, not extracted);
3. a folder of PNGs: ``train/<class>/*.png`` and ``test/<class>/*.png`` (labels = sorted class
   folder index), or ``train/*.png`` / ``test/*.png`` without labels.

The pickles are read with :class:`CifarUnpickler`, which resolves only the globals that numpy
arrays need (a plain ``pickle.load`` would run any code a crafted batch file names); anything
else is a :class:`~lightning_pfd.errors.ConfigError` naming the file and the global.
"""
from __future__ import annotations

import _codecs
import os
import pickle
import tarfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import ConfigError
from ..validation import NonNegativeInt, PositiveInt
from .base import DEFAULT_VALUE_RANGE, TensorDataModule, _check_choice, _scale_uint8

__all__ = ["CIFAR10DataModule", "load_cifar10", "CifarUnpickler", "safe_load_cifar_pickle"]

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
TARBALL = "cifar-10-python.tar.gz"
BATCH_DIR = "cifar-10-batches-py"


def _latin1_encode(obj, encoding: str = "utf-8", errors: str = "strict"):
    """``_codecs.encode`` restricted to latin-1: how Python 3 pickles ``bytes`` at protocol <= 2
    (e.g. a numpy array's raw buffer); other codecs (zlib, base64, ...) are refused."""
    if str(encoding).lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise pickle.UnpicklingError(f"codec {encoding!r} is not allowed (only latin1)")
    return _codecs.encode(obj, "latin1", errors)


def _numpy_globals() -> dict[tuple[str, str], object]:
    """The globals numpy's own pickles of arrays, dtypes and scalars reference, under both module
    spellings (numpy 1.x ``numpy.core``, numpy 2.x ``numpy._core``); the objects are taken from
    numpy's reducers, so no module is imported by name."""
    reconstruct = np.zeros(1).__reduce__()[0]      # multiarray._reconstruct (protocol <= 4)
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]   # numeric._frombuffer (protocol 5)
    scalar = np.int64(0).__reduce__()[0]           # multiarray.scalar (numpy scalars)
    allowed: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray,
                                              ("numpy", "dtype"): np.dtype,
                                              ("_codecs", "encode"): _latin1_encode}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class CifarUnpickler(pickle.Unpickler):
    """An unpickler for the CIFAR-10 python format: dicts, lists, strings, bytes, numbers and
    numpy arrays / dtypes / scalars; any other global (``os.system``, ``builtins.eval``, ...)
    raises :class:`ConfigError` before it is resolved, so no code named by the file runs."""

    ALLOWED = _numpy_globals()

    def __init__(self, file, where: str):
        super().__init__(file, encoding="latin1")  # the official files are Python 2 pickles
        self.where = where

    def find_class(self, module: str, name: str):
        """Resolve only the allowed (module, name) pairs; refuse everything else."""
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise ConfigError(
                "root", f"{self.where}: refusing to load the global '{module}.{name}', which the "
                "CIFAR-10 python format never contains (the file may be crafted to run code)",
                accepted=sorted(f"{m}.{n}" for m, n in self.ALLOWED),
                suggestion="use the official cifar-10-batches-py files or PNG folders") from None

    def persistent_load(self, pid):
        """Persistent ids never occur in CIFAR-10 batches."""
        raise ConfigError("root", f"{self.where}: refusing a pickle persistent id")


def safe_load_cifar_pickle(file, where: str):
    """Unpickle one CIFAR-10 batch with :class:`CifarUnpickler`; unreadable data -> ConfigError."""
    try:
        return CifarUnpickler(file, where).load()
    except ConfigError:
        raise
    except Exception as e:  # truncated / corrupt stream, refused codec, bad numpy state
        raise ConfigError("root", f"{where} is not a readable CIFAR-10 python pickle "
                          f"({type(e).__name__}: {e})",
                          suggestion="re-copy the official cifar-10-batches-py files") from None


def _decode_batch(d, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (n, 3, 32, 32), int64 (n,)) from one unpickled batch dict."""
    if not isinstance(d, dict):
        raise ConfigError("root", f"CIFAR-10 batch {where} must hold a dict, got {type(d).__name__}")
    try:
        data = np.asarray(d["data"], dtype=np.uint8)
        labels = np.asarray(d["labels"], dtype=np.int64)
    except KeyError as e:
        raise ConfigError("root", f"CIFAR-10 batch {where} lacks the key {e}",
                          accepted=["data", "labels"]) from None
    except (TypeError, ValueError) as e:
        raise ConfigError("root", f"CIFAR-10 batch {where}: data / labels are not numeric ({e})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(labels) != len(data):
        raise ConfigError("root", f"CIFAR-10 batch {where} must hold data uint8 (n, 3072) and n "
                          f"labels, got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _from_pickles(folder: Path):
    def load(name):
        with open(folder / name, "rb") as f:
            return _decode_batch(safe_load_cifar_pickle(f, str(folder / name)), str(folder / name))
    return [load(n) for n in TRAIN_BATCHES], load(TEST_BATCH)


def _from_tarball(path: Path):
    with tarfile.open(path, "r:gz") as tar:
        members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        missing = [n for n in TRAIN_BATCHES + [TEST_BATCH] if n not in members]
        if missing:
            raise FileNotFoundError(f"root: tarball {path} lacks the members {missing}")

        def load(name):
            where = f"{path}:{members[name].name}"
            return _decode_batch(safe_load_cifar_pickle(tar.extractfile(members[name]), where), where)
        return [load(n) for n in TRAIN_BATCHES], load(TEST_BATCH)


def _from_pngs(split_dir: Path):
    from PIL import Image

    subdirs = sorted(p for p in split_dir.iterdir() if p.is_dir())
    if subdirs:
        files = [(f, k) for k, d in enumerate(subdirs) for f in sorted(d.glob("*.png"))]
    else:
        files = [(f, -1) for f in sorted(split_dir.glob("*.png"))]
    if not files:
        raise FileNotFoundError(f"root: no PNG files in {split_dir}")
    imgs = []
    for f, _ in files:
        with Image.open(f) as im:
            a = np.asarray(im.convert("RGB"), dtype=np.uint8)
        if a.shape != (32, 32, 3):
            raise ValueError(f"root: {f} is {a.shape[1]}x{a.shape[0]}, CIFAR-10 images are 32x32")
        imgs.append(a.transpose(2, 0, 1))
    labels = np.asarray([k for _, k in files], dtype=np.int64)
    return np.stack(imgs), (labels if subdirs else None)


def load_cifar10(root: str | os.PathLike):
    """(train_x uint8 (N,3,32,32), train_y, test_x, test_y) from one of the accepted layouts."""
    root = Path(root)
    for folder in (root / BATCH_DIR, root):
        if all((folder / n).is_file() for n in TRAIN_BATCHES + [TEST_BATCH]):
            train, test = _from_pickles(folder)
            break
    else:
        tarball = root / TARBALL if root.is_dir() else root
        if tarball.is_file() and tarball.name.endswith((".tar.gz", ".tgz")):
            train, test = _from_tarball(tarball)
        elif (root / "train").is_dir() and (root / "test").is_dir():
            return (*_from_pngs(root / "train"), *_from_pngs(root / "test"))
        else:
            raise FileNotFoundError(
                f"root: CIFAR-10 not found at {str(root)!r}. Expected one of: "
                f"{BATCH_DIR}/{{{', '.join(TRAIN_BATCHES)}, {TEST_BATCH}}} (official python pickles), "
                f"the official tarball {TARBALL}, or PNG folders train/<class>/*.png and "
                "test/<class>/*.png. CIFAR-10 is not downloaded at run time: copy it there yourself.")
    train_x = np.concatenate([b[0] for b in train])
    train_y = np.concatenate([b[1] for b in train])
    return train_x, train_y, test[0], test[1]


class CIFAR10DataModule(TensorDataModule):
    """CIFAR-10 (3, 32, 32) in [-1, 1]; validation = the official test split.

    ``classes`` keeps only the given labels; ``n_train`` picks a seeded subset.
    """

    def __init__(self, root: str, classes: Optional[list[int]] = None, batch_size: PositiveInt = 128,
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
        self.root, self.classes = str(root), classes
        if not Path(self.root).exists():
            raise FileNotFoundError(
                f"root: {self.root!r} does not exist; CIFAR-10 must be provided locally as "
                f"{BATCH_DIR}/ (data_batch_1..5, test_batch), {TARBALL} or PNG folders train/ test/")

    def load_splits(self):
        tx, ty, vx, vy = load_cifar10(self.root)
        tx, vx = _scale_uint8(torch.from_numpy(tx)), _scale_uint8(torch.from_numpy(vx))
        ty = None if ty is None else torch.from_numpy(ty)
        vy = None if vy is None else torch.from_numpy(vy)
        if self.classes is not None:
            if ty is None or vy is None:
                raise ValueError("classes: this CIFAR-10 copy has no labels (flat PNG folders)")
            keep, keepv = torch.isin(ty, torch.tensor(self.classes)), torch.isin(vy, torch.tensor(self.classes))
            tx, ty, vx, vy = tx[keep], ty[keep], vx[keepv], vy[keepv]
        return tx, ty, vx, vy
