"""Issue 42 item 1: numbers quoted in README.md and the docs are checked against their records,
value and rounding, so a re-recorded result that changes a number fails the suite until the text
follows. Covered here: the quickstart tables and event figures (README.md,
docs/getting-started.md) against ``experiments/results/quickstart_record.json``, and the
double-descent study's table in docs/events.md against ``experiments/results/double_descent_study.json``."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = json.loads((ROOT / "experiments/results/quickstart_record.json").read_text())


def _tables(text: str):
    """Every markdown table whose header starts with ``| epoch |``: (epochs, {label: cells})."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| epoch |"):
            epochs = [c.strip() for c in line.strip("|").split("|")][1:]
            rows, j = {}, i + 2
            while j < len(lines) and lines[j].startswith("|"):
                cells = [c.strip() for c in lines[j].strip("|").split("|")]
                rows[cells[0]] = cells[1:]
                j += 1
            yield epochs, rows


def _agrees(cell: str, value: float) -> bool:
    cell = cell.replace("**", "")
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return f"{value:.{decimals}f}" == cell


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_quickstart_tables_equal_the_record(page):
    tables = list(_tables((ROOT / page).read_text()))
    assert tables, page
    checked, wrong = 0, []
    for epochs, rows in tables:
        for label, cells in rows.items():
            curve = QUICKSTART["curves"].get(label)
            assert curve is not None, f"{page}: row {label!r} has no record"
            for ep, cell in zip(epochs, cells):
                value = curve["values"][ep]
                checked += 1
                if not _agrees(cell, value):
                    wrong.append(f"{label} at epoch {ep}: page {cell}, record {value:.6g}")
    assert wrong == [] and checked >= 28, wrong


def test_the_quickstart_event_figures_equal_the_record():
    text = " ".join((ROOT / "README.md").read_text().split())
    ev = {e["name"]: e for e in QUICKSTART["events"]}
    el, on = ev["early_learning"], ev["memorization_onset"]
    d, r = el["legs"]["descent"], el["legs"]["rise"]
    minimum = QUICKSTART["curves"]["E_gen"]["values"][str(el["epoch"])]
    expected = (f"E_gen minimum {minimum:.2f} at epoch {el['epoch']}; descent {d['diff']:.2f} ± {d['se']:.2f}, "
                f"held-out z = {d['z']:.1f}; rise {r['diff']:.2f} ± {r['se']:.2f}, z = {r['z']:.1f}")
    assert expected in text, expected
    onset = f"**memorization onset** at epoch {on['epoch']} (ratio 0 → {on['legs']['rise']['diff']:.2f}, z = {on['significance']:.1f})"
    assert onset in text, onset


def test_a_changed_record_fails_the_check():
    """The check can fail: a record moved by one unit of the last printed digit disagrees."""
    assert _agrees("0.55", 0.5547) and not _agrees("0.56", 0.5547) and not _agrees("3.07", 3.0646)


STUDY = ROOT / "experiments/results/double_descent_study.json"


@pytest.mark.skipif(not STUDY.is_file(), reason="the study's results are not recorded yet")
def test_the_double_descent_study_table_in_the_docs_is_the_records():
    sys.path.insert(0, str(ROOT / "experiments"))
    from double_descent_study import table

    text = (ROOT / "docs/events.md").read_text()
    block = re.search(r"<!-- study-table:start -->\n(.*?)<!-- study-table:end -->", text, re.S)
    assert block is not None
    assert block.group(1) == table(json.loads(STUDY.read_text()))


# ----------------------------------------------------------------------------- PITE and ICR claims
PITE = json.loads((ROOT / "experiments/results/pite_v4.json").read_text())
ICR_UNET = json.loads((ROOT / "experiments/results/icr_unet.json").read_text())


def _claim(key):
    return PITE["claims"]["max"][key]


def test_the_pite_sentences_quote_the_v4_record_with_holm():
    """README.md and the scorecard quote the v4 record's exact p, its Holm-corrected p and the
    LIM rows' out-of-range share, each rounded as printed."""
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines re-wrapped: one space
    card = " ".join((ROOT / "docs/scorecard.md").read_text().split())
    reversed_keys = [k for k in ("lim_rmsqe", "lim_rmsqe_clipped", "lim_loader", "sbm_bulk",
                                 "lim_rmsqe@lim_ref", "lim_rmsqe_clipped@lim_ref", "lim_loader@lim_ref",
                                 "sbm_bulk@lim_ref")]
    assert {f"{_claim(k)['p']:.4f}" for k in reversed_keys} == {"0.0079"}
    assert {f"{_claim(k)['p_holm']:.2f}" for k in reversed_keys} == {"0.25"}
    for text in (readme, card):
        assert "p = 0.0079" in text and "Holm" in text and "0.25" in text
    x0a = [_claim(k) for k in ("lim_rmsqe@lim_x0A", "lim_rmsqe_clipped@lim_x0A")]
    assert {f"{c['p']:.3f}" for c in x0a} == {"0.016"} and {f"{c['p_holm']:.2f}" for c in x0a} == {"0.29"}
    assert "p = 0.016 each, Holm 0.29" in readme and "p = 0.016 each, Holm 0.29" in card
    s = PITE["summary"]["max"]
    lim = s["lim"]["above_range"]
    assert f"{100 * lim['min']:.1f}–{100 * lim['max']:.1f} %" == "2.3–3.5 %"
    assert "2.3–3.5 % of" in readme and "2.3–3.5 % of samples" in card
    loader = s["lim"]["loader"]
    assert f"LOADER {loader['min']:.0f}–{loader['max']:.0f}" in card


