"""Memorization ratio of generated samples (REFERENCE §11; ICR paper footnote 4; Gu et al.).

A generated sample x is *memorized* when, in a descriptor space Psi,

- ``criterion="cosine"`` (ICR paper, SSCD features): max_i cos(Psi(x), Psi(y_i)) > threshold
  (default 0.6), or
- ``criterion="nn_ratio"`` (Gu et al., pixel space): d_1/d_2 < threshold (default 1/3), where
  d_1 <= d_2 are the Euclidean distances from Psi(x) to its nearest and second-nearest training
  samples (0/0 counts as 0: an exact copy of a duplicated training point is memorized).

The ratio is (#memorized)/(#generated). The training set is embedded once (``set_reference``) and
scanned in chunks of ``chunk_size`` rows with a running max / running two smallest distances, so
memory is O(B x chunk), never O(M x N x D). States are float64 sums (count of memorized samples,
count of samples), so under DDP -- every rank holding the full reference, the generated samples
sharded -- the synced ratio is exact.

``descriptor``: a callable mapping a batch (B, *shape) to features (B, D) (e.g. a frozen
image encoder); None means the flattened samples themselves (pixel space). The cosine threshold
0.6 was calibrated for SSCD; with any other descriptor calibrate it on your data (REFERENCE §11).
Pure torch + torchmetrics (no Lightning import).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torchmetrics import Metric

__all__ = ["MemorizationRatio", "memorization_ratio", "memorization_scores", "CRITERIA",
           "DEFAULT_THRESHOLDS"]

CRITERIA = ("cosine", "nn_ratio")
DEFAULT_THRESHOLDS = {"cosine": 0.6, "nn_ratio": 1.0 / 3.0}


def _check_criterion(criterion: str, threshold) -> float:
    if criterion not in CRITERIA:
        raise ValueError(f"criterion: must be one of {list(CRITERIA)}, got {criterion!r}")
    if threshold is None:
        return DEFAULT_THRESHOLDS[criterion]
    threshold = float(threshold)
    if criterion == "cosine" and not -1.0 <= threshold <= 1.0:
        raise ValueError(f"threshold: a cosine threshold must lie in [-1, 1], got {threshold}")
    if criterion == "nn_ratio" and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold: an nn_ratio threshold must lie in (0, 1], got {threshold}")
    return threshold


def _check_chunk(chunk_size) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be an int >= 1, got {chunk_size!r}")


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


def _nn_ratio(g: torch.Tensor, ref: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """d_1/d_2 with a running pair of smallest squared distances over reference chunks."""
    inf = torch.full((g.shape[0], 2), float("inf"), dtype=torch.float64, device=g.device)
    top2 = inf
    g2 = (g * g).sum(1, keepdim=True)
    for j in range(0, ref.shape[0], chunk_size):
        r = ref[j:j + chunk_size]
        d2 = (g2 + (r * r).sum(1)[None, :] - 2.0 * g @ r.T).clamp_min(0.0)
        top2 = torch.cat([top2, d2], 1).topk(2, dim=1, largest=False).values
    d = top2.sqrt()
    return torch.where(d[:, 0] == 0, torch.zeros_like(d[:, 0]), d[:, 0] / d[:, 1])


def memorization_scores(generated_features: torch.Tensor, reference_features: torch.Tensor,
                        criterion: str = "cosine", chunk_size: int = 4096) -> torch.Tensor:
    """Per-sample score: max cosine similarity (``cosine``) or d_1/d_2 (``nn_ratio``), float64."""
    _check_criterion(criterion, None)
    _check_chunk(chunk_size)
    g = generated_features.reshape(generated_features.shape[0], -1).to(torch.float64)
    r = reference_features.reshape(reference_features.shape[0], -1).to(torch.float64).to(g.device)
    if g.shape[1] != r.shape[1]:
        raise ValueError(f"features: generated dimension {g.shape[1]} != reference {r.shape[1]}")
    if r.shape[0] < (2 if criterion == "nn_ratio" else 1):
        raise ValueError(f"reference: {criterion} needs at least "
                         f"{2 if criterion == 'nn_ratio' else 1} training samples, got {r.shape[0]}")
    out = []
    for i in range(0, g.shape[0], chunk_size):  # bound the generated side too
        gi = g[i:i + chunk_size]
        out.append(_max_cosine(gi, r, chunk_size) if criterion == "cosine"
                   else _nn_ratio(gi, r, chunk_size))
    return torch.cat(out) if out else g.new_zeros(0)


def _is_memorized(scores: torch.Tensor, criterion: str, threshold: float) -> torch.Tensor:
    return scores > threshold if criterion == "cosine" else scores < threshold


class MemorizationRatio(Metric):
    """Fraction of generated samples that copy a training sample (module docstring).

    Usage: ``m = MemorizationRatio(criterion="nn_ratio"); m.set_reference(train_data);
    m.update(samples); m.compute()``. ``set_reference`` embeds the training set once; the
    reference survives ``reset()`` (it is not a metric state).
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, threshold: Optional[float] = None, criterion: str = "cosine",
                 descriptor: Optional[Callable] = None, chunk_size: int = 4096,
                 **kwargs) -> None:
        self.threshold = _check_criterion(criterion, threshold)
        _check_chunk(chunk_size)
        if descriptor is not None and not callable(descriptor):
            raise ValueError("descriptor: must be None (pixel space) or a callable batch -> features")
        super().__init__(**kwargs)
        self.criterion = criterion
        self.descriptor = descriptor
        self.chunk_size = chunk_size
        self.reference: Optional[torch.Tensor] = None
        self.add_state("memorized", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def set_reference(self, train: torch.Tensor, features: bool = False) -> None:
        """Embed the training set once (``features=True``: ``train`` already holds Psi(y))."""
        if not torch.is_tensor(train) or train.ndim < 2 or train.shape[0] < 1:
            raise ValueError("train: expected a non-empty tensor (N, ...)")
        ref = train.reshape(train.shape[0], -1).to(torch.float64) if features \
            else embed(train, self.descriptor)
        self.reference = ref.to(self.device)

    def update(self, generated: torch.Tensor) -> None:
        if self.reference is None:
            raise ValueError("MemorizationRatio: call set_reference(train) before update()")
        g = embed(generated, self.descriptor)
        if self.reference.device != g.device:  # follow the samples' device (metric.to(...))
            self.reference = self.reference.to(g.device)
        scores = memorization_scores(g, self.reference, self.criterion, self.chunk_size)
        self.memorized += _is_memorized(scores, self.criterion, self.threshold).sum()
        self.total += scores.numel()

    def compute(self) -> torch.Tensor:
        return self.memorized / self.total.clamp_min(1.0)

    def plot(self, val=None, ax=None):  # torchmetrics convention
        return self._plot(val, ax)


def memorization_ratio(generated: torch.Tensor, train: torch.Tensor,
                       threshold: Optional[float] = None, criterion: str = "cosine",
                       descriptor: Optional[Callable] = None,
                       chunk_size: int = 4096) -> torch.Tensor:
    """Functional twin of :class:`MemorizationRatio`."""
    m = MemorizationRatio(threshold, criterion, descriptor, chunk_size, sync_on_compute=False)
    m.set_reference(train)
    m.update(generated)
    return m.compute()
