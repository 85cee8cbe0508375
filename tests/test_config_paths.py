"""A class names its own argument only; the command line (launch/cli.py) adds where the class
sits in the config: ``model.init_args.<arg>``, ``data.init_args.<arg>``,
``trainer.callbacks[<Name>].<arg>`` (Name: the class_path the config gives, a class or a factory
function), while the model, the datamodule and each callback are built and in each callback's
pre-flight ``check_setup``; ``model.<arg>`` / ``data.<arg>`` (an argument of the model / the
datamodule that another component refuses) become ``model.init_args.<arg>`` /
``data.init_args.<arg>``. The components are in tests/helpers/refusing.py."""
from __future__ import annotations

import sys
from unittest import mock

import pytest
import yaml

from lightning_pfd.errors import ConfigError, MissingFileError
from lightning_pfd.launch.cli import PFDLightningCLI
from lightning_pfd.launch.paths import callback_path, check_callbacks, config_path

HELPERS = "helpers.refusing"


def _config(tmp_path, model=None, data=None, callbacks=(), logger=False) -> dict:
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "logger": logger,
                    "default_root_dir": str(tmp_path / "run"), "enable_progress_bar": False,
                    "enable_model_summary": False, "enable_checkpointing": False, "log_every_n_steps": 1,
                    "callbacks": [{"class_path": f"{HELPERS}.{name}", "init_args": dict(args)}
                                  for name, args in callbacks]},
        "model": {"class_path": f"{HELPERS}.TinyModel", "init_args": dict(model or {})},
        "data": {"class_path": f"{HELPERS}.TinyData", "init_args": dict(data or {})},
    }


def _refusal(cfg: dict, fit: bool = False) -> ConfigError:
    with mock.patch.object(sys, "argv", ["lightning_pfd"]), pytest.raises(ConfigError) as e:
        PFDLightningCLI(args={"fit": cfg}) if fit else PFDLightningCLI(args=cfg, run=False)
    return e.value


def test_a_models_refusal_is_named_by_its_config_path(tmp_path):
    err = _refusal(_config(tmp_path, model={"width": 0}))
    assert err.field == "model.init_args.width" and err.value == 0


def test_a_datamodules_refusal_is_named_by_its_config_path(tmp_path):
    err = _refusal(_config(tmp_path, data={"n": 0}))
    assert err.field == "data.init_args.n" and err.value == 0
    err = _refusal(_config(tmp_path, data={"n": 0}), fit=True)  # the same under a subcommand
    assert err.field == "data.init_args.n"


def test_a_missing_file_refused_by_a_datamodule_keeps_its_class(tmp_path):
    cfg = _config(tmp_path)
    cfg["data"] = {"class_path": f"{HELPERS}.NeedsAFile", "init_args": {"ckpt": "nowhere.ckpt"}}
    err = _refusal(cfg)
    assert isinstance(err, MissingFileError) and isinstance(err, FileNotFoundError)
    assert err.field == "data.init_args.ckpt" and str(err).startswith("data.init_args.ckpt: no such file")


@pytest.mark.parametrize("name", ["TapMonitor", "tap_monitor"])  # a class, a factory function
def test_a_callbacks_refusal_is_named_by_its_entry_in_the_config(tmp_path, name):
    err = _refusal(_config(tmp_path, callbacks=[("TapMonitor", {}), (name, {"tap": "midd"})]))
    assert err.field == f"trainer.callbacks[{name}].tap"
    assert (err.value, err.suggestion) == ("midd", "did you mean 'mid'?")


@pytest.mark.parametrize("name", ["TapMonitor", "tap_monitor"])
def test_a_callbacks_preflight_refusal_is_named_by_its_entry_in_the_config(tmp_path, name):
    cfg = _config(tmp_path, callbacks=[(name, {"stride": 9})])
    err = _refusal(cfg, fit=True)
    assert err.field == f"trainer.callbacks[{name}].stride" and "training set (8 samples)" in err.problem
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_a_model_argument_a_callback_refuses_is_named_by_the_models_config_path(tmp_path):
    cfg = _config(tmp_path, model={"num_steps": 4}, callbacks=[("tap_monitor", {"min_steps": 10})])
    err = _refusal(cfg, fit=True)
    assert err.field == "model.init_args.num_steps" and err.value == 4


