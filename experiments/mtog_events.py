"""Per-trial events of a sweep (issue: events you can trust, item 5), read back from the trials' files.

For every trial directory of a finished sweep (``runs/<sweep>/<trial-id>/``) it runs the same
analysis as ``python -m lightning_pfd report`` on that trial: the CSV log, the per-unit records in
``per_unit/`` (held-out tests with paired per-seed errors) and the detector settings the trial's
RegimeMonitor saved. It also reads what the RegimeMonitor decided at the end of the trial
(``events/<name>_confirmed`` / ``_moved`` / ``_retracted`` in the CSV) and checks that both agree (the same events, at the epoch the run logged last). Writes
``experiments/results/<sweep>_events.json`` and a markdown table (events per cell: N × width,
both repeats)::

    python -m lightning_pfd sweep --config mtog_digits      # the sweep (41 min on 2 cores)
    python experiments/mtog_events.py runs/mtog_digits      # this analysis (~1 min)
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from lightning_pfd.analysis import analyze_history, load_history
from lightning_pfd.analysis.per_unit import find_store, load_units
from lightning_pfd.analysis.report import DEFAULT_SETTINGS, find_saved_settings

ROOT = Path(__file__).resolve().parents[1]


def trial_events(trial: Path) -> dict:
    res = json.loads((trial / "trial_result.json").read_text())
    hist = load_history(trial / "csv", source="csv")
    saved, _, _ = find_saved_settings(hist)
    settings = dict(DEFAULT_SETTINGS, **(saved or {}))
    units, problems = load_units(find_store(trial))
    a = analyze_history(hist.series_dict(), units=units, keys=settings["keys"], window=settings["window"],
                        min_sigma=settings["min_sigma"], min_rel=settings["min_rel"],
                        confirm=settings["confirm"], require_descent=settings["require_descent"])
    online = {}
    for key in hist.keys():
        if key.startswith("events/") and key.endswith(("_confirmed", "_retracted", "_moved")):
            name, status = key[len("events/"):].rsplit("_", 1)
            online[name] = status
    found = {e.name: e for e in a.events}
    return {"trial": trial.name, "n_train": res["n_train"], "n_params": res["n_params"],
            "model": res["model_label"], "seed": res["seed"],
            "events": [{"name": e.name, "epoch": e.epoch, "z": e.significance,
                        "held_out": bool(e.detail.get("held_out")),
                        "legs": {k: {"diff": v["diff"], "se": v["se"], "z": v["z"]}
                                 for k, v in e.detail.get("legs", {}).items()}} for e in a.events],
            "regime": None if a.regime is None else a.regime.name,
            "online_final": online,
            # "moved": the final test confirmed the event at another epoch than the provisional one;
            # both at the epoch the run logged last for it
            "agrees_with_run": all((online.get(n) in ("confirmed", "moved")) == (n in found)
                                   and (n not in found or _last(hist, f"events/{n}_epoch") == float(found[n].epoch))
                                   for n in set(online) | set(found) if n != "memorization_lead"),
            "settings": {k: settings[k] for k in ("window", "min_sigma", "confirm")},
            "per_unit_metrics": sorted(units), "per_unit_problems": problems}


def _last(hist, key: str) -> float:
    """The last value the run logged for ``key`` (NaN if never)."""
    _, ys = hist.series(key)
    return float(ys[-1]) if len(ys) else math.nan


def table(rows: list) -> str:
    cells = defaultdict(list)
    for r in rows:
        cells[(r["n_train"], r["n_params"], r["model"])].append(r)
    widths = sorted({(r["n_params"], r["model"]) for r in rows})
    ns = sorted({r["n_train"] for r in rows})
    short = {"early_learning": "EL", "memorization_onset": "MO", "double_descent": "DD", "icr_minimum": "IM"}
    out = ["| N \\ model | " + " | ".join(f"{m} ({p / 1e6:.2f}M)" for p, m in widths) + " |",
           "|---|" + "---|" * len(widths)]
    for n in ns:
        row = []
        for p, m in widths:
            parts = []
            for r in sorted(cells[(n, p, m)], key=lambda r: r["seed"]):
                ev = ", ".join(f"{short.get(e['name'], e['name'])} {e['z']:.1f}" for e in r["events"]) or "—"
                parts.append(ev)
            row.append(" / ".join(parts))
        out.append(f"| {n} | " + " | ".join(row) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    trials = sorted(p for p in args.sweep_dir.iterdir() if (p / "trial_result.json").is_file())
    rows = [trial_events(t) for t in trials]
    counts = defaultdict(int)
    for r in rows:
        for e in r["events"]:
            counts[e["name"]] += 1
    summary = {"trials": len(rows), "events": dict(counts),
               "agree_with_run": sum(r["agrees_with_run"] for r in rows),
               "held_out": sum(e["held_out"] for r in rows for e in r["events"]),
               "median_z": {k: sorted(e["z"] for r in rows for e in r["events"] if e["name"] == k)[
                   counts[k] // 2] if counts[k] else math.nan for k in counts}}
    out = args.out or ROOT / "experiments" / "results" / f"{args.sweep_dir.name}_events.json"
    md = table(rows)
    out.write_text(json.dumps({"summary": summary, "trials": rows, "table_md": md}, indent=1))
    print(md)
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
