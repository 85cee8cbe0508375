"""EmpiricalDenoiser (PFD paper eq. 46) against brute-force float64 oracles, both precisions
(the mixed path has its own adversarial tests in test_empirical_mixed.py)."""
import math

import pytest
import torch

from lightning_pfd.diffusion import EmpiricalDenoiser, heun_sample, karras_sigmas, seeded_noise


def _brute_force(x, data, sigma):
    """Dense float64 softmax(-||x - y_i||^2 / (2 sigma^2)) @ y, no tricks."""
    xf = x.reshape(len(x), -1).double()
    y = data.reshape(len(data), -1).double()
    d2 = ((xf[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    w = torch.softmax(-d2 / (2 * torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1) ** 2), dim=1)
    return (w @ y).reshape(x.shape)


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(37, 2, 3, generator=g)  # image-like shape, 6 features


@pytest.mark.parametrize("precision", ["mixed", "float64"])
@pytest.mark.parametrize("sigma", [0.002, 0.05, 0.7, 3.0, 80.0])
@pytest.mark.parametrize("chunk", [1, 5, 37, 1000])
def test_matches_brute_force(data, sigma, chunk, precision):
    g = torch.Generator().manual_seed(1)
    # points between training points, so several weights matter even at small sigma
    i, j = torch.randint(0, 37, (2, 11), generator=g)
    x = 0.5 * (data[i] + data[j]) + sigma * torch.randn(11, 2, 3, generator=g, dtype=torch.float64)
    D = EmpiricalDenoiser(data, chunk_size=chunk, precision=precision)
    out = D(x, sigma)
    ref = _brute_force(x, data, sigma)
    assert out.dtype == torch.float64 and out.shape == x.shape
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("precision", ["mixed", "float64"])
def test_per_sample_sigma(data, precision):
    x = seeded_noise(range(6), (2, 3))
    sig = torch.tensor([0.002, 0.01, 0.1, 1.0, 10.0, 80.0], dtype=torch.float64)
    out = EmpiricalDenoiser(data, chunk_size=4, precision=precision)(x, sig)
    torch.testing.assert_close(out, _brute_force(x, data, sig), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("precision", ["mixed", "float64"])
def test_float64_logits_pick_the_right_winner(precision):
    """Two points 0.02 apart far from the origin at sigma = 0.002: float32 distances
    (error ~ 6e-4 on ||y||^2 = 1e4) would give logit errors ~ 75 and a coin-flip winner."""
    y = torch.tensor([[100.0, 0.0], [100.0, 0.02]], dtype=torch.float64)
    x = torch.tensor([[100.0, 0.019]], dtype=torch.float64)
    out = EmpiricalDenoiser(y, chunk_size=1, precision=precision)(x, 0.002)
    torch.testing.assert_close(out, _brute_force(x, y, 0.002), rtol=1e-9, atol=1e-9)
    assert abs(float(out[0, 1]) - 0.02) < 1e-12  # the nearest point wins (logit gap 45)


@pytest.mark.parametrize("sigma", [0.002, 1.0, 80.0])
def test_single_training_point_is_returned(sigma):
    y = torch.tensor([[0.3, -1.2, 2.0]])
    x = seeded_noise(range(5), (3,)) * 50
    out = EmpiricalDenoiser(y)(x, sigma)
    torch.testing.assert_close(out, y.double().expand(5, 3), rtol=0, atol=1e-12)


def test_large_sigma_gives_data_mean(data):
    x = seeded_noise(range(4), (2, 3))
    out = EmpiricalDenoiser(data, chunk_size=8)(x, 1e7)
    torch.testing.assert_close(out, data.double().mean(0).expand(4, 2, 3), rtol=0, atol=1e-6)


def test_permutation_invariance(data):
    x = seeded_noise(range(9), (2, 3)) * 0.8
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(3))
    for sigma in (0.01, 0.5, 5.0):
        a = EmpiricalDenoiser(data, chunk_size=6)(x, sigma)
        b = EmpiricalDenoiser(data[perm], chunk_size=6)(x, sigma)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("precision", ["mixed", "float64"])
def test_flow_endpoints_land_on_training_points(data, precision):
    D = EmpiricalDenoiser(data, chunk_size=10, precision=precision)
    sig = karras_sigmas(18)
    x_T = seeded_noise(range(64), (2, 3)) * sig[0]
    x0 = heun_sample(D, x_T, sig)
    idx = D.nearest(x0)
    dist = (x0 - data.double()[idx]).flatten(1).norm(dim=1)
    assert float(dist.max()) < 1e-8
    assert len(set(idx.tolist())) > 5  # many different training points are reached


def test_nearest_matches_argmin(data):
    x = seeded_noise(range(20), (2, 3))
    D = EmpiricalDenoiser(data, chunk_size=4)
    ref = torch.cdist(x.flatten(1), data.double().flatten(1)).argmin(1)
    assert torch.equal(D.nearest(x), ref)


def test_fingerprint_depends_on_data(data):
    assert EmpiricalDenoiser(data).fingerprint() == EmpiricalDenoiser(data.clone(), chunk_size=3).fingerprint()
    assert EmpiricalDenoiser(data).fingerprint() != EmpiricalDenoiser(data + 1e-6).fingerprint()


def test_bad_input(data):
    with pytest.raises(ValueError, match="chunk_size"):
        EmpiricalDenoiser(data, chunk_size=0)
    with pytest.raises(ValueError, match="data"):
        EmpiricalDenoiser(torch.zeros(5))
    with pytest.raises(ValueError, match="data"):
        EmpiricalDenoiser(torch.tensor([[0.0, math.nan]]))
    D = EmpiricalDenoiser(data)
    with pytest.raises(ValueError, match="sigma"):
        D(torch.zeros(2, 2, 3), 0.0)
    with pytest.raises(ValueError, match="sigma"):
        D(torch.zeros(2, 2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="x"):
        D(torch.zeros(2, 5), 1.0)
