"""Scaling analysis of an (N, |θ|) sweep and `python -m lightning_pfd report SWEEP_DIR`.

Oracles: synthetic curves built on a known master curve and a known γ (PFD paper Fig. 2), the
analytic crossing of linear curves, brute-force loops for the collapse objective and for Def. 3,
ProbabilityFlowDistance (eq. 4) for E_gen, scipy's sqrtm for the Fréchet distance of sample
moments, torchmetrics' KID, and the zero mean of an unbiased MMD² between equal laws."""
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.interpolate import PchipInterpolator
from scipy.linalg import sqrtm

from lightning_pfd.commands.report import main as report_main
from lightning_pfd.analysis.bias_variance import bias_variance_cell, bias_variance_statements
from lightning_pfd.analysis.scaling import (
    MODEL_ERROR_WEIGHT,
    Cell,
    bootstrap_collapse,
    cell_means,
    cell_standard_errors,
    collapse_model,
    collapse_spread,
    chi2_log_tail,
    crossings,
    deformation_test,
    fit_collapse,
    group_cells,
    jackknife_se,
    master_curve,
    psi_fid,
    psi_kid,
    subtract_floors,
    transition_point,
)
from lightning_pfd.analysis.sweep_report import _verdict, pfd_from_endpoints, write_sweep_report
from lightning_pfd.errors import ConfigError
from lightning_pfd.metrics import ProbabilityFlowDistance
from lightning_pfd.metrics.baselines import frechet_distance, kernel_distance


def _master(x):
    """A sigmoid master curve for E_gen and E_mem (MtoG at x ≈ 0)."""
    return 0.5 + 1.5 / (1 + np.exp(x)), 2.0 - 0.8 / (1 + np.exp(x - 1))


def _synthetic_cells(gamma, seed=0, sizes=(14, 16, 18, 20), logn=range(4, 19), K=3, noise=0.01):
    """Curves that collapse exactly (no floors), small noise: the easy case."""
    rng = np.random.default_rng(seed)
    shift = 11 - gamma * 17  # keeps the transition inside the N range for every γ
    n, p, v = [], [], []
    for s in sizes:
        for ln in logn:
            g, m = _master(ln - gamma * s - shift)
            for _ in range(K):
                n.append(2 ** ln)
                p.append(2 ** s)
                v.append([g + noise * rng.standard_normal(), m + noise * rng.standard_normal()])
    return group_cells(n, p, np.array(v))


#: the recorded mtog_digits design: 4 widths, N = 2^5..2^12, K = 2; per-width floors of E_gen and
#: per-repeat noise of the recorded size (experiments/collapse_coverage.py holds the same model).
_LOG2_P = np.log2([29600, 67200, 191552, 636864])
_FLOORS = (2.7, 2.0, 1.6, 1.5)


def _recorded_like(gamma, rng, noise=0.067, hetero=0.7, K=2):
    """E_gen = floor_w + 2σ(−x'/0.8), x' = log₂N − γ(log₂|θ| − mean) − 7.5; heteroscedastic
    Gaussian repeat noise with rms ≈ ``noise`` (the recorded E_gen's 0.067)."""
    n, p, v = [], [], []
    for s, fl in zip(_LOG2_P, _FLOORS):
        for ln in range(5, 13):
            x = ln - gamma * (s - _LOG2_P.mean()) - 7.5
            sd = noise * math.exp(hetero * rng.standard_normal() - hetero ** 2)
            for _ in range(K):
                n.append(2 ** ln)
                p.append(int(round(2 ** s)))
                v.append(fl + 2.0 / (1 + math.exp(x / 0.8)) + sd * rng.standard_normal())
    return group_cells(n, p, np.array(v))


_FLOOR_FIT = dict(floor_points=1, shifts=True)


# ----------------------------------------------------------------------------- collapse
@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.7])
def test_gamma_recovered_with_floors_and_recorded_noise(gamma):
    """Width-dependent floors, K = 2, noise like the recorded sweep (one fit's sd is 0.03,
    experiments/results/collapse_coverage.json): the mean γ̂ of 8 noise realizations is within
    ±0.05 of γ (its sd ≈ 0.011), every single γ̂ within ±0.12 (4 sd); the floors fitted jointly
    with γ come back within 0.1 of the truth relative to each other."""
    rng = np.random.default_rng(int(100 * gamma))
    est = []
    for _ in range(8):
        fit = bootstrap_collapse(_recorded_like(gamma, rng), B=1, **_FLOOR_FIT)
        est.append(fit.gamma)
        fitted = np.array([fit.floors[s]["fitted"][0] for s in sorted(fit.floors)])
        truth = np.array(_FLOORS)  # the shifts fix the floors up to one common level
        assert np.max(np.abs((fitted - fitted.mean()) - (truth - truth.mean()))) < 0.1
    assert abs(np.mean(est) - gamma) < 0.05
    assert np.max(np.abs(np.array(est) - gamma)) < 0.12
    # at a tenth of the noise every single fit is within ±0.05
    for _ in range(3):
        assert abs(bootstrap_collapse(_recorded_like(gamma, rng, noise=0.0067), B=1, **_FLOOR_FIT).gamma
                   - gamma) < 0.05


def test_without_fitted_floors_the_floor_bias_shows():
    """The data-rich-end floor alone is biased when the widest curve still decays at the largest
    N; noise-free, the jointly fitted shifts remove that bias (γ̂ = γ to 0.005)."""
    rng = np.random.default_rng(0)
    cells = _recorded_like(0.7, rng, noise=1e-9, hetero=0.0)
    plain = bootstrap_collapse(cells, B=1, floor_points=1)
    joint = bootstrap_collapse(cells, B=1, **_FLOOR_FIT)
    assert abs(joint.gamma - 0.7) < 0.005 < abs(plain.gamma - 0.7)


def test_interval_has_width_and_covers_on_synthetic_sweeps():
    """Small version of the coverage study (200 sweeps per setting there:
    experiments/collapse_coverage.py): on 16 synthetic sweeps the nominal 90 % interval (bootstrap
    of the fitted collapse model + jackknife over widths) has positive width, its sd combines the
    two parts as documented, and it covers γ = 0.5 at least 7 of 10 times (a calibrated 90 %
    interval misses that with probability 1.3 %)."""
    rng = np.random.default_rng(11)
    fits = [bootstrap_collapse(_recorded_like(0.5, rng), B=15, seed=r, level=0.9, **_FLOOR_FIT)
            for r in range(10)]
    assert all(f.method == "model" and f.interval[1] - f.interval[0] > 0.02 for f in fits)
    assert sum(f.interval[0] <= 0.5 <= f.interval[1] for f in fits) >= 7
    for f in fits:
        assert f.gamma_se ** 2 == pytest.approx(f.se_repeats ** 2 + MODEL_ERROR_WEIGHT * f.se_widths ** 2)
        assert f.spread_intervals == {} and f.spread_null[0] < f.spread_null[1] and 0 < f.gof_p <= 1
        assert sorted(f.jackknife) == sorted(float(s) for s in _LOG2_P)


