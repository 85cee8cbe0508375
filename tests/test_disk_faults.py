"""Disk and path faults: a full disk (a file-size limit, ``ulimit -f``, in a real subprocess) gives
one message naming the file, leaves the earlier checkpoint and its config.yaml as they were and
says how to resume; an output path through a regular file is refused before anything is written."""
from __future__ import annotations

import hashlib
import resource
import subprocess
import sys

import pytest

from lightning_pfd.checkpoint import load_checkpoint
from lightning_pfd.cli import main
from test_reliability import _env, _snapshot, _write_config

LIMIT = 300 * 1024  # bytes: above config.yaml and the logs, below one checkpoint (~385 kB)


def _limited():
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_full_disk_gives_one_message_and_changes_nothing_of_the_earlier_run(tmp_path, monkeypatch):
    env, d = _env(tmp_path), tmp_path / "r"
    _write_config(d, epochs=2)
    monkeypatch.chdir(d)
    assert main(["fit", "--config", "c.yaml"]) == 0  # the earlier run (in-process: faster)
    ckpt, config = d / "run/checkpoints/last.ckpt", d / "run/csv/version_0/config.yaml"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ckpt, config)}
    assert ckpt.stat().st_size > LIMIT
    # resume for 2 more epochs with another lr: the new config.yaml differs from the earlier one
    args = ["--ckpt_path", "last", "--trainer.max_epochs", "4", "--model.init_args.lr", "0.002"]
    r = subprocess.run([sys.executable, "-m", "lightning_pfd", "fit", "--config", "c.yaml", *args], cwd=d,
                       env=env, capture_output=True, text=True, timeout=600, preexec_fn=_limited)
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"error: cannot write {ckpt}: over the file-size limit (ulimit -f) ([Errno 27]" in r.stderr
    assert f"intact: {ckpt} (end of epoch 1)" in r.stderr
    assert "then resume: python -m lightning_pfd fit --config c.yaml --trainer.max_epochs 4" in r.stderr
    assert "Traceback" not in r.stderr
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ckpt, config)} == before
    assert not list(ckpt.parent.glob(".*.tmp")) and load_checkpoint(ckpt)["global_step"] == 20
    # with space again the resume works and its config.yaml replaces the earlier one
    assert main(["fit", "--config", "c.yaml", *args]) == 0
    assert load_checkpoint(ckpt)["global_step"] == 40 and "lr: 0.002" in config.read_text()


def test_an_output_path_through_a_regular_file_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    d = tmp_path / "p"
    cfg = _write_config(d, epochs=1)
    (d / "afile").write_text("not a directory")
    monkeypatch.chdir(d)
    before = _snapshot(d)
    for option in (["--trainer.default_root_dir", "afile/run"],
                   ["--trainer.callbacks.dirpath", "afile/ckpt"]):  # the last callback: EpochCheckpoint
        assert main(["fit", "--config", str(cfg), *option]) == 2
        err = capsys.readouterr().err
        assert f"{d / 'afile'} is a regular file, so the directory {d / option[1]} cannot be created" in err
        assert "Traceback" not in err
    assert _snapshot(d) == before and not (d / "run").exists()


def test_a_cache_path_that_is_a_file_is_named(tmp_path, monkeypatch):
    from lightning_pfd.cache import cache_dir
    from lightning_pfd.errors import ConfigError

    (tmp_path / "cachefile").write_text("")
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cachefile"))
    with pytest.raises(ConfigError, match="LIGHTNING_PFD_CACHE: is \\(or goes through\\) a regular file"):
        cache_dir()


def test_a_hint_names_the_value_the_parser_keeps(monkeypatch):
    """An option given twice: argparse keeps the last value, so the hint names that one."""
    from lightning_pfd.launch.cli import _argv_value

    monkeypatch.setattr(sys, "argv", ["x", "fit", "--trainer.max_epochs", "2", "--trainer.max_epochs=two"])
    assert _argv_value("trainer.max_epochs") == "two"
