"""Lévy–Itō model: alpha-stable noise vs scipy, schedule, loss and samplers vs closed forms."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from lightning_pfd.diffusion import GaussianDenoiser, sample_alpha_stable
from lightning_pfd.diffusion.levy import (CosineSchedule, denoiser_dsm_loss, denoiser_to_score,
                                          fractional_dsm_loss, levy_sample, sample_positive_stable,
                                          score_to_eps, subgaussian_constant)
from lightning_pfd.errors import ConfigError

ALPHAS = [1.2, 1.5, 1.8, 2.0]


@pytest.fixture
def scipy_s1():
    """scipy's levy_stable in the S1 parameterization (restored afterwards)."""
    old = stats.levy_stable.parameterization
    stats.levy_stable.parameterization = "S1"
    yield stats.levy_stable
    stats.levy_stable.parameterization = old


def ks_stat(x: np.ndarray, cdf) -> float:
    """KS distance sup |F_n - F| evaluated at 199 sample quantiles (a lower bound of the full
    KS statistic; scipy's stable cdf is too slow for every point)."""
    x = np.sort(x)
    n = x.size
    idx = (np.linspace(0.005, 0.995, 199) * n).astype(int)
    pts = x[idx]
    F = cdf(pts)
    return float(np.max(np.maximum(np.abs((idx + 1) / n - F), np.abs(idx / n - F))))


N_KS = 20000
KS_CRIT = 1.95 / math.sqrt(N_KS)  # KS critical value at level 0.001


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("isotropic", [True, False])
def test_coordinate_marginal_matches_scipy(alpha, isotropic, scipy_s1):
    g = torch.Generator().manual_seed(1)
    eps = sample_alpha_stable(alpha, (N_KS, 3), isotropic=isotropic, generator=g)
    assert eps.dtype == torch.float64 and eps.shape == (N_KS, 3)
    ref = scipy_s1(alpha, 0.0)  # alpha = 2: N(0, 2)
    assert ks_stat(eps[:, 1].numpy(), ref.cdf) < KS_CRIT
    # the same statistic detects a 15% scale error (the torchlevy bug is 20-50%)
    assert ks_stat(0.85 * eps[:, 1].numpy(), ref.cdf) > KS_CRIT


@pytest.mark.parametrize("alpha", [1.2, 1.5, 1.8])
def test_positive_factor_matches_scipy(alpha, scipy_s1):
    A = sample_positive_stable(alpha, N_KS, generator=torch.Generator().manual_seed(2))
    assert bool((A > 0).all())
    assert ks_stat(A.numpy(), scipy_s1(alpha / 2, 1.0).cdf) < KS_CRIT


def test_isotropic_shares_one_factor_per_example():
    """Sub-Gaussian: eps / ||eps|| is uniform on the sphere and ||eps||^2 = A chi2_d, so
    coordinates are dependent (large |eps_1| goes with large |eps_2|), unlike per-coordinate."""
    g = torch.Generator().manual_seed(3)
    iso = sample_alpha_stable(1.5, (20000, 2), isotropic=True, generator=g)
    ind = sample_alpha_stable(1.5, (20000, 2), isotropic=False, generator=g)
    big = lambda e: (e[:, 0].abs() > 10) & (e[:, 1].abs() > 10)  # noqa: E731
    # independent coordinates: P(both > 10) = P(>10)^2 ~ 1e-3 ; isotropic: much larger
    assert big(iso).float().mean() > 5 * big(ind).float().mean()


def test_alpha_two_is_exactly_gaussian_and_constant_two():
    assert subgaussian_constant(2.0) == 0.0
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    eps = sample_alpha_stable(2.0, (7, 4), generator=g1)
    G = torch.randn(7, 4, generator=g2, dtype=torch.float64)
    torch.testing.assert_close(eps, math.sqrt(2) * G)


def test_seeded_rows_depend_only_on_their_seed():
    a = sample_alpha_stable(1.7, (3, 4), seeds=[5, 9, 11], stream=2)
    b = sample_alpha_stable(1.7, (3, 4), seeds=[11, 5], stream=2)
    assert a.shape == (3, 3, 4)
    torch.testing.assert_close(a[0], b[1])
    torch.testing.assert_close(a[2], b[0])
    c = sample_alpha_stable(1.7, (3, 4), seeds=[5], stream=3)
    assert not torch.allclose(a[0], c[0])


@pytest.mark.parametrize("bad", [1.0, 0.5, 2.5, float("nan"), "x"])
def test_bad_alpha_raises(bad):
    with pytest.raises(ValueError, match=r"alpha.*\(1, 2\]"):
        sample_alpha_stable(bad, (4, 2))


def test_bad_shape_and_clamp_raise():
    with pytest.raises(ValueError, match="shape"):
        sample_alpha_stable(1.5, (4, -1))
    with pytest.raises(ValueError, match="clamp_A"):
        sample_alpha_stable(1.5, (4, 2), clamp_A=0.0)


# ----------------------------------------------------------------------------- truncation of A
def test_reject_A_is_the_law_of_A_given_A_below_c():
    """reject_A = c gives A | A < c: two-sample KS (scipy) against unconditioned seeded draws
    filtered below c (independent seeds), at c = 7.22 (DLPM's bound 20 c_alpha at alpha 1.7)
    and c = 2.5; every A < c. A clamped sample fails the same test (its 2.5 % point mass)."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor

    alpha, n = 1.7, 40_000
    free = sample_subgaussian_factor(alpha, n, seeds=range(10**6, 10**6 + 3 * n))[:, 0].numpy()
    for c in (7.22, 2.5):
        rej = sample_subgaussian_factor(alpha, n, seeds=range(n), reject_A=c)[:, 0].numpy()
        assert rej.max() < c
        assert stats.ks_2samp(rej, free[free < c]).pvalue > 1e-3
    clamped = sample_subgaussian_factor(alpha, n, seeds=range(n), clamp_A=20.0)[:, 0].numpy()
    assert stats.ks_2samp(clamped, free[free < 20.0]).pvalue < 1e-6
    assert 0.015 < float(np.mean(clamped == 20.0)) < 0.035  # the clamp's point mass (~2.5 %)


def test_reject_A_generator_path_has_the_conditional_law():
    """Without seeds (training noise) the rejected entries are redrawn from the generator; the
    per-coordinate (non-isotropic) factors have the conditional law as well."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor

    g = torch.Generator().manual_seed(1)
    rej = sample_subgaussian_factor(1.5, 2000, 10, generator=g, reject_A=5.0).reshape(-1).numpy()
    g = torch.Generator().manual_seed(2)
    free = sample_subgaussian_factor(1.5, 6000, 10, generator=g).reshape(-1).numpy()
    assert rej.max() < 5.0
    assert stats.ks_2samp(rej, free[free < 5.0]).pvalue > 1e-3


