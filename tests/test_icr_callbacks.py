"""ICRMonitor, MemorizationMonitor, ICREarlyStopping (+ checkpoint at the minimum), YAML stack."""
import math
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_pfd.callbacks import ICREarlyStopping, ICRMonitor, MemorizationMonitor
from lightning_pfd.evaluation.representation import RepresentationEvaluation, fixed_subset, sigma_leaf
from lightning_pfd.diffusion.augment import noisy_view
from lightning_pfd.diffusion.features import extract_features
from lightning_pfd.metrics import invariant_contamination_ratio
from scripted_icr import ScriptedICR, TinyModule

ROOT = Path(__file__).resolve().parents[1]


def _trainer(tmp_path, callbacks, max_epochs, logger=False, **kw):
    return pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=logger,
                      default_root_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, limit_train_batches=1, limit_val_batches=1,
                      num_sanity_val_steps=0, accelerator="cpu", devices=1, **kw)


# ----------------------------------------------------------------------------- scripted ICR curve
CURVE = [0.9, 0.7, 0.55, 0.5, 0.52, 0.51, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.0, 1.0]
# minimum 0.5 at epoch 3; patience 3 -> epochs 4, 5, 6 do not improve -> stop at epoch 6. These
# scripted curves have no per-unit records, so the tests of the patience features use plain
# patience (min_rise_z=None); the rise test is tested in tests/test_icr_early_stop.py


def _best_ckpt_epoch(ckpt: ModelCheckpoint) -> int:
    return torch.load(ckpt.best_model_path, weights_only=True)["epoch"]


def test_stops_after_patience_and_keeps_the_minimum(tmp_path):
    es = ICREarlyStopping(min_rise_z=None, patience=3)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="icr/icr", mode="min", save_top_k=1)
    logger = CSVLogger(tmp_path, name="csv")
    trainer = _trainer(tmp_path, [ScriptedICR(CURVE), es, ckpt], max_epochs=len(CURVE),
                       logger=logger)
    trainer.fit(TinyModule(batch=4))
    assert es.stopped_epoch == 6 and trainer.current_epoch == 7  # stopped after epoch 6
    assert es.best_epoch == 3 and float(es.best_score) == pytest.approx(0.5)
    assert float(ckpt.best_model_score) == pytest.approx(0.5)
    assert _best_ckpt_epoch(ckpt) == 3
    assert float(trainer.callback_metrics["icr/best_epoch"]) == 3
    logger.finalize("success")
    rows = list(csv_rows(Path(logger.log_dir) / "metrics.csv", "icr/best_epoch"))
    assert rows[-1] == 3.0 and rows[0] == 0.0


def test_dry_run_keeps_training_and_logs_where_it_would_have_stopped(tmp_path):
    """Observe mode: the same decision as a real stop (epoch 6 on CURVE), but every epoch runs;
    the checkpoint at the minimum is still the one kept."""
    es = ICREarlyStopping(min_rise_z=None, patience=3, dry_run=True)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="icr/icr", mode="min", save_top_k=1)
    logger = CSVLogger(tmp_path, name="csv")
    trainer = _trainer(tmp_path, [ScriptedICR(CURVE), es, ckpt], max_epochs=len(CURVE),
                       logger=logger)
    trainer.fit(TinyModule(batch=4))
    assert trainer.current_epoch == len(CURVE) and es.stopped_epoch == 0  # never stopped
    assert es.would_stop_epoch == 6 and es.best_epoch == 3
    assert _best_ckpt_epoch(ckpt) == 3
    assert float(trainer.callback_metrics["icr/stop_epoch"]) == 6
    logger.finalize("success")
    rows = list(csv_rows(Path(logger.log_dir) / "metrics.csv", "icr/stop_epoch"))
    assert rows[:6] == [-1.0] * 6 and rows[6:] == [6.0] * (len(CURVE) - 6)
    es2 = ICREarlyStopping(min_rise_z=None, patience=3, dry_run=True)
    es2.load_state_dict(es.state_dict())
    assert es2.would_stop_epoch == 6
    with pytest.raises(ValueError, match="dry_run"):
        ICREarlyStopping(dry_run="yes")


