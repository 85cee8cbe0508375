"""TailEvaluation (pure torch) and the thin TailMonitor on top of it.

Oracles: the functional metrics (``rmsqe``, ``loader``, ``same_law_floor`` on explicit reference
splits, themselves checked against scipy in test_tails.py), scipy's quad of exact quantile
functions (RMSQE of known laws) and scipy's gaussian_kde + quad (LOADER), both reused from
test_tails.py; the monitor's logged values against ``TailEvaluation.measure`` on the same model.
"""
import math

import numpy as np
import pytest
import torch
from scipy import stats
from test_tails import _loader_oracle, blog_rmsqe_oracle, quasi_sample

from lightning_pfd.errors import ConfigError, renamed_fields
from lightning_pfd.evaluation.tail import TailEvaluation, TailSettings, check_generate, kde_curves
from lightning_pfd.metrics.tails import (kde_density, loader, loader_settings, reference_splits,
                                         rmsqe, same_law_floor)


class LawModel:
    """``generate(seeds)``: one field (``dim`` values) per seed from ``law``, seeded per sample;
    NaN fields for the seeds in ``nan_seeds``. Records the calls."""

    def __init__(self, law, dim=3, nan_seeds=()):
        self.law, self.dim, self.nan_seeds, self.calls = law, dim, set(nan_seeds), []

    def generate(self, seeds, batch_size=256, num_steps=None):
        seeds = torch.as_tensor(seeds)
        self.calls.append((seeds.clone(), batch_size, num_steps))
        rows = [self.law.rvs(self.dim, random_state=np.random.default_rng(int(s))) for s in seeds]
        x = torch.as_tensor(np.stack(rows))
        for i, s in enumerate(seeds.tolist()):
            if s in self.nan_seeds:
                x[i] = math.nan
        return x


class _DM:
    def __init__(self, train, val=None, scale=None):
        self.train_data, self.val_data, self.scale = train, val, scale

    def inverse_transform(self, x):
        return x.double() * (self.scale or 1.0)


def _fields(law, n, dim=3, seed=0):
    return torch.as_tensor(law.rvs((n, dim), random_state=np.random.default_rng(seed)))


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize("kwargs,field", [
    (dict(eta=1.0), "eta"), (dict(definition="rmse"), "definition"), (dict(u_max=0.5), "u_max"),
    (dict(num_levels=0), "num_levels"), (dict(window=(2.0, 1.0)), "window"),
    (dict(window="everything"), "window"), (dict(floor=0.0), "floor"),
    (dict(bandwidth="silvermann"), "bandwidth"), (dict(bandwidth=-1.0), "bandwidth"),
    (dict(num_samples=1), "num_samples"), (dict(num_samples=2.5), "num_samples"),
    (dict(num_splits=0), "num_splits"), (dict(seed_offset=-1), "seed_offset"),
    (dict(batch_size=0), "batch_size"), (dict(num_steps=0), "num_steps"),
    (dict(nonfinite="ignore"), "nonfinite"), (dict(observable="maxx"), "observable"),
    (dict(observable="exceedance", observable_kwargs={"thresh": 2.0}), "observable_kwargs"),
])
def test_settings_refuse_bad_values_before_any_data(kwargs, field):
    with pytest.raises(ConfigError) as err:
        TailSettings(**kwargs)
    assert err.value.field == field


def test_settings_defaults_are_the_blog_definitions():
    s = TailSettings()
    assert (s.definition, s.eta, s.u_max, s.window, s.bandwidth) == ("blog", 0.975, None, None, "silverman")
    assert s.rmsqe_kwargs() == dict(eta=0.975, u_max=None, num_levels=200, definition="blog")
    assert TailSettings(num_steps=7).generate_kwargs() == {"batch_size": 256, "num_steps": 7}
    assert TailSettings(window=[0, 3]).window == (0.0, 3.0)


def test_renamed_fields_maps_the_arguments_it_names():
    """A command names the settings' own arguments by its flags; any other field is kept."""
    with pytest.raises(ConfigError) as err, renamed_fields({"eta": "--eta"}):
        TailSettings(eta=2.0)
    assert err.value.field == "--eta" and err.value.value == 2.0
    with pytest.raises(ConfigError) as err, renamed_fields({"eta": "--eta"}):
        TailSettings(floor=-1)
    assert err.value.field == "floor"


