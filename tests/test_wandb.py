"""W&B / CSV / TensorBoard integration of the regime monitor, the W&B helpers and the progress bar.

A scripted LightningModule logs known curves of pfd/e_gen, pfd/e_mem, icr/icr, mem/ratio and the
fixed-noise losses in on_validation_epoch_end; the run is read back from disk (W&B offline log via
`wandb leet inspect` and via the built-in reader, CSV metrics.csv) and compared with the scripted
values and with the pure detectors applied to the same curves (independent oracle).
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_pfd.analysis.events import (
    detect_early_learning,
    detect_icr_minimum,
    detect_memorization_onset,
)
from lightning_pfd.analysis.history import load_history, read_wandb_records
from lightning_pfd.callbacks.base import MeasurementCallback
from lightning_pfd.callbacks.progress import PFDProgressBar, format_pfd_metrics
from lightning_pfd.callbacks.regime import RegimeMonitor
from lightning_pfd.callbacks.wandb_setup import (
    AutoWandbLogger,
    LogConfigCallback,
    has_wandb_credentials,
    logger_offline_if_no_credentials,
)
from wandb_wait import wait_for_exit_record

EPOCHS = 18
T = np.arange(EPOCHS, dtype=np.float64)
CURVES = {
    # early learning: interior minimum near epoch 5, then a sustained rise
    "pfd/e_gen": 2.0 + 2.0 * np.exp(-T / 2.0) + 1.5 * (1.0 - np.exp(-T / 12.0)),
    "pfd/e_mem": 3.5 - 0.8 / (1.0 + np.exp(-(T - 10.0) / 1.5)),
    "icr/icr": 0.5 + 0.3 * ((T - 6.0) / 8.0) ** 2,
    "mem/ratio": 0.8 / (1.0 + np.exp(-(T - 11.0) / 1.2)),
    "loss/train_fixed": 1.0 / (1.0 + T / 3.0),
    "loss/test_fixed": 1.0 / (1.0 + T / 3.0) + 0.004 * T,
}
# a little noise: a noiseless curve's events are undecided (its only "noise" is smooth)
_RNG = np.random.default_rng(11)
for _k, _sd in (("pfd/e_gen", 0.003), ("pfd/e_mem", 0.003), ("icr/icr", 0.001), ("mem/ratio", 0.002)):
    CURVES[_k] = CURVES[_k] + _sd * _RNG.standard_normal(EPOCHS)
PARAMS = dict(window=3, min_sigma=2.5, min_rel=0.0, confirm=2)


class Scripted(LightningModule):
    """Tiny model; logs the scripted curves (except those in ``omit``)."""

    def __init__(self, omit=()):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.omit = set(omit)

    def training_step(self, batch, batch_idx):
        loss = self.lin(batch[0]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.lin(batch[0]).pow(2).mean())

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        e = self.current_epoch
        for name, curve in CURVES.items():
            if name not in self.omit:
                self.log(name, torch.tensor(curve[e], dtype=torch.float64), sync_dist=False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)),
                                           batch_size=4)

    val_dataloader = train_dataloader


class EveryOtherMonitor(MeasurementCallback):
    """A monitor measuring ``key``'s scripted curve at every other pass (epochs 0, 2, 4, ...)."""

    def __init__(self, key):
        super().__init__(every_n_epochs=2)
        self.key = key

    def metric_names(self):
        return [self.key]

    def _measure_and_log(self, trainer, pl_module):
        value = torch.tensor(CURVES[self.key][trainer.current_epoch], dtype=torch.float64)
        self.log_metrics(trainer, pl_module, {self.key: value})


def _trainer(tmp_path, logger, callbacks, epochs=EPOCHS, progress=False):
    return Trainer(max_epochs=epochs, logger=logger, callbacks=callbacks, accelerator="cpu",
                   devices=1, enable_checkpointing=False, enable_model_summary=False,
                   enable_progress_bar=progress, num_sanity_val_steps=0,
                   default_root_dir=str(tmp_path), log_every_n_steps=1)


def _oracle():
    el = detect_early_learning(T, CURVES["pfd/e_gen"], **PARAMS)
    icr = detect_icr_minimum(T, CURVES["icr/icr"], **PARAMS)
    onset = detect_memorization_onset(T, CURVES["mem/ratio"], icr=CURVES["icr/icr"], **PARAMS)
    assert el is not None and icr is not None and onset is not None  # scripted curves show them
    return el, icr, onset


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """One scripted fit with AutoWandbLogger (offline) + RegimeMonitor; returns the run dir."""
    import wandb

    tmp = tmp_path_factory.mktemp("wb")
    mp = pytest.MonkeyPatch()
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp / var.lower()).mkdir()
        mp.setenv(var, str(tmp / var.lower()))
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("WANDB_API_KEY", raising=False)
    try:
        logger = AutoWandbLogger(project="pfd-test", save_dir=str(tmp))
        assert logger._offline is True
        mon = RegimeMonitor(**PARAMS, plot_every_n_epochs=6)
        trainer = _trainer(tmp, logger, [mon])
        trainer.fit(Scripted())
        # the full CLI config, as LightningCLI would hand it to the callback
        from jsonargparse import Namespace

        cb = LogConfigCallback(parser=None, config=Namespace(model=Namespace(lr=0.25), seed=3),
                               save_to_log_dir=False)
        cb.save_config(trainer, trainer.lightning_module, "fit")
        run_dir = Path(logger.experiment.dir).parent
        wandb.finish()
        wait_for_exit_record(run_dir)
    finally:
        mp.undo()
    return run_dir, mon


