"""When the measurement callbacks measure (lightning_pfd/callbacks/schedule.py).

Every n-th *validation pass* (the first always), not ``epoch % n == 0`` -- Lightning validates at
epochs with ``(epoch + 1) % check_val_every_n_epoch == 0``; every n-th training epoch when the fit
has no validation loop; the count survives a resume. The schedules of issue 13: "log" (dense
early, sparse late; oracle: exact integer rounding of √2^k), an explicit list of passes, bad
values refused naming the field. Plus: GeneralizationMonitor refuses num_eval < world size, and a
reused monitor re-derives its references for a second fit.
"""
import math
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from lightning_pfd.callbacks import (GeneralizationMonitor, ICREarlyStopping, ICRMonitor,
                                     MemorizationMonitor, TailMonitor)
from lightning_pfd.callbacks.base import MeasurementCallback
from lightning_pfd.callbacks.schedule import is_log_pass, log_schedule
from lightning_pfd.data import TensorDataModule
from lightning_pfd.errors import ConfigError
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet
from test_callback_base import Tiny  # a linear LightningModule: passes without a diffusion model

D = 3


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[1.0, -1.0, 0.5], [-1.0, 0.5, -0.5]])  # a 2-component GMM
    return (centres[torch.randint(0, 2, (n,), generator=g)] + 0.3 * torch.randn(n, D, generator=g)).float()


def _dm(seed=0, n=24):
    return TensorDataModule(train_data=_data(n, seed), val_data=_data(8, seed + 100), batch_size=8,
                            value_range=None)


def _module():
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(D, hidden=8, depth=1, emb_dim=8), family="edm", num_steps=3,
                           ema_decay=0.9)


def _monitors(every_n):
    return {
        "gen": GeneralizationMonitor(num_eval=4, every_n_epochs=every_n, num_loss_samples=4,
                                     image_every_n_epochs=0, use_cache=False),
        "icr": ICRMonitor(num_images=6, every_n_epochs=every_n, batch_size=6),
        "mem": MemorizationMonitor(num_samples=4, every_n_epochs=every_n, seed=0),
        "tail": TailMonitor(every_n_epochs=every_n, num_samples=8, eta=0.5, num_splits=2, plot=False),
    }


class _RecordingES(ICREarlyStopping):
    """ICREarlyStopping that records the epochs at which it evaluated the stopping criteria."""

    def __init__(self, **kw):
        super().__init__(patience=100, **kw)
        self.checked = []

    def stopping_decision(self, current):
        self.checked.append(self._epoch)
        return super().stopping_decision(current)

    def on_validation_end(self, trainer, pl_module):
        self._epoch = trainer.current_epoch
        super().on_validation_end(trainer, pl_module)


def _trainer(tmp_path, callbacks, max_epochs, **kw):
    args = dict(accelerator="cpu", devices=1, max_epochs=max_epochs, limit_train_batches=1,
                limit_val_batches=1, num_sanity_val_steps=0, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                default_root_dir=str(tmp_path))
    args.update(kw)
    return pl.Trainer(callbacks=callbacks, **args)


