"""Issue 40 item 3: a full W&B disk is said at once, naming the directory; training continues,
the CSV log keeps every row, and the closing lines say that the W&B run is incomplete (not
"upload it with wandb sync")."""
from __future__ import annotations

import csv
import shutil
from collections import namedtuple

import pytest

from lightning_pfd.cli import main
from test_reliability import _write_config

Usage = namedtuple("Usage", "total used free")


def _tiny_wandb_run(tmp_path, monkeypatch) -> None:
    """A 3-epoch tiny config with an offline W&B logger in ``tmp_path`` (the working directory)."""
    _write_config(tmp_path, epochs=3, wandb=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_a_full_wandb_disk_is_said_at_once_and_the_csv_keeps_every_row(tmp_path, monkeypatch, capsys):
    import lightning_pfd.callbacks.wandb_setup as ws

    _tiny_wandb_run(tmp_path, monkeypatch)
    calls = {"n": 0}
    real = shutil.disk_usage

    def usage(path):  # the disk fills after the first few logging calls (epoch 0)
        calls["n"] += 1
        u = real(path)
        return Usage(u.total, u.used, 10 ** 12 if calls["n"] <= 2 else 2 ** 20)

    monkeypatch.setattr(ws.shutil, "disk_usage", usage)
    with pytest.warns(RuntimeWarning, match=r"W&B: the disk of .* is full .*the CSV log\) keep every row") as rec:
        assert main(["fit", "--config", "c.yaml"]) == 0
    assert sum("W&B: the disk of" in str(w.message) for w in rec) == 1  # once
    out = capsys.readouterr().out
    assert "W&B run INCOMPLETE from step" in out and "wandb sync" not in out
    with open(tmp_path / "run/csv/version_0/metrics.csv", newline="") as f:
        epochs = {int(float(r["epoch"])) for r in csv.DictReader(f) if r.get("train/loss_epoch")}
    assert epochs == {0, 1, 2}  # every epoch's row is in the CSV


def test_enough_free_space_says_nothing(tmp_path, monkeypatch):
    from lightning_pfd.callbacks.wandb_setup import AutoWandbLogger

    lg = AutoWandbLogger(save_dir=str(tmp_path), offline=True)
    assert lg.check_disk(0) and lg.disk_full is None


def test_a_wandb_run_folder_deleted_mid_run_is_said_and_not_offered_for_sync(tmp_path, monkeypatch, capsys):
    """Issue 40 item 11: the W&B run folder deleted during the run is said once; the closing
    lines say the W&B run is lost instead of suggesting `wandb sync` on a folder that is gone."""
    import lightning_pfd.callbacks.wandb_setup as ws

    _tiny_wandb_run(tmp_path, monkeypatch)
    calls = {"n": 0}
    real = shutil.disk_usage

    def usage(path):  # somebody removes the run folder after the first few logging calls
        calls["n"] += 1
        if calls["n"] == 2:
            shutil.rmtree(path)
        return real(path if calls["n"] != 2 else tmp_path)

    monkeypatch.setattr(ws.shutil, "disk_usage", usage)
    with pytest.warns(RuntimeWarning, match=r"W&B: the run directory .* was deleted during the run") as rec:
        assert main(["fit", "--config", "c.yaml"]) == 0
    assert sum("was deleted during the run" in str(w.message) for w in rec) == 1  # once
    out = capsys.readouterr().out
    assert "W&B run LOST: its directory" in out and "wandb sync" not in out
    with open(tmp_path / "run/csv/version_0/metrics.csv", newline="") as f:
        epochs = {int(float(r["epoch"])) for r in csv.DictReader(f) if r.get("train/loss_epoch")}
    assert epochs == {0, 1, 2}
