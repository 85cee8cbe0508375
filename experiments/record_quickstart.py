"""Record the quickstart's curves and events: ``experiments/results/quickstart_record.json``.

README.md and docs/getting-started.md quote the quickstart's per-epoch values and its events;
``tests/test_quoted_numbers.py`` checks every quoted number against this record, so the text
cannot drift from what the run gives. This script makes the record from a finished quickstart run
(its CSV log through ``load_history``: the last value per epoch, and its ``report/events.json``),
optionally running the quickstart first.

Usage (from the repository root, in the project's virtualenv):

    python experiments/record_quickstart.py --fit          # run the quickstart (a few min), record it
    python experiments/record_quickstart.py --run DIR      # record a finished quickstart run in DIR
    python experiments/record_quickstart.py --run DIR --check   # compare with the record, write nothing

``--check`` exits 1 and lists the differences when the run's values or events differ from the
record (at the printed precision of the pages: 1e-9 relative).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "experiments" / "results" / "quickstart_record.json"
COMMAND = ["python", "-m", "lightning_pfd", "--threads", "1", "fit"]
#: the rows the pages quote: label -> logged key
CURVES = {"E_gen": "pfd/e_gen", "E_mem": "pfd/e_mem", "memorization ratio": "mem/ratio",
          "ℓ_train (frozen noise)": "loss/train_fixed", "ℓ_test − ℓ_train": "loss/gap",
          "ICR (MLP `middle_hidden` tap)": "icr/icr"}
#: what each recorded event keeps of events.json
LEGS = ("descent", "rise")


def run_quickstart(workdir: Path) -> Path:
    """``python -m lightning_pfd --threads 1 fit`` (the embedded quickstart) in ``workdir``."""
    subprocess.run([sys.executable, *COMMAND[1:]], cwd=workdir, check=True)
    return workdir / "runs" / "quickstart"


def record(run: Path) -> dict:
    """The record of the finished quickstart run in ``run`` (module docstring)."""
    from lightning_pfd.analysis.history import load_history

    series = load_history(run).series_dict()
    curves = {}
    for label, key in CURVES.items():
        epochs, values = series[key]
        curves[label] = {"key": key, "values": {str(int(e)): float(v) for e, v in zip(epochs, values)}}
    events = json.loads((run / "report" / "events.json").read_text())["events"]
    kept = []
    for e in events:
        legs = {name: {k: float(e["legs"][name][k]) for k in ("diff", "se", "z")}
                for name in LEGS if name in (e.get("legs") or {})}
        kept.append({"name": e["name"], "epoch": int(e["epoch"]), "significance": float(e["significance"]),
                     "legs": legs})
    return {"command": " ".join(COMMAND) + "   (the embedded quickstart, 24 epochs)",
            "note": "per-epoch values as logged in runs/quickstart/csv (load_history: the last value per "
                    "epoch); README.md and docs/getting-started.md quote them (tests/test_quoted_numbers.py); "
                    "made by experiments/record_quickstart.py",
            "machine": platform.machine(), "curves": curves, "events": kept}


def differences(new: dict, old: dict, rel: float = 1e-9) -> list:
    """What differs between two records (values beyond ``rel``, events by name and epoch)."""
    out = []
    for label, c in old["curves"].items():
        got = new["curves"].get(label, {}).get("values", {})
        for ep, v in c["values"].items():
            w = got.get(ep)
            if w is None or not math.isclose(w, v, rel_tol=rel, abs_tol=1e-12):
                out.append(f"{label} epoch {ep}: {v!r} -> {w!r}")
    key = lambda r: [(e["name"], e["epoch"]) for e in r["events"]]  # noqa: E731
    if key(new) != key(old):
        out.append(f"events: {key(old)} -> {key(new)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None, help="a finished quickstart run directory (runs/quickstart)")
    ap.add_argument("--fit", action="store_true", help="run the quickstart first (in a temporary folder)")
    ap.add_argument("--check", action="store_true", help="compare with the record; write nothing")
    args = ap.parse_args(argv)
    if (args.run is None) == (not args.fit):
        ap.error("give exactly one of --run DIR and --fit")
    with tempfile.TemporaryDirectory() as tmp:
        run = run_quickstart(Path(tmp)) if args.fit else Path(args.run)
        new = record(run)
    if args.check:
        diff = differences(new, json.loads(RECORD.read_text()))
        print("\n".join(diff) if diff else "the run equals the record")
        return 1 if diff else 0
    RECORD.write_text(json.dumps(new, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
