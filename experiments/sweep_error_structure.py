"""The error structure of a recorded sweep's repeats (issue 42 item 4): are the errors of a cell
independent of those of the other cells, as the collapse test's null assumes?

A repeat k of ``mtog_digits`` shares its initialisation seed across every N of a width and its
training set (teacher seeds [8192 k, 8192 k + N), nested in N) across every width of an N. Both
could make the errors of cells of one repeat correlated: a width x repeat effect (one
initialisation per width, seen at every N) and an N x repeat effect (one training set per N,
seen at every width). With two repeats, the repeat difference d(w, N) = log E_gen(rep 0) −
log E_gen(rep 1) removes every fixed effect of the cell; under independent errors its mean is 0
and it has no width or N structure. A two-way ANOVA of d (rows: widths, columns: N; one value
per cell, so the interaction is the residual) tests both effects with F tests; the intraclass
correlation of d within a width measures the first. With K > 2 repeats the same two effects are
tested by nested least-squares F tests beside a free mean per cell (:func:`repeat_effects`; with
K = 2 they equal the ANOVA of the differences).

Usage (from the repository root):

    python experiments/sweep_error_structure.py experiments/results/mtog_digits_sweep_results.csv \
        --out experiments/results/mtog_digits_error_structure.json

Writes the JSON (F, degrees of freedom, p, the effects' variance components, the ICC, the
per-cell differences) and prints a summary. Needs exactly two repeats per cell (the ``seed``
column 0 and 1) with status ok.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

KEY = "e_gen_final"


def repeat_differences(rows: list, key: str = KEY) -> tuple:
    """(widths, ns, d) with d[w, n] = log value(repeat 0) − log value(repeat 1) of each cell."""
    ok = [r for r in rows if r["status"] == "ok"]
    widths = sorted({int(r["n_params"]) for r in ok})
    ns = sorted({int(r["n_train"]) for r in ok})
    vals = np.full((len(widths), len(ns), 2), np.nan)
    for r in ok:
        k = int(r["seed"])
        if k in (0, 1):
            vals[widths.index(int(r["n_params"])), ns.index(int(r["n_train"])), k] = math.log(float(r[key]))
    if not np.isfinite(vals).all():
        raise SystemExit("every cell needs repeats 0 and 1 with status ok")
    return widths, ns, vals[..., 0] - vals[..., 1]


def two_way_anova(d: np.ndarray) -> dict:
    """Two-way ANOVA without replication of d (rows x columns): F, df, p of the row and column
    effects, and the variance components (method of moments, floored at 0)."""
    r, c = d.shape
    grand = d.mean()
    rows, cols = d.mean(1), d.mean(0)
    ss_r = c * np.sum((rows - grand) ** 2)
    ss_c = r * np.sum((cols - grand) ** 2)
    resid = d - rows[:, None] - cols[None, :] + grand
    ss_e = np.sum(resid ** 2)
    df_r, df_c, df_e = r - 1, c - 1, (r - 1) * (c - 1)
    ms_r, ms_c, ms_e = ss_r / df_r, ss_c / df_c, ss_e / df_e
    f_r, f_c = ms_r / ms_e, ms_c / ms_e
    return {"rows": {"F": f_r, "df": [df_r, df_e], "p": float(stats.f.sf(f_r, df_r, df_e)),
                     "variance": max(0.0, (ms_r - ms_e) / c)},
            "columns": {"F": f_c, "df": [df_c, df_e], "p": float(stats.f.sf(f_c, df_c, df_e)),
                        "variance": max(0.0, (ms_c - ms_e) / r)},
            "residual": {"variance": ms_e, "df": df_e},
            "mean": {"value": grand, "t": grand / math.sqrt(ms_e / (r * c)) if ms_e > 0 else math.inf}}


def repeat_values(rows: list, key: str = KEY) -> tuple:
    """(widths, ns, v) with v[w, n, k] = log value of repeat k of each cell (every cell needs
    every repeat, status ok)."""
    ok = [r for r in rows if r["status"] == "ok"]
    widths = sorted({int(r["n_params"]) for r in ok})
    ns = sorted({int(r["n_train"]) for r in ok})
    reps = sorted({int(r["seed"]) for r in ok})
    v = np.full((len(widths), len(ns), len(reps)), np.nan)
    for r in ok:
        v[widths.index(int(r["n_params"])), ns.index(int(r["n_train"])), reps.index(int(r["seed"]))] = \
            math.log(float(r[key]))
    if not np.isfinite(v).all():
        raise SystemExit("every cell needs every repeat with status ok")
    return widths, ns, v


def _onehot(idx: np.ndarray) -> np.ndarray:
    return np.eye(int(idx.max()) + 1)[idx]


def _rss_rank(X: np.ndarray, y: np.ndarray) -> tuple:
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    return float(np.sum((y - X @ beta) ** 2)), int(np.linalg.matrix_rank(X))


def repeat_effects(v: np.ndarray) -> dict:
    """For K >= 2 repeats (v: widths x N x repeats): the nested least-squares F tests of a
    width x repeat and an N x repeat effect beside a free mean per cell (y = cell + a_{w,k} +
    b_{N,k} + e). With K = 2 they are the two-way ANOVA of the repeat differences."""
    W, N, K = v.shape
    w, n, k = np.meshgrid(np.arange(W), np.arange(N), np.arange(K), indexing="ij")
    y = v.reshape(-1)
    cell, wk, nk = (_onehot(a.reshape(-1)) for a in (w * N + n, w * K + k, n * K + k))
    full = np.hstack([cell, wk, nk])
    rss_f, rank_f = _rss_rank(full, y)
    df_e = y.size - rank_f
    out = {}
    for name, reduced in (("width_x_repeat", np.hstack([cell, nk])), ("n_x_repeat", np.hstack([cell, wk]))):
        rss_r, rank_r = _rss_rank(reduced, y)
        df1 = rank_f - rank_r
        f = ((rss_r - rss_f) / df1) / (rss_f / df_e)
        out[name] = {"F": float(f), "df": [df1, df_e], "p": float(stats.f.sf(f, df1, df_e))}
    return out


def analyse(rows: list, key: str = KEY) -> dict:
    widths, ns, v = repeat_values(rows, key)
    if v.shape[2] != 2:  # K > 2: the nested F tests (no single difference to decompose)
        eff = repeat_effects(v)
        return {"quantity": f"log {key}, {v.shape[2]} repeats", "widths": widths, "n_train": ns,
                "repeats": int(v.shape[2]), "effects": eff}
    d = v[..., 0] - v[..., 1]
    a = two_way_anova(d)
    total = a["rows"]["variance"] + a["columns"]["variance"] + a["residual"]["variance"]
    return {"quantity": f"log {key}, repeat 0 minus repeat 1", "widths": widths, "n_train": ns,
            "differences": d.round(6).tolist(), "anova": a,
            "share_width_x_repeat": a["rows"]["variance"] / total if total > 0 else 0.0,
            "share_n_x_repeat": a["columns"]["variance"] / total if total > 0 else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a sweep's sweep_results.csv")
    ap.add_argument("--key", default=KEY)
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    with open(args.results, newline="") as f:
        res = analyse(list(csv.DictReader(f)), args.key)
    if "effects" in res:
        for name, e in res["effects"].items():
            print(f"{name}: F = {e['F']:.2f} (df {e['df']}), p = {e['p']:.3g}")
        if args.out:
            Path(args.out).write_text(json.dumps(dict(res, source=args.results), indent=1) + "\n")
            print(f"wrote {args.out}")
        return 0
    a = res["anova"]
    print(f"width x repeat: F = {a['rows']['F']:.2f} (df {a['rows']['df']}), p = {a['rows']['p']:.3g}, "
          f"share {res['share_width_x_repeat']:.2f}")
    print(f"N x repeat:     F = {a['columns']['F']:.2f} (df {a['columns']['df']}), p = {a['columns']['p']:.3g}, "
          f"share {res['share_n_x_repeat']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(res, source=args.results), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
