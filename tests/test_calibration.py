"""The generator of whole synthetic runs and the calibration harness
(calibration, second part): noise processes against their closed forms,
the per-unit records of a run, nulls without events, the tune / held-out split, the Wilson
interval against scipy, and a run written to disk decided by ``report`` as in memory."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from calibration import (FAMILIES, HELD_OUT, POWER_FAMILIES, TUNE, Family,
                                                calibrate_families, envelope, gen_trend, mem_trend,
                                                noise_process, simulate_run, split, wilson_interval,
                                                write_run)
from lightning_pfd.analysis.per_unit import value_and_se
from lightning_pfd.errors import ConfigError


# ----------------------------------------------------------------------------- noise processes
def test_ar1_has_the_stationary_variance_and_lag1_correlation():
    """Var = 1 at every evaluation (stationary start) and corr(x_t, x_{t+1}) = φ."""
    rng = np.random.default_rng(0)
    phi = 0.8
    x = noise_process(rng, "ar1", 120, 3000, phi=phi)
    assert x.shape == (120, 3000)
    assert x[0].var() == pytest.approx(1.0, abs=0.08)  # the first evaluation too
    assert x[-1].var() == pytest.approx(1.0, abs=0.08)
    assert x.var() == pytest.approx(1.0, abs=0.03)
    assert np.mean(x[1:] * x[:-1]) == pytest.approx(phi, abs=0.02)
    assert np.mean(x[3:] * x[:-3]) == pytest.approx(phi ** 3, abs=0.03)


def test_fgn_covariance_and_fbm_variogram_exponent():
    """fGn: variance 1, lag-1 covariance (2^{2H} − 2)/2; fBm (its cumulative sum):
    Var(B_{t+h} − B_t) = (h/n)^{2H}, a log-log slope of 2H."""
    rng = np.random.default_rng(1)
    n = 256
    for hurst in (0.6, 0.8):
        g = noise_process(rng, "fgn", n, 1500, hurst=hurst)
        assert g.var() == pytest.approx(1.0, abs=0.04)
        assert np.mean(g[1:] * g[:-1]) == pytest.approx((2 ** (2 * hurst) - 2) / 2, abs=0.03)
        b = noise_process(rng, "fbm", n, 1500, hurst=hurst)
        lags = np.array([1, 2, 4, 8, 16, 32])
        v = np.array([np.mean((b[h:] - b[:-h]) ** 2) for h in lags])
        slope = np.polyfit(np.log(lags), np.log(v), 1)[0]
        assert slope == pytest.approx(2 * hurst, abs=0.05)
        np.testing.assert_allclose(v, (lags / n) ** (2 * hurst), rtol=0.1)


def test_random_walk_smooth_and_jump_noise():
    rng = np.random.default_rng(2)
    w = noise_process(rng, "walk", 100, 4000)
    assert w[-1].var() == pytest.approx(1.0, rel=0.08)  # Var = (t + 1)/n
    assert w[49].var() == pytest.approx(0.5, rel=0.08)
    s = noise_process(rng, "smooth", 200, 2000, length=5.0)
    assert s.var() == pytest.approx(1.0, abs=0.05)
    # a Gaussian kernel of sd ℓ convolved with itself: correlation exp(−h²/(4ℓ²))
    for h in (1, 5, 10):
        assert np.mean(s[h:] * s[:-h]) == pytest.approx(math.exp(-h * h / 100.0), abs=0.04)
    j = noise_process(rng, "jumps", 200, 2000, length=20.0)
    assert j.var() == pytest.approx(1.0, abs=0.05)
    assert np.mean(np.diff(j, axis=0) != 0) == pytest.approx(1 / 20, abs=0.005)  # jump rate
    assert not noise_process(rng, "none", 10, 2).any()


def test_growth_factor_of_the_training_noise_through_a_whole_run():
    """A family without seed noise logs E = trend + noise exactly: the noise sd is ``noise_sd``
    at the last evaluation and ``noise_sd``/``growth`` at the first."""
    np.testing.assert_allclose(envelope(5, 16.0), [1, 2, 4, 8, 16])
    fam = Family("g", "training_noise", n_eval=20, num_seeds=4, seed_sd=0.0, noise="white",
                 noise_sd=0.05, growth=2.5, curves="e_only")
    t = np.arange(20.0)
    expected = 0.05 * 2.5 ** (t / 19 - 1)
    res = np.array([simulate_run(fam, s)[0]["pfd/e_gen"][1] - gen_trend(t, 20) for s in range(10_000, 11_500)])
    np.testing.assert_allclose(res.std(0) / expected, 1.0, atol=0.1)  # sd of one estimate: ~2 %
    assert res[:, -3:].std() / res[:, :3].std() == pytest.approx(2.5 ** (17 / 19), rel=0.06)
    shrink = dataclasses.replace(fam, growth=0.4)
    res = np.array([simulate_run(shrink, s)[0]["pfd/e_gen"][1] - gen_trend(t, 20) for s in range(1500)])
    assert res[:, :3].std() / res[:, -3:].std() == pytest.approx(2.5 ** (17 / 19), rel=0.06)
    assert res[:, -1].std() == pytest.approx(0.05, rel=0.1)


# ----------------------------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
def small_run():
    fam = dataclasses.replace(FAMILIES["ar1_m256"], n_eval=30, num_seeds=64, num_samples=50)
    return fam, simulate_run(fam, 7)


def test_a_run_has_every_curve_in_the_input_format_of_analyze_history(small_run):
    fam, (series, units) = small_run
    assert set(series) == set(units) == {"pfd/e_gen", "pfd/e_mem", "mem/ratio", "icr/icr"}
    for key, (x, y) in series.items():
        u = units[key]
        np.testing.assert_array_equal(x, np.arange(30.0))
        np.testing.assert_array_equal(u.epochs, x)
        np.testing.assert_array_equal(u.logged, y)
    for key in ("pfd/e_gen", "pfd/e_mem"):  # E = sqrt(mean d²) over the M seeds
        u = units[key]
        assert u.kind == "sq_dist" and u.values.shape == (30, 64) and np.all(u.values > 0)
        np.testing.assert_allclose(series[key][1], np.sqrt(u.values.mean(1)), rtol=1e-12)
    r = units["mem/ratio"]  # indicators: 0/1, ratio = their mean
    assert r.kind == "indicator" and r.values.shape == (30, 50)
    assert set(np.unique(r.values)) <= {0.0, 1.0}
    np.testing.assert_allclose(series["mem/ratio"][1], r.values.mean(1))
    j = units["icr/icr"]  # 16 delete-a-group replicates whose mean is the full estimate
    assert j.kind == "jackknife" and j.values.shape == (30, 16)
    np.testing.assert_allclose(j.values.mean(1), series["icr/icr"][1], rtol=1e-12)
    # jackknife se of a mean of group contributions a_g = sd(a)/sqrt(G), a_g = G·full − (G−1)·r_g
    a = 16 * j.logged[:, None] - 15 * j.values
    se = np.array([value_and_se(j.values[i], "jackknife", j.logged[i])[1] for i in range(30)])
    np.testing.assert_allclose(se, a.std(1, ddof=1) / 4.0, rtol=1e-9)


def test_runs_are_deterministic_in_the_seed(small_run):
    fam, (series, _) = small_run
    again, _ = simulate_run(fam, 7)
    other, _ = simulate_run(fam, 8)
    for key in series:
        np.testing.assert_array_equal(series[key][1], again[key][1])
        assert not np.array_equal(series[key][1], other[key][1])


def test_no_family_plants_an_event():
    """Without noise every null curve is monotone (E_gen and E_mem fall, ICR flat or falling)
    and the ratio's rate is constant: the per-sample persistence leaves its mean at the baseline."""
    for fam in FAMILIES.values():
        quiet = dataclasses.replace(fam, seed_sd=0.0, noise_sd=0.0, icr_group_sd=0.0, icr_noise_sd=0.0,
                                    ratio_noise_sd=0.0, spike_size=0.0, n_eval=min(fam.n_eval, 60),
                                    num_seeds=8, num_samples=20)
        series, _ = simulate_run(quiet, 0)
        for key in ("pfd/e_gen", "pfd/e_mem", "icr/icr"):
            if key in series:
                assert np.all(np.diff(series[key][1]) <= 1e-12), (fam.name, key)
    fam = dataclasses.replace(FAMILIES["ratio_few_values"], n_eval=40, num_seeds=8, num_samples=400,
                              ratio_noise_sd=0.0)
    ratio = np.array([simulate_run(fam, s)[0]["mem/ratio"][1] for s in range(40)])
    se = math.sqrt(0.03 * 0.97 / (400 * 40 * 20))  # binomial, ignoring the persistence (x ~6)
    assert abs(ratio[:, :20].mean() - 0.03) < 15 * se and abs(ratio[:, 20:].mean() - 0.03) < 15 * se


