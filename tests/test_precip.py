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
                                       log1p_inverse, log1p_transform, out_of_range_fraction,
                                       random_crops)
from lightning_pfd.errors import ConfigError


def test_shipped_file_and_licence():
    assert STAGEIV_PATH.exists()
    assert (STAGEIV_PATH.parent / "COPYRIGHT-stageiv_florence.txt").read_text().count("Apache-2.0")
    frames = load_stageiv()
    assert frames.shape == (23, 118, 87)
    # independent read of the raw file: the facts documented in lightning_pfd.data.precip
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


def test_out_of_range_policy_closed_form():
    """keep: y = 1 + d -> (1 + log_max)^(1 + d/2) - 1 (faithful extrapolation); clip: log_max.
    Below -1 is dry under both."""
    y = torch.tensor([-3.0, -1.0, 0.0, 1.0, 1.5, 3.0, 9.0], dtype=torch.float64)
    keep = log1p_inverse(y, 200.0)
    want = torch.tensor([0.0, 0.0, 201.0**0.5 - 1, 200.0, 201.0**1.25 - 1, 201.0**2 - 1,
                         201.0**5 - 1], dtype=torch.float64)
    torch.testing.assert_close(keep, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log1p_inverse(y, 200.0, out_of_range="keep"), keep)
    clip = log1p_inverse(y, 200.0, out_of_range="clip")
    torch.testing.assert_close(clip, torch.minimum(want, torch.tensor(200.0, dtype=torch.float64)))
    with pytest.raises(ConfigError, match="out_of_range"):
        log1p_inverse(y, 200.0, out_of_range="cap")


def test_out_of_range_fraction_counts():
    y = -torch.ones(4, 1, 2, 5, dtype=torch.float64) * 0.5    # 4 samples x 10 pixels
    y[0, 0, 0, 0] = 1.5          # sample 0: one pixel above
    y[0, 0, 1, 3] = 7.0          # ... and a second one
    y[2, 0, 1, 1] = 1.0          # exactly +1: inside
    y[2, 0, 0, 4] = -1.2         # below
    y[3, 0, 0, 0] = float("nan")
    y[3, 0, 0, 1] = float("inf")
    st = out_of_range_fraction(y)
    assert st["n_pixels"] == 40
    assert st["pixels_above"] == 2 / 40 and st["pixels_below"] == 1 / 40
    assert st["samples_above"] == 1 / 4 and st["nonfinite"] == 2 / 40 and st["max"] == 7.0
    assert out_of_range_fraction(y, -2.0, 10.0)["pixels_above"] == 0.0
    with pytest.raises(ConfigError, match="lo, hi"):
        out_of_range_fraction(y, 1.0, -1.0)
    with pytest.raises(ConfigError, match="y"):
        out_of_range_fraction(torch.zeros(0, 3))


def test_datamodule_out_of_range_policy():
    dm = PrecipitationDataModule(crop_size=8, n_train=8, n_val=0, out_of_range="clip")
    y = torch.tensor([[0.0, 1.0, 2.0]])
    assert float(dm.inverse_transform(y).max()) == pytest.approx(200.0)
    assert float(dm.inverse_transform(y, out_of_range="keep").max()) == pytest.approx(201.0**1.5 - 1)
    assert dm.out_of_range_stats(y)["pixels_above"] == pytest.approx(1 / 3)
    assert PrecipitationDataModule(crop_size=8, n_train=8).out_of_range == "keep"
    with pytest.raises(ConfigError, match="out_of_range"):
        PrecipitationDataModule(out_of_range="drop")


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
@pytest.mark.parametrize("pair", [("sbm_precip", "lim_precip"),
                                  ("experiments/pite_sbm", "experiments/pite_lim")])
