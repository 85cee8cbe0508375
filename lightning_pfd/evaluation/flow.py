"""FlowEvaluation: E_gen, E_mem, the frozen-noise losses and any metric between a student's PF-ODE
endpoints and a fixed reference flow ("Understanding Generalization in Diffusion Distillation via
Probability Flow Distance", the PFD paper: Def. 2, eq. 8, 10; App. C.3, C.6). Pure torch.

One evaluation fixes

- the evaluation seeds x_gen,T (``seed_offset + arange(num_eval)``, disjoint from the training and
  test seeds of a distillation data set),
- ONE PF-ODE solver, a :class:`~lightning_pfd.diffusion.sampling.SamplerSettings` (sampler, sigma
  grid, precision), used for every flow: the student's, the teacher's and the empirical one
  (each clamps the grid to its denoiser's sigma range). A bf16 / fp16 precision therefore applies
  to the references as well, and the references are cached per precision. The settings'
  ``compile`` mode applies to the student only (sampled at every measurement, one compiled graph
  for all epochs); the references are sampled once per cache key, eagerly;
- the reference flows (``"teacher"`` when a teacher is given, ``"empirical"``: the closed-form
  denoiser of the training set, eq. 46: :class:`EmpiricalDenoiser`) with their endpoints and
  descriptors Psi, computed once on all seeds -- sharded over the processes and gathered -- and
  cached on disk under a hash of everything they depend on;
- the metrics fed by student and reference features, each registered against one reference:
  ``e_gen`` = PFD(student, teacher) and ``e_mem`` = PFD(student, empirical) by default (eq. 8), and
  any user metric (``add_metric("sw/teacher", SlicedWasserstein, reference="teacher")``).

:meth:`FlowEvaluation.evaluate` then samples only the student (on this process's shard of the
seeds), and returns a :class:`FlowResult` with the metrics (already reduced over processes), the
fraction of non-finite student endpoints, and the endpoints / features of student and references
(gathered on every process with ``gather=True``)::

    ev = FlowEvaluation.from_datamodule(dm, model, num_eval=1024)
    result = ev.evaluate(model.denoiser, loss_fn=model.loss_fn)
    result.metrics["e_gen"], result.features()["student"], result.features()["teacher"]

Metric contract: a metric is made by a factory (a class such as a torchmetrics ``Metric``
subclass, or a ``functools.partial``) called with the keyword arguments ``dist_sync_fn`` and
``distributed_available_fn``; the result has ``update(student_features, reference_features)``
(rows of both come from the same seeds, float64, shape (B, F); called once per ``batch_size``
rows) and ``compute()``. Each process updates it with its own shard; ``compute`` synchronises
the states through the evaluation's :class:`~lightning_pfd.evaluation.base.Comm` (torch.distributed by default), so a
torchmetrics metric whose states are sums or concatenations gives the same value for every number
of processes. A student with any
non-finite endpoint or feature gives NaN for every metric -- never a value over part of the seeds.

Frozen-noise losses (PFD paper App. C.6): ``train_fixed`` / ``test_fixed`` are the mean per-sample
loss ``loss_fn(denoiser, y, seeds=offset + i)`` over the first ``num_loss_samples`` training /
held-out samples (noise and sigma frozen per sample), ``gap = test_fixed - train_fixed``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Union

import torch

from ..cache import cache_dir, hash_key, load_tensor_verified, save_tensor_atomic
from ..classpath import load_class
from ..diffusion import EmpiricalDenoiser
from ..diffusion.sampling import (PRECISIONS, SAMPLERS, SamplerSettings, _hparams, check_compile, describe_grid,
                                  module_device, same_grid)
from ..errors import ConfigError
from ..metrics.descriptors import IdentityDescriptor, build_descriptor, descriptor_fingerprint
from ..metrics.pfd import ProbabilityFlowDistance, paired_sq_distances
from ..validation import NonNegativeInt, PositiveInt, check_args, check_memory
from . import sharding
from .base import SINGLE, Comm, Evaluation, Measurement, NonFinite, StrategyCollective, TorchDistributed, Units, train_data_of

__all__ = ["FlowEvaluation", "FlowResult", "Reference", "Comm", "TorchDistributed",
           "StrategyCollective", "image_grid", "metric_factory", "pfd_standard_error", "check_sigma_space_model",
           "check_one_solver", "DEFAULT_GEN_SEED_OFFSET", "LOSS_TRAIN_SEED_OFFSET", "LOSS_TEST_SEED_OFFSET"]

DEFAULT_GEN_SEED_OFFSET = 2_000_000
#: the PF-ODE samplers and precisions an evaluation accepts (:data:`SAMPLERS`, :data:`PRECISIONS`)
SamplerName = Literal[tuple(sorted(SAMPLERS))]
PrecisionName = Literal[tuple(PRECISIONS)]
LOSS_TRAIN_SEED_OFFSET = 20_000_000  # frozen (noise, sigma) of the i-th training sample
LOSS_TEST_SEED_OFFSET = 30_000_000  # ... of the i-th held-out sample
_CACHE_VERSION = 2  # 2: the precision is part of the key
#: the metrics registered by default: key -> reference (eq. 8)
DEFAULT_METRICS = {"e_gen": "teacher", "e_mem": "empirical"}


# ----------------------------------------------------------------------------- results
@dataclass
class Reference:
    """A fixed flow on all M evaluation seeds: endpoints (M, *shape) and Psi features (M, F),
    float64 on CPU, with the cache key they were stored under."""

    name: str
    endpoints: torch.Tensor
    features: torch.Tensor
    cache_key: str


#: below this relative spread of the student's features over the evaluation seeds every seed
#: lands on the same endpoint: the model's outputs collapsed (a dead network: D(x, σ) constant)
COLLAPSE_SPREAD = 1e-10

@dataclass
class FlowResult:
    """What one :meth:`FlowEvaluation.evaluate` gives (:meth:`FlowEvaluation.measure` keeps it as ``raw``).

    Attributes:
        metrics: key -> float64 scalar, the same on every process: the registered metrics
            (``e_gen``, ``e_mem``, user keys), ``nonfinite`` and, with a loss, ``train_fixed``,
            ``test_fixed``, ``gap``.
        nonfinite: fraction of the M student endpoints (or their features) that are NaN/inf.
        seeds: the M evaluation seeds; ``shard``: the positions this process sampled.
        student, student_features: endpoints and features of the student, on this process's
            shard or, when ``gathered``, on all M seeds (global order).
        references: name -> :class:`Reference` (all M seeds).
        per_seed: key -> float64 (M,) per-seed squared distances d²_i of each PFD metric (eq. 4:
            E = sqrt(mean d²)), all M seeds in global order on every process (NaN rows for a
            non-finite student); ``metrics["<key>_se"]`` is the delta-method standard error
            sd(d²)/(2 E sqrt(M)).
    """

    metrics: Dict[str, torch.Tensor]
    nonfinite: float
    seeds: torch.Tensor
    shard: torch.Tensor
    student: torch.Tensor
    student_features: torch.Tensor
    references: Dict[str, Reference]
    gathered: bool = False
    per_seed: Dict[str, torch.Tensor] = field(default_factory=dict)
    #: the student features' total variance over the M seeds relative to their mean squared norm
    #: (0: every seed gives the same endpoint, a collapsed model; NaN when not measured)
    spread: float = math.nan

    def features(self) -> Dict[str, torch.Tensor]:
        """Psi features on all M seeds: ``{"student": ..., "teacher": ..., "empirical": ...}``
        (needs ``measure(..., gather=True)`` on several processes)."""
        if not self.gathered and len(self.shard) != len(self.seeds):
            raise ValueError("features: the student was measured on a shard; use measure(..., gather=True)")
        return {"student": self.student_features, **{k: r.features for k, r in self.references.items()}}

    def endpoints(self) -> Dict[str, torch.Tensor]:
        """PF-ODE endpoints on all M seeds, as :meth:`features`."""
        if not self.gathered and len(self.shard) != len(self.seeds):
            raise ValueError("endpoints: the student was measured on a shard; use measure(..., gather=True)")
        return {"student": self.student, **{k: r.endpoints for k, r in self.references.items()}}

    def sample_grid(self, num_images: int):
        """The PFD paper's Fig. 1 layout as a uint8 image (H, W) or (H, W, 3): rows student and
        each reference, columns this process's first ``num_images`` seeds. Returns (image, names)."""
        pos = self.shard if not self.gathered else torch.arange(len(self.seeds))
        n = min(int(num_images), len(pos))
        local = self.student[:n] if not self.gathered else self.student[pos[:n]]
        rows = [local.cpu()] + [r.endpoints[pos[:n]] for r in self.references.values()]
        img = (image_grid(torch.stack(rows)) * 255).round().to(torch.uint8).numpy()
        return (img[..., 0] if img.shape[-1] == 1 else img), ["student", *self.references]


