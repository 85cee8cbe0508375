"""StageIV precipitation crops and synthetic heavy-tailed fields."""
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.io import netcdf_file

from lightning_pfd.data import HeavyTailedFieldDataModule, PrecipitationDataModule
from lightning_pfd.data.heavy import gaussian_random_field, heavy_tailed_fields
from lightning_pfd.data.precip import (STAGEIV_PATH, STAGEIV_VARIABLE, load_stageiv,
                                       log1p_inverse, log1p_transform, random_crops)


def test_shipped_file_and_licence():
    assert STAGEIV_PATH.exists()
    assert (STAGEIV_PATH.parent / "COPYRIGHT-stageiv_florence.txt").read_text().count("Apache-2.0")
    frames = load_stageiv()
    assert frames.shape == (23, 118, 87)
    # independent read of the raw file: the documented facts (DATA.md)
    with netcdf_file(str(STAGEIV_PATH), "r", mmap=False) as f:
        raw = np.array(f.variables[STAGEIV_VARIABLE].data, dtype=np.float64)
    assert abs(raw.max() - 163.75) < 1e-3
    assert 0.40 < (raw == 0).mean() < 0.46
    np.testing.assert_allclose(frames.numpy(), raw, rtol=0, atol=0)


def test_crops_are_exact_windows_and_seeded():
    frames = torch.arange(2 * 10 * 9, dtype=torch.float32).reshape(2, 10, 9)
    c = random_crops(frames, 50, 4, seed=3)
    assert c.shape == (50, 1, 4, 4)
    # each crop equals some window of some frame (brute force)
    windows = {tuple(frames[f, i:i + 4, j:j + 4].reshape(-1).tolist())
               for f in range(2) for i in range(7) for j in range(6)}
    assert all(tuple(x.reshape(-1).tolist()) in windows for x in c)
    torch.testing.assert_close(c, random_crops(frames, 50, 4, seed=3))
    assert not torch.equal(c, random_crops(frames, 50, 4, seed=4))
    with pytest.raises(ValueError, match="crop_size"):
        random_crops(frames, 5, 11, seed=0)


def test_log1p_roundtrip():
    p = torch.tensor([0.0, 0.3, 5.0, 163.75, 200.0, 500.0], dtype=torch.float64)
    y = log1p_transform(p, 200.0)
    assert float(y[0]) == -1.0 and abs(float(y[4]) - 1.0) < 1e-12
    torch.testing.assert_close(log1p_inverse(y, 200.0), p)
    assert float(log1p_inverse(torch.tensor([-3.0]), 200.0)) == 0.0  # below -1 -> dry


def test_datamodule_contract_and_split():
    dm = PrecipitationDataModule(crop_size=16, n_train=64, n_val=16, batch_size=8)
    dm.setup()
    assert dm.train_data.shape == (64, 1, 16, 16) and dm.train_data.dtype == torch.float32
    assert dm.val_data.shape == (16, 1, 16, 16) and dm.data_shape == (1, 16, 16)
    assert float(dm.train_data.min()) >= -1.0
    x, lab = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 1, 16, 16) and bool((lab == -1).all())
    # training crops come from the training frames only (time split)
    frames = load_stageiv()
    mm = dm.inverse_transform(dm.train_data)[:, 0]
    train_max = float(frames[:18].max())
    assert float(mm.max()) <= train_max + 1e-3
    assert len(dm.fingerprint()) > 10
    dm2 = PrecipitationDataModule(crop_size=16, n_train=64, n_val=16)
    dm2.setup()
    assert dm2.fingerprint() == dm.fingerprint()


@pytest.mark.parametrize("kwargs,match", [
    (dict(crop_size=100), "crop_size"), (dict(n_train=0), "n_train"), (dict(log_max=0.0), "log_max"),
    (dict(val_frames=[30]), "val_frames"), (dict(path="/nonexistent.nc"), "path"),
])
def test_precip_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrecipitationDataModule(**kwargs)