def test_the_command_line_prints_the_config_path(tmp_path, capsys):
    from lightning_pfd.cli import main

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, callbacks=[("tap_monitor", {"stride": 9})])))
    with mock.patch.object(sys, "argv", ["python -m lightning_pfd"]):
        assert main(["fit", "--config", str(path)]) == 2
    assert "error: trainer.callbacks[tap_monitor].stride: larger than the training set" in capsys.readouterr().err


def test_components_built_one_at_a_time_are_the_ones_the_run_uses(tmp_path):
    """Lightning's instantiator still builds the model (``_class_path`` in its hparams), the
    trainer's callbacks are the objects built from the config, and config.yaml lists them as
    the config gives them."""
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path / "run")}}
    cfg = _config(tmp_path, callbacks=[("tap_monitor", {"tap": "out"}), ("TapMonitor", {})], logger=logger)
    with mock.patch.object(sys, "argv", ["lightning_pfd"]):
        cli = PFDLightningCLI(args={"fit": cfg})
    assert cli.model.hparams["_class_path"] == f"{HELPERS}.TinyModel"
    built = [cb for cb, _entry in cli.configured_callbacks]
    assert [cb.tap for cb in built] == ["out", "mid"] and all(any(cb is c for c in cli.trainer.callbacks) for cb in built)
    saved = yaml.safe_load(next((tmp_path / "run").rglob("config.yaml")).read_text())
    assert [c["class_path"] for c in saved["trainer"]["callbacks"]] == [f"{HELPERS}.tap_monitor", f"{HELPERS}.TapMonitor"]
    assert saved["model"]["class_path"] == f"{HELPERS}.TinyModel"


def test_config_path_rules():
    net = {"class_path": "x.Net", "init_args": {"preset": "unet9", "width": 2}}
    model = {"class_path": "x.Module", "init_args": {"net": net, "width": 3, "family_args": {}}}
    assert config_path("width", "model.init_args", model) == "model.init_args.width"  # its own first
    assert config_path("preset", "model.init_args", model) == "model.init_args.net.init_args.preset"
    assert config_path("family_args.sigma_max", "model.init_args", model) == "model.init_args.family_args.sigma_max"
    assert config_path("tap", "trainer.callbacks[ICRMonitor]") == "trainer.callbacks[ICRMonitor].tap"
    assert config_path("model.num_steps", "trainer.callbacks[X]") == "model.init_args.num_steps"
    assert config_path("data.gen_seed_offset") == "data.init_args.gen_seed_offset"
    for kept in ("model.init_args.net", "model", "data (TinyData)", "--tap", "trainer.max_epochs", "ckpt_path"):
        assert config_path(kept, "trainer.callbacks[X]") == kept


def test_check_callbacks_names_a_callback_by_its_entry_else_by_its_class():
    from types import SimpleNamespace

    from helpers.refusing import TapMonitor

    cb = TapMonitor(stride=9)
    trainer = SimpleNamespace(callbacks=[cb])
    data, model = SimpleNamespace(n=8), SimpleNamespace(hparams={"num_steps": 4})
    with pytest.raises(ConfigError) as e:
        check_callbacks(trainer, model, data, configured=[(cb, {"class_path": f"{HELPERS}.tap_monitor"})])
    assert e.value.field == "trainer.callbacks[tap_monitor].stride"
    with pytest.raises(ConfigError) as e:
        check_callbacks(SimpleNamespace(callbacks=[TapMonitor(stride=9)]), model, data)  # added by the CLI
    assert e.value.field == "trainer.callbacks[TapMonitor].stride"


