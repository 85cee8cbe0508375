"""Faults: SIGKILL + resume exactness, damaged checkpoints, explicit overrides, failed runs that
leave earlier files intact, divergence, world-size invariant validation loss, readable errors."""
from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_pfd.checkpoint import (CHECKSUM_KEY, CheckpointError, content_digest, load_checkpoint,
                                      save_checkpoint)
from lightning_pfd.cli import main
from lightning_pfd.launch.cli import join_negative_values
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.modules.base import compare_hparams, step_seed

REPO = Path(__file__).resolve().parents[1]

TINY = """
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: {epochs}
  log_every_n_steps: 5
  default_root_dir: run
  num_sanity_val_steps: 0
  enable_model_summary: false
  enable_progress_bar: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: run, name: csv}}
  callbacks:
{extra_callbacks}    - class_path: lightning_pfd.callbacks.RegimeMonitor
      init_args: {{window: 3, confirm: 2, write_report: true}}
    - class_path: lightning_pfd.callbacks.EpochCheckpoint
      init_args: {{dirpath: run/checkpoints}}
model:
  class_path: lightning_pfd.modules.DiffusionModule
  init_args:
    net:
      class_path: lightning_pfd.nets.MLPNet
      init_args: {{dim: 64, hidden: 32, depth: 2, dropout: 0.1}}
    lr: 1.0e-3
    ema_decay: 0.99
data:
  class_path: lightning_pfd.data.TeacherDistillationDataModule
  init_args:
    teacher: gmm_digits
    n_components: 4
    n_train: 32
    n_test: 64
    batch_size: 32
    samples_per_epoch: 320
"""

MONITORS = """    - class_path: lightning_pfd.callbacks.GeneralizationMonitor
      init_args: {num_eval: 16, num_loss_samples: 32}
    - class_path: lightning_pfd.callbacks.ICRMonitor
      init_args: {num_images: 32, views_per_image: 4, d_proj: 8, image_shape: [1, 8, 8], level: 1}
    - class_path: lightning_pfd.callbacks.MemorizationMonitor
      init_args: {num_samples: 16, every_n_epochs: 1}
"""


WANDB = """    - class_path: lightning_pfd.callbacks.AutoWandbLogger
      init_args: {project: tests, name: tiny, save_dir: run}
"""


def _write_config(d: Path, epochs: int = 4, monitors: bool = False, wandb: bool = False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "c.yaml"
    text = TINY.format(epochs=epochs, extra_callbacks=MONITORS if monitors else "")
    if wandb:
        text = text.replace("  logger:\n", "  logger:\n" + WANDB, 1)
    cfg.write_text(text)
    return cfg


def _env(tmp_path: Path) -> dict:
    # WANDB_SERVICE (set by an in-process W&B run of another test) would make every subprocess
    # share that service, where a SIGKILLed process's run id stays "in use": drop it, as in a shell
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]),
               WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path / "wandb"),
               LIGHTNING_PFD_CACHE=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    return env


