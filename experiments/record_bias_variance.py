"""Record a sweep's bias–variance section (PFD paper §4.3, Def. 3): the per-cell values with their
standard errors and the four statements, from the sweep report's ``analysis.json``.

    python -m lightning_pfd report runs/mtog_digits_k3 --out /tmp/k3rep
    python experiments/record_bias_variance.py /tmp/k3rep/analysis.json \
        --out experiments/results/mtog_digits_k3_bias_variance.json

docs/sweeps.md quotes the statements from the written file (``tests/test_quoted_numbers.py``
checks them, and that they are :func:`lightning_pfd.analysis.bias_variance.bias_variance_statements`
of the recorded cells).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KEEP = ("n_params", "n_train", "model_label", "k", "m", "e_bias_sq", "e_var", "e_gen_sq_mean", "e_gen",
        "e_bias_sq_unbiased", "e_var_unbiased", "se_seeds", "se_students", "identity_rel_error")


def record(analysis: dict, source: str) -> dict:
    cells = [{k: c[k] for k in KEEP if k in c} for c in analysis["bias_variance"] if "skipped" not in c]
    return {"source": source, "cells": cells, "statements": analysis["bias_variance_statements"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("analysis", help="a sweep report's analysis.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rec = record(json.loads(Path(args.analysis).read_text()), args.analysis)
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    for s in rec["statements"]:
        print(f"{s['verdict']:>16}  {s['statement']}\n{'':18}{s['numbers']}")
    print(f"wrote {args.out} ({len(rec['cells'])} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
