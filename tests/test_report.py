"""`python -m lightning_pfd report RUN_DIR` on a CSVLogger-style run and a W&B offline run:
PNG figures + markdown with the events the pure detectors find on the same curves (oracle)."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_pfd.analysis.events import analyze_history
from lightning_pfd.analysis.history import load_history
from lightning_pfd.analysis.report import main, write_report

T = np.arange(40, dtype=np.float64)
RNG = np.random.default_rng(7)
CURVES = {
    "pfd/e_gen": 2 + 2 * np.exp(-T / 3) + (1 - np.exp(-T / 20)) + 0.01 * RNG.standard_normal(40),
    "pfd/e_mem": 3.5 - 0.8 / (1 + np.exp(-(T - 22) / 2.5)) + 0.01 * RNG.standard_normal(40),
    "icr/icr": 0.5 + 0.3 * ((T - 14) / 20) ** 2 + 0.003 * RNG.standard_normal(40),
    "mem/ratio": 0.8 / (1 + np.exp(-(T - 24) / 2.0)),
    "loss/train_fixed": 1 / (1 + T / 4),
    "loss/test_fixed": 1 / (1 + T / 4) + 0.002 * T,
}
PNG = b"\x89PNG\r\n\x1a\n"


def _expected():
    a = analyze_history({k: (T, v) for k, v in CURVES.items()})
    assert {e.name for e in a.events} == {"early_learning", "icr_minimum", "memorization_onset"}
    return a


def _write_csv(root: Path) -> Path:
    """metrics.csv as Lightning's CSVLogger writes it: step rows and epoch rows, empty cells."""
    d = root / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    cols = ["epoch", "step", "train/loss"] + list(CURVES)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for e in range(T.size):
            w.writerow([e, 10 * e + 4, 0.3] + [""] * len(CURVES))
            w.writerow([e, 10 * e + 9, ""] + [repr(float(CURVES[k][e])) for k in CURVES])
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
    assert main(["report", str(run_dir)]) == 0  # leading "report" (dispatcher argv) tolerated
    _check_outputs(run_dir / "report", _expected())
    # the built-in reader gives the same report
    assert main([str(run_dir), "--no-leet", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "report.md").read_text() == (run_dir / "report" / "report.md").read_text()


def test_report_without_events_says_so(tmp_path):
    series = {"pfd/e_gen": (T, 2 + 2 * np.exp(-T / 10)), "pfd/e_mem": (T, 3 + 0 * T)}
    res = write_report(series, tmp_path)
    md = Path(res["markdown"]).read_text()
    assert "No event detected" in md and "**generalization**" in md
    assert res["figures"] == [str(tmp_path / "dynamics.png")]  # no ICR / ratio: one figure


def test_report_bad_input(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "run_dir" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no W&B run" in capsys.readouterr().out
    run = _write_csv(tmp_path / "run")
    assert main([str(run), "--window", "0"]) == 2
    assert "--window" in capsys.readouterr().out
    with pytest.raises(ValueError, match="source"):
        load_history(run, source="tensorboard")


def test_report_module_entry_point(tmp_path):
    run = _write_csv(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "lightning_pfd.analysis.report", str(run), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "early learning" in r.stdout and (tmp_path / "o" / "report.md").is_file()