def test_reject_A_is_seed_reproducible_and_batch_independent():
    """A row depends on its seed only (any batch, any position), and equals the unconditioned
    draw whenever that one was accepted; the noise eps shares its Gaussian factor with the
    unconditioned eps."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor

    seeds = list(range(3000))
    A = sample_subgaussian_factor(1.7, len(seeds), seeds=seeds, reject_A=3.0)
    sub = [2999, 7, 1234, 7]
    torch.testing.assert_close(sample_subgaussian_factor(1.7, 4, seeds=sub, reject_A=3.0),
                               A[sub], rtol=0, atol=0)
    free = sample_subgaussian_factor(1.7, len(seeds), seeds=seeds)
    kept = free < 3.0
    assert 0.1 < float(kept.float().mean()) < 0.95
    assert torch.equal(A[kept], free[kept]) and not torch.equal(A, free)
    e = sample_alpha_stable(1.7, (5,), seeds=seeds, stream=2, reject_A=3.0)
    e_sub = sample_alpha_stable(1.7, (5,), seeds=sub, stream=2, reject_A=3.0)
    torch.testing.assert_close(e_sub, e[sub], rtol=0, atol=0)
    A2 = sample_subgaussian_factor(1.7, len(seeds), seeds=seeds, stream=2, reject_A=3.0)
    G = sample_alpha_stable(2.0, (5,), seeds=seeds, stream=2) / math.sqrt(2.0)  # A = 2 at alpha 2
    torch.testing.assert_close(e, A2.sqrt() * G)


@pytest.mark.parametrize("kw, match", [
    (dict(reject_A=0.0), "reject_A"), (dict(reject_A=-3.0), "reject_A"),
    (dict(reject_A=float("inf")), "reject_A"), (dict(clamp_A=0.0), "clamp_A"),
    (dict(clamp_A=20.0, reject_A=20.0), "at most one"),
])
def test_bad_truncation_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        sample_alpha_stable(1.5, (4, 2), **kw)


def test_reject_A_at_alpha_2_and_too_rare_acceptance():
    """alpha = 2: A = 2, so reject_A <= 2 is refused up front (every draw would be rejected); a
    threshold that almost never accepts stops with a clear error, not an endless loop."""
    with pytest.raises(ValueError, match="reject_A.*> 2"):
        sample_alpha_stable(2.0, (4, 2), reject_A=2.0)
    torch.testing.assert_close(sample_alpha_stable(2.0, (3,), seeds=[1], reject_A=2.5),
                               sample_alpha_stable(2.0, (3,), seeds=[1]))
    with pytest.raises(ValueError, match="accepts too rarely"):
        sample_alpha_stable(1.7, (2,), seeds=range(4), reject_A=1e-3)


def test_module_truncation_defaults_follow_the_reference():
    """LevyItoModule rejects A >= 20 by default in training, prior and SDE noise; clamp is the
    named variant; clamp + reject together is a ConfigError naming both fields."""
    from lightning_pfd.modules import LevyItoModule

    m = LevyItoModule(_Dummy(2))
    assert m.truncation("train") == {"clamp_A": None, "reject_A": 20.0}
    assert m.truncation("generate") == {"clamp_A": None, "reject_A": 20.0}
    m = LevyItoModule(_Dummy(2), reject_A=None, clamp_A=20.0, generate_reject_A=7.22)
    assert m.truncation("train") == {"clamp_A": 20.0, "reject_A": None}
    assert m.truncation("generate") == {"clamp_A": None, "reject_A": 7.22}
    with pytest.raises(ConfigError, match="clamp_A.*reject_A.*reject_A: null"):
        LevyItoModule(_Dummy(2), clamp_A=20.0)
    with pytest.raises(ConfigError, match="generate_clamp_A.*generate_reject_A"):
        LevyItoModule(_Dummy(2), generate_clamp_A=20.0)
    with pytest.raises(ConfigError, match="generate_reject_A"):
        LevyItoModule(_Dummy(2), generate_reject_A="same")
    with pytest.raises(ConfigError, match="reject_A"):
        LevyItoModule(_Dummy(2), reject_A=0.0)


def test_module_draw_and_generate_use_the_rejection():
    """The seeded training noise and the prior of ``generate`` are sample_alpha_stable with the
    module's rejection (row by row, same streams)."""
    from lightning_pfd.diffusion.streams import alpha_stable_stream
    from lightning_pfd.modules import LevyItoModule

    m = LevyItoModule(_Dummy(3), reject_A=4.0)
    _, eps = m.draw(torch.zeros(50, 3), seeds=list(range(50)))
    ref = sample_alpha_stable(1.7, (3,), seeds=range(50),
                              stream=alpha_stable_stream("levy.loss_eps"), reject_A=4.0)
    torch.testing.assert_close(eps, ref)
    free = sample_alpha_stable(1.7, (3,), seeds=range(50), stream=alpha_stable_stream("levy.loss_eps"))
    assert not torch.allclose(eps, free)


def test_clamp_A_bounds_the_factor():
    g = torch.Generator().manual_seed(0)
    eps = sample_alpha_stable(1.2, (5000, 1), isotropic=False, generator=g, clamp_A=4.0)
    g = torch.Generator().manual_seed(0)
    G = torch.randn(5000, 1, generator=g, dtype=torch.float64)  # same Gaussian factor
    assert bool((eps.abs() <= 2.0 * G.abs() + 1e-12).all())


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_schedule_identities(alpha):
    sch = CosineSchedule(alpha)
    t = torch.linspace(1e-4, 0.99, 50, dtype=torch.float64, requires_grad=True)
    g = sch.gamma(t)
    torch.testing.assert_close(sch.sigma(t) ** alpha + g ** alpha, torch.ones_like(g))
    (dlog,) = torch.autograd.grad(g.log().sum(), t)
    torch.testing.assert_close(sch.beta(t), -alpha * dlog)  # beta = -alpha d ln gamma/dt
    assert abs(float(sch.gamma(0.0)) - 1.0) < 1e-12
    if alpha == 2.0:  # VP: gamma^2 + sigma^2 = 1 and gamma = exp(-1/2 int beta)
        torch.testing.assert_close(g ** 2 + sch.sigma(t) ** 2, torch.ones_like(g))


def test_schedule_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        CosineSchedule(2.2)
    with pytest.raises(ValueError, match="t_min, T"):
        CosineSchedule(1.5, T=1.2)


