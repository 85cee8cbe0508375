"""The last faults of issue 22: a finished run's logs are never appended to (``validate`` writes its
own logger version; resuming a finished run says so and writes nothing), a monitored-key typo in a
plain Lightning callback and ``WANDB_MODE=online`` without credentials are refused before anything
is written, a sweep trial whose files were deleted is "missing" (not "pending"), the hint of a
refused value names that value, and an appended checkpoint callback without ``dirpath`` writes into
the run's one checkpoint folder."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_pfd.cli import main
from lightning_pfd.errors import ConfigError
from test_reliability import _env, _snapshot, _write_config

REPO = Path(__file__).resolve().parents[1]

TYPO_CHECKPOINT = """    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: run/best, monitor: pfd/e_genn, mode: min}
"""
GENERALIZATION = """    - class_path: lightning_pfd.callbacks.GeneralizationMonitor
      init_args: {num_eval: 16, num_loss_samples: 32}
"""


def _fit(d: Path, env: dict, *args: str, command: str = "fit") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lightning_pfd", command, "--config", "c.yaml", *args],
                          cwd=d, env=env, capture_output=True, text=True, timeout=600)


def _rows(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _files(root: Path) -> dict:
    """Content hashes of the files under ``root``; W&B's ``latest-run`` / ``debug*.log`` links,
    which point at whichever W&B run started last, are left out."""
    return {k: v for k, v in _snapshot(root).items()
            if not any(p.is_symlink() for p in [root / k, *(root / k).parents])}


@pytest.fixture
def finished_run(tmp_path):
    """A finished 1-epoch run with a CSV and an (offline) W&B logger."""
    env, d = _env(tmp_path), tmp_path / "r"
    _write_config(d, epochs=1, wandb=True)
    r = _fit(d, env)
    assert r.returncode == 0, r.stderr[-2000:]
    return d, env


# -- a finished run's logs -----------------------------------------------------------------------
def test_validate_on_a_finished_run_writes_its_own_log_version(finished_run):
    d, env = finished_run
    before = _files(d)
    r = _fit(d, env, "--ckpt_path", "last", command="validate")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "validate logs to a new logger version" in r.stdout
    after = _files(d)
    changed = [k for k in before if after.get(k) != before[k]]
    assert changed == [], changed  # the training run's CSV, hparams, W&B run, checkpoint
    new = sorted(k for k in set(after) - set(before))
    assert "run/csv/version_1/metrics.csv" in new
    assert not any(k.startswith("run/csv/version_0/") for k in new)
    rows = _rows(d / "run/csv/version_1/metrics.csv")
    assert len(rows) == 1 and float(rows[0]["val/loss"]) > 0
    runs = {p.name for p in (d / "run/wandb").glob("offline-run-*")}
    assert len(runs) == 2  # its own W&B run, not the training run resumed


def test_resuming_a_finished_run_says_so_and_writes_nothing(finished_run):
    d, env = finished_run
    before = _snapshot(d)  # the W&B links too: no W&B run starts
    r = _fit(d, env, "--ckpt_path", "last")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "nothing to train" in r.stdout and "already finished" in r.stdout
    assert "trainer.max_epochs=1" in r.stdout and "raise --trainer.max_epochs" in r.stdout
    assert "report of this run is missing" not in r.stdout  # it was written after the last checkpoint
    assert _snapshot(d) == before
    # a SIGKILL during the end-of-run report: the report is missing, and the next fit says so
    (report,) = (d / "run").rglob("report/report.md")
    report.unlink()
    before = _snapshot(d)
    r = _fit(d, env, "--ckpt_path", "last")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "nothing to train" in r.stdout
    assert ("report: the end-of-run report of this run is missing (it stopped while writing it); build it "
            "from the logs with: python -m lightning_pfd report run") in r.stdout
    assert _snapshot(d) == before


def test_finished_run_reads_lightnings_stop_rule():
    from lightning_pfd.launch.run_checks import finished_run

    ckpt = {"global_step": 20, "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 2}}}}}
    assert finished_run(ckpt, 2, -1) is not None and finished_run(ckpt, 3, -1) is None
    assert finished_run(ckpt, 5, 20) is not None and finished_run(ckpt, 5, 21) is None
    assert finished_run(ckpt, -1, -1) is None and finished_run({}, 2, -1) is None


# -- a monitored-key typo ------------------------------------------------------------------------
def test_a_monitored_key_typo_fails_before_writing_and_keeps_the_earlier_run(tmp_path, monkeypatch):
    env, d = _env(tmp_path), tmp_path / "r"
    cfg = _write_config(d, epochs=1)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", env["LIGHTNING_PFD_CACHE"])
    monkeypatch.chdir(d)
    assert main(["fit", "--config", "c.yaml"]) == 0
    text = cfg.read_text().replace("  callbacks:\n", "  callbacks:\n" + GENERALIZATION + TYPO_CHECKPOINT, 1)
    cfg.write_text(text)
    before = _snapshot(d)
    r = _fit(d, env, "--ckpt_path", "last", "--trainer.max_epochs", "2")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "trainer.callbacks[ModelCheckpoint].monitor: no monitor of this run logs this key" in r.stderr
    assert "did you mean 'pfd/e_gen'?" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(d) == before and not (d / "run/best").exists()


def test_monitored_keys_are_checked_in_the_namespaces_of_the_monitors():
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from lightning_pfd.callbacks import ICRMonitor
    from lightning_pfd.launch.run_checks import check_monitored_keys

    icr = ICRMonitor(num_images=16, views_per_image=2, d_proj=4, image_shape=[1, 8, 8], level=1)

    class T:  # the trainer attribute the check reads
        def __init__(self, *cbs):
            self.callbacks = [icr, *cbs]

    with pytest.raises(ConfigError, match=r"EarlyStopping\].monitor.*did you mean 'icr/icr'"):
        check_monitored_keys(T(EarlyStopping(monitor="icr/icrr")))
    for ok in ("icr/icr", "val/loss", "my/own_metric", "loss"):  # logged, or not ours to know
        check_monitored_keys(T(EarlyStopping(monitor=ok), ModelCheckpoint(monitor=ok)))
    check_monitored_keys(T(ModelCheckpoint()))  # no monitor


# -- W&B online without credentials ---------------------------------------------------------------
def test_wandb_online_without_credentials_fails_before_writing(tmp_path):
    env, d = _env(tmp_path), tmp_path / "w"
    _write_config(d, epochs=1, wandb=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in env.items() if k not in ("WANDB_API_KEY", "NETRC")}
    env.update(WANDB_MODE="online", HOME=str(home))
    before = _snapshot(d)
    r = _fit(d, env)
    assert r.returncode == 2, (r.stdout[-1500:], r.stderr[-1500:])
    assert "WANDB_MODE: online logging asked for, but no W&B credentials" in r.stderr
    assert "wandb login" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(d) == before and not (d / "run").exists()


def test_wandb_online_check_accepts_credentials_and_offline_modes():
    from lightning_pfd.callbacks import AutoWandbLogger
    from lightning_pfd.launch.run_checks import check_wandb_online

    class T:
        loggers = [AutoWandbLogger(save_dir="unused", offline=True)]

    empty = {"HOME": "/nonexistent", "NETRC": "/nonexistent/netrc"}
    with pytest.raises(ConfigError, match="WANDB_MODE"):
        check_wandb_online(T(), dict(empty, WANDB_MODE="online"))
    check_wandb_online(T(), dict(empty, WANDB_MODE="online", WANDB_API_KEY="x" * 40))
    for mode in ("offline", "disabled", ""):
        check_wandb_online(T(), dict(empty, WANDB_MODE=mode))

    class NoWandb:
        loggers = []
    check_wandb_online(NoWandb(), dict(empty, WANDB_MODE="online"))


# -- sweeps: a trial whose files were deleted -----------------------------------------------------
def test_aggregate_only_reports_a_deleted_trial_as_missing(tmp_path):
    base = tmp_path / "base.yaml"
    _write_config(tmp_path / "b", epochs=1)
    base.write_text((tmp_path / "b" / "c.yaml").read_text())
    (tmp_path / "sw.yaml").write_text(yaml.safe_dump(
        {"name": "sw", "base": str(base), "root": str(tmp_path / "runs"),
         "grid": {"data.init_args.n_train": [16, 24, 32]}}))
    sweep = tmp_path / "runs" / "sw"
    ids = ["n_train=16", "n_train=24", "n_train=32"]
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"trials": [{"trial_id": t, "overrides": {}} for t in ids]}))
    for t in ids[:2]:  # two trials ran; the third never did
        (sweep / t).mkdir()
        (sweep / t / "trial_result.json").write_text(json.dumps({"status": "ok", "epochs": 1}))
    from lightning_pfd.sweeps.aggregate import aggregate_sweep

    assert [r["status"] for r in aggregate_sweep(sweep)] == ["ok", "ok", "pending"]
    for p in (sweep / ids[1]).iterdir():  # the files of a finished trial are deleted
        p.unlink()
    (sweep / ids[1]).rmdir()
    env = _env(tmp_path)
    r = subprocess.run([sys.executable, "-m", "lightning_pfd", "sweep", "--config", "sw.yaml",
                        "--aggregate-only"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "1 trial(s) missing" in r.stderr and ids[1] in r.stderr
    assert "1 trial(s) not run yet (pending)" in r.stderr and ids[2] in r.stderr
    rows = json.loads((sweep / "sweep_results.json").read_text())
    assert [r["status"] for r in rows] == ["ok", "missing", "pending"]
    assert "trial_result.json is gone" in rows[1]["error"]
    # a second aggregation keeps it missing (not pending)
    assert [r["status"] for r in aggregate_sweep(sweep)] == ["ok", "missing", "pending"]


# -- hints ---------------------------------------------------------------------------------------
def test_the_hint_names_the_refused_value_of_an_option_given_twice(tmp_path, monkeypatch, capsys):
    d = tmp_path / "h"
    _write_config(d, epochs=1)
    monkeypatch.chdir(d)
    with pytest.raises(SystemExit) as e:  # a parser error exits
        main(["fit", "--config", "c.yaml", "--trainer.max_epochs", "two", "--trainer.max_epochs", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "the value given for --trainer.max_epochs was 'two'" in err and "'3'" not in err
    assert main(["fit", "--config", "c.yaml", "--trainer.max_epochs", "3", "--trainer.max_epochs", "-2"]) == 2
    err = capsys.readouterr().err
    assert "You passed in -2" in err and "check --trainer.max_epochs -2 (given on the command line)" in err
    assert not (d / "run").exists()


# -- one checkpoint folder per run ---------------------------------------------------------------
def test_an_appended_checkpoint_without_dirpath_writes_into_the_runs_folder(tmp_path, monkeypatch):
    d = tmp_path / "k"
    _write_config(d, epochs=1)
    extra = ("    - class_path: lightning_pfd.callbacks.EpochCheckpoint\n"
             "      init_args: {monitor: val/loss, filename: best-val}\n")
    stack = d / "stack.yaml"
    stack.write_text(extra.replace("    - ", "- ", 1).replace("      init_args", "  init_args"))
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(d)
    assert main(["fit", "--config", "c.yaml", f"--trainer.callbacks+={stack}"]) == 0
    folders = sorted(str(p.relative_to(d)) for p in d.rglob("checkpoints") if p.is_dir())
    assert folders == ["run/checkpoints"]
    assert sorted(p.name for p in (d / "run/checkpoints").glob("*.ckpt")) == ["best-val.ckpt", "last.ckpt"]


def test_teacher_config_with_the_representation_stack_has_one_checkpoint_folder(tmp_path, monkeypatch):
    """The combination of issue 22 (teacher_edm_digits + configs/callbacks/representation.yaml), built
    (not trained): every checkpoint callback writes into runs/teacher_edm_digits/checkpoints."""
    from lightning_pfd.launch.cli import PFDLightningCLI
    from lightning_pfd.launch.run_checks import share_checkpoint_dir, writes_last

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = REPO / "lightning_pfd/configs/teacher_edm_digits.yaml"
    stack = REPO / "lightning_pfd/configs/callbacks/representation.yaml"
    monkeypatch.setattr(sys, "argv", ["x"])
    cli = PFDLightningCLI(args=["--config", str(cfg), f"--trainer.callbacks+={stack}",
                                "--trainer.accelerator", "cpu", "--trainer.devices", "1"], run=False)
    ckpts = cli.trainer.checkpoint_callbacks
    assert len(ckpts) == 2 and ckpts[1].dirpath is None  # as configured: Lightning would pick a logger dir
    lines = share_checkpoint_dir(cli.trainer)
    want = str((tmp_path / "runs/teacher_edm_digits/checkpoints").resolve())
    assert [c.dirpath for c in ckpts] == [want, want] and len(lines) == 1 and "icr/icr" in lines[0]
    assert [writes_last(c) for c in ckpts] == [True, False]  # one last.ckpt per run