def _unmarked(text: str) -> str:
    """The text as it renders: HTML comments (the quoted-number markers) removed."""
    return re.sub(r"<!--.*?-->", "", text)


def test_the_icr_trace_and_onset_numbers_are_the_records():
    card = _unmarked((ROOT / "docs/scorecard.md").read_text())
    assert ICR_UNET["levels"]["icr/icr"]["level"] == 3  # the reported series (issue 42 item 5)
    for name, n in (("small", 64), ("large", 1024)):
        ep = ICR_UNET["runs"][name]["epochs"]
        rs = ep[-1]["icr/trace_s"] / ep[0]["icr/trace_s"]
        rx = ep[-1]["icr/trace_xi"] / ep[0]["icr/trace_xi"]
        assert f"N = {n}: Tr Σ_s ×{rs:.1f}" in card and f"Tr Σ_ξ ×{rx:.1f}" in card
    summ = ICR_UNET["runs"]["small"]["summary"]
    assert f"is epoch {summ['mem_onset_epoch']}, its first non-zero ratio epoch {summ['mem_first_nonzero_epoch']}" in card


def test_the_superseded_double_descent_run_is_quoted_from_its_record():
    run = json.loads((ROOT / "experiments/results/double_descent.json").read_text())["runs"][0]["analysis"]["curves"]
    eg = dict(zip(run["e_gen"]["epoch"], run["e_gen"]["value"]))
    em = dict(zip(run["e_mem"]["epoch"], run["e_mem"]["value"]))
    gap = dict(zip(run["gap"]["epoch"], run["gap"]["value"]))
    want = {"gap0": f"{gap[0]:.2f}", "gap499": f"{gap[499]:.2f}", "egen499": f"{eg[499]:.3f}",
            "ratio499": f"{eg[499] / em[499]:.2f}"}
    text = (ROOT / "docs/events.md").read_text()
    got = dict(re.findall(r"<!-- dd-record:(\w+) -->(.*?)<!-- /dd-record -->", text))
    assert got == want


# ----------------------------------------------------------------------------- the event calibration
def test_the_v7_calibration_tables_are_generated_from_their_records():
    """docs/events.md's calibration-v7 block is docs_block() of the two recorded files, and the
    prose's power figures are theirs."""
    import calibrate_events as ce  # experiments/ (tests/conftest.py puts it on the path)

    nulls = json.loads((ROOT / "experiments/results/calibrate_events_v7.json").read_text())
    power = json.loads((ROOT / "experiments/results/calibrate_events_v7_power.json").read_text())
    assert not nulls.get("partial") and all(r["runs"] >= 300 for r in nulls["nulls"].values())
    text = (ROOT / "docs/events.md").read_text()
    a = text.index(ce.V7_DOCS_MARKERS[0]) + len(ce.V7_DOCS_MARKERS[0])
    assert text[a:text.index(ce.V7_DOCS_MARKERS[1])] == "\n" + ce.docs_block(nulls, power)
    cell = {(r["event"], r["family"], r["num_seeds"]): f"{r['planted']['found']}/{r['runs']}" for r in power["power"]}
    want = {"fgn_dd": cell[("double_descent", "fgn_h0.8_m1024", 2048)],
            "cos_el": cell[("early_learning", "cosine_m256", 2048)],
            "cos_dd": cell[("double_descent", "cosine_m256", 2048)]}
    assert dict(re.findall(r"<!-- v7p:(\w+) -->(.*?)<!-- /v7p -->", text)) == want