def image_grid(rows: torch.Tensor, pad: int = 1) -> torch.Tensor:
    """(R, n, C, H, W) in [-1, 1] -> one (R*(H+pad)+pad, n*(W+pad)+pad, C) image in [0, 1]."""
    R, n, C, H, W = rows.shape
    x = (rows.to(torch.float32).nan_to_num(0.0).clamp(-1, 1) + 1) / 2
    canvas = torch.ones(C, R * (H + pad) + pad, n * (W + pad) + pad)
    for r in range(R):
        for c in range(n):
            top, left = pad + r * (H + pad), pad + c * (W + pad)
            canvas[:, top: top + H, left: left + W] = x[r, c]
    return canvas.permute(1, 2, 0)


@dataclass
class _Source:
    """A reference flow before it is computed: how to build its denoiser, and its fingerprint."""

    build: Callable[[Any], Any]
    fingerprint: str
    release: Callable[[], None] = field(default=lambda: None)


# ----------------------------------------------------------------------------- the evaluation
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class FlowEvaluation(Evaluation):
    """The per-epoch flow measurement as a plain object (module docstring).

    Args:
        train_data: the N training samples (N, *shape); the empirical reference and ``train_fixed``.
            None: bound later, from a datamodule (:meth:`prepare` / :meth:`bind_datamodule`).
        test_data: held-out samples for ``test_fixed`` (None: no test loss).
        teacher: the teacher denoiser D(x, sigma) (the ``"teacher"`` reference); None: no E_gen.
        teacher_fingerprint: a string identifying the teacher (its cache key); default
            ``teacher.fingerprint()``.
        train_fingerprint: identifies the training set; default a hash of ``train_data``.
        num_eval: M, the number of evaluation seeds; ``seed_offset``: the first one (None: the
            datamodule's ``gen_seed_offset``, else 2_000_000). ``seeds``: explicit seeds instead
            (overrides both).
        settings: the one PF-ODE solver of every flow (default: Heun-18 in fp32, eager, or with a
            datamodule the model's solver with the ``sampler`` / ``sigmas`` / ``precision``
            overrides); its ``compile`` mode compiles the student's denoiser (module docstring).
        compile: the student's torch.compile mode (None: the settings', under the measurement
            contract the model's ``sample_compile``).
        descriptor: Psi (None / "identity", "efficientnet_lite0", a TorchScript path, a module).
        batch_size: samples per sampler batch; ``chunk_size``: training-set chunk of the empirical
            denoiser (memory knobs).
        num_loss_samples: leading training / held-out samples of the frozen-noise losses (None: all).
        use_cache: read / write the reference cache (``$LIGHTNING_PFD_CACHE/pfd``).
        comm: the :class:`~lightning_pfd.evaluation.base.Comm` to shard over (default :class:`TorchDistributed`).
        default_metrics: register ``e_gen`` (teacher) and ``e_mem`` (empirical) PFDs.
        metrics: extra metrics, key -> ``{class_path, init_args, reference}`` or a factory
            (:func:`metric_factory`), registered with :meth:`add_metric` at every binding.
        num_images: columns of the sample grid figure of :meth:`measure` (None: no grid).

    Ranges are declared in the signature (:mod:`lightning_pfd.validation`). Bad values raise
    :class:`~lightning_pfd.errors.ConfigError` here, before any sampling; the descriptor is tried
    on two training samples.

    Under the measurement contract (:mod:`lightning_pfd.evaluation.base`), :meth:`prepare` binds
    the datamodule and the model once (:meth:`reset` forgets them) and computes or loads the
    references; :meth:`measure` returns every metric of :meth:`evaluate` (leaves ``e_gen``,
    ``e_mem``, ``e_gen_se``, ..., the losses and user metrics under their own keys), the per-seed
    d² of each PFD metric (PFD paper eq. 4) and, for image data, the sample grid ``samples``
    (rows student and each reference). The student is sampled through the model's ``generate``
    when the evaluation uses the model's own solver.
    """

    #: leaf -> logged key of a monitor without a namespace (``name=None``); with one: ``<name>/<leaf>``
    DEFAULT_KEYS = {"e_gen": "pfd/e_gen", "e_mem": "pfd/e_mem", "e_gen_se": "pfd/e_gen_se",
                    "e_mem_se": "pfd/e_mem_se", "nonfinite": "pfd/nonfinite",
                    "samples": "pfd/samples", "train_fixed": "loss/train_fixed",
                    "test_fixed": "loss/test_fixed", "gap": "loss/gap"}

    def __init__(self, train_data: Optional[torch.Tensor] = None, *, test_data: Optional[torch.Tensor] = None,
                 teacher: Any = None, teacher_fingerprint: Optional[str] = None,
                 train_fingerprint: Optional[str] = None, num_eval: PositiveInt = 1024,
                 seed_offset: Optional[NonNegativeInt] = None, seeds: Optional[Sequence[int]] = None,
                 settings: Optional[SamplerSettings] = None, sampler: Optional[SamplerName] = None,
                 sigmas: Optional[Sequence[float]] = None, precision: Optional[PrecisionName] = None,
                 compile: Union[bool, str, None] = None, descriptor: Any = None,
                 batch_size: PositiveInt = 256, chunk_size: PositiveInt = 4096,
                 num_loss_samples: Optional[PositiveInt] = 1024,
                 use_cache: bool = True, comm: Optional[Comm] = None, default_metrics: bool = True,
                 metrics: Optional[Dict[str, Any]] = None, num_images: Optional[PositiveInt] = None):
        check_args(FlowEvaluation.__init__, locals())
        if compile is not None:
            check_compile(compile, "compile")
        if settings is not None and not isinstance(settings, SamplerSettings):
            raise ConfigError("settings", "must be a SamplerSettings", value=type(settings).__name__)
        if seeds is not None:
            seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
            if len(seeds) == 0:
                raise ConfigError("seeds", "needs at least one seed", value=[])
        self.comm = comm if comm is not None else TorchDistributed()
        self._seed_args = (num_eval, seed_offset, seeds)
        self.num_eval = len(seeds) if seeds is not None else num_eval
        check_memory("num_eval", self.num_eval, 8.0 * self.num_eval, "its list of int64 seeds")
        self.seeds = seeds if seeds is not None else torch.arange(
            _first_seed(seed_offset), _first_seed(seed_offset) + num_eval)
        self._check_world(self.comm.world)
        self.settings = settings or SamplerSettings()
        self._explicit_settings = settings
        self.sampler, self.sigmas, self.precision, self.compile = sampler, sigmas, precision, compile
        self.batch_size, self.chunk_size, self.num_loss_samples = batch_size, chunk_size, num_loss_samples
        self.use_cache, self.default_metrics, self.num_images = bool(use_cache), default_metrics, num_images
        self.descriptor_spec = descriptor
        self.descriptor = build_descriptor(descriptor)  # fails now if unavailable
        self.user_metrics = {k: metric_factory(v, f"metrics.{k}") for k, v in (metrics or {}).items()}
        self.train_data: Optional[torch.Tensor] = None
        self.shape: tuple = ()
        self._sources: Dict[str, _Source] = {}
        self._metrics: Dict[str, tuple] = {}  # key -> (factory, reference)
        self._references: Dict[str, Reference] = {}
        if train_data is not None:
            self.bind(train_data, test_data=test_data, teacher=teacher, teacher_fingerprint=teacher_fingerprint,
                      train_fingerprint=train_fingerprint)

    # ------------------------------------------------------------------ binding the data
    def bind(self, train_data: torch.Tensor, *, test_data: Optional[torch.Tensor] = None, teacher: Any = None,
             teacher_fingerprint: Optional[str] = None, train_fingerprint: Optional[str] = None) -> None:
        """Measure against ``train_data`` (and ``teacher``): the references, the default metrics
        and the configured ``metrics`` are set up again; the references are computed on first use."""
        if train_data is None or len(train_data) == 0:
            raise ConfigError("data", "FlowEvaluation needs a non-empty training set (train_data)",
                              value=None if train_data is None else tuple(train_data.shape))
        self.train_data, self.test_data = train_data, test_data
        self.shape = tuple(int(d) for d in train_data.shape[1:])
        self._check_descriptor(train_data)
        self._sources, self._metrics, self._references = {}, {}, {}
        if teacher is not None:
            self.add_reference("teacher", teacher, self._teacher_fingerprint(teacher, teacher_fingerprint))
        self._sources["empirical"] = _Source(
            lambda device: EmpiricalDenoiser(self.train_data, chunk_size=self.chunk_size).to(device),
            str(train_fingerprint or hash_key(train_data)))
        if self.default_metrics:
            for key, ref in DEFAULT_METRICS.items():
                if ref in self._sources:
                    self.add_metric(key, ProbabilityFlowDistance, reference=ref)
        for key, (factory, reference) in self.user_metrics.items():
            self.add_metric(key, factory, reference)

    def bind_datamodule(self, datamodule: Any, model: Any = None, compile: Union[bool, str, None] = None) -> None:
        """:meth:`bind` the data of ``datamodule`` (after ``setup``) for ``model`` (a sigma-space
        model: ``denoiser``, ``loss_fn``): its ``train_data``, ``val_data``, ``teacher``,
        ``teacher_fingerprint``, ``fingerprint()`` and evaluation range (``gen_seed_offset``,
        ``n_gen``). The solver is the ``settings`` given, else the model's
        (:meth:`SamplerSettings.from_module` with the ``sampler`` / ``sigmas`` / ``precision``
        overrides); ``compile`` (None: this evaluation's, else the settings') sets its
        torch.compile mode for the student. A teacher datamodule whose own solver
        (``teacher_sigmas``, ``sampler``) differs is refused (E_gen would compare two solvers)."""
        num_eval, seed_offset, seeds = self._seed_args
        data = train_data_of(datamodule, "FlowEvaluation")
        if model is not None:
            check_sigma_space_model(model)
        settings = self._explicit_settings or SamplerSettings.from_module(
            model, sampler=self.sampler, sigmas=self.sigmas, precision=self.precision)
        mode = self.compile if compile is None else compile
        if mode is not None:
            settings = replace(settings, compile=check_compile(mode, "compile"))
        dim, n = int(data[0].numel()), self.num_eval
        check_memory("num_eval", n, 32.0 * n * dim, f"four float64 arrays of {n} x {dim}: latents, teacher, "
                     "empirical and student endpoints")  # before the n_gen check: the first problem
        if seeds is None:
            _check_n_gen(datamodule, num_eval)
            offset = seed_offset if seed_offset is not None else int(
                getattr(datamodule, "gen_seed_offset", DEFAULT_GEN_SEED_OFFSET))
            self.seeds = torch.arange(offset, offset + num_eval)
        teacher, teacher_fp = getattr(datamodule, "teacher", None), None
        if teacher is not None:
            fp = getattr(datamodule, "teacher_fingerprint", None) or getattr(teacher, "fingerprint", None)
            if not callable(fp):
                raise ConfigError("data.teacher", "needs a fingerprint() method (it keys the endpoint cache)",
                                  value=type(teacher).__name__)
            teacher_fp = str(fp())
            check_one_solver(settings, datamodule, teacher,
                             overridden={a for a, v in (("sampler", self.sampler), ("sigmas", self.sigmas))
                                         if v is not None})
        self.settings = settings
        train_fp = datamodule.fingerprint() if callable(getattr(datamodule, "fingerprint", None)) else None
        self.bind(data, test_data=getattr(datamodule, "val_data", None), teacher=teacher,
                  teacher_fingerprint=teacher_fp, train_fingerprint=train_fp)

    @classmethod
    def from_datamodule(cls, datamodule: Any, model: Any = None, **kwargs) -> "FlowEvaluation":
        """An evaluation of ``model`` on the data of ``datamodule`` (:meth:`bind_datamodule`);
        ``kwargs``: the arguments of the constructor but the data."""
        ev = cls(None, **kwargs)
        ev.bind_datamodule(datamodule, model)
        return ev

    def _check_world(self, world: int) -> None:
        if self.num_eval < world:  # an empty shard would hang the gathers
            raise ConfigError("num_eval", f"{self.num_eval} evaluation seeds for world size {world}: "
                              "every rank needs at least one", value=self.num_eval,
                              accepted=f"an integer >= the world size ({world})")

    # ------------------------------------------------------------------ the measurement contract
    def key(self, leaf: str, name: Optional[str]) -> str:
        """The logged name of ``leaf`` under the namespace ``name`` (:attr:`DEFAULT_KEYS` without
        one); a user metric's key as it is."""
        if leaf not in self.DEFAULT_KEYS:
            return leaf
        return self.DEFAULT_KEYS[leaf] if name is None else f"{name}/{leaf}"

    def leaves(self) -> List[str]:
        return [*self.DEFAULT_KEYS, *self.user_metrics]

    def metric_keys(self, key: Callable[[str], str]) -> List[Any]:
        """The keys of the configured ``metrics`` (:func:`lightning_pfd.keys.collect`), each read
        from its metric's class (:meth:`lightning_pfd.keys.MetricKey.from_metric`)."""
        from .. import keys

        return [keys.MetricKey.from_metric(k, factory) for k, (factory, _) in self.user_metrics.items()]

    def state_key_args(self) -> Dict[str, Any]:
        spec = self.descriptor_spec
        desc = "identity" if spec is None else spec if isinstance(spec, str) else type(spec).__name__
        return {"descriptor": desc, "num_eval": self.num_eval}

    def compile_mode(self, model: Any) -> Union[bool, str]:
        """The student's torch.compile mode: ``compile``, else the model's ``sample_compile``."""
        if self.compile is not None:
            return self.compile
        return check_compile(getattr(model, "sample_compile", False), "model.sample_compile")

    def reset(self) -> None:
        """Forget the data (the next :meth:`prepare` binds the datamodule again)."""
        self.train_data = None

    def check(self, datamodule: Any, model: Any, comm: Comm = SINGLE) -> None:
        """Bind the datamodule and the model (every ConfigError of :meth:`bind_datamodule`), and
        refuse a sample grid wider than the seeds rank 0 evaluates."""
        self._check_world(comm.world)
        self.bind_datamodule(datamodule, model, self.compile_mode(model))
        on_rank0 = len(range(0, self.num_eval, comm.world))
        if self.draws_grid() and self.num_images > on_rank0:
            raise ConfigError("num_images", f"the sample grid has more columns than the {on_rank0} seeds "
                              f"rank 0 evaluates (num_eval = {self.num_eval}, world size {comm.world})",
                              value=self.num_images, accepted=f"an integer in [1, {on_rank0}]")

    def prepare(self, datamodule: Any, model: Any, comm: Comm = SINGLE) -> None:
        """Measure with ``comm``; bind the datamodule and the model (again when the datamodule's
        ``train_data`` is another tensor); take the precision the model asks for on its device
        now; compute (or load) the references."""
        self._check_world(comm.world)
        self.comm = comm
        data = getattr(datamodule, "train_data", None) if datamodule is not None else None
        if self.train_data is None or (data is not None and data is not self.train_data):
            self.bind_datamodule(datamodule, model, self.compile_mode(model))
        self._follow_model_precision(model)
        self.compute_references(model.device)  # teacher / empirical endpoints: cached, once

    def _follow_model_precision(self, model: Any) -> None:
        """A precision derived from the model (bf16 when its ``sample_autocast`` is set and it is
        on CUDA: known once Lightning moved it to its device, after ``setup``) is read again at
        each measurement; references computed in another precision are dropped (the cache keeps
        one entry per precision)."""
        if self._explicit_settings is not None or self.precision is not None:
            return
        want = SamplerSettings.from_module(model).precision
        if want != self.settings.precision:
            self.settings = replace(self.settings, precision=want)
            self._references = {}

    def __getstate__(self) -> Dict[str, Any]:
        """A copy (``ddp_spawn`` pickles the callbacks) is unbound, as after :meth:`reset`:
        each process binds its own data and computes or loads its references."""
        return {**self.__dict__, "train_data": None, "test_data": None, "_sources": {}, "_metrics": {},
                "_references": {}}

    def draws_grid(self) -> bool:
        """A sample grid is configured and the data are images (C, H, W) with C in (1, 3)."""
        return bool(self.num_images) and len(self.shape) == 3 and self.shape[0] in (1, 3)

    def _generate(self, model: Any) -> Optional[Callable]:
        """The model's own ``generate`` when the evaluation's solver is the model's."""
        own = (self.sigmas is None and self.precision is None and self._explicit_settings is None
               and hasattr(model, "generate")
               and self.settings.compile == check_compile(getattr(model, "sample_compile", False)))
        if not own:
            return None
        return functools.partial(model.generate, sampler=self.settings.sampler, batch_size=self.batch_size)

    @torch.no_grad()
    def measure(self, model: Any, comm: Optional[Comm] = None) -> Measurement:
        """Every metric of :meth:`evaluate` on the sigma-space ``model`` (its ``denoiser``,
        ``loss_fn``, ``generate``), sharded over this evaluation's processes (``comm``, when
        given, must be the one it was prepared with)."""
        if comm is not None and (comm.rank, comm.world) != (self.comm.rank, self.comm.world):
            raise ConfigError("comm", "differs from the processes this evaluation was prepared with",
                              value=(comm.rank, comm.world), accepted=[(self.comm.rank, self.comm.world)])
        res = self.evaluate(model.denoiser, loss_fn=model.loss_fn, generate=self._generate(model), device=model.device)
        units = {k: Units("sq_dist", sq, res.seeds, res.metrics[k]) for k, sq in res.per_seed.items()}
        figures = {}
        if self.draws_grid():
            def grid(epoch: int):
                img, names = res.sample_grid(self.num_images)
                return img, " / ".join(names) + f" rows, epoch {epoch}"
            figures["samples"] = grid
        bad = NonFinite(res.nonfinite, "student endpoints", [k for k in res.metrics if k in self.flow_metric_keys()])
        collapsed = None
        if res.spread == res.spread and res.spread < COLLAPSE_SPREAD:
            collapsed = (f"every evaluation seed gives the same student endpoint (feature variance over the "
                         f"seeds {res.spread:.2g} of their squared norm, below {COLLAPSE_SPREAD:g})")
        return Measurement(dict(res.metrics), units=units, figures=figures, nonfinite=bad, raw=res,
                           collapsed=collapsed)

    def _teacher_fingerprint(self, teacher, fingerprint) -> str:
        if fingerprint is None:
            fp = getattr(teacher, "fingerprint", None)
            if not callable(fp):
                raise ConfigError("data.teacher", "needs a fingerprint() method (it keys the endpoint cache)",
                                  value=type(teacher).__name__)
            fingerprint = fp()
        return str(fingerprint)

    @torch.no_grad()
    def _check_descriptor(self, data: torch.Tensor) -> None:
        """Psi must map two samples shaped like the data (endpoints have the data's shape) to (2, F)."""
        try:
            feats = self.features(data[:2].to(torch.float64))
        except Exception as e:  # a descriptor built for other data (e.g. an image net on vectors)
            raise ConfigError("descriptor", f"fails on samples of shape {self.shape}: "
                              f"{type(e).__name__}: {e}", value=self.descriptor_spec) from e
        if feats.ndim != 2 or feats.shape[0] != min(2, len(data)):
            raise ConfigError("descriptor", "must map a batch (B, ...) to features (B, F); "
                              f"got shape {tuple(feats.shape)}", value=self.descriptor_spec)

    # ------------------------------------------------------------------ registration
    def add_reference(self, name: str, denoiser: Any, fingerprint: str) -> None:
        """A fixed flow to compare against: ``denoiser(x, sigma)`` on the evaluation's solver.
        ``fingerprint`` must identify it (it keys the cache). Moved to the sampling device while
        its endpoints are computed, then back to the CPU (an ``nn.Module``)."""
        if not isinstance(name, str) or not name or name in self._sources:
            raise ConfigError("reference", "needs a new, non-empty name", value=name,
                              accepted=f"a name other than {sorted(self._sources)}")
        is_module = isinstance(denoiser, torch.nn.Module)
        self._sources[name] = _Source(lambda device: denoiser.to(device) if is_module else denoiser, str(fingerprint),
                                      (lambda: denoiser.to("cpu")) if is_module else (lambda: None))
        self._references.pop(name, None)

    def add_metric(self, key: str, metric: Callable[..., Any], reference: str = "teacher") -> None:
        """Compute ``metric`` between student and ``reference`` features at every :meth:`measure`
        under ``key`` (module docstring: the metric contract). ``metric`` is a factory, e.g. a
        torchmetrics ``Metric`` subclass or ``functools.partial(MyMetric, num_projections=64)``."""
        if not isinstance(key, str) or not key or key != key.strip():
            raise ConfigError("metrics", "a metric key must be a non-empty string", value=key)
        if key in self._metrics or key in ("nonfinite", "train_fixed", "test_fixed", "gap"):
            raise ConfigError(f"metrics.{key}", "this key is already measured", value=key)
        if reference not in self._sources:
            raise ConfigError(f"metrics.{key}.reference", "no such reference flow in this evaluation "
                              "(\"teacher\" needs a datamodule with a teacher)", value=reference,
                              accepted=sorted(self._sources))
        if not callable(metric):
            raise ConfigError(f"metrics.{key}", "must be a metric factory (a class or a callable)",
                              value=type(metric).__name__)
        probe = metric()
        if not (callable(getattr(probe, "update", None)) and callable(getattr(probe, "compute", None))):
            raise ConfigError(f"metrics.{key}", "the factory must make an object with update(student, "
                              "reference) and compute()", value=type(probe).__name__)
        self._metrics[key] = (metric, reference)

    def flow_metric_keys(self) -> List[str]:
        """The registered metrics between student and a reference (NaN for a non-finite student)."""
        return list(self._metrics)

    def metric_reference(self, key: str) -> str:
        return self._metrics[key][1]

    # ------------------------------------------------------------------ references
    @property
    def references(self) -> Dict[str, Reference]:
        """The computed references (empty before :meth:`prepare` / :meth:`measure`)."""
        return dict(self._references)

    def cache_key(self, name: str) -> str:
        """The hash of everything reference ``name`` depends on (seeds, shape, solver incl.
        precision, denoiser fingerprint, descriptor)."""
        s = self.settings
        return hash_key("pfd-reference", _CACHE_VERSION, name, self._sources[name].fingerprint, self.seeds,
                        list(self.shape), s.sampler, s.sigmas(), s.precision,
                        descriptor_fingerprint(self.descriptor))

    @torch.no_grad()
    def compute_references(self, device: Any = None) -> Dict[str, Reference]:
        """Compute (or load) every reference not computed yet; every process must call it."""
        device = torch.device("cpu") if device is None else torch.device(device)
        for name in self._sources:
            if name not in self._references:
                self._references[name] = self._reference(name, device)
        return self.references

    def _reference(self, name: str, device: torch.device) -> Reference:
        key = self.cache_key(name)
        path = cache_dir() / "pfd" / f"{name}_{key[:32]}.pt"
        hit = load_tensor_verified(path, key) if self.use_cache else None
        ok = hit is not None and hit["endpoints"].shape[0] == self.num_eval
        if self._all_true(ok, device):  # every process: the same branch (collectives below)
            return Reference(name, hit["endpoints"], hit["features"], key)
        src, shard = self._sources[name], self._shard()
        try:  # once per cache key: eager (the empirical denoiser's candidate search does not compile)
            ends = replace(self.settings, compile=False).sample(src.build(device), self.seeds[shard], self.shape,
                                                                batch_size=self.batch_size, device=device,
                                                                out_device=device)
        finally:
            src.release()
        feats = self.features(ends)
        ends = self.comm.gather_rows(ends, self.num_eval).cpu()
        feats = self.comm.gather_rows(feats, self.num_eval).cpu()
        if self.use_cache and self.comm.rank == 0:
            save_tensor_atomic(path, {"endpoints": ends, "features": feats}, key)
        return Reference(name, ends, feats, key)

    # ------------------------------------------------------------------ measurement
    @torch.no_grad()
    def features(self, endpoints: torch.Tensor) -> torch.Tensor:
        """Psi of endpoints (B, *shape) -> (B, F) float64, in batches of ``batch_size``. The
        identity descriptor returns a flat view of float64 endpoints (no copy: M x D memory)."""
        if isinstance(self.descriptor, IdentityDescriptor):
            return endpoints.reshape(endpoints.shape[0], -1).to(torch.float64)
        psi = self.descriptor.to(endpoints.device)
        feats = [psi(b).reshape(b.shape[0], -1).to(torch.float64) for b in endpoints.split(self.batch_size)]
        if not feats:
            return torch.empty(0, 0, dtype=torch.float64, device=endpoints.device)
        return torch.cat(feats)

    @torch.no_grad()
    def sample_student(self, denoiser: Any, device: Any = None) -> torch.Tensor:
        """The student's endpoints on this process's shard, with the evaluation's solver (compiled
        with ``settings.compile``)."""
        device = module_device(denoiser, torch.device("cpu")) if device is None else torch.device(device)
        return self.settings.sample(denoiser, self.seeds[self._shard()], self.shape,
                                    batch_size=self.batch_size, device=device, out_device=device)

    @torch.no_grad()
    def evaluate(self, denoiser: Any, *, loss_fn: Optional[Callable] = None,
                generate: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                device: Any = None, gather: bool = False) -> FlowResult:
        """Sample the student on this process's seeds and compute every metric (module docstring).

        Args:
            denoiser: the student's sigma-space denoiser D(x, sigma).
            loss_fn: ``loss_fn(denoiser, y, seeds=...) -> per-sample loss``; with it the
                frozen-noise ``train_fixed``, ``test_fixed`` and ``gap`` are measured.
            generate: ``generate(seeds) -> endpoints`` replacing the evaluation's own sampling of
                the student (a model's ``generate``; it must use the same solver).
            device: where to sample (default: the denoiser's).
            gather: gather the student's endpoints and features on every process (sweeps).
        """
        device = module_device(denoiser, torch.device("cpu")) if device is None else torch.device(device)
        if self.train_data is None:
            raise ConfigError("train_data", "no training set: pass train_data or call prepare(datamodule, model)")
        refs = self.compute_references(device)
        shard = self._shard()
        student = (generate(self.seeds[shard]) if generate is not None else self.sample_student(denoiser, device))
        student = student.to(device=device, dtype=torch.float64)
        bad = ~torch.isfinite(student.reshape(student.shape[0], -1)).all(1)
        feats = self.features(torch.nan_to_num(student) if bool(bad.any()) else student)  # NaN rows: counted, not used
        bad |= ~torch.isfinite(feats.reshape(feats.shape[0], -1)).all(1).to(bad.device)
        n_bad = float(self.comm.all_sum(bad.sum().reshape(1).to(device))[0])
        spread = self._spread(feats, bad)
        metrics = self._metric_values(feats, shard, n_bad > 0, device)
        per_seed = self._per_seed(feats, shard, n_bad > 0, device)
        metrics.update({f"{k}_se": pfd_standard_error(v) for k, v in per_seed.items()})
        metrics["nonfinite"] = torch.tensor(n_bad / self.num_eval, dtype=torch.float64, device=device)
        if loss_fn is not None:
            metrics.update(self._losses(denoiser, loss_fn, device))
        if gather:
            student = self.comm.gather_rows(student, self.num_eval)
            feats = self.comm.gather_rows(feats, self.num_eval)
        return FlowResult(metrics, n_bad / self.num_eval, self.seeds, shard, student, feats, refs,
                          gathered=gather or self.comm.world == 1, per_seed=per_seed, spread=spread)

    def _spread(self, feats: torch.Tensor, bad: torch.Tensor) -> float:
        """Total variance of the finite student features over every process's seeds, over their
        mean squared norm (:attr:`FlowResult.spread`): one all-reduce of (count, sum, sum of
        squares)."""
        f = feats.reshape(feats.shape[0], -1)[~bad.to(feats.device)]
        stats = torch.cat([torch.tensor([float(f.shape[0])], dtype=torch.float64, device=feats.device),
                           f.sum(0), (f * f).sum(0)])
        stats = self.comm.all_sum(stats)
        n, d = float(stats[0]), f.shape[1]
        if n < 2:
            return math.nan
        mean, sq = stats[1:1 + d] / n, stats[1 + d:] / n
        var = float((sq - mean * mean).clamp_min(0).sum())
        norm = float(sq.sum())
        return var / norm if norm > 0 else 0.0

    def pfd_metric_keys(self) -> List[str]:
        """The registered metrics that are the PFD of eq. 4 (they have per-seed distances)."""
        return [k for k, (factory, _) in self._metrics.items()
                if getattr(factory, "func", factory) is ProbabilityFlowDistance
                and not getattr(factory, "keywords", {}).get("per_dimension", False)
                and getattr(factory, "keywords", {}).get("descriptor") is None]

    def _per_seed(self, feats: torch.Tensor, shard: torch.Tensor, nonfinite: bool,
                  device: torch.device) -> Dict[str, torch.Tensor]:
        """Per-seed squared distances of every PFD metric, gathered on every process (M,)."""
        out: Dict[str, torch.Tensor] = {}
        for key in self.pfd_metric_keys():
            if nonfinite:
                out[key] = torch.full((self.num_eval,), math.nan, dtype=torch.float64)
                continue
            ref = self._references[self._metrics[key][1]].features
            sq = paired_sq_distances(feats, ref[shard].to(feats.device))
            out[key] = self.comm.gather_rows(sq.reshape(-1, 1), self.num_eval).reshape(-1).cpu()
        return out

    def _metric_values(self, feats: torch.Tensor, shard: torch.Tensor, nonfinite: bool,
                       device: torch.device) -> Dict[str, torch.Tensor]:
        """Each registered metric on (student, reference) features; all NaN for a non-finite
        student (the decision is global, so every process calls the same collectives)."""
        out: Dict[str, torch.Tensor] = {}
        for key, (factory, ref) in self._metrics.items():
            if nonfinite:
                out[key] = torch.tensor(math.nan, dtype=torch.float64, device=device)
                continue
            m = factory(dist_sync_fn=self.comm.gather_all, distributed_available_fn=self.comm.distributed)
            m = m.to(device) if hasattr(m, "to") else m
            ref_feats = self._references[ref].features
            for lo in range(0, len(shard), self.batch_size):  # memory O(batch x F), not O(M x F)
                hi = lo + self.batch_size
                m.update(feats[lo:hi], ref_feats[shard[lo:hi]].to(device))
            value = m.compute()
            if isinstance(value, dict):
                out.update({f"{key}/{k}": torch.as_tensor(v, dtype=torch.float64) for k, v in value.items()})
            else:
                out[key] = torch.as_tensor(value, dtype=torch.float64)
        return out

    def _losses(self, denoiser, loss_fn, device) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        l_train = self.frozen_loss(denoiser, loss_fn, self.train_data, LOSS_TRAIN_SEED_OFFSET, device)
        l_test = self.frozen_loss(denoiser, loss_fn, self.test_data, LOSS_TEST_SEED_OFFSET, device)
        if l_train is not None:
            out["train_fixed"] = l_train
        if l_test is not None:
            out["test_fixed"] = l_test
            if l_train is not None:
                out["gap"] = l_test - l_train
        return out

    @torch.no_grad()
    def frozen_loss(self, denoiser, loss_fn: Callable, data: Optional[torch.Tensor], seed_offset: int,
                    device: Any = None) -> Optional[torch.Tensor]:
        """Mean per-sample loss with (noise, sigma) frozen per sample (PFD paper App. C.6): sample
        i uses seed ``seed_offset + i``; sharded over processes, float64 sums reduced exactly."""
        if data is None or len(data) == 0:
            return None
        n = len(data) if self.num_loss_samples is None else min(len(data), self.num_loss_samples)
        idx = sharding.shard_indices(n, self.comm.rank, self.comm.world)
        acc = torch.zeros(2, dtype=torch.float64, device=device)  # (sum, count)
        for b in idx.split(self.batch_size):
            per = loss_fn(denoiser, data[b].to(device), seeds=seed_offset + b)
            acc += torch.stack([per.detach().to(acc).sum(), acc.new_tensor(float(per.numel()))])
        total, count = self.comm.all_sum(acc)
        return total / count if float(count) > 0 else torch.tensor(math.nan, dtype=torch.float64, device=device)

    # ------------------------------------------------------------------ processes
    def _shard(self) -> torch.Tensor:
        return sharding.shard_indices(self.num_eval, self.comm.rank, self.comm.world)

    def _all_true(self, flag: bool, device) -> bool:
        return self.comm.all_true(flag, device)


