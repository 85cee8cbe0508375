"""Issue 30, "wrong results or lost work": ``--overwrite`` leaves no stale ``last.ckpt``; a plain
``ModelCheckpoint(save_last, save_top_k=0)`` run stopped by SIGTERM is resumable; a resume on
changed data (a datamodule value, a replaced file) is refused unless ``--allow-data-change``; a
``max_steps`` stop inside an epoch resumes exactly (weights and metrics.csv of an uninterrupted
run); places the run cannot write (read-only, too long a name, an unwritable cache) fail before
anything is written; ``max_epochs 0``, a duplicated YAML key and the old option ``precond`` are
refused clearly; an interrupted checkpoint write's temporary file is removed at the next start."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_pfd.checkpoint import load_checkpoint
from lightning_pfd.cli import main
from lightning_pfd.errors import ConfigError
from test_reliability import _env, _snapshot, _write_config

FIT = ["fit", "--config", "c.yaml"]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished 1-epoch tiny run (10 steps), made once; tests copy it."""
    d = tmp_path_factory.mktemp("one_epoch")
    _write_config(d, epochs=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTNING_PFD_CACHE", str(d.parent / "cache_one_epoch"))
        mp.chdir(d)
        assert main(FIT) == 0
    return d


@pytest.fixture
def run(one_epoch, tmp_path, monkeypatch):
    d = tmp_path / "r"
    shutil.copytree(one_epoch, d)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(one_epoch.parent / "cache_one_epoch"))
    monkeypatch.chdir(d)
    return d


def _refused(capsys, argv, *must):
    try:
        status = main(argv)
    except SystemExit as e:  # the parser's own refusals exit from inside LightningCLI
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(m in err for m in must), err
    return err


# -- 1. --overwrite ------------------------------------------------------------------------------
def test_overwrite_moves_the_earlier_checkpoints_aside_and_last_is_the_new_runs(run):
    old = load_checkpoint(run / "run/checkpoints/last.ckpt")
    assert main(FIT + ["--overwrite", "--model.init_args.lr", "2e-3"]) == 0
    ckpts = sorted(p.relative_to(run / "run/checkpoints").as_posix()
                   for p in (run / "run/checkpoints").rglob("*.ckpt"))
    assert len(ckpts) == 2 and "last.ckpt" in ckpts, ckpts  # no last-v1.ckpt beside an old last.ckpt
    aside = [c for c in ckpts if c != "last.ckpt"][0]
    assert aside.startswith("overwritten-") and aside.endswith("/last.ckpt")
    new = load_checkpoint(run / "run/checkpoints/last.ckpt")
    assert new["hyper_parameters"]["lr"] == 2e-3 and old["hyper_parameters"]["lr"] == 1e-3
    kept = load_checkpoint(run / "run/checkpoints" / aside)["state_dict"]
    assert all(torch.equal(kept[k], old["state_dict"][k]) for k in old["state_dict"])  # moved, intact


def test_overwrite_refused_by_the_preflight_moves_nothing(run, capsys):
    before = _snapshot(run)
    _refused(capsys, FIT + ["--overwrite", "--trainer.max_epochs", "0"], "trainer.max_epochs")
    assert _snapshot(run) == before


# -- 2. SIGTERM with a plain ModelCheckpoint(save_last=True, save_top_k=0) -------------------------
def test_sigterm_with_a_plain_model_checkpoint_keeps_every_finished_epoch(tmp_path, monkeypatch, capsys):
    env, d = _env(tmp_path), tmp_path / "plain"
    cfg = _write_config(d, epochs=3)
    cfg.write_text(cfg.read_text().replace(
        "lightning_pfd.callbacks.EpochCheckpoint\n      init_args: {dirpath: run/checkpoints}",
        "lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {dirpath: run/checkpoints, save_last: true, save_top_k: 0}"))
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", env["LIGHTNING_PFD_CACHE"])
    monkeypatch.chdir(d)
    # the real signal, sent by the process to itself after step 25 (epoch 2), through the handlers
    assert main(FIT + ["--trainer.callbacks+=helpers.faults.SignalAtStep", "--trainer.callbacks.step", "25"]) == 143
    err = capsys.readouterr().err
    assert "(end of epoch 1)" in err and "did not finish" not in err, err[-2000:]
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["global_step"] == 20  # both epochs kept
    assert main(FIT + ["--ckpt_path", "last"]) == 0
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["global_step"] == 30