def test_pite_configs_share_net_and_data(pair):
    import yaml

    from lightning_pfd.cli import CONFIG_DIR

    sbm = yaml.safe_load((CONFIG_DIR / f"{pair[0]}.yaml").read_text())
    lim = yaml.safe_load((CONFIG_DIR / f"{pair[1]}.yaml").read_text())
    assert sbm["model"]["init_args"]["net"] == lim["model"]["init_args"]["net"]
    assert sbm["data"] == lim["data"]
    assert sbm["model"]["class_path"].endswith("DiffusionModule")
    assert lim["model"]["class_path"].endswith("LevyItoModule")
    assert sbm["model"]["init_args"]["family"] == "edm"  # VP only as the documented extra row
    li = lim["model"]["init_args"]
    assert li["parameterization"] == "x0" and li["sampler"] == "heun" and li["time_grid"] == "edm"
    assert li["num_steps"] >= 100
    for k in ("lr", "ema_decay", "warmup_steps"):
        assert sbm["model"]["init_args"][k] == li[k]


def test_pite_config_builds_through_the_cli(tmp_path):
    import sys
    from unittest import mock

    from lightning_pfd.commands.pite import _cli_args, _rows, build_parser
    from lightning_pfd.launch.cli import PFDLightningCLI
    from lightning_pfd.modules import DiffusionModule, LevyItoModule

    a = build_parser().parse_args(["--out", str(tmp_path), "--crop-size", "8", "--n-train", "16",
                                   "--sbm-families", "edm,vp", "--lim-steps", "7"])
    rows = _rows(a)
    assert [r[0] for r in rows] == ["sbm_edm", "sbm_vp", "lim"]
    built = {}
    for name, cfg, extra in rows:
        with mock.patch.object(sys, "argv", ["x"]):
            built[name] = PFDLightningCLI(args=_cli_args(a, cfg, name, extra), run=False)
    lim = built["lim"].model
    assert isinstance(lim, LevyItoModule) and lim.alpha == 1.7 and lim.parameterization == "x0"
    assert lim.hparams.sampler == "heun" and lim.hparams.time_grid == "edm"
    assert lim.hparams.num_steps == 7
    assert lim.data_shape == (1, 8, 8) and built["lim"].datamodule.crop_size == 8
    assert built["lim"].trainer.max_steps == 1500  # the config's
    for q in ("edm", "vp"):
        m = built[f"sbm_{q}"].model
        assert isinstance(m, DiffusionModule) and m.hparams.family == q
        assert m.hparams.lr == lim.hparams.lr


def test_pite_scale_aware_row_and_alpha(tmp_path):
    import sys
    from unittest import mock

    from lightning_pfd.commands.pite import _cli_args, _label, _rows, build_parser
    from lightning_pfd.launch.cli import PFDLightningCLI

    a = build_parser().parse_args(["--out", str(tmp_path), "--crop-size", "8", "--n-train", "16",
                                   "--scale-aware-row", "--alpha", "1.5"])
    rows = _rows(a)
    assert [r[0] for r in rows] == ["sbm_edm", "lim", "lim_x0A"]
    name, cfg, extra = rows[2]
    with mock.patch.object(sys, "argv", ["x"]):
        m = PFDLightningCLI(args=_cli_args(a, cfg, name, extra), run=False).model
    assert m.parameterization == "x0_A" and m.alpha == 1.5
    assert m.truncation("generate") == {"clamp_A": None, "reject_A": 20.0}
    assert "scale-aware" in _label({"alpha": 1.5}, "lim_x0A")


