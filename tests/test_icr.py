"""ICR metric (eq. 3-5, App. B.6 of the ICR paper), view augmentations and feature taps."""
import math
import os

import numpy as np
import pytest
import scipy.linalg
import torch

from lightning_pfd.diffusion import EDMFamily, VPFamily
from lightning_pfd.diffusion.augment import augment, crop_padding, noisy_view
from lightning_pfd.diffusion.features import extract_features, random_projection, tap_features
from lightning_pfd.metrics import InvariantContaminationRatio, invariant_contamination_ratio
from lightning_pfd.metrics.icr import DEFAULT_COND_MAX, generalized_eigenvalues, icr_from_covariances

F64 = torch.float64


def _spd(d, g, scale=1.0, floor=0.05):
    a = torch.randn(d, d, generator=g, dtype=F64)
    return scale * (a @ a.T / d + floor * torch.eye(d, dtype=F64))


def _views(sigma_s, sigma_xi, n, seed=0):
    """h_v = s + xi_v with s ~ N(0, Sigma_s), xi_v ~ N(0, Sigma_xi) independent per view."""
    g = torch.Generator().manual_seed(seed)
    d = sigma_s.shape[0]
    ls, lx = torch.linalg.cholesky(sigma_s), torch.linalg.cholesky(sigma_xi)
    s = torch.randn(n, d, generator=g, dtype=F64) @ ls.T
    h1 = s + torch.randn(n, d, generator=g, dtype=F64) @ lx.T
    h2 = s + torch.randn(n, d, generator=g, dtype=F64) @ lx.T
    return h1, h2


def _exact_icr(sigma_s, sigma_xi):
    d = sigma_s.shape[0]
    return 1.0 / (1.0 + float(np.trace(np.linalg.solve(sigma_xi.numpy(), sigma_s.numpy()))) / d)


# ----------------------------------------------------------------------------- oracle
@pytest.mark.parametrize("d,seed,xi_scale", [(8, 0, 1.0), (16, 1, 0.3), (32, 2, 3.0)])
def test_icr_matches_closed_form_at_n_20000(d, seed, xi_scale):
    g = torch.Generator().manual_seed(100 + seed)
    sigma_s, sigma_xi = _spd(d, g), _spd(d, g, scale=xi_scale)
    h1, h2 = _views(sigma_s, sigma_xi, 20_000, seed)
    out = invariant_contamination_ratio(h1, h2)
    exact = _exact_icr(sigma_s, sigma_xi)
    assert abs(float(out["icr"]) / exact - 1) < 0.02, (float(out["icr"]), exact)
    assert out["n"] == 20_000 and out["d"] == d
    # Sigma_s, Sigma_xi estimates themselves (App. B.6 identities)
    m = InvariantContaminationRatio()
    m.update(h1, h2)
    cov = m.covariances()
    assert torch.allclose(cov["sigma_xi"], sigma_xi, atol=0.1 * float(sigma_xi.diagonal().mean()))
    assert torch.allclose(cov["sigma_s"], sigma_s, atol=0.1 * float(sigma_xi.diagonal().mean()) + 0.05)


def test_eigenvalues_match_scipy_generalized_eigh():
    g = torch.Generator().manual_seed(3)
    h1, h2 = _views(_spd(12, g), _spd(12, g), 3000, 3)
    m = InvariantContaminationRatio(tau=0.01)
    m.update(h1, h2)
    out, cov = m.compute(), m.covariances()
    ref = scipy.linalg.eigh(cov["sigma_s"].numpy(), cov["sigma_xi"].numpy() + 0.01 * np.eye(12),
                            eigvals_only=True)[::-1]
    np.testing.assert_allclose(out["eigenvalues"].numpy(), ref, rtol=1e-9, atol=1e-10)
    assert math.isclose(float(out["icr"]), 1 / (1 + ref.mean()), rel_tol=1e-12)
    assert torch.equal(m.eigenvalues(), out["eigenvalues"])


