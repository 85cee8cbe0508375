"""LevyItoModule: the Lévy–Itō model (Yoon et al. 2023) as a LightningModule (derivations in docs/levy.md).

Lightning glue over :mod:`lightning_pfd.diffusion.levy` (noise, schedule, loss, samplers).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch import nn

from ..diffusion.levy import (LEVY_SAMPLERS, LEVY_TIME_GRIDS, PARAMETERIZATIONS, CosineSchedule,
                              AScale, LevyLoss, LevySamplerName, LevyTimeGrid, Parameterization,
                              denoiser_dsm_loss, denoiser_to_score, fractional_dsm_loss, levy_sample,
                              sample_alpha_stable)
from ..diffusion.sampling import CompileMode, check_compile, compile_denoiser, pad_rows
from ..diffusion.streams import alpha_stable_stream, stream
from ..errors import ConfigError, check_choice
from ..validation import (ClosedUnitInterval, FiniteNonNegativeFloat, FinitePositiveFloat, NonNegativeInt,
                          PositiveFloat, PositiveInt, StabilityIndex, check_args)
from .base import EMAModule, OnDivergence, check_optimization, check_training_args, record_optimization

__all__ = ["LevyItoModule", "LevyScoreNet", "trimmed_mean"]

# seeded streams of the frozen-noise validation loss (registered in diffusion/streams.py)
_T_STREAM, _EPS_STREAM = stream("levy.loss_t"), alpha_stable_stream("levy.loss_eps")


def trimmed_mean(x: torch.Tensor, fraction: float = 0.1) -> torch.Tensor:
    """Mean after dropping the ``fraction`` smallest and largest values (robust loss summary)."""
    x = x.detach().reshape(-1).sort().values
    k = int(math.floor(fraction * x.numel()))
    return x[k: x.numel() - k].mean() if x.numel() - 2 * k > 0 else x.mean()


class LevyScoreNet(nn.Module):
    """The network of the Lévy–Itō model with its input scaling and output parameterization.

    Network input c_in x_t with c_in = 1/sqrt(gamma(t)^2 sigma_data^2 + sigma(t)^2) (a nominal
    input scale; alpha-stable noise has no variance), c_noise = (M - 1) t (as EDM Table 1, VP).

    * ``parameterization="eps"`` (LIM): ``forward`` returns s_theta = net(c_in x_t, c_noise),
      regressing -eps/alpha; the fractional score is S_theta = sigma(t)^(1-alpha) s_theta.
    * ``parameterization="x0"``: ``forward`` returns the denoiser D(x_t, t) = c_skip y +
      c_out net(c_in x_t, c_noise) (float64) with y = x_t/gamma, r = sigma/gamma and EDM's
      coefficients in r: c_skip = sigma_data^2/(r^2 + sigma_data^2), c_out = r sigma_data /
      sqrt(r^2 + sigma_data^2) (so c_in x_t = y/sqrt(r^2 + sigma_data^2), the same input). It
      regresses x_0; the score is S = -(x_t - gamma D)/(alpha sigma^alpha). A network error
      delta gives a clean-image error c_out delta <= sigma_data delta at every t, where an error
      delta in s_theta gives alpha r delta (r(T) = 119 for the cosine schedule, docs/levy.md).
    * ``parameterization="x0_A"``: ``forward(x_t, t, A)`` returns the denoiser with EDM's
      coefficients at the per-example level L = r sqrt(A) (A: the factor of the example's
      isotropic noise) and c_noise = ln(L)/4; given A, y = x_0 + L G is a Gaussian corruption
      (``_forward_scaled``; docs/levy.md, "Noise-scale-aware preconditioning").
    """

    def __init__(self, net: nn.Module, schedule: CosineSchedule, sigma_data: float = 0.5,
                 M: int = 1000, parameterization: str = "eps"):
        super().__init__()
        check_choice("parameterization", parameterization, PARAMETERIZATIONS)
        self.net, self.schedule = net, schedule
        self.sigma_data, self.M = float(sigma_data), int(M)
        self.parameterization = parameterization

    def _coef(self, t, x):
        """(t (B,), gamma, sigma) as float64 tensors shaped to broadcast against x."""
        t = torch.as_tensor(t, dtype=torch.float64, device=x.device)
        if t.ndim == 0:
            t = t.expand(x.shape[0])
        shape = (-1,) + (1,) * (x.ndim - 1)
        return t, self.schedule.gamma(t).reshape(shape), self.schedule.sigma(t).reshape(shape)

    def c_out(self, t) -> torch.Tensor:
        """c_out(t) of the x0 parameterization: r sigma_data / sqrt(r^2 + sigma_data^2)."""
        r = self.schedule.nsr(t)
        return r * self.sigma_data / (r.square() + self.sigma_data**2).sqrt()

    def forward(self, x: torch.Tensor, t, A=None) -> torch.Tensor:
        t, g, s = self._coef(t, x)
        if self.parameterization == "x0_A":
            return self._forward_scaled(x, g, s, A)
        c_in = (g.square() * self.sigma_data**2 + s.square()).rsqrt()
        c_noise = ((self.M - 1) * t).to(torch.float32)
        F = self.net((c_in * x.to(torch.float64)).to(torch.float32), c_noise)
        if self.parameterization == "eps":
            return F.to(torch.float32)
        r = s / g
        sd2 = self.sigma_data**2
        c_skip = sd2 / (r.square() + sd2)
        c_out = r * self.sigma_data / (r.square() + sd2).sqrt()
        return c_skip * (x.to(torch.float64) / g) + c_out * F.to(torch.float64)

    def level(self, t, A, x: torch.Tensor) -> torch.Tensor:
        """The Gaussian noise level of y = x/gamma given the factor A: r(t) sqrt(A), float64,
        shaped to broadcast against x (``x0_A``)."""
        _, g, s = self._coef(t, x)
        return (s / g) * self._A(A, x).sqrt()

    @staticmethod
    def _A(A, x: torch.Tensor) -> torch.Tensor:
        if A is None:
            raise ValueError("A: the x0_A parameterization needs the per-example factor A of the "
                             "noise (sample_alpha_stable(..., return_factor=True))")
        A = torch.as_tensor(A, dtype=torch.float64, device=x.device).reshape(-1)
        if A.numel() != x.shape[0]:
            raise ValueError(f"A: need one factor per example ({x.shape[0]}), got {A.numel()}")
        return A.reshape((-1,) + (1,) * (x.ndim - 1))

    def _forward_scaled(self, x, g, s, A) -> torch.Tensor:
        """``x0_A``: EDM's preconditioning at the per-example level L = r sqrt(A) of y = x/gamma
        (given A, y = x_0 + L G is a Gaussian corruption at level L; docs/levy.md): c_in =
        1/sqrt(L^2 + sigma_data^2), c_skip = sigma_data^2/(L^2 + sigma_data^2), c_out =
        L sigma_data/sqrt(L^2 + sigma_data^2), c_noise = ln(L)/4 (EDM Table 1)."""
        L = (s / g) * self._A(A, x).sqrt()
        sd2 = self.sigma_data**2
        y = x.to(torch.float64) / g
        c_in = (L.square() + sd2).rsqrt()
        c_noise = (L.reshape(-1).log() / 4).to(torch.float32)
        F = self.net((c_in * y).to(torch.float32), c_noise)
        return sd2 / (L.square() + sd2) * y + L * self.sigma_data * c_in * F.to(torch.float64)

    def fractional_score(self, x: torch.Tensor, t, A=None) -> torch.Tensor:
        """S_theta(x, t), float64 (eps: sigma^(1-alpha) s_theta; x0, x0_A: -(x - gamma D)/(alpha
        sigma^alpha); x0_A needs the per-example factor ``A``)."""
        _, g, s = self._coef(t, x)
        out = self(x, t, A).to(torch.float64)
        if self.parameterization == "eps":
            return s.pow(1 - self.schedule.alpha) * out
        return denoiser_to_score(out, x, g, s, self.schedule.alpha)

    def denoised(self, x: torch.Tensor, t, A=None) -> torch.Tensor:
        """The implied clean sample D(x, t) = (x - sigma eps_hat)/gamma, float64."""
        _, g, s = self._coef(t, x)
        out = self(x, t, A).to(torch.float64)
        if self.parameterization != "eps":
            return out
        return (x.to(torch.float64) + s * self.schedule.alpha * out) / g


def _check_truncations(alpha, reject_A, clamp_A, generate_reject_A, generate_clamp_A) -> None:
    """ConfigError for a bad truncation of A (``check_truncation``) in training or generation."""
    from ..diffusion.levy import check_truncation

    if isinstance(generate_reject_A, str) and generate_reject_A != "train":
        raise ConfigError("generate_reject_A", "must be a number > 0, \"train\" "
                          "(= reject_A) or null (off)", value=generate_reject_A)
    g_reject = reject_A if generate_reject_A == "train" else generate_reject_A
    for phase, (rA, cA) in (("", (reject_A, clamp_A)), ("generate_", (g_reject, generate_clamp_A))):
        try:
            check_truncation(float(alpha), cA, rA, prefix=phase)
        except ValueError as e:
            field, _, problem = str(e).partition(": ")
            hint = (" (reject_A defaults to 20, the reference's rejection: set reject_A: null to "
                    "clamp instead)") if cA is not None and rA is not None else ""
            raise ConfigError(field, problem + hint) from None


class LevyItoModule(EMAModule):
    """Train a Lévy–Itō model with fractional denoising score matching; keep EMA weights.

    Args:
        net: raw network ``net(x_in, c_noise)`` with ``data_shape`` (UNet, MLPNet, ...).
        alpha: stability index in (1, 2]; alpha = 2 is the Gaussian VP model with N(0, 2) noise.
        loss: "squared" (LIM), "huber" (smooth L1, ``huber_delta``) or "l2" (non-squared, DLPM).
        reject_A: rejection threshold of the heavy-tailed factor A = c_alpha A' of the training
            noise: A >= reject_A is redrawn, so A has the law of A given A < reject_A (default 20,
            the threshold of the Lévy–Itō model's reference code, ``reject_threshold=20``, which
            applies it to its kappa-scaled A: the reference's law is this with ``a_scale=
            "lim_reference"``; None = exact alpha-stable noise). A hyperparameter: at alpha = 1.7,
            P(A >= 20) = 2.53 % (standard scale), 1.27 % ("lim_reference");
            DLPM's copy bounds A' at 20, i.e. A at 20 c_alpha = 7.22 (docs/levy.md, "Truncating A").
        clamp_A: the clamping variant, A <- min(A, clamp_A) (a point mass at the threshold; not
            what the reference codes do). At most one of ``clamp_A`` and ``reject_A``.
        a_scale: scale of the factor A of every noise draw (training, prior, SDE): "standard"
            (default: A = c_alpha A', noise of stable scale 1) or "lim_reference": A scaled by
            kappa(alpha) = ((1 + tan(pi alpha/4)) cos^2(pi alpha/4))^(1/alpha) (0.474 at alpha =
            1.7), the law the LIM reference code's sampler draws; ``reject_A`` / ``clamp_A``
            then act on that scaled A, so ``reject_A=20`` with "lim_reference" is the reference's
            rejection (A_standard >= 42.2 at alpha = 1.7; docs/levy.md).
        clamp_eps: clamp of |eps| per coordinate (None = off; refused with ``x0_A``, whose
            preconditioning needs eps = sqrt(A) G exactly Gaussian given A).
        isotropic: sub-Gaussian isotropic noise (one A per example) or per-coordinate A.
        gradient_clip_val: global grad-norm clip applied in ``on_before_optimizer_step``
            (None/0 = off; Lightning's ``trainer.gradient_clip_val`` works as well).
        schedule_s, T, t_min: the cosine schedule (docs/levy.md).
        sigma_data, M: input scaling and noise conditioning of the network (``LevyScoreNet``).
        lr, betas, weight_decay, warmup_steps: the optimizer's settings and linear LR warm-up.
        optimizer, lr_scheduler: None (Adam, the default) or any ``torch.optim`` optimizer /
            LR scheduler as ``{class_path, init_args}`` (as ``DiffusionModule``'s;
            :mod:`lightning_pfd.modules.optim`).
        ema_decay / ema_halflife_kimg: EMA of the weights (the half-life overrides the decay).
        parameterization: "eps" (the network regresses -eps/alpha, LIM), "x0" (an
            EDM-preconditioned denoiser in r = sigma/gamma; the score is derived from it, see
            ``LevyScoreNet`` and docs/levy.md) or "x0_A" (noise-scale-aware: EDM's
            preconditioning at the per-example level r sqrt(A), A known in training and, drawn
            with the prior, at every step of the ODE samplers; isotropic noise, ode/ddim/heun,
            no sample_compile).
        num_steps, sampler, sde_drift_factor, time_grid, rho: defaults of ``generate``
            (sampler "ode" (first order in t) / "ddim" / "heun" / "sde"; time grid "uniform" in t or
            "edm" = EDM's rho-grid in r = sigma/gamma).
        trim_fraction: fraction cut on each side for the logged trimmed-mean loss.
        generate_reject_A: rejection threshold of A in the prior x_T and the SDE noise of
            ``generate``: ``"train"`` (default) = ``reject_A``, so training, prior and SDE noise
            share one truncation as in the reference code; a number; or None (exact law).
        generate_clamp_A: the clamping variant for ``generate`` (None = off; at most one of
            ``generate_clamp_A`` and a resolved ``generate_reject_A``).
        train_seed, divergence_patience, on_divergence, divergence_factor: seeded per-batch
            randomness and divergence events (see ``lightning_pfd.modules.base.ResumableModule``).
        sample_compile: ``generate`` runs the score network through ``torch.compile`` for every
            step: ``false`` (eager, the default), ``true`` (mode ``"default"``) or a mode
            (``"reduce-overhead"``: + CUDA graphs on a GPU, ``"max-autotune"``,
            ``"max-autotune-no-cudagraphs"``), as ``DiffusionModule.sample_compile``: a ragged last
            batch is padded to the batch's rows, t enters as a tensor, one graph for every epoch.
    """

    ARCHITECTURE_KEYS = frozenset({"net", "alpha", "isotropic", "schedule_s", "T", "t_min",
                                   "sigma_data", "M", "parameterization"})
    TRAINED = "score_net"

    def __init__(self, net: nn.Module, alpha: StabilityIndex = 1.7, loss: LevyLoss = "squared",
                 huber_delta: PositiveFloat = 1.0, reject_A: Optional[float] = 20.0,
                 clamp_A: Optional[float] = None,
                 clamp_eps: Optional[PositiveFloat] = None, isotropic: bool = True,
                 gradient_clip_val: Optional[FiniteNonNegativeFloat] = 1.0, schedule_s: PositiveFloat = 0.008,
                 T: float = 0.9946, t_min: float = 1e-5, sigma_data: PositiveFloat = 0.5, M: int = 1000,
                 lr: FinitePositiveFloat = 2e-4, betas: Sequence[float] = (0.9, 0.999),
                 weight_decay: FiniteNonNegativeFloat = 0.0, warmup_steps: NonNegativeInt = 0,
                 ema_decay: ClosedUnitInterval = 0.999,
                 ema_halflife_kimg: Optional[PositiveFloat] = None, ema_rampup: bool = True,
                 num_steps: PositiveInt = 100,
                 sampler: LevySamplerName = "ode", sde_drift_factor: float = 2.0, trim_fraction: float = 0.1,
                 generate_reject_A: Union[float, str, None] = "train",
                 generate_clamp_A: Optional[float] = None, train_seed: Optional[NonNegativeInt] = None,
                 divergence_patience: NonNegativeInt = 10, on_divergence: OnDivergence = "stop",
                 parameterization: Parameterization = "eps", time_grid: LevyTimeGrid = "uniform",
                 rho: PositiveFloat = 7.0,
                 sample_compile: Union[bool, CompileMode] = False, a_scale: AScale = "standard",
                 optimizer: Optional[Dict[str, Any]] = None, lr_scheduler: Optional[Dict[str, Any]] = None,
                 divergence_factor: FiniteNonNegativeFloat = 1e4):
        check_args(LevyItoModule.__init__, locals())
        super().__init__()
        check_compile(sample_compile, "sample_compile")
        _check_truncations(alpha, reject_A, clamp_A, generate_reject_A, generate_clamp_A)
        if parameterization == "x0_A":
            for bad, field, why in ((not isotropic, "isotropic", "needs one factor A per example"),
                                    (sampler == "sde", "sampler", "the reverse SDE draws fresh "
                                     "noise with other factors A; use ode, ddim or heun"),
                                    (bool(sample_compile), "sample_compile", "is not supported"),
                                    (clamp_eps is not None, "clamp_eps",
                                     "needs eps = sqrt(A) G Gaussian given A (its preconditioning "
                                     "is EDM's at the level r sqrt(A)); clamping eps breaks that: "
                                     "set clamp_eps: null")):
                if bad:
                    raise ConfigError(field, f"parameterization x0_A {why}")
        check_training_args(net, betas)
        opt_spec, sched_spec = check_optimization(optimizer, lr_scheduler, lr, betas, weight_decay, warmup_steps)
        if not 0.0 <= trim_fraction < 0.5:
            raise ConfigError("trim_fraction", "must lie in [0, 0.5)", value=trim_fraction)
        self.schedule = CosineSchedule(alpha, schedule_s, T, t_min)  # validates s, T, t_min
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
            self.save_hyperparameters()
        record_optimization(self, opt_spec, sched_spec)
        self.net = net
        self.score_net = LevyScoreNet(net, self.schedule, sigma_data, M, parameterization)
        self.sample_compile_backend: Union[str, Any] = "inductor"  # not saved: a debugging switch
        self._init_ema(train_seed, divergence_patience, on_divergence)

    # -- public interface ----------------------------------------------------------------------
    def truncation(self, phase: str = "train") -> dict:
        """The truncation of A for ``phase`` "train" (training and validation noise) or
        "generate" (prior and SDE noise), as ``sample_alpha_stable`` keyword arguments
        ``{"clamp_A": ..., "reject_A": ...}``."""
        check_choice("phase", phase, ("train", "generate"))
        hp = self.hparams
        rA, cA = hp.get("reject_A"), hp.get("clamp_A")
        if phase == "train":
            return {"clamp_A": cA, "reject_A": rA}
        g = hp.get("generate_reject_A")
        return {"clamp_A": hp.get("generate_clamp_A"), "reject_A": rA if g == "train" else g}

    @property
    def a_scale(self) -> str:
        """The scale convention of the factor A ("standard" or "lim_reference")."""
        return self.hparams.get("a_scale", "standard")

    @property
    def alpha(self) -> float:
        return self.schedule.alpha

    @property
    def sample_compile(self) -> Union[bool, str]:
        """``generate``'s torch.compile mode (False: eager), from ``hparams.sample_compile``."""
        return check_compile(self.hparams.get("sample_compile", False), "sample_compile")

    @property
    def score_model(self) -> LevyScoreNet:
        """The EMA score network (eval mode): use it for every evaluation."""
        return self.ema.shadow

    def draw(self, y: torch.Tensor, seeds=None, return_factor: bool = False):
        """(t (B,) float64, eps like y float64): training noise, or frozen per-sample with seeds;
        with ``return_factor`` also the sub-Gaussian factor A ((B, 1) when isotropic)."""
        hp = self.hparams
        if seeds is None:
            t = self.schedule.sample_t(y.shape[0], device=y.device)
            eps, A = sample_alpha_stable(self.alpha, y.shape, hp.isotropic, device=y.device,
                                         return_factor=True, a_scale=self.a_scale,
                                         **self.truncation("train"))
        else:
            t = self.schedule.sample_t(len(seeds), device=y.device, seeds=seeds, stream=_T_STREAM)
            eps, A = sample_alpha_stable(self.alpha, y.shape[1:], hp.isotropic, device=y.device,
                                         seeds=seeds, stream=_EPS_STREAM, return_factor=True,
                                         a_scale=self.a_scale, **self.truncation("train"))
        if hp.clamp_eps is not None:
            eps = eps.clamp(-hp.clamp_eps, hp.clamp_eps)
        return (t, eps, A) if return_factor else (t, eps)

    @property
    def parameterization(self) -> str:
        return self.hparams.get("parameterization", "eps")

    def loss_fn(self, model: LevyScoreNet, y: torch.Tensor, seeds=None) -> torch.Tensor:
        """Per-sample loss (B,), x_t = gamma y + sigma eps. "eps": fractional DSM, target
        -eps/alpha; "x0": ``denoiser_dsm_loss`` of D = model(x_t, t) against y (the same
        regression weighted by alpha^2 (1 + r^2/sigma_data^2), docs/levy.md)."""
        t, eps, A = self.draw(y, seeds, return_factor=True)
        shape = (-1,) + (1,) * (y.ndim - 1)
        x_t = self.schedule.gamma(t).reshape(shape) * y.to(torch.float64) \
            + self.schedule.sigma(t).reshape(shape) * eps
        if self.parameterization == "x0_A":  # EDM's loss at the level L = r sqrt(A)
            L = model.level(t, A, x_t).reshape(-1)
            sd = float(self.hparams.sigma_data)
            c_out = L * sd / (L.square() + sd**2).sqrt()
            return denoiser_dsm_loss(model(x_t, t, A), y, c_out, self.hparams.loss,
                                     self.hparams.huber_delta)
        if self.parameterization == "x0":
            r = self.schedule.nsr(t)
            sd = float(self.hparams.sigma_data)
            c_out = r * sd / (r.square() + sd**2).sqrt()
            D = model(x_t, t)
            return denoiser_dsm_loss(D, y, c_out, self.hparams.loss, self.hparams.huber_delta)
        s = model(x_t.to(torch.float32), t)
        return fractional_dsm_loss(s, eps.to(torch.float32), self.alpha, self.hparams.loss,
                                   self.hparams.huber_delta)

    @torch.no_grad()
    def generate(self, seeds, num_steps: Optional[int] = None, sampler: Optional[str] = None,
                 batch_size: int = 256, model: Optional[nn.Module] = None,
                 sigmas=None, time_grid: Optional[str] = None,
                 rho: Optional[float] = None) -> torch.Tensor:
        """Samples (float64, on this module's device), one per seed, reproducible per seed.

        x_T = sigma(T) eps with eps from ``sample_alpha_stable(seeds=...)`` (registered stream "levy.sampler", index 0), SDE
        noise of step i from index 1 + i. ``sigmas`` is accepted for interface compatibility
        with ``DiffusionModule.generate`` and must be None. ``sampler``, ``num_steps``,
        ``time_grid``, ``rho``: None = the module's defaults. With ``sample_compile`` the score
        runs compiled (backend ``sample_compile_backend``) on batches of min(batch_size,
        len(seeds)) rows.
        """
        if sigmas is not None:
            raise ValueError("sigmas: LevyItoModule integrates in t; use num_steps instead")
        sampler = sampler or self.hparams.sampler
        check_choice("sampler", sampler, LEVY_SAMPLERS)
        time_grid = time_grid or self.hparams.get("time_grid", "uniform")
        check_choice("time_grid", time_grid, LEVY_TIME_GRIDS)
        rho = self.hparams.get("rho", 7.0) if rho is None else rho
        check_args(LevyItoModule.__init__, {"rho": rho})
        rho = float(rho)
        num_steps = int(num_steps or self.hparams.num_steps)
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        model = self.score_model if model is None else model
        seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
        iso, a, trunc = self.hparams.isotropic, self.alpha, self.truncation("generate")
        trunc = {**trunc, "a_scale": self.a_scale}
        score = model.fractional_score
        if self.sample_compile and len(seeds):  # fixed shapes: one graph for every batch and epoch
            score = pad_rows(compile_denoiser(score, self.sample_compile, self.sample_compile_backend, self.device),
                             min(int(batch_size), len(seeds)))
        scaled = self.parameterization == "x0_A"
        if scaled and sampler == "sde":
            raise ValueError("sampler: parameterization x0_A samples with ode, ddim or heun (the "
                             "reverse SDE draws fresh noise with other factors A)")
        out = []
        for chunk in seeds.split(int(batch_size)):
            eps_T, A_T = sample_alpha_stable(
                a, self.data_shape, iso, device=self.device, seeds=chunk,
                stream=alpha_stable_stream("levy.sampler", 0), return_factor=True, **trunc)
            x_T = self.schedule.sigma(self.schedule.T) * eps_T
            if scaled:  # the ODE given A: EDM's flow at the level r sqrt(A) (docs/levy.md)
                score = (lambda x, t, A=A_T: model.fractional_score(x, t, A))
            noise_fn = (lambda i, c=chunk: sample_alpha_stable(
                a, self.data_shape, iso, device=self.device, seeds=c, stream=alpha_stable_stream("levy.sampler", 1 + i),
                **trunc))
            out.append(levy_sample(score, x_T, self.schedule, num_steps, sampler,
                                   noise_fn, drift_factor=self.hparams.sde_drift_factor,
                                   time_grid=time_grid, rho=rho))
        if not out:
            return torch.zeros(0, *self.data_shape, dtype=torch.float64, device=self.device)
        return torch.cat(out)

    # -- training (the steps, gradient guard, EMA and optimizer: EMAModule) ---------------------
    def _train_metrics(self, loss, per_sample):
        """``train/loss`` (the optimized mean) with its median and trimmed mean: the squared loss
        has infinite-variance targets for alpha < 2, the robust summaries show the trend."""
        return {"train/loss": loss, "train/loss_median": per_sample.median(),
                "train/loss_trimmed": trimmed_mean(per_sample, self.hparams.trim_fraction)}

    def _accumulate_val_extra(self, per_sample, keep) -> None:
        """``val/loss_median``: the mean over validation batches of the batch medians."""
        self._accumulate_val("val/loss_median", per_sample.median().expand(1), keep.any().expand(1))
