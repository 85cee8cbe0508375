"""Per-unit records and events in real fits: what the monitors log and keep, resume, the online /
final answer, `report` on the run's files, damaged records (ICREarlyStopping's rise test:
tests/test_icr_early_stop.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_pfd.analysis.per_unit import PerUnitStore, value_and_se
from lightning_pfd.callbacks import GeneralizationMonitor, MemorizationMonitor, RegimeMonitor
from lightning_pfd.commands.report import main as report_main
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet
from tests.helpers.teacher import GaussianTeacherDM


class OneThread(DiffusionModule):
    def setup(self, stage):
        torch.set_num_threads(1)


def _callbacks():
    return [GeneralizationMonitor(num_eval=24, batch_size=24, num_loss_samples=8, image_every_n_epochs=0),
            MemorizationMonitor(num_samples=16, criterion="nn_ratio"),
            RegimeMonitor(window=3, confirm=2, verbose=False)]


def _fit(root: Path, epochs: int, ckpt_path=None):
    torch.manual_seed(0)
    model = OneThread(MLPNet(3, hidden=16, depth=1, emb_dim=8), family="edm", num_steps=6)
    ck = ModelCheckpoint(dirpath=str(root / "ck"), save_last=True, save_top_k=0)
    cbs = _callbacks()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=2,
                         num_sanity_val_steps=0, logger=CSVLogger(str(root), name="csv"),
                         callbacks=[*cbs, ck], enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(root), log_every_n_steps=1)
    trainer.fit(model, datamodule=GaussianTeacherDM(), ckpt_path=ckpt_path)
    return trainer, cbs


def test_records_standard_errors_resume_and_report(tmp_path, capsys):
    trainer, cbs = _fit(tmp_path, 3)
    store = PerUnitStore(tmp_path / "per_unit")
    recs, problems = store.read()
    assert problems == [] and set(recs) == {"pfd/e_gen", "pfd/e_mem", "mem/ratio"}
    gen = cbs[0].history
    for row, rec in zip(gen, recs["pfd/e_gen"]):
        e, se = value_and_se(rec.values, "sq_dist")
        assert row["pfd/e_gen"] == pytest.approx(e, rel=1e-12) and row["pfd/e_gen_se"] == pytest.approx(se, rel=1e-9)
        assert rec.values.size == 24 and list(rec.units) == list(range(7000, 7024))  # the evaluation seeds
    mem = cbs[1].history
    for row, rec in zip(mem, recs["mem/ratio"]):
        assert row["mem/ratio"] == pytest.approx(rec.values.mean()) and set(np.unique(rec.values)) <= {0.0, 1.0}
        assert row["mem/ratio_se"] == pytest.approx(value_and_se(rec.values, "indicator")[1], nan_ok=True)
    # resume from the last checkpoint for two more epochs: every epoch's record exactly once
    before = {p.name: p.read_bytes() for p in (store.root / "pfd_e_gen").iterdir()}
    _fit(tmp_path, 5, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    names = sorted(p.name for p in (store.root / "pfd_e_gen").iterdir())
    assert names == [f"epoch_{e:06d}.npz" for e in range(5)]
    assert all((store.root / "pfd_e_gen" / n).read_bytes() == b for n, b in before.items())
    assert not list(tmp_path.glob("per_unit.prev-*"))  # a resume keeps the records
    # report on the run's files: the same final answer as the monitor, read from the records
    assert report_main([str(tmp_path / "csv"), "--out", str(tmp_path / "rep")]) == 0
    js = json.loads((tmp_path / "rep" / "events.json").read_text())
    assert set(js["per_unit"]["metrics"]) >= {"pfd/e_gen", "pfd/e_mem", "mem/ratio"} and js["per_unit"]["problems"] == []
    assert "per-unit records" in capsys.readouterr().out
    # a fresh fit into the same directory moves the earlier records aside (never mixed)
    _fit(tmp_path, 1)
    prev = list(tmp_path.glob("per_unit.prev-*"))
    assert len(prev) == 1 and len(list((prev[0] / "pfd_e_gen").iterdir())) == 5
    assert sorted(p.name for p in (store.root / "pfd_e_gen").iterdir()) == ["epoch_000000.npz"]


def test_online_events_are_settled_by_the_final_analysis(tmp_path):
    trainer, cbs = _fit(tmp_path, 4)
    regime = cbs[2]
    final = regime.analyze(final=True)
    assert {e.name for e in final.events} == {n for n, d in regime.final.items()
                                               if d["status"] in ("confirmed", "found at the end", "moved")}
    for name, d in regime.emitted.items():
        if name != "memorization_lead":
            assert regime.final[name]["status"] in ("confirmed", "retracted", "moved", "undecided")
            if regime.final[name]["status"] == "confirmed":  # confirmed = at the provisional epoch
                assert float(regime.final[name]["epoch"]) == float(d["epoch"])
    rep = json.loads((Path(regime.report_paths["json"])).read_text())
    assert [(e["name"], e["epoch"]) for e in rep["events"]] == [(e.name, e.epoch) for e in final.events]


def test_damaged_record_is_reported_not_used(tmp_path, capsys):
    _fit(tmp_path, 3)
    p = tmp_path / "per_unit" / "pfd_e_gen" / "epoch_000001.npz"
    p.write_bytes(p.read_bytes()[:100])
    assert report_main([str(tmp_path / "csv"), "--out", str(tmp_path / "rep")]) == 1
    err = capsys.readouterr().err
    assert "epoch_000001.npz" in err and "not used" in err
    js = json.loads((tmp_path / "rep" / "events.json").read_text())
    assert "pfd/e_gen" not in js["per_unit"]["metrics"] and any("epoch_000001" in q for q in js["per_unit"]["problems"])
    assert "Per-unit records not used" in (tmp_path / "rep" / "report.md").read_text()


def test_a_provisional_event_that_moves_or_becomes_undecided_is_not_confirmed():
    """The final test puts the provisional onset (epoch 3) at epoch 5: status "moved" with both
    epochs and ``events/<name>_moved``; a provisional event whose final noise model fails its
    check: "undecided" with the reason; one at the same epoch: "confirmed"."""
    from lightning_pfd.analysis.events import Event, RunAnalysis

    logged = []
    logger = SimpleNamespace(log_metrics=lambda m, step=None: logged.append(dict(m)))
    trainer = SimpleNamespace(loggers=[logger], is_global_zero=True, global_step=10, current_epoch=9,
                              callback_metrics={})
    mon = RegimeMonitor(verbose=False, write_report=False)
    detail = {"source": "mem/ratio", "min_value": 1.0, "first_min_epoch": 1, "second_min_epoch": 6}
    prov = {n: dict(Event(n, 3, 2.8, 4, detail).to_dict(), status="provisional", announced_epoch=4)
            for n in ("memorization_onset", "early_learning", "double_descent")}
    mon.emitted = dict(prov)
    final = RunAnalysis(events=[Event("memorization_onset", 5, 6.0, 6, detail),
                                Event("double_descent", 3, 4.0, 5, detail)],
                        regime=None,
                        undecided=[Event("early_learning", 3, 3.0, 5, {"undecided_reason": "too smooth"},
                                         status="undecided")])
    mon._settle(trainer, final)
    assert mon.final["memorization_onset"]["status"] == "moved"
    assert mon.final["memorization_onset"]["provisional_epoch"] == 3 and mon.final["memorization_onset"]["epoch"] == 5
    assert mon.final["early_learning"]["status"] == "undecided"
    assert mon.final["double_descent"]["status"] == "confirmed"
    flat = {k: v for m in logged for k, v in m.items()}
    assert flat["events/memorization_onset_moved"] == 1.0 and "events/memorization_onset_confirmed" not in flat
    assert flat["events/early_learning_undecided"] == 1.0 and "events/early_learning_confirmed" not in flat
    assert flat["events/double_descent_confirmed"] == 1.0
    rows = {r[0]: r for r in mon._table_rows()}
    assert rows["memorization_onset"][1] == "moved" and "undecided" in rows["early_learning"][5]


def test_a_transient_is_named_in_the_console_metrics_and_the_wandb_table_not_as_an_event():
    """The final analysis's transients (a spike of E_gen): ``events/transients`` (their count)
    on every logger, one "transient" row of the events table (W&B), a console line; no event."""
    from lightning_pfd.analysis.events import RunAnalysis

    logged = []
    logger = SimpleNamespace(log_metrics=lambda m, step=None: logged.append(dict(m)))
    trainer = SimpleNamespace(loggers=[logger], is_global_zero=True, global_step=10, current_epoch=9,
                              callback_metrics={})
    mon = RegimeMonitor(verbose=False, write_report=False)
    spike = {"epoch": 300.0, "height": 0.4, "width_evaluations": 1}
    mon._settle(trainer, RunAnalysis(events=[], regime=None, undecided=[], transients=[spike]))
    flat = {k: v for m in logged for k, v in m.items()}
    assert {k: v for k, v in flat.items() if k != "epoch"} == {"events/transients": 1.0}
    rows = mon._table_rows()
    assert [r[:3] for r in rows] == [["transient", "not an event", 300.0]] and "+0.4" in rows[0][5]


def test_event_and_end_of_run_rows_carry_the_integer_epoch_of_the_run():
    """Issue 40 item 14: the rows RegimeMonitor logs (events, regime at the end of fit) carry an
    integer epoch as Lightning's own rows do; at ``on_fit_end`` of a 0–23 run (where Lightning's
    ``current_epoch`` is already 24) it is 23, and a run stopped inside epoch 10 logs 10."""
    from lightning_pfd.callbacks.figures import log_to_loggers

    def trainer(current, started):
        progress = SimpleNamespace(current=SimpleNamespace(started=started))
        return SimpleNamespace(loggers=[SimpleNamespace(log_metrics=lambda m, step=None: logged.append(m))],
                               is_global_zero=True, global_step=240, current_epoch=current,
                               callback_metrics={}, fit_loop=SimpleNamespace(epoch_progress=progress))

    logged = []
    for current, started, want in ((7, 8, 7), (24, 24, 23), (10, 11, 10), (0, 0, 0)):
        log_to_loggers(trainer(current, started), {"events/regime_code": 1.0})
        assert type(logged[-1]["epoch"]) is int and logged[-1]["epoch"] == want