def test_relative_tau_is_the_old_rule_one_thousandth_of_mean_residual_eigenvalue():
    g = torch.Generator().manual_seed(4)
    h1, h2 = _views(_spd(6, g), _spd(6, g), 2000, 4)
    out = invariant_contamination_ratio(h1, h2, tau="relative")
    m = InvariantContaminationRatio(tau="relative")
    m.update(h1, h2)
    cov = m.covariances()
    tr = float(cov["sigma_xi"].diagonal().sum())
    assert math.isclose(float(out["tau"]), 1e-3 * tr / 6, rel_tol=1e-12)
    ref = icr_from_covariances(cov["sigma_s"], cov["sigma_xi"], tau=1e-3 * tr / 6)
    assert math.isclose(float(out["icr"]), float(ref), rel_tol=1e-12)


# ----------------------------------------------------------------------------- tau = "auto"
def _ill_conditioned(d, cond, g):
    """SPD matrix with eigenvalues log-spaced in [1/cond, 1] (condition number ``cond``)."""
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    return q @ torch.diag(torch.logspace(0, -math.log10(cond), d, dtype=F64)) @ q.T


def test_auto_tau_is_zero_and_equals_closed_form_on_well_conditioned_covariances():
    """Population covariances: tau="auto" (the default) adds nothing, so ICR is exactly
    1/(1 + Tr(Sigma_xi^-1 Sigma_s)/d); the old relative ridge is measurably off."""
    g = torch.Generator().manual_seed(40)
    for d in (4, 12, 32):
        s, x = _spd(d, g), _spd(d, g, scale=0.5)
        exact = _exact_icr(s, x)
        assert math.isclose(float(icr_from_covariances(s, x)), exact, rel_tol=1e-10)
        assert math.isclose(float(icr_from_covariances(s, x, tau="auto")), exact, rel_tol=1e-10)
        assert math.isclose(float(icr_from_covariances(s, x, tau=None)), exact, rel_tol=1e-10)
        rel = float(icr_from_covariances(s, x, tau="relative"))
        assert rel > exact  # a ridge only shrinks the eigenvalues (Proposition 1)
    # estimated: the default reports tau = 0, its condition number, and equals the tau = 0 estimate
    h1, h2 = _views(_spd(6, g), _spd(6, g), 2000, 41)
    out = invariant_contamination_ratio(h1, h2)
    assert float(out["tau"]) == 0.0 and 1 <= float(out["cond_xi"]) < 1e3
    assert float(out["icr"]) == float(invariant_contamination_ratio(h1, h2, tau=0.0)["icr"])


def test_auto_tau_applies_the_relative_ridge_only_when_ill_conditioned():
    g = torch.Generator().manual_seed(42)
    d = 8
    s = _spd(d, g)
    x = _ill_conditioned(d, 1e10, g)  # cond 1e10 > cond_max = 1e8
    tau_rel = 1e-3 * float(x.diagonal().sum()) / d
    got = float(icr_from_covariances(s, x, tau="auto"))
    assert math.isclose(got, float(icr_from_covariances(s, x, tau=tau_rel)), rel_tol=1e-12)
    assert math.isclose(got, float(icr_from_covariances(s, x, tau="relative")), rel_tol=1e-12)
    assert got > 10 * _exact_icr(s, x)  # the ridge caps the huge eigenvalues of the tiny directions
    # the threshold: cond 1e5 is well conditioned for the default cond_max, not for cond_max = 1e4
    x5 = _ill_conditioned(d, 1e5, g)
    assert math.isclose(float(icr_from_covariances(s, x5)), _exact_icr(s, x5), rel_tol=1e-8)
    assert math.isclose(float(icr_from_covariances(s, x5, cond_max=1e4)),
                        float(icr_from_covariances(s, x5, tau="relative")), rel_tol=1e-12)
    # a singular estimate (n <= d): tau = 0 fails, "auto" falls back to the ridge, like "relative"
    h1, h2 = torch.randn(5, 8, generator=g, dtype=F64), torch.randn(5, 8, generator=g, dtype=F64)
    with pytest.raises(ValueError, match="too few samples"):
        invariant_contamination_ratio(h1, h2, tau=0.0)
    auto = invariant_contamination_ratio(h1, h2)
    rel = invariant_contamination_ratio(h1, h2, tau="relative")
    # the decision, not an exact inf: rank <= 4 leaves eigenvalues that are zero up to rounding, so
    # lambda_min is a tiny number of either sign (cond = inf on AMD/OpenBLAS, 5.9e17 on Intel/MKL)
    assert float(auto["cond_xi"]) > DEFAULT_COND_MAX and float(auto["tau"]) == float(rel["tau"]) > 0
    assert float(auto["icr"]) == float(rel["icr"])