def test_the_stop_message_says_how_many_epochs_finished_without_a_checkpoint():
    from lightning_pfd.launch.interrupts import SignalRecord, resume_message

    rec = SignalRecord()
    rec.signum = int(signal.SIGTERM)

    class T:
        current_epoch, global_step, checkpoint_callbacks = 2, 25, []

    assert "2 epoch(s) finished" in resume_message(rec, T(), ["fit"], "prog")
    T.current_epoch = 0
    assert "the first epoch did not finish" in resume_message(rec, T(), ["fit"], "prog")


# -- 3. data fingerprint -------------------------------------------------------------------------
def test_a_resume_on_a_changed_data_value_is_refused_and_allowed_with_the_flag(run, capsys):
    before = _snapshot(run)
    _refused(capsys, FIT + ["--ckpt_path", "last", "--trainer.max_epochs", "2", "--data.init_args.n_train", "16"],
             "data: differs from the data the checkpoint", "data.init_args.n_train: 32 -> 16",
             "--allow-data-change")
    assert _snapshot(run) == before
    assert main(FIT + ["--ckpt_path", "last", "--trainer.max_epochs", "2", "--data.init_args.n_train", "16",
                       "--allow-data-change"]) == 0
    assert "training continues on changed data" in capsys.readouterr().err
    assert load_checkpoint(run / "run/checkpoints/last.ckpt")["global_step"] == 20


def test_a_data_file_replaced_between_run_and_resume_is_named(tmp_path, monkeypatch, capsys):
    d = tmp_path / "tf"
    cfg = _write_config(d, epochs=1)
    x = np.random.default_rng(0).uniform(-1, 1, size=(96, 64)).astype(np.float32)
    np.savez(d / "data.npz", x=x)
    text = cfg.read_text()
    cfg.write_text(text[:text.index("data:")] + "data:\n  class_path: lightning_pfd.data.TensorFileDataModule\n"
                   "  init_args: {path: data.npz, batch_size: 32}\n")
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(d)
    assert main(FIT) == 0
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["lightning_pfd_data"]["files"]["path"]["sha256"]
    x[0, 0] = 0.5  # one value
    np.savez(d / "data.npz", x=x)
    before = _snapshot(d)
    _refused(capsys, FIT + ["--ckpt_path", "last", "--trainer.max_epochs", "2"],
             "data.init_args.path (data.npz): the file's content changed")
    assert _snapshot(d) == before


def test_data_changes_lists_values_and_files():
    from lightning_pfd.data.base import data_changes

    a = {"class": "m.D", "values": {"n_train": 64, "path": "x.npz"},
         "files": {"path": {"path": "x.npz", "size": 10, "mtime_ns": 1, "sha256": "aa"}}}
    b = {"class": "m.D", "values": {"n_train": 128, "path": "x.npz"},
         "files": {"path": {"path": "x.npz", "size": 10, "mtime_ns": 2, "sha256": "aa"}}}
    assert data_changes(a, b) == ["data.n_train: 64 -> 128"]  # a touched file: same content
    b["files"]["path"]["sha256"] = "bb"
    assert any("content changed" in c for c in data_changes(a, b))
    big = {"path": {"path": "x.npz", "size": 10, "mtime_ns": 1, "sha256": None}}
    assert data_changes(dict(a, files=big), dict(a, files={"path": dict(big["path"], mtime_ns=5)})) != []
    assert data_changes({}, b) == []  # a checkpoint of an earlier release: nothing to compare


