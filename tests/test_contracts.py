"""Written contracts: the shipped models, denoisers and datamodules satisfy their protocols, a
miss is one ConfigError naming every missing member, and the one shape check names the field."""
import lightning.pytorch as pl
import pytest
import torch

from lightning_pfd.contracts import (FeatureDenoiser, GenerativeModel, SampleDataModule,
                                     SigmaSpaceDenoiser, SigmaSpaceModel, TeacherDataModule,
                                     check_contract, check_data_shape, check_on_samples,
                                     missing_members, protocol_members)
from lightning_pfd.data.base import TensorDataModule
from lightning_pfd.data.distill import TeacherDistillationDataModule
from lightning_pfd.data.gmm import GaussianMixtureDataModule
from lightning_pfd.diffusion import EDMFamily, EmpiricalDenoiser, GaussianDenoiser, VEFamily, VPFamily
from lightning_pfd.errors import ConfigError
from lightning_pfd.modules import DiffusionModule, LevyItoModule
from lightning_pfd.nets import MLPNet


def test_protocol_members_are_the_documented_ones():
    assert protocol_members(SigmaSpaceModel) == ("data_shape", "denoiser", "generate", "loss_fn",
                                                 "network_input", "sampler_settings", "sigmas")
    assert protocol_members(GenerativeModel) == ("data_shape", "generate", "loss_fn")
    assert set(protocol_members(TeacherDataModule)) == set(protocol_members(SampleDataModule)) | {
        "teacher_fingerprint", "teacher_sigmas", "sampler_settings", "n_gen", "gen_seed_offset"}
    assert protocol_members(FeatureDenoiser) == ("__call__", "net", "network_input")


@pytest.mark.parametrize("family", ["edm", "vp", "ve"])
def test_diffusion_module_is_a_sigma_space_model(family):
    m = DiffusionModule(MLPNet(3, hidden=8, depth=1), family=family, num_steps=3)
    assert isinstance(m, SigmaSpaceModel) and isinstance(m, GenerativeModel)
    assert isinstance(m.denoiser, FeatureDenoiser)
    x = torch.randn(2, 3)
    for a, b in zip(m.network_input(x, 0.3), m.denoiser.network_input(x, 0.3)):
        assert torch.equal(a, b)


def test_levy_module_is_generative_but_not_sigma_space():
    m = LevyItoModule(MLPNet(3, hidden=8, depth=1), num_steps=3)
    assert isinstance(m, GenerativeModel) and not isinstance(m, SigmaSpaceModel)
    assert missing_members(m, SigmaSpaceModel) == ("denoiser", "network_input", "sampler_settings", "sigmas")
    with pytest.raises(ConfigError) as e:
        check_contract(m, SigmaSpaceModel, "model", "GeneralizationMonitor")
    msg = str(e.value)
    assert e.value.field == "model" and "GeneralizationMonitor needs a SigmaSpaceModel" in msg
    assert "LevyItoModule has no `denoiser`, `network_input`, `sampler_settings`, `sigmas`" in msg
    check_contract(m, GenerativeModel, "model", "TailMonitor")  # satisfied: no error


def test_denoisers():
    net = MLPNet(2, hidden=8, depth=1)
    for d in (EDMFamily().precondition(net), VPFamily().precondition(net), VEFamily().precondition(net)):
        assert isinstance(d, FeatureDenoiser)
    g = GaussianDenoiser(torch.zeros(2), torch.eye(2))
    e = EmpiricalDenoiser(torch.randn(5, 2))
    for d in (g, e):
        assert isinstance(d, SigmaSpaceDenoiser) and not isinstance(d, FeatureDenoiser)
    assert not isinstance(object(), SigmaSpaceDenoiser)


def test_datamodules():
    tdm = TensorDataModule(torch.randn(8, 2), torch.randn(4, 2), value_range=None)
    assert isinstance(tdm, SampleDataModule) and not isinstance(tdm, TeacherDataModule)
    assert missing_members(tdm, TeacherDataModule) == ("gen_seed_offset", "n_gen", "sampler_settings",
                                                       "teacher_fingerprint", "teacher_sigmas")
    gmm = GaussianMixtureDataModule(n_components=2, dim=2, n_train=8, n_val=4)
    assert isinstance(gmm, SampleDataModule)
    teacher = {"mean": torch.zeros(2).tolist(), "cov": torch.eye(2).tolist()}
    dist = TeacherDistillationDataModule(teacher=teacher, n_train=4, n_test=4, n_gen=8, num_steps=3,
                                         use_cache=False)
    assert isinstance(dist, TeacherDataModule) and isinstance(dist, SampleDataModule)
    check_contract(dist, TeacherDataModule, "data", "GeneralizationMonitor")


class _Shaped:
    def __init__(self, shape):
        self.data_shape = shape


def test_shape_check_names_the_field():
    check_data_shape(_Shaped((1, 8, 8)), _Shaped([1, 8, 8]))  # equal: silent
    check_data_shape(_Shaped((1, 8, 8)), _Shaped(None))  # unknown (before setup): silent
    check_data_shape(_Shaped((3,)), None)
    with pytest.raises(ConfigError) as e:
        check_data_shape(_Shaped((1, 16, 16)), _Shaped((1, 8, 8)))
    assert e.value.field == "model.net"  # the model's argument (the command line: model.init_args.net)
    assert "(1, 16, 16)" in str(e.value) and "(1, 8, 8)" in str(e.value) and "_Shaped" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_data_shape(_Shaped((4,)), _Shaped((5,)), field="teacher_ckpt")
    assert e.value.field == "teacher_ckpt"


@pytest.mark.parametrize("module_cls", [DiffusionModule, LevyItoModule])
def test_modules_refuse_mismatched_data_in_setup(tmp_path, module_cls):
    model = module_cls(MLPNet(5, hidden=8, depth=1))
    dm = TensorDataModule(torch.randn(16, 4), torch.randn(8, 4), batch_size=8, value_range=None)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, max_steps=1,
                         default_root_dir=tmp_path)
    with pytest.raises(ConfigError) as e:
        trainer.fit(model, dm)
    assert e.value.field == "net" and "(5,)" in str(e.value) and "(4,)" in str(e.value)
    assert int(model.ema.num_updates) == 0


def test_check_on_samples_names_the_field_and_the_shapes():
    data = torch.randn(5, 1, 4, 4)
    feats = check_on_samples(lambda x: x.flatten(1)[:, :3], data, "descriptor")
    assert feats.shape == (2, 3)
    assert check_on_samples(lambda x: x.amax((1, 2, 3)), data, "observable", "scalars").shape == (2,)
    with pytest.raises(ConfigError) as e:  # a layer for 16-d vectors given 1x4x4 images
        check_on_samples(torch.nn.Linear(16, 3), data, "trainer.callbacks[X].descriptor", value="mlp")
    assert e.value.field == "trainer.callbacks[X].descriptor" and "(1, 4, 4)" in str(e.value)
    assert e.value.value == "mlp"
    with pytest.raises(ConfigError, match=r"one scalar per sample \(B,\); got shape \(2, 16\)"):
        check_on_samples(lambda x: x.flatten(1), data, "observable", "scalars")
    with pytest.raises(ConfigError, match=r"features \(B, F\); got shape \(2,\)"):
        check_on_samples(lambda x: x.sum((1, 2, 3)), data, "descriptor")