def test_the_v7_prose_names_the_families_over_two_percent_and_counts_them():
    """The families over 2 % are named with their counts; the counts of README and the docs'
    summary (families in all, held out, within 2 %) are the code's and the record's; the long
    tune family's count and the cosine variants' are their records'."""
    import calibration

    nulls = json.loads((ROOT / "experiments/results/calibrate_events_v7.json").read_text())["nulls"]
    over = sorted(f for f, r in nulls.items() if r["rate"] > 0.02)
    text = " ".join((ROOT / "docs/events.md").read_text().split())
    for f in over:
        r = nulls[f]
        assert f"`{f}`" in text
        assert f"{r['any_confirmed']}/{r['runs']} = {100 * r['rate']:.1f} %" in text
    assert over == ["heavy_t_m1024", "heavy_t_spikes_m1024"]  # the prose names exactly these
    assert sorted(nulls) == sorted(calibration.HELD_OUT)  # every held-out family was run
    tune = json.loads((ROOT / "experiments/results/calibrate_events_v7_tune_long.json").read_text())["nulls"]
    r = tune["long_t1000_ema_spike_m256"]
    assert re.findall(r"<!-- v7t:long -->(.*?)<!-- /v7t -->", text) == [f"{r['any_confirmed']}/{r['runs']}"]
    cpv = json.loads((ROOT / "experiments/results/cosine_power_variants.json").read_text())["variants"]
    assert dict(re.findall(r"<!-- cpv2?:(\w+) -->(.*?)<!-- /cpv2? -->", text)) == {
        k: f"{v['found']}/{v['runs']}" for k, v in cpv.items()}
    cpo = json.loads((ROOT / "experiments/results/cosine_power_variants.json").read_text())["oracles"]
    assert dict(re.findall(r"<!-- cpo:(\w+:\w+) -->(.*?)<!-- /cpo -->", text)) == {
        f"{k}:{e}": f"{v['found']}/{v['runs']}" for k, evs in cpo.items() for e, v in evs.items()}
    # the two derived figures: AR(1) φ 0.9 against a random walk, third differences (variogram
    # identity Var(D_h) = 15V(h) − 6V(2h) + V(3h)), and the MAD log-sd at lag 10 on 500 evaluations
    ar1 = lambda h: 2 * (1 - 0.9 ** h)  # noqa: E731
    third = lambda V, h: 15 * V(h) - 6 * V(2 * h) + V(3 * h)  # noqa: E731
    walk_over_ar1 = (third(float, 10) / third(float, 1)) / (third(ar1, 10) / third(ar1, 1))
    got = dict(re.findall(r"<!-- cpo:(walk|sd10) -->(.*?)<!-- /cpo -->", text))
    assert got == {"walk": f"{100 * (walk_over_ar1 - 1):.0f}", "sd10": f"{3 * (10 / (500 - 30)) ** 0.5:.2f}"}


def _v8():
    r = ROOT / "experiments/results"
    return ({v: json.loads((r / f"calibrate_events_{v}.json").read_text()) for v in
             ("v7", "v8", "v8_tune", "v7_tune_heavy")},
            {v: json.loads((r / f"calibrate_events_{v}_power.json").read_text())["power"] for v in ("v7", "v8")})


def test_the_v8_calibration_tables_and_their_comparison_with_v7_are_generated_from_the_records():
    """docs/events.md's calibration-v8 block is docs_block() of the two v8 records; the sentences
    on what changed against v7 (null families, power cells) are built from the four records; the
    cosine cells are the v8 power record's."""
    import calibrate_events as ce

    nulls, power = _v8()
    assert not nulls["v8"].get("partial") and all(r["runs"] >= 300 for r in nulls["v8"]["nulls"].values())
    text = (ROOT / "docs/events.md").read_text()
    a = text.index(ce.DOCS_MARKERS[0]) + len(ce.DOCS_MARKERS[0])
    power_v8 = json.loads((ROOT / "experiments/results/calibrate_events_v8_power.json").read_text())
    assert text[a:text.index(ce.DOCS_MARKERS[1])] == "\n" + ce.docs_block(nulls["v8"], power_v8)
    got = dict(re.findall(r"<!-- v8d:(\w+) -->(.*?)<!-- /v8d -->", text, re.S))
    assert got == {"nulls": ce.changed_nulls(nulls["v7"]["nulls"], nulls["v8"]["nulls"]),
                   "power": ce.changed_power(power["v7"], power["v8"])}
    cell = {(r["event"], r["family"], r["num_seeds"]): f"{r['planted']['found']}/{r['runs']}" for r in power["v8"]}
    assert dict(re.findall(r"<!-- v8p:(\w+) -->(.*?)<!-- /v8p -->", text)) == {
        "cos_el": cell[("early_learning", "cosine_m256", 2048)], "cos_dd": cell[("double_descent", "cosine_m256", 2048)]}
    # "the other 27 are v7's, event by event"
    counts = lambda rec: {f: {e: v["confirmed"] for e, v in r["events"].items()} for f, r in rec["nulls"].items()}  # noqa: E731
    same = [f for f in nulls["v8"]["nulls"] if counts(nulls["v8"])[f] == counts(nulls["v7"])[f]]
    assert f"the other {len(same)} are v7's, event by event" in " ".join(text.split())