def test_wandb_history_summaries_and_axes(wandb_run):
    run_dir, mon = wandb_run
    h = load_history(run_dir, use_leet=True)
    assert h.source == "wandb"
    for name, curve in CURVES.items():
        x, y = h.series(name)
        np.testing.assert_array_equal(x, T)
        np.testing.assert_allclose(y, curve, rtol=1e-12, atol=0)
    # summaries defined by setup_wandb_metrics
    assert h.summary["pfd/e_gen"]["min"] == pytest.approx(CURVES["pfd/e_gen"].min(), rel=1e-12)
    assert h.summary["icr/icr"]["min"] == pytest.approx(CURVES["icr/icr"].min(), rel=1e-12)
    assert h.summary["mem/ratio"]["max"] == pytest.approx(CURVES["mem/ratio"].max(), rel=1e-12)
    assert h.summary["pfd/e_gen"]["last"] == pytest.approx(CURVES["pfd/e_gen"][-1], rel=1e-12)
    # epoch is the x-axis of the per-epoch metrics
    recs, _, _ = read_wandb_records(h.path, use_leet=True)
    metric = {r.get("name"): r for kind, r in recs if kind == "metric"}
    assert metric["pfd/e_gen"]["step_metric"] == "epoch"
    assert metric["mem/ratio"]["summary"] == {"max": True, "last": True}
    # full CLI config logged
    assert h.config["cli"] == {"model": {"lr": 0.25}, "seed": 3}


def test_wandb_builtin_reader_agrees_with_leet(wandb_run):
    run_dir, _ = wandb_run
    a = load_history(run_dir, use_leet=True)
    b = load_history(run_dir, use_leet=False)
    assert len(a.rows) == len(b.rows) > EPOCHS
    assert a.rows == b.rows
    assert a.images == b.images and a.tables == b.tables
    assert a.config == b.config
    assert a.summary["pfd/e_gen"] == b.summary["pfd/e_gen"]


def test_wandb_events_metrics_table_and_images(wandb_run):
    run_dir, mon = wandb_run
    el, icr, onset = _oracle()
    h = load_history(run_dir)
    # events logged as metrics, once, with the oracle's epochs
    # (once provisional when found, once more when the final test confirms it at fit end)
    x, y = h.series("events/early_learning_epoch")
    assert y.tolist() == [el.epoch, el.epoch]
    assert x[0] > el.epoch  # emitted once the rise after the minimum was seen, not before
    assert h.series("events/early_learning_confirmed")[1].tolist() == [1.0]
    assert h.series("events/icr_minimum_epoch")[1].tolist() == [icr.epoch, icr.epoch]
    on_epochs = h.series("events/memorization_onset_epoch")[1].tolist()  # provisional (history so far), final
    assert len(on_epochs) == 2 and on_epochs[-1] == onset.epoch
    lead = h.series("events/memorization_lead_epochs")[1]  # provisional, then the final events'
    assert lead.tolist()[-1] == onset.epoch - icr.epoch
    assert h.series("events/regime_code")[1].tolist() == [2.0]  # ratio 0.8 at the end
    assert h.summary["events/regime"] == "memorization"
    # events table: one row per event + the regime row
    table = h.table("events")
    assert table is not None
    rows = {r[0]: r for r in table["data"]}
    assert set(rows) == {"early_learning", "icr_minimum", "memorization_onset", "regime"}
    assert rows["early_learning"][1] == "confirmed" and rows["early_learning"][2] == el.epoch
    assert rows["early_learning"][3] == pytest.approx(el.significance, rel=1e-6)  # the final test
    # significance as known online: the detector on the history up to the emission epoch
    k = int(x[0]) + 1
    online = detect_early_learning(T[:k], CURVES["pfd/e_gen"][:k], **PARAMS)
    assert h.series("events/early_learning_significance")[1][0] == pytest.approx(
        online.significance, rel=1e-6)
    # figures logged as images and present on disk as PNG
    for key in ("plots/dynamics", "plots/icr_memorization"):
        assert len(h.images[key]) == EPOCHS // 6 + 1  # every 6 epochs + at the end
        p = Path(h.images[key][-1])
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # report written into the run dir at fit end
    md = (run_dir / "report" / "report.md").read_text()
    assert "early_learning" in md and "memorization" in md
    assert mon.report_paths["markdown"] == str(run_dir / "report" / "report.md")