# ----------------------------------------------------------------------------- measure = functional
def test_measure_equals_the_functional_metrics_on_the_same_samples():
    ref_law, gen_law = stats.lomax(c=3.0), stats.lomax(c=2.0)
    data = _fields(ref_law, 200)
    model = LawModel(gen_law)
    ev = TailEvaluation(data, num_samples=60, eta=0.9, num_splits=3, split_seed=4, seed_offset=11,
                        batch_size=17, num_steps=5)
    got = ev.evaluate(model)
    # the samples: seeds 11..70 in one generate call with the settings' batch_size / num_steps
    (seeds, bs, steps), = model.calls
    assert torch.equal(seeds, torch.arange(11, 71)) and (bs, steps) == (17, 5)
    gen = model.generate(seeds).amax(1).double()
    ref = data.double().amax(1)
    torch.testing.assert_close(ev.reference_observable, ref, rtol=0, atol=0)
    ls = loader_settings(ref)  # the LOADER settings frozen on the full reference
    assert ev.metric_settings()["loader"] == ls
    rest = [b for _, b in reference_splits(200, 60, 3, 4)]
    assert got["rmsqe"] == pytest.approx(np.mean([float(rmsqe(gen, ref[b], eta=0.9)) for b in rest]),
                                         rel=1e-12)
    assert got["loader"] == pytest.approx(np.mean([float(loader(gen, ref[b], **ls)) for b in rest]),
                                          rel=1e-12)
    assert got["rmsqe_floor"] == pytest.approx(float(same_law_floor(ref, "rmsqe", 3, 4, 60, eta=0.9)),
                                               rel=1e-12)
    assert got["loader_floor"] == pytest.approx(float(same_law_floor(ref, "loader", 3, 4, 60, **ls)),
                                                rel=1e-12)
    assert got["nonfinite"] == 0.0
    assert got["rmsqe"] > got["rmsqe_floor"] and got["loader"] > got["loader_floor"]  # heavier tail


def test_rmsqe_matches_the_scipy_population_integral():
    """Quasi-samples of Exp(1) as data, of Exp(2) as the model: the matched RMSQE (the blog's
    integral over [0.975, 1]) is the population value by quad; the floor is far below it."""
    p, q = stats.expon(scale=2.0), stats.expon(scale=1.0)
    n_ref, n_gen = 60_000, 20_000
    data = quasi_sample(q, n_ref)[torch.randperm(n_ref, generator=torch.Generator().manual_seed(0))]

    class Quasi:
        def generate(self, seeds, batch_size=256):
            return quasi_sample(p, n_gen)[torch.as_tensor(seeds)].reshape(-1, 1)

    ev = TailEvaluation(data.reshape(-1, 1), num_samples=n_gen, num_splits=2, seed_offset=0)
    got = ev.evaluate(Quasi())
    expected = blog_rmsqe_oracle(p, q, 0.975)
    assert got["rmsqe"] == pytest.approx(expected, rel=0.05)
    assert got["rmsqe_floor"] < 0.05 * expected


def test_loader_matches_gaussian_kde_and_quad():
    """One split: LOADER of the model's observables against the split's rest equals the scipy
    gaussian_kde + quad integral with the evaluation's bandwidth and absolute floor."""
    data = _fields(stats.lomax(c=3.0), 190, dim=1, seed=3)
    model = LawModel(stats.lomax(c=2.0), dim=1)
    ev = TailEvaluation(data, num_samples=40, num_splits=1, seed_offset=5)
    got = ev.evaluate(model)
    st = ev.metric_settings()["loader"]
    (_, rest), = reference_splits(190, 40, 1, 0)
    gen = model.generate(torch.arange(5, 45))[:, 0].numpy()
    expected, _ = _loader_oracle(gen, data[rest, 0].numpy(), st["bandwidth"], st["floor"])
    assert got["loader"] == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------- non-finite samples
def test_nonfinite_policies():
    data = _fields(stats.lomax(c=3.0), 120)
    model = LawModel(stats.lomax(c=3.0), nan_seeds=range(1, 40, 2))  # 20 of the 40 seeds 0..39
    nan = TailEvaluation(data, num_samples=40, seed_offset=0, num_splits=2).evaluate(model)
    assert nan["nonfinite"] == 0.5 and math.isnan(nan["rmsqe"]) and math.isnan(nan["loader"])
    assert math.isfinite(nan["loader_floor"])
    drop = TailEvaluation(data, num_samples=40, seed_offset=0, num_splits=2, nonfinite="drop")
    got = drop.evaluate(model)
    obs = model.generate(torch.arange(0, 40, 2)).amax(1)
    ref, ls = drop.reference_observable, drop.metric_settings()["loader"]
    rest = [b for _, b in reference_splits(120, 40, 2, 0)]  # the floors' n_gen: all 40 samples
    assert got["nonfinite"] == 0.5
    assert got["loader"] == pytest.approx(np.mean([float(loader(obs, ref[b], **ls)) for b in rest]),
                                          rel=1e-12)
    all_nan = LawModel(stats.lomax(c=3.0), nan_seeds=range(40))
    assert math.isnan(drop.evaluate(all_nan)["rmsqe"]) and drop.evaluate(all_nan)["nonfinite"] == 1.0
    with pytest.raises(ConfigError, match="num_samples = 40"):
        drop.scores(obs)  # 20 values: not the observables of all num_samples samples


