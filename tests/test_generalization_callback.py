"""GeneralizationMonitor: values vs functional oracles, cache reuse, corruption, DDP equality."""
import glob
import math
import os

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from helpers.rounding import assert_equal_to_rounding
from lightning_pfd.cache import cache_dir
from lightning_pfd.callbacks import GeneralizationMonitor
from lightning_pfd.evaluation import flow as gen_mod
from lightning_pfd.data import TensorDataModule
from lightning_pfd.diffusion import EDMFamily, EmpiricalDenoiser, GaussianDenoiser
from lightning_pfd.metrics import probability_flow_distance
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet

GEN_OFFSET = 5_000


class CountingTeacher(nn.Module):
    """A Gaussian teacher that counts its calls (in this process)."""

    def __init__(self, d=2):
        super().__init__()
        self.inner = GaussianDenoiser(torch.tensor([0.5, -0.3][:d]), torch.tensor([[1.0, 0.3], [0.3, 0.5]])[:d, :d])
        self.calls = 0

    def forward(self, x, sigma):
        self.calls += 1
        return self.inner(x, sigma)

    def fingerprint(self):
        return self.inner.fingerprint()


class TeacherDM(TensorDataModule):
    def __init__(self, n_train=15, n_val=9, teacher=True, **kw):
        t = CountingTeacher()
        super().__init__(train_data=t.inner.sample(range(n_train)).float(),
                         val_data=t.inner.sample(range(100, 100 + n_val)).float(), batch_size=8,
                         value_range=None, **kw)
        self._teacher = t if teacher else None
        self.gen_seed_offset = GEN_OFFSET

    def setup(self, stage=None):
        super().setup(stage)
        self.teacher = self._teacher


class ThreadSafeModule(DiffusionModule):
    def setup(self, stage):  # spawned DDP ranks on a 2-core box: one thread each
        torch.set_num_threads(1)


def _module(seed=0):
    torch.manual_seed(seed)
    return ThreadSafeModule(MLPNet(2, hidden=16, depth=1, emb_dim=8), family="edm", num_steps=6)


def _trainer(tmp_path, cb, **kw):
    args = dict(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0,
                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=str(tmp_path))
    args.update(kw)
    return pl.Trainer(callbacks=[cb], **args)


def _metrics(trainer):
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("pfd/", "loss/"))}


# ------------------------------------------------------------------ values against oracles
def test_logged_values_match_functional_oracles(tmp_path):
    dm, model = TeacherDM(), _module()
    cb = GeneralizationMonitor(num_eval=20, batch_size=7, num_loss_samples=None, image_every_n_epochs=0)
    trainer = _trainer(tmp_path, cb)
    trainer.fit(model, datamodule=dm)
    got = _metrics(trainer)
    seeds = range(GEN_OFFSET, GEN_OFFSET + 20)
    den = model.denoiser
    e_mem = probability_flow_distance(den, EmpiricalDenoiser(dm.train_data), seeds=seeds, shape=(2,),
                                      sigmas=model.sigmas)
    e_gen = probability_flow_distance(den, dm.teacher.inner, seeds=seeds, shape=(2,), sigmas=model.sigmas)
    assert got["pfd/e_mem"] == pytest.approx(float(e_mem), rel=1e-9)
    assert got["pfd/e_gen"] == pytest.approx(float(e_gen), rel=1e-9)
    loss = EDMFamily(sigma_data=0.5).loss()
    with torch.no_grad():
        l_tr = loss(den, dm.train_data, seeds=gen_mod.LOSS_TRAIN_SEED_OFFSET + torch.arange(15)).double().mean()
        l_te = loss(den, dm.val_data, seeds=gen_mod.LOSS_TEST_SEED_OFFSET + torch.arange(9)).double().mean()
    assert got["loss/train_fixed"] == pytest.approx(float(l_tr), rel=1e-6)
    assert got["loss/test_fixed"] == pytest.approx(float(l_te), rel=1e-6)
    assert got["loss/gap"] == pytest.approx(float(l_te - l_tr), rel=1e-5, abs=1e-6)
    assert cb.history and cb.history[-1]["pfd/e_mem"] == pytest.approx(got["pfd/e_mem"], rel=1e-12)
    # resume state
    cb2 = GeneralizationMonitor(num_eval=20)
    cb2.load_state_dict(cb.state_dict())
    assert cb2.history == cb.history


# ------------------------------------------------------------------ caching
class CountingEmpirical(EmpiricalDenoiser):
    calls = 0

    def forward(self, x, sigma):
        type(self).calls += 1
        return super().forward(x, sigma)


