"""Issue 42 item 1, the audit's part: numbers quoted in README.md and docs/ that
``tests/test_quoted_numbers.py`` did not check yet, each checked against its results file in
``experiments/results/`` (value and rounding). A check builds the quoted text from the record with
the page's rounding and looks for it in the page (HTML comments removed, whitespace folded, so a
re-wrapped line still matches); a re-recorded result that changes a printed digit fails here
until the text follows. Numbers with no results file (the sizing runs of docs/sweeps.md, the
pilots, the benchmarks of docs/performance.md) are not checked here; the benchmark records and
docs/levy.md's exact-score record are checked in ``tests/test_quoted_numbers_benchmarks.py``."""
from __future__ import annotations

import csv
import functools
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments/results"
sys.path.insert(0, str(ROOT / "experiments"))  # as tests/conftest.py does


@functools.lru_cache(maxsize=None)
def _rec(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@functools.lru_cache(maxsize=None)
def _page(page: str) -> str:
    """The page as it renders, for phrase search: HTML comments (the markers) removed and every
    run of whitespace one space."""
    return " ".join(re.sub(r"<!--.*?-->", "", (ROOT / page).read_text(), flags=re.S).split())


def _missing(page: str, phrases) -> list:
    text = _page(page)
    return [p for p in phrases if p not in text]


def _sci(x: float, d: int) -> str:
    """``x`` as the pages write a power of ten in prose: 4.9e-3, 1.2e-2, 4.1e4."""
    m, e = f"{x:.{d}e}".split("e")
    return f"{m}e{int(e)}"


def _pct(share: float, d: int = 0) -> str:
    return f"{100 * share:.{d}f} %"


def _range(values, fmt) -> str:
    return f"{fmt(min(values))}–{fmt(max(values))}"


def test_the_phrase_check_can_fail():
    """A phrase built from a changed value is not found (the checks below can fail)."""
    qs = _rec("quickstart_record.json")
    el = qs["events"][0]
    assert _missing("docs/getting-started.md", [f"held-out z = {el['significance']:.1f}"]) == []
    assert _missing("docs/getting-started.md", [f"held-out z = {el['significance'] + 0.1:.1f}"]) != []
    assert _sci(0.0049199, 1) == "4.9e-3" and _sci(41024.3, 1) == "4.1e4" and _pct(0.925, 1) == "92.5 %"


# ----------------------------------------------------------------------------- the quickstart
def _quickstart_regime():
    """The quickstart's regime as its RegimeMonitor decides it: classify_regime of the recorded
    curves with the config's window and confirm."""
    import yaml

    from lightning_pfd.analysis.events import classify_regime

    cfg = yaml.safe_load((ROOT / "lightning_pfd/configs/quickstart.yaml").read_text())
    (mon,) = [c["init_args"] for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("RegimeMonitor")]
    curves = _rec("quickstart_record.json")["curves"]
    epochs = sorted(int(e) for e in curves["E_gen"]["values"])
    series = {k: [curves[k]["values"][str(e)] for e in epochs] for k in ("E_gen", "E_mem", "memorization ratio")}
    return classify_regime(epochs, series["E_gen"], series["E_mem"], mem_ratio=series["memorization ratio"],
                           window=mon["window"], confirm=mon["confirm"])


def test_the_quickstart_prose_of_getting_started_and_the_scorecard_is_the_record():
    qs = _rec("quickstart_record.json")
    ev = {e["name"]: e for e in qs["events"]}
    el, on = ev["early_learning"], ev["memorization_onset"]
    d, r = el["legs"]["descent"], el["legs"]["rise"]
    g = qs["curves"]["E_gen"]["values"]
    first, minimum = g["0"], g[str(el["epoch"])]
    regime = _quickstart_regime()
    assert regime.name == "memorization"
    assert _missing("docs/getting-started.md", [
        f"for {len(g)} epochs × 250 steps",
        f"(memorization onset at epoch {on['epoch']}, early learning at epoch {el['epoch']})",
        f"E_gen minimum {minimum:.2f} at epoch {el['epoch']} — descent {first:.2f} → {minimum:.2f} = "
        f"{d['diff']:.2f} ± {d['se']:.2f} (held-out z = {d['z']:.1f} after the selection allowance)",
        f"rise to the last three epochs {r['diff']:.2f} ± {r['se']:.2f} (z = {r['z']:.1f})",
        f"**memorization onset** at epoch {on['epoch']} (the ratio's end level {on['legs']['rise']['diff']:.2f} "
        f"against its baseline before epoch {on['epoch']}, held-out z = {on['significance']:.1f}",
        f"regime **{regime.name}** (E_gen/E_mem = {regime.detail['e_gen_end'] / regime.detail['e_mem_end']:.2f}, "
        f"ratio {regime.detail['mem_ratio_end']:.2f})",
        f"`runs/quickstart/checkpoints/egen-min-{el['epoch']:03d}.ckpt`",
    ]) == []
    assert _missing("docs/scorecard.md", [
        f"N = 64, {len(g)} epochs, Ψ = identity, M = 256",
        f"the minimum is at the second of {len(g)} evaluations",
        f"quickstart: E_gen minimum {minimum:.2f} at epoch {el['epoch']}; descent {d['diff']:.2f} ± {d['se']:.2f} "
        f"(selection-corrected held-out z = {d['z']:.1f}), rise {r['diff']:.2f} ± {r['se']:.2f} (z = {r['z']:.1f})",
    ]) == []
    assert _missing("README.md", [f"trains on them for {len(g)} epochs"]) == []
    # the onset's epoch and z, quoted again in the v4 calibration note of docs/events.md
    assert _missing("docs/events.md", [f"The quickstart's onset: epoch {on['epoch']}, z {on['significance']:.1f}"]) == []


def test_the_quickstart_students_size_is_the_configs():
    """README, getting-started and the scorecard quote the quickstart student's size (0.64M)."""
    import yaml

    from lightning_pfd.nets import MLPNet

    cfg = yaml.safe_load((ROOT / "lightning_pfd/configs/quickstart.yaml").read_text())
    net = MLPNet(**cfg["model"]["init_args"]["net"]["init_args"])
    size = f"{sum(p.numel() for p in net.parameters()) / 1e6:.2f}M"
    for page in ("README.md", "docs/getting-started.md", "docs/scorecard.md"):
        assert size in _page(page), (page, size)


# ----------------------------------------------------------------------------- PFD, App. C.1
def test_the_gaussian_efficiency_table_and_prose_are_the_record():
    rec = _rec("pfd_gaussian_efficiency.json")
    s, args = rec["summary"], rec["args"]
    rows = [f"| {m} | " + " | ".join(f"{s[m][k][0]:.2e} ({s[m][k][1]:.1e})" for k in ("pfd_heun", "pfd_exact_flow", "w2_ot", "fid"))
            + " |" for m in s]
    assert len(rows) == len(args["sizes"]) == 6
    text = (ROOT / "docs/pfd.md").read_text()
    assert [r for r in rows if r not in text.splitlines()] == []
    top = s[str(max(args["sizes"]))]
    heun, mc, w2, fid = (top[k][0] for k in ("pfd_heun", "pfd_exact_flow", "w2_ot", "fid"))
    assert _missing("docs/pfd.md", [
        f"M = {max(args['sizes'])}: relative error **{_sci(heun, 1)}** (Monte Carlo alone {_sci(mc, 1)}; "
        f"exact-OT sample W2 {_sci(w2, 1)}; FID vs W2² {_sci(fid, 1)})",
        f"mean (std) over {args['repeats']} random pairs of {args['dim']}-D",
        f"PFD through the real sampler is within {_pct(heun, 1)} of eq. 39",
        f"{w2 / heun:.1f}× better than exact-OT W2 and {fid / heun:.1f}× better than FID",
        f"isolates the Monte Carlo error ({_sci(mc, 1)})",
    ]) == []
    assert _missing("docs/scorecard.md", [f"rel. error {_sci(heun, 1)} vs eq. 39 at M = {max(args['sizes'])}"]) == []


def test_the_mixture_correlation_table_and_prose_are_the_records():
    recs = [_rec("pfd_mixture_correlation.json"), _rec("pfd_mixture_correlation_m4096.json")]
    rows = []
    for r in recs:
        a = r["args"]
        rows.append(f"| {a['num_samples']} | {a['repeats']} | **{r['pearson_r']:.4f}** | {r['slope']:.3f} | "
                    f"{r['frac_w2_le_pfd']:.2f} | [{min(r['pfd']):.2f}, {max(r['pfd']):.2f}] |")
        assert len(r["pfd"]) == a["repeats"]
    text = (ROOT / "docs/pfd.md").read_text()
    assert [r for r in rows if r not in text.splitlines()] == []
    big, a = recs[1], recs[1]["args"]
    low = sorted(1 - r["frac_w2_le_pfd"] for r in recs)
    assert _missing("docs/pfd.md", [
        f"PFD vs W2 on {a['repeats']} random {a['components']}-component {a['dim']}-D mixtures: Pearson "
        f"**r = {big['pearson_r']:.4f}** at M = {a['num_samples']}",
        f"{a['repeats']} random pairs of {a['components']}-component {a['dim']}-D Gaussian mixtures",
        f"which is why {100 * low[0]:.0f}–{100 * low[1]:.0f} % of the pairs have Ŵ2 > PFD",
    ]) == []
    assert _missing("docs/scorecard.md", [f"Pearson r = {big['pearson_r']:.4f}"]) == []


# ----------------------------------------------------------------------------- rounding of quoted numbers
_NUM = r"[+−-]?\d[\d,]*(?:\.\d+)?"


def _agrees(doc: str, value) -> bool:
    """``doc`` (a number as the page prints it) is ``value`` rounded as printed. ``value`` is a
    float (the record's full value: the rounding must match exactly) or a string (a number the
    record itself prints rounded, e.g. in a report table: then ``doc`` must be a rounding of some
    value that rounds to it)."""
    doc = doc.replace("−", "-").replace(",", "")
    k = len(doc.split(".")[1]) if "." in doc else 0
    if isinstance(value, str):
        value = value.replace("−", "-")
        kv = len(value.split(".")[1]) if "." in value else 0
        return abs(float(doc) - float(value)) <= 0.5 * 10 ** -k + 0.5 * 10 ** -kv + 1e-12
    return f"{value:{'+' if doc.startswith('+') else ''}.{k}f}" == doc


def _quote(page: str, template: str, *values) -> bool:
    """Whether ``page`` holds ``template`` with each ``{}`` a number that agrees (:func:`_agrees`)
    with the matching value."""
    parts = template.split("{}")
    assert len(parts) == len(values) + 1, template
    pattern = "".join(re.escape(p) + (f"({_NUM})" if i < len(values) else "") for i, p in enumerate(parts))
    return any(all(_agrees(g, v) for g, v in zip(m.groups(), values)) for m in re.finditer(pattern, _page(page)))


def _unquoted(page: str, quotes) -> list:
    """The (template, values) of ``quotes`` that ``page`` does not hold."""
    return [q for q in quotes if not _quote(page, q[0], *q[1:])]


def test_the_rounding_check_can_fail():
    assert _agrees("0.96", "0.955") and _agrees("0.95", "0.955") and not _agrees("0.94", "0.955")
    assert _agrees("0.80", 0.8012) and not _agrees("0.81", 0.8012) and not _agrees("0.8", "0.86")
    assert _quote("docs/sweeps.md", "γ̂ = {}, 90 % interval [{}, {}]", "0.801", "0.647", "0.955")
    assert not _quote("docs/sweeps.md", "γ̂ = {}, 90 % interval [{}, {}]", "0.811", "0.647", "0.955")


# ----------------------------------------------------------------------------- the mtog_digits sweep
@functools.lru_cache(maxsize=None)
def _cells():
    """{(|θ|, N): (mean E_gen, mean E_mem)} of the recorded sweep's rows (final values)."""
    with open(RESULTS / "mtog_digits_sweep_results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = {}
    for r in rows:
        cells.setdefault((int(r["n_params"]), int(r["n_train"])), []).append(r)
    return rows, {k: (statistics.mean(float(r["e_gen_final"]) for r in v),
                      statistics.mean(float(r["e_mem_final"]) for r in v)) for k, v in cells.items()}


def _report_rows(first_header_cell: str, header_has: str = "") -> list:
    """The rows (lists of cells) of the table of mtog_digits_report.md whose header starts so
    (and holds ``header_has``)."""
    lines = (RESULTS / "mtog_digits_report.md").read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header_cell} |") and header_has in ln)
    out = []
    for ln in lines[i + 2:]:
        if not ln.startswith("|"):
            break
        out.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip("|"))])  # not at an escaped \|
    return out


