"""Issue 40 item 6: the tail metrics (RMSQE, LOADER) under 2-rank gloo DDP with uneven ranks and a
rank that never updates: both ranks compute the value of all the observables in one process
(oracle: the same metric on the concatenated data), no abort, no hang. Before, torchmetrics'
placeholder for the empty rank was float32 beside float64 states ("1200 vs 600 bytes")."""
from __future__ import annotations

import os

import pytest
import torch

from lightning_pfd.metrics.tails import LogAbsoluteDensityRatio, RootMeanSquaredQuantileError

METRICS = {"rmsqe": lambda: RootMeanSquaredQuantileError(),
           "loader": lambda: LogAbsoluteDensityRatio(window=(0.0, 8.0), relative_floor=False)}


def _data():
    g = torch.Generator().manual_seed(3)
    gen = torch.distributions.Exponential(1.0).sample((151,)).double() + 0.01 * torch.rand(151, generator=g, dtype=torch.float64)
    ref = torch.distributions.Exponential(1.2).sample((150,)).double()
    return gen, ref


def _worker(rank, world, init_file, out_dir, name, gen, ref):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        m = METRICS[name]()
        if rank == 0:  # rank 1 never updates
            m.update(gen[:100], ref[:70])
            m.update(gen[100:], ref[70:])
        torch.save(m.compute(), os.path.join(out_dir, f"{name}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(METRICS))
def test_a_rank_that_never_updates_neither_aborts_nor_hangs(tmp_path, name):
    import torch.multiprocessing as mp

    gen, ref = _data()
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), name, gen, ref), nprocs=2, join=True)
    one = METRICS[name]()
    one.update(gen, ref)
    expected = one.compute()
    for r in range(2):
        got = torch.load(tmp_path / f"{name}_rank{r}.pt", weights_only=True)
        assert torch.allclose(got, expected, rtol=1e-12, atol=0), (r, got, expected)