def _cli(d: Path, env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lightning_pfd", "fit", "--config", "c.yaml", *args],
                          cwd=d, env=env, capture_output=True, text=True, timeout=timeout)


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# -- SIGKILL + resume ----------------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path):
    """A real subprocess SIGKILLed mid-epoch 2, resumed with --ckpt_path last, writes the same
    metrics.csv (every metric, every epoch once, byte-identical) and the same final weights as an
    uninterrupted run; the resumed history continues in the same CSV version directory and the
    same (offline) W&B run, whose merged history has every epoch."""
    from lightning_pfd.analysis.history import load_history

    env = _env(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    _write_config(a, monitors=True, wandb=True), _write_config(b, monitors=True, wandb=True)
    ra = _cli(a, env)
    assert ra.returncode == 0, ra.stderr[-3000:]
    kill = ["--trainer.callbacks+=helpers.faults.KillAtStep", "--trainer.callbacks.step", "25"]
    rk = _cli(b, env, *kill)
    assert rk.returncode == -9, (rk.returncode, rk.stderr[-2000:])
    assert not (b / "run/checkpoints/last.ckpt.tmp").exists()
    assert load_checkpoint(b / "run/checkpoints/last.ckpt")["global_step"] == 20  # end of epoch 1
    rb = _cli(b, env, "--ckpt_path", "last")
    assert rb.returncode == 0, rb.stderr[-600:]
    assert "resuming from" in rb.stdout and "CSV log continues" in rb.stdout

    assert sorted(p.name for p in (b / "run/csv").iterdir()) == ["version_0"]
    csv_a = (a / "run/csv/version_0/metrics.csv").read_bytes()
    csv_b = (b / "run/csv/version_0/metrics.csv").read_bytes()
    assert csv_a == csv_b
    rows = _rows(a / "run/csv/version_0/metrics.csv")
    for key in ("pfd/e_gen", "pfd/e_mem", "icr/icr", "mem/ratio", "val/loss", "train/loss_epoch"):
        epochs = [r["epoch"] for r in rows if r.get(key)]
        assert epochs == ["0", "1", "2", "3"], (key, epochs)
    sa = load_checkpoint(a / "run/checkpoints/last.ckpt")["state_dict"]
    sb = load_checkpoint(b / "run/checkpoints/last.ckpt")["state_dict"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    runs = sorted((b / "run/wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({p.name.rsplit("-", 1)[-1] for p in runs}) == 1  # one run id
    merged = load_history(b / "run/wandb")
    epochs, e_gen = merged.series("pfd/e_gen")
    assert epochs.tolist() == [0, 1, 2, 3]
    expected = [float(r["pfd/e_gen"]) for r in rows if r.get("pfd/e_gen")]
    assert e_gen.tolist() == pytest.approx(expected, rel=1e-6)
    import json

    ev_a = max((a / "run").rglob("report/events.json"), key=lambda p: p.stat().st_mtime)
    ev_b = max((b / "run").rglob("report/events.json"), key=lambda p: p.stat().st_mtime)
    ja, jb = json.loads(ev_a.read_text()), json.loads(ev_b.read_text())
    assert ja["events"] == jb["events"] and ja.get("regime") == jb.get("regime")


def test_step_seed_is_a_pure_function_and_separates_batches_and_ranks():
    assert step_seed(0, 5, 0) == step_seed(0, 5, 0)
    seeds = {step_seed(s, k, r) for s in range(3) for k in range(50) for r in range(4)}
    assert len(seeds) == 3 * 50 * 4
    assert all(0 <= x < 2**63 for x in seeds)


# -- verified checkpoints --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ckpt")
    env = _env(d)
    _write_config(d, epochs=1)
    r = _cli(d, env)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "run/checkpoints/last.ckpt"


def _largest_tensor_offset(data: bytes, ckpt: dict) -> int:
    t = max(ckpt["state_dict"].values(), key=lambda v: v.numel())
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    off = data.find(raw[:64])
    assert off > 0
    return off


def test_flipped_bytes_inside_a_tensor_are_detected(good_ckpt, tmp_path):
    data = good_ckpt.read_bytes()
    off = _largest_tensor_offset(data, load_checkpoint(good_ckpt))
    bad = bytearray(data)
    for i in range(off + 16, off + 16 + 256):
        bad[i] ^= 0xFF
    p = tmp_path / "flipped.ckpt"
    p.write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match="does not match its sha256 digest"):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match="flipped.ckpt"):
        DiffusionModule.load_from_checkpoint(str(p))


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[: len(b) // 2], "cannot be read"),
    (lambda b: b"", "empty"),
    (lambda b: b"epoch: 3\nthis is not a checkpoint\n", "a text file"),
    (lambda b: b"\x00\x01garbage" * 10, "not a PyTorch checkpoint"),
])
def test_truncated_empty_and_foreign_files_give_one_clear_error(good_ckpt, tmp_path, damage, message):
    p = tmp_path / "damaged.ckpt"
    p.write_bytes(damage(good_ckpt.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as e:
        load_checkpoint(p)
    assert "damaged.ckpt" in str(e.value)


def test_a_torch_file_that_is_not_a_lightning_checkpoint_is_refused(tmp_path):
    p = tmp_path / "tensor.ckpt"
    torch.save(torch.zeros(3), p)
    with pytest.raises(CheckpointError, match="not a checkpoint dictionary"):
        load_checkpoint(p)
    q = tmp_path / "dict.ckpt"
    save_checkpoint({"weights": torch.zeros(3)}, q)
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        load_checkpoint(q)


def test_digest_covers_tensors_keys_and_scalars():
    base = {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "hp": {"lr": 1e-3}}
    d0 = content_digest(base)
    variants = [
        {"state_dict": {"w": torch.arange(6.0).reshape(3, 2)}, "epoch": 3, "hp": {"lr": 1e-3}},
        {"state_dict": {"w": torch.arange(6.0).reshape(2, 3).double()}, "epoch": 3, "hp": {"lr": 1e-3}},
        {"state_dict": {"v": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "hp": {"lr": 1e-3}},
        {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 4, "hp": {"lr": 1e-3}},
        {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "hp": {"lr": 2e-3}},
    ]
    assert all(content_digest(v) != d0 for v in variants)
    assert content_digest(dict(base, **{CHECKSUM_KEY: {"sha256": "x"}})) == d0


def test_cli_refuses_a_damaged_checkpoint_before_writing_anything(good_ckpt, tmp_path):
    data = good_ckpt.read_bytes()
    off = _largest_tensor_offset(data, load_checkpoint(good_ckpt))
    bad = bytearray(data)
    bad[off + 100] ^= 0x01
    d = tmp_path / "fresh"
    _write_config(d, epochs=2)
    (d / "bad.ckpt").write_bytes(bytes(bad))
    r = _cli(d, _env(tmp_path), "--ckpt_path", "bad.ckpt")
    assert r.returncode == 2
    assert "digest" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["bad.ckpt", "c.yaml"]


# -- overrides with a checkpoint ---------------------------------------------------------------------
def test_compare_hparams_splits_architecture_from_applied_changes():
    saved = {"net": {"class_path": "M", "init_args": {"hidden": 64}}, "lr": 1e-3, "family": "edm"}
    now = {"net": {"class_path": "M", "init_args": {"hidden": 128}}, "lr": 5e-2, "family": "edm"}
    refused, applied = compare_hparams(saved, now, {"net", "family"})
    assert refused == [("net.init_args.hidden", 64, 128)]
    assert applied == [("lr", 1e-3, 5e-2)]


@pytest.mark.slow
def test_resume_applies_a_new_lr_and_refuses_a_new_architecture(tmp_path):
    d = tmp_path / "run1"
    env = _env(tmp_path)
    _write_config(d, epochs=1)
    assert _cli(d, env).returncode == 0
    before = _snapshot(d)
    r = _cli(d, env, "--ckpt_path", "last", "--model.init_args.net.init_args.hidden", "128")
    assert r.returncode == 2
    assert "model.init_args.net.init_args.hidden: checkpoint 32, now 128" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(d) == before
    r = _cli(d, env, "--ckpt_path", "last", "--trainer.max_epochs", "2", "--model.init_args.lr", "0.05")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming with model.lr = 0.05 (the checkpoint was trained with 0.001)" in \
        r.stdout + r.stderr
    ck = load_checkpoint(d / "run/checkpoints/last.ckpt")
    assert ck["epoch"] == 1
    assert ck["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.05)
    assert ck["hyper_parameters"]["lr"] == pytest.approx(0.05)


# -- failed runs never touch an earlier run ------------------------------------------------------------
@pytest.mark.slow
def _cli_in_process(d: Path, env: dict, args: list, monkeypatch, capfd) -> tuple:
    """``fit --config c.yaml ARGS`` in this process (cwd ``d``, the environment ``env``): the
    exit status and stderr. The same ``main`` the module entry point calls; the start-up of a
    fresh interpreter (about 5 s) is what one subprocess case below keeps testing."""
    with monkeypatch.context() as m:
        m.chdir(d)
        for k, v in env.items():
            if os.environ.get(k) != v:
                m.setenv(k, v)
        capfd.readouterr()
        try:
            status = main(["fit", "--config", "c.yaml", *args])
        except SystemExit as exit_:  # a parser's refusal exits, as in the interpreter
            status = exit_.code
        return status, capfd.readouterr().err


def test_failed_runs_leave_the_earlier_run_byte_identical(tmp_path, monkeypatch, capfd):
    d = tmp_path / "run"
    env = _env(tmp_path)
    _write_config(d, epochs=1, monitors=True)
    assert _cli(d, env).returncode == 0
    before = _snapshot(d)
    env["LIGHTNING_PFD_CACHE"] = str(tmp_path / "cache_of_failed_runs")  # must stay empty
    stack = str(REPO / "lightning_pfd/configs/callbacks/representation.yaml")
    bad_inputs = [
        [],  # a fresh fit over an earlier run's checkpoints
        ["--model.init_args.net.init_args.dim", "32", "--overwrite"],  # net/data shape mismatch
        ["--ckpt_path", "missing.ckpt"],
        ["--model.init_args.lr", "-1e-3", "--overwrite"],
        ["--trainer.max_epoch", "3"],
        ["--model.init_args.family", "edn", "--overwrite"],
        ["--data.init_args.n_train", "0", "--overwrite"],
        ["--model.init_args.num_steps", "5", "--overwrite"],  # student/teacher grids differ
        ["--model.init_args.betas", "[1.5, 0.999]", "--overwrite"],  # Adam would refuse it late
        ["--trainer.limit_train_batches", "-1", "--overwrite"],  # Lightning's own refusal
        [f"--trainer.callbacks+={stack}", f"--trainer.callbacks+={stack}", "--overwrite"],
        ["--data.init_args.n_gen", "8", "--overwrite"],  # num_eval 16 > n_gen: after data setup
        ["--trainer.callbacks.tap", "nope", "--overwrite"],  # unknown ICR tap
    ]
    for i, args in enumerate(bad_inputs):
        if i == 0:  # one case through a real interpreter: the exit status the shell sees
            r = _cli(d, env, *args)
            status, err = r.returncode, r.stderr
        else:
            status, err = _cli_in_process(d, env, args, monkeypatch, capfd)
        assert status == 2, (args, status, err[-2000:])
        assert "Traceback" not in err, args
        lines = err.strip().splitlines()
        first = next(i for i, ln in enumerate(lines) if "error:" in ln)
        assert len(lines) - first <= 6, (args, err)  # one short block after Lightning's banner
        assert _snapshot(d) == before, args
        cache = tmp_path / "cache_of_failed_runs"
        assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()], args


# -- divergence ----------------------------------------------------------------------------------------
class _PoisonAt:
    """Callback: turn the net's weights into NaN after optimizer step ``step`` (a blow-up)."""

    def __new__(cls, step):
        from lightning.pytorch.callbacks import Callback

        class Poison(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if trainer.global_step == step:
                    with torch.no_grad():
                        for p in pl_module.net.parameters():
                            p.fill_(float("nan"))
        return Poison()


def test_divergence_is_an_event_that_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from lightning_pfd.callbacks import EpochCheckpoint
    from lightning_pfd.data.base import TensorDataModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    x = torch.rand(64, 8) * 2 - 1
    dm = TensorDataModule(train_data=x, val_data=x[:16], batch_size=16)
    model = DiffusionModule(MLPNet(dim=8, hidden=16, depth=1), divergence_patience=3)
    ckpt = EpochCheckpoint(dirpath=tmp_path / "ck")
    trainer = pl.Trainer(max_epochs=5, accelerator="cpu", logger=CSVLogger(tmp_path, name="csv"),
                         callbacks=[_PoisonAt(6), ckpt], enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(model, datamodule=dm)
    assert model.diverged
    assert trainer.current_epoch < 4  # stopped early
    good = load_checkpoint(tmp_path / "ck/last.ckpt")
    # epoch 1 ended inside the run of NaN steps (7, 8): its checkpoint was not written
    assert good["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in good["state_dict"].values() if v.is_floating_point())
    rows = _rows(Path(trainer.logger.log_dir) / "metrics.csv")
    steps = [float(r["events/diverged_step"]) for r in rows if r.get("events/diverged_step")]
    # NaN weights after optimizer step 6: the next three steps are non-finite; the third is
    # detected before it completes, with 8 steps done
    assert steps == [8.0]


# -- val/loss is the same for any number of processes -----------------------------------------------------
def _val_loss(devices: int, tmp: Path) -> float:
    import lightning.pytorch as pl

    from lightning_pfd.data.base import TensorDataModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    x = torch.rand(40, 8) * 2 - 1
    dm = TensorDataModule(train_data=x, val_data=x[:11], batch_size=8, val_batch_size=4)
    model = DiffusionModule(MLPNet(dim=8, hidden=16, depth=1))
    trainer = pl.Trainer(accelerator="cpu", devices=devices,
                         strategy="ddp_spawn" if devices > 1 else "auto", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp)
    out = trainer.validate(model, datamodule=dm, verbose=False)
    return float(out[0]["val/loss"])


@pytest.mark.slow
def test_val_loss_is_world_size_invariant(tmp_path):
    one, two = _val_loss(1, tmp_path), _val_loss(2, tmp_path)
    assert one == pytest.approx(two, rel=1e-6)


# -- readable errors ---------------------------------------------------------------------------------------
def test_negative_numbers_are_joined_to_their_option():
    assert join_negative_values(["--model.init_args.lr", "-1e-3", "--x", "-2"]) == \
        ["--model.init_args.lr=-1e-3", "--x=-2"]
    assert join_negative_values(["--a", "-b", "--c=-1"]) == ["--a", "-b", "--c=-1"]


def test_cli_errors_are_one_short_block_with_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_config(tmp_path, epochs=1)
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", "c.yaml", "--trainer.max_epoch", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean --trainer.max_epochs?" in err and "usage" not in err.lower()
    with pytest.raises(SystemExit) as e:  # the declared type refuses it while parsing
        main(["fit", "--config", "c.yaml", "--model.init_args.lr", "-1e-3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'Parser key "model.init_args.lr"' in err and "-1e-3 does not conform to restriction v>0" in err
    assert "Namespace(" not in err and "Traceback" not in err
    assert main(["fit", "--config", "quickstrt"]) == 2
    assert "did you mean 'quickstart'?" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# -- the command line under DDP ------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_under_ddp_writes_one_run_and_resumes_it(tmp_path):
    """Two CPU processes (strategy=ddp, a real launch from the command line): every rank takes
    part in the collective calls of the validation phase, config writing, checkpointing and the
    monitors (a rank-0-only broadcast used to hang here); the resumed run continues the same
    CSV file, and no stray ./wandb or extra CSV version appears."""
    d = tmp_path / "ddp"
    env = _env(tmp_path)
    cfg = _write_config(d, epochs=1, monitors=True)
    cfg.write_text(cfg.read_text().replace("  devices: 1\n", "  devices: 2\n  strategy: ddp\n"))
    r = _cli(d, env, timeout=600)
    assert r.returncode == 0, r.stderr[-600:]
    r = _cli(d, env, "--ckpt_path", "last", "--trainer.max_epochs", "2", timeout=600)
    assert r.returncode == 0, r.stderr[-600:]
    assert sorted(p.name for p in (d / "run/csv").iterdir()) == ["version_0"]
    rows = _rows(d / "run/csv/version_0/metrics.csv")
    for key in ("pfd/e_gen", "icr/icr", "val/loss"):
        assert [r["epoch"] for r in rows if r.get(key)] == ["0", "1"], key
    assert not (d / "wandb").exists() and load_checkpoint(d / "run/checkpoints/last.ckpt")["epoch"] == 1
