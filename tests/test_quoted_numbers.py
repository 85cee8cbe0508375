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


def test_the_icr_trace_and_onset_numbers_are_the_records():
    card = (ROOT / "docs/scorecard.md").read_text()
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
def test_the_v6_calibration_tables_are_generated_from_their_records():
    """docs/events.md's calibration-v6 block is docs_block() of the two recorded files, and the
    prose's power figures are theirs."""
    import calibrate_events as ce  # experiments/ (tests/conftest.py puts it on the path)

    nulls = json.loads((ROOT / "experiments/results/calibrate_events_v6.json").read_text())
    power = json.loads((ROOT / "experiments/results/calibrate_events_v6_power.json").read_text())
    assert not nulls.get("partial") and all(r["runs"] >= 300 for r in nulls["nulls"].values())
    text = (ROOT / "docs/events.md").read_text()
    a = text.index(ce.DOCS_MARKERS[0]) + len(ce.DOCS_MARKERS[0])
    assert text[a:text.index(ce.DOCS_MARKERS[1])] == "\n" + ce.docs_block(nulls, power)
    cell = {(r["event"], r["family"], r["num_seeds"]): f"{r['planted']['found']}/{r['runs']}" for r in power["power"]}
    want = {"fgn_dd": cell[("double_descent", "fgn_h0.8_m1024", 2048)],
            "cos_el": cell[("early_learning", "cosine_m256", 2048)],
            "cos_dd": cell[("double_descent", "cosine_m256", 2048)]}
    assert dict(re.findall(r"<!-- v6p:(\w+) -->(.*?)<!-- /v6p -->", text)) == want


def test_the_v6_prose_names_the_families_over_two_percent():
    nulls = json.loads((ROOT / "experiments/results/calibrate_events_v6.json").read_text())["nulls"]
    over = sorted(f for f, r in nulls.items() if r["rate"] > 0.02)
    text = " ".join((ROOT / "docs/events.md").read_text().split())
    for f in over:
        r = nulls[f]
        assert f"`{f}`" in text
        assert f"{r['any_confirmed']}/{r['runs']} = {100 * r['rate']:.1f} %" in text
    assert over == ["heavy_t_m1024", "heavy_t_spikes_m1024"]  # the prose names exactly these


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