# -- 4. a max_steps stop inside an epoch resumes exactly -----------------------------------------
def test_a_max_steps_stop_inside_an_epoch_resumes_like_an_uninterrupted_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):
        _write_config(d, epochs=2)
    monkeypatch.chdir(whole)
    assert main(FIT) == 0
    monkeypatch.chdir(cut)
    assert main(FIT + ["--trainer.max_steps", "15"]) == 0  # stops after 5 of epoch 1's 10 steps
    assert "stopped inside epoch 1, after 5 of its steps" in capsys.readouterr().out
    assert load_checkpoint(cut / "run/checkpoints/last.ckpt")["global_step"] == 10  # the epoch end
    stopped = load_checkpoint(cut / "run/checkpoints/stopped/epoch=1-step=15.ckpt")  # the weights at the stop
    assert stopped["global_step"] == 15
    assert main(FIT + ["--ckpt_path", "last"]) == 0
    a, b = (load_checkpoint(d / "run/checkpoints/last.ckpt") for d in (whole, cut))
    assert a["global_step"] == b["global_step"] == 20
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    csv = "run/csv/version_0/metrics.csv"
    assert (whole / csv).read_bytes() == (cut / csv).read_bytes()


# -- 7. places the run cannot write ----------------------------------------------------------------
def test_a_path_component_too_long_is_refused_before_anything_is_written(run, capsys):
    before = _snapshot(run)
    _refused(capsys, FIT + ["--overwrite", "--trainer.default_root_dir", "run/" + "a" * 300],
             "trainer.default_root_dir", "longer than the file system allows")
    assert _snapshot(run) == before


def test_probe_names_a_read_only_place_and_an_unwritable_cache(tmp_path, monkeypatch):
    from lightning_pfd.cache import check_cache_writable
    from lightning_pfd.launch.run_safety import probe_output_places

    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    with pytest.raises(ConfigError, match=r"trainer\.callbacks\[X\]\.dirpath: .*ro is not writable"):
        probe_output_places(None, [("trainer.callbacks[X].dirpath", str(ro / "run" / "ckpt"), "last.ckpt")])
    assert not (ro / "run").exists()
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(ro / "cache"))
    with pytest.raises(ConfigError, match="LIGHTNING_PFD_CACHE: cannot be written"):
        check_cache_writable()


def _unshare_ok() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_ok(), reason="needs user + mount namespaces (unshare -rm)")
def test_a_read_only_run_directory_fails_with_one_message(one_epoch, tmp_path):
    """A real read-only file system (a read-only bind mount in a private mount namespace)."""
    d = tmp_path / "r"
    shutil.copytree(one_epoch, d)
    env = _env(tmp_path)
    before = _snapshot(d)
    cmd = (f"mount --bind -o ro {d} {d} && exec {sys.executable} -m lightning_pfd fit --config c.yaml "
           "--ckpt_path last --trainer.max_epochs 2")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], cwd=d, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "read-only file system" in r.stderr, r.stderr[-2000:]
    assert "trainer.default_root_dir" in r.stderr or "dirpath" in r.stderr
    assert _snapshot(d) == before


# -- 8. clear refusals, and an interrupted checkpoint write ---------------------------------------
def test_max_epochs_0_duplicate_keys_and_the_old_precond_option_are_refused(tmp_path, monkeypatch, capsys):
    d = tmp_path / "x"
    _write_config(d, epochs=1)
    monkeypatch.chdir(d)
    _refused(capsys, FIT + ["--trainer.max_epochs", "0"], "trainer.max_epochs", "trains nothing")
    (d / "dup.yaml").write_text("trainer:\n  max_epochs: 2\n  log_every_n_steps: 5\n  max_epochs: 3\n")
    _refused(capsys, FIT + ["--config", "dup.yaml"], "'max_epochs' is given twice", "lines 2 and 4", "dup.yaml")
    _refused(capsys, FIT + ["--model.init_args.precond", "edm"], "`precond` is now called `family`")
    assert sorted(p.name for p in d.iterdir()) == ["c.yaml", "dup.yaml"]


def test_an_interrupted_checkpoint_write_is_cleaned_at_the_next_start(run, capsys):
    tmp = run / "run/checkpoints/.last.ckpt.k2j4x_q1.tmp"
    tmp.write_bytes(b"PK\x03\x04 half a checkpoint")
    assert main(FIT + ["--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert not tmp.exists() and "removed 1 unfinished checkpoint write" in capsys.readouterr().out