def test_regime_monitor_state_roundtrip_and_sparse_metrics(tmp_path):
    mon = RegimeMonitor(**PARAMS, write_report=False, verbose=False)
    trainer = _trainer(tmp_path, CSVLogger(str(tmp_path)), [EveryOtherMonitor("mem/ratio"), mon], epochs=8)
    trainer.fit(Scripted(omit={"mem/ratio"}))
    x, y = mon.series()["mem/ratio"]
    # fresh by its monitor's epoch/step: the stale values of odd epochs are not recorded
    np.testing.assert_array_equal(x, [0, 2, 4, 6])
    np.testing.assert_allclose(y, CURVES["mem/ratio"][[0, 2, 4, 6]])
    np.testing.assert_array_equal(mon.series()["pfd/e_gen"][0], np.arange(8))
    state = mon.state_dict()
    other = RegimeMonitor(**PARAMS)
    other.load_state_dict(json.loads(json.dumps(state)))
    assert other.history == mon.history and other.emitted == mon.emitted
    # resumed monitor does not re-emit known events
    assert set(other.emitted) == set(mon.emitted)


def test_csv_logger_events_and_report(tmp_path):
    el, icr, onset = _oracle()
    mon = RegimeMonitor(**PARAMS, verbose=False)
    logger = CSVLogger(str(tmp_path), name="csv")
    trainer = _trainer(tmp_path, logger, [mon])
    trainer.fit(Scripted())
    h = load_history(tmp_path / "csv")
    assert h.source == "csv"
    np.testing.assert_allclose(h.series("pfd/e_gen")[1], CURVES["pfd/e_gen"], rtol=1e-6)
    assert h.series("events/early_learning_epoch")[1].tolist() == [el.epoch, el.epoch]  # provisional, final
    on_epochs = h.series("events/memorization_onset_epoch")[1].tolist()  # provisional (history so far), final
    assert len(on_epochs) == 2 and on_epochs[-1] == onset.epoch
    # confirmed when the final test keeps the provisional epoch, "moved" when it does not
    status = "confirmed" if on_epochs[0] == on_epochs[-1] else "moved"
    assert h.series(f"events/memorization_onset_{status}")[1].tolist() == [1.0]
    rep = Path(logger.log_dir) / "report"
    assert (rep / "dynamics.png").is_file() and (rep / "icr_memorization.png").is_file()
    data = json.loads((rep / "events.json").read_text())
    assert {e["name"] for e in data["events"]} == {"early_learning", "icr_minimum",
                                                    "memorization_onset"}
    assert data["regime"]["name"] == "memorization"


def test_tensorboard_logger_still_works(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger

    mon = RegimeMonitor(**PARAMS, verbose=False)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    _trainer(tmp_path, logger, [mon]).fit(Scripted())
    assert mon.emitted["early_learning"]["epoch"] == _oracle()[0].epoch
    assert any(Path(logger.log_dir).glob("events.out.tfevents.*"))
    assert (Path(logger.log_dir) / "report" / "report.md").is_file()


def test_offline_decision_from_credentials(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert not has_wandb_credentials({"HOME": str(home)})
    assert logger_offline_if_no_credentials({"HOME": str(home)}) is True
    assert has_wandb_credentials({"HOME": str(home), "WANDB_API_KEY": "x" * 40})
    assert logger_offline_if_no_credentials({"HOME": str(home), "WANDB_API_KEY": "x" * 40}) is False
    # WANDB_MODE=offline wins over a key
    assert logger_offline_if_no_credentials({"HOME": str(home), "WANDB_API_KEY": "k",
                                             "WANDB_MODE": "offline"}) is True
    netrc = home / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc.chmod(0o600)
    assert has_wandb_credentials({"HOME": str(home)})
    # an entry for another host does not count
    assert not has_wandb_credentials({"HOME": str(home), "WANDB_BASE_URL": "https://wandb.example.org"})


def test_progress_bar_formats_pfd_metrics(tmp_path):
    m = {"pfd/e_gen": torch.tensor(2.345678), "icr/icr": 0.5, "train/loss": torch.tensor(1.0)}
    assert format_pfd_metrics(m) == {"E_gen": "2.346", "ICR": "0.5"}
    bar = PFDProgressBar(digits=3)
    trainer = _trainer(tmp_path, False, [bar], epochs=2, progress=True)
    trainer.fit(Scripted())
    items = bar.get_metrics(trainer, trainer.lightning_module)
    assert items["E_gen"] == f"{CURVES['pfd/e_gen'][1]:.3g}"
    assert items["E_mem"] == f"{CURVES['pfd/e_mem'][1]:.3g}"
    assert items["ICR"] == f"{CURVES['icr/icr'][1]:.3g}"
    assert items["mem"] == f"{CURVES['mem/ratio'][1]:.3g}"


@pytest.mark.parametrize("kwargs, field", [
    (dict(window=0), "window"), (dict(confirm=0), "confirm"), (dict(min_sigma=-1.0), "min_sigma"),
    (dict(keys={"egen": "x"}), "keys"), (dict(plot_every_n_epochs=-1), "plot_every_n_epochs"),
])
def test_regime_monitor_bad_config(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RegimeMonitor(**kwargs)


def test_progress_bar_bad_config():
    with pytest.raises(ValueError, match="digits"):
        PFDProgressBar(digits=0)