def csv_rows(path, column):
    import csv
    with open(path) as f:
        for row in csv.DictReader(f):
            if row.get(column):
                yield float(row[column])


def test_min_delta_ignores_tiny_improvements(tmp_path):
    curve = [1.0, 0.8, 0.79, 0.785, 0.9, 0.9, 0.9, 0.9]
    es = ICREarlyStopping(min_rise_z=None, patience=2, min_delta=0.05)
    trainer = _trainer(tmp_path, [ScriptedICR(curve), es], max_epochs=len(curve))
    trainer.fit(TinyModule(batch=4))
    assert es.best_epoch == 1 and es.stopped_epoch == 3


def test_smoothing_uses_the_ema_of_the_curve(tmp_path):
    curve = [1.0, 0.6, 0.9, 0.5, 0.8, 0.85, 0.9, 0.95, 1.0, 1.0]
    a = 0.5
    ema, best, best_epoch, wait, stop = None, math.inf, -1, 0, None
    for e, v in enumerate(curve):  # independent re-implementation of the rule
        ema = v if ema is None else a * ema + (1 - a) * v
        if ema < best:
            best, best_epoch, wait = ema, e, 0
        else:
            wait += 1
            if wait >= 2 and stop is None:
                stop = e
                break
    es = ICREarlyStopping(min_rise_z=None, patience=2, smoothing=a)
    trainer = _trainer(tmp_path, [ScriptedICR(curve), es], max_epochs=len(curve))
    trainer.fit(TinyModule(batch=4))
    assert es.best_epoch == best_epoch and es.stopped_epoch == stop
    assert float(es.best_score) == pytest.approx(best)
    assert float(trainer.callback_metrics["icr/icr_smooth"]) == pytest.approx(ema)


def test_state_survives_resume(tmp_path):
    # uninterrupted reference run
    ref_es = ICREarlyStopping(min_rise_z=None, patience=3, smoothing=0.3)
    _trainer(tmp_path / "ref", [ScriptedICR(CURVE), ref_es], max_epochs=len(CURVE)).fit(TinyModule(batch=4))
    # interrupted after epoch 7 (inside the patience window), then resumed from the checkpoint
    es1 = ICREarlyStopping(min_rise_z=None, patience=3, smoothing=0.3)
    last = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True, save_top_k=0)
    _trainer(tmp_path, [ScriptedICR(CURVE), es1, last], max_epochs=8).fit(TinyModule(batch=4))
    assert es1.wait_count == 2 and es1.stopped_epoch == 0 and ref_es.stopped_epoch == 8
    es2 = ICREarlyStopping(min_rise_z=None, patience=3, smoothing=0.3)
    best = ModelCheckpoint(dirpath=tmp_path / "ck2", monitor="icr/icr", mode="min", save_top_k=1)
    _trainer(tmp_path, [ScriptedICR(CURVE), es2, best], max_epochs=len(CURVE)).fit(
        TinyModule(batch=4), ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert es2.stopped_epoch == ref_es.stopped_epoch
    assert es2.best_epoch == ref_es.best_epoch
    assert es2.smoothed == pytest.approx(ref_es.smoothed)
    # plain state_dict round trip
    es3 = ICREarlyStopping(min_rise_z=None, patience=3, smoothing=0.3)
    es3.load_state_dict(es2.state_dict())
    assert es3.state_dict() == es2.state_dict()


NAN = float("nan")


@pytest.mark.parametrize("check_finite", [False, True])
def test_a_nan_icr_counts_as_no_improvement(tmp_path, check_finite):
    # minimum 0.6 at epoch 3 between NaN epochs (a diverged measurement): by default NaN is one
    # check without improvement (stop after 3 of them, at epoch 6, keeping epoch 3 as the best);
    # with check_finite=True Lightning's immediate stop at the first NaN (epoch 2)
    curve = [0.9, 0.7, NAN, 0.6, NAN, NAN, NAN, 0.5, 0.4, 0.3]
    es = ICREarlyStopping(min_rise_z=None, patience=3, check_finite=check_finite)
    _trainer(tmp_path, [ScriptedICR(curve), es], max_epochs=len(curve)).fit(TinyModule(batch=4))
    assert es.stopped_epoch == (2 if check_finite else 6)
    assert es.best_epoch == (1 if check_finite else 3)
    assert float(es.best_score) == pytest.approx(0.7 if check_finite else 0.6)


def test_early_stopping_bad_config():
    with pytest.raises(ValueError, match="smoothing"):
        ICREarlyStopping(smoothing=1.0)
    with pytest.raises(ValueError, match="patience"):
        ICREarlyStopping(min_rise_z=None, patience=0)
    with pytest.raises(ValueError, match="min_delta"):
        ICREarlyStopping(min_delta=-0.1)
    with pytest.raises(ValueError, match="mode"):
        ICREarlyStopping(mode="lowest")


# ----------------------------------------------------------------------------- ICRMonitor
class _DataModule(pl.LightningDataModule):
    def __init__(self, train, val=None):
        super().__init__()
        self.train_data, self.val_data = train, train[:8] if val is None else val
        self.data_shape = tuple(train.shape[1:])

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.train_data, torch.zeros(len(self.train_data))),
                          batch_size=32, shuffle=False)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.val_data, torch.zeros(len(self.val_data))),
                          batch_size=8)


