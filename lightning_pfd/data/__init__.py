"""LightningDataModules: digits, Fashion-MNIST, CIFAR-10 (local), GMM, tensor files, distillation."""
from .base import TensorDataModule
from .cifar import CIFAR10DataModule
from .digits import DigitsDataModule
from .distill import TeacherDistillationDataModule
from .fashion import FashionMNISTDataModule
from .gmm import GaussianMixtureDataModule
from .tensorfile import TensorFileDataModule

__all__ = [
    "TensorDataModule", "DigitsDataModule", "FashionMNISTDataModule", "CIFAR10DataModule",
    "GaussianMixtureDataModule", "TensorFileDataModule", "TeacherDistillationDataModule",
]
from .heavy import HeavyTailedFieldDataModule  # noqa: E402
from .precip import PrecipitationDataModule  # noqa: E402

__all__ = __all__ + ["PrecipitationDataModule", "HeavyTailedFieldDataModule"]
