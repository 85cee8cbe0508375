"""Issue 39 item 2: a fit stopped by ``max_time`` (or ``max_steps``) inside an epoch, or at an
epoch boundary, and resumed with ``--ckpt_path last`` equals the uninterrupted run byte for byte:
``metrics.csv`` and the final weights, with EMA, without EMA, and with SGD + a cosine schedule.

The ``max_time`` clock is :class:`helpers.faults.StepClock` (one second per optimizer step), so the
stop lands on a chosen step on any machine: no wall-clock limit in the test. The oracle is the
uninterrupted run of the same config. A stop one step into an epoch is the case that failed: the
cut epoch's validation rows are logged at the checkpoint's own step and were kept on resume."""
from __future__ import annotations

import pytest
import torch

from lightning_pfd.checkpoint import load_checkpoint
from lightning_pfd.cli import main
from test_reliability import _write_config

FIT = ["fit", "--config", "c.yaml"]
CSV = "run/csv/version_0/metrics.csv"
CLOCK = ["--trainer.callbacks+=helpers.faults.StepClock"]
VARIANTS = {  # config text replacements
    "ema": [],
    "no_ema": [("ema_decay: 0.99", "ema_decay: 0.0\n    ema_rampup: false")],
    "sgd_cosine_halflife": [("ema_decay: 0.99", "ema_halflife_kimg: 0.5\n"
                             "    optimizer: {class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}\n"
                             "    lr_scheduler: {class_path: torch.optim.lr_scheduler.CosineAnnealingLR, init_args: {T_max: 30}, interval: step}")],
}


def _config(d, variant: str, monitors: bool):
    cfg = _write_config(d, epochs=3, monitors=monitors)
    text = cfg.read_text()
    for old, new in VARIANTS[variant]:
        assert old in text
        text = text.replace(old, new)
    cfg.write_text(text)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted 3-epoch runs (10 steps per epoch), one per (variant, monitors)."""
    made = {}

    def get(variant: str, monitors: bool = False):
        key = (variant, monitors)
        if key not in made:
            d = tmp_path_factory.mktemp(f"whole_{variant}_{int(monitors)}")
            _config(d, variant, monitors)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("LIGHTNING_PFD_CACHE", str(d.parent / "cache_time_limit"))
                mp.chdir(d)
                assert main(FIT) == 0
            made[key] = d
        return made[key]
    return get


def _same_as(whole_dir, cut_dir):
    a, b = (load_checkpoint(d / "run/checkpoints/last.ckpt") for d in (whole_dir, cut_dir))
    assert a["global_step"] == b["global_step"] == 30
    assert a["state_dict"].keys() == b["state_dict"].keys()
    different = [k for k in a["state_dict"] if not torch.equal(a["state_dict"][k], b["state_dict"][k])]
    assert different == []
    assert (whole_dir / CSV).read_bytes() == (cut_dir / CSV).read_bytes()


@pytest.mark.parametrize("variant, monitors, stop, steps_in", [
    ("ema", True, "00:00:00:21", 1),       # one step into epoch 2: the case that kept stale rows
    ("ema", False, "00:00:00:25", 5),
    ("no_ema", False, "00:00:00:21", 1),
    ("sgd_cosine_halflife", False, "00:00:00:21", 1),
])
def test_a_max_time_stop_inside_an_epoch_resumes_exactly(whole, tmp_path, monkeypatch, capsys,
                                                         variant, monitors, stop, steps_in):
    ref = whole(variant, monitors)
    cut = tmp_path / "cut"
    _config(cut, variant, monitors)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(ref.parent / "cache_time_limit"))
    monkeypatch.chdir(cut)
    assert main(FIT + CLOCK + ["--trainer.max_time", stop]) == 0
    assert f"stopped inside epoch 2, after {steps_in} of its steps" in capsys.readouterr().out
    assert load_checkpoint(cut / "run/checkpoints/last.ckpt")["global_step"] == 20  # end of epoch 1
    assert main(FIT + ["--ckpt_path", "last"]) == 0
    _same_as(ref, cut)


@pytest.mark.parametrize("first, steps_in", [(["--trainer.max_steps", "21"], 1),  # inside epoch 2
                                             (["--trainer.max_steps", "20"], None)])  # at its boundary
def test_a_max_steps_stop_inside_an_epoch_or_at_its_end_resumes_exactly(whole, tmp_path, monkeypatch,
                                                                        capsys, first, steps_in):
    ref = whole("ema")
    cut = tmp_path / "cut"
    _config(cut, "ema", False)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(ref.parent / "cache_time_limit"))
    monkeypatch.chdir(cut)
    assert main(FIT + first) == 0
    out = capsys.readouterr().out
    assert ("stopped inside epoch" in out) == (steps_in is not None)
    assert load_checkpoint(cut / "run/checkpoints/last.ckpt")["global_step"] == 20
    assert main(FIT + ["--ckpt_path", "last"]) == 0
    _same_as(ref, cut)


def test_the_csv_continuation_drops_rows_of_a_later_epoch_at_the_checkpoint_step():
    from lightning_pfd.callbacks.checkpoint import _after_checkpoint

    assert not _after_checkpoint({"epoch": "1", "step": "19"}, 19, 1)
    assert _after_checkpoint({"epoch": "2", "step": "19"}, 19, 1)  # the cut epoch's validation
    assert _after_checkpoint({"epoch": "", "step": "20"}, 19, 1)
    assert not _after_checkpoint({"epoch": "", "step": "19"}, 19, 1)
    assert not _after_checkpoint({"epoch": "2", "step": "19"}, 19, None)  # no epoch in the checkpoint


def test_a_command_line_seed_leaves_every_checkpoint_loadable_weights_only(tmp_path, monkeypatch):
    """``--model.init_args.train_seed 3`` arrives as jsonargparse's ``NonNegativeInt``; the module
    kept it and wrote it into every checkpoint, which a weights-only load then refused (found
    by the double-descent study's re-evaluation of its kept checkpoints)."""
    _config(tmp_path, "ema", False)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(FIT + ["--trainer.max_epochs", "1", "--model.init_args.train_seed", "3"]) == 0
    raw = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)
    assert type(raw["lightning_pfd"]["train_seed"]) is int and raw["lightning_pfd"]["train_seed"] == 3
