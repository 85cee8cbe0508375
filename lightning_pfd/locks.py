"""One writer per run directory and per sweep: an exclusive lock file that names its holder.

Two ``fit`` into the same checkpoint directory (or two ``sweep`` drivers with the same name) at
once would interleave their checkpoints (``last.ckpt`` and ``last-v1.ckpt``), logs and results.
:func:`acquire` takes ``<directory>/.lightning_pfd.lock``:

* the lock is an ``fcntl.flock`` on that file, held while the process runs: the kernel drops it
  when the process ends in any way (exit, exception, SIGKILL), so a crash never blocks the next
  run; the file's content (JSON: pid, host, start time, command) only serves the messages;
* a second writer fails at once with a :class:`~lightning_pfd.errors.ConfigError` naming the
  holder's pid, host, start time and command;
* a lock file left by a process that is gone (SIGKILL, power loss: the flock is free, the pid on
  this host no longer runs, or runs another program) is **stale**: it is taken over with one
  printed line; a file written on *another* host whose flock is free cannot be checked from here
  (a network file system may not share flocks between hosts): it is refused, naming the file to
  delete if that run is gone;
* :meth:`RunLock.release` removes the file (only the holder's own); a lock taken twice by the
  same process is the same lock (re-entrant).

Pure standard library (no torch, no Lightning). POSIX only: elsewhere the lock is a no-op.
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

from .errors import ConfigError

__all__ = ["LOCK_NAME", "RunLock", "acquire", "release_all", "held_locks", "read_holder"]

LOCK_NAME = ".lightning_pfd.lock"

try:  # pragma: no cover - POSIX everywhere this project runs
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

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


def read_holder(path) -> Optional[dict]:
    """The holder record in a lock file (None: no file, empty or unreadable)."""
    try:
        text = Path(path).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
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

    def __init__(self, path: Path, fd: int, created_dir: Optional[Path], what: str):
        self.path, self._fd, self.created_dir, self.what = path, fd, created_dir, what

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, remove_created_dir: bool = False) -> None:
        """Drop the lock and remove the lock file; with ``remove_created_dir`` also the directory
        :func:`acquire` created, when nothing else was written into it."""
        if self._fd is None:
            return
        try:
            holder = read_holder(self.path)
            if holder is not None and holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
            _HELD.pop(str(self.path), None)
        if remove_created_dir and self.created_dir is not None:
            p = self.path.parent
            while True:  # the directories acquire() created, innermost first, while empty
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
    :class:`ConfigError` on ``field`` when another process holds it. None without ``fcntl``."""
    if fcntl is None:  # pragma: no cover
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
    for _ in range(5):  # retried only when the file was replaced between open and flock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only directory or file system, no permission
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise ConfigError(field, f"cannot write in the {what} directory {directory} "
                              f"({e.strerror}: its lock file {LOCK_NAME} cannot be created)",
                              value=str(directory),
                              suggestion="choose a writable output path, or make this one writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_holder(path) or {}
            raise ConfigError(field, f"another process is writing this {what}: {_describe(holder)}; "
                              f"lock {path}", value=str(directory),
                              suggestion="wait for it to finish (or stop it), or write elsewhere") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released (and removed) the file meanwhile: lock the new one
            os.close(fd)
            continue
        break
    else:  # pragma: no cover - a file replaced five times in a row
        raise ConfigError(field, f"could not lock {path} (replaced repeatedly)", value=str(directory))
    old = read_holder(path)
    if old:
        mine = old.get("host") == socket.gethostname()
        if not mine:
            os.close(fd)
            raise ConfigError(field, f"a lock of {_describe(old)} is in {path}; that host's process "
                              "cannot be checked from here", value=str(directory),
                              suggestion=f"if that run is no longer running, delete {path}")
        if old.get("pid") != os.getpid() and _alive(int(old.get("pid", -1)), old.get("pid_start")):
            # the flock is free but the pid runs the same program: a file system without flocks
            os.close(fd)
            raise ConfigError(field, f"another process is writing this {what}: {_describe(old)}; "
                              f"lock {path}", value=str(directory),
                              suggestion="wait for it to finish (or stop it), or write elsewhere")
        if old.get("pid") != os.getpid():
            echo(f"[lightning_pfd] taking over the stale lock of {_describe(old)}: that process is gone")
    record = {"pid": os.getpid(), "pid_start": _process_start(os.getpid()), "host": socket.gethostname(),
              "started": time.time(), "command": command or " ".join(sys.argv)[:300], "what": what}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    lock = RunLock(path, fd, created, what)
    _HELD[str(path)] = lock
    return lock
