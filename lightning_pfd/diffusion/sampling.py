"""Sigma grids, deterministic PF-ODE solvers and the settings that pick one (EDM paper eq. 5
and Alg. 1 without churn).

Solvers have the k-diffusion shape ``sample(denoiser, x_T, sigmas) -> x_0`` where ``x_T`` is
already scaled by ``sigmas[0]`` and the ODE is dx/dsigma = (x - D(x; sigma)) / sigma
(PFD paper eq. 1 with the EDM schedule). The state is kept in float64; the denoiser may
compute in lower precision, its output is promoted back.

:class:`SamplerSettings` is the one owner of "which PF-ODE solver": sampler, Karras grid (or an
explicit one) and the precision the denoiser runs in. ``DiffusionModule.generate``, the teacher
distillation data and :class:`~lightning_pfd.evaluation.flow.FlowEvaluation` all sample through
it, so a comparison of two flows can use one solver by construction.

Compiled sampling (``SamplerSettings(compile=...)``; ``sample_compile`` of ``DiffusionModule`` /
``LevyItoModule`` for their ``generate``, ``compile`` of ``GeneralizationMonitor``): the denoiser
runs through ``torch.compile`` for every PF-ODE evaluation. Shapes are fixed per flow (a ragged
last batch is padded with zero rows to the flow's batch size, the padding dropped from the
endpoints) and sigma enters as a 0-d tensor, so one compiled graph serves every step, batch and
epoch (one per batch shape: callers sampling 128 and 256 rows at a time compile twice) -- the
weights are graph inputs, an EMA update does not recompile. Mode ``"reduce-overhead"`` adds CUDA
graphs on a CUDA device (on a CPU it is the default mode). Endpoints equal the eager ones to
float32 rounding (the compiler may fuse and reorder float32 operations), so the option is not
part of any cache key.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Literal, Optional, Sequence, Tuple, Union, get_args

import torch

from ..contracts import denoiser_sigma_range
from ..errors import ConfigError
from ..validation import FinitePositiveFloat, PositiveInt, check_args
from .noise import seeded_noise
from .streams import stream

__all__ = ["karras_sigmas", "karras_sigmas_for", "heun_sample", "euler_sample", "sample_endpoints", "clamp_sigmas",
           "SAMPLERS", "PRECISIONS", "COMPILE_MODES", "SamplerSettings", "check_compile", "compile_denoiser",
           "pad_rows"]


def karras_sigmas(num_steps: int = 18, sigma_min: float = 0.002, sigma_max: float = 80.0,
                  rho: float = 7.0) -> torch.Tensor:
    """EDM time steps (EDM eq. 5), float64, length num_steps + 1, the last entry 0.

    t_i = (s_max^{1/rho} + i/(N-1) (s_min^{1/rho} - s_max^{1/rho}))^rho, i = 0..N-1; t_N = 0.
    """
    if int(num_steps) < 1:
        raise ValueError(f"num_steps: must be >= 1, got {num_steps}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"sigma_min/sigma_max: need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    if rho <= 0:
        raise ValueError(f"rho: must be > 0, got {rho}")
    if num_steps == 1:
        t = torch.tensor([sigma_max], dtype=torch.float64)
    else:
        i = torch.arange(num_steps, dtype=torch.float64)
        t = (sigma_max ** (1 / rho) + i / (num_steps - 1)
             * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([t, t.new_zeros(1)])


def clamp_sigmas(sigmas: torch.Tensor, denoiser) -> torch.Tensor:
    """Clamp the positive part of a grid to the noise levels the denoiser supports, its
    ``sigma_range`` (:func:`~lightning_pfd.contracts.denoiser_sigma_range`)."""
    lo, hi = denoiser_sigma_range(denoiser)
    pos = sigmas > 0
    return torch.where(pos, sigmas.clamp(min=lo if lo > 0 else None, max=hi), sigmas)


def karras_sigmas_for(denoiser, num_steps: int = 18, sigma_min: float = 0.002, sigma_max: float = 80.0,
                      rho: float = 7.0) -> torch.Tensor:
    """EDM's grid for ``denoiser`` as NVlabs/edm's ``edm_sampler`` builds it (generate.py: "Adjust
    noise levels based on what's supported by the network"): :func:`karras_sigmas` on
    [max(``sigma_min``, lo), min(``sigma_max``, hi)] of the denoiser's supported range (lo, hi),
    so the grid is re-spaced rather than clamped (a VE net, range [0.02, 100], gets no repeated
    step at 0.02). Without a declared range (lo = 0, hi = inf) it is ``karras_sigmas`` itself."""
    lo, hi = denoiser_sigma_range(denoiser) if denoiser is not None else (0.0, math.inf)
    smin, smax = max(float(sigma_min), lo), min(float(sigma_max), hi)
    if not 0 < smin < smax:  # the range excludes the requested grid: EDM's clamp semantics
        return clamp_sigmas(karras_sigmas(num_steps, sigma_min, sigma_max, rho), denoiser)
    return karras_sigmas(num_steps, smin, smax, rho)


def module_device(denoiser, default) -> torch.device:
    """Device of a denoiser's first parameter or buffer (exact denoisers hold only buffers)."""
    if isinstance(denoiser, torch.nn.Module):
        for t in list(denoiser.parameters()) + list(denoiser.buffers()):
            return t.device
    return torch.device(default)


def _d(denoiser, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """ODE direction (x - D(x; sigma)) / sigma in float64."""
    D = denoiser(x, sigma.to(x.dtype)).to(torch.float64)
    return (x - D) / sigma


@torch.no_grad()
def euler_sample(denoiser: Callable, x_T: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """First-order Euler solver of the PF-ODE on the grid ``sigmas`` (NFE = len(sigmas) - 1)."""
    sigmas = sigmas.to(device=x_T.device, dtype=torch.float64)
    x = x_T.to(torch.float64)
    for i in range(len(sigmas) - 1):
        x = x + (sigmas[i + 1] - sigmas[i]) * _d(denoiser, x, sigmas[i])
    return x


@torch.no_grad()
def heun_sample(denoiser: Callable, x_T: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Deterministic 2nd-order Heun solver (EDM Alg. 1, S_churn = 0).

    Euler predictor then trapezoidal corrector on every step except the last (to sigma = 0),
    which is a plain Euler step; NFE = 2(len(sigmas) - 1) - 1 = 35 for the 18-step grid.
    """
    sigmas = sigmas.to(device=x_T.device, dtype=torch.float64)
    x = x_T.to(torch.float64)
    for i in range(len(sigmas) - 1):
        t_cur, t_next = sigmas[i], sigmas[i + 1]
        d_cur = _d(denoiser, x, t_cur)
        x_next = x + (t_next - t_cur) * d_cur
        if t_next > 0:
            d_next = _d(denoiser, x_next, t_next)
            x_next = x + (t_next - t_cur) * (0.5 * d_cur + 0.5 * d_next)
        x = x_next
    return x


#: the deterministic PF-ODE solvers by name
SamplerName = Literal["heun", "euler"]
SAMPLERS = {"heun": heun_sample, "euler": euler_sample}
assert tuple(SAMPLERS) == get_args(SamplerName)


def resolve_sampler(sampler) -> Callable:
    if callable(sampler):
        return sampler
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: unknown {sampler!r}; accepted: {sorted(SAMPLERS)}")
    return SAMPLERS[sampler]


@torch.no_grad()
def sample_endpoints(denoiser: Callable, seeds: Sequence[int] | torch.Tensor, shape: Sequence[int],
                     sigmas: torch.Tensor | None = None, sampler="heun", batch_size: int = 256,
                     device=None, out_device="cpu", fixed_batch: bool = False) -> torch.Tensor:
    """PF-ODE endpoints Phi(x_T) for x_T = sigmas[0] * seeded_noise(seeds), in batches.

    Working memory is bounded by ``batch_size``; the result (preallocated, float64 on
    ``out_device``) is the only M-sized tensor. Row i depends only on seeds[i]: its noise bit for
    bit; its endpoint up to rounding across batch sizes and devices (a matmul over other shapes may
    take other BLAS kernels), bit for bit for the same batch size on the same machine. ``fixed_batch``: every batch has min(batch_size, len(seeds)) rows, a ragged
    last one padded with zero rows that are dropped from the result (one input shape for a
    compiled denoiser).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    sampler = resolve_sampler(sampler)
    sigmas = karras_sigmas_for(denoiser) if sigmas is None else clamp_sigmas(sigmas, denoiser)
    seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    if device is None:
        device = module_device(denoiser, torch.device("cpu"))
    rows = min(batch_size, len(seeds))
    out = torch.empty(len(seeds), *shape, dtype=torch.float64, device=out_device)
    for start in range(0, len(seeds), batch_size):
        chunk = seeds[start:start + batch_size]
        x_T = seeded_noise(chunk, shape, device=device, stream=stream("pf_ode.x_T")) * sigmas[0]
        if fixed_batch and len(chunk) < rows:
            x_T = torch.cat([x_T, x_T.new_zeros(rows - len(chunk), *x_T.shape[1:])])
        out[start:start + len(chunk)] = sampler(denoiser, x_T, sigmas)[:len(chunk)]
    return out


#: network precision while sampling -> autocast dtype (None: no autocast, float32 weights as stored)
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: Dict[str, Optional[torch.dtype]] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
assert tuple(PRECISIONS) == get_args(Precision)
#: torch.compile modes of ``SamplerSettings.compile`` (True means "default", False: eager)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES = get_args(CompileMode)
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
_GRID_ARGS = ("num_steps", "sigma_min", "sigma_max", "rho")


def check_compile(value: Any, arg: str = "compile") -> Union[bool, str]:
    """The compile option normalised: False (eager) or one of :data:`COMPILE_MODES` (True ->
    ``"default"``); otherwise a ConfigError naming ``arg``, the caller's own argument that holds
    the value (``sample_compile`` of a module), never a config path."""
    if value is None or value is False:
        return False
    if value is True:
        return "default"
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    raise ConfigError(arg, "unknown torch.compile mode", value=value, accepted=[False, True, *COMPILE_MODES],
                      suggestion="compile: default (or reduce-overhead for CUDA graphs on a GPU)")


def compile_denoiser(denoiser: Callable, mode: Union[bool, str] = "default",
                     backend: Union[str, Callable] = "inductor", device: Any = None) -> Callable:
    """``denoiser`` through ``torch.compile(mode, backend, dynamic=False)`` (identity for mode False).

    ``denoiser``: a module or any function of (x, sigma) -- e.g. a bound method such as a score
    network's ``fractional_score`` -- whose ``device`` (default: the module's) decides whether
    CUDA graphs apply. Cheap to call again: the compiled code is cached by torch._dynamo on the
    forward's code object and guarded on the module's structure, not on its weights, so every
    epoch reuses the graph of the first. With CUDA graphs (``"reduce-overhead"``,
    ``"max-autotune"`` on a CUDA denoiser) each call starts a new graph step and returns a copy
    of the output, whose buffer the next replay overwrites."""
    mode = check_compile(mode)
    if not mode:
        return denoiser
    compiled = torch.compile(denoiser, mode=None if mode == "default" else mode, backend=backend, dynamic=False)
    device = module_device(denoiser, torch.device("cpu")) if device is None else torch.device(device)
    on_cuda = device.type == "cuda"
    if not (on_cuda and mode in _CUDA_GRAPH_MODES and backend == "inductor"):
        return compiled

    def step(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:  # CUDA graphs (not testable on CPU)
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, sigma).clone()

    step.sigma_range = denoiser_sigma_range(denoiser)  # clamp_sigmas reads it
    return step


def pad_rows(fn: Callable, rows: int) -> Callable:
    """``fn(x, *args)`` always called on ``rows`` rows: a batch x with fewer is padded with zero
    rows and the padding's outputs are dropped (one input shape for a compiled ``fn``: a
    ragged last batch does not recompile). Rows are independent, so no output changes."""

    def run(x: torch.Tensor, *args):
        n = x.shape[0]
        if n >= rows:
            return fn(x, *args)
        return fn(torch.cat([x, x.new_zeros(rows - n, *x.shape[1:])]), *args)[:n]

    return run


@dataclass(frozen=True)
class SamplerSettings:
    """One deterministic PF-ODE solver: sampler, sigma grid and the denoiser's precision.

    Args:
        sampler: ``"heun"`` (EDM Alg. 1, S_churn = 0) or ``"euler"``; deterministic only (a
            stochastic sampler is not a flow map, which PFD compares).
        num_steps, sigma_min, sigma_max, rho: the Karras grid (EDM eq. 5), Heun-18 by default.
        grid: an explicit sigma grid (float64 values, decreasing, non-negative) that replaces
            the Karras grid; the named grid arguments are then only defaults.
        precision: ``"fp32"`` (no autocast: the state in float64, the network in its own
            dtype), ``"bf16"`` or ``"fp16"`` (the denoiser under ``torch.autocast`` with that
            dtype, the ODE state still float64). It is part of every endpoint cache key.
        compile: False (eager), True / ``"default"``, ``"reduce-overhead"`` (+ CUDA graphs on a
            GPU), ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``: run the denoiser through
            ``torch.compile`` (module docstring), with ``compile_backend`` (``"inductor"``;
            ``"aot_eager"`` / ``"eager"`` to debug, or a backend callable). Not part of cache keys.

    Each flow clamps the grid to its denoiser's supported sigma range (:meth:`sigmas`).
    The fields' types declare what they accept (:func:`~lightning_pfd.validation.check_args`);
    an invalid value raises :class:`~lightning_pfd.errors.ConfigError` naming the field.
    """

    sampler: SamplerName = "heun"
    num_steps: PositiveInt = 18
    sigma_min: FinitePositiveFloat = 0.002
    sigma_max: FinitePositiveFloat = 80.0
    rho: FinitePositiveFloat = 7.0
    grid: Optional[Tuple[float, ...]] = None
    precision: Precision = "fp32"
    compile: Union[bool, CompileMode] = False
    compile_backend: Union[str, Callable] = "inductor"

    def __post_init__(self):
        if self.grid is not None:
            object.__setattr__(self, "grid", tuple(float(s) for s in torch.as_tensor(
                self.grid, dtype=torch.float64).reshape(-1).tolist()))
        check_args(type(self), vars(self))
        object.__setattr__(self, "compile", check_compile(self.compile))
        _validate(self)

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_hparams(cls, obj: Any, grid: Optional[Sequence[float]] = None,
                     **overrides) -> "SamplerSettings":
        """Settings from an object's ``sampler``, ``num_steps``, ``sigma_min``, ``sigma_max``,
        ``rho`` (its ``hparams``, else its attributes); missing ones keep their defaults.
        ``grid`` (e.g. the object's clamped ``sigmas``) is kept explicitly unless it equals the
        clamped Karras grid of those settings."""
        hp = _hparams(obj)
        kw: Dict[str, Any] = {}
        for f in ("sampler",) + _GRID_ARGS:
            v = hp.get(f, getattr(obj, f, None))
            if v is not None and not isinstance(v, torch.Tensor):
                kw[f] = v
        kw.update(overrides)
        settings = cls(**kw)
        if grid is not None:
            grid = torch.as_tensor(grid, dtype=torch.float64).cpu()
            if not _is_clamped_version(settings.sigmas(), grid):
                settings = replace(settings, grid=tuple(grid.tolist()))
        return settings

    @classmethod
    def from_module(cls, module: Any, sampler: Optional[str] = None,
                    sigmas: Optional[Sequence[float]] = None,
                    precision: Optional[str] = None) -> "SamplerSettings":
        """The solver a sigma-space model samples with: its public ``sampler_settings``
        (:class:`~lightning_pfd.contracts.SigmaSpaceModel`); for a model without them, Heun on
        its ``sigmas`` (EDM's 18-step grid when it has none). bf16 when the model's
        ``sample_autocast`` is set and it lives on CUDA, else fp32. Explicit arguments override;
        ``sigmas`` replaces the grid."""
        own = getattr(module, "sampler_settings", None)
        if not isinstance(own, SamplerSettings):
            own = cls()
            grid = getattr(module, "sigmas", None)
            if isinstance(grid, torch.Tensor):
                grid = grid.detach().to("cpu", torch.float64).reshape(-1)
                if not _is_clamped_version(own.sigmas(), grid):
                    own = replace(own, grid=tuple(grid.tolist()))
        if precision is None:
            device = getattr(module, "device", torch.device("cpu"))
            on_cuda = getattr(device, "type", str(device)) == "cuda"
            precision = "bf16" if bool(getattr(module, "sample_autocast", False)) and on_cuda else "fp32"
        settings = replace(own, sampler=sampler or own.sampler, precision=precision)
        if sigmas is not None:  # an explicit grid: the named arguments do not describe it
            settings = replace(settings, grid=tuple(torch.as_tensor(sigmas, dtype=torch.float64).reshape(-1).tolist()))
        return settings

    # ---- use ------------------------------------------------------------------------------
    def sigmas(self, denoiser: Any = None, device=None) -> torch.Tensor:
        """The float64 grid for ``denoiser``: EDM's grid re-spaced on its supported sigma range
        (:func:`karras_sigmas_for`, as NVlabs/edm's sampler), or an explicit ``grid`` clamped
        to it."""
        if self.grid is not None:
            g = torch.tensor(self.grid, dtype=torch.float64)
            if denoiser is not None:
                g = clamp_sigmas(g, denoiser)
        else:
            g = karras_sigmas_for(denoiser, self.num_steps, self.sigma_min, self.sigma_max, self.rho)
        return g if device is None else g.to(device)

    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        return PRECISIONS[self.precision]

    def autocast(self, device) -> contextlib.AbstractContextManager:
        """``torch.autocast`` with this precision on ``device`` (a no-op context for fp32)."""
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=dtype)

    @torch.no_grad()
    def sample(self, denoiser: Callable, seeds, shape: Sequence[int], batch_size: int = 256,
               device=None, out_device="cpu") -> torch.Tensor:
        """Endpoints Phi(x_T) of ``denoiser``'s PF-ODE for x_T = sigma_0 * z(seed), float64,
        with this sampler, grid (clamped to the denoiser), precision and compile mode (fixed
        batch shapes when compiled; see ``sample_endpoints``)."""
        if device is None:
            device = module_device(denoiser, torch.device("cpu"))
        sigmas = self.sigmas(denoiser)
        run = compile_denoiser(denoiser, self.compile, self.compile_backend)
        with self.autocast(device):
            return sample_endpoints(run, seeds, shape, sigmas=sigmas, sampler=self.sampler, batch_size=batch_size,
                                    device=device, out_device=out_device, fixed_batch=bool(self.compile))

    def describe(self) -> str:
        """``(heun, num_steps=5, sigma_min=0.002, sigma_max=80, rho=7)``, or ``(heun, 5 steps,
        sigma 80 .. 0.002)`` for an explicit grid; `` in bf16`` when not fp32, `` compiled
        (default)`` when compiled."""
        prec = "" if self.precision == "fp32" else f" in {self.precision}"
        prec += f" compiled ({self.compile})" if self.compile else ""
        if self.grid is None:
            args = ", ".join(f"{a}={float(getattr(self, a)):g}" for a in _GRID_ARGS)
            return f"({self.sampler}, {args}){prec}"
        return f"({self.sampler}, {describe_grid(self.sigmas())}){prec}"


def describe_grid(grid: torch.Tensor) -> str:
    """``5 steps, sigma 80 .. 0.002`` (the positive part of a grid)."""
    pos = grid[grid > 0]
    if not len(pos):
        return "an empty grid"
    return f"{len(grid) - 1} steps, sigma {float(pos.max()):.6g} .. {float(pos.min()):.6g}"


def same_grid(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two grids equal to rounding (rtol 1e-9)."""
    return a.shape == b.shape and torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-9, atol=0.0)


def _is_clamped_version(named: torch.Tensor, grid: torch.Tensor) -> bool:
    """Whether ``grid`` is ``named`` clamped to some [lo, hi] (a model's supported sigma range):
    then the named settings reproduce it exactly for that model (:meth:`SamplerSettings.sigmas`)."""
    pos = grid[grid > 0]
    if named.shape != grid.shape or not len(pos):
        return False
    lo, hi = (float(v) for v in torch.aminmax(pos))
    return torch.equal(torch.where(named > 0, named.clamp(min=lo, max=hi), named), grid)


def _hparams(obj) -> Dict[str, Any]:
    """An object's saved hyperparameters as a plain dict (empty when it has none)."""
    hp = getattr(obj, "hparams", None)
    try:
        return dict(hp) if hp is not None else {}
    except (TypeError, ValueError):
        return {}


def _validate(s: SamplerSettings) -> None:
    """What the field types do not express: a backend, the order of the grid's ends, the grid."""
    if not (callable(s.compile_backend) or (isinstance(s.compile_backend, str) and s.compile_backend)):
        raise ConfigError("compile_backend", "must be a torch.compile backend name or callable",
                          value=s.compile_backend, accepted="e.g. inductor, aot_eager, eager")
    if not s.sigma_min < s.sigma_max:
        raise ConfigError("sigma_min", f"need 0 < sigma_min < sigma_max = {s.sigma_max:g}", value=s.sigma_min)
    if s.grid is not None:
        g = torch.tensor(s.grid, dtype=torch.float64)
        ok = (len(g) >= 2 and bool(torch.isfinite(g).all()) and bool((g >= 0).all()) and float(g[0]) > 0
              and bool((g[1:] <= g[:-1]).all()))
        if not ok:
            raise ConfigError("sigmas", "must be a finite, non-increasing grid of >= 2 sigmas >= 0 "
                              "starting above 0 (e.g. karras_sigmas(18).tolist())", value=list(s.grid)[:6])