def pfd_standard_error(sq: torch.Tensor) -> torch.Tensor:
    """Delta-method standard error of E = sqrt(mean d²) from per-seed d² (M,):
    sd(d²) / (2 E sqrt(M)) (float64 scalar; NaN for fewer than 2 or non-finite seeds)."""
    sq = sq.to(torch.float64)
    m = sq.numel()
    if m < 2 or not bool(torch.isfinite(sq).all()):
        return torch.tensor(math.nan, dtype=torch.float64)
    e = sq.mean().sqrt()
    if float(e) == 0.0:
        return torch.zeros((), dtype=torch.float64)
    return sq.std(unbiased=True) / (2.0 * e * math.sqrt(m))


def metric_factory(spec: Any, field: str = "metrics") -> tuple:
    """``(factory, reference)`` from a config entry ``{"class_path": "pkg.mod.Class" (or the class
    itself), "init_args": {...}, "reference": "teacher"}`` (``reference`` defaults to
    ``"teacher"``): the form a YAML config gives a user metric. The class is imported now and
    checked to be a class with ``update`` and ``compute`` before anything is called, so a wrong
    path, or a ``class_path`` naming a function such as ``os.system``, fails before any work."""
    if callable(spec) and not isinstance(spec, dict):
        return spec, "teacher"
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise ConfigError(field, "a metric needs {class_path, init_args, reference}", value=spec,
                          accepted="{class_path: pkg.module.Class, init_args: {...}, reference: teacher}")
    extra = set(spec) - {"class_path", "init_args", "reference"}
    if extra:
        raise ConfigError(field, f"unknown entries {sorted(extra)}", value=sorted(spec),
                          accepted=["class_path", "init_args", "reference"])
    cls = load_class(spec["class_path"], object, f"{field}.class_path")  # a class, nothing called
    if not all(callable(getattr(cls, m, None)) for m in ("update", "compute")):
        raise ConfigError(f"{field}.class_path", "names a class without update(student, reference) and "
                          "compute(): not a metric", value=spec["class_path"],
                          accepted="a metric class, e.g. a torchmetrics.Metric subclass")
    init_args = dict(spec.get("init_args") or {})
    return functools.partial(cls, **init_args), str(spec.get("reference", "teacher"))


