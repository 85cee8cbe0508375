"""Issue 30's sweep faults: ``--resume`` runs again a finished trial whose files were deleted; a
sweep folder copied elsewhere keeps its config fingerprints; ``--dry-run`` runs the pre-flight
of the real sweep (a trial ``fit`` refuses is refused); a base with a progress-bar callback (the
quickstart's ``PFDProgressBar``) passes the pre-flight."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from lightning_pfd.errors import ConfigError
from lightning_pfd.sweeps import runner
from lightning_pfd.sweeps.spec import expand_trials, load_sweep
from test_sweep import run_cli, write_sweep

pytest.importorskip("ray")


def _record(spec, trials) -> None:
    runner._write_record(spec, trials, spec.resources, None, False)


def test_a_copied_sweep_folder_keeps_its_fingerprints_and_an_edit_is_still_seen(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    path = write_sweep(a, {"data.init_args.n_train": [16, 24]})
    spec = load_sweep(path)
    _record(spec, expand_trials(spec))
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)  # the whole folder: sweep file, base config, runs/
    text = (b / "sw.yaml").read_text().replace(str(a), str(b))
    (b / "sw.yaml").write_text(text)
    moved = load_sweep(b / "sw.yaml")
    assert moved.sweep_dir != spec.sweep_dir
    assert runner._check_sweep_dir(moved, expand_trials(moved), resume=True) is not None  # accepted
    edited = yaml.safe_load(text)
    edited["shared"] = {"model.init_args.lr": 5.0e-4}
    (b / "sw.yaml").write_text(yaml.safe_dump(edited))
    changed = load_sweep(b / "sw.yaml")
    with pytest.raises(ConfigError, match="the configs of 2 trial"):
        runner._check_sweep_dir(changed, expand_trials(changed), resume=True)


def test_a_sweep_recorded_with_absolute_fingerprints_still_resumes_in_place(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, {"data.init_args.n_train": [16, 24]}))
    trials = expand_trials(spec)
    _record(spec, trials)
    rec = json.loads((spec.sweep_dir / "sweep.json").read_text())
    for t, entry in zip(trials, rec["trials"]):  # as an earlier release wrote them
        entry["config_sha256"] = t.legacy_config_sha
    (spec.sweep_dir / "sweep.json").write_text(json.dumps(rec))
    assert runner._check_sweep_dir(spec, trials, resume=True) is not None


def test_resume_runs_the_trials_without_a_result_on_disk(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, {"data.init_args.n_train": [16, 24, 32]}))
    trials = expand_trials(spec)
    for t, status in zip(trials, ["ok", "failed", None]):
        if status:
            (spec.sweep_dir / t.trial_id).mkdir(parents=True)
            (spec.sweep_dir / t.trial_id / "trial_result.json").write_text(json.dumps({"status": status}))
    assert [t.trial_id for t in runner.unfinished(spec, trials)] == ["n_train=32"]
    shutil.rmtree(spec.sweep_dir / "n_train=16")  # a finished trial's folder deleted: run it again
    assert [t.trial_id for t in runner.unfinished(spec, trials)] == ["n_train=16", "n_train=32"]


def test_dry_run_refuses_what_the_real_preflight_refuses_and_accepts_a_progress_bar(tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    path = write_sweep(tmp_path, {"data.init_args.n_train": [8, 16]}, icr=True)
    base = yaml.safe_load((tmp_path / "base.yaml").read_text())
    del base["trainer"]["enable_progress_bar"]  # as in the quickstart: its own progress bar
    base["trainer"]["callbacks"].append({"class_path": "lightning_pfd.callbacks.PFDProgressBar"})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    assert run_cli(["--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 trials fail the checks `fit` runs before training" in err
    assert "trial n_train=8: trainer.callbacks[ICRMonitor].num_images" in err and "n_train=16:" not in err
    assert "enable_progress_bar" not in err  # the progress bar of the base is not a failure
    assert not (tmp_path / "runs").exists() and not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