def _mlp_module(dim=6, hidden=16, family="edm"):
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(dim=dim, hidden=hidden, depth=2), family=family, ema_decay=0.9)


def _unet_module():
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import UNet
    torch.manual_seed(0)
    net = UNet(img_resolution=8, in_channels=3, model_channels=8, channel_mult=[1, 2],
               num_blocks=1, attn_resolutions=[])
    return DiffusionModule(net, family="edm", ema_decay=0.9)


def _manual_icr(module, data, num_images, sigma, level, views_per_image=1, seed=0):
    """Independent re-assembly of the protocol from the pure pieces."""
    idx = fixed_subset(data.shape[0], num_images, seed)
    x0, seeds = data[idx], seed * 1_000_003 + idx
    h1s, h2s = [], []
    for k in range(views_per_image):
        h1s.append(extract_features(module.denoiser, noisy_view(x0, seeds, sigma, level, 2 * k), sigma))
        h2s.append(extract_features(module.denoiser, noisy_view(x0, seeds, sigma, level, 2 * k + 1), sigma))
    return invariant_contamination_ratio(torch.cat(h1s), torch.cat(h2s))


@pytest.mark.parametrize("kind", ["mlp", "unet"])
def test_icr_monitor_logs_the_protocol_value(tmp_path, kind):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        module, data = _mlp_module(), torch.randn(200, 6, generator=g)
    else:
        module, data = _unet_module(), torch.rand(120, 3, 8, 8, generator=g) * 2 - 1
    mon = ICRMonitor(num_images=96, sigma=0.29, sigmas=[1.0], views_per_image=2, batch_size=40)
    trainer = _trainer(tmp_path, [mon], max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=_DataModule(data))
    logged = trainer.callback_metrics
    expect = _manual_icr(module, data, 96, 0.29, 3, views_per_image=2)
    expect_hi = _manual_icr(module, data, 96, 1.0, 3, views_per_image=2)
    assert float(logged["icr/icr"]) == pytest.approx(float(expect["icr"]), rel=1e-5)
    assert float(logged["icr/trace_xi"]) == pytest.approx(float(expect["trace_xi"]), rel=1e-5)
    assert float(logged["icr/" + sigma_leaf(1.0)]) == pytest.approx(float(expect_hi["icr"]), rel=1e-5)
    assert float(logged["icr/n"]) == 96 and float(logged["icr/d"]) == float(expect["d"])
    assert [h["epoch"] for h in mon.history] == [0, 1]
    assert 0 < float(logged["icr/icr"]) <= 1