def test_planted_events_have_their_height():
    """Noise-free planted events: legs of the given height where they belong."""
    n, h = 200, 0.3
    t = np.arange(n, dtype=float)
    bump = gen_trend(t, n, "double_descent", h) - gen_trend(t, n)
    assert bump.max() == pytest.approx(h) and int(np.argmax(bump)) == 120
    fam = Family("p", "ratio", n_eval=n, num_seeds=8, seed_sd=0.0, num_samples=4000,
                 ratio_persistence=0.0, icr_group_sd=0.0, icr_noise_sd=0.0)
    series, _ = simulate_run(fam, 0, event=("early_learning", "memorization_onset", "icr_minimum"), height=h)
    e = series["pfd/e_gen"][1]
    m = int(np.argmin(e))
    # the rise holds to the end; the trend still falls by < 0.025 after the minimum
    assert 0.5 * n < m < 0.65 * n and e[-1] - e[m] == pytest.approx(h, abs=0.025)
    r = series["mem/ratio"][1]
    assert r[-20:].mean() - r[:20].mean() == pytest.approx(h, abs=0.03)
    icr = series["icr/icr"][1]
    m = int(np.argmin(icr))
    assert m == 80 and icr[0] - icr[m] == pytest.approx(h, abs=1e-4) and icr[-1] - icr[m] == pytest.approx(h, abs=1e-4)
    assert np.all(np.diff(mem_trend(t, n)) < 0)


