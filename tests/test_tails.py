"""RMSQE / LOADER vs scipy-integrated values for analytic laws; floors; bad input; observables.

Oracles: scipy.integrate.quad of exact quantile functions (RMSQE of known laws), exact rational
arithmetic and a separate numpy step-function integral (empirical RMSQE), scipy.stats.gaussian_kde
+ quad (LOADER's KDEs and integral).
"""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from lightning_pfd.errors import ConfigError
from lightning_pfd.metrics import (LogAbsoluteDensityRatio, RootMeanSquaredQuantileError,
                                   get_observable, loader, register_observable, rmsqe,
                                   same_law_floor)
from lightning_pfd.metrics.tails import (bandwidth_rule, integrate_abs_log_ratio, kde_density,
                                        loader_settings, matched_score, quantile_step_integral,
                                        reference_splits)


def quasi_sample(dist, n):
    """Deterministic 'sample' x_i = Q((i - 1/2)/n): empirical quantiles ~ exact quantiles."""
    return torch.as_tensor(dist.ppf((np.arange(n) + 0.5) / n))


def rmsqe_oracle(p, q, eta, u_max):
    """The former root-mean variant's population value."""
    val, _ = integrate.quad(lambda u: (p.ppf(u) - q.ppf(u)) ** 2, eta, u_max, limit=200)
    return math.sqrt(val / (u_max - eta))


def blog_rmsqe_oracle(p, q, eta):
    """The blog's int_eta^1 (F_p^-1 - F_q^-1)^2 du by quad, in s = 1 - u (isf: exact tails)."""
    val, _ = integrate.quad(lambda s: (p.isf(s) - q.isf(s)) ** 2, 0.0, 1.0 - eta, limit=500)
    return val


# ----------------------------------------------------------------------------- RMSQE
def _step_integral_fraction(g, r, eta):
    """Exact rational int_eta^1 (x_(ceil(n u)) - y_(ceil(m u)))^2 du (independent oracle)."""
    g, r = sorted(Fraction(v) for v in g), sorted(Fraction(v) for v in r)
    n, m = len(g), len(r)
    eta = Fraction(eta)
    cuts = sorted({Fraction(k, n) for k in range(1, n + 1)} | {Fraction(j, m) for j in range(1, m + 1)})
    cuts = [eta] + [c for c in cuts if c > eta]
    total = Fraction(0)
    for a, b in zip(cuts[:-1], cuts[1:]):  # on (a, b] both steps are constant: use b
        i, j = math.ceil(b * n), math.ceil(b * m)
        total += (g[i - 1] - r[j - 1]) ** 2 * (b - a)
    return total


def _step_integral_numpy(g, r, eta, grid=2_000_001):
    """Plain numpy: left-continuous quantile steps on a fine midpoint grid of [eta, 1]."""
    g, r = np.sort(g), np.sort(r)
    u = eta + (np.arange(grid) + 0.5) * (1 - eta) / grid
    qg = g[np.ceil(u * g.size).astype(int) - 1]
    qr = r[np.ceil(u * r.size).astype(int) - 1]
    return float(np.mean((qg - qr) ** 2) * (1 - eta))


@pytest.mark.parametrize("n,m,eta", [(7, 11, 0.5), (40, 40, 0.975), (13, 50, 0.9), (1, 3, 0.2)])
def test_blog_rmsqe_is_the_exact_step_function_integral(n, m, eta):
    rng = np.random.default_rng(n * m)
    g = np.round(rng.standard_t(3, n), 3)  # 3 decimals: exact rationals for the oracle
    r = np.round(rng.standard_normal(m), 3)
    exact = float(_step_integral_fraction(g, r, eta))
    got = float(rmsqe(g, r, eta=eta))
    assert got == pytest.approx(exact, rel=1e-12, abs=1e-15)
    assert got == pytest.approx(_step_integral_numpy(g, r, eta), rel=1e-4)
    assert float(rmsqe(g, r, eta=eta, definition="blog")) == got  # the default is the blog's


def test_blog_rmsqe_sees_the_sample_maximum_exactly():
    """Shifting only the largest sample by d changes the blog integral by exactly d^2/n; the
    former root-mean variant stops at u_max = 1 - 1/n and barely notices."""
    ref = np.sort(stats.norm.rvs(size=1000, random_state=np.random.default_rng(0)))
    gen = ref.copy()
    gen[-1] += 30.0
    assert float(rmsqe(gen, ref)) == pytest.approx(30.0 ** 2 / 1000, rel=1e-12)
    assert float(rmsqe(ref, ref)) == 0.0
    old = float(rmsqe(gen, ref, definition="root_mean_levels"))
    assert old < 0.05 * math.sqrt(float(rmsqe(gen, ref)) / 0.025)  # its root-mean scale


def test_blog_rmsqe_matches_scipy_for_t3_vs_normal():
    """Population value int_0.975^1 (F_t3^-1 - Phi^-1)^2 du by quad vs the empirical estimator.

    The blog integral includes the top cell (1 - 1/n, 1] whose share of the integral shrinks
    like n^(-1/3) for t_3 (38 % of it for n ~ 6000): the estimator converges slowly, so the
    check is at large n and the tolerance follows the measured convergence (quasi-samples:
    17 %, 8 %, 4 % low at n = 1e4, 1e5, 1e6)."""
    p, q, eta = stats.t(df=3), stats.norm(), 0.975
    expected = blog_rmsqe_oracle(p, q, eta)
    assert expected == pytest.approx(0.38291, rel=1e-4)
    beyond, _ = integrate.quad(lambda s: (p.isf(s) - q.isf(s)) ** 2, 0.0, 1.0 / 9050)
    assert 0.3 < beyond / expected < 0.36  # what a cut at u_max = 1 - 1/9050 would miss
    errs = [abs(float(rmsqe(quasi_sample(p, n), quasi_sample(q, n))) / expected - 1)
            for n in (10_000, 1_000_000)]
    assert errs[1] < 0.06 and errs[1] < 0.5 * errs[0]
    rng = np.random.default_rng(0)
    vals = [float(rmsqe(p.rvs(1_000_000, random_state=rng), q.rvs(1_000_000, random_state=rng)))
            for _ in range(3)]
    assert abs(np.median(vals) / expected - 1) < 0.05