def test_objective_is_continuous_in_gamma():
    """S(γ) on a 0.001 grid has no jump larger than a small fraction of the noise unit (S is in
    standard errors: noise alone gives S ≈ 1), on a synthetic sweep and on the recorded one,
    where the hard overlap set (taper = 0) jumps by 0.21 between 0.450 and 0.451."""
    rng = np.random.default_rng(5)
    cells = _recorded_like(0.5, rng)
    ln, lp, means = cell_means(cells)
    se = cell_standard_errors(cells)
    s = fit_collapse(ln, lp, means, se=se, shifts=True, bounds=(0.0, 1.0), step=0.001).objective
    assert np.isfinite(s).all() and np.abs(np.diff(s)).max() < 0.05
    assert s[500] == pytest.approx(collapse_spread(ln, lp, means, 0.5, se=se, shifts=True).spread)
    rec = _recorded_cells()
    ln, lp, means = cell_means(rec)
    se = cell_standard_errors(rec)
    smooth = fit_collapse(ln, lp, means, se=se, bounds=(0.40, 0.50), step=0.001).objective
    hard = fit_collapse(ln, lp, means, se=se, taper=0.0, bounds=(0.40, 0.50), step=0.001).objective
    assert np.abs(np.diff(smooth)).max() < 0.02
    assert np.abs(np.diff(hard)).max() > 0.15


def _report_objective(cells, grid):
    """S(γ) of the quantity the report fits for E_gen: the cell means less each width's floor at
    its largest N, per-width shifts fitted with γ, each point with its own cell's variance."""
    ln, lp, means = cell_means(cells)
    se = cell_standard_errors(cells)
    y, _, _ = subtract_floors(ln, lp, means, se ** 2, floor_points=1)
    return fit_collapse(ln, lp, y, se=se, shifts=True, bounds=(grid[0], grid[-1]), step=grid[1] - grid[0]).objective


@pytest.mark.parametrize("which", ["recorded", "gamma0"])
def test_report_objective_is_continuous_over_the_whole_range(which):
    """On the fitted quantity (floors and shifts) over the whole search range [−0.5, 1.5] at step
    0.002: no jump and no kink anywhere — the second difference of S stays below 0.05 s.e. (0.014
    on the recorded E_gen; the old objective, whose floor points entered with variance 0, had a
    kink at γ = 0 there, slope −131 → +167 s.e. per unit γ, second difference 0.60) — and around
    γ = 0, where the N grids of all widths line up, the slope stays within 30 s.e. per unit γ."""
    cells = (_recorded_cells() if which == "recorded"
             else _recorded_like(0.0, np.random.default_rng(2)))
    if which == "recorded":
        cells = [Cell(c.n_train, c.n_params, c.samples[:, :1]) for c in cells]
    grid = np.round(np.arange(-0.5, 1.5 + 1e-9, 0.002), 6)
    s = _report_objective(cells, grid)
    assert np.isfinite(s).all() and np.abs(np.diff(s, 2)).max() < 0.05
    i0 = int(np.argmin(np.abs(grid)))
    assert abs(s[i0] - s[i0 - 1]) / 0.002 < 30 and abs(s[i0 + 1] - s[i0]) / 0.002 < 30


def test_floor_points_are_no_zero_variance_anchors():
    """With shifts the floor is a fitted level: every point keeps its own cell's variance (none is
    0); without shifts the single floor point (exactly 0 after subtraction) leaves the fit."""
    cells = _recorded_like(0.5, np.random.default_rng(4))
    ln, lp, means = cell_means(cells)
    se = cell_standard_errors(cells)
    _, v_anchor, _ = subtract_floors(ln, lp, means, se ** 2, floor_points=1)
    assert np.sum(v_anchor == 0) == 4  # the bookkeeping of subtract_floors: one anchor per width
    fit = bootstrap_collapse(cells, B=2, **_FLOOR_FIT)
    floors = np.array([fit.floors[s]["data_rich"][0] for s in lp])
    direct = fit_collapse(ln, lp, means[:, 0] - floors, se=se[:, 0], shifts=True)
    assert fit.gamma == pytest.approx(direct.gamma) and fit.score.spread == pytest.approx(direct.score.spread)
    plain = bootstrap_collapse(cells, B=2, floor_points=1)
    assert plain.score.n_points == len(cells) - 4


def test_gamma_zero_is_not_a_trap():
    """A true γ = 0 (all widths' N grids line up at γ = 0): γ̂ is never exactly 0 on 12 sweeps
    (the old objective gave exactly 0 in 71 % of them) and no interval has zero width."""
    rng = np.random.default_rng(9)
    fits = [bootstrap_collapse(_recorded_like(0.0, rng), B=8, seed=r, **_FLOOR_FIT) for r in range(12)]
    assert sum(f.gamma == 0.0 for f in fits) <= 1
    assert min(f.interval[1] - f.interval[0] for f in fits) > 0.02
    assert abs(np.mean([f.gamma for f in fits])) < 0.05


def test_master_curve_and_collapse_model_closed_form():
    """A cubic polynomial is a cubic spline: the weighted least-squares master curve reproduces it
    exactly; the collapse model of curves that collapse exactly (with offsets) is the data."""
    x = np.linspace(-3, 5, 40)
    y = 0.3 - 0.2 * x + 0.05 * x ** 2 - 0.01 * x ** 3
    F = master_curve(x, y, np.linspace(1, 2, 40))
    assert np.allclose(F(x)[:, 0], y, atol=1e-10)
    ln = np.tile(np.arange(4.0, 12.0), 3)
    lp = np.repeat([10.0, 12.0, 14.0], 8)
    xx = ln - 0.4 * lp
    offs = np.array([0.5, 0.0, -0.5])
    vals = np.tanh(xx + 1.5) + offs[np.searchsorted([10.0, 12.0, 14.0], lp)]
    fit = fit_collapse(ln, lp, vals, se=np.full(24, 0.01), shifts=True)
    assert fit.gamma == pytest.approx(0.4, abs=0.02)  # PCHIP on a 1-octave grid: noise-free bias 0.012
    model = collapse_model(ln, lp, vals, fit.gamma, se=np.full(24, 0.01), shifts=fit.score.shifts)
    assert np.max(np.abs(model[:, 0] - vals)) < 0.02


def test_jackknife_se_closed_form():
    """√((C−1)/C Σ (g_j − ḡ)²) by hand; None below two estimates (a failed refit is skipped)."""
    g = [0.4, 0.5, 0.7, None]
    m = np.mean([0.4, 0.5, 0.7])
    assert jackknife_se(g) == pytest.approx(math.sqrt(2 / 3 * sum((v - m) ** 2 for v in (0.4, 0.5, 0.7))))
    assert jackknife_se([0.3, None]) is None


