"""Verified, atomic checkpoints.

Every checkpoint lightning_pfd writes carries a sha256 digest of its *content* (every tensor's
dtype, shape and bytes, every key and scalar, in order) under ``CHECKSUM_KEY``; loading recomputes
it. Flipped bytes inside a tensor, a truncated or empty file, or a file that is not a checkpoint
give one :class:`CheckpointError` naming the file and what is wrong, instead of a silently damaged
model or a bare ``EOFError``.

Writes are atomic: the bytes go to a temporary file in the target directory, are flushed to disk
(``fsync``) and renamed over the target, so a crash at any moment leaves either the old or the new
checkpoint, never a partial one. Loading always uses ``torch.load(weights_only=True)``.

:class:`VerifiedCheckpointIO` plugs both into Lightning (``Trainer(plugins=[...])``; the command
line and :class:`lightning_pfd.callbacks.EpochCheckpoint` install it by themselves).
"""
from __future__ import annotations

import hashlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from .atomic import atomic_write
from .errors import ConfigError

__all__ = ["CHECKSUM_KEY", "CheckpointError", "content_digest", "truncated_epoch",
           "load_weights_only",
           "save_checkpoint", "load_checkpoint", "read_verified_bytes", "verified_stream",
           "VerifiedCheckpointIO"]

CHECKSUM_KEY = "lightning_pfd_integrity"
_FORMAT = 1


class CheckpointError(ConfigError):
    """A checkpoint file that cannot be trusted: missing, empty, truncated, foreign or damaged."""

    def __init__(self, path, problem: str, suggestion: Optional[str] = None):
        super().__init__(f"checkpoint {str(path)!r}", problem, suggestion=suggestion)
        self.path = str(path)


# -- content digest -----------------------------------------------------------------------------
def _feed(h, obj: Any) -> None:
    """Feed a canonical, type-tagged encoding of ``obj`` into the hash ``h``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.is_sparse:
            t = t.to_dense()
        t = t.cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy())
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"A{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, (str, bytes)):
        b = obj.encode() if isinstance(obj, str) else obj
        h.update(f"{'S' if isinstance(obj, str) else 'B'}{len(b)}:".encode())
        h.update(b)
    elif obj is None or isinstance(obj, (bool, int, float, complex, np.generic)):
        h.update(f"P{type(obj).__name__}:{obj!r}".encode())
    elif hasattr(obj, "__dict__"):
        h.update(f"O{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _feed(h, dict(vars(obj)))
    else:
        h.update(f"R{type(obj).__qualname__}:{obj!r}".encode())


def content_digest(checkpoint: dict) -> str:
    """sha256 of everything in ``checkpoint`` except the digest entry itself."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in checkpoint.items() if k != CHECKSUM_KEY})
    return h.hexdigest()


# -- writing ------------------------------------------------------------------------------------
def save_checkpoint(checkpoint: dict, path) -> str:
    """Add the content digest to ``checkpoint`` and write it atomically. Returns the digest.

    Restricted numbers jsonargparse built (``NonNegativeInt(0)``, an ``int`` subclass that a
    class kept as an attribute) are written as the built-in numbers they equal
    (:func:`~lightning_pfd.validation.plain_numbers`), so the file loads weights-only."""
    from .validation import plain_numbers

    plain_numbers(checkpoint)
    digest = content_digest(checkpoint)
    checkpoint[CHECKSUM_KEY] = {"sha256": digest, "format": _FORMAT}
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    atomic_write(path, buf.getvalue())
    return digest


