"""ICRMonitor: the Invariant Contamination Ratio of the EMA denoiser during training (Sec. 5 of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

*What* is measured -- the fixed training subset, the augmented + noised views, the feature tap, the
projection, ICR, the traces and the spectrum -- is
:class:`~lightning_pfd.evaluation.representation.RepresentationEvaluation` (same arguments); this
callback decides *when* (:mod:`lightning_pfd.callbacks.base`: every n-th validation pass, a ``"log"``
or an explicit schedule) and *where* to log. The subset is split over ranks and the sums are added
through ``trainer.strategy``, so the logged values are global.

Logged: ``icr/icr``, ``icr/trace_s``, ``icr/trace_xi`` (l2-normalized features), ``icr/n`` (distinct
images), ``icr/d``, ``icr/nonfinite`` (fraction of view pairs with a NaN/inf feature; the ICR values
are then NaN, one warning) and ``icr/sigma_<value>`` for every extra sigma. ``name`` replaces the
``icr`` namespace, so two monitors (another sigma*, another tap) can share a Trainer, each with its own
checkpoint state. History rows also keep ``tau``, ``cond_xi``, ``icr_tau_auto`` and
``icr_tau_relative``; :attr:`ICRMonitor.eigenvalues` holds the last spectrum per sigma. With fewer
than 4 d distinct images one warning says the estimate is biased towards 0 (use ``d_proj``).

:meth:`ICRMonitor.check_setup` refuses before training: a module without a sigma-space denoiser, an
unknown ``tap`` (with the closest name), a sigma outside the denoiser's range, ``num_images`` larger
than the training set or smaller than the world size, an ``image_shape`` that does not fit the
samples, ``d_proj`` larger than the tap's dimension, and another monitor logging the same keys.

ICRMonitor is :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor` on
:class:`~lightning_pfd.evaluation.representation.ICRMeasure` (the measurement contract), with the
arguments, metric names and checkpoint state key of this monitor.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from lightning.pytorch.utilities import rank_zero_warn

from .. import keys
from ..errors import renamed_fields
from ..evaluation.representation import (DEFAULT_NUM_IMAGES, ICR_LEAVES, AugLevel, ICRMeasure, RepresentationEvaluation,
                                         check_representation_settings, fixed_subset,
                                         resolve_num_images, sigma_leaf, well_posed)
from ..metrics.icr import DEFAULT_COND_MAX, TauSpec
from ..validation import FinitePositiveFloat, IntAtLeastTwo, NonNegativeFloat, NonNegativeInt, PositiveInt
from .base import check_metric_prefix, check_unique_metric_names, require_train_data
from .monitor import EvaluationMonitor
from .state import callback_field

__all__ = ["ICRMonitor", "sigma_key", "fixed_subset", "DEFAULT_NUM_IMAGES", "resolve_num_images"]

_ARGS = ("num_images", "sigma", "sigmas", "level", "vector_jitter", "image_shape", "tap", "d_proj",
         "views_per_image", "tau", "normalize", "cond_max", "seed", "batch_size")
_LEAVES = ICR_LEAVES


def sigma_key(sigma: float, prefix: str = "icr") -> str:
    """Metric name of an extra noise level, e.g. 0.29 -> ``icr/sigma_0.29``."""
    return f"{prefix}/{sigma_leaf(sigma)}"


class ICRMonitor(EvaluationMonitor):
    """Log ICR of the EMA denoiser on a fixed training subset (module docstring).

    Args: those of :class:`RepresentationEvaluation` (``num_images`` None: min(4096, N); ``level``
    None: 3), plus ``every_n_epochs`` / ``schedule`` (:mod:`lightning_pfd.callbacks.base`) and
    ``name``, the metric namespace (default ``"icr"``; e.g. ``"icr_sigma1"`` for a second monitor).
    """

    _DEFAULT_NAME = "icr"

    def __init__(self, num_images: Optional[IntAtLeastTwo] = None, sigma: FinitePositiveFloat = 0.29,
                 sigmas: Optional[Sequence[float]] = None, level: Optional[AugLevel] = None,
                 vector_jitter: NonNegativeFloat = 0.0, image_shape: Optional[Sequence[int]] = None,
                 tap: Optional[str] = None, d_proj: Optional[PositiveInt] = None, views_per_image: PositiveInt = 1,
                 tau: TauSpec = "auto", normalize: bool = False, seed: NonNegativeInt = 0, batch_size: PositiveInt = 256,
                 every_n_epochs: int = 1, name: str = "icr", cond_max: float = DEFAULT_COND_MAX,
                 schedule: Union[str, List[int]] = "every_n_epochs"):
        super().__init__(None, every_n_epochs=every_n_epochs, schedule=schedule)
        with self._fields():
            self.settings = check_representation_settings(
                num_images=num_images, sigma=sigma, sigmas=sigmas, level=level, vector_jitter=vector_jitter,
                image_shape=image_shape, tap=tap, d_proj=d_proj, views_per_image=views_per_image, tau=tau,
                normalize=normalize, cond_max=cond_max, seed=seed, batch_size=batch_size)
        self.__dict__.update(self.settings)  # num_images, sigma, sigmas (the extra ones), tap, ...
        self.name = check_metric_prefix(self, "name", name)
        self.metric_keys()  # a name clash between the declared keys fails here
        self.eigenvalues: Dict[float, torch.Tensor] = {}  # last spectrum per sigma (descending)
        self._warned = False
        self.protocol = ICRMeasure(self.settings, fields=self._fields)

    def _fields(self):
        return renamed_fields(lambda arg: callback_field(self, arg), _ARGS)

    def metric_keys(self) -> List[keys.MetricKey]:
        """The keys of this monitor's namespace (:func:`lightning_pfd.keys.collect`): the
        built-in ``icr/*`` renamed under ``name``, and one per extra sigma."""
        renamed = [keys.get(f"icr/{leaf}").renamed(self.key(leaf)) for leaf in _LEAVES
                   if self.name != self._DEFAULT_NAME]
        extra = [keys.MetricKey(sigma_key(s, self.name), f"{self.name} σ={s:g}", True,
                                description=f"ICR at sigma = {s:g}") for s in self.sigmas]
        return list(keys.KeySet(renamed + extra).all_keys(kind=None))

    def key(self, leaf: str) -> str:
        """Logged name of ``leaf`` (icr, trace_s, trace_xi, n, d, nonfinite) in this namespace."""
        return f"{self.name}/{leaf}"

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in self._leaves()]

    def _state_key_args(self) -> Dict[str, Any]:
        return dict(name=self.name, sigma=self.sigma, tap=self.tap, num_images=self.num_images,
                    level=self.level, views_per_image=self.views_per_image, d_proj=self.d_proj,
                    image_shape=self.image_shape, seed=self.seed)

    def evaluation(self, train_data: torch.Tensor) -> RepresentationEvaluation:
        """The evaluation object of this monitor's protocol on ``train_data`` (kept while it is the same)."""
        return self.protocol.use(train_data)

    def check_data(self, data: torch.Tensor, world_size: int = 1) -> None:
        """``num_images`` vs the training set and the world size; the view shape."""
        with self._fields():
            self.evaluation(data).check_world(world_size)

    def check_setup(self, trainer, pl_module, datamodule: Any) -> None:
        self.check_data(require_train_data(self, datamodule), trainer.world_size)
        with self._fields():
            self.protocol.evaluation.check_model(pl_module)
        check_unique_metric_names(self, trainer)

    def measure(self, pl_module, train_data: torch.Tensor, rank: int = 0, world_size: int = 1,
                reduce=None) -> Dict[float, Dict[str, torch.Tensor]]:
        """:meth:`RepresentationEvaluation.measure` of this protocol (every rank must call it)."""
        return self.evaluation(train_data).measure(pl_module, rank, world_size, reduce)

    def prepare(self, trainer, pl_module, comm) -> None:
        self.evaluation(require_train_data(self, getattr(trainer, "datamodule", None)))

    def _inspect(self, trainer, m) -> None:
        self.eigenvalues = {s: r["eigenvalues"].cpu() for s, r in m.raw.items()}
        n, d = int(m.values["n"]), int(m.values["d"])
        if not well_posed(n, d) and not self._warned:
            self._warned = True
            rank_zero_warn(f"ICRMonitor: n = {m.values['n']:.0f} images for d = {m.values['d']:.0f} feature "
                           "dimensions (n < 4d): the ICR estimate is biased towards 0 (d x d covariances "
                           "from n images). Use more images, d_proj, a narrower tap, or views_per_image > 1.")

    def _extra_state(self) -> Dict[str, Any]:
        return {"warned": self._warned}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        self._warned = bool(state.get("warned", False))