def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "collapse_coverage", Path(__file__).parents[1] / "experiments" / "collapse_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_goodness_of_fit_says_no_on_crossing_curves_and_yes_on_a_collapse():
    """Small version of the size/power study (experiments/collapse_coverage.py, 200 sweeps per
    setting): the randomized generator (t(5) noise growing where the curve is steep, K = 2, missing
    cells, one single-repeat cell), 6 sweeps of each: curves that cross (per-width steepness ±30 %)
    are rejected at least 4 times, true collapses at most 2 times (at the measured power ≈ 0.9 and
    size ≈ 0.05 these fail with probability < 2 % each); the report's verdict follows the p-value,
    which is that of the deformation statistic T against its bootstrap values."""
    gen = _generator()
    rng = np.random.default_rng(21)
    null = [bootstrap_collapse(group_cells(*gen.synthetic_sweep(rng, None, 0.5, drift=0.0)), B=30, seed=r,
                               model_error=False, **_FLOOR_FIT) for r in range(6)]
    alt = [bootstrap_collapse(group_cells(*gen.synthetic_sweep(rng, None, 0.5, drift=0.0, alternative="crossing")),
                              B=30, seed=r, model_error=False, **_FLOOR_FIT) for r in range(6)]
    assert sum(f.rejected for f in alt) >= 4
    assert sum(f.rejected for f in null) <= 2
    for f in null + alt:
        assert f.gof_statistic == "deformation" and f.bootstrap_deformations.size == f.bootstrap.size
        t = f.deformation.statistic
        assert f.gof_p == pytest.approx((1 + np.sum(f.bootstrap_deformations >= t)) / (1 + f.bootstrap.size))
        assert _verdict(f).startswith("collapse rejected" if f.rejected else "consistent with a collapse")
        assert ("collapses at γ̂" in _verdict(f)) == (not f.rejected)
        assert ("largest departure" in _verdict(f)) == f.rejected


def _deformation_design():
    """4 widths × N = 2⁵…2¹², levels per width, a logistic master curve at γ = ½, se = 0.02."""
    ln = np.tile(np.arange(5.0, 13.0), 4)
    lp = np.repeat([14.0, 15.5, 17.0, 18.5], 8)
    level = np.repeat([0.3, 0.1, -0.2, 0.05], 8)
    return ln, lp, ln - 0.5 * lp, level, lambda x: 2 / (1 + np.exp((x + 0.5) / 0.8)), np.full(32, 0.02)


def test_deformation_lr_is_chi_square_under_a_collapse():
    """Oracle: under an exact collapse with Gaussian noise of known s.e., each deformation's
    likelihood ratio is χ²(df) (df = 2 for location: the change of γ is part of the null; 3 for
    stretch and amplitude: one column per width but the first) — mean within 4 s.e. of df and a
    Kolmogorov–Smirnov test against scipy's χ² over 200 sweeps."""
    from scipy.stats import chi2, kstest

    ln, lp, x, level, F, se = _deformation_design()
    rng = np.random.default_rng(0)
    tests = [deformation_test(ln, lp, F(x) + level + se * rng.standard_normal(32), 0.5, se=se) for _ in range(200)]
    assert tests[0].df == {"location": 2, "stretch": 3, "amplitude": 3}
    for c, df in tests[0].df.items():
        lr = np.array([t.lr[c] for t in tests])
        assert abs(lr.mean() - df) < 4 * math.sqrt(2 * df / lr.size)
        assert kstest(lr, chi2(df).cdf).pvalue > 1e-3
    t = tests[0]
    assert t.statistic == pytest.approx(-min(chi2.logsf(t.lr[c], t.df[c]) for c in t.lr))


def test_deformation_test_names_the_departure_and_ignores_levels():
    """One width (|θ| = 2¹⁷) moved 0.4 octave, 30 % flatter or 15 % taller: the deformation with
    the largest evidence is location, stretch or amplitude respectively, each beyond χ² tail
    e^-20; per-width constants (the floors) change no LR (they are part of the null model)."""
    ln, lp, x, level, F, se = _deformation_design()
    noise = se * np.random.default_rng(1).standard_normal(32)
    w = lp == 17.0
    for name, y in (("location", F(x - 0.4 * w)), ("stretch", F((x + 0.5) / (1 + 0.3 * w) - 0.5)),
                    ("amplitude", F(x) * (1 + 0.15 * w))):
        t = deformation_test(ln, lp, y + level + noise, 0.5, se=se)
        assert t.largest == name and t.statistic > 20
    a = deformation_test(ln, lp, F(x) + noise, 0.5, se=se)
    b = deformation_test(ln, lp, F(x) + noise + 3 * level, 0.5, se=se)
    assert a.statistic < 5 and all(a.lr[c] == pytest.approx(b.lr[c], abs=1e-8) for c in a.lr)


def test_deformation_test_scales_sums_and_never_overflows():
    """LR is in se² units (all se × 2 → every LR / 4); two quantities fitted together give the sum
    of their LRs and dfs; reversing the order of the widths leaves location and amplitude unchanged
    (their common column is in the null model); a departure whose LR is beyond scipy's χ² tail
    (logsf = −inf above ≈ 1450) still gives a finite T (asymptotic tail, equal to scipy's where both
    are finite) and the bootstrap rejects it."""
    from scipy.stats import chi2

    ln, lp, x, level, F, se = _deformation_design()
    rng = np.random.default_rng(2)
    y1 = F(x) + level + se * rng.standard_normal(32)
    y2 = 0.5 * F(x) * (1 + 0.05 * (lp == 15.5)) + se * rng.standard_normal(32)
    a, b = deformation_test(ln, lp, y1, 0.5, se=se), deformation_test(ln, lp, y1, 0.5, se=2 * se)
    assert all(b.lr[c] == pytest.approx(a.lr[c] / 4) for c in a.lr)
    c2 = deformation_test(ln, lp, y2, 0.5, se=se)
    joint = deformation_test(ln, lp, np.stack([y1, y2], 1), 0.5, se=np.stack([se, se], 1))
    assert all(joint.lr[c] == pytest.approx(a.lr[c] + c2.lr[c]) and joint.df[c] == a.df[c] + c2.df[c] for c in a.lr)
    flip = -lp + 40.0                       # the widest width comes first; x = ln − ½ lp shifts by a constant
    r = deformation_test(ln, flip, y1, -0.5, se=se)
    assert r.lr["location"] == pytest.approx(a.lr["location"], rel=1e-6)
    assert r.lr["amplitude"] == pytest.approx(a.lr["amplitude"], rel=1e-6)
    assert chi2_log_tail(50.0, 3) == chi2.logsf(50.0, 3)
    assert chi2.logsf(2000.0, 2) == -np.inf and chi2_log_tail(2000.0, 2) == pytest.approx(-1000.0)  # P = e^(−x/2)
    # df = 3 beyond the underflow: the tail falls by e^(−Δx/2) (x/x₀)^(1/2) from the last finite one
    assert chi2.logsf(1500.0, 3) == -np.inf and chi2_log_tail(1500.0, 3) == pytest.approx(
        chi2.logsf(1400.0, 3) - 50.0 + 0.5 * math.log(1500 / 1400), abs=0.01)
    huge = deformation_test(ln, lp, F(x) * (1 + 1.0 * (lp == 17.0)) + level, 0.5, se=se / 10)
    assert math.isfinite(huge.statistic) and huge.lr["amplitude"] > 2000


def test_collapse_without_levels_tests_the_levels():
    """Fitted without per-width shifts a collapse has no levels: a constant offset of one width is
    then a departure (the ``level`` deformation finds it); with shifts it is part of the model."""
    ln, lp, x, level, F, se = _deformation_design()
    y = F(x) + 0.3 * (lp == 15.5) + se * np.random.default_rng(3).standard_normal(32)
    without = deformation_test(ln, lp, y, 0.5, se=se, levels=False)
    assert without.largest == "level" and without.df["level"] == 3 and without.statistic > 50
    assert "level" not in deformation_test(ln, lp, y, 0.5, se=se).lr