def test_icr_at_recomputes_the_same_state_under_another_tau():
    g = torch.Generator().manual_seed(43)
    h1, h2 = _views(_spd(6, g), _spd(6, g), 1000, 43)
    m = InvariantContaminationRatio()
    m.update(h1, h2)
    out = m.compute()
    assert float(m.icr_at("auto")) == float(out["icr"])
    assert float(m.icr_at("relative")) == float(invariant_contamination_ratio(h1, h2, tau="relative")["icr"])
    assert float(m.icr_at(0.01)) == float(invariant_contamination_ratio(h1, h2, tau=0.01)["icr"])


def test_bad_tau_specs_name_the_field():
    for bad in ("always", -1.0, math.nan, math.inf, True, [0.1]):
        with pytest.raises(ValueError, match="tau"):
            InvariantContaminationRatio(tau=bad)
    with pytest.raises(ValueError, match="cond_max"):
        InvariantContaminationRatio(cond_max=0.5)
    with pytest.raises(ValueError, match="tau_rel"):
        icr_from_covariances(torch.eye(2), torch.eye(2), tau_rel=-1.0)


def test_traces_are_on_l2_normalized_features():
    g = torch.Generator().manual_seed(5)
    h1, h2 = _views(_spd(5, g), _spd(5, g), 500, 5)
    h1 = h1 + 3.0  # non-zero mean, so normalization matters
    out = invariant_contamination_ratio(h1, h2)
    u1 = (h1 / h1.norm(dim=1, keepdim=True)).numpy()
    u2 = (h2 / h2.norm(dim=1, keepdim=True)).numpy()
    cov_t, cov_d = np.cov(((u1 + u2) / 2).T), np.cov((u1 - u2).T)
    assert math.isclose(float(out["trace_xi"]), 0.5 * np.trace(cov_d), rel_tol=1e-10)
    assert math.isclose(float(out["trace_s"]), np.trace(cov_t) - 0.25 * np.trace(cov_d),
                        rel_tol=1e-10)
    raw_d = np.cov((h1 - h2).numpy().T)
    assert math.isclose(float(out["trace_xi_raw"]), 0.5 * np.trace(raw_d), rel_tol=1e-10)


def test_extremes_pure_residual_and_pure_signal():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4000, 8, generator=g, dtype=F64)
    noise_only = invariant_contamination_ratio(torch.randn(4000, 8, generator=g, dtype=F64),
                                               torch.randn(4000, 8, generator=g, dtype=F64))
    assert abs(float(noise_only["icr"]) - 1.0) < 0.03  # Sigma_s = 0 -> ICR = 1
    nearly_same = invariant_contamination_ratio(x + 1e-3 * torch.randn(4000, 8, generator=g, dtype=F64),
                                                x + 1e-3 * torch.randn(4000, 8, generator=g, dtype=F64))
    assert float(nearly_same["icr"]) < 1e-4


