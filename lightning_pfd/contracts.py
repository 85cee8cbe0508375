"""The written contracts between models, data and the measurements (``typing.Protocol``).

What a monitor, an evaluation object or a subcommand may rely on, in one place instead of
``getattr`` chains. The protocols are ``runtime_checkable``: ``isinstance(module,
SigmaSpaceModel)`` checks that the members exist (not their signatures), and
:func:`check_contract` turns a miss into one :class:`~lightning_pfd.errors.ConfigError` that
names every missing member. Shipped classes and the protocols they satisfy:

===============================================  ===========================================
``DiffusionModule``                              :class:`SigmaSpaceModel` (hence :class:`GenerativeModel`)
``LevyItoModule``                                :class:`GenerativeModel`
``PreconditionedDenoiser`` (every family)        :class:`FeatureDenoiser` (hence :class:`SigmaSpaceDenoiser`)
``GaussianDenoiser``, ``EmpiricalDenoiser``, ...  :class:`SigmaSpaceDenoiser`
``TensorDataModule`` and every datamodule         :class:`SampleDataModule`
``TeacherDistillationDataModule``                :class:`TeacherDataModule`
===============================================  ===========================================

:func:`check_data_shape` is the one model <-> data shape check (the command line's validation
phase and the modules' ``setup`` call it); :func:`check_on_samples` the one "does this
user function (descriptor, observable) accept samples shaped like the data" check. No Lightning
import.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from .errors import ConfigError

__all__ = ["SigmaSpaceDenoiser", "FeatureDenoiser", "GenerativeModel", "SigmaSpaceModel",
           "SampleDataModule", "TeacherDataModule", "protocol_members", "missing_members",
           "check_contract", "check_data_shape", "check_on_samples", "SAMPLE_OUTPUTS",
           "SIGMA_SPACE_MODELS", "GENERATING_MODELS", "denoiser_sigma_range"]

#: what the sigma-space measurements (PFD, ICR, frozen-noise losses) accept as a model, for the
#: ``accepted`` of their error messages (:class:`SigmaSpaceModel`)
SIGMA_SPACE_MODELS = ("lightning_pfd.modules.DiffusionModule (any diffusion family: 'edm', 'vp', "
                      "'ve', ...), or any model exposing a sigma-space EMA denoiser `denoiser` "
                      "(lightning_pfd.contracts.SigmaSpaceModel)")
#: what the sampling measurements (memorization, tail metrics) accept as a model, for the
#: ``accepted`` of their error messages (:class:`GenerativeModel`)
GENERATING_MODELS = ("a model with generate(seeds, batch_size=...) "
                     "(lightning_pfd.contracts.GenerativeModel): lightning_pfd.modules.DiffusionModule "
                     "or LevyItoModule")


# ------------------------------------------------------------------------------ denoisers
@runtime_checkable
class SigmaSpaceDenoiser(Protocol):
    """D(x, sigma) -> x0_hat with x = y + sigma n (PFD paper eq. 1): any denoiser a PF-ODE
    sampler, PFD or a frozen-noise loss accepts. Optional: ``sigma_range`` -> ``(lo, hi)``, the
    noise levels the denoiser supports (every sampling grid is clamped to it; absent: (0, inf)),
    read through :func:`denoiser_sigma_range`; and ``fingerprint()`` (a cache key), read with
    ``getattr`` where it exists. (``sigma_min`` / ``sigma_max`` name the sampling grid's ends,
    :class:`~lightning_pfd.diffusion.sampling.SamplerSettings`, not this range.)"""

    def __call__(self, x: torch.Tensor, sigma: Any) -> torch.Tensor: ...


@runtime_checkable
class FeatureDenoiser(SigmaSpaceDenoiser, Protocol):
    """A preconditioned denoiser whose raw network can be tapped for features (ICR):
    ``net`` is the raw network, ``network_input(x, sigma) -> (c_in x, c_noise)`` what it sees."""

    net: torch.nn.Module

    def network_input(self, x: torch.Tensor, sigma: Any) -> Tuple[torch.Tensor, torch.Tensor]: ...


def legacy_sigma_range(obj: Any) -> Optional[Tuple[float, float]]:
    """``(lo, hi)`` from ``obj.sigma_min`` / ``obj.sigma_max``, the names releases before
    ``sigma_range`` gave the supported noise range (a denoiser, or a diffusion family), with a
    FutureWarning naming ``sigma_range``; None when ``obj`` has neither."""
    lo, hi = getattr(obj, "sigma_min", None), getattr(obj, "sigma_max", None)
    if lo is None and hi is None:
        return None
    warnings.warn(f"{type(obj).__name__}: the supported noise range is now the attribute "
                  "`sigma_range` -> (lo, hi); read from its `sigma_min` / `sigma_max` for now, "
                  "which a later release will ignore", FutureWarning, stacklevel=3)
    return float(lo or 0.0), (math.inf if hi is None else float(hi))


def denoiser_sigma_range(denoiser: Any) -> Tuple[float, float]:
    """``(lo, hi)``: the noise levels ``denoiser`` supports (its ``sigma_range``, see
    :class:`SigmaSpaceDenoiser`), as floats; (0, inf) when it declares none. A denoiser written
    for an earlier release, with ``sigma_min`` / ``sigma_max`` and no ``sigma_range``, is read by
    those names with a FutureWarning (:func:`legacy_sigma_range`)."""
    rng = getattr(denoiser, "sigma_range", None)
    if rng is None:
        return legacy_sigma_range(denoiser) or (0.0, math.inf)
    try:
        lo, hi = rng
    except (TypeError, ValueError):
        raise TypeError(f"{type(denoiser).__name__}.sigma_range: must be a pair (lo, hi) of noise "
                        f"levels, got {rng!r}") from None
    return float(lo or 0.0), (math.inf if hi is None else float(hi))


# ------------------------------------------------------------------------------ models
@runtime_checkable
class GenerativeModel(Protocol):
    """A trained generative model: samples per seed and a per-sample frozen-noise loss.

    * ``data_shape``: the shape of one sample;
    * ``generate(seeds, ...) -> (len(seeds), *data_shape)`` float64 samples, row i a function of
      ``seeds[i]`` only;
    * ``loss_fn(model, y, seeds=None) -> (B,)``: the per-sample training loss of ``model`` on
      ``y``, with noise frozen per seed when ``seeds`` are given.
    """

    data_shape: Tuple[int, ...]

    def generate(self, seeds: Any, *args: Any, **kwargs: Any) -> torch.Tensor: ...

    def loss_fn(self, model: Any, y: torch.Tensor, seeds: Any = None) -> torch.Tensor: ...


@runtime_checkable
class SigmaSpaceModel(GenerativeModel, Protocol):
    """A generative model whose evaluation copy is a sigma-space denoiser (PFD, E_gen/E_mem,
    ICR and the frozen-noise losses compare such models):

    * ``denoiser``: the evaluation denoiser D(x; sigma) (the EMA weights, eval mode);
    * ``network_input(x, sigma) -> (c_in x, c_noise)``: what its raw network sees (feature taps);
    * ``sampler_settings``: the :class:`~lightning_pfd.diffusion.sampling.SamplerSettings`
      ``generate`` uses by default (solver and grid), and ``sigmas`` that grid as float64,
      clamped to the denoiser's range
      (:meth:`~lightning_pfd.diffusion.sampling.SamplerSettings.from_module` reads the settings,
      and an optional boolean ``sample_autocast``: bf16 on CUDA);
    * ``loss_fn(denoiser, y, seeds=None)`` and ``generate`` as in :class:`GenerativeModel`.
    """

    sampler_settings: Any
    sigmas: torch.Tensor

    @property
    def denoiser(self) -> SigmaSpaceDenoiser: ...

    def network_input(self, x: torch.Tensor, sigma: Any) -> Tuple[torch.Tensor, torch.Tensor]: ...


# ------------------------------------------------------------------------------ data
@runtime_checkable
class SampleDataModule(Protocol):
    """A datamodule over in-memory samples (``lightning_pfd.data.TensorDataModule`` and its
    subclasses). After ``setup()``: ``train_data`` (N, *data_shape) float32 -- the exact N
    training samples --, ``val_data`` (or None), ``data_shape``, ``train_labels`` /
    ``val_labels`` (long or None), ``teacher`` (an exact denoiser of the data law, or None) and
    ``fingerprint()`` (a hash of the training set, a cache key)."""

    train_data: Optional[torch.Tensor]
    val_data: Optional[torch.Tensor]
    train_labels: Optional[torch.Tensor]
    val_labels: Optional[torch.Tensor]
    data_shape: Optional[Tuple[int, ...]]
    teacher: Any

    def fingerprint(self) -> str: ...


@runtime_checkable
class TeacherDataModule(SampleDataModule, Protocol):
    """Data generated by a teacher's PF-ODE (PFD paper App. C.3), what E_gen needs:

    * ``teacher``: the teacher denoiser (built by ``prepare_data`` / ``setup``);
    * ``teacher_fingerprint()``: a string identifying the teacher (endpoint cache key);
    * ``teacher_sigmas``: the float64 grid that generated the data (clamped to the teacher);
    * ``sampler_settings``: the teacher's full solver
      (:class:`~lightning_pfd.diffusion.sampling.SamplerSettings`);
    * ``n_gen``, ``gen_seed_offset``: the evaluation seed range x_gen,T reserved for E_gen and
      E_mem, disjoint from the training and test seeds.
    """

    teacher_sigmas: torch.Tensor
    sampler_settings: Any
    n_gen: int
    gen_seed_offset: int

    def teacher_fingerprint(self) -> str: ...


# ------------------------------------------------------------------------------ checks
_PROTOCOL_BASES = {"Protocol", "Generic", "object"}


def protocol_members(protocol: type) -> Tuple[str, ...]:
    """The public members a protocol requires (its own and its protocol bases'), sorted."""
    names = set()
    for klass in protocol.__mro__:
        if klass.__name__ in _PROTOCOL_BASES or Protocol not in klass.__bases__:  # a protocol names Protocol
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(k for k, v in vars(klass).items() if callable(v) or isinstance(v, property))
    return tuple(sorted(n for n in names if not n.startswith("_") or n == "__call__"))


def missing_members(obj: Any, protocol: type) -> Tuple[str, ...]:
    """The members of ``protocol`` that ``obj`` lacks (empty when it satisfies it)."""
    out = []
    for name in protocol_members(protocol):
        if name == "__call__":
            if not callable(obj):
                out.append("__call__")
        elif not hasattr(obj, name):
            out.append(name)
    return tuple(out)


def check_contract(obj: Any, protocol: type, field: str, needed_by: str, why: str = "") -> None:
    """Raise :class:`ConfigError` naming ``field`` and every member of ``protocol`` that ``obj``
    lacks ("GeneralizationMonitor needs a SigmaSpaceModel: LevyItoModule has no denoiser, ...")."""
    missing = missing_members(obj, protocol)
    if missing:
        raise ConfigError(field, f"{needed_by} needs a {protocol.__name__} "
                          f"({', '.join(protocol_members(protocol))}); {type(obj).__name__} has no "
                          + ", ".join(f"`{m}`" for m in missing) + (f" ({why})" if why else ""),
                          value=type(obj).__name__)


def check_data_shape(model: Any, datamodule: Any, field: str = "model.net") -> None:
    """The one model <-> data shape check: ``model.data_shape`` must equal ``datamodule.data_shape``.

    Silent when either is unknown (a datamodule before ``setup``, a model without a fixed
    shape); otherwise a :class:`ConfigError` naming ``field`` (the net, whose
    ``img_resolution`` / ``in_channels`` / ``dim`` fix the model's shape)."""
    m_shape = _shape(getattr(model, "data_shape", None))
    d_shape = _shape(getattr(datamodule, "data_shape", None)) if datamodule is not None else None
    if m_shape is None or d_shape is None or m_shape == d_shape:
        return
    raise ConfigError(field, f"the net expects samples of shape {m_shape} but the data "
                      f"({type(datamodule).__name__}) yields shape {d_shape}",
                      suggestion="set the net's img_resolution / in_channels (or dim) to match the data")


def _shape(value: Optional[Sequence[int]]) -> Optional[Tuple[int, ...]]:
    return None if value is None else tuple(int(d) for d in value)


#: what :func:`check_on_samples` expects a function to return for B samples
SAMPLE_OUTPUTS = {"features": "features (B, F)", "scalars": "one scalar per sample (B,)"}


def check_on_samples(fn: Any, data: torch.Tensor, field: str, output: str = "features",
                     value: Any = None, what: str = "samples") -> torch.Tensor:
    """Call ``fn`` on the first two rows of ``data`` and return its output; a
    :class:`ConfigError` naming ``field`` when it raises (e.g. an image network given vector
    data) or when the output is not ``output``: ``"features"`` (B, F) with F >= 1 or
    ``"scalars"`` (B,). ``value`` is the user's spec shown in the error (default: fn's type)."""
    if output not in SAMPLE_OUTPUTS:
        raise ValueError(f"output: one of {sorted(SAMPLE_OUTPUTS)}, got {output!r}")
    shown = type(fn).__name__ if value is None else value
    probe = data[:2]
    try:
        out = torch.as_tensor(fn(probe))
    except Exception as e:
        raise ConfigError(field, f"fails on {what} of shape {tuple(data.shape[1:])}: "
                          f"{type(e).__name__}: {e}", value=shown) from e
    b = probe.shape[0]
    ok = (out.ndim == 2 and out.shape[0] == b and out.shape[1] >= 1) if output == "features" \
        else tuple(out.shape) == (b,)
    if not ok:
        raise ConfigError(field, f"must map a batch (B, ...) to {SAMPLE_OUTPUTS[output]}; got shape "
                          f"{tuple(out.shape)} for {b} {what}", value=shown)
    return out