def test_the_v8_prose_counts_are_the_records():
    """README's and the Summary's family counts and power ranges, and the tune-side figures the
    change was chosen on, are the v8 records'; every held-out family is within 2 %."""
    import calibration

    nulls, power = _v8()
    held = nulls["v8"]["nulls"]
    assert sorted(held) == sorted(calibration.HELD_OUT) and all(r["rate"] <= 0.02 for r in held.values())
    want = {"all": str(len(calibration.FAMILIES)), "held": str(len(held)),
            "within": str(sum(r["rate"] <= 0.02 for r in held.values()))}
    for page in ("docs/events.md", "README.md"):
        got = dict(re.findall(r"<!-- v8n:(\w+) -->(\d+)<!-- /v8n -->", (ROOT / page).read_text()))
        assert got == {k: v for k, v in want.items() if k in got} and {"held", "within"} <= set(got), page
    text = (ROOT / "docs/events.md").read_text()
    tune, base = nulls["v8_tune"]["nulls"], nulls["v7_tune_heavy"]["nulls"]
    assert sorted(tune) == sorted(calibration.TUNE) and {r["runs"] for r in tune.values()} == {300}
    want_t = {"max": f"{100 * max(r['rate'] for r in tune.values()):.1f}"}
    for f in ("heavy_t_m256", "heavy_t_spikes_m256"):
        want_t[f"v7:{f}"] = f"{base[f]['any_confirmed']}/{base[f]['runs']}"
        want_t[f"v8:{f}"] = f"{tune[f]['any_confirmed']}/{tune[f]['runs']}"
    assert dict(re.findall(r"<!-- v8t:([\w:.]+) -->(.*?)<!-- /v8t -->", text)) == want_t
    assert f"{len(tune)} families at 300 runs" in text
    rows = [r for r in power["v8"] if r["height"] == 0.2 and r["num_seeds"] == 2048]
    kind = {r["family"]: calibration.FAMILIES[r["family"]].structure for r in rows}
    pct = lambda rs: f"{min(100 * r['planted']['found'] / r['runs'] for r in rs):.0f}–{max(100 * r['planted']['found'] / r['runs'] for r in rs):.0f}"  # noqa: E731
    assert dict(re.findall(r"<!-- v8r:(\w+) -->(.*?)<!-- /v8r -->", text)) == {
        "per_seed": pct([r for r in rows if kind[r["family"]] == "per_seed"]),
        "common": pct([r for r in rows if kind[r["family"]] not in ("per_seed", "schedule")])}
    assert all(r["planted"]["found"] / r["runs"] < 0.5 for r in rows if kind[r["family"]] == "schedule")


def test_the_cosine_routes_of_v8_are_the_record():
    """The long-lag precision and the fitted shapes' false events quoted in the v8 cosine paragraph
    are cosine_power_variants.json's."""
    rec = json.loads((ROOT / "experiments/results/cosine_power_variants.json").read_text())
    llp, nulls = rec["long_lag_precision"], rec["fitted_shape_nulls"]
    text = (ROOT / "docs/events.md").read_text()
    ex = llp["excluded"]["40"]
    assert dict(re.findall(r"<!-- llp:([\w:]+) -->(.*?)<!-- /llp -->", text)) == {
        "excluded:40:sd": f"{ex['sd_log']:.3f}", "excluded:40:n": str(ex["differences"]),
        "excluded:40:q95": f"{ex['q95_log']:.3f}", "walk:40": f"{np.log(llp['walk_over_ar1']['40']):.3f}"}
    assert ex["q95_log"] > np.log(llp["walk_over_ar1"]["40"])  # "exceeds"
    assert dict(re.findall(r"<!-- cpn:([\w.]+) -->(.*?)<!-- /cpn -->", text)) == {
        f: f"{r['any_confirmed']}/{r['runs']}" for f, r in nulls.items()}
    v = rec["variants"]
    assert v["fitted_long_excluded"]["found"] < v["fitted_shape"]["found"]  # "fewer than"


def test_v7_equals_v6_on_every_family_both_ran():
    """The two changes of v7 (the extent cap beyond 500 evaluations, the jump's neighbour rule)
    change no count on the 28 families of v6 and no cell of the power table (docs/events.md)."""
    def counts(rec):
        return {f: (r["any_confirmed"], {e: v["confirmed"] for e, v in r["events"].items()})
                for f, r in rec["nulls"].items()}

    v6 = counts(json.loads((ROOT / "experiments/results/calibrate_events_v6.json").read_text()))
    v7 = counts(json.loads((ROOT / "experiments/results/calibrate_events_v7.json").read_text()))
    assert {f: v7[f] for f in v6} == v6
    cells = [{(r["event"], r["family"], r["num_seeds"]): r["planted"]["found"]
              for r in json.loads((ROOT / f"experiments/results/calibrate_events_{v}_power.json").read_text())["power"]}
             for v in ("v6", "v7")]
    assert cells[0] == cells[1]


def test_the_adam_1000_epoch_table_in_the_docs_is_the_record():
    from double_descent_study import table

    text = (ROOT / "docs/events.md").read_text()
    block = re.search(r"<!-- study-table-1000:start -->\n(.*?)<!-- study-table-1000:end -->", text, re.S)
    record = json.loads((ROOT / "experiments/results/double_descent_study_adam1000.json").read_text())
    assert block is not None and block.group(1) == table(record)


