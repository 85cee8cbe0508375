"""Diffusion families as objects: preconditioning, training loss, sigma range and default grid.

Every model in the project is a denoiser D(x; sigma) in sigma-space, x = y + sigma n (PFD paper
eq. 1). What distinguishes EDM, VP and VE is only the columns of Table 1 of Karras et al. (2022),
"Elucidating the Design Space of Diffusion-Based Generative Models" (the EDM paper):

* the preconditioning D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma))
  (EDM eq. 7), built by :meth:`DiffusionFamily.precondition`;
* the training loss E_{sigma, y, n} lambda(sigma) ||D(y + sigma n; sigma) - y||^2 (EDM eq. 2 and 8)
  with its sigma distribution and weight lambda, built by :meth:`DiffusionFamily.loss`;
* the sigma range the denoiser supports, :attr:`DiffusionFamily.sigma_range` (sampling grids
  are clamped to it), and the family's own sampling grid (Table 1, "time steps"),
  :meth:`DiffusionFamily.default_grid`.

A :class:`DiffusionFamily` holds exactly these; :class:`PreconditionedDenoiser` and
:class:`DenoisingLoss` are the one generic denoiser and loss every family shares. Adding a
family is one class in one file: subclass :class:`DiffusionFamily` (a frozen dataclass whose
fields are its parameters), implement ``coefficients``, ``sample_sigma``, ``weight`` and
``default_grid``, and decorate it with :func:`register_family`; ``DiffusionModule(family=name)``
and the YAML key ``family: name`` of the module then find it (see ``docs/extending.md``). A
family's fields declare what they accept with the types of :mod:`lightning_pfd.validation`.

Shipped families: :class:`EDMFamily` ("edm"), :class:`VPFamily` ("vp", Song et al. 2021 as in
the EDM paper's VP column) and :class:`VEFamily` ("ve", the VE column). Pure torch.
"""
from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from typing import ClassVar, Dict, Mapping, Optional, Tuple, Type

import torch
from torch import nn

from ..contracts import legacy_sigma_range
from ..errors import ConfigError
from ..validation import NonNegativeFloat, OpenUnitInterval, PositiveFloat, PositiveInt, check_args
from .noise import seeded_noise, seeded_uniform
from .sampling import SamplerSettings, karras_sigmas
from .streams import stream

__all__ = ["DiffusionFamily", "EDMFamily", "VPFamily", "VEFamily", "PreconditionedDenoiser",
           "DenoisingLoss", "register_family", "get_family", "family_names", "build_family",
           "as_sigma"]

# seeded streams of the frozen-noise losses l_train / l_test (PFD paper App. C.6)
_NOISE_STREAM, _SIGMA_STREAM = stream("loss.noise"), stream("loss.sigma")


