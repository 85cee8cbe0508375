"""LightningModules: DiffusionModule (any diffusion family: EDM | VP | VE | registered) and
LevyItoModule, both on the EMA / optimizer base EMAModule."""
from .base import EMAModule
from .diffusion import DiffusionModule
from .ema import EMA, beta_from_halflife, ema_beta
from .levy import LevyItoModule

__all__ = ["DiffusionModule", "EMA", "EMAModule", "beta_from_halflife", "ema_beta", "LevyItoModule"]