def test_icr_monitor_warns_when_n_is_small_and_projection_fixes_d(tmp_path):
    g = torch.Generator().manual_seed(2)
    data = torch.randn(40, 6, generator=g)
    module = _mlp_module(hidden=32)
    with pytest.warns(UserWarning, match="n < 4d"):
        _trainer(tmp_path, [ICRMonitor(num_images=40)], max_epochs=1).fit(
            module, datamodule=_DataModule(data))
    mon = ICRMonitor(num_images=40, d_proj=8)
    trainer = _trainer(tmp_path, [mon], max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=_DataModule(data))
    assert not [w for w in caught if "n < 4d" in str(w.message)]  # well posed now: 40 >= 4 * 8
    assert float(trainer.callback_metrics["icr/d"]) == 8


def _measure(mon, module, data):
    """The per-level results of ``mon``'s evaluation of ``module`` on ``data``."""
    mon.evaluation.bind(data)
    return mon.evaluation.evaluate(module)


def test_icr_monitor_vp_uses_same_sigma_space():
    g = torch.Generator().manual_seed(3)
    data = torch.randn(64, 6, generator=g)
    module = _mlp_module(family="vp")
    mon = ICRMonitor(num_images=64, sigma=0.29)
    got = _measure(mon, module, data)[0.29]
    expect = _manual_icr(module, data, 64, 0.29, 3)
    assert float(got["icr"]) == pytest.approx(float(expect["icr"]), rel=1e-6)


def test_icr_monitor_bad_config():
    from lightning_pfd.errors import ConfigError
    for kw, field in (({"num_images": 1}, "num_images"), ({"sigma": 0.0}, "sigma"),
                      ({"level": 7}, "level"), ({"d_proj": 0}, "d_proj"),
                      ({"views_per_image": 0}, "views_per_image"), ({"tau": -1.0}, "tau"),
                      ({"tau": "sometimes"}, "tau"), ({"cond_max": 0.0}, "cond_max"),
                      ({"vector_jitter": -0.1}, "vector_jitter")):
        with pytest.raises(ConfigError, match=field):
            ICRMonitor(**kw)


def test_icr_monitor_default_subset_is_4096_capped_at_n():
    """num_images=None (default): min(4096, N) -- the paper's 4096, or all N when N is smaller;
    an explicit value larger than N is still refused."""
    from lightning_pfd.evaluation.representation import DEFAULT_NUM_IMAGES, resolve_num_images
    from lightning_pfd.errors import ConfigError
    assert DEFAULT_NUM_IMAGES == 4096 and ICRMonitor().evaluation.num_images is None
    assert resolve_num_images(None, 50_000) == 4096 and resolve_num_images(None, 300) == 300
    assert resolve_num_images(128, 50_000) == 128
    g = torch.Generator().manual_seed(5)
    module = _mlp_module(dim=4, hidden=8)
    small = torch.randn(300, 4, generator=g)
    mon = ICRMonitor(batch_size=4096)
    mon.evaluation.bind(small)  # no refusal: the default adapts to N
    assert float(_measure(mon, module, small)[0.29]["n"]) == 300
    big = torch.randn(5000, 4, generator=g)
    out = _measure(mon, module, big)[0.29]
    assert float(out["n"]) == 4096
    ref = RepresentationEvaluation(big, num_images=4096, batch_size=4096).evaluate(module)[0.29]
    assert float(out["icr"]) == float(ref["icr"])  # the same fixed subset as an explicit 4096
    with pytest.raises(ConfigError, match="num_images"):
        ICRMonitor(num_images=301).evaluation.bind(small)


def test_icr_monitor_tau_rules_on_the_same_features():
    """The monitor's ICR uses tau="auto" by default; both rules are reported for the same
    features, and tau="relative" reproduces the former default."""
    g = torch.Generator().manual_seed(6)
    module, data = _mlp_module(dim=6, hidden=16), torch.randn(200, 6, generator=g)
    auto = RepresentationEvaluation(data, num_images=200).evaluate(module)[0.29]
    rel = RepresentationEvaluation(data, num_images=200, tau="relative").evaluate(module)[0.29]
    assert float(auto["tau"]) == 0.0 and float(auto["cond_xi"]) < 1e8
    assert float(auto["icr"]) == float(auto["icr_tau_auto"]) == float(rel["icr_tau_auto"])
    assert float(rel["icr"]) == float(rel["icr_tau_relative"]) == float(auto["icr_tau_relative"])
    assert float(rel["tau"]) > 0 and float(rel["icr"]) > float(auto["icr"])  # a ridge only adds


