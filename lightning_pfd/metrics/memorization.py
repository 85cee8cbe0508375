"""Memorization ratio of generated samples (ICR paper "Evaluating the Representation Space of
Diffusion Models via Self-Supervised Principles", footnote 4; Gu et al.).

A generated sample x is *memorized* when, in a descriptor space Psi,

- ``criterion="cosine"`` (ICR paper, SSCD features): max_i cos(Psi(x), Psi(y_i)) > threshold
  (default 0.6), or
- ``criterion="nn_ratio"`` (Gu et al., pixel space): d_1/d_2 < threshold (default 1/3), where
  d_1 <= d_2 are the Euclidean distances from Psi(x) to its nearest and second-nearest training
  samples (0/0 counts as 0: an exact copy of a duplicated training point is memorized).
  **Exact distances**: the expanded form |x|^2 - 2 x.y + |y|^2 (one matmul per chunk) only
  *selects* the ``candidates`` nearest training points; d_1, d_2 are then recomputed as
  |x - y| in float64 from the differences. The expanded form cancels catastrophically for
  near-equal vectors (an exact copy of a duplicated training point got d_1 = d_2 != 0, ratio 1,
  i.e. "not memorized"); a rounding bound on it (2 (D + 4) eps (|x|^2 + max |y|^2)) tells whether
  the true two nearest are surely among the candidates, and the rows where they might not be
  (near ties, many duplicates) are recomputed exactly against the whole reference, in chunks.

The ratio is (#memorized)/(#generated). The training set is embedded once (``set_reference``) and
scanned in chunks of ``chunk_size`` rows with a running max / running two smallest distances, so
memory is O(B x chunk), never O(M x N x D). States are float64 sums (count of memorized samples,
count of samples), so under DDP -- every rank holding the full reference, the generated samples
sharded -- the synced ratio is exact.

``descriptor``: a callable mapping a batch (B, *shape) to features (B, D) (e.g. a frozen
image encoder); None means the flattened samples themselves (pixel space). The cosine threshold
0.6 was calibrated for SSCD; with any other descriptor calibrate it on your data.
Pure torch + torchmetrics (no Lightning import).
"""
from __future__ import annotations

import warnings

import typing
from typing import Callable, Literal, Optional, Tuple

import torch
from torchmetrics import Metric

from .. import keys
from ..errors import ConfigError
from ..validation import IntAtLeastTwo, PositiveInt, check_args

__all__ = ["MemorizationRatio", "memorization_ratio", "memorization_scores", "embed",
           "reference_features", "resolve_threshold", "Criterion", "CRITERIA", "DEFAULT_THRESHOLDS"]

#: the memorization criteria (module docstring)
Criterion = Literal["cosine", "nn_ratio"]
CRITERIA = typing.get_args(Criterion)
DEFAULT_THRESHOLDS = {"cosine": 0.6, "nn_ratio": 1.0 / 3.0}


def resolve_threshold(criterion: Criterion, threshold: Optional[float] = None) -> float:
    """The threshold for ``criterion`` (its default when None); a ConfigError naming
    ``threshold`` when it lies outside the criterion's range (a rule between two arguments)."""
    if threshold is None:
        return DEFAULT_THRESHOLDS[criterion]
    threshold = float(threshold)
    if criterion == "cosine" and not -1.0 <= threshold <= 1.0:
        raise ConfigError("threshold", "a cosine threshold must lie in [-1, 1]", value=threshold)
    if criterion == "nn_ratio" and not 0.0 < threshold <= 1.0:
        raise ConfigError("threshold", "an nn_ratio threshold must lie in (0, 1]", value=threshold)
    return threshold


def _check_descriptor(descriptor) -> None:
    if descriptor is not None and not callable(descriptor):
        raise ValueError("descriptor: must be None (pixel space) or a callable batch -> features")


