"""GeneralizationMonitor: E_gen, E_mem, the frozen-noise losses (and user flow metrics) every epoch.

When to measure (``every_n_epochs`` / ``schedule``, :mod:`lightning_pfd.callbacks.base`) and where to
log; *what* is measured is :class:`~lightning_pfd.evaluation.flow.FlowEvaluation`: the evaluation
seeds (``datamodule.gen_seed_offset``, default 2_000_000), one PF-ODE solver for student, teacher and
empirical flows (the model's, or ``sampler`` / ``sigmas`` / ``precision``), the cached references,
and ``pfd/e_gen``, ``pfd/e_mem`` (PFD paper eq. 8) with their standard errors ``pfd/e_gen_se``,
``pfd/e_mem_se`` (delta method over the seeds), ``pfd/nonfinite``, ``loss/train_fixed``,
``loss/test_fixed``, ``loss/gap`` (App. C.6). ``name`` moves these keys to ``<name>/e_gen``, ...
Extra metrics between student and a reference flow come from ``metrics`` (YAML)::

    metrics:
      sw/e_gen: {class_path: my_pkg.SlicedWasserstein, init_args: {num_projections: 64}, reference: teacher}

logged under their own key, whose meaning the metric's class declares
(:meth:`metric_keys`, :meth:`lightning_pfd.keys.MetricKey.from_metric`).
The per-seed squared distances of E_gen and E_mem of every measurement are kept in the run's
``per_unit/`` directory (:mod:`lightning_pfd.analysis.per_unit`; rank 0 writes), where the event
tests and ``report`` read them.
``compile`` (``true`` / a torch.compile mode) compiles the student's denoiser for its PF-ODE
(:class:`~lightning_pfd.diffusion.sampling.SamplerSettings`), ``false`` samples it eagerly; unset
(``null``, the default) it follows the module's ``sample_compile`` (off by default:
docs/performance.md).
Every ``image_every_n_epochs`` measured passes a grid of samples (rows: student and each
reference, like the paper's Fig. 1) goes to :meth:`~MeasurementCallback.log_figure`.

GeneralizationMonitor is :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor` on
:class:`~lightning_pfd.evaluation.flow.FlowMeasure` (the measurement contract), with the
arguments, metric names and checkpoint state key of this monitor.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Union


from .. import keys
from ..diffusion.sampling import check_compile
from ..errors import ConfigError, renamed_fields
from ..evaluation.base import strategy_comm
from ..evaluation.flow import FlowEvaluation, FlowMeasure, PrecisionName, SamplerName, metric_factory
from ..metrics.descriptors import build_descriptor
from ..validation import NonNegativeInt, PositiveInt, check_args
from .base import check_metric_prefix, check_unique_metric_names
from .monitor import EvaluationMonitor
from .state import callback_field

__all__ = ["GeneralizationMonitor"]

#: leaf -> logged key with the default namespace (``name=None``)
DEFAULT_KEYS = {"e_gen": "pfd/e_gen", "e_mem": "pfd/e_mem", "e_gen_se": "pfd/e_gen_se",
                "e_mem_se": "pfd/e_mem_se", "nonfinite": "pfd/nonfinite",
                "samples": "pfd/samples", "train_fixed": "loss/train_fixed",
                "test_fixed": "loss/test_fixed", "gap": "loss/gap"}

#: the config fields of the model's and the datamodule's arguments the flow evaluation reports
#: by their bare names (the monitor's own arguments are named through ``callback_field``)
OTHER_FIELDS = {"sampler": "model.init_args.sampler", "num_steps": "model.init_args.num_steps",
                "sigma_min": "model.init_args.sigma_min", "sigma_max": "model.init_args.sigma_max",
                "rho": "model.init_args.rho", "sample_compile": "model.init_args.sample_compile",
                "seed_offset": "data.init_args.gen_seed_offset"}


class GeneralizationMonitor(EvaluationMonitor):
    """Log E_gen, E_mem (PFD), frozen-noise losses, their gap and user ``metrics`` on schedule.

    ``num_eval`` (M), ``descriptor``, ``sampler`` / ``sigmas`` / ``precision`` / ``compile`` (None: the model's),
    ``batch_size``, ``chunk_size``, ``num_loss_samples``, ``use_cache``: as :class:`FlowEvaluation`; ``every_n_epochs`` /
    ``schedule``: callbacks.base; ``image_every_n_epochs`` (0: no sample grid), ``num_images``; ``name``: the
    metric namespace; ``metrics``: module docstring."""

    def __init__(self, num_eval: PositiveInt = 1024, every_n_epochs: int = 1, descriptor: Any = None,
                 sampler: Optional[SamplerName] = None, sigmas: Optional[Sequence[float]] = None,
                 batch_size: PositiveInt = 256, chunk_size: PositiveInt = 4096,
                 num_loss_samples: Optional[PositiveInt] = 1024,
                 image_every_n_epochs: NonNegativeInt = 10, num_images: PositiveInt = 8, use_cache: bool = True,
                 name: Optional[str] = None, schedule: Union[str, List[int]] = "every_n_epochs",
                 precision: Optional[PrecisionName] = None, metrics: Optional[Dict[str, Dict[str, Any]]] = None,
                 compile: Union[bool, str, None] = None):
        field = functools.partial(callback_field, self)
        with renamed_fields(field):
            check_args(GeneralizationMonitor.__init__, locals())
        check_compile(compile, field("compile"))
        super().__init__(None, every_n_epochs=every_n_epochs, schedule=schedule, figure_every_n=0)
        self.name = None if name is None else check_metric_prefix(self, "name", name)
        self.num_eval, self.descriptor_spec, self.descriptor = num_eval, descriptor, build_descriptor(descriptor)
        self.sampler, self.sigmas, self.precision, self.compile = sampler, sigmas, precision, compile
        self.batch_size, self.chunk_size, self.num_loss_samples = batch_size, chunk_size, num_loss_samples
        self.image_every_n_epochs, self.num_images, self.use_cache = image_every_n_epochs, num_images, use_cache
        self.figure_every_n = image_every_n_epochs  # the sample grid's schedule
        self.metrics = {k: metric_factory(v, f"{field('metrics')}.{k}") for k, v in (metrics or {}).items()}
        self.protocol = FlowMeasure(
            num_eval=num_eval, descriptor=self.descriptor, sampler=sampler, sigmas=sigmas, precision=precision,
            compile=compile, batch_size=batch_size, chunk_size=chunk_size, num_loss_samples=num_loss_samples,
            use_cache=use_cache, num_images=num_images, metrics=self.metrics, field=field)

    @property
    def evaluation(self) -> Optional[FlowEvaluation]:
        """This run's FlowEvaluation (built at fit / validation start; None before)."""
        return self.protocol.evaluation

    def key(self, leaf: str) -> str:
        """The logged name of ``leaf`` (``e_gen``, ``nonfinite``, ...); a user key as it is."""
        return leaf if leaf not in DEFAULT_KEYS else DEFAULT_KEYS[leaf] if self.name is None else f"{self.name}/{leaf}"

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in DEFAULT_KEYS] + list(self.metrics)

    def metric_keys(self) -> List[keys.MetricKey]:
        """The keys of the configured ``metrics`` (:func:`lightning_pfd.keys.collect`), each
        read from its metric's class (:meth:`lightning_pfd.keys.MetricKey.from_metric`)."""
        return [keys.MetricKey.from_metric(key, factory) for key, (factory, _) in self.metrics.items()]

    def _state_key_args(self) -> Dict[str, Any]:
        spec = self.descriptor_spec
        desc = "identity" if spec is None else spec if isinstance(spec, str) else type(spec).__name__
        return {"name": self.name or "pfd", "descriptor": desc, "num_eval": self.num_eval}

    def _build(self, trainer, pl_module, datamodule) -> FlowEvaluation:
        """The run's FlowEvaluation (it refuses a bad setup with a ConfigError, named by the
        config field of the model's or datamodule's argument at fault)."""
        with renamed_fields(OTHER_FIELDS):
            return self.protocol.build(datamodule, pl_module, strategy_comm(trainer))

    def prepare(self, trainer, pl_module, comm) -> None:
        with renamed_fields(OTHER_FIELDS):
            super().prepare(trainer, pl_module, comm)

    def check_setup(self, trainer, pl_module, datamodule) -> None:
        shape = self._build(trainer, pl_module, datamodule).shape
        on_rank0 = len(range(0, self.num_eval, trainer.world_size))
        if self._draws_grid(shape) and self.num_images > on_rank0:
            raise ConfigError(callback_field(self, "num_images"), f"the sample grid has more columns than "
                              f"the {on_rank0} seeds rank 0 evaluates (num_eval = {self.num_eval}, world size "
                              f"{trainer.world_size})",
                              value=self.num_images, accepted=f"an integer in [1, {on_rank0}]")
        check_unique_metric_names(self, trainer)

    def _draws_grid(self, shape) -> bool:  # image data only
        return bool(self.image_every_n_epochs) and len(shape) == 3 and shape[0] in (1, 3)

    def _prepare(self, trainer, pl_module) -> FlowEvaluation:
        """Built once per run on the module's device (bf16 autocast on CUDA: every flow), + references."""
        self.prepare(trainer, pl_module, strategy_comm(trainer))
        return self.evaluation

    def on_fit_start(self, trainer, pl_module) -> None:
        self._prepare(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._prepare(trainer, pl_module)
