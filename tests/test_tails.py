"""RMSQE / LOADER vs scipy-integrated values for analytic laws; floors; bad input; observables."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from lightning_pfd.metrics import (LogAbsoluteDensityRatio, RootMeanSquaredQuantileError,
                                   get_observable, loader, register_observable, rmsqe,
                                   same_law_floor)
from lightning_pfd.metrics.tails import (integrate_abs_log_ratio, kde_density, loader_settings,
                                        matched_score, reference_splits)


def quasi_sample(dist, n):
    """Deterministic 'sample' x_i = Q((i - 1/2)/n): empirical quantiles ~ exact quantiles."""
    return torch.as_tensor(dist.ppf((np.arange(n) + 0.5) / n))


def rmsqe_oracle(p, q, eta, u_max):
    val, _ = integrate.quad(lambda u: (p.ppf(u) - q.ppf(u)) ** 2, eta, u_max, limit=200)
    return math.sqrt(val / (u_max - eta))


@pytest.mark.parametrize("pair", [
    (stats.expon(scale=1.0), stats.expon(scale=2.0)),
    (stats.pareto(b=3.0), stats.pareto(b=2.0)),
])
def test_rmsqe_matches_scipy_integral(pair):
    p, q = pair
    eta, u_max = 0.975, 0.999
    expected = rmsqe_oracle(p, q, eta, u_max)
    got = rmsqe(quasi_sample(p, 200_000), quasi_sample(q, 200_000), eta, u_max, num_levels=2000)
    assert abs(float(got) / expected - 1) < 2e-3
    # random samples: same value within sampling error
    rng = np.random.default_rng(0)
    got_r = rmsqe(p.rvs(200_000, random_state=rng), q.rvs(200_000, random_state=rng), eta, u_max)
    assert abs(float(got_r) / expected - 1) < 0.1


def test_rmsqe_sees_the_tail_and_ignores_the_bulk():
    """Two laws equal above their 90% quantile but very different in the bulk: RMSQE ~ 0.
    Two laws equal in the bulk but different above the 97.5% quantile: RMSQE large."""
    n = 100_000
    u = (np.arange(n) + 0.5) / n
    base = stats.pareto(b=2.5).ppf(u)
    bulk_changed = np.where(u < 0.9, 0.3 * base, base)  # only the bulk differs
    tail_changed = np.where(u > 0.98, 3.0 * base, base)  # only the tail differs
    assert float(rmsqe(bulk_changed, base)) < 1e-9
    assert float(rmsqe(tail_changed, base)) > 5.0
    # the full-range quantile error (eta -> 0) does see the bulk change
    assert float(rmsqe(bulk_changed, base, eta=0.01)) > 0.3


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
    with pytest.raises(ValueError, match="u_max"):  # too few samples for eta = 0.975
        rmsqe(np.arange(20.0), np.arange(20.0))


@pytest.mark.parametrize("kwargs,match", [
    (dict(window=(2.0, 1.0)), "window"), (dict(window=(0.0, float("inf"))), "window"),
    (dict(window=3.0), "window"), (dict(floor=0.0), "floor"), (dict(bandwidth=-1.0), "bandwidth"),
    (dict(bandwidth="magic"), "bandwidth"),
])
def test_loader_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        loader(np.arange(100.0), np.arange(100.0), **kwargs)
    if "window" in kwargs or "floor" in kwargs or kwargs.get("bandwidth") == "magic":
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
    dm = TensorDataModule(train_data=data, val_data=data[:32], batch_size=64)
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
    window = (float(ref.min()), float(ref.max()))
    # model and floors: same reference splits (n_gen = 96 vs the other 160), same settings
    ls = loader_settings(ref, window=window)
    u_max = 1 - 1 / 96
    rest = [r for _, r in reference_splits(256, 96, 2, 0)]
    assert float(m["tail/rmsqe"]) == pytest.approx(
        np.mean([float(rmsqe(gen, ref[r], eta=0.9, u_max=u_max)) for r in rest]), rel=1e-5)
    assert float(m["tail/loader"]) == pytest.approx(
        np.mean([float(loader(gen, ref[r], **ls)) for r in rest]), rel=1e-5)
    assert float(m["tail/loader_floor"]) == pytest.approx(
        float(same_law_floor(ref, "loader", 2, n_gen=96, **ls)), rel=1e-5)
    assert float(m["tail/rmsqe_floor"]) == pytest.approx(
        float(same_law_floor(ref, "rmsqe", 2, n_gen=96, eta=0.9, u_max=u_max)), rel=1e-5)
    assert (tmp_path / "tail_density" / "epoch_0000.png").exists()
    # resume state
    state = mon.state_dict()
    mon2 = TailMonitor()
    mon2.load_state_dict(state)
    assert mon2.history == mon.history and mon2.floors == mon.floors


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


# --------------------------------------------------- same-law floor = perfect model (§13)
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
    from lightning_pfd.callbacks import TailMonitor
    from lightning_pfd.experiments_cli import main

    mon = TailMonitor(num_samples=64)
    with pytest.raises(ValueError, match="num_samples"):
        mon._metric_settings(torch.arange(64, dtype=torch.float64))
    st = mon._metric_settings(torch.arange(65, dtype=torch.float64))
    assert st["rmsqe"]["u_max"] == 1 - 1 / 64 and st["loader"]["relative_floor"] is False
    assert main(["--num-samples", "100", "--n-train", "64"]) == 2
    assert "--num-samples" in capsys.readouterr().err