def test_deformation_test_refuses_bad_input():
    ln, lp, x, level, F, se = _deformation_design()
    with pytest.raises(ConfigError, match="se"):
        deformation_test(ln, lp, F(x), 0.5, se=None)
    assert deformation_test(ln[:3], lp[:3], F(x)[:3], 0.5, se=se[:3]) is None   # 3 distinct x: no spline
    keep = np.isin(ln, [5.0, 6.0])                                                # two widths, 2 x each
    assert deformation_test(ln[keep & (lp < 16)], lp[keep & (lp < 16)], F(x)[keep & (lp < 16)], 0.0,
                            se=se[keep & (lp < 16)]) is None                     # 4 points, x on a grid: 2 distinct
    zero = se.copy()
    zero[4] = 0.0
    assert deformation_test(ln, lp, F(x), 0.5, se=zero) is None                # a weight of 1/0: no test
    cells = group_cells([32, 32, 64, 64], [100, 100, 200, 200], [1.0, 1.1, 0.5, 0.6])
    with pytest.raises(ConfigError, match="gof_statistic"):
        bootstrap_collapse(cells, B=5, gof_statistic="chi2")


def _recorded_cells():
    rows = list(csv.DictReader(open(Path(__file__).parents[1] / "experiments" / "results"
                                    / "mtog_digits_sweep_results.csv")))
    return group_cells([int(r["n_train"]) for r in rows], [int(r["n_params"]) for r in rows],
                       [[float(r["e_gen_final"]), float(r["e_mem_final"])] for r in rows])


def test_collapse_recovers_known_gamma_without_floors():
    """The easy case (curves that collapse exactly, K = 3, small noise): γ̂ within 0.01; S(γ̂) is
    of the order of the noise (≈ 1 s.e.) while N alone (γ = 0) deviates by tens of s.e."""
    for gamma in (0.5, 0.3):
        fit = bootstrap_collapse(_synthetic_cells(gamma), B=20, seed=1)
        assert abs(fit.gamma - gamma) < 0.01
        assert fit.interval[0] < fit.interval[1]
        assert fit.score.spread < 2.0 and fit.references[0.0].spread > 10
        assert fit.within_noise and not fit.rejected


def test_collapse_gamma_zero_when_curves_coincide():
    fit = bootstrap_collapse(_synthetic_cells(0.0), B=30, seed=2)
    assert abs(fit.gamma) < 0.01
    assert fit.interval[0] <= 0.0 <= fit.interval[1]
    assert fit.references[0.5].spread > 10 * fit.score.spread


def _brute_spread(ln, lp, y, se, gamma, taper, min_overlap):
    """The documented objective with explicit loops over points and curves, scipy's PCHIP and
    numpy's linear interpolation."""
    x = ln - gamma * lp
    num, den, P = 0.0, 0.0, len(x)

    def ramp(t):
        t = min(max(t / taper, 0.0), 1.0)
        return t * t * (3 - 2 * t)

    for i in range(P):
        fs, ws, vs, ds = [], [], [], []
        for s in np.unique(lp):
            if s == lp[i]:
                continue
            sel = lp == s
            o = np.argsort(x[sel])
            xs, ys, vv = x[sel][o], y[sel][o], se[sel][o] ** 2
            w = ramp(x[i] - xs[0]) * ramp(xs[-1] - x[i])
            if w == 0:
                continue
            u = min(max(x[i], xs[0]), xs[-1])
            f = float(PchipInterpolator(xs, ys)(u))
            fs.append(f)
            ws.append(w)
            vs.append(np.interp(u, xs, vv))
            ds.append(f - np.interp(u, xs, ys))
        if not ws:
            continue
        W = sum(ws)
        M = sum(w * f for w, f in zip(ws, fs)) / W
        var = se[i] ** 2 + sum(w * w * v for w, v in zip(ws, vs)) / W ** 2 \
            + sum(w * d * d for w, d in zip(ws, ds)) / W
        om = min(1.0, W)
        num += om * (y[i] - M) ** 2 / var
        den += om
    if den < max(3, min_overlap * P):
        return math.inf
    return math.sqrt(num / den)


@pytest.mark.parametrize("gamma", [-0.3, 0.0, 0.37, 0.5, 1.1])
def test_collapse_spread_matches_brute_force(gamma):
    rng = np.random.default_rng(3)
    ln = np.concatenate([np.arange(3, 10), np.arange(4, 12), np.arange(2, 8)]).astype(float)
    lp = np.concatenate([np.full(7, 10.0), np.full(8, 12.0), np.full(6, 15.0)])
    y = rng.standard_normal(ln.size)
    se = rng.uniform(0.1, 0.5, ln.size)
    got = collapse_spread(ln, lp, y, gamma, se=se, taper=0.7)
    want = _brute_spread(ln, lp, y, se, gamma, 0.7, 0.25)
    assert got.spread == pytest.approx(want, rel=1e-10) if math.isfinite(want) else got.spread == math.inf


def test_shifts_are_the_weighted_least_squares_solution():
    """The per-width shifts at one γ minimise the objective: perturbing them (keeping Σ a = 0)
    never lowers S, checked with the brute-force objective on shifted data."""
    rng = np.random.default_rng(4)
    ln = np.tile(np.arange(3.0, 11.0), 3)
    lp = np.repeat([10.0, 12.0, 14.0], 8)
    y = 1 / (1 + np.exp(ln - 0.5 * lp)) + np.repeat([0.3, 0.0, -0.2], 8) + 0.02 * rng.standard_normal(24)
    se = np.full(24, 0.02)
    sc = collapse_spread(ln, lp, y, 0.5, se=se, shifts=True)
    a = np.array([s[0] for s in sc.shifts])
    assert a.sum() == pytest.approx(0.0, abs=1e-12)
    assert a == pytest.approx([0.3 - 0.1 / 3, -0.1 / 3, -0.2 - 0.1 / 3], abs=0.03)
    base = _brute_spread(ln, lp, y - np.repeat(a, 8), se, 0.5, 0.5, 0.25)
    assert sc.spread == pytest.approx(base, rel=1e-8)
    for d in ([0.01, -0.01, 0.0], [0.0, 0.02, -0.02], [-0.03, 0.0, 0.03]):
        assert _brute_spread(ln, lp, y - np.repeat(a + d, 8), se, 0.5, 0.5, 0.25) > base


def test_cell_standard_errors_and_floors_closed_form():
    cells = group_cells([8, 8, 16, 16, 32, 32, 32], [4] * 7, [1.0, 3.0, 2.0, 2.5, 0.0, 1.0, 5.0])
    s2 = np.array([2.0, 0.125, np.var([0.0, 1.0, 5.0], ddof=1)])
    dof = np.array([1, 1, 2])
    s0 = (dof * s2).sum() / dof.sum()
    want = np.sqrt((dof * s2 + 4 * s0) / (dof + 4) / (dof + 1))
    assert cell_standard_errors(cells)[:, 0] == pytest.approx(want, rel=1e-12)
    assert cell_standard_errors(cells, prior_dof=0)[:, 0] == pytest.approx(np.sqrt(s2 / (dof + 1)), rel=1e-12)
    assert cell_standard_errors(group_cells([8, 16], [4, 4], [1.0, 2.0])) is None
    ln, lp, m = cell_means(cells)
    v = cell_standard_errors(cells) ** 2
    y, var, floors = subtract_floors(ln, lp, m, v, floor_points=2)
    f = (m[1, 0] + m[2, 0]) / 2
    assert y[:, 0] == pytest.approx(m[:, 0] - f)
    vf = (v[1, 0] + v[2, 0]) / 4
    assert var[:, 0] == pytest.approx([v[0, 0] + vf, v[1, 0] + vf - v[1, 0], v[2, 0] + vf - v[2, 0]])
    assert floors[2.0][0][0] == pytest.approx(f)


