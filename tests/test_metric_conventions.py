"""Issue 40 item 7: one convention for compute() before update() across every metric of
lightning_pfd.metrics -- torchmetrics' warning and a defined value, NaN (as torchmetrics' mean
metrics return); after one update the metric gives a finite value (oracle: the functional twin)."""
from __future__ import annotations

import math

import pytest
import torch

import lightning_pfd.metrics as M
from lightning_pfd.metrics.icr import invariant_contamination_ratio

G = torch.Generator().manual_seed(0)
X = torch.randn(64, 4, generator=G, dtype=torch.float64)
Y = X + 0.1 * torch.randn(64, 4, generator=G, dtype=torch.float64)


def _value(v):
    if isinstance(v, dict):
        v = v["icr"] if "icr" in v else v["e_bias"]
    return v.reshape(-1)[0]


CASES = {
    "pfd": (lambda: M.ProbabilityFlowDistance(), lambda m: m.update(X, Y)),
    "icr": (lambda: M.InvariantContaminationRatio(), lambda m: m.update(X, Y)),
    "icr_d": (lambda: M.InvariantContaminationRatio(num_features=4), lambda m: m.update(X, Y)),
    "rmsqe": (lambda: M.RootMeanSquaredQuantileError(), lambda m: m.update(X[:, 0].exp(), Y[:, 0].exp())),
    "loader": (lambda: M.LogAbsoluteDensityRatio(window=(0.0, 10.0), relative_floor=False),
               lambda m: m.update(X[:, 0].exp(), Y[:, 0].exp())),
    "bias_variance": (lambda: M.BiasVarianceDecomposition(num_students=2),
                      lambda m: m.update(X, torch.stack([Y, X + 0.2]))),
    "memorization": (lambda: _mem(), lambda m: m.update(Y)),
}


def _mem():
    m = M.MemorizationRatio(criterion="nn_ratio")
    m.set_reference(X)
    return m


@pytest.mark.parametrize("name", sorted(CASES))
def test_compute_before_update_is_nan_with_torchmetrics_warning(name):
    make, feed = CASES[name]
    m = make()
    with pytest.warns(UserWarning, match="before the ``update``"):
        before = m.compute()
    assert math.isnan(float(_value(before)))
    feed(m)
    after = float(_value(m.compute()))
    assert math.isfinite(after)
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(float(_value(m.compute())))


def test_the_icr_after_update_is_the_functional_value():
    m = M.InvariantContaminationRatio()
    m.update(X, Y)
    assert torch.equal(m.compute()["icr"], invariant_contamination_ratio(X, Y)["icr"])


def test_icr_without_num_features_follows_torchmetrics_conventions():
    """Issue 40 item 5: without ``num_features`` the reduced ``forward`` gives the batch's value
    and accumulates like ``update``; ``merge_state`` into an empty metric keeps the sums; a
    persistent ``state_dict`` loads into a fresh metric; a pickled metric computes the same."""
    import pickle

    from lightning_pfd.metrics import InvariantContaminationRatio

    g = torch.Generator().manual_seed(0)
    s = torch.randn(64, 6, generator=g, dtype=torch.float64)
    h1 = s + 0.3 * torch.randn(64, 6, generator=g, dtype=torch.float64)
    h2 = s + 0.3 * torch.randn(64, 6, generator=g, dtype=torch.float64)
    ref = InvariantContaminationRatio()
    ref.update(h1, h2)
    want = ref.compute()["icr"]

    fwd = InvariantContaminationRatio()
    batch = fwd(h1[:32], h2[:32])["icr"]
    solo = InvariantContaminationRatio()
    solo.update(h1[:32], h2[:32])
    torch.testing.assert_close(batch, solo.compute()["icr"], rtol=0, atol=0)
    fwd(h1[32:], h2[32:])
    torch.testing.assert_close(fwd.compute()["icr"], want, rtol=1e-12, atol=0)

    empty = InvariantContaminationRatio()
    empty.merge_state(ref)
    assert empty.num_features == 6
    torch.testing.assert_close(empty.compute()["icr"], want, rtol=0, atol=0)

    keep = InvariantContaminationRatio()
    keep.persistent(True)
    keep.update(h1, h2)
    fresh = InvariantContaminationRatio()
    fresh.persistent(True)
    fresh.load_state_dict(keep.state_dict())
    torch.testing.assert_close(fresh.compute()["icr"], want, rtol=0, atol=0)
    fresh.update(h1, h2)  # and it keeps accumulating with the loaded shape
    assert fresh.num_features == 6 and float(fresh.n) == 128

    again = pickle.loads(pickle.dumps(ref))
    torch.testing.assert_close(again.compute()["icr"], want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="feature dimension changed from 6 to 5"):
        ref.update(h1[:, :5], h2[:, :5])


def test_cosine_criterion_on_raw_features_is_warned_about():
    """Issue 42 item 6: with Psi = identity on data that share a mean, the ICR paper's cosine
    criterion (meant for SSCD descriptors) counts fresh samples as copies -- here all of them --
    so it warns by name; nn_ratio (the monitors' criterion) and a descriptor do not warn."""
    import warnings as w

    from lightning_pfd.metrics import MemorizationRatio
    from lightning_pfd.metrics.memorization import memorization_ratio

    g = torch.Generator().manual_seed(0)
    train = 5.0 + torch.randn(64, 16, generator=g, dtype=torch.float64)  # a shared mean
    fresh = 5.0 + torch.randn(64, 16, generator=g, dtype=torch.float64)  # no sample is a copy
    with pytest.warns(UserWarning, match="cosine criterion .* on raw features"):
        r = memorization_ratio(fresh, train, criterion="cosine")
    assert float(r) == 1.0  # the trap the warning names
    with pytest.warns(UserWarning, match="cosine criterion"):
        MemorizationRatio(criterion="cosine").set_reference(train)
    with w.catch_warnings():
        w.simplefilter("error")
        assert float(memorization_ratio(fresh, train, criterion="nn_ratio")) == 0.0
        m = MemorizationRatio(criterion="cosine", descriptor=lambda x: x - 5.0)
        m.set_reference(train)
        MemorizationRatio(criterion="cosine").set_reference(train - 5.0, features=True)
