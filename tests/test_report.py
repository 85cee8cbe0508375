"""`python -m lightning_pfd report RUN_DIR` on a CSVLogger-style run and a W&B offline run:
PNG figures + markdown with the events the pure detectors find on the same curves (oracle).
Also: an existing report is never overwritten without --force, the detector settings saved with
the run are used, resumed segments are merged, damaged logs are reported, and RegimeMonitor
saves its settings and keeps a separate checkpoint state per instance."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_pfd.analysis.events import MIN_SIGMA, analyze_history
from lightning_pfd.analysis.history import load_history, scan_wandb_log
from lightning_pfd.analysis.report import SETTINGS_FILE, save_detector_settings, write_report
from lightning_pfd.callbacks.regime import RegimeMonitor
from lightning_pfd.commands.report import main
from lightning_pfd.errors import ConfigError
from wandb_wait import wait_for_exit_record

T = np.arange(40, dtype=np.float64)
RNG = np.random.default_rng(7)
CURVES = {
    "pfd/e_gen": 2 + 2 * np.exp(-T / 3) + (1 - np.exp(-T / 20)) + 0.01 * RNG.standard_normal(40),
    "pfd/e_mem": 3.5 - 0.8 / (1 + np.exp(-(T - 22) / 2.5)) + 0.01 * RNG.standard_normal(40),
    "icr/icr": 0.5 + 0.3 * ((T - 14) / 20) ** 2 + 0.003 * RNG.standard_normal(40),
    "mem/ratio": 0.8 / (1 + np.exp(-(T - 24) / 2.0)) + 0.01 * RNG.standard_normal(40),
    "loss/train_fixed": 1 / (1 + T / 4),
    "loss/test_fixed": 1 / (1 + T / 4) + 0.002 * T,
}
PNG = b"\x89PNG\r\n\x1a\n"


def _expected():
    a = analyze_history({k: (T, v) for k, v in CURVES.items()})
    assert {e.name for e in a.events} == {"early_learning", "icr_minimum", "memorization_onset"}
    return a


def _write_csv(root: Path, version: int = 0, epochs=range(T.size), shift: float = 0.0,
               curves=None) -> Path:
    """metrics.csv as Lightning's CSVLogger writes it: step rows and epoch rows, empty cells;
    ``shift`` is added to every metric value (a segment whose values must not be used)."""
    curves = CURVES if curves is None else curves
    d = root / "lightning_logs" / f"version_{version}"
    d.mkdir(parents=True)
    cols = ["epoch", "step", "train/loss"] + list(curves)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for e in epochs:
            w.writerow([e, 10 * e + 4, 0.3] + [""] * len(curves))
            w.writerow([e, 10 * e + 9, ""] + [repr(float(curves[k][e]) + shift) for k in curves])
    return root


def _check_outputs(out: Path, expected):
    md = (out / "report.md").read_text()
    for name in ("dynamics.png", "icr_memorization.png"):
        assert (out / name).read_bytes()[:8] == PNG
        assert f"]({name})" in md
    for e in expected.events:
        assert f"| {e.name} | {int(e.epoch)} |" in md
    assert f"**{expected.regime.name}**" in md
    data = json.loads((out / "events.json").read_text())
    assert [(e["name"], e["epoch"]) for e in data["events"]] == \
        [(e.name, e.epoch) for e in expected.events]


def test_report_on_csv_run(tmp_path):
    run = _write_csv(tmp_path / "run")
    h = load_history(run)
    for k, v in CURVES.items():
        np.testing.assert_allclose(h.series(k)[1], v, rtol=1e-15)
    assert main([str(run), "--out", str(tmp_path / "out")]) == 0
    _check_outputs(tmp_path / "out", _expected())


def test_report_on_wandb_offline_run(tmp_path):
    import wandb

    run = wandb.init(dir=str(tmp_path), project="report-test", mode="offline")
    for e in range(T.size):
        run.log({"epoch": e, "trainer/global_step": 10 * e + 9,
                 **{k: float(v[e]) for k, v in CURVES.items()}})
    run_dir = Path(run.dir).parent
    wandb.finish()
    wait_for_exit_record(run_dir)
    assert main(["report", str(run_dir)]) == 0  # leading "report" (dispatcher argv) tolerated
    _check_outputs(run_dir / "report", _expected())
    # the built-in reader gives the same report (written beside it: paths in it are relative to
    # the report's folder)
    assert main([str(run_dir), "--no-leet", "--out", str(run_dir / "b")]) == 0
    assert (run_dir / "b" / "report.md").read_text() == (run_dir / "report" / "report.md").read_text()


def test_report_without_events_says_so(tmp_path):
    series = {"pfd/e_gen": (T, 2 + 2 * np.exp(-T / 10)), "pfd/e_mem": (T, 3 + 0 * T)}
    res = write_report(series, tmp_path)
    md = Path(res["markdown"]).read_text()
    assert "No event passed its test" in md and "**generalization**" in md
    assert res["figures"] == [str(tmp_path / "dynamics.png")]  # no ICR / ratio: one figure


def test_report_bad_input(tmp_path, capsys):
    """User errors: exit 2, one short block on stderr naming the problem, nothing written."""
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run_dir:") and "does not exist" in err
    assert len(err.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no W&B run" in capsys.readouterr().err
    run = _write_csv(tmp_path / "run")
    assert main([str(run), "--window", "0"]) == 2
    assert "--window: must be an integer > 0\n  value:    0" in capsys.readouterr().err
    assert main([str(run), "--key", "egen=pfd/x"]) == 2
    assert "did you mean 'e_gen'" in capsys.readouterr().err
    assert main([str(run), "--segment", "version_3"]) == 2
    assert "--segment: no such segment" in capsys.readouterr().err
    assert not (run / "report").exists()
    with pytest.raises(ValueError, match="source"):
        load_history(run, source="tensorboard")


def test_report_module_entry_point(tmp_path):
    run = _write_csv(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "lightning_pfd.commands.report", str(run), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "early learning" in r.stdout and (tmp_path / "o" / "report.md").is_file()
    # a missing directory: status 2, one line, no traceback
    r = subprocess.run([sys.executable, "-m", "lightning_pfd.commands.report",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert r.stderr.strip() == f"error: run_dir: {str(tmp_path / 'nope')!r} does not exist"


# ----------------------------------------------------------------------------- never destroys
def test_existing_report_kept_without_force(tmp_path, capsys):
    run = _write_csv(tmp_path / "run")
    ver = run / "lightning_logs" / "version_0"
    old = ver / "report"  # as RegimeMonitor leaves it at the end of the run
    old.mkdir()
    before = {"report.md": b"# in-run report\n", "events.json": b'{"events": []}',
              "dynamics.png": PNG + b"old"}
    for name, data in before.items():
        (old / name).write_bytes(data)
    assert main([str(ver)]) == 0
    assert {n: (old / n).read_bytes() for n in before} == before  # byte-identical
    assert sorted(p.name for p in old.iterdir()) == sorted(before)
    err = capsys.readouterr().err
    assert f"{old} already holds a report (kept); writing to {old}-2" in err
    _check_outputs(ver / "report-2", _expected())
    assert main([str(ver)]) == 0  # next free sibling
    assert (ver / "report-3" / "report.md").is_file()
    # --force overwrites in place
    assert main([str(ver), "--force"]) == 0
    _check_outputs(old, _expected())
    assert (old / "report.md").read_bytes() != before["report.md"]
    assert not (ver / "report-4").exists()


# ----------------------------------------------------------------------------- saved settings
N_SET = 14
T_SET = np.arange(N_SET, dtype=np.float64)
SET_CURVES = {
    "pfd/e_gen": 2.0 + 2.0 * np.exp(-T_SET / 2.0) + (1.0 - np.exp(-T_SET / 12.0)),
    "pfd/e_mem": 3.0 + 0.0 * T_SET,
    "custom/ratio": 0.8 / (1.0 + np.exp(-(T_SET - 8.0))),
}
SAVED = dict(keys={"mem_ratio": "custom/ratio"}, window=1, confirm=2)


def _onset(series, **kw):
    return analyze_history(series, **kw).event("memorization_onset")


def test_saved_settings_are_used(tmp_path, capsys):
    run = _write_csv(tmp_path / "run", epochs=range(N_SET), curves=SET_CURVES)
    ver = run / "lightning_logs" / "version_0"
    series = {k: (T_SET, v) for k, v in SET_CURVES.items()}
    saved_on = _onset(series, keys=SAVED["keys"], window=1, confirm=2)
    default_on = _onset(series, keys=SAVED["keys"])
    assert (saved_on.epoch, default_on.epoch) == (5, 7)  # the settings move the onset
    assert _onset(series) is None  # without the saved keys no ratio, flat E_mem: no onset
    f = save_detector_settings(ver / "report", dict(SAVED, require_descent=True),
                               written_by="test")
    assert main([str(ver), "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "events.json").read_text())
    onset = [e for e in data["events"] if e["name"] == "memorization_onset"]
    assert [e["epoch"] for e in onset] == [saved_on.epoch]
    assert data["settings"]["window"] == 1 and data["settings"]["confirm"] == 2
    assert data["settings"]["keys"]["mem_ratio"] == "custom/ratio"
    rel = os.path.relpath(f, tmp_path / "a")  # report files name it relative to themselves
    assert rel == "../run/lightning_logs/version_0/report/detector_settings.json"
    assert data["settings_source"]["window"] == f"run: {rel}"
    assert data["settings_source"]["min_sigma"] == "default"
    md = (tmp_path / "a" / "report.md").read_text()
    assert f"| window | `1` | run: {rel} |" in md and "| min_rel | `0` | default |" in md
    assert f"(run: {f})" in capsys.readouterr().out
    # flags given explicitly win over the saved settings; the saved keys stay
    assert main([str(ver), "--out", str(tmp_path / "b"), "--window", "5", "--confirm", "3"]) == 0
    data = json.loads((tmp_path / "b" / "events.json").read_text())
    assert [e["epoch"] for e in data["events"] if e["name"] == "memorization_onset"] == \
        [default_on.epoch]
    assert data["settings_source"]["window"] == "command line"
    assert data["settings_source"]["keys"] == f"run: {os.path.relpath(f, tmp_path / 'b')}"
    # a damaged settings file is a user error naming it
    f.write_text("{not json")
    assert main([str(ver), "--out", str(tmp_path / "c")]) == 2
    assert str(f) in capsys.readouterr().err and not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------- segments
def test_report_merges_csv_versions(tmp_path, capsys):
    """version_0 ran epochs 0-24 but its epochs 20-24 were re-run by version_1 (resumed from a
    checkpoint at epoch 19): the stale values (shifted by +5) must not reach the report."""
    run = tmp_path / "run"
    _write_csv(run, 0, epochs=range(0, 20))
    d = run / "lightning_logs"
    _write_csv(tmp_path / "tmp", 0, epochs=range(20, 25), shift=5.0)  # stale rows of version_0
    stale = (tmp_path / "tmp" / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    with open(d / "version_0" / "metrics.csv", "a") as fh:
        fh.write(stale.split("\n", 1)[1])
    _write_csv(run, 1, epochs=range(20, T.size))
    assert main([str(run / "lightning_logs"), "--out", str(tmp_path / "o")]) == 0
    _check_outputs(tmp_path / "o", _expected())
    out = capsys.readouterr().out
    assert "from 2 segments of one run, merged by epoch" in out
    assert "version_0/metrics.csv: 50 rows, epochs 0–24, 40 kept" in out
    # the latest segment alone is what the reader used to return
    assert main([str(run / "lightning_logs"), "--segment", "latest", "--out",
                 str(tmp_path / "l")]) == 0
    assert "Training-dynamics report" in (tmp_path / "l" / "report.md").read_text()
    data = json.loads((tmp_path / "l" / "events.json").read_text())
    assert [s["rows_read"] for s in data["input"]["segments"]] == [40]


# ----------------------------------------------------------------------------- damaged input
def _wandb_run(tmp_path) -> Path:
    import wandb

    run = wandb.init(dir=str(tmp_path), project="trunc", mode="offline")
    for e in range(T.size):
        run.log({"epoch": e, **{k: float(v[e]) for k, v in CURVES.items()}})
    run_dir = Path(run.dir).parent
    wandb.finish()
    return wait_for_exit_record(run_dir)


def _cut_mid_record(data: bytes, at: int) -> bytes:
    """The first prefix of length >= ``at`` that ends inside a record."""
    while scan_wandb_log(data[:at])[1] is None or "mid-record" not in scan_wandb_log(data[:at])[1]:
        at += 1
        assert at < len(data), f"no prefix of the {len(data)}-byte log from {at} ends inside a record"
    return data[:at]


def test_truncated_wandb_log(tmp_path, capsys):
    data = _wandb_run(tmp_path).read_bytes()
    d = tmp_path / "cut" / "offline-run-20250101_000000-cut1"
    d.mkdir(parents=True)
    f = d / "run-cut1.wandb"
    f.write_bytes(_cut_mid_record(data, len(data) // 2))
    rows = load_history(f).series("pfd/e_gen")[0]
    assert 0 < rows.size < T.size
    assert main([str(d)]) == 1  # report written, but from incomplete input
    cap = capsys.readouterr()
    assert f"warning: {f}: cut mid-record" in cap.err
    assert f"read {rows.size} rows, epochs 0–{rows.size - 1}" in cap.err
    md = (d / "report" / "report.md").read_text()
    assert md.splitlines()[2].startswith("> **Incomplete input**") and "(**incomplete**)" in md
    assert json.loads((d / "report" / "events.json").read_text())["input"]["incomplete"] is True
    # cut before the first metric: nothing valid, one error line, nothing written
    f.write_bytes(_cut_mid_record(data, 300))
    assert main([str(d), "--out", str(tmp_path / "none")]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "no metric values could be read" in cap.err
    assert "cut mid-record" in cap.err and not (tmp_path / "none").exists()


# ----------------------------------------------------------------------------- RegimeMonitor
class Scripted(LightningModule):
    """Logs SET_CURVES (custom/ratio as mem/ratio) in on_validation_epoch_end."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        e = self.current_epoch
        for name, curve in SET_CURVES.items():
            self.log(name.replace("custom/ratio", "mem/ratio"),
                     torch.tensor(curve[e], dtype=torch.float64))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)),
                                           batch_size=4)

    val_dataloader = train_dataloader


