"""Diffusion families (EDM paper Table 1): EDM/VP reproduce the historical classes bit for bit,
VE matches the paper's column, an exact network through each family's preconditioning gives the
exact Gaussian denoiser, a family is one registered class, DiffusionModule trains any of them."""
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import scipy.stats
import torch

from lightning_pfd.data.base import TensorDataModule
from lightning_pfd.diffusion import GaussianDenoiser, karras_sigmas, seeded_noise, seeded_uniform
from lightning_pfd.diffusion.families import (DenoisingLoss, DiffusionFamily, EDMFamily,
                                              PreconditionedDenoiser, VEFamily, VPFamily,
                                              _FAMILIES, build_family, family_names, get_family,
                                              register_family)
from lightning_pfd.diffusion.streams import stream
from lightning_pfd.errors import ConfigError
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet


class _Probe(torch.nn.Module):
    """A fixed nonlinear function of (x_in, c_noise) that records its inputs."""

    def forward(self, x, c_noise):
        self.x_in, self.c_noise = x.clone(), c_noise.clone()
        return torch.tanh(x) + c_noise.reshape(-1, *([1] * (x.ndim - 1)))


def _x_sigma(b=7, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, generator=g) * 3
    sigma = torch.exp(torch.linspace(math.log(0.003), math.log(90.0), b))
    return x, sigma


# ------------------------------------------------------------------ EDM / VP: today's values
def test_edm_family_preconditioning_is_bitwise_the_closed_form():
    x, sigma = _x_sigma()
    sd = 0.37
    D = EDMFamily(sigma_data=sd).precondition(_Probe())
    out = D(x, sigma)
    s = sigma[:, None]  # EDM Table 1, evaluated in the same float32 operation order
    c_skip, c_out = sd**2 / (s**2 + sd**2), s * sd / (s**2 + sd**2).sqrt()
    c_in, c_noise = 1 / (sd**2 + s**2).sqrt(), s.log() / 4
    assert torch.equal(D.net.x_in, c_in * x) and torch.equal(D.net.c_noise, c_noise.flatten())
    assert torch.equal(out, c_skip * x + c_out * (torch.tanh(c_in * x) + c_noise))
    assert D.sigma_range == (0.0, math.inf)  # EDM: no clamping of any grid


def test_vp_family_preconditioning_is_bitwise_the_closed_form():
    x, sigma = _x_sigma()
    fam = VPFamily()
    D = fam.precondition(_Probe())
    out = D(x, sigma)
    s = sigma[:, None]
    L = torch.log1p(s**2)  # sigma^{-1}(s) without cancellation (EDM Table 1, VP column)
    t = 2 * L / ((0.1**2 + 2 * 19.9 * L).sqrt() + 0.1)
    c_in, c_noise = 1 / (s**2 + 1).sqrt(), 999 * t
    assert torch.equal(out, torch.ones_like(s) * x + (-s) * (torch.tanh(c_in * x) + c_noise))
    # the schedule: sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1), inverted by sigma_inv
    tt = torch.tensor([1e-5, 0.1, 0.5, 1.0], dtype=torch.float64)
    np.testing.assert_allclose(fam.sigma(tt).numpy(), np.sqrt(np.expm1(19.9 * tt.numpy()**2 / 2 + 0.1 * tt.numpy())))
    torch.testing.assert_close(fam.sigma_inv(fam.sigma(tt)), tt, rtol=1e-9, atol=1e-12)
    assert fam.sigma_range == (float(fam.sigma(torch.tensor(1e-5, dtype=torch.float64))),
                               float(fam.sigma(torch.tensor(1.0, dtype=torch.float64))))


