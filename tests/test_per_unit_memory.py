"""The measurement travels in memory (architecture issue, item 4): RegimeMonitor's per-unit series
kept from the monitors' ``latest`` equal what ``load_units`` reads from the run's files (fresh fit
and resume), the files are read once per fit; freshness by epoch/step; ICREarlyStopping's rise
test reads its replicates in memory; the per-unit store is started once per fit without a
module-level registry; the report folders are a RegimeMonitor attribute the command line lists."""
from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import torch

import lightning_pfd.callbacks.regime as regime_module
from lightning_pfd.analysis.per_unit import PerUnitStore, UnitMemory, UnitRecord, load_units
from lightning_pfd.callbacks import EvaluationMonitor, ICREarlyStopping, RegimeMonitor
from lightning_pfd.callbacks import base as callbacks_base
from lightning_pfd.callbacks.base import MeasurementCallback, fresh_units
from lightning_pfd.callbacks.monitor import Latest
from lightning_pfd.evaluation.base import Evaluation, Measurement, Units


def _assert_same_series(memory: dict, disk: dict) -> None:
    assert list(memory) == list(disk)  # same metrics, same order
    for key in disk:
        m, d = memory[key], disk[key]
        assert (m.key, m.kind) == (d.key, d.kind)
        for field in ("epochs", "values", "units", "logged"):
            a, b = getattr(m, field), getattr(d, field)
            assert a.dtype == b.dtype and a.shape == b.shape, (key, field)
            np.testing.assert_array_equal(a, b, err_msg=f"{key}.{field}")  # NaN == NaN, bit for bit


