"""RepresentationEvaluation and MemorizationEvaluation: the measurement protocols as plain objects.

Oracles: the protocol re-assembled in the test from the seeded pieces (subset permutation, views,
the net's tap called directly, the projection drawn from its stream) fed to the functional ICR;
closed-form ICR of known covariances; sharded statistics (world = 2, 3) summed by hand; the
monitors' logged values vs the objects' direct results on the same weights; icr-sweep's rows vs
the object (and a probe trained by hand); the memorization ratio vs a numpy brute-force
nearest-neighbour / cosine search.
"""
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lightning_pfd.diffusion.augment import noisy_view
from lightning_pfd.diffusion.noise import seeded_noise, seeded_uniform
from lightning_pfd.diffusion.streams import stream
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.base import Comm
from lightning_pfd.evaluation.memorization import MemorizationEvaluation
from lightning_pfd.evaluation.representation import RepresentationEvaluation, merge_statistics
from lightning_pfd.metrics import invariant_contamination_ratio
from lightning_pfd.metrics.icr import icr_from_covariances


def _mlp_module(dim=6, hidden=16, **kw):
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(dim=dim, hidden=hidden, depth=2), ema_decay=0.9, **kw)


def _unet_module():
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import UNet
    torch.manual_seed(0)
    net = UNet(img_resolution=8, in_channels=3, model_channels=8, channel_mult=[1, 2], num_blocks=1,
               attn_resolutions=[])
    return DiffusionModule(net, ema_decay=0.9)


def _data(n, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g)


def _tap(den, x, sigma):
    """The net's activation at its default tap, called directly (not through extract_features)."""
    x_in, c_noise = den.network_input(x, torch.as_tensor(sigma, dtype=torch.float64))
    with torch.no_grad():
        h = den.net.forward_features(x_in, c_noise, den.net.default_tap)
    return (h.flatten(2).mean(-1) if h.ndim > 2 else h).double()


def _by_hand(module, data, num, sigma, views_per_image=1, d_proj=None, seed=0, level=3):
    """The protocol re-assembled from the seeded pieces, then the functional ICR."""
    idx = seeded_uniform([seed], data.shape[0], stream=stream("icr.subset"))[0].argsort()[:num]
    x0, seeds = data[idx], seed * 1_000_003 + idx
    den = module.denoiser.eval()
    h = {v: torch.cat([_tap(den, noisy_view(x0, seeds, sigma, level, 2 * k + v), sigma)
                       for k in range(views_per_image)]) for v in (0, 1)}
    if d_proj is not None:
        p = seeded_noise([seed], (h[0].shape[1], d_proj), dtype=torch.float64,
                         stream=stream("icr.projection"))[0] / math.sqrt(d_proj)
        h = {v: h[v] @ p for v in h}
    return invariant_contamination_ratio(h[0], h[1])


# ----------------------------------------------------------------------------- ICR vs by hand
@pytest.mark.parametrize("kind", ["mlp", "unet"])
def test_icr_equals_the_functional_on_features_extracted_by_hand(kind):
    if kind == "mlp":
        module, data, d_proj = _mlp_module(), _data(150), 8
    else:
        g = torch.Generator().manual_seed(1)
        module, data, d_proj = _unet_module(), torch.rand(90, 3, 8, 8, generator=g) * 2 - 1, None
    ev = RepresentationEvaluation(data, num_images=80, sigma=0.29, sigmas=[1.5], views_per_image=2,
                                  d_proj=d_proj, batch_size=33, seed=3)
    got = ev.evaluate(module)
    assert sorted(got) == [0.29, 1.5]
    for sigma in (0.29, 1.5):
        expect = _by_hand(module, data, 80, sigma, views_per_image=2, d_proj=d_proj, seed=3)
        # float32 features: another batch split may change the last bits of a row (BLAS blocking)
        for key in ("icr", "trace_s", "trace_xi", "trace_s_raw", "trace_xi_raw", "n", "d", "tau"):
            assert float(got[sigma][key]) == pytest.approx(float(expect[key]), rel=1e-6, abs=1e-12), key
        assert torch.allclose(got[sigma]["eigenvalues"], expect["eigenvalues"], rtol=1e-5, atol=1e-8)
        assert float(got[sigma]["nonfinite"]) == 0.0 and float(got[sigma]["icr_tau_auto"]) == float(
            got[sigma]["icr"])
    assert 0 < float(got[0.29]["icr"]) < 1 and float(got[0.29]["n"]) == 160