# ----------------------------------------------------------------------------- setup checks
def check_sigma_space_model(model: Any) -> None:
    """A sigma-space model exposes ``denoiser`` and ``loss_fn`` (PFD compares PF-ODE maps)."""
    if not hasattr(model, "denoiser") or not hasattr(model, "loss_fn"):
        raise ConfigError("model", f"FlowEvaluation needs a sigma-space denoiser: {type(model).__name__} "
                          "has no `denoiser` / `loss_fn` (PFD compares PF-ODE maps of sigma-space denoisers)",
                          value=type(model).__name__,
                          accepted="lightning_pfd.modules.DiffusionModule (family 'edm' or 'vp'), or any "
                                   "LightningModule exposing a sigma-space EMA denoiser `denoiser` and `loss_fn`",
                          suggestion="for LevyItoModule use TailMonitor and MemorizationMonitor")


def _first_seed(seed_offset: Optional[int]) -> int:
    return DEFAULT_GEN_SEED_OFFSET if seed_offset is None else int(seed_offset)


def _check_n_gen(datamodule: Any, num_eval: Any) -> None:
    n_gen = getattr(datamodule, "n_gen", None)
    if n_gen is not None and _is_int(num_eval) and num_eval > int(n_gen):
        raise ConfigError("num_eval", f"exceeds the datamodule's reserved evaluation range n_gen = {n_gen} "
                          "(the evaluation seeds must stay disjoint from the training / test seeds)",
                          value=num_eval, accepted=f"an integer in [1, {n_gen}]",
                          suggestion="lower num_eval or raise the datamodule's n_gen")


