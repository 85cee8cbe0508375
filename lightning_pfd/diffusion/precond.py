"""The EDM and VP preconditioned denoisers under their historical names.

Every model in the project is a callable ``D(x, sigma) -> x0_hat`` with x = y + sigma * n. The
preconditioning itself lives in :mod:`lightning_pfd.diffusion.families` (one
:class:`~lightning_pfd.diffusion.families.PreconditionedDenoiser` for every family); these two
classes build it with the EDM or VP family of the EDM paper's Table 1 (Karras et al. 2022,
"Elucidating the Design Space of Diffusion-Based Generative Models"), keeping the constructor
arguments and attributes they always had.
"""
from __future__ import annotations

import math

from torch import nn

from .families import EDMFamily, PreconditionedDenoiser, VPFamily, as_sigma

__all__ = ["EDMPrecond", "VPPrecond", "as_sigma"]


class EDMPrecond(PreconditionedDenoiser):
    """EDM preconditioning: D = c_skip x + c_out F(c_in x; c_noise) (EDM eq. 7, Table 1).

    c_skip = s_d^2/(s^2+s_d^2), c_out = s s_d/sqrt(s^2+s_d^2), c_in = 1/sqrt(s^2+s_d^2),
    c_noise = ln(s)/4. The skip combination is done in float32 even under autocast.
    """

    def __init__(self, net: nn.Module, sigma_data: float = 0.5, sigma_min: float = 0.0,
                 sigma_max: float = math.inf):
        super().__init__(net, EDMFamily(sigma_data=sigma_data, sigma_min=sigma_min, sigma_max=sigma_max))

    @property
    def sigma_data(self) -> float:
        return self.family.sigma_data


class VPPrecond(PreconditionedDenoiser):
    """VP preconditioning (EDM paper Table 1, VP column).

    sigma(t) = sqrt(exp(beta_d t^2/2 + beta_min t) - 1); c_skip = 1, c_out = -sigma,
    c_in = 1/sqrt(sigma^2+1), c_noise = (M-1) sigma^{-1}(sigma).
    """

    def __init__(self, net: nn.Module, beta_d: float = 19.9, beta_min: float = 0.1,
                 M: int = 1000, epsilon_t: float = 1e-5):
        super().__init__(net, VPFamily(beta_d=beta_d, beta_min=beta_min, M=M, epsilon_t=epsilon_t))

    beta_d = property(lambda self: self.family.beta_d)
    beta_min = property(lambda self: self.family.beta_min)
    M = property(lambda self: self.family.M)
    epsilon_t = property(lambda self: self.family.epsilon_t)

    def sigma(self, t):
        return self.family.sigma(t)

    def sigma_inv(self, sigma):
        return self.family.sigma_inv(sigma)
