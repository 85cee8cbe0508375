"""Work split over processes: the ``[rank::world]`` convention, in one place (pure torch).

Every evaluation set of the project (evaluation seeds, loss samples, ICR subset, sample seeds) is
split over the ``world`` processes by position: rank ``r`` takes items ``r, r + world, r + 2·world,
…`` (no padding sampler, so no item is counted twice; Lightning's ``DistributedSampler`` would
duplicate items of an uneven set). Rank ``r`` holds ``len(range(r, n, world))`` items, so shard
sizes differ by at most one. Results come back in the global order with :func:`gather_shards`
(from the per-rank parts, e.g. a ``strategy.all_gather``) or :func:`all_gather_shards`
(``torch.distributed`` collective); tensors are summed over ranks with :func:`distributed_sum`,
scalars with :func:`all_reduce_sum`; :func:`process_of` resolves the (rank, world) of a
measurement.

Everything is the identity on one process (``world == 1`` or ``torch.distributed`` not
initialised), so the same code runs in a notebook.
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import torch

from ..errors import ConfigError

__all__ = ["check_world", "shard_indices", "shard", "shard_size", "shard_sizes", "pad_rows",
           "gather_shards", "distributed_world", "process_of", "all_gather_shards",
           "distributed_sum", "all_reduce_sum"]

T = TypeVar("T")


def check_world(rank: int, world: int) -> None:
    """Raise ``ValueError`` unless ``0 <= rank < world`` (integers)."""
    for name, v in (("rank", rank), ("world", world)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world and world >= 1, got rank={rank}, world={world}")


def shard_size(n: int, rank: int, world: int) -> int:
    """How many of ``n`` items rank ``rank`` holds: ``len(range(rank, n, world))``."""
    check_world(rank, world)
    return len(range(rank, int(n), world))


def shard_sizes(n: int, world: int) -> List[int]:
    """The shard size of every rank (sums to ``n``; sizes differ by at most one)."""
    return [shard_size(n, r, world) for r in range(world)]


def shard_indices(n: int, rank: int, world: int) -> torch.Tensor:
    """Global positions of this rank's items: ``arange(rank, n, world)`` (int64)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    check_world(rank, world)
    if rank >= n:  # fewer items than ranks: this rank has none (arange would refuse the range)
        return torch.zeros(0, dtype=torch.long)
    return torch.arange(rank, n, world)


def shard(items: T, rank: int, world: int) -> T:
    """This rank's items of a tensor (rows) or a sequence: ``items[rank::world]``."""
    check_world(rank, world)
    return items[rank::world]


def pad_rows(rows: torch.Tensor, length: int) -> torch.Tensor:
    """``rows`` zero-padded to ``length`` rows (collectives need equal shapes on every rank)."""
    if rows.shape[0] > length:
        raise ValueError(f"cannot pad {rows.shape[0]} rows to {length}")
    if rows.shape[0] == length:
        return rows
    out = rows.new_zeros((length, *rows.shape[1:]))
    out[: rows.shape[0]] = rows
    return out


def gather_shards(parts: Sequence[torch.Tensor], n: int, world: int) -> torch.Tensor:
    """Reassemble ``n`` rows in global order from the per-rank parts (``parts[r]`` = rank r's rows,
    possibly zero-padded at the end, e.g. the rows of ``strategy.all_gather``): ``out[r::world] =
    parts[r][:shard_size(n, r, world)]``."""
    if len(parts) != world:
        raise ValueError(f"expected {world} parts (one per rank), got {len(parts)}")
    sizes = shard_sizes(n, world)
    for r, (p, s) in enumerate(zip(parts, sizes)):
        if p.shape[0] < s:
            raise ValueError(f"rank {r} holds {p.shape[0]} rows, its shard of {n} has {s}")
    first = parts[0]
    out = first.new_empty((n, *first.shape[1:]))
    for r, (p, s) in enumerate(zip(parts, sizes)):
        out[r::world] = p[:s].to(out.device)
    return out


def distributed_world() -> int:
    """The ``torch.distributed`` world size (1 when it is not available or not initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def all_gather_shards(rows: torch.Tensor, n: int) -> torch.Tensor:
    """All ``n`` rows in global order on every rank, from this rank's strided shard ``rows``
    (a ``torch.distributed`` collective: every rank must call it; the identity on one process)."""
    world = distributed_world()
    if world == 1:
        return rows
    import torch.distributed as dist

    per = math.ceil(n / world)
    padded = pad_rows(rows.contiguous(), per)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return gather_shards(parts, n, world)


def process_of(rank: Optional[int], world: Optional[int],
               reduce: Optional[Callable] = None) -> Tuple[int, int]:
    """(rank, world): as given, else from torch.distributed ((0, 1) without it). Several processes
    need either torch.distributed or an explicit ``reduce``, else the sums would stay partial."""
    if world is None:
        world = distributed_world()
    if rank is None:
        import torch.distributed as dist

        rank = dist.get_rank() if world > 1 and distributed_world() > 1 else 0
    check_world(rank, world)
    if world > 1 and reduce is None and distributed_world() != world:
        raise ConfigError("world", f"{world} processes but torch.distributed has "
                          f"{distributed_world()}: pass `reduce` (a sum over the processes)", value=world)
    return rank, world


def distributed_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the torch.distributed processes (a copy; identity on one process).

    Every rank must call it."""
    if distributed_world() == 1:
        return t
    import torch.distributed as dist

    t = t.clone()
    dist.all_reduce(t)
    return t


def all_reduce_sum(value: Any, device: Any = None) -> float:
    """``value`` summed over all ranks (float64 all-reduce; the identity on one process).

    Every rank must call it. ``device`` is where the buffer lives (the module's device: NCCL needs
    a GPU tensor)."""
    if distributed_world() == 1:
        return float(value)
    return float(distributed_sum(torch.tensor([float(value)], dtype=torch.float64, device=device)))
