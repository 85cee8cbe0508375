"""Denoiser networks ``net(x_in, c_noise) -> F``: U-Net family (unet1..unet10) and MLPNet."""
from .layers import count_parameters
from .mlp import MLPNet
from .unet import UNET_PRESET_PARAMS, UNET_PRESETS, UNet

__all__ = ["UNet", "MLPNet", "count_parameters", "UNET_PRESETS", "UNET_PRESET_PARAMS"]
