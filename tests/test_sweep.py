"""Sweeps on Ray Tune (``python -m lightning_pfd sweep``): spec expansion and validation, a 2×2
sweep whose rows equal the trials' own histories, failures, interrupt + resume, trial resume."""
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from lightning_pfd.errors import ConfigError
from lightning_pfd.sweeps.spec import apply_override, expand_trials, load_sweep, split_key

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]


def tiny_base(root: Path, icr: bool = False) -> dict:
    """A distillation run of a few seconds: GMM-digits teacher, 2-layer MLP student, 2 epochs
    of 4 steps, E_gen/E_mem on 16 seeds."""
    callbacks = [
        {"class_path": "lightning_pfd.callbacks.GeneralizationMonitor",
         "init_args": {"num_eval": 16, "num_loss_samples": 16, "batch_size": 16}},
        {"class_path": "lightning_pfd.callbacks.MemorizationMonitor",
         "init_args": {"num_samples": 16, "criterion": "nn_ratio"}},
        {"class_path": "lightning_pfd.callbacks.RegimeMonitor",
         "init_args": {"window": 3, "confirm": 2, "write_report": False}},
        {"class_path": "lightning_pfd.callbacks.EpochCheckpoint",
         "init_args": {"dirpath": f"{root}/checkpoints", "monitor": "pfd/e_gen", "mode": "min",
                       "filename": "egen-min-{epoch:03d}", "auto_insert_metric_name": False}},
    ]
    if icr:
        callbacks.insert(1, {"class_path": "lightning_pfd.callbacks.ICRMonitor",
                             "init_args": {"num_images": 16, "views_per_image": 2, "d_proj": 4,
                                           "image_shape": [1, 8, 8], "level": 1}})
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": 2, "default_root_dir": str(root),
                    "num_sanity_val_steps": 0, "enable_model_summary": False,
                    "enable_progress_bar": False, "log_every_n_steps": 1,
                    "logger": [{"class_path": "lightning_pfd.callbacks.AutoWandbLogger",
                                "init_args": {"project": "lightning_pfd", "name": "tiny", "save_dir": str(root)}},
                               {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                "init_args": {"save_dir": str(root), "name": "csv"}}],
                    "callbacks": callbacks},
        "model": {"class_path": "lightning_pfd.modules.DiffusionModule",
                  "init_args": {"net": {"class_path": "lightning_pfd.nets.MLPNet",
                                        "init_args": {"dim": 64, "hidden": 32, "depth": 2}},
                                "family": "edm", "lr": 1.0e-3, "num_steps": 6}},
        "data": {"class_path": "lightning_pfd.data.TeacherDistillationDataModule",
                 "init_args": {"teacher": "gmm_digits", "n_components": 4, "n_train": 16, "n_test": 32,
                               "n_gen": 64, "batch_size": 16, "samples_per_epoch": 64, "num_steps": 6}},
    }


def write_sweep(tmp_path: Path, grid: dict, name: str = "sw", icr: bool = False, **extra) -> Path:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_base(tmp_path / "base_run", icr=icr)))
    spec = {"name": name, "base": str(base), "root": str(tmp_path / "runs"), "grid": grid, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module's in-process sweeps (run_sweep joins it, never stops it)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    yield
    ray.shutdown()


def run_cli(argv):
    from lightning_pfd.cli import main

    return main(["sweep", *argv])


def results(sweep_dir: Path) -> list:
    return json.loads((sweep_dir / "sweep_results.json").read_text())


def starts(trial_dir: Path) -> int:
    lines = (trial_dir / "attempts.jsonl").read_text().splitlines()
    return sum(json.loads(ln)["event"] == "start" for ln in lines)


# ----------------------------------------------------------------------------- spec (no Ray)
def test_trials_are_the_grid_product_with_seeds_and_own_output_dirs(tmp_path):
    grid = {"data.init_args.n_train": [16, 32], "model.init_args.net.init_args.hidden": [16, 32, 48]}
    spec = load_sweep(write_sweep(tmp_path, grid, repeats=2))
    trials = expand_trials(spec, seed_keys=["seed_everything", "data.init_args.seed"])
    expected = [(n, h, s) for n, h in itertools.product([16, 32], [16, 32, 48]) for s in (0, 1)]
    assert [(t.overrides["data.init_args.n_train"], t.overrides["model.init_args.net.init_args.hidden"],
             t.seed) for t in trials] == expected
    assert trials[0].trial_id == "n_train=16-hidden=16-seed=0"
    assert len({t.trial_id for t in trials}) == 12
    assert [t.trial_id for t in expand_trials(spec)] == [t.trial_id for t in trials]  # deterministic
    t = trials[5]  # n_train=16, hidden=48, seed=1
    cfg, tdir = t.config, spec.sweep_dir / t.trial_id
    assert cfg["data"]["init_args"]["n_train"] == 16 and cfg["model"]["init_args"]["net"]["init_args"]["hidden"] == 48
    assert cfg["seed_everything"] == 1 and cfg["data"]["init_args"]["seed"] == 1
    assert cfg["trainer"]["default_root_dir"] == str(tdir)
    wandb_args, csv_args = (lg["init_args"] for lg in cfg["trainer"]["logger"])
    assert (wandb_args["name"], wandb_args["group"], wandb_args["save_dir"]) == (t.trial_id, "sw", str(tdir))
    assert csv_args["save_dir"] == str(tdir)
    ckpt = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("EpochCheckpoint")][0]
    assert ckpt["init_args"]["dirpath"] == str(tdir / "checkpoints")
    assert t.model_label == "hidden=48"


