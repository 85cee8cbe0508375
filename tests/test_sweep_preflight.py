"""Sweep faults found before anything runs: a Ray address where nothing answers (seconds, not
Ray's minutes of retries), a token-authenticated cluster joined without a token (what to set),
and every trial's cross-component validation (the checks ``fit`` runs before writing) naming
every bad trial."""
from __future__ import annotations

import time

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
    with pytest.raises(ConfigError, match=r"--address: Ray refused this driver at 10.1.2.3:6379: the cluster "
                                          r"uses token authentication: run the driver with RAY_AUTH_MODE=token"):
        runner._start_ray("10.1.2.3:6379")


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


def test_an_empty_grid_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"grid: is empty: the sweep would be a single trial.*repeats"):
        load_sweep(write_sweep(tmp_path, {}))
