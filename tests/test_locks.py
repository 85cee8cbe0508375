"""One writer per run directory and per sweep (lightning_pfd.locks, on filelock), with real
processes: a second writer fails at once naming the holder's pid and host and leaves its record
intact; a lock left by a SIGKILLed process is stale and taken over; a released lock keeps its file
but no holder; a failed run leaves no directory and no lock behind."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_pfd.errors import ConfigError
from lightning_pfd.locks import LOCK_NAME, acquire, held_locks, read_holder
from test_reliability import REPO, _cli, _env, _write_config

HOLD = """
import sys, time
from lightning_pfd.locks import acquire
acquire(sys.argv[1], "run", "dir")
print("held", flush=True)
time.sleep(60)
"""


def _holder(directory: Path, stderr=None) -> subprocess.Popen:
    """A real process holding the lock of ``directory`` (prints 'held' once it does)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                         stderr=stderr, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout.readline().strip() == "held"
    return p


def _wait_for_lock(path: Path, timeout: float = 90.0) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        holder = read_holder(path)
        if holder:
            return holder
        time.sleep(0.1)
    raise AssertionError(f"no lock at {path} after {timeout} s")


def test_a_second_process_is_refused_then_a_sigkilled_holder_is_taken_over(tmp_path):
    from lightning_pfd.commands.report import training_now

    d = tmp_path / "a" / "b"
    p = _holder(d)
    try:
        holder = read_holder(d / LOCK_NAME)
        assert holder["pid"] == p.pid and holder["host"] == socket.gethostname()
        before = (d / LOCK_NAME).read_bytes()
        with pytest.raises(ConfigError, match=rf"another process is writing this run: pid {p.pid} on host "):
            acquire(d, "run", "dir")
        assert (d / LOCK_NAME).read_bytes() == before and not held_locks()  # the holder's record intact
        assert training_now(d) == f"pid {p.pid} ({holder['command']})"  # report: "still training"
    finally:
        p.kill()
        p.wait()
    assert read_holder(d / LOCK_NAME)["pid"] == p.pid  # SIGKILL: the record stays, the flock is gone
    assert training_now(d) is None
    said = []
    lock = acquire(d, "run", "dir", echo=said.append)
    assert len(said) == 1 and f"stale lock of pid {p.pid}" in said[0] and "that process is gone" in said[0]
    assert read_holder(d / LOCK_NAME)["pid"] == os.getpid()
    assert acquire(d, "run", "dir") is lock  # re-entrant in one process
    lock.release()
    # released: the file stays (filelock's), with no holder; the next process takes it silently
    assert (d / LOCK_NAME).exists() and read_holder(d / LOCK_NAME) is None and not held_locks()
    assert not lock.held and training_now(d) is None
    p = _holder(d, stderr=subprocess.PIPE)
    p.kill()
    assert "taking over" not in p.communicate()[1]


def test_a_record_of_a_live_process_with_a_free_lock_is_refused(tmp_path):
    """A file system whose flocks do not exclude: the record names a process of this host that
    still runs the same program (its start time matches), so the lock is not taken."""
    from lightning_pfd.locks import _process_start

    ppid = os.getppid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": ppid, "pid_start": _process_start(ppid),
                                                  "host": socket.gethostname(), "command": "fit"}))
    with pytest.raises(ConfigError, match=rf"another process is writing this run: pid {ppid} on host "):
        acquire(tmp_path, "run", "dir")
    assert read_holder(tmp_path / LOCK_NAME)["pid"] == ppid and not held_locks()


def test_a_lock_written_on_another_host_is_refused_with_the_file_to_delete(tmp_path):
    (tmp_path / LOCK_NAME).write_text('{"pid": 1, "host": "elsewhere", "started": 0, "command": "fit"}')
    with pytest.raises(ConfigError, match=r"pid 1 on host 'elsewhere'.*delete .*\.lightning_pfd\.lock"):
        acquire(tmp_path, "run", "dir")
    assert read_holder(tmp_path / LOCK_NAME)["host"] == "elsewhere" and not held_locks()


def test_a_lock_that_created_its_directory_removes_it_when_nothing_was_written(tmp_path):
    lock = acquire(tmp_path / "x" / "y" / "z", "run", "dir")
    lock.release(remove_created_dir=True)
    assert not (tmp_path / "x").exists()
    lock = acquire(tmp_path / "x" / "y", "run", "dir")
    (tmp_path / "x" / "y" / "written").write_text("")
    lock.release(remove_created_dir=True)  # something was written: the directory and its lock stay
    assert (tmp_path / "x" / "y" / LOCK_NAME).exists() and read_holder(tmp_path / "x" / "y" / LOCK_NAME) is None
    with pytest.raises(ConfigError, match="a part of the path is a regular file"):
        (tmp_path / "file").write_text("")
        acquire(tmp_path / "file" / "run", "run", "dir")


def test_two_fits_into_one_run_directory_the_second_fails_before_training(tmp_path):
    env, d = _env(tmp_path), tmp_path / "r"
    _write_config(d, epochs=10_000)  # runs until stopped
    first = subprocess.Popen([sys.executable, "-m", "lightning_pfd", "fit", "--config", "c.yaml"], cwd=d,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        holder = _wait_for_lock(d / "run/checkpoints" / LOCK_NAME)
        assert holder["pid"] == first.pid
        t0 = time.time()
        second = _cli(d, env, timeout=600)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"another process is writing this run: pid {first.pid} on host '{socket.gethostname()}'" \
            in second.stderr
        assert "Traceback" not in second.stderr and time.time() - t0 < 60
        assert first.poll() is None  # the first run goes on
        assert sorted(p.name for p in (d / "run/csv").iterdir()) == ["version_0"]  # no second version
        assert not list((d / "run/checkpoints").glob("last-v*.ckpt"))
    finally:
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=60)
    assert rc == 143  # stopped by SIGTERM: not a success
    assert read_holder(d / "run/checkpoints" / LOCK_NAME) is None  # released on the way out


def test_two_sweep_drivers_with_one_name_the_second_fails_at_once(tmp_path):
    pytest.importorskip("ray")
    from test_sweep import write_sweep

    cfg = write_sweep(tmp_path, {"data.init_args.n_train": [16]}, name="locked")
    sweep_dir = tmp_path / "runs" / "locked"
    p = _holder(sweep_dir)  # a real driver's lock, held by another process
    try:
        r = subprocess.run([sys.executable, "-m", "lightning_pfd", "sweep", "--config", str(cfg)],
                           cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"--name: another process is writing this sweep: pid {p.pid}" in r.stderr
    assert sorted(x.name for x in sweep_dir.iterdir()) == [LOCK_NAME]  # nothing written: no sweep.json
