"""A one-parameter LightningModule and a callback that logs a scripted ICR curve as ICRMonitor
does (the value as ``icr/icr``, optionally its delete-a-group jackknife replicates in its
``latest`` measurement and in the run's per-unit store): the Trainer side of the ICR
early-stopping tests and of ``experiments/icr_early_stopping.py``, without a diffusion model."""
from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lightning_pfd.analysis.per_unit import UnitRecord
from lightning_pfd.callbacks.base import per_unit_store
from lightning_pfd.callbacks.monitor import Latest
from lightning_pfd.evaluation.base import Measurement, Units


class TinyModule(pl.LightningModule):
    """w -> (w - 1)^2 by SGD on ``batch`` zero inputs: one step per epoch, nothing else."""

    def __init__(self, batch: int = 2):
        super().__init__()
        self.batch = batch
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w - 1).pow(2).sum()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(self.batch, 1)), batch_size=self.batch)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(self.batch, 1)), batch_size=self.batch)


class ScriptedICR(Callback):
    """Logs ``y[epoch]`` as ``icr/icr`` in ``on_validation_epoch_end`` (not in the sanity check),
    and with ``reps`` (epochs, G) keeps the epoch's jackknife replicates in ``latest`` and writes
    them to the store, as ICRMonitor does."""

    def __init__(self, y, reps=None):
        self.y, self.reps = np.asarray(y, dtype=np.float64), reps
        self.latest = None

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        e = trainer.current_epoch
        pl_module.log("icr/icr", torch.tensor(self.y[e], dtype=torch.float32))
        if self.reps is not None:
            groups = np.arange(self.reps.shape[1])
            units = Units("jackknife", torch.from_numpy(self.reps[e]), torch.from_numpy(groups), float(self.y[e]))
            record = UnitRecord("icr/icr", e, trainer.global_step, "jackknife", self.reps[e], groups, float(self.y[e]))
            self.latest = Latest(e, trainer.global_step, Measurement({"icr": float(self.y[e])}, {"icr": units}),
                                 {"icr/icr": float(self.y[e])}, {"icr/icr": record})
        if self.reps is not None and trainer.is_global_zero:
            per_unit_store(trainer).write(UnitRecord("icr/icr", e, trainer.global_step, "jackknife",
                                                     self.reps[e], groups, float(self.y[e])))


def previous_rule(y, reps, min_rise_z, patience=5):
    """The previous ``ICREarlyStopping(min_rise_z)`` (the rule the rise test replaced): patience on
    the raw values, then the paired jackknife z of (now − best) >= ``min_rise_z``, re-tested at
    every check after patience is exhausted. ``reps``: (n, G) delete-a-group replicates. Returns
    the stop index or None (a zero jackknife variance with a rise gave z = inf: a stop)."""
    g = reps.shape[1]
    best, best_i, wait = np.inf, -1, 0
    for i, v in enumerate(y):
        if v < best:
            best, best_i, wait = v, i, 0
            continue
        wait += 1
        if wait >= patience:
            d = reps[i] - reps[best_i]
            se = float(np.sqrt((g - 1) / g * ((d - d.mean()) ** 2).sum()))
            z = (y[i] - y[best_i]) / se if se > 0 else (np.inf if y[i] > y[best_i] else 0.0)
            if z >= min_rise_z:
                return i
    return None