def test_bad_input_is_refused_first():
    with pytest.raises(ConfigError) as e:
        Family("x", "per_seed", num_seeds=2)
    assert e.value.field == "num_seeds"
    with pytest.raises(ConfigError) as e:
        Family("x", "per_seed", noise="pink")
    assert e.value.field == "noise"
    with pytest.raises(ValueError, match="unknown planted event 'bump'"):
        simulate_run(FAMILIES["ar1_m256"], 0, event="bump")
    with pytest.raises(ValueError, match="curves='e_only'"):
        simulate_run(FAMILIES["e_only_m256"], 0, event="memorization_onset", height=0.1)
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        calibrate_families(["nope"], 3)


# ----------------------------------------------------------------------------- the split
def test_split_is_fixed_disjoint_and_covers_every_structure():
    assert split("tune") == TUNE and split("held_out") == HELD_OUT
    assert not set(TUNE) & set(HELD_OUT)
    assert set(TUNE) | set(HELD_OUT) == set(FAMILIES) == set(split("all"))
    assert abs(len(TUNE) - len(HELD_OUT)) <= 4
    for side in (TUNE, HELD_OUT):
        assert {FAMILIES[f].structure for f in side} == {f.structure for f in FAMILIES.values()}
    assert set(POWER_FAMILIES) <= set(HELD_OUT)
    ms = {f.num_seeds for f in FAMILIES.values()}
    ts = {f.n_eval for f in FAMILIES.values()}
    assert min(ms) == 64 and max(ms) == 4096 and min(ts) == 20 and max(ts) == 2000  # short runs to the long-run families
    with pytest.raises(ConfigError):
        split("train")