def test_the_battery_sentences_are_the_record():
    """README's battery sentence and docs/reliability.md's summary are generated from
    ``bad_input_battery.json`` (``experiments/bad_input_battery.py --docs-only``), and it has no
    PROBLEM case."""
    import bad_input_battery as bb  # experiments/ (tests/conftest.py puts it on the path)

    rec = json.loads((ROOT / "experiments/results/bad_input_battery.json").read_text())
    readme = (ROOT / "README.md").read_text()
    start, end = bb.README_MARKERS
    assert readme.split(start, 1)[1].split(end, 1)[0] == bb.readme_sentence(rec["cases"])
    docs = (ROOT / "docs/reliability.md").read_text()
    summary = docs.split("<!-- battery:summary:start -->\n", 1)[1].split("\n<!-- battery:summary:end -->", 1)[0]
    assert summary == rec["summary"]  # summary_md of the run, as the script wrote it
    assert [r["id"] for r in rec["cases"] if r["verdict"] == "PROBLEM"] == []


def test_the_sweep_error_structure_numbers_are_the_record():
    """The F and p of the repeats' error structure in README, docs/sweeps.md and the scorecard are
    those of ``mtog_digits_error_structure.json``, which is the analysis of the recorded rows."""
    import csv

    from sweep_error_structure import analyse  # experiments/

    rec = json.loads((ROOT / "experiments/results/mtog_digits_error_structure.json").read_text())
    with open(ROOT / "experiments/results/mtog_digits_sweep_results.csv", newline="") as f:
        fresh = analyse(list(csv.DictReader(f)))
    assert fresh["anova"]["rows"]["F"] == pytest.approx(rec["anova"]["rows"]["F"], rel=1e-12)
    assert fresh["anova"]["columns"]["p"] == pytest.approx(rec["anova"]["columns"]["p"], rel=1e-9)
    a = rec["anova"]
    want = {"fw": f"{a['rows']['F']:.1f}", "pw": f"{a['rows']['p']:.4f}", "fn": f"{a['columns']['F']:.1f}",
            "pn": f"{a['columns']['p']:.4f}",
            "share": f"{100 * (rec['share_width_x_repeat'] + rec['share_n_x_repeat']):.0f} %"}
    for page in ("README.md", "docs/sweeps.md", "docs/scorecard.md"):
        got = re.findall(r"<!-- err:(\w+) -->(.*?)<!-- /err -->", (ROOT / page).read_text())
        assert got and all(want[k] == v for k, v in got), (page, got)


def test_the_k3_bias_variance_statements_are_the_record():
    """docs/sweeps.md and the scorecard quote the four statements' verdicts and figures of
    ``mtog_digits_k3_bias_variance.json``, whose statements are bias_variance_statements of its
    own cells."""
    from lightning_pfd.analysis.bias_variance import bias_variance_statements

    rec = json.loads((ROOT / "experiments/results/mtog_digits_k3_bias_variance.json").read_text())
    assert len(rec["cells"]) == 32 and {c["k"] for c in rec["cells"]} == {3}
    assert bias_variance_statements(rec["cells"]) == rec["statements"]
    st = {s["key"]: s for s in rec["statements"]}
    for page in ("docs/sweeps.md", "docs/scorecard.md"):
        text = (ROOT / page).read_text()
        verdicts = re.findall(r"<!-- bv:(\w+) -->(.*?)<!-- /bv -->", text)
        assert len(verdicts) == 4 and all(st[k]["verdict"] == v for k, v in verdicts), (page, verdicts)
    figures = re.findall(r"<!-- bvn:(\w+) -->(.*?)<!-- /bvn -->", (ROOT / "docs/sweeps.md").read_text())
    assert len(figures) >= 10 and all(f in st[k]["numbers"] for k, f in figures), figures


def test_the_k3_error_structure_numbers_are_the_record():
    """The K = 3 sweep's repeat effects quoted in docs/sweeps.md are its record's, which is the
    analysis of its recorded rows."""
    import csv

    from sweep_error_structure import analyse  # experiments/

    rec = json.loads((ROOT / "experiments/results/mtog_digits_k3_error_structure.json").read_text())
    with open(ROOT / "experiments/results/mtog_digits_k3_sweep_results.csv", newline="") as f:
        fresh = analyse(list(csv.DictReader(f)))
    for k in rec["effects"]:
        assert fresh["effects"][k]["F"] == pytest.approx(rec["effects"][k]["F"], rel=1e-12)
    e = rec["effects"]
    want = {"fw": f"{e['width_x_repeat']['F']:.2f}", "pw": f"{e['width_x_repeat']['p']:.4f}",
            "fn": f"{e['n_x_repeat']['F']:.2f}", "pn": f"{e['n_x_repeat']['p']:.5f}"}
    got = re.findall(r"<!-- err3:(\w+) -->(.*?)<!-- /err3 -->", (ROOT / "docs/sweeps.md").read_text())
    assert sorted(k for k, _ in got) == sorted(want) and all(want[k] == v for k, v in got)


