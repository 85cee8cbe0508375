"""A tiny datamodule with an analytic Gaussian teacher (closed-form denoiser), for monitor tests."""
import torch

from lightning_pfd.data import TensorDataModule
from lightning_pfd.diffusion import GaussianDenoiser

#: the 3-d Gaussian law of the flow / compile tests
MEAN = torch.tensor([0.5, -0.3, 0.2])
COV = torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.4]])


class GaussianTeacherDM(TensorDataModule):
    """12 training and 7 validation samples of N(mean, cov); the teacher is the law's exact
    denoiser, evaluation seeds from 7000."""

    def __init__(self, mean: torch.Tensor = MEAN, cov: torch.Tensor = COV):
        law = GaussianDenoiser(mean, cov)
        super().__init__(train_data=law.sample(range(12)).float(), val_data=law.sample(range(100, 107)).float(),
                         batch_size=6, value_range=None)
        self._law, self.gen_seed_offset = law, 7_000

    def setup(self, stage=None):
        super().setup(stage)
        self.teacher = self._law