@pytest.mark.parametrize("pair", [
    (stats.expon(scale=1.0), stats.expon(scale=2.0)),
    (stats.pareto(b=6.0), stats.pareto(b=10.0)),
])
def test_blog_rmsqe_matches_scipy_integral_light_tails(pair):
    """Lighter tails: the top cell's share (and the quasi-sample's bias there) is small."""
    p, q = pair
    expected = blog_rmsqe_oracle(p, q, 0.975)
    got = rmsqe(quasi_sample(p, 200_000), quasi_sample(q, 200_000), 0.975)
    assert abs(float(got) / expected - 1) < 5e-3
    rng = np.random.default_rng(0)
    got_r = rmsqe(p.rvs(200_000, random_state=rng), q.rvs(200_000, random_state=rng), 0.975)
    assert abs(float(got_r) / expected - 1) < 0.1


def test_quantile_step_integral_unequal_sizes_and_upper_limit():
    rng = np.random.default_rng(3)
    g, r = np.round(rng.exponential(size=9), 2), np.round(rng.exponential(size=6), 2)
    exact = float(_step_integral_fraction(g, r, 0.3))
    assert quantile_step_integral(g, r, 0.3) == pytest.approx(exact, rel=1e-12)
    # u_max < 1 truncates: the difference is the integral over (u_max, 1]
    full, part = float(rmsqe(g, r, eta=0.3)), float(rmsqe(g, r, eta=0.3, u_max=0.8))
    assert full - part == pytest.approx(quantile_step_integral(g, r, 0.8), rel=1e-12)


@pytest.mark.parametrize("pair", [
    (stats.expon(scale=1.0), stats.expon(scale=2.0)),
    (stats.pareto(b=3.0), stats.pareto(b=2.0)),
])
def test_root_mean_levels_variant_matches_scipy_integral(pair):
    p, q = pair
    eta, u_max = 0.975, 0.999
    expected = rmsqe_oracle(p, q, eta, u_max)
    got = rmsqe(quasi_sample(p, 200_000), quasi_sample(q, 200_000), eta, u_max, num_levels=2000,
                definition="root_mean_levels")
    assert abs(float(got) / expected - 1) < 2e-3
    # random samples: same value within sampling error
    rng = np.random.default_rng(0)
    got_r = rmsqe(p.rvs(200_000, random_state=rng), q.rvs(200_000, random_state=rng), eta, u_max,
                  definition="root_mean_levels")
    assert abs(float(got_r) / expected - 1) < 0.1


def test_rmsqe_sees_the_tail_and_ignores_the_bulk():
    """Two laws equal above their 90% quantile but very different in the bulk: RMSQE ~ 0.
    Two laws equal in the bulk but different above the 97.5% quantile: RMSQE large."""
    n = 100_000
    u = (np.arange(n) + 0.5) / n
    base = stats.pareto(b=2.5).ppf(u)
    bulk_changed = np.where(u < 0.9, 0.3 * base, base)  # only the bulk differs
    tail_changed = np.where(u > 0.98, 3.0 * base, base)  # only the tail differs
    for d in ("blog", "root_mean_levels"):
        assert float(rmsqe(bulk_changed, base, definition=d)) < 1e-9
        assert float(rmsqe(tail_changed, base, definition=d)) > 5.0
        # the full-range quantile error (eta -> 0) does see the bulk change
        assert float(rmsqe(bulk_changed, base, eta=0.01, definition=d)) > 0.3


def test_quadrature_matches_scipy_for_analytic_densities():
    p, q = stats.pareto(b=2.0), stats.pareto(b=3.0)
    window, floor = (1.2, 10.0), 1e-12
    # the integrand |log(2/3) + log x| has a kink at x = 1.5 (scipy is told; we are not)
    expected, _ = integrate.quad(lambda x: abs(p.logpdf(x) - q.logpdf(x)), *window, points=[1.5])
    got = integrate_abs_log_ratio(p.pdf, q.pdf, window, floor, panels=32, nodes=8)
    assert abs(got / expected - 1) < 1e-5
    smooth = (2.0, 10.0)  # no kink: Gauss-Legendre is exact to rounding
    expected, _ = integrate.quad(lambda x: abs(p.logpdf(x) - q.logpdf(x)), *smooth)
    assert abs(integrate_abs_log_ratio(p.pdf, q.pdf, smooth, floor, 4, 16) - expected) < 1e-10
    # the density floor caps the log ratio: with a huge floor the integrand vanishes
    assert integrate_abs_log_ratio(p.pdf, q.pdf, window, 10.0) == 0.0


def test_loader_kde_matches_scipy_integral():
    p, q = stats.expon(scale=1.0), stats.expon(scale=2.0)
    window = (0.5, 4.0)  # away from the density jump at 0 (KDE boundary bias)
    expected, _ = integrate.quad(lambda x: abs(p.logpdf(x) - q.logpdf(x)), *window)
    rng = np.random.default_rng(1)
    got = loader(p.rvs(100_000, random_state=rng), q.rvs(100_000, random_state=rng),
                 window=window, floor=1e-12, relative_floor=False)
    assert abs(float(got) / expected - 1) < 0.05