def test_pite_table_and_observable_parsing():
    from lightning_pfd.commands.pite import RUN_METRICS, claims, summarize, verdict
    from lightning_pfd.commands.pite import format_table, parse_observable

    assert parse_observable("max") == ("max", "max", {})
    assert parse_observable("exceedance:threshold=25") == ("exceedance:threshold=25", "exceedance",
                                                           {"threshold": 25.0})
    for bad in ("maxx", "exceedance:threshold"):
        with pytest.raises(ConfigError, match="--observable"):
            parse_observable(bad)
    # verdicts: every seed of one row below every seed of the other, else undecided
    assert verdict([1.0, 2.0], [3.0, 2.5]) == "holds" and verdict([3.0, 4.0], [1.0, 2.9]) == "reversed"
    assert verdict([1.0, 3.0], [2.0, 4.0]) == "undecided" and verdict([1.0, math.nan], [5.0]) == "undecided"
    sm = summarize([1.0, 2.0, 6.0])
    assert sm["mean"] == 3.0 and sm["sd"] == pytest.approx(math.sqrt(7.0)) and sm["median"] == 2.0
    assert (sm["min"], sm["max"], sm["values"]) == (1.0, 6.0, [1.0, 2.0, 6.0])
    rows, seeds = ["sbm_edm", "lim"], [0, 1]
    oor = {"pixels_above": 0.001, "pixels_below": 0.1, "samples_above": 0.05, "nonfinite": 0.0,
           "max": 2.5, "n_pixels": 10}
    vals = {"sbm_edm": {"rmsqe": [1.0, 2.0], "loader": [5.0, 6.0], "bulk_qe": [0.1, 0.2]},
            "lim": {"rmsqe": [3.0, 4.0], "loader": [1.0, 2.0], "bulk_qe": [0.15, 0.3]}}
    runs = {r: {str(sd): {"out_of_range": oor, "metrics": {"max": {
        m: vals[r].get(m, [0.5, 0.5])[i] for m in RUN_METRICS}}} for i, sd in enumerate(seeds)}
        for r in rows}
    res = {"rows": rows, "observables": ["max"], "eta": 0.975, "alpha": 1.7, "out_of_range": "keep",
           "train_seeds": seeds, "num_samples": 16, "n_ref": 40, "runs": runs,
           "lim_truncation": "A >= 20 rejected",
           "summary": {"max": {r: {m: summarize(runs[r][str(sd)]["metrics"]["max"][m] for sd in seeds)
                                   for m in RUN_METRICS} for r in rows}},
           "floor": {"max": {"rmsqe": 0.5, "loader": 1.5, "bulk_qe": 0.01}},
           "quantiles": {"max": {k: [1.0, 2.0, 3.0, 4.0, 5.0] for k in ["data"] + rows}},
           "hill": {"max": [{"k": 2, "alpha": 2.5, "se": 0.5, "threshold": 1.0}]}}
    res["claims"] = claims(res)
    c = res["claims"]["max"]
    # two seeds per row: the every-seed rule separates, the exact test cannot (p >= 1/3)
    assert c["lim_rmsqe"]["all_seeds"] == "reversed" and c["lim_loader"]["all_seeds"] == "holds"
    assert c["sbm_bulk"]["all_seeds"] == "undecided"
    assert c["lim_loader"]["verdict"] == "undecided" and c["lim_loader"]["p"] == pytest.approx(1 / 3)
    assert c["lim_loader"]["prob_better"] == 1.0 and c["lim_loader"]["design"] == "unpaired"
    assert c["lim_loader"]["ratio"] == pytest.approx(math.exp(np.median(np.log([[1 / 5, 1 / 6], [2 / 5, 2 / 6]]))))
    t = format_table(res)
    assert "| RMSQE (blog, no root) (eta = 0.975) | 1.5 ± 0.707 [1, 2] | 3.5 ± 0.707 [3, 4] | 0.5 |" in t
    assert "SBM (EDM)" in t and "LIM (alpha = 1.7, A >= 20 rejected)" in t
    assert "- LIM better in LOADER [lim vs sbm_edm]: **undecided (p = 0.33)**" in t and "k = 2: 2.5 ± 0.5" in t
    assert "every-seed rule: holds" in t
    assert "| pixels > +1 | 0.1 % | 0.1 % |" in t and "| samples with a pixel > +1 | 5 % | 5 % |" in t
    res["runs"]["lim"]["1"]["out_of_range"] = None  # data without a training range
    assert "| pixels > +1 | 0.1 % | n/a |" in format_table(res)