def test_dotted_overrides_select_list_entries_by_class_or_position():
    cfg = {"trainer": {"callbacks": [{"class_path": "a.GeneralizationMonitor", "init_args": {"num_eval": 8}},
                                     {"class_path": "a.ICRMonitor", "init_args": {}}],
                       "logger": {"class_path": "x.CSVLogger", "init_args": {"save_dir": "r"}}}}
    apply_override(cfg, "trainer.callbacks[GeneralizationMonitor].init_args.num_eval", 32)
    apply_override(cfg, "trainer.callbacks[1].init_args.level", 2)
    apply_override(cfg, "trainer.logger[CSVLogger].init_args.name", "csv")
    apply_override(cfg, "model.init_args.lr", 0.5)  # missing mappings are created
    assert cfg["trainer"]["callbacks"][0]["init_args"]["num_eval"] == 32
    assert cfg["trainer"]["callbacks"][1]["init_args"]["level"] == 2
    assert cfg["trainer"]["logger"] == [{"class_path": "x.CSVLogger", "init_args": {"save_dir": "r", "name": "csv"}}]
    assert cfg["model"] == {"init_args": {"lr": 0.5}}
    apply_override(cfg, "trainer.callbacks[ICRMonitor]", None)  # null removes the entry
    assert [c["class_path"] for c in cfg["trainer"]["callbacks"]] == ["a.GeneralizationMonitor"]
    with pytest.raises(ConfigError, match="no entry of class 'Memo'"):
        apply_override(cfg, "trainer.callbacks[Memo].init_args.x", 1)
    with pytest.raises(ConfigError, match="not a dotted config key"):
        split_key("trainer..max_epochs")


