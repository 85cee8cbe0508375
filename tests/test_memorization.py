"""Memorization ratio (ICR paper fn. 4; Gu et al.): planted duplicates, disjoint data, brute-force
oracles (exact copies of duplicated points included), DDP."""
import os

import numpy as np
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


def _brute_ratio(gen, train):
    """Oracle: numpy differences in float64, full sort; 0/0 -> 0 (memorized)."""
    g, t = gen.numpy(), train.numpy()
    d = np.sqrt(((g[:, None, :] - t[None, :, :]) ** 2).sum(-1))
    d.sort(axis=1)
    return np.where(d[:, 0] == 0, 0.0, d[:, 0] / np.where(d[:, 1] == 0, 1.0, d[:, 1]))


def test_exact_copies_of_duplicated_points_are_memorized_in_random_trials():
    """An exact copy of a training point that appears twice has d1 = d2 = 0 (0/0 -> memorized).
    The expanded |x|^2 - 2 x.y + |y|^2 alone returned d1 = d2 != 0 (ratio 1) in a good share
    of such trials (large offsets and norms); recomputing the nearest distances exactly fixes it."""
    missed = 0
    for trial in range(300):
        g = torch.Generator().manual_seed(trial)
        d = int(torch.randint(2, 64, (1,), generator=g))
        scale = float(torch.rand(1, generator=g)) * 100 + 0.1
        shift = float(torch.randn(1, generator=g)) * 10
        train = torch.randn(50, d, generator=g, dtype=F64) * scale + shift
        i = int(torch.randint(0, 50, (1,), generator=g))
        train = torch.cat([train, train[i:i + 1]])
        gen = torch.cat([train[i:i + 1], train[:3] + 1e-9 * scale])  # copy + near-copies
        s = memorization_scores(gen, train, "nn_ratio", chunk_size=16)
        missed += bool(s[0] != 0.0)
        np.testing.assert_allclose(s.numpy(), _brute_ratio(gen, train), rtol=1e-9, atol=1e-12)
    assert missed == 0


def _expanded_only_ratio(gen, train):
    """The former computation: expanded squared distances only (shows the cancellation)."""
    d2 = ((gen * gen).sum(1, keepdim=True) + (train * train).sum(1)[None, :]
          - 2.0 * gen @ train.T).clamp_min(0.0)
    d = d2.topk(2, dim=1, largest=False).values.sqrt()
    return torch.where(d[:, 0] == 0, torch.zeros_like(d[:, 0]), d[:, 0] / d[:, 1])


def test_the_expanded_formula_alone_misses_exact_copies():
    """Guard that the test above can fail: the expanded formula gets such copies wrong."""
    wrong = 0
    for trial in range(100):
        g = torch.Generator().manual_seed(trial)
        train = torch.randn(50, 32, generator=g, dtype=F64) * 50 + 7
        train = torch.cat([train, train[:1]])
        wrong += bool(_expanded_only_ratio(train[:1], train)[0] != 0)
        assert float(memorization_scores(train[:1], train, "nn_ratio")[0]) == 0.0
    assert wrong > 5


@pytest.mark.parametrize("candidates", [2, 3, 8])
def test_nn_ratio_matches_brute_force_with_many_duplicates_and_ties(candidates):
    """Duplicated training points (up to 12 copies: more than the candidates), exact copies,
    near-copies and equidistant points: every row equals the brute-force oracle."""
    g = torch.Generator().manual_seed(21)
    base = torch.randn(40, 6, generator=g, dtype=F64) * 30 + 5
    train = torch.cat([base, base[:1].expand(11, -1), base[1:3].repeat(4, 1)])  # 12, 5, 5 copies
    train = train[torch.randperm(train.shape[0], generator=g)]
    tie = torch.zeros(1, 6, dtype=F64)
    train = torch.cat([train, tie + 1.0, tie - 1.0, tie + 3.0])  # tie: two points at distance sqrt(6)
    gen = torch.cat([base[:5], base[5:9] + 1e-7, tie, torch.randn(20, 6, generator=g, dtype=F64) * 30])
    brute = _brute_ratio(gen, train)
    for chunk in (1, 7, 4096):
        got = memorization_scores(gen, train, "nn_ratio", chunk_size=chunk, candidates=candidates)
        np.testing.assert_allclose(got.numpy(), brute, rtol=1e-9, atol=1e-12)
    assert (brute[:5] == 0).all() and brute[9] == 1.0  # copies memorized; the tie is 1
    # torch oracle as well: cdist *without* its matmul (expanded-formula) path, which has the
    # same cancellation for near-copies
    ref = torch.cdist(gen, train, compute_mode="donot_use_mm_for_euclid_dist")
    ref = ref.topk(2, dim=1, largest=False).values
    np.testing.assert_allclose(got[5:].numpy(), (ref[:, 0] / ref[:, 1])[5:].numpy(), rtol=1e-9)


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
    with pytest.raises(ValueError, match="candidates"):
        memorization_scores(_data(3), _data(5), "nn_ratio", candidates=1)


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


def test_compute_before_any_update_is_nan_with_torchmetrics_warning():
    """Nothing measured is not "no copy": compute() before update() (and after reset()) returns
    NaN, as torchmetrics' mean metrics do, with torchmetrics' "called before the update" warning;
    one update gives the planted fraction (1 of 4 generated points is a training point)."""
    train = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    m = MemorizationRatio(criterion="nn_ratio")
    m.set_reference(train)
    with pytest.warns(UserWarning, match="before the ``update``"):
        value = m.compute()
    assert torch.isnan(value)
    far = 100.0 + torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    m.update(torch.cat([train[:1], far]))
    assert float(m.compute()) == pytest.approx(0.25)
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(m.compute())
