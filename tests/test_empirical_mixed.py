"""Mixed-precision EmpiricalDenoiser (float32 candidate search + float64 rescoring, PFD paper
eq. 46) against a brute-force float64 softmax over full distance matrices (docs/empirical_denoiser.md).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from lightning_pfd.diffusion import EmpiricalDenoiser, heun_sample, karras_sigmas, seeded_noise
from lightning_pfd.diffusion.empirical import _above, _top_per_row, fp32_cross_term_bound
from lightning_pfd.errors import ConfigError

GRID = [float(s) for s in karras_sigmas(18)[:-1]]  # 80 ... 0.002, the EDM grid
# (probe_rows, dense_fraction, max_candidates): the defaults, and knobs that send rows to the
# float64 fallback at small sizes (the result must not depend on them)
KNOBS = [None, (3, 0.5, 3)]


def oracle(x, data, sigma):
    """softmax_i(-||x - y_i||^2 / (2 sigma^2)) @ y from the full float64 distance matrix."""
    xf = x.reshape(len(x), -1).double()
    y = data.reshape(len(data), -1).double()
    d2 = ((xf[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    s = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1)
    logw = -d2 / (2 * s ** 2)
    w = torch.exp(logw - torch.logsumexp(logw, dim=1, keepdim=True))
    return (w @ y).reshape(x.shape)


def smooth_images(n, seed):
    """(n, 1, 8, 8) images in [-1, 1] built from upsampled 2x2 and 4x4 noise."""
    g = torch.Generator().manual_seed(seed)
    img = sum(a * F.interpolate(torch.randn(n, 1, r, r, generator=g, dtype=torch.float64), size=(8, 8),
                                mode="bilinear", align_corners=False) for r, a in ((2, 1.0), (4, 0.5)))
    return torch.tanh(img)


def make(data, chunk=4096, knobs=None, **kw):
    den = EmpiricalDenoiser(data, chunk_size=chunk, **kw)
    den.float64_fast = False  # the float32 search under test (small N on a CPU would skip it)
    if knobs is not None:
        den.probe_rows, den.dense_fraction, den.max_candidates = knobs
    return den


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def images():
    return smooth_images(45, seed=0)


def noisy_queries(data, sigma, seed, m=12):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(data), (m,), generator=g)
    return data[idx] + sigma * torch.randn(m, *data.shape[1:], generator=g, dtype=torch.float64)


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("chunk", [7, 45, 1000])  # 7 does not divide N = 45
def test_every_grid_sigma_matches_oracle_and_float64(images, chunk, knobs):
    mixed = make(images, chunk, knobs)
    exact = EmpiricalDenoiser(images, chunk_size=chunk, precision="float64")
    for k, sigma in enumerate(GRID):
        x = noisy_queries(images, sigma, seed=k)
        out = mixed(x, sigma)
        assert out.dtype == torch.float64 and out.shape == x.shape
        close(out, oracle(x, images, sigma))
        close(out, exact(x, sigma))


def test_fast_path_is_used_at_small_sigma_and_fallback_at_large(images):
    den = make(images, 16, (4, 0.25, 3))
    x = noisy_queries(images, 0.002, seed=1)
    den(x, 0.002)
    assert den.last_stats["dense_rows"] == 0
    assert max(den.last_stats["candidates"]) == 1  # one basin per row at sigma = 0.002
    den(noisy_queries(images, 80.0, seed=2), 80.0)
    assert den.last_stats["dense_rows"] == 12  # every point is a candidate at sigma = 80


def _tie_queries(data, i, j, sigma, gaps):
    """Points x with ||x - y_i||^2 - ||x - y_j||^2 = gap * 2 sigma^2 (log-weight gap), off the
    segment by a vector orthogonal to y_j - y_i."""
    yi, yj = data[i].flatten(), data[j].flatten()
    u = (yj - yi) / (yj - yi).norm()
    g = torch.Generator().manual_seed(5)
    v = torch.randn(yi.numel(), generator=g, dtype=torch.float64)
    v = 1e-3 * (v - (v @ u) * u)
    h = float((yj - yi).norm()) / 2
    rows = [0.5 * (yi + yj) + v + (gap * 2 * sigma ** 2 / (4 * h)) * u for gap in gaps]
    return torch.stack(rows).reshape(len(gaps), *data.shape[1:])


@pytest.mark.parametrize("knobs", KNOBS)
def test_near_ties(images, knobs):
    data = images.clone()
    data[1] = data[0] + 0.05 * (data[2] - data[0])  # a close pair: its midpoint is in both basins
    den = make(data, 10, knobs)
    for sigma in [0.002] + GRID:
        # log-weight gaps from an exact tie (1e-12 in squared distance) to beyond T
        gaps = [0.0, 1e-12 / (2 * sigma ** 2), 1e-6, 0.3, 5.0, 30.0, 44.0, 60.0]
        x = _tie_queries(data, 0, 1, sigma, gaps)
        close(den(x, sigma), oracle(x, data, sigma))


def test_exact_tie_gives_the_midpoint(images):
    data = images.clone()
    data[1] = data[0] + 0.05 * (data[2] - data[0])
    x = _tie_queries(data, 0, 1, 0.002, [0.0])
    out = make(data, 8)(x, 0.002)
    torch.testing.assert_close(out[0], 0.5 * (data[0] + data[1]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("knobs", KNOBS)
def test_duplicates_split_the_weight(images, knobs):
    """Three copies of y_a and one of y_b, x equidistant: D* = (3 y_a + y_b) / 4 (closed form)."""
    ya = images[3]
    yb = ya + 0.05 * (images[4] - ya)
    data = torch.cat([images[5:], ya.expand(3, -1, -1, -1), yb[None]])
    x = _tie_queries(torch.stack([ya, yb]), 0, 1, 0.002, [0.0])
    out = make(data, 9, knobs)(x, 0.002)
    torch.testing.assert_close(out[0], (3 * ya + yb) / 4, rtol=0, atol=1e-7)
    for sigma in GRID:
        close(make(data, 9, knobs)(x, sigma), oracle(x, data, sigma))


def test_many_duplicates_beyond_the_candidate_limit(images):
    data = torch.cat([images, images[7].expand(80, -1, -1, -1)])  # 81 copies of y_7 > 64
    x = images[7:8] + 1e-4
    den = make(data, 32)
    for sigma in (0.002, 0.5, 80.0):
        close(den(x, sigma), oracle(x, data, sigma))
    den(x, 0.002)
    assert den.last_stats["dense_rows"] == 1


@pytest.mark.parametrize("knobs", KNOBS)
def test_x_exactly_on_a_training_point(images, knobs):
    x = images[[4, 9, 9, 30]]
    den = make(images, 11, knobs)
    torch.testing.assert_close(den(x, 0.002), x, rtol=0, atol=1e-12)
    for sigma in GRID:
        close(den(x, sigma), oracle(x, images, sigma))


@pytest.mark.parametrize("offset", [1e4, -3e5])
def test_very_large_norms(images, offset):
    """Data far from the origin: centring keeps the float32 bound small, and candidates are
    rescored from exact differences (float64 cross terms would lose ~1e-5 of a squared norm
    ~1e13 here)."""
    data = images + offset
    data[1] = data[0] + 0.05 * (data[2] - data[0])
    den = make(data, 13)
    for sigma in [0.002] + GRID:
        x = torch.cat([_tie_queries(data, 0, 1, sigma, [0.0, 0.5, 3.0]), noisy_queries(data, sigma, 3, 4)])
        close(den(x, sigma), oracle(x, data, sigma))


def test_two_far_clusters_keep_each_cluster_as_candidates(images):
    """Clusters at +-1e4: the mean is near 0, ||y - mu|| ~ 8e4 and the float32 margin (~5e4 in
    squared distance) admits the whole nearby cluster but not the other one."""
    data = torch.cat([images[:20] + 1e4, images[20:40] - 1e4])
    data[1] = data[0] + 0.05 * (data[2] - data[0])
    den = make(data, 16)
    den.max_candidates = 32  # keep 20-candidate rows on the rescoring path (float64 cross terms
    # of the fallback lose ~1e-5 of ||y||^2 ~ 6e9 here, like the float64 algorithm)
    for sigma in (0.002, 0.3, 40.0):
        x = torch.cat([_tie_queries(data, 0, 1, sigma, [0.0, 2.0]), noisy_queries(data, sigma, 4, 4)])
        close(den(x, sigma), oracle(x, data, sigma))
    den(noisy_queries(data, 0.002, 4, 4), 0.002)
    assert den.last_stats["dense_rows"] == 0 and max(den.last_stats["candidates"]) == 20


def test_float32_overflow_takes_the_float64_path():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(10, 6, generator=g, dtype=torch.float64) * 1e19  # ||y||^2 ~ 1e38 > 2^120
    x = data[:3] * 1.01
    mixed, exact = make(data, 4), EmpiricalDenoiser(data, chunk_size=4, precision="float64")
    torch.testing.assert_close(mixed(x, 1e18), exact(x, 1e18), rtol=1e-12, atol=0)
    assert mixed.last_stats["dense_rows"] == 3


def test_per_sample_sigma_mixes_sparse_and_dense_rows(images):
    sig = torch.tensor([0.002, 80.0, 0.5, 5.0, 0.02, 40.0, 2.0], dtype=torch.float64)
    x = noisy_queries(images, 1.0, seed=6, m=7)
    for knobs in KNOBS:
        close(make(images, 10, knobs)(x, sig), oracle(x, images, sig))


def test_rows_with_one_two_and_all_candidates_in_one_batch(images):
    """One candidate, a tie (two) and a dense row together: as many pairs as rows, but not one
    per row."""
    data = images.clone()
    data[1] = data[0] + 0.05 * (data[2] - data[0])
    x = torch.cat([images[5:6] + 1e-4, _tie_queries(data, 0, 1, 0.002, [0.0]), images[7:8]])
    sig = torch.tensor([0.002, 0.002, 80.0], dtype=torch.float64)
    den = make(data, 45, (1, 0.5, 2))
    close(den(x, sig), oracle(x, data, sig))
    assert den.last_stats["dense_rows"] == 1 and den.last_stats["candidates"] == [1, 2]


@pytest.mark.parametrize("sigma", [0.002, 1.0, 80.0])
def test_batch_of_one(images, sigma):
    x = noisy_queries(images, sigma, seed=7, m=1)
    close(make(images, 6)(x, sigma), oracle(x, images, sigma))


def test_non_finite_rows_stay_non_finite_and_do_not_spoil_others(images):
    x = noisy_queries(images, 0.1, seed=8, m=3)
    x[1, 0, 0, 0] = math.nan
    out = make(images, 10)(x, 0.1)
    assert bool(torch.isnan(out[1]).all())
    close(out[[0, 2]], oracle(x[[0, 2]], images, 0.1))


def test_lower_precision_settings_do_not_leak_into_the_float32_pass(images):
    """Under bf16 autocast, or with the oneDNN float32 matmuls set to bf16, the result is still
    exact and the caller's setting is restored."""
    data = torch.cat([images[:20] + 100, images[20:40] - 100])  # bf16 would lose the winners here
    data[1] = data[0] + 0.05 * (data[2] - data[0])
    x = torch.cat([_tie_queries(data, 0, 1, 0.01, [0.0, 1.0, 8.0]), noisy_queries(data, 0.01, 9, 4)])
    den = make(data, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        close(den(x, 0.01), oracle(x, data, 0.01))
    backend = torch.backends.mkldnn.matmul
    if not hasattr(backend, "fp32_precision"):
        pytest.skip("this torch has no per-backend fp32_precision switch")
    old = backend.fp32_precision
    try:
        backend.fp32_precision = "bf16"
        close(den(x, 0.01), oracle(x, data, 0.01))
        assert backend.fp32_precision == "bf16"
    finally:
        backend.fp32_precision = old


@pytest.mark.parametrize("dim", [64, 3072])
def test_error_bound_holds_on_adversarial_sums(dim):
    """|G_i - t_i| <= E (eq. B of docs/empirical_denoiser.md) for all-positive vectors, where
    float32 rounding errors of the cross term accumulate without cancelling."""
    g = torch.Generator().manual_seed(dim)
    X = torch.rand(16, dim, generator=g, dtype=torch.float64) * 3 + 1
    Y = torch.rand(40, dim, generator=g, dtype=torch.float64) * 3 + 1
    q = Y.square().sum(1)
    G = torch.addmm(q.float(), X.float(), Y.float().T, beta=-1.0, alpha=2.0).double()
    t = 2 * X @ Y.T - q  # float64: its own error is ~1e-9 of the bound
    E = fp32_cross_term_bound(X.norm(dim=1), float(Y.norm(dim=1).max()), float(q.max()), dim)
    err = (G - t).abs().amax(1)
    assert bool((err <= E).all())
    assert float((err / E).max()) > 1e-5  # float32 error is present and the bound is not absurd
    assert bool((fp32_cross_term_bound(X.norm(dim=1), 1.0, 1.0, dim, "tf32")
                 > fp32_cross_term_bound(X.norm(dim=1), 1.0, 1.0, dim)).all())
    assert math.isinf(float(fp32_cross_term_bound(torch.ones(1), 1.0, 1.0, 2 ** 24)[0]))


@pytest.mark.parametrize("chunk", [7, 45])
def test_candidates_are_every_point_within_T_and_few_more(images, chunk):
    """The float32 pass keeps every point with logit >= max - T (eq. C), and only points with
    logit >= max - T - 4E / (2 sigma^2) besides."""
    den = make(images, chunk)
    den.max_candidates = 10 ** 6  # no dense rows: compare the full candidate sets
    y = images.flatten(1)
    T = math.log(len(y)) + 37
    for k, sigma in enumerate(GRID + [0.002]):
        x = noisy_queries(images, sigma, seed=20 + k, m=6)
        xf = x.flatten(1)
        two_s2 = torch.full((6, 1), 2 * sigma ** 2, dtype=torch.float64)
        rows, cols, dense = den._fp32_candidates(xf, two_s2)
        assert not bool(dense.any())
        logit = -((xf[:, None] - y[None]) ** 2).sum(-1) / (2 * sigma ** 2)
        gap = logit.amax(1, keepdim=True) - logit
        kept = torch.zeros_like(gap, dtype=torch.bool)
        kept[rows, cols] = True
        assert bool(kept[gap <= T].all())
        margin = den._fp32_setup(xf, two_s2)[1].unsqueeze(1) / (2 * sigma ** 2)  # 2E/(2s^2) + T
        assert bool((gap[kept] <= (2 * margin - T + 1e-6).expand_as(gap)[kept]).all())


def test_streaming_forgets_early_ties_once_the_maximum_arrives():
    """Ten copies of a point in the first chunks tie above the running threshold and overflow
    the per-row store (K + 1 = 3); the nearest point comes in the last chunk: one candidate."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 8, generator=g, dtype=torch.float64)
    data = torch.cat([a.expand(10, 8), torch.randn(5, 8, generator=g, dtype=torch.float64) + 5, b[None]])
    x = (b + 0.01 * (a - b))[None]
    den = make(data, 4, (1, 0.5, 2))
    for sigma in (0.002, 0.05):
        close(den(x, sigma), oracle(x, data, sigma))
        assert den.last_stats["candidates"] == [1]
    close(den(x, 2.0), oracle(x, data, 2.0))  # every point a candidate: float64 fallback
    assert den.last_stats["dense_rows"] == 1


def test_top_per_row_and_above_against_sorting():
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 5, (60,), generator=g)
    vals = torch.randn(60, generator=g)
    cols = torch.arange(60)
    r, c, v = _top_per_row(rows, cols, vals, 4)
    for i in range(5):
        ref = sorted(vals[rows == i].tolist(), reverse=True)[:4]
        assert sorted(v[r == i].tolist(), reverse=True) == ref
        assert torch.equal(vals[c[r == i]], v[r == i])  # columns travel with their values
    G = torch.randn(6, 30, generator=g)
    G[5] = -1.0
    G[5, 7] = 3.0  # exactly one entry above tau
    tau = torch.tensor([3.0, 0.0, -0.5, -9.0, 1.0, 2.5])
    r, c, v = _above(G, tau, 5, *G.topk(2, dim=1))
    for i in range(6):
        above = sorted(G[i][G[i] >= tau[i]].tolist(), reverse=True)[:5]
        assert sorted(v[r == i].tolist(), reverse=True) == above
        assert torch.equal(G[i, c[r == i]], v[r == i])


def test_pf_ode_endpoints_agree_with_float64(images):
    """Heun-18 endpoints (what E_mem caches hold) agree within 1e-9 for both precisions."""
    x_T = seeded_noise(range(16), images.shape[1:]) * GRID[0]
    ends = [heun_sample(make(images, 20, knobs, precision=p), x_T, karras_sigmas(18))
            for p, knobs in (("float64", None), ("mixed", None), ("mixed", KNOBS[1]))]
    close(ends[1], ends[0])
    close(ends[2], ends[0])


def test_fingerprint_does_not_depend_on_precision(images):
    assert make(images).fingerprint() == EmpiricalDenoiser(images, precision="float64").fingerprint()
    assert set(make(images).state_dict()) == {"data", "sq_norms"}


@pytest.mark.parametrize("bad", ["fp32", "Mixed", None, 64])
def test_bad_precision(images, bad):
    with pytest.raises(ConfigError, match="precision") as e:
        EmpiricalDenoiser(images, precision=bad)
    assert e.value.accepted == ["mixed", "float64"]
    assert isinstance(e.value, ValueError)


def test_mixed_runs_the_float64_algorithm_where_float64_matmuls_are_fast(images):
    from lightning_pfd.diffusion.empirical import float64_matmul_is_fast

    assert float64_matmul_is_fast("cpu") is False  # CPUs: never measured, the float32 search pays
    x = noisy_queries(images, 0.05, seed=4)
    fast = make(images)
    fast.float64_fast = True  # as on an H100 (float64 tensor cores)
    got = fast(x, 0.05)
    assert fast.last_stats["mode"].startswith("float64")
    assert torch.equal(got, make(images, precision="float64")(x, 0.05))  # the same algorithm, bit for bit
    mixed = make(images)
    close(mixed(x, 0.05), got)
    assert mixed.last_stats["mode"] in ("ieee", "tf32")  # the float32 search ran


def _longdouble_oracle(x, data, sigma):
    """D* from 80-bit extended-precision distances (numpy longdouble): ~2000x less rounding than
    float64, the reference for near-ties in high dimension."""
    np = pytest.importorskip("numpy")
    if np.finfo(np.longdouble).eps >= 1e-17:
        pytest.skip("numpy longdouble is not extended precision on this platform")
    Y = data.reshape(len(data), -1).numpy().astype(np.longdouble)
    out = []
    for r in x.reshape(len(x), -1).numpy().astype(np.longdouble):
        logw = -((r[None] - Y) ** 2).sum(1) / (2 * np.longdouble(sigma) ** 2)
        w = np.exp(logw - logw.max())
        out.append((w[:, None] * Y).sum(0) / w.sum())
    return torch.tensor(np.array(out, dtype=np.float64)).reshape(x.shape)


def test_near_ties_in_cifar_dimension_against_extended_precision():
    """Midpoints of two CIFAR-sized images (D = 3072) at sigma = 0.002: the log-weight gap is
    (||x - y_b||^2 - ||x - y_a||^2) / (2 sigma^2), so float64 rounding of squared distances of
    ~10^2 is amplified by 1 / (2 sigma^2) = 1.25e5. The mixed path rescores candidates from exact
    differences and stays at the problem's float64 conditioning (a few 1e-9 from an 80-bit
    reference); the float64 algorithm's expanded 2 x.y - ||y||^2 loses two more digits here."""
    g = torch.Generator().manual_seed(0)
    data = torch.tanh(torch.randn(48, 3, 32, 32, generator=g, dtype=torch.float64))
    y = data.reshape(48, -1)
    i, j = torch.arange(0, 8), torch.arange(8, 16)
    x = (0.5 * (y[i] + y[j]) + 1e-12 * torch.randn(8, 3072, generator=g, dtype=torch.float64)).reshape(8, 3, 32, 32)
    err = lambda a, b: float(((a - b).abs() / (1 + b.abs())).max())  # noqa: E731
    for sigma in (0.002, 0.02):
        ref = _longdouble_oracle(x, data, sigma)
        e_mixed = err(make(data)(x, sigma), ref)
        e_f64 = err(make(data, precision="float64")(x, sigma), ref)
        assert e_mixed <= 2e-8 * (0.002 / sigma) ** 2, (sigma, e_mixed)
        assert e_mixed <= e_f64, (sigma, e_mixed, e_f64)