# ----------------------------------------------------------------------------- harness
def test_wilson_interval_matches_scipy():
    from scipy.stats import binomtest

    for k, n in ((0, 300), (1, 300), (6, 300), (12, 40), (40, 40), (5, 7)):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    ci = binomtest(3, 50).proportion_ci(confidence_level=0.9, method="wilson")
    assert wilson_interval(3, 50, 0.9) == pytest.approx((ci.low, ci.high), abs=1e-12)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


@dataclasses.dataclass
class _Ev:
    name: str
    significance: float
    status: str = "confirmed"
    epoch: float = 0.0


@dataclasses.dataclass
class _Analysis:
    events: list


def _fake_detector(series, units=None):
    """Events decided by the run's first E_gen value (a deterministic function of the run)."""
    u = float(series["pfd/e_gen"][1][0]) * 1000 % 1
    evs = []
    if u < 0.3:
        evs.append(_Ev("double_descent", 3.0))
    if 0.2 < u < 0.5:
        evs.append(_Ev("icr_minimum", 2.0, status="undecided"))
    if u > 0.9:
        evs.append(_Ev("early_learning", 5.0))
    return _Analysis(evs)


def test_calibrate_families_counts_confirmed_and_undecided_events():
    fam = Family("tiny", "short", n_eval=12, num_seeds=4, seed_sd=0.02, curves="e_only")
    r = calibrate_families([fam], 60, _fake_detector, seed0=3)["tiny"]
    us = []
    from calibration import _run_seed

    for i in range(60):
        s, _ = simulate_run(fam, _run_seed(3, "tiny", i))
        us.append(float(s["pfd/e_gen"][1][0]) * 1000 % 1)
    us = np.array(us)
    k_any = int(np.sum((us < 0.3) | (us > 0.9)))
    assert r["runs"] == 60 and r["any_confirmed"] == k_any and r["rate"] == k_any / 60
    assert r["ci95"] == pytest.approx(list(wilson_interval(k_any, 60)))
    assert r["any_undecided"] == int(np.sum((us > 0.2) & (us < 0.5)))
    assert r["events"]["double_descent"]["confirmed"] == int(np.sum(us < 0.3))
    assert r["events"]["icr_minimum"]["confirmed"] == 0
    assert r["events"]["icr_minimum"]["undecided"] == r["any_undecided"]
    assert 0 < k_any < 60 and r["any_undecided"] > 0  # the check above was not vacuous
    p = calibrate_families([fam], 60, _fake_detector, seed0=3, event="double_descent", height=0.0)
    assert p["tiny"]["planted"]["double_descent"]["found"] == r["events"]["double_descent"]["confirmed"]


# ----------------------------------------------------------------------------- on disk
def _events(analysis_events):
    return [(e.name, e.epoch, getattr(e, "status", "confirmed")) for e in analysis_events]


