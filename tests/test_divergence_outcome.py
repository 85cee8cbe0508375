"""Issue 41 item 4 / issue 40 item 4: a diverged fit says so in every output and never exits 0
with a healthy-looking report. Tested through the command line with a huge learning rate and
with huge inputs (the range check off): exit status 3, the console names a checkpoint only when
one exists, no monitor logs a value of the diverged model, report.md opens with the divergence,
events.json's outcome is "diverged" with no regime, and no event is confirmed after it."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from lightning_pfd.analysis.events import analyze_history
from lightning_pfd.cli import main
from lightning_pfd.commands.fit import DIVERGED
from test_reliability import _write_config


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_outputs(d, caplog):
    rows = _rows(d / "run/csv/version_0/metrics.csv")
    div = [float(r["events/diverged_epoch"]) for r in rows if r.get("events/diverged_epoch")]
    assert len(div) == 1
    def finite(v):
        return bool(v) and np.isfinite(float(v))

    measured = [float(r["epoch"]) for r in rows
                if finite(r.get("pfd/e_gen")) or finite(r.get("icr/icr")) or finite(r.get("mem/ratio"))]
    assert all(e < div[0] for e in measured)  # no finite value measured from the diverged epoch on
    report = next(d.glob("run/**/report/report.md")).read_text()
    assert "**DIVERGED** at epoch" in report and "Not classified: the run diverged" in report
    events = json.loads(next(d.glob("run/**/report/events.json")).read_text())
    assert events["outcome"] == "diverged" and events["regime"] is None
    assert events["diverged"]["epoch"] == int(div[0])
    assert all(float(e["detected_epoch"]) < div[0] for e in events["events"])
    return div[0]


@pytest.mark.parametrize("how", ["huge_lr", "huge_inputs"])
def test_a_diverged_fit_exits_3_and_every_output_says_so(tmp_path, monkeypatch, capsys, caplog, how):
    import torch

    _write_config(tmp_path, epochs=3, monitors=True)
    text = (tmp_path / "c.yaml").read_text()
    args = []
    if how == "huge_lr":
        args = ["--model.init_args.lr", "1.0e4"]
    else:  # huge inputs: a data file scaled by 1e30, the datamodule's range check off
        torch.save({"train": torch.randn(96, 64, dtype=torch.float64) * 1e30}, tmp_path / "huge.pt")
        start = text.index("data:\n")
        text = text[:start] + ("data:\n  class_path: lightning_pfd.data.TensorFileDataModule\n  init_args:\n"
                               f"    path: {tmp_path / 'huge.pt'}\n    value_range: null\n    batch_size: 32\n")
        text = text.replace("num_images: 32", "num_images: 16")
    (tmp_path / "c.yaml").write_text(text)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    assert main(["fit", "--config", "c.yaml", *args]) == DIVERGED == 3
    err = capsys.readouterr().err
    assert "the run DIVERGED" in err and f"exit status {DIVERGED}" in err
    said = caplog.text
    assert "event: diverged" in said
    ckpts = sorted((tmp_path / "run/checkpoints").glob("*.ckpt")) if (tmp_path / "run/checkpoints").is_dir() else []
    if ckpts:
        assert "the last good checkpoint is" in said and str(ckpts[-1].name) in said
    else:
        assert "no checkpoint was written before it" in said and "last good" not in said
    _check_outputs(tmp_path, caplog)


def test_no_event_is_confirmed_from_measurements_that_reach_the_divergence():
    """A clear early-learning curve (descent, then a rise to the end) is confirmed; the same
    curve with a divergence logged (epoch 7) before the rise is confirmed (epoch 8) is not, and has no regime."""
    ep = np.arange(40.0)
    rng = np.random.default_rng(0)
    e_gen = 3 - 0.5 * np.minimum(ep, 5) / 5 + np.where(ep > 5, 0.08 * (ep - 5), 0) + rng.normal(0, 0.02, ep.size)
    e_mem = 3.2 - 0.02 * ep
    series = {"pfd/e_gen": (ep, e_gen), "pfd/e_mem": (ep, e_mem)}
    healthy = analyze_history(series, window=3, confirm=2)
    assert healthy.event("early_learning") is not None and healthy.diverged is None
    sick = analyze_history(dict(series, **{"events/diverged_epoch": (np.array([7.0]), np.array([7.0])),
                                           "events/diverged_step": (np.array([7.0]), np.array([70.0]))}),
                           window=3, confirm=2)
    assert sick.diverged == {"epoch": 7, "step": 70, "cause": "non-finite loss or gradients"}
    assert sick.regime is None
    late = [e for e in healthy.events if float(e.detected_epoch) >= 7]
    assert late and all(sick.event(e.name) is None for e in late)
    assert {e.name for e in late} <= {e.name for e in sick.undecided}
    assert all("diverged at epoch 7" in e.reason for e in sick.undecided if e.name in {x.name for x in late})


@pytest.mark.parametrize("fault, cause, code", [
    (["helpers.faults.ScaleWeightsAtStep", "--trainer.callbacks.step", "25", "--trainer.callbacks.factor", "30"],
     "an exploding (finite) loss", 2),
    (["helpers.faults.ScaleWeightsAtEpochEnd", "--trainer.callbacks.epoch", "0", "--trainer.callbacks.factor", "1e5"],
     "exploding or non-finite weights", 3),
    (["helpers.faults.DeadNetAtStep", "--trainer.callbacks.step", "20"],
     "collapsed outputs (constant features)", 4),
], ids=["finite_loss_explosion", "weights_explosion", "collapsed_features"])
def test_finite_explosions_and_collapsed_outputs_diverge_too(tmp_path, monkeypatch, capsys, caplog, fault, cause, code):
    """The explosions a non-finite check misses: a loss that jumps by orders of magnitude and stays
    finite (every weight x30 at step 25, after the running mean's warm-up), weights whose norm grew 1e5-fold between two epoch
    checks, and a network whose hidden features are the same for every input (weights 0, biases 1
    at the end of epoch 1: ICR's features collapse, logged NaN, not a finite ICR of a dead
    network). Each is a divergence with its cause in the console, the CSV, report.md and
    events.json, and the fit exits 3."""
    _write_config(tmp_path, epochs=4, monitors=True)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    assert main(["fit", "--config", "c.yaml", "--trainer.callbacks+=" + fault[0], *fault[1:]]) == DIVERGED
    err = capsys.readouterr().err
    assert "the run DIVERGED" in err
    rows = _rows(tmp_path / "run/csv/version_0/metrics.csv")
    causes = [float(r["events/diverged_cause"]) for r in rows if r.get("events/diverged_cause")]
    assert causes == [float(code)]
    report = next(tmp_path.glob("run/**/report/report.md")).read_text()
    assert f"**DIVERGED** at epoch" in report and cause in report
    events = json.loads(next(tmp_path.glob("run/**/report/events.json")).read_text())
    assert events["outcome"] == "diverged" and events["diverged"]["cause"] == cause
    if code == 4:  # the collapsed measurement is NaN, never a finite ICR of a dead network
        icr = [r["icr/icr"] for r in rows if r.get("icr/icr")]
        assert icr and icr[-1].lower() == "nan" and all(v.lower() != "nan" for v in icr[:-1])
        assert "collapsed outputs" in caplog.text


def test_loss_explosion_rule_on_its_own():
    """The rule without a Trainer: the running mean's minimum is taken after the warm-up steps;
    a finite loss above divergence_factor x that minimum is bad and leaves the mean alone."""
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    m = DiffusionModule(MLPNet(dim=4, hidden=8, depth=1), divergence_factor=100.0)
    losses = [10.0 * 0.9 ** k for k in range(40)]  # falling fast at first
    assert not any(m._loss_exploded(v) for v in losses)
    floor = m._loss_floor
    assert 0 < floor <= m._loss_ema and floor < 10.0  # the lowest running mean after the warm-up
    assert not m._loss_exploded(99.0 * floor) and m._loss_exploded(101.0 * floor)
    off = DiffusionModule(MLPNet(dim=4, hidden=8, depth=1), divergence_factor=0.0)
    assert not any(off._loss_exploded(v) for v in losses + [1e30])
    with pytest.raises(ValueError, match="divergence_factor"):
        DiffusionModule(MLPNet(dim=4, hidden=8, depth=1), divergence_factor=-1.0)
