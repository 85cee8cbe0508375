"""Issue 39 item 1: any torch.optim optimizer and LR schedule from the config and the command line.

Oracles: torch's own classes (the built optimizer *is* a ``torch.optim.SGD`` with the given
settings), the closed form of the cosine schedule, lr_k = lr (1 + cos(pi k / T)) / 2, and the
default Adam + warm-up built by ``adam_with_warmup`` itself. Bad values are refused at
construction, naming the field; a class path that is not an optimizer is never called."""
from __future__ import annotations

import math
import os

import pytest
import torch
import yaml

from lightning_pfd.checkpoint import load_checkpoint
from lightning_pfd.cli import main
from lightning_pfd.errors import ConfigError
from lightning_pfd.modules import DiffusionModule, LevyItoModule
from lightning_pfd.modules.optim import adam_with_warmup, configure_optimization
from lightning_pfd.nets import MLPNet
from test_reliability import _write_config

SGD = {"class_path": "torch.optim.SGD", "init_args": {"momentum": 0.9, "nesterov": True}}
COSINE = {"class_path": "torch.optim.lr_scheduler.CosineAnnealingLR", "init_args": {"T_max": 4}}


def _module(**kw):
    return DiffusionModule(MLPNet(4, hidden=8, depth=1), **kw)


def test_the_default_is_edms_adam_with_warmup_unchanged():
    m = _module(warmup_steps=3)
    assert m.hparams.optimizer is None and m.hparams.lr_scheduler is None
    got = m.configure_optimizers()
    ref = adam_with_warmup(list(m.trained_module.parameters()), m.hparams, m.device)
    assert type(got["optimizer"]) is torch.optim.Adam
    assert got["optimizer"].defaults == ref["optimizer"].defaults  # fused, lr, betas, weight decay
    assert got["lr_scheduler"]["interval"] == "step"


def test_sgd_with_momentum_and_a_cosine_schedule_are_built_from_plain_data():
    m = _module(lr=0.1, weight_decay=1e-4, optimizer=SGD, lr_scheduler=dict(COSINE, interval="epoch"))
    assert m.hparams.optimizer == {"class_path": "torch.optim.sgd.SGD", "init_args": SGD["init_args"]}
    cfg = m.configure_optimizers()
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]
    assert type(opt) is torch.optim.SGD
    assert (opt.defaults["lr"], opt.defaults["momentum"], opt.defaults["nesterov"],
            opt.defaults["weight_decay"]) == (0.1, 0.9, True, 1e-4)  # module lr / weight decay
    assert sched["interval"] == "epoch" and sched["frequency"] == 1
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched["scheduler"].step()
    assert lrs == pytest.approx([0.1 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(5)], abs=1e-15)


def test_a_bare_name_adamw_and_levy_modules_work():
    m = _module(optimizer={"class_path": "AdamW", "init_args": {"amsgrad": True}},
                lr_scheduler={"class_path": "StepLR", "init_args": {"step_size": 2, "gamma": 0.5}, "interval": "step"})
    opt = m.configure_optimizers()["optimizer"]
    assert type(opt) is torch.optim.AdamW and opt.defaults["amsgrad"] and opt.defaults["weight_decay"] == 0.0
    lev = LevyItoModule(MLPNet(4, hidden=8, depth=1), optimizer=SGD)
    assert type(lev.configure_optimizers()) is torch.optim.SGD
    assert lev.hparams_initial["optimizer"]["class_path"] == "torch.optim.sgd.SGD"  # what loggers write