def test_a_written_null_run_reads_back_as_in_memory(tmp_path):
    """A null run written in the on-disk format (metrics.csv + per_unit records) reads back as
    written (the values as float32, as the CSVLogger logs them) and is decided like in memory by
    the path ``report`` takes (load_history, find_store, load_units, analyze_history)."""
    from lightning_pfd.analysis.events import analyze_history
    from lightning_pfd.analysis.history import load_history
    from lightning_pfd.analysis.per_unit import find_store, load_units

    fam = dataclasses.replace(FAMILIES["ar1_grow2.5_m256"], n_eval=60, num_seeds=64, num_samples=60)
    series, units = simulate_run(fam, 5)
    written = write_run(tmp_path / "run", series, units)
    for key, (x, y) in written.items():
        np.testing.assert_array_equal(y, y.astype(np.float32))
        assert np.max(np.abs(y - series[key][1])) < 1e-6 * np.max(np.abs(series[key][1]))
    hist = load_history(tmp_path / "run")
    on_disk, problems = load_units(find_store(tmp_path / "run"))
    assert not problems and set(on_disk) == set(units)
    for key, u in units.items():
        np.testing.assert_array_equal(hist.series(key)[0], written[key][0])
        np.testing.assert_array_equal(hist.series(key)[1], written[key][1])
        for field in ("epochs", "values", "units", "logged"):
            np.testing.assert_array_equal(getattr(on_disk[key], field), getattr(u, field))
        assert on_disk[key].kind == u.kind
    expected = analyze_history(written, units=units)
    got = analyze_history(hist.series_dict(), units=on_disk)
    assert _events(got.events) == _events(expected.events)
    assert got.regime == expected.regime


def test_report_command_on_a_written_run_decides_as_in_memory(tmp_path):
    """``python -m lightning_pfd report RUN_DIR`` on a written run (a null family with planted
    events, so that there is something to decide) gives analyze_history's events in memory."""
    from lightning_pfd.analysis.events import analyze_history
    from lightning_pfd.commands.report import main

    fam = dataclasses.replace(FAMILIES["short_t30_flip"], n_eval=40, num_seeds=64, num_samples=60)
    series, units = simulate_run(fam, 12, event=("early_learning", "memorization_onset", "icr_minimum"),
                                 height=0.5)
    written = write_run(tmp_path / "run", series, units)
    expected = analyze_history(written, units=units)
    assert expected.events  # planted legs of 0.5: something to decide (which ones: the detectors' power)
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    got = json.loads((tmp_path / "rep" / "events.json").read_text())
    assert [(e["name"], e["epoch"], e.get("status", "confirmed")) for e in got["events"]] == _events(expected.events)
    np.testing.assert_allclose([e["significance"] for e in got["events"]],
                               [e.significance for e in expected.events], rtol=1e-12)
    assert got["regime"]["name"] == expected.regime.name


def test_seed_noise_families_have_the_measured_residual_sd():
    """Every per-seed model gives E a residual sd of ``seed_sd`` (0.049, the 500-epoch run's) at
    M = 256 late in the run, as the single-curve seed-flip null does; 8× the seeds: /sqrt(8)."""
    from calibration import NullSpec, simulate

    t = np.arange(500.0)
    old = np.mean([(simulate(NullSpec("seed_flip", num_seeds=256), s)[1] - gen_trend(t, 500))[300:].std()
                   for s in range(4)])
    assert old == pytest.approx(0.049, rel=0.25)
    for model in ("flip", "heavy", "hetero"):
        fam = Family("s", "per_seed", seed_noise=model, curves="e_only")
        sd = {}
        for m in (256, 2048):
            fam = dataclasses.replace(fam, num_seeds=m)
            sd[m] = np.mean([(simulate_run(fam, s)[0]["pfd/e_gen"][1] - gen_trend(t, 500))[400:].std()
                             for s in range(4)])
        assert sd[256] == pytest.approx(0.049, rel=0.35), (model, sd)
        assert sd[2048] == pytest.approx(sd[256] / math.sqrt(8), rel=0.35), (model, sd)
    # drift: the seeds' log d² are random walks, so E wanders slowly; its relative change from the
    # first to the last evaluation has sd seed_sd / E_end
    fam = Family("d", "per_seed", seed_noise="drift", curves="e_only", n_eval=100)
    t = np.arange(100.0)
    tr = gen_trend(t, 100)
    ch = [np.log(e[-1] / tr[-1]) - np.log(e[0] / tr[0])
          for e in (simulate_run(fam, s)[0]["pfd/e_gen"][1] for s in range(40))]
    assert np.std(ch) * tr[-1] == pytest.approx(0.049, rel=0.3)
