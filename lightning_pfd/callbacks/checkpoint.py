"""EpochCheckpoint: ``last.ckpt`` at the end of every epoch, verified and atomic; resume continuity.

Lightning's ``ModelCheckpoint(save_last=True, save_top_k=0)`` writes ``last.ckpt`` only when a
top-k checkpoint is written, i.e. at the end of fit: a crash loses the whole run.
:class:`EpochCheckpoint` writes ``last.ckpt`` at the end of every training epoch — after the
epoch's validation and measurements, so the callbacks' histories in it include that epoch — and
keeps Lightning's top-k logic for a monitored metric (``monitor="icr/icr"``, ``mode="min"`` keeps
the checkpoint at the ICR minimum). The monitors measure on a schedule (``every_n_epochs``, ``log``,
a list of epochs), so the monitored metric is absent in some epochs: such an epoch leaves the top-k
checkpoints unchanged (Lightning would stop the run with an error) and still writes ``last.ckpt``;
a monitored key that never appeared by the end of fit is reported with a warning (a misspelt
``monitor``). Before writing it flushes the loggers, so the CSV history on
disk is never behind the checkpoint. While the module is inside a run of non-finite steps or has
diverged (``pl_module.unhealthy``) it writes nothing: the last good checkpoint stays.

Writes go through :class:`lightning_pfd.checkpoint.VerifiedCheckpointIO` (content digest,
tmp file + fsync + rename), installed here when the trainer still has Lightning's default IO.

The checkpoint also records where the loggers write (CSV version directories, W&B run id), so a
resumed command-line run continues the *same* CSV file and W&B run
(:func:`continue_loggers`) instead of starting split versions.
"""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Dict, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from ..checkpoint import VerifiedCheckpointIO, atomic_write_bytes

__all__ = ["EpochCheckpoint", "install_verified_io", "continue_loggers", "logger_locations"]


