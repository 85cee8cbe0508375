"""Probability flow distance ("Understanding Generalization in Diffusion Distillation via
Probability Flow Distance", Def. 1, eq. 3-4).

    PFD(p, q) = ( E_{x_T} || Psi(Phi_p(x_T)) - Psi(Phi_q(x_T)) ||_2^2 )^{1/2}

estimated on M shared noise draws x_T^(i) (eq. 4) as the root of the mean squared distance of
paired endpoints. No division by the dimension, as in eq. 3 (our choice for the default); the
per-dimension (RMS) variant is the named option ``per_dimension=True``.

As in torchmetrics, the class and its functional twin share two primitives:
:func:`_pfd_update` (the float64 sums of one batch of paired features) and :func:`_pfd_compute`
(the estimate from the summed states).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional, Sequence, Tuple

import torch
from torchmetrics import Metric

from .. import keys
from ..diffusion.noise import seeded_noise
from ..diffusion.sampling import (SamplerSettings, clamp_sigmas, heun_sample, karras_sigmas, module_device,
                                  resolve_sampler)
from ..diffusion.streams import stream
from .descriptors import build_descriptor

__all__ = ["ProbabilityFlowDistance", "probability_flow_distance", "paired_sq_distances"]


def paired_sq_distances(features_p: torch.Tensor, features_q: torch.Tensor) -> torch.Tensor:
    """||f_p^(i) - f_q^(i)||^2 per row, float64, shape (B,)."""
    if features_p.shape != features_q.shape:
        raise ValueError(f"endpoints: paired batches must have equal shapes, got {tuple(features_p.shape)} "
                         f"and {tuple(features_q.shape)}")
    if features_p.ndim < 1 or features_p.shape[0] == 0:
        raise ValueError(f"endpoints: expected a non-empty batch (B, ...), got shape {tuple(features_p.shape)}")
    d = features_p.to(torch.float64) - features_q.to(device=features_p.device, dtype=torch.float64)
    return d.reshape(d.shape[0], -1).square().sum(1)


def _pfd_update(features_p: torch.Tensor, features_q: torch.Tensor
                ) -> Tuple[torch.Tensor, int, torch.Tensor, int]:
    """The sufficient statistics of eq. 4 for one batch of paired features:
    (sum of squared distances, pairs, pairs with a non-finite distance, features per sample)."""
    sq = paired_sq_distances(features_p, features_q)
    return sq.sum(), int(sq.shape[0]), (~torch.isfinite(sq)).sum(), int(features_p[0].numel())


def _pfd_compute(sum_sq: torch.Tensor, count, num_features, num_nonfinite,
                 per_dimension: bool = False) -> torch.Tensor:
    """eq. 4 from the summed states: sqrt(sum / M) (or sqrt(sum / (M F)) per dimension); NaN when
    any pair was non-finite (never inf, never a number over part of the pairs)."""
    sum_sq = torch.as_tensor(sum_sq, dtype=torch.float64)
    if float(num_nonfinite) > 0:
        return torch.full_like(sum_sq, float("nan"))
    denom = torch.as_tensor(count, dtype=torch.float64, device=sum_sq.device)
    if per_dimension:
        denom = denom * float(num_features)
    return (sum_sq / denom).sqrt()


class ProbabilityFlowDistance(Metric):
    """PFD estimator (eq. 4) as a torchmetrics Metric, exact under DDP.

    ``update(endpoints_p, endpoints_q)`` takes matching batches of PF-ODE endpoints produced from
    the same noise seeds (row i of both from x_T^(i)); Psi is applied to both, and the float64
    sum of squared distances and the count are accumulated (summed across processes).
    ``compute()`` returns sqrt(sum / M), or sqrt(sum / (M * F)) with ``per_dimension=True``
    (F = number of features), as float64. A pair with a non-finite feature (NaN/inf endpoint,
    e.g. a diverged model) makes the result NaN -- never inf or a finite number -- and is counted:
    ``nonfinite_fraction()`` is the fraction of such pairs (of this process's states; inside
    ``metric.sync_context()`` of all processes).

    Args:
        descriptor: Psi (see ``build_descriptor``); None = identity.
        per_dimension: divide by the feature dimension (RMS per coordinate) -- not eq. 4.
    """

    is_differentiable = False
    higher_is_better = keys.higher_is_better("pfd/e_gen")  # the key table declares it
    full_state_update = False

    def __init__(self, descriptor=None, per_dimension: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.descriptor = build_descriptor(descriptor)
        self.per_dimension = bool(per_dimension)
        self.add_state("sum_sq", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_features", torch.zeros((), dtype=torch.float64), dist_reduce_fx="max")
        self.add_state("num_nonfinite", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, endpoints_p: torch.Tensor, endpoints_q: torch.Tensor) -> None:
        if endpoints_p.shape != endpoints_q.shape:
            raise ValueError(f"endpoints: paired batches must have equal shapes, got {tuple(endpoints_p.shape)} "
                             f"and {tuple(endpoints_q.shape)}")
        sum_sq, count, nonfinite, num_features = _pfd_update(self.descriptor(endpoints_p),
                                                             self.descriptor(endpoints_q))
        self.sum_sq += sum_sq.to(self.sum_sq.device)
        self.count += count
        self.num_nonfinite += nonfinite.to(self.num_nonfinite.device)
        self.num_features.fill_(max(float(self.num_features), float(num_features)))

    def compute(self) -> torch.Tensor:
        """PFD of the (synced) states; NaN before any update (with torchmetrics' warning), as
        every metric of :mod:`lightning_pfd.metrics`."""
        if float(self.count) == 0:
            return torch.tensor(float("nan"), dtype=torch.float64, device=self.count.device)
        return _pfd_compute(self.sum_sq, self.count, self.num_features, self.num_nonfinite, self.per_dimension)

    def nonfinite_fraction(self) -> torch.Tensor:
        """Fraction of the paired endpoints with a non-finite distance (float64; this process's
        states unless called inside ``self.sync_context()``)."""
        if float(self.count) == 0:
            raise RuntimeError("ProbabilityFlowDistance: nonfinite_fraction() called before any update()")
        return self.num_nonfinite / self.count

    plot = lambda self, val=None, ax=None: self._plot(val, ax)  # noqa: E731


@torch.no_grad()
def probability_flow_distance(denoiser_p: Callable, denoiser_q: Callable,
                              x_T: Optional[torch.Tensor] = None, *, seeds=None,
                              shape: Optional[Sequence[int]] = None,
                              sigmas: Optional[torch.Tensor] = None,
                              sampler=heun_sample, descriptor=None, batch_size: int = 256,
                              per_dimension: bool = False,
                              settings: Optional[SamplerSettings] = None) -> torch.Tensor:
    """PFD between the flows of two denoisers on shared noise (eq. 3-4), float64 scalar.

    Give either ``x_T`` (the initial states, already scaled by the first sigma, i.e. drawn from
    N(0, T^2 I)) or ``seeds`` (+ ``shape``): then x_T^(i) = sigmas[0] * seeded_noise(seeds[i]).
    Both flows integrate the PF-ODE with ``sampler`` on ``sigmas`` (default Heun on EDM's
    18-step grid), each grid clamped to its denoiser's supported sigma range, in batches of
    ``batch_size`` (memory bounded by the batch). ``settings`` (a
    :class:`~lightning_pfd.diffusion.sampling.SamplerSettings`) gives sampler, grid and
    precision at once instead of ``sampler`` / ``sigmas``.
    """
    if (x_T is None) == (seeds is None):
        raise ValueError("x_T/seeds: give exactly one of x_T (initial states) or seeds (+ shape)")
    if seeds is not None and shape is None:
        raise ValueError("shape: required with seeds (the shape of one sample)")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if settings is not None:
        sampler, grid = settings.sampler, settings.sigmas()
    else:
        grid = karras_sigmas() if sigmas is None else torch.as_tensor(sigmas, dtype=torch.float64)
    sampler = resolve_sampler(sampler)
    grid_p, grid_q = clamp_sigmas(grid, denoiser_p), clamp_sigmas(grid, denoiser_q)
    if float(grid_p[0]) != float(grid_q[0]):
        raise ValueError(f"sigmas: the two denoisers support different maximal sigma ({float(grid_p[0]):g} vs "
                         f"{float(grid_q[0]):g}); both flows must start from the same x_T ~ N(0, T^2 I): "
                         "pass a grid whose first sigma both support")
    psi = build_descriptor(descriptor)
    if x_T is not None:
        batches = x_T.split(int(batch_size))
    else:
        seeds = torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
        batches = (seeded_noise(c, shape, stream=stream("pf_ode.x_T")) * grid_p[0] for c in seeds.split(int(batch_size)))
    sum_sq, count, nonfinite, num_features, device = 0.0, 0, 0, 0, None
    for xb in batches:
        if device is None:
            device = module_device(denoiser_p, xb.device)
            psi = psi.to(device)
        xb = xb.to(device)
        with settings.autocast(device) if settings is not None else contextlib.nullcontext():
            ep, eq = sampler(denoiser_p, xb, grid_p), sampler(denoiser_q, xb, grid_q)
        s, c, nb, nf = _pfd_update(psi(ep), psi(eq))
        sum_sq, count, nonfinite, num_features = sum_sq + s, count + c, nonfinite + int(nb), max(num_features, nf)
    if count == 0:
        raise ValueError("x_T/seeds: no initial states given")
    return _pfd_compute(sum_sq, count, num_features, nonfinite, per_dimension)
