"""icr-sweep on a checkpoint whose model takes flattened images (the quickstart's MLP) with image
data (``--data digits``): flattened as the model expects, augmented as images, equal to the
monitor on the same flattened data with ``image_shape``; a warning when n < 4d; samples of
another size refused naming --data."""
from __future__ import annotations

import json
from pathlib import Path
import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_pfd.evaluation.representation import RepresentationEvaluation
from lightning_pfd.commands.icr_sweep import main
from lightning_pfd.commands.icr_sweep import reliability_warnings
from lightning_pfd.data import DigitsDataModule
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet


@pytest.fixture(scope="module")
def flat_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    module = DiffusionModule(MLPNet(dim=64, hidden=32, depth=2))
    trainer = pl.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, limit_val_batches=0, default_root_dir=d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=DigitsDataModule(as_vector=True, batch_size=64))
    trainer.save_checkpoint(d / "m.ckpt")
    return d / "m.ckpt", module.eval()


def test_image_data_is_flattened_for_a_vector_model_and_augmented_as_images(flat_ckpt, tmp_path, capsys):
    ckpt, module = flat_ckpt
    net = json.dumps({"class_path": "lightning_pfd.nets.MLPNet", "init_args": {"dim": 64, "hidden": 32, "depth": 2}})
    argv = ["--ckpt", str(ckpt), "--data", "digits", "--net", net, "--sigmas", "0.29", "--num-images", "100",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "the data's samples (1, 8, 8) are flattened to the model's (64,); the augmentation sees " \
           "them as (1, 8, 8) images" in out
    (row,) = json.loads((tmp_path / "out" / "icr_sweep.json").read_text())
    dm = DigitsDataModule()
    dm.setup("fit")
    flat = dm.train_data.reshape(len(dm.train_data), 64)
    expect = RepresentationEvaluation(flat, num_images=100, sigma=0.29, image_shape=(1, 8, 8)).evaluate(module)[0.29]
    assert row["icr"] == pytest.approx(float(expect["icr"]), rel=1e-5)
    assert row["probe_acc"] > 0.3  # digits labels: the probe ran (chance 0.1)
    # n = 100 view pairs < 4 d = 128: the estimate is flagged
    assert "warning: ICR from n = 100 view pairs in d = 32 feature dimensions (n < 4 d)" in err


def test_samples_of_another_size_are_refused_naming_data(flat_ckpt, tmp_path, capsys):
    ckpt, _ = flat_ckpt
    net = json.dumps({"class_path": "lightning_pfd.nets.MLPNet", "init_args": {"dim": 64, "hidden": 32, "depth": 2}})
    assert main(["--ckpt", str(ckpt), "--data", "digits", "--data-args", '{"image_size": 16}', "--net", net,
                 "--sigmas", "0.29", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--data: its samples have shape (1, 16, 16) but the checkpoint's model takes (64,)" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_reliability_warnings_follow_the_4d_rule():
    row = {"n": 128.0, "d": 32.0, "probe_acc": 0.5}
    assert reliability_warnings([row]) == []  # 128 = 4 d
    assert len(reliability_warnings([{**row, "n": 127.0}])) == 1
    assert reliability_warnings([{**row, "n": 64.0}], views_per_image=2) == []  # 128 view pairs
    assert reliability_warnings([{**row, "probe_acc": float("nan")}])[0].startswith("note: no linear probe")


def test_every_level_has_its_jackknife_se_and_a_minimum_at_the_edge_is_flagged(flat_ckpt, capsys):
    """Each row's ICR and standard error equal the ICRMonitor's (icr/icr, icr/icr_se) measured at
    that sigma alone; on a two-level grid the minimum is at an edge, which is flagged; with no
    --out the sweep goes beside the checkpoint (RUN/icr_sweep/<checkpoint name>)."""
    ckpt, module = flat_ckpt
    net = json.dumps({"class_path": "lightning_pfd.nets.MLPNet", "init_args": {"dim": 64, "hidden": 32, "depth": 2}})
    assert main(["--ckpt", str(ckpt), "--data", "digits", "--net", net, "--sigmas", "0.29", "0.1",
                 "--num-images", "100", "--probe-train", "64"]) == 0
    out, err = capsys.readouterr()
    where = ckpt.parent / "icr_sweep" / ckpt.stem
    rows = json.loads((where / "icr_sweep.json").read_text())
    assert [r["sigma"] for r in rows] == [0.1, 0.29]
    dm = DigitsDataModule()
    dm.setup("fit")
    flat = dm.train_data.reshape(len(dm.train_data), 64)
    for r in rows:
        expect = RepresentationEvaluation(flat, num_images=100, sigma=r["sigma"], image_shape=(1, 8, 8)).evaluate(module)[r["sigma"]]
        assert r["icr"] == pytest.approx(float(expect["icr"]), rel=1e-5)
        assert r["icr_se"] == pytest.approx(float(expect["icr_se"]), rel=1e-5) and r["icr_se"] > 0
        assert f"{r['icr']:.4f} ± {r['icr_se']:.4f}" in out
    side = "smallest" if rows[0]["icr"] < rows[1]["icr"] else "largest"
    assert f"warning: the ICR minimum is at the grid's {side} noise level" in err
    assert "at the grid's edge" in out and f"wrote {where / 'icr_sweep.csv'}" in out


def test_edge_minimum_and_default_output_folder(tmp_path):
    from argparse import Namespace

    from lightning_pfd.commands.icr_sweep import default_out, edge_minimum, output_dir

    def rows(values):
        return [{"sigma": s, "icr": v} for s, v in zip((0.05, 0.1, 0.29, 1.0), values)]

    assert edge_minimum(rows([0.9, 0.7, 0.8, 0.95])) is None  # interior minimum
    assert "smallest noise level (sigma = 0.05)" in edge_minimum(rows([0.5, 0.7, 0.8, 0.9]))
    assert "largest noise level (sigma = 1)" in edge_minimum(rows([0.9, 0.8, 0.7, 0.5]))
    assert default_out("runs/x/checkpoints/last.ckpt") == Path("runs/x/icr_sweep/last")
    assert default_out("elsewhere/m.ckpt") == Path("elsewhere/icr_sweep/m")
    args = Namespace(out=None, ckpt=str(tmp_path / "run/checkpoints/last.ckpt"), force=False)
    first = output_dir(args)
    assert first == tmp_path / "run/icr_sweep/last"
    first.mkdir(parents=True)
    (first / "icr_sweep.json").write_text("[]")
    assert output_dir(args) == tmp_path / "run/icr_sweep/last-2"  # an earlier sweep is kept
    assert output_dir(Namespace(**{**vars(args), "force": True})) == first