def _exact_kde(sample, h):
    """Scalar exact Gaussian KDE (checked against scipy.stats.gaussian_kde below)."""
    c = 1.0 / (sample.size * h * math.sqrt(2 * math.pi))
    return lambda x: c * math.fsum(np.exp(-0.5 * ((x - sample) / h) ** 2))


def _heavy_pair(seed=7, n_ref=150, n_gen=95, n_out=5):
    """Reference Lomax(3); model Lomax(2) plus a few points beyond the reference maximum."""
    rng = np.random.default_rng(seed)
    ref = stats.lomax(c=3.0).rvs(n_ref, random_state=rng)
    gen = np.concatenate([stats.lomax(c=2.0).rvs(n_gen, random_state=rng),
                          ref.max() + 1.0 + rng.exponential(size=n_out)])
    return gen, ref


def _loader_oracle(gen, ref, h, f):
    """int over the real line of |log max(p, f) - log max(q, f)| with scipy gaussian_kde + quad.

    Outside [min - R, max + R] (union, R = h sqrt(2 log(1/(f h sqrt(2 pi))))) both KDEs are
    below f, so the integrand is 0 there (checked at the ends)."""
    kp = stats.gaussian_kde(gen, bw_method=h / np.std(gen, ddof=1))
    kq = stats.gaussian_kde(ref, bw_method=h / np.std(ref, ddof=1))
    assert math.sqrt(kp.covariance[0, 0]) == pytest.approx(h, rel=1e-12)
    ep, eq = _exact_kde(gen, h), _exact_kde(ref, h)
    probe = np.linspace(min(gen.min(), ref.min()), max(gen.max(), ref.max()), 40)
    np.testing.assert_allclose([ep(x) for x in probe], kp(probe), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose([eq(x) for x in probe], kq(probe), rtol=1e-10, atol=1e-300)
    R = h * math.sqrt(2 * math.log(1 / (f * h * math.sqrt(2 * math.pi))))
    u = np.concatenate([gen, ref])
    lo, hi = u.min() - R, u.max() + R
    assert max(kp([lo - 1e-9, hi + 1e-9]).max(), kq([lo - 1e-9, hi + 1e-9]).max()) < f
    lf = math.log(f)

    def integrand(x):
        return abs(max(math.log(max(ep(x), 1e-300)), lf) - max(math.log(max(eq(x), 1e-300)), lf))

    edges = np.linspace(lo, hi, int((hi - lo) / h) + 2)  # plain subdivision, no kink hints
    total = sum(integrate.quad(integrand, a, b, limit=50, epsabs=1e-10, epsrel=1e-8)[0]
                for a, b in zip(edges[:-1], edges[1:]))
    return total, (lo, hi)


def test_loader_matches_gaussian_kde_and_quad():
    gen, ref = _heavy_pair()
    h = 0.9 * min(np.std(ref, ddof=1), np.subtract(*np.percentile(ref, [75, 25])) / 1.34) \
        * ref.size ** -0.2  # Silverman's rule of thumb, written out
    f = 2e-3
    expected, (lo, hi) = _loader_oracle(gen, ref, h, f)
    got, det = loader(gen, ref, floor=f, relative_floor=False, bandwidth=h, return_details=True)
    assert float(got) == pytest.approx(expected, rel=1e-6)
    assert det["window"] == pytest.approx((lo, hi), rel=1e-12)
    assert det["floor"] == f and det["bandwidth"] == pytest.approx(h, rel=1e-12)
    # an explicit window larger than the effective one adds exactly nothing
    wide = float(loader(gen, ref, window=(lo - 50.0, hi + 50.0), floor=f, relative_floor=False,
                        bandwidth=h))
    assert wide == pytest.approx(float(got), rel=1e-12)
    # defaults: Silverman bandwidth and 1e-3 x the reference KDE's peak (grid maximum here)
    kq = stats.gaussian_kde(ref, bw_method=h / np.std(ref, ddof=1))
    peak = kq(np.linspace(ref.min() - 1, ref.max() + 1, 200_001)).max()
    _, det = loader(gen, ref, return_details=True)
    assert det["bandwidth"] == pytest.approx(h, rel=1e-12)
    assert det["floor"] == pytest.approx(1e-3 * peak, rel=1e-4)
    expected, _ = _loader_oracle(gen, ref, det["bandwidth"], det["floor"])
    assert float(loader(gen, ref)) == pytest.approx(expected, rel=1e-6)


def test_bandwidth_rules_compute_what_their_names_say():
    x = stats.lomax(c=3.0).rvs(500, random_state=np.random.default_rng(0))
    sd, iqr = np.std(x, ddof=1), np.subtract(*np.percentile(x, [75, 25]))
    silverman = 0.9 * min(sd, iqr / 1.34) * 500 ** -0.2
    normal_reference = 1.06 * sd * 500 ** -0.2
    assert bandwidth_rule(x, "silverman") == pytest.approx(silverman, rel=1e-12)
    assert bandwidth_rule(x, "scott") == pytest.approx(normal_reference, rel=1e-12)
    assert bandwidth_rule(x, "normal_reference") == pytest.approx(normal_reference, rel=1e-12)
    assert silverman < 0.8 * normal_reference  # heavy tail: IQR/1.34 << sigma; not the same rule
    assert loader_settings(x)["bandwidth"] == pytest.approx(silverman, rel=1e-12)
    assert loader_settings(x, bandwidth="normal_reference")["bandwidth"] == pytest.approx(normal_reference)
    assert loader_settings(x, bandwidth=0.3)["bandwidth"] == 0.3
    ties = np.r_[np.zeros(80), np.arange(1.0, 21.0)]  # IQR = 0: Silverman falls back on sigma
    assert bandwidth_rule(ties, "silverman") == pytest.approx(0.9 * np.std(ties, ddof=1) * 100 ** -0.2)
    with pytest.raises(ConfigError, match="rule.*silverman"):  # named by the argument, with the close name
        bandwidth_rule(x, "silvermann")
    with pytest.raises(ConfigError, match="bandwidth"):
        kde_density(x, [0.0], bandwidth="silvermann")


def test_loader_sees_generated_mass_beyond_the_reference_maximum():
    """A model that puts 5 % of its mass (or one sample) beyond the data maximum scores worse
    than the same model without it; the former window (the reference's range) cannot tell."""
    rng = np.random.default_rng(0)
    ref, gen = rng.standard_normal(2000), rng.standard_normal(1000)
    beyond = gen.copy()
    beyond[:50] = ref.max() + 2.0 + rng.exponential(size=50)
    one = gen.copy()
    one[0] = 100.0
    base, d0 = loader(gen, ref, return_details=True)
    for g in (beyond, one):
        val, det = loader(g, ref, return_details=True)
        assert float(val) > float(base) + 0.5
        assert det["window"][1] > g.max()  # the window reaches past the generated maximum
        assert det["floor_fraction_ref"] > d0["floor_fraction_ref"]  # ref floored out there
    # former variant: window = reference range, blind to what lies beyond it
    old = [float(loader(g, ref, window="reference")) for g in (gen, one)]
    assert abs(old[1] - old[0]) < 0.05
    # floors are reported and consistent: fractions in [0, 1], 'both' <= each
    for k in ("floor_fraction_gen", "floor_fraction_ref", "floor_fraction_both"):
        assert 0.0 <= d0[k] <= 1.0
    assert d0["floor_fraction_both"] <= min(d0["floor_fraction_gen"], d0["floor_fraction_ref"])
    assert d0["reach"] == pytest.approx(d0["bandwidth"] * math.sqrt(
        2 * math.log(1 / (d0["floor"] * d0["bandwidth"] * math.sqrt(2 * math.pi)))))


def test_loader_handles_astronomical_outliers():
    """Diverging samplers (values ~1e150) neither blow up the cost nor lose the outliers'
    contribution: each isolated sample adds the same amount wherever it lies."""
    rng = np.random.default_rng(1)
    ref, gen = rng.standard_normal(1000), rng.standard_normal(500)
    far = gen.copy()
    far[:3] = [1e3, 1e60, 1e150]
    near = gen.copy()
    near[:3] = [1e3, 2e3, 3e3]
    a, b = float(loader(far, ref)), float(loader(near, ref))
    assert math.isfinite(a) and a == pytest.approx(b, rel=1e-6)


def test_kde_integrates_to_one_and_covers_all_points():
    x = stats.t(df=1.5).rvs(5000, random_state=np.random.default_rng(2))  # huge outliers
    grid = np.linspace(x.min() - 5, x.max() + 5, 400_001)
    dens = kde_density(x, grid)
    assert abs(np.trapezoid(dens, grid) - 1) < 1e-3
    assert kde_density(x, [x.max()])[0] > 0 and kde_density(x, [x.min()])[0] > 0


def test_loader_same_law_sits_at_the_floor():
    dist = stats.lomax(c=3.0)  # Pareto II, heavy tail
    rng = np.random.default_rng(3)
    ref = dist.rvs(4000, random_state=rng)
    window = (0.0, float(np.quantile(ref, 0.999)))
    floor = float(same_law_floor(ref, "loader", num_splits=6, window=window))
    # LOADER(p, p) for independent n/2 samples: same order as the floor
    same = [float(loader(dist.rvs(2000, random_state=rng), dist.rvs(2000, random_state=rng),
                         window=window)) for _ in range(4)]
    assert np.mean(same) < 2.0 * floor and np.mean(same) > 0.3 * floor
    other = float(loader(stats.lomax(c=1.5).rvs(2000, random_state=rng), ref[:2000], window=window))
    assert other > 3 * floor
    assert float(loader(ref, ref, window=window)) == 0.0
    # rmsqe floor: positive and below the score of a different law
    f_q = float(same_law_floor(ref, "rmsqe", num_splits=6))
    assert 0 < f_q < float(rmsqe(stats.lomax(c=1.5).rvs(2000, random_state=rng), ref[:2000]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(eta=0.0), "eta"), (dict(eta=1.0), "eta"), (dict(eta=1.5), "eta"),
    (dict(u_max=0.9), "u_max"), (dict(num_levels=0), "num_levels"),
])
def test_rmsqe_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rmsqe(np.arange(1000.0), np.arange(1000.0), **kwargs)