@pytest.mark.slow
def test_icr_monitor_ddp_spawn_matches_single_process(tmp_path):
    g = torch.Generator().manual_seed(4)
    data = torch.randn(101, 6, generator=g)  # odd subset: uneven shards
    module = _mlp_module()
    mon = ICRMonitor(num_images=101)
    trainer = pl.Trainer(max_epochs=1, callbacks=[mon], logger=False, default_root_dir=tmp_path,
                         enable_progress_bar=False, enable_model_summary=False,
                         limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                         accelerator="cpu", devices=2, strategy="ddp_spawn",
                         enable_checkpointing=False)
    dm = _DataModule(data)
    dm.setup("fit")
    mon.check_setup(trainer, module, dm)  # the command line's pre-flight: the copies are unbound
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    # ddp_spawn returns the trained weights to the main process: recompute single-process
    expect = RepresentationEvaluation(data, num_images=101).evaluate(module)[0.29]
    assert float(trainer.callback_metrics["icr/icr"]) == pytest.approx(float(expect["icr"]), rel=1e-5)
    assert float(trainer.callback_metrics["icr/n"]) == 101


# ----------------------------------------------------------------------------- MemorizationMonitor
class _CopyingModule(TinyModule):
    """generate(seeds): exact training copies for seeds divisible by 4, fresh noise otherwise;
    with ``nan``, NaN samples (diverged) for seeds = 1 mod 10."""

    def __init__(self, train, nan=False):
        super().__init__(batch=4)
        self.train_set, self.nan = train, nan

    def generate(self, seeds, batch_size=256):
        seeds = torch.as_tensor(seeds)
        g = torch.Generator().manual_seed(int(seeds.sum()))
        out = torch.randn(len(seeds), *self.train_set.shape[1:], generator=g, dtype=torch.float64) * 3
        copy = seeds % 4 == 0
        out[copy] = self.train_set[seeds[copy] % len(self.train_set)].double()
        if self.nan:
            out[seeds % 10 == 1] = float("nan")  # diverged samples
        return out


def test_memorization_monitor_counts_planted_copies(tmp_path):
    g = torch.Generator().manual_seed(5)
    train = torch.randn(50, 2, 3, 3, generator=g)
    mon = MemorizationMonitor(num_samples=40, every_n_epochs=2, seed=0)
    trainer = _trainer(tmp_path, [mon], max_epochs=3)
    trainer.fit(_CopyingModule(train), datamodule=_DataModule(train))
    seeds = torch.arange(40)
    assert float(trainer.callback_metrics["mem/ratio"]) == pytest.approx(float((seeds % 4 == 0).double().mean()))
    assert float(trainer.callback_metrics["mem/nonfinite"]) == 0.0  # always logged
    assert [h["epoch"] for h in mon.history] == [0, 2]


def test_memorization_monitor_with_some_nan_samples_logs_nan_not_a_ratio(tmp_path):
    # 4 of 40 samples are NaN: counting them as "not memorized" would log 0.225 instead of the
    # planted 0.25 -- a plausible, wrong number. The ratio is NaN and the fraction is logged.
    g = torch.Generator().manual_seed(5)
    train = torch.randn(50, 2, 3, 3, generator=g)
    mon = MemorizationMonitor(num_samples=40, every_n_epochs=1, seed=0)
    with pytest.warns(RuntimeWarning, match="non-finite samples"):
        _trainer(tmp_path, [mon], max_epochs=2).fit(_CopyingModule(train, nan=True),
                                                    datamodule=_DataModule(train))
    assert [math.isnan(h["mem/ratio"]) for h in mon.history] == [True, True]
    assert [h["mem/nonfinite"] for h in mon.history] == [pytest.approx(4 / 40)] * 2


