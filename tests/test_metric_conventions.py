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
