"""A killed sweep driver leaves no Ray process behind.

``ray.init(address="local")`` starts the session's processes (gcs_server, raylet, dashboard,
log and autoscaler monitors) as children of the driver, and the raylet starts agents and
workers. Ray ties the direct children to the driver's life, but after a SIGKILL of the driver
the raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and workers outlive it.

:func:`start_watchdog` runs this file as a separate process (standard library only, its own
session so a terminal's Ctrl-C does not reach it) that reads a pipe from the driver. While the
driver lives it records, every ``POLL_S`` seconds, the processes of *this* Ray session: the
driver's children whose command line names the session directory, and all their descendants
(pid and start time, so a reused pid is never touched). When the pipe closes (the driver exited
or was killed), it sends SIGKILL to the recorded processes that are still alive, their
descendants, and any process of the same user naming the session directory, as Ray's own
fate-sharing does for the driver's direct children: a trial cut this way records nothing (no
"failed" result from a half-stopped W&B or data loader), so ``--resume`` continues it from its
checkpoint. A cluster joined with ``--address`` is never watched: only a Ray this driver
started. Linux only (``/proc``); elsewhere :func:`start_watchdog` returns None.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, Optional, Set, Tuple

__all__ = ["start_watchdog", "stop_watchdog", "session_processes", "reap", "POLL_S"]

POLL_S = 0.5    # seconds between two records of the session's processes
ROUNDS = 3      # reaping rounds (a process may start a child while its parent is killed)

_PROC = Path("/proc")


def _stat(pid: int) -> Optional[Tuple[int, int]]:
    """(parent pid, start time in clock ticks) of ``pid``; None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace") + " "


def _own_uid_pids() -> Iterable[int]:
    uid = os.getuid()
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    yield int(entry.name)
            except OSError:
                continue


def session_processes(driver: int, session_dir: str, exclude: Iterable[int] = ()) -> Dict[int, int]:
    """pid -> start time of the processes of the Ray session ``session_dir`` started by
    ``driver``: its children whose command line names the session directory, their
    descendants, and any process of this user naming the session directory."""
    skip = set(exclude) | {driver, os.getpid()}
    stats = {pid: s for pid in _own_uid_pids() if (s := _stat(pid)) is not None}
    found: Dict[int, int] = {}
    names = (session_dir.rstrip("/") + "/", session_dir.rstrip("/") + " ")
    for pid, (ppid, start) in stats.items():
        if pid not in skip and any(n in _cmdline(pid) for n in names):
            found[pid] = start
    children: Dict[int, list] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in found and c not in skip:
                found[c] = stats[c][1]
                todo.append(c)
    return found


def _alive(recorded: Dict[int, int]) -> Set[int]:
    return {pid for pid, start in recorded.items() if (s := _stat(pid)) is not None and s[1] == start}


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def reap(driver: int, session_dir: str, recorded: Dict[int, int]) -> Set[int]:
    """SIGKILL every still-alive process of ``recorded`` and of the session (and what they
    started meanwhile); returns the pids signalled."""
    killed: Set[int] = set()
    targets = dict(recorded)
    for _ in range(ROUNDS):
        targets.update(session_processes(driver, session_dir))
        alive = _alive(targets) - killed
        if not alive:
            break
        _signal_all(alive, signal.SIGKILL)
        killed |= alive
        time.sleep(0.2)
    return killed


def _watch(driver: int, session_dir: str) -> None:
    """Record the session's processes until stdin closes, then :func:`reap` them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    recorded: Dict[int, int] = {}
    fd = sys.stdin.fileno()
    while True:
        recorded.update(session_processes(driver, session_dir))
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready and not os.read(fd, 4096):  # EOF: the driver is gone or done with Ray
            break
        if _stat(driver) is None:
            break
    reap(driver, session_dir, recorded)


def start_watchdog(session_dir: str) -> Optional[subprocess.Popen]:
    """Start the watchdog of this driver's local Ray session (see the module docstring); None
    where ``/proc`` is missing."""
    if not sys.platform.startswith("linux") or not _PROC.is_dir() or not session_dir:
        return None
    return subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid()),
                             str(session_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)


def stop_watchdog(proc: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """After ``ray.shutdown()``: close the pipe (the watchdog stops what is left of the session)
    and wait for it."""
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


if __name__ == "__main__":  # pragma: no cover - run by start_watchdog in its own process
    _watch(int(sys.argv[1]), sys.argv[2])