def test_cache_reuse_and_corruption_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(gen_mod, "EmpiricalDenoiser", CountingEmpirical)

    def run():
        CountingEmpirical.calls = 0
        dm, model = TeacherDM(), _module()
        cb = GeneralizationMonitor(num_eval=16, image_every_n_epochs=0)
        trainer = _trainer(tmp_path, cb)
        trainer.fit(model, datamodule=dm)
        return _metrics(trainer), dm._teacher.calls, CountingEmpirical.calls

    first, t1, e1 = run()
    assert t1 > 0 and e1 > 0
    files = sorted(glob.glob(str(cache_dir() / "pfd" / "*.pt")))
    assert len(files) == 2
    second, t2, e2 = run()
    assert (t2, e2) == (0, 0)  # teacher and empirical flows never recomputed
    assert second == first
    for f in files:  # corrupt both cache files (keep the size, flip bytes)
        raw = bytearray(open(f, "rb").read())
        raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)
        open(f, "wb").write(bytes(raw))
    third, t3, e3 = run()
    assert t3 > 0 and e3 > 0  # detected and rebuilt
    assert third == first
    fourth, t4, e4 = run()  # and the rebuilt files are trusted again
    assert (t4, e4) == (0, 0) and fourth == first


# ------------------------------------------------------------------ DDP
@pytest.mark.slow
def test_ddp_spawn_two_ranks_equal_single_process(tmp_path):
    kw = dict(num_eval=13, batch_size=4, num_loss_samples=None, image_every_n_epochs=0)
    t1 = _trainer(tmp_path, GeneralizationMonitor(use_cache=False, **kw))
    t1.validate(_module(), datamodule=TeacherDM(), verbose=False)
    single = _metrics(t1)
    mon, module, dm = GeneralizationMonitor(use_cache=True, **kw), _module(), TeacherDM()
    t2 = _trainer(tmp_path, mon, devices=2, strategy="ddp_spawn")
    dm.setup("validate")
    mon.check_setup(t2, module, dm)  # the command line's pre-flight binds it: the copies are not
    t2.validate(module, datamodule=dm, verbose=False)
    double = _metrics(t2)
    assert set(single) == {"pfd/e_gen", "pfd/e_mem", "pfd/e_gen_se", "pfd/e_mem_se", "pfd/nonfinite",
                           "loss/train_fixed", "loss/test_fixed", "loss/gap"}
    assert single["pfd/nonfinite"] == double["pfd/nonfinite"] == 0.0
    assert set(double) == set(single)
    for k in single:
        assert double[k] == pytest.approx(single[k], rel=1e-9, abs=1e-12), k
    # the cache written from two gathered shards equals a single-process computation
    from lightning_pfd.cache import load_tensor_verified
    from lightning_pfd.diffusion import sample_endpoints
    (f,) = glob.glob(str(cache_dir() / "pfd" / "teacher_*.pt"))
    payload = torch.load(f, weights_only=True)
    hit = load_tensor_verified(f, payload["key"])
    ref = sample_endpoints(TeacherDM()._teacher.inner, range(GEN_OFFSET, GEN_OFFSET + 13), (2,),
                           sigmas=_module().sigmas)
    # shards of 7 and 6 rows in batches of 4 vs 13 rows in one batch: other matmul shapes, so equal
    # to rounding (measured ~9e-15 on Intel/MKL, bit for bit on AMD/OpenBLAS)
    assert_equal_to_rounding(hit["endpoints"], ref)


# ------------------------------------------------------------------ minimal module, images, NaN
class TinyImageModule(pl.LightningModule):
    """Exposes only what the callback needs: denoiser, loss_fn, data_shape."""

    def __init__(self, nan=False):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(()))
        self.nan = nan
        self.den = GaussianDenoiser(torch.zeros(16), 0.3 * torch.eye(16), shape=(1, 4, 4))
        self.loss_fn = EDMFamily().loss()
        self.data_shape = (1, 4, 4)

    @property
    def denoiser(self):
        if self.nan:
            return lambda x, s: torch.full_like(x, math.nan)
        return self.den

    def training_step(self, batch, i):
        return (self.p - 1) ** 2

    def validation_step(self, batch, i):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _image_dm(val=False):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(9, 1, 4, 4, generator=g) * 2 - 1
    return TensorDataModule(train_data=x[:6], val_data=x[6:] if val else None, batch_size=3)


