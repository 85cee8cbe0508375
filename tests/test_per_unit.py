"""Per-unit records, standard errors, paired held-out tests and their calibration.

Oracles: Monte Carlo over independent seed sets (the standard errors), closed-form AR(1)
variograms (the training-noise bound), and the calibration nulls of
calibration (false events, power)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from calibration import NullSpec, calibrate, simulate
from lightning_pfd.analysis.events import MIN_SIGMA, detect_double_descent, detect_early_learning
from lightning_pfd.analysis.inference import Curve, contrast, curves_from_units, leg_test, variogram
from lightning_pfd.analysis.per_unit import (PerUnitStore, UnitRecord, UnitSeries, find_store, load_units,
                                             read_records, value_and_se)


# ----------------------------------------------------------------------------- the store
def _rec(key="pfd/e_gen", epoch=0, values=None, units=None, kind="sq_dist"):
    v = np.arange(1.0, 9.0) if values is None else values
    u = np.arange(v.size) + 2_000_000 if units is None else units
    return UnitRecord(key, epoch, 10 * epoch, kind, v, u, value_and_se(v, kind)[0])


def test_store_roundtrip_and_one_record_per_epoch(tmp_path):
    store = PerUnitStore(tmp_path / "per_unit")
    for e in range(3):
        store.write(_rec(epoch=e, values=np.arange(1.0, 9.0) + e))
    store.write(_rec(epoch=1, values=np.full(8, 7.0)))  # a resumed run measures epoch 1 again
    recs, problems = read_records(store.root)
    assert problems == []
    assert [r.epoch for r in recs["pfd/e_gen"]] == [0, 1, 2]
    np.testing.assert_array_equal(recs["pfd/e_gen"][1].values, np.full(8, 7.0))
    assert not list(store.root.rglob(".tmp-*"))  # atomic writes leave no temporary file
    series = UnitSeries.from_records(recs["pfd/e_gen"])
    assert series.values.shape == (3, 8) and series.kind == "sq_dist"
    assert find_store(tmp_path) == store.root and find_store(tmp_path / "wandb" / "x") == store.root


def test_bad_records_are_reported_and_never_used(tmp_path):
    store = PerUnitStore(tmp_path / "per_unit")
    for e in range(3):
        store.write(_rec(epoch=e))
        store.write(_rec(key="pfd/e_mem", epoch=e))
    p = store.path("pfd/e_gen", 1)
    p.write_bytes(p.read_bytes()[:40])  # truncated
    store.write(_rec(key="pfd/e_mem", epoch=2, values=np.arange(1.0, 5.0)))  # other units: unpaired
    store.write(_rec(key="icr/icr", epoch=0))
    store.write(_rec(key="icr/icr", epoch=1))
    store.path("icr/icr", 0).write_bytes(store.path("pfd/e_gen", 0).read_bytes())  # names another metric
    units, problems = load_units(store.root)
    assert units == {}  # every metric left out entirely
    assert any("icr_icr/epoch_000000.npz" in p and "names the metric 'pfd/e_gen'" in p for p in problems)
    assert any("epoch_000001.npz" in p and "unreadable" in p for p in problems)
    assert any("pfd_e_mem" in p and "paired" in p for p in problems)
    with pytest.raises(ValueError, match="one length"):
        UnitRecord("k", 0, 0, "sq_dist", np.ones(3), np.arange(4))
    with pytest.raises(ValueError, match="kind"):
        UnitRecord("k", 0, 0, "median", np.ones(3), np.arange(3))


# ----------------------------------------------------------------------------- standard errors
def test_pfd_standard_error_matches_monte_carlo():
    """se(E) of E = sqrt(mean d²) (delta method) against the spread of E over 4000 independent
    seed sets of M = 256 heavy-tailed squared distances."""
    rng = np.random.default_rng(0)
    draws = lambda size: rng.gamma(0.7, 3.0, size) + 0.5 * rng.lognormal(0, 1.2, size)  # noqa: E731
    es, ses = [], []
    for _ in range(4000):
        d2 = draws(256)
        e, se = value_and_se(d2, "sq_dist")
        es.append(e)
        ses.append(se)
    assert np.mean(ses) == pytest.approx(np.std(es), rel=0.08)
    flags = (rng.random((4000, 128)) < 0.3).astype(float)
    ratio_se = [value_and_se(f, "indicator")[1] for f in flags]
    assert np.mean(ratio_se) == pytest.approx(np.std(flags.mean(1)), rel=0.08)
    reps = rng.normal(0.5, 0.01, 16)  # jackknife: sqrt((G-1)/G sum (r - mean)²)
    assert value_and_se(reps, "jackknife", 0.5)[1] == pytest.approx(math.sqrt(15 / 16 * np.sum((reps - reps.mean()) ** 2)))


def test_paired_contrast_error_matches_monte_carlo():
    """The paired seed error of E(epoch 1) − E(epoch 0) when each seed's d² is strongly
    correlated between the epochs: Monte Carlo over 3000 seed sets."""
    rng = np.random.default_rng(1)
    diffs, ses = [], []
    for _ in range(3000):
        base = rng.gamma(1.0, 2.0, 200)
        d2 = np.stack([base, base * rng.lognormal(0.05, 0.2, 200)])
        curve = Curve(np.arange(2.0), np.sqrt(d2.mean(1)), d2 / (2 * np.sqrt(d2.mean(1)))[:, None], "linear")
        c = np.array([-1.0, 1.0])
        diffs.append(c @ curve.y)
        ses.append(math.sqrt(curve.seed_var(c)[0]))
    assert np.mean(ses) == pytest.approx(np.std(diffs), rel=0.08)
    unpaired = math.sqrt(2) * np.mean([value_and_se(rng.gamma(1.0, 2.0, 200), "sq_dist")[1] for _ in range(200)])
    assert np.mean(ses) < 0.5 * unpaired  # pairing removes the shared seed variation


@pytest.mark.parametrize("phi", [0.0, 0.9, 0.97])
def test_variogram_bounds_the_true_variogram(phi):
    """V̂(h) against the closed form of an AR(1) (sd 1): 2(1 − φ^h). The estimate is an upper
    bound up to estimation noise (third differences: <= 2.5x for white noise)."""
    rng = np.random.default_rng(2)
    n = 6000
    e = rng.standard_normal(n) * math.sqrt(1 - phi ** 2)
    y = np.empty(n)
    y[0] = rng.standard_normal()
    for i in range(1, n):
        y[i] = phi * y[i - 1] + e[i]
    trend = 2 + np.exp(-np.arange(n) / 800)
    V = variogram(Curve(np.arange(n, dtype=float), trend + y))
    for h in (1, 5, 20, 100):
        true = 2 * (1 - phi ** h)
        assert 0.85 * true <= V[h] <= 2.8 * true, (h, V[h], true)


def test_a_discrete_ratio_has_a_binomial_floor_never_zero():
    """Pure binomial indicators (no training noise): the training part of Var(D_1) is estimated
    as total − seed, often <= 0. For a ratio of indicators it is floored at seed·sqrt(2/count),
    which (Monte Carlo over 200 such curves) is below the estimate's own standard deviation: the
    floor is one sampling error at most, not an inflation. It enters as a nugget: the same
    white-noise level added at every lag, lifting V(1) to the floor (a variogram plus a nugget
    is a variogram, and a contrast's variance can only grow); the same values read as a
    continuous metric keep the zero estimate."""
    from lightning_pfd.analysis.inference import _diff, _robust_var

    rng = np.random.default_rng(3)
    T, h = 100, 1
    ests, floors, zero_left, lifted = [], [], 0, 0
    for _ in range(200):
        u = (rng.random((T, 128)) < 0.05).astype(np.float64)  # 128 indicators at rate 0.05
        ratio = Curve(np.arange(T, dtype=float), u.mean(1), u, "linear", True)
        d = _diff(ratio.y, h, 3)
        seed = float(np.mean(ratio.unit_var(_diff(ratio.units, h, 3))))
        ests.append(_robust_var(d) - seed)
        floors.append(seed * math.sqrt(2 * h / d.size))
        V = variogram(ratio)
        assert np.all(V[1:] > 0)  # never 0 where indicators change
        assert V[1] >= 0.25 * floors[-1] * (1 - 1e-12)
        continuous = variogram(Curve(ratio.epochs, ratio.y, u, "linear", False))
        zero_left += continuous[1] == 0.0
        nugget = V[1:] - continuous[1:]  # the floor adds the same white-noise level at every lag
        assert np.allclose(nugget, nugget[0], rtol=0, atol=1e-15) and nugget[0] >= 0
        if nugget[0] > 0:
            lifted += 1
            assert V[1] == pytest.approx(0.25 * floors[-1])
    assert np.mean(floors) < np.std(ests)
    assert zero_left > 0  # the unfloored estimate is 0 on some of these curves
    assert lifted >= zero_left


def test_a_ratio_that_sits_at_zero_then_moves_gives_finite_significance():
    """Indicators all 0 for 30 evaluations, then a binomial 0.2 for 20: the onset, if any, has a
    finite significance (the floor replaces a zero training-noise estimate) and is confirmed."""
    from lightning_pfd.analysis.events import detect_memorization_onset

    rng = np.random.default_rng(4)
    T, U = 50, 128
    p = np.where(np.arange(T) < 30, 0.0, 0.2)
    u = (rng.random((T, U)) < p[:, None]).astype(np.float64)
    series = UnitSeries("mem/ratio", "indicator", np.arange(T, dtype=float), u, np.arange(U), u.mean(1))
    ev = detect_memorization_onset(np.arange(T, dtype=float), u.mean(1), units=series)
    assert ev is not None and math.isfinite(ev.significance) and ev.status == "confirmed"
    assert 27 <= ev.epoch <= 32  # the change at 30, located within the smoothing window (5)


# ----------------------------------------------------------------------------- held-out tests
def test_held_out_z_is_calibrated_on_the_seed_flip_null():
    """A fixed contrast (evaluation 400 vs 100) on the held-out half of a seed-flip null (slow,
    per-seed noise, no event): z has mean ~0 and a spread no larger than 1 (the training-noise
    bound may only add variance)."""
    zs = []
    for r in range(120):
        x, y, u = simulate(NullSpec("seed_flip", num_seeds=256), 700 + r)
        _, test, _, held = curves_from_units(u)
        leg = leg_test(test, contrast(len(test), np.array([400]), np.array([100])))
        zs.append(leg.diff / leg.se)
        assert held
    zs = np.array(zs) - np.mean(zs)  # the (known, common) trend moves the mean, not the spread
    assert 0.5 <= np.std(zs) <= 1.15


def test_calibration_nulls_and_power_small():
    """The shipped calibration at small size (the full table: experiments/calibrate_events.py):
    no more than 2 false events in 60 runs of each null, and planted events of height 0.3 found."""
    for spec in (NullSpec("seed_flip", num_seeds=256), NullSpec("ar1", phi=0.97),
                 NullSpec("seed_flip_common", num_seeds=256)):
        for det in (detect_early_learning, detect_double_descent):
            assert calibrate(det, spec, 60, seed0=123)["events"] <= 2, (spec.kind, det.__name__)
    spec = NullSpec("seed_flip", num_seeds=2048)
    for det, name in ((detect_double_descent, "double_descent"), (detect_early_learning, "early_learning")):
        r = calibrate(det, spec, 20, event=name, height=0.3, seed0=9)
        assert r["rate"] >= 0.8 and r["median_z"] >= MIN_SIGMA, (name, r)


def test_seed_flip_null_reproduces_the_measured_noise():
    """The seed-flip null's E curve at M = 256: residual sd ≈ 0.05 and lag-1 ≈ 0.96 (the
    500-epoch run's), less noise with more seeds."""
    from calibration import planted_trend

    stats = {}
    for m in (256, 2048):
        r = []
        for s in range(6):
            x, y, _ = simulate(NullSpec("seed_flip", num_seeds=m), s)
            res = (y - planted_trend(x, None, 0))[100:]
            r.append((res.std(), np.corrcoef(res[:-1], res[1:])[0, 1]))
        stats[m] = np.mean(r, 0)
    assert 0.04 <= stats[256][0] <= 0.06 and stats[256][1] >= 0.93
    assert stats[2048][0] == pytest.approx(stats[256][0] / math.sqrt(8), rel=0.3)


# ----------------------------------------------------------------------------- the noise model
def test_shape_factor_is_the_power_law_identity():
    """For V(h) = h^a, Var(D_h) = (15 − 6·2^a + 3^a)·V(h) (the variogram identity of third
    differences), so the bound V ≤ factor·Var(D_h)/4 is tight at the factor 4/(15 − 6·2^a + 3^a)
    above a = 1.37 and 1 below; it cannot be bounded at a = 2 (a linear drift)."""
    from lightning_pfd.analysis.inference import shape_factor

    h = np.arange(1, 6, dtype=float)
    for a in (0.5, 1.0, 1.5, 1.7):
        V = lambda x: x ** a  # noqa: E731
        var_d = 15 * V(h) - 6 * V(2 * h) + V(3 * h)
        assert np.all(V(h) <= shape_factor(a) * var_d / 4 * (1 + 1e-12))
    assert shape_factor(1.0) == 1.0 and math.isinf(shape_factor(2.0))
    assert shape_factor(1.5) == pytest.approx(4 / (15 - 6 * 2 ** 1.5 + 3 ** 1.5))


@pytest.mark.parametrize("kind, hurst, lo, hi", [("white", 0.5, -3.0, 0.3), ("fbm", 0.85, 1.0, 1.75)])
def test_shape_exponent_is_a_lower_bound_of_the_true_exponent(kind, hurst, lo, hi):
    """White noise has exponent 0, fBm 2H (1.7 here): the reported lower 95 % bound lies below
    the truth and not far below it on 3000 evaluations."""
    from calibration import noise_process
    from lightning_pfd.analysis.inference import shape_exponent

    y = noise_process(np.random.default_rng(4), kind, 3000, hurst=hurst)[:, 0]
    a, _ = shape_exponent(Curve(np.arange(3000.0), y))
    assert lo <= a <= hi


def test_noise_model_sees_noise_that_grows_where_the_leg_is():
    """AR(1) noise whose sd grows 4× over 600 evaluations: the local scale of a contrast at the
    end is well above 1 (the pooled variogram understates it there); at the start, where the
    noise is quieter than pooled (its variance ratio there is about 1/4 of the geometric middle),
    it is below 1 but not below that true ratio (a confidence bound toward 1); with noise of
    constant size both are ≈ 1 (the shrinkage keeps agreeing windows pooled)."""
    from calibration import noise_process
    from lightning_pfd.analysis.inference import NoiseModel

    n = 600
    base = noise_process(np.random.default_rng(5), "ar1", n, phi=0.9)[:, 0]
    end, start = contrast(n, np.arange(n - 5, n), np.array([n - 60])), contrast(n, np.arange(5), np.array([60]))
    grow = NoiseModel.fit(Curve(np.arange(n, dtype=float), base * 4.0 ** (np.arange(n) / n)))
    flat = NoiseModel.fit(Curve(np.arange(n, dtype=float), base))
    assert grow.local_scale(end) > 2.0 and 0.25 < grow.local_scale(start) < 0.8
    assert 0.75 < flat.local_scale(end) < 1.3 and 0.75 < flat.local_scale(start) < 1.3
