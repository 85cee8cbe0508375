"""Memorization ratio (REFERENCE §11): planted duplicates, disjoint data, brute-force oracles, DDP."""
import os

import pytest
import torch

from lightning_pfd.metrics import MemorizationRatio, memorization_ratio
from lightning_pfd.metrics.memorization import memorization_scores

F64 = torch.float64


def _data(n, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=F64)


def _planted(train, n_gen, n_copies, seed=1, jitter=0.0):
    g = torch.Generator().manual_seed(seed)
    fresh = torch.randn(n_gen - n_copies, train.shape[1], generator=g, dtype=F64)
    idx = torch.randperm(train.shape[0], generator=g)[:n_copies]
    copies = train[idx] + jitter * torch.randn(n_copies, train.shape[1], generator=g, dtype=F64)
    return torch.cat([copies, fresh])[torch.randperm(n_gen, generator=g)]


@pytest.mark.parametrize("criterion", ["cosine", "nn_ratio"])
def test_planted_duplicates_give_the_planted_fraction(criterion):
    train = _data(500, d=64)
    gen = _planted(train, 200, 37, jitter=1e-3)  # near-exact copies
    m = MemorizationRatio(criterion=criterion, threshold=0.9 if criterion == "cosine" else None,
                          chunk_size=64)
    m.set_reference(train)
    for i in range(0, 200, 50):
        m.update(gen[i:i + 50])
    assert float(m.compute()) == pytest.approx(37 / 200)


@pytest.mark.parametrize("criterion", ["cosine", "nn_ratio"])
def test_disjoint_data_gives_zero(criterion):
    train, gen = _data(400, d=64, seed=2), _data(150, d=64, seed=3)
    thr = 0.6 if criterion == "cosine" else None
    assert float(memorization_ratio(gen, train, threshold=thr, criterion=criterion)) == 0.0


def test_nn_ratio_matches_brute_force():
    train = _data(300, d=5, seed=4)
    gen = torch.cat([_data(80, d=5, seed=5), train[:20] + 0.05 * _data(20, d=5, seed=6)])
    dist = torch.cdist(gen, train)
    top = dist.topk(2, dim=1, largest=False).values
    brute = top[:, 0] / top[:, 1]
    chunked = memorization_scores(gen, train, "nn_ratio", chunk_size=7)
    assert torch.allclose(chunked, brute, rtol=1e-9, atol=1e-12)
    ratio = memorization_ratio(gen, train, criterion="nn_ratio", chunk_size=7)
    assert float(ratio) == pytest.approx(float((brute < 1 / 3).double().mean()))
    assert 0 < float(ratio) < 1  # the test exercises both outcomes


def test_cosine_matches_brute_force_and_threshold_is_strict():
    train, gen = _data(250, d=6, seed=7), _data(60, d=6, seed=8)
    cos = torch.nn.functional.normalize(gen, dim=1) @ torch.nn.functional.normalize(train, dim=1).T
    brute = cos.max(1).values
    assert torch.allclose(memorization_scores(gen, train, "cosine", chunk_size=13), brute)
    thr = float(brute.median())
    ratio = memorization_ratio(gen, train, threshold=thr, criterion="cosine", chunk_size=13)
    assert float(ratio) == pytest.approx(float((brute > thr).double().mean()))


def test_descriptor_is_applied_to_both_sides_and_reference_cached():
    train = _data(100, d=8, seed=9).reshape(100, 2, 4)
    calls = []

    def descriptor(x):
        calls.append(x.shape[0])
        return x.reshape(x.shape[0], -1)[:, :4] * 2

    gen = train[:10].clone()
    gen.reshape(10, -1)[:, 4:] += 100.0  # differs only outside the descriptor's view
    m = MemorizationRatio(criterion="nn_ratio", descriptor=descriptor)
    m.set_reference(train)
    n_ref_calls = len(calls)
    m.update(gen)
    m.update(gen)
    assert float(m.compute()) == 1.0
    assert len(calls) == n_ref_calls + 2  # the training set was embedded only once
    m.reset()
    assert m.reference is not None and float(m.total) == 0


def test_duplicated_training_point_counts_as_memorized():
    train = torch.cat([_data(10, seed=10), _data(10, seed=10)[:1]])  # point 0 twice
    assert float(memorization_ratio(train[:1], train, criterion="nn_ratio")) == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="criterion"):
        MemorizationRatio(criterion="l2")
    with pytest.raises(ValueError, match="threshold"):
        MemorizationRatio(criterion="nn_ratio", threshold=2.0)
    with pytest.raises(ValueError, match="threshold"):
        MemorizationRatio(criterion="cosine", threshold=1.5)
    with pytest.raises(ValueError, match="chunk_size"):
        MemorizationRatio(chunk_size=0)
    with pytest.raises(ValueError, match="descriptor"):
        MemorizationRatio(descriptor=3)
    m = MemorizationRatio()
    with pytest.raises(ValueError, match="set_reference"):
        m.update(_data(3))
    with pytest.raises(ValueError, match="at least 2"):
        memorization_ratio(_data(3), _data(1), criterion="nn_ratio")
    with pytest.raises(ValueError, match="dimension"):
        memorization_scores(_data(3, d=4), _data(5, d=5))


def _ddp_worker(rank, world, init_file, out_dir, gen, train):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        m = MemorizationRatio(criterion="nn_ratio", chunk_size=32)
        m.set_reference(train)
        m.update(gen[rank::world])
        torch.save(m.compute(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_sync_is_exact(tmp_path):
    import torch.multiprocessing as mp
    train = _data(200, d=16, seed=11)
    gen = _planted(train, 101, 13, seed=12)  # odd size: uneven shards
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path), gen, train), nprocs=2)
    for r in range(2):
        assert float(torch.load(tmp_path / f"rank{r}.pt")) == pytest.approx(13 / 101, abs=1e-15)
