"""One writer per run directory and per sweep: an exclusive lock file that names its holder.

Two ``fit`` into the same checkpoint directory (or two ``sweep`` drivers with the same name) at
once would interleave their checkpoints (``last.ckpt`` and ``last-v1.ckpt``), logs and results.
:func:`acquire` takes ``<directory>/.lightning_pfd.lock`` with :class:`filelock.UnixFileLock`:

* the lock is an ``flock`` on that file, held while the process runs: the kernel drops it when
  the process ends in any way (exit, exception, SIGKILL), so a crash never blocks the next run.
  The file stays (filelock keeps it: every contender locks the same inode); its content, the
  holder record (JSON: pid, host, start time, command), is written once the lock is held and
  emptied on release: it only serves the messages (``report`` probes the flock itself);
* a second writer fails at once (``timeout=0``) with a :class:`~lightning_pfd.errors.ConfigError`
  naming the holder's pid, host, start time and command, and leaves the record intact;
* a record left by a process that is gone (SIGKILL, power loss: the flock is free, the pid on
  this host no longer runs, or runs another program) is **stale**: it is taken over with one
  printed line; a record written on *another* host whose flock is free cannot be checked from
  here (a network file system may not share flocks between hosts): it is refused, naming the
  file to delete if that run is gone (a live pid of this host with a free flock is refused too);
* :meth:`RunLock.release` empties the record, then drops the lock; with ``remove_created_dir``
  the directories :func:`acquire` created go too if nothing else was written there (the lock
  file is unlinked while held: filelock takes no lock on an unlinked inode). A lock taken twice
  by the same process is the same lock (re-entrant).

filelock and the standard library only (no torch, no Lightning). POSIX only: elsewhere the lock
is a no-op.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import filelock

from .errors import ConfigError

__all__ = ["LOCK_NAME", "RunLock", "acquire", "release_all", "held_locks", "read_holder"]

LOCK_NAME = ".lightning_pfd.lock"

_HELD: Dict[str, "RunLock"] = {}


def _process_start(pid: int) -> Optional[str]:
    """The start time of ``pid`` in clock ticks since boot (Linux /proc; None elsewhere): tells a
    reused pid from the original process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _process_start(pid)
    return start is None or now is None or now == start


def _parse(data: bytes) -> Optional[dict]:
    try:
        record = json.loads(data) if data.strip() else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_holder(path) -> Optional[dict]:
    """The holder record in a lock file (None: no file, empty, released or unreadable)."""
    try:
        return _parse(Path(path).read_bytes())
    except OSError:
        return None


def _describe(holder: dict) -> str:
    if not holder:
        return "a process that is starting (its record is not written yet)"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return (f"pid {holder.get('pid')} on host {holder.get('host')!r} (since {when}: "
            f"{holder.get('command') or '?'})")


