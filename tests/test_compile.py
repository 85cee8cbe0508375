"""Compiled sampling (``SamplerSettings(compile=...)``, ``GeneralizationMonitor(compile=...)``,
``DiffusionModule`` / ``LevyItoModule(sample_compile=...)``).

* padding a ragged last batch to the flow's batch size changes no endpoint, and the denoiser
  then only ever sees one batch shape;
* compiled endpoints equal the eager ones to float32 rounding (aot_eager here; inductor in a slow
  test, its C++ compile takes ~30-60 s on this CPU);
* one compiled graph serves every batch, step and measurement: a second ``FlowEvaluation.measure``
  after an in-place weight update (an epoch's EMA) with a ragged last batch compiles nothing
  (torch._dynamo's CompileCounter backend, and ``error_on_recompile``) -- while the same ragged
  batch without padding does recompile (the control that shows the counter can see it);
* the references are sampled eagerly, the monitor plumbs ``compile`` to the evaluation, and bad
  values are refused with a ConfigError naming the field;
* the modules' ``generate`` with ``sample_compile``: compiled samples equal eager ones, a second
  ``generate`` after a weight update (ragged last batch included) compiles nothing, the option is
  validated and saved in hparams, and GeneralizationMonitor follows it unless its own ``compile``
  is set.
"""
import lightning.pytorch as pl
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from helpers.teacher import GaussianTeacherDM
from lightning_pfd.callbacks import GeneralizationMonitor
from lightning_pfd.diffusion import GaussianDenoiser
from lightning_pfd.diffusion import sampling
from lightning_pfd.diffusion.sampling import SamplerSettings, compile_denoiser, sample_endpoints
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.flow import FlowEvaluation
from lightning_pfd.modules import DiffusionModule, LevyItoModule
from lightning_pfd.nets import MLPNet

MEAN, COV = torch.tensor([0.5, -0.3, 0.2]), torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.4]])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # compiled code of other tests must not count here (nor fill the cache)
    yield
    torch._dynamo.reset()


def _student(seed=0, **kw):
    torch.manual_seed(seed)
    return DiffusionModule(MLPNet(3, hidden=16, depth=1, emb_dim=8), num_steps=4, **kw)