def _transitions():
    """log₂N* per width (E_gen = E_mem, linear in log₂N between the cells: docs/sweeps_analysis.md)."""
    import math

    _, cells = _cells()
    widths, ns = sorted({w for w, _ in cells}), sorted({n for _, n in cells})
    out = {}
    for w in widths:
        d = [cells[(w, n)][0] - cells[(w, n)][1] for n in ns]
        for j in range(len(ns) - 1):
            if d[j] > 0 >= d[j + 1]:
                x0, x1 = math.log2(ns[j]), math.log2(ns[j + 1])
                out[w] = x0 + d[j] * (x1 - x0) / (d[j] - d[j + 1])
                break
    return out


def test_the_sweeps_cell_numbers_are_the_recorded_rows():
    """E_gen / E_mem per cell, the transitions and their spreads in docs/sweeps.md, the scorecard and
    docs/sweeps_analysis.md are those of mtog_digits_sweep_results.csv."""
    import math

    rows, c = _cells()
    widths, ns = sorted({w for w, _ in c}), sorted({n for _, n in c})
    w32, w64, w128, w256 = widths
    g = lambda w, n: f"{c[(w, n)][0]:.2f}"  # noqa: E731
    m = lambda w, n: f"{c[(w, n)][1]:.2f}"  # noqa: E731
    lo, hi = ns[0], ns[-1]
    assert len(rows) == 64 and {r["status"] for r in rows} == {"ok"}
    t = _transitions()
    assert sorted(t) == [w64, w128, w256]  # width 32 never crosses
    nstar = [f"{2 ** t[w]:.1f}" if 2 ** t[w] < 100 else f"{2 ** t[w]:.0f}" for w in sorted(t)]
    spread = lambda gamma: statistics.stdev(t[w] - gamma * math.log2(w) for w in t)  # noqa: E731
    gamma_hat = _report_rows("quantity")[0][3]  # E_gen − floor_w
    e32 = [c[(w32, n)][1] for n in ns]
    walls = [float(r["wall_time_s"]) for r in rows]
    quiet = {r["model_label"]: [] for r in rows}
    for r in rows:
        if int(r["n_train"]) == hi:
            quiet[r["model_label"]].append(float(r["wall_time_s"]))
    sweeps = [
        f"{len(rows)} trials, 0 failed",
        f"(width 256: {g(w256, lo)} at N = {lo} → {g(w256, hi)} at N = {hi})",
        f"(128: {m(w128, lo)} → {m(w128, hi)}; 256: {m(w256, lo)} → {m(w256, hi)})",
        f"E_mem {m(w32, lo)} → {m(w32, hi)}",
        f"N* ≈ {nstar[0]}, {nstar[1]}, {nstar[2]} for 0.07M, 0.19M, 0.64M",
        f"drops from {spread(0):.2f} (against log₂N) to {spread(0.5):.2f} against log₂(N/√|θ|)",
        f"width 32: {g(w32, lo)} → {g(w32, hi)}",
        f"(128: {m(w128, lo)} at N = {lo} → {m(w128, hi)} at N = {hi}; 256: {m(w256, lo)} → {m(w256, hi)}, both peaking at N = 2048)",
        f"width 64 rises from {m(w64, lo)} to {m(w64, 128)} by N = 128 then drifts back to {m(w64, hi)}",
        f"stays at {min(e32[:4]):.2f}–{max(e32[:4]):.2f} up to N = 256 and then falls to {m(w32, hi)}",
        f"N* ≈ {nstar[0]} (width 64), {nstar[1]} (128), {nstar[2]} (256), none for width 32",
        f"The spread of log₂N* across sizes is {spread(0):.2f} against log₂N, {spread(0.5):.2f} against "
        f"log₂(N/√|θ|) and {spread(float(gamma_hat)):.2f} against log₂(N/|θ|^γ̂), γ̂ = {gamma_hat} of item 3",
        f"({' / '.join(g(w, hi) for w in widths)} at N = {hi} for widths 32 … 256)",
        f"crossings' spread shrinks from {spread(0):.2f} (log₂N) to {spread(0.5):.2f} against log₂(N/√|θ|) "
        f"and to {spread(float(gamma_hat)):.2f}",
        f"Per-trial fit wall times range from {min(walls):.0f} s to {max(walls):.0f} s",
        f"took {min(quiet['hidden=32']):.0f} s (width 32) to {max(quiet['hidden=256']):.0f} s (width 256)",
    ]
    assert _missing("docs/sweeps.md", sweeps) == []
    assert [max(c[(w, n)][1] for n in ns) for w in (w128, w256)] == [c[(w, 2048)][1] for w in (w128, w256)]
    assert _missing("docs/scorecard.md", [f"transition N* ≈ {nstar[0]}, {nstar[1]}, {nstar[2]} grows with"]) == []
    floors = ", ".join(f"{c[(w, hi)][0]:.2f}" for w in widths)
    assert _missing("docs/sweeps_analysis.md", [f"sweep {floors} at N = {hi} for widths 32…256"]) == []
    assert [f"{w:,}" for w in widths] == ["29,600", "67,200", "191,552", "636,864"]
    assert _missing("docs/sweeps.md", [f"|θ| = {widths[0]:,} … {widths[-1]:,}"]) == []


def test_the_collapse_numbers_are_the_reports():
    """The collapse fit quoted in README, docs/sweeps.md, the scorecard and docs/sweeps_analysis.md
    is that of experiments/results/mtog_digits_report.md (its "Collapse" tables, rounded as
    printed)."""
    q = {r[0]: r for r in _report_rows("quantity")}
    sens = {r[0]: r for r in _report_rows("fit")}
    fl, lr, mc, raw = (q[k] for k in ("E_gen − floor_w", "log(E_gen/E_mem)", "E_mem − ceiling_w", "E_gen, E_mem (raw, jointly)"))
    p = lambda row: re.search(r"p = ([\d.]+)", row[2] if len(row) > 4 else row[3]).group(1)  # noqa: E731
    iv = lambda cell: re.findall(_NUM, cell)  # noqa: E731
    sd, rep, wid = re.findall(r"[\d.]+", fl[5])
    s_hat, s_lo, s_hi = re.findall(r"[\d.]+", fl[8])
    se_below = re.search(r"([\d.]+) s\.e\. below", fl[7]).group(1)
    w1, w2, w3, w4, n32 = (sens[k] for k in ("without width \\|θ\\| = 29600", "without width \\|θ\\| = 67200",
                                               "without width \\|θ\\| = 191552", "without width \\|θ\\| = 636864",
                                               "without the smallest N (N = 32)"))
    assert {p(fl), p(lr), p(mc), p(raw)} == {"0.00498"} and "consistent" in w3[3]
    assert fl[1] == "29600, 67200, 191552, 636864" and fl[4] == "[0.647, 0.955]"
    sens_hats = [w1[1], w2[1], w3[1], w4[1], n32[1]]
    sweeps = [
        ("the goodness-of-fit test rejects (p = {}, the smallest p of B = 200)", p(fl)),
        ("γ̂ = {}, 90 % interval [{}, {}] once the between-width variation is included (sd {}: {} from the repeats, "
         "{} from the jackknife over widths); the paper's γ = ½ lies {} s.e. below it", fl[3], *iv(fl[4]), sd, rep, wid, se_below),
        ("moves γ̂ over {}–{}", min(sens_hats, key=float), max(sens_hats, key=float)),
        ("the raw E_gen, E_mem deviate by {} s.e. at their best γ̂ = {} (rejected, p = {})", raw[8].split()[0], raw[3], p(raw)),
        ("collapse of E_gen − floor_w (p = {}, the smallest p of B = 200", p(fl)),
        ("S(γ̂) = {} s.e., above the 90 % range {}–{} of S under an exact collapse", s_hat, s_lo, s_hi),
        ("**γ̂ = {}, 90 % interval [{}, {}] including the model error** (sd {} = √({}² + 0.5·{}²)", fl[3], *iv(fl[4]), sd, rep, wid),
        ("the repeats alone would give [{}, {}]", *iv(fl[6])),
        ("{} s.e. below γ̂**, with S(½) = {} against S(γ̂) = {} and S(0) = {}", se_below, fl[10], s_hat, fl[9]),
        ("without one width γ̂ = {}, {}, {}, {} (widths 32, 64, 128, 256 left out), without N = 32 it is {}", *sens_hats),
        ("the intervals of the first two contain ½ ([{}, {}], [{}, {}])", *iv(w1[2]), *iv(w2[2])),
        ("without width 128 (p = {}) — gives {} [{}, {}]", re.search(r"p = ([\d.]+)", w3[3]).group(1), w3[1], *iv(w3[2])),
        ("(without N = 32: {} [{}, {}], rejected, p = {})", n32[1], *iv(n32[2]), re.search(r"p = ([\d.]+)", n32[3]).group(1)),
        ("is rejected too (p = {}, S(γ̂) = {}) with γ̂ = {} [{}, {}]", p(lr), lr[8].split()[0], lr[3], *iv(lr[4])),
        ("(p = {}, largest departure the widths' height), whose γ̂ = {} [{}, {}]", p(mc), mc[3], *iv(mc[4])),
        ("(goodness of fit p = {}), and the best-aligning exponent is γ̂ = {} [{}, {}], ½ lying {} s.e. below",
         p(fl), fl[3], *iv(fl[4]), se_below),
        ("the γ that aligns them best is about {}, and ½ is {} standard errors below", fl[3], se_below),
        ("(p = {}, γ̂ = {} with ½ {} s.e. below)", p(fl), fl[3], se_below),
    ]
    assert _unquoted("docs/sweeps.md", sweeps) == []
    assert "without width \\|θ\\| = 29600" in sens and float(iv(w1[2])[0]) < 0.5 < float(iv(w2[2])[1])
    assert _unquoted("docs/scorecard.md", [
        ("the best-aligning γ ≈ {}, ½ disfavoured ({} s.e.)", fl[3], se_below),
        ("goodness-of-fit test (p = {}, parametric bootstrap of the fitted collapse model, B = 200); best-aligning "
         "γ̂ = {}, 90 % interval [{}, {}]", p(fl), fl[3], *iv(fl[4])),
        ("γ = ½ lies outside it, {} s.e. below", se_below),
        ("moves γ̂ over {}–{}", min(sens_hats, key=float), max(sens_hats, key=float)),
        ("rejected too (p = {}), γ̂ = {} [{}, {}]", p(lr), lr[3], *iv(lr[4])),
        ("raw curves (different floors) rejected (S = {} s.e.)", raw[8].split()[0]),
    ]) == []
    assert _unquoted("README.md", [
        ("(goodness-of-fit p = {}; γ̂ = {}, ½ {} s.e. below)", p(fl), fl[3], se_below),
    ]) == []