def test_pite_claims_are_exact_tests_with_five_seeds():
    """Five seeds per row: LIM rows against SBM by the exact Mann-Whitney test (separated rows:
    p = 2/252, "holds" / "reversed" at 0.05), lim_ref against lim by the exact sign-flip test
    of the per-seed log ratios (paired; with 5 pairs p >= 1/16: undecided at 0.05); Holm over
    every claim; the verdict words are the test's."""
    from lightning_pfd.commands.pite import RUN_METRICS, claims, format_table, summarize
    from lightning_pfd.metrics.seed_tests import compare, holm

    rows, seeds = ["sbm_edm", "lim", "lim_ref"], [0, 1, 2, 3, 4]
    base = {"sbm_edm": [10.0, 12.0, 9.0, 11.0, 30.0], "lim": [100.0, 90.0, 95.0, 300.0, 80.0],
            "lim_ref": [101.0, 91.0, 97.0, 301.0, 82.0]}
    runs = {r: {str(sd): {"out_of_range": None, "metrics": {"max": {
        m: base[r][i] * (1 if m != "loader" else -1 if r == "sbm_edm" else 1) + (50 if m == "loader" else 0)
        for m in RUN_METRICS}}} for i, sd in enumerate(seeds)} for r in rows}
    res = {"rows": rows, "observables": ["max"], "train_seeds": seeds,
           "summary": {"max": {r: {m: summarize(runs[r][str(sd)]["metrics"]["max"][m] for sd in seeds)
                                   for m in RUN_METRICS} for r in rows}}}
    c = claims(res)["max"]
    assert c["lim_rmsqe"]["verdict"] == "reversed" and c["lim_rmsqe"]["p"] == pytest.approx(2 / 252)
    assert c["sbm_bulk"]["verdict"] == "holds" and c["sbm_bulk"]["prob_better"] == 1.0
    assert c["lim_rmsqe@lim_ref"]["verdict"] == "reversed"
    ref = c["ref_rmsqe"]  # lim_ref 1-2 % above lim in every seed: paired, p = 2/32
    assert ref["design"] == "paired" and ref["verdict"] == "undecided" and ref["p"] == pytest.approx(2 / 32)
    assert ref == {**ref, **{k: v for k, v in compare(base["lim_ref"], base["lim"], "paired").items()
                             if k in ("p", "p_other", "ratio", "prob_better")}}
    flat = list(c.values())
    assert [x["p_holm"] for x in flat] == pytest.approx(holm([x["p"] for x in flat]))
    res.update({"eta": 0.975, "alpha": 1.7, "out_of_range": "keep", "num_samples": 16, "n_ref": 40,
                "runs": runs, "floor": {"max": {"rmsqe": 1.0, "loader": 1.0, "bulk_qe": 1.0}},
                "quantiles": {"max": {k: [1.0] * 5 for k in ["data"] + rows}}, "claims": {"max": c}})
    t = format_table(res)
    assert "- LIM better in RMSQE [lim vs sbm_edm]: **reversed (p = 0.0079)**" in t
    assert "[lim_ref vs lim]: **undecided (p = 0.062)**" in t and "A scaled as the LIM reference code" in t


def test_pite_reference_row_builds_the_reference_noise(tmp_path):
    """--reference-row adds lim_ref: the LIM config with a_scale=lim_reference (and the same
    rejection threshold, now on the scaled A)."""
    import sys
    from unittest import mock

    from lightning_pfd.commands.pite import _cli_args, _rows, build_parser
    from lightning_pfd.launch.cli import PFDLightningCLI

    a = build_parser().parse_args(["--out", str(tmp_path), "--crop-size", "8", "--n-train", "16",
                                   "--reference-row", "--scale-aware-row"])
    rows = _rows(a)
    assert [r[0] for r in rows] == ["sbm_edm", "lim", "lim_ref", "lim_x0A"]
    with mock.patch.object(sys, "argv", ["x"]):
        m = PFDLightningCLI(args=_cli_args(a, rows[2][1], "lim_ref", rows[2][2]), run=False).model
    assert m.a_scale == "lim_reference" and m.parameterization == "x0"
    assert m.truncation("train") == {"clamp_A": None, "reject_A": 20.0}