def test_callback_path_names_the_entry_else_the_preset_else_the_class():
    """Every place that names a callback's argument (the pre-flight, the monitored-key and output
    checks, --run_dir) goes through callback_path: a preset monitor is named as it is configured."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_pfd.callbacks import EvaluationMonitor, ICRMonitor
    from lightning_pfd.launch.run_checks import check_monitored_keys

    icr = ICRMonitor(num_images=4)
    assert callback_path(icr, arg="tap") == "trainer.callbacks[ICRMonitor].tap"
    assert callback_path(icr, {"class_path": "my.own_icr"}) == "trainer.callbacks[own_icr]"
    assert callback_path(None, {"init_args": {}}, "x") == "trainer.callbacks[?].x"
    plain = EvaluationMonitor(icr.evaluation, name="mine")
    assert callback_path(plain) == "trainer.callbacks[EvaluationMonitor]"
    ckpt = ModelCheckpoint(monitor="icr/nope", dirpath=None)
    trainer = type("T", (), {"callbacks": [icr, ckpt], "checkpoint_callbacks": [ckpt]})()
    with pytest.raises(ConfigError) as e:
        check_monitored_keys(trainer)
    assert e.value.field == "trainer.callbacks[ModelCheckpoint].monitor"


def test_a_duplicated_preset_monitor_is_named_as_configured(tmp_path):
    """Lightning refuses two callbacks with one checkpoint state key; the message names the
    configured preset (the callback's class is EvaluationMonitor)."""
    cfg = _config(tmp_path)
    icr = {"class_path": "lightning_pfd.callbacks.ICRMonitor", "init_args": {"num_images": 4}}
    cfg["trainer"]["callbacks"] = [dict(icr), dict(icr)]
    err = _refusal(cfg)
    assert err.field == "trainer.callbacks[ICRMonitor]" and "appears twice" in err.problem


def test_a_monitor_refusing_the_datamodules_data_names_the_data():
    """What an evaluation reads from the datamodule is the data's, not a monitor argument: the
    training set is ``data``, its value range ``data.init_args.value_range`` (a datamodule
    without weak references works too: it is checked as new each time)."""
    from types import SimpleNamespace

    import torch

    from lightning_pfd.callbacks import ICRMonitor, MemorizationMonitor, TailMonitor

    class Model(torch.nn.Module):
        device = torch.device("cpu")

        def generate(self, seeds, batch_size=256, num_steps=None):
            return torch.zeros(len(seeds), 3)

    model = Model()
    trainer = SimpleNamespace(global_rank=0, world_size=1, strategy=None)
    for monitor, dm, field in ((ICRMonitor(), SimpleNamespace(train_data=torch.randn(1, 3)), "data"),
                               (MemorizationMonitor(criterion="nn_ratio", num_samples=1),
                                SimpleNamespace(train_data=torch.randn(1, 3)), "trainer.callbacks[MemorizationMonitor].criterion"),
                               (TailMonitor(num_samples=4), SimpleNamespace(train_data=torch.randn(40, 3), value_range=(1, 0)),
                                "data.init_args.value_range")):
        trainer.callbacks = [monitor]
        with pytest.raises(ConfigError) as e:
            check_callbacks(trainer, model, dm)
        assert e.value.field == field, (monitor.preset, str(e.value))


def test_a_nets_refusal_is_named_by_its_nested_config_path(tmp_path):
    """The U-Net names its argument (a ConfigError, still a ValueError for Python callers); the
    command line finds it inside the model's net."""
    cfg = _config(tmp_path)
    cfg["model"] = {"class_path": "lightning_pfd.modules.DiffusionModule", "init_args": {"net": {
        "class_path": "lightning_pfd.nets.UNet",
        "init_args": {"img_resolution": 10, "in_channels": 1, "model_channels": 8, "channel_mult": [1, 2, 2],
                      "num_blocks": 1, "attn_resolutions": []}}}}
    err = _refusal(cfg)
    assert err.field == "model.init_args.net.init_args.img_resolution" and err.value == 10


def test_a_typo_inside_a_config_file_names_the_file_the_line_and_the_close_argument(tmp_path, monkeypatch, capsys):
    """Issue 40 item 14: `Option 'num_evl' is not accepted` said neither where nor what was meant."""
    from lightning_pfd.cli import main
    from test_reliability import _write_config

    _write_config(tmp_path, epochs=1, monitors=True)
    text = (tmp_path / "c.yaml").read_text()
    line = next(i + 1 for i, t in enumerate(text.splitlines()) if "num_eval: 16" in t)
    (tmp_path / "c.yaml").write_text(text.replace("num_eval: 16", "num_evl: 16"))
    monkeypatch.chdir(tmp_path)
    try:
        status = main(["fit", "--config", "c.yaml"])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert (f"trainer.callbacks[GeneralizationMonitor].init_args.num_evl in c.yaml, line {line}: "
            "did you mean num_eval?") in err