def test_in_memory_units_equal_the_files_on_a_real_run(tmp_path, monkeypatch):
    from test_events_integration import _fit

    disk_reads, seeds = [], []
    real_load_units, real_seed = regime_module.load_units, UnitMemory.load
    monkeypatch.setattr(regime_module, "load_units", lambda *a, **k: disk_reads.append(a) or real_load_units(*a, **k))
    monkeypatch.setattr(UnitMemory, "load", lambda self: seeds.append(self.root) or real_seed(self))

    _, cbs = _fit(tmp_path, 3)
    regime, store = cbs[2], tmp_path / "per_unit"
    assert len(disk_reads) == 1 and seeds == []  # the end-of-fit analysis only: nothing read per epoch
    disk, problems = load_units(store)
    assert set(disk) == {"pfd/e_gen", "pfd/e_mem", "mem/ratio"} and problems == []
    memory, mem_problems = regime._memory.series()
    _assert_same_series(memory, disk)
    assert mem_problems == problems

    # resume for two more epochs: the files are read once (the records before the resume)
    disk_reads.clear()
    _, cbs = _fit(tmp_path, 5, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    regime = cbs[2]
    assert seeds == [store] and len(disk_reads) == 1
    disk, problems = load_units(store)
    assert disk["pfd/e_gen"].epochs.tolist() == [0, 1, 2, 3, 4]
    memory, mem_problems = regime._memory.series()
    _assert_same_series(memory, disk)
    assert mem_problems == problems
    # the online curves: the logged values, at the monitors' measurements only
    x, y = regime.series()["pfd/e_gen"]
    assert x.tolist() == [0, 1, 2, 3, 4] and y[3:].tolist() == [r["pfd/e_gen"] for r in cbs[0].history[-2:]]
    assert regime.series()["mem/ratio"][0].tolist() == [r["epoch"] for r in cbs[1].history] == [0]


def test_unit_memory_reports_what_the_files_report(tmp_path):
    """Unpaired units and an empty record: the same problem lines and the same metrics left out as
    ``load_units`` on the same records written to disk."""
    store, memory = PerUnitStore(tmp_path / "per_unit"), UnitMemory(tmp_path / "per_unit")
    recs = [UnitRecord("a/x", 0, 1, "sq_dist", [1.0, 2.0], [0, 1], 1.2),
            UnitRecord("a/x", 1, 2, "sq_dist", [1.0, 2.0], [0, 2], 1.2),  # other units
            UnitRecord("b", 0, 1, "indicator", [1.0, 0.0], [5, 6], 0.5),
            UnitRecord("b", 1, 2, "indicator", [0.0, 0.0], [5, 6], 0.0),
            UnitRecord("b", 1, 2, "indicator", [1.0, 1.0], [5, 6], 1.0),  # replaces epoch 1
            UnitRecord("c", 0, 1, "mean", [], [], float("nan"))]  # no units
    for r in recs:
        store.write(r)
        memory.add(r)
    disk, problems = load_units(store.root)
    got, got_problems = memory.series()
    assert got_problems == problems and len(problems) == 2
    _assert_same_series(got, disk)
    assert list(got) == ["b"] and got["b"].values.tolist() == [[1.0, 0.0], [1.0, 1.0]]


class _Constant(Evaluation):
    """An evaluation of one value with per-unit values (the measurement contract)."""

    def prepare(self, datamodule, model, comm=None):
        pass

    def measure(self, model, comm=None):
        return Measurement({"v": 1.0}, {"v": Units("mean", torch.ones(3), torch.arange(3))})


class _History(MeasurementCallback):
    def metric_names(self):
        return ["h/v"]


def test_freshness_is_the_producers_epoch_and_step():
    mon, other = EvaluationMonitor(_Constant(), name="c"), _History()
    trainer = SimpleNamespace(callbacks=[mon, other, RegimeMonitor()], current_epoch=3, global_step=40)
    trainer.is_global_zero = False  # nothing written to disk
    mon.schedule.fresh = other.schedule.fresh = True  # their schedules measured at this pass
    m = mon.evaluation.measure(None)
    u = m.units["v"]
    rec = mon.write_units(trainer, "c/v", u.kind, u.values, u.ids, 1.0)
    mon.latest = Latest(3, 40, m, {"c/v": 1.0}, {"c/v": rec})
    other.history = [{"epoch": 2, "step": 30, "h/v": 0.5, "h/extra": 1.0}]
    fresh, produced = RegimeMonitor._measured(trainer)
    assert fresh == {"c/v"} and produced == {"c/v", "h/v", "h/extra"} and fresh_units(trainer) == {"c/v": rec}
    trainer.global_step = 41  # a later validation in the same epoch: nothing measured in it
    assert RegimeMonitor._measured(trainer)[0] == set()
    other.log_metrics(trainer, SimpleNamespace(log_dict=lambda *a, **k: None), {"h/v": 0.25})  # measured now
    assert RegimeMonitor._measured(trainer)[0] == {"h/v", "h/extra"}
    es = ICREarlyStopping(monitor="c/v", every_n_epochs=None)
    es._source = mon
    assert not es._fresh(trainer)
    assert fresh_units(trainer) == {}  # the records of step 40 are not this pass's
    trainer.global_step = 40
    mon.schedule.fresh = other.schedule.fresh = True  # both measured at this pass
    assert es._fresh(trainer) and es._units_now(trainer).values.tolist() == [1.0, 1.0, 1.0]
    mon.schedule.fresh = False  # a second validation at the same epoch and step, not measured
    assert RegimeMonitor._measured(trainer)[0] == set() and fresh_units(trainer) == {}
    assert not es._fresh(trainer)
    mon.schedule.fresh = True
    # a MeasurementCallback of its own: its write_units records are read in memory too
    trainer.global_step = 41
    own = other.write_units(trainer, "h/v", "mean", torch.full((2,), 0.25), torch.arange(2), 0.25)
    assert fresh_units(trainer) == {"h/v": own}
    assert ICREarlyStopping(monitor="h/v", every_n_epochs=None)._units_now(trainer) is own


def test_a_second_validation_at_the_same_epoch_and_step_is_not_fresh(tmp_path):
    """Gradient accumulation (2) with a validation after every batch: passes 0-3 at steps 0, 1,
    1, 2; an ICRMonitor measuring pass 1 only. At pass 2 (same epoch and step, not measured) its
    stale ``icr/icr`` is still in ``callback_metrics``: neither RegimeMonitor's keys, nor the
    in-memory records, nor ICREarlyStopping treat it as fresh (``MeasurementCallback.measured_now``)."""
    from lightning.pytorch.callbacks import Callback
    from test_callback_schedule import _dm, _fit, _trainer

    from lightning_pfd.callbacks import ICRMonitor

    class Probe(Callback):
        def on_validation_end(self, trainer, pl_module):
            fresh = RegimeMonitor._measured(trainer)[0]
            seen.append((trainer.global_step, "icr/icr" in fresh, "icr/icr" in fresh_units(trainer),
                         "icr/icr" in trainer.callback_metrics, len(es.series_values)))

    seen, mon, es = [], ICRMonitor(num_images=6, schedule=[1], batch_size=6), ICREarlyStopping(patience=100)
    _fit(_trainer(tmp_path, [mon, es, Probe()], max_epochs=1, limit_train_batches=4, val_check_interval=1,
                  accumulate_grad_batches=2), dm=_dm(n=32))
    assert mon.schedule.passes == 4 and [(r["epoch"], r["step"]) for r in mon.history] == [(0, 1)]
    assert seen == [(0, False, False, False, 0), (1, True, True, True, 1), (1, False, False, True, 1),
                    (2, False, False, True, 1)]  # one check of ICREarlyStopping, at pass 1


def test_icr_early_stopping_reads_the_replicates_in_memory(tmp_path, monkeypatch):
    """No per-unit file is written: the rise test still gets every replicate (from ``latest``)."""
    from scripted_icr import ScriptedICR, TinyModule
    from test_icr_early_stop import _pure_stop, _run, _trainer, _u

    y, reps = _run(30, 3, mu=_u(30, 9, 0.2))
    stop, zs = _pure_stop(y, reps)
    monkeypatch.setattr(PerUnitStore, "write", lambda self, record: None)
    es = ICREarlyStopping(patience=5)
    _trainer(tmp_path, [ScriptedICR(y, reps), es], y.size).fit(TinyModule())
    assert not (tmp_path / "per_unit").exists()
    assert es.stopped_epoch == stop and all(r is not None for r in es.series_reps)
    assert es.rise_z == zs[-1]


class _Writer(MeasurementCallback):
    def __init__(self, key):
        super().__init__()
        self.key = key

    def _state_key_args(self):
        return {"key": self.key}

    def _measure_and_log(self, trainer, pl_module):
        self.write_units(trainer, self.key, "mean", torch.ones(2), torch.arange(2), 1.0)


def test_each_fresh_fit_starts_its_store_once(tmp_path):
    """Two writers in one fit: the first start moves the earlier run's records aside, the second
    finds none (never the records of this fit); a second fresh fit of the same Trainer object
    moves them aside again; no module-level registry of trainers."""
    from test_callback_base import Tiny

    assert not hasattr(callbacks_base, "_PREPARED_STORES")
    trainer = pl.Trainer(max_epochs=2, logger=False, callbacks=[_Writer("w/v"), _Writer("w/u")], accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(Tiny())
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("per_unit*/*/*.npz"))
    assert names == [f"per_unit/w_{k}/epoch_00000{e}.npz" for k in "uv" for e in (0, 1)]
    trainer.fit_loop.max_epochs = 3
    trainer.fit(Tiny())  # fresh again (no ckpt_path): the first fit's records go aside
    assert len(list(tmp_path.glob("per_unit.prev-*/w_*/*.npz"))) == 4
    assert [p.name for p in (tmp_path / "per_unit" / "w_v").glob("*.npz")] == ["epoch_000002.npz"]


def test_report_dirs_are_listed_by_the_command_line(tmp_path, capsys):
    from lightning_pfd.launch.cli import PFDLightningCLI
    from test_wandb import PARAMS, Scripted

    mon = RegimeMonitor(**PARAMS, verbose=False, report_dir=str(tmp_path / "rep"))
    trainer = pl.Trainer(max_epochs=6, logger=False, callbacks=[mon], accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(Scripted())
    assert mon.report_dirs == [str(tmp_path / "rep")] and not hasattr(trainer, "lightning_pfd_plot_dirs")
    PFDLightningCLI.after_fit(SimpleNamespace(trainer=trainer))
    assert f"  plots: {tmp_path / 'rep'}" in capsys.readouterr().out