def _fit(trainer, dm=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-n ICR warning, few-batches logging warnings
        trainer.fit(_module(), datamodule=dm or _dm(), **kw)


def _epochs(mon):
    return [h["epoch"] for h in mon.history]


@pytest.mark.parametrize("every_n, expected", [(1, [1, 3, 5]), (2, [1, 5])])
def test_cadence_counts_validation_passes_with_check_val_every_2(tmp_path, every_n, expected):
    # validation runs at epochs 1, 3, 5; the old `epoch % every_n == 0` test never measured
    # with every_n = 2 (GeneralizationMonitor once, at epoch 0, without a validation)
    mons = _monitors(every_n)
    es_follow = _RecordingES()  # follows the ICRMonitor's fresh measurements
    es_own = _RecordingES(monitor="icr/trace_s", every_n_epochs=every_n)  # counts passes itself
    _fit(_trainer(tmp_path, [*mons.values(), es_follow, es_own], max_epochs=6,
                  check_val_every_n_epoch=2))
    for name, mon in mons.items():
        assert _epochs(mon) == expected, name
    assert es_follow.checked == expected and es_own.checked == expected
    assert mons["icr"].schedule.passes == 3


def test_every_pass_is_counted_with_validation_twice_per_epoch(tmp_path):
    mon = ICRMonitor(num_images=6, every_n_epochs=3, batch_size=6)
    # 2 training batches, validation after each -> passes 0..5 at epochs 0,0,1,1,2,2
    _fit(_trainer(tmp_path, [mon], max_epochs=3, limit_train_batches=2, val_check_interval=1))
    assert mon.schedule.passes == 6 and _epochs(mon) == [0, 1]


def test_without_validation_the_monitors_measure_at_train_epoch_end(tmp_path):
    mons = _monitors(2)
    _fit(_trainer(tmp_path, list(mons.values()), max_epochs=3, limit_val_batches=0))
    for name, mon in mons.items():
        assert _epochs(mon) == [0, 2], name
    keys = {"gen": "pfd/e_mem", "icr": "icr/icr", "mem": "mem/ratio", "tail": "rmsqe"}
    for name, key in keys.items():  # a real measurement happened in on_train_epoch_end
        assert key in mons[name].history[-1], name


def test_resume_keeps_the_cadence(tmp_path):
    mons = _monitors(2)
    trainer = _trainer(tmp_path, list(mons.values()), max_epochs=3)
    _fit(trainer)  # passes 0, 1, 2 -> measured at epochs 0, 2; the next due pass is 4
    ckpt = str(tmp_path / "e2.ckpt")
    trainer.save_checkpoint(ckpt)
    resumed = _monitors(2)
    _fit(_trainer(tmp_path, list(resumed.values()), max_epochs=6), ckpt_path=ckpt)
    for name, mon in resumed.items():
        # a count restarted at 0 would measure at epochs 3 and 5 instead
        assert _epochs(mon) == [0, 2, 4], name
        assert mon.schedule.passes == 6


def test_early_stopping_state_keeps_its_pass_count():
    es = ICREarlyStopping(every_n_epochs=2)
    es._schedule.passes = 5
    es2 = ICREarlyStopping(every_n_epochs=2)
    es2.load_state_dict(es.state_dict())
    assert es2._schedule.passes == 5


def test_generalization_monitor_refuses_fewer_seeds_than_ranks():
    cb = GeneralizationMonitor(num_eval=3, image_every_n_epochs=0, use_cache=False)
    fake = SimpleNamespace(world_size=4, global_rank=0, datamodule=None)
    with pytest.raises(ValueError, match="num_eval: 3 .*world size 4"):
        cb.prepare(fake, None)
    # num_eval == world size passes this check (and fails later, on the missing datamodule)
    cb4 = GeneralizationMonitor(num_eval=4, image_every_n_epochs=0, use_cache=False)
    with pytest.raises(ValueError, match="datamodule") as err:
        cb4.prepare(fake, None)
    assert "num_eval" not in str(err.value)


def _empirical_endpoints(mon):
    """The empirical-flow endpoints of a GeneralizationMonitor's FlowEvaluation (public API)."""
    return mon.evaluation.references["empirical"].endpoints


def test_a_reused_monitor_rederives_its_references_for_a_new_fit(tmp_path):
    reused = {"gen": GeneralizationMonitor(num_eval=4, num_loss_samples=4, image_every_n_epochs=0,
                                           use_cache=False),
              "tail": TailMonitor(num_samples=8, eta=0.5, num_splits=2, plot=False)}
    _fit(_trainer(tmp_path, list(reused.values()), max_epochs=1), dm=_dm(seed=0))
    first_ref = _empirical_endpoints(reused["gen"]).clone()
    first_tail_ref = reused["tail"].evaluation.reference_observable.clone()
    _fit(_trainer(tmp_path, list(reused.values()), max_epochs=1), dm=_dm(seed=7))
    fresh = {"gen": GeneralizationMonitor(num_eval=4, num_loss_samples=4, image_every_n_epochs=0,
                                          use_cache=False),
             "tail": TailMonitor(num_samples=8, eta=0.5, num_splits=2, plot=False)}
    _fit(_trainer(tmp_path, list(fresh.values()), max_epochs=1), dm=_dm(seed=7))
    # the references follow the second training set (the stale ones differ)
    ref2 = _empirical_endpoints(reused["gen"])
    assert not torch.allclose(ref2, first_ref)
    assert torch.equal(ref2, _empirical_endpoints(fresh["gen"]))
    tail_ref = reused["tail"].evaluation.reference_observable
    assert not torch.equal(tail_ref, first_tail_ref)
    assert torch.equal(tail_ref, fresh["tail"].evaluation.reference_observable)
    assert reused["tail"].evaluation.floors() == fresh["tail"].evaluation.floors()
    # same student (same seed, same data) -> the same logged values as a fresh callback
    last, want = reused["gen"].history[-1], fresh["gen"].history[-1]
    assert last["pfd/e_mem"] == pytest.approx(want["pfd/e_mem"], rel=1e-10)
    assert reused["tail"].history[-1]["rmsqe"] == pytest.approx(fresh["tail"].history[-1]["rmsqe"],
                                                                rel=1e-10)
    assert len(reused["gen"].history) == 2 and reused["gen"].schedule.passes == 1


# ----------------------------------------------------------------------------- issue-13 schedules
class _Counter(MeasurementCallback):
    def _measure_and_log(self, trainer, pl_module):
        self.log_metrics(trainer, pl_module, {"count/epoch": float(trainer.current_epoch)})


def _fit_tiny(trainer, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), **kw)