# ----------------------------------------------------------------------------- invariances
def test_invariant_under_invertible_linear_map_and_translation_tau0():
    """Tr((A S_xi A^T)^-1 A S_s A^T) = Tr(S_xi^-1 S_s): exact for the estimator too (tau = 0)."""
    g = torch.Generator().manual_seed(7)
    h1, h2 = _views(_spd(10, g), _spd(10, g), 1500, 7)
    A = torch.randn(10, 10, generator=g, dtype=F64) + 3 * torch.eye(10, dtype=F64)
    b = torch.randn(10, generator=g, dtype=F64) * 5
    base = invariant_contamination_ratio(h1, h2, tau=0.0)["icr"]
    mapped = invariant_contamination_ratio(h1 @ A.T + b, h2 @ A.T + b, tau=0.0)["icr"]
    assert math.isclose(float(base), float(mapped), rel_tol=1e-8)


@pytest.mark.parametrize("tau", ["auto", "relative"])
def test_invariant_under_scaled_rotation_with_default_tau(tau):
    g = torch.Generator().manual_seed(8)
    h1, h2 = _views(_spd(10, g), _spd(10, g), 1500, 8)
    q, _ = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=F64))
    base = invariant_contamination_ratio(h1, h2, tau=tau)
    mapped = invariant_contamination_ratio(7.0 * h1 @ q + 2.0, 7.0 * h2 @ q + 2.0, tau=tau)
    assert math.isclose(float(base["icr"]), float(mapped["icr"]), rel_tol=1e-9)
    # traces on normalized features are rotation invariant, but not translation invariant
    rot = invariant_contamination_ratio(7.0 * h1 @ q, 7.0 * h2 @ q)
    assert math.isclose(float(base["trace_xi"]), float(rot["trace_xi"]), rel_tol=1e-9)


def test_invariant_to_view_swap_sample_permutation_and_batching():
    g = torch.Generator().manual_seed(9)
    h1, h2 = _views(_spd(6, g), _spd(6, g), 999, 9)
    base = invariant_contamination_ratio(h1, h2)
    swapped = invariant_contamination_ratio(h2, h1)
    perm = torch.randperm(999, generator=g)
    permuted = invariant_contamination_ratio(h1[perm], h2[perm])
    m = InvariantContaminationRatio()
    for i in range(0, 999, 128):
        m.update(h1[i:i + 128], h2[i:i + 128])
    chunked = m.compute()
    for other in (swapped, permuted, chunked):
        for k in ("icr", "trace_s", "trace_xi"):
            assert math.isclose(float(base[k]), float(other[k]), rel_tol=1e-9), k


def test_not_invariant_to_view_mismatch():
    """Pairing views of *different* images destroys the invariant component: ICR -> 1."""
    g = torch.Generator().manual_seed(10)
    h1, h2 = _views(_spd(6, g), 0.1 * _spd(6, g), 3000, 10)
    good = float(invariant_contamination_ratio(h1, h2)["icr"])
    shuffled = float(invariant_contamination_ratio(h1, h2.roll(1, 0))["icr"])
    assert good < 0.2 and shuffled > 0.9


# ----------------------------------------------------------------------------- Proposition 1
def test_proposition1_monotonicity_population():
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        s, x = _spd(7, g), _spd(7, g)
        delta = _spd(7, g, scale=0.5, floor=0.0)  # PSD
        for tau in (0.0, "auto", "relative"):
            base = icr_from_covariances(s, x, tau=tau)
            assert icr_from_covariances(s, x + delta, tau=tau) >= base  # more residual hurts
            assert icr_from_covariances(s + delta, x, tau=tau) <= base  # more invariant helps