def test_memorization_monitor_bad_config():
    with pytest.raises(ValueError, match="criterion"):
        MemorizationMonitor(criterion="ssim")
    with pytest.raises(ValueError, match="num_samples"):
        MemorizationMonitor(num_samples=0)
    with pytest.raises(ValueError, match="every_n_epochs"):
        MemorizationMonitor(every_n_epochs=0)


# ----------------------------------------------------------------------------- YAML stack
def test_representation_stack_yaml_instantiates():
    from jsonargparse import ArgumentParser
    from lightning.pytorch.callbacks import Callback as LCallback
    path = ROOT / "lightning_pfd" / "configs" / "callbacks" / "representation.yaml"
    spec = yaml.safe_load(path.read_text())
    parser = ArgumentParser()
    parser.add_argument("--callbacks", type=list[LCallback])
    cfg = parser.parse_args(["--callbacks", path.read_text()])
    cbs = parser.instantiate_classes(cfg).callbacks
    kinds = [getattr(c, "display_name", type(c).__name__) for c in cbs]
    assert kinds[:3] == ["ICRMonitor", "MemorizationMonitor", "ICREarlyStopping"]
    assert isinstance(cbs[3], ModelCheckpoint)  # ModelCheckpoint or the project's EpochCheckpoint
    assert cbs[3].monitor == "icr/icr" and cbs[3].mode == "min" and cbs[2].monitor == "icr/icr"
    assert len(spec) == 4


