"""DiffusionModule: a sigma-space denoiser of any diffusion family trained with EMA weights
(Lightning glue over :mod:`lightning_pfd.diffusion`)."""
from __future__ import annotations


import warnings
from dataclasses import replace
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch import nn

from ..diffusion.families import DiffusionFamily, build_family, family_names
from ..diffusion.sampling import CompileMode, SamplerName, SamplerSettings, check_compile
from ..errors import ConfigError
from ..validation import (ClosedUnitInterval, FiniteNonNegativeFloat, FinitePositiveFloat, NonNegativeInt,
                          PositiveFloat, PositiveInt, check_args)
from .base import EMAModule, OnDivergence, check_optimization, check_training_args

__all__ = ["DiffusionModule", "resolve_family"]

# The EMA copy is deliberately kept in eval mode; Lightning's generic warning about modules in
# eval mode at the start of training refers to it.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


def resolve_family(family: Union[str, DiffusionFamily], module_args: Dict[str, Any],
                   family_args: Optional[dict]) -> DiffusionFamily:
    """The family a DiffusionModule trains: ``family`` itself (an object), or the one registered
    under that name, built from the module's arguments (``build_family``)."""
    if isinstance(family, str):
        return build_family(family, module_args, family_args)
    if not isinstance(family, DiffusionFamily):
        raise ConfigError("family", "must be a family name or a DiffusionFamily",
                          value=family, accepted=list(family_names()))
    if family_args and dict(family_args) != _extra_args(family):  # (the recorded ones are fine)
        raise ConfigError("family_args", "only used with a family name; the family object "
                          f"already holds its parameters: {family!r}", value=family_args)
    return family


def _extra_args(family: DiffusionFamily) -> Dict[str, Any]:
    """A family's parameters that are not DiffusionModule arguments (its ``family_args``)."""
    fed = set(type(family).MODULE_ARGS.values())
    return {k: v for k, v in family.init_args().items() if k not in fed}