def test_proposition1_monotonicity_estimated():
    g = torch.Generator().manual_seed(12)
    s_cov, x_cov = _spd(8, g), _spd(8, g)
    h1, h2 = _views(s_cov, x_cov, 5000, 12)
    extra1 = torch.randn(5000, 8, generator=g, dtype=F64)
    extra2 = torch.randn(5000, 8, generator=g, dtype=F64)
    base = float(invariant_contamination_ratio(h1, h2)["icr"])
    more_residual = float(invariant_contamination_ratio(h1 + 0.7 * extra1, h2 + 0.7 * extra2)["icr"])
    shared = torch.randn(5000, 8, generator=g, dtype=F64)
    more_invariant = float(invariant_contamination_ratio(h1 + shared, h2 + shared)["icr"])
    assert more_residual > base > more_invariant


def test_generalized_eigenvalues_keep_negative_values():
    s = torch.diag(torch.tensor([2.0, -0.5], dtype=F64))
    lam = generalized_eigenvalues(s, torch.eye(2, dtype=F64), tau=0.0)
    assert torch.allclose(lam, torch.tensor([2.0, -0.5], dtype=F64))


# ----------------------------------------------------------------------------- input handling
def test_spatial_features_are_mean_pooled():
    g = torch.Generator().manual_seed(13)
    a, b = torch.randn(300, 4, 3, 3, generator=g), torch.randn(300, 4, 3, 3, generator=g)
    a = a + torch.randn(300, 4, 1, 1, generator=g) * 3
    b = b + a.mean((2, 3), keepdim=True)
    pooled = invariant_contamination_ratio(a.mean((2, 3)), b.mean((2, 3)))
    spatial = invariant_contamination_ratio(a, b)
    assert math.isclose(float(pooled["icr"]), float(spatial["icr"]), rel_tol=1e-6)


def test_bad_inputs_raise_before_work():
    with pytest.raises(ValueError, match="tau"):
        InvariantContaminationRatio(tau=-1.0)
    with pytest.raises(ValueError, match="normalize"):
        InvariantContaminationRatio(normalize="yes")
    with pytest.raises(ValueError, match="num_features"):
        InvariantContaminationRatio(num_features=0)
    m = InvariantContaminationRatio()
    with pytest.raises(ValueError, match="same shape"):
        m.update(torch.zeros(4, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="h1, h2"):
        m.update(torch.zeros(4), torch.zeros(4))
    assert torch.isnan(m.compute()["icr"])  # fewer than 2 view pairs: NaN (tests/test_metric_conventions.py)
    m.update(torch.randn(5, 3), torch.randn(5, 3))
    with pytest.raises(ValueError, match="dimension changed"):
        m.update(torch.randn(5, 4), torch.randn(5, 4))
    with pytest.raises(ValueError, match="positive definite"):
        invariant_contamination_ratio(torch.ones(10, 3), torch.ones(10, 3), tau=0.0)


def test_reset_and_num_features():
    g = torch.Generator().manual_seed(14)
    h1, h2 = _views(_spd(4, g), _spd(4, g), 200, 14)
    m = InvariantContaminationRatio(num_features=4)
    m.update(h1, h2)
    first = m.compute()["icr"]
    m.reset()
    assert float(m.n) == 0
    m.update(h1, h2)
    assert torch.equal(m.compute()["icr"], first)


# ----------------------------------------------------------------------------- DDP
def _ddp_worker(rank, world, init_file, out_dir, h1, h2):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        m = InvariantContaminationRatio()
        m.update(h1[rank::world], h2[rank::world])  # uneven shards (odd n)
        out = m.compute()
        torch.save({k: v for k, v in out.items()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_sync_equals_single_process(tmp_path):
    import torch.multiprocessing as mp
    g = torch.Generator().manual_seed(15)
    h1, h2 = _views(_spd(6, g), _spd(6, g), 301, 15)
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path), h1, h2), nprocs=2,
             join=True)
    single = invariant_contamination_ratio(h1, h2)
    for r in range(2):
        out = torch.load(tmp_path / f"rank{r}.pt")
        assert out["n"] == 301
        for k in ("icr", "trace_s", "trace_xi", "eigenvalues"):
            assert torch.allclose(out[k], single[k], rtol=1e-10, atol=1e-12), k