@pytest.mark.parametrize("kw, field", [
    ({"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"momentum": -1.0}}}, "optimizer.init_args"),
    ({"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}}}, "optimizer.init_args.lr"),
    ({"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"momentun": 0.9}}}, "optimizer.init_args"),
    ({"optimizer": {"class_path": "torch.optim.NoSuchOpt"}}, "optimizer.class_path"),
    ({"optimizer": {"class_path": "torch.nn.Linear"}}, "optimizer.class_path"),
    ({"optimizer": {"init_args": {}}}, "optimizer"),
    ({"lr_scheduler": {"class_path": "CosineAnnealingLR"}}, "lr_scheduler.init_args"),  # T_max missing
    ({"lr_scheduler": dict(COSINE, interval="batch")}, "lr_scheduler.interval"),
    ({"lr_scheduler": dict(COSINE, frequency=0)}, "lr_scheduler.frequency"),
    ({"lr_scheduler": {"class_path": "ReduceLROnPlateau"}}, "lr_scheduler.monitor"),
    ({"lr_scheduler": COSINE, "warmup_steps": 10}, "warmup_steps"),
])
def test_bad_values_are_refused_at_construction_naming_the_field(kw, field):
    with pytest.raises(ConfigError) as err:
        _module(**kw)
    assert err.value.field == field, str(err.value)


def test_a_class_path_that_is_not_an_optimizer_is_never_called(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(a) or 0)
    for key in ("optimizer", "lr_scheduler"):
        with pytest.raises(ConfigError, match="not a class|is not a"):
            _module(**{key: {"class_path": "os.system", "init_args": {"command": f"touch {tmp_path}/x"}}})
    assert calls == [] and not (tmp_path / "x").exists()


def _run(d, monkeypatch, *args):
    monkeypatch.chdir(d)
    return main(["fit", "--config", "c.yaml", *args])


def test_sgd_cosine_from_the_command_line_and_from_yaml_agree_and_resume_is_guarded(tmp_path, monkeypatch, capsys,
                                                                                   caplog):
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    cli, yml = tmp_path / "cli", tmp_path / "yml"
    for d in (cli, yml):
        _write_config(d, epochs=1)
    text = (yml / "c.yaml").read_text().replace("    ema_decay: 0.99\n", "    ema_decay: 0.99\n"
        "    optimizer: {class_path: torch.optim.SGD, init_args: {momentum: 0.9}}\n"
        "    lr_scheduler: {class_path: torch.optim.lr_scheduler.CosineAnnealingLR, init_args: {T_max: 2}}\n")
    (yml / "c.yaml").write_text(text)
    flags = ["--model.init_args.optimizer.class_path", "torch.optim.SGD", "--model.init_args.optimizer.momentum", "0.9",
             "--model.init_args.lr_scheduler.class_path", "torch.optim.lr_scheduler.CosineAnnealingLR",
             "--model.init_args.lr_scheduler.init_args.T_max", "2"]
    assert _run(cli, monkeypatch, *flags) == 0 and _run(yml, monkeypatch) == 0
    a, b = (load_checkpoint(d / "run/checkpoints/last.ckpt") for d in (cli, yml))
    for ck in (a, b):
        assert ck["hyper_parameters"]["optimizer"] == {"class_path": "torch.optim.sgd.SGD", "init_args": {"momentum": 0.9}}
        assert ck["hyper_parameters"]["lr_scheduler"]["class_path"] == "torch.optim.lr_scheduler.CosineAnnealingLR"
        assert "momentum_buffer" in next(iter(ck["optimizer_states"][0]["state"].values()))
        assert ck["lr_schedulers"][0]["T_max"] == 2
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    hp = yaml.safe_load(next((cli / "run/csv").glob("version_0/hparams.yaml")).read_text())
    assert hp["optimizer"]["class_path"] == "torch.optim.sgd.SGD"  # what the loggers (and W&B) get
    capsys.readouterr()
    # another optimizer class on resume: refused by name, nothing written
    before = sorted(p.name for p in (yml / "run/checkpoints").iterdir())
    assert _run(yml, monkeypatch, "--ckpt_path", "last", "--trainer.max_epochs", "2",
                "--model.init_args.optimizer", "null") == 2
    err = capsys.readouterr().err
    assert "model.init_args.optimizer: checkpoint torch.optim.sgd.SGD, now torch.optim.adam.Adam" in err
    assert "--allow-optimizer-change" in err and "Traceback" not in err
    assert sorted(p.name for p in (yml / "run/checkpoints").iterdir()) == before
    # a changed init_arg is applied to the restored state
    assert _run(yml, monkeypatch, "--ckpt_path", "last", "--trainer.max_epochs", "2",
                "--model.init_args.optimizer.init_args.momentum", "0.5") == 0
    ck = load_checkpoint(yml / "run/checkpoints/last.ckpt")
    assert ck["epoch"] == 1 and ck["optimizer_states"][0]["param_groups"][0]["momentum"] == 0.5
    # asked for: a fresh Adam from the checkpoint's weights (the line is Lightning's rank-zero log)
    caplog.set_level("INFO")
    assert _run(yml, monkeypatch, "--ckpt_path", "last", "--trainer.max_epochs", "3", "--allow-optimizer-change",
                "--model.init_args.optimizer", "null", "--model.init_args.lr_scheduler", "null") == 0
    assert "--allow-optimizer-change: model.optimizer torch.optim.sgd.SGD -> torch.optim.adam.Adam" in caplog.text
    ck = load_checkpoint(yml / "run/checkpoints/last.ckpt")
    assert ck["epoch"] == 2 and "exp_avg" in next(iter(ck["optimizer_states"][0]["state"].values()))
    assert ck["optimizer_states"][0]["state"][0]["step"] == 10  # Adam's own count: one epoch, from zero


def test_the_papers_double_descent_gpu_config_builds_a_unet10_vp_student_with_sgd():
    """configs/experiments/double_descent_cifar10_gpu.yaml (issue 39 item 4; not run here): its
    model builds (the UNet-10 on the meta device) with the paper's family and optimizer."""
    import lightning.pytorch as pl

    from lightning_pfd.classpath import instantiate
    from lightning_pfd.launch import CONFIG_DIR
    from lightning_pfd.nets import count_parameters
    from lightning_pfd.sweeps.validate import build_net_meta

    cfg = yaml.safe_load((CONFIG_DIR / "experiments/double_descent_cifar10_gpu.yaml").read_text())
    assert cfg["trainer"]["max_epochs"] == 500 and cfg["data"]["init_args"]["n_train"] == 2 ** 16
    assert cfg["trainer"]["callbacks"][0]["init_args"]["num_eval"] == 10_000
    model = instantiate(cfg["model"], pl.LightningModule, net=build_net_meta)
    assert model.hparams.family == "vp" and model.hparams.optimizer["class_path"] == "torch.optim.sgd.SGD"
    assert model.sampler_settings.num_steps == 18
    assert abs(count_parameters(model.net) / 55.7e6 - 1) < 0.01  # UNet-10 of the paper (55.7 M)
