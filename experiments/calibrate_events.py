"""Calibrate the event detectors on whole synthetic runs: false events per run on named null
families (tune / held-out split), power on planted events.

Every family of :data:`calibration.FAMILIES` generates whole runs (E_gen
and E_mem with M per-seed squared distances, the memorization ratio with per-sample
indicators, ICR with 16 jackknife replicates; docs/events.md, "Null families") without any
event; :func:`~lightning_pfd.analysis.events.analyze_history` runs on each with its default
settings, as ``python -m lightning_pfd report`` does on the same run written to disk. Counted
per family: runs with any *confirmed* event (Wilson 95 % interval), per event name, undecided
events, median significance, the detector's time per run. Then the power: the fraction of runs
in which a planted event is confirmed, on :data:`~calibration.POWER_FAMILIES`
(all held out; ``--power-families tails``: POWER_FAMILIES_TAILS, the spike, heavy-tail and
schedule families of issue 41): early learning and double descent at M = 2048 and M = 256,
memorization onset and the ICR minimum (curves that do not depend on M) at M = 256.

Tune the detectors on ``--split tune`` only; report ``--split held_out``. Writes
``experiments/results/calibrate_events_v2.json`` (``--out``) and the markdown tables
(``--md``, default the same path with ``.md``)::

    OMP_NUM_THREADS=1 python experiments/calibrate_events.py --split held_out --jobs 2
    OMP_NUM_THREADS=1 python experiments/calibrate_events.py --split tune --runs 50 --runs-large 20 --power-runs 0

``--runs`` (default 300) is the number of runs of a family with M <= 1024 seeds; families with
more seeds get ``--runs-large`` (default 100; the detector costs ~1-3 s per run there), stated
in the table. (The previous version of this script, single detectors on 500-evaluation E_gen
curves, wrote ``experiments/results/calibrate_events.json``.)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

from calibration import (FAMILIES, HELD_OUT, TUNE, POWER_FAMILIES, POWER_FAMILIES_TAILS, calibrate_families,
                                                simulate_run, split)
from lightning_pfd.analysis.events import MIN_SIGMA, analyze_history

ROOT = Path(__file__).resolve().parents[1]
LARGE_M = 1024
#: planted heights: E_gen events (E units), the ratio's rise (rate), ICR's legs (ICR units)
HEIGHTS = {"early_learning": 0.2, "double_descent": 0.2, "memorization_onset": 0.05, "icr_minimum": 0.01}


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.1f} %" if n else "—"


def _ci(ci) -> str:
    lo, hi = ci
    return "—" if lo is None or (isinstance(lo, float) and math.isnan(lo)) else f"[{100 * lo:.1f}, {100 * hi:.1f}] %"


def _z(z) -> str:
    return "—" if z is None or (isinstance(z, float) and math.isnan(z)) else f"{z:.1f}"


def null_table(results: dict, side: str) -> str:
    lines = [f"| family ({side}) | structure | T | M | runs | any confirmed event | Wilson 95 % | "
             "per event (confirmed) | undecided runs | median z | s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        per = ", ".join(f"{ev} {v['confirmed']}" for ev, v in r["events"].items() if v["confirmed"]) or "—"
        lines.append(f"| {name} | {r['structure']} | {r['n_eval']} | {r['num_seeds']} | {r['runs']} | "
                     f"{r['any_confirmed']}/{r['runs']} ({_pct(r['any_confirmed'], r['runs'])}) | "
                     f"{_ci(r['ci95'])} | {per} | {r['any_undecided']} | {_z(r['median_significance'])} | "
                     f"{r['detector_seconds_per_run']:.2f} |")
    return "\n".join(lines)


def power_table(power: dict) -> str:
    lines = ["| planted event | height | family | M | runs | confirmed (power) | Wilson 95 % | median z |",
             "|---|---|---|---|---|---|---|---|"]
    for row in power:
        p = row["planted"]
        lines.append(f"| {row['event']} | {row['height']:g} | {row['family']} | {row['num_seeds']} | "
                     f"{row['runs']} | {p['found']}/{row['runs']} ({_pct(p['found'], row['runs'])}) | "
                     f"{_ci(p['ci95'])} | {_z(row['median_z'])} |")
    return "\n".join(lines)


#: the markers of the generated list of null families in docs/events.md (tests compare them)
FAMILY_MARKERS = ("<!-- families:start -->", "<!-- families:end -->")


def family_table() -> str:
    """Every null family of ``experiments/calibration.py`` with its side of the split, as
    docs/events.md lists them between :data:`FAMILY_MARKERS` (generated from ``FAMILIES``)."""
    lines = [f"**The split is fixed in code** (`TUNE`, `HELD_OUT`): {len(TUNE)} families to tune on and "
             f"{len(HELD_OUT)} held out, {len(FAMILIES)} in all.", "",
             "| family | side | structure | T | M | null structure |", "|---|---|---|---|---|---|"]
    for name, f in FAMILIES.items():
        side = "tune" if name in TUNE else "held-out"
        lines.append(f"| `{name}` | {side} | {f.structure} | {f.n_eval} | {f.num_seeds} | {f.description} |")
    return "\n".join(lines)


#: the markers of the generated tables of this release in docs/events.md (``--write-docs``;
#: tests compare them); :data:`V7_DOCS_MARKERS`: the previous release's block, kept as it was
DOCS_MARKERS = ("<!-- calibration-v8:start -->", "<!-- calibration-v8:end -->")
V7_DOCS_MARKERS = ("<!-- calibration-v7:start -->", "<!-- calibration-v7:end -->")


def docs_block(nulls_record: dict, power_record: dict) -> str:
    """The held-out table and the power table of two recorded results, as docs/events.md
    shows them between :data:`DOCS_MARKERS` (generated, never typed: issue 42)."""
    return "\n".join([f"Nulls: `{nulls_record['command']}`.", "", null_table(nulls_record["nulls"], "held_out"), "",
                      f"Power: `{power_record['command']}`.", "", power_table(power_record["power"]), ""])


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def changed_nulls(old: dict, new: dict) -> str:
    """The held-out families whose count changed between two null records, as docs/events.md's
    sentence ("four families changed, each down: `f` 6 → 4, ...")."""
    ch = [(f, old[f]["any_confirmed"], r["any_confirmed"]) for f, r in new.items()
          if f in old and old[f]["any_confirmed"] != r["any_confirmed"]]
    way = "each down" if all(b < a for _, a, b in ch) else "up or down"
    return (f"{_WORDS.get(len(ch), str(len(ch)))} families changed, {way}: "
            + ", ".join(f"`{f}` {a} → {b}" for f, a, b in ch))


def changed_power(old: list, new: list) -> str:
    """The power cells whose count changed between two power records, as docs/events.md's list:
    "early learning on `f` at M = 2048 35 → 34, ..."."""
    key = lambda r: (r["event"], r["family"], r["num_seeds"])  # noqa: E731
    before = {key(r): r["planted"]["found"] for r in old}
    out = [f"{r['event'].replace('_', ' ')} on `{r['family']}` at M = {r['num_seeds']} {before[key(r)]} → {r['planted']['found']}"
           for r in new if key(r) in before and before[key(r)] != r["planted"]["found"]]
    return "; ".join(out)


def write_docs(nulls_path: Path, power_path: Path, page: Path = ROOT / "docs/events.md") -> None:
    """Replace the block between :data:`DOCS_MARKERS` of ``page`` by :func:`docs_block`."""
    text = page.read_text()
    a, b = text.index(DOCS_MARKERS[0]) + len(DOCS_MARKERS[0]), text.index(DOCS_MARKERS[1])
    block = docs_block(json.loads(Path(nulls_path).read_text()), json.loads(Path(power_path).read_text()))
    page.write_text(text[:a] + "\n" + block + text[b:])


def measure_cost(names, repeats: int = 3) -> dict:
    """Seconds per run of the generator and of analyze_history, by family (a few runs)."""
    out = {}
    for name in names:
        fam = FAMILIES[name]
        t_sim = t_det = 0.0
        for r in range(repeats):
            t0 = time.perf_counter()
            series, units = simulate_run(fam, 10 ** 6 + r)
            t1 = time.perf_counter()
            analyze_history(series, units=units)
            t_det += time.perf_counter() - t1
            t_sim += t1 - t0
        out[name] = {"simulate_s": t_sim / repeats, "analyze_history_s": t_det / repeats}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=("tune", "held_out", "all"), default="held_out",
                    help="which null families: tune (the detectors may be tuned on them), held_out "
                         "(reported, never tuned on) or all (default held_out)")
    ap.add_argument("--runs", type=int, default=300, help=f"runs per family with M <= {LARGE_M} (default 300)")
    ap.add_argument("--runs-large", type=int, default=100,
                    help=f"runs per family with M > {LARGE_M} (default 100: ~1-3 s per run)")
    ap.add_argument("--power-runs", type=int, default=100,
                    help="runs per planted event / family / M (default 100; 0: no power table)")
    ap.add_argument("--families", nargs="*", default=None, help="only these families (names)")
    ap.add_argument("--power-events", nargs="*", default=None, choices=sorted(HEIGHTS),
                    help="measure the power of these events only (default: all)")
    ap.add_argument("--power-families", choices=("default", "tails", "all"), default="default",
                    help="power on POWER_FAMILIES (default), on POWER_FAMILIES_TAILS (spikes, heavy tails, "
                         "schedules; issue 41) or on both")
    ap.add_argument("--power-m", nargs="*", type=int, default=[2048, 256],
                    help="the numbers of seeds M of the power table (default 2048 256)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--seed0", type=int, default=10_000)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/calibrate_events_v2.json"))
    ap.add_argument("--md", default=None, help="markdown tables (default: --out with .md)")
    ap.add_argument("--write-families", action="store_true",
                    help="only write the list of null families into docs/events.md (between its families "
                         "markers) and exit")
    ap.add_argument("--write-docs", nargs=2, metavar=("NULLS_JSON", "POWER_JSON"), default=None,
                    help="only write the tables of two recorded results into docs/events.md (between "
                         "its calibration-v8 markers) and exit")
    args = ap.parse_args(argv)
    if args.write_families:
        page = ROOT / "docs/events.md"
        text = page.read_text()
        a, b = text.index(FAMILY_MARKERS[0]) + len(FAMILY_MARKERS[0]), text.index(FAMILY_MARKERS[1])
        page.write_text(text[:a] + "\n" + family_table() + "\n" + text[b:])
        return 0
    if args.write_docs:
        write_docs(Path(args.write_docs[0]), Path(args.write_docs[1]))
        return 0
    for name in ("runs", "runs_large", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.power_runs < 0:
        ap.error(f"--power-runs must be >= 0, got {args.power_runs}")
    names = list(split(args.split))
    if args.families:
        unknown = [f for f in args.families if f not in FAMILIES]
        if unknown:
            ap.error(f"--families: unknown {unknown}; known: {sorted(FAMILIES)}")
        names = [n for n in names if n in args.families]
    t0 = time.time()
    cost = measure_cost([n for n in ("seed_flip_m256", "seed_flip_m2048", "ar1_m4096") if n in FAMILIES])
    print("cost per run (simulate, analyze_history): " + ", ".join(
        f"{k} {v['simulate_s']:.2f} s, {v['analyze_history_s']:.2f} s" for k, v in cost.items()), flush=True)
    runs = {n: (args.runs if FAMILIES[n].num_seeds <= LARGE_M else args.runs_large) for n in names}

    partial = {}
    command = "python experiments/calibrate_events.py " + " ".join(sys.argv[1:] if argv is None else argv)

    def progress(name, r):
        partial[name] = r  # a run stopped midway leaves the families it finished
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": command, "partial": True, "nulls": partial}, indent=2))
        print(f"{name:28s} {r['any_confirmed']:4d}/{r['runs']:<4d} any confirmed "
              f"({_pct(r['any_confirmed'], r['runs'])}, Wilson {_ci(r['ci95'])}), undecided {r['any_undecided']}, "
              f"{r['wall_s']:.0f} s", flush=True)

    nulls = calibrate_families(names, runs, analyze_history, seed0=args.seed0, jobs=args.jobs, progress=progress)
    power = []
    power_fams = {"default": POWER_FAMILIES, "tails": POWER_FAMILIES_TAILS,
                  "all": POWER_FAMILIES + POWER_FAMILIES_TAILS}[args.power_families]
    if args.power_runs:
        for m in args.power_m:
            for event, h in HEIGHTS.items():
                if args.power_events and event not in args.power_events:
                    continue
                if m != min(args.power_m) and event in ("memorization_onset", "icr_minimum"):
                    continue  # the ratio and ICR do not depend on M: once, at the smallest M
                for name in power_fams:
                    fam = dataclasses.replace(FAMILIES[name], num_seeds=m, name=f"{name}@M{m}")
                    r = calibrate_families([fam], args.power_runs, analyze_history, event=event, height=h,
                                           seed0=args.seed0 + 1, jobs=args.jobs)[fam.name]
                    power.append({"event": event, "height": h, "family": name, "num_seeds": m,
                                  "runs": r["runs"], "planted": r["planted"][event],
                                  "median_z": r["events"].get(event, {}).get("median_significance", math.nan),
                                  "false_other": {k: v["confirmed"] for k, v in r["events"].items() if k != event}})
                    print(f"power {event} h={h:g} {name} M={m}: {r['planted'][event]['found']}/{r['runs']}",
                          flush=True)
    wall = time.time() - t0
    out = {"command": command, "split": args.split, "min_sigma": MIN_SIGMA, "runs": args.runs,
           "runs_large": args.runs_large, "large_m": LARGE_M, "power_runs": args.power_runs,
           "heights": HEIGHTS, "power_families": list(power_fams), "seed0": args.seed0, "jobs": args.jobs, "cost_per_run": cost,
           "nulls": nulls, "power": power, "wall_s": wall, "python": platform.python_version()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    md = [f"Command: `{command}` ({wall / 60:.1f} min, min_sigma {MIN_SIGMA}).", "",
          null_table(nulls, args.split)]
    if power:
        md += ["", power_table(power)]
    md_path = Path(args.md) if args.md else Path(args.out).with_suffix(".md")
    md_path.write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"\nwrote {args.out} and {md_path} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