class RunLock:
    """An acquired lock (see the module docstring)."""

    def __init__(self, path: Path, created_dir: Optional[Path], what: str):
        self.path, self.created_dir, self.what = path, created_dir, what
        self._lock: Optional[filelock.BaseFileLock] = None
        self._pid, self._inode = os.getpid(), None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def _claim(self, fd: int, field: str, command: Optional[str], echo) -> None:
        """filelock's ``on_acquired``: check the previous record (filelock >= 4.2.1 leaves the
        file's content alone), then write this process's (a raise here gives the lock back)."""
        old = _parse(os.pread(fd, 1 << 16, 0))
        where = dict(value=str(self.path.parent))
        if old and old.get("host") != socket.gethostname():
            raise ConfigError(field, f"a lock of {_describe(old)} is in {self.path}; that host's process "
                              "cannot be checked from here", **where,
                              suggestion=f"if that run is no longer running, delete {self.path}")
        if old and old.get("pid") != os.getpid():
            if _alive(int(old.get("pid", -1)), old.get("pid_start")):  # a file system without flocks
                raise ConfigError(field, f"another process is writing this {self.what}: {_describe(old)}; "
                                  f"lock {self.path}", **where,
                                  suggestion="wait for it to finish (or stop it), or write elsewhere")
            echo(f"[lightning_pfd] taking over the stale lock of {_describe(old)}: that process is gone")
        record = {"pid": os.getpid(), "pid_start": _process_start(os.getpid()), "host": socket.gethostname(),
                  "started": time.time(), "command": command or " ".join(sys.argv)[:300], "what": self.what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        st = os.fstat(fd)
        self._inode = (st.st_dev, st.st_ino)

    def release(self, remove_created_dir: bool = False) -> None:
        """Empty the record and drop the lock; with ``remove_created_dir`` also remove the
        directory :func:`acquire` created, lock file included, when nothing else was written into it."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        _HELD.pop(str(self.path), None)
        if self._pid != os.getpid():  # a forked child: the parent's lock (filelock closed its copy)
            return
        remove = remove_created_dir and self.created_dir is not None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == self._inode:  # our file (not one put in its place)
                    os.ftruncate(fd, 0)
                    if remove and os.listdir(self.path.parent) == [LOCK_NAME]:
                        os.unlink(self.path)
            finally:
                os.close(fd)
        except OSError:  # deleted by hand: nothing to empty
            pass
        finally:
            lock.release(force=True)
        p = self.path.parent
        while remove:  # the directories acquire() created, innermost first, while empty
            try:
                p.rmdir()
            except OSError:
                break
            if p == self.created_dir:
                break
            p = p.parent


def held_locks() -> Dict[str, RunLock]:
    """The locks this process holds (lock file path -> lock)."""
    return dict(_HELD)


def release_all(remove_created_dirs: bool = False) -> None:
    """Release every lock this process holds (the end of a command)."""
    for lock in list(_HELD.values()):
        lock.release(remove_created_dirs)


def _first_missing(directory: Path) -> Optional[Path]:
    """The top-most directory of ``directory`` that does not exist yet (None: it exists)."""
    missing = None
    for p in (directory, *directory.parents):
        if p.exists():
            break
        missing = p
    return missing


def acquire(directory, what: str, field: str, command: Optional[str] = None,
            echo=lambda s: print(s, file=sys.stderr, flush=True)) -> Optional[RunLock]:
    """Take the lock of ``directory`` (created if needed) for ``what`` ("run", "sweep"); a
    :class:`ConfigError` on ``field`` when another process holds it. None without ``flock``."""
    if not filelock.has_fcntl:  # pragma: no cover
        return None
    directory = Path(directory).absolute()
    path = directory / LOCK_NAME
    if str(path) in _HELD:
        return _HELD[str(path)]
    created = _first_missing(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ConfigError(field, f"cannot create the {what} directory {directory}: a part of the path "
                          "is a regular file, not a directory", value=str(directory),
                          suggestion="choose another output path (or move that file)") from e
    except OSError as e:
        raise ConfigError(field, f"cannot create the {what} directory {directory}: {e.strerror}",
                          value=str(directory)) from e
    lock = RunLock(path, created, what)
    file_lock = filelock.UnixFileLock(path, timeout=0, mode=0o644, thread_local=False, fallback_to_soft=False,
                                      preserve_lock_file=True,
                                      on_acquired=lambda fd: lock._claim(fd, field, command, echo))
    try:
        file_lock.acquire()
    except filelock.Timeout:  # before OSError: Timeout is a TimeoutError
        raise ConfigError(field, f"another process is writing this {what}: {_describe(read_holder(path) or {})}; "
                          f"lock {path}", value=str(directory),
                          suggestion="wait for it to finish (or stop it), or write elsewhere") from None
    except OSError as e:  # a read-only directory or file system, no permission
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise ConfigError(field, f"cannot write in the {what} directory {directory} "
                          f"({e.strerror}: its lock file {LOCK_NAME} cannot be created)",
                          value=str(directory),
                          suggestion="choose a writable output path, or make this one writable") from None
    lock._lock = file_lock
    _HELD[str(path)] = lock
    return lock