@pytest.mark.parametrize("name", ["edm", "vp"])
def test_edm_vp_losses_are_the_historical_draws_bit_for_bit(name):
    """The family's loss draws sigma then n from the global RNG (training) or from the seeded
    streams loss.sigma / loss.noise (frozen noise) in the order fixed by the closed form below."""
    fam = EDMFamily(P_mean=-1.0, P_std=1.1, sigma_data=0.4) if name == "edm" else VPFamily(epsilon_t=1e-4)
    den = GaussianDenoiser(torch.zeros(5), 0.3 * torch.eye(5))
    y = torch.randn(16, 5)
    seeds = torch.arange(100, 116)

    def manual(global_rng: bool):
        if name == "edm":
            z = torch.randn(16) if global_rng else seeded_noise(seeds, (1,), stream=stream("loss.sigma"))[:, 0]
            sig = (z.float() * 1.1 - 1.0).exp()
            w = (sig**2 + 0.4**2) / (sig * 0.4) ** 2
        else:
            u = torch.rand(16, dtype=torch.float64) if global_rng else seeded_uniform(seeds, 1, stream=stream("loss.sigma"))[:, 0]
            t = 1 + u * (1e-4 - 1)
            sig = torch.expm1(0.5 * 19.9 * t**2 + 0.1 * t).sqrt().float()
            w = 1 / sig**2
        n = torch.randn_like(y) if global_rng else seeded_noise(seeds, (5,), stream=stream("loss.noise")).float()
        return w * (den(y + sig[:, None] * n, sig).float() - y).square().sum(1)

    for global_rng in (True, False):
        torch.manual_seed(7)
        result = fam.loss()(den, y, seeds=None if global_rng else seeds)
        torch.manual_seed(7)
        assert torch.equal(result, manual(global_rng))


# ------------------------------------------------------------------ VE: the paper's column
def test_ve_coefficients_are_the_paper_column():
    fam = VEFamily()
    sigma = torch.tensor([0.02, 0.5, 2.0, 37.0, 100.0], dtype=torch.float64)
    c_skip, c_out, c_in, c_noise = fam.coefficients(sigma)
    for i, s in enumerate(sigma.tolist()):  # c_skip = 1, c_out = sigma, c_in = 1, c_noise = ln(sigma/2)
        assert float(c_skip[i]) == 1.0 and float(c_in[i]) == 1.0 and float(c_out[i]) == s
        assert float(c_noise[i]) == pytest.approx(math.log(s / 2), rel=1e-15, abs=1e-15)
    assert fam.sigma_range == (0.02, 100.0)
    torch.testing.assert_close(fam.weight(sigma), sigma**-2, rtol=0, atol=0)
    # the preconditioned network sees x itself and ln(sigma/2)
    x, s = _x_sigma()
    D = fam.precondition(_Probe())
    out = D(x, s)
    assert torch.equal(D.net.x_in, x)
    torch.testing.assert_close(D.net.c_noise, (s / 2).log())
    torch.testing.assert_close(out, x + s[:, None] * (torch.tanh(x) + (s[:, None] / 2).log()))


def test_ve_training_sigma_is_log_uniform_on_its_range():
    fam = VEFamily(sigma_min=0.05, sigma_max=20.0)
    s = fam.sample_sigma(20000, "cpu", seeds=torch.arange(20000)).double()
    assert s.dtype == torch.float64 and bool((s >= 0.05 * (1 - 1e-6)).all()) and bool((s <= 20.0 * (1 + 1e-6)).all())
    u = (s.log() - math.log(0.05)) / (math.log(20.0) - math.log(0.05))
    assert scipy.stats.kstest(u.numpy(), "uniform").pvalue > 1e-3
    torch.manual_seed(0)
    g = fam.sample_sigma(20000, "cpu").double()
    ug = (g.log() - math.log(0.05)) / (math.log(20.0) - math.log(0.05))
    assert scipy.stats.kstest(ug.numpy(), "uniform").pvalue > 1e-3
    # frozen draws depend on the seed only
    torch.testing.assert_close(fam.sample_sigma(3, "cpu", seeds=torch.tensor([5, 6, 7])), s[5:8].float())


class _ExactNet(torch.nn.Module):
    """The network that makes ``family``'s preconditioned denoiser the exact Gaussian one:
    F = (D*(x; sigma) - c_skip x) / c_out with sigma recovered from c_noise, x from c_in x."""

    def __init__(self, family, gauss, sigma_of_c_noise):
        super().__init__()
        self.family, self.gauss, self.sigma_of = family, gauss, sigma_of_c_noise

    def forward(self, x_in, c_noise):
        sigma = self.sigma_of(c_noise.double())[:, None]
        c_skip, c_out, c_in, _ = self.family.coefficients(sigma)
        x = x_in.double() / c_in
        return (self.gauss(x, sigma[:, 0]) - c_skip * x) / c_out


