"""Components that refuse an argument by its bare name, built by class_path from a config
(tests/test_config_paths.py): the command line adds where each one sits in the config."""
from __future__ import annotations

import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lightning_pfd.errors import ConfigError, MissingFileError


class TinyModel(pl.LightningModule):
    """A linear regression; refuses ``width`` < 1 (its own argument)."""

    def __init__(self, width: int = 2, num_steps: int = 4):
        super().__init__()
        if width < 1:
            raise ConfigError("width", "must be >= 1", value=width)
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TinyData(pl.LightningDataModule):
    """Eight random points; refuses ``n`` < 1 (its own argument)."""

    def __init__(self, n: int = 8, width: int = 2):
        super().__init__()
        if n < 1:
            raise ConfigError("n", "must be >= 1", value=n)
        self.n, self.width = n, width

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(self.n, self.width, generator=g),
                                        torch.randn(self.n, 1, generator=g)), batch_size=4)


class NeedsAFile(pl.LightningDataModule):
    """Refuses a checkpoint file that does not exist (a MissingFileError: also a FileNotFoundError)."""

    def __init__(self, ckpt: str = "nowhere.ckpt"):
        super().__init__()
        raise MissingFileError("ckpt", ckpt, "a checkpoint file")


class TapMonitor(Callback):
    """Refuses an unknown ``tap`` when built; in its pre-flight ``check_setup``: ``stride``
    larger than the training set (its own argument), or a model ``num_steps`` below
    ``min_steps`` (an argument of the model it read: ``model.num_steps``)."""

    def __init__(self, tap: str = "mid", stride: int = 1, min_steps: int = 0):
        if tap not in ("mid", "out"):
            raise ConfigError("tap", "unknown tap", value=tap, accepted=["mid", "out"])
        self.tap, self.stride, self.min_steps = tap, stride, min_steps

    def check_setup(self, trainer, model, datamodule) -> None:
        if self.stride > datamodule.n:
            raise ConfigError("stride", f"larger than the training set ({datamodule.n} samples)",
                              value=self.stride)
        if model.hparams.num_steps < self.min_steps:
            raise ConfigError("model.num_steps", f"this monitor needs at least {self.min_steps} steps",
                              value=model.hparams.num_steps)


def tap_monitor(tap: str = "mid", stride: int = 1, min_steps: int = 0) -> TapMonitor:
    """A factory function as a callback's class_path (its return annotation: a Callback)."""
    return TapMonitor(tap=tap, stride=stride, min_steps=min_steps)
