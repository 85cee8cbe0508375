"""``python -m lightning_pfd report RUN_DIR [--out DIR]``: figures + markdown summary of a run.

RUN_DIR is a W&B offline run (``wandb/offline-run-*``, a ``wandb`` directory or the ``.wandb``
file) or a CSVLogger directory (``metrics.csv`` below it). Writes to ``--out`` (default
``RUN_DIR/report`` for a directory, next to the file otherwise):

- ``dynamics.png`` — PFD paper Fig. 4: E_gen, E_mem, ℓ_train, ℓ_test and ℓ_test − ℓ_train vs epoch;
- ``icr_memorization.png`` — ICR paper Fig. 5: ICR and memorization ratio vs epoch;
- ``report.md`` — regime, detected events (epoch, significance), per-metric summary;
- ``events.json`` — the same, machine-readable.

Library use: :func:`write_report` (the RegimeMonitor callback calls it at the end of fit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .events import DEFAULT_KEYS, RunAnalysis, analyze_history
from .history import History, load_history

__all__ = ["main", "write_report", "render_markdown", "build_parser"]

_LABELS = {
    "e_gen": "E_gen (PFD to teacher)",
    "e_mem": "E_mem (PFD to empirical)",
    "loss_train": "ℓ_train (fixed noise)",
    "loss_test": "ℓ_test (fixed noise)",
    "gap": "ℓ_test − ℓ_train",
    "icr": "ICR",
    "mem_ratio": "memorization ratio",
}

_EXPLAIN = {
    "early_learning": "E_gen reaches an interior minimum, then rises until the end (PFD paper §4.2)",
    "double_descent": "E_gen decreases, increases, decreases again (PFD paper §4.2)",
    "icr_minimum": "ICR is U-shaped; its minimum is the early-stopping point (ICR paper §5.2)",
    "memorization_onset": "memorization starts: memorization ratio rises / E_mem falls",
}


def _fmt(v, digits=4) -> str:
    if v is None:
        return "—"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e9 else f"{v:.{digits}g}"


def _metric_rows(series: dict, keys: dict) -> list:
    rows = []
    for role, name in keys.items():
        if name not in series:
            continue
        x, y = series[name]
        i = int(np.argmin(y))
        j = int(np.argmax(y))
        rows.append(f"| {_LABELS.get(role, role)} | `{name}` | {len(x)} | {_fmt(y[0])} | "
                    f"{_fmt(y[i])} (epoch {_fmt(x[i])}) | {_fmt(y[j])} (epoch {_fmt(x[j])}) | "
                    f"{_fmt(y[-1])} |")
    return rows


def render_markdown(analysis: RunAnalysis, series: dict, *, figures: Sequence[str] = (),
                    keys: Optional[dict] = None, source: str = "", params: Optional[dict] = None,
                    title: str = "Training-dynamics report") -> str:
    """Markdown summary: regime, events table, metric table, figures, detector parameters."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    out = [f"# {title}", ""]
    if source:
        out += [f"Run: `{source}`", ""]
    out += ["## Regime", ""]
    reg = analysis.regime
    if reg is None:
        out += ["Not determined (needs both `%s` and `%s`)." % (k["e_gen"], k["e_mem"]), ""]
    else:
        out += [f"**{reg.name}** — log(E_gen/E_mem) = {reg.score:.3f} at the end of training "
                f"(E_gen = {_fmt(reg.detail['e_gen_end'])}, E_mem = {_fmt(reg.detail['e_mem_end'])}"
                + ("" if reg.detail.get("mem_ratio_end") is None
                   else f", memorization ratio = {_fmt(reg.detail['mem_ratio_end'])}")
                + ("" if reg.detail.get("gap_end") is None
                   else f", ℓ_test − ℓ_train = {_fmt(reg.detail['gap_end'])}") + ").", ""]
        out += [f"- {r}" for r in reg.reasons] + [""]
    out += ["## Events", ""]
    if analysis.events:
        out += ["| event | epoch | significance (σ) | confirmed at epoch | description |",
                "|---|---|---|---|---|"]
        for e in analysis.events:
            out.append(f"| {e.name} | {_fmt(e.epoch)} | {_fmt(e.significance, 3)} | "
                       f"{_fmt(e.detected_epoch)} | {e.describe()} |")
        out.append("")
    else:
        out += ["No event detected above the noise threshold.", ""]
    found = {e.name for e in analysis.events}
    missing = [n for n in _EXPLAIN if n not in found]
    if missing:
        out += ["Not detected: " + "; ".join(f"{n} ({_EXPLAIN[n]})" for n in missing) + ".", ""]
    rows = _metric_rows(series, k)
    if rows:
        out += ["## Metrics", "", "| metric | key | evaluations | first | min | max | last |",
                "|---|---|---|---|---|---|---|"] + rows + [""]
    if figures:
        out += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures] + [""]
    if params:
        out += ["## Detector parameters", "",
                ", ".join(f"`{a}={b}`" for a, b in params.items()) +
                " (smoothing window in evaluations, threshold in noise units, relative floor, "
                "confirmation length; see docs/events.md).", ""]
    return "\n".join(out)


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def write_report(history: History | dict, out_dir, *, keys: Optional[dict] = None,
                 window: int = 5, min_sigma: float = 4.0, min_rel: float = 0.02,
                 confirm: int = 3, title: str = "Training-dynamics report",
                 analysis: Optional[RunAnalysis] = None) -> dict:
    """Analyze ``history`` (a :class:`History` or ``{name: (epochs, values)}``), write the PNGs,
    ``report.md`` and ``events.json`` into ``out_dir``; returns ``{"markdown": path,
    "json": path, "figures": [paths], "analysis": RunAnalysis}``."""
    from .plots import plot_dynamics, plot_icr_memorization  # matplotlib only when writing

    series = history.series_dict() if isinstance(history, History) else dict(history)
    params = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    if analysis is None:
        analysis = analyze_history(series, keys=keys, **params)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = [f for f in (
        plot_dynamics(series, analysis.events, out / "dynamics.png", keys=keys, window=window),
        plot_icr_memorization(series, analysis.events, out / "icr_memorization.png", keys=keys,
                              window=window),
    ) if f is not None]
    source = str(history.path) if isinstance(history, History) and history.path else ""
    md = render_markdown(analysis, series, figures=figs, keys=keys, source=source, params=params,
                         title=title)
    md_path, js_path = out / "report.md", out / "events.json"
    _atomic_write(md_path, md)
    _atomic_write(js_path, json.dumps(dict(analysis.to_dict(), params=params), indent=2,
                                      default=_json_default))
    return {"markdown": str(md_path), "json": str(js_path), "figures": figs, "analysis": analysis}