def test_the_mtog_digits_per_trial_events_are_the_record():
    """docs/events.md's per-trial events of the K = 3 sweep (table and counts) are those of
    ``mtog_digits_k3_events.json``, and the counts are the trials' own (not the summary's copy)."""
    rec = json.loads((ROOT / "experiments/results/mtog_digits_k3_events.json").read_text())
    text = (ROOT / "docs/events.md").read_text()
    block = re.search(r"<!-- mtog-events:start -->\n(.*?)\n<!-- mtog-events:end -->", text, re.S)
    assert block is not None and block.group(1) == rec["table_md"]
    quoted = dict(re.findall(r"<!-- mtog:(\w+) -->(\d+)<!-- /mtog -->", text))
    names = [e["name"] for r in rec["trials"] for e in r["events"]]
    assert quoted == {"trials": str(len(rec["trials"])), "mo": str(names.count("memorization_onset")),
                      "el": str(names.count("early_learning")),
                      "agree": str(sum(r["agrees_with_run"] for r in rec["trials"]))}
    assert not [n for n in names if n not in ("memorization_onset", "early_learning")]  # "no double descent"


def test_the_null_family_list_in_the_docs_is_the_code():
    """docs/events.md lists every null family of ``experiments/calibration.py`` with its side of
    the split (``calibrate_events.family_table``), including the long-run families."""
    import calibrate_events as ce

    text = (ROOT / "docs/events.md").read_text()
    a, b = ce.FAMILY_MARKERS
    assert text.split(a, 1)[1].split(b, 1)[0] == "\n" + ce.family_table() + "\n"
    assert "`long_t1000_spike_m1024` | held-out | long | 1000 |" in ce.family_table()


def test_the_sgd_arms_power_at_a_third_of_e_gen_is_the_record():
    """The docs' count of placements at height 0.8 confirmed on the SGD arms is the record's."""
    rec = json.loads(STUDY.read_text())
    hits = sum(round(5 * r["power"]["power"]["0.8"]) for r in rec["runs"] if r["arm"].startswith("sgd_lr"))
    total = 5 * sum(1 for r in rec["runs"] if r["arm"].startswith("sgd_lr"))
    text = (ROOT / "docs/events.md").read_text()
    assert re.findall(r"<!-- dd:p08 -->(.*?)<!-- /dd -->", text) == [f"{hits} of the {total}"]


def _pct(share: float) -> str:
    """A share as the pages print it: a whole percent with a space before the sign ("12 %")."""
    return f"{100 * share:.0f} %"


def test_the_scorecard_quotes_the_adam_arms_power_from_its_record():
    rec = json.loads((ROOT / "experiments/results/double_descent_study_adam1000.json").read_text())
    found = rec["verdicts"]["adam_ema"]["detectable"]
    text = (ROOT / "docs/scorecard.md").read_text()
    got = dict(re.findall(r"<!-- sc:(\w+) -->(.*?)<!-- /sc -->", text))
    assert got["adam_share"] == _pct(found['share_of_e_gen'])
    assert got["adam_power"] == _pct(found['power'])
    assert found["height"] == 0.2
    sgd = json.loads(STUDY.read_text())["verdicts"]["sgd_ema_lr0.01"]["detectable"]
    assert got["sgdema_share"] == _pct(sgd['share_of_e_gen'])
    assert got["sgdema_power"] == _pct(sgd['power']) and sgd["height"] == 0.2
    lo, hi = sorted(round(100 * v["share_of_e_gen"]) for v in (found, sgd))
    assert f"ascent of {lo}–{hi} % of E_gen" in (ROOT / "README.md").read_text()  # the two EMA arms