def test_a_bare_denoiser_a_module_and_a_feature_function_give_the_same_icr():
    module, data = _mlp_module(), _data(120)
    ev = RepresentationEvaluation(data, num_images=100, batch_size=64)
    via_module = float(ev.evaluate(module)[0.29]["icr"])
    assert float(ev.evaluate(module.denoiser)[0.29]["icr"]) == via_module
    fn = float(ev.evaluate(lambda x, s: _tap(module.denoiser, x, s))[0.29]["icr"])
    assert fn == pytest.approx(via_module, rel=1e-12)


# ----------------------------------------------------------------------------- known covariances
@pytest.mark.parametrize("seed", [0, 1])
def test_icr_of_known_covariances(seed):
    """Noise-only views of Gaussian vectors, features W x: Sigma_s = W A W^T, Sigma_xi = sigma^2 W W^T,
    so ICR = 1/(1 + Tr(A)/(d sigma^2)) whatever the invertible W (eq. 5 with tau = 0)."""
    g = torch.Generator().manual_seed(seed)
    d, n, sigma = 3, 20_000, 0.7
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = a @ a.T + 0.5 * torch.eye(d, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    w = torch.randn(d, d, generator=g, dtype=torch.float64) + 2 * torch.eye(d, dtype=torch.float64)
    ev = RepresentationEvaluation(x.float(), num_images=n, sigma=sigma, batch_size=4096)
    got = ev.evaluate(lambda v, s: v.double() @ w.T)[sigma]
    closed = 1.0 / (1.0 + float(torch.trace(cov)) / (d * sigma ** 2))
    oracle = float(icr_from_covariances(w @ cov @ w.T, sigma ** 2 * w @ w.T))
    assert oracle == pytest.approx(closed, rel=1e-10)
    assert float(got["icr"]) == pytest.approx(closed, rel=0.03)
    assert float(got["tau"]) == 0.0  # well conditioned: "auto" adds no ridge


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("features", ["float64_map", "mlp"])
def test_two_and_three_shards_sum_to_the_single_process_statistics(features):
    """Exact (1e-12) with row-wise float64 features; the net's float32 features may differ in their
    last bits with the batch composition, hence 1e-6 there."""
    data = _data(101)
    if features == "mlp":
        model, rel = _mlp_module(), 1e-6
    else:
        w = torch.randn(6, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        model, rel = (lambda x, s: torch.tanh(x.double() @ w) * (1 + s)), 1e-12
    ev = RepresentationEvaluation(data, num_images=101, sigmas=[1.0], d_proj=8, batch_size=17)
    single = ev.results(ev.shard_statistics(model, 0, 1))
    for world in (2, 3):
        parts = [ev.shard_statistics(model, r, world) for r in range(world)]
        assert sum(float(p[0.29]["n"]) for p in parts) == 101
        sharded = ev.results(merge_statistics(parts))
        for s in (0.29, 1.0):
            for key in ("icr", "trace_s", "trace_xi", "n", "cond_xi"):
                assert float(sharded[s][key]) == pytest.approx(float(single[s][key]), rel=rel), key
            assert torch.allclose(sharded[s]["eigenvalues"], single[s]["eigenvalues"], rtol=100 * rel)


class _OneRankOfTwo(Comm):
    """One rank of two processes, seen from that rank: ``reduce_sum`` is ``reduce`` (the other
    rank's vector added by hand); no gathers."""

    world = 2

    def __init__(self, rank, reduce):
        self.rank, self._reduce = rank, reduce

    def all_gather_equal(self, t):
        raise AssertionError("evaluate sums, it does not gather")

    def reduce_sum(self, t):
        return self._reduce(t)


def test_evaluate_over_two_simulated_processes_equals_one():
    """evaluate(model, comm): one reduce_sum of every sum over the processes; simulated with the
    other rank's vector captured first."""
    module, data = _mlp_module(), _data(61)
    ev = RepresentationEvaluation(data, num_images=61, sigmas=[2.0], batch_size=64)
    captured = []
    ev.evaluate(module, _OneRankOfTwo(1, lambda t: captured.append(t.clone()) or t))
    calls = []
    got = ev.evaluate(module, _OneRankOfTwo(0, lambda t: calls.append(1) or t + captured[0]))
    single = ev.evaluate(module)
    assert len(captured) == 1 and len(calls) == 1
    for s in (0.29, 2.0):
        assert float(got[s]["icr"]) == pytest.approx(float(single[s]["icr"]), rel=1e-12)
    mem = MemorizationEvaluation(data, num_samples=9, seed=3, batch_size=4)  # the same for the counts

    def sampler(seeds):  # copies the training sample of every third seed, is far from the others
        x = data[seeds % len(data)] + 0.01
        far = seeds % 3 != 0
        x[far] = 100.0 + seeds[far, None].to(x.dtype)
        return x

    mem_parts = []
    mem.evaluate(sampler, _OneRankOfTwo(1, lambda t: mem_parts.append(t.clone()) or t))
    two = mem.evaluate(sampler, _OneRankOfTwo(0, lambda t: t + mem_parts[0]))
    assert two == mem.evaluate(sampler) and two["ratio"] == pytest.approx(3 / 9)


def test_non_finite_features_on_one_shard_give_nan_everywhere():
    data = _data(40, d=3)
    bad = data[:, 0] > 1.0  # the images whose features are NaN
    ev = RepresentationEvaluation(data, num_images=40, sigma=0.1, batch_size=8)

    def fn(x, s):
        return torch.where((x[:, :1] > 1.0 + 5 * s), math.nan, 1.0) * x  # only clearly-bad rows

    single = ev.evaluate(fn)[0.1]
    merged = ev.results(merge_statistics([ev.shard_statistics(fn, r, 2) for r in range(2)]))[0.1]
    assert 0 < float(single["nonfinite"]) <= float(bad.double().mean())
    assert float(merged["nonfinite"]) == float(single["nonfinite"])
    assert math.isnan(float(single["icr"])) and math.isnan(float(merged["icr"]))
    assert single["eigenvalues"].numel() == 0 and float(single["n"]) == 40


# ----------------------------------------------------------------------------- batched views
def _recording(fn):
    """A feature function that records every batch it is fed."""
    calls = []

    def record(x, s):
        calls.append((x.clone(), s))
        return fn(x, s)
    return record, calls


@pytest.mark.parametrize("kind", ["vectors", "flattened_gray", "rgb"])
def test_every_view_fed_to_the_model_is_noisy_view_of_its_image_bit_for_bit(kind):
    """One call per chunk and noise level; row v c + j of a chunk of c images is
    noisy_view(x0_j, seed_j, sigma, level, view=v), drawn here image by image and view by view."""
    g = torch.Generator().manual_seed(5)
    kw = dict(views_per_image=3, sigmas=[1.3], seed=4, batch_size=13)  # 13 // 6 = 2 images a chunk
    if kind == "vectors":
        data, kw = torch.randn(30, 6, generator=g), {**kw, "vector_jitter": 0.2}
    elif kind == "flattened_gray":
        data, kw = torch.rand(30, 64, generator=g) * 2 - 1, {**kw, "image_shape": (1, 8, 8), "level": 4}
    else:
        data, kw = torch.rand(30, 3, 8, 8, generator=g) * 2 - 1, {**kw, "level": 5}
    ev = RepresentationEvaluation(data, num_images=25, **kw)
    fn, calls = _recording(lambda x, s: x.reshape(len(x), -1)[:, :4].double())
    ev.shard_statistics(fn)
    chunks = [ev.subset[i:i + 2] for i in range(0, 25, 2)]  # ragged: the last chunk has 1 image
    assert [s for _, s in calls] == [s for _ in chunks for s in (0.29, 1.3)]
    for (x, sigma), idx in zip(calls, [c for c in chunks for _ in (0.29, 1.3)]):
        assert x.shape == (6 * len(idx), *data.shape[1:])
        for v in range(6):
            for j, i in enumerate(idx.tolist()):
                x0 = data[i:i + 1]
                if kind == "flattened_gray":
                    x0 = x0.reshape(1, 1, 8, 8)
                expect = noisy_view(x0, [4 * 1_000_003 + i], sigma, level=ev.level, view=v,
                                    vector_jitter=ev.vector_jitter).reshape(data.shape[1:])
                assert torch.equal(x[v * len(idx) + j], expect), (v, i, sigma)


def _view_of(ev, idx, sigma, view):
    """View ``view`` of the training images ``idx`` at sigma, straight from noisy_view."""
    return noisy_view(ev.train_data[idx], ev.image_seeds(idx), sigma, ev.level, view, ev.vector_jitter)


def _per_view_statistics(ev, den, shard):
    """Reference: plain loop over noise levels and views, every view of every image its own forward
    (batch of one row), pairs (2k, 2k + 1) summed one at a time by the functional update."""
    from lightning_pfd.metrics.icr import _icr_update, _icr_zero_states
    p = ev.projection(_tap(den, _view_of(ev, shard[:1], 0.29, 0), 0.29).shape[1])
    out = {}
    for sigma in ev.noise_levels:
        acc = None
        for i in shard.tolist():
            for k in range(ev.views_per_image):
                h1, h2 = (_tap(den, _view_of(ev, torch.tensor([i]), sigma, 2 * k + v), sigma) for v in (0, 1))
                if p is not None:
                    h1, h2 = h1 @ p, h2 @ p
                acc = acc or _icr_zero_states(h1.shape[1])
                for key, val in _icr_update(h1, h2).items():
                    acc[key] = acc[key] + val
        out[sigma] = acc
    return out


@pytest.mark.parametrize("kind", ["mlp", "unet"])
def test_batched_statistics_equal_a_per_view_reference(kind):
    """The sums of one forward per chunk and noise level = the sums of one forward per view and
    image. float32 features: a row's last bits may change with the batch (another conv / GEMM
    kernel), so each sum agrees to ~1e-7 of its largest entry (measured); asserted at 1e-6."""
    if kind == "mlp":
        module, data, kw = _mlp_module(), _data(40), dict(d_proj=4, vector_jitter=0.1)
    else:
        g = torch.Generator().manual_seed(1)
        module, data, kw = _unet_module(), torch.rand(30, 3, 8, 8, generator=g) * 2 - 1, {}
    ev = RepresentationEvaluation(data, num_images=21, sigmas=[2.0], views_per_image=2, batch_size=10,
                                  seed=2, **kw)
    got = ev.shard_statistics(module)
    expect = _per_view_statistics(ev, module.denoiser.eval(), ev.subset)
    for s in (0.29, 2.0):
        assert float(got[s]["n"]) == 42 and float(got[s]["nonfinite"]) == 0
        for key, val in expect[s].items():
            assert torch.allclose(got[s][key], val, rtol=1e-6, atol=1e-6 * float(val.abs().max())), (s, key)


@pytest.mark.parametrize("features", ["float64_map", "mlp"])
def test_chunking_does_not_change_the_result(features, monkeypatch):
    """batch_size 1 (one image, its 4 views split over 4 forwards), 3, 4, 9 (ragged last chunks),
    and everything in one chunk, the pending features summed at the end or after every chunk:
    the same sums (exactly up to float64 summation order for a row-wise float64 feature map;
    float32 rounding for the net)."""
    import lightning_pfd.evaluation.representation as rep
    data = _data(37)
    if features == "mlp":
        model, rel = _mlp_module(), 1e-6
    else:
        w = torch.randn(6, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        model, rel = (lambda x, s: torch.sinh(x.double() @ w) / (1 + s)), 1e-12
    results = []
    for b, pending in ((1, None), (3, None), (4, 1), (9, None), (9, 1), (1000, None)):
        if pending:
            monkeypatch.setattr(rep, "_PENDING_VALUES", pending)  # one update per chunk
        ev = RepresentationEvaluation(data, num_images=37, sigmas=[0.7], views_per_image=2, batch_size=b,
                                      level=1)
        assert ev.images_per_chunk == max(1, b // 4)
        results.append(ev.evaluate(model))
        monkeypatch.undo()
    for r in results[1:]:
        for s in (0.29, 0.7):
            for key in ("icr", "trace_s", "trace_xi", "trace_s_raw", "icr_tau_relative"):
                assert float(r[s][key]) == pytest.approx(float(results[0][s][key]), rel=rel), (s, key)
            cond = float(results[0][s]["cond_xi"])  # rounding of the sums, amplified by cond
            assert float(r[s]["cond_xi"]) == pytest.approx(cond, rel=rel * cond)
            assert float(r[s]["n"]) == 74


def test_views_are_drawn_once_and_kept_within_the_cache_bound(monkeypatch):
    """The views do not depend on the model: the second measurement reuses them (no draw) and gives
    the same sums bit for bit; another shard redraws; above VIEW_CACHE_BYTES nothing is kept and
    every measurement redraws, with the same result."""
    import lightning_pfd.evaluation.representation as rep
    module, data = _mlp_module(), _data(30)
    ev = RepresentationEvaluation(data, num_images=30, views_per_image=2, batch_size=16)
    draws = []
    real = ev.view_parts
    monkeypatch.setattr(ev, "view_parts", lambda idx, dev=None: draws.append(len(idx)) or real(idx, dev))
    first = ev.shard_statistics(module)
    assert draws == [4] * 7 + [2]  # 16 // 4 = 4 images a chunk, 30 images
    second = ev.shard_statistics(module)
    assert len(draws) == 8 and all(torch.equal(first[0.29][k], second[0.29][k]) for k in first[0.29])
    ev.shard_statistics(module, 1, 2)
    assert len(draws) == 8 + 4  # rank 1 of 2: 15 images
    monkeypatch.setattr(rep, "VIEW_CACHE_BYTES", 8 * 2 * 2 * 30 * 6 - 1)  # one byte short
    ev._view_cache = None
    uncached = [ev.shard_statistics(module) for _ in range(2)]
    assert len(draws) == 12 + 16 and ev._view_cache is None
    assert all(torch.equal(u[0.29][k], first[0.29][k]) for u in uncached for k in first[0.29])


def test_measuring_restores_every_submodule_mode():
    """Features in eval mode; afterwards each submodule is back in its own mode (also mixed ones)."""
    module, data = _mlp_module(), _data(20)
    den = module.denoiser.train()
    den.net.blocks[0].eval()
    before = [m.training for m in den.modules()]
    seen = []
    ev = RepresentationEvaluation(data, num_images=20)
    hook = den.net.inp.register_forward_pre_hook(
        lambda m, a: seen.append([x.training for x in den.modules()]))
    ev.evaluate(den)
    hook.remove()
    assert seen and all(not any(modes) for modes in seen)
    assert [m.training for m in den.modules()] == before and any(before) and not all(before)


# ----------------------------------------------------------------------------- bad input
def test_bad_settings_and_data_name_the_argument():
    data = _data(20)
    for kw, field in (({"num_images": 21}, "num_images"), ({"num_images": 1}, "num_images"),
                      ({"sigma": -1.0}, "sigma"), ({"level": 9}, "level"), ({"d_proj": 0}, "d_proj"),
                      ({"image_shape": (1, 2, 3)}, "image_shape"), ({"tau": "never"}, "tau"),
                      ({"views_per_image": 0}, "views_per_image"), ({"normalize": "yes"}, "normalize"),
                      ({"views_per_image": 501}, "views_per_image")):
        with pytest.raises(ConfigError) as err:
            RepresentationEvaluation(data, **kw)
        assert err.value.field.startswith(field), (kw, err.value.field)
    with pytest.raises(ConfigError, match="train_data"):
        RepresentationEvaluation(torch.zeros(0, 3))
    module = _mlp_module(hidden=8)
    with pytest.raises(ConfigError, match="d_proj") as err:
        RepresentationEvaluation(data, d_proj=9).check_model(module)
    assert "d = 8" in err.value.problem
    with pytest.raises(ConfigError, match="did you mean 'middle'"):
        RepresentationEvaluation(data, tap="midle").check_model(module)
    with pytest.raises(ConfigError, match="num_images"):
        RepresentationEvaluation(data, num_images=3).check_world(4)
    with pytest.raises(ConfigError, match="model"):
        RepresentationEvaluation(data).evaluate(42)


# ----------------------------------------------------------------------------- monitors
def _trainer(tmp_path, callbacks):
    import lightning.pytorch as pl
    return pl.Trainer(max_epochs=1, callbacks=callbacks, logger=False, default_root_dir=tmp_path,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                      accelerator="cpu", devices=1)


def test_the_monitors_log_what_the_evaluations_measure(tmp_path):
    from lightning_pfd.callbacks import ICRMonitor, MemorizationMonitor
    from lightning_pfd.data import TensorDataModule

    data = _data(64, d=4)
    dm = TensorDataModule(train_data=data, val_data=_data(8, d=4, seed=1), batch_size=16, value_range=None)
    module = _mlp_module(dim=4, hidden=8, num_steps=4)
    icr_args = dict(num_images=60, sigma=0.3, sigmas=[1.0], views_per_image=2, d_proj=6, seed=2,
                    batch_size=25)
    icr = ICRMonitor(**icr_args)
    mem = MemorizationMonitor(num_samples=10, every_n_epochs=1, seed=5, batch_size=4)
    trainer = _trainer(tmp_path, [icr, mem])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    expect = RepresentationEvaluation(data, **icr_args).evaluate(module)
    f32 = lambda v: float(torch.tensor(float(v), dtype=torch.float32))  # noqa: E731 (logged as float32)
    assert logged["icr/icr"] == f32(expect[0.3]["icr"]) and logged["icr/sigma_1"] == f32(expect[1.0]["icr"])
    assert logged["icr/trace_s"] == f32(expect[0.3]["trace_s"]) and logged["icr/n"] == 60
    assert logged["icr/d"] == 6 and icr.history[-1]["icr/tau"] == float(expect[0.3]["tau"])
    assert torch.equal(icr.evaluation.eigenvalues[0.3], expect[0.3]["eigenvalues"].cpu())
    mem_expect = MemorizationEvaluation(data, num_samples=10, seed=5, batch_size=4).evaluate(module)
    assert logged["mem/ratio"] == f32(mem_expect["ratio"]) and logged["mem/nonfinite"] == 0.0


def test_the_monitors_validate_like_before():
    from lightning_pfd.callbacks import ICRMonitor, MemorizationMonitor
    with pytest.raises(ConfigError, match=r"^tap: "):  # the argument's name; the CLI adds its config path
        ICRMonitor(tap=3)
    with pytest.raises(ConfigError, match=r"^criterion: .*did you mean 'cosine'"):
        MemorizationMonitor(criterion="cosin")
    mon = ICRMonitor(num_images=8, schedule="log")
    assert mon.schedule.kind == "log" and mon.evaluation.sigmas == [] and mon.evaluation.level == 3


# ----------------------------------------------------------------------------- icr-sweep
def test_icr_sweep_rows_are_the_evaluation_and_a_probe_on_its_features():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from lightning_pfd.evaluation.icr_sweep import sweep

    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 2, (90,), generator=g)
    data = torch.randn(90, 6, generator=g) + 1.5 * labels[:, None].float()
    dm = SimpleNamespace(train_data=data[:60], train_labels=labels[:60], val_data=data[60:],
                         val_labels=labels[60:])
    module = _mlp_module().eval()
    rows = sweep(module, dm, [0.2, 2.0], num_images=50, d_proj=5, batch_size=32, seed=1)
    ev = RepresentationEvaluation(dm.train_data, num_images=50, sigma=0.2, sigmas=[2.0], d_proj=5,
                                  batch_size=32, seed=1)
    direct = ev.evaluate(module)
    proj = seeded_noise([1], (16, 5), dtype=torch.float64, stream=stream("icr.projection"))[0] / math.sqrt(5)

    def feats(x, sigma, seed):
        n = seeded_noise(torch.arange(x.shape[0]) + seed, x.shape[1:], stream=stream("icr_sweep.noise"))
        return (_tap(module.denoiser, x + sigma * n, sigma) @ proj).numpy()

    for row, s in zip(rows, (0.2, 2.0)):
        assert row["icr"] == float(direct[s]["icr"]) and row["trace_xi"] == float(direct[s]["trace_xi"])
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=1))
        clf.fit(feats(dm.train_data, s, 1), dm.train_labels.numpy())
        assert row["probe_acc"] == pytest.approx(clf.score(feats(dm.val_data, s, 10_000_001),
                                                           dm.val_labels.numpy()), abs=1e-12)


# ----------------------------------------------------------------------------- memorization
def _numpy_ratio(gen, train, criterion, threshold):
    g, t = gen.reshape(len(gen), -1).double().numpy(), train.reshape(len(train), -1).double().numpy()
    hits = 0
    for x in g:
        if criterion == "cosine":
            cos = (t @ x) / (np.linalg.norm(t, axis=1) * np.linalg.norm(x))
            hits += cos.max() > threshold
        else:
            d = np.sort(np.sqrt(((t - x) ** 2).sum(1)))
            hits += (0.0 if d[0] == 0 else d[0] / d[1]) < threshold
    return hits / len(g)


@pytest.mark.parametrize("criterion, threshold", [("nn_ratio", None), ("cosine", 0.9)])
def test_memorization_ratio_matches_numpy_brute_force(criterion, threshold):
    g = torch.Generator().manual_seed(8)
    train = torch.randn(60, 2, 3, 3, generator=g) * 4
    train[7] = train[3]  # a duplicated training point: its exact copies must count as memorized

    def sampler(seeds):  # copies, near-copies (noise 0.2 or 2) and fresh samples; row i from seed i
        base = train[seeds % 60]
        scale = torch.tensor([0.0, 0.2, 2.0, 100.0])[seeds % 4].reshape(-1, 1, 1, 1)
        return base + scale * seeded_noise(seeds, base.shape[1:])

    ev = MemorizationEvaluation(train, num_samples=41, criterion=criterion, threshold=threshold,
                                seed=0, chunk_size=16)
    got = ev.evaluate(sampler)
    samples = sampler(torch.arange(41))
    expect = _numpy_ratio(samples, train, criterion, 1 / 3 if threshold is None else threshold)
    assert got["ratio"] == pytest.approx(expect, abs=1e-15) and got["nonfinite"] == 0.0
    assert 0 < expect < 1
    merged = ev.results(ev.merge([ev.shard_statistics(sampler, r, 3) for r in range(3)]))
    assert merged == got


def test_memorization_descriptor_and_nan_samples():
    g = torch.Generator().manual_seed(9)
    train = torch.randn(30, 5, generator=g)
    w = torch.randn(5, 3, generator=g)
    desc = torch.nn.Linear(5, 3, bias=False)
    with torch.no_grad():
        desc.weight.copy_(w.T)

    def sampler(seeds):
        out = train[seeds % 30] + 0.05 * (seeds % 2)[:, None]
        out[seeds % 7 == 3] = math.nan
        return out

    ev = MemorizationEvaluation(train, num_samples=20, descriptor=desc, seed=0)
    got = ev.evaluate(sampler)
    assert math.isnan(got["ratio"]) and got["nonfinite"] == pytest.approx(3 / 20)
    seeds = torch.arange(20)
    finite = sampler(seeds)[seeds % 7 != 3]
    stats = ev.sample_statistics(finite)
    expect = _numpy_ratio(finite @ w, train @ w, "nn_ratio", 1 / 3)
    assert float(stats[0] / stats[1]) == pytest.approx(expect, abs=1e-15)


def test_memorization_evaluation_bad_input():
    train = _data(10)
    for kw, field in (({"num_samples": 0}, "num_samples"), ({"criterion": "l2"}, "criterion"),
                      ({"threshold": 2.0}, "threshold"), ({"chunk_size": 0}, "chunk_size"),
                      ({"descriptor": 3}, "descriptor")):
        with pytest.raises(ConfigError) as err:
            MemorizationEvaluation(train, **kw)
        assert err.value.field == field
    with pytest.raises(ConfigError, match="at least 2") as err:
        MemorizationEvaluation(train[:1])
    assert err.value.accepted == ["cosine"]
    with pytest.raises(ConfigError, match="world size 4"):
        MemorizationEvaluation(train, num_samples=3).check_world(4)
    with pytest.raises(ConfigError, match="generate"):
        MemorizationEvaluation(train).evaluate(torch.nn.Linear(2, 2))


def test_a_one_sample_training_set_is_refused_with_its_own_message():
    """ICR estimates covariances over images: one sample is a data problem, not a num_images one
    (the former message offered 'an integer in [2, 1]')."""
    from lightning_pfd.errors import ConfigError
    from lightning_pfd.evaluation.representation import RepresentationEvaluation

    with pytest.raises(ConfigError, match="at least 2 training samples") as info:
        RepresentationEvaluation(torch.randn(1, 64), num_images=2)
    assert "[2, 1]" not in str(info.value)