# ----------------------------------------------------------------------------- synthetic fields
def test_grf_pixels_are_standard_normal_and_correlated():
    z = gaussian_random_field(torch.arange(2000), size=16, slope=3.0)
    pix = z[:, 3, 5].numpy()
    assert stats.kstest(pix, "norm").pvalue > 1e-3
    near = np.corrcoef(z[:, 3, 5], z[:, 3, 6])[0, 1]
    far = np.corrcoef(z[:, 3, 5], z[:, 11, 13])[0, 1]
    assert near > 0.5 and abs(far) < near - 0.3


@pytest.mark.parametrize("marginal,dist", [
    ("gpd", stats.genpareto(c=1 / 2.5)), ("student_t", stats.t(df=2.5)),
])
def test_heavy_marginal_matches_scipy(marginal, dist):
    x = heavy_tailed_fields(torch.arange(3000), size=8, tail_index=2.5, marginal=marginal)
    assert x.shape == (3000, 1, 8, 8)
    assert stats.kstest(x[:, 0, 2, 6].numpy(), dist.cdf).pvalue > 1e-3
    # the upper tail is resolved (exact survival-function transform): P(X > q_0.999)
    q = dist.isf(1e-3)
    frac = float((x > q).double().mean())
    assert 0.5e-3 < frac < 1.6e-3


def test_tail_index_controls_the_tail():
    light = heavy_tailed_fields(torch.arange(500), size=16, tail_index=6.0)
    heavy = heavy_tailed_fields(torch.arange(500), size=16, tail_index=1.5)
    # field maxima: much heavier upper quantile for the smaller tail index
    assert float(heavy.amax((1, 2, 3)).quantile(0.99)) > 5 * float(light.amax((1, 2, 3)).quantile(0.99))


def test_heavy_datamodule_seeded_and_bad_input():
    dm = HeavyTailedFieldDataModule(size=8, n_train=32, n_val=8, scale=2.0)
    dm.setup()
    direct = heavy_tailed_fields(torch.arange(32), size=8) / 2.0
    torch.testing.assert_close(dm.train_data, direct.float())
    torch.testing.assert_close(dm.inverse_transform(dm.train_data), direct.float().double() * 2.0)
    with pytest.raises(ValueError, match="marginal"):
        HeavyTailedFieldDataModule(marginal="cauchy")
    with pytest.raises(ValueError, match="tail_index"):
        HeavyTailedFieldDataModule(tail_index=0.0)
    with pytest.raises(ValueError, match="overlap"):
        HeavyTailedFieldDataModule(n_train=10, n_val=10, val_seed_offset=5)


# ----------------------------------------------------------------------------- PITE configs / CLI
def test_pite_configs_share_net_and_data():
    import yaml

    from lightning_pfd.cli import CONFIG_DIR

    sbm = yaml.safe_load((CONFIG_DIR / "sbm_precip.yaml").read_text())
    lim = yaml.safe_load((CONFIG_DIR / "lim_precip.yaml").read_text())
    assert sbm["model"]["init_args"]["net"] == lim["model"]["init_args"]["net"]
    assert sbm["data"] == lim["data"]
    assert sbm["model"]["class_path"].endswith("DiffusionModule")
    assert lim["model"]["class_path"].endswith("LevyItoModule")


def test_pite_config_builds_through_the_cli(tmp_path):
    import sys
    from unittest import mock

    from lightning_pfd.experiments_cli import _cli_args, build_parser
    from lightning_pfd.lightning_cli import PFDLightningCLI
    from lightning_pfd.modules import LevyItoModule

    a = build_parser().parse_args(["--out", str(tmp_path), "--crop-size", "8", "--n-train", "16"])
    with mock.patch.object(sys, "argv", ["x"]):
        cli = PFDLightningCLI(args=_cli_args(a, "lim_precip", "lim"), run=False)
    assert isinstance(cli.model, LevyItoModule) and cli.model.alpha == 1.7
    assert cli.model.data_shape == (1, 8, 8) and cli.datamodule.crop_size == 8
    assert cli.model.hparams.lr == 1e-3 and cli.trainer.max_steps == a.max_steps


@pytest.mark.parametrize("argv", [["--eta", "1.5"], ["--max-steps", "0"], ["--num-samples", "0"],
                                  ["--crop-size", "-1"]])
def test_pite_cli_rejects_bad_args(argv, capsys):
    from lightning_pfd.cli import main

    assert main(["pite", *argv]) == 2
    assert argv[0] in capsys.readouterr().err