def test_bad_samples_raise():
    with pytest.raises(ValueError, match="gen"):
        rmsqe([], np.arange(100.0))
    with pytest.raises(ValueError, match="ref"):
        loader(np.arange(100.0), [])
    with pytest.raises(ValueError, match="finite"):
        loader(np.array([1.0, np.nan]), np.arange(10.0))
    with pytest.raises(ValueError, match="u_max"):  # root-mean variant: too few for eta = 0.975
        rmsqe(np.arange(20.0), np.arange(20.0), definition="root_mean_levels")
    assert float(rmsqe(np.arange(20.0), np.arange(20.0))) == 0.0  # the blog's: any size
    with pytest.raises(ConfigError, match="definition"):
        rmsqe(np.arange(20.0), np.arange(20.0), definition="rmse")


@pytest.mark.parametrize("kwargs,match", [
    (dict(window=(2.0, 1.0)), "window"), (dict(window=(0.0, float("inf"))), "window"),
    (dict(window=3.0), "window"), (dict(floor=0.0), "floor"), (dict(bandwidth=-1.0), "bandwidth"),
    (dict(bandwidth="magic"), "bandwidth"), (dict(window="everything"), "window"),
    (dict(panels=0), "panels"), (dict(nodes=0), "nodes"),
])
def test_loader_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        loader(np.arange(100.0), np.arange(100.0), **kwargs)
    if "window" in kwargs or "floor" in kwargs or isinstance(kwargs.get("bandwidth"), str):
        with pytest.raises(ValueError, match=match):
            LogAbsoluteDensityRatio(**kwargs)