def embed(x: torch.Tensor, descriptor: Optional[Callable] = None,
          batch_size: int = 1024) -> torch.Tensor:
    """Psi(x) as float64 (B, D), in batches; ``descriptor=None`` flattens."""
    if descriptor is None:
        return x.reshape(x.shape[0], -1).to(torch.float64)
    out = []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            f = descriptor(x[i:i + batch_size])
            out.append(f.reshape(f.shape[0], -1).to(torch.float64))
    return torch.cat(out) if out else x.new_zeros((0, 0), dtype=torch.float64)


def _max_cosine(g: torch.Tensor, ref: torch.Tensor, chunk_size: int) -> torch.Tensor:
    gn = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
    best = torch.full((g.shape[0],), -float("inf"), dtype=torch.float64, device=g.device)
    for j in range(0, ref.shape[0], chunk_size):
        r = ref[j:j + chunk_size]
        rn = r / r.norm(dim=1, keepdim=True).clamp_min(1e-12)
        best = torch.maximum(best, (gn @ rn.T).amax(1))
    return best


_EXACT_BUDGET = 1 << 22  # float64 elements of difference tensors held at once (32 MiB)


def _exact_sq_dist(g: torch.Tensor, r: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """|g_i - r_idx[i, k]|^2 from the differences (no cancellation), shape of idx; row blocks
    keep the (rows, k, D) difference tensor within ``_EXACT_BUDGET`` elements."""
    rows = max(1, _EXACT_BUDGET // max(1, idx.shape[1] * g.shape[1]))
    return torch.cat([(g[i:i + rows, None, :] - r[idx[i:i + rows]]).square().sum(-1)
                      for i in range(0, g.shape[0], rows)]) if g.shape[0] else idx.to(g.dtype)


def _exact_top2(g: torch.Tensor, ref: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Two smallest exact squared distances of each row of g to all of ref (brute force, chunked)."""
    top2 = torch.full((g.shape[0], 2), float("inf"), dtype=torch.float64, device=g.device)
    cols = max(1, min(chunk_size, _EXACT_BUDGET // max(1, g.shape[1])))
    rows = max(1, _EXACT_BUDGET // (cols * max(1, g.shape[1])))
    for i in range(0, g.shape[0], rows):
        gi, best = g[i:i + rows], top2[i:i + rows]
        for j in range(0, ref.shape[0], cols):
            d = (gi[:, None, :] - ref[None, j:j + cols, :]).square().sum(-1)
            best = torch.cat([best, d], 1).topk(2, dim=1, largest=False).values
        top2[i:i + rows] = best
    return top2


def _nn_ratio(g: torch.Tensor, ref: torch.Tensor, chunk_size: int,
              candidates: int = 8) -> torch.Tensor:
    """d_1/d_2 with exact distances for the nearest neighbours (module docstring).

    1. running top-``candidates`` by the expanded squared distance over reference chunks;
    2. exact squared distances |x - y|^2 of those candidates, the two smallest kept;
    3. rows whose 2nd exact distance is not surely below every non-candidate's (the k-th
       expanded distance minus the rounding bound) are redone exactly over all chunks.
    Memory O(B x (chunk + k)) plus difference tensors of at most 2^22 float64 elements.
    """
    k = min(max(2, int(candidates)), ref.shape[0])
    B, D = g.shape
    g2 = (g * g).sum(1, keepdim=True)
    best_d = torch.full((B, 0), float("inf"), dtype=torch.float64, device=g.device)
    best_i = torch.zeros((B, 0), dtype=torch.long, device=g.device)
    r2max = torch.zeros((), dtype=torch.float64, device=g.device)
    for j in range(0, ref.shape[0], chunk_size):
        r = ref[j:j + chunk_size]
        r2 = (r * r).sum(1)
        r2max = torch.maximum(r2max, r2.max())
        d2 = (g2 + r2[None, :] - 2.0 * g @ r.T).clamp_min(0.0)
        cand_d = torch.cat([best_d, d2], 1)
        cand_i = torch.cat([best_i, torch.arange(j, j + r.shape[0], device=g.device).expand(B, -1)], 1)
        kk = min(k, cand_d.shape[1])
        best_d, pos = cand_d.topk(kk, dim=1, largest=False)
        best_i = cand_i.gather(1, pos)
    exact = _exact_sq_dist(g, ref, best_i)  # (B, k)
    top2 = exact.topk(2, dim=1, largest=False).values
    if k < ref.shape[0]:
        # any non-candidate y has expanded d2 >= best_d[:, -1], hence true d2 >= that - bound
        eps = torch.finfo(torch.float64).eps
        bound = 2.0 * (D + 4) * eps * (g2[:, 0] + r2max)
        unsure = torch.nonzero(best_d[:, -1] - bound <= top2[:, 1]).flatten()
        if unsure.numel():  # near ties / many duplicates: exact over the whole reference
            top2[unsure] = _exact_top2(g[unsure], ref, chunk_size)
    d = top2.sqrt()
    return torch.where(d[:, 0] == 0, torch.zeros_like(d[:, 0]), d[:, 0] / d[:, 1])


def memorization_scores(generated_features: torch.Tensor, reference_features: torch.Tensor,
                        criterion: Criterion = "cosine", chunk_size: PositiveInt = 4096,
                        candidates: IntAtLeastTwo = 8) -> torch.Tensor:
    """Per-sample score: max cosine similarity (``cosine``) or d_1/d_2 (``nn_ratio``), float64.

    ``candidates`` (>= 2, ``nn_ratio`` only): nearest neighbours by the fast expanded distance
    whose distances are recomputed exactly (a margin for near ties; rows where the true two
    nearest may lie outside them are recomputed against the whole reference).
    """
    check_args(memorization_scores, locals())
    g = generated_features.reshape(generated_features.shape[0], -1).to(torch.float64)
    r = reference_features.reshape(reference_features.shape[0], -1).to(torch.float64).to(g.device)
    if g.shape[1] != r.shape[1]:
        raise ConfigError("features", f"generated dimension {g.shape[1]} != reference dimension "
                          f"{r.shape[1]}")
    if r.shape[0] < (2 if criterion == "nn_ratio" else 1):
        raise ValueError(f"reference: {criterion} needs at least "
                         f"{2 if criterion == 'nn_ratio' else 1} training samples, got {r.shape[0]}")
    out = []
    for i in range(0, g.shape[0], chunk_size):  # bound the generated side too
        gi = g[i:i + chunk_size]
        out.append(_max_cosine(gi, r, chunk_size) if criterion == "cosine"
                   else _nn_ratio(gi, r, chunk_size, candidates))
    return torch.cat(out) if out else g.new_zeros(0)


def _is_memorized(scores: torch.Tensor, criterion: str, threshold: float) -> torch.Tensor:
    return scores > threshold if criterion == "cosine" else scores < threshold


def _memorization_update(generated_features: torch.Tensor, reference_features: torch.Tensor,
                         criterion: str, threshold: float,
                         chunk_size: int = 4096) -> Tuple[torch.Tensor, torch.Tensor]:
    """(memorized, total) float64 counts of one batch of generated samples, in Psi space.

    Both sides are descriptors already (:func:`embed`); sums of counts over batches or ranks give
    the counts of the union, so the ratio syncs exactly.
    """
    scores = memorization_scores(generated_features, reference_features, criterion, chunk_size)
    memorized = _is_memorized(scores, criterion, threshold).sum().to(torch.float64)
    return memorized, torch.tensor(float(scores.numel()), dtype=torch.float64, device=scores.device)


def _memorization_compute(memorized: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """(#memorized)/(#generated); NaN for no sample (0/0: nothing was measured, not "no copy";
    torchmetrics' own mean metrics do the same, and ``Metric.compute`` before any ``update``
    warns that it was called before the update method)."""
    return memorized / total


class MemorizationRatio(Metric):
    """Fraction of generated samples that copy a training sample (module docstring).

    Usage: ``m = MemorizationRatio(criterion="nn_ratio"); m.set_reference(train_data);
    m.update(samples); m.compute()``. ``set_reference`` embeds the training set once; the
    reference survives ``reset()`` (it is not a metric state). The class and
    :func:`memorization_ratio` share ``_memorization_update`` / ``_memorization_compute``.
    """

    is_differentiable = False
    higher_is_better = keys.higher_is_better("mem/ratio")  # the key table declares it
    full_state_update = False

    def __init__(self, threshold: Optional[float] = None, criterion: Criterion = "cosine",
                 descriptor: Optional[Callable] = None, chunk_size: PositiveInt = 4096,
                 **kwargs) -> None:
        check_args(MemorizationRatio.__init__, locals())
        self.threshold = resolve_threshold(criterion, threshold)
        _check_descriptor(descriptor)
        super().__init__(**kwargs)
        self.criterion = criterion
        self.descriptor = descriptor
        self.chunk_size = chunk_size
        self.reference: Optional[torch.Tensor] = None
        self.add_state("memorized", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def set_reference(self, train: torch.Tensor, features: bool = False) -> None:
        """Embed the training set once (``features=True``: ``train`` already holds Psi(y)).
        The cosine criterion on raw features (no descriptor, ``features=False``) is warned about
        (:func:`warn_cosine_on_raw`)."""
        if not features:
            warn_cosine_on_raw(self.criterion, self.descriptor)
        self.reference = reference_features(train, None if features else self.descriptor).to(self.device)

    def update(self, generated: torch.Tensor) -> None:
        if self.reference is None:
            raise ValueError("MemorizationRatio: call set_reference(train) before update()")
        g = embed(generated, self.descriptor)
        if self.reference.device != g.device:  # follow the samples' device (metric.to(...))
            self.reference = self.reference.to(g.device)
        memorized, total = _memorization_update(g, self.reference, self.criterion, self.threshold,
                                                self.chunk_size)
        self.memorized += memorized
        self.total += total

    def compute(self) -> torch.Tensor:
        return _memorization_compute(self.memorized, self.total)

    def plot(self, val=None, ax=None):  # torchmetrics convention
        return self._plot(val, ax)


def warn_cosine_on_raw(criterion: str, descriptor: Optional[Callable]) -> bool:
    """Warn (once per call site) when the ICR paper's cosine criterion (cos > 0.6, meant for SSCD
    descriptors) is used on raw pixel / vector features (no descriptor): there, samples that
    share the data's mean direction have cosines near 1 with many training samples, so most
    fresh samples count as copies (100 % of fresh samples of a dataset with a shared mean).
    Returns whether it warned."""
    if criterion != "cosine" or descriptor is not None:
        return False
    warnings.warn("MemorizationRatio: the cosine criterion (cos > 0.6, the ICR paper's, meant for SSCD "
                  "descriptors) on raw features counts samples that share the data's mean direction as "
                  "copies; give a descriptor (or set_reference(features, features=True) with descriptor "
                  "features), or use criterion='nn_ratio' (Gu et al.'s d1/d2 < 1/3 in pixel space, the "
                  "monitors' default)", UserWarning, stacklevel=3)
    return True


def reference_features(train: torch.Tensor, descriptor: Optional[Callable] = None) -> torch.Tensor:
    """Psi of the training set, float64 (N, D), validated (``descriptor=None``: flattened)."""
    if not torch.is_tensor(train) or train.ndim < 2 or train.shape[0] < 1:
        raise ValueError("train: expected a non-empty tensor (N, ...)")
    return embed(train, descriptor)


def memorization_ratio(generated: torch.Tensor, train: torch.Tensor,
                       threshold: Optional[float] = None, criterion: Criterion = "cosine",
                       descriptor: Optional[Callable] = None,
                       chunk_size: PositiveInt = 4096) -> torch.Tensor:
    """Functional twin of :class:`MemorizationRatio`."""
    check_args(memorization_ratio, locals())
    threshold = resolve_threshold(criterion, threshold)
    _check_descriptor(descriptor)
    warn_cosine_on_raw(criterion, descriptor)
    ref = reference_features(train, descriptor)
    g = embed(generated, descriptor).to(ref.device)
    return _memorization_compute(*_memorization_update(g, ref, criterion, threshold, chunk_size))