# ----------------------------------------------------------------------------- loss
def test_loss_variants_formulas():
    s = torch.tensor([[0.5, -3.0]])
    eps = torch.tensor([[1.0, 2.0]])
    r = s + eps / 1.5  # [1.1667, -1.6667]
    torch.testing.assert_close(fractional_dsm_loss(s, eps, 1.5, "squared"), r.square().sum(1))
    torch.testing.assert_close(fractional_dsm_loss(s, eps, 1.5, "l2"), r.norm(dim=1), atol=1e-6, rtol=0)
    hub = torch.where(r.abs() < 1, 0.5 * r**2, r.abs() - 0.5).sum(1)
    torch.testing.assert_close(fractional_dsm_loss(s, eps, 1.5, "huber"), hub)
    with pytest.raises(ValueError, match="loss"):
        fractional_dsm_loss(s, eps, 1.5, "abs")


class _Dummy(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.data_shape = (d,)

    def forward(self, x, c_noise):
        return self.lin(x)


def test_alpha_two_loss_equals_gaussian_dsm_minimum():
    """At alpha = 2 with Gaussian data N(mu, diag lam) and the exact score model
    s*(x, t) = sigma * grad log p_t(x) = -sigma (x - gamma mu)/(gamma^2 lam + 2 sigma^2),
    E loss = d/2 - sigma^2 sum 1/(gamma^2 lam + 2 sigma^2) (the Gaussian DSM minimum)."""
    from lightning_pfd.modules import LevyItoModule

    d, n = 3, 20000
    mu = torch.tensor([0.3, -1.0, 0.5], dtype=torch.float64)
    lam = torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)
    m = LevyItoModule(_Dummy(d), alpha=2.0)
    sch = m.schedule

    def exact(x, t):
        g, s = sch.gamma(t)[:, None], sch.sigma(t)[:, None]
        return (-s * (x.double() - g * mu) / (g**2 * lam + 2 * s**2)).float()

    y = mu + lam.sqrt() * torch.randn(n, d, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64)
    seeds = torch.arange(n)
    loss = m.loss_fn(exact, y, seeds=seeds).double()
    t, _ = m.draw(y, seeds)
    g, s = sch.gamma(t)[:, None], sch.sigma(t)[:, None]
    expected = d / 2 - (s**2 / (g**2 * lam + 2 * s**2)).sum(1)
    assert abs(loss.mean() - expected.mean()) < 4 * loss.std() / math.sqrt(n)
    # a wrong model (s = 0) has loss E||eps||^2/4 = d/2: visibly higher
    zero = m.loss_fn(lambda x, t: torch.zeros_like(x), y, seeds=seeds).double().mean()
    assert abs(zero - d / 2) < 0.05 and zero > loss.mean() + 0.1


# ----------------------------------------------------------------------------- samplers
def test_alpha_two_ode_matches_gaussian_vp_closed_form():
    """alpha = 2, data N(mu, Sigma): the LIM ODE equals the Gaussian PF-ODE (PFD eq. 32) in
    sigma-space with sigma_eff = sqrt(2) sigma(t)/gamma(t) and x = gamma * x_sigma."""
    d = 3
    mu = torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64)
    A = torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.2]], dtype=torch.float64)
    gd = GaussianDenoiser(mu, A)
    sch = CosineSchedule(2.0)
    Ainv_cache = {}

    def score(x, t):
        g, s = float(sch.gamma(t)), float(sch.sigma(t))
        C = g**2 * A + 2 * s**2 * torch.eye(d, dtype=torch.float64)
        Ci = Ainv_cache.setdefault(float(t), torch.linalg.inv(C))
        return -(x - g * mu) @ Ci

    x_T = sch.sigma(sch.T) * sample_alpha_stable(2.0, (d,), seeds=range(64))
    t_end = 0.05
    out = levy_sample(score, x_T, sch, num_steps=800, sampler="ode", t_end=t_end)
    gT, sT = float(sch.gamma(sch.T)), float(sch.sigma(sch.T))
    ge, se = float(sch.gamma(t_end)), float(sch.sigma(t_end))
    ref = ge * gd.flow_map(x_T / gT, math.sqrt(2) * sT / gT, math.sqrt(2) * se / ge)
    err = (out - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(err.max()) < 5e-3


def _median_abs_stable(alpha):
    old = stats.levy_stable.parameterization
    stats.levy_stable.parameterization = "S1"
    try:
        return float(stats.levy_stable(alpha, 0.0).ppf(0.75))
    finally:
        stats.levy_stable.parameterization = old


@pytest.mark.parametrize("alpha", [1.5, 1.8, 2.0])
def test_ode_point_mass_exact_scale(alpha):
    """Point mass at 0: x_t = sigma(t) eps, exact fractional score S = -x/(alpha sigma^alpha);
    the exact flow is x_t = sigma(t)/sigma(T) x_T."""
    sch = CosineSchedule(alpha)
    score = lambda x, t: -x / (alpha * sch.sigma(t) ** alpha)  # noqa: E731
    x_T = sch.sigma(sch.T) * sample_alpha_stable(alpha, (2,), seeds=range(32))
    t_end = 0.3
    out = levy_sample(score, x_T, sch, 400, "ode", t_end=t_end)
    ratio = out / x_T
    target = float(sch.sigma(t_end) / sch.sigma(sch.T))
    assert float((ratio - target).abs().max()) < 5e-3 * target  # first-order integrator


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_sde_point_mass_marginal_scale(alpha):
    """SDE with the exact score: the median |x_t| must equal sigma(t) * median |eps| (scipy).
    The reference drift alpha*h*S inflates it at alpha = 1.5 (~1.55x): the test catches it."""
    sch = CosineSchedule(alpha)
    score = lambda x, t: -x / (alpha * sch.sigma(t) ** alpha)  # noqa: E731
    n, d, t_end = 6000, 2, 0.3
    seeds = torch.arange(n)
    x_T = sch.sigma(sch.T) * sample_alpha_stable(alpha, (d,), seeds=seeds)
    noise = lambda i: sample_alpha_stable(alpha, (d,), seeds=seeds, stream=1 + i)  # noqa: E731
    target = float(sch.sigma(t_end)) * _median_abs_stable(alpha)

    def med(drift):
        x = levy_sample(score, x_T, sch, 200, "sde", noise, t_end=t_end, drift_factor=drift)
        return float(x.abs().median())

    assert abs(med(2.0) / target - 1) < 0.05
    if alpha < 2:
        assert med(alpha) / target > 1.3


# ----------------------------------------------------------------------------- r-space samplers
@pytest.mark.parametrize("alpha", [1.5, 1.7, 2.0])
def test_nsr_inverse_and_edm_grid(alpha):
    """r = sigma/gamma and its closed-form inverse; the "edm" grid is EDM's rho-grid in r with
    exact end points T and t_min."""
    sch = CosineSchedule(alpha)
    t = torch.tensor([1e-5, 1e-3, 0.05, 0.5, 0.9, 0.99, sch.T], dtype=torch.float64)
    torch.testing.assert_close(sch.t_of_nsr(sch.nsr(t)), t, rtol=1e-9, atol=1e-13)
    g = sch.gamma(t)
    torch.testing.assert_close(sch.nsr(t), (1 - g**alpha).pow(1 / alpha) / g)
    n, rho = 12, 7.0
    ts = sch.time_grid(n, "edm", rho)
    assert ts.shape == (n + 1,) and float(ts[0]) == sch.T and float(ts[-1]) == sch.t_min
    assert bool((ts[1:] < ts[:-1]).all())
    r = sch.nsr(ts)
    rmax, rmin = float(r[0]), float(r[-1])
    i = torch.arange(n + 1, dtype=torch.float64)
    want = (rmax ** (1 / rho) + i / n * (rmin ** (1 / rho) - rmax ** (1 / rho))) ** rho
    torch.testing.assert_close(r, want, rtol=1e-9, atol=0)
    torch.testing.assert_close(sch.time_grid(n, "uniform"),
                               torch.linspace(sch.T, sch.t_min, n + 1, dtype=torch.float64))


@pytest.mark.parametrize("alpha", [1.5, 1.7, 2.0])
@pytest.mark.parametrize("grid", ["uniform", "edm"])
def test_r_space_samplers_exact_for_a_point_mass(alpha, grid):
    """Point mass at c: x_t = gamma c + sigma eps with eps constant along the flow, i.e.
    y = x/gamma = c + r eps is linear in r. Euler in r ("ddim") and Heun are exact on any grid
    (8 steps, to t_min); the first-order exponential integrator in t ("ode") is not."""
    sch = CosineSchedule(alpha)
    c = torch.tensor([0.3, -0.7], dtype=torch.float64)
    score = lambda x, t: -(x - sch.gamma(t) * c) / (alpha * sch.sigma(t) ** alpha)  # noqa: E731
    eps = sample_alpha_stable(alpha, (2,), seeds=range(16))
    x_T = sch.gamma(sch.T) * c + sch.sigma(sch.T) * eps
    exact = sch.gamma(sch.t_min) * c + sch.sigma(sch.t_min) * eps
    for sampler in ("ddim", "heun"):
        out = levy_sample(score, x_T, sch, 8, sampler, time_grid=grid)
        assert float((out - exact).abs().max()) < 1e-9
    out = levy_sample(score, x_T, sch, 8, "ode", time_grid=grid)
    assert float((out - exact).abs().max()) > 1e-3


def _gaussian_case():
    d = 3
    mu = torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64)
    A = torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.2]], dtype=torch.float64)
    sch = CosineSchedule(2.0)

    def score(x, t):
        g, s = float(sch.gamma(t)), float(sch.sigma(t))
        C = g**2 * A + 2 * s**2 * torch.eye(d, dtype=torch.float64)
        return -(x - g * mu) @ torch.linalg.inv(C)

    x_T = sch.sigma(sch.T) * sample_alpha_stable(2.0, (d,), seeds=range(32))
    gT, sT = float(sch.gamma(sch.T)), float(sch.sigma(sch.T))
    ge, se = float(sch.gamma(sch.t_min)), float(sch.sigma(sch.t_min))
    exact = ge * GaussianDenoiser(mu, A).flow_map(x_T / gT, math.sqrt(2) * sT / gT,
                                                  math.sqrt(2) * se / ge)
    return sch, score, x_T, exact


