"""``fit --run_dir PATH``: every output path of a config moves into PATH (the sweeps' rule: the part
below default_root_dir kept, another path by its last name), the W&B run is named after it, and
the parsed CLI builds a trainer whose loggers, checkpoints and report write there."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lightning_pfd.launch import CONFIG_DIR
from lightning_pfd.launch.run_dir import OUTPUT_PATH_KEYS, relocate, relocated_path
from lightning_pfd.errors import ConfigError

QUICKSTART = yaml.safe_load((CONFIG_DIR / "quickstart.yaml").read_text())


def _paths(cfg: dict) -> dict:
    t = cfg["trainer"]
    out = {"default_root_dir": t["default_root_dir"]}
    for lg in t["logger"]:
        out[lg["class_path"].rsplit(".", 1)[-1]] = lg["init_args"]["save_dir"]
    for cb in t["callbacks"]:
        for k in OUTPUT_PATH_KEYS:
            if k in (cb.get("init_args") or {}):
                out[f"{cb['class_path'].rsplit('.', 1)[-1]}.{k}"] = cb["init_args"][k]
    return out


def test_every_output_of_the_quickstart_moves():
    cfg = copy.deepcopy(QUICKSTART)
    assert set(_paths(cfg).values()) <= {"runs/quickstart", "runs/quickstart/checkpoints",
                                         "runs/quickstart/report"}
    changed = relocate(cfg, "elsewhere/n4096")
    assert _paths(cfg) == {"default_root_dir": "elsewhere/n4096", "AutoWandbLogger": "elsewhere/n4096",
                           "CSVLogger": "elsewhere/n4096",
                           "RegimeMonitor.report_dir": "elsewhere/n4096/report",
                           "EpochCheckpoint.dirpath": "elsewhere/n4096/checkpoints"}
    assert cfg["trainer"]["logger"][0]["init_args"]["name"] == "n4096"  # the W&B run's name
    assert ("trainer.callbacks[EpochCheckpoint].dirpath", "runs/quickstart/checkpoints",
            "elsewhere/n4096/checkpoints") in changed
    assert relocate(cfg, "elsewhere/n4096/") == []  # again (a resume): nothing moves
    assert cfg["data"] == QUICKSTART["data"] and cfg["model"] == QUICKSTART["model"]


def test_paths_outside_the_root_go_by_their_last_name_and_an_empty_path_is_refused(tmp_path):
    assert relocated_path("runs/q/ckpts/best", "runs/q", Path("new")) == "new/ckpts/best"
    assert relocated_path("./runs/q/ckpts", "runs/q", Path("new")) == "new/ckpts"
    assert relocated_path(str(Path("runs/q/x").resolve()), "runs/q", Path("new")) == "new/x"
    assert relocated_path("/elsewhere/plots", "runs/q", Path("new")) == "new/plots"
    assert relocated_path(None, "runs/q", Path("new")) is None
    with pytest.raises(ConfigError, match="--run_dir"):
        relocate(copy.deepcopy(QUICKSTART), "  ")


def test_the_sweeps_move_the_same_keys():
    from lightning_pfd.sweeps.spec import OUTPUT_PATH_KEYS as SWEEP_KEYS

    assert OUTPUT_PATH_KEYS == SWEEP_KEYS


def test_the_cli_builds_a_trainer_writing_into_run_dir(tmp_path, monkeypatch):
    from lightning_pfd.callbacks.regime import RegimeMonitor
    from lightning_pfd.launch.cli import PFDLightningCLI

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["python -m lightning_pfd"])
    cli = PFDLightningCLI(args=["--config", str(CONFIG_DIR / "quickstart.yaml"), "--run_dir", "runs/mine"],
                          run=False)
    t = cli.trainer
    assert t.default_root_dir == "runs/mine"
    assert sorted(str(lg.save_dir) for lg in t.loggers) == ["runs/mine", "runs/mine"]
    assert [cb.dirpath for cb in t.checkpoint_callbacks] == [str(tmp_path / "runs/mine/checkpoints")]
    (mon,) = [cb for cb in t.callbacks if isinstance(cb, RegimeMonitor)]
    assert mon.report_dir == "runs/mine/report"
    assert not (tmp_path / "runs").exists()  # nothing written while building
