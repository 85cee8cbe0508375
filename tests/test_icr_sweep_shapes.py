"""icr-sweep on a checkpoint whose model takes flattened images (the quickstart's MLP) with image
data (``--data digits``): flattened as the model expects, augmented as images, equal to the
monitor on the same flattened data with ``image_shape``; a warning when n < 4d; samples of
another size refused naming --data."""
from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_pfd.callbacks import ICRMonitor
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
    expect = ICRMonitor(num_images=100, sigma=0.29, image_shape=(1, 8, 8)).measure(module, flat)[0.29]
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
