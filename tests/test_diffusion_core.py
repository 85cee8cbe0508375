"""Oracle tests for the diffusion core: noise, grids, preconditioning, losses, samplers, exact denoisers."""

import numpy as np
import pytest
import scipy.stats
import torch

from lightning_pfd.diffusion import (EDMFamily, GaussianDenoiser, GaussianMixtureDenoiser, VPFamily,
                                     euler_sample, heun_sample, karras_sigmas,
                                     sample_endpoints, seeded_noise, seeded_uniform)
from lightning_pfd.diffusion.noise import splitmix64


# ---------------------------------------------------------------- seeded noise
def _splitmix64_py(x: int) -> int:
    """Reference SplitMix64 output function on Python ints mod 2**64 (Steele et al. 2014)."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_splitmix64_matches_python_reference():
    xs = [0, 1, 2, 12345, 2**40 + 7, 2**62 + 3]
    got = splitmix64(torch.tensor(xs, dtype=torch.int64)).tolist()
    want = [_splitmix64_py(x) for x in xs]
    assert [g % (1 << 64) for g in got] == want


def test_seeded_noise_rows_depend_only_on_their_seed():
    a = seeded_noise([5, 9, 11, 3], (3, 4, 4))
    b = seeded_noise([11], (3, 4, 4))
    c = seeded_noise(torch.arange(20), (3, 4, 4))
    assert a.shape == (4, 3, 4, 4) and a.dtype == torch.float64
    assert torch.equal(a[2], b[0]) and torch.equal(a[0], c[5]) and torch.equal(a[3], c[3])
    assert not torch.equal(a[0], a[1])
    # another stream is a different sequence for the same seeds
    assert not torch.allclose(seeded_noise([5], (8,), stream=1), seeded_noise([5], (8,)))


def test_seeded_noise_is_standard_normal_and_uncorrelated():
    z = seeded_noise(torch.arange(400), (250,)).flatten().numpy()
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-3
    # neighbouring seeds are uncorrelated
    zz = seeded_noise(torch.arange(2000), (2,)).numpy()
    r = np.corrcoef(zz[:-1, 0], zz[1:, 0])[0, 1]
    assert abs(r) < 0.08
    u = seeded_uniform(torch.arange(100), 300).flatten().numpy()
    assert u.min() > 0 and u.max() < 1 and scipy.stats.kstest(u, "uniform").pvalue > 1e-3


def test_seeded_noise_rejects_negative_seeds():
    with pytest.raises(ValueError, match="seeds"):
        seeded_noise([-1], (2,))


# ---------------------------------------------------------------- sigma grid
def test_karras_sigmas_against_formula_and_edm_values():
    s = karras_sigmas(18, 0.002, 80.0, 7.0)
    assert s.dtype == torch.float64 and len(s) == 19 and s[-1] == 0
    i = np.arange(18)
    ref = (80 ** (1 / 7) + i / 17 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    np.testing.assert_allclose(s[:-1].numpy(), ref, rtol=1e-14)
    # EDM's 18-step grid (EDM paper eq. 5): first and last values
    np.testing.assert_allclose(s[[0, 1, 2, -4, -3, -2]].numpy(),
                               [80, 57.59, 40.79, 0.02294, 0.007528, 0.002], rtol=5e-4)


@pytest.mark.parametrize("kwargs,field", [({"num_steps": 0}, "num_steps"),
                                          ({"sigma_min": 1.0, "sigma_max": 0.5}, "sigma_min"),
                                          ({"rho": 0.0}, "rho")])
def test_karras_sigmas_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        karras_sigmas(**kwargs)


# ---------------------------------------------------------------- preconditioning
class _Probe(torch.nn.Module):
    """Records its inputs and returns a fixed function of them."""

    def forward(self, x, c_noise):
        self.x_in, self.c_noise = x.clone(), c_noise.clone()
        return torch.tanh(x) + c_noise.reshape(-1, 1)


def test_edm_precond_matches_table1_formulas():
    net, sd = _Probe(), 0.5
    D = EDMFamily(sigma_data=sd).precondition(net)
    x = torch.randn(5, 3)
    sigma = torch.tensor([0.002, 0.1, 0.5, 3.0, 80.0])
    out = D(x, sigma)
    s = sigma[:, None]
    c_skip, c_out = sd**2 / (s**2 + sd**2), s * sd / (s**2 + sd**2).sqrt()
    c_in = 1 / (s**2 + sd**2).sqrt()
    torch.testing.assert_close(net.x_in, c_in * x)
    torch.testing.assert_close(net.c_noise, sigma.log() / 4)
    torch.testing.assert_close(out, c_skip * x + c_out * (torch.tanh(c_in * x) + sigma.log()[:, None] / 4))
    # unit-variance training target (EDM eq. 11): (1 - c_skip)^2 sd^2 + c_skip^2 s^2 = c_out^2
    torch.testing.assert_close((1 - c_skip) ** 2 * sd**2 + c_skip**2 * s**2, c_out**2)
    # the loss weight is 1 / c_out^2 (EDM eq. 8)
    torch.testing.assert_close(EDMFamily(sigma_data=sd).loss().weight(s), 1 / c_out**2)


def test_vp_precond_matches_table1_and_inverts_schedule():
    net = _Probe()
    fam = VPFamily()
    D = fam.precondition(net)
    t = torch.tensor([1e-5, 0.01, 0.3, 1.0], dtype=torch.float64)
    sigma = fam.sigma(t)
    torch.testing.assert_close(fam.sigma_inv(sigma), t, rtol=1e-6, atol=1e-9)
    assert D.sigma_range == pytest.approx((0.001, 152.0), rel=0.01) and D.sigma_range == fam.sigma_range
    x = torch.randn(4, 3)
    out = D(x, sigma.float())
    s = sigma.float()[:, None]
    torch.testing.assert_close(net.x_in, x / (s**2 + 1).sqrt())
    torch.testing.assert_close(net.c_noise, (999 * t).float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, x - s * (torch.tanh(x / (s**2 + 1).sqrt()) + net.c_noise[:, None]))


def test_precond_bad_parameters():
    with pytest.raises(ValueError, match="sigma_data"):
        EDMFamily(sigma_data=0).precondition(_Probe())
    with pytest.raises(ValueError, match="epsilon_t"):
        VPFamily(epsilon_t=0).precondition(_Probe())


# ---------------------------------------------------------------- losses
@pytest.mark.parametrize("loss", [EDMFamily().loss(), VPFamily().loss()])
def test_frozen_loss_is_a_function_of_the_seed_only(loss):
    g = GaussianDenoiser(torch.zeros(6), 0.25 * torch.eye(6))
    y = torch.randn(8, 6)
    seeds = torch.arange(100, 108)
    full = loss(g, y, seeds=seeds)
    part = loss(g, y[3:5], seeds=seeds[3:5])
    torch.testing.assert_close(full[3:5], part)
    torch.testing.assert_close(full, loss(g, y, seeds=seeds))
    assert not torch.allclose(full, loss(g, y, seeds=seeds + 1))
    # per-sample value = weight(sigma) * ||D(y + sigma n) - y||^2 with the drawn (sigma, n)
    sigma, n = loss.draw(y, seeds)
    manual = loss.weight(sigma) * (g(y + sigma[:, None] * n, sigma).float() - y).square().sum(1)
    torch.testing.assert_close(full, manual)


def test_edm_loss_of_exact_denoiser_equals_posterior_variance():
    """For y ~ N(0, s^2 I_d) and the exact denoiser, E||D - y||^2 = d s^2 sigma^2 / (s^2 + sigma^2)."""
    d, s2 = 4, 0.3
    g = GaussianDenoiser(torch.zeros(d), s2 * torch.eye(d))
    seeds = torch.arange(40000)
    y = g.sample(seeds + 10**6).float()
    loss = EDMFamily().loss()
    sigma, _ = loss.draw(y, seeds)
    mse = loss(g, y, seeds=seeds) / loss.weight(sigma)
    expected = d * s2 * sigma**2 / (s2 + sigma**2)
    ratio = float(mse.mean() / expected.mean())
    assert abs(ratio - 1) < 0.02


# ---------------------------------------------------------------- samplers vs eq. 32
def _random_gaussian(d=7, seed=0, lo=0.05, hi=2.0):
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    lam = torch.linspace(lo, hi, d, dtype=torch.float64)
    mean = torch.randn(d, generator=gen, dtype=torch.float64)
    return GaussianDenoiser(mean, (Q * lam) @ Q.T)


def _heun_rel_error(g, steps, seeds):
    sig = karras_sigmas(steps)
    x_T = seeded_noise(seeds, (g.dim,)) * sig[0]
    exact = g.flow_map(x_T, T=float(sig[0]), t=0.0)
    got = heun_sample(g, x_T, sig)
    return float(((got - exact).norm(dim=1) / (exact - g.mean).norm(dim=1)).max())


def test_heun_converges_to_closed_form_flow_at_second_order():
    g, seeds = _random_gaussian(), torch.arange(64)
    errs = {n: _heun_rel_error(g, n, seeds) for n in (18, 64, 128, 256)}
    # measured: 18 steps -> ~5e-2 max relative error (coarse for small-variance directions)
    assert 1e-2 < errs[18] < 0.1
    assert errs[256] < 1e-3
    # second order: doubling the steps divides the error by ~4
    for a, b in ((64, 128), (128, 256)):
        assert 3.0 < errs[a] / errs[b] < 5.0


def test_euler_is_first_order():
    g, seeds = _random_gaussian(), torch.arange(32)
    def err(n):
        sig = karras_sigmas(n)
        x_T = seeded_noise(seeds, (g.dim,)) * sig[0]
        return float((euler_sample(g, x_T, sig) - g.flow_map(x_T, float(sig[0]))).norm(dim=1).max())
    assert 1.6 < err(128) / err(256) < 2.4


def test_heun_nfe_is_35_on_the_18_step_grid():
    g = _random_gaussian(d=3)
    calls = []
    def counting(x, s):
        calls.append(1)
        return g(x, s)
    heun_sample(counting, seeded_noise([0], (3,)) * 80, karras_sigmas(18))
    assert len(calls) == 35


def test_sample_endpoints_independent_of_batch_size():
    g = _random_gaussian(d=5)
    seeds = torch.arange(37)
    a = sample_endpoints(g, seeds, (5,), batch_size=37)
    b = sample_endpoints(g, seeds, (5,), batch_size=6)
    c = sample_endpoints(g, seeds[10:20], (5,), batch_size=4)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a[10:20], c, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="batch_size"):
        sample_endpoints(g, seeds, (5,), batch_size=0)
    with pytest.raises(ValueError, match="sampler"):
        sample_endpoints(g, seeds, (5,), sampler="nope")


# ---------------------------------------------------------------- exact denoisers
def test_gaussian_denoiser_against_linear_solve():
    g = _random_gaussian(d=6, seed=3)
    x = torch.randn(10, 6, dtype=torch.float64)
    sigma = torch.rand(10, dtype=torch.float64) * 3 + 0.01
    want = torch.stack([g.mean + g.cov @ torch.linalg.solve(g.cov + s**2 * torch.eye(6), xi - g.mean)
                        for xi, s in zip(x, sigma)])
    torch.testing.assert_close(g(x, sigma), want)
    with pytest.raises(ValueError, match="cov"):
        GaussianDenoiser(torch.zeros(2), torch.tensor([[1.0, 2.0], [0.0, 1.0]]))


def _random_gmm(K=3, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(K, d, d, generator=gen, dtype=torch.float64) * 0.4
    covs = A @ A.transpose(1, 2) + 0.05 * torch.eye(d, dtype=torch.float64)
    means = torch.randn(K, d, generator=gen, dtype=torch.float64) * 2
    return GaussianMixtureDenoiser(torch.tensor([0.2, 0.5, 0.3][:K]), means, covs)


@pytest.mark.parametrize("sigma", [0.05, 0.4, 2.0])
def test_gmm_denoiser_matches_finite_difference_score(sigma):
    gmm = _random_gmm()
    x = torch.randn(6, 4, dtype=torch.float64) * 1.5
    h = 1e-5
    fd = torch.zeros_like(x)
    for j in range(4):
        e = torch.zeros(4, dtype=torch.float64)
        e[j] = h
        fd[:, j] = (gmm.log_prob(x + e, sigma) - gmm.log_prob(x - e, sigma)) / (2 * h)
    torch.testing.assert_close(gmm.score(x, sigma), fd, rtol=1e-6, atol=1e-6)


def test_gmm_single_component_equals_gaussian_and_samples_have_right_moments():
    g = _random_gaussian(d=4, seed=5)
    gmm = GaussianMixtureDenoiser(torch.ones(1), g.mean[None], g.cov[None])
    x = torch.randn(7, 4, dtype=torch.float64)
    torch.testing.assert_close(gmm(x, 0.7), g(x, 0.7))
    mix = _random_gmm()
    s = mix.sample(torch.arange(60000))
    mean = (mix.weights[:, None] * mix.means).sum(0)
    torch.testing.assert_close(s.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(mix.sample(torch.arange(5, 8)), s[5:8])


def test_gmm_bad_parameters():
    with pytest.raises(ValueError, match="means"):
        GaussianMixtureDenoiser(torch.ones(2), torch.zeros(3, 2), torch.eye(2).repeat(2, 1, 1))
    with pytest.raises(ValueError, match="weights"):
        GaussianMixtureDenoiser(-torch.ones(1), torch.zeros(1, 2), torch.eye(2)[None])