# -- reading ------------------------------------------------------------------------------------
def read_verified_bytes(path) -> bytes:
    """The raw bytes of ``path`` after checking it exists, is a file and is not empty."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(path, "no such file", suggestion=_listing_hint(p))
    if not p.is_file():
        raise CheckpointError(path, "is not a file")
    data = p.read_bytes()
    if not data:
        raise CheckpointError(path, "the file is empty (0 bytes): the write was interrupted or the "
                                    "file was truncated")
    return data


def _listing_hint(p: Path) -> Optional[str]:
    if p.parent.is_dir():
        ckpts = sorted(q.name for q in p.parent.glob("*.ckpt"))
        if ckpts:
            return f"checkpoints in {str(p.parent)!r}: {ckpts[:8]}"
    return None


def _deserialize(path, data: bytes, map_location) -> dict:
    if not data.startswith(b"PK"):
        kind = "a text file" if _looks_like_text(data) else "not a PyTorch checkpoint"
        raise CheckpointError(path, f"{kind} (no torch zip header); expected a file written by "
                                    "Trainer.save_checkpoint / ModelCheckpoint")
    obj = load_weights_only(io.BytesIO(data), path, map_location, CheckpointError)
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"holds a {type(obj).__name__}, not a checkpoint dictionary")
    return obj


#: what torch's weights-only unpickler says when a file holds Python objects it will not build
_REFUSED_PICKLE = ("Weights only load failed", "Unsupported global", "Unsupported operand")


def load_weights_only(f, path, map_location, error: Callable[[Any, str], Exception]):
    """``torch.load(f, weights_only=True)``, the package's one way to read a tensor file.

    A file holding Python objects the weights-only unpickler refuses (a pickle payload: code that
    would run if loaded without it) raises ``error(path, ...)`` saying so, without torch's advice
    to re-run with ``weights_only=False``; zip damage or truncation says that."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:  # zip damage, truncation, or a pickle that weights_only refuses
        text = str(e).strip()
        if isinstance(e, pickle.UnpicklingError) or any(m in text for m in _REFUSED_PICKLE):
            raise error(path, "holds Python objects that a weights-only load refuses (a pickle "
                              "payload could run code when loaded): it is not loaded. Load only files "
                              "you trust; a file written by this package holds tensors and plain values "
                              "only") from None
        first = text.splitlines()[0] if text else type(e).__name__
        raise error(path, f"cannot be read: truncated or damaged ({first[:200]})") from None


def _looks_like_text(data: bytes) -> bool:
    head = data[:512]
    return bool(head) and all(32 <= b < 127 or b in (9, 10, 13) for b in head)


def verify_content(path, checkpoint: dict, require_digest: bool = False) -> bool:
    """Check the stored digest against the content. Returns False when none is stored."""
    meta = checkpoint.get(CHECKSUM_KEY)
    if meta is None:
        if require_digest:
            raise CheckpointError(path, "carries no integrity digest, so it cannot be verified")
        warnings.warn(f"checkpoint {str(path)!r} carries no lightning_pfd integrity digest (written "
                      "by another tool or an older version): loaded without verification")
        return False
    expected = meta.get("sha256") if isinstance(meta, dict) else None
    if expected != content_digest(checkpoint):
        raise CheckpointError(path, "content does not match its sha256 digest: the file is damaged "
                                    "(flipped bytes inside a tensor or its metadata)",
                              suggestion="use an earlier checkpoint (e.g. the best one or a backup)")
    return True


def load_checkpoint(path, map_location: Any = "cpu", require_digest: bool = False) -> dict:
    """Load and verify a checkpoint (``weights_only=True``); the digest entry is removed."""
    data = read_verified_bytes(path)
    ckpt = _deserialize(path, data, map_location)
    verify_content(path, ckpt, require_digest)
    ckpt.pop(CHECKSUM_KEY, None)
    if "state_dict" not in ckpt:
        raise CheckpointError(path, "has no 'state_dict': not a Lightning checkpoint "
                                    f"(keys: {sorted(map(str, ckpt))[:8]})")
    return ckpt


def verified_stream(path) -> io.BytesIO:
    """The bytes of a verified checkpoint file as a stream (for ``load_from_checkpoint``): the
    file is read once, its content digest checked, and the same bytes handed to Lightning."""
    data = read_verified_bytes(path)
    ckpt = _deserialize(path, data, "cpu")
    verify_content(path, ckpt)
    if "state_dict" not in ckpt:
        raise CheckpointError(path, "has no 'state_dict': not a Lightning checkpoint")
    return io.BytesIO(data)


def _lightning_io_base():
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    return TorchCheckpointIO


class VerifiedCheckpointIO(_lightning_io_base()):
    """Lightning ``CheckpointIO``: atomic writes with a content digest, verified weights-only loads."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("VerifiedCheckpointIO does not take storage_options")
        save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")


def truncated_epoch(checkpoint: dict) -> Optional[tuple]:
    """``(epoch, steps done in it)`` when the checkpoint was written before the last batch of the
    epoch that was running (a ``max_time`` / ``max_steps`` stop, a step-interval checkpoint),
    else None. Lightning does not resume such an epoch where it stopped: the rest of it is never
    trained and it is never validated (read from Lightning's saved loop progress; None when the
    checkpoint has none)."""
    loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    batches, epochs = loop.get("epoch_loop.batch_progress"), loop.get("epoch_progress")
    if not isinstance(batches, dict) or not isinstance(epochs, dict):
        return None
    try:
        done = int(batches["current"]["completed"])
        cut = not batches["is_last_batch"] and done > 0
        epoch = int(epochs["current"]["processed"]) - 1
    except (KeyError, TypeError, ValueError):
        return None
    return (epoch, done) if cut else None