# ----------------------------------------------------------------------------- augmentations
def _images(b=6, c=3, h=8, w=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, c, h, w, generator=g) * 2 - 1


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_augment_rows_depend_only_on_their_seed(level):
    x = _images(6)
    seeds = torch.arange(100, 106)
    full = augment(x, seeds, level=level, stream=1)
    for i in (0, 3, 5):
        alone = augment(x[i:i + 1], seeds[i:i + 1], level=level, stream=1)
        assert torch.allclose(full[i:i + 1], alone, atol=1e-6)
    assert full.shape == x.shape and full.min() >= -1 - 1e-5 and full.max() <= 1 + 1e-5
    other = augment(x, seeds, level=level, stream=2)
    assert not torch.allclose(full, other)  # a different view


def test_random_crop_is_a_shifted_window_of_the_black_padded_image():
    x = _images(16, c=1, h=8, w=8, seed=1)
    out = augment(x, torch.arange(16), level=1)
    p = crop_padding(8)
    xp = torch.nn.functional.pad(x, (p, p, p, p), value=-1.0)
    offsets = set()
    for i in range(16):
        hits = [(a, b) for a in range(2 * p + 1) for b in range(2 * p + 1)
                if torch.equal(out[i], xp[i, :, a:a + 8, b:b + 8])]
        assert hits, f"row {i} is not a crop"
        offsets.add(hits[0])
    assert len(offsets) > 3  # offsets actually vary
    assert crop_padding(32) == 4 and crop_padding(8) == 1


def test_flip_and_colour_jitter_rules():
    x1 = _images(32, c=1, seed=2)
    seeds = torch.arange(32)
    l1, l2, l3 = (augment(x1, seeds, level=k) for k in (1, 2, 3))
    flipped = [bool(torch.equal(l2[i], l1[i].flip(-1))) and not torch.equal(l2[i], l1[i])
               for i in range(32)]
    assert all(torch.equal(l2[i], l1[i]) or flipped[i] for i in range(32))
    assert 5 < sum(flipped) < 27
    # 1 channel: level 3 adds brightness / contrast jitter (no colour to jitter)
    assert all(not torch.allclose(l3[i], l2[i]) for i in range(32))
    x3 = _images(8, c=3, seed=3)
    assert not torch.allclose(augment(x3, seeds[:8], level=3), augment(x3, seeds[:8], level=2))


def test_rotation_and_centre_crop_keep_constant_images_inside():
    x = torch.full((4, 1, 16, 16), 0.3)
    # level 3 (1 channel: brightness / contrast) keeps the interior constant, at a new value
    inner = augment(x, torch.arange(4), level=3)[:, :, 8, 8].reshape(4, 1, 1, 1)
    assert torch.allclose(augment(x, torch.arange(4), level=3)[..., 6:10, 6:10],
                          inner.expand(4, 1, 4, 4), atol=1e-6)
    for level in (4, 5):
        out = augment(x, torch.arange(4), level=level)
        centre = out[..., 6:10, 6:10]  # far from the black padding
        assert torch.allclose(centre, inner.expand_as(centre), atol=1e-5)


def test_noisy_view_adds_independent_seeded_noise():
    x = torch.zeros(2000, 4)
    v0 = noisy_view(x, torch.arange(2000), sigma=0.5, view=0)
    v1 = noisy_view(x, torch.arange(2000), sigma=0.5, view=1)
    assert abs(float(v0.std()) - 0.5) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([v0.flatten(), v1.flatten()]))[0, 1])) < 0.03
    assert torch.equal(v0, noisy_view(x, torch.arange(2000), sigma=0.5, view=0))
    jit = augment(x, torch.arange(2000), vector_jitter=0.2)
    assert abs(float(jit.std()) - 0.2) < 0.01


