"""The one atomic write of the package: every file lightning_pfd writes whole (checkpoints, cache
entries, per-unit records, reports, figures, ``config.yaml``, sweep records) goes through
:func:`atomic_open`.

The bytes go to a temporary file in the target's directory (``.<name>.<random>.tmp``), are
flushed and ``fsync``'ed, and the file is renamed over the target (``os.replace``), after which
the directory is fsync'ed so the rename itself is durable. A crash at any moment leaves the old
file or the new one, never a partial one; on any exception (a full disk, SIGTERM turned into
``SystemExit``, a bug in the writer) the temporary file is removed and the target is untouched.
An ``OSError`` without a file name (``ENOSPC`` from ``write``) is raised again naming the target,
so a full-disk message says which file could not be written.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

__all__ = ["atomic_open", "atomic_write"]


@contextlib.contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = "wb") -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: ``path`` holds what was written once the
    block ends without an exception, and is untouched otherwise (module docstring). ``mode``:
    ``"wb"`` or ``"w"`` (text, UTF-8). The parent directory is created."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open: mode must be 'wb' or 'w', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # disk full, file-size limit, ...: say which file (the old one is intact)
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None or e.filename == tmp:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write(path: Union[str, os.PathLike], data: Union[bytes, str]) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; returns the path."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (not possible on some file systems: skipped)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover - directories cannot be fsynced on some file systems
        pass
    finally:
        os.close(dfd)