def install_verified_io(trainer: "pl.Trainer") -> None:
    """Replace Lightning's default checkpoint IO by the verified, atomic one (idempotent)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    strategy = trainer.strategy
    current = getattr(strategy, "_checkpoint_io", None)
    if current is None or type(current) is TorchCheckpointIO:
        strategy.checkpoint_io = VerifiedCheckpointIO()


def logger_locations(trainer: "pl.Trainer") -> Dict[str, Any]:
    """Where each logger writes: CSV (save_dir, name) -> version; W&B run id."""
    out: Dict[str, Any] = {"csv": [], "wandb": []}
    for lg in trainer.loggers:
        if isinstance(lg, CSVLogger):
            out["csv"].append({"root": str(Path(lg.root_dir)), "version": lg.version})
        elif isinstance(lg, WandbLogger):
            run_id = lg.version  # the run id once the run exists
            if run_id:
                out["wandb"].append({"save_dir": str(lg.save_dir), "id": str(run_id)})
    return out


def _unhealthy(pl_module) -> bool:
    return bool(getattr(pl_module, "unhealthy", False))


class EpochCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that always writes ``last.ckpt`` at the end of every training epoch.

    All arguments are ``ModelCheckpoint``'s; ``save_last`` defaults to True and ``save_top_k``
    to 0 without a ``monitor`` (1 with one: the best checkpoint of the monitored metric).
    """

    def __init__(self, *args, save_last: bool = True, save_top_k: Optional[int] = None, **kwargs):
        if save_top_k is None:
            save_top_k = 1 if kwargs.get("monitor") else 0
        super().__init__(*args, save_last=save_last, save_top_k=save_top_k, **kwargs)
        self._locations: Dict[str, Any] = {}
        self._epoch_end = False
        self._monitor_seen = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        install_verified_io(trainer)

    # -- when to write -------------------------------------------------------------------------
    def _save_last_checkpoint(self, trainer, monitor_candidates) -> None:
        # only at the end of a training epoch (or of fit): one well-defined resume point per epoch
        if self._epoch_end:
            super()._save_last_checkpoint(trainer, monitor_candidates)

    def _save_topk_checkpoint(self, trainer, monitor_candidates) -> None:
        if self.monitor is not None and self.monitor not in monitor_candidates:
            return  # an epoch the metric's monitor did not measure (its schedule): top-k unchanged
        self._monitor_seen = self.monitor is not None
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if _unhealthy(pl_module):
            return
        super().on_train_epoch_end(trainer, pl_module)
        # not ``_should_skip_saving_checkpoint``: it also skips when a top-k checkpoint was just
        # written at this global step (the epoch's validation improved the monitored metric),
        # which would leave last.ckpt one epoch behind (or absent) exactly when the run improves
        if not self.save_last or self._outside_fit(trainer):
            return
        for lg in trainer.loggers:  # the history on disk must not lag the checkpoint
            lg.save()
        self._locations = logger_locations(trainer)
        self._epoch_end = True
        try:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        finally:
            self._epoch_end = False

    @staticmethod
    def _outside_fit(trainer) -> bool:
        from lightning.pytorch.trainer.states import TrainerFn

        return bool(trainer.fast_dev_run) or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking

    def on_validation_end(self, trainer, pl_module) -> None:
        if not _unhealthy(pl_module):
            super().on_validation_end(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.monitor is not None and not self._monitor_seen and not self.best_model_path \
                and not self._outside_fit(trainer):
            rank_zero_warn(f"EpochCheckpoint: the monitored metric {self.monitor!r} was never logged "
                           f"in this run, so no best checkpoint was written (last.ckpt was); check "
                           f"`monitor` against the logged keys: {sorted(self._monitor_candidates(trainer))}")
        if _unhealthy(pl_module):
            return
        self._epoch_end = True
        try:
            super().on_train_end(trainer, pl_module)
        finally:
            self._epoch_end = False

    def on_exception(self, trainer, pl_module, exception) -> None:
        return  # never overwrite the last good checkpoint with the state of a failing run

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state["logger_locations"] = dict(self._locations)
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._locations = dict(state_dict.get("logger_locations", {}))
        super().load_state_dict(state_dict)


def _saved_locations(checkpoint: dict) -> Dict[str, Any]:
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if isinstance(state, dict) and "logger_locations" in state:
            return state["logger_locations"] or {}
    return {}


def _read_csv(path: Path):
    with open(path, newline="") as f:
        text = f.read()
    header = next(csv.reader(io.StringIO(text)), [])
    return header, list(csv.DictReader(io.StringIO(text)))


def _continue_csv(lg: CSVLogger, max_step: int) -> list:
    """Reopen a CSVLogger's version directory keeping the rows with step <= max_step.

    Lightning's CSV writer deletes an existing ``metrics.csv`` when it starts, so the file is first
    moved aside (an atomic rename: a crash here loses nothing), the writer started, the kept rows
    written back atomically under the same header, and only then the moved copy removed."""
    metrics = Path(lg.log_dir) / "metrics.csv"
    if not metrics.is_file():
        return []
    aside = metrics.with_name("metrics.csv.resuming")
    os.replace(metrics, aside)
    header, rows = _read_csv(aside)
    keep = [r for r in rows if not r.get("step") or int(float(r["step"])) <= max_step]
    writer = lg.experiment  # creates the writer (nothing left to delete)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header)  # csv's default \r\n, as Lightning writes
    w.writeheader()
    w.writerows(keep)
    atomic_write_bytes(metrics, buf.getvalue().encode())
    writer.metrics_keys = list(header)  # later rows are appended under the same header
    aside.unlink()
    return keep


def _replay(lg: WandbLogger, rows: list) -> int:
    """Log the kept CSV rows (the history up to the checkpoint) into a resumed W&B run.

    W&B buffers records in its service process, so a SIGKILLed segment may have lost its last
    rows; the resumed segment then holds the whole history by itself (readers that merge
    segments by epoch, like ``python -m lightning_pfd report``, get every epoch once)."""
    n = 0
    for r in rows:
        vals = {k: float(v) for k, v in r.items() if k != "step" and v not in ("", None)}
        if vals and r.get("step"):
            lg.log_metrics(vals, step=int(float(r["step"])))
            n += 1
    return n


def continue_loggers(trainer: "pl.Trainer", checkpoint: dict) -> list:
    """Point the (not yet started) loggers at the run the checkpoint belongs to.

    CSV loggers reuse the checkpoint's version directory, with the rows written after the
    checkpoint (the killed part of the interrupted epoch) dropped; W&B loggers resume the same run
    id. Returns one line per logger saying what was continued (printed by the command line)."""
    saved, lines = _saved_locations(checkpoint), []
    step = int(checkpoint.get("global_step", 0))
    csv_saved = {d["root"]: d["version"] for d in saved.get("csv", [])}
    wandb_saved = {d["save_dir"]: d["id"] for d in saved.get("wandb", [])}
    history: list = []
    for lg in trainer.loggers:
        if isinstance(lg, CSVLogger) and str(Path(lg.root_dir)) in csv_saved:
            lg._version = csv_saved[str(Path(lg.root_dir))]
            rows = _continue_csv(lg, step)
            history = history or rows
            lines.append(f"CSV log continues in {lg.log_dir} (rows after step {step} dropped)")
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and str(lg.save_dir) in wandb_saved and lg._experiment is None:
            run_id = wandb_saved[str(lg.save_dir)]
            lg._wandb_init.update(id=run_id, resume="allow")
            lg._id = run_id
            n = _replay(lg, history) if history else 0
            lines.append(f"W&B run {run_id} resumed" + (f" ({n} history rows up to step {step} "
                                                        "replayed from the CSV log)" if n else ""))
    return lines


def run_artifacts(trainer: "pl.Trainer") -> list:
    """Files of an earlier run that a fresh fit would overwrite: last.ckpt and top-k checkpoints
    in the checkpoint directory."""
    found = []
    for cb in trainer.checkpoint_callbacks:
        d = getattr(cb, "dirpath", None)
        if d and os.path.isdir(d):
            found += sorted(str(p) for p in Path(d).glob("*.ckpt"))
    return found
