"""The monitors' check_setup (ConfigError before training), NaN-safe metrics and state keys.

* every ``check_setup`` case raises :class:`ConfigError` naming the field (tap, image_shape,
  module type, world size, data sizes, same-law floor, one PF-ODE grid, descriptor, duplicate
  metric keys, early-stopping monitor) -- and a compatible setup passes;
* a denoiser whose weights are NaN gives NaN metrics and ``*/nonfinite`` = 1.0, no exception,
  one warning; a finite one logs ``*/nonfinite`` = 0.0; a partly non-finite student gives NaN,
  not a number over the finite part; under DDP a NaN on one rank only sends both ranks down the
  same branch (no hang);
* two ICRMonitors (other sigma, other name) log distinct keys and save / restore their own state;
* ``icr-sweep`` validates its arguments before loading anything.
"""
import math
import warnings
from datetime import timedelta
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_pfd.callbacks import (GeneralizationMonitor, ICREarlyStopping, ICRMonitor,
                                     MemorizationMonitor, TailMonitor)
from lightning_pfd.data import TeacherDistillationDataModule, TensorDataModule
from lightning_pfd.diffusion import EDMFamily, GaussianDenoiser, karras_sigmas, sample_endpoints
from lightning_pfd.errors import ConfigError
from lightning_pfd.metrics import InvariantContaminationRatio, ProbabilityFlowDistance
from lightning_pfd.metrics.icr import generalized_eigenvalues
from lightning_pfd.modules import DiffusionModule, LevyItoModule
from lightning_pfd.nets import MLPNet, UNet

D = 3
GAUSS = {"mean": [0.5, -0.3], "cov": [[1.0, 0.3], [0.3, 0.5]]}


def _data(n, seed=0, d=D):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * 0.5


def _dm(n=24, n_val=8, d=D, **kw):
    dm = TensorDataModule(train_data=_data(n, 0, d), val_data=_data(n_val, 1, d) if n_val else None,
                          batch_size=8, value_range=None, **kw)
    dm.setup("fit")
    return dm


def _module(family="edm", d=D, hidden=8, **kw):
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(d, hidden=hidden, depth=1, emb_dim=8), family=family, num_steps=3,
                           ema_decay=0.9, **kw)


def _world(n, callbacks=()):
    """The part of a Trainer that check_setup reads."""
    return SimpleNamespace(world_size=n, callbacks=list(callbacks))


