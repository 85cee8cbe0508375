"""LightningDataModules: digits, Fashion-MNIST, CIFAR-10 (local), GMM, tensor files, distillation,
StageIV precipitation and synthetic heavy-tailed fields."""
from .base import TensorDataModule
from .cifar import CIFAR10DataModule
from .digits import DigitsDataModule
from .distill import TeacherDistillationDataModule
from .fashion import FashionMNISTDataModule
from .gmm import GaussianMixtureDataModule
from .heavy import HeavyTailedFieldDataModule
from .precip import PrecipitationDataModule
from .tensorfile import TensorFileDataModule

__all__ = [
    "TensorDataModule", "DigitsDataModule", "FashionMNISTDataModule", "CIFAR10DataModule",
    "GaussianMixtureDataModule", "TensorFileDataModule", "TeacherDistillationDataModule",
    "PrecipitationDataModule", "HeavyTailedFieldDataModule",
]