def _fit(tmp_path, callbacks, epochs, logger=False, ckpt_path=None, checkpoint=False):
    trainer = Trainer(max_epochs=epochs, logger=logger, callbacks=callbacks, accelerator="cpu",
                      devices=1, enable_checkpointing=checkpoint, enable_model_summary=False,
                      enable_progress_bar=False, num_sanity_val_steps=0,
                      default_root_dir=str(tmp_path), log_every_n_steps=1)
    trainer.fit(Scripted(), ckpt_path=ckpt_path)
    return trainer


def test_in_run_report_kept_and_its_settings_used(tmp_path, capsys):
    mon = RegimeMonitor(window=1, confirm=2, verbose=False)
    logger = CSVLogger(str(tmp_path), name="csv")
    _fit(tmp_path, [mon], N_SET, logger=logger)
    ver = Path(logger.log_dir)
    rep = ver / "report"
    saved = json.loads((rep / SETTINGS_FILE).read_text())
    assert saved["settings"] == dict(mon.detector_settings, min_sigma=MIN_SIGMA)
    assert saved["state_key"] == mon.state_key
    assert json.loads((ver / SETTINGS_FILE).read_text()) == saved  # copy in the logger's dir
    before = {p.name: p.read_bytes() for p in rep.iterdir()}
    assert main([str(ver)]) == 0
    assert {p.name: p.read_bytes() for p in rep.iterdir()} == before
    in_run = json.loads(before["events.json"])
    new = json.loads((ver / "report-2" / "events.json").read_text())
    assert [(e["name"], e["epoch"]) for e in new["events"]] == \
        [(e["name"], e["epoch"]) for e in in_run["events"]]
    assert new["settings_source"]["window"] == f"run: ../{SETTINGS_FILE}"  # relative to report-2/
    series = {k.replace("custom/ratio", "mem/ratio"): (T_SET, v) for k, v in SET_CURVES.items()}
    assert [e["epoch"] for e in new["events"] if e["name"] == "memorization_onset"] == \
        [_onset(series, window=1, confirm=2).epoch] != [_onset(series).epoch]


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_two_regime_monitors_keep_separate_state(tmp_path):
    def monitors():
        return (RegimeMonitor(report_dir=str(tmp_path / "a"), verbose=False, window=3, confirm=2),
                RegimeMonitor(keys={"e_gen": "pfd/e_mem"}, report_dir=str(tmp_path / "b"),
                              verbose=False, window=3, confirm=2))

    a, b = monitors()
    assert a.state_key != b.state_key and "report_dir" in a.state_key
    ck = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
    _fit(tmp_path, [a, b, ck], 6, checkpoint=True)
    state = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)["callbacks"]
    assert state[a.state_key]["history"] == a.history and "pfd/e_gen" in a.history[0]
    assert state[b.state_key]["history"] == b.history and "pfd/e_gen" not in b.history[0]
    a2, b2 = monitors()
    _fit(tmp_path, [a2, b2], 8, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert a2.history[:6] == a.history and len(a2.history) == 8
    assert b2.history[:6] == b.history and "pfd/e_gen" not in b2.history[-1]
    assert (tmp_path / "a" / "report.md").is_file() and (tmp_path / "b" / SETTINGS_FILE).is_file()
    # two monitors writing into one report directory are refused before training
    with pytest.raises(ConfigError, match="report_dir"):
        _fit(tmp_path, [RegimeMonitor(verbose=False),
                        RegimeMonitor(keys={"icr": "x"}, verbose=False)], 1)


def test_report_on_a_run_still_training(tmp_path, capsys):
    """A run that is still training: its W&B log holds no metric value yet (W&B buffers in its
    service) while the CSV has rows, and fit holds the run lock. The report reads the CSV, says
    the run is in progress (stderr and report.md), and finds what the rows so far show."""
    import fcntl

    run = _write_csv(tmp_path / "run", epochs=range(12))
    wb = run / "wandb" / "offline-run-20250101_000000-live1"
    wb.mkdir(parents=True)
    (wb / "run-live1.wandb").write_bytes(b"")  # nothing flushed yet
    lock = run / "checkpoints" / ".lightning_pfd.lock"
    lock.parent.mkdir()
    lock.write_text(json.dumps({"pid": os.getpid(), "command": "python -m lightning_pfd fit"}))
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as fit holds it
    try:
        assert main([str(run)]) == 0
    finally:
        os.close(fd)
    out, err = capsys.readouterr()
    assert "no metric values could be read" not in err
    assert f"the run is still training (pid {os.getpid()} (python -m lightning_pfd fit))" in err
    assert "holds no metric value yet" in err and "read the CSV log instead" in err
    md = (run / "report" / "report.md").read_text()
    assert "the run is still training" in md and str(tmp_path) not in md
    assert "| E_gen | `pfd/e_gen` | 12 |" in md  # the 12 epochs logged so far
    # the lock released (the run finished): no such line any more
    assert main([str(run), "--force"]) == 0
    assert "still training" not in capsys.readouterr().err


def test_a_stopped_fit_says_how_to_rebuild_its_report():
    """SIGTERM / SIGINT during (or before) the end-of-run report: the exit message names the
    command that builds it from the logs; a run without a report-writing monitor gets no line."""
    from types import SimpleNamespace

    from lightning_pfd.launch.interrupts import SignalRecord, resume_message

    record = SignalRecord()
    record.signum = 15
    trainer = SimpleNamespace(current_epoch=3, global_step=30, checkpoint_callbacks=[],
                              callbacks=[RegimeMonitor(report_dir="runs/my run/report", verbose=False)],
                              default_root_dir="runs/my run")
    msg = resume_message(record, trainer, ["fit", "--config", "c.yaml"], "python -m lightning_pfd")
    assert "report: the end-of-run report may be missing or partial; build it from the logs with: " \
           "python -m lightning_pfd report 'runs/my run'" in msg
    trainer.callbacks = [RegimeMonitor(write_report=False, verbose=False)]
    assert "report" not in resume_message(record, trainer, ["fit"], "python -m lightning_pfd").split("exit status")[1]


def test_a_stop_after_the_last_epoch_offers_no_resume(tmp_path):
    """SIGTERM during the end-of-run report of a finished run: the final checkpoint has nothing
    left to train, so the message says so instead of a resume command that would do nothing."""
    from types import SimpleNamespace

    import torch

    from lightning_pfd.launch.interrupts import SignalRecord, resume_message

    record = SignalRecord()
    record.signum = 15
    loops = {"fit_loop": {"epoch_progress": {"current": {"processed": 4}}}}
    torch.save({"epoch": 3, "global_step": 40, "loops": loops}, tmp_path / "last.ckpt")
    trainer = SimpleNamespace(current_epoch=4, global_step=40, max_epochs=4, max_steps=-1,
                              checkpoint_callbacks=[SimpleNamespace(dirpath=str(tmp_path))],
                              callbacks=[RegimeMonitor(report_dir="r/report", verbose=False)],
                              default_root_dir="r")
    msg = resume_message(record, trainer, ["fit", "--config", "c.yaml"], "python -m lightning_pfd")
    assert "training had finished" in msg and "its 4 epoch(s) reached trainer.max_epochs=4" in msg
    assert "resume with" not in msg and "python -m lightning_pfd report r" in msg
    trainer.max_epochs = 8  # the same checkpoint with epochs left: the resume command
    msg = resume_message(record, trainer, ["fit", "--config", "c.yaml"], "python -m lightning_pfd")
    assert "training had finished" not in msg
    assert "resume with: python -m lightning_pfd fit --config c.yaml --ckpt_path last" in msg


def test_report_paths_are_relative_to_the_report_folder(tmp_path):
    """A rewritten path is a whole component: run/x is rewritten, run/x2 beside it is not."""
    from lightning_pfd.commands.report import _portable

    run = _write_csv(tmp_path / "x", epochs=range(6))
    hist = load_history(run)
    out = run / "report"
    shown, rewrite = _portable(hist, out, str(run))
    assert str(shown.segments[0].path) == "../lightning_logs/version_0/metrics.csv"
    assert (out / shown.segments[0].path).resolve() == hist.segments[0].path.resolve()
    assert rewrite(f"run: {run}/a.json") == "run: ../a.json"
    assert rewrite(f"{tmp_path}/x2/b.json") == f"{tmp_path}/x2/b.json".replace(str(tmp_path), "../..")
    assert rewrite("default") == "default"


def test_a_run_without_a_regime_says_why():
    """Issue 40 item 14: a short run that logged both curves is told it has too few evaluations,
    not that a curve is missing; a run without E_mem is told that one is missing."""
    from lightning_pfd.analysis.report import render_markdown

    short = {k: (T[:4], CURVES[k][:4]) for k in ("pfd/e_gen", "pfd/e_mem")}
    a = analyze_history(short, final=True)
    assert a.regime is None
    md = render_markdown(a, short, settings={"confirm": 3})
    assert ("Not determined: `pfd/e_gen` and `pfd/e_mem` have 4 common finite evaluation(s); the regime "
            "needs at least 5 (max(5, confirm + 2))") in md and "needs both" not in md
    assert "needs at least 6" in render_markdown(a, short, settings={"confirm": 4})
    only = {"pfd/e_gen": short["pfd/e_gen"]}
    assert "Not determined (needs both `pfd/e_gen` and `pfd/e_mem`)." in render_markdown(analyze_history(only), only)
    full = {k: (T, CURVES[k]) for k in ("pfd/e_gen", "pfd/e_mem")}
    assert "Not determined" not in render_markdown(analyze_history(full, final=True), full)