def _trainer(tmp_path, callbacks, **kw):
    args = dict(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    args.update(kw)
    return pl.Trainer(callbacks=callbacks, **args)


def _refused(callback, trainer, module, dm, field):
    """check_setup raises ConfigError naming ``field`` (the callback's own argument, or
    ``model.<arg>`` for the model's; the command line adds the config path); returns the error."""
    with pytest.raises(ConfigError) as err:
        callback.check_setup(trainer, module, dm)
    assert err.value.field == field, err.value.field
    return err.value


class _NoGenerate(pl.LightningModule):
    """A module with neither a denoiser nor generate()."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))


# ----------------------------------------------------------------------------- ICRMonitor
def test_icr_unknown_tap_lists_the_net_taps_and_suggests_the_closest():
    module, dm = _module(), _dm()
    err = _refused(ICRMonitor(num_images=8, tap="midle"), _world(1), module, dm, "tap")
    assert err.accepted == sorted(module.net.feature_taps) and "middle" in err.accepted
    assert err.suggestion == "did you mean 'middle'?"
    ICRMonitor(num_images=8, tap="block0").check_setup(_world(1), module, dm)  # a real tap passes
    torch.manual_seed(0)
    unet = DiffusionModule(UNet(img_resolution=8, in_channels=1, model_channels=8, channel_mult=[1, 2],
                                num_blocks=1, attn_resolutions=[]))
    images = TensorDataModule(train_data=torch.rand(12, 1, 8, 8) * 2 - 1, batch_size=4)
    images.setup("fit")
    err = _refused(ICRMonitor(num_images=8, tap="dec.8x8_blok0"), _world(1), unet, images, "tap")
    assert err.accepted == sorted(unet.net.feature_taps) and "dec.8x8_block0" in err.suggestion


def test_icr_image_shape_numel_must_match_the_samples():
    module, dm = _module(d=16), _dm(d=16)
    err = _refused(ICRMonitor(num_images=8, image_shape=(1, 3, 3)), _world(1), module, dm, "image_shape")
    assert "(16,)" in err.problem
    ICRMonitor(num_images=8, image_shape=(1, 4, 4)).check_setup(_world(1), module, dm)
    # too small for the crop augmentation, although the size matches
    _refused(ICRMonitor(num_images=8, image_shape=(4, 2, 2)), _world(1), module, dm, "image_shape")


def test_icr_sizes_noise_range_and_projection():
    module, dm = _module(hidden=8), _dm(n=24)
    err = _refused(ICRMonitor(num_images=30), _world(1), module, dm, "num_images")
    assert "24" in err.problem
    _refused(ICRMonitor(num_images=3), _world(4), module, dm, "num_images")
    ICRMonitor(num_images=4).check_setup(_world(4), module, dm)
    vp = _module(family="vp")
    _refused(ICRMonitor(num_images=8, sigma=500.0), _world(1), vp, dm, "sigma")
    _refused(ICRMonitor(num_images=8, sigmas=[1e-5]), _world(1), vp, dm, "sigmas")
    err = _refused(ICRMonitor(num_images=8, d_proj=16), _world(1), module, dm, "d_proj")
    assert "d = 8" in err.problem  # MLPNet(hidden=8): 8 features at every tap
    ICRMonitor(num_images=8, d_proj=8).check_setup(_world(1), module, dm)


# ----------------------------------------------------------------------------- module types
@pytest.mark.parametrize("make", [lambda: ICRMonitor(num_images=8),
                                  lambda: GeneralizationMonitor(num_eval=4, use_cache=False)],
                         ids=["icr", "generalization"])
def test_sigma_space_monitors_refuse_a_levy_module_and_say_what_works(make):
    levy = LevyItoModule(MLPNet(D, hidden=8, depth=1, emb_dim=8), alpha=1.7)
    err = _refused(make(), _world(1), levy, _dm(), "model")
    assert err.value == "LevyItoModule" and "DiffusionModule" in str(err.accepted)
    assert "TailMonitor" in err.suggestion


def test_sampling_monitors_accept_levy_but_need_generate():
    levy = LevyItoModule(MLPNet(D, hidden=8, depth=1, emb_dim=8), alpha=1.7)
    dm = _dm()
    MemorizationMonitor(num_samples=4).check_setup(_world(1), levy, dm)
    TailMonitor(num_samples=8, eta=0.5, num_steps=3).check_setup(_world(1), levy, dm)
    for cb in (MemorizationMonitor(num_samples=4), TailMonitor(num_samples=8, eta=0.5)):
        err = _refused(cb, _world(1), _NoGenerate(), dm, "model")
        assert "LevyItoModule" in str(err.accepted)


def test_tail_num_steps_needs_a_generate_that_takes_it():
    class _Fixed(_NoGenerate):
        def generate(self, seeds, batch_size=256):
            return torch.zeros(len(seeds), D)

    dm = _dm()
    TailMonitor(num_samples=8, eta=0.5).check_setup(_world(1), _Fixed(), dm)
    _refused(TailMonitor(num_samples=8, eta=0.5, num_steps=5), _world(1), _Fixed(), dm, "num_steps")


# ----------------------------------------------------------------------------- sizes vs world / data
@pytest.mark.parametrize("make, field", [
    (lambda: GeneralizationMonitor(num_eval=3, use_cache=False), "num_eval"),
    (lambda: MemorizationMonitor(num_samples=3), "num_samples"),
    (lambda: TailMonitor(num_samples=3, eta=0.5), "num_samples"),
], ids=["generalization", "memorization", "tail"])
def test_fewer_evaluations_than_ranks_are_refused(make, field):
    module, dm = _module(), _dm()
    err = _refused(make(), _world(4), module, dm, field)
    assert "world size 4" in err.problem
    make().check_setup(_world(3), module, dm)


def test_generalization_num_eval_within_the_reserved_range():
    module, dm = _module(), _dm()
    dm.n_gen = 10
    err = _refused(GeneralizationMonitor(num_eval=11, use_cache=False), _world(1), module, dm, "num_eval")
    assert "n_gen = 10" in err.problem
    GeneralizationMonitor(num_eval=10, use_cache=False).check_setup(_world(1), module, dm)


def test_tail_same_law_floor_needs_more_reference_than_generated_samples():
    module, dm = _module(), _dm(n=24, n_val=8)
    err = _refused(TailMonitor(num_samples=24, eta=0.5), _world(1), module, dm, "num_samples")
    assert "same-law floor" in err.problem
    TailMonitor(num_samples=23, eta=0.5).check_setup(_world(1), module, dm)
    _refused(TailMonitor(num_samples=8, eta=0.5, reference="val"), _world(1), module, dm, "num_samples")
    err = _refused(TailMonitor(num_samples=4, eta=0.5, reference="val"), _world(1), module, _dm(n_val=0),
                   "reference")
    assert err.accepted == ["train"]
    # the blog's RMSQE integrates up to u = 1 (the sample maxima): any sample size works
    TailMonitor(num_samples=2, eta=0.975)


def test_tail_observable_must_give_one_value_per_sample():
    from lightning_pfd.metrics.observables import OBSERVABLES, register_observable

    if "test_identity_obs" not in OBSERVABLES:
        register_observable("test_identity_obs")(lambda x: x.reshape(x.shape[0], -1).double())
    _refused(TailMonitor(num_samples=8, eta=0.5, observable="test_identity_obs"), _world(1), _module(),
             _dm(), "observable")
    with pytest.raises(ConfigError, match="did you mean 'max'"):
        TailMonitor(observable="maxx")


def test_memorization_nn_ratio_needs_two_training_samples():
    module = _module()
    err = _refused(MemorizationMonitor(num_samples=4), _world(1), module, _dm(n=1), "criterion")
    assert err.accepted == ["cosine"]
    MemorizationMonitor(num_samples=4, criterion="cosine").check_setup(_world(1), module, _dm(n=1))
    with pytest.raises(ConfigError, match="did you mean 'cosine'"):
        MemorizationMonitor(criterion="cosin")


class _ImagesOnly(torch.nn.Module):
    """A descriptor for (B, C, H, W) images only (like an image network)."""

    def forward(self, x):
        if x.ndim != 4:
            raise ValueError(f"expected images, got shape {tuple(x.shape)}")
        return x.flatten(1)


def test_descriptors_must_accept_the_data():
    module, dm = _module(), _dm()
    err = _refused(GeneralizationMonitor(num_eval=4, descriptor=_ImagesOnly(), use_cache=False), _world(1),
                   module, dm, "descriptor")
    assert "expected images" in err.problem
    _refused(MemorizationMonitor(num_samples=4, descriptor=_ImagesOnly()), _world(1), module, dm, "descriptor")


def test_generalization_sample_grid_columns_within_rank_0_seeds():
    module, images = _module(), TensorDataModule(train_data=torch.rand(8, 1, 4, 4) * 2 - 1, batch_size=4)
    images.setup("fit")
    _refused(GeneralizationMonitor(num_eval=4, num_images=3, use_cache=False), _world(2), module, images,
             "num_images")
    GeneralizationMonitor(num_eval=4, num_images=2, use_cache=False).check_setup(_world(2), module, images)
    # no grid drawn: nothing to refuse
    GeneralizationMonitor(num_eval=4, num_images=3, image_every_n_epochs=0,
                          use_cache=False).check_setup(_world(2), module, images)


# ----------------------------------------------------------------------------- one PF-ODE grid
def _teacher_dm(**kw):
    dm = TeacherDistillationDataModule(teacher=GAUSS, n_train=8, n_test=4, n_gen=64, batch_size=4, **kw)
    dm.setup("fit")
    return dm


def _student(**kw):
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(2, hidden=8, depth=1, emb_dim=8), **kw)


def test_a_student_grid_other_than_the_teacher_grid_is_refused():
    dm, mon = _teacher_dm(), GeneralizationMonitor(num_eval=8, use_cache=False)
    mon.check_setup(_world(1), _student(), dm)  # Heun-18 on both sides
    err = _refused(mon, _world(1), _student(num_steps=5), dm, "model.num_steps")
    assert "num_steps=5" in err.problem and "num_steps=18" in err.problem and "datamodule" in err.suggestion
    err = _refused(mon, _world(1), _student(rho=3.0), dm, "model.rho")
    err = _refused(mon, _world(1), _student(sampler="euler"), dm, "model.sampler")
    assert err.accepted == ["heun"]
    _refused(GeneralizationMonitor(num_eval=8, sampler="euler", use_cache=False), _world(1), _student(), dm,
             "sampler")
    _refused(GeneralizationMonitor(num_eval=8, sigmas=karras_sigmas(5).tolist(), use_cache=False), _world(1),
             _student(), dm, "sigmas")
    # a teacher datamodule on the student's grid is accepted
    GeneralizationMonitor(num_eval=8, use_cache=False).check_setup(
        _world(1), _student(num_steps=5, sampler="euler"), _teacher_dm(num_steps=5, sampler="euler"))


def test_the_grid_mismatch_stops_fit_before_any_training_step(tmp_path):
    class _Counting(DiffusionModule):
        steps = 0

        def training_step(self, batch, batch_idx):
            type(self).steps += 1
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    model = _Counting(MLPNet(2, hidden=8, depth=1, emb_dim=8), num_steps=5)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"))
    trainer = _trainer(tmp_path, [GeneralizationMonitor(num_eval=8), ckpt], enable_checkpointing=True)
    with pytest.raises(ConfigError, match="num_steps"):
        trainer.fit(model, datamodule=TeacherDistillationDataModule(teacher=GAUSS, n_train=8, n_test=4,
                                                                    n_gen=64, batch_size=4))
    assert _Counting.steps == 0 and not (tmp_path / "ckpt").exists()
    assert not list((tmp_path / "cache").rglob("pfd/*.pt"))  # no reference flow was computed


# ----------------------------------------------------------------------------- metric keys
def test_two_monitors_writing_the_same_keys_are_refused():
    module, dm = _module(), _dm()
    a, b = ICRMonitor(num_images=8), ICRMonitor(num_images=8, sigma=1.0)
    err = _refused(a, _world(1, [a, b]), module, dm, "name")
    assert "icr/icr" in err.problem
    c = ICRMonitor(num_images=8, sigma=1.0, name="icr_hi")
    a.check_setup(_world(1, [a, c]), module, dm)
    assert a.state_key != c.state_key != ICRMonitor(num_images=8, sigma=1.0, name="icr_hi", tap="in").state_key
    g1, g2 = GeneralizationMonitor(num_eval=4), GeneralizationMonitor(num_eval=4, name="pfd_b")
    assert g1.state_key != g2.state_key and set(g1.metric_names()).isdisjoint(g2.metric_names())
    _refused(g1, _world(1, [g1, GeneralizationMonitor(num_eval=8)]), module, dm, "name")
    with pytest.raises(ConfigError, match="name"):
        ICRMonitor(name="icr/hi")


def test_early_stopping_monitor_must_be_logged_by_an_icr_monitor():
    mon = ICRMonitor(num_images=8, name="icr_hi")
    es = ICREarlyStopping()  # monitors icr/icr, which no monitor logs
    err = _refused(es, _world(1, [mon, es]), None, None, "monitor")
    assert "icr_hi/icr" in err.accepted and err.suggestion == "did you mean 'icr_hi/icr'?"
    ICREarlyStopping(monitor="icr_hi/icr").check_setup(_world(1, [mon]), None, None)
    ICREarlyStopping().check_setup(_world(1, []), None, None)  # no ICRMonitor: the key may come from elsewhere


# ----------------------------------------------------------------------------- non-finite models
class _TeacherDM(TensorDataModule):
    """Training data with an exact teacher (so that E_gen is measured too)."""

    def __init__(self, d=D, n=24):
        self._law = GaussianDenoiser(torch.zeros(d), 0.25 * torch.eye(d))
        super().__init__(train_data=self._law.sample(range(n)).float(),
                         val_data=self._law.sample(range(100, 108)).float(), batch_size=8, value_range=None)

    def setup(self, stage=None):
        super().setup(stage)
        self.teacher = self._law


def _all_monitors(num=8):
    return [GeneralizationMonitor(num_eval=num, image_every_n_epochs=0, use_cache=False),
            ICRMonitor(num_images=num, batch_size=num), MemorizationMonitor(num_samples=num, every_n_epochs=1),
            TailMonitor(num_samples=num, eta=0.5, num_splits=2, plot=False)]


def _poison(module):
    with torch.no_grad():
        for p in list(module.live_denoiser.parameters()) + list(module.denoiser.parameters()):
            p.fill_(math.nan)


KEYS = {"pfd": ["pfd/e_gen", "pfd/e_mem"], "icr": ["icr/icr", "icr/trace_s", "icr/trace_xi"],
        "mem": ["mem/ratio"], "tail": ["tail/rmsqe", "tail/loader"]}


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan_weights"])
def test_nan_weights_give_nan_metrics_and_the_nonfinite_fraction(tmp_path, nan):
    module = _module()
    if nan:
        _poison(module)
    trainer = _trainer(tmp_path, _all_monitors())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two measurements, one warning per monitor
            trainer.validate(module, datamodule=_TeacherDM(), verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for ns, keys in KEYS.items():
        assert m[f"{ns}/nonfinite"] == (1.0 if nan else 0.0), ns
        for k in keys:
            assert math.isnan(m[k]) == nan, k
    assert math.isfinite(m["tail/loader_floor"]) and m["icr/n"] == 8 and m["icr/d"] == 8
    nonfinite = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert len(nonfinite) == (4 if nan else 0), nonfinite
    assert all(issubclass(w.category, RuntimeWarning) for w in caught if "non-finite" in str(w.message))


def test_nan_unet_features_give_nan_icr_not_an_error(tmp_path):
    torch.manual_seed(0)
    unet = DiffusionModule(UNet(img_resolution=8, in_channels=3, model_channels=8, channel_mult=[1, 2],
                                num_blocks=1, attn_resolutions=[]), num_steps=2)
    _poison(unet)
    images = TensorDataModule(train_data=torch.rand(10, 3, 8, 8) * 2 - 1, val_data=torch.rand(4, 3, 8, 8) * 2 - 1,
                              batch_size=4)
    mons = [ICRMonitor(num_images=6), GeneralizationMonitor(num_eval=2, image_every_n_epochs=0, use_cache=False),
            MemorizationMonitor(num_samples=2)]
    trainer = _trainer(tmp_path, mons)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        trainer.validate(unet, datamodule=images, verbose=False)
    m = trainer.callback_metrics
    assert math.isnan(float(m["icr/icr"])) and float(m["icr/nonfinite"]) == 1.0
    assert math.isnan(float(m["pfd/e_mem"])) and float(m["pfd/nonfinite"]) == 1.0
    assert math.isnan(float(m["mem/ratio"])) and float(m["mem/nonfinite"]) == 1.0
    assert mons[0].evaluation.eigenvalues[0.29].numel() == 0


class _OddNaN(pl.LightningModule):
    """A sigma-space model whose samples are NaN for odd seeds, and whose ICR features are NaN on
    distributed rank 1 (only): under DDP one rank sees non-finite values, the other does not."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.den = EDMFamily().precondition(_RankNaNNet(D, hidden=8, depth=1, emb_dim=8))
        self.loss_fn = EDMFamily().loss()
        self.sigmas = karras_sigmas(3)
        self.data_shape = (D,)

    @property
    def denoiser(self):
        return self.den

    def generate(self, seeds, sampler=None, batch_size=256, **kw):
        seeds = torch.as_tensor(seeds)
        x = sample_endpoints(self.den, seeds, self.data_shape, self.sigmas, sampler or "heun", batch_size)
        x[seeds % 2 == 1] = math.nan
        return x

    def validation_step(self, batch, batch_idx):
        pass


class _RankNaNNet(MLPNet):
    def forward_features(self, x_in, c_noise, tap=None):
        h = super().forward_features(x_in, c_noise, tap)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            h = h * math.nan
        return h


def test_partly_non_finite_student_logs_nan_not_a_partial_value(tmp_path):
    trainer = _trainer(tmp_path, [GeneralizationMonitor(num_eval=4, image_every_n_epochs=0, use_cache=False),
                                  MemorizationMonitor(num_samples=6),
                                  TailMonitor(num_samples=8, eta=0.5, num_splits=2, plot=False)])
    with pytest.warns(RuntimeWarning, match="non-finite"):
        trainer.validate(_OddNaN(), datamodule=_TeacherDM(), verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for ns in ("pfd", "mem", "tail"):  # the evaluation seeds start at even numbers: half are odd
        assert m[f"{ns}/nonfinite"] == 0.5, ns
        assert all(math.isnan(m[k]) for k in KEYS[ns]), ns


@pytest.mark.slow
def test_ddp_nan_on_one_rank_takes_the_same_branch_on_both(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy

    mons = [GeneralizationMonitor(num_eval=4, image_every_n_epochs=0, use_cache=False),
            ICRMonitor(num_images=6, batch_size=6), MemorizationMonitor(num_samples=6),
            TailMonitor(num_samples=8, eta=0.5, num_splits=2, plot=False)]
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=600))  # a hang fails, not blocks
    trainer = _trainer(tmp_path, mons, devices=2, strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.validate(_OddNaN(), datamodule=_TeacherDM(), verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # rank 0 evaluates the even seeds (finite), rank 1 the odd ones (NaN): the fraction is global
    for ns in ("pfd", "mem", "tail"):
        assert m[f"{ns}/nonfinite"] == 0.5, ns
        assert all(math.isnan(m[k]) for k in KEYS[ns]), ns
    assert m["icr/nonfinite"] == 0.5 and math.isnan(m["icr/icr"])  # rank 1's 3 of 6 images


# ----------------------------------------------------------------------------- two ICRMonitors
def _icr_pair():
    return (ICRMonitor(num_images=12, batch_size=12, every_n_epochs=1),
            ICRMonitor(num_images=12, batch_size=12, sigma=1.0, name="icr_hi", every_n_epochs=2))


def test_two_icr_monitors_log_distinct_keys_and_restore_their_own_state(tmp_path):
    lo, hi = _icr_pair()
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    trainer = _trainer(tmp_path, [lo, hi, ckpt], max_epochs=3, enable_checkpointing=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n < 4d
        trainer.fit(_module(), datamodule=_dm())
    m = trainer.callback_metrics
    assert float(m["icr/icr"]) != float(m["icr_hi/icr"]) and "icr_hi/nonfinite" in m
    assert [h["epoch"] for h in lo.history] == [0, 1, 2] and [h["epoch"] for h in hi.history] == [0, 2]
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["callbacks"]
    assert saved[lo.state_key]["history"] == lo.history and saved[hi.state_key]["history"] == hi.history
    assert lo.state_key != hi.state_key
    lo2, hi2 = _icr_pair()
    trainer = _trainer(tmp_path, [lo2, hi2], max_epochs=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_module(), datamodule=_dm(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    # each resumed its own history and cadence (hi: passes 3, 4 -> measures at epoch 4 only)
    assert [h["epoch"] for h in lo2.history] == [0, 1, 2, 3, 4]
    assert [h["epoch"] for h in hi2.history] == [0, 2, 4]
    assert all("icr_hi/icr" in h for h in hi2.history) and all("icr/icr" in h for h in lo2.history)


def test_a_second_default_monitor_is_refused_with_a_config_error_not_lightnings(tmp_path):
    # e.g. a config's ICRMonitor plus a callback stack's: different protocols, hence different
    # state keys (the Trainer accepts them), but the same keys icr/* -> one clear ConfigError
    a, b = ICRMonitor(num_images=8, level=1), ICRMonitor(num_images=12)
    assert a.state_key != b.state_key
    trainer = _trainer(tmp_path, [a, b])
    err = _refused(a, trainer, _module(), _dm(), "name")
    assert "icr/icr" in err.problem and "name" in err.suggestion


def test_same_name_monitors_fail_fit_before_training(tmp_path):
    trainer = _trainer(tmp_path, [ICRMonitor(num_images=8), ICRMonitor(num_images=8, sigma=1.0)])
    with pytest.raises(ConfigError, match=r"^name: .*\(ICRMonitor\)"):
        trainer.fit(_module(), datamodule=_dm())
    assert trainer.global_step == 0


# ----------------------------------------------------------------------------- metrics on bad input
def test_icr_not_positive_definite_message_names_the_actual_cause():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="non-finite") as e:
        m = InvariantContaminationRatio()
        m.update(torch.full((10, 3), math.nan), torch.randn(10, 3, generator=g))
        m.compute()
    assert "too few samples" not in str(e.value)
    # n = 50 >> d = 3, but the views agree exactly in coordinate 2: singular, not "too few samples"
    s = torch.randn(50, 3, generator=g)
    h1, h2 = s + 0.1 * torch.randn(50, 3, generator=g), s + 0.1 * torch.randn(50, 3, generator=g)
    h2[:, 2] = h1[:, 2]
    m = InvariantContaminationRatio(tau=0.0)
    m.update(h1, h2)
    with pytest.raises(ValueError, match="positive definite") as e:
        m.compute()
    assert "too few samples" not in str(e.value) and "singular" in str(e.value)
    # n = 3 <= d = 5: too few samples
    with pytest.raises(ValueError, match="too few samples.*n=3"):
        m = InvariantContaminationRatio(tau=0.0)
        m.update(torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g))
        m.compute()
    with pytest.raises(ValueError, match="non-finite"):
        generalized_eigenvalues(torch.eye(2), torch.tensor([[math.inf, 0.0], [0.0, 1.0]]))


def test_pfd_with_inf_endpoints_is_nan_with_its_fraction():
    m = ProbabilityFlowDistance()
    m.update(torch.tensor([[math.inf, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]), torch.zeros(4, 2))
    assert math.isnan(float(m.compute())) and float(m.nonfinite_fraction()) == 0.25
    m = ProbabilityFlowDistance()
    m.update(torch.tensor([[3.0, 4.0]]), torch.zeros(1, 2))
    assert float(m.compute()) == 5.0 and float(m.nonfinite_fraction()) == 0.0


# ----------------------------------------------------------------------------- icr-sweep arguments
@pytest.mark.parametrize("extra, flag, hint", [
    (["--num-images", "1"], "--num-images", None),
    (["--level", "9"], "--level", None),
    (["--d-proj", "0"], "--d-proj", None),
    (["--sigmas", "0.1", "0.1"], "--sigmas", None),
    (["--sigmas", "0"], "--sigmas", None),
    (["--seed", "-1"], "--seed", None),
    (["--data", "digitz"], "--data", "did you mean 'digits'?"),
    (["--data", "missing.yaml"], "--data", None),
    (["--module-class", "DiffusionModule"], "--module-class", None),
])
def test_icr_sweep_refuses_bad_arguments_before_loading_anything(tmp_path, monkeypatch, capsys, extra, flag,
                                                                  hint):
    from lightning_pfd.commands import icr_sweep

    def forbidden(*a, **k):
        raise AssertionError("loaded data / a checkpoint before validating the arguments")

    monkeypatch.setattr(icr_sweep, "build_datamodule", forbidden)
    monkeypatch.setattr(icr_sweep, "load_module", forbidden)
    ckpt = tmp_path / "m.ckpt"
    ckpt.write_bytes(b"")  # exists: the other arguments are what is wrong
    argv = ["--ckpt", str(ckpt), "--data", "digits", "--out", str(tmp_path / "out")]
    assert icr_sweep.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}" in err, err
    if hint:
        assert hint in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "afile").write_text("x")
    assert icr_sweep.main(argv[:4] + ["--out", str(tmp_path / "afile")]) == 2
    assert "--out" in capsys.readouterr().err