def test_collapse_needs_overlap_and_two_sizes():
    ln = np.tile(np.arange(4.0, 9.0), 2)
    lp = np.repeat([10.0, 30.0], 5)
    y = np.concatenate([np.linspace(1, 0, 5)] * 2)
    assert collapse_spread(ln, lp, y, 1.0).spread == math.inf  # shift of 20 octaves: no overlap
    single = fit_collapse(ln[:5], lp[:5], y[:5])
    assert single.gamma is None and "two model sizes" in single.reason


def test_bootstrap_is_seeded_and_falls_back_to_curves():
    cells = _synthetic_cells(0.5, K=2)
    a, b = (bootstrap_collapse(cells, B=15, seed=7) for _ in range(2))
    assert np.array_equal(a.bootstrap, b.bootstrap)
    seeds = bootstrap_collapse(cells, B=15, seed=7, method="seeds")
    assert seeds.method == "seeds" and seeds.interval[0] < seeds.interval[1]
    one = _synthetic_cells(0.5, K=1)
    fit = bootstrap_collapse(one, B=15, seed=0)
    assert fit.method == "curves" and fit.bootstrap.size == 15
    assert abs(fit.gamma - 0.5) < 0.02
    assert fit.within_noise is None  # K = 1: no standard errors, no noise verdict
    with pytest.raises(ConfigError, match="normal"):
        bootstrap_collapse(one, B=5, method="normal")


@pytest.mark.parametrize("kwargs", [dict(B=0), dict(level=1.0), dict(method="jackknife"),
                                    dict(bounds=(1.0, 0.0)), dict(step=0.0), dict(min_overlap=2),
                                    dict(taper=-1.0), dict(floor_points=0), dict(prior_dof=-1),
                                    dict(gof_alpha=1.5), dict(model_error_weight=-1.0), dict(method="bogus")])
def test_bad_fit_options_raise_config_error(kwargs):
    """Refused before any fit, naming the argument itself (the library knows no CLI flags)."""
    with pytest.raises(ConfigError) as e:
        bootstrap_collapse(_synthetic_cells(0.5, sizes=(14, 16), logn=range(4, 8), K=1), **kwargs)
    (name, value), = kwargs.items()
    assert e.value.field == name and e.value.value == value


def test_bad_standard_errors_raise_config_error():
    with pytest.raises(ConfigError, match="se"):
        collapse_spread([1, 2, 3], [4, 4, 5], [1.0, 2.0, 3.0], 0.5, se=[0.1, -0.1, 0.1])


def test_group_cells_drops_nonfinite_repeats():
    cells = group_cells([16, 16, 32], [100, 100, 100], [[1.0, 2.0], [np.nan, 2.0], [3.0, 4.0]])
    assert [(c.n_train, c.samples.shape[0]) for c in cells] == [(16, 1), (32, 1)]
    with pytest.raises(ConfigError):
        group_cells([0], [100], [1.0])


# ----------------------------------------------------------------------------- transition
def test_transition_point_is_the_analytic_crossing():
    c = 1.3  # with u = log2 N − ½ log2|θ| − c, 3 − 0.5 u = 1 + 0.25 u at u = 8/3
    for s in (12.0, 16.0, 20.0):
        ln = np.arange(4.0, 19.0)
        u = ln - 0.5 * s - c
        x_star = transition_point(ln, 3 - 0.5 * u, 1 + 0.25 * u)
        assert x_star == pytest.approx(8 / 3 + 0.5 * s + c, abs=1e-12)
    # smooth curves on a fine grid: within the linear-interpolation error of the grid
    ln = np.linspace(2, 12, 401)
    g, m = np.exp(-(ln - 2) / 3), 0.2 + 0.05 * ln  # cross where exp(-(x-2)/3) = 0.2 + 0.05 x
    from scipy.optimize import brentq
    exact = brentq(lambda x: np.exp(-(x - 2) / 3) - 0.2 - 0.05 * x, 2, 12)
    assert transition_point(ln[::-1], g[::-1], m[::-1]) == pytest.approx(exact, abs=1e-4)


def test_transition_none_without_downward_crossing():
    ln = np.arange(5.0)
    assert transition_point(ln, ln + 1, ln) is None           # E_gen > E_mem throughout
    assert transition_point(ln, ln - 2, 2 * np.ones(5) - 2) is None  # only an upward crossing
    assert crossings(ln, ln - 2) == [(2.0, "up")]


# ----------------------------------------------------------------------------- bias-variance
def test_bias_variance_matches_brute_force_and_pfd():
    rng = np.random.default_rng(4)
    K, M, d = 3, 20, 4
    teacher = rng.standard_normal((M, d))
    students = teacher + 0.3 + rng.standard_normal((K, M, d))
    out = bias_variance_cell(teacher, students)
    bias2 = var = 0.0
    gen2 = np.zeros(K)
    for i in range(M):
        m = sum(students[k, i] for k in range(K)) / K
        bias2 += sum((teacher[i, j] - m[j]) ** 2 for j in range(d)) / M
        for k in range(K):
            var += sum((students[k, i, j] - m[j]) ** 2 for j in range(d)) / (M * K)
            gen2[k] += sum((students[k, i, j] - teacher[i, j]) ** 2 for j in range(d)) / M
    assert out["e_bias_sq"] == pytest.approx(bias2, rel=1e-12)
    assert out["e_var"] == pytest.approx(var, rel=1e-12)
    assert out["e_gen"] == pytest.approx(np.sqrt(gen2).tolist(), rel=1e-12)
    assert out["identity_rel_error"] < 1e-12
    assert out["e_gen_sq_mean"] == pytest.approx(out["e_bias_sq"] + out["e_var"], rel=1e-12)
    for k in range(K):  # E_gen,k is the monitor's PFD (eq. 4) on the same endpoints
        metric = ProbabilityFlowDistance()
        metric.update(torch.from_numpy(students[k]), torch.from_numpy(teacher))
        assert out["e_gen"][k] == pytest.approx(float(metric.compute()), rel=1e-12)
        assert pfd_from_endpoints(students[k], teacher) == pytest.approx(float(metric.compute()), rel=1e-12)