def test_augment_bad_input():
    with pytest.raises(ValueError, match="level"):
        augment(_images(2), [0, 1], level=6)
    with pytest.raises(ValueError, match="seeds"):
        augment(_images(2), [0], level=1)
    with pytest.raises(ValueError, match="x:"):
        augment(torch.zeros(2, 3, 4), [0, 1])
    with pytest.raises(ValueError, match="sigma"):
        noisy_view(_images(2), [0, 1], sigma=-1.0)


# ----------------------------------------------------------------------------- feature taps
class _HookOnlyNet(torch.nn.Module):
    """A net without forward_features: exercised through the forward-hook path."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 7)
        self.b = torch.nn.Linear(7, 5)
        self.feature_taps = {"a": self.a, "b": self.b}
        self.default_tap = "a"
        self.calls_b = 0

    def forward(self, x, c_noise):
        h = self.a(x) + c_noise[:, None]
        self.calls_b += 1
        return self.b(h)


def test_hook_path_stops_after_the_tap_and_matches_manual():
    net = _HookOnlyNet()
    den = EDMFamily().precondition(net)
    x = torch.randn(9, 5)
    h = extract_features(den, x, 0.29, batch_size=4)
    x_in, _ = den.network_input(x, 0.29)
    assert torch.allclose(h, net.a(x_in).double(), atol=1e-6)
    assert net.calls_b == 0  # the forward was aborted at the tap
    with pytest.raises(ValueError, match="tap"):
        extract_features(den, x, 0.29, tap="nope")


def test_forward_features_equals_hook_path_on_unet_and_mlp():
    from lightning_pfd.nets import MLPNet, UNet
    torch.manual_seed(0)
    unet = UNet(img_resolution=8, in_channels=1, model_channels=8, channel_mult=[1, 2],
                num_blocks=1, attn_resolutions=[])
    mlp = MLPNet(dim=6, hidden=16, depth=2)
    for net, x in ((unet.eval(), torch.randn(3, 1, 8, 8)), (mlp.eval(), torch.randn(3, 6))):
        for precond in (EDMFamily().precondition(net), VPFamily().precondition(net)):
            x_in, c_noise = precond.network_input(x, 0.29)
            direct = net.forward_features(x_in, c_noise, net.default_tap)
            captured = {}
            handle = net.feature_taps[net.default_tap].register_forward_hook(
                lambda m, i, o: captured.setdefault("h", o))
            net(x_in, c_noise)
            handle.remove()
            assert torch.allclose(direct, captured["h"], atol=1e-6)
            feats = extract_features(precond, x, 0.29)
            pooled = direct.flatten(2).mean(-1) if direct.ndim > 2 else direct
            assert torch.allclose(feats, pooled.double(), atol=1e-6)
            assert torch.equal(tap_features(net, x_in, c_noise), direct)


def test_random_projection_fixed_and_scaled():
    p1, p2 = random_projection(64, 16, seed=3), random_projection(64, 16, seed=3)
    assert torch.equal(p1, p2) and p1.shape == (64, 16)
    assert abs(float((p1 ** 2).sum(1).mean()) - 1.0) < 0.15  # E||row||^2 = 1
    assert not torch.equal(p1, random_projection(64, 16, seed=4))


def test_normalize_option_equals_prenormalized_features():
    g = torch.Generator().manual_seed(16)
    h1, h2 = _views(_spd(5, g), _spd(5, g), 800, 16)
    h1, h2 = h1 + 2.0, h2 + 2.0
    a = invariant_contamination_ratio(h1, h2, normalize=True)
    u1, u2 = h1 / h1.norm(dim=1, keepdim=True), h2 / h2.norm(dim=1, keepdim=True)
    b = invariant_contamination_ratio(u1, u2)
    assert math.isclose(float(a["icr"]), float(b["icr"]), rel_tol=1e-10)
    assert not math.isclose(float(a["icr"]), float(invariant_contamination_ratio(h1, h2)["icr"]),
                            rel_tol=1e-3)
