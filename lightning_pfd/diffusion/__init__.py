"""The math of diffusion models, pure torch (no Lightning import)."""
from .augment import augment, noisy_view
from .empirical import EmpiricalDenoiser
from .exact import GaussianDenoiser, GaussianMixtureDenoiser
from .families import (DenoisingLoss, DiffusionFamily, EDMFamily, PreconditionedDenoiser, VEFamily,
                       VPFamily, build_family, family_names, get_family, register_family)
from .levy import sample_alpha_stable
from .noise import seeded_noise, seeded_uniform
from .sampling import clamp_sigmas, euler_sample, heun_sample, karras_sigmas, sample_endpoints

__all__ = [
    "karras_sigmas", "heun_sample", "euler_sample", "sample_endpoints", "clamp_sigmas",
    "seeded_noise", "seeded_uniform",
    "DiffusionFamily", "EDMFamily", "VPFamily", "VEFamily", "PreconditionedDenoiser", "DenoisingLoss",
    "register_family", "get_family", "family_names", "build_family",
    "GaussianDenoiser", "GaussianMixtureDenoiser", "EmpiricalDenoiser", "sample_alpha_stable",
    "augment", "noisy_view",
]