def as_sigma(sigma, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Broadcast a scalar / (B,) sigma to shape (B, 1, ..., 1) matching x."""
    s = torch.as_tensor(sigma, dtype=dtype, device=x.device)
    if s.ndim == 0:
        s = s.expand(x.shape[0])
    return s.reshape(-1, *([1] * (x.ndim - 1)))


# ------------------------------------------------------------------------------ the base
class DiffusionFamily(ABC):
    """One column of the EDM paper's Table 1: preconditioning, loss, sigma range, sampling grid.

    Subclasses are frozen dataclasses (their fields are the family's parameters, e.g.
    ``sigma_data``) with a class attribute ``name`` (the registry key) and, optionally,
    ``MODULE_ARGS``: which ``DiffusionModule`` init arguments feed which field (``{"vp_beta_d":
    "beta_d"}``); every other field is set through the module's ``family_args``.
    """

    name: ClassVar[str] = ""
    MODULE_ARGS: ClassVar[Mapping[str, str]] = {}

    # -- the four columns a family defines ------------------------------------------------
    @abstractmethod
    def coefficients(self, sigma: torch.Tensor):
        """(c_skip, c_out, c_in, c_noise) at ``sigma`` (EDM eq. 7, Table 1), each like sigma."""

    @abstractmethod
    def sample_sigma(self, n: int, device, seeds=None) -> torch.Tensor:
        """n training noise levels (float32): from the global torch RNG, or -- given ``seeds`` --
        one per seed from the seeded stream ``loss.sigma`` (frozen-noise losses). Use
        :meth:`_standard_normal` / :meth:`_uniform` for the random numbers."""

    @abstractmethod
    def weight(self, sigma: torch.Tensor) -> torch.Tensor:
        """The loss weight lambda(sigma) (EDM eq. 8)."""

    @abstractmethod
    def default_grid(self, num_steps: int = 18) -> torch.Tensor:
        """The family's own sampling grid (Table 1, "time steps"): float64, length num_steps + 1,
        decreasing, the last entry 0."""

    # -- what every family derives from them -------------------------------------------------
    @property
    def sigma_range(self) -> Tuple[float, float]:
        """(lo, hi): the noise levels the family's denoiser supports; every sampling grid is
        clamped to it. Unbounded, (0, inf), unless a family overrides this property. (A family
        written for an earlier release that gives the range as ``sigma_min`` / ``sigma_max`` is
        still read by those names, with a FutureWarning.)"""
        return legacy_sigma_range(self) or (0.0, math.inf)

    def precondition(self, net: nn.Module) -> "PreconditionedDenoiser":
        """D(x; sigma) = c_skip x + c_out net(c_in x, c_noise) around a raw network."""
        return PreconditionedDenoiser(net, self)

    def loss(self) -> "DenoisingLoss":
        """The family's per-sample denoising loss (its sigma distribution and weight)."""
        return DenoisingLoss(self)

    def sampler_settings(self, num_steps: int = 18, sampler: str = "heun") -> SamplerSettings:
        """A :class:`SamplerSettings` on :meth:`default_grid` (an explicit grid)."""
        return SamplerSettings(sampler=sampler, grid=tuple(self.default_grid(num_steps).tolist()))

    def init_args(self) -> Dict[str, object]:
        """The family's parameters (its dataclass fields) as a plain dict."""
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}

    # -- random numbers of sample_sigma --------------------------------------------------
    @staticmethod
    def _standard_normal(n: int, device, seeds=None) -> torch.Tensor:
        """N(0, 1): float32 from the global RNG, or float64 per seed (stream ``loss.sigma``)."""
        if seeds is None:
            return torch.randn(n, device=device)
        return seeded_noise(seeds, (1,), device=device, stream=_SIGMA_STREAM)[:, 0]

    @staticmethod
    def _uniform(n: int, device, seeds=None) -> torch.Tensor:
        """U(0, 1) in float64: from the global RNG, or per seed (stream ``loss.sigma``)."""
        if seeds is None:
            return torch.rand(n, device=device, dtype=torch.float64)
        return seeded_uniform(seeds, 1, device=device, stream=_SIGMA_STREAM)[:, 0]


# ------------------------------------------------------------------------------ generic parts
class PreconditionedDenoiser(nn.Module):
    """D(x; sigma) = c_skip x + c_out F(c_in x; c_noise) with the coefficients of ``family``.

    The wrapped network has the signature ``net(x_in, c_noise) -> F`` with F shaped like x_in.
    The skip combination is done in float32 even when F runs in lower precision (autocast).
    ``net`` is the only submodule, so the state-dict keys are ``net.*`` whatever the family.
    """

    def __init__(self, net: nn.Module, family: DiffusionFamily):
        super().__init__()
        self.net = net
        self.family = family

    @property
    def sigma_range(self) -> Tuple[float, float]:
        """(lo, hi): the noise levels the family supports (every sampling grid is clamped to it)."""
        lo, hi = self.family.sigma_range
        return float(lo), float(hi)

    def coefficients(self, sigma: torch.Tensor):
        return self.family.coefficients(sigma)

    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        x = x.to(torch.float32)
        sigma = as_sigma(sigma, x)
        c_skip, c_out, c_in, c_noise = self.family.coefficients(sigma)
        F_x = self.net(c_in * x, c_noise.flatten())
        return c_skip * x + c_out * F_x.to(torch.float32)

    def network_input(self, x: torch.Tensor, sigma):
        """(c_in x, c_noise): what the raw network sees (used for feature taps)."""
        x = x.to(torch.float32)
        sigma = as_sigma(sigma, x)
        _, _, c_in, c_noise = self.family.coefficients(sigma)
        return c_in * x, c_noise.flatten()


