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

import copy
import csv
import io
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence
from weakref import proxy

import torch

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from ..atomic import atomic_write
from ..checkpoint import VerifiedCheckpointIO

__all__ = ["EpochCheckpoint", "install_verified_io", "continue_loggers", "logger_locations",
           "DataFingerprint", "install_data_fingerprint", "DATA_KEY"]

#: the folder (inside a dirpath) of the weights where a max_steps / max_time stop cut an epoch
STOPPED_DIR = "stopped"
#: the checkpoint entry holding the fingerprint of the data the run trains on
DATA_KEY = "lightning_pfd_data"


def install_verified_io(trainer: "pl.Trainer") -> None:
    """Replace Lightning's default checkpoint IO by the verified, atomic one (idempotent)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # the default (created on first access)
        strategy.checkpoint_io = VerifiedCheckpointIO()


class DataFingerprint(pl.Callback):
    """Stores :func:`lightning_pfd.data.base.data_fingerprint` of the run's datamodule (its
    arguments and the files they name) in every checkpoint, under :data:`DATA_KEY`; the command
    line compares it on resume. Holds no state of its own (nothing in ``callbacks``)."""

    def __init__(self, fingerprint: dict):
        self.fingerprint = dict(fingerprint)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.fingerprint:
            checkpoint[DATA_KEY] = copy.deepcopy(self.fingerprint)


def install_data_fingerprint(trainer: "pl.Trainer", datamodule) -> None:
    """Add a :class:`DataFingerprint` of ``datamodule`` to the trainer (once)."""
    from ..data.base import data_fingerprint

    if datamodule is None or any(isinstance(cb, DataFingerprint) for cb in trainer.callbacks):
        return
    trainer.callbacks.append(DataFingerprint(data_fingerprint(datamodule)))


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


def epoch_cut(trainer: "pl.Trainer") -> bool:
    """Whether the training epoch that just ended stopped before its last batch (``max_steps``
    or ``max_time`` reached inside it): Lightning does not resume such an epoch where it stopped."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return not progress.is_last_batch and progress.current.completed > 0