@pytest.mark.parametrize("name", ["ve", "edm", "vp"])
def test_exact_network_through_the_preconditioning_is_the_exact_gaussian_denoiser(name):
    d = 4
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(d, d, generator=gen, dtype=torch.float64)
    gauss = GaussianDenoiser(torch.randn(d, generator=gen, dtype=torch.float64), A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64))
    fam = {"ve": VEFamily(), "edm": EDMFamily(), "vp": VPFamily()}[name]
    sigma_of = {"ve": lambda c: 2 * c.exp(), "edm": lambda c: (4 * c).exp(),
                "vp": lambda c: VPFamily().sigma(c / 999)}[name]
    D = fam.precondition(_ExactNet(fam, gauss, sigma_of))
    sigma = torch.tensor([0.02, 0.1, 0.7, 3.0, 25.0, 80.0])
    x = gauss.sample(torch.arange(6)).float() + sigma[:, None] * torch.randn(6, d)
    torch.testing.assert_close(D(x, sigma).double(), gauss(x.double(), sigma.double()), rtol=2e-5, atol=2e-5)


def test_ve_loss_of_the_exact_denoiser_is_the_posterior_variance():
    """E lambda ||D* - y||^2 given sigma = tr(Sigma sigma^2 (Sigma + sigma^2)^-1) / sigma^2 for
    y ~ N(0, Sigma) (Monte Carlo over 40000 frozen draws, 2 % tolerance)."""
    lam = torch.tensor([0.05, 0.3, 1.0, 2.0], dtype=torch.float64)
    g = GaussianDenoiser(torch.zeros(4, dtype=torch.float64), torch.diag(lam))
    seeds = torch.arange(40000)
    y = g.sample(seeds + 10**6).float()
    loss = VEFamily().loss()
    sigma, _ = loss.draw(y, seeds)
    per = loss(g, y, seeds=seeds).double()
    s2 = sigma.double()[:, None] ** 2
    expected = (lam * s2 / (lam + s2)).sum(1) / s2[:, 0]
    assert abs(float(per.mean() / expected.mean()) - 1) < 0.02


def test_default_grids_follow_table1():
    edm, vp, ve = EDMFamily(), VPFamily(), VEFamily()
    torch.testing.assert_close(edm.default_grid(18), karras_sigmas(18, 0.002, 80.0, 7.0), rtol=0, atol=0)
    g = ve.default_grid(10)  # sigma_i = sigma_max (sigma_min/sigma_max)^(i/(N-1)): geometric
    assert len(g) == 11 and float(g[-1]) == 0.0 and g.dtype == torch.float64
    assert float(g[0]) == pytest.approx(100.0) and float(g[-2]) == pytest.approx(0.02)
    ratios = (g[1:-1] / g[:-2]).numpy()
    np.testing.assert_allclose(ratios, (0.02 / 100) ** (1 / 9), rtol=1e-12)
    v = vp.default_grid(5)  # t_i = 1 + i/(N-1) (eps_s - 1), sigma_i = sigma(t_i)
    t = 1 + np.arange(5) / 4 * (1e-3 - 1)
    np.testing.assert_allclose(v[:-1].numpy(), np.sqrt(np.expm1(19.9 * t**2 / 2 + 0.1 * t)), rtol=1e-12)
    assert float(v[-1]) == 0.0
    settings = ve.sampler_settings(10)
    torch.testing.assert_close(settings.sigmas(), g, rtol=0, atol=0)


# ------------------------------------------------------------------ registry and errors
def test_registry_names_and_errors():
    assert {"edm", "vp", "ve"} <= set(family_names())
    assert get_family("ve") is VEFamily
    with pytest.raises(ConfigError) as e:
        get_family("vee")
    assert e.value.field == "family" and "did you mean 've'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_family("edm", {}, {"sigma_data": 0.3})
    assert e.value.field == "family_args.sigma_data" and "set sigma_data instead" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_family("ve", {}, {"sigma_mn": 0.1})
    assert e.value.field == "family_args" and "sigma_min" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_family("ve", {}, {"sigma_min": 200.0})
    assert e.value.field == "family_args.sigma_min"
    with pytest.raises(ConfigError) as e:
        build_family("vp", {"vp_epsilon_t": 0.0})
    assert e.value.field == "vp_epsilon_t"
    with pytest.raises(ConfigError) as e:
        build_family("edm", {"sigma_data": -1.0})
    assert e.value.field == "sigma_data"
    # the module arguments a family does not read are ignored; the ones it reads are passed on
    assert build_family("vp", {"sigma_data": 9.0, "vp_beta_d": 10.0}) == VPFamily(beta_d=10.0)
    assert build_family("ve", {"sigma_data": 9.0}, {"sigma_max": 50.0}) == VEFamily(sigma_max=50.0)