def test_bad_grid_key_or_value_fails_before_anything_starts(tmp_path, monkeypatch, capsys):
    import lightning_pfd.sweeps.runner as runner

    monkeypatch.setattr(runner, "_start_ray", lambda *a: pytest.fail("Ray must not start"))
    path = write_sweep(tmp_path, {"data.init_args.n_train": [16, 32],
                                  "model.init_args.net.init_args.hiden": [16]})
    assert run_cli(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "model.init_args.net.init_args.hiden" in err and "trial n_train=16-hiden=16" in err
    assert "did you mean model.init_args.net.init_args.hidden" in err
    assert not (tmp_path / "runs").exists()  # nothing written
    path = write_sweep(tmp_path, {"model.init_args.net.init_args.hidden": [16, "wide"]})
    assert run_cli(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "model.init_args.net.init_args.hidden (trial hidden=wide)" in err and "int" in err
    path = write_sweep(tmp_path, {"data.init_args.n_train": [16, -4]})  # refused by the datamodule
    assert run_cli(["--config", str(path)]) == 2
    assert "data.init_args.n_train (trial n_train=-4)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_shipped_cifar_sweep_parses_and_its_dry_run_refuses_the_missing_teacher(tmp_path, monkeypatch, capsys):
    from lightning_pfd.nets import UNET_PRESET_PARAMS
    from lightning_pfd.sweeps.runner import format_plan, plan

    monkeypatch.chdir(tmp_path)
    assert run_cli(["--config", "mtog_cifar10", "--dry-run"]) == 2  # the real pre-flight: no teacher here
    assert "data cannot be built: teacher_ckpt" in capsys.readouterr().err  # the teacher is not here
    spec = load_sweep("mtog_cifar10")
    out = format_plan(spec, plan(spec, construct=False), spec.resources)  # parsed, |theta| counted
    rows = [ln.split() for ln in out.splitlines() if ln.split()[1:2] and ln.split()[1].startswith("n_train=")]
    assert len(rows) == 10 * 11  # U-Net-1..10 x N = 2^6..2^16
    assert [r[0] for r in rows] == [f"t{i:03d}" for i in range(1, 111)]  # the short names, in order
    rows = [r[1:] for r in rows]
    for trial_id, n, params, label in rows:
        assert trial_id.startswith(f"n_train={n}-preset={label}")
        counted = int(params.replace(",", ""))  # |theta| of the preset, counted on the meta device
        assert abs(counted - UNET_PRESET_PARAMS[label]) / UNET_PRESET_PARAMS[label] < 0.02
    assert sorted({int(r[1]) for r in rows}) == [2 ** k for k in range(6, 17)]
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- trial resume (no Ray)
def test_a_trial_resumes_from_its_checkpoint(tmp_path):
    from lightning_pfd.analysis.history import load_history
    from lightning_pfd.sweeps.trial import execute_trial

    spec = load_sweep(write_sweep(tmp_path, {"data.init_args.n_train": [16]}))
    (t,) = expand_trials(spec)
    payload = {"trial_id": t.trial_id, "sweep_dir": str(spec.sweep_dir), "cwd": str(tmp_path),
               "config": dict(t.config, trainer=dict(t.config["trainer"], max_epochs=1)), "cpus": 1,
               "env": {}, "endpoints": {"enabled": False}}
    first = execute_trial(payload)
    assert first["status"] == "ok" and first["epochs"] == 1 and first["resumed_from"] is None
    tdir = spec.sweep_dir / t.trial_id
    (tdir / "trial_result.json").unlink()  # as if the trial had been killed after its first epoch
    payload["config"] = t.config  # max_epochs 2
    second = execute_trial(payload)
    assert second["resumed_from"] is not None and second["epochs"] == 2 and starts(tdir) == 2
    epochs, _ = load_history(tdir, source="csv").series("pfd/e_gen")
    assert list(epochs) == [0.0, 1.0]  # epoch 0 from the first segment, epoch 1 from the resumed one
    assert execute_trial(payload) == second  # finished: never trained again
    assert starts(tdir) == 2


# ----------------------------------------------------------------------------- Ray sweeps
def test_2x2_sweep_rows_equal_the_trials_histories(tmp_path, ray_local):
    from lightning_pfd.analysis.history import load_history
    from lightning_pfd.nets import MLPNet, count_parameters
    from lightning_pfd.sweeps import run_sweep
    from lightning_pfd.sweeps.spec import Resources

    grid = {"data.init_args.n_train": [16, 32], "model.init_args.net.init_args.hidden": [16, 32]}
    spec = load_sweep(write_sweep(tmp_path, grid, icr=True))
    assert run_sweep(spec, Resources(cpus_per_trial=1, max_concurrent=2)) == 0
    rows = results(spec.sweep_dir)
    assert [r["trial_id"] for r in rows] == ["n_train=16-hidden=16", "n_train=16-hidden=32",
                                             "n_train=32-hidden=16", "n_train=32-hidden=32"]
    import csv
    with open(spec.sweep_dir / "sweep_results.csv") as f:
        assert [r["trial_id"] for r in csv.DictReader(f)] == [r["trial_id"] for r in rows]
    for r in rows:
        tdir = spec.sweep_dir / r["run_dir"]
        hist = load_history(tdir, source="csv")
        ep, e_gen = hist.series("pfd/e_gen")
        _, e_mem = hist.series("pfd/e_mem")
        assert r["status"] == "ok" and r["error"] is None and r["epochs"] == 2 and list(ep) == [0.0, 1.0]
        assert r["e_gen_final"] == e_gen[-1] and r["e_mem_final"] == e_mem[-1]
        assert r["e_gen_best"] == e_gen.min() and r["e_gen_best_epoch"] == int(ep[e_gen.argmin()])
        assert r["e_mem_best"] == e_mem.min() and r["e_mem_best_epoch"] == int(ep[e_mem.argmin()])
        assert r["loss_train"] == hist.series("loss/train_fixed")[1][-1]
        assert r["loss_test"] == hist.series("loss/test_fixed")[1][-1]
        assert r["gap"] == pytest.approx(r["loss_test"] - r["loss_train"], rel=1e-9)
        assert r["memorization_ratio"] == hist.series("mem/ratio")[1][-1]
        assert r["icr_min"] == hist.series("icr/icr")[1].min()
        n, h = r["overrides"]["data.init_args.n_train"], r["overrides"]["model.init_args.net.init_args.hidden"]
        assert r["n_train"] == n and r["seed"] == 0 and r["model_label"] == f"hidden={h}"
        assert r["n_params"] == count_parameters(MLPNet(dim=64, hidden=h, depth=2), trainable_only=True)
        # endpoints on the monitor's seeds: their PFD (eq. 4) is the logged final E_gen / E_mem
        ends = torch.load(spec.sweep_dir / r["endpoints"])
        assert ends["seeds"].tolist() == list(range(2_000_000, 2_000_016))
        pfd = lambda a, b: float((a - b).square().sum(1).mean().sqrt())  # noqa: E731
        assert pfd(ends["student"], ends["teacher"]) == pytest.approx(r["e_gen_final"], rel=1e-9)
        assert pfd(ends["student"], ends["empirical"]) == pytest.approx(r["e_mem_final"], rel=1e-9)
        # its own W&B run in the sweep's group
        wb = yaml.safe_load((tdir / "trial_config.yaml").read_text())["trainer"]["logger"][0]["init_args"]
        assert (wb["name"], wb["group"]) == (r["trial_id"], "sw")
        assert len(list((tdir / "wandb").glob("offline-run-*"))) == 1
    meta = json.loads((spec.sweep_dir / "sweep.json").read_text())
    assert meta["grid"] == grid and meta["versions"]["ray"] == ray.__version__


def test_a_failing_trial_is_recorded_and_the_others_complete(tmp_path, ray_local, monkeypatch):
    from lightning_pfd.sweeps import run_sweep, validate
    from lightning_pfd.sweeps.spec import Resources

    # n_gen = 8 < num_eval = 16: valid alone, refused when the monitor meets the data (check_setup).
    # The sweep's pre-flight refuses it before Ray starts (test_sweep_preflight.py); switched off
    # here, it stands for a failure no check can see (out of memory, a node lost)
    monkeypatch.setattr(validate, "preflight", lambda *args, **kwargs: None)
    spec = load_sweep(write_sweep(tmp_path, {"data.init_args.n_gen": [64, 8]}))
    assert run_sweep(spec, Resources(cpus_per_trial=1, max_concurrent=2)) == 1
    ok, bad = results(spec.sweep_dir)
    assert (ok["trial_id"], ok["status"], ok["error"]) == ("n_gen=64", "ok", None)
    assert ok["e_gen_final"] is not None
    assert bad["trial_id"] == "n_gen=8" and bad["status"] == "failed"
    assert "ConfigError" in bad["error"] and "n_gen" in bad["error"] and bad["e_gen_final"] is None
    # --resume runs neither again (finished / failed); --retry-failed runs the failed one again
    assert run_sweep(spec, Resources(cpus_per_trial=1), resume=True) == 1
    assert starts(spec.sweep_dir / "n_gen=64") == 1 and starts(spec.sweep_dir / "n_gen=8") == 1
    assert run_sweep(spec, Resources(cpus_per_trial=1), resume=True, retry_failed=True) == 1
    assert starts(spec.sweep_dir / "n_gen=64") == 1 and starts(spec.sweep_dir / "n_gen=8") == 2
    assert results(spec.sweep_dir)[1]["status"] == "failed"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_a_sigkilled_driver_leaves_no_ray_process_and_resume_runs_only_the_rest(tmp_path, ray_local):
    """The driver starts its own Ray; SIGKILL the driver alone after its first trial finished,
    while the next one trains: within a bounded time no process it started (gcs_server, raylet,
    agents, workers, the watchdog) is left; ``--resume`` then runs only the unfinished trials."""
    path = write_sweep(tmp_path, {"data.init_args.n_train": [16, 24, 32]}, name="intr")
    sweep_dir = tmp_path / "runs" / "intr"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "driver.out"
    with out.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "lightning_pfd", "sweep", "--config", str(path),
                                 "--max-concurrent", "1"], cwd=tmp_path, env=env, start_new_session=True,
                                stdout=fh, stderr=subprocess.STDOUT)
    first = sweep_dir / "n_train=16" / "trial_result.json"
    recorded = {}
    try:
        deadline = time.time() + 240
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            recorded.update(_proc_tree(proc.pid))
            time.sleep(0.2)
        assert first.exists(), out.read_text()[-3000:]
        recorded.update(_proc_tree(proc.pid))
        names = " ".join(cmd for _, cmd in recorded.values())
        assert "raylet" in names and "gcs_server" in names and "ray::" in names, names
        assert "ray_watchdog.py" in names
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its watchdog must stop the rest
        proc.wait(timeout=10)
        deadline = time.time() + 20
        while _still_alive(recorded) and time.time() < deadline:
            time.sleep(0.2)
        assert _still_alive(recorded) == {}
    finally:
        for pid in _still_alive(recorded):  # only what this test's driver started
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    # the plan names each trial with its short name, as Tune's table shows it
    text = out.read_text()
    assert re.search(r"^\s+t01\s+n_train=16\s", text, re.M) and re.search(r"^\s+t02\s+n_train=24\s", text, re.M)
    assert text.count("sweep intr: 3 trials") == 1  # printed once (flushed before Ray forks)
    done = {d.name: (d / "trial_result.json").stat().st_mtime_ns
            for d in sweep_dir.iterdir() if (d / "trial_result.json").exists()}
    assert "n_train=16" in done and len(done) < 3
    assert run_cli(["--config", str(path), "--resume"]) == 0
    rows = results(sweep_dir)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    for tid, mtime in done.items():  # finished before the interruption: not run again
        assert (sweep_dir / tid / "trial_result.json").stat().st_mtime_ns == mtime
        assert starts(sweep_dir / tid) == 1
    assert all(r["e_gen_final"] is not None for r in rows)