# ----------------------------------------------------------------------------- ICR U-Net, level 3 (issue 42 item 5)
def _icr_unet_quotes(res: dict) -> dict:
    """Every number docs/icr.md and docs/scorecard.md quote from icr_unet.json between
    ``<!-- icr:KEY -->`` and ``<!-- /icr -->``, by KEY (level 3 = ``icr/icr``; ``v_`` = the level-1
    variant ``icr_l1``; ``s_`` / ``l_`` = N = 64 / N = 1024)."""
    S, L = res["runs"]["small"], res["runs"]["large"]
    out = {}
    for p, r in (("s", S), ("l", L)):
        sm, rv, d = r["summary"], r["rise_vs_spread"], r["diagnostics"]
        pv = {row["epoch"]: row for row in r["paired_vs_min"]["icr/icr"]["rows"]}
        out.update({f"{p}_first": sm["icr_first"], f"{p}_min": sm["icr_min"], f"{p}_min_ep": sm["icr_min_epoch"],
                    f"{p}_last": sm["icr_last"], f"{p}_rise": rv["rise_last_minus_min"],
                    f"{p}_sd_best": rv["sd_best"], f"{p}_sd_last": rv["sd_last"],
                    f"{p}_range_best": rv["range_best"], f"{p}_range_last": rv["range_last"],
                    f"{p}_rise_over_sd": rv["rise_over_sd"], f"{p}_pos": rv["paired_rise_positive_seeds"],
                    f"{p}_held_mean": rv["paired_rise_other_seeds_mean"],
                    f"{p}_held_se": rv["paired_rise_other_seeds_se"], f"{p}_held_min": rv["paired_rise_other_seeds_min"],
                    f"{p}_z19": pv[19]["z"], f"{p}_random": d["random_linear_map_of_input"]["icr"],
                    f"{p}_untrained": d["tap_untrained"]["icr"], f"{p}_cond": r["tau_effect"]["max_cond_xi"],
                    f"{p}_tau_diff": r["tau_effect"]["max_abs_diff"],
                    f"{p}_plain": r["early_stopping"]["plain_patience_stop_epoch"],
                    f"{p}_es_best": r["early_stopping"]["best_epoch"]})
        vs, vrv = r["variant"]["summary"], r["variant"]["rise_vs_spread"]
        out.update({f"v_{p}_first": vs["icr_first"], f"v_{p}_min": vs["icr_min"], f"v_{p}_min_ep": vs["icr_min_epoch"],
                    f"v_{p}_last": vs["icr_last"], f"v_{p}_rise": vrv["rise_last_minus_min"],
                    f"v_{p}_sd_best": vrv["sd_best"], f"v_{p}_sd_last": vrv["sd_last"],
                    f"v_{p}_pos": vrv["paired_rise_positive_seeds"], f"v_{p}_held_mean": vrv["paired_rise_other_seeds_mean"],
                    f"v_{p}_held_se": vrv["paired_rise_other_seeds_se"]})
        ep = r["epochs"]
        out.update({f"{p}_trs": ep[-1]["icr/trace_s"] / ep[0]["icr/trace_s"],
                    f"{p}_trx": ep[-1]["icr/trace_xi"] / ep[0]["icr/trace_xi"],
                    f"v_{p}_trs": ep[-1]["icr_l1/trace_s"] / ep[0]["icr_l1/trace_s"],
                    f"v_{p}_trx": ep[-1]["icr_l1/trace_xi"] / ep[0]["icr_l1/trace_xi"]})
    se, sm = S["epochs"], S["summary"]
    pv = {row["epoch"]: row for row in S["paired_vs_min"]["icr/icr"]["rows"]}
    onset = [e for e in S["report"]["events"] if e["name"] == "memorization_onset"][0]
    ts = [e["icr/trace_s"] for e in se]
    peak = max(range(len(ts)), key=ts.__getitem__)
    low = min(range(peak, len(ts)), key=ts.__getitem__)
    out.update({"s_ep2": se[2]["icr/icr"], "s_ep5": se[5]["icr/icr"], "s_z2": pv[2]["z"], "s_z5": pv[5]["z"],
                "s_onset": sm["mem_onset_epoch"], "s_first_nonzero": sm["mem_first_nonzero_epoch"],
                "s_det_onset": onset["epoch"], "s_det_z": onset["z"], "s_lead": sm["lead_epochs"],
                "s_mem_last": sm["mem_last"], "s_kept": S["diagnostics"]["best_checkpoint"]["icr_remeasured"],
                "s_cond_untr": S["diagnostics"]["tap_untrained"]["cond_xi"] / 1e11,
                "s_trs_peak": ts[peak], "s_trs_peak_ep": peak, "s_trs_low": ts[low], "s_trs_low_ep": low,
                "s_trx_last": se[-1]["icr/trace_xi"],
                "l_argmin_rel": L["tau_effect"]["argmin_relative"],
                "l_ep7": L["epochs"][L["tau_effect"]["argmin_relative"]]["icr/icr"]})
    vl = S["diagnostics"]["view_seed_spread_last_icr_l1"]["values"]
    out.update({"v_s_last_seed_min": min(vl), "v_s_last_seed_max": max(vl)})
    mv = S["diagnostics"]["many_views"]
    for tag, dp in (("mv16", "16"), ("mvfull", "None")):
        for i in (0, 1):
            out[f"{tag}_b{i + 1}"] = mv[f"d_proj={dp}/best"][i]
            out[f"{tag}_l{i + 1}"] = mv[f"d_proj={dp}/last"][i]
    rows = res["sweeps"]["large_last"]["rows"]
    i_min = min(range(len(rows)), key=lambda i: rows[i]["icr"])
    out.update({"l_sw_sigma": rows[i_min]["sigma"], "l_sw_min": rows[i_min]["icr"], "l_sw_se": rows[i_min]["icr_se"],
                "l_sw_low": rows[0]["icr"], "l_sw_high": rows[-1]["icr"],
                "l_probe": max(row["probe_acc"] for row in rows)})
    for n in ("small", "large"):
        sec = res["wall_seconds"][f"fit_{n}"]
        out[f"fit_{n}"] = f"{int(sec // 60)} min {round(sec % 60)} s"
    return out


def _quoted_agrees(cell: str, value) -> bool:
    if isinstance(value, str):
        return cell == value
    cell = cell.replace("−", "-")
    if re.fullmatch(r"[+-]?\d+", cell) and isinstance(value, int):
        return int(cell) == value
    if not re.fullmatch(r"[+-]?\d+(\.\d+)?", cell):
        return False
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return f"{value:{'+' if cell[0] == '+' else ''}.{decimals}f}" == cell


def _icr_marks(text: str) -> list:
    return re.findall(r"<!-- icr:(\w+) -->(.*?)<!-- /icr -->", text)