def test_the_k2_bias_variance_numbers_are_the_reports():
    """docs/sweeps.md's bias–variance figures (K = 2) are the report's table (it needs the
    endpoints, which were not kept: the report is the record)."""
    bv = {(int(r[1]), int(r[2])): r for r in _report_rows("model", "E_bias²")}
    assert len(bv) == 32
    widths, ns = sorted({w for w, _ in bv}), sorted({n for _, n in bv})
    var = lambda w, n: bv[(w, n)][6]  # noqa: E731
    bias = lambda w, n: bv[(w, n)][5]  # noqa: E731
    ident = max(float(r[9].split("/")[1]) for r in bv.values())
    assert f"{ident:.0e}" == "3e-16"
    quotes = [
        ("E_var falls with N for every width (width 256: {} → {})", var(widths[-1], ns[0]), var(widths[-1], ns[-1])),
        ("(N = 32: {} → {} from width 32 to 256); E_bias² falls with |θ| at large N (N = 2048: {} → {})",
         var(widths[0], 32), var(widths[-1], 32), bias(widths[0], 2048), bias(widths[-1], 2048)),
        ("(width 256: {} at N = 32 → {} at N = 4096)", var(widths[-1], 32), var(widths[-1], ns[-1])),
        ("(N = 32: {}, {}, {}, {} for widths 32…256)", *(var(w, 32) for w in widths)),
        ("(N = 2048: {}, {}, {}, {})", *(bias(w, 2048) for w in widths)),
    ]
    assert _unquoted("docs/sweeps.md", quotes) == []
    assert all(float(var(w, ns[0])) > float(var(w, ns[-1])) for w in widths)  # "E_var falls with N for every width"
    assert _missing("docs/sweeps.md", ["identity exact to 3e-16", "holds to ≤ 3e-16 relative on every cell"]) == []


def test_the_k3_bias_variance_scorecard_figures_are_the_record():
    rec = _rec("mtog_digits_k3_bias_variance.json")
    ident = max(c["identity_rel_error"] for c in rec["cells"])
    st = {s["key"]: s for s in rec["statements"]}
    grows = re.findall(r"N (\d+) ([+-][\d.]+) ± ([\d.]+)", st["var_grows"]["numbers"])
    yes = [int(n) for n, d, se in grows if float(d) > 2 * float(se)]
    no = [int(n) for n, d, se in grows if float(d) <= 2 * float(se)]
    assert yes == [n for n in yes if n <= max(yes)] and min(no) > max(yes)
    ns = sorted({c["n_train"] for c in rec["cells"]})
    assert _missing("docs/scorecard.md", [
        f"identity to ≤ {ident:.1e}",
        f"N ≤ {max(ns)}, Ψ = identity",
        f"(yes at N ≤ {max(yes)}, not at {min(no)}–{max(no)})",
    ]) == []


# ----------------------------------------------------------------------------- docs/sweeps_analysis.md: calibration of the collapse test
def _doc_table(page: str, header_start: str, header_has: str = "") -> list:
    """The rows (lists of cells, ``**`` removed) of the markdown table of ``page`` whose header
    line starts with ``header_start`` (and holds ``header_has``)."""
    lines = (ROOT / page).read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(header_start) and header_has in ln)
    out = []
    for ln in lines[i + 2:]:
        if not ln.startswith("|"):
            break
        out.append([c.strip().replace("**", "") for c in re.split(r"(?<!\\)\|", ln.strip().strip("|"))])
    return out


def _power_bound() -> dict:
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+mean bound ([\d.]+)",
                                                        (RESULTS / "collapse_power_bound.txt").read_text(), re.M)}


def test_the_coverage_table_is_the_record():
    cov = _rec("collapse_coverage.json")["summary"]["coverage"]
    rows = _doc_table("docs/sweeps_analysis.md", "| half | shape | true γ |")
    assert len(rows) == len(cov) == 8
    wrong = []
    for row, c in zip(rows, cov):
        n = c["n"]
        want = ["tuning" if c["role"] == "tune" else "held out", c["shape"], f"{c['gamma']:g}", str(n),
                f"{c['mean_gamma_hat']:.3f}", f"{c['sd_gamma_hat']:.3f}", f"{c['median_width']:.3f}",
                f"{c['covered']}/{n} = {c['coverage']:.3f} ± {c['coverage_se']:.3f}", f"{c['covered_repeats_only'] / n:.3f}",
                f"{c['coverage_c0']:.3f}", f"{c['gamma_hat_exactly_zero']}/{n}", f"{c['min_width']:.3f}", f"{c['gof_rejected']}/{n}"]
        if row != want:
            wrong.append((row, want))
    assert wrong == []
    held = [c for c in cov if c["role"] == "held_out"]
    tune = [c for c in cov if c["role"] == "tune"]
    zero = [c for c in cov if c["gamma"] == 0]
    assert _missing("docs/sweeps_analysis.md", [
        f"brings the coverage to {min(c['coverage'] for c in held):.3f}–{max(c['coverage'] for c in held):.3f} on the held-out settings",
        f"(pooled {sum(c['covered'] for c in held)}/{sum(c['n'] for c in held)} = "
        f"{sum(c['covered'] for c in held) / sum(c['n'] for c in held):.3f}; tuning half "
        f"{sum(c['covered'] for c in tune)}/{sum(c['n'] for c in tune)} = "
        f"{sum(c['covered'] for c in tune) / sum(c['n'] for c in tune):.3f};",
        f"at the price of widths of {min(c['median_width'] for c in cov):.2f}–{max(c['median_width'] for c in cov):.2f}",
        f"γ̂ is exactly 0 in {sum(c['gamma_hat_exactly_zero'] for c in zero)} of the {sum(c['n'] for c in zero)} sweeps with γ = 0",
        f"narrowest interval of all sweeps is {min(c['min_width'] for c in cov):.3f} wide",
    ]) == []
    # "under floor drift and heavy-tailed noise they cover 0.59–0.85": repeats-only and c = 0
    shares = [c["covered_repeats_only"] / c["n"] for c in cov] + [c["coverage_c0"] for c in cov]
    assert _unquoted("docs/sweeps_analysis.md", [("they cover {}–{}", f"{min(shares):.3f}", f"{max(shares):.3f}")]) == []


