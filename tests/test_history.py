"""Reading runs back: resumed segments merged by epoch (CSV versions, W&B offline runs of one
id), damaged logs detected (W&B record framing + CRC, CSV cut lines) and described."""
import csv
import os
import time
from pathlib import Path

import numpy as np
import pytest

from lightning_pfd.analysis.history import (
    find_segments,
    load_history,
    merge_segments,
    read_csv_segment,
    scan_wandb_log,
)
from lightning_pfd.errors import ConfigError


def _write_version(root: Path, version: int, epochs, offset: float) -> Path:
    """A CSVLogger version dir: per epoch a step row (train/loss) and an epoch row (metrics)."""
    d = root / f"version_{version}"
    d.mkdir(parents=True)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "step", "train/loss", "pfd/e_gen"])
        for e in epochs:
            w.writerow([e, 10 * e + 4, offset + 0.5, ""])
            w.writerow([e, 10 * e + 9, "", offset + e])
    return d


def test_merge_segments_later_segment_wins_per_epoch():
    a = [{"epoch": 0.0, "x": 1.0}, {"x": 2.0}, {"epoch": 1.0, "x": 3.0}, {"epoch": 2.0, "x": 4.0}]
    b = [{"y": 9.0}, {"epoch": 2.0, "x": 40.0}, {"x": 41.0}, {"epoch": 3.0, "x": 50.0}]
    rows, kept = merge_segments([a, b])
    # epochs 0, 1 from a (the epoch-less row inherits epoch 0 and is stamped), 2 and 3 from b;
    # b's row before its first epoch is kept (latest segment), a's epoch-2 row is dropped
    assert rows == [{"epoch": 0.0, "x": 1.0}, {"epoch": 0.0, "x": 2.0}, {"epoch": 1.0, "x": 3.0},
                    {"y": 9.0}, {"epoch": 2.0, "x": 40.0}, {"epoch": 2.0, "x": 41.0},
                    {"epoch": 3.0, "x": 50.0}]
    assert kept == [3, 4]
    assert merge_segments([a]) == (a, [4])  # one segment: rows untouched


def test_csv_versions_merged_by_epoch(tmp_path):
    root = tmp_path / "csv"
    _write_version(root, 0, range(0, 10), offset=0.0)       # crashed after epoch 9
    v1 = _write_version(root, 1, range(6, 15), offset=100.0)  # resumed from epoch 6
    # segment order is the version number, not the modification time
    old = time.time() - 100
    os.utime(v1 / "metrics.csv", (old, old))
    h = load_history(root)
    x, y = h.series("pfd/e_gen")
    np.testing.assert_array_equal(x, np.arange(15))
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4, 5] + [100 + e for e in range(6, 15)])
    np.testing.assert_array_equal(h.series("train/loss")[1], [0.5] * 6 + [100.5] * 9)
    assert [s.name for s in h.segments] == ["version_0", "version_1"]
    assert [(s.rows_read, s.rows_kept) for s in h.segments] == [(20, 12), (18, 18)]
    assert h.segments[0].epochs == (0.0, 9.0) and not h.incomplete and h.warnings == []
    # one segment on request, or by pointing at its directory
    assert load_history(root, segment="latest").series("pfd/e_gen")[0][0] == 6
    assert load_history(root, segment="version_0").series("pfd/e_gen")[1][-1] == 9
    assert load_history(root, segment=0).series("pfd/e_gen")[1][-1] == 9
    assert len(load_history(root / "version_0").segments) == 1
    with pytest.raises(ConfigError, match="segment"):
        load_history(root, segment="version_7")


def test_wandb_segments_of_one_run_id_merged(tmp_path):
    import wandb

    for k, (a, b) in enumerate([(0, 10), (6, 15)]):
        if k:
            time.sleep(1.05)  # segment dirs are named by the start time in seconds
        run = wandb.init(dir=str(tmp_path), project="seg", mode="offline", id="resumed1",
                         resume="allow")
        for e in range(a, b):
            run.log({"epoch": e, "pfd/e_gen": 100.0 * k + e})
        wandb.finish()
    other = wandb.init(dir=str(tmp_path), project="seg", mode="offline")  # another run id
    other.log({"epoch": 0, "pfd/e_gen": -1.0})
    wandb.finish()
    kind, files = find_segments(next((tmp_path / "wandb").glob("offline-run-*-resumed1")))
    assert kind == "wandb" and len(files) == 2 and files[0].parent.name < files[1].parent.name
    h = load_history(files[0].parent, use_leet=False)  # either segment names the whole run
    x, y = h.series("pfd/e_gen")
    np.testing.assert_array_equal(x, np.arange(15))
    np.testing.assert_array_equal(y, list(range(6)) + [100.0 + e for e in range(6, 15)])
    assert [s.rows_kept for s in h.segments] == [6, 9]
    assert all(s.finished for s in h.segments) and h.warnings == []


def test_scan_wandb_log_detects_cuts_and_corruption(tmp_path):
    import wandb

    run = wandb.init(dir=str(tmp_path), project="scan", mode="offline")
    for e in range(30):
        run.log({"epoch": e, "pfd/e_gen": float(e)})
    f = next(Path(run.dir).parent.glob("run-*.wandb"))
    wandb.finish()
    import time

    for _ in range(100):  # the W&B service may still be writing the file after finish()
        data = f.read_bytes()
        payloads, problem = scan_wandb_log(data)
        if problem is None and len(payloads) > 30:  # (a read mid-write ends in a cut record)
            break
        time.sleep(0.1)
    assert problem is None and len(payloads) > 30
    # every cut inside the last record is found; fewer records survive
    cut_payloads, problem = scan_wandb_log(data[:-3])
    assert "cut mid-record" in problem and len(cut_payloads) == len(payloads) - 1
    # a flipped byte fails the CRC of its record; reading stops before it
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0xFF
    ok, problem = scan_wandb_log(bytes(bad))
    assert "corrupt record" in problem and len(ok) < len(payloads)
    assert scan_wandb_log(b"")[1] == "the file is empty"
    assert "bad header" in scan_wandb_log(b"not a wandb log at all")[1]


def test_csv_cut_last_line_and_bad_lines(tmp_path):
    f = tmp_path / "metrics.csv"
    f.write_text("epoch,step,pfd/e_gen\n0,9,1.5\n1,19,1.25\n2,29\n3,39,1.1")
    rows, problem = read_csv_segment(f)
    assert rows == [{"epoch": 0.0, "step": 9.0, "pfd/e_gen": 1.5},
                    {"epoch": 1.0, "step": 19.0, "pfd/e_gen": 1.25}]
    assert "last line (5) is cut" in problem and "1 line(s) with a wrong number" in problem
    h = load_history(f)
    assert h.incomplete and str(f) in h.warnings[0] and "read 2 rows, epochs 0–1" in h.warnings[0]
    f.write_text("epoch,step,pfd/e_gen\n")
    with pytest.raises(ConfigError, match="no metric values could be read"):
        load_history(f)
