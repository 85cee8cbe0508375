"""The package's four monitors: configurations of :class:`~lightning_pfd.callbacks.EvaluationMonitor`.

Each is a function that builds an ``EvaluationMonitor`` on one built-in evaluation, usable as a
config's ``class_path`` (jsonargparse reads its signature and docstring like a class's)::

    trainer:
      callbacks:
        - class_path: lightning_pfd.callbacks.ICRMonitor
          init_args: {num_images: 1024, every_n_epochs: 2}

*What* is measured is the evaluation (:mod:`lightning_pfd.evaluation`); *when* (every
``every_n_epochs``-th pass, a ``"log"`` or an explicit ``schedule``) and *where* to log is the
monitor's. Keys, checkpoint state keys and values are those of the classes these functions
replaced, so configs and checkpoints written before keep working.

- :func:`GeneralizationMonitor`: E_gen, E_mem, their standard errors, the frozen-noise losses
  and user flow metrics (:class:`~lightning_pfd.evaluation.FlowEvaluation`; PFD paper eq. 8,
  App. C.6), keys ``pfd/*`` and ``loss/*`` (``<name>/*`` with a ``name``), and every
  ``image_every_n_epochs`` measured passes a grid of samples (rows student and each reference,
  like the paper's Fig. 1). User metrics come from ``metrics``::

      metrics:
        sw/e_gen: {class_path: my_pkg.SlicedWasserstein, init_args: {num_projections: 64}, reference: teacher}

  logged under their own key, whose meaning the metric's class declares
  (:meth:`lightning_pfd.keys.MetricKey.from_metric`). ``compile`` (``true`` / a torch.compile
  mode) compiles the student's denoiser for its PF-ODE, ``false`` samples it eagerly, unset it
  follows the module's ``sample_compile``.
- :func:`ICRMonitor`: the Invariant Contamination Ratio of the EMA denoiser's features
  (:class:`~lightning_pfd.evaluation.RepresentationEvaluation`; Sec. 5 of *Evaluating the
  Representation Space of Diffusion Models via Self-Supervised Principles*), keys ``icr/icr``,
  ``icr/icr_se``, ``icr/trace_s``, ``icr/trace_xi``, ``icr/n``, ``icr/d``, ``icr/nonfinite`` and
  ``icr/sigma_<value>`` per extra sigma; the last spectrum per sigma is
  ``monitor.evaluation.eigenvalues``; one warning when n < 4 d.
- :func:`MemorizationMonitor`: the memorization ratio of seeded samples
  (:class:`~lightning_pfd.evaluation.MemorizationEvaluation`), keys ``mem/ratio``,
  ``mem/ratio_se``, ``mem/nonfinite``; the per-sample indicators of the last measurement are
  ``monitor.latest.units["mem/ratio"].values``.
- :func:`TailMonitor`: RMSQE and LOADER of a physical observable with their same-law floors and
  diagnostics (:class:`~lightning_pfd.evaluation.TailEvaluation`), keys ``tail/*`` and the
  density figure ``tail/density``.

Every check a monitor makes before training (a module without a denoiser or ``generate``, an
unknown tap, sizes against the data and the world size, a descriptor that fails on the data,
another monitor logging the same keys) is its evaluation's ``check`` plus the duplicate-key
check; errors name the function's argument.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ..evaluation.flow import FlowEvaluation, PrecisionName, SamplerName
from ..evaluation.memorization import MemorizationEvaluation
from ..evaluation.representation import AugLevel, RepresentationEvaluation
from ..evaluation.tail import ReferenceSplit, TailEvaluation, TailSettings
from ..metrics.icr import DEFAULT_COND_MAX, TauSpec
from ..metrics.kde import Bandwidth
from ..metrics.memorization import Criterion
from ..metrics.tails import Definition
from ..validation import (FinitePositiveFloat, IntAtLeastTwo, NonNegativeFloat, NonNegativeInt, OpenUnitInterval,
                          PositiveInt, check_args)
from .monitor import EvaluationMonitor

__all__ = ["GeneralizationMonitor", "ICRMonitor", "MemorizationMonitor", "TailMonitor", "PRESETS", "preset_of"]

Schedule = Union[str, List[int]]


def _configured(monitor: EvaluationMonitor, preset: str, namespace: Optional[str] = None) -> EvaluationMonitor:
    monitor.preset, monitor.preset_namespace = preset, namespace
    return monitor


def GeneralizationMonitor(num_eval: PositiveInt = 1024, every_n_epochs: int = 1, descriptor: Any = None,  # noqa: N802
                          sampler: Optional[SamplerName] = None, sigmas: Optional[Sequence[float]] = None,
                          batch_size: PositiveInt = 256, chunk_size: PositiveInt = 4096,
                          num_loss_samples: Optional[PositiveInt] = 1024,
                          image_every_n_epochs: NonNegativeInt = 10, num_images: PositiveInt = 8,
                          use_cache: bool = True, name: Optional[str] = None, schedule: Schedule = "every_n_epochs",
                          precision: Optional[PrecisionName] = None,
                          metrics: Optional[Dict[str, Dict[str, Any]]] = None,
                          compile: Union[bool, str, None] = None) -> EvaluationMonitor:
    """Log E_gen, E_mem (PFD), frozen-noise losses, their gap and user ``metrics`` on schedule.

    Args:
        num_eval: M, the evaluation seeds (the datamodule's ``gen_seed_offset`` onwards).
        every_n_epochs: measure on every n-th pass (``schedule="every_n_epochs"``).
        descriptor: Psi (None / "identity", "efficientnet_lite0", a TorchScript path).
        sampler: the PF-ODE sampler (None: the model's).
        sigmas: an explicit sigma grid (None: the model's).
        batch_size: samples per sampler batch.
        chunk_size: training-set chunk of the empirical denoiser.
        num_loss_samples: samples of the frozen-noise losses (None: all).
        image_every_n_epochs: draw the sample grid every n-th measured pass (0: never).
        num_images: columns of the sample grid.
        use_cache: read / write the reference cache.
        name: the metric namespace (None: ``pfd/*`` and ``loss/*``).
        schedule: ``"every_n_epochs"``, ``"log"`` or a list of pass indices.
        precision: ``fp32``, ``bf16`` or ``fp16`` (None: the model's).
        metrics: user metrics, key -> {class_path, init_args, reference}.
        compile: the student's torch.compile mode (None: the model's ``sample_compile``).
    """
    check_args(GeneralizationMonitor, locals())
    ev = FlowEvaluation(num_eval=num_eval, descriptor=descriptor, sampler=sampler, sigmas=sigmas,
                        precision=precision, compile=compile, batch_size=batch_size, chunk_size=chunk_size,
                        num_loss_samples=num_loss_samples, use_cache=use_cache, metrics=metrics,
                        num_images=num_images if image_every_n_epochs else None)
    return _configured(EvaluationMonitor(ev, name=name, every_n_epochs=every_n_epochs, schedule=schedule,
                                         figure_every_n=image_every_n_epochs), "GeneralizationMonitor", "pfd")


def ICRMonitor(num_images: Optional[IntAtLeastTwo] = None, sigma: FinitePositiveFloat = 0.29,  # noqa: N802
               sigmas: Optional[Sequence[float]] = None, level: Optional[AugLevel] = None,
               vector_jitter: NonNegativeFloat = 0.0, image_shape: Optional[Sequence[int]] = None,
               tap: Optional[str] = None, d_proj: Optional[PositiveInt] = None, views_per_image: PositiveInt = 1,
               tau: TauSpec = "auto", normalize: bool = False, seed: NonNegativeInt = 0,
               batch_size: PositiveInt = 256, every_n_epochs: int = 1, name: str = "icr",
               cond_max: float = DEFAULT_COND_MAX, schedule: Schedule = "every_n_epochs") -> EvaluationMonitor:
    """Log ICR of the EMA denoiser on a fixed training subset.

    Args:
        num_images: distinct training images (None: min(4096, N)).
        sigma: the noise level sigma* of the views.
        sigmas: extra noise levels (logged as ``<name>/sigma_<value>``).
        level: augmentation level 0-5 (None: 3).
        vector_jitter: std of the additive jitter of vector data.
        image_shape: (C, H, W) of flattened images.
        tap: feature tap of the denoiser's net (None: its default tap).
        d_proj: fixed random projection of the features to this dimension.
        views_per_image: pairs of views per image.
        tau: the ridge rule of Sigma_xi (``auto``, ``relative`` or a number).
        normalize: l2-normalise the features before the covariances.
        seed: selects the subset and seeds the views and the projection.
        batch_size: rows (views) per forward pass.
        every_n_epochs: measure on every n-th pass.
        name: the metric namespace (e.g. ``icr_sigma1`` for a second monitor).
        cond_max: the condition-number limit of the ridge rule.
        schedule: ``"every_n_epochs"``, ``"log"`` or a list of pass indices.
    """
    ev = RepresentationEvaluation(num_images=num_images, sigma=sigma, sigmas=sigmas, level=level,
                                  vector_jitter=vector_jitter, image_shape=image_shape, tap=tap, d_proj=d_proj,
                                  views_per_image=views_per_image, tau=tau, normalize=normalize,
                                  cond_max=cond_max, seed=seed, batch_size=batch_size)
    monitor = _configured(EvaluationMonitor(ev, name=name, every_n_epochs=every_n_epochs, schedule=schedule),
                          "ICRMonitor")
    monitor.metric_keys()  # a name clash between the declared keys fails here
    return monitor


def MemorizationMonitor(num_samples: PositiveInt = 256, every_n_epochs: int = 5,  # noqa: N802
                        criterion: Criterion = "nn_ratio", threshold: Optional[float] = None,
                        descriptor: Union[str, Callable, None] = None, chunk_size: PositiveInt = 4096,
                        seed: NonNegativeInt = 20_000_000, batch_size: PositiveInt = 256, cache: bool = True,
                        name: str = "mem", schedule: Schedule = "every_n_epochs") -> EvaluationMonitor:
    """Log the memorization ratio ``mem/ratio`` of seeded samples.

    Args:
        num_samples: generated samples per measurement.
        every_n_epochs: measure on every n-th pass.
        criterion: ``nn_ratio`` (d_1/d_2 < threshold) or ``cosine`` (similarity > threshold).
        threshold: None: 1/3 for nn_ratio, 0.6 for cosine.
        descriptor: None (pixel space), a descriptor name / file, or a callable.
        chunk_size: training rows per distance block.
        seed: the first sample seed.
        batch_size: sampler batch size.
        cache: cache the training-set embedding on disk.
        name: the metric namespace.
        schedule: ``"every_n_epochs"``, ``"log"`` or a list of pass indices.
    """
    ev = MemorizationEvaluation(num_samples=num_samples, criterion=criterion, threshold=threshold,
                                descriptor=descriptor, chunk_size=chunk_size, seed=seed, batch_size=batch_size,
                                cache=cache)
    return _configured(EvaluationMonitor(ev, name=name, every_n_epochs=every_n_epochs, schedule=schedule),
                       "MemorizationMonitor")


def TailMonitor(every_n_epochs: int = 1, num_samples: IntAtLeastTwo = 512, observable: str = "max",  # noqa: N802
                observable_kwargs: Optional[Dict[str, Any]] = None, reference: ReferenceSplit = "train",
                eta: OpenUnitInterval = 0.975, window: Optional[Sequence[float]] = None,
                floor: FinitePositiveFloat = 1e-3, relative_floor: bool = True, bandwidth: Bandwidth = "silverman",
                num_splits: PositiveInt = 8, seed_offset: NonNegativeInt = 50_000_000, batch_size: PositiveInt = 256,
                num_steps: Optional[PositiveInt] = None, plot: bool = True, name: str = "tail",
                definition: Definition = "blog", schedule: Schedule = "every_n_epochs") -> EvaluationMonitor:
    """Tail metrics of ``observable`` between model samples and the ``reference`` data.

    Args:
        every_n_epochs: measure on every n-th pass.
        num_samples: generated samples per measurement.
        observable: the observable's name (:mod:`lightning_pfd.metrics.observables`).
        observable_kwargs: its keyword arguments.
        reference: the datamodule split compared with (``train`` or ``val``).
        eta: the quantile level of RMSQE's tail.
        window: the LOADER window (None: from the data).
        floor: the density floor of LOADER.
        relative_floor: the floor is relative to the density's peak.
        bandwidth: the KDE bandwidth rule or value.
        num_splits: splits of the same-law floors.
        seed_offset: the first sample seed.
        batch_size: sampler batch size.
        num_steps: sampler steps (None: the model's).
        plot: log the density figure at every measurement.
        name: the metric namespace.
        definition: ``blog`` or ``paper`` (the RMSQE definition).
        schedule: ``"every_n_epochs"``, ``"log"`` or a list of pass indices.
    """
    check_args(TailMonitor, locals())
    settings = TailSettings(observable, observable_kwargs or {}, num_samples, eta, definition, window=window,
                            floor=floor, relative_floor=relative_floor, bandwidth=bandwidth, num_splits=num_splits,
                            seed_offset=seed_offset, batch_size=batch_size, num_steps=num_steps)
    ev = TailEvaluation(None, settings, reference=reference)
    return _configured(EvaluationMonitor(ev, name=name, every_n_epochs=every_n_epochs, schedule=schedule,
                                         figure_every_n=1 if plot else 0), "TailMonitor")


#: preset name -> the evaluation class it configures
PRESETS = {"GeneralizationMonitor": FlowEvaluation, "ICRMonitor": RepresentationEvaluation,
           "MemorizationMonitor": MemorizationEvaluation, "TailMonitor": TailEvaluation}


def preset_of(callback: Any, preset: str) -> bool:
    """Whether ``callback`` is an EvaluationMonitor measuring what the preset ``preset``
    measures (its evaluation class), however it was configured."""
    return isinstance(callback, EvaluationMonitor) and isinstance(callback.evaluation, PRESETS[preset])
