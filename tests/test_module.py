"""DiffusionModule: EMA, training reduces the loss, checkpoints keep the EMA, bad input fails early."""
import lightning.pytorch as pl
import pytest
import torch

from lightning_pfd.data.base import TensorDataModule
from lightning_pfd.diffusion import GaussianMixtureDenoiser
from lightning_pfd.modules import EMA, DiffusionModule, beta_from_halflife, ema_beta
from lightning_pfd.nets import MLPNet


def _gmm_data(n=512, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(3, d, generator=gen, dtype=torch.float64)
    covs = 0.05 * torch.eye(d, dtype=torch.float64).repeat(3, 1, 1)
    gmm = GaussianMixtureDenoiser(torch.ones(3), means, covs)
    return gmm, gmm.sample(torch.arange(n)).float(), gmm.sample(torch.arange(10**5, 10**5 + 128)).float()


def _trainer(tmp_path, **kw):
    kw.setdefault("max_epochs", 1)
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kw)


def test_ema_update_is_the_convex_blend():
    net = torch.nn.Linear(3, 2)
    ema = EMA(net)
    before = ema.shadow.weight.clone()
    with torch.no_grad():
        net.weight.add_(1.0)
    ema.update(net, beta=0.9)
    torch.testing.assert_close(ema.shadow.weight, 0.9 * before + 0.1 * net.weight)
    assert not ema.shadow.weight.requires_grad and int(ema.num_updates) == 1
    assert beta_from_halflife(512, 500) == pytest.approx(0.5 ** (512 / 500_000))


def test_ema_rampup_formulas():
    # decay mode: min(decay, (1 + n) / (10 + n)); without ramp-up the decay itself
    assert ema_beta(0, 64, decay=0.999) == pytest.approx(0.1)
    assert ema_beta(90, 64, decay=0.999) == pytest.approx(91 / 100)
    assert ema_beta(10**6, 64, decay=0.999) == pytest.approx(0.999)
    assert ema_beta(0, 64, decay=0.999, rampup=False) == 0.999
    # half-life mode (EDM): half-life capped at 5 % of the images seen after this step
    assert ema_beta(9, 100, halflife_kimg=500) == pytest.approx(0.5 ** (100 / (0.05 * 1000)))
    assert ema_beta(10**7, 100, halflife_kimg=500) == pytest.approx(beta_from_halflife(100, 500))


def test_ema_rampup_forgets_the_initial_weights(tmp_path):
    """The shadow starts at the initial weights; shift the live weights by +1 (lr ~ 0 keeps them
    there): after n steps the shadow moved by 1 - prod(beta_i). Constant 0.995 keeps 0.995**200
    = 37 % of the initial weights; the ramp-up keeps almost none."""
    import math
    _, train, val = _gmm_data(n=256)
    for rampup in (True, False):
        model = DiffusionModule(MLPNet(4, hidden=16, depth=1), ema_decay=0.995, ema_rampup=rampup, lr=1e-12)
        init = [p.detach().clone() for p in model.denoiser.parameters()]
        with torch.no_grad():
            for p in model.live_denoiser.parameters():
                p.add_(1.0)
        _trainer(tmp_path).fit(model, TensorDataModule(train, val, batch_size=32, samples_per_epoch=32 * 200, value_range=None))
        moved = torch.cat([(s - i).flatten() for s, i in zip(model.denoiser.parameters(), init)])
        kept = math.prod(ema_beta(i, 32, 0.995, rampup=rampup) for i in range(200))
        torch.testing.assert_close(moved, torch.full_like(moved, 1 - kept), rtol=0, atol=1e-5)
    assert math.prod(ema_beta(i, 32, 0.995) for i in range(200)) < 1e-3 < 0.995 ** 200