@pytest.mark.parametrize("grid", ["uniform", "edm"])
def test_heun_is_second_order_against_the_exact_gaussian_flow(grid):
    """alpha = 2, Gaussian data: the exact flow map to t_min is known (PFD eq. 32). Halving the
    step divides the Heun error by ~4 (order 2) and the Euler-type errors by ~2 (order 1)."""
    sch, score, x_T, exact = _gaussian_case()

    def err(sampler, n):
        out = levy_sample(score, x_T, sch, n, sampler, time_grid=grid)
        return float((out - exact).norm(dim=1).max())

    h = [err("heun", n) for n in (16, 32, 64)]
    assert all(3.0 < h[i] / h[i + 1] < 8.0 for i in range(2)), h
    for sampler in ("ode", "ddim"):
        e = [err(sampler, n) for n in (16, 32, 64)]
        assert all(1.7 < e[i] / e[i + 1] < 2.3 for i in range(2)), (sampler, e)
    assert h[-1] < 0.15 * e[-1]


def _two_point_mixture_score(alpha, centres, A_nodes):
    """Exact fractional score of data on two points when the noise is the scale mixture
    eps = sqrt(A) G with A uniform on the given nodes (a discretised sub-Gaussian factor):
    S = sigma^(1-alpha) (-E[eps | x_t]/alpha), with the posterior over (centre, node)."""
    sch = CosineSchedule(alpha)
    d = centres.shape[1]

    def score(x, t):
        g, s = sch.gamma(t), sch.sigma(t)
        diff = x[:, None, :] - g * centres[None]                      # (B, K, d)
        sq = diff.square().sum(-1)[:, :, None]                        # (B, K, 1)
        var = s**2 * A_nodes[None, None, :]                           # (1, 1, M)
        logw = -0.5 * sq / var - 0.5 * d * torch.log(var)             # (B, K, M)
        w = torch.softmax(logw.reshape(x.shape[0], -1), 1).reshape(logw.shape).sum(2)
        eps = (w[:, :, None] * diff).sum(1) / s
        return s.pow(1 - alpha) * (-eps / alpha)

    return sch, score


