"""A checkpoint written when max_steps / max_time ended an epoch early is recognised (Lightning
would resume at the next epoch: the rest of the cut epoch is never trained nor validated)."""
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_pfd.checkpoint import truncated_epoch


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 2)), batch_size=4)


def _fit(tmp_path, name, **kw):
    ck = ModelCheckpoint(dirpath=str(tmp_path / name), save_last=True, save_top_k=0)
    pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[ck], enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=str(tmp_path), **kw).fit(Tiny())
    return torch.load(tmp_path / name / "last.ckpt", weights_only=True, map_location="cpu")


def test_a_checkpoint_cut_inside_an_epoch_is_recognised(tmp_path):
    cut = _fit(tmp_path, "cut", max_epochs=3, max_steps=25)  # 10 steps per epoch: stops in epoch 2
    assert truncated_epoch(cut) == (2, 5)
    whole = _fit(tmp_path, "whole", max_epochs=2)
    assert truncated_epoch(whole) is None
    assert truncated_epoch({"epoch": 1}) is None  # no loop state (a hand-made checkpoint): no claim