@pytest.fixture
def scratch_registry():
    saved = dict(_FAMILIES)
    yield
    _FAMILIES.clear()
    _FAMILIES.update(saved)


def test_a_new_family_is_one_registered_class(scratch_registry, tmp_path):
    """sub-VP-like toy family in a dozen lines: DiffusionModule(family=name) trains and samples it."""
    import dataclasses

    @register_family
    @dataclasses.dataclass(frozen=True)
    class ToyFamily(DiffusionFamily):
        name = "toy"
        scale: float = 2.0

        def coefficients(self, sigma):
            return torch.ones_like(sigma), sigma, 1 / (sigma**2 + 1).sqrt(), sigma.log()

        def sample_sigma(self, n, device, seeds=None):
            return (self.scale * self._uniform(n, device, seeds) + 0.01).float()

        def weight(self, sigma):
            return 1 / sigma**2

        def default_grid(self, num_steps=18):
            return torch.cat([torch.linspace(self.scale, 0.01, num_steps, dtype=torch.float64),
                              torch.zeros(1, dtype=torch.float64)])

    assert "toy" in family_names()
    model = DiffusionModule(MLPNet(3, hidden=8, depth=1), family="toy", family_args={"scale": 3.0}, num_steps=4)
    assert model.family == ToyFamily(scale=3.0) and model.hparams.family == "toy"
    x = model.generate([0, 1], sigmas=model.family.default_grid(4))
    assert x.shape == (2, 3) and bool(torch.isfinite(x).all())
    with pytest.raises(ValueError, match="already registered"):
        register_family(type("ToyFamily", (ToyFamily,), {}))
    assert register_family(ToyFamily) is ToyFamily  # idempotent


# ------------------------------------------------------------------ DiffusionModule with a family
def _fit(model, tmp_path, steps=6):
    gen = torch.Generator().manual_seed(0)
    train, val = torch.randn(96, 3, generator=gen) * 0.5, torch.randn(32, 3, generator=gen) * 0.5
    dm = TensorDataModule(train, val, batch_size=16, value_range=None)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, max_steps=steps,
                         default_root_dir=tmp_path)
    trainer.fit(model, dm)
    return trainer


@pytest.mark.parametrize("kwargs", [{"family": "ve"}, {"family": "ve", "family_args": {"sigma_max": 100.0}}])
def test_ve_module_trains_and_samples_finite(tmp_path, kwargs):
    torch.manual_seed(0)
    model = DiffusionModule(MLPNet(3, hidden=16, depth=1), lr=1e-3, ema_decay=0.5, num_steps=6, **kwargs)
    assert isinstance(model.family, VEFamily) and model.hparams.family == "ve"
    assert isinstance(model.live_denoiser, PreconditionedDenoiser) and isinstance(model.loss_fn, DenoisingLoss)
    # the sampling grid is clamped to VE's supported range [0.02, 100]
    pos = model.sigmas[model.sigmas > 0]
    assert float(pos.min()) == pytest.approx(0.02) and float(pos.max()) == pytest.approx(80.0)
    before = [p.detach().clone() for p in model.live_denoiser.parameters()]
    trainer = _fit(model, tmp_path)
    assert int(model.ema.num_updates) == 6 and math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.live_denoiser.parameters()))
    x = model.generate(torch.arange(5))
    assert x.shape == (5, 3) and bool(torch.isfinite(x).all())


