"""Scaling analysis of an (N, |θ|) sweep and `python -m lightning_pfd report SWEEP_DIR`.

Oracles: synthetic curves built on a known master curve and a known γ (PFD paper Fig. 2), the
analytic crossing of linear curves, brute-force loops for the collapse objective and for Def. 3,
ProbabilityFlowDistance (eq. 4) for E_gen, scipy's sqrtm for the Fréchet distance of sample
moments, torchmetrics' KID, and the zero mean of an unbiased MMD² between equal laws."""
import json
import math

import numpy as np
import pytest
import torch
from scipy.interpolate import PchipInterpolator
from scipy.linalg import sqrtm

from lightning_pfd.analysis.report import main as report_main
from lightning_pfd.analysis.scaling import (
    bias_variance_cell,
    bootstrap_collapse,
    collapse_spread,
    crossings,
    fit_collapse,
    group_cells,
    psi_fid,
    psi_kid,
    transition_point,
)
from lightning_pfd.analysis.sweep_report import pfd_from_endpoints, write_sweep_report
from lightning_pfd.errors import ConfigError
from lightning_pfd.metrics import ProbabilityFlowDistance
from lightning_pfd.metrics.baselines import frechet_distance, kernel_distance


def _master(x):
    """A sigmoid master curve for E_gen and E_mem (MtoG at x ≈ 0)."""
    return 0.5 + 1.5 / (1 + np.exp(x)), 2.0 - 0.8 / (1 + np.exp(x - 1))


def _synthetic_cells(gamma, seed=0, sizes=(14, 16, 18, 20), logn=range(4, 19), K=3, noise=0.01):
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


# ----------------------------------------------------------------------------- collapse
@pytest.mark.parametrize("gamma", [0.5, 0.3])
def test_collapse_recovers_known_gamma(gamma):
    """γ̂ within 0.01 on every noise realization; the 95 % interval covers γ on at least 6 of 8
    (a nominal 95 % interval misses 6 of 8 with probability 0.6 %; measured coverage on 20
    realizations: 0.95-1.0, docs/sweeps_analysis.md)."""
    fits = [bootstrap_collapse(_synthetic_cells(gamma, seed=r), B=40, seed=1) for r in range(8)]
    assert all(f.method == "seeds" and abs(f.gamma - gamma) < 0.01 for f in fits)
    assert sum(f.interval[0] <= gamma <= f.interval[1] for f in fits) >= 6
    fit = fits[0]
    assert fit.interval[1] - fit.interval[0] < 0.05
    assert fit.score.spread < 0.05 < fit.references[0.0].spread  # N alone does not collapse
    if gamma == 0.3:
        assert fit.references[0.5].spread > 5 * fit.score.spread
    for cols in ([0], [1]):  # E_gen and E_mem separately find the same γ
        assert abs(bootstrap_collapse(_synthetic_cells(gamma), cols, B=20).gamma - gamma) < 0.02


def test_collapse_gamma_zero_when_curves_coincide():
    fit = bootstrap_collapse(_synthetic_cells(0.0), B=50, seed=2)
    assert abs(fit.gamma) < 0.01
    assert fit.interval[0] <= 0.0 <= fit.interval[1]
    assert fit.references[0.0].spread == pytest.approx(fit.score.spread, rel=0.05)
    assert fit.references[0.5].spread > 10 * fit.score.spread


def _brute_spread(ln, lp, y, gamma, min_overlap):
    """The documented objective with explicit loops and scipy's PCHIP on each other curve."""
    x = ln - gamma * lp
    res, P = [], len(x)
    for i in range(P):
        vals = []
        for s in np.unique(lp):
            if s == lp[i]:
                continue
            sel = lp == s
            order = np.argsort(x[sel])
            xs, ys = x[sel][order], y[sel][order]
            if xs[0] - 1e-12 <= x[i] <= xs[-1] + 1e-12:
                vals.append(PchipInterpolator(xs, ys, axis=0)(np.clip(x[i], xs[0], xs[-1])))
        if vals:
            res.append(y[i] - np.mean(vals, axis=0))
    if len(res) < max(3, min_overlap * P):
        return math.inf
    r = np.array(res)
    return math.sqrt(np.mean(np.mean(r ** 2, axis=0) / y.std(axis=0) ** 2))


@pytest.mark.parametrize("gamma", [-0.3, 0.0, 0.37, 0.5, 1.1])
def test_collapse_spread_matches_brute_force(gamma):
    rng = np.random.default_rng(3)
    ln = np.concatenate([np.arange(3, 10), np.arange(4, 12), np.arange(2, 8)]).astype(float)
    lp = np.concatenate([np.full(7, 10.0), np.full(8, 12.0), np.full(6, 15.0)])
    y = rng.standard_normal((ln.size, 2))
    got = collapse_spread(ln, lp, y, gamma)
    want = _brute_spread(ln, lp, y, gamma, 0.25)
    assert got.spread == pytest.approx(want, rel=1e-10) if math.isfinite(want) else got.spread == math.inf


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
    one = _synthetic_cells(0.5, K=1)
    fit = bootstrap_collapse(one, B=15, seed=0)
    assert fit.method == "curves" and fit.bootstrap.size == 15
    assert abs(fit.gamma - 0.5) < 0.02


@pytest.mark.parametrize("kwargs", [dict(B=0), dict(level=1.0), dict(method="jackknife"),
                                    dict(bounds=(1.0, 0.0)), dict(step=0.0), dict(min_overlap=2)])
def test_bad_fit_options_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        bootstrap_collapse(_synthetic_cells(0.5, sizes=(14, 16), logn=range(4, 8), K=1), **kwargs)


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
    joint = analysis["collapse"]["joint"]
    assert abs(joint["gamma"] - 0.5) < 0.05
    assert f"γ̂ = {joint['gamma']:.4f}" in md
    assert analysis["n_used"] == 36 and analysis["n_excluded"] == 2
    assert "broken-7" in md and "RuntimeError: out of memory" in md and "nan-1" in md
    assert "987654" not in md  # the failed trial's numbers enter nothing
    assert all(c["k"] == 2 for c in analysis["cells"])
    bv = [c for c in analysis["bias_variance"] if "skipped" not in c]
    assert len(bv) == 18 and max(c["identity_rel_error"] for c in bv) < 1e-12
    assert "max relative difference 0.00e+00" in md  # E_gen from endpoints = e_gen_final

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert report_main([str(sweep), "--bootstrap", "30"]) == 0
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


@pytest.mark.parametrize("kwargs", [dict(bootstrap=0), dict(gamma_bounds=(1.0, 0.6)),
                                    dict(model_size="nope"), dict(which="last"), dict(level=2.0)])
def test_sweep_report_bad_options_write_nothing(tmp_path, kwargs):
    sweep = _write_sweep(tmp_path / "sw", sizes=(2 ** 10,), logn=range(3, 5), seeds=(0,), extra_rows=False)
    with pytest.raises(ConfigError):
        write_sweep_report(sweep, **kwargs)
    assert not (sweep / "report").exists()