def test_metric_classes_equal_functional_and_merge_like_ddp():
    """'cat' states: updating in shards (as DDP ranks would) then merging gives exactly the
    single-process value."""
    rng = np.random.default_rng(4)
    gen = torch.as_tensor(stats.pareto(b=2.2).rvs(3000, random_state=rng))
    ref = torch.as_tensor(stats.pareto(b=2.5).rvs(3000, random_state=rng))
    for Cls, fn in ((RootMeanSquaredQuantileError, rmsqe), (LogAbsoluteDensityRatio, loader)):
        m = Cls()
        m.update(gen[:1000], ref)
        m.update(gen[1000:])
        assert float(m.compute()) == pytest.approx(float(fn(gen, ref)), rel=1e-12)
        a, b = Cls(), Cls()
        a.update(gen[1500:], ref)
        b.update(gen[:1500])  # the reference lives on one "rank" only
        a.merge_state(b)
        assert float(a.compute()) == pytest.approx(float(fn(gen, ref)), rel=1e-12)
        fixed = Cls(reference=ref)
        fixed.update(gen)
        assert float(fixed.compute()) == pytest.approx(float(fn(gen, ref)), rel=1e-12)


def test_rmsqe_metric_bad_eta():
    with pytest.raises(ValueError, match="eta"):
        RootMeanSquaredQuantileError(eta=1.2)


# ----------------------------------------------------------------------------- observables
def test_observables():
    x = torch.tensor([[[1.0, 5.0], [2.0, 0.0]], [[9.0, 9.0], [0.5, 30.0]]])
    torch.testing.assert_close(get_observable("max")(x), torch.tensor([5.0, 30.0], dtype=torch.float64))
    torch.testing.assert_close(get_observable("mean")(x), torch.tensor([2.0, 12.125], dtype=torch.float64))
    exc = get_observable("exceedance", threshold=4.0)(x)
    torch.testing.assert_close(exc, torch.tensor([0.25, 0.75], dtype=torch.float64))
    with pytest.raises(ValueError, match="observable"):
        get_observable("median")
    with pytest.raises(ValueError, match="x"):
        get_observable("max")(torch.zeros(0, 3))

    @register_observable("test_min_obs")
    def _mn(x):
        return x.reshape(x.shape[0], -1).amin(1).double()

    torch.testing.assert_close(get_observable("test_min_obs")(x), torch.tensor([0.0, 0.5], dtype=torch.float64))


# ----------------------------------------------------------------------------- TailMonitor
def test_tail_monitor_logs_metrics_equal_to_recomputation(tmp_path):
    import lightning.pytorch as pl

    from lightning_pfd.callbacks import TailMonitor
    from lightning_pfd.data import TensorDataModule
    from lightning_pfd.modules import LevyItoModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    data = torch.as_tensor(stats.lomax(c=3.0).rvs((256, 4), random_state=np.random.default_rng(5))).float()
    dm = TensorDataModule(train_data=data, val_data=data[:32], batch_size=64, value_range=None)
    model = LevyItoModule(MLPNet(dim=4, hidden=16, depth=1, emb_dim=8), alpha=1.7, num_steps=5,
                          ema_decay=0.9)
    mon = TailMonitor(every_n_epochs=1, num_samples=96, observable="max", eta=0.9,
                      num_splits=2, seed_offset=7)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[mon])
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    for k in ("tail/rmsqe", "tail/loader", "tail/loader_floor", "tail/rmsqe_floor", "tail/nonfinite"):
        assert k in m and math.isfinite(float(m[k]))
    # independent recomputation from the same seeds
    ref = data.double().amax(1)
    gen = model.generate(torch.arange(7, 7 + 96)).amax(1)
    # model and floors: same reference splits (n_gen = 96 vs the other 160), and the settings the
    # monitor's evaluation says it uses (bandwidth / floor frozen on the full reference)
    st = mon.evaluation.metric_settings()
    ls, rq = st["loader"], st["rmsqe"]
    assert rq == dict(eta=0.9, u_max=None, num_levels=200, definition="blog")  # blog: up to u = 1
    rest = [r for _, r in reference_splits(256, 96, 2, 0)]
    assert float(m["tail/rmsqe"]) == pytest.approx(
        np.mean([float(rmsqe(gen, ref[r], eta=0.9)) for r in rest]), rel=1e-5)
    assert float(m["tail/loader"]) == pytest.approx(
        np.mean([float(loader(gen, ref[r], **ls)) for r in rest]), rel=1e-5)
    assert float(m["tail/loader_floor"]) == pytest.approx(
        float(same_law_floor(ref, "loader", 2, n_gen=96, **ls)), rel=1e-5)
    assert float(m["tail/rmsqe_floor"]) == pytest.approx(
        float(same_law_floor(ref, "rmsqe", 2, n_gen=96, eta=0.9)), rel=1e-5)
    assert (tmp_path / "figures" / "tail_density-epoch0000.png").exists()  # base's log_figure
    # resume state: the history and the pass count; the floors are re-derived from the data
    state = mon.state_dict()
    mon2 = TailMonitor()
    mon2.load_state_dict(state)
    assert mon2.history == mon.history and mon2.schedule.passes == mon.schedule.passes == 1
    assert mon.history[-1]["tail/loader_floor"] == mon.evaluation.floors()["loader_floor"]