def test_minimal_module_without_teacher_or_val_data_writes_png_grid(tmp_path):
    """No validation batches: the monitor measures at the end of the training epoch instead."""
    from lightning.pytorch.loggers import CSVLogger
    cb = GeneralizationMonitor(num_eval=5, image_every_n_epochs=1, num_images=4)
    trainer = _trainer(tmp_path, cb, logger=CSVLogger(str(tmp_path), name="run"))
    dm = _image_dm()
    trainer.fit(TinyImageModule(), datamodule=dm)
    got = _metrics(trainer)
    assert "pfd/e_gen" not in got and "loss/test_fixed" not in got  # no teacher, no held-out data
    e_mem = probability_flow_distance(GaussianDenoiser(torch.zeros(16), 0.3 * torch.eye(16), shape=(1, 4, 4)),
                                      EmpiricalDenoiser(dm.train_data), seeds=range(2_000_000, 2_000_005),
                                      shape=(1, 4, 4))
    assert got["pfd/e_mem"] == pytest.approx(float(e_mem), rel=1e-9)
    (png,) = glob.glob(os.path.join(trainer.logger.log_dir, "figures", "pfd_samples-epoch*.png"))
    import matplotlib.pyplot as plt
    img = plt.imread(png)
    assert img.shape[:2] == (2 * 5 + 1, 4 * 5 + 1)  # rows: student, empirical; 4 columns of 4x4 + 1px pad


def test_non_finite_student_logs_nan_and_warns(tmp_path):
    cb = GeneralizationMonitor(num_eval=4, image_every_n_epochs=0)
    trainer = _trainer(tmp_path, cb)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        trainer.validate(TinyImageModule(nan=True), datamodule=_image_dm(val=True), verbose=False)
    assert math.isnan(float(trainer.callback_metrics["pfd/e_mem"]))


def test_bad_configuration_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="num_eval"):
        GeneralizationMonitor(num_eval=0)
    with pytest.raises(ValueError, match="sampler"):
        GeneralizationMonitor(sampler="rk4")
    with pytest.raises(ValueError, match="num_loss_samples"):
        GeneralizationMonitor(num_loss_samples=0)
    with pytest.raises(FileNotFoundError):
        GeneralizationMonitor(descriptor=str(tmp_path / "sscd.pt"))
    dm = TeacherDM()
    dm.n_gen = 10
    trainer = _trainer(tmp_path, GeneralizationMonitor(num_eval=11))
    with pytest.raises(ValueError, match="n_gen"):
        trainer.fit(_module(), datamodule=dm)


def test_sample_grid_goes_to_log_image_when_the_logger_has_it(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    class ImageLogger(CSVLogger):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.images = []

        def log_image(self, key, images, caption=None, step=None):
            self.images.append((key, images, caption))

    logger = ImageLogger(str(tmp_path), name="run")
    trainer = _trainer(tmp_path, GeneralizationMonitor(num_eval=3, image_every_n_epochs=1, num_images=2),
                       logger=logger)
    trainer.validate(TinyImageModule(), datamodule=_image_dm(val=True), verbose=False)
    ((key, images, caption),) = logger.images
    assert key == "pfd/samples" and images[0].shape == (2 * 5 + 1, 2 * 5 + 1)
    assert images[0].dtype.name == "uint8" and images[0][0, 0] == 255  # white 1-px padding
    assert "student / empirical" in caption[0]
    assert not glob.glob(os.path.join(str(tmp_path), "**", "*.png"), recursive=True)


def test_every_n_epochs_and_reference_reuse_across_epochs(tmp_path, monkeypatch):
    monkeypatch.setattr(gen_mod, "EmpiricalDenoiser", CountingEmpirical)
    CountingEmpirical.calls = 0
    dm = TeacherDM()
    cb = GeneralizationMonitor(num_eval=4, every_n_epochs=2, image_every_n_epochs=0, use_cache=False)
    trainer = _trainer(tmp_path, cb, max_epochs=5, limit_train_batches=1)
    trainer.fit(_module(), datamodule=dm)
    assert [h["epoch"] for h in cb.history] == [0, 2, 4]
    # the reference flows ran once (one Heun-6 pass = 11 calls per batch), not once per epoch
    assert dm._teacher.calls == 11 and CountingEmpirical.calls == 11
    assert len({h["pfd/e_mem"] for h in cb.history}) == 3  # the student changes between epochs


def test_levy_module_is_refused_with_a_clear_message(tmp_path):
    from lightning_pfd.modules import LevyItoModule
    trainer = _trainer(tmp_path, GeneralizationMonitor(num_eval=4))
    with pytest.raises(ValueError, match="TailMonitor"):
        trainer.fit(LevyItoModule(MLPNet(2, hidden=8, depth=1), alpha=1.7), datamodule=TeacherDM())