def test_the_deformation_test_table_and_its_summaries_are_the_records():
    gof = _rec("collapse_gof_deformation.json")["summary"]["gof"]
    bound = _power_bound()
    rows = _doc_table("docs/sweeps_analysis.md", "| half | setting | collapses? |")
    assert len(rows) == len(gof) == 10
    wrong = []
    for row, g in zip(rows, gof):
        half, setting, collapses, n, rej, rate, med, spread, bnd, largest = row
        se = (g["rate"] * (1 - g["rate"]) / g["n"]) ** 0.5
        ok = (half == ("tuning" if g["role"] == "tune" else "held out") and setting == f"`{g['setting']}`"
              and collapses == ("yes" if g["collapse"] else "no") and n == str(g["n"]) and rej == str(g["rejected_at_0.05"])
              and rate == f"{g['rate']:.3f} ± {se:.3f}" and _agrees(med, g["median_p"]) and _agrees(spread, g["spread_rate"])
              and (bnd == "—" if g["collapse"] else bnd == bound[g["setting"]])
              and dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", largest)) == g["largest_of_rejected"])
        if not ok:
            wrong.append(row)
    assert wrong == []
    by = {g["setting"]: g for g in gof}
    nulls = [g for g in gof if g["collapse"]]
    tune = [by[k] for k in ("crossing", "exponents", "shapes")]
    accepted = sorted(1 - g["rate"] for g in nulls)
    assert _missing("docs/sweeps_analysis.md", [
        f"*Size.* {100 * accepted[0]:.0f}–{100 * accepted[-1]:.1f} % of true collapses are accepted on all three null settings "
        f"(rejected {min(g['rate'] for g in nulls):.3f}–{max(g['rate'] for g in nulls):.3f}",
        f"(median p {min(g['median_p'] for g in nulls):.2f}–{max(g['median_p'] for g in nulls):.2f}, not 0.5)",
        f"**{by['crossing']['rate']:.3f} on crossing curves**",
        f"on **{_pct(1 - by['crossing']['rate'], 1)}** of them (goal ≤ 10 %; the earlier test "
        f"{_pct(1 - by['crossing']['spread_rate'], 1)}",
        f"**{by['exponents']['rate']:.3f} ± {(by['exponents']['rate'] * (1 - by['exponents']['rate']) / 200) ** 0.5:.3f} "
        "on width-dependent "
        f"exponents** (the earlier test {by['exponents']['spread_rate']:.3f})",
        f"**{by['shapes']['rate']:.3f} on own shapes** ({by['shapes']['spread_rate']:.3f})",
        f"pooled {sum(g['rejected_at_0.05'] for g in tune)}/{sum(g['n'] for g in tune)} = "
        f"**{sum(g['rejected_at_0.05'] for g in tune) / sum(g['n'] for g in tune):.3f}**",
        f"({by['exponents']['rejected_at_0.05']} of {by['exponents']['n']}; 180 would be 0.90)",
        f"({by['amplitudes']['rate']:.2f} / {by['knee_tails']['rate']:.3f} / {by['one_width']['rate']:.3f} / "
        f"{by['shape_by_width']['rate']:.2f} against {by['amplitudes']['spread_rate']:.3f} / {by['knee_tails']['spread_rate']:.2f} / "
        f"{by['one_width']['spread_rate']:.3f} / {by['shape_by_width']['spread_rate']:.3f})",
        f"{by['knee_tails']['rate']:.3f} against a bound of {bound['knee_tails']}",
        f"{by['one_width']['rate']:.3f} against {bound['one_width']}",
        f"(bound {float(bound['shape_by_width']):.2f})",
        f"(false in {max(g['rate'] for g in nulls) * 100:.0f} % of true collapses)",
        f"On `exponents` it is {bound['exponents']}: the data held far more evidence than S used ({by['exponents']['spread_rate']:.3f})",
        f"rejected only {by['crossing']['spread_rate']:.3f} / {by['exponents']['spread_rate']:.3f} / {by['shapes']['spread_rate']:.3f} "
        "of the three mild non-collapses below",
    ]) == []
    # README: size and power in percent
    held = {k: by[k] for k in ("knee_tails", "shape_by_width")}
    pc = lambda x: f"{100 * x:.1f}"  # noqa: E731  (an exact half, 92.5 %, may print as 93 %)
    assert _unquoted("README.md", [
        ("size ({} % of true collapses accepted) and power ({}–{} % on the tuning designs, {} % and {} % on two held-out ones)",
         pc(1 - max(g["rate"] for g in nulls)), pc(min(g["rate"] for g in tune)), pc(max(g["rate"] for g in tune)),
         held["knee_tails"]["rate"] * 100, held["shape_by_width"]["rate"] * 100),
    ]) == []


def test_the_earlier_collapse_tests_rates_are_the_records():
    b200 = {g["setting"]: g for g in _rec("collapse_gof_b200.json")["summary"]["gof"]}
    b25 = {g["setting"]: g for g in _rec("collapse_coverage.json")["summary"]["gof"]}
    assert _missing("docs/sweeps_analysis.md", [
        f"accepted {_pct(1 - b200['collapse']['rate'], 1)} of exact collapses; rejected {b200['crossing']['rate']:.3f} of crossing "
        f"curves, {b200['exponents']['rate']:.3f} of width-dependent exponents, {b200['shapes']['rate']:.3f} of own shapes",
        f"study's own fits): {b25['collapse']['rate']:.3f} / {b25['crossing']['rate']:.3f} / {b25['exponents']['rate']:.3f} / "
        f"{b25['shapes']['rate']:.3f}",
        f"(median p {b200['collapse']['median_p']:.2f})",
    ]) == []


# ----------------------------------------------------------------------------- the double-descent study
def test_the_double_descent_study_prose_is_its_records():
    """README, the scorecard and docs/events.md quote the study's records: arms, epochs, seeds,
    first descents and the planted-ascent power."""
    import yaml

    study, adam, ema = (_rec(f) for f in ("double_descent_study.json", "double_descent_study_adam1000.json",
                                          "double_descent_study_sgdema1000.json"))
    raw = [r for r in study["runs"] if r["arm"].startswith("sgd_lr")]
    sgd_ema = [r for r in study["runs"] if r["arm"] == "sgd_ema_lr0.01"]
    running = lambda runs: sum(not r["first_descent"]["ended"] for r in runs)  # noqa: E731
    seeds = {a: sorted(r["seed"] for r in rec["runs"] if r["arm"] == a) for rec in (study, adam) for a in rec["arms"]}
    assert set(map(len, seeds.values())) == {3} and study["max_epochs"] == 500 and adam["max_epochs"] == ema["max_epochs"] == 1000
    lrs = sorted(float(a.split("lr")[1]) for a in study["arms"] if a.startswith("sgd_lr"))
    width = {r["power"]["width_epochs"] for rec in (study, adam, ema) for r in rec["runs"]}
    assert width == {60}
    raw_height = {v["detectable"]["height"] for a, v in study["verdicts"].items() if a.startswith("sgd_lr")}
    assert raw_height == {3.2}
    ends = sorted(r["first_descent"]["epoch"] for r in adam["runs"] if r["first_descent"]["ended"])
    assert _missing("README.md", [
        f"SGD at three learning rates ({study['max_epochs']} epochs), SGD through an EMA and Adam + EMA "
        f"({adam['max_epochs']} epochs), 3 seeds each, M = 2048",
        f"would have seen a {width.pop()}-epoch ascent",
    ]) == []
    assert _missing("docs/scorecard.md", [
        f"lr {' / '.join(f'{x:g}' for x in lrs)}",
        f"for {study['max_epochs']} epochs and Adam + EMA for {adam['max_epochs']}",
        f"{running(raw)} of the {len(raw)} raw-SGD runs, the {running(sgd_ema)} SGD + EMA runs and {running(adam['runs'])} of "
        f"the {len(adam['runs'])} Adam runs have not finished their first descent",
        "a planted 60-epoch ascent of 0.2",
        f"only an ascent about E_gen's own size (height {raw_height.pop():g})",
    ]) == [] and running(sgd_ema) == len(sgd_ema)
    assert _missing("docs/events.md", [
        f"lr {', '.join(f'{x:g}' for x in lrs)}, momentum 0.9",
        f"3 seeds each, {study['max_epochs']} epochs): no seed shows a double descent",
        "confirmed in most placements only at height 3.2",
        f"Two seeds end their first descent (at epochs {ends[1]} and {ends[0]}) and the third is still in it at epoch {adam['max_epochs']}",
    ]) == [] and len(ends) == 2
    assert all("'name': 'double_descent'" not in str(r["events"]) for rec in (study, adam, ema) for r in rec["runs"])
    # the study's set-up table: the shipped config
    cfg = yaml.safe_load((ROOT / "lightning_pfd/configs/experiments/double_descent_study.yaml").read_text())
    net, data = cfg["model"]["init_args"]["net"]["init_args"], cfg["data"]["init_args"]
    from lightning_pfd.nets import MLPNet

    size = sum(p.numel() for p in MLPNet(**net).parameters()) / 1e6
    assert _missing("docs/events.md", [
        f"residual MLP hidden {net['hidden']}, depth {net['depth']}, **{cfg['model']['init_args']['family'].upper()}**-preconditioned "
        f"({size:.2f}M)",
        f"| {data['n_train']}, {cfg['trainer']['max_epochs']}, {data['batch_size']} "
        f"({data['n_train'] // data['batch_size']} steps per epoch) |",
    ]) == []
    assert _missing("docs/scorecard.md", [f"VP MLP {size:.2f}M, GMM-digits teacher, N = {data['n_train']}"]) == []


# ----------------------------------------------------------------------------- ICREarlyStopping's rise test
def test_the_icr_early_stopping_tables_are_the_v3_record():
    v3, v2 = _rec("icr_early_stopping_v3.json"), _rec("icr_early_stopping_v2.json")
    splits = {f: "tuning" for f in v3["tuning_families"]}
    for key, label in (("held_out_families", "held out (seen four times)"), ("second_held_out_families", "held out (seen three times)"),
                       ("third_held_out_families", "held out (seen twice)"), ("fourth_held_out_families", "held out, new")):
        splits.update({f: label for f in v3[key]})
    rows = _doc_table("docs/icr.md", "| family | split | stops at z = 2")
    zs = ("z=2", "z=2.5", "z=3")
    want = [[f, splits[f]] + [f"{r[z]['stops']}/{r[z]['runs']} ({100 * r[z]['wilson95_upper']:.1f} %)" for z in zs]
            + [f"{r['z=3']['previous_rule']}/{r['z=3']['runs']}"] for f, r in v3["nulls"].items()]
    assert rows == want
    u_rows = _doc_table("docs/icr.md", "| U-shape / noise |")
    u_want = []
    for name, r in v3["u_shapes"].items():
        shape, noise = name.split("/")
        n, m, rise = r["n"], r["true_min"], r["rise"]
        cells = []
        for z in zs:
            c, q = r[z], r[z]["delay_quartiles"]
            delay = "" if not c["stopped"] else f", {c['before_min']}, {q[0]:g} / {q[1]:g} / {q[2]:g}"
            cells.append(f"{c['stopped']}/{c['runs']}{delay}")
        old = v2["u_shapes"][name]["z=3"]
        u_want.append([f"{n} checks, min at {m}, rise {rise:g} / `{noise}`", *cells, f"{old['stopped']}/{old['runs']}"])
    assert u_rows == u_want
    nulls = v3["nulls"].values()
    prev = [r["z=3"]["previous_rule"] / r["z=3"]["runs"] for r in nulls]
    z2 = max(r["z=2"]["stops"] for r in nulls)
    assert {r["z=3"]["stops"] for r in nulls} == {0} and {r["z=3"]["runs"] for r in nulls} == {300}
    tenfold = [r for name, r in v3["u_shapes"].items() if r["rise"] == 0.1 and name.endswith("/white")]
    stopped3 = [r["z=3"]["stopped"] for r in tenfold]
    old3 = [v2["u_shapes"][n]["z=3"]["stopped"] for n, r in v3["u_shapes"].items() if r["rise"] == 0.1 and n.endswith("/white")]
    delays = [q for r in tenfold for q in r["z=3"]["delay_quartiles"]]
    trainer = v3["trainer"]
    assert _missing("docs/icr.md", [
        f"The previous rule stopped {100 * min(prev):.0f}–{100 * max(prev):.0f} % of flat runs at z = 3",
        f"stops **0/300 runs on every one of the {len(v3['nulls'])} families** (Wilson upper bound "
        f"{100 * max(r['z=3']['wilson95_upper'] for r in nulls):.1f} % each)",
        f"at z = 2 it stops at most {z2}/300 ({100 * z2 / 300:.1f} %, a random walk plus white training noise)",
        f"is detected in {min(stopped3)}–{max(stopped3)} of 50 runs without training noise (the second version: "
        f"{min(old3)}–{max(old3)}), {min(delays):g}–{max(delays):g} checks after the minimum",
        f"in {trainer['white']['callback_equals_pure_rule']}/{trainer['white']['runs']} `white` and "
        f"{trainer['growing']['callback_equals_pure_rule']}/{trainer['growing']['runs']} `growing` runs "
        f"({trainer['white']['stops']} stops each",
        f"All {len(v3['nulls'])} families, third version",
        f"0 of 300 flat runs on each of the {len(v3['nulls'])} null families",
        f"(the previous rule: {100 * min(prev):.0f}–{100 * max(prev):.0f} %)",
        f"this page's table: {100 * min(prev):.0f}–{100 * max(prev):.0f} % of runs per null family at z = 3",
    ]) == [] and [r["stops"] for r in trainer.values()] == [0, 0]
    assert [f for f, r in v3["nulls"].items() if r["z=2"]["stops"] == z2] == ["walk_white"]
    assert _missing("README.md", [f"stops a flat ICR in 0 of 300 runs on each of {len(v3['nulls'])} null families"]) == []
    assert _missing("docs/scorecard.md", [
        f"0/300 false stops on each of {len(v3['nulls'])} null families",
        f"a 10-s.e. rise detected in {min(stopped3)}–{max(stopped3)} of 50 runs",
        f"(patience and a paired z ≥ 3: {100 * min(prev):.0f}–{100 * max(prev):.0f} % of null runs)",
    ]) == []


def test_the_icr_early_stopping_real_run_is_the_record():
    """The 30-epoch level-1 U-Net run of docs/icr.md and the scorecard: its record in
    icr_early_stopping_v2.json / _v3.json."""
    v2, v3 = _rec("icr_early_stopping_v2.json")["real_run"], _rec("icr_early_stopping_v3.json")["real_run"]
    icr, se = v3["icr"], v3["se"]
    mem = {int(k): v for k, v in v2["mem_ratio"].items()}
    plateau = icr[2:13]  # epochs 2–12
    late = icr[16:]  # the level the rise reaches (epochs 16–29)
    wall = re.search(r"# (\d+ min \d+ s)", v2["fit_command"]).group(1)
    assert v3["min_epoch"] == 1 and len(v3["epochs"]) == 30
    assert {z for k in ("z=2", "z=2.5", "z=3") for z in v3[k]["z_at_block_ends"] if z is not None} == {0.0}
    assert _missing("docs/icr.md", [
        f"ICR {icr[0]:.3f} at epoch 0, minimum {min(icr):.3f} at epoch {v3['min_epoch']}, a plateau at "
        f"{min(plateau):.2f}–{max(plateau):.2f}, a rise to {min(late):.2f}–{max(late):.2f} from epoch 13 on, "
        f"memorization ratio ≥ 0.05 from epoch {v3['mem_onset_0.05']}",
        f"se(ICR) {min(se):.2f}–{max(se):.2f} per value",
        f"the memorization ratio reaches 0.05 at epoch {v2['mem_onset_0.05']} and {mem[29]:.2f} at epoch 29",
        "`icr/rise_z` = NaN at epoch 5 (undecided: too few checks) and **0 at every later block end**, `icr/stop_epoch` = −1",
        f"`fit --config lightning_pfd/configs/experiments/icr_unet_small.yaml --trainer.max_epochs 30`, "
        f"{wall} on 2",
    ]) == []
    assert v2["callback_logged"]["icr/stop_epoch"] == -1 and "NaN at epoch 5" in v2["callback_logged"]["icr/rise_z"]
    assert _missing("docs/scorecard.md", ["the U-Net run in 30 epochs", "`icr/stop_epoch` −1"]) == []


def test_the_mlp_icr_dynamics_tables_and_prose_are_the_record():
    """docs/icr.md's superseded MLP experiment: icr_dynamics.json."""
    rec = _rec("icr_dynamics.json")
    small, large = rec["runs"]
    rows = _doc_table("docs/icr.md", "| epoch | N=200 ICR |")
    want = []
    for a, b in zip(small["epochs"], large["epochs"]):
        ia = f"{a['icr/icr']:.4f}"
        ib = f"{b['icr/icr']:.4f}"
        want.append([str(a["epoch"]), ia, f"{a['icr/trace_s']:.4f}", f"{a['icr/trace_xi']:.4f}", f"{a['mem/ratio']:.3f}",
                     ib, f"{b['icr/trace_s']:.4f}", f"{b['icr/trace_xi']:.4f}", f"{b['mem/ratio']:g}"])
    assert rows == want
    for run, row in zip(rec["runs"], _doc_table("docs/icr.md", "| run | n (images) |")):
        s = run["summary"]
        assert row[:5] == [f"N = {run['n_train']}", str(s["n"]), str(s["d"]),
                           f"{s['icr_min_epoch']}" + (" (last)" if s["icr_min_epoch"] == len(run["epochs"]) - 1 else ""),
                           f"{s['icr_first']:.4f} → {s['icr_min']:.4f} → {s['icr_last']:.4f}"], row
        assert row[6] == f"{s['mem_last']:.3f}"
        onset = s["mem_onset_epoch"]
        if onset is None:
            assert row[5] == "none"
        else:
            ep = {e["epoch"]: e["mem/ratio"] for e in run["epochs"]}
            assert row[5] == f"{onset} ({ep[onset]:.3f}; {ep[onset - 1]:.3f} at epoch {onset - 1})"
    a = rec["args"]
    xi = [e["icr/trace_xi"] for e in small["epochs"]]
    flat = [e["icr/icr"] for e in small["epochs"][6:]]
    assert _missing("docs/icr.md", [
        f"hidden {a['hidden']}, depth {a['depth']}, Adam 1e-3, EMA {a['ema']}, batch {a['batch_size']}",
        f"{a['epochs']} epochs × {a['steps_per_epoch']} steps ({a['epochs'] * a['steps_per_epoch']:,} steps)".replace(",", " "),
        f"on N = {a['n_limited']} (data-limited) and N = {a['n_rich']} (data-rich)",
        f"a fixed {a['icr_images']}",
        f"d = {a['d_proj']} (n/d = {small['summary']['n'] / a['d_proj']:.2f} resp. {large['summary']['n'] // a['d_proj']})",
        f"{a['views']} view pairs per image",
        f"memorization ratio of {a['mem_samples']} Heun-18 samples",
        f"{small['seconds']:.0f} s + {large['seconds']:.0f} s wall",
        f"rising steadily to {small['summary']['mem_last']:.2f}",
        f"ICR falls from {small['summary']['icr_first']:.3f} to ≈ {small['epochs'][6]['icr/icr']:.3f} by epoch 6 and then stays flat "
        f"within ±{(max(flat) - min(flat)) / 2:.3f}",
        f"its nominal minimum at epoch {small['summary']['icr_min_epoch']}",
        f"({large['summary']['icr_first']:.3f} → {large['summary']['icr_min']:.3f})",
        f"(Tr Σ_ξ from {xi[0]:.2f} to {xi[-1]:.2f} for N = {a['n_limited']})",
        f"covers only {a['epochs'] * a['steps_per_epoch']:,} steps".replace(",", " "),
    ]) == []


# ----------------------------------------------------------------------------- docs/events.md: the calibration records
def _cal(version: str) -> dict:
    return _rec("calibrate_events.json" if not version else f"calibrate_events_{version}.json")


def _counts(r: dict):
    return r["any_confirmed"], {e: v["confirmed"] for e, v in r["events"].items() if v["confirmed"]}


def test_the_first_calibration_tables_are_their_record():
    rec = _cal("")
    nulls = _doc_table("docs/events.md", "| null family (500 evaluations) |")
    cell = lambda r: f"{r['events']}/{r['runs']} ({100 * r['rate']:.1f} %, 95 % CI ≤ {100 * r['ci95'][1]:.1f} %)"  # noqa: E731
    assert nulls == [[name, cell(r["early_learning"]), cell(r["double_descent"])] for name, r in rec["nulls"].items()]
    power = _doc_table("docs/events.md", "| power: planted height → |")
    header = [ln for ln in (ROOT / "docs/events.md").read_text().splitlines() if ln.startswith("| power: planted height → |")][0]
    hs = [c.strip() for c in header.strip("|").split("|")][1:]
    assert power == [[name] + [f"{100 * r[h]['rate']:.0f} %" for h in hs] for name, r in rec["power"].items()]
    p = rec["power"]
    runs = {r["runs"] for v in rec["nulls"].values() for r in v.values()}
    assert _missing("docs/events.md", [
        f"min_sigma {rec['min_sigma']:g} (3.0 without per-unit records)",
        f"300 runs per null, 100 per planted height; {rec['wall_s'] / 60:.0f} min on 2 cores",
        f"are met: early learning {100 * p['early_learning, seed flips M = 2048']['0.2']['rate']:.0f} %, double descent "
        f"{100 * p['double_descent, seed flips M = 2048']['0.2']['rate']:.0f} %",
        f"a planted height of 0.2 is found in {100 * p['early_learning, seed flips M = 256']['0.2']['rate']:.0f} % / "
        f"{100 * p['double_descent, seed flips M = 256']['0.2']['rate']:.0f} % of runs",
    ]) == [] and runs == {rec["runs"]} == {300}


def test_the_v3_to_v5_calibration_records_and_their_prose():
    import calibrate_events as ce  # experiments/

    v2, v3, big, v4, v5 = (_cal(v) for v in ("v2", "v3", "v3_large", "v4", "v5"))
    merged = {f: big["nulls"].get(f, r) for f, r in v3["nulls"].items()}  # the four M > 1024 families at 300 runs
    text = (ROOT / "docs/events.md").read_text()
    assert "\n" + ce.null_table(merged, "held_out") + "\n\n**What holds and what does not.**" in text
    assert {r["runs"] for r in merged.values()} == {300}
    assert "\n" + ce.power_table(v2["power"]) + "\n" in text  # the v2 power table
    # v3's prose
    rate = {f: r["any_confirmed"] for f, r in merged.items()}
    upper = sorted(100 * r["ci95"][1] for r in merged.values())
    od = merged["ratio_overdispersed_grow"]
    assert _missing("docs/events.md", [
        f"Every one of the {len(merged)} held-out families gives **at most 2 %** false events per run "
        f"({min(rate.values())}–{max(rate.values())} of 300)",
        f"(`ar1_grow2.5_m2048`, {rate['ar1_grow2.5_m2048']}/300 = {100 * rate['ar1_grow2.5_m2048'] / 300:.1f} %",
        f"(`ar1_grow10_m256`, {100 * rate['ar1_grow10_m256'] / 300:.1f} %), smooth noise (`smooth_l8_m256`, "
        f"{100 * rate['smooth_l8_m256'] / 300:.1f} %), E_gen/E_mem-only runs ({rate['e_only_ar1_m2048']}/300",
        f"≤ 4 % on {sum(u <= 4 for u in upper)} families and **{upper[-1]:.1f} % on one**",
        f"(`ratio_overdispersed_grow`, {od['any_confirmed']}/300 = {100 * od['rate']:.1f} %: "
        f"{od['events']['early_learning']['confirmed']} early learning, {od['events']['icr_minimum']['confirmed']} ICR minimum, "
        f"{od['events']['memorization_onset']['confirmed']} onsets)",
        f"is met on {sum(u <= 4 for u in upper)} of {len(merged)}",
        f"calibrate_events_v3.json` / `.md` ({v3['wall_s'] / 60:.1f} min)",
        f"the same seeds for the first 100; {big['wall_s'] / 60:.1f} min)",
    ]) == [] and max(rate.values()) / 300 <= 0.02
    # v4: the binomial floor changes no count; the onset power
    assert {f: _counts(r) for f, r in v4["nulls"].items()} == {f: _counts(r) for f, r in v3["nulls"].items()}
    onset = [r["planted"]["found"] for r in _cal("v4_onset_power")["power"]]
    onset_v2 = [r["planted"]["found"] for r in v2["power"] if r["event"] == "memorization_onset"]
    assert _missing("docs/events.md", [
        f"**all {len(v4['nulls'])} families give exactly the v3 counts**",
        f"{', '.join(map(str, onset[:-1]))} and {onset[-1]} of 40 on the four power families (v3: {', '.join(map(str, onset_v2))})",
    ]) == []
    # v5: the extent rule
    same = [f for f in v4["nulls"] if _counts(v4["nulls"][f]) == _counts(v5["nulls"][f])]
    lost = {f: (_counts(v4["nulls"][f]), _counts(v5["nulls"][f])) for f in v4["nulls"] if f not in same}
    assert sorted(lost) == ["ar1_grow10_m256", "short_t40_ar1"] and all(after[0] == 0 for _, after in lost.values())
    p5 = {(r["event"], r["family"], r["num_seeds"]): r["planted"]["found"] for r in _cal("v5_power")["power"]}
    p2 = {(r["event"], r["family"], r["num_seeds"]): r["planted"]["found"] for r in v2["power"]}
    changed = [k for k in p5 if p5[k] != p2[k]]
    assert changed == [("double_descent", "fgn_h0.8_m1024", 256)]
    dd2048 = [p5[("double_descent", f, 2048)] for f in ("seed_flip_m2048", "ar1_grow2.5_m2048", "heavy_d2_m1024", "fgn_h0.8_m1024")]
    (b, a), (b2, _) = lost["ar1_grow10_m256"], lost["short_t40_ar1"]
    assert _missing("docs/events.md", [
        f"every one of the {len(p5)} cells (2 events × 4 power families × M = 2048 / 256)",
        f"`fgn_h0.8_m1024` at M = 256, {p5[changed[0]]}/40 (was {p2[changed[0]]}/40); e.g. double descent at M = 2048: "
        f"{', '.join(map(str, dd2048))} of 40",
        f"(`calibrate_events_v5.json` / `.md`, {v5['wall_s'] / 60:.0f} min",
        f"**{len(same)} of the {len(v4['nulls'])} families give exactly the v4 counts",
        f"`ar1_grow10_m256` 0/300 (v4: {b[0]}, early learning {b[1]['early_learning']} and ICR minimum {b[1]['icr_minimum']})",
        f"`short_t40_ar1` 0/300 (v4: {b2[0]} early learning)",
    ]) == [] and b2[1] == {"early_learning": b2[0]}


def test_the_v2_calibration_prose_is_its_records():
    v2, tune = _cal("v2"), _cal("v2_tune")
    pct = {f: r["any_confirmed"] / r["runs"] for f, r in v2["nulls"].items()}
    worst = sorted(tune["nulls"].values(), key=lambda r: -r["any_confirmed"])[:2]
    p = {(r["event"], r["family"]): r["planted"]["power"] for r in v2["power"] if r["num_seeds"] == 2048}
    common = [p[(e, f)] for e in ("early_learning", "double_descent") for f in ("ar1_grow2.5_m2048", "fgn_h0.8_m1024")]
    small = [r["planted"]["power"] for r in v2["power"] if r["num_seeds"] == 256 and r["event"] in ("early_learning", "double_descent")]
    od = v2["nulls"]["ratio_overdispersed_grow"]
    assert _missing("docs/events.md", [
        f"(held-out, {v2['wall_s'] / 60:.1f} min, on a loaded machine) and `calibrate_events_v2_tune.json` / `.md` (tune, "
        f"{tune['wall_s'] / 60:.1f} min): at {v2['runs']} runs ({v2['runs_large']} with M > 1024) "
        f"{sum(v <= 0.01 for v in pct.values())} of {len(pct)} held-out families gave at most 1 % and "
        f"`ratio_overdispersed_grow` {od['any_confirmed']}/{od['runs']}",
        f"the worst were `{worst[0]['family']}` and `{worst[1]['family']}` ({worst[0]['any_confirmed']}/{worst[0]['runs']} each)",
        f"early learning reaches it on two families (seed flips {100 * p[('early_learning', 'seed_flip_m2048')]:.0f} %, heavy-tailed d² "
        f"{100 * p[('early_learning', 'heavy_d2_m1024')]:.0f} %), double descent on one (seed flips "
        f"{100 * p[('double_descent', 'seed_flip_m2048')]:.0f} %)",
        f"costs most of the power: {100 * min(common):.0f}–{100 * max(common):.0f} %",
        f"a height of 0.2 is found in {100 * min(small):.0f}–{100 * max(small):.0f} % of runs",
    ]) == []
    third = sorted(tune["nulls"].values(), key=lambda r: -r["any_confirmed"])[2]
    assert worst[0]["any_confirmed"] == worst[1]["any_confirmed"] > third["any_confirmed"]  # "the worst were" two
    reach = lambda event: sum(v >= 0.8 for k, v in p.items() if k[0] == event)  # noqa: E731
    assert reach("early_learning") == 2 and reach("double_descent") == 1


def test_the_v7_prose_outside_the_generated_block_is_the_record():
    """The v7 paragraph and README's sentence: counts, Wilson bounds and power cells not yet
    behind a marker."""
    v7, v6, v5p = _cal("v7"), _cal("v6"), _cal("v5_power")
    nulls = v7["nulls"]
    heavy = [nulls[f] for f in ("heavy_t_m1024", "heavy_t_spikes_m1024")]
    spikes = [nulls[f] for f in ("spike_big_m2048", "spike_white_m1024", "ema_spike_m256")]
    sched = [r for r in nulls.values() if r["structure"] in ("tails", "schedule") and r not in heavy]
    longs = [r for f, r in nulls.items() if r["structure"] == "long"]
    ci = {tuple(f"{100 * x:.1f}" for x in r["ci95"]) for r in heavy}
    p5 = {(r["event"], r["family"], r["num_seeds"]): r["planted"]["found"] for r in v5p["power"]}
    assert len(ci) == 1 and {r["any_confirmed"] for r in spikes} == {0} and all(r["rate"] <= 0.02 for r in longs)
    lo, hi = ci.pop()
    assert _missing("docs/events.md", [
        f"On the {len(v6['nulls'])} families of v6 every count is v6's",
        f"give {min(r['any_confirmed'] for r in sched)}–{max(r['any_confirmed'] for r in sched)} false events of 300",
        "(`spike_big_m2048`, `spike_white_m1024`, `ema_spike_m256`: 0/300)",
        f"{heavy[0]['any_confirmed']}/300 = {100 * heavy[0]['rate']:.1f} % each, Wilson [{lo}, {hi}] %",
        f"for double descent on `fgn_h0.8_m1024`, v5: {p5[('double_descent', 'fgn_h0.8_m1024', 2048)]}/40",
        f"on the {len(nulls)} held-out families, now including three long-run families",
        "**every family at 300 runs**",
    ]) == [] and {r["runs"] for r in nulls.values()} == {300} and len(longs) == 3
    assert {r["any_confirmed"] for r in heavy} == {heavy[0]["any_confirmed"]}


def test_the_summary_and_readme_sentences_are_the_v8_record():
    """The Summary of docs/events.md and README's sentence: 300 runs each, 0 of 300 on the spike
    families (calibrate_events_v8.json)."""
    nulls = _cal("v8")["nulls"]
    assert {r["runs"] for r in nulls.values()} == {300}
    assert {nulls[f]["any_confirmed"] for f in ("spike_big_m2048", "spike_white_m1024", "ema_spike_m256")} == {0}
    for page in ("docs/events.md", "README.md"):
        assert _missing(page, ["300 runs each"]) == [], page
    assert _missing("README.md", ["(0 of 300 with one-epoch spikes, raw or through an EMA)"]) == []
    assert _missing("docs/events.md", ["0 of 300 on the spike families"]) == []


def test_the_event_rules_quoted_are_the_codes_constants():
    """README and docs/events.md quote the detectors' constants; they are the code's."""
    from lightning_pfd.analysis import events as ev, inference as inf

    assert (ev.MIN_SIGMA, ev.SELECTION_ALLOWANCE, ev.SELF_SELECTION_ALLOWANCE) == (2.5, 1.0, 1.5)
    assert inf.MAX_TAIL_SHARE == 0.5  # "more than half of their sum"
    share, cap = f"{100 * ev.MIN_EXTENT_SHARE:g} %", ev.MIN_EXTENT_CAP
    assert _missing("README.md", [f"(max(2·window + 1, min({share} of the run, {cap})) evaluations)"]) == []
    assert _missing("docs/events.md", [
        f"Every leg needs z ≥ `min_sigma` = {ev.MIN_SIGMA:g}",
        f"the training part on a held-out half (A = {ev.SELECTION_ALLOWANCE:.1f}), all of it without one "
        f"(A = {ev.SELF_SELECTION_ALLOWANCE:.1f})",
        f"`min_extent` = max(2·`window` + 1, min({share} of the run's evaluations, {cap})) evaluations",
        f"{ev.min_extent(24, 3)} on the quickstart's 24, {ev.min_extent(500, 5)} on a 500-epoch run",
        f"a 1000-epoch run asked {round(ev.MIN_EXTENT_SHARE * 1000)}",
        f"at least {ev.TRANSIENT_PEAK_SIGMA:g} noise units tall",
        f"by more than {inf.JUMP_SIGMA:g} robust units",
        f"(MAD; at least {100 * inf.JUMP_FLOOR:g} % of the curve's level",
        f"a step to each of at least {inf.JUMP_CONCENTRATION:g} of that excess",
        f"more than {inf.JUMP_TAIL_SIGMA:g} units above the level before it",
        f"jumps on more than {100 * inf.MAX_JUMP_SHARE:g} % of the evaluations",
        "more than half of their sum",
        f"(the leading stretch beyond {inf.TRANSIENT_SIGMA:g} MAD units",
        f"only for a ≤ {inf.CONCAVE_A:g}",
        f"for â ≥ {inf.MAX_SHAPE_EXPONENT:g}",
        f"segments of max({inf.MIN_SEGMENT}, T/4,",
        f"exp({inf.LOCAL_SHRINK:g}·sd(log r))",
        f"events last `min_extent` = {ev.min_extent(500, 5)} evaluations) |",
        f"on a 10-measurement trial an event's rise must span `min_extent` = 2·window + 1 = {ev.min_extent(10, 3)} evaluations",
    ]) == []
    # the power-law bound: 15 − 6·2^a + 3^a = 4 at a = CONCAVE_A (to its printed digits)
    assert abs(15 - 6 * 2 ** inf.CONCAVE_A + 3 ** inf.CONCAVE_A - 4) < 0.02


# ----------------------------------------------------------------------------- per-trial events of the sweep
def test_the_sweeps_per_trial_event_prose_is_the_records():
    k3, old = _rec("mtog_digits_k3_events.json"), _rec("mtog_digits_events.json")

    def evs(rec, name):
        return [(t, e) for t in rec["trials"] for e in t["events"] if e["name"] == name]

    el, mo = evs(k3, "early_learning"), evs(k3, "memorization_onset")
    gone = [(t, e) for t, e in evs(old, "early_learning") if t["trial"] not in {u["trial"] for u, _ in el}]
    assert {t["trial"] for t, _ in el} == {f"n_train=64-hidden=128-seed={s}" for s in range(3)}
    assert {(t["n_train"], t["model"]) for t, _ in mo} <= {(n, m) for n in (32, 64, 128, 256) for m in ("hidden=128", "hidden=256")}
    assert not [t for t in k3["trials"] if t["events"] and t["n_train"] >= 512]
    assert sorted((t["trial"], e["epoch"]) for t, e in evs(old, "memorization_onset")) == sorted(
        (t["trial"], e["epoch"]) for t, e in mo if t["seed"] < 2)  # "the memorization onsets are identical"
    desc = {(t["n_train"], t["model"]): f"{e['z']:.1f}" for t, e in gone}
    assert len(gone) == 4 and _missing("docs/events.md", [
        f"four early learnings are gone (N = 32 hidden 64, z {desc[(32, 'hidden=64')]}; N = 128 and 256 hidden 128, z "
        f"{desc[(128, 'hidden=128')]} and {desc[(256, 'hidden=128')]}; N = 512 hidden 256, z {desc[(512, 'hidden=256')]})",
    ]) == []
    assert len({(t["settings"]["window"], t["settings"]["confirm"]) for t in k3["trials"]}) == 1
    w = k3["trials"][0]["settings"]
    assert _missing("docs/events.md", [f"RegimeMonitor window {w['window']} / confirm {w['confirm']}"]) == []
    zs = lambda pairs: _range([e["z"] for _, e in pairs], lambda z: f"{z:.1f}")  # noqa: E731
    assert _missing("docs/scorecard.md", [
        f"(the {len(k3['trials'])} trials of K = 3, 10 measurements each",
        f"early learning appears at the transition of the 0.19M model (N = 64, all {len(el)} repeats, held-out z {zs(el)})",
        f"memorization onset at small N for the two widest models ({len(mo)} trials, z {zs(mo)})",
        "four early learnings of the earlier record are gone",
    ]) == []


# ----------------------------------------------------------------------------- docs/reliability.md: the battery
def test_the_battery_table_and_problem_list_are_the_record():
    """Between the ``battery:table`` and ``battery:problems`` markers docs/reliability.md holds
    table_md / problems_md of bad_input_battery.json (the summary line is checked in
    tests/test_quoted_numbers.py), and the fault notes quote the record's cases."""
    import bad_input_battery as bb  # experiments/

    cases = _rec("bad_input_battery.json")["cases"]
    text = (ROOT / "docs/reliability.md").read_text()
    for name, body in (("table", bb.table_md(cases)), ("problems", bb.problems_md(cases))):
        got = text.split(f"<!-- battery:{name}:start -->\n", 1)[1].split(f"\n<!-- battery:{name}:end -->", 1)[0]
        assert got == body, name
    by = {c["id"]: c for c in cases}
    f07 = by["fault-07"]
    assert f07["rc"] == 2 and _missing("docs/reliability.md", [f"| fault-07 | `sweep --address 127.0.0.1:1` (nothing listens) | "
                                                               f"exit {f07['rc']} in {f07['seconds']:.1f} s"]) == []
    assert by["fault-01"]["rc"] == 143 and by["work-02"]["rc"] == 143


# ----------------------------------------------------------------------------- ICR on the U-Net: numbers outside the icr: markers
def test_the_icr_unet_set_up_and_sweep_grid_quoted_are_the_record():
    rec = _rec("icr_unet.json")
    small, large = rec["runs"]["small"], rec["runs"]["large"]
    n_ep = len(small["epochs"])
    sigmas = [row["sigma"] for row in rec["sweeps"]["large_last"]["rows"]]
    best_probe = max(rec["sweeps"]["large_last"]["rows"], key=lambda row: row["probe_acc"])
    seeds = len(small["rise_vs_spread"]["paired_rise_by_seed"])
    assert n_ep == len(large["epochs"]) == 20 and seeds == 4
    assert {row["sigma"] for s in rec["sweeps"].values() for row in s["rows"]} == set(sigmas)
    g = lambda x: f"{x:g}"  # noqa: E731
    for page in ("docs/scorecard.md", "docs/icr.md"):
        grid = [f"probe peaks at σ = {g(best_probe['sigma'])}", f"at σ = {g(sigmas[0])}", f"at σ = {g(sigmas[-1])}"]
        assert _missing(page, grid) == [], page
    assert _missing("docs/scorecard.md", [
        f"N = 64 / 1024, {n_ep} epochs, level 3",
        f"at epoch {n_ep - 1}, a rise of",
        f"{seeds} seeds of views + projection", f"positive for {small['rise_vs_spread']['paired_rise_positive_seeds']} of {seeds}",
        f"never stops the {n_ep}-epoch level-3 record", f"over {n_ep} epochs",
    ]) == []
    assert _missing("docs/icr.md", [
        f"{len(sigmas)} σ from {g(sigmas[0])} to {g(sigmas[-1])}",
        f"{n_ep} epochs × 75 steps × batch 64 ({n_ep * 75} steps, {n_ep * 75 * 64 // 1000} k images seen)",
        f"Re-measured with {seeds} view seeds", f"with {seeds} monitor seeds", f"over {n_ep} epochs",
    ]) == []


# ----------------------------------------------------------------------------- docs/levy.md: the PITE records
_TOKEN = re.compile(r"[+−-]?(?:\d{1,3}(?: \d{3})+|\d+)(?:\.\d+)?(?:e[+−-]?\d+)?")


def _close(doc: str, value: float) -> bool:
    """``doc`` is ``value`` rounded to the digits it prints (either way at an exact half):
    12.9, 1.4e5 (a mantissa's digits), 11 560 (a space between thousands; an integer's trailing
    zeros from its fourth digit on are not significant)."""
    doc = doc.replace("−", "-").replace(" ", "")
    mant, _, exp = doc.partition("e")
    k = len(mant.split(".")[1]) if "." in mant else 0
    if not k and not exp and len(mant.lstrip("+-")) >= 4:
        k = -(len(mant) - len(mant.rstrip("0")))
    scale = 10.0 ** int(exp or 0)
    return abs(value / scale - float(mant)) <= 0.5 * 10 ** -k * (1 + 1e-9)


def _cell_is(cell: str, values) -> bool:
    """Every number of a table cell, in order, is the matching value (:func:`_close`)."""
    toks = _TOKEN.findall(cell)
    return len(toks) == len(values) and all(_close(t, v) for t, v in zip(toks, values))


def _pite_table_mismatches(page: str, header_start: str, rows: dict, header_has: str = "") -> list:
    """Cells of the page's table whose numbers are not the record's: ``rows`` = {row label:
    [values per column]} (a column's list of numbers, or None for a cell without numbers)."""
    wrong = []
    table = {r[0]: r[1:] for r in _doc_table(page, header_start, header_has)}
    assert set(rows) <= set(table), sorted(set(rows) - set(table))
    for label, cols in rows.items():
        for cell, values in zip(table[label], cols):
            if values is not None and not _cell_is(cell, values):
                wrong.append((label, cell, values))
        assert len(table[label]) >= len(cols), label
    return wrong


def _summ(rec: dict, row: str, metric: str, obs: str = "max"):
    s = rec["summary"][obs][row][metric]
    return [s["mean"], s["sd"], s["min"], s["max"]]


def test_the_pite_v4_tables_are_the_record():
    rec = _rec("pite_v4.json")
    rows, fl = rec["rows"], rec["floor"]["max"]
    assert rows == ["sbm_edm", "lim", "lim_ref", "lim_x0A"] and rec["train_seeds"] == [0, 1, 2, 3, 4]
    s = lambda m: [_summ(rec, r, m) for r in rows]  # noqa: E731
    share = [[100 * rec["summary"]["max"][r]["rmsqe_top_share"][k] for k in ("min", "max")] for r in rows]
    above = [[100 * rec["summary"]["max"][r]["above_range"]["mean"]] for r in rows]
    assert _pite_table_mismatches("docs/levy.md", "| metric (mean ± sd [min, max]) |", {
        "RMSQE (η = 0.975)": s("rmsqe") + [[fl["rmsqe"]]],
        "RMSQE, samples clipped to the data range": s("rmsqe_clipped") + [[fl["rmsqe"]]],
        "LOADER": s("loader") + [[fl["loader"]]],
        "bulk QE": s("bulk_qe") + [[fl["bulk_qe"]]],
        "share of RMSQE from its largest sample": share,
        "samples with a value above the data range": above,
    }) == []
    c = rec["claims"]["max"]
    claim_rows = {"LIM better in RMSQE": "lim_rmsqe", "LIM better in clipped RMSQE": "lim_rmsqe_clipped",
                  "LIM better in LOADER": "lim_loader", "SBM better in the bulk": "sbm_bulk"}
    table = {r[0]: r[1:] for r in _doc_table("docs/levy.md", "| claim (row vs SBM-EDM) |")}
    wrong = []
    for label, key in claim_rows.items():
        for cell, suffix in zip(table[label], ("", "@lim_ref", "@lim_x0A")):
            k = c[key + suffix]
            m = re.fullmatch(r"(\w+) \(p = ([\d.]+)(?:; P\(better\) ([\d.]+))?[;,] ratio ([\d.e]+)\)", cell)
            ok = m is not None and m.group(1) == k["verdict"] and _close(m.group(2), k["p"]) \
                and (m.group(3) is None or _close(m.group(3), k["prob_better"])) and _close(m.group(4), k["ratio"])
            if not ok:
                wrong.append((label, suffix, cell))
    ref = {r[0]: r[1] for r in _doc_table("docs/levy.md", "| claim (`lim_ref` vs `lim`, paired by seed) |")}
    for label, key in (("lower clipped RMSQE", "ref_rmsqe_clipped"), ("lower LOADER", "ref_loader"), ("lower bulk QE", "ref_bulk")):
        k = c[key]
        m = re.fullmatch(r"(\w+) \(p = ([\d.]+), ratio ([\d.]+)\)", ref[label])
        if not (m and m.group(1) == k["verdict"] and _close(m.group(2), k["p"]) and _close(m.group(3), k["ratio"])):
            wrong.append((label, ref[label]))
    k = c["ref_rmsqe"]
    assert _unquoted("docs/levy.md", [
        ("undecided (sign-flip p = {}, the smallest possible with 5 pairs; `lim_ref` is *worse* in every seed, ratio {}, "
         "Mann–Whitney p = {})", f"{k['p']:.3f}", f"{k['ratio']:.1f}", f"{k['p_other']:.4f}"),
    ]) == [] and k["verdict"] == "undecided" and k["prob_better"] == 0
    assert wrong == []
    holm = {f"{v['p_holm']:.2f}" for v in c.values() if f"{v['p']:.4f}" == "0.0079"}
    n_claims = sum(len(rec["claims"][o]) for o in rec["claims"])
    assert holm == {"0.25"} and n_claims == 32
    assert _missing("docs/levy.md", [
        f"p_Holm over the record's {n_claims} claims ({len(rec['claims']['max'])} per observable, two observables) is in the JSON "
        f"({holm.pop()} for the p = 0.0079 claims)",
        f"(71–99.5 % of it from the largest one",
        f"with Holm over the record's {n_claims} claims no claim reaches 0.05 (the smallest Holm p is {n_claims} × 0.0079 = "
        f"{min(v['p_holm'] for o in rec['claims'].values() for v in o.values()):.2f}",
    ]) == []
    # the intense-rain area: LOADER reversed for all three LIM rows at p = 0.0079
    ex = rec["claims"]["exceedance:threshold=25"]
    assert [ex[f"lim_loader{s}"]["verdict"] for s in ("", "@lim_ref", "@lim_x0A")] == ["reversed"] * 3
    assert {f"{ex[f'lim_loader{s}']['p']:.4f}" for s in ("", "@lim_ref", "@lim_x0A")} == {"0.0079"}
    assert all(v["verdict"] in ("reversed", "undecided") for k, v in ex.items() if k.startswith("lim_"))


def test_the_pite_v4_prose_in_the_readme_and_the_scorecard_is_the_record():
    rec = _rec("pite_v4.json")
    s, c = rec["summary"]["max"], rec["claims"]["max"]
    rng = lambda row, m, f: f"{f(s[row][m]['min'])}–{f(s[row][m]['max'])}"  # noqa: E731
    steps = {run["steps"] for row in rec["runs"].values() for run in row.values()}
    assert steps == {1500} and rec["num_samples"] == 512 and len(rec["train_seeds"]) == 5
    assert _missing("README.md", [f"(v4: {len(rec['train_seeds'])} seeds per row, 1,500 steps", f"{rec['num_samples']} samples",
                                  f"in all {len(rec['train_seeds'])} seeds"]) == []
    assert _missing("docs/scorecard.md", [
        f"1,500 steps of an 8-channel, 1-block U-Net on 16×16 crops, {len(rec['train_seeds'])} training seeds per row, "
        f"{rec['num_samples']} samples",
        f"RMSQE {_sci(s['lim']['rmsqe']['min'], 1)}–{_sci(s['lim']['rmsqe']['max'], 1)} vs SBM-EDM "
        f"{rng('sbm_edm', 'rmsqe', lambda x: f'{x:.0f}')} (floor {rec['floor']['max']['rmsqe']:.1f})",
        f"vs {rng('sbm_edm', 'loader', lambda x: f'{x:.0f}')} (floor {rec['floor']['max']['loader']:.0f})",
        f"LIM `x0_A`: RMSQE {rng('lim_x0A', 'rmsqe', lambda x: f'{x:.0f}')}",
        f"LOADER {c['lim_loader@lim_x0A']['verdict']} (p = {c['lim_loader@lim_x0A']['p']:.3f})",
        f"SBM better in the bulk: same side in every seed, p = {c['sbm_bulk']['p']:.4f}, Holm {c['sbm_bulk']['p_holm']:.2f}",
    ]) == [] and c["sbm_bulk"]["verdict"] == "holds"


def test_the_pite_v3_tables_are_the_record():
    rec = _rec("pite_v3.json")
    rows, fl, q = rec["rows"], rec["floor"]["max"], rec["quantiles"]["max"]
    assert rows == ["sbm_edm", "lim", "lim_x0A"] and rec["train_seeds"] == [0, 1, 2]
    s = lambda m, k=4: [_summ(rec, r, m)[:k] for r in rows]  # noqa: E731
    ss = lambda m: [[100 * rec["summary"]["max"][r][m][k] for k in ("min", "max")] for r in rows]  # noqa: E731
    above = lambda ks: [[100 * rec["summary"]["max"][r]["above_range"][k] for k in ks] for r in rows]  # noqa: E731
    summary = {
        "RMSQE (blog, η = 0.975, no root)": s("rmsqe") + [[fl["rmsqe"]]],
        "LOADER": s("loader") + [[fl["loader"]]],
        "RMSQE, samples clipped to [−1, 1]": s("rmsqe_clipped") + [[fl["rmsqe"]]],
        "share of RMSQE from its largest sample": ss("rmsqe_top_share"),
        "samples with a pixel > 200 mm/h": above(("mean",)),
        "bulk QE ∫₀^η ΔQ² du": s("bulk_qe", 2) + [[fl["bulk_qe"]]],
    }
    assert _pite_table_mismatches("docs/levy.md", "| Metric | SBM (EDM) | LIM (reject A ≥ 20) | LIM x0_A |", summary) == []
    full = dict(summary, **{
        "RMSQE (blog, η = 0.975)": s("rmsqe") + [[fl["rmsqe"]]],
        "LOADER, samples clipped to [−1, 1]": s("loader_clipped") + [[fl["loader"]]],
        "share of RMSQE from its largest single sample": ss("rmsqe_top_share"),
        "samples with a pixel > 200 mm/h": above(("mean", "min", "max")),
        "bulk QE ∫₀^η ΔQ² du": s("bulk_qe") + [[fl["bulk_qe"]]],
        "q97.5 / q99 / max (seeds pooled)": [q[r][2:] for r in rows],
    })
    del full["RMSQE (blog, η = 0.975, no root)"], full["share of RMSQE from its largest sample"]
    assert _pite_table_mismatches("docs/levy.md", "| Metric | SBM (EDM) | LIM (reject A ≥ 20) | LIM x0_A (reject A ≥ 20) |", full) == []
    ex = rec["summary"]["exceedance:threshold=25"]
    fx = rec["floor"]["exceedance:threshold=25"]
    text = _page("docs/levy.md")
    m = re.search(r"Fraction of each crop above 25 mm/h \(clipping does not change it\): RMSQE (.*?) \(floor ([^)]*)\), LOADER (.*?) "
                  r"\(floor ([^)]*)\), bulk QE (.*?) \(floor ([^)]*)\)", text)
    assert m is not None
    rm = [tuple(p.split(" ± ")) for p in m.group(1).split(" / ")]
    assert all(_close(a, ex[r]["rmsqe"]["mean"]) and _close(b, ex[r]["rmsqe"]["sd"]) for (a, b), r in zip(rm, rows)) and len(rm) == 3
    assert _close(m.group(2), fx["rmsqe"]) and _close(m.group(4), fx["loader"]) and _close(m.group(6), fx["bulk_qe"])
    lo = [tuple(p.split(" ± ")) for p in m.group(3).split(" / ")]
    assert all(_close(a, ex[r]["loader"]["mean"]) and _close(b, ex[r]["loader"]["sd"]) for (a, b), r in zip(lo, rows)) and len(lo) == 3
    bq = m.group(5).split(" / ")
    assert all(_close(a, ex[r]["bulk_qe"]["mean"]) for a, r in zip(bq, rows)) and len(bq) == 3
    hill = rec["hill"]["max"]
    assert _missing("docs/levy.md", [
        "Tail index of the data's crop maximum (Hill, n = 2048): " + ", ".join(
            f"{h['alpha']:.2f} ± {h['se']:.2f} (k = {h['k']})" for h in hill),
        f"({rec['wall_s_command'] / 60:.1f} min on 2 shared CPU cores; `experiments/results/pite_v3.json`",
        f"{int(rec['wall_s_command'] // 60)} min {round(rec['wall_s_command'] % 60)} s wall on 2 shared CPU cores",
        f"data q50 / q90 / q97.5 / q99 / max = {' / '.join(f'{x:.1f}' for x in q['data'])}",
    ]) == []


def test_the_pite_v3_claims_re_judged_and_the_tail_indices_are_the_records():
    rec, v4 = _rec("pite_v3_tests.json"), _rec("pite_v4.json")
    c = rec["claims"]["max"]
    table = {r[0]: r[1:] for r in _doc_table("docs/levy.md", "| claim (LIM row vs SBM-EDM) |")}
    wrong = []
    for label, key in (("LIM better in RMSQE", "lim_rmsqe"), ("LIM better in clipped RMSQE", "lim_rmsqe_clipped"),
                       ("LIM better in LOADER", "lim_loader"), ("SBM better in the bulk", "sbm_bulk")):
        for cell, suffix in zip(table[label], ("", "@lim_x0A")):
            k = c[key + suffix]
            m = re.fullmatch(r"(\w+) \(p = ([\d.]+); P\(better\) = ([\d.]+), ratio ([\d.]+)\)", cell)
            if not (m and m.group(1) == k["verdict"] and _close(m.group(2), k["p"]) and _close(m.group(3), k["prob_better"])
                    and _close(m.group(4), k["ratio"])):
                wrong.append((label, suffix, cell))
    assert wrong == [] and {v["verdict"] for v in c.values()} == {"undecided"} and min(v["p"] for v in c.values()) == 0.1
    assert _missing("docs/levy.md", [f"({rec['wall_s']:.0f} s; `experiments/results/pite_v3_tests.json`"]) == []
    tiles = rec["hill_images"]["max"]["estimates"]
    assert tiles == v4["hill_images"]["max"]["estimates"]
    t = lambda e, d: f"{e['alpha']:.2f} [{e['lo']:.{d}f}, {e['hi']:.{d}f}]"  # noqa: E731
    hill = v4["hill"]["max"]
    assert _missing("docs/levy.md", [
        f"({tiles[0]['n']} non-overlapping 16×16 tiles, 90 % bootstrap interval over the {tiles[0]['groups']} frames): "
        f"**{t(tiles[0], 2)} at k = {tiles[0]['k']}, {t(tiles[1], 2)} at k = {tiles[1]['k']}**",
        "former " + " / ".join(f"{h['alpha']:.2f} ± {h['se']:.2f}" for h in hill) + " on the overlapping crops "
        f"({hill[0]['distinct_top']} distinct values among their top {hill[0]['k']}, {hill[1]['distinct_top']} among the top "
        f"{hill[1]['k']})",
        f"tiles with a bootstrap over frames: {t(tiles[0], 1)} for the crop maximum",
        f"of the {tiles[0]['groups']} training frames ({tiles[0]['n']} tiles of 16×16",
        f"of {tiles[0]['num_boot']} bootstrap resamples",
    ]) == []


def test_the_pite_v3_interpretation_is_the_record():
    rec = _rec("pite_v3.json")
    s, q, c = rec["summary"]["max"], rec["quantiles"]["max"], rec["claims"]["max"]
    vals = lambda row, m: s[row][m]["values"]  # noqa: E731
    rng = lambda row, m, d=1: f"{min(vals(row, m)):.{d}f}–{max(vals(row, m)):.{d}f}"  # noqa: E731
    clipped_sbm, clipped_x0 = vals("sbm_edm", "rmsqe_clipped"), vals("lim_x0A", "rmsqe_clipped")
    assert sum(b < a for a, b in zip(clipped_x0, clipped_sbm)) == 3 and max(clipped_sbm) > min(clipped_x0)
    mm = lambda row, m: (min(vals(row, m)), max(vals(row, m)))  # noqa: E731
    assert _unquoted("docs/levy.md", [
        ("RMSQE ({}–{} vs {}–{}) but not with clipping ({}–{} vs {}–{}:", *mm("lim_x0A", "rmsqe"), *mm("sbm_edm", "rmsqe"),
         *mm("lim_x0A", "rmsqe_clipped"), *mm("sbm_edm", "rmsqe_clipped")),
    ]) == []
    verdicts = [c[k]["verdict"] for k in ("lim_rmsqe", "lim_loader", "sbm_bulk", "lim_rmsqe@lim_x0A")]
    assert verdicts == ["reversed", "reversed", "holds", "holds"]
    assert _missing("docs/levy.md", [
        f"(every seed ≥ {_sci(min(vals('lim', 'rmsqe')), 1)} vs SBM ≤ {max(vals('sbm_edm', 'rmsqe')):.0f}; clipped "
        f"{rng('lim', 'rmsqe_clipped', 0)} vs {rng('sbm_edm', 'rmsqe_clipped')})",
        f"({100 * min(vals('sbm_edm', 'rmsqe_top_share')):.0f}–{100 * max(vals('sbm_edm', 'rmsqe_top_share')):.0f} % from one sample; "
        f"its largest crop maximum {q['sbm_edm'][4]:.0f} mm/h)",
        f"**reversed** for LIM ({rng('lim', 'loader', 0)} vs {rng('sbm_edm', 'loader', 0)}), **undecided** for LIM x0_A "
        f"({rng('lim_x0A', 'loader', 0)})",
        f"(SBM {rng('sbm_edm', 'bulk_qe', 0)} vs LIM {rng('lim', 'bulk_qe', 0)} and x0_A {rng('lim_x0A', 'bulk_qe', 0)})",
        f"{100 * s['lim']['above_range']['mean']:.1f} % of its samples hold a pixel above 200 mm/h",
        f"({rng('lim', 'rmsqe_clipped', 0)} in every seed), and one sample still carries up to "
        f"{100 * max(vals('lim', 'rmsqe_top_share')):.0f} % of the unclipped score",
        f"({100 * s['lim_x0A']['above_range']['mean']:.2f} % of samples above 200 mm/h, q99 {q['lim_x0A'][3]:.0f} vs data "
        f"{q['data'][3]:.0f}, largest crop maximum {q['lim_x0A'][4]:.0f} mm/h, top share ≤ "
        f"{100 * max(vals('lim_x0A', 'rmsqe_top_share')):.0f} %)",
        f"(LIM RMSQE {_sci(min(vals('lim', 'rmsqe')), 1)}–{_sci(max(vals('lim', 'rmsqe')), 1)} over three seeds, SBM "
        f"{rng('sbm_edm', 'rmsqe', 0)})",
    ]) == []


def test_the_pite_v2_tables_and_prose_are_the_record():
    rec = _rec("pite_v2.json")
    rows = ["sbm_edm", "sbm_vp", "lim"]
    mx, ex = rec["metrics"]["max"], rec["metrics"]["exceedance:threshold=25"]
    qm, qe, clip = rec["quantiles"]["max"], rec["quantiles"]["exceedance:threshold=25"], rec["posthoc_clip_max"]
    oor = {r: rec["models"][r]["out_of_range"] for r in rows}
    assert _pite_table_mismatches("docs/levy.md", "| Metric | SBM (EDM) | SBM (VP) | LIM (α = 1.7) |", {
        "RMSQE (η = 0.975)": [[mx[r]["rmsqe"]] for r in rows] + [[mx["floor"]["rmsqe"]]],
        "LOADER": [[mx[r]["loader"]] for r in rows] + [[mx["floor"]["loader"]]],
        "q50 / q90 / q99 (data 8.5 / 47.7 / 129.6)": [[qm[r][0], qm[r][1], qm[r][3]] for r in rows],
        "q97.5 / max (data 79.3 / 163.8)": [[qm[r][2], qm[r][4]] for r in rows],
        "RMSQE / LOADER with `--out-of-range clip` (post hoc, exact)": [[clip[r]["rmsqe"], clip[r]["loader"]] for r in rows]
        + [[clip["floor"]["rmsqe"], clip["floor"]["loader"]]],
    }, "same-law floor") == []
    assert _doc_table("docs/levy.md", "| Metric | SBM (EDM) | SBM (VP) | LIM (α = 1.7) |")[0][1] == "118.7"
    lines = (ROOT / "docs/levy.md").read_text().splitlines()
    i = lines.index("Fraction of each crop above 25 mm/h (`exceedance:threshold=25`, intense-rain area):")
    ex_rows = {r[0]: r[1:] for r in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[i + 4:i + 7])}
    want = {"RMSQE (η = 0.975)": [[ex[r]["rmsqe"]] for r in rows] + [[ex["floor"]["rmsqe"]]],
            "LOADER": [[ex[r]["loader"]] for r in rows] + [[ex["floor"]["loader"]]],
            "q50 / q90 / q99 (data 0 / 0.134 / 0.471)": [[qe[r][0], qe[r][1], qe[r][3]] for r in rows]}
    assert all(_cell_is(cell, v) for k, cols in want.items() for cell, v in zip(ex_rows[k], cols)), ex_rows
    oor_rows = {r[0]: r[1:] for r in _doc_table("docs/levy.md", "| | SBM (EDM) | SBM (VP) | LIM (α = 1.7) |")}
    assert all(_cell_is(cell, [100 * oor[r]["pixels_above"]]) for cell, r in zip(oor_rows["pixels > +1"], rows))
    assert all(_cell_is(cell, [100 * oor[r]["samples_above"]]) for cell, r in zip(oor_rows["samples with a pixel > +1"], rows))
    assert all(_cell_is(cell, [100 * oor[r]["pixels_below"]]) for cell, r in zip(oor_rows["pixels < −1 (→ 0 mm/h, dry)"], rows))
    assert all(_close(_TOKEN.findall(cell)[0], oor[r]["max"]) for cell, r in zip(oor_rows["largest value (training space → mm/h)"], rows))
    m = {r: rec["models"][r] for r in rows}
    assert _unquoted("docs/levy.md", [  # 32.5 s of sampling prints as 33 s
        ("Timings: SBM(EDM) {} s training + {} s sampling, SBM(VP) {} s + {} s, LIM {} s + {} s",
         *[f"{m[r][k]:.1f}" for r in rows for k in ("fit_s", "sample_s")]),
    ]) == []
    assert _missing("docs/levy.md", [
        f"{int(rec['wall_s_command'] // 60)} min {rec['wall_s_command'] % 60:.0f} s wall ({rec['wall_s_command']:.0f} s)",
        f"its LIM RMSQE ({_sci(mx['lim']['rmsqe'], 2)}) was decided by that clamp",
        f"LIM RMSQE {_sci(mx['lim']['rmsqe'], 2)}, 5.7e6 on a rerun",
        f"up to q99 ({qm['sbm_edm'][3]:.0f} vs {qm['data'][3]:.0f} mm/h)",
        f"with {100 * oor['sbm_edm']['samples_above']:.1f} % of samples holding a pixel above 200 mm/h",
        f"{100 * oor['sbm_vp']['samples_above']:.0f} % of its samples have a pixel above +1 and its q90 is {qm['sbm_vp'][1]:.0f} mm/h",
        f"on RMSQE ({_sci(mx['lim']['rmsqe'], 2)} vs {mx['sbm_edm']['rmsqe']:.1f}; with clipping {clip['lim']['rmsqe']:.1f} vs "
        f"{clip['sbm_edm']['rmsqe']:.1f}) and on LOADER ({mx['lim']['loader']:.1f} vs {mx['sbm_edm']['loader']:.1f}; floor "
        f"{mx['floor']['loader']:.1f})",
        f"because {100 * oor['lim']['samples_above']:.1f} % of its samples hold a pixel beyond 200 mm/h (q97.5 {qm['lim'][2]:.0f} vs "
        f"{qm['data'][2]:.0f}, q99 {qm['lim'][3]:.0f} vs {qm['data'][3]:.0f} mm/h)",
        f"(q99 {qe['lim'][3]:.2f} vs {qe['data'][3]:.2f}; RMSQE {_sci(ex['lim']['rmsqe'], 1)} vs floor {_sci(ex['floor']['rmsqe'], 1)})",
    ]) == []