def _same_file(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two local paths name the same file (False for remote paths or a missing one)."""
    if not a or not b or "://" in str(a) or "://" in str(b):
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _unhealthy(pl_module) -> bool:
    return bool(getattr(pl_module, "unhealthy", False))


def monitor_candidates(trainer: "pl.Trainer") -> Dict[str, torch.Tensor]:
    """The values a checkpoint's name and top-k can use: the callback metrics, with ``epoch``
    and ``step`` as integer tensors (the trainer's when not logged)."""
    out = copy.deepcopy(dict(trainer.callback_metrics))
    for key, default in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
        v = out.get(key)
        out[key] = v.int() if isinstance(v, torch.Tensor) else torch.tensor(default)
    return out


class EpochCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that always writes ``last.ckpt`` at the end of every training epoch.

    All arguments are ``ModelCheckpoint``'s; ``save_last`` defaults to True and ``save_top_k``
    to 0 without a ``monitor`` (1 with one: the best checkpoint of the monitored metric).
    Lightning's part is the top-k checkpoints; ``last.ckpt`` is written here, through the
    public ``trainer.save_checkpoint`` (Lightning's own ``save_last`` is off).
    """

    def __init__(self, *args, save_last: bool = True, save_top_k: Optional[int] = None,
                 enable_version_counter: bool = True, **kwargs):
        if save_top_k is None:
            save_top_k = 1 if kwargs.get("monitor") else 0
        if save_last not in (True, False):
            raise ValueError(f"EpochCheckpoint.save_last: must be true or false, got {save_last!r}")
        super().__init__(*args, save_last=False, save_top_k=save_top_k,
                         enable_version_counter=enable_version_counter, **kwargs)
        self.write_last = bool(save_last)
        self.version_last = bool(enable_version_counter)
        self._locations: Dict[str, Any] = {}
        self._monitor_seen = False
        self._wrote_in_fit = False
        self._top_k_at_start: Dict[str, Any] = {}
        self._cut: Optional[tuple] = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        install_verified_io(trainer)

    def on_fit_start(self, trainer, pl_module) -> None:
        super().on_fit_start(trainer, pl_module)
        self._wrote_in_fit = False
        self._top_k_at_start = dict(self.best_k_models)
        self._cut = None
        self._stopped_path = None

    # -- top-k: Lightning's, in the epochs where the monitored metric was measured -------------
    def _measured(self, trainer) -> bool:
        """Whether the monitored metric exists now (a monitor's schedule skips some epochs: the
        top-k checkpoints then stay unchanged; Lightning would stop the run with an error)."""
        if self.monitor is None:
            return True
        seen = self.monitor in trainer.callback_metrics or self.monitor in ("epoch", "step")
        self._monitor_seen = self._monitor_seen or seen
        return seen

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._measured(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not _unhealthy(pl_module) and self._measured(trainer):
            super().on_validation_end(trainer, pl_module)

    # -- last.ckpt: every epoch end ------------------------------------------------------------
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if _unhealthy(pl_module):
            return
        if not self._outside_fit(trainer) and epoch_cut(trainer):  # max_steps / max_time inside it:
            self._cut = (trainer.current_epoch,  # last.ckpt stays at the last epoch end
                         trainer.fit_loop.epoch_loop.batch_progress.current.completed)
            self._save_stopped(trainer)
            return
        if self._measured(trainer):
            super().on_train_epoch_end(trainer, pl_module)
        if not self.write_last or self._outside_fit(trainer):
            return
        for lg in trainer.loggers:  # the history on disk must not lag the checkpoint
            lg.save()
        self._locations = logger_locations(trainer)
        self.save_last_checkpoint(trainer)

    def _save_stopped(self, trainer) -> None:
        """The weights where a cut epoch stopped, in ``<dirpath>/stopped/`` (not a resume point:
        ``--ckpt_path last`` and ``best`` never pick it); the previous one there is replaced."""
        if self.dirpath is None or "://" in str(self.dirpath):
            return
        folder = Path(self.dirpath) / STOPPED_DIR
        path = folder / f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"
        old = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
        trainer.save_checkpoint(str(path), self.save_weights_only)
        self._stopped_path = str(path)
        if trainer.is_global_zero:
            for q in old:
                if q != path:
                    q.unlink(missing_ok=True)

    def save_last_checkpoint(self, trainer) -> str:
        """Write ``last.ckpt`` (``last-vN.ckpt`` when another run's file has the name) and remove
        the previous one of this run; returns the path."""
        candidates = monitor_candidates(trainer)
        filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        if self.version_last:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != self.last_model_path \
                    and not _same_file(filepath, trainer.ckpt_path):  # a moved run: its own last.ckpt
                filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST, ver=version)
                version += 1
        previous, self.last_model_path = self.last_model_path, filepath  # part of the saved state
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._wrote_in_fit = True
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.after_save_checkpoint(proxy(self))
        if previous and self._removable(trainer, previous, filepath):
            trainer.strategy.remove_checkpoint(previous)
        return filepath

    def _removable(self, trainer, previous: str, current: str) -> bool:
        """The previous last.ckpt is removed unless it is the current one, the file this fit
        resumed from, or outside this callback's directory (local files)."""
        if previous == current:
            return False
        if "://" in str(previous):
            return True
        prev = Path(previous).absolute()
        if trainer.ckpt_path is not None and prev == Path(trainer.ckpt_path).absolute():
            return False
        return self.dirpath is not None and Path(self.dirpath).absolute() in prev.parents

    @staticmethod
    def _outside_fit(trainer) -> bool:
        from lightning.pytorch.trainer.states import TrainerFn

        return bool(trainer.fast_dev_run) or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking

    def on_train_end(self, trainer, pl_module) -> None:
        if self.monitor is not None and not self._monitor_seen and not self.best_model_path \
                and not self._outside_fit(trainer):
            rank_zero_warn(f"EpochCheckpoint: the monitored metric {self.monitor!r} was never logged "
                           f"in this run, so no best checkpoint was written (last.ckpt was); check "
                           f"`monitor` against the logged keys: {sorted(monitor_candidates(trainer))}")
        super().on_train_end(trainer, pl_module)
        if _unhealthy(pl_module) or not self.write_last or self._outside_fit(trainer):
            return
        if self._cut is not None:  # never a checkpoint inside an epoch: a resume re-runs it whole
            epoch, done = self._cut
            where = (f"{self.last_model_path} (end of epoch {epoch - 1})" if self.last_model_path
                     and os.path.isfile(self.last_model_path) else "no checkpoint (the first epoch was cut)")
            if trainer.is_global_zero:
                stopped = getattr(self, "_stopped_path", None)
                print(f"[lightning_pfd] the run stopped inside epoch {epoch}, after {done} of its steps "
                      f"(max_steps / max_time): the resume point is {where}; a resume with a larger "
                      f"limit trains epoch {epoch} again from its start, exactly as an uninterrupted "
                      "run would" + (f". The weights at the stop: {stopped} (not a resume point)"
                                     if stopped else ""), flush=True)
            return
        # a fit that wrote no checkpoint (e.g. a fast epoch's early stop) still leaves last.ckpt
        if not self._wrote_in_fit and dict(self.best_k_models) == self._top_k_at_start:
            self.save_last_checkpoint(trainer)

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


def _after_checkpoint(row: dict, max_step: int, max_epoch: Optional[int]) -> bool:
    """Whether a CSV row was logged after the checkpoint (step ``max_step``, epoch ``max_epoch``).

    The step alone cannot tell: a ``max_time`` / ``max_steps`` stop one step into an epoch
    validates that cut epoch and logs it at step = the checkpoint's (Lightning logs at the last
    optimizer step), and the end-of-run rows of a finished run carry its last step too. Both have
    a later epoch than the checkpoint's, so a row is dropped when either is later."""
    step, epoch = row.get("step"), row.get("epoch")
    if step and int(float(step)) > max_step:
        return True
    return bool(epoch) and max_epoch is not None and float(epoch) > max_epoch


def _continue_csv(lg: CSVLogger, max_step: int, max_epoch: Optional[int] = None) -> list:
    """Reopen a CSVLogger's version directory keeping the rows logged up to the checkpoint
    (:func:`_after_checkpoint`: step <= ``max_step`` and epoch <= ``max_epoch``).

    Lightning's CSV writer deletes an existing ``metrics.csv`` when it starts, so the file is first
    moved aside (an atomic rename: a crash here loses nothing), the writer started, the kept rows
    written back atomically under the same header, and only then the moved copy removed."""
    metrics = Path(lg.log_dir) / "metrics.csv"
    if not metrics.is_file():
        return []
    aside = metrics.with_name("metrics.csv.resuming")
    os.replace(metrics, aside)
    header, rows = _read_csv(aside)
    keep = [r for r in rows if not _after_checkpoint(r, max_step, max_epoch)]
    writer = lg.experiment  # creates the writer (nothing left to delete)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header)  # csv's default \r\n, as Lightning writes
    w.writeheader()
    w.writerows(keep)
    atomic_write(metrics, buf.getvalue())
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


def continue_loggers(trainer: "pl.Trainer", checkpoint: dict,
                     init_args: Optional[Sequence[Optional[Dict[str, Any]]]] = None) -> list:
    """Point the (not yet started) loggers at the run the checkpoint belongs to.

    ``init_args[i]`` are the constructor arguments of ``trainer.loggers[i]`` (the command line's
    config). A CSV logger is rebuilt with ``version=`` the checkpoint's version directory, with
    the rows written after the checkpoint (the killed part of the interrupted epoch) dropped; a
    W&B logger is rebuilt with ``id=`` the checkpoint's run and ``resume="allow"``; the trainer
    then gets the rebuilt loggers (``trainer.loggers``). A logger without constructor arguments
    is left as it is. Returns one line per logger saying what was continued."""
    saved, lines = _saved_locations(checkpoint), []
    step = int(checkpoint.get("global_step", 0))
    epoch = checkpoint.get("epoch")
    epoch = int(epoch) if isinstance(epoch, int) else None
    csv_saved = {d["root"]: d["version"] for d in saved.get("csv", [])}
    wandb_saved = {d["save_dir"]: d["id"] for d in saved.get("wandb", [])}
    loggers = list(trainer.loggers)
    args = list(init_args or [])
    args += [None] * (len(loggers) - len(args))
    history: list = []
    for i, (lg, kw) in enumerate(zip(loggers, args)):
        root = str(Path(lg.root_dir)) if isinstance(lg, CSVLogger) else None
        if root in csv_saved and kw is not None:
            loggers[i] = lg = type(lg)(**dict(kw, version=csv_saved[root]))
            rows = _continue_csv(lg, step, epoch)
            history = history or rows
            lines.append(f"CSV log continues in {lg.log_dir} (rows after step {step}"
                         + (f", epoch {epoch}" if epoch is not None else "") + " dropped)")
    for i, (lg, kw) in enumerate(zip(loggers, args)):
        if isinstance(lg, WandbLogger) and str(lg.save_dir) in wandb_saved and kw is not None:
            run_id = wandb_saved[str(lg.save_dir)]
            kw = dict(kw, id=run_id, resume="allow")
            if kw.get("version") is not None:
                kw["version"] = run_id
            loggers[i] = lg = type(lg)(**kw)
            n = _replay(lg, history) if history else 0
            lines.append(f"W&B run {run_id} resumed" + (f" ({n} history rows up to step {step} "
                                                        "replayed from the CSV log)" if n else ""))
    if lines:
        trainer.loggers = loggers
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