@pytest.mark.parametrize("user_value", [None, "10"])
def test_local_ray_starts_trial_workers_at_normal_priority(monkeypatch, user_value):
    """Ray's raylet starts workers at niceness 15 unless RAY_worker_niceness says otherwise: a
    local sweep sets 0 (the trials are the sweep's work), a user's own value is kept."""
    from lightning_pfd.sweeps import runner

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(env=os.environ.get(runner.WORKER_NICENESS_ENV)))
    monkeypatch.delenv(runner.WORKER_NICENESS_ENV, raising=False)
    if user_value is not None:
        monkeypatch.setenv(runner.WORKER_NICENESS_ENV, user_value)
    assert runner._start_ray(None) is True
    assert seen["env"] == (user_value or "0")


# ----------------------------------------------------------------------------- a killed driver
def _proc_tree(root: int) -> dict:
    """pid -> (start time, command line) of ``root``'s descendants (read from /proc)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(entry.name)] = (int(fields[1]), int(fields[19]), cmd)
    out, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, cmd) in stats.items():
            if ppid == parent and pid not in out:
                out[pid] = (start, cmd)
                todo.append(pid)
    return out


def _still_alive(recorded: dict) -> dict:
    alive = {}
    for pid, (start, cmd) in recorded.items():
        try:
            text = (Path("/proc") / str(pid) / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[19]) == start:
            alive[pid] = cmd
    return alive


def test_trials_get_short_distinct_names_in_tunes_table():
    from lightning_pfd.sweeps.runner import _trial_name, short_names

    ids = [f"data_n_train={n}-model_hidden=16-seed={s}" for n in (16, 32) for s in range(6)]
    names = short_names(ids)
    assert list(names.values()) == [f"t{i:02d}" for i in range(1, 13)]
    assert len(set(short_names([f"x={i}" for i in range(120)]).values())) == 120
    assert short_names([f"x={i}" for i in range(120)])["x=119"] == "t120"
    # Tune cuts its table cells to 20 characters from the end: the ids collide, the names do not
    assert len({i[-17:] for i in ids}) < len(ids)

    class FakeTrial:  # what Tune passes to trial_name_creator: an object with the trial's config
        def __init__(self, config):
            self.config = config

    assert _trial_name(FakeTrial({"trial": "t03"})) == "t03"
    assert _trial_name(FakeTrial({"trial_id": ids[0]})) == ids[0]  # a sweep started before names