def test_the_unbiased_variant_and_the_standard_errors_match_monte_carlo():
    """Def. 3 over K students with a training-set effect δ_k (one per student, shared by every
    seed): the plug-in E_var has mean (K−1)/K·Var and the plug-in E_bias² Bias² + Var/K; the
    unbiased variant has mean Var and Bias² (within 4 Monte Carlo standard errors); the
    jackknife over students has the size of the estimates' spread over student draws, and the
    seed standard error that of their spread over evaluation-seed draws (students fixed)."""
    rng = np.random.default_rng(0)
    K, M, d = 5, 16, 3
    mu, tau, eps = np.array([0.5, -0.2, 0.1]), 0.7, 0.05
    var, bias2 = d * (tau ** 2 + eps ** 2), float(np.sum(mu ** 2))
    teacher = rng.standard_normal((M, d))
    cells = [bias_variance_cell(teacher, teacher + mu + tau * rng.standard_normal((K, 1, d))
                                + eps * rng.standard_normal((K, M, d))) for _ in range(600)]

    def mean_close(key, want):
        v = np.array([c[key] for c in cells])
        assert abs(v.mean() - want) < 4 * v.std(ddof=1) / math.sqrt(v.size), (key, v.mean(), want)
        return v

    mean_close("e_var", (K - 1) / K * var)
    mean_close("e_bias_sq", bias2 + var / K)
    unbiased_var = mean_close("e_var_unbiased", var)
    unbiased_bias = mean_close("e_bias_sq_unbiased", bias2)
    for key, v in (("e_var", unbiased_var), ("e_bias_sq", unbiased_bias)):
        ratio = np.mean([c["se_students"][key] for c in cells]) / v.std(ddof=1)
        assert 0.8 < ratio < 1.35, (key, ratio)
    delta = tau * rng.standard_normal((K, 1, d))  # students fixed, the evaluation seeds redrawn
    seeds = []
    for _ in range(400):
        x = rng.standard_normal((M, d))
        seeds.append(bias_variance_cell(x, x + mu + delta + 0.3 * rng.standard_normal((K, M, d))))
    for key in ("e_bias_sq", "e_var"):
        ratio = np.mean([c["se_seeds"][key] for c in seeds]) / np.std([c[key] for c in seeds], ddof=1)
        assert 0.85 < ratio < 1.15, (key, ratio)
    two = bias_variance_cell(teacher, teacher + rng.standard_normal((2, M, d)))
    assert two["se_students"] is None and two["se_seeds"]["e_var"] > 0  # K = 2: no jackknife


def _bv_cells(bias2: dict, var: dict, K: int = 8, M: int = 64, d: int = 4) -> list:
    """Cells of a synthetic sweep whose students have the planted Bias² (a shared offset) and
    Var (per-student offsets of exactly that sample variance) per (|θ|, N)."""
    rng = np.random.default_rng(0)
    signs = np.where(np.arange(K) % 2 == 0, 1.0, -1.0)
    out = []
    for (w, n), b2 in bias2.items():
        t = rng.standard_normal((M, d))
        e = np.zeros((K, d))
        e[:, 0], e[:, 1] = signs, np.roll(signs, 1) * (np.arange(K) % 4 < 2)
        e -= e.mean(0)
        e *= math.sqrt(var[(w, n)] / np.square(e).sum(1).mean())
        s = t + math.sqrt(b2) * np.ones(d) / math.sqrt(d) + e[:, None, :] + 0.01 * rng.standard_normal((K, M, d))
        out.append(dict(bias_variance_cell(t, s), n_params=w, n_train=n))
    return out


def test_the_four_bias_variance_statements_are_marked_from_planted_trends():
    """§4.3's statements on a planted sweep: at N = 4096 bias falls and variance grows with |θ|
    (U-shaped E_gen), both fall with N, variance grows with |θ| at every N, bias grows with |θ|
    at N = 64 (N ≥ 2^15 is not in the grid): holds / holds in part. Variance that falls with
    |θ| at N = 4096 fails its statement; K = 2 (no error over training sets) decides nothing."""
    b2 = {(1, 4096): .8, (2, 4096): .3, (3, 4096): .1, (1, 64): 1.6, (2, 64): 2.2, (3, 64): 3.0}
    var = {(1, 4096): .1, (2, 4096): .3, (3, 4096): .8, (1, 64): .5, (2, 64): 1.0, (3, 64): 1.5}
    got = {r["key"]: r["verdict"] for r in bias_variance_statements(_bv_cells(b2, var))}
    assert got == {"u_shape": "holds", "n_reduces": "holds", "var_grows": "holds", "bias_depends": "holds in part"}
    falls = {**var, (1, 4096): .8, (3, 4096): .1}
    rows = {r["key"]: r for r in bias_variance_statements(_bv_cells(b2, falls))}
    assert rows["var_grows"]["verdict"] == "fails" and "N 4096 -0.7" in rows["var_grows"]["numbers"]
    two = {r["key"]: r["verdict"] for r in bias_variance_statements(_bv_cells(b2, var, K=2))}
    assert two == {"u_shape": "undecided", "n_reduces": "undecided", "var_grows": "undecided",
                   "bias_depends": "undecided"}


def test_bias_variance_needs_two_students():
    with pytest.raises(ConfigError):
        bias_variance_cell(np.zeros((5, 2)), np.zeros((1, 5, 2)))
    with pytest.raises(ConfigError):
        bias_variance_cell(np.zeros((5, 2)), np.zeros((2, 4, 2)))


# ----------------------------------------------------------------------------- FID / KID
def test_fid_equals_frechet_distance_of_sample_moments():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((400, 3)) @ np.array([[1.0, 0.3, 0], [0, 0.7, 0.2], [0, 0, 1.5]])
    b = rng.standard_normal((300, 3)) * [0.5, 1.2, 1.0] + [0.4, -0.2, 0.1]
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    want = np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(ca + cb - 2 * sqrtm(ca @ cb).real)
    assert psi_fid(a, b) == pytest.approx(want, rel=1e-9)
    assert psi_fid(a, b) == pytest.approx(float(frechet_distance(torch.from_numpy(a), torch.from_numpy(b))), rel=1e-6)
    assert psi_fid(a, a) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.filterwarnings("ignore:Metric `Kernel Inception Distance` will save")
def test_kid_matches_torchmetrics_and_brute_force():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((60, 3)), rng.standard_normal((60, 3)) + 0.2
    tm, _ = kernel_distance(torch.from_numpy(a), torch.from_numpy(b), subsets=2, subset_size=60)
    assert psi_kid(a, b) == pytest.approx(float(tm), rel=1e-9)
    k = lambda x, y: (x @ y / 3 + 1) ** 3  # noqa: E731
    m = 60
    off = [(i, j) for i in range(m) for j in range(m) if i != j]
    want = sum(k(a[i], a[j]) + k(b[i], b[j]) - k(a[i], b[j]) - k(a[j], b[i]) for i, j in off) / len(off)
    assert psi_kid(a, b, paired=True, chunk=7) == pytest.approx(want, rel=1e-9)


def test_kid_unbiased_zero_for_equal_laws_and_positive_for_shift():
    rng = np.random.default_rng(8)
    same, paired_dep, unpaired_dep, shifted = [], [], [], []
    for _ in range(100):
        a = rng.standard_normal((40, 4))
        same.append(psi_kid(a, rng.standard_normal((40, 4))))
        b = 0.9 * a + math.sqrt(1 - 0.81) * rng.standard_normal((40, 4))  # same law, paired rows
        paired_dep.append(psi_kid(a, b, paired=True))
        unpaired_dep.append(psi_kid(a, b))
        shifted.append(psi_kid(a, rng.standard_normal((40, 4)) + 0.5, paired=True))
    se = lambda v: np.std(v) / math.sqrt(len(v))  # noqa: E731
    assert abs(np.mean(same)) < 4 * se(same)
    assert abs(np.mean(paired_dep)) < 4 * se(paired_dep)
    assert np.mean(unpaired_dep) < -10 * se(unpaired_dep)  # why the report uses the paired form
    assert np.mean(shifted) > 10 * se(shifted)


