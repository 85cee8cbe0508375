"""Calibrate the event detectors: false events on realistic nulls, power on planted events.

For every null family of :mod:`lightning_pfd.analysis.calibration` (500 evaluations, a monotone
E_gen trend; white noise, AR(1) with φ 0.9 / 0.95 / 0.97 and sd 0.049, the per-seed seed-flip
null at M = 256 and 2048 seeds, the same plus a common training-noise AR(1)), it counts the runs
in which :func:`~lightning_pfd.analysis.events.detect_early_learning` or
:func:`~lightning_pfd.analysis.events.detect_double_descent` reports an event with the default
settings (window 5, confirm 3, min_sigma = MIN_SIGMA). Then the power: the fraction of runs that
find a planted double-descent bump / early-learning rise of a given height, on the seed-flip null
with M = 2048 and 256 seeds. Writes ``experiments/results/calibrate_events.json`` and prints the
markdown tables of docs/events.md::

    OMP_NUM_THREADS=1 python experiments/calibrate_events.py            # 300 runs per null (~10 min)
    OMP_NUM_THREADS=1 python experiments/calibrate_events.py --runs 50  # a quick look
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from lightning_pfd.analysis.calibration import NullSpec, calibrate
from lightning_pfd.analysis.events import MIN_SIGMA, detect_double_descent, detect_early_learning

ROOT = Path(__file__).resolve().parents[1]
DETECTORS = {"early_learning": detect_early_learning, "double_descent": detect_double_descent}
NULLS = {
    "white noise, sd 0.049 (logged curve only)": NullSpec("white"),
    "AR(1) φ 0.90, sd 0.049 (logged curve only)": NullSpec("ar1", phi=0.90),
    "AR(1) φ 0.95, sd 0.049 (logged curve only)": NullSpec("ar1", phi=0.95),
    "AR(1) φ 0.97, sd 0.049 (logged curve only)": NullSpec("ar1", phi=0.97),
    "seed flips, M = 256 (per-seed records)": NullSpec("seed_flip", num_seeds=256),
    "seed flips, M = 2048 (per-seed records)": NullSpec("seed_flip", num_seeds=2048),
    "seed flips + common AR(1) sd 0.02 φ 0.9, M = 256": NullSpec("seed_flip_common", num_seeds=256),
}
HEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.3)


def binom_ci(k: int, n: int) -> tuple:
    """Wilson 95 % interval of a rate k/n."""
    if n == 0:
        return (math.nan, math.nan)
    z, p = 1.959964, k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300, help="runs per null family (default 300)")
    ap.add_argument("--power-runs", type=int, default=100, help="runs per planted height (default 100)")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/calibrate_events.json"))
    args = ap.parse_args()
    t0 = time.time()
    out = {"min_sigma": MIN_SIGMA, "runs": args.runs, "nulls": {}, "power": {}}
    print("| null family (500 evaluations) | early learning | double descent |\n|---|---|---|")
    for name, spec in NULLS.items():
        row = {}
        for det_name, det in DETECTORS.items():
            r = calibrate(det, spec, args.runs, seed0=10_000)
            r["ci95"] = binom_ci(r["events"], r["runs"])
            row[det_name] = r
        out["nulls"][name] = row
        cells = [f"{row[d]['events']}/{row[d]['runs']} ({100 * row[d]['rate']:.1f} %)" for d in DETECTORS]
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)
    print("\n| planted height | " + " | ".join(f"{h:g}" for h in HEIGHTS) + " |\n|---|" + "---|" * len(HEIGHTS))
    for m in (2048, 256):
        spec = NullSpec("seed_flip", num_seeds=m)
        for det_name, det in DETECTORS.items():
            rates = []
            for h in HEIGHTS:
                r = calibrate(det, spec, args.power_runs, event=det_name, height=h, seed0=50_000)
                rates.append(r)
            out["power"][f"{det_name}, seed flips M = {m}"] = {str(h): r for h, r in zip(HEIGHTS, rates)}
            print(f"| {det_name}, seed flips M = {m} | " + " | ".join(f"{100 * r['rate']:.0f} %" for r in rates)
                  + " |", flush=True)
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.out} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
