"""EpochCheckpoint writes last.ckpt at every epoch end, also when the epoch's validation wrote a
top-k checkpoint at the same global step (Lightning then skips 'already saved' steps)."""
import lightning.pytorch as pl
import torch
from torch import nn

from lightning_pfd.callbacks import EpochCheckpoint
from lightning_pfd.checkpoint import load_checkpoint


class Improving(pl.LightningModule):
    """A metric that improves at every validation: the best checkpoint is rewritten every epoch."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def training_step(self, batch, _):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, _):
        self.log("score", -float(self.current_epoch), on_epoch=True, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)

    val_dataloader = train_dataloader


def _fit(tmp_path, epochs, monitor):
    ckpt = EpochCheckpoint(dirpath=tmp_path / "ckpt", monitor=monitor, mode="min",
                           filename="best-{epoch}")
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[ckpt],
                         default_root_dir=tmp_path)
    trainer.fit(Improving())
    return ckpt


def test_last_checkpoint_follows_every_epoch_even_when_the_best_one_is_written(tmp_path):
    ckpt = _fit(tmp_path, 3, "score")
    last = tmp_path / "ckpt" / "last.ckpt"
    assert last.exists()
    state = load_checkpoint(last)
    assert state["epoch"] == 2 and state["global_step"] == 6
    assert (tmp_path / "ckpt" / "best-epoch=2.ckpt").exists()
    assert ckpt.best_model_path.endswith("best-epoch=2.ckpt")


def test_last_checkpoint_after_each_epoch_of_an_interrupted_run(tmp_path):
    """After one epoch (the best was written at that step) last.ckpt already holds epoch 0."""
    _fit(tmp_path, 1, "score")
    state = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert state["epoch"] == 0 and state["global_step"] == 2


class Sparse(Improving):
    """The monitored metric is measured on odd epochs only (a monitor's schedule): epoch 0 and 2 log none."""

    def validation_step(self, batch, _):
        if self.current_epoch % 2 == 1:
            self.log("score", 1.0 / (1 + self.current_epoch),
                     on_epoch=True, batch_size=1)


def test_epochs_without_the_monitored_metric_keep_top_k_and_still_write_last(tmp_path):
    ckpt = EpochCheckpoint(dirpath=tmp_path / "ckpt", monitor="score", mode="min", filename="best-{epoch}")
    trainer = pl.Trainer(max_epochs=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[ckpt], default_root_dir=tmp_path)
    trainer.fit(Sparse())  # Lightning's ModelCheckpoint raises at epoch 0 here
    state = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert state["epoch"] == 3 and state["global_step"] == 8
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("best-*")) == ["best-epoch=3.ckpt"]
    assert abs(float(ckpt.best_model_score) - 0.25) < 1e-12


def test_a_monitored_key_never_logged_is_reported(tmp_path):
    import pytest

    with pytest.warns(UserWarning, match="'scroe' was never logged"):
        ckpt = _fit(tmp_path, 2, "scroe")
    assert (tmp_path / "ckpt" / "last.ckpt").exists() and ckpt.best_model_path == ""