class DenoisingLoss:
    """Per-sample loss lambda(sigma) ||D(y + sigma n; sigma) - y||^2 summed over data dimensions,
    shape (B,) (EDM eq. 2 and 8), with sigma ~ the family's training distribution.

    Noise n and sigma come from the global torch RNG (training) or, given ``seeds``, from
    per-sample seeded streams, so a sample gets the same (n, sigma) every epoch: the
    frozen-noise losses l_train and l_test of the PFD paper (App. C.6).
    """

    def __init__(self, family: DiffusionFamily):
        self.family = family

    def draw(self, y: torch.Tensor, seeds=None):
        """(sigma (B,), n like y), both float32: sigma first, then n."""
        sigma = self.family.sample_sigma(y.shape[0], y.device, seeds)
        if seeds is None:
            n = torch.randn_like(y, dtype=torch.float32)
        else:
            n = seeded_noise(seeds, y.shape[1:], device=y.device, stream=_NOISE_STREAM)
        return sigma, n.to(torch.float32)

    def weight(self, sigma: torch.Tensor) -> torch.Tensor:
        return self.family.weight(sigma)

    def __call__(self, denoiser, y: torch.Tensor, seeds=None) -> torch.Tensor:
        sigma, n = self.draw(y, seeds)
        s = sigma.reshape(-1, *([1] * (y.ndim - 1)))
        D = denoiser(y + s * n, sigma)
        return self.weight(sigma) * (D.to(torch.float32) - y.to(torch.float32)).square().flatten(1).sum(1)


# ------------------------------------------------------------------------------ registry
_FAMILIES: Dict[str, Type[DiffusionFamily]] = {}