class DiffusionModule(EMAModule):
    """Train a denoiser D(x; sigma) of a diffusion family; keep EMA weights for evaluation.

    Args:
        net: the raw network ``net(c_in * x, c_noise)`` (e.g. ``UNet``, ``MLPNet``).
        family: the diffusion family by name: ``"edm"`` (Karras et al. 2022), ``"vp"`` (Song et
            al. 2021), ``"ve"`` (Song et al. 2021) -- the columns of the EDM paper's Table 1 -- or
            any family registered with ``lightning_pfd.diffusion.families.register_family``; or,
            from Python, a :class:`~lightning_pfd.diffusion.families.DiffusionFamily` object.
            ``hparams.family`` records the family's name.
        family_args: parameters of the family other than the module arguments below, e.g.
            ``{"sigma_min": 0.02, "sigma_max": 100}`` for "ve" (errors name
            ``family_args.<name>``).
        sigma_data, P_mean, P_std: EDM's data scale and training sigma distribution.
        vp_beta_d, vp_beta_min, vp_epsilon_t, vp_M: the VP schedule.
        lr, betas, weight_decay: the optimizer's learning rate, Adam betas and weight decay
            (passed to any ``optimizer`` that takes them); ``warmup_steps`` linear LR warm-up.
        optimizer: None (EDM's Adam, the default) or any ``torch.optim`` optimizer as
            ``{class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}``;
            ``lr_scheduler``: None (the warm-up, if any) or ``{class_path, init_args, interval,
            frequency, monitor}``, e.g. ``{class_path: CosineAnnealingLR, init_args: {T_max:
            500}}`` (:mod:`lightning_pfd.modules.optim`; saved in hparams and the checkpoint; a
            resume with another class is refused unless ``--allow-optimizer-change``).
        ema_decay: per-step EMA decay; ``ema_halflife_kimg`` (EDM's convention) overrides it.
        ema_rampup: ramp the EMA up at the start of training (``modules.ema.ema_beta``).
        num_steps, sigma_min, sigma_max, rho, sampler: the PF-ODE solver (a
            :class:`~lightning_pfd.diffusion.sampling.SamplerSettings`, ``sampler_settings``)
            used by ``generate`` and every evaluation callback: Heun-18 on EDM's grid by default,
            clamped to the family's supported sigma range (``family.default_grid`` gives the
            family's own grid, e.g. the geometric VE grid on [0.02, 100]).
        sample_autocast: run the network in bf16 autocast while sampling on CUDA.
        sample_compile: ``generate`` runs the denoiser through ``torch.compile`` for every
            PF-ODE evaluation: ``false`` (eager, the default), ``true`` (mode ``"default"``) or a
            mode, ``"reduce-overhead"`` (+ CUDA graphs on a GPU), ``"max-autotune"``,
            ``"max-autotune-no-cudagraphs"`` -- the module's counterpart of the monitors'
            ``compile``: fixed batch shapes, one graph for every epoch (docs/performance.md).
            Every monitor sampling through ``generate`` (MemorizationMonitor, TailMonitor, and
            GeneralizationMonitor unless its own ``compile`` is set) uses it.
        train_seed: training seed (None: ``seed_everything``'s, else 0); batch k's noise and dropout
            come from SplitMix64(seed, k, rank), so a resumed run is bit-identical.
        divergence_patience: consecutive bad steps (non-finite loss/gradients, or a finite loss
            above ``divergence_factor`` x its lowest running mean) that make a ``diverged`` event
            (0 = off); ``on_divergence``: ``"stop"`` or ``"continue"``.
        divergence_factor: the explosion a finite value may not reach: the step loss over its
            lowest running mean, the weights' norm over its start (checked every epoch end);
            0 = only non-finite values diverge (``lightning_pfd.modules.base``).

    The argument types declare what each accepts (:mod:`lightning_pfd.validation`); an error
    names the argument (the command line adds ``model.init_args.``). The trained (live)
    denoiser is ``live_denoiser``; its EMA copy, ``denoiser``, is what every evaluation uses.
    """

    ARCHITECTURE_KEYS = frozenset({"net", "family", "family_args", "sigma_data", "vp_beta_d",
                                   "vp_beta_min", "vp_M", "vp_epsilon_t"})
    TRAINED = "live_denoiser"

    def __init__(
        self,
        net: nn.Module,
        family: Union[str, DiffusionFamily] = "edm",
        sigma_data: PositiveFloat = 0.5,
        P_mean: float = -1.2,
        P_std: float = 1.2,
        vp_beta_d: float = 19.9,
        vp_beta_min: float = 0.1,
        vp_epsilon_t: float = 1e-5,
        vp_M: int = 1000,
        lr: FinitePositiveFloat = 1e-3,
        betas: Sequence[float] = (0.9, 0.999),
        weight_decay: FiniteNonNegativeFloat = 0.0,
        warmup_steps: NonNegativeInt = 0,
        ema_decay: ClosedUnitInterval = 0.999,
        ema_halflife_kimg: Optional[PositiveFloat] = None,
        ema_rampup: bool = True,
        num_steps: PositiveInt = 18,
        sigma_min: FinitePositiveFloat = 0.002,
        sigma_max: FinitePositiveFloat = 80.0,
        rho: FinitePositiveFloat = 7.0,
        sampler: SamplerName = "heun",
        sample_autocast: bool = False,
        sample_compile: Union[bool, CompileMode] = False,
        train_seed: Optional[NonNegativeInt] = None,
        divergence_patience: NonNegativeInt = 10,
        on_divergence: OnDivergence = "stop",
        family_args: Optional[Dict[str, Any]] = None,
        optimizer: Optional[Dict[str, Any]] = None,
        lr_scheduler: Optional[Dict[str, Any]] = None,
        divergence_factor: FiniteNonNegativeFloat = 1e4,
    ):
        check_args(DiffusionModule.__init__, locals())
        super().__init__()
        args = dict(sigma_data=sigma_data, P_mean=P_mean, P_std=P_std, vp_beta_d=vp_beta_d,
                    vp_beta_min=vp_beta_min, vp_epsilon_t=vp_epsilon_t, vp_M=vp_M)
        fam = resolve_family(family, args, family_args)
        settings = SamplerSettings(sampler=sampler, num_steps=num_steps, sigma_min=sigma_min,
                                   sigma_max=sigma_max, rho=rho)
        check_training_args(net, betas)
        opt_spec, sched_spec = check_optimization(optimizer, lr_scheduler, lr, betas, weight_decay, warmup_steps)
        check_compile(sample_compile, "sample_compile")
        # Under LightningCLI the net arrives as its class_path config, which is saved so
        # load_from_checkpoint(path) rebuilds it; a net built in Python is not picklable into
        # hparams safely: pass it again, load_from_checkpoint(path, net=...). A family object is
        # saved as its name and parameters.
        with warnings.catch_warnings():  # a net built in Python is dropped right below
            warnings.filterwarnings("ignore", message=r".*'net' is an instance of `nn.Module`")
            self.save_hyperparameters(ignore=["family"] if isinstance(family, DiffusionFamily) else [])
        if isinstance(self.hparams.get("net"), nn.Module):  # not the CLI's class_path config
            del self.hparams["net"]
        self._record_family(fam, family)
        self.hparams["optimizer"], self.hparams["lr_scheduler"] = opt_spec, sched_spec
        # loggers write hparams_initial (hparams.yaml): let it show the recorded family too
        self.save_hyperparameters(dict(self.hparams))
        self.net = net
        self.family = fam
        self.live_denoiser = fam.precondition(net)
        self.loss_fn = fam.loss()
        self.sampler_settings = settings
        self.sigmas = settings.sigmas(self.live_denoiser)
        self.sample_compile_backend: Union[str, Any] = "inductor"  # not saved: a debugging switch
        self._init_ema(train_seed, divergence_patience, on_divergence)

    def _record_family(self, fam: DiffusionFamily, given) -> None:
        """hparams.family = the family's name; a family object is recorded as the module
        arguments and ``family_args`` that rebuild it (so ``load_from_checkpoint`` does)."""
        self.hparams["family"] = fam.name
        if not isinstance(given, DiffusionFamily):
            return
        params = fam.init_args()
        for module_arg, field in type(fam).MODULE_ARGS.items():
            self.hparams[module_arg] = params[field]
        self.hparams["family_args"] = _extra_args(fam) or None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args, **kwargs):
        """Lightning's ``load_from_checkpoint`` (verified file, weights only); a checkpoint of a
        release that named the family ``precond`` is refused with the way to convert it."""
        try:
            return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)
        except TypeError as e:
            if "unexpected keyword argument 'precond'" in str(e):
                raise _legacy_checkpoint(checkpoint_path) from e
            raise

    def resume_changes(self, checkpoint: dict, source: str = "the checkpoint", name="model.{}".format,
                       allow_optimizer_change: Optional[bool] = None):
        if "precond" in (checkpoint.get("hyper_parameters") or {}):
            raise _legacy_checkpoint(source)
        return super().resume_changes(checkpoint, source, name, allow_optimizer_change)

    # -- public interface used by the callbacks (lightning_pfd.contracts.SigmaSpaceModel) ------
    @property
    def sigma_data(self) -> float:
        return float(self.hparams.sigma_data)

    @property
    def denoiser(self) -> nn.Module:
        """The EMA denoiser D(x; sigma) in eval mode: use it for every evaluation."""
        return self.ema.shadow

    def network_input(self, x: torch.Tensor, sigma):
        """(c_in x, c_noise): what the EMA denoiser's raw network sees at ``sigma``."""
        return self.denoiser.network_input(x, sigma)

    @property
    def sample_compile(self) -> Union[bool, str]:
        """``generate``'s torch.compile mode (False: eager), from ``hparams.sample_compile``."""
        return check_compile(self.hparams.get("sample_compile", False), "sample_compile")

    @property
    def sample_autocast(self) -> bool:
        """Whether ``generate`` runs the network in bf16 autocast on CUDA (``hparams.sample_autocast``)."""
        return bool(self.hparams.get("sample_autocast", False))

    @torch.no_grad()
    def generate(self, seeds, sigmas: Optional[torch.Tensor] = None, sampler: Optional[str] = None,
                 batch_size: int = 256, denoiser: Optional[nn.Module] = None,
                 num_steps: Optional[int] = None) -> torch.Tensor:
        """PF-ODE samples (float64, on this module's device), one per seed (PFD paper eq. 2; EDM Alg. 1).

        ``sigmas`` gives the grid; else ``num_steps`` rebuilds the module's Karras grid with that
        many steps; else the module's grid (Heun-18 by default). The grid is clamped to the
        denoiser's sigma range; bf16 autocast with ``sample_autocast`` on CUDA; compiled with
        ``sample_compile`` (backend ``sample_compile_backend``, ``"inductor"``; ``"aot_eager"`` to
        debug)."""
        den = self.denoiser if denoiser is None else denoiser
        settings = self.sampler_settings
        if sampler is not None:
            settings = replace(settings, sampler=sampler)
        if sigmas is not None:
            settings = replace(settings, grid=tuple(torch.as_tensor(sigmas, dtype=torch.float64).reshape(-1).tolist()))
        elif num_steps is not None:
            settings = replace(settings, num_steps=num_steps)
        use_amp = self.sample_autocast and self.device.type == "cuda"
        settings = replace(settings, precision="bf16" if use_amp else "fp32", compile=self.sample_compile,
                           compile_backend=self.sample_compile_backend)
        return settings.sample(den, seeds, self.data_shape, batch_size=batch_size,
                               device=self.device, out_device=self.device)


def _legacy_checkpoint(source) -> ConfigError:
    """The refusal of a checkpoint whose hyper-parameters name the family ``precond`` (and whose
    weights sit under ``precond.``): this release calls them ``family`` and ``live_denoiser.``."""
    return ConfigError(
        "ckpt_path", "was written by a release that named the diffusion family `precond`; "
        "this one reads `family` (and the trained denoiser's weights under `live_denoiser.`)",
        value=str(source),
        suggestion="convert it once: from lightning_pfd.checkpoint import load_checkpoint, "
                   "save_checkpoint; ckpt = load_checkpoint(path); hp = ckpt['hyper_parameters']; "
                   "hp['family'] = hp.pop('precond'); ckpt['state_dict'] = {k.replace('precond.', "
                   "'live_denoiser.', 1): v for k, v in ckpt['state_dict'].items()}; "
                   "save_checkpoint(ckpt, path)")
