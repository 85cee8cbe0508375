"""Issue 40: torchmetrics' MetricTester checks, written out, for every metric of
``lightning_pfd.metrics``: the reduced ``forward`` gives the batch's value and accumulates like
``update``; ``merge_state`` into an empty metric; a persistent ``state_dict`` loaded into a fresh
metric; pickling; and 2-rank gloo DDP with uneven ranks and with a rank that never updates (before,
the tail metrics aborted on one rank and hung on the other -- torchmetrics' float32 placeholder
beside float64 states -- and ICR without ``num_features`` hung: a rank's 0-dim sums beside the
other's (d, d) ones). The oracle of each is the same metric updated with every batch in one process."""
from __future__ import annotations

import datetime
import os
import pickle

import pytest
import torch

import lightning_pfd.metrics as M

G = torch.Generator().manual_seed(0)
X = torch.randn(64, 4, generator=G, dtype=torch.float64)
Y = X + 0.1 * torch.randn(64, 4, generator=G, dtype=torch.float64)
E0, E1 = (-torch.log(torch.rand(61, generator=G, dtype=torch.float64)) / r for r in (1.0, 1.3))  # Exp(r)


def _mem():
    m = M.MemorizationRatio(criterion="nn_ratio")
    m.set_reference(X[:32])
    return m


#: name -> (fresh metric, two batches of update arguments of different sizes)
CASES = {
    "pfd": (M.ProbabilityFlowDistance, [(X[:40], Y[:40]), (X[40:], Y[40:])]),
    "icr": (M.InvariantContaminationRatio, [(X[:40], Y[:40]), (X[40:], Y[40:])]),
    "icr_d": (lambda: M.InvariantContaminationRatio(num_features=4), [(X[:40], Y[:40]), (X[40:], Y[40:])]),
    "rmsqe": (M.RootMeanSquaredQuantileError, [(E0[:40], E1[:35]), (E0[40:], E1[35:])]),
    "loader": (lambda: M.LogAbsoluteDensityRatio(window=(0.0, 6.0), relative_floor=False),
               [(E0[:40], E1[:35]), (E0[40:], E1[35:])]),
    "bias_variance": (lambda: M.BiasVarianceDecomposition(num_students=2),
                      [(X[:40], torch.stack([Y[:40], X[:40] + 0.2])), (X[40:], torch.stack([Y[40:], X[40:] + 0.2]))]),
    "memorization": (_mem, [(torch.cat([X[:8], Y[40:52]]),), (torch.cat([X[8:12], Y[52:]]),)]),
}


def _flat(v) -> torch.Tensor:
    if isinstance(v, dict):
        return torch.cat([torch.as_tensor(v[k], dtype=torch.float64).reshape(-1) for k in sorted(v)])
    return torch.as_tensor(v, dtype=torch.float64).reshape(-1)


def _oracle(name, batches=None):
    make, default = CASES[name]
    m = make()
    for args in (default if batches is None else batches):
        m.update(*args)
    return _flat(m.compute())


def _same(a, b):
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-10, atol=1e-12, equal_nan=True), (a, b)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_is_the_batch_value_and_accumulates_like_update(name):
    make, batches = CASES[name]
    m = make()
    for i, args in enumerate(batches):
        _same(_flat(m(*args)), _oracle(name, [args]))  # the reduced forward: this batch alone
    _same(_flat(m.compute()), _oracle(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_merge_into_an_empty_metric_state_dict_into_a_fresh_one_and_pickle(name):
    make, batches = CASES[name]
    parts = []
    for args in batches:
        p = make()
        p.update(*args)
        parts.append(p)
    empty = make()
    empty.merge_state(parts[0])
    empty.merge_state(parts[1])
    _same(_flat(empty.compute()), _oracle(name))
    full = make()
    for args in batches:
        full.update(*args)
    full.persistent(True)
    fresh = make()
    fresh.persistent(True)
    fresh.load_state_dict(full.state_dict())
    _same(_flat(fresh.compute()), _oracle(name))
    _same(_flat(pickle.loads(pickle.dumps(full)).compute()), _oracle(name))


def _worker(rank, world, init_file, out_dir, scenario):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a hang fails, after 5 min
    try:
        out = {}
        for name, (make, batches) in CASES.items():
            m = make()
            mine = [batches[rank]] if scenario == "uneven" else (batches if rank == 0 else [])
            for args in mine:
                m.update(*args)
            out[name] = _flat(m.compute())
        torch.save(out, os.path.join(out_dir, f"{scenario}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("scenario", ["uneven", "empty"])
def test_two_gloo_ranks_uneven_or_one_empty_give_the_one_process_value(tmp_path, scenario):
    """uneven: rank 0 has the first batch, rank 1 the second (other sizes); empty: rank 0 has
    both, rank 1 none. Every rank computes the value of all the data (no abort, no hang)."""
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), scenario), nprocs=2, join=True)
    for r in range(2):
        got = torch.load(tmp_path / f"{scenario}_rank{r}.pt", weights_only=True)
        for name in CASES:
            _same(got[name], _oracle(name))