def _log_oracle(limit):
    """{0} ∪ {round(√2^k)}, round half up, in exact integer arithmetic: for N = 2^k,
    r = isqrt(N) and √N >= r + 1/2  <=>  N > r² + r (N, r integers)."""
    out = {0}
    k = 0
    while True:
        n = 2 ** k
        r = math.isqrt(n)
        v = r + 1 if n > r * r + r else r
        if v >= limit:
            return sorted(out)
        out.add(v)
        k += 1


def test_log_schedule_sequence():
    documented = [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512]
    assert log_schedule(600) == documented == _log_oracle(600)
    assert log_schedule(100_000) == _log_oracle(100_000)
    due = [i for i in range(3000) if is_log_pass(i)]
    assert due == _log_oracle(3000)
    assert len(log_schedule(500)) == 18  # a 500-epoch run measures 18 times


@pytest.mark.parametrize("limit_val_batches", [1, 0])  # validation passes / train-epoch fallback
def test_log_schedule_in_a_fit(tmp_path, limit_val_batches):
    mon = _Counter(schedule="log")
    _fit_tiny(_trainer(tmp_path, [mon], max_epochs=13, limit_val_batches=limit_val_batches))
    assert _epochs(mon) == [0, 1, 2, 3, 4, 6, 8, 11]
    assert mon.schedule.passes == 13 and mon.schedule.kind == "log"


def test_log_schedule_resumed_in_the_middle_keeps_the_sequence(tmp_path):
    first = _Counter(schedule="log")
    t7 = _trainer(tmp_path, [first], max_epochs=7)
    _fit_tiny(t7)  # passes 0..6 -> measured at 0, 1, 2, 3, 4, 6; the next due pass is 8
    assert _epochs(first) == [0, 1, 2, 3, 4, 6]
    ckpt = str(tmp_path / "e6.ckpt")
    t7.save_checkpoint(ckpt)
    resumed = _Counter(schedule="log")
    _fit_tiny(_trainer(tmp_path, [resumed], max_epochs=17), ckpt_path=ckpt)
    assert _epochs(resumed) == [0, 1, 2, 3, 4, 6, 8, 11, 16]  # history restored + continued
    assert resumed.schedule.passes == 17
    uninterrupted = _Counter(schedule="log")
    _fit_tiny(_trainer(tmp_path, [uninterrupted], max_epochs=17))
    assert _epochs(uninterrupted) == _epochs(resumed)
    # a count restarted at 0 would have measured at 7, 8, 9, 10, 11, 13, 15 instead


def test_explicit_schedule(tmp_path):
    mon = _Counter(schedule=[5, 0, 2])
    _fit_tiny(_trainer(tmp_path, [mon], max_epochs=7))
    assert _epochs(mon) == [0, 2, 5] and mon.schedule.kind == (0, 2, 5)
    late = _Counter(schedule=[3])  # the first pass is not forced
    _fit_tiny(_trainer(tmp_path, [late], max_epochs=5))
    assert _epochs(late) == [3]


def test_every_n_epochs_schedule_is_the_default(tmp_path):
    mon = _Counter(every_n_epochs=3)
    _fit_tiny(_trainer(tmp_path, [mon], max_epochs=7))
    assert _epochs(mon) == [0, 3, 6] and mon.schedule.kind == "every_n_epochs"


@pytest.mark.parametrize("kwargs, field, match", [
    (dict(schedule="logg"), "schedule", "did you mean 'log'"),
    (dict(schedule="every_epoch"), "schedule", "unknown schedule"),
    (dict(schedule=[]), "schedule", "at least one"),
    (dict(schedule=[0, -1]), "schedule", r"integers >= 0, got \[-1\]"),
    (dict(schedule=[0, 1.5]), "schedule", "integers >= 0"),
    (dict(schedule=[True]), "schedule", "integers >= 0"),
    (dict(schedule=[2, 4, 2]), "schedule", r"listed twice: \[2\]"),
    (dict(schedule=3), "schedule", "schedule name or a list"),
    (dict(every_n_epochs=0), "every_n_epochs", "integer >= 1"),
    (dict(every_n_epochs=2.0), "every_n_epochs", "integer >= 1"),
])
def test_bad_schedules_are_rejected_naming_the_field(kwargs, field, match):
    with pytest.raises(ConfigError, match=match) as err:
        _Counter(**kwargs)
    assert err.value.field == field  # the command line adds the config path (test_cli.py)