@pytest.mark.parametrize("page,at_least", [("docs/icr.md", 60), ("docs/scorecard.md", 30)])
def test_the_icr_unet_numbers_quoted_are_the_level3_record(page, at_least):
    """docs/icr.md's U-Net section and the scorecard's ICR rows quote icr_unet.json: each marked
    number equals the record, rounded as printed (a changed record fails until the text follows)."""
    want = _icr_unet_quotes(ICR_UNET)
    marks = _icr_marks((ROOT / page).read_text())
    wrong = [f"{k}: page {v!r}, record {want.get(k)!r}" for k, v in marks
             if k not in want or not _quoted_agrees(v, want[k])]
    assert wrong == [] and len(marks) >= at_least, (wrong, len(marks))


def test_the_icr_unet_quote_check_can_fail():
    want = _icr_unet_quotes(ICR_UNET)
    assert _quoted_agrees(f"{want['s_rise']:.3f}", want["s_rise"])
    assert not _quoted_agrees(f"{want['s_rise'] + 0.001:.3f}", want["s_rise"])
    assert not _quoted_agrees("−0.004", 0.004) and _quoted_agrees("+0.079", 0.0792) and not _quoted_agrees("0.08", 0.0792 + 0.01)


def test_the_icr_unet_tables_in_the_docs_are_the_record():
    sys.path.insert(0, str(ROOT / "experiments"))
    from icr_unet import doc_tables

    text = (ROOT / "docs/icr.md").read_text()
    for name, table in doc_tables(ICR_UNET).items():
        block = re.search(rf"<!-- icr-unet-{name}:start -->\n(.*?)<!-- icr-unet-{name}:end -->", text, re.S)
        assert block is not None, name
        assert block.group(1) == table, name


def test_the_icr_unet_configs_report_level3_with_a_level1_variant():
    import yaml

    for name in ("small", "large"):
        cfg = yaml.safe_load((ROOT / f"lightning_pfd/configs/experiments/icr_unet_{name}.yaml").read_text())
        mons = [c["init_args"] for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("ICRMonitor")]
        main = [m for m in mons if m.get("name", "icr") == "icr"]
        var = [m for m in mons if m.get("name") == "icr_l1"]
        assert len(mons) == 2 and len(main) == 1 and len(var) == 1
        assert main[0]["level"] == 3 and var[0]["level"] == 1
        for k in ("d_proj", "seed", "views_per_image"):
            assert main[0][k] == var[0][k]
        assert ICR_UNET["runs"][name]["summary"]["level"] == 3
        assert ICR_UNET["runs"][name]["variant"]["summary"]["level"] == 1


def test_the_sgd_ema_1000_epoch_table_and_numbers_are_the_record():
    from double_descent_study import table

    text = (ROOT / "docs/events.md").read_text()
    record = json.loads((ROOT / "experiments/results/double_descent_study_sgdema1000.json").read_text())
    block = re.search(r"<!-- study-table-sgdema1000:start -->\n(.*?)<!-- study-table-sgdema1000:end -->", text, re.S)
    assert block is not None and block.group(1) == table(record)
    got = dict(re.findall(r"<!-- sgdema:(\w+) -->(.*?)<!-- /sgdema -->", text))
    runs = record["runs"]
    left = [r["epochs_run"] - 1 - r["first_descent"]["epoch"] for r in runs]
    found = record["verdicts"]["sgd_ema_lr0.01"]["detectable"]
    assert got == {"ends": ", ".join(str(r["first_descent"]["epoch"]) for r in runs),
                   "left": f"{min(left)}–{max(left)}",
                   "share": _pct(found['share_of_e_gen'])}
    assert all(r["first_descent"]["ended"] for r in runs) and not record["verdicts"]["sgd_ema_lr0.01"]["confirmed_seeds"]
    ends = sorted(r["first_descent"]["epoch"] for r in runs)
    assert f"end their first descent late (epochs {ends[0]}–{ends[-1]})" in (ROOT / "docs/scorecard.md").read_text()


def test_the_sweeps_step_budget_is_the_configs():
    """docs/sweeps.md's passes over the data per trial follow from the shipped sweep and its base:
    max_epochs x steps per epoch x batch / N."""
    import yaml

    sweep = yaml.safe_load((ROOT / "lightning_pfd/configs/sweeps/mtog_digits.yaml").read_text())
    base = yaml.safe_load((ROOT / "lightning_pfd/configs/quickstart.yaml").read_text())
    epochs = sweep["shared"]["trainer.max_epochs"]
    batch = base["data"]["init_args"]["batch_size"]
    steps = base["data"]["init_args"]["samples_per_epoch"] // batch
    ns = sweep["grid"]["data.init_args.n_train"]
    samples = epochs * steps * batch
    text = " ".join((ROOT / "docs/sweeps.md").read_text().split())
    assert (f"the same {epochs * steps} steps of batch {batch}" in text and f"{samples:,}".replace(",", " ") in text)
    assert f"{samples // min(ns):,}".replace(",", " ") + f" passes over the data at N = {min(ns)}, " \
        f"{round(samples / max(ns))} at N = {max(ns)}" in text