def register_family(cls: Type[DiffusionFamily]) -> Type[DiffusionFamily]:
    """Class decorator: make ``cls`` available under ``cls.name`` (``family: <name>``).

    Registering the same class again is a no-op; another class under a taken name is refused."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__}: a diffusion family needs a non-empty class attribute `name`")
    old = _FAMILIES.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"diffusion family {name!r} is already registered by {old.__module__}."
                         f"{old.__qualname__}")
    _FAMILIES[name] = cls
    return cls


def family_names() -> Tuple[str, ...]:
    """Registered family names, sorted."""
    return tuple(sorted(_FAMILIES))


def get_family(name: str, field: str = "family") -> Type[DiffusionFamily]:
    """The family class registered under ``name`` (ConfigError naming ``field`` otherwise)."""
    if name not in _FAMILIES:
        raise ConfigError(field, "unknown diffusion family", value=name, accepted=list(family_names()))
    return _FAMILIES[name]


def build_family(name: str, module_args: Optional[Mapping[str, object]] = None,
                 family_args: Optional[Mapping[str, object]] = None) -> DiffusionFamily:
    """Instantiate family ``name`` from ``DiffusionModule`` init arguments.

    ``module_args`` are the module's arguments; those named in the family's ``MODULE_ARGS`` are
    passed on (renamed), the others ignored. ``family_args`` sets any other field of the
    family. Errors name the argument the user gave (``family``, a module argument such as
    ``vp_beta_d``, or ``family_args.<field>``)."""
    cls = get_family(name, "family")
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    to_module = {v: k for k, v in cls.MODULE_ARGS.items()}
    kwargs = {f: (module_args or {})[m] for m, f in cls.MODULE_ARGS.items() if m in (module_args or {})}
    extra = dict(family_args or {})
    for key in extra:
        if key in to_module:
            raise ConfigError("family_args." + key, f"is set by the module argument "
                              f"{to_module[key]} for the {name!r} family", value=extra[key],
                              suggestion=f"set {to_module[key]} instead")
        if key not in fields:
            raise ConfigError("family_args", f"the {name!r} family has no parameter {key!r}",
                              value=key, accepted=sorted(fields - set(to_module)))
    kwargs.update(extra)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        where = to_module.get(e.field, "family_args." + e.field if e.field in extra else e.field)
        raise ConfigError(where, e.problem, value=e.value, accepted=e.accepted,
                          suggestion=e.suggestion) from None


# ------------------------------------------------------------------------------ the families
@register_family
@dataclasses.dataclass(frozen=True)
class EDMFamily(DiffusionFamily):
    """EDM (Karras et al. 2022, Table 1, "ours" column).

    c_skip = s_d^2/(s^2+s_d^2), c_out = s s_d/sqrt(s^2+s_d^2), c_in = 1/sqrt(s^2+s_d^2),
    c_noise = ln(s)/4; training ln s ~ N(P_mean, P_std^2), lambda = (s^2+s_d^2)/(s s_d)^2;
    sampling grid: EDM eq. 5 with rho = 7 on [0.002, 80]. The fields ``sigma_min`` /
    ``sigma_max`` bound :attr:`sigma_range` (the supported range, default unbounded), which
    clamps sampling grids; they are not the grid's ends (Table 1's EDM sigma_min = 0.002,
    sigma_max = 80: ``DiffusionModule``'s ``sigma_min`` / ``sigma_max``).
    """

    name: ClassVar[str] = "edm"
    MODULE_ARGS: ClassVar[Mapping[str, str]] = {"sigma_data": "sigma_data", "P_mean": "P_mean",
                                                "P_std": "P_std"}

    sigma_data: PositiveFloat = 0.5
    P_mean: float = -1.2
    P_std: PositiveFloat = 1.2
    sigma_min: float = 0.0
    sigma_max: float = math.inf

    def __post_init__(self):
        check_args(type(self), vars(self))
        object.__setattr__(self, "sigma_data", float(self.sigma_data))
        object.__setattr__(self, "P_std", float(self.P_std))
        if isinstance(self.P_mean, bool) or not isinstance(self.P_mean, (int, float)) \
                or not math.isfinite(self.P_mean):
            raise ConfigError("P_mean", "must be a finite number", value=self.P_mean)
        object.__setattr__(self, "P_mean", float(self.P_mean))
        if not 0 <= self.sigma_min < self.sigma_max:
            raise ConfigError("sigma_min", f"need 0 <= sigma_min < sigma_max = {self.sigma_max}",
                              value=self.sigma_min)
        object.__setattr__(self, "sigma_min", float(self.sigma_min))
        object.__setattr__(self, "sigma_max", float(self.sigma_max))

    @property
    def sigma_range(self) -> Tuple[float, float]:
        return self.sigma_min, self.sigma_max

    def coefficients(self, sigma: torch.Tensor):
        sd = self.sigma_data
        c_skip = sd**2 / (sigma**2 + sd**2)
        c_out = sigma * sd / (sigma**2 + sd**2).sqrt()
        c_in = 1 / (sd**2 + sigma**2).sqrt()
        c_noise = sigma.log() / 4
        return c_skip, c_out, c_in, c_noise

    def sample_sigma(self, n: int, device, seeds=None) -> torch.Tensor:
        z = self._standard_normal(n, device, seeds)
        return (z.to(torch.float32) * self.P_std + self.P_mean).exp()

    def weight(self, sigma: torch.Tensor) -> torch.Tensor:
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2

    def default_grid(self, num_steps: int = 18) -> torch.Tensor:
        return karras_sigmas(num_steps, 0.002, 80.0, 7.0)


@register_family
@dataclasses.dataclass(frozen=True)
class VPFamily(DiffusionFamily):
    """VP (Song et al. 2021) as written in the EDM paper's Table 1, VP column.

    sigma(t) = sqrt(exp(beta_d t^2/2 + beta_min t) - 1); c_skip = 1, c_out = -sigma,
    c_in = 1/sqrt(sigma^2+1), c_noise = (M-1) sigma^{-1}(sigma); training t ~ U(eps_t, 1),
    lambda = 1/sigma^2; supported range ``sigma_range`` = (sigma(eps_t), sigma(1)) (about
    (0.001, 152));
    sampling grid t_i = 1 + i/(N-1) (eps_s - 1), sigma_i = sigma(t_i).
    """

    name: ClassVar[str] = "vp"
    MODULE_ARGS: ClassVar[Mapping[str, str]] = {"vp_beta_d": "beta_d", "vp_beta_min": "beta_min",
                                                "vp_M": "M", "vp_epsilon_t": "epsilon_t"}

    beta_d: PositiveFloat = 19.9
    beta_min: NonNegativeFloat = 0.1
    M: int = 1000
    epsilon_t: OpenUnitInterval = 1e-5
    epsilon_s: OpenUnitInterval = 1e-3

    def __post_init__(self):
        check_args(type(self), vars(self))
        for f in ("beta_d", "beta_min", "epsilon_t", "epsilon_s"):
            object.__setattr__(self, f, float(getattr(self, f)))
        if isinstance(self.M, bool) or not isinstance(self.M, (int, float)) or not math.isfinite(self.M) \
                or self.M != int(self.M) \
                or self.M < 2:
            raise ConfigError("M", "must be an integer >= 2 (c_noise = (M - 1) t)", value=self.M)
        object.__setattr__(self, "M", int(self.M))

    @property
    def sigma_range(self) -> Tuple[float, float]:
        """(sigma(epsilon_t), sigma(1)): the training range of t, in sigma."""
        return (float(self.sigma(torch.tensor(self.epsilon_t, dtype=torch.float64))),
                float(self.sigma(torch.tensor(1.0, dtype=torch.float64))))

    def sigma(self, t):
        """sigma(t) = sqrt(exp(beta_d t^2/2 + beta_min t) - 1)."""
        t = torch.as_tensor(t)
        return torch.expm1(0.5 * self.beta_d * t**2 + self.beta_min * t).sqrt()

    def sigma_inv(self, sigma):
        """t(sigma) = (sqrt(b_min^2 + 2 b_d ln(1+sigma^2)) - b_min) / b_d, written without the
        cancellation of the two square roots (accurate in float32 down to sigma ~ 1e-3)."""
        sigma = torch.as_tensor(sigma)
        L = torch.log1p(sigma**2)
        return 2 * L / ((self.beta_min**2 + 2 * self.beta_d * L).sqrt() + self.beta_min)

    def coefficients(self, sigma: torch.Tensor):
        c_skip = torch.ones_like(sigma)
        c_out = -sigma
        c_in = 1 / (sigma**2 + 1).sqrt()
        c_noise = (self.M - 1) * self.sigma_inv(sigma)
        return c_skip, c_out, c_in, c_noise

    def sample_sigma(self, n: int, device, seeds=None) -> torch.Tensor:
        u = self._uniform(n, device, seeds)
        t = 1 + u * (self.epsilon_t - 1)
        return self.sigma(t).to(torch.float32)

    def weight(self, sigma: torch.Tensor) -> torch.Tensor:
        return 1 / sigma**2

    def default_grid(self, num_steps: PositiveInt = 18) -> torch.Tensor:
        check_args(type(self).default_grid, locals())
        n = num_steps
        i = torch.arange(n, dtype=torch.float64)
        t = 1 + i / max(n - 1, 1) * (self.epsilon_s - 1)
        return torch.cat([self.sigma(t), torch.zeros(1, dtype=torch.float64)])


@register_family
@dataclasses.dataclass(frozen=True)
class VEFamily(DiffusionFamily):
    """VE (Song et al. 2021) as written in the EDM paper's Table 1, VE column.

    c_skip = 1, c_out = sigma, c_in = 1, c_noise = ln(sigma/2); training
    ln sigma ~ U(ln sigma_min, ln sigma_max), i.e. sigma = sigma_min (sigma_max/sigma_min)^u with
    u ~ U(0, 1), and lambda = 1/sigma^2; supported range ``sigma_range`` = (sigma_min, sigma_max)
    = (0.02, 100) (the fields keep Table 1's names: they are its VE parameters);
    sampling grid: sigma_i = sigma_max (sigma_min/sigma_max)^{i/(N-1)} (Table 1's
    t_i = sigma_max^2 (sigma_min^2/sigma_max^2)^{i/(N-1)} with sigma(t) = sqrt(t)).
    """

    name: ClassVar[str] = "ve"

    sigma_min: PositiveFloat = 0.02
    sigma_max: PositiveFloat = 100.0

    def __post_init__(self):
        check_args(type(self), vars(self))
        lo, hi = float(self.sigma_min), float(self.sigma_max)
        if not (lo < hi and math.isfinite(hi)):
            raise ConfigError("sigma_min", f"need 0 < sigma_min < sigma_max = {hi:g} < inf", value=lo)
        object.__setattr__(self, "sigma_min", lo)
        object.__setattr__(self, "sigma_max", hi)

    @property
    def sigma_range(self) -> Tuple[float, float]:
        return self.sigma_min, self.sigma_max

    def coefficients(self, sigma: torch.Tensor):
        c_skip = torch.ones_like(sigma)
        c_out = sigma
        c_in = torch.ones_like(sigma)
        c_noise = (0.5 * sigma).log()
        return c_skip, c_out, c_in, c_noise

    def sample_sigma(self, n: int, device, seeds=None) -> torch.Tensor:
        u = self._uniform(n, device, seeds)
        return (self.sigma_min * (self.sigma_max / self.sigma_min) ** u).to(torch.float32)

    def weight(self, sigma: torch.Tensor) -> torch.Tensor:
        return 1 / sigma**2

    def default_grid(self, num_steps: PositiveInt = 18) -> torch.Tensor:
        check_args(type(self).default_grid, locals())
        n = num_steps
        i = torch.arange(n, dtype=torch.float64)
        s = self.sigma_max * (self.sigma_min / self.sigma_max) ** (i / max(n - 1, 1))
        return torch.cat([s, torch.zeros(1, dtype=torch.float64)])