@pytest.mark.parametrize("family", ["edm", "vp"])
def test_training_reduces_frozen_validation_loss(tmp_path, family):
    torch.manual_seed(0)
    _, train, val = _gmm_data()
    dm = TensorDataModule(train, val, batch_size=64, samples_per_epoch=64 * 60, value_range=None)
    model = DiffusionModule(MLPNet(4, hidden=64, depth=2), family=family, lr=2e-3, ema_decay=0.9)
    dm.setup()
    seeds = torch.arange(len(val))
    before = model.loss_fn(model.denoiser, val, seeds=seeds).mean().item()
    _trainer(tmp_path, max_epochs=2).fit(model, dm)
    after = model.loss_fn(model.denoiser, val, seeds=seeds).mean().item()
    assert after < 0.7 * before, (before, after)
    # the EMA denoiser was trained and differs from the live weights
    assert int(model.ema.num_updates) == 120


def test_checkpoint_round_trip_keeps_ema_and_generates_same_samples(tmp_path):
    _, train, val = _gmm_data(n=128)
    dm = TensorDataModule(train, val, batch_size=32, value_range=None)
    model = DiffusionModule(MLPNet(4, hidden=32, depth=2), ema_decay=0.5, num_steps=6)
    trainer = _trainer(tmp_path)
    trainer.fit(model, dm)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = DiffusionModule.load_from_checkpoint(path, net=MLPNet(4, hidden=32, depth=2))
    torch.testing.assert_close(loaded.generate([1, 2, 3]), model.generate([1, 2, 3]))
    assert loaded.generate([1, 2, 3]).dtype == torch.float64


def test_generate_num_steps_rebuilds_the_karras_grid():
    model = DiffusionModule(MLPNet(3, hidden=16, depth=1), num_steps=18)
    from lightning_pfd.diffusion import karras_sigmas
    torch.testing.assert_close(model.generate([1, 2], num_steps=7), model.generate([1, 2], sigmas=karras_sigmas(7)))
    assert not torch.allclose(model.generate([1, 2], num_steps=7), model.generate([1, 2]))


def test_generate_is_per_seed_and_uses_the_ema_weights():
    model = DiffusionModule(MLPNet(3, hidden=16, depth=1), num_steps=5)
    a = model.generate(torch.arange(6), batch_size=4)
    b = model.generate(torch.tensor([4, 5]))
    torch.testing.assert_close(a[4:], b, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        for p in model.live_denoiser.parameters():
            p.add_(1.0)  # live weights change, EMA weights do not
    torch.testing.assert_close(model.generate(torch.tensor([4, 5])), b)


@pytest.mark.parametrize("kwargs,field", [
    ({"family": "edn"}, "family"), ({"sampler": "rk4"}, "sampler"), ({"lr": 0}, "lr"),
    ({"sigma_min": 5.0, "sigma_max": 1.0}, "sigma_min"), ({"ema_decay": 1.5}, "ema_decay"),
    ({"warmup_steps": -1}, "warmup_steps"), ({"num_steps": 0}, "num_steps")])
def test_bad_configuration_is_rejected_at_construction(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DiffusionModule(MLPNet(3, hidden=8, depth=1), **kwargs)


def test_shape_mismatch_fails_before_training(tmp_path):
    _, train, val = _gmm_data(n=64)
    dm = TensorDataModule(train, val, batch_size=32, value_range=None)
    model = DiffusionModule(MLPNet(5, hidden=8, depth=1))
    with pytest.raises(ValueError, match="net"):
        _trainer(tmp_path).fit(model, dm)
    assert int(model.ema.num_updates) == 0


def test_adam_with_linear_warmup():
    from types import SimpleNamespace
    from lightning_pfd.modules.optim import adam_with_warmup
    p = [torch.nn.Parameter(torch.zeros(3))]
    hp = SimpleNamespace(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, warmup_steps=4)
    cfg = adam_with_warmup(p, hp, torch.device("cpu"))
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert isinstance(adam_with_warmup(p, SimpleNamespace(**{**vars(hp), "warmup_steps": 0}), "cpu"),
                      torch.optim.Adam)