class Shapes(torch.nn.Module):
    """A denoiser recording the batch size of every call."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.rows = inner, []

    def forward(self, x, sigma):
        self.rows.append(x.shape[0])
        return self.inner(x, sigma)


def test_padding_the_ragged_batch_changes_no_endpoint():
    den = Shapes(GaussianDenoiser(MEAN, COV))
    sigmas = SamplerSettings(num_steps=5).sigmas()
    ragged = sample_endpoints(den, range(11), (3,), sigmas, batch_size=4)
    assert sorted(set(den.rows)) == [3, 4]
    den.rows.clear()
    fixed = sample_endpoints(den, range(11), (3,), sigmas, batch_size=4, fixed_batch=True)
    assert set(den.rows) == {4} and fixed.shape == (11, 3)
    torch.testing.assert_close(fixed, ragged, rtol=1e-13, atol=1e-13)
    den.rows.clear()  # fewer seeds than the batch size: batches of len(seeds), no padding
    sample_endpoints(den, range(3), (3,), sigmas, batch_size=4, fixed_batch=True)
    assert set(den.rows) == {3}


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_endpoints_equal_eager_ones(backend):
    den = _student().denoiser
    with torch.no_grad():  # weights away from the initialisation, so the net matters
        for p in den.parameters():
            p.add_(0.1 * torch.randn_like(p))
    eager = SamplerSettings(num_steps=4)
    compiled = SamplerSettings(num_steps=4, compile=True, compile_backend=backend)
    want = eager.sample(den, range(7), (3,), batch_size=4)
    got = compiled.sample(den, range(7), (3,), batch_size=4)
    assert got.dtype == torch.float64 and got.shape == (7, 3)
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)  # float32 rounding, 7 NFE
    assert not torch.equal(want, SamplerSettings(num_steps=3).sample(den, range(7), (3,), batch_size=4))


def test_a_second_measure_with_a_ragged_batch_compiles_nothing():
    model = _student()
    counter = CompileCounter()
    train = GaussianDenoiser(MEAN, COV).sample(range(12)).float()
    ev = FlowEvaluation(train, teacher=GaussianDenoiser(MEAN, COV), num_eval=10, batch_size=4,  # 4 + 4 + 2
                        settings=SamplerSettings(num_steps=4, compile=True, compile_backend=counter),
                        use_cache=False)
    first = ev.evaluate(model.denoiser)
    frames = counter.frame_count
    assert frames >= 1  # the student was compiled (the references run eagerly: not counted)
    with torch.no_grad():  # an epoch later: new EMA weights, in place
        for p in model.denoiser.parameters():
            p.mul_(0.9)
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = ev.evaluate(model.denoiser)
    assert counter.frame_count == frames
    assert float(second.metrics["e_gen"]) != float(first.metrics["e_gen"])  # the new weights were used
    eager = FlowEvaluation(train, teacher=GaussianDenoiser(MEAN, COV), num_eval=10, batch_size=4,
                           settings=SamplerSettings(num_steps=4), use_cache=False).evaluate(model.denoiser)
    assert float(second.metrics["e_gen"]) == pytest.approx(float(eager.metrics["e_gen"]), rel=1e-5)
    # control: the ragged batch without padding is a new shape, which the counter does see
    run = compile_denoiser(model.denoiser, "default", counter)
    sample_endpoints(run, range(10), (3,), SamplerSettings(num_steps=4).sigmas(), batch_size=4)
    assert counter.frame_count > frames


def test_references_run_eagerly_and_share_the_cache_key(monkeypatch):
    seen = []
    real = sampling.compile_denoiser

    def spy(den, mode="default", backend="inductor"):
        seen.append((type(den).__name__, mode))
        return real(den, mode, backend)

    monkeypatch.setattr(sampling, "compile_denoiser", spy)
    train = GaussianDenoiser(MEAN, COV).sample(range(12)).float()
    kw = dict(teacher=GaussianDenoiser(MEAN, COV), num_eval=6, batch_size=4, use_cache=False)
    ev = FlowEvaluation(train, settings=SamplerSettings(num_steps=3, compile=True, compile_backend="eager"), **kw)
    ev.evaluate(GaussianDenoiser(MEAN * 0, COV))
    assert ("GaussianDenoiser", "default") in seen  # the student
    assert {m for name, m in seen if name == "EmpiricalDenoiser"} == {False}
    assert sum(m == "default" for _, m in seen) == 1
    eager = FlowEvaluation(train, settings=SamplerSettings(num_steps=3), **kw)
    assert ev.cache_key("teacher") == eager.cache_key("teacher")




def test_monitor_plumbs_compile_to_its_evaluation(tmp_path, monkeypatch):
    modes = []
    monkeypatch.setattr(sampling, "compile_denoiser", lambda den, mode="default", backend="inductor":
                        (modes.append(mode), den)[1])  # eager in fact: the values must be the eager ones
    model, dm = _student(), GaussianTeacherDM(MEAN, COV)
    cb = GeneralizationMonitor(num_eval=10, batch_size=4, num_loss_samples=None, image_every_n_epochs=0,
                               compile="reduce-overhead")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[cb])
    trainer.fit(model, datamodule=dm)
    assert cb.evaluation.settings.compile == "reduce-overhead" and "reduce-overhead" in modes
    got = FlowEvaluation.from_datamodule(dm, model, num_eval=10, batch_size=4, num_loss_samples=None,
                                         use_cache=False).evaluate(model.denoiser).metrics
    assert float(trainer.callback_metrics["pfd/e_gen"]) == pytest.approx(float(got["e_gen"]), rel=1e-12)


def test_bad_compile_values_are_refused():
    assert SamplerSettings(compile=True).compile == "default" and SamplerSettings().compile is False
    with pytest.raises(ConfigError) as e:
        SamplerSettings(compile="fast")
    assert e.value.field == "compile" and "reduce-overhead" in str(e.value)
    with pytest.raises(ConfigError) as e:
        SamplerSettings(compile=True, compile_backend="")
    assert e.value.field == "compile_backend"
    with pytest.raises(ConfigError) as e:
        GeneralizationMonitor(compile="yes")
    assert e.value.field == "compile"
    dm = GaussianTeacherDM(MEAN, COV)
    dm.setup("fit")
    with pytest.raises(ConfigError) as e:
        FlowEvaluation.from_datamodule(dm, _student(), num_eval=4, compile=1)
    assert e.value.field == "compile"
    ev = FlowEvaluation.from_datamodule(dm, _student(), num_eval=4, compile="max-autotune", use_cache=False)
    assert ev.settings.compile == "max-autotune" and "compiled (max-autotune)" in ev.settings.describe()


# ----------------------------------------------------------------------------- modules: sample_compile
def _levy(seed=0, **kw):
    torch.manual_seed(seed)
    return LevyItoModule(MLPNet(3, hidden=16, depth=1, emb_dim=8), num_steps=5, **kw)


_MODULES = {"diffusion": _student, "levy": _levy}


def _ema_copy(module):
    """The EMA network a module evaluates with: DiffusionModule's ``denoiser``, LevyItoModule's ``score_model``."""
    return module.denoiser if hasattr(module, "denoiser") else module.score_model


def _perturb(module):
    with torch.no_grad():  # weights away from the initialisation, so the net matters
        for p in _ema_copy(module).parameters():
            p.add_(0.1 * torch.randn_like(p))


@pytest.mark.parametrize("kind", sorted(_MODULES))
def test_compiled_generate_equals_eager(kind):
    eager = _MODULES[kind]()
    _perturb(eager)
    compiled = _MODULES[kind]()
    compiled.load_state_dict(eager.state_dict())
    compiled.hparams.sample_compile = True
    compiled.sample_compile_backend = "aot_eager"
    want = eager.generate(range(7), batch_size=4)  # 4 + 3: the ragged batch padded when compiled
    got = compiled.generate(range(7), batch_size=4)
    assert compiled.sample_compile == "default" and eager.sample_compile is False
    assert got.dtype == torch.float64 and got.shape == (7, 3)
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)  # float32 rounding
    assert not torch.equal(want, eager.generate(range(1, 8), batch_size=4))  # the seeds matter


@pytest.mark.parametrize("kind", sorted(_MODULES))
def test_a_second_generate_after_a_weight_update_compiles_nothing(kind):
    model = _MODULES[kind](sample_compile="default")
    counter = CompileCounter()
    model.sample_compile_backend = counter
    with torch._dynamo.config.patch(error_on_recompile=True):  # the ragged batch (4 + 4 + 2) included
        first = model.generate(range(10), batch_size=4)
        frames = counter.frame_count
        assert frames >= 1
        with torch.no_grad():  # an epoch later: new EMA weights, in place
            for p in _ema_copy(model).parameters():
                p.mul_(0.9)
        second = model.generate(range(10), batch_size=4)
    assert counter.frame_count == frames
    assert not torch.equal(first, second)  # the new weights were used
    model.hparams.sample_compile = False
    torch.testing.assert_close(second, model.generate(range(10), batch_size=4), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(_MODULES))
def test_bad_sample_compile_is_refused_and_a_good_one_saved(kind):
    with pytest.raises(ConfigError) as e:
        _MODULES[kind](sample_compile="fast")
    assert e.value.field == "sample_compile" and "reduce-overhead" in str(e.value)
    with pytest.raises(ConfigError):
        _MODULES[kind](sample_compile=1)
    model = _MODULES[kind](sample_compile="reduce-overhead")
    assert model.hparams.sample_compile == "reduce-overhead" and model.sample_compile == "reduce-overhead"
    assert _MODULES[kind]().hparams.sample_compile is False


def test_generalization_monitor_follows_the_module_unless_told(monkeypatch):
    modes = []
    monkeypatch.setattr(sampling, "compile_denoiser", lambda den, mode="default", backend="inductor", device=None:
                        (modes.append(mode), den)[1])
    dm = GaussianTeacherDM(MEAN, COV)
    dm.setup("fit")
    model = _student(sample_compile="max-autotune")
    trainer = type("T", (), {"strategy": None, "global_rank": 0, "world_size": 1})()
    kw = dict(num_eval=4, batch_size=4, num_loss_samples=None, use_cache=False)

    def built(mon):
        mon.check_setup(trainer, model, dm)  # binds the datamodule and the model
        return mon.evaluation

    assert built(GeneralizationMonitor(**kw)).settings.compile == "max-autotune"
    assert built(GeneralizationMonitor(compile=False, **kw)).settings.compile is False
    assert built(GeneralizationMonitor(compile=True, **kw)).settings.compile == "default"
    model.generate(range(3), batch_size=2)  # and the module's generate samples compiled
    assert modes == ["max-autotune"]
