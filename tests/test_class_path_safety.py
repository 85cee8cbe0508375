"""Issue 40 items 1-2: no ``class_path`` calls anything that is not its declared type, and no file
is unpickled: an ``os.system`` / ``subprocess.Popen`` payload planted in each place a config or a
file reaches (a user metric, a sweep's trial config, icr-sweep's data config, an optimizer, a
checkpoint, ``pite --merge``'s observables) is refused by name and never runs.

Oracle: the payload's side effect (a file it would create) does not exist afterwards, and
``os.system`` / ``subprocess.Popen`` were not called (monkeypatched to record)."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict

import pytest
import torch
from torch import nn

from lightning_pfd.checkpoint import CheckpointError, load_checkpoint
from lightning_pfd.classpath import instantiate, load_class
from lightning_pfd.cli import main
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.flow import metric_factory
from test_reliability import _write_config


def _arm(monkeypatch) -> list:
    """Replace os.system and subprocess.Popen by recorders; returns the record."""
    seen = []
    monkeypatch.setattr(os, "system", lambda *a, **k: seen.append(("system", a)) or 0)

    class NoPopen:
        def __init__(self, *a, **k):
            seen.append(("Popen", a))
    monkeypatch.setattr(subprocess, "Popen", NoPopen)
    return seen


@pytest.fixture
def calls(monkeypatch):
    return _arm(monkeypatch)


def _payload(tmp_path, cls="os.system"):
    marker = tmp_path / "PWNED"
    arg = {"command": f"touch {marker}"} if cls == "os.system" else {"args": ["touch", str(marker)]}
    return {"class_path": cls, "init_args": arg}, marker


def test_a_user_metric_naming_a_function_is_refused_before_it_is_called(tmp_path, calls):
    spec, marker = _payload(tmp_path)
    with pytest.raises(ConfigError, match="not a class") as err:
        metric_factory(dict(spec, reference="teacher"), "metrics.x")
    assert err.value.field == "metrics.x.class_path"
    spec, _ = _payload(tmp_path, "subprocess.Popen")  # a class, but no update/compute: not a metric
    with pytest.raises(ConfigError, match="not a metric"):
        metric_factory(spec, "metrics.x")
    assert calls == [] and not marker.exists()


def test_a_config_whose_user_metric_is_os_system_fails_before_any_command_runs(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "PWNED"
    _write_config(tmp_path, epochs=1)
    text = (tmp_path / "c.yaml").read_text().replace(
        "  callbacks:\n", "  callbacks:\n    - class_path: lightning_pfd.callbacks.GeneralizationMonitor\n"
        "      init_args:\n        num_eval: 8\n        num_loss_samples: 8\n        metrics:\n"
        "          evil: {class_path: os.system, init_args: {command: 'touch " + str(marker) + "'}}\n", 1)
    (tmp_path / "c.yaml").write_text(text)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", "c.yaml"]) == 2
    err = capsys.readouterr().err
    assert "metrics.evil.class_path" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "run" / "checkpoints").exists()


class _Holder(nn.Module):
    def __init__(self, net: nn.Module, spec: Dict[str, Any] = None, extra: Any = None):
        super().__init__()
        self.net, self.spec, self.extra = net, spec, extra


@pytest.mark.parametrize("where", ["top", "net"])
def test_instantiate_checks_every_declared_class_before_calling_it(tmp_path, calls, where):
    evil, marker = _payload(tmp_path, "subprocess.Popen")
    if where == "top":
        spec = evil
    else:
        spec = {"class_path": f"{__name__}._Holder", "init_args": {"net": evil}}
    with pytest.raises(ConfigError, match="is not a torch.nn"):
        instantiate(spec, nn.Module)
    assert calls == [] and not marker.exists()


def test_instantiate_leaves_a_class_path_where_no_class_is_declared_as_data(tmp_path, calls):
    evil, marker = _payload(tmp_path)
    built = instantiate({"class_path": f"{__name__}._Holder",
                         "init_args": {"net": {"class_path": "torch.nn.Identity"}, "spec": evil, "extra": evil}},
                        nn.Module)
    assert isinstance(built.net, nn.Identity) and built.spec == evil and built.extra == evil
    assert calls == [] and not marker.exists()


def test_load_class_refuses_builtins_and_other_classes_and_accepts_annotated_factories():
    with pytest.raises(ConfigError, match="not a class"):
        load_class("os.system", object, "f")
    with pytest.raises(ConfigError, match="is not a torch.optim"):
        load_class("torch.nn.Linear", torch.optim.Optimizer, "f")
    from lightning.pytorch.callbacks import Callback
    from lightning_pfd.callbacks import GeneralizationMonitor
    assert load_class("lightning_pfd.callbacks.GeneralizationMonitor", Callback, "f", factories=True) \
        is GeneralizationMonitor
    with pytest.raises(ConfigError):  # a factory only where factories are allowed
        load_class("lightning_pfd.callbacks.GeneralizationMonitor", Callback, "f")


def test_icr_sweep_refuses_a_data_config_that_is_not_a_datamodule(tmp_path, calls):
    from lightning_pfd.commands.icr_sweep import build_datamodule, load_module

    evil, marker = _payload(tmp_path, "subprocess.Popen")
    cfg = tmp_path / "data.yaml"
    cfg.write_text(json.dumps({"data": evil}))
    with pytest.raises(ConfigError, match="LightningDataModule"):
        build_datamodule(str(cfg), None)
    with pytest.raises(ConfigError, match="--module-class"):
        load_module(str(tmp_path / "x.ckpt"), None, "os.system")
    assert calls == [] and not marker.exists()


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_in_a_checkpoint_is_named_as_such_and_never_run(tmp_path, monkeypatch):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _Payload(marker)}, path)
    calls = _arm(monkeypatch)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    text = str(err.value)
    assert "weights-only load refuses" in text and "weights_only=False" not in text and "truncated" not in text
    assert calls == [] and not marker.exists()


def test_pite_merge_reads_observables_weights_only(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "PWNED"
    part = tmp_path / "part"
    part.mkdir()
    (part / "results.json").write_text("{}")
    torch.save({"obs": _Payload(marker)}, part / "observables.pt")
    calls = _arm(monkeypatch)
    assert main(["pite", "--merge", f"{part},{part}", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--merge" in err and "weights-only load refuses" in err and "Traceback" not in err
    assert calls == [] and not marker.exists()