def test_cli_refuses_clamp_eps_with_x0_A(capsys, tmp_path):
    """The refusal reaches the command line: a config with parameterization x0_A and clamp_eps
    fails before training (status 2), naming both."""
    from lightning_pfd.cli import main

    argv = ["pite", "--seeds", "0", "--crop-size", "8", "--n-train", "16", "--num-samples", "8",
            "--scale-aware-row", "--lim-override=--model.init_args.clamp_eps=3.0", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "clamp_eps" in err and "x0_A" in err


def test_pite_out_of_range_uses_the_datamodules_range():
    from lightning_pfd.commands.pite import _out_of_range

    y = torch.tensor([[0.0, 1.5, -2.0, 0.5]])
    pre = PrecipitationDataModule(crop_size=8, n_train=8, n_val=0)
    assert _out_of_range(pre, y)["pixels_above"] == 0.25
    heavy = HeavyTailedFieldDataModule(size=8, n_train=8, n_val=4, value_range=None)
    assert _out_of_range(heavy, y) is None
    ranged = HeavyTailedFieldDataModule(size=8, n_train=8, n_val=4, value_range=(-3.0, 3.0))
    assert _out_of_range(ranged, y)["pixels_above"] == 0.0


@pytest.mark.parametrize("argv", [["--eta", "1.5"], ["--max-steps", "0"], ["--num-samples", "0"],
                                  ["--crop-size", "-1"], ["--sbm-families", "edn"],
                                  ["--sbm-families", "edm,edm"], ["--observable", "maxx"],
                                  ["--lim-steps", "0"], ["--seeds", "1,1"], ["--seeds", "a"],
                                  ["--alpha", "0.9"], ["--rows", "lim_ref"], ["--rows", "sbm"],
                                  ["--merge", "/nonexistent/pite_run"]])
def test_pite_cli_rejects_bad_args(argv, capsys):
    from lightning_pfd.cli import main

    assert main(["pite", *argv]) == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.slow
def test_pite_table_is_the_functional_metrics_of_its_observables(tmp_path):
    """A tiny end-to-end pite run with two training seeds: every score of its table is
    recomputed from the saved observables with the functional metrics (same-law floors on 8
    seeded reference splits with n_gen = --num-samples, models scored against the same splits'
    rest; non-finite dropped), the summaries are the mean / sd over the seeds."""
    import json

    from lightning_pfd.cli import main
    from lightning_pfd.commands.pite import format_table
    from lightning_pfd.metrics.tails import (loader_settings, matched_rmsqe_contributions,
                                             matched_score, quantile_step_integral,
                                             reference_splits, same_law_floor)

    out = tmp_path / "pite"
    argv = ["pite", "--crop-size", "8", "--n-train", "40", "--num-samples", "16", "--max-steps", "2",
            "--model-channels", "8", "--num-blocks", "1", "--lim-steps", "3", "--floor", "2e-3",
            "--seeds", "0,3", "--alpha", "1.6",
            "--override=--model.init_args.num_steps=3", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    obs = torch.load(out / "observables.pt")
    assert res["rows"] == ["sbm_edm", "lim"] and res["n_ref"] == 40 and res["train_seeds"] == [0, 3]
    assert res["alpha"] == 1.6
    for o in res["observables"]:
        ref = obs[o]["data"]
        assert ref.shape == (40,)
        kw = {"rmsqe": dict(eta=0.975), "loader": loader_settings(ref, floor=2e-3)}
        for k in ("rmsqe", "loader"):
            assert res["floor"][o][k] == pytest.approx(
                float(same_law_floor(ref, k, 8, 0, 16, **kw[k])), rel=1e-12)
        splits = reference_splits(40, 16, 8, 0)
        rest = [b for _, b in splits]
        assert res["floor"][o]["bulk_qe"] == pytest.approx(np.mean(
            [quantile_step_integral(ref[a].numpy(), ref[b].numpy(), 0, 0.975) for a, b in splits]), rel=1e-12)
        for r in res["rows"]:
            for sd in (0, 3):
                g = obs[o][f"{r}/seed{sd}"]
                got = res["runs"][r][str(sd)]["metrics"][o]
                for k in ("rmsqe", "loader"):
                    want = float(matched_score(g, ref, k, 8, 0, 16, **kw[k])) if g.numel() else math.nan
                    assert got[k] == pytest.approx(want, rel=1e-12, nan_ok=True)
                assert got["nonfinite"] == 1 - g.numel() / 16
                # the range diagnostics use the datamodule's declared range [-1, 1]
                assert got["above_range"] == res["runs"][r][str(sd)]["out_of_range"]["samples_above"]
                if g.numel():
                    bulk = np.mean([quantile_step_integral(g.numpy(), ref[b].numpy(), 0, 0.975) for b in rest])
                    assert got["bulk_qe"] == pytest.approx(bulk, rel=1e-12)
                    c = matched_rmsqe_contributions(g, ref, 8, 0, 16, eta=0.975)
                    assert got["rmsqe_top_share"] == pytest.approx(float(c.max() / c.sum()), rel=1e-12,
                                                                   nan_ok=True)
            vals = [res["runs"][r][str(sd)]["metrics"][o]["loader"] for sd in (0, 3)]
            assert res["summary"][o][r]["loader"]["mean"] == pytest.approx(np.mean(vals), rel=1e-12)
            assert res["summary"][o][r]["loader"]["sd"] == pytest.approx(np.std(vals, ddof=1), abs=1e-12)
    assert (out / "table.md").read_text() == format_table(res) + "\n"
    # --merge of the run split by seed (one directory per seed) gives back the same record
    for sd in (0, 3):
        part = tmp_path / f"part{sd}"
        part.mkdir()
        rec = {**res, "runs": {r: {str(sd): res["runs"][r][str(sd)]} for r in res["rows"]}}
        (part / "results.json").write_text(json.dumps(rec))
        torch.save({o: {k: v for k, v in obs[o].items() if k == "data" or k.endswith(f"seed{sd}")}
                    for o in obs}, part / "observables.pt")
    merged_out = tmp_path / "merged"
    assert main(["pite", "--merge", f"{tmp_path / 'part0'},{tmp_path / 'part3'}", "--out", str(merged_out)]) == 0
    merged = json.loads((merged_out / "results.json").read_text())
    assert merged["train_seeds"] == [0, 3] and merged["rows"] == res["rows"]
    for k in ("summary", "floor", "quantiles", "claims", "hill"):
        assert json.dumps(merged[k]) == json.dumps(res[k]), k
    # the data's tail index on non-overlapping tiles of the training frames (one value per tile)
    hi = res["hill_images"]["max"]
    assert "non-overlapping 8x8 tiles of the 18 training frames" in hi["description"]
    assert all(e["lo"] <= e["hi"] and e["groups"] == 18 for e in hi["estimates"])
    # --rescore recomputes claims, tail indices and the table from results.json: the same
    assert main(["pite", "--rescore", "--out", str(out)]) == 0
    again = json.loads((out / "results.json").read_text())
    assert json.dumps(again["claims"]) == json.dumps(res["claims"])  # (NaN-safe comparison)
    assert json.dumps(again["hill_images"]) == json.dumps(res["hill_images"])
    assert (out / "table.md").read_text() == format_table(res) + "\n"
    assert (out / "density.png").stat().st_size > 0