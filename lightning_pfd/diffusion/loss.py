"""The EDM and VP denoising losses under their historical names.

Each loss returns the *per-sample* loss lambda(sigma) ||D(y + sigma n; sigma) - y||^2 summed over
data dimensions, shape (B,) (EDM eq. 2 and 8). The loss itself is
:class:`~lightning_pfd.diffusion.families.DenoisingLoss` (one for every family: noise and sigma
from the global RNG, or frozen per sample given ``seeds`` -- the l_train / l_test of the PFD
paper, App. C.6); these classes build it with the EDM or VP family and keep their constructor
arguments and attributes.
"""
from __future__ import annotations

from .families import DenoisingLoss, EDMFamily, VPFamily

__all__ = ["EDMLoss", "VPLoss"]


class EDMLoss(DenoisingLoss):
    """EDM loss: ln sigma ~ N(P_mean, P_std^2), lambda = (sigma^2+s_d^2)/(sigma s_d)^2."""

    def __init__(self, P_mean: float = -1.2, P_std: float = 1.2, sigma_data: float = 0.5):
        super().__init__(EDMFamily(sigma_data=sigma_data, P_mean=P_mean, P_std=P_std))
        self.P_mean, self.P_std, self.sigma_data = self.family.P_mean, self.family.P_std, self.family.sigma_data


class VPLoss(DenoisingLoss):
    """VP loss: t ~ U(eps_t, 1), sigma = sigma_VP(t), lambda = 1/sigma^2 (EDM paper Table 1)."""

    def __init__(self, beta_d: float = 19.9, beta_min: float = 0.1, epsilon_t: float = 1e-5):
        super().__init__(VPFamily(beta_d=beta_d, beta_min=beta_min, epsilon_t=epsilon_t))
        self.beta_d, self.beta_min, self.epsilon_t = self.family.beta_d, self.family.beta_min, self.family.epsilon_t

    def sigma(self, t):
        return self.family.sigma(t)
