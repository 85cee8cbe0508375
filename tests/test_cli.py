"""The CLI: program name, embedded configs, a 2-epoch fit in-process, bad configuration fails early."""
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from lightning_pfd.cli import CONFIG_DIR, main

EMBEDDED = ["quickstart", "teacher_edm_digits", "distill_vp_digits", "edm_cifar10", "distill_vp_cifar10"]


def _tiny_config(tmp_path: Path, **overrides) -> Path:
    """A 2-epoch digits run with a small MLP, CSV logging into tmp_path."""
    cfg = {
        "seed_everything": 0,
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "devices": 1, "limit_train_batches": 4,
                    "limit_val_batches": 2, "default_root_dir": str(tmp_path / "run"),
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path / "run")}}},
        "model": {"class_path": "lightning_pfd.modules.DiffusionModule",
                  "init_args": {"net": {"class_path": "lightning_pfd.nets.MLPNet",
                                        "init_args": {"dim": 64, "hidden": 32, "depth": 2}},
                                "num_steps": 6}},
        "data": {"class_path": "lightning_pfd.data.DigitsDataModule",
                 "init_args": {"as_vector": True, "batch_size": 32}},
    }
    for dotted, value in overrides.items():
        node = cfg
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _run(argv):
    with mock.patch.object(sys, "argv", ["python -m lightning_pfd"]):
        return main(argv)


def test_help_names_the_program_and_extra_commands():
    out = subprocess.run([sys.executable, "-m", "lightning_pfd", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: python -m lightning_pfd" in out.stdout
    for name in ("fit", "validate", "test", "report", "icr-sweep", "pite"):
        assert name in out.stdout


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_configs_parse_with_print_config(name, capsys):
    assert (CONFIG_DIR / f"{name}.yaml").exists()
    with pytest.raises(SystemExit) as e:
        _run(["fit", "--config", name, "--print_config"])
    assert e.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("lightning_pfd.modules")


def test_two_epoch_fit_in_process_and_second_run_into_same_dir(tmp_path, capsys):
    cfg = _tiny_config(tmp_path)
    assert _run(["fit", "--config", str(cfg)]) == 0
    first = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    # Lightning's default checkpoint directory is per logger version: a second run writes next
    # to the first one and leaves its files byte-identical
    assert _run(["fit", "--config", str(cfg)]) == 0
    assert all(p.read_bytes() == b for p, b in first.items())
    metrics = list((tmp_path / "run").rglob("metrics.csv"))
    assert len(metrics) == 2
    text = metrics[0].read_text()
    assert "train/loss" in text and "val/loss" in text
    assert list((tmp_path / "run").rglob("*.ckpt"))


def _assert_fails_before_training(tmp_path, cfg, field, capsys):
    try:
        code = _run(["fit", "--config", str(cfg)])
    except SystemExit as e:  # parser errors exit from inside argparse
        code = e.code
    assert code == 2
    message = capsys.readouterr().err
    assert field in message, message  # (no-traceback is checked on real processes: test_reliability)
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("metrics.csv"))


@pytest.mark.parametrize("override,field", [
    ({"model.init_args.net": {"class_path": "lightning_pfd.nets.UNet",
                              "init_args": {"preset": "unet99", "img_resolution": 8, "in_channels": 1}}},
     "preset"),
    ({"data.init_args.n_train": 0}, "n_train"),
    ({"data.init_args.n_train": 100000}, "n_train"),
    ({"model.init_args.sigma_min": 100.0}, "sigma_min"),
    ({"model.init_args.precond": "edn"}, "precond"),
    ({"data": {"class_path": "lightning_pfd.data.CIFAR10DataModule",
               "init_args": {"root": "/nonexistent/cifar"}}}, "cifar"),
    ({"model.init_args.net": {"class_path": "lightning_pfd.nets.UNet",
                              "init_args": {"img_resolution": 16, "in_channels": 1, "model_channels": 8,
                                            "channel_mult": [1, 1], "num_blocks": 1}},
      "data.init_args": {"image_size": 8, "batch_size": 32}}, "net"),
])
def test_bad_configuration_fails_before_training(tmp_path, override, field, capsys):
    cfg = _tiny_config(tmp_path, **override)
    _assert_fails_before_training(tmp_path, cfg, field, capsys)


def test_unknown_config_name_lists_embedded_configs(capsys):
    assert _run(["fit", "--config", "no_such_config"]) == 2
    assert "quickstart" in capsys.readouterr().err


@pytest.mark.parametrize("override", [{"model.init_args.precond": "ve"},
                                      {"model.init_args.family": "ve",
                                       "model.init_args.family_args": {"sigma_max": 50.0}}])
def test_fit_a_family_named_in_the_yaml(tmp_path, override):
    import csv
    import math

    from lightning_pfd.checkpoint import load_checkpoint

    cfg = _tiny_config(tmp_path, **override)
    assert _run(["fit", "--config", str(cfg)]) == 0
    ckpt = load_checkpoint(sorted((tmp_path / "run").rglob("*.ckpt"))[0])
    hp = ckpt["hyper_parameters"]
    assert hp["precond"] == "ve"
    assert hp.get("family_args") == override.get("model.init_args.family_args")
    rows = list(csv.DictReader((next((tmp_path / "run").rglob("metrics.csv"))).open()))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and all(math.isfinite(v) for v in val)