# ----------------------------------------------------------------------------- data, checks
def test_from_datamodule_uses_its_split_and_inverse_transform():
    train, val = _fields(stats.expon(), 50), _fields(stats.expon(), 30, seed=1)
    dm = _DM(train, val, scale=10.0)
    ev = TailEvaluation.from_datamodule(dm, "val", observable="exceedance",
                                        observable_kwargs={"threshold": 12.0}, num_samples=8)
    want = ((val * 10.0) > 12.0).double().mean(1)
    torch.testing.assert_close(ev.reference_observable, want, rtol=0, atol=0)
    assert ev.n_ref == 30
    with pytest.raises(ConfigError) as err:
        TailEvaluation.from_datamodule(_DM(train), "val", num_samples=8)
    assert err.value.field == "reference" and err.value.accepted == ["train"]
    with pytest.raises(ConfigError, match="reference"):
        TailEvaluation.from_datamodule(dm, "test")


def test_check_refuses_what_cannot_work():
    data = _fields(stats.expon(), 24)
    TailEvaluation(data, num_samples=23).check_world(4)
    with pytest.raises(ConfigError, match="same-law floor") as err:
        TailEvaluation(data, num_samples=24).check_world()
    assert err.value.field == "num_samples"
    with pytest.raises(ConfigError, match="world size 4"):
        TailEvaluation(data, num_samples=3).check_world(4)
    from lightning_pfd.metrics.observables import OBSERVABLES, register_observable

    if "test_eval_rows" not in OBSERVABLES:
        register_observable("test_eval_rows")(lambda x: x.reshape(x.shape[0], -1).double())
    with pytest.raises(ConfigError, match="one scalar per sample") as err:
        TailEvaluation(data, num_samples=8, observable="test_eval_rows").check_world()
    assert err.value.field == "observable"
    with pytest.raises(ConfigError) as err:
        check_generate(object())
    assert err.value.field == "model" and "LevyItoModule" in err.value.accepted

    class Fixed:
        def generate(self, seeds, batch_size=256):
            return torch.zeros(len(seeds), 3)

    check_generate(Fixed())
    with pytest.raises(ConfigError) as err:
        TailEvaluation(data, num_samples=8, num_steps=4).sample(Fixed())
    assert err.value.field == "num_steps"
    with pytest.raises(ConfigError, match="data"):
        TailEvaluation(torch.zeros(0, 3))


def test_density_data_uses_loaders_bandwidth_and_drops_nonfinite():
    data = _fields(stats.lomax(c=3.0), 300, dim=1)
    ev = TailEvaluation(data, num_samples=50, bandwidth=0.2)
    gen = torch.cat([torch.linspace(0.0, 2.0, 48, dtype=torch.float64),
                     torch.tensor([math.nan, math.inf], dtype=torch.float64)])
    d = ev.density_data(gen)
    assert set(d["densities"]) == {"data", "model"} and ev.metric_settings()["loader"]["bandwidth"] == 0.2
    np.testing.assert_allclose(d["densities"]["data"], kde_density(ev.reference_observable, d["x"], 0.2))
    np.testing.assert_allclose(d["densities"]["model"], kde_density(gen[:48], d["x"], 0.2))
    ref = ev.reference_observable
    assert d["x"][0] == 0.0 and d["x"][-1] == pytest.approx(max(float(ref.max()), 2.0))  # all finite
    peak = d["densities"]["data"].max()
    assert d["ylim"] == pytest.approx((peak * 1e-5, peak * 3))
    # wild outliers are cut at twice the reference's range beyond its maximum
    far = kde_curves({"data": ref, "model": torch.tensor([0.5, 1e9], dtype=torch.float64)}, 0.2)
    span = float(ref.max() - ref.min())
    assert far["x"][-1] == pytest.approx(float(ref.max()) + 2 * span)
    fig = ev.density_figure({"a": gen, "b": gen[:2]}, "t")
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3
    import matplotlib.pyplot as plt

    plt.close(fig)


# ----------------------------------------------------------------------------- the monitor
def _fit_with(monitor, tmp_path, seed=0):
    import lightning.pytorch as pl

    from lightning_pfd.data import TensorDataModule
    from lightning_pfd.modules import LevyItoModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(seed)
    data = _fields(stats.lomax(c=3.0), 128, dim=4, seed=5).float()
    dm = TensorDataModule(train_data=data, val_data=data[:32], batch_size=32, value_range=None)
    model = LevyItoModule(MLPNet(dim=4, hidden=16, depth=1, emb_dim=8), alpha=1.7, num_steps=4,
                          ema_decay=0.9)
    trainer = pl.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[monitor])
    trainer.fit(model, datamodule=dm)
    return trainer, model, dm