def test_kid_fid_bad_input():
    with pytest.raises(ConfigError):
        psi_kid(np.zeros((5, 2)), np.zeros((4, 2)), paired=True)
    with pytest.raises(ConfigError):
        psi_fid(np.zeros((5, 2)), np.zeros((5, 3)))
    with pytest.raises(ConfigError):
        psi_kid(np.full((5, 2), np.nan), np.zeros((5, 2)))


# ----------------------------------------------------------------------------- report
def _write_sweep(root, sizes=(2 ** 10, 2 ** 12, 2 ** 14), logn=range(3, 9), seeds=(0, 1), M=24, d=3,
                 status_ok=True, extra_rows=True, with_teacher=True):
    """A fake sweep dir in the format of the `sweep` command: student endpoints move from the
    empirical endpoints to the teacher's along log2(N/√|θ|), so γ = ½ by construction."""
    rng = np.random.default_rng(0)
    teacher, emp = rng.standard_normal((M, d)), rng.standard_normal((M, d)) + 1.0
    rows = []
    for p in sizes:
        for ln in logn:
            for s in seeds:
                a = 1 / (1 + np.exp(-(ln - 0.5 * math.log2(p))))
                st = a * teacher + (1 - a) * emp + 0.05 * rng.standard_normal((M, d))
                tid = f"t{len(rows):03d}"
                (root / tid).mkdir(parents=True)
                ends = {"seeds": torch.arange(100, 100 + M), "student": torch.from_numpy(st),
                        "teacher": torch.from_numpy(teacher), "empirical": torch.from_numpy(emp)}
                if not with_teacher:  # the sweep command omits it when the data has no teacher
                    del ends["teacher"]
                torch.save(ends, root / tid / "endpoints.pt")
                rows.append(dict(trial_id=tid, status="ok" if status_ok else "failed",
                                 error=None if status_ok else "boom", overrides={}, n_train=2 ** ln,
                                 n_params=p, model_label=f"m{p}", seed=s, epochs=3,
                                 e_gen_final=pfd_from_endpoints(st, teacher), e_gen_best=0.0,
                                 e_gen_best_epoch=0, e_mem_final=pfd_from_endpoints(st, emp),
                                 e_mem_best=0.0, e_mem_best_epoch=0, loss_train=1.0 / ln,
                                 loss_test=1.2 / ln, gap=0.2 / ln, memorization_ratio=1 - a,
                                 icr_min=0.5, icr_min_epoch=1, regime="x", events=[],
                                 wall_time_s=1.0, run_dir=tid, endpoints=f"{tid}/endpoints.pt"))
    if extra_rows:
        rows.append(dict(trial_id="broken-7", status="failed", error="RuntimeError: out of memory",
                         overrides={}, n_train=8, n_params=sizes[0], model_label="m", seed=0,
                         e_gen_final=987654.0, e_mem_final=987654.0, run_dir="x", endpoints=None))
        rows.append(dict(trial_id="nan-1", status="diverged", error="loss is nan", overrides={},
                         n_train=16, n_params=sizes[0], model_label="m", seed=1,
                         e_gen_final=None, e_mem_final=None, run_dir="y", endpoints=None))
    (root / "sweep_results.json").write_text(json.dumps(rows))
    (root / "sweep.json").write_text(json.dumps({"name": "tiny-sweep"}))
    return root


def test_sweep_report_files_content_and_never_overwrites(tmp_path, capsys):
    sweep = _write_sweep(tmp_path / "sw")
    assert report_main([str(sweep), "--bootstrap", "30"]) == 0  # the `report` entry point routes it
    out = sweep / "report"
    names = {"report.md", "analysis.json", "egen_emem_vs_logN.png", "egen_emem_collapsed.png",
             "practical_metrics.png", "bias_variance.png"}
    assert names <= {p.name for p in out.iterdir()}
    for png in names - {"report.md", "analysis.json"}:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    analysis = json.loads((out / "analysis.json").read_text())
    md = (out / "report.md").read_text()
    col = analysis["collapse"]
    assert analysis["collapse_primary"] == "e_gen_floor"
    for key in ("e_gen_floor", "log_ratio", "raw"):  # built with γ = ½
        assert abs(col[key]["gamma"] - 0.5) < 0.05, key
        lo, hi = col[key]["interval"]
        assert hi > lo and col[key]["gamma_se"] > 0 and 0 < col[key]["gof_p"] <= 1
        assert col[key]["spread_null"][0] < col[key]["spread_null"][1]
    assert f"γ̂ = {col['e_gen_floor']['gamma']:.3f}" in md
    assert col["e_gen_floor"]["floors"] and col["raw"]["floors"] == {}
    assert analysis["n_used"] == 36 and analysis["n_excluded"] == 2
    assert "broken-7" in md and "RuntimeError: out of memory" in md and "nan-1" in md
    assert "987654" not in md  # the failed trial's numbers enter nothing
    assert all(c["k"] == 2 for c in analysis["cells"])
    bv = [c for c in analysis["bias_variance"] if "skipped" not in c]
    assert len(bv) == 18 and max(c["identity_rel_error"] for c in bv) < 1e-12
    assert "max relative difference 0.00e+00" in md  # E_gen from endpoints = e_gen_final

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert report_main([str(sweep), "--bootstrap", "5"]) == 0  # only the directory logic here
    assert "already holds a report" in capsys.readouterr().err
    assert (sweep / "report-2" / "report.md").is_file()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sweep_report_via_cli_and_unreadable_endpoints(tmp_path):
    from lightning_pfd.cli import main as cli_main

    sweep = _write_sweep(tmp_path / "sw", sizes=(2 ** 10, 2 ** 12), logn=range(3, 7), seeds=(0,),
                         extra_rows=False)
    (sweep / "t000" / "endpoints.pt").write_bytes(b"not a torch file")
    assert cli_main(["report", str(sweep), "--bootstrap", "10", "--out", str(tmp_path / "r")]) == 1
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Incomplete input" in md and "t000" in md
    assert "No cell with K ≥ 2" in md  # one seed per cell: no bias-variance
    res = write_sweep_report(sweep, tmp_path / "r", force=True, bootstrap=5)  # --force: same dir
    assert res["out_dir"] == str(tmp_path / "r") and not (tmp_path / "r-2").exists()


def test_sweep_report_endpoints_without_teacher(tmp_path):
    sweep = _write_sweep(tmp_path / "sw", sizes=(2 ** 10, 2 ** 12), logn=range(3, 7), extra_rows=False,
                         with_teacher=False)
    res = write_sweep_report(sweep, bootstrap=5)
    assert not res["incomplete"]
    a = res["analysis"]
    assert all(c["fid"]["mean"] is None and c["kid"]["mean"] is None for c in a["cells"])
    assert not [c for c in a["bias_variance"] if "skipped" not in c]
    assert any(line.startswith("E_mem recomputed") and "0.00e+00" in line for line in a["consistency"])