_GRID_ARGS = ("num_steps", "sigma_min", "sigma_max", "rho")


def check_one_solver(settings: SamplerSettings, datamodule: Any, teacher: Any, overridden=frozenset()) -> None:
    """Refuse a teacher datamodule whose solver (``teacher_sigmas``, ``sampler``: the one that
    generated the training set) differs from ``settings``: E_gen would compare endpoints of two
    solvers. ``overridden``: the arguments (``sampler``, ``sigmas``) the caller set itself, named
    by their bare names in the error; the others are the model's (``model.sampler``,
    ``model.num_steps``, ``model.sigma_min``, ``model.sigma_max``, ``model.rho``)."""
    t_grid = getattr(datamodule, "teacher_sigmas", None)
    if t_grid is None:  # e.g. an exact GMM law: its flow is computed on the student's grid
        return
    t_grid = SamplerSettings(grid=tuple(torch.as_tensor(t_grid, dtype=torch.float64).tolist())).sigmas(teacher)
    student = settings.sigmas(teacher)
    t_sampler = getattr(datamodule, "sampler", None)
    t_sampler = t_sampler if isinstance(t_sampler, str) else settings.sampler
    same = same_grid(student, t_grid)
    if same and settings.sampler == t_sampler:
        return
    theirs_settings = SamplerSettings.from_hparams(datamodule, grid=t_grid, sampler=t_sampler)
    ours, theirs = _describe(settings), _describe(theirs_settings)
    if ours == theirs:  # same settings, different effective grids (clamped to other ranges)
        ours = f"({settings.sampler}, {describe_grid(student)})"
        theirs = f"({t_sampler}, {describe_grid(t_grid)})"
    problem = (f"student and teacher flows need one PF-ODE grid and sampler, but the student's is {ours} "
               f"and the teacher data's is {theirs} (E_gen would compare endpoints of two different solvers)")
    if same:  # only the sampler differs
        name = "sampler" if "sampler" in overridden else "model.sampler"
        raise ConfigError(name, problem, value=settings.sampler, accepted=[t_sampler],
                          suggestion="use the same sampler in the model (or the monitor) and in the teacher datamodule")
    if "sigmas" in overridden:
        raise ConfigError("sigmas", problem, suggestion="drop the monitor's sigmas or give the teacher's grid")
    hp = _hparams(datamodule)
    arg = next((a for a in _GRID_ARGS if settings.grid is None and a in hp
                and float(getattr(settings, a)) != float(hp[a])), None)
    name = arg or "num_steps"
    raise ConfigError(f"model.{name}", problem,
                      value=getattr(settings, name) if settings.grid is None else None,
                      suggestion=f"set the model's {name} and the teacher datamodule's {name} to the same value")


def _describe(settings: SamplerSettings) -> str:
    """The solver without its precision (the teacher data are data, whatever the precision)."""
    return replace(settings, precision="fp32").describe()
