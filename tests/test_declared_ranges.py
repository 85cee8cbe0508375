"""The ranges the evaluations, metrics, datamodules and monitors declare in their signatures:
a Python caller gets a ConfigError naming the argument (a monitor: its config field), before any
work, and jsonargparse -- the command line -- refuses the same value for the same field."""
import types

import pytest
import torch
from jsonargparse import ArgumentParser

from lightning_pfd.callbacks import GeneralizationMonitor, ICREarlyStopping, MemorizationMonitor, TailMonitor
from lightning_pfd.data import GaussianMixtureDataModule, HeavyTailedFieldDataModule
from lightning_pfd.data.base import TensorDataModule
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.tail import TailSettings
from lightning_pfd.metrics import InvariantContaminationRatio, LogAbsoluteDensityRatio, MemorizationRatio
from lightning_pfd.metrics.tails import RootMeanSquaredQuantileError

CASES = [  # (class, argument, refused value, a value it accepts)
    (TailSettings, "num_samples", 1, 2),
    (TailSettings, "eta", 1.0, 0.9),
    (TailSettings, "nonfinite", "zero", "drop"),
    (RootMeanSquaredQuantileError, "definition", "blg", "root_mean_levels"),
    (LogAbsoluteDensityRatio, "bandwidth", -0.5, "scott"),
    (LogAbsoluteDensityRatio, "panels", 0, 3),
    (MemorizationRatio, "criterion", "cosin", "nn_ratio"),
    (InvariantContaminationRatio, "tau", "autoo", 0.0),
    (TensorDataModule, "batch_size", 0, 1),
    (GaussianMixtureDataModule, "n_val", 0, 8),
    (HeavyTailedFieldDataModule, "marginal", "cauchy", "student_t"),
]

MONITOR_CASES = [  # (monitor, argument, refused value)
    (GeneralizationMonitor, "num_eval", 0),
    (GeneralizationMonitor, "sampler", "heunn"),
    (MemorizationMonitor, "chunk_size", 0),
    (TailMonitor, "reference", "test"),
    (ICREarlyStopping, "smoothing", 1.0),
]


@pytest.mark.parametrize("cls,arg,bad,good", CASES, ids=[f"{c[0].__name__}.{c[1]}" for c in CASES])
def test_python_refuses_with_the_argument_name(cls, arg, bad, good):
    with pytest.raises(ConfigError) as e:
        cls(**{arg: bad})
    assert e.value.field == arg and e.value.value == bad
    cls(**{arg: good})


@pytest.mark.parametrize("cls,arg,bad,good", CASES, ids=[f"{c[0].__name__}.{c[1]}" for c in CASES])
def test_command_line_refuses_the_same_value(cls, arg, bad, good):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "x")
    parser.parse_args([f"--x.{arg}", str(good)])
    with pytest.raises(Exception) as e:
        parser.parse_args([f"--x.{arg}", str(bad)])
    assert f"x.{arg}" in str(e.value)


@pytest.mark.parametrize("cls,arg,bad", MONITOR_CASES, ids=[f"{c[0].__name__}.{c[1]}" for c in MONITOR_CASES])
def test_a_monitor_names_its_argument(cls, arg, bad):
    """A monitor (a class or a preset function) names its own argument; the command line adds
    where it sits in the config (tests/test_cli.py)."""
    with pytest.raises(ConfigError) as e:
        cls(**{arg: bad})
    assert e.value.field == arg and e.value.value == bad


def test_flow_evaluation_names_its_arguments_and_the_models():
    """FlowEvaluation names its own arguments (``seed_offset``, ``num_eval``) and the model's
    arguments it refuses as ``model.<arg>`` (the command line adds ``init_args``)."""
    from lightning_pfd.evaluation.flow import FlowEvaluation

    data = torch.zeros(4, 2)
    with pytest.raises(ConfigError) as e:
        FlowEvaluation(data, num_eval=2, seed_offset=-1, use_cache=False)
    assert e.value.field == "seed_offset"
    with pytest.raises(ConfigError) as e:
        FlowEvaluation(data, num_eval=0, use_cache=False)
    assert e.value.field == "num_eval"
    with pytest.raises(ConfigError) as e:
        FlowEvaluation(num_eval=2, use_cache=False).compile_mode(types.SimpleNamespace(sample_compile="yes"))
    assert e.value.field == "model.sample_compile"


def test_the_parsed_config_holds_plain_numbers(tmp_path):
    """jsonargparse parses a ``PositiveInt`` value as an ``int`` subclass; the command line turns
    the parsed config back into built-in numbers, so what it saves (a trial's config YAML, the
    run's config, hyperparameters in a checkpoint loaded with ``weights_only=True``) holds only
    those. (A config given as a dict is normalised too: tests/test_sweep.py resumes a trial.)"""
    import io

    import yaml

    from lightning_pfd.launch.cli import PFDLightningCLI

    cfg = {"model": {"class_path": "lightning_pfd.modules.DiffusionModule",
                     "init_args": {"net": {"class_path": "lightning_pfd.nets.MLPNet",
                                           "init_args": {"dim": 2, "hidden": 8, "depth": 1}}}},
           "data": {"class_path": "lightning_pfd.data.GaussianMixtureDataModule",
                    "init_args": {"dim": 2, "n_train": 16, "batch_size": 8}},
           "trainer": {"default_root_dir": str(tmp_path / "run"), "logger": False}}
    cli = PFDLightningCLI(args=cfg, run=False)
    parsed = cli.config.data.init_args
    assert parsed.n_train == 16 and type(parsed.n_train) is int and type(parsed.batch_size) is int
    yaml.safe_dump(cli.config.as_dict())
    hp = dict(cli.datamodule.hparams)
    buf = io.BytesIO()
    torch.save({"datamodule_hyper_parameters": hp, "hyper_parameters": dict(cli.model.hparams)}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["datamodule_hyper_parameters"]["n_train"] == 16


def test_a_missing_file_a_datamodule_refuses_is_named_by_its_config_path(tmp_path):
    """A MissingFileError (also an OSError) raised in a datamodule's __init__ gets the config
    path of its field like any ConfigError."""
    from lightning_pfd.launch.cli import PFDLightningCLI
    from lightning_pfd.errors import MissingFileError

    cfg = {"model": {"class_path": "helpers.refusing.TinyModel"},
           "data": {"class_path": "lightning_pfd.data.TensorFileDataModule",
                    "init_args": {"path": str(tmp_path / "none.npz")}},
           "trainer": {"logger": False, "default_root_dir": str(tmp_path / "run")}}
    with pytest.raises(MissingFileError) as e:
        PFDLightningCLI(args=cfg, run=False)
    renamed = e.value
    assert isinstance(renamed, ConfigError) and renamed.field == "data.init_args.path"
    assert renamed.value == str(tmp_path / "none.npz")
