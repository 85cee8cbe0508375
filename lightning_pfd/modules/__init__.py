"""LightningModules: DiffusionModule (EDM | VP) and LevyItoModule."""
from .diffusion import DiffusionModule
from .ema import EMA, beta_from_halflife, ema_beta
from .levy import LevyItoModule

__all__ = ["DiffusionModule", "EMA", "beta_from_halflife", "ema_beta", "LevyItoModule"]
