"""On-disk cache for things that do not change between epochs or runs.

Teacher endpoints, empirical endpoints and training-set descriptors are expensive and fully
determined by their inputs, so they are stored under a key that hashes *everything* they depend
on, written atomically (tmp file in the same directory + ``os.replace``) and verified on load
(key and a sha256 checksum of the tensors' bytes).  A missing, stale or corrupted file is never
trusted: :func:`load_tensor_verified` returns ``None`` and the caller recomputes.

Root directory: ``$LIGHTNING_PFD_CACHE`` or ``~/.cache/lightning_pfd``.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_open

__all__ = ["cache_dir", "check_cache_writable", "hash_key", "save_tensor_atomic", "load_tensor_verified", "tensor_checksum",
           "deferred_writes", "write_deferred"]

_FORMAT_VERSION = 1


def _cache_root() -> tuple:
    given = os.environ.get("LIGHTNING_PFD_CACHE")
    root = given or os.path.join("~", ".cache", "lightning_pfd")
    return root, Path(root).expanduser(), bool(given)


def _cache_error(root: str, given: bool, problem: str, cause=None):
    from .errors import ConfigError

    field = "LIGHTNING_PFD_CACHE" if given else "LIGHTNING_PFD_CACHE (unset: the default cache directory)"
    return ConfigError(field, problem, value=str(root),
                       suggestion="point LIGHTNING_PFD_CACHE at a writable directory"
                       + (" (or unset it for ~/.cache/lightning_pfd)" if given else ""))


def check_cache_writable() -> None:
    """ConfigError naming ``LIGHTNING_PFD_CACHE`` when the cache directory is (or goes through) a
    regular file, or cannot be created or written (read-only, no permission); creates nothing."""
    root, path, given = _cache_root()
    existing = next((q for q in (path.absolute(), *path.absolute().parents) if q.exists()), None)
    if existing is None:  # pragma: no cover - the file system root exists
        return
    if not existing.is_dir():
        raise _cache_error(root, given, "is (or goes through) a regular file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _cache_error(root, given, f"cannot be written: {existing} is not writable by this user "
                           "(or on a read-only file system)")


def cache_dir() -> Path:
    """The cache root (``$LIGHTNING_PFD_CACHE``, default ``~/.cache/lightning_pfd``), created;
    a ConfigError naming ``LIGHTNING_PFD_CACHE`` when it cannot be."""
    root, path, given = _cache_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise _cache_error(root, given, "is (or goes through) a regular file, not a directory") from e
    except OSError as e:  # no permission, read-only file system
        raise _cache_error(root, given, f"cannot be created: {e.strerror}") from e
    check_cache_writable()
    return path


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw bytes of a tensor's contents (CPU, contiguous, any dtype)."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def _update(h: "hashlib._Hash", obj: Any) -> None:
    """Feed a canonical, type-tagged encoding of ``obj`` into ``h`` (recursive)."""
    if obj is None:
        h.update(b"N;")
    elif isinstance(obj, bool):
        h.update(b"B" + (b"1" if obj else b"0") + b";")
    elif isinstance(obj, int):
        h.update(b"I" + str(obj).encode() + b";")
    elif isinstance(obj, float):
        # repr round-trips exactly; normalise -0.0 / nan so equal values hash equally
        s = "nan" if math.isnan(obj) else repr(obj + 0.0)
        h.update(b"F" + s.encode() + b";")
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        h.update(b"S" + str(len(data)).encode() + b":" + data)
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        h.update(b"Y" + str(len(data)).encode() + b":" + data)
    elif isinstance(obj, torch.Tensor):
        meta = json.dumps({"dtype": str(obj.dtype), "shape": list(obj.shape)}, sort_keys=True)
        h.update(b"T" + meta.encode() + b":")
        h.update(_tensor_bytes(obj))
        h.update(b";")
    elif hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        import numpy as np

        arr = np.ascontiguousarray(np.asarray(obj))
        meta = json.dumps({"dtype": str(arr.dtype), "shape": list(arr.shape)}, sort_keys=True)
        h.update(b"A" + meta.encode() + b":" + arr.tobytes() + b";")
    elif isinstance(obj, dict):
        items = sorted(((str(k), v) for k, v in obj.items()), key=lambda kv: kv[0])
        h.update(b"D" + str(len(items)).encode() + b"{")
        for k, v in items:
            _update(h, k)
            _update(h, v)
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"L" + str(len(obj)).encode() + b"[")
        for v in obj:
            _update(h, v)
        h.update(b"]")
    elif isinstance(obj, (torch.dtype, torch.device, Path)):
        _update(h, str(obj))
    elif hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        _update(h, obj.item())
    else:
        raise TypeError(
            f"hash_key: cannot hash object of type {type(obj).__name__}; allowed: None, bool, int, "
            "float, str, bytes, torch.Tensor, numpy arrays, dicts, lists and tuples of these"
        )


def hash_key(*parts: Any) -> str:
    """sha256 hex digest of a canonical encoding of ``parts``.

    Strings, numbers, bytes, dicts (key order irrelevant), lists/tuples and tensors (by dtype,
    shape and content, not identity) are supported; equal inputs give equal keys across runs.
    """
    h = hashlib.sha256()
    _update(h, list(parts))
    return h.hexdigest()


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a dict of tensors."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        _update(h, name)
        _update(h, tensors[name])
    return h.hexdigest()


def _check_tensor_dict(tensors: Any) -> None:
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise ValueError("save_tensor_atomic: `tensors` must be a dict[str, torch.Tensor]")


_DEFERRED: contextvars.ContextVar = contextvars.ContextVar("lightning_pfd_deferred_cache", default=None)


@contextlib.contextmanager
def deferred_writes():
    """Keep the cache writes made inside in memory (reads see them) instead of writing them.

    The command line validates a run inside this context: a run that fails validation leaves no
    cache entry behind; one that passes writes them with :func:`write_deferred`."""
    pending: dict = {}
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)


def write_deferred(pending: dict) -> None:
    """Write the entries collected by :func:`deferred_writes` (atomically, one by one)."""
    for path, (tensors, key) in list(pending.items()):
        save_tensor_atomic(path, tensors, key)
    pending.clear()


def save_tensor_atomic(path: str | os.PathLike, tensors: dict[str, torch.Tensor], key: str) -> Path:
    """Write ``tensors`` with their ``key`` and checksum to ``path`` atomically.

    The payload goes to a temporary file in the same directory, is flushed and fsync'ed, then
    ``os.replace``'d onto ``path``; if anything raises, the temporary file is removed and any
    previous file at ``path`` is left untouched.
    """
    _check_tensor_dict(tensors)
    if not isinstance(key, str):
        raise ValueError("save_tensor_atomic: `key` must be a str (use hash_key(...))")
    path = Path(path)
    pending = _DEFERRED.get()
    if pending is not None:  # inside deferred_writes(): keep it for later
        pending[path] = ({k: v.detach().to("cpu").clone() for k, v in tensors.items()}, key)
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        root, _root_path, given = _cache_root()
        raise _cache_error(root, given, f"cannot create {path.parent}: {e.strerror}") from e
    payload = {
        "format": _FORMAT_VERSION,
        "key": key,
        "checksum": tensor_checksum(tensors),
        "tensors": {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
    }
    with atomic_open(path) as f:
        torch.save(payload, f)
    return path


def load_tensor_verified(path: str | os.PathLike, key: str) -> dict[str, torch.Tensor] | None:
    """Load a dict saved by :func:`save_tensor_atomic`, or ``None``.

    ``None`` when the file is missing, unreadable, of an unknown format, stored under another
    key, or when its tensors fail the checksum (a corrupted file is never trusted).
    """
    path = Path(path)
    pending = _DEFERRED.get()
    if pending is not None and path in pending and pending[path][1] == key:
        return {k: v.clone() for k, v in pending[path][0].items()}
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT_VERSION:
        return None
    if payload.get("key") != key:
        return None
    tensors = payload.get("tensors")
    try:
        _check_tensor_dict(tensors)
        if tensor_checksum(tensors) != payload.get("checksum"):
            return None
    except Exception:
        return None
    return tensors