def test_heun_convergence_alpha_1p7_against_a_fine_grid():
    """alpha = 1.7, data on two points, a smooth exact score (the sub-Gaussian factor
    discretised on 32 CMS draws of A, clamped at 20 as in training). Against a 512-step Heun
    reference (converged to ~1e-7): the Heun error drops >= 4x per halving of the step from 8
    to 32 steps, DDIM's >= 1.6x; at 32 steps Heun on the edm grid is > 1000x closer than the
    first-order exponential integrator on the uniform grid, and the flow ends on a data point."""
    alpha = 1.7
    A = (sample_positive_stable(alpha, 32, generator=torch.Generator().manual_seed(0))
         * subgaussian_constant(alpha)).clamp_max(20.0)
    centres = torch.tensor([[0.6, -0.4], [-0.5, 0.3]], dtype=torch.float64)
    sch, score = _two_point_mixture_score(alpha, centres, A)
    eps = sample_alpha_stable(alpha, (2,), seeds=range(24), clamp_A=20.0)
    x_T = sch.sigma(sch.T) * eps
    ref = levy_sample(score, x_T, sch, 512, "heun", time_grid="edm")

    def err(sampler, n, grid="edm"):
        return float((levy_sample(score, x_T, sch, n, sampler, time_grid=grid) - ref).norm(dim=1).max())

    h = [err("heun", n) for n in (8, 16, 32)]
    e = [err("ddim", n) for n in (8, 16, 32)]
    assert all(h[i] / h[i + 1] > 4.0 for i in range(2)), h
    assert all(e[i] / e[i + 1] > 1.6 for i in range(2)), e
    assert h[-1] < 1e-4 and h[-1] < 1e-3 * err("ode", 32, "uniform")
    # the exact flow ends on a data point, up to r(t_min) |eps| ~ 1.5e-4 |eps|
    dist = (ref[:, None, :] - centres[None]).norm(dim=-1).amin(1)
    assert float(dist.max()) < 5e-3


def test_sampler_bad_arguments():
    sch = CosineSchedule(1.5)
    with pytest.raises(ValueError, match="sampler"):
        levy_sample(lambda x, t: x, torch.zeros(2, 2), sch, 10, "rk4")
    with pytest.raises(ValueError, match="noise_fn"):
        levy_sample(lambda x, t: x, torch.zeros(2, 2), sch, 10, "sde")
    with pytest.raises(ValueError, match="num_steps"):
        levy_sample(lambda x, t: x, torch.zeros(2, 2), sch, 0, "ode")
    with pytest.raises(ConfigError, match="time_grid"):
        levy_sample(lambda x, t: x, torch.zeros(2, 2), sch, 10, "heun", time_grid="karras")
    with pytest.raises(ConfigError, match="rho"):
        sch.time_grid(10, "edm", rho=0.0)


# ----------------------------------------------------------------------------- x0 parameterisation
class _OracleNet(torch.nn.Module):
    """Outputs, from (c_in x, c_noise) alone, what makes LevyScoreNet exact for a point mass at
    c: "eps": -eps/alpha; "x0": F* = (c - c_skip y)/c_out (so that D = c)."""

    def __init__(self, sch, c, param, sigma_data=0.5, M=1000, err=0.0):
        super().__init__()
        self.sch, self.c, self.param, self.sd, self.M, self.err = sch, c, param, sigma_data, M, err
        self.data_shape = tuple(c.shape)

    def forward(self, x_in, c_noise):
        t = c_noise.double() / (self.M - 1)
        g, s = self.sch.gamma(t)[:, None], self.sch.sigma(t)[:, None]
        x = x_in.double() * (g**2 * self.sd**2 + s**2).sqrt()
        if self.param == "eps":
            return -((x - g * self.c) / s) / self.sch.alpha + self.err
        r = s / g
        c_skip, c_out = self.sd**2 / (r**2 + self.sd**2), r * self.sd / (r**2 + self.sd**2).sqrt()
        return (self.c - c_skip * x / g) / c_out + self.err


