"""DiffusionModule: EDM / VP training with EMA weights (Lightning glue over lightning_pfd.diffusion)."""
from __future__ import annotations

import os
import warnings
from typing import Optional, Sequence

import torch
from torch import nn

from ..diffusion import (EDMLoss, EDMPrecond, VPLoss, VPPrecond, clamp_sigmas, karras_sigmas,
                         sample_endpoints)
from ..diffusion.sampling import SAMPLERS
from ..errors import check_choice
from .base import ResumableModule, check_optimizer_args
from .ema import EMA, ema_step, sanitize_gradients
from .optim import adam_with_warmup

__all__ = ["DiffusionModule"]

PRECONDS = ("edm", "vp")


def _check_choice(name: str, value, allowed) -> None:
    check_choice(name, value, allowed)


# The EMA copy is deliberately kept in eval mode; Lightning's generic warning about modules in
# eval mode at the start of training refers to it.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


def limit_cpu_threads(trainer) -> None:
    """torch.set_num_threads(max(1, cores // local processes)) for multi-process CPU runs."""
    if trainer is None or trainer.world_size <= 1:
        return
    if getattr(trainer.strategy.root_device, "type", "cpu") != "cpu":
        return
    local = max(1, getattr(trainer, "num_devices", trainer.world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def _built_by_cli() -> bool:
    """True while LightningCLI instantiates the module with its parsed config."""
    try:
        from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
    except ImportError:  # pragma: no cover - older/newer Lightning
        return False
    return _given_hyperparameters.get() is not None


class DiffusionModule(ResumableModule):
    """Train a denoiser D(x; sigma) with the EDM or VP loss; keep EMA weights for evaluation.

    Args:
        net: the raw network ``net(c_in * x, c_noise)`` (e.g. ``UNet``, ``MLPNet``).
        precond: ``"edm"`` (Karras et al. 2022) or ``"vp"`` (Song et al. 2021): EDM paper Table 1.
        lr, betas, weight_decay: Adam(W) settings; ``warmup_steps`` linear LR warm-up.
        ema_decay: per-step EMA decay; ``ema_halflife_kimg`` (EDM's convention) overrides it.
        ema_rampup: ramp the EMA up at the start of training (``modules.ema.ema_beta``).
        num_steps, sigma_min, sigma_max, rho, sampler: the PF-ODE sampler used by ``generate``
            and every evaluation callback (Heun-18 on EDM's grid by default).
        sample_autocast: run the network in bf16 autocast while sampling on CUDA.
        train_seed: training seed (None: ``seed_everything``'s, else 0); batch k's noise and dropout
            come from SplitMix64(seed, k, rank), so a resumed run is bit-identical.
        divergence_patience: consecutive steps with non-finite loss/gradients that make a
            ``diverged`` event (0 = off); ``on_divergence``: ``"stop"`` or ``"continue"``.
    """

    ARCHITECTURE_KEYS = frozenset({"net", "precond", "sigma_data", "vp_beta_d", "vp_beta_min",
                                   "vp_M", "vp_epsilon_t"})

    def __init__(
        self,
        net: nn.Module,
        precond: str = "edm",
        sigma_data: float = 0.5,
        P_mean: float = -1.2,
        P_std: float = 1.2,
        vp_beta_d: float = 19.9,
        vp_beta_min: float = 0.1,
        vp_epsilon_t: float = 1e-5,
        vp_M: int = 1000,
        lr: float = 1e-3,
        betas: Sequence[float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        ema_decay: float = 0.999,
        ema_halflife_kimg: Optional[float] = None,
        ema_rampup: bool = True,
        num_steps: int = 18,
        sigma_min: float = 0.002,
        sigma_max: float = 80.0,
        rho: float = 7.0,
        sampler: str = "heun",
        sample_autocast: bool = False,
        train_seed: Optional[int] = None,
        divergence_patience: int = 10,
        on_divergence: str = "stop",
    ):
        super().__init__()
        _check_choice("precond", precond, PRECONDS)
        _check_choice("sampler", sampler, sorted(SAMPLERS))
        check_optimizer_args(lr, betas, weight_decay, warmup_steps)
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"ema_decay: must lie in [0, 1], got {ema_decay}")
        if ema_halflife_kimg is not None and ema_halflife_kimg <= 0:
            raise ValueError(f"ema_halflife_kimg: must be > 0, got {ema_halflife_kimg}")
        self.sigmas = karras_sigmas(num_steps, sigma_min, sigma_max, rho)  # validates the grid
        if not hasattr(net, "data_shape"):
            raise ValueError("net: must expose `data_shape` (the shape of one sample)")
        # Under LightningCLI the net arrives as its class_path config, which is saved so
        # load_from_checkpoint(path) rebuilds it; a net built in Python is not picklable into
        # hparams safely: pass it again, load_from_checkpoint(path, net=...).
        self.save_hyperparameters(ignore=[] if _built_by_cli() else ["net"])
        self.net = net
        if precond == "edm":
            self.precond = EDMPrecond(net, sigma_data=sigma_data)
            self.loss_fn = EDMLoss(P_mean, P_std, sigma_data)
        else:
            self.precond = VPPrecond(net, vp_beta_d, vp_beta_min, vp_M, vp_epsilon_t)
            self.loss_fn = VPLoss(vp_beta_d, vp_beta_min, vp_epsilon_t)
        self.sigmas = clamp_sigmas(self.sigmas, self.precond)
        self.ema = EMA(self.precond)
        self._init_resumable(train_seed, divergence_patience, on_divergence)

    # -- public interface used by the callbacks -------------------------------------------
    @property
    def data_shape(self) -> tuple:
        return tuple(self.net.data_shape)

    @property
    def sigma_data(self) -> float:
        return float(self.hparams.sigma_data)

    @property
    def denoiser(self) -> nn.Module:
        """The EMA denoiser D(x; sigma) in eval mode: use it for every evaluation."""
        return self.ema.shadow

    @torch.no_grad()
    def generate(self, seeds, sigmas: Optional[torch.Tensor] = None, sampler: Optional[str] = None,
                 batch_size: int = 256, denoiser: Optional[nn.Module] = None,
                 num_steps: Optional[int] = None) -> torch.Tensor:
        """PF-ODE samples (float64, on this module's device), one per seed (PFD paper eq. 2; EDM Alg. 1).

        ``sigmas`` gives the grid; else ``num_steps`` rebuilds the module's Karras grid with that
        many steps; else the module's grid (Heun-18 by default)."""
        den = self.denoiser if denoiser is None else denoiser
        if sigmas is None and num_steps is not None:
            hp = self.hparams
            sigmas = karras_sigmas(num_steps, hp.sigma_min, hp.sigma_max, hp.rho)
        grid = self.sigmas if sigmas is None else clamp_sigmas(sigmas, den)
        use_amp = bool(self.hparams.sample_autocast) and self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_amp):
            return sample_endpoints(den, seeds, self.data_shape, grid,
                                    sampler or self.hparams.sampler, batch_size,
                                    device=self.device, out_device=self.device)

    def setup(self, stage: str) -> None:
        """Fail before any training if the data's sample shape does not fit the net; cap the
        intra-op threads of CPU DDP ranks (two 2-thread ranks on 2 cores run ~20x slower)."""
        limit_cpu_threads(self._trainer)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        d_shape = getattr(dm, "data_shape", None)
        if d_shape is not None and tuple(d_shape) != self.data_shape:
            raise ValueError(
                f"model.init_args.net: the net expects samples of shape {self.data_shape} but the "
                f"data ({type(dm).__name__}) has shape {tuple(d_shape)}; set the net's "
                "img_resolution / in_channels (or dim) to match")

    # -- training ----------------------------------------------------------------------------
    @staticmethod
    def _images(batch) -> torch.Tensor:
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def training_step(self, batch, batch_idx):
        y = self._images(batch)
        loss = self.loss_fn(self.precond, y).mean()
        self._last_loss = loss.detach()
        self._log_train({"train/loss": loss}, y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        """Frozen-noise loss of the EMA weights; seeds by the sample's index in the validation
        set, so ``val/loss`` is the same for any number of processes."""
        y = self._images(batch)
        seeds, keep = self._val_seeds(batch_idx, y.shape[0], y.device)
        per = self.loss_fn(self.denoiser, y, seeds=seeds)
        self._accumulate_val("val/loss", per, keep)
        return per.mean()

    def on_before_optimizer_step(self, optimizer) -> None:
        # EDM's guard: NaN gradients -> 0, +-inf -> +-1e5 (after counting them for divergence)
        self._check_gradients(self.precond.parameters())
        sanitize_gradients(self.precond.parameters())

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        world = self.trainer.world_size if self._trainer is not None else 1
        ema_step(self.ema, self.precond, self.hparams, self._images(batch).shape[0], world)

    def configure_optimizers(self):
        return adam_with_warmup(self.precond.parameters(), self.hparams, self.device)
