"""Sweep faults found before anything runs: a Ray address where nothing answers (seconds, not
Ray's minutes of retries), a token-authenticated cluster joined without a token (what to set),
and every trial's cross-component validation (the checks ``fit`` runs before writing) naming
every bad trial."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lightning_pfd.errors import ConfigError
from lightning_pfd.sweeps import runner
from lightning_pfd.sweeps.spec import load_sweep
from test_sweep import run_cli, write_sweep

ray = pytest.importorskip("ray")


def test_an_address_where_nothing_listens_fails_within_seconds(tmp_path, capsys):
    cfg = write_sweep(tmp_path, {"data.init_args.n_train": [16]})
    t0 = time.time()
    assert run_cli(["--config", str(cfg), "--address", "127.0.0.1:1"]) == 2
    assert time.time() - t0 < 30
    err = capsys.readouterr().err
    assert "--address: no Ray head answers at 127.0.0.1:1 (connection refused)" in err
    assert "ray start --head" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() and not ray.is_initialized()  # nothing written, no Ray


@pytest.mark.parametrize("address", ["127.0.0.1", "head:port", "10.0.0.1:70000"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(ConfigError, match="not a Ray address"):
        runner.check_address(address)


def test_an_authentication_error_says_to_set_ray_auth_mode_token(monkeypatch):
    """What Ray 2.60 raises for a driver without a token against `ray start --head` (token auth on
    by default; ECOSYSTEM: verified with a real head), mapped to our message."""
    from ray.exceptions import AuthenticationError

    def refuse(**kwargs):
        raise AuthenticationError("InvalidAuthToken: Authentication required")

    monkeypatch.setattr(runner, "check_address", lambda address, timeout=0: None)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError, match=r"--address: cannot join the Ray cluster at 10.1.2.3:6379: the head "
                                          r"answers but refused this driver.*RAY_AUTH_MODE=token"):
        runner._start_ray("10.1.2.3:6379")


def test_a_token_at_hand_sets_ray_auth_mode_for_an_explicit_address(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    said = []
    runner.prepare_ray_auth("10.1.2.3:6379", said.append)
    assert "RAY_AUTH_MODE" not in os.environ and not said  # no token: nothing set
    (tmp_path / "token").write_text("abc")
    runner.prepare_ray_auth("auto", said.append)
    assert "RAY_AUTH_MODE" not in os.environ  # auto finds the token itself
    runner.prepare_ray_auth("10.1.2.3:6379", said.append)
    assert os.environ["RAY_AUTH_MODE"] == "token" and str(tmp_path / "token") in said[0]
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's own choice is kept
    runner.prepare_ray_auth("10.1.2.3:6379", said.append)
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and len(said) == 1


def test_preflight_names_every_trial_whose_data_is_too_small_for_a_monitor(tmp_path):
    """The issue's case: ICRMonitor.num_images = 16 with n_train 8 and 12 (both bad) and 16 (good);
    before, the sweep started and the bad trials failed inside Ray."""
    spec = load_sweep(write_sweep(tmp_path, {"data.init_args.n_train": [8, 16, 12]}, icr=True))
    with pytest.raises(ConfigError) as info:
        runner.plan(spec)
    text = info.value.block()
    assert "2 of 3 trials fail the checks `fit` runs before training" in text
    assert "trial n_train=8: trainer.callbacks[ICRMonitor].num_images: larger than the training set (8 " in text
    assert "trial n_train=12: trainer.callbacks[ICRMonitor].num_images: larger than the training set (12 " in text
    assert "n_train=16" not in text
    assert not spec.sweep_dir.exists()  # nothing written: no sweep directory, no cache entry
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    good = load_sweep(write_sweep(tmp_path, {"data.init_args.n_train": [16, 24]}, name="ok", icr=True))
    assert [t.n_train for t in runner.plan(good)] == [16, 24]


def test_aggregate_only_with_a_trial_without_results_exits_1(tmp_path, capsys):
    """Trials that never ran are pending: not a success (deleted files: test_run_faults.py)."""
    cfg = write_sweep(tmp_path, {"data.init_args.n_train": [16, 24]})
    spec = load_sweep(cfg)
    runner._write_record(spec, runner.plan(spec, construct=False), spec.resources, None, False)
    assert run_cli(["--config", str(cfg), "--aggregate-only"]) == 1
    err = capsys.readouterr().err
    assert "2 trial(s) not run yet (pending), e.g. n_train=16: run them with --resume" in err


def test_an_empty_grid_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"grid: is empty: the sweep would be a single trial.*repeats"):
        load_sweep(write_sweep(tmp_path, {}))


def test_a_failed_join_of_a_port_that_answers_names_the_token(monkeypatch):
    """Ray 2.60 does not raise AuthenticationError to the driver: after ~20 s of InvalidAuthToken
    retries ray.init raises ConnectionError("Failed to connect to Ray cluster at ...") (seen with
    a real head); the port answered, so the token is named."""
    def refuse(**kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390")

    monkeypatch.setattr(runner, "check_address", lambda address, timeout=0: None)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError, match=r"cannot join the Ray cluster at 127.0.0.1:6390: .*RAY_AUTH_MODE=token"):
        runner._start_ray("127.0.0.1:6390")


JOIN = """
import sys
from lightning_pfd.sweeps.runner import prepare_ray_auth, _start_ray
address = sys.argv[1]
prepare_ray_auth(address)  # before Ray is imported, as the sweep command does
import ray
assert _start_ray(address)
print("joined", int(ray.cluster_resources().get("CPU", 0)), flush=True)
ray.shutdown()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_head(head, ray_tmp) -> None:
    """Stop the head this test started, and only it: its process group, then any process of its
    session left over (found by its own RAY_TMPDIR in the command line), by pid."""
    import signal
    import subprocess

    try:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:  # the GCS server and the monitor outlive SIGTERM for a while
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait(timeout=10)
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if str(ray_tmp) in args and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_real_token_authenticated_head_is_joined_by_auto_and_by_host_port(tmp_path):
    """`ray start --head` with token authentication (Ray 2.60 turns it on when ~/.ray/auth_token
    exists: made here by `ray get-auth-token --generate`) on a free local port, isolated by its own
    RAY_TMPDIR and HOME: the driver joins it with --address auto and with --address
    127.0.0.1:PORT (RAY_AUTH_MODE=token set from the token)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from test_reliability import REPO

    ray_bin = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    ray_tmp = Path(tempfile.mkdtemp(prefix="lpfd", dir="/tmp"))  # short: Ray's socket paths
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=str(ray_tmp), HOME=str(home), PYTHONPATH=str(REPO))
    port = _free_port()
    subprocess.run([ray_bin, "get-auth-token", "--generate"], env=env, capture_output=True, timeout=60,
                   check=True)
    assert (home / ".ray" / "auth_token").stat().st_size > 0
    head = subprocess.Popen([ray_bin, "start", "--head", "--port", str(port), "--num-cpus", "1",
                             "--include-dashboard", "false", "--block", "--disable-usage-stats"],
                            env=env, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        while not (ray_tmp / "ray" / "ray_current_cluster").exists():
            assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        assert "Token authentication is enabled for this Ray cluster" in (tmp_path / "head.log").read_text()
        for address in ("auto", f"127.0.0.1:{port}"):
            r = subprocess.run([sys.executable, "-c", JOIN, address], env=env, capture_output=True,
                               text=True, timeout=600)
            assert r.returncode == 0 and "joined 1" in r.stdout, (address, r.stdout[-1000:], r.stderr[-2000:])
            if address != "auto":
                assert "RAY_AUTH_MODE=token: joining" in r.stdout
    finally:
        _stop_head(head, ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
