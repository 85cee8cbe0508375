"""The CLI: program name, embedded configs, a 2-epoch fit in-process, bad configuration fails early;
the command registry, one error handling shared by every command, the removed compatibility modules."""
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from lightning_pfd.cli import CONFIG_DIR, main
from lightning_pfd.errors import ConfigError

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
                         text=True, timeout=600)
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
    ({"model.init_args.sigma_min": 100.0}, "model.init_args.sigma_min"),
    ({"model.init_args.family": "edn"}, "model.init_args.family"),
    # the module and the family name their own argument; the command line adds the path
    ({"model.init_args.family": "ve", "model.init_args.family_args": {"sigma_max": -1.0}},
     "model.init_args.family_args.sigma_max"),
    ({"model.init_args.ema_decay": 1.5}, "model.init_args.ema_decay"),
    ({"model.init_args.on_divergence": "halt"}, "model.init_args.on_divergence"),
    ({"model.init_args.sample_compile": "fast"}, "model.init_args.sample_compile"),
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


@pytest.mark.parametrize("where", ["config", "option"])
def test_a_misspelt_declared_choice_suggests_the_close_one(tmp_path, where, capsys):
    """``sampler`` is declared as a set of choices: a close misspelling, in the config file or on
    the command line, is refused while parsing with the field and the suggestion."""
    cfg = _tiny_config(tmp_path, **({"model.init_args.sampler": "heunn"} if where == "config" else {}))
    args = ["fit", "--config", str(cfg)] + (["--model.init_args.sampler", "heunn"] if where == "option" else [])
    with pytest.raises(SystemExit) as e:
        _run(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'Parser key "model.init_args.sampler"' in err
    assert "did you mean 'heun'? (accepted: heun, euler)" in err
    assert not (tmp_path / "run").exists()


def test_debug_prints_the_traceback_of_a_refusal_while_parsing(tmp_path, capsys):
    """``--debug``: a value its declared type refuses while parsing shows the traceback too."""
    cfg = _tiny_config(tmp_path, **{"model.init_args.lr": 0})
    with pytest.raises(SystemExit) as e:
        _run(["fit", "--config", str(cfg), "--debug"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback (most recent call last)" in err
    assert "does not conform to restriction v>0" in err and not (tmp_path / "run").exists()


def test_unknown_config_name_lists_embedded_configs(capsys):
    assert _run(["fit", "--config", "no_such_config"]) == 2
    assert "quickstart" in capsys.readouterr().err


@pytest.mark.parametrize("override", [{"model.init_args.family": "ve"},
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
    assert hp["family"] == "ve" and "precond" not in hp
    # the declared types checked the YAML values; the module received (and saved) plain numbers
    assert type(hp["num_steps"]) is int and hp["num_steps"] == 6
    assert hp.get("family_args") == override.get("model.init_args.family_args")
    rows = list(csv.DictReader((next((tmp_path / "run").rglob("metrics.csv"))).open()))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and all(math.isfinite(v) for v in val)


# ----------------------------------------------------------------------------- commands
@pytest.fixture
def restore_threads():
    import torch

    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def test_registry_names_a_main_and_a_help_line_for_every_command():
    from lightning_pfd.commands import COMMANDS, command_for

    assert {"fit", "report", "icr-sweep", "pite", "sweep"} <= set(COMMANDS)
    for name, command in COMMANDS.items():
        assert callable(command.main()) and command.help and command.prog.endswith(f" {name}")
    for argv in ([], ["fit"], ["validate", "--config", "x"], ["test"], ["--help"]):
        assert command_for(argv) is COMMANDS["fit"]  # LightningCLI parses these
    assert command_for(["icr-sweep", "--ckpt", "x"]) is COMMANDS["icr-sweep"]


def test_top_level_help_imports_neither_torch_nor_lightning():
    """``python -m lightning_pfd --help`` lists every command without importing Lightning (which
    takes seconds); ``fit --help`` (LightningCLI's options) still does."""
    code = ("import sys, runpy; sys.argv = ['python -m lightning_pfd', '--help']\n"
            "try:\n    runpy.run_module('lightning_pfd', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('LOADED', sorted(m for m in ('torch', 'lightning', 'lightning.pytorch', "
            "'jsonargparse') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "LOADED []", out.stdout[-500:]
    assert "usage: python -m lightning_pfd" in out.stdout
    for name in ("fit", "validate", "test", "predict", "report", "icr-sweep", "pite", "sweep"):
        assert f"  {name} " in out.stdout, name
    code = ("import sys\nfrom lightning_pfd.cli import main\n"
            "try:\n    main(['fit', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('LOADED', 'lightning.pytorch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip().splitlines()[-1] == "LOADED True" and "--trainer.max_epochs" in out.stdout


def test_entry_point_imports_neither_torch_nor_lightning():
    code = ("import sys; import lightning_pfd.cli, lightning_pfd.commands; "
            "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


REMOVED_MODULES = ["lightning_pfd.lightning_cli", "lightning_pfd.experiments_cli",
                   "lightning_pfd.callbacks.icr_sweep", "lightning_pfd.sweeps.command",
                   "lightning_pfd.diffusion.precond", "lightning_pfd.diffusion.loss"]


def test_removed_compatibility_modules_are_gone_and_unreferenced():
    """The commands live in lightning_pfd.commands only (no compatibility modules before 1.0):
    neither the files nor a mention of their import paths in the code, configs or docs."""
    root = Path(__file__).resolve().parent.parent
    assert [m for m in REMOVED_MODULES if (root / (m.replace(".", "/") + ".py")).exists()] == []
    texts = [root / "README.md", *[p for d in ("lightning_pfd", "docs", "configs", "callbacks",
                                               "experiments", "benchmarks")
                                  for p in (root / d).rglob("*") if p.suffix in (".py", ".md", ".yaml")]]
    hits = [f"{p.relative_to(root)}: {m}" for p in texts for m in REMOVED_MODULES
            if re.search(re.escape(m) + r"\b", p.read_text(errors="replace"))]
    assert hits == []


def test_negative_values_join_their_option():
    from lightning_pfd.launch.cli import join_negative_values

    assert join_negative_values(["--lr", "-1e-3"]) == ["--lr=-1e-3"]


#: (argv, the start of stderr): report prints the bare one-line block; the others name the program
COMMAND_ERRORS = [
    (["report", "/nonexistent/run"], "error: run_dir: '/nonexistent/run' does not exist\n"),
    (["icr-sweep", "--ckpt", "/nonexistent.ckpt", "--data", "digits"],
     "python -m lightning_pfd icr-sweep: error: --ckpt: no such checkpoint file\n"),
    (["pite", "--num-samples", "100", "--n-train", "64"],
     "python -m lightning_pfd pite: error: --num-samples: must be < --n-train (64)"),
    (["fit", "--config", "no_such_config"], "python -m lightning_pfd: error: --config: no such file"),
    (["sweep", "--config", "no_such_sweep"], "python -m lightning_pfd sweep: error: --config: no such"),
    (["fit", "--threads", "0"], "python -m lightning_pfd: error: --threads:"),
]


@pytest.mark.parametrize("argv, start", COMMAND_ERRORS)
def test_one_error_handling_for_every_command(argv, start, capsys, monkeypatch, restore_threads):
    from lightning_pfd.commands import COMMANDS

    monkeypatch.delenv("LIGHTNING_PFD_DEBUG", raising=False)
    assert _run(argv) == 2
    err = capsys.readouterr().err
    if COMMANDS[argv[0]].threaded and "--threads" not in argv:  # the threads line comes first
        first, err = err.split("\n", 1)
        assert first.startswith("[lightning_pfd] ") and "CPU thread" in first
    assert err.startswith(start) and "Traceback" not in err, err
    hint = "(run with --debug or LIGHTNING_PFD_DEBUG=1 for the traceback)"
    assert err.splitlines()[-1] == hint if argv[0] != "report" else len(err.splitlines()) == 1
    # --debug anywhere on the line, or the environment variable: the error itself, traceback and all
    for debug_argv in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(ConfigError):
            _run(debug_argv)
    if "--threads" not in argv:  # the command's own main (as tests and scripts call it) too
        with pytest.raises(ConfigError):
            COMMANDS[argv[0]].main()([*(argv if argv[0] == "fit" else argv[1:]), "--debug"])
    monkeypatch.setenv("LIGHTNING_PFD_DEBUG", "1")
    with pytest.raises(ConfigError):
        _run(argv)


#: (argv, the error line): a range or choice declared as the option's type, refused by argparse
OPTION_ERRORS = [
    (["pite", "--eta", "1.5"], "python -m lightning_pfd pite: error: --eta: must be a number in (0, 1); got '1.5'"),
    (["pite", "--max-steps", "0"], "python -m lightning_pfd pite: error: --max-steps: must be an integer > 0; got '0'"),
    (["pite", "--alpha", "2.5"], "python -m lightning_pfd pite: error: --alpha: must be a number in (1, 2]; got '2.5'"),
    (["icr-sweep", "--ckpt", "m.ckpt", "--data", "digits", "--sigmas", "0.1", "inf"],
     "python -m lightning_pfd icr-sweep: error: --sigmas: must be a finite number > 0; got 'inf'"),
    (["icr-sweep", "--ckpt", "m.ckpt", "--data", "digits", "--level", "9"],
     "python -m lightning_pfd icr-sweep: error: --level: invalid choice: 9 (choose from 0, 1, 2, 3, 4, 5)"),
]


@pytest.mark.parametrize("argv, line", OPTION_ERRORS)
def test_option_types_refuse_a_value_naming_option_and_range(argv, line, capsys, monkeypatch, restore_threads):
    """The option's declared type refuses the value while parsing: status 2 (returned by the
    command's main), one block naming the option, the value and what is accepted."""
    monkeypatch.delenv("LIGHTNING_PFD_DEBUG", raising=False)
    assert _run(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[lightning_pfd] ")]
    assert err[0] == line and len(err) == 2 and "--help" in err[1], err


def test_help_shows_the_declared_ranges(capsys):
    from lightning_pfd.commands import icr_sweep, pite, typed
    from lightning_pfd.validation import PositiveInt

    text = " ".join(pite.build_parser().format_help().split())
    assert "--eta ETA RMSQE tail level, a number in (0, 1)" in text
    assert "stability index of the LIM row, in (1, 2]" in text
    text = " ".join(icr_sweep._parser().format_help().split())
    assert "--seed SEED an integer >= 0" in text and "--level {0,1,2,3,4,5}" in text
    assert typed(PositiveInt)("3") == 3 and type(typed(PositiveInt)("3")) is int  # plain values


def test_renamed_fields_names_what_the_user_typed():
    """A command maps an argument to its flag; an error about any other field passes unchanged;
    the error keeps its class, value, accepted values, suggestion and cause."""
    from lightning_pfd.errors import renamed_fields

    flags = {"view_tap": "--view-tap", "seed": "--seed"}
    with pytest.raises(ConfigError) as err, renamed_fields(flags):
        raise ConfigError("view_tap", "unknown tap", value="midle", accepted=["middle", "out"])
    e = err.value  # everything but the field is kept
    assert (e.field, e.problem, e.value, e.accepted) == ("--view-tap", "unknown tap", "midle",
                                                         ["middle", "out"])
    assert e.suggestion == "did you mean 'middle'?"
    with pytest.raises(ConfigError) as err, renamed_fields(flags):
        raise ConfigError("model", "has no denoiser", value="LevyItoModule")  # not a named one
    assert err.value.field == "model"
    with pytest.raises(ConfigError) as err, renamed_fields(flags):
        try:
            int("x")
        except ValueError as cause:
            raise ConfigError("seed", "not an integer") from cause
    assert err.value.field == "--seed" and isinstance(err.value.__cause__, ValueError)
    assert not err.value.has_value and "got" not in str(err.value)
    with pytest.raises(TypeError, match="mapping"), renamed_fields("trainer.callbacks[X]."):
        pass  # one shape: a prefix or a function is refused


def test_pite_has_an_sbm_row_for_every_registered_family(tmp_path):
    from lightning_pfd.commands.pite import _cli_args, _label, _rows, build_parser
    from lightning_pfd.diffusion.families import family_names
    from lightning_pfd.launch.cli import PFDLightningCLI

    names = list(family_names())
    assert {"edm", "vp", "ve"} <= set(names)
    a = build_parser().parse_args(["--out", str(tmp_path), "--crop-size", "8", "--n-train", "16",
                                   "--sbm-families", ",".join(names)])
    rows = _rows(a)
    assert [r[0] for r in rows] == [f"sbm_{q}" for q in names] + ["lim"]
    for q, (name, cfg, extra) in zip(names, rows):
        with mock.patch.object(sys, "argv", ["x"]):
            model = PFDLightningCLI(args=_cli_args(a, cfg, name, extra), run=False).model
        assert model.family.name == q and model.hparams.family == q
        assert _label({}, name) == f"SBM ({q.upper()})"
    with pytest.raises(ConfigError) as err:
        _rows(build_parser().parse_args(["--sbm-families", "edn"]))
    assert err.value.field == "--sbm-families" and err.value.accepted == names
    assert err.value.suggestion == "did you mean 'edm'?"


def test_known_start_up_noise_is_silenced_by_exact_message_only():
    """Lightning's litlogger tip and torch's pytree LeafSpec deprecation are dropped by message;
    other rank-zero messages and warnings stay."""
    import io
    import logging
    import warnings

    from lightning.pytorch.utilities import rank_zero_info

    from lightning_pfd.launch import quiet_known_noise

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_known_noise()
            quiet_known_noise()  # idempotent
            rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
            rank_zero_info("GPU available: False, used: False")
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use TreeSpec", FutureWarning)
            warnings.warn("another deprecation", FutureWarning)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for f in [f for f in logger.filters if type(f).__name__ == "_DropMessage"]:
            logger.removeFilter(f)
    assert buf.getvalue() == "GPU available: False, used: False\n"
    assert [str(w.message) for w in caught] == ["another deprecation"]


def test_a_config_without_data_is_refused_before_anything_is_written(tmp_path, capsys):
    """A model-only config (docs/extending.md's iddpm.yaml alone) used to fail after Lightning
    had written lightning_logs/version_0, with a train_dataloader traceback."""
    cfg = yaml.safe_load(_tiny_config(tmp_path).read_text())
    del cfg["data"]
    p = tmp_path / "model_only.yaml"
    p.write_text(yaml.safe_dump(cfg))
    _assert_fails_before_training(tmp_path, p, "no data", capsys)
    assert not (tmp_path / "run").exists() and not list(tmp_path.rglob("version_0"))


def test_fit_help_starts_with_what_most_runs_need():
    """``fit --help``: a one-line usage, then the options most runs need (lightning_pfd's own
    --threads / --overwrite / --debug included), then LightningCLI's full list."""
    out = subprocess.run([sys.executable, "-m", "lightning_pfd", "fit", "--help"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("usage: python -m lightning_pfd fit [--config FILE|NAME]") and lines[1] == ""
    head = "\n".join(lines[:16])
    for flag in ("--config FILE|NAME", "--trainer.max_epochs N", "--ckpt_path last", "--overwrite",
                 "--threads N|auto", "--debug", "--print_config"):
        assert f"\n  {flag} " in head, flag
    assert "--trainer.max_epochs MAX_EPOCHS" not in head  # LightningCLI's list comes after
    assert "--trainer.max_epochs MAX_EPOCHS" in out.stdout and "--model CONFIG" in out.stdout
    # the package's modules and datamodules are listed as --model / --data subclasses (issue 40 item 14)
    flat = " ".join(out.stdout.split())
    for cls in ("lightning_pfd.modules.DiffusionModule", "lightning_pfd.modules.LevyItoModule",
                "lightning_pfd.data.DigitsDataModule", "lightning_pfd.data.TeacherDistillationDataModule"):
        assert cls in flat, cls
    # validate has no --overwrite (fit only)
    val = subprocess.run([sys.executable, "-m", "lightning_pfd", "validate", "--help"], capture_output=True,
                         text=True, timeout=600)
    assert val.returncode == 0 and "--overwrite" not in "\n".join(val.stdout.splitlines()[:16])


#: what the libraries printed at start-up that a user cannot act on (issue 22, item 6)
START_UP_NOISE = ("litlogger", "LeafSpec", "anonymous setting", "wandb:", "Tracking run with wandb",
                  "WANDB_MODE=online", "exists and is not empty")


def test_quickstart_start_up_prints_our_line_first_and_no_library_noise(tmp_path):
    """A real ``fit`` of the quickstart (cut to 2 steps) without W&B credentials: the first line
    is ours, none of the known library messages appears, and our closing lines say how to
    upload the offline W&B run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(OMP_NUM_THREADS="1", NETRC=str(tmp_path / "no-netrc"))
    out = subprocess.run([sys.executable, "-m", "lightning_pfd", "fit", "--config",
                          str(CONFIG_DIR / "quickstart.yaml"), "--trainer.max_epochs", "1",
                          "--trainer.limit_train_batches", "2", "--trainer.log_every_n_steps", "1"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    text = out.stdout
    assert out.returncode == 0, text[-3000:]
    assert text.splitlines()[0].startswith("[lightning_pfd] "), text[:500]
    assert [n for n in START_UP_NOISE if n in text] == [], text
    assert "W&B ran offline (no credentials): upload later with `wandb login`" in text
    assert list((tmp_path / "runs" / "quickstart" / "wandb").glob("offline-run-*"))  # W&B did log


def test_a_missing_file_refused_by_a_datamodule_is_named_by_its_config_path(tmp_path):
    """A MissingFileError (a ConfigError that is also a FileNotFoundError) raised in a
    datamodule's ``__init__`` keeps its class and gets the datamodule's config path."""
    from lightning_pfd.errors import MissingFileError
    from lightning_pfd.launch.cli import PFDLightningCLI

    cfg = {"model": {"class_path": "helpers.refusing.TinyModel"},
           "data": {"class_path": "helpers.refusing.NeedsAFile", "init_args": {"ckpt": "nowhere.ckpt"}},
           "trainer": {"logger": False, "default_root_dir": str(tmp_path / "run")}}
    with mock.patch.object(sys, "argv", ["lightning_pfd"]), pytest.raises(MissingFileError) as e:
        PFDLightningCLI(args=cfg, run=False)
    err = e.value
    assert isinstance(err, FileNotFoundError) and err.field == "data.init_args.ckpt"
    assert err.value == "nowhere.ckpt" and str(err).startswith("data.init_args.ckpt: no such file")