def test_family_object_round_trips_through_a_checkpoint(tmp_path):
    model = DiffusionModule(MLPNet(3, hidden=8, depth=1), family=VEFamily(sigma_min=0.05, sigma_max=50.0),
                            num_steps=4)
    assert model.hparams.family == "ve" and model.hparams.family_args == {"sigma_min": 0.05, "sigma_max": 50.0}
    # the loggers' hparams.yaml (hparams_initial) records the same family, not the default "edm"
    assert model.hparams_initial["family"] == "ve" and model.hparams_initial["family_args"] == model.hparams.family_args
    trainer = _fit(model, tmp_path, steps=2)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = DiffusionModule.load_from_checkpoint(path, net=MLPNet(3, hidden=8, depth=1))
    assert loaded.family == model.family
    torch.testing.assert_close(loaded.generate([1, 2]), model.generate([1, 2]))
    # an EDM family object records its sigma_data / P_mean / P_std as the module arguments
    edm = DiffusionModule(MLPNet(3, hidden=8, depth=1), family=EDMFamily(sigma_data=0.3, P_std=1.5))
    assert edm.hparams.sigma_data == 0.3 and edm.hparams.P_std == 1.5 and edm.hparams.family == "edm"
    hp = {k: v for k, v in edm.hparams.items()}
    assert DiffusionModule(MLPNet(3, hidden=8, depth=1), **hp).family == edm.family
    # the object passed again together with its recorded family_args (load_from_checkpoint(..., family=))
    again = DiffusionModule(MLPNet(3, hidden=8, depth=1), family=model.family, family_args=dict(model.hparams.family_args))
    assert again.family == model.family


def test_module_family_errors_name_the_argument_at_construction():
    """One name for the family (``family``); errors name the module's argument, no CLI path."""
    net = MLPNet(3, hidden=8, depth=1)
    with pytest.raises(TypeError):  # the former synonym is gone
        DiffusionModule(net, precond="ve")
    with pytest.raises(ConfigError) as e:
        DiffusionModule(net, family="vee")
    assert e.value.field == "family" and e.value.suggestion == "did you mean 've'?"
    with pytest.raises(ConfigError) as e:
        DiffusionModule(net, family=3)
    assert e.value.field == "family" and e.value.accepted == list(family_names())
    with pytest.raises(ConfigError) as e:
        DiffusionModule(net, family=VEFamily(), family_args={"sigma_min": 0.1})
    assert e.value.field == "family_args"
    with pytest.raises(ConfigError) as e:
        DiffusionModule(net, family="ve", family_args={"sigma_max": -1})
    assert e.value.field == "family_args.sigma_max" and e.value.value == -1


def test_a_checkpoint_naming_the_family_precond_is_refused_with_the_fix(tmp_path):
    """A checkpoint of the release that called the family ``precond`` (hparams key and the
    weights under ``precond.``) is refused, naming the conversion; converted, it loads."""
    from lightning_pfd.checkpoint import load_checkpoint, save_checkpoint

    model = DiffusionModule(MLPNet(3, hidden=8, depth=1), family="vp", num_steps=3)
    trainer = _fit(model, tmp_path, steps=2)
    path = tmp_path / "old.ckpt"
    trainer.save_checkpoint(path)
    ckpt = load_checkpoint(path)  # rewrite it as the former release wrote it
    hp = ckpt["hyper_parameters"]
    hp["precond"] = hp.pop("family")
    ckpt["state_dict"] = {k.replace("live_denoiser.", "precond.", 1): v for k, v in ckpt["state_dict"].items()}
    save_checkpoint(ckpt, path)
    with pytest.raises(ConfigError) as e:
        DiffusionModule.load_from_checkpoint(path, net=MLPNet(3, hidden=8, depth=1))
    assert e.value.field == "ckpt_path" and "hp['family'] = hp.pop('precond')" in e.value.suggestion
    with pytest.raises(ConfigError, match="named the diffusion family `precond`"):
        model.resume_changes(load_checkpoint(path))
    # the conversion the message gives
    ckpt = load_checkpoint(path)
    hp = ckpt["hyper_parameters"]
    hp["family"] = hp.pop("precond")
    ckpt["state_dict"] = {k.replace("precond.", "live_denoiser.", 1): v for k, v in ckpt["state_dict"].items()}
    save_checkpoint(ckpt, path)
    loaded = DiffusionModule.load_from_checkpoint(path, net=MLPNet(3, hidden=8, depth=1))
    assert loaded.hparams.family == "vp"
    torch.testing.assert_close(loaded.generate([1, 2]), model.generate([1, 2]), rtol=0, atol=0)