def _atomic_write(path: Path, text: str):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lightning_pfd report",
        description="Figures (PFD paper Fig. 4, ICR paper Fig. 5) and a markdown summary of the "
                    "training-dynamics events of a run (W&B offline run or CSVLogger logs).")
    p.add_argument("run_dir", help="W&B offline run dir / wandb dir / .wandb file, or a CSVLogger "
                                   "dir / metrics.csv")
    p.add_argument("--out", default=None, help="output directory (default: RUN_DIR/report)")
    p.add_argument("--source", choices=("auto", "csv", "wandb"), default="auto")
    p.add_argument("--window", type=int, default=5, help="smoothing window (evaluations)")
    p.add_argument("--min-sigma", type=float, default=4.0,
                   help="minimum amplitude in noise units (√2·σ of the smoothed curve)")
    p.add_argument("--min-rel", type=float, default=0.02,
                   help="minimum amplitude relative to the curve's max |value|")
    p.add_argument("--confirm", type=int, default=3,
                   help="evaluations a change must persist to count")
    p.add_argument("--no-leet", action="store_true",
                   help="read W&B logs with the built-in reader instead of `wandb leet inspect`")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m lightning_pfd report``; returns the exit status."""
    argv = list(argv) if argv is not None else None
    if argv and argv[0] == "report" and len(argv) > 1:
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        if args.window < 1 or args.confirm < 1:
            raise ValueError("--window and --confirm must be positive integers")
        if args.min_sigma < 0 or args.min_rel < 0:
            raise ValueError("--min-sigma and --min-rel must be >= 0")
        hist = load_history(args.run_dir, source=args.source,
                            use_leet=False if args.no_leet else None)
    except ValueError as err:
        print(f"error: {err}")
        return 2
    run = Path(args.run_dir)
    out = Path(args.out) if args.out else (run / "report" if run.is_dir() else run.parent / "report")
    res = write_report(hist, out, window=args.window, min_sigma=args.min_sigma,
                       min_rel=args.min_rel, confirm=args.confirm,
                       title=f"Training-dynamics report ({hist.source})")
    a = res["analysis"]
    print(f"read {len(hist.rows)} rows ({hist.source}) from {hist.path}")
    for e in a.events:
        print(" -", e.describe())
    if a.regime is not None:
        print(f" - regime: {a.regime.name}")
    print(f"wrote {res['markdown']}" + "".join(f", {f}" for f in res["figures"]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