def test_sweep_without_successful_trial_is_an_error(tmp_path, capsys):
    sweep = _write_sweep(tmp_path / "sw", sizes=(2 ** 10,), logn=range(3, 5), seeds=(0,),
                         status_ok=False)
    with pytest.raises(ConfigError, match="no successful trial"):
        write_sweep_report(sweep)
    assert report_main([str(sweep)]) == 2
    assert "no successful trial" in capsys.readouterr().err
    assert not (sweep / "report").exists()


@pytest.mark.parametrize("kwargs, argv", [
    (dict(bootstrap=0), ["--bootstrap", "0"]), (dict(gamma_bounds=(1.0, 0.6)), ["--gamma-bounds", "1", "0.6"]),
    (dict(model_size="nope"), ["--model-size", "nope"]), (dict(which="last"), None),
    (dict(level=2.0), ["--level", "2"]), (dict(bootstrap_seed=-1), ["--bootstrap-seed", "-1"]),
    (dict(kid_max_samples=1), ["--kid-max-samples", "1"])])
def test_sweep_report_bad_options_write_nothing(tmp_path, kwargs, argv, capsys):
    """The library names its argument; ``report SWEEP_DIR`` names the option the user typed."""
    sweep = _write_sweep(tmp_path / "sw", sizes=(2 ** 10,), logn=range(3, 5), seeds=(0,), extra_rows=False)
    with pytest.raises(ConfigError) as e:
        write_sweep_report(sweep, **kwargs)
    (name, value), = kwargs.items()
    assert e.value.field == name and repr(e.value.value) == repr(value)
    if argv is not None:
        capsys.readouterr()
        assert report_main([str(sweep), *argv]) == 2
        assert capsys.readouterr().err.startswith(f"error: {argv[0]}: ")
    assert not (sweep / "report").exists()


def test_sweep_report_on_the_recorded_results(tmp_path):
    """The recorded mtog_digits rows (experiments/results/mtog_digits_sweep_results.csv, no
    endpoints kept): every collapse quantity gets an interval of non-zero width; the width that
    never crosses (|θ| = 29,600) is excluded from the transition quantities with its reason."""
    rows = []
    for r in csv.DictReader(open(Path(__file__).parents[1] / "experiments" / "results"
                                 / "mtog_digits_sweep_results.csv")):
        rows.append(dict(trial_id=r["trial_id"], status=r["status"], n_train=int(r["n_train"]),
                         n_params=int(r["n_params"]), model_label=r["model_label"], seed=int(r["seed"]),
                         e_gen_final=float(r["e_gen_final"]), e_mem_final=float(r["e_mem_final"]),
                         endpoints=None))
    (tmp_path / "sweep_results.json").write_text(json.dumps(rows))
    res = write_sweep_report(tmp_path, tmp_path / "r", bootstrap=20)
    col = res["analysis"]["collapse"]
    for key in ("e_gen_floor", "log_ratio", "e_mem_ceiling", "raw"):
        lo, hi = col[key]["interval"]
        assert hi - lo > 0.01, key
    assert col["log_ratio"]["widths"] == [67200, 191552, 636864]
    assert col["e_gen_floor"]["excluded"] == {} and "29600" in col["log_ratio"]["excluded"]
    assert "no transition" in col["log_ratio"]["excluded"]["29600"]
    md = Path(res["markdown"]).read_text()
    assert "width \\|θ\\| = 29600 excluded" in md
    # the first line of the primary quantity is the goodness-of-fit verdict; a rejected quantity is
    # not said to collapse at γ̂ (the recorded E_gen − floor_w: its deformation statistic above all
    # 20 bootstrap values), and the verdict names the largest departure (the curves cross)
    prim = col["e_gen_floor"]
    assert prim["rejected"] and prim["gof_p"] == pytest.approx(1 / 21)
    assert prim["gof_statistic"] == "deformation" and prim["deformation"]["largest"] == "stretch"
    assert (f"**E_gen − floor_w: collapse rejected (p = {prim['gof_p']:.3g}; largest departure: "
            "per-width steepness).**") in md
    assert "collapses at γ̂" not in prim["verdict"] and "not a collapse exponent" in md
    assert prim["se_widths"] > prim["se_repeats"] > 0  # the model error dominates on this sweep
    sens = res["analysis"]["collapse_sensitivity"]
    assert [r["variant"] for r in sens] == [f"without width |θ| = {w}" for w in (29600, 67200, 191552, 636864)] \
        + ["without the smallest N (N = 32)"]
    for r in sens:
        assert r["fit"]["gamma"] is not None and f"| {r['fit']['gamma']:.3f} |" in md
    assert "Spread: leaving out one width or the smallest N moves γ̂ over" in md


def test_the_repeat_error_structure_anova_is_the_regression_f_test_and_has_its_size():
    """experiments/sweep_error_structure.py: its row / column F are the nested least-squares F
    tests of the additive model (an independent computation), its p-value has size ~5 % on
    independent errors, and a planted width x repeat effect is found."""
    from sweep_error_structure import two_way_anova  # experiments/ (tests/conftest.py)

    rng = np.random.default_rng(3)
    r, c = 4, 8
    d = rng.standard_normal((r, c)) + np.array([0.0, 0.5, -0.4, 1.0])[:, None]
    rows, cols = np.repeat(np.arange(r), c), np.tile(np.arange(c), r)
    design = lambda *parts: np.column_stack([np.ones(r * c)] + [np.eye(n)[idx][:, 1:] for n, idx in parts])  # noqa: E731
    rss = lambda X: float(np.sum((d.reshape(-1) - X @ np.linalg.lstsq(X, d.reshape(-1), rcond=None)[0]) ** 2))  # noqa: E731
    full = rss(design((r, rows), (c, cols)))
    df_e = (r - 1) * (c - 1)
    a = two_way_anova(d)
    f_rows = (rss(design((c, cols))) - full) / (r - 1) / (full / df_e)
    f_cols = (rss(design((r, rows))) - full) / (c - 1) / (full / df_e)
    assert a["rows"]["F"] == pytest.approx(f_rows, rel=1e-10) and a["columns"]["F"] == pytest.approx(f_cols, rel=1e-10)
    null = [two_way_anova(rng.standard_normal((r, c)))["rows"]["p"] < 0.05 for _ in range(600)]
    assert 0.025 < np.mean(null) < 0.08
    planted = [two_way_anova(rng.standard_normal((r, c)) + 1.5 * rng.standard_normal((r, 1)))["rows"]["p"] < 0.05
               for _ in range(200)]
    assert np.mean(planted) > 0.6
    # with K = 2 repeats the nested F tests of repeat_effects are this ANOVA of the differences
    from sweep_error_structure import repeat_effects

    v = rng.standard_normal((r, c, 2))
    eff, a = repeat_effects(v), two_way_anova(v[..., 0] - v[..., 1])
    assert eff["width_x_repeat"]["F"] == pytest.approx(a["rows"]["F"], rel=1e-9)
    assert eff["n_x_repeat"]["F"] == pytest.approx(a["columns"]["F"], rel=1e-9)
    assert eff["n_x_repeat"]["df"] == a["columns"]["df"]