# ----------------------------------------------------------------------------- icr-sweep command
def test_icr_sweep_command(tmp_path, capsys):
    import json

    from lightning_pfd.commands.icr_sweep import main
    from lightning_pfd.data import DigitsDataModule
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    dm = DigitsDataModule(as_vector=True, batch_size=64)
    module = DiffusionModule(MLPNet(dim=64, hidden=32, depth=2))
    trainer = pl.Trainer(max_steps=5, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    net = json.dumps({"class_path": "lightning_pfd.nets.MLPNet",
                      "init_args": {"dim": 64, "hidden": 32, "depth": 2}})
    argv = ["--ckpt", str(tmp_path / "m.ckpt"), "--data", "digits", "--data-args",
            '{"as_vector": true}', "--net", net, "--sigmas", "5.0", "0.05", "--num-images", "256",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "out" / "icr_sweep.json").read_text())
    assert [r["sigma"] for r in rows] == [0.05, 5.0]
    assert (tmp_path / "out" / "icr_sweep.png").stat().st_size > 1000
    # ICR column = the monitor's measurement on the same data and weights
    dm.setup("fit")
    expect = RepresentationEvaluation(dm.train_data, num_images=256, sigma=0.05, sigmas=[5.0]).evaluate(module.eval())
    assert rows[0]["icr"] == pytest.approx(float(expect[0.05]["icr"]), rel=1e-5)
    assert rows[1]["icr"] == pytest.approx(float(expect[5.0]["icr"]), rel=1e-5)
    # the probe reads digits (chance = 0.1) at low noise and degrades at high noise
    assert rows[0]["probe_acc"] > 0.6 and rows[1]["probe_acc"] < rows[0]["probe_acc"]
    assert "ICR minimum at sigma" in capsys.readouterr().out
    assert main(["--ckpt", str(tmp_path / "missing.ckpt"), "--data", "digits"]) == 2
    assert "--ckpt" in capsys.readouterr().err
    assert main(argv[:4] + ["--sigmas", "-1"]) == 2
    # checks that need the loaded net / data, before the sweep runs
    assert main(argv[:-2] + ["--tap", "midle", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "--tap" in err and "did you mean 'middle'?" in err
    assert main(argv[:-4] + ["--num-images", "5000", "--out", str(tmp_path / "bad")]) == 2
    assert "--num-images" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_icr_monitor_image_shape_augments_flattened_images():
    from lightning_pfd.diffusion.augment import augment
    g = torch.Generator().manual_seed(6)
    images = torch.rand(64, 1, 8, 8, generator=g) * 2 - 1
    module = _mlp_module(dim=64)
    got = RepresentationEvaluation(images.reshape(64, 64), num_images=64, image_shape=(1, 8, 8), level=2).evaluate(module)
    idx = fixed_subset(64, 64, 0)
    x0, seeds = images[idx], idx
    views = [noisy_view(x0, seeds, 0.29, level=2, view=v).reshape(64, 64) for v in (0, 1)]
    expect = invariant_contamination_ratio(*(extract_features(module.denoiser, v, 0.29) for v in views))
    assert float(got[0.29]["icr"]) == pytest.approx(float(expect["icr"]), rel=1e-6)
    # the views really are flipped / shifted images, not noise-only
    assert not torch.equal(augment(x0, seeds, level=2), x0)
    with pytest.raises(ValueError, match="image_shape"):
        ICRMonitor(image_shape=(8, 8))
    with pytest.raises(ValueError, match="image_shape"):
        RepresentationEvaluation(images.reshape(64, 64), num_images=8, image_shape=(1, 4, 4)).evaluate(module)


class _EveryOther(Callback):
    """Logs a decreasing ICR only at even epochs (like ICRMonitor(every_n_epochs=2))."""

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch % 2 == 0:
            pl_module.log("icr/icr", torch.tensor(1.0 - 0.01 * trainer.current_epoch))


def test_early_stopping_ignores_epochs_without_a_fresh_value(tmp_path):
    # Lightning keeps the stale value in callback_metrics at odd epochs; counting it as "no
    # improvement" would stop this steadily improving run after patience = 2 stale checks.
    es = ICREarlyStopping(min_rise_z=None, patience=2, every_n_epochs=2)
    _trainer(tmp_path, [_EveryOther(), es], max_epochs=7).fit(TinyModule(batch=4))
    assert es.stopped_epoch == 0 and es.wait_count == 0 and es.best_epoch == 6
    # inferred from an ICRMonitor in the callbacks
    es2 = ICREarlyStopping(min_rise_z=None, patience=2)
    mon = ICRMonitor(every_n_epochs=3)
    mon.on_validation_epoch_end = lambda trainer, pl_module: None  # only its schedule matters
    mon.check_setup = mon.prepare = lambda *args: None  # TinyModule has no denoiser and no data
    _trainer(tmp_path, [_EveryOther(), mon, es2], max_epochs=1).fit(TinyModule(batch=4))
    assert es2._every == 3
    with pytest.raises(ValueError, match="every_n_epochs"):
        ICREarlyStopping(every_n_epochs=0)


class _CountingDescriptor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rows = 0

    def forward(self, x):
        self.rows += x.shape[0]
        return x.reshape(x.shape[0], -1)[:, :5] * 2.0


def test_memorization_monitor_caches_the_training_embedding_on_disk(tmp_path):
    g = torch.Generator().manual_seed(7)
    train = torch.randn(50, 2, 3, 3, generator=g)

    class _FingerprintedData(_DataModule):
        def fingerprint(self):
            return "train-50-seed7"

    ratios = []
    for run in range(2):
        desc = _CountingDescriptor()
        mon = MemorizationMonitor(num_samples=40, every_n_epochs=1, seed=0, descriptor=desc)
        trainer = _trainer(tmp_path / f"r{run}", [mon], max_epochs=1)
        trainer.fit(_CopyingModule(train), datamodule=_FingerprintedData(train))
        ratios.append(float(trainer.callback_metrics["mem/ratio"]))
        # run 0 embeds the 50 training rows; run 1 reads them from the cache (+ 2 rows of the
        # descriptor check and the 40 samples in both runs)
        assert desc.rows == (50 + 2 + 40 if run == 0 else 2 + 40)
    assert ratios[0] == ratios[1] == pytest.approx(10 / 40)
    files = list((Path(__import__("os").environ["LIGHTNING_PFD_CACHE"]) / "memorization").glob("*.pt"))
    assert len(files) == 1
    with pytest.raises(ValueError, match="descriptor"):
        MemorizationMonitor(descriptor="no_such_descriptor")