def test_tail_monitor_bad_config():
    from lightning_pfd.callbacks import TailMonitor

    with pytest.raises(ValueError, match="observable"):
        TailMonitor(observable="nope")
    with pytest.raises(ValueError, match="eta"):
        TailMonitor(eta=1.0)
    with pytest.raises(ValueError, match="reference"):
        TailMonitor(reference="test")
    with pytest.raises(ValueError, match="window"):
        TailMonitor(window=(3.0, 1.0))


# --------------------------------------------------- same-law floor = perfect model
def test_floor_is_the_score_of_a_perfect_model_with_n_gen_samples():
    """A model that samples the reference law exactly (n_gen draws) scores the floor on average.

    Oracle: fresh draws of the true law. The old half split (n_gen = n_ref / 2, default
    u_max) does *not* calibrate LOADER for n_gen = n_ref / 8, which shows the test can fail.
    """
    dist, n_ref, n_gen, eta = stats.expon(), 512, 64, 0.9
    rng = np.random.default_rng(1)
    acc = {k: [] for k in ("r", "rf", "rm", "l", "lf", "lm", "lold")}
    for s in range(150):
        ref = torch.as_tensor(dist.rvs(n_ref, random_state=rng))
        gen = torch.as_tensor(dist.rvs(n_gen, random_state=rng))  # the perfect model
        ls, rq = loader_settings(ref), dict(eta=eta, u_max=1 - 1 / n_gen)
        acc["r"].append(float(rmsqe(gen, ref, **rq)))
        acc["l"].append(float(loader(gen, ref, **ls)))
        acc["rf"].append(float(same_law_floor(ref, "rmsqe", 1, s, n_gen=n_gen, **rq)))
        acc["lf"].append(float(same_law_floor(ref, "loader", 1, s, n_gen=n_gen, **ls)))
        acc["rm"].append(float(matched_score(gen, ref, "rmsqe", 1, s, **rq)))
        acc["lm"].append(float(matched_score(gen, ref, "loader", 1, s, **ls)))
        acc["lold"].append(float(same_law_floor(ref, "loader", 1, s)))
    mean = {k: float(np.mean(v)) for k, v in acc.items()}
    for model, floor in (("r", "rf"), ("rm", "rf"), ("l", "lf"), ("lm", "lf")):
        assert mean[model] == pytest.approx(mean[floor], rel=0.15), (model, floor, mean)
    assert mean["lold"] < 0.8 * mean["l"]  # the half split looked far too optimistic


def test_floor_defaults_and_shared_splits():
    ref = torch.as_tensor(stats.pareto(b=2.5).rvs(200, random_state=np.random.default_rng(4)))
    # default n_gen = n_ref // 2 and u_max = 1 - 1/n_gen: the old half split
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(3))
    old = float(rmsqe(ref[perm[:100]], ref[perm[100:]], eta=0.9))
    assert float(same_law_floor(ref, "rmsqe", 1, 3, eta=0.9)) == pytest.approx(old, rel=1e-12)
    # matched_score with gen = the split's own subset reproduces the floor exactly
    (a, b), = reference_splits(200, 30, 1, 7)
    assert a.numel() == 30 and b.numel() == 170 and set((a.tolist() + b.tolist())) == set(range(200))
    for metric, kw in (("rmsqe", dict(eta=0.9)), ("loader", loader_settings(ref))):
        assert float(matched_score(ref[a], ref, metric, 1, 7, **kw)) == pytest.approx(
            float(same_law_floor(ref, metric, 1, 7, n_gen=30, **kw)), rel=1e-12)
    # torchmetrics classes with splits = matched_score
    gen = ref[:40] * 1.3
    m = RootMeanSquaredQuantileError(eta=0.9, reference=ref, num_splits=3, n_gen=40)
    m.update(gen)
    assert float(m.compute()) == pytest.approx(float(matched_score(gen, ref, "rmsqe", 3, eta=0.9)))
    ls = loader_settings(ref)
    m = LogAbsoluteDensityRatio(reference=ref, num_splits=3, **ls)
    m.update(gen)
    assert float(m.compute()) == pytest.approx(float(matched_score(gen, ref, "loader", 3, **ls)))
    # loader_settings reproduces loader's own data-dependent defaults
    assert float(loader(gen, ref, **ls)) == pytest.approx(float(loader(gen, ref)), rel=1e-12)


@pytest.mark.parametrize("n_gen", [0, -3, 200, 250, 2.5, "ten", True])
def test_same_law_floor_bad_n_gen(n_gen):
    ref = torch.linspace(0, 1, 200, dtype=torch.float64)
    with pytest.raises(ValueError, match="n_gen"):
        same_law_floor(ref, "rmsqe", n_gen=n_gen)
    with pytest.raises(ValueError, match="n_gen"):
        reference_splits(200, n_gen)
    with pytest.raises(ValueError, match="n_gen"):
        matched_score(ref[:10], ref, "rmsqe", n_gen=n_gen)