def test_monitor_logs_exactly_what_measure_returns(tmp_path):
    mon = TailMonitor_(num_samples=48, eta=0.9, num_splits=2, seed_offset=3, plot=True,
                       name="tail_b", every_n_epochs=2)
    trainer, model, dm = _fit_with(mon, tmp_path)
    assert [r["epoch"] for r in mon.history] == [0, 2]  # passes 0, 1, 2: every second one
    direct = TailEvaluation.from_datamodule(dm, "train", mon.evaluation.settings).evaluate(model)
    m = trainer.callback_metrics
    for k, v in direct.items():
        assert mon.history[-1][f"tail_b/{k}"] == v  # float64, bit for bit
        assert float(m[f"tail_b/{k}"]) == pytest.approx(v, rel=1e-6)  # logged as float32
    assert (tmp_path / "figures" / "tail_b_density-epoch0002.png").exists()
    from lightning_pfd import keys

    assert keys.collect([mon]).get("tail_b/loader").lower_is_better is True  # tail/*'s definition, renamed
    assert mon.state_key.startswith("TailMonitor{") and "'name': 'tail_b'" in mon.state_key


def TailMonitor_(**kw):
    from lightning_pfd.callbacks import TailMonitor

    return TailMonitor(**kw)


def test_monitor_bad_arguments_name_the_argument():
    for kw, field in ((dict(eta=1.5), "eta"), (dict(reference="test"), "reference"),
                      (dict(observable="maxx"), "observable"), (dict(definition="x"), "definition"),
                      (dict(num_samples=0), "num_samples"), (dict(name="a/b"), "name")):
        with pytest.raises(ConfigError) as err:
            TailMonitor_(**kw)
        assert err.value.field == field, kw  # the command line adds the config path (test_cli.py)


def test_diagnostics_against_brute_force():
    """above_range / below_range = the fractions of fields with a value above / below the data
    range; the clipped
    scores = the matched scores of the clipped fields' observables; rmsqe_top_share = the
    largest per-sample part of the matched RMSQE / the RMSQE (brute force over the splits)."""
    from test_tails import _contributions_fraction

    rng = np.random.default_rng(0)
    data = torch.as_tensor(rng.uniform(-1, 1, (300, 4)))
    x = torch.as_tensor(rng.uniform(-1, 1, (60, 4)))
    x[5, 2], x[9, 0], x[9, 1], x[30, 3] = 25.0, 3.0, -4.0, -1.5  # 2 fields above, 2 below
    ev = TailEvaluation(data, num_samples=60, eta=0.9, num_splits=3, split_seed=1,
                        inverse_transform=lambda y: torch.expm1(2 * y), value_range=(-1.0, 1.0))
    got = ev.measure_rows(ev.observe_rows(x))
    assert got["above_range"] == pytest.approx(2 / 60, rel=1e-15)
    assert got["below_range"] == pytest.approx(2 / 60, rel=1e-15)
    obs = torch.expm1(2 * x).amax(1)
    clipped = torch.expm1(2 * x.clamp(-1, 1)).amax(1)
    ref = torch.expm1(2 * data).amax(1)
    rest = [b for _, b in reference_splits(300, 60, 3, 1)]
    assert got["rmsqe"] == pytest.approx(np.mean([float(rmsqe(obs, ref[b], eta=0.9)) for b in rest]), rel=1e-12)
    assert got["rmsqe_clipped"] == pytest.approx(
        np.mean([float(rmsqe(clipped, ref[b], eta=0.9)) for b in rest]), rel=1e-12)
    ls = loader_settings(ref)
    assert got["loader_clipped"] == pytest.approx(
        np.mean([float(loader(clipped, ref[b], **ls)) for b in rest]), rel=1e-12)
    per = np.mean([_contributions_fraction(obs.numpy(), ref[b].numpy(), 0.9) for b in rest], 0)
    assert got["rmsqe_top_share"] == pytest.approx(per.max() / per.sum(), rel=1e-12)
    assert got["rmsqe_top_share"] > 0.99  # the field at 25 (e^50) decides the score
    assert got["rmsqe_clipped"] < got["rmsqe"] * 1e-10
    # default value_range: the reference's min/max; from_datamodule: the declared range
    assert TailEvaluation(data, num_samples=60).value_range == (float(data.min()), float(data.max()))
    dm = _DM(data)
    dm.value_range = (-2.0, 2.0)
    assert TailEvaluation.from_datamodule(dm, num_samples=60).value_range == (-2.0, 2.0)
    with pytest.raises(ConfigError, match="value_range"):
        TailEvaluation(data, num_samples=60, value_range=(1.0, -1.0))