@pytest.mark.parametrize("alpha", [1.5, 1.7, 2.0])
def test_x0_parameterisation_gives_the_exact_score(alpha):
    """Point mass at c (x0 = c known): the x0-parameterised module with the exact denoiser has
    fractional score -(x - gamma c)/(alpha sigma^alpha), equal to the eps-parameterised module
    with the exact -eps/alpha target, and denoised() = c for both."""
    from lightning_pfd.modules.levy import LevyScoreNet

    sch = CosineSchedule(alpha)
    c = torch.tensor([0.4, -0.8, 0.1], dtype=torch.float64)
    for t in (0.05, 0.3, 0.7, 0.95, 0.99):
        tt = torch.tensor(t, dtype=torch.float64)
        eps = sample_alpha_stable(alpha, (3,), seeds=range(8), clamp_A=20.0)
        x = sch.gamma(tt) * c + sch.sigma(tt) * eps
        exact = -(x - sch.gamma(tt) * c) / (alpha * sch.sigma(tt) ** alpha)
        torch.testing.assert_close(exact, sch.sigma(tt) ** (1 - alpha) * (-eps / alpha))
        S = {}
        for p in ("eps", "x0"):
            w = LevyScoreNet(_OracleNet(sch, c, p), sch, parameterization=p)
            S[p] = w.fractional_score(x, tt)
            torch.testing.assert_close(w.denoised(x, tt), c.expand(8, 3), rtol=0, atol=2e-4)
        torch.testing.assert_close(S["x0"], exact, rtol=2e-5, atol=1e-8)
        torch.testing.assert_close(S["eps"], exact, rtol=2e-5, atol=1e-8)
        # the pure-function form, float64 end to end
        torch.testing.assert_close(denoiser_to_score(c.expand(8, 3), x, sch.gamma(tt), sch.sigma(tt),
                                                     alpha), exact, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(score_to_eps(exact, sch.sigma(tt), alpha), eps)


def test_x0_removes_the_1_over_gamma_amplification():
    """A network error delta becomes a clean-image error alpha r delta with the eps
    parameterisation (r(T) = 119 at alpha = 1.7) but c_out delta <= sigma_data delta with x0."""
    from lightning_pfd.modules.levy import LevyScoreNet

    alpha, delta = 1.7, 0.05
    sch = CosineSchedule(alpha)
    c = torch.tensor([0.4, -0.8], dtype=torch.float64)
    tt = torch.tensor(sch.T, dtype=torch.float64)
    x = sch.gamma(tt) * c + sch.sigma(tt) * sample_alpha_stable(alpha, (2,), seeds=range(4))
    r = float(sch.nsr(tt))
    assert 118 < r < 120
    e = LevyScoreNet(_OracleNet(sch, c, "eps", err=delta), sch, parameterization="eps")
    err_eps = (e.denoised(x, tt) - c).abs()
    torch.testing.assert_close(err_eps, torch.full_like(err_eps, alpha * r * delta), rtol=1e-4, atol=0)
    w = LevyScoreNet(_OracleNet(sch, c, "x0", err=delta), sch, parameterization="x0")
    err_x0 = (w.denoised(x, tt) - c).abs()
    c_out = float(w.c_out(tt))
    torch.testing.assert_close(err_x0, torch.full_like(err_x0, c_out * delta), rtol=1e-4, atol=0)
    assert c_out < 0.5 and float(err_eps.min()) > 100 * float(err_x0.max())


def test_x0_loss_is_the_eps_loss_reweighted():
    """(D - x0)/c_out = alpha r / c_out (s + eps/alpha) for the s implied by D: the x0 loss is the
    eps loss times alpha^2 (1 + r^2/sigma_data^2) per example; both vanish at the exact D."""
    from lightning_pfd.modules import LevyItoModule

    alpha, sd = 1.7, 0.5
    mx = LevyItoModule(_Dummy(3), alpha=alpha, parameterization="x0", sigma_data=sd)
    me = LevyItoModule(_Dummy(3), alpha=alpha, parameterization="eps", sigma_data=sd)
    sch = mx.schedule
    n = 64
    c = torch.tensor([0.4, -0.8, 0.1], dtype=torch.float64)
    y = c.expand(n, 3).clone()
    seeds = torch.arange(n)
    t, eps = mx.draw(y, seeds)
    g, s = sch.gamma(t)[:, None], sch.sigma(t)[:, None]
    assert float(mx.loss_fn(lambda x, tt: c.expand(x.shape[0], 3), y, seeds=seeds).abs().max()) == 0
    exact_s = lambda x, tt: (-((x.double() - g * c) / s) / alpha).float()  # noqa: E731
    assert float(me.loss_fn(exact_s, y, seeds=seeds).max()) < 1e-8
    delta = torch.tensor([0.02, -0.05, 0.03], dtype=torch.float64)
    D_wrong = lambda x, tt: (c + delta).expand(x.shape[0], 3)  # noqa: E731
    lx = mx.loss_fn(D_wrong, y, seeds=seeds)
    r = sch.nsr(t)
    c_out = r * sd / (r**2 + sd**2).sqrt()
    torch.testing.assert_close(lx.double(), delta.square().sum() / c_out**2, rtol=1e-5, atol=0)

    def implied_s(x, tt):  # s = -eps_hat/alpha with eps_hat = (x - gamma D)/sigma
        return (-((x.double() - g * (c + delta)) / s) / alpha).float()

    le = me.loss_fn(implied_s, y, seeds=seeds).double()
    torch.testing.assert_close(lx.double(), le * alpha**2 * (1 + r**2 / sd**2), rtol=2e-3, atol=0)
    with pytest.raises(ConfigError, match="loss"):
        denoiser_dsm_loss(y, y, c_out, "abs")


# ----------------------------------------------------------------------------- module
def test_module_bad_config_raises():
    from lightning_pfd.modules import LevyItoModule

    with pytest.raises(ValueError, match="alpha"):
        LevyItoModule(_Dummy(2), alpha=0.9)
    with pytest.raises(ValueError, match="loss"):
        LevyItoModule(_Dummy(2), loss="abs")
    with pytest.raises(ValueError, match="clamp_A"):
        LevyItoModule(_Dummy(2), clamp_A=-1.0, reject_A=None)
    with pytest.raises(ValueError, match="sampler"):
        LevyItoModule(_Dummy(2), sampler="rk4")
    for kw, field in ((dict(parameterization="x_0"), "parameterization"),
                      (dict(time_grid="karras"), "time_grid"), (dict(rho=-1.0), "rho"),
                      (dict(rho="7"), "rho")):
        with pytest.raises(ConfigError, match=field):
            LevyItoModule(_Dummy(2), **kw)
    with pytest.raises(ConfigError, match="time_grid"):
        LevyItoModule(_Dummy(2)).generate([0], time_grid="log")


def test_500_steps_alpha_1p5_finite_and_generate_reproducible(tmp_path):
    """No NaN/inf over 500 training steps at alpha = 1.5 on heavy-tailed data (tiny MLP)."""
    import lightning.pytorch as pl

    from lightning_pfd.data import TensorDataModule
    from lightning_pfd.modules import LevyItoModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    data = torch.distributions.StudentT(2.5).sample((512, 2)).float()
    dm = TensorDataModule(train_data=data, val_data=data[:64], batch_size=64, value_range=None)
    net = MLPNet(dim=2, hidden=32, depth=2, emb_dim=16)
    m = LevyItoModule(net, alpha=1.5, loss="squared", lr=1e-3, ema_decay=0.99, num_steps=20)
    losses = []

    class Track(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    trainer = pl.Trainer(max_steps=500, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=1,
                         default_root_dir=tmp_path, callbacks=[Track()])
    trainer.fit(m, datamodule=dm)
    assert len(losses) == 500 and all(math.isfinite(v) for v in losses)
    for p in list(m.score_net.parameters()) + list(m.score_model.parameters()):
        assert bool(torch.isfinite(p).all())
    for k in ("train/loss_median", "train/loss_trimmed", "val/loss"):
        assert math.isfinite(float(trainer.callback_metrics[k]))
    # the median summary is robust: below the (heavy-tailed) mean
    assert float(trainer.callback_metrics["train/loss_median_epoch"]) <= \
        float(trainer.callback_metrics["train/loss_epoch"])
    a = m.generate([3, 4, 5], batch_size=2)
    b = m.generate([5, 3], batch_size=7)
    assert a.dtype == torch.float64 and a.shape == (3, 2) and bool(torch.isfinite(a).all())
    # float32 network: batch composition changes matmul rounding only (~1e-6)
    torch.testing.assert_close(a[2], b[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a[0], b[1], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(a[0], a[1], rtol=1e-2)
    s = m.generate([3, 4], sampler="sde", num_steps=10)
    assert bool(torch.isfinite(s).all())


def test_x0_training_finite_and_heun_generate(tmp_path):
    """100 steps of the x0 parameterisation at alpha = 1.7 on heavy-tailed data stay finite;
    Heun on the edm grid generates finite, per-seed reproducible samples."""
    import lightning.pytorch as pl

    from lightning_pfd.data import TensorDataModule
    from lightning_pfd.modules import LevyItoModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    data = torch.distributions.StudentT(2.5).sample((256, 2)).float()
    dm = TensorDataModule(train_data=data, batch_size=64, value_range=None)
    m = LevyItoModule(MLPNet(dim=2, hidden=32, depth=2, emb_dim=16), alpha=1.7, lr=1e-3,
                      parameterization="x0", reject_A=20.0, ema_decay=0.9, num_steps=12,
                      sampler="heun", time_grid="edm")
    pl.Trainer(max_steps=100, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
               default_root_dir=tmp_path).fit(m, datamodule=dm)
    for p in m.score_model.parameters():
        assert bool(torch.isfinite(p).all())
    a = m.generate([3, 4, 5], batch_size=2)
    b = m.generate([5], batch_size=1)
    assert a.shape == (3, 2) and bool(torch.isfinite(a).all())
    torch.testing.assert_close(a[2], b[0], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- x0_A (scale-aware)
class _GaussianScaledOracle(torch.nn.Module):
    """The exact F of the x0_A parameterization for data N(0, v I): given A, y = x_0 + L G with
    L = r sqrt(A), so D = v/(v + L^2) y; F = (D - c_skip y)/c_out from the net's inputs
    (c_in y, c_noise = ln(L)/4), sigma_data = 0.5."""

    def __init__(self, v, d=3):
        super().__init__()
        self.v, self.data_shape = v, (d,)
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x_in, c_noise):
        L = torch.exp(4 * c_noise.double()).reshape(-1, 1)
        sd2 = 0.25
        y = x_in.double() * (L.square() + sd2).sqrt()
        D = self.v / (self.v + L.square()) * y
        c_skip, c_out = sd2 / (L.square() + sd2), L * 0.5 / (L.square() + sd2).sqrt()
        return ((D - c_skip * y) / c_out).float() + 0 * self.dummy


def test_x0_A_preconditioning_and_loss_are_edm_at_the_level_r_sqrt_A():
    """forward = c_skip y + c_out F with EDM's coefficients at L = r(t) sqrt(A) and c_noise =
    ln(L)/4 (brute force); the seeded loss is ||(D - x_0)/c_out(L)||^2 with the A that the seeded
    draw used."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor
    from lightning_pfd.diffusion.streams import alpha_stable_stream
    from lightning_pfd.modules import LevyItoModule

    seen = {}

    class Rec(_Dummy):
        def forward(self, x, c_noise):
            seen["x"], seen["c"] = x.clone(), c_noise.clone()
            return self.lin(x)

    m = LevyItoModule(Rec(3), parameterization="x0_A", sampler="heun", reject_A=None)
    net = m.score_net
    x = torch.randn(4, 3, dtype=torch.float64)
    t = torch.tensor([0.1, 0.4, 0.7, 0.95], dtype=torch.float64)
    A = torch.tensor([0.5, 1.0, 3.0, 30.0], dtype=torch.float64)
    D = net(x, t, A)
    g, r = m.schedule.gamma(t)[:, None], m.schedule.nsr(t)[:, None]
    L = r * A.sqrt()[:, None]
    y = x / g
    c_in, c_skip, c_out = (L**2 + 0.25).rsqrt(), 0.25 / (L**2 + 0.25), L * 0.5 / (L**2 + 0.25).sqrt()
    torch.testing.assert_close(seen["x"], (c_in * y).float())
    torch.testing.assert_close(seen["c"], (L[:, 0].log() / 4).float())
    F = net.net.lin(seen["x"]).double()
    torch.testing.assert_close(D, c_skip * y + c_out * F)
    with pytest.raises(ValueError, match="A:"):
        net(x, t)
    # the loss with the seeded draw's own A
    y0 = torch.randn(6, 3)
    seeds = list(range(6))
    loss = m.loss_fn(net, y0, seeds=seeds)
    tt = m.schedule.sample_t(6, seeds=seeds, stream=stream("levy.loss_t"))
    k = alpha_stable_stream("levy.loss_eps")
    eps = sample_alpha_stable(1.7, (3,), seeds=seeds, stream=k)
    A6 = sample_subgaussian_factor(1.7, 6, seeds=seeds, stream=k)
    xt = m.schedule.gamma(tt)[:, None] * y0.double() + m.schedule.sigma(tt)[:, None] * eps
    L6 = m.schedule.nsr(tt)[:, None] * A6.sqrt()
    want = ((net(xt, tt, A6) - y0.double()) / (L6 * 0.5 / (L6**2 + 0.25).sqrt())).square().sum(1)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)


def test_x0_A_flow_given_A_is_edm_flow_at_level_r_sqrt_A():
    """With the exact denoiser of N(0, v I) data, generate (Heun, EDM grid) follows the closed-form
    flow given each sample's prior factor A: y(r) = y_T sqrt(v + r^2 A)/sqrt(v + r_T^2 A)."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor
    from lightning_pfd.modules import LevyItoModule

    v = 0.3
    m = LevyItoModule(_GaussianScaledOracle(v), parameterization="x0_A", sampler="heun",
                      time_grid="edm", num_steps=200, ema_decay=0.0)
    m.score_model.load_state_dict(m.score_net.state_dict())
    seeds = list(range(40))
    x, x100 = m.generate(seeds, batch_size=16), m.generate(seeds, num_steps=100)
    k = alpha_stable_stream_("levy.sampler", 0)
    eps = sample_alpha_stable(1.7, (3,), seeds=seeds, stream=k, reject_A=20.0)
    A = sample_subgaussian_factor(1.7, 40, seeds=seeds, stream=k, reject_A=20.0)
    sch = m.schedule
    yT = sch.sigma(sch.T) * eps / sch.gamma(sch.T)
    rT, r0 = float(sch.nsr(sch.T)), float(sch.nsr(sch.t_min))
    want = yT * ((v + r0**2 * A) / (v + rT**2 * A)).sqrt() * sch.gamma(sch.t_min)
    err200, err100 = (float(((y - want) / want).abs().max()) for y in (x, x100))
    assert err200 < 1e-3 and err100 / err200 > 3.5  # Heun's second-order convergence to it
    assert float(A.max()) > 4 * float(A.min())  # the levels differ by sample
    with pytest.raises(ValueError, match="sampler"):
        m.generate(seeds[:2], sampler="sde")
    for kw, field in ((dict(isotropic=False), "isotropic"), (dict(sampler="sde"), "sampler"),
                      (dict(sample_compile=True), "sample_compile"), (dict(clamp_eps=3.0), "clamp_eps")):
        with pytest.raises(ConfigError, match=f"{field}.*parameterization x0_A"):
            LevyItoModule(_Dummy(3), parameterization="x0_A", **kw)
        LevyItoModule(_Dummy(3), parameterization="x0", **kw)  # the premise is x0_A's alone


def alpha_stable_stream_(name, i):
    from lightning_pfd.diffusion.streams import alpha_stable_stream

    return alpha_stable_stream(name, i)


def stream(name):
    from lightning_pfd.diffusion.streams import stream as _s

    return _s(name)


# ----------------------------------------------------------------------------- the reference's A scale
def _reference_cms_factor(alpha: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """An independent numpy re-derivation of the law of the LIM reference sampler's factor A:
    Chambers–Mallows–Stuck for a' = alpha/2, beta = 1 with the reference's constant
    (1 + beta^2 tan(pi a'/2))^(1/(2a')) (tan, where CMS has tan^2), times 2 cos(pi alpha/4)^(2/alpha)."""
    ap = alpha / 2.0
    v = rng.uniform(-np.pi / 2, np.pi / 2, n)
    w = rng.exponential(1.0, n)
    b = np.arctan(np.tan(np.pi * ap / 2)) / ap
    s = (1.0 + np.tan(np.pi * ap / 2)) ** (1.0 / (2.0 * ap))
    x = s * np.sin(ap * (v + b)) / np.cos(v) ** (1 / ap) * (np.cos(v - ap * (v + b)) / w) ** ((1 - ap) / ap)
    return x * 2.0 * np.cos(np.pi * alpha / 4) ** (2.0 / alpha)


def test_lim_reference_scale_closed_form():
    """kappa(alpha) = ((1 + tan(pi alpha/4)) cos^2(pi alpha/4))^(1/alpha) = the ratio of the
    reference's CMS constant to the standard one; the documented values; kappa(2) = 1."""
    from lightning_pfd.diffusion.levy import factor_scale, lim_reference_scale

    for a, want in ((1.2, 0.85), (1.5, 0.63), (1.7, 0.474), (1.8, 0.38)):
        ap = a / 2
        ratio = ((1 + math.tan(math.pi * ap / 2)) / (1 + math.tan(math.pi * ap / 2) ** 2)) ** (1 / (2 * ap))
        assert lim_reference_scale(a) == pytest.approx(ratio, rel=1e-12)
        assert lim_reference_scale(a) == pytest.approx(want, abs=0.006)
    assert 20 / lim_reference_scale(1.7) == pytest.approx(42.2, abs=0.05)
    assert lim_reference_scale(2.0) == 1.0 and factor_scale(1.7) == 1.0
    with pytest.raises(ConfigError, match="a_scale"):
        factor_scale(1.7, "reference")


def test_lim_reference_a_scale_matches_an_independent_reference_sampler(scipy_s1):
    """a_scale="lim_reference" draws the law of the reference sampler's A: two-sample KS (10^5
    draws each) against the numpy re-derivation above, unconditioned and with the reference's
    rejection A >= 20 (its draws filtered below 20); P(A >= 20) against the closed form
    P(A' >= 20/(kappa c_alpha)) of scipy's totally skewed alpha/2-stable law (S1) for both
    scales (1.27 % vs 2.53 % at alpha = 1.7); a noise coordinate against scipy's symmetric
    alpha-stable law of scale sqrt(kappa) (grid KS), which rejects scale 1."""
    from lightning_pfd.diffusion.levy import lim_reference_scale, sample_subgaussian_factor

    alpha, n = 1.7, 100_000
    kappa, c_a = lim_reference_scale(alpha), subgaussian_constant(alpha)
    ref = _reference_cms_factor(alpha, 2 * n, np.random.default_rng(7))
    ours = sample_subgaussian_factor(alpha, n, seeds=range(n), a_scale="lim_reference")[:, 0].numpy()
    assert stats.ks_2samp(ours, ref[:n]).pvalue > 1e-3
    std = sample_subgaussian_factor(alpha, n, seeds=range(n))[:, 0].numpy()
    assert stats.ks_2samp(std, ref[:n]).pvalue < 1e-12  # the standard scale is another law
    np.testing.assert_allclose(ours, kappa * std, rtol=1e-12)  # row by row: kappa times the draw
    rej = sample_subgaussian_factor(alpha, n, seeds=range(n), reject_A=20.0,
                                    a_scale="lim_reference")[:, 0].numpy()
    assert rej.max() < 20.0 and stats.ks_2samp(rej, ref[ref < 20.0]).pvalue > 1e-3
    sd = math.sqrt(0.02 / n)
    for scale, a_scale in ((kappa, "lim_reference"), (1.0, "standard")):
        p = float(scipy_s1(alpha / 2, 1.0).sf(20.0 / (scale * c_a)))
        got = std if a_scale == "standard" else ours
        assert abs(float(np.mean(got >= 20.0)) - p) < 4 * sd
    assert float(scipy_s1(alpha / 2, 1.0).sf(20.0 / (kappa * c_a))) == pytest.approx(0.0127, abs=1e-4)
    assert float(scipy_s1(alpha / 2, 1.0).sf(20.0 / c_a)) == pytest.approx(0.0253, abs=1e-4)
    eps = sample_alpha_stable(alpha, (2,), seeds=range(N_KS), stream=3, a_scale="lim_reference")
    assert ks_stat(eps[:, 0].numpy(), scipy_s1(alpha, 0.0, scale=math.sqrt(kappa)).cdf) < KS_CRIT
    assert ks_stat(eps[:, 0].numpy(), scipy_s1(alpha, 0.0).cdf) > KS_CRIT


def test_module_a_scale_reaches_training_noise_and_prior(monkeypatch):
    """LevyItoModule(a_scale="lim_reference") draws its seeded training noise and the prior of
    ``generate`` with the reference's scale and the rejection on the scaled A; "standard" stays
    the default."""
    from lightning_pfd.diffusion.levy import lim_reference_scale, sample_subgaussian_factor
    from lightning_pfd.diffusion.streams import alpha_stable_stream
    from lightning_pfd.modules import LevyItoModule

    assert LevyItoModule(_Dummy(3)).a_scale == "standard"
    m = LevyItoModule(_Dummy(3), a_scale="lim_reference")
    seeds = list(range(2000))
    _, eps, A = m.draw(torch.zeros(2000, 3), seeds=seeds, return_factor=True)
    k = alpha_stable_stream("levy.loss_eps")
    want = sample_subgaussian_factor(1.7, 2000, seeds=seeds, stream=k, reject_A=20.0)
    want_ref = sample_subgaussian_factor(1.7, 2000, seeds=seeds, stream=k, reject_A=20.0 / lim_reference_scale(1.7))
    torch.testing.assert_close(A, want_ref * lim_reference_scale(1.7))
    assert not torch.allclose(A, want * lim_reference_scale(1.7))  # the threshold moved to 42.2
    torch.testing.assert_close(eps, sample_alpha_stable(1.7, (3,), seeds=seeds, stream=k, reject_A=20.0,
                                                        a_scale="lim_reference"))
    import lightning_pfd.modules.levy as mod

    monkeypatch.setattr(mod, "levy_sample", lambda score, x_T, *a, **kw: x_T)  # return the prior
    sch = m.schedule
    prior = sample_alpha_stable(1.7, (3,), seeds=range(50), stream=alpha_stable_stream("levy.sampler", 0),
                                reject_A=20.0, a_scale="lim_reference") * sch.sigma(sch.T)
    torch.testing.assert_close(m.generate(range(50)), prior)
    with pytest.raises(ConfigError, match="a_scale"):
        LevyItoModule(_Dummy(3), a_scale="reference")