def test_floor_needs_fewer_generated_than_reference_samples(capsys):
    from lightning_pfd.cli import main
    from lightning_pfd.evaluation.tail import TailEvaluation

    data = torch.arange(65, dtype=torch.float64).reshape(65, 1)
    with pytest.raises(ConfigError, match="num_samples"):
        TailEvaluation(data[:64], num_samples=64).metric_settings()
    st = TailEvaluation(data, num_samples=64).metric_settings()
    assert st["rmsqe"]["u_max"] is None and st["loader"]["relative_floor"] is False  # blog: up to u = 1
    assert main(["pite", "--num-samples", "100", "--n-train", "64"]) == 2
    assert "--num-samples" in capsys.readouterr().err


def test_definitions_and_details_through_classes_and_floors():
    rng = np.random.default_rng(9)
    ref = torch.as_tensor(stats.lomax(c=2.5).rvs(400, random_state=rng))
    gen = torch.as_tensor(stats.lomax(c=2.0).rvs(100, random_state=rng))
    for d in ("blog", "root_mean_levels"):
        m = RootMeanSquaredQuantileError(eta=0.9, reference=ref, definition=d)
        m.update(gen)
        assert float(m.compute()) == pytest.approx(float(rmsqe(gen, ref, eta=0.9, definition=d)), rel=1e-12)
    # floors: the blog definition integrates to 1 (no u_max); the root-mean variant's u_max
    # defaults to 1 - 1/n_gen
    (a, b), = reference_splits(400, 100, 1, 0)
    assert float(same_law_floor(ref, "rmsqe", 1, 0, 100, eta=0.9)) == pytest.approx(
        float(rmsqe(ref[a], ref[b], eta=0.9)), rel=1e-12)
    assert float(same_law_floor(ref, "rmsqe", 1, 0, 100, eta=0.9, definition="root_mean_levels")) \
        == pytest.approx(float(rmsqe(ref[a], ref[b], eta=0.9, u_max=0.99,
                                     definition="root_mean_levels")), rel=1e-12)
    with pytest.raises(ConfigError, match="definition"):
        RootMeanSquaredQuantileError(definition="root")
    m = LogAbsoluteDensityRatio(reference=ref)
    m.update(gen)
    val = m.compute()
    assert m.last_details["value"] == pytest.approx(float(val))
    assert 0 < m.last_details["floor_fraction_ref"] < 1
    # window="reference": one window (the full reference's range) for every split
    ls = loader_settings(ref, window="reference")
    assert ls["window"] == (float(ref.min()), float(ref.max()))
    assert float(same_law_floor(ref, "loader", 2, 0, 100, window="reference")) == pytest.approx(
        float(same_law_floor(ref, "loader", 2, 0, 100, window=ls["window"])), rel=1e-12)


# ----------------------------------------------------------------------------- RMSQE contributions
def _contributions_fraction(g, r, eta):
    """Exact rational int over each generated sample's quantile cell ((k-1)/n, k/n] ∩ [eta, 1]
    of (x_(ceil(n u)) - y_(ceil(m u)))^2 du (independent oracle, sorted order of g)."""
    g, r = sorted(Fraction(v) for v in g), sorted(Fraction(v) for v in r)
    n, m = len(g), len(r)
    eta = Fraction(eta)
    cuts = sorted({Fraction(k, n) for k in range(1, n + 1)} | {Fraction(j, m) for j in range(1, m + 1)})
    cuts = [eta] + [c for c in cuts if c > eta]
    out = [Fraction(0)] * n
    for a, b in zip(cuts[:-1], cuts[1:]):
        i, j = math.ceil(b * n), math.ceil(b * m)
        out[i - 1] += (g[i - 1] - r[j - 1]) ** 2 * (b - a)
    return [float(v) for v in out]


@pytest.mark.parametrize("n,m,eta", [(7, 11, 0.5), (40, 40, 0.975), (13, 50, 0.9)])
def test_quantile_step_contributions_split_the_integral_by_sample(n, m, eta):
    from lightning_pfd.metrics.tails import quantile_step_contributions

    rng = np.random.default_rng(n * m)
    g, r = rng.standard_t(2.0, n), rng.standard_t(3.0, m)
    c = quantile_step_contributions(g, r, eta)
    np.testing.assert_allclose(c, _contributions_fraction(g, r, eta), rtol=1e-12, atol=1e-15)
    assert c.sum() == pytest.approx(quantile_step_integral(g, r, eta), rel=1e-12)


def test_matched_rmsqe_contributions_and_top_share():
    """Entries in the order of gen, averaged over the matched splits, sum to the matched blog
    RMSQE; one sample far out carries (almost) all of it, and top_share says so."""
    from lightning_pfd.metrics.tails import matched_rmsqe_contributions, top_share

    rng = np.random.default_rng(3)
    ref = torch.as_tensor(rng.standard_normal(300))
    gen = torch.as_tensor(rng.standard_normal(80))
    gen[17] = 40.0
    c = matched_rmsqe_contributions(gen, ref, 4, 2, eta=0.9)
    total = float(matched_score(gen, ref, "rmsqe", 4, 2, eta=0.9))
    assert float(c.sum()) == pytest.approx(total, rel=1e-12)
    brute = np.zeros(80)
    order = np.argsort(gen.numpy(), kind="stable")
    for _, b in reference_splits(300, 80, 4, 2):
        brute[order] += _contributions_fraction(gen.numpy(), ref[b].numpy(), 0.9)
    np.testing.assert_allclose(c.numpy(), brute / 4, rtol=1e-12, atol=1e-15)
    assert int(c.argmax()) == 17
    share = top_share(c)
    assert share == pytest.approx(float(c[17]) / total, rel=1e-12) and share > 0.9
    assert math.isnan(top_share(torch.zeros(3)))


