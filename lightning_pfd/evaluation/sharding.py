"""Work split over processes: the ``[rank::world]`` convention, in one place (pure torch).

Every evaluation set of the project (evaluation seeds, loss samples, ICR subset, sample seeds) is
split over the ``world`` processes by position: rank ``r`` takes items ``r, r + world, r + 2·world,
…`` (no padding sampler, so no item is counted twice; Lightning's ``DistributedSampler`` would
duplicate items of an uneven set). Rank ``r`` holds ``len(range(r, n, world))`` items, so shard
sizes differ by at most one. Results come back in the global order with :func:`gather_shards`
from the per-rank parts. The collectives that move the parts between processes are those of
:class:`~lightning_pfd.evaluation.base.Comm` (``Comm.gather_rows``, ``Comm.reduce_sum``); this
module is index arithmetic only.
"""
from __future__ import annotations

from typing import List, Sequence, TypeVar

import torch

__all__ = ["check_world", "shard_indices", "shard", "shard_size", "shard_sizes", "pad_rows",
           "gather_shards"]

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