# ------------------------------------------------------------------ the supported range: one name
def test_sigma_range_is_the_one_name_of_the_range_grids_are_clamped_to():
    """Denoisers and families name the noise levels they support ``sigma_range``; ``sigma_min`` /
    ``sigma_max`` are left to the sampling grid's ends (and to the parameters of a family)."""
    from lightning_pfd.diffusion import GaussianMixtureDenoiser, clamp_sigmas
    from lightning_pfd.diffusion.empirical import EmpiricalDenoiser

    for fam, rng in [(EDMFamily(), (0.0, math.inf)), (EDMFamily(sigma_min=0.01, sigma_max=50.0), (0.01, 50.0)),
                     (VEFamily(), (0.02, 100.0)), (VPFamily(), VPFamily().sigma_range)]:
        D = fam.precondition(_Probe())
        assert fam.sigma_range == rng and D.sigma_range == rng
        assert not hasattr(D, "sigma_min") and not hasattr(D, "sigma_max")
    assert not hasattr(VPFamily(), "sigma_min") and not hasattr(VPFamily(), "sigma_max")
    exact = [GaussianDenoiser(torch.zeros(2), torch.eye(2)),
             GaussianMixtureDenoiser(torch.ones(1), torch.zeros(1, 2), torch.eye(2)[None]),
             EmpiricalDenoiser(torch.zeros(3, 2))]
    assert all(d.sigma_range == (0.0, math.inf) and not hasattr(d, "sigma_max") for d in exact)
    g = karras_sigmas(6)  # 80 ... 0.002, 0
    clamped = clamp_sigmas(g, VEFamily().precondition(_Probe()))
    assert float(clamped[0]) == 80.0 and float(clamped[-2]) == 0.02 and float(clamped[-1]) == 0.0


def test_a_denoiser_or_family_with_the_former_names_still_clamps_with_a_future_warning():
    """A wrapped denoiser (or a family) written for a release before ``sigma_range``, giving
    its range as ``sigma_min`` / ``sigma_max``, is clamped as before, with a FutureWarning that
    names ``sigma_range``; one that declares no range is not clamped, without a warning."""
    import warnings

    from lightning_pfd.contracts import denoiser_sigma_range
    from lightning_pfd.diffusion import clamp_sigmas

    class FormerDenoiser:
        sigma_min, sigma_max = 0.5, 10.0

        def __call__(self, x, sigma):
            return x

    class Denoiser(FormerDenoiser):
        sigma_range = (0.5, 10.0)

    g = karras_sigmas(6)
    with pytest.warns(FutureWarning, match=r"FormerDenoiser.*`sigma_range`"):
        former = clamp_sigmas(g, FormerDenoiser())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(former, clamp_sigmas(g, Denoiser()))  # sigma_range wins over the former names
        assert torch.equal(clamp_sigmas(g, lambda x, s: x), g)
    assert float(former[0]) == 10.0 and float(former[-2]) == 0.5 and float(former[-1]) == 0.0
    with pytest.raises(TypeError, match="sigma_range: must be a pair"):
        denoiser_sigma_range(type("Bad", (), {"sigma_range": 3.0})())

    class FormerFamily(EDMFamily):  # an earlier release's family: sigma_min / sigma_max, no sigma_range
        sigma_range = DiffusionFamily.sigma_range

    with pytest.warns(FutureWarning, match=r"FormerFamily.*`sigma_range`"):
        assert FormerFamily(sigma_min=0.01, sigma_max=50.0).precondition(_Probe()).sigma_range == (0.01, 50.0)


def test_ve_grid_is_respaced_on_the_net_range_as_edm_does():
    """Issue 40 item 8: NVlabs/edm's ``edm_sampler`` re-spaces the Karras grid on the net's
    supported range (sigma_min = max(0.002, net.sigma_min), sigma_max = min(80, net.sigma_max)).
    The VE family (range [0.02, 100]) therefore samples on the grid of EDM eq. 5 over [0.02, 80]
    -- written out here from the equation -- with no repeated step; VP and EDM keep [0.002, 80]."""
    import torch

    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    def eq5(n, lo, hi, rho=7.0):
        i = torch.arange(n, dtype=torch.float64)
        t = (hi ** (1 / rho) + i / (n - 1) * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho
        return torch.cat([t, torch.zeros(1, dtype=torch.float64)])

    for family, lo in (("ve", 0.02), ("vp", 0.002), ("edm", 0.002)):
        m = DiffusionModule(MLPNet(dim=4, hidden=8, depth=1), family=family)
        torch.testing.assert_close(m.sigmas, eq5(18, lo, 80.0), rtol=1e-15, atol=0)
        assert torch.all(torch.diff(m.sigmas) < 0)  # strictly decreasing: no zero-length step