def test_hill_tail_index_brute_force_and_pareto():
    """The formula on a small sample by hand; on Pareto(alpha = 1.5) draws the estimate lies
    within 4 standard errors of 1.5; non-positive thresholds give NaN; bad k is refused."""
    from lightning_pfd.metrics.tails import hill_tail_index

    x = [5.0, 1.0, 3.0, 2.0, 8.0]
    h = hill_tail_index(x, 2)  # top 2: 8, 5 over the threshold 3
    want = 2 / (math.log(8 / 3) + math.log(5 / 3))
    assert h["alpha"] == pytest.approx(want, rel=1e-14) and h["threshold"] == 3.0
    assert h["se"] == pytest.approx(want / math.sqrt(2), rel=1e-14)
    rng = np.random.default_rng(0)
    p = stats.pareto(1.5).rvs(20000, random_state=rng)
    h = hill_tail_index(p, 2000)
    assert abs(h["alpha"] - 1.5) < 4 * h["se"] and h["se"] < 0.05
    assert math.isnan(hill_tail_index([-3.0, -2.0, 0.0, 1.0], 3)["alpha"])
    for bad in (0, 5, 2.5):
        with pytest.raises(ConfigError, match="k"):
            hill_tail_index(x, bad)


def _pareto_images(rng, n_images, alpha=2.5, max_copies=5):
    """One Pareto(alpha) peak per image, seen by 1..max_copies overlapping crops (duplicated
    values), as the crop maxima of the PITE data: (values, image index)."""
    peaks = stats.pareto(alpha).rvs(n_images, random_state=rng)
    reps = rng.integers(1, max_copies + 1, n_images)
    return np.repeat(peaks, reps), np.repeat(np.arange(n_images), reps), peaks


def test_hill_with_duplicated_values_distinct_and_bootstrap():
    """Pareto(2.5) peaks, each repeated 1-5 times (shared peaks): ``distinct=True`` gives exactly
    the estimate of the undeduplicated peaks; the naive alpha/sqrt(k) of the duplicated sample is
    too small, the bootstrap over images is not (its sd within 35 % of the asymptotic se of the
    independent peaks); ``distinct_top`` counts the distinct values among the top k."""
    from lightning_pfd.metrics.tails import hill_bootstrap, hill_tail_index

    rng = np.random.default_rng(3)
    vals, img, peaks = _pareto_images(rng, 4000)
    k = 400
    h_peaks = hill_tail_index(peaks, k)
    h_dist = hill_tail_index(vals, k, distinct=True)
    assert h_dist["alpha"] == pytest.approx(h_peaks["alpha"], rel=1e-12) and h_dist["n"] == 4000
    h_dup = hill_tail_index(vals, 3 * k)
    assert h_dup["distinct_top"] < 0.5 * 3 * k  # the top values are heavily tied
    assert abs(h_peaks["alpha"] - 2.5) < 4 * h_peaks["se"]
    b = hill_bootstrap(vals, img, k_fraction=3 * k / vals.size, num_boot=300, seed=1)
    assert b["groups"] == 4000 and b["n"] == vals.size and b["lo"] < b["alpha"] < b["hi"]
    assert b["boot_sd"] == pytest.approx(h_peaks["se"], rel=0.35)
    assert h_dup["se"] < 0.7 * b["boot_sd"]  # the naive error bar overstates the precision
    hd = hill_bootstrap(vals, img, k_fraction=0.1, num_boot=50, seed=1, distinct=True)
    assert hd["distinct"] and hd["alpha"] == pytest.approx(hill_tail_index(peaks, 400)["alpha"], rel=1e-12)
    for kw, field in ((dict(k_fraction=1.0), "k_fraction"), (dict(k_fraction=0.1, level=0.0), "level"),
                      (dict(k_fraction=0.1, num_boot=0), "num_boot")):
        with pytest.raises(ValueError, match=field):
            hill_bootstrap(vals, img, **kw)
    with pytest.raises(ValueError, match="groups"):
        hill_bootstrap(vals, img[:-1], 0.1)


def test_hill_bootstrap_over_images_covers_the_index():
    """Coverage on 40 synthetic data sets of 300 images with duplicated peaks (alpha = 2.5,
    k = 10 %): the 90 % bootstrap interval over images covers 2.5 in >= 75 % of them, more often
    than the naive alpha +- 1.645 alpha/sqrt(k) on the duplicated values."""
    from lightning_pfd.metrics.tails import hill_bootstrap

    rng = np.random.default_rng(11)
    boot = naive = 0
    for _ in range(40):
        vals, img, _ = _pareto_images(rng, 300)
        b = hill_bootstrap(vals, img, k_fraction=0.1, num_boot=150, seed=int(rng.integers(1 << 30)))
        boot += b["lo"] <= 2.5 <= b["hi"]
        naive += abs(b["alpha"] - 2.5) <= 1.645 * b["se_asymptotic"]
    assert boot >= 30 and boot > naive


def test_image_tiles_are_non_overlapping_windows():
    from lightning_pfd.metrics.tails import image_tiles

    x = torch.arange(2 * 7 * 9, dtype=torch.float64).reshape(2, 7, 9)
    t, g = image_tiles(x, 3)
    assert t.shape == (2 * 2 * 3, 1, 3, 3) and g.tolist() == [0] * 6 + [1] * 6
    for i in range(2):  # brute force: tile (r, c) of image i
        for r in range(2):
            for c in range(3):
                torch.testing.assert_close(t[i * 6 + r * 3 + c, 0], x[i, 3 * r:3 * r + 3, 3 * c:3 * c + 3])
    assert t.reshape(-1).unique().numel() == t.numel()  # no pixel in two tiles
    for bad in (0, 8):
        with pytest.raises(ValueError, match="size"):
            image_tiles(x, bad)
