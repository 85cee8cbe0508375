"""Declared argument types and ranges: one declaration checked by jsonargparse (command line)
and by :func:`lightning_pfd.validation.check_args` (Python), with the same verdicts."""
from typing import Literal, Optional

import pytest
from jsonargparse import ArgumentParser

from lightning_pfd.evaluation import Evaluation
from lightning_pfd.errors import ConfigError
from lightning_pfd.validation import (ClosedUnitInterval, FinitePositiveFloat, HalfOpenUnitInterval, NonNegativeInt,
                                      PositiveFloat, PositiveInt, check_args, describe)


class Thing:
    def __init__(self, lr: PositiveFloat = 1e-3, steps: PositiveInt = 18, warmup: NonNegativeInt = 0,
                 p: ClosedUnitInterval = 0.5, decay: HalfOpenUnitInterval = 0.999,
                 kind: Literal["heun", "euler"] = "heun", cap: Optional[PositiveFloat] = None,
                 sigma: FinitePositiveFloat = 1.0, free: float = -3.0):
        check_args(Thing.__init__, locals())


CASES = [  # (argument, value, accepted?)
    ("lr", 0.1, True), ("lr", 2, True), ("lr", 0.0, False), ("lr", -1.0, False),
    ("steps", 1, True), ("steps", 0, False), ("steps", 2.5, False), ("steps", True, False),
    ("warmup", 0, True), ("warmup", -1, False),
    ("p", 0.0, True), ("p", 1.0, True), ("p", 1.5, False),
    ("decay", 0.0, True), ("decay", 1.0, False),
    ("kind", "euler", True), ("kind", "hen", False),
    ("cap", None, True), ("cap", 3.0, True), ("cap", -3.0, False),
    ("sigma", 80.0, True), ("sigma", float("inf"), False), ("sigma", float("nan"), False),
    ("free", -1e9, True),
]


@pytest.mark.parametrize("arg,value,ok", CASES)
def test_python_check_names_the_argument(arg, value, ok):
    if ok:
        Thing(**{arg: value})
        return
    with pytest.raises(ConfigError) as e:
        Thing(**{arg: value})
    assert e.value.field == arg and repr(e.value.value) == repr(value)
    assert isinstance(e.value, ValueError)


def _parser():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(Thing, "thing")
    return parser


@pytest.mark.parametrize("arg,value,ok", [c for c in CASES if not isinstance(c[1], bool)])
def test_command_line_gives_the_same_verdict(arg, value, ok):
    """The same declaration, parsed by jsonargparse: accepted exactly when check_args accepts,
    and a refusal names the config field."""
    parser = _parser()
    if ok:
        parser.parse_args([f"--thing.{arg}", "null" if value is None else str(value)])
        return
    with pytest.raises(Exception) as e:
        parser.parse_args([f"--thing.{arg}", "null" if value is None else str(value)])
    assert f"thing.{arg}" in str(e.value)


def test_wrong_kind_is_a_type_error_and_choices_suggest():
    with pytest.raises(TypeError):
        Thing(lr="fast")
    with pytest.raises(ConfigError) as e:
        Thing(kind="hen")
    assert e.value.suggestion == "did you mean 'heun'?"
    assert describe(Optional[PositiveFloat]) == "a number > 0 or None"


class EvenWidth(__import__("lightning.pytorch", fromlist=["LightningModule"]).LightningModule):
    """A module whose own check (not expressible as a type) names its argument only."""

    def __init__(self, width: PositiveInt = 2):
        super().__init__()
        if width % 2:
            raise ConfigError("width", "must be even", value=width)


@pytest.mark.parametrize("width,field", [(3, "model.init_args.width"), (-2, "model.init_args.width")])
def test_command_line_adds_the_component_path(width, field, tmp_path, capsys):
    """The module names ``width``; the command line reports where the user wrote it, whether
    jsonargparse (the declared range) or the module (its own rule) refused the value."""
    from lightning_pfd.launch.cli import PFDLightningCLI

    args = ["--model", f"{__name__}.EvenWidth", "--model.init_args.width", str(width),
            "--data", "lightning_pfd.data.GaussianMixtureDataModule", f"--trainer.default_root_dir={tmp_path / 'run'}"]
    with pytest.raises((ConfigError, SystemExit)) as e:
        PFDLightningCLI(args=args, run=False)
    if isinstance(e.value, ConfigError):  # the module's own rule
        assert e.value.field == field and e.value.value == width
    else:  # the declared range, refused while parsing
        assert e.value.code == 2 and field in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_config_file_value_is_named_by_its_path(tmp_path, capsys):
    """jsonargparse names a class_path argument by its bare name; the error says where the
    config file sets it."""
    from lightning_pfd.launch.cli import PFDLightningCLI

    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  class_path: {__name__}.EvenWidth\n  init_args:\n    width: -2\n"
                   "data: lightning_pfd.data.GaussianMixtureDataModule\n")
    with pytest.raises(SystemExit) as e:
        PFDLightningCLI(args=["--config", str(cfg)], run=False)
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'Parser key "model.init_args.width"' in err and "-2" in err


def test_a_range_declared_twice_is_one_type():
    """jsonargparse registers one type per range: a second declaration of the same range (in
    another module, under another name) is the first type, not an import-time error."""
    from lightning_pfd.validation import IntAtLeastTwo, ranged

    assert ranged("AtLeastTwoAgain", int, (">=", 2), "an integer >= 2") is IntAtLeastTwo
    Unit = ranged("UnitAgain", float, [(">=", 0), ("<", 1)], "a number in [0, 1)")
    assert Unit is HalfOpenUnitInterval


class CountedEvaluation(Evaluation):
    """An evaluation whose one argument has a declared range (nothing is measured here)."""

    def __init__(self, num_samples: PositiveInt = 4):
        check_args(CountedEvaluation.__init__, locals())

    def leaves(self):
        return ["x"]

    def prepare(self, datamodule, model, comm=None):
        pass

    def measure(self, model, comm=None):
        raise AssertionError("never measured: the config is refused while parsing")


@pytest.mark.parametrize("where", ["config", "option"])
def test_a_nested_class_argument_is_named_by_its_full_path(tmp_path, capsys, where):
    """A monitor's evaluation (a class inside a callback's arguments): a value its declared range
    refuses is named by where it sits, in the config file or on the command line."""
    from lightning_pfd.launch.cli import PFDLightningCLI

    value = -1 if where == "config" else 4
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model:\n  class_path: {__name__}.EvenWidth\n"
        "data: lightning_pfd.data.GaussianMixtureDataModule\n"
        "trainer:\n  callbacks:\n    - class_path: lightning_pfd.callbacks.EvaluationMonitor\n"
        f"      init_args:\n        evaluation:\n          class_path: {__name__}.CountedEvaluation\n"
        f"          init_args: {{num_samples: {value}}}\n")
    extra = ["--trainer.callbacks.evaluation.init_args.num_samples", "-1"] if where == "option" else []
    with pytest.raises(SystemExit) as e:
        PFDLightningCLI(args=["--config", str(cfg)] + extra, run=False)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "-1" in err, err
    expected = ("trainer.callbacks[EvaluationMonitor].evaluation.init_args.num_samples" if where == "config"
                else "trainer.callbacks.evaluation.init_args.num_samples")
    assert f'Parser key "{expected}"' in err, err
