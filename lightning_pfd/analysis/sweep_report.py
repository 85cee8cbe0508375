"""``python -m lightning_pfd report SWEEP_DIR``: figures + markdown of an (N, |θ|) sweep.

SWEEP_DIR is written by ``python -m lightning_pfd sweep``: ``sweep_results.json`` (a list of
trial rows, or ``{"rows": [...], ...}``), ``sweep.json`` (the spec and its name) and, per trial,
``endpoints.pt`` = ``{"seeds" (M,), "student" (M, d), "teacher" (M, d), "empirical" (M, d)}`` in
the descriptor space Ψ, on the same seeds for every trial. Only trials with status ``ok`` and
finite E_gen/E_mem enter the fits; the others are listed with their errors. Writes to ``--out``
(default ``SWEEP_DIR/report``):

- ``egen_emem_vs_logN.png`` — PFD paper Fig. 2 left: E_gen, E_mem vs log₂N, one curve per model
  size (mean over seeds, shaded min–max);
- ``egen_emem_collapsed.png`` — Fig. 2 right: E_gen less the fitted floors and E_mem against
  log₂(N/|θ|^γ̂) (γ̂ of E_gen − floor) and log₂(N/√|θ|);
- ``practical_metrics.png`` — Fig. 7 (App. C.4): E_gen, E_mem, KID, FID, ℓ_train, ℓ_test vs log₂N
  for one model size (the largest by default);
- ``bias_variance.png`` — §4.3, Def. 3: E_bias², E_var, mean E_gen² vs N per |θ| and vs |θ| per N
  (cells with K ≥ 2 repeats that saved endpoints);
- ``report.md`` and ``analysis.json`` — per-cell table; for each collapse quantity
  (:data:`COLLAPSE_QUANTITIES`: E_gen less per-width floors, log(E_gen/E_mem) and E_mem less
  per-width levels of the widths that cross, the raw curves) the goodness-of-fit verdict
  ("collapse rejected" or "consistent with a collapse", with its p-value), γ̂ with an interval that
  includes the between-width (model) error, the residual S in standard errors at γ̂ / 0 / ½, and a
  sensitivity table (each width and the smallest N left out, the other quantities);
  MtoG transition points, bias–variance table with the identity error per cell, failed trials.
  Definitions: ``docs/sweeps_analysis.md``.

**Never destroys**: when the output directory holds a report, the first free ``<out>-2``,
``<out>-3``, ... is used (as the run report does); ``--force`` overwrites.

Exit status: 0 written; 1 written from incomplete input (an unreadable row or endpoints file,
listed in report.md); 2 nothing written (no sweep, no successful trial, bad option).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence, get_args

import numpy as np

from ..atomic import atomic_open, atomic_write
from ..errors import ConfigError, ShortErrorParser, renamed_fields
from ..validation import IntAtLeastTwo, NonNegativeInt, OpenUnitInterval, PositiveInt, check_args
from .report import format_value, holds_report
from .bias_variance import Z_DECIDE, bias_variance_cell, bias_variance_statements
from .scaling import (bootstrap_collapse, cell_means,
                      collapse_coordinate, group_cells, psi_fid, psi_kid, transition_point)

__all__ = ["RESULTS_FILE", "SPEC_FILE", "SWEEP_REPORT_FILES", "SweepData", "load_sweep",
           "is_sweep_dir", "free_sweep_report_dir", "write_sweep_report", "build_parser", "main",
           "CollapseQuantity", "COLLAPSE_QUANTITIES", "PRIMARY"]

RESULTS_FILE = "sweep_results.json"
SPEC_FILE = "sweep.json"
FIGURES = ("egen_emem_vs_logN.png", "egen_emem_collapsed.png", "practical_metrics.png",
           "bias_variance.png")
#: files that make a directory "hold a sweep report".
SWEEP_REPORT_FILES = ("report.md", "analysis.json") + FIGURES
_NEEDED = ("trial_id", "status", "n_train", "n_params")
#: which E_gen / E_mem of a trial: at the end of training or at its best epoch
Which = Literal["final", "best"]
_CELL_KEYS = (("e_gen", "E_gen"), ("e_mem", "E_mem"), ("loss_train", "ℓ_train"),
              ("loss_test", "ℓ_test"), ("gap", "ℓ_test − ℓ_train"),
              ("memorization_ratio", "mem. ratio"), ("fid", "FID (Ψ)"), ("kid", "KID (Ψ)"))


# ----------------------------------------------------------------------------- input
@dataclass
class SweepData:
    """What :func:`load_sweep` read: all rows, the usable ones (``ok``), the others with a reason."""

    directory: Path
    name: str
    spec: Optional[dict]
    ok: List[dict]
    excluded: List[dict]
    warnings: List[str] = field(default_factory=list)
    incomplete: bool = False


def is_sweep_dir(path) -> bool:
    """True for a directory holding ``sweep_results.json`` (or that file itself)."""
    p = Path(path)
    return (p.is_dir() and (p / RESULTS_FILE).is_file()) or (p.name == RESULTS_FILE and p.is_file())


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _read_json(path: Path, field_name: str):
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(field_name, f"{path} is not valid JSON ({err})") from None


def load_sweep(sweep_dir, which: Which = "final") -> SweepData:
    """Read ``sweep_results.json`` (+ ``sweep.json``) and split the rows.

    A row is usable when its status is ``ok`` and it has positive integer ``n_train`` /
    ``n_params`` and finite ``e_gen_<which>`` / ``e_mem_<which>``; every other row is kept in
    ``excluded`` with the reason (its own ``error`` for a failed trial). A row that is not an
    object or lacks the identifying fields makes the input incomplete. Raises ConfigError when
    the file is missing or not a list of rows."""
    check_args(load_sweep, locals())
    p = Path(sweep_dir)
    d = p.parent if p.name == RESULTS_FILE else p
    if not (d / RESULTS_FILE).is_file():
        raise ConfigError("sweep_dir", f"no {RESULTS_FILE} in this directory", value=str(d),
                          suggestion="run `python -m lightning_pfd sweep` first, or pass the sweep's directory")
    data = _read_json(d / RESULTS_FILE, str(d / RESULTS_FILE))
    meta = data if isinstance(data, dict) else {}
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ConfigError(str(d / RESULTS_FILE), "must hold a list of trial rows or {\"rows\": [...]}",
                          value=type(rows).__name__)
    spec = _read_json(d / SPEC_FILE, str(d / SPEC_FILE)) if (d / SPEC_FILE).is_file() else None
    name = (spec or {}).get("name") if isinstance(spec, dict) else None
    out = SweepData(d, str(name or meta.get("name") or d.name), spec if isinstance(spec, dict) else None, [], [])
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in _NEEDED):
            out.incomplete = True
            out.warnings.append(f"row {i} is unreadable (not an object with {', '.join(_NEEDED)})")
            continue
        reason = _exclusion(row, which)
        if reason:
            out.excluded.append(dict(row, _reason=reason))
        else:
            out.ok.append(dict(row, e_gen=float(row[f"e_gen_{which}"]), e_mem=float(row[f"e_mem_{which}"])))
    return out


def _exclusion(row: dict, which: str) -> str:
    if row.get("status") != "ok":
        return f"status {row.get('status')!r}" + (f": {row['error']}" if row.get("error") else "")
    for k in ("n_train", "n_params"):
        if isinstance(row[k], bool) or not isinstance(row[k], int) or row[k] < 1:
            return f"{k} is not a positive integer ({row[k]!r})"
    bad = [k for k in (f"e_gen_{which}", f"e_mem_{which}") if not _finite(row.get(k))]
    return f"non-finite or missing {', '.join(bad)}" if bad else ""


# ----------------------------------------------------------------------------- endpoints
_ENDPOINT_KEYS = ("seeds", "student", "teacher", "empirical")


def _load_endpoints(sweep_dir: Path, rel) -> dict:
    """The arrays of one ``endpoints.pt`` as float64 numpy (seeds int64); raises ValueError."""
    import torch

    path = sweep_dir / rel
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict) or any(k not in obj for k in _ENDPOINT_KEYS[:2]):
        raise ValueError(f"expected a dict with keys {', '.join(_ENDPOINT_KEYS)} (teacher and "
                         "empirical may be absent)")
    seeds = np.asarray(obj["seeds"].cpu().numpy(), dtype=np.int64).reshape(-1)
    arrs = {k: obj[k].detach().cpu().to(torch.float64).reshape(seeds.size, -1).numpy()
            for k in _ENDPOINT_KEYS[1:] if obj.get(k) is not None}
    shapes = {a.shape for a in arrs.values()}
    if len(shapes) != 1 or seeds.size < 2:
        raise ValueError(f"student/teacher/empirical must be (M, d) with M = len(seeds) >= 2, got {shapes}")
    if np.unique(seeds).size != seeds.size:
        raise ValueError("seeds are not unique")
    return dict(arrs, seeds=seeds)


def pfd_from_endpoints(a: np.ndarray, b: np.ndarray) -> float:
    """(mean_i ‖a_i − b_i‖²)^{1/2}: eq. 4 of the PFD paper on paired Ψ endpoints (no division by
    the dimension) — the value ``ProbabilityFlowDistance`` and the monitor's E_gen/E_mem give."""
    return float(np.sqrt(np.mean(np.sum((a - b) ** 2, axis=1))))


def _endpoint_metrics(sweep: SweepData, kid_max_samples: Optional[int]):
    """Per-trial Ψ metrics (E_gen, E_mem recomputed, FID, KID) and the bias–variance cells.

    Endpoints are loaded one cell at a time (memory bounded by a cell). Returns
    ``(per_trial {trial_id: dict}, bias_variance [dict], problems [str], teacher_mismatch)``."""
    per_trial, bv, problems, mismatch = {}, [], [], 0.0
    cells: Dict[tuple, List[dict]] = {}
    for row in sweep.ok:
        cells.setdefault((row["n_params"], row["n_train"]), []).append(row)
    ref_teacher = None
    for key in sorted(cells):
        loaded = []
        for row in cells[key]:
            rel = row.get("endpoints")
            if not rel:
                continue
            try:
                e = _load_endpoints(sweep.directory, rel)
            except Exception as err:  # noqa: BLE001 - any unreadable file is reported, not fatal
                problems.append(f"trial {row['trial_id']}: {rel}: {type(err).__name__}: {err}")
                continue
            rec = {"m": int(e["seeds"].size)}
            if "empirical" in e:
                rec["e_mem_psi"] = pfd_from_endpoints(e["student"], e["empirical"])
            if "teacher" in e:  # a sweep without a teacher has no E_gen, FID, KID, Def. 3
                if ref_teacher is None:
                    ref_teacher = (e["seeds"], e["teacher"])
                common, ia, ib = np.intersect1d(ref_teacher[0], e["seeds"], return_indices=True)
                if common.size:
                    mismatch = max(mismatch, float(np.max(np.abs(ref_teacher[1][ia] - e["teacher"][ib]))))
                rec.update(e_gen_psi=pfd_from_endpoints(e["student"], e["teacher"]),
                           fid=psi_fid(e["student"], e["teacher"]),
                           kid=psi_kid(e["student"], e["teacher"], paired=True, max_samples=kid_max_samples))
                loaded.append((row, e))
            per_trial[row["trial_id"]] = rec
        if len(loaded) >= 2:
            bv.append(_bias_variance_of(key, loaded))
    return per_trial, bv, problems, mismatch


def _bias_variance_of(key, loaded) -> dict:
    """Def. 3 on one cell: students aligned on the seeds all trials share."""
    common = loaded[0][1]["seeds"]
    for _, e in loaded[1:]:
        common = np.intersect1d(common, e["seeds"])
    rows = [r for r, _ in loaded]
    base = {"n_params": key[0], "n_train": key[1], "model_label": _label(rows),
            "trials": [r["trial_id"] for r in rows], "seeds_of_trials": [r.get("seed") for r in rows]}
    if common.size < 2:
        return dict(base, skipped="fewer than 2 evaluation seeds shared by the trials")
    idx = [np.intersect1d(common, e["seeds"], return_indices=True)[2] for _, e in loaded]
    teacher = loaded[0][1]["teacher"][idx[0]]
    students = np.stack([e["student"][i] for (_, e), i in zip(loaded, idx)])
    return dict(base, **bias_variance_cell(teacher, students))


# ----------------------------------------------------------------------------- analysis
def _label(rows: Sequence[dict]) -> str:
    labels = sorted({str(r.get("model_label") or "") for r in rows} - {""})
    return "/".join(labels) if labels else f"|θ|={rows[0]['n_params']}"


def _stats(values: Sequence[float]) -> dict:
    v = np.array([x for x in values if _finite(x)], dtype=np.float64)
    if v.size == 0:
        return {"n": 0, "mean": None, "sd": None, "min": None, "max": None}
    return {"n": int(v.size), "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else None,
            "min": float(v.min()), "max": float(v.max())}


def _cell_table(sweep: SweepData) -> List[dict]:
    cells: Dict[tuple, List[dict]] = {}
    for row in sweep.ok:
        cells.setdefault((row["n_params"], row["n_train"]), []).append(row)
    out = []
    for (p, n), rows in sorted(cells.items()):
        out.append({"n_params": p, "n_train": n, "model_label": _label(rows), "k": len(rows),
                    "seeds": [r.get("seed") for r in rows],
                    **{k: _stats([r.get(k) for r in rows]) for k, _ in _CELL_KEYS}})
    return out


@dataclass(frozen=True)
class CollapseQuantity:
    """One quantity whose curves the report collapses: ``column`` of (E_gen, E_mem,
    log(E_gen/E_mem)) per repeat, the ``widths`` it uses (``all`` or ``crossing``: the model sizes
    whose mean curves cross from E_gen > E_mem to E_gen ≤ E_mem), ``floor_points`` (None or the
    number of largest N that anchor each width's floor) and ``shifts`` (per-width vertical
    shifts fitted jointly with γ)."""

    key: str
    label: str
    column: int
    widths: str
    floor_points: Optional[int]
    shifts: bool
    why: str


#: The quantities of the collapse section (docs/sweeps_analysis.md, "Collapse objective").
COLLAPSE_QUANTITIES = (
    CollapseQuantity("e_gen_floor", "E_gen − floor_w", 0, "all", 1, True,
                     "E_gen approaches a width-dependent floor (capacity); the floors are fitted with γ"),
    CollapseQuantity("log_ratio", "log(E_gen/E_mem)", 2, "crossing", None, False,
                     "the transition variable: 0 at the MtoG crossing"),
    CollapseQuantity("e_mem_ceiling", "E_mem − ceiling_w", 1, "crossing", 1, True,
                     "E_mem of the widths that memorize; its data-rich level differs by width"),
    CollapseQuantity("raw", "E_gen, E_mem (raw, jointly)", -1, "all", None, False,
                     "no floor: curves with different asymptotes cannot collapse by a horizontal shift"),
)
#: The fit whose γ̂ the figure and the transition table use.
PRIMARY = "e_gen_floor"


def _crossing_widths(cells) -> Dict[int, Optional[float]]:
    """{|θ|: log₂N* or None} of the transition on each width's mean curves."""
    ln, lp, means = cell_means(cells)
    return {int(round(2 ** s)): transition_point(ln[lp == s], means[lp == s, 0], means[lp == s, 1])
            for s in np.unique(lp)}


def _collapse(sweep: SweepData, B: int, seed: int, level: float, bounds) -> dict:
    g = np.array([r["e_gen"] for r in sweep.ok])
    m = np.array([r["e_mem"] for r in sweep.ok])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where((g > 0) & (m > 0), np.log(g / m), np.nan)
    n, p = [r["n_train"] for r in sweep.ok], [r["n_params"] for r in sweep.ok]
    cells = group_cells(n, p, np.c_[g, m])
    ratio_cells = group_cells(n, p, ratio)
    crossing = _crossing_widths(cells)
    n_range = f"N = {min(n)}…{max(n)}"
    fits, used, excluded = {}, {}, {}
    for q in COLLAPSE_QUANTITIES:
        src = ratio_cells if q.column == 2 else cells
        keep = sorted(crossing) if q.widths == "all" else sorted(w for w, x in crossing.items() if x is not None)
        excluded[q.key] = {w: f"E_gen − E_mem does not change sign from > 0 to ≤ 0 over {n_range}: no "
                              "transition (a curve that never crosses cannot be aligned with those that do)"
                           for w in sorted(crossing) if w not in keep}
        used[q.key] = keep
        sel = [c for c in src if c.n_params in keep]
        cols = [0, 1] if q.column == -1 else [0 if q.column == 2 else q.column]
        if len(keep) < 2 or not sel:
            fits[q.key] = None
            continue
        fits[q.key] = bootstrap_collapse(sel, cols, B=B, seed=seed, level=level, bounds=bounds,
                                         floor_points=q.floor_points, shifts=q.shifts)
    sensitivity = _sensitivity(cells, COLLAPSE_QUANTITIES[0], used[PRIMARY], B, seed, level, bounds)
    return {"cells": cells, "fits": fits, "used": used, "excluded": excluded, "crossing": crossing,
            "sensitivity": sensitivity}


def sensitivity_resamples(B: int) -> int:
    """Bootstrap resamples of each sensitivity refit: a quarter of the main fit's, at least 20."""
    return max(20, int(B) // 4)


def _sensitivity(cells, q: "CollapseQuantity", widths, B: int, seed: int, level: float, bounds) -> List[dict]:
    """The primary fit again without each width in turn and without the smallest N (γ̂, interval,
    GOF p-value of each; docs/sweeps_analysis.md, "Sensitivity")."""
    out = []
    sel = [c for c in cells if c.n_params in widths]
    if len(widths) < 2 or not sel:
        return out
    n_min = min(c.n_train for c in sel)
    variants = [(f"without width |θ| = {w}", [c for c in sel if c.n_params != w]) for w in widths]
    variants.append((f"without the smallest N (N = {n_min})", [c for c in sel if c.n_train != n_min]))
    for label, sub in variants:
        f = None
        if len({c.n_params for c in sub}) >= 2:
            f = bootstrap_collapse(sub, [q.column], B=sensitivity_resamples(B), seed=seed, level=level, bounds=bounds,
                                   floor_points=q.floor_points, shifts=q.shifts)
        out.append({"variant": label, "fit": f})
    return out


def _primary(collapse: dict):
    f = collapse["fits"].get(PRIMARY)
    return f if f is not None else next((f for f in collapse["fits"].values() if f is not None), None)


def _transitions(cells, gamma: Optional[float]) -> List[dict]:
    ln, lp, means = cell_means(cells)
    out = []
    for s in np.unique(lp):
        sel = lp == s
        x = transition_point(ln[sel], means[sel, 0], means[sel, 1])
        rec = {"n_params": int(round(2 ** s)), "log2_params": float(s), "log2_n": x,
               "n": None if x is None else float(2 ** x)}
        for g, name in ((0.0, "x_gamma0"), (0.5, "x_gamma_half"), (gamma, "x_gamma_hat")):
            rec[name] = None if x is None or g is None else float(collapse_coordinate(x, s, g))
        out.append(rec)
    return out


def _transition_spread(trans: List[dict]) -> dict:
    out = {}
    for name in ("x_gamma0", "x_gamma_half", "x_gamma_hat"):
        v = [t[name] for t in trans if t[name] is not None]
        out[name] = float(np.std(v, ddof=1)) if len(v) >= 2 else None
    return out


# ----------------------------------------------------------------------------- figures
def _figure(nrows, ncols, w, h):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), constrained_layout=True)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _integer_x(axes) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in np.ravel(axes):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


#: axis labels: quantity and unit
_LOG2N = r"$\log_2 N$ (N: training samples)"
_PFD_UNIT = " (Ψ-space distance)"
_PANEL_YLABELS = {"e_gen": r"$\mathcal{E}_{gen}$" + _PFD_UNIT, "e_mem": r"$\mathcal{E}_{mem}$" + _PFD_UNIT,
                  "kid": "KID in Ψ (dimensionless)", "fid": "FID in Ψ (Ψ-space distance²)",
                  "loss_train": "denoising loss (dimensionless)", "loss_test": "denoising loss (dimensionless)"}


def _save(fig, path: Path, figure_texts=()) -> str:
    from .plots import fit_titles

    fit_titles(fig, figure_texts)
    with atomic_open(path) as f:
        fig.savefig(f, dpi=120, format="png")
    return str(path)


def _colors(n: int):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(n - 1, 1)) for i in range(n)]


def _size_label(label: str, p: int) -> str:
    return f"{label} (|θ|={p / 1e6:.3g}M)" if p >= 1e5 else f"{label} (|θ|={p})"


def _curve_points(rows: Sequence[dict], key: str, xfun):
    """(x sorted, mean, min, max) over seeds of ``key`` for rows of one model size."""
    by_n: Dict[int, list] = {}
    for r in rows:
        v = r.get(key)
        if _finite(v):
            by_n.setdefault(r["n_train"], []).append(float(v))
    ns = sorted(by_n)
    x = np.array([xfun(n) for n in ns], dtype=np.float64)
    arr = [np.array(by_n[n]) for n in ns]
    return x, np.array([a.mean() for a in arr]), np.array([a.min() for a in arr]), np.array([a.max() for a in arr])


def _by_size(rows: Sequence[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for r in rows:
        out.setdefault(r["n_params"], []).append(r)
    return dict(sorted(out.items()))


def _plot_band(ax, rows, key, xfun, color, label, marker="o"):
    x, m, lo, hi = _curve_points(rows, key, xfun)
    if x.size == 0:
        return False
    ax.plot(x, m, marker=marker, ms=3.5, lw=1.5, color=color, label=label)
    if np.any(hi > lo):
        ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)
    return True


def _plot_vs_logn(rows, path: Path, trans: List[dict]) -> str:
    fig, axes = _figure(1, 2, 10.0, 4.0)
    sizes = _by_size(rows)
    for color, (p, rs) in zip(_colors(len(sizes)), sizes.items()):
        for ax, key in zip(axes[0], ("e_gen", "e_mem")):
            _plot_band(ax, rs, key, math.log2, color, _size_label(_label(rs), p))
        t = next((t for t in trans if t["n_params"] == p and t["log2_n"] is not None), None)
        if t is not None:
            for ax in axes[0]:
                ax.axvline(t["log2_n"], color=color, ls=":", lw=0.9)
    for ax, key in zip(axes[0], ("e_gen", "e_mem")):
        ax.set_xlabel(_LOG2N)
        ax.set_ylabel(_PANEL_YLABELS[key])
        ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=7, loc="best")
    _integer_x(axes)
    title = fig.suptitle("MtoG transition vs N (PFD paper Fig. 2 left); mean over seeds, band = min–max, "
                         "dotted = E_gen = E_mem", fontsize=9)
    return _save(fig, path, [title])


def _plot_collapsed(rows, path: Path, fit) -> str:
    """E_gen − fitted floor (top; raw E_gen without floors) and E_mem (bottom) against
    log₂(N/|θ|^γ) at γ̂ of the primary fit and at the paper's γ = ½."""
    gammas = [(fit.gamma, "γ̂")] if fit is not None and fit.gamma is not None else []
    gammas.append((0.5, "paper"))
    floors = {}
    if fit is not None:
        floors = {int(round(2 ** s)): rec["fitted"][0] if rec["fitted"] is not None else rec["data_rich"][0]
                  for s, rec in fit.floors.items()}
    rows = [dict(r, e_gen_floor=r["e_gen"] - floors.get(r["n_params"], 0.0)) for r in rows]
    top = ("e_gen_floor", r"$\mathcal{E}_{gen}$ − floor$_w$") if floors else ("e_gen", r"$\mathcal{E}_{gen}$")
    fig, axes = _figure(2, len(gammas), 5.0 * len(gammas), 7.0)
    sizes = _by_size(rows)
    for j, (g, what) in enumerate(gammas):
        for color, (p, rs) in zip(_colors(len(sizes)), sizes.items()):
            for i, key in enumerate((top[0], "e_mem")):
                _plot_band(axes[i][j], rs, key, lambda n, p=p, g=g: math.log2(n) - g * math.log2(p),
                           color, _size_label(_label(rs), p))
        score = None if fit is None else (fit.score if what == "γ̂" else fit.references.get(0.5))
        head = (f"γ̂ = {g:.3f}" + ("" if fit.interval is None else
                                  f" [{fit.interval[0]:.3f}, {fit.interval[1]:.3f}]")) \
            if what == "γ̂" else "γ = 0.5 (N/√|θ|, the paper's)"
        unit = " s.e." if fit is not None and fit.critical is not None else ""
        spread = "" if score is None or not math.isfinite(score.spread) else f", S = {score.spread:.3g}{unit}"
        axes[0][j].set_title(head + spread, fontsize=9)
        for i, name in enumerate((top[1], r"$\mathcal{E}_{mem}$")):
            axes[i][j].set_xlabel(r"$\log_2(N/|\theta|^{\gamma})$" + f", γ = {g:.3g} (dimensionless)")
            axes[i][j].set_ylabel(name + _PFD_UNIT)
            axes[i][j].grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    title = fig.suptitle("Collapse of the MtoG curves (PFD paper Fig. 2 right); top: E_gen less each width's "
                         "fitted floor; S = RMS residual in standard errors (docs/sweeps_analysis.md)",
                         fontsize=9)
    return _save(fig, path, [title])


def _plot_practical(rows, path: Path, label: str) -> str:
    fig, axes = _figure(2, 3, 11.0, 6.0)
    panels = (("e_gen", r"$\mathcal{E}_{gen}$"), ("e_mem", r"$\mathcal{E}_{mem}$"), ("kid", "KID (Ψ)"),
              ("fid", "FID (Ψ)"), ("loss_train", r"$\ell_{train}$"), ("loss_test", r"$\ell_{test}$"))
    for ax, (key, name) in zip(axes.ravel(), panels):
        if not _plot_band(ax, rows, key, math.log2, "tab:blue", name):
            ax.text(0.5, 0.5, "not available", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(_LOG2N)
        ax.set_ylabel(_PANEL_YLABELS[key])
        ax.grid(alpha=0.3)
    _integer_x(axes)
    title = fig.suptitle(f"Practical metrics vs PFD on the MtoG transition (PFD paper Fig. 7), {label}; "
                         "FID/KID: student vs teacher endpoints in Ψ space", fontsize=9)
    return _save(fig, path, [title])


def _plot_bias_variance(bv: List[dict], path: Path) -> Optional[str]:
    cells = [c for c in bv if "skipped" not in c]
    if not cells:
        return None
    fig, axes = _figure(1, 2, 11.0, 4.2)
    styles = (("e_gen_sq_mean", "-", "o", r"mean $\mathcal{E}_{gen}^2$"),
              ("e_bias_sq", "--", "s", r"$\mathcal{E}_{bias}^2$"), ("e_var", ":", "^", r"$\mathcal{E}_{var}$"))
    for ax, group, xkey, xname in ((axes[0][0], "n_params", "n_train", _LOG2N),
                                   (axes[0][1], "n_train", "n_params", r"$\log_2|\theta|$ (|θ|: parameters)")):
        groups = sorted({c[group] for c in cells})
        for color, gv in zip(_colors(len(groups)), groups):
            cs = sorted((c for c in cells if c[group] == gv), key=lambda c: c[xkey])
            x = np.log2([c[xkey] for c in cs])
            for key, ls, mk, _ in styles:
                ax.plot(x, [c[key] for c in cs], ls=ls, marker=mk, ms=3.5, color=color)
            ax.plot([], [], color=color, label=(f"|θ|={gv:.3g}" if group == "n_params" else f"N={gv}"))
        for key, ls, mk, name in styles:
            ax.plot([], [], ls=ls, marker=mk, color="gray", label=name)
        ax.set_xlabel(xname)
        ax.set_ylabel("squared PFD (Ψ-space distance²)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_title("vs N, one colour per |θ|", fontsize=9)
    axes[0][1].set_title("vs |θ|, one colour per N", fontsize=9)
    title = fig.suptitle("Bias–variance decomposition (PFD paper §4.3, Def. 3): "
                         "mean E_gen² = E_bias² + E_var", fontsize=9)
    return _save(fig, path, [title])


# ----------------------------------------------------------------------------- markdown
def _md_cell(s: dict) -> str:
    if not s or s["mean"] is None:
        return "—"
    return format_value(s["mean"]) + ("" if s["sd"] is None else f" ± {format_value(s['sd'], 2)}")


def _md_escape(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_interval(f, attr: str = "interval") -> str:
    iv = getattr(f, attr)
    if iv is None:
        return "—" if f.gamma is None else f"— ({f.method}: no variability to resample)"
    return f"[{iv[0]:.3f}, {iv[1]:.3f}]"


def _md_spread(f, key: str, sc) -> str:
    """S at one γ with its bootstrap percentile interval, or at γ̂ with the range of S over sweeps
    that collapse exactly (the ``model`` bootstrap)."""
    if sc is None or not math.isfinite(sc.spread):
        return "— (too little overlap)"
    iv = f.spread_intervals.get(key)
    if iv is None and key == "gamma_hat" and f.spread_null is not None:
        return f"{sc.spread:.3g} (collapse: {f.spread_null[0]:.3g}–{f.spread_null[1]:.3g})"
    return f"{sc.spread:.3g}" + ("" if iv is None else f" [{iv[0]:.3g}, {iv[1]:.3g}]")


#: how the report names each deformation of :func:`lightning_pfd.analysis.scaling.deformation_test`
_DEFORMATION_WORDS = {"location": "per-width location", "stretch": "per-width steepness",
                      "amplitude": "per-width height", "level": "per-width level"}


def _gof_md(f) -> str:
    """The goodness-of-fit line of a collapse quantity: 'collapse rejected (p = …; largest
    departure: …)' or 'consistent with a collapse (p = …)' (parametric bootstrap of the fitted
    collapse model)."""
    if f is None or f.score is None:
        return "—"
    if f.rejected is None:
        return f"no goodness-of-fit test ({f.gof_reason or 'no standard errors: K = 1'})"
    if not f.rejected:
        return f"consistent with a collapse (p = {f.gof_p:.3g})"
    d = f.deformation
    largest = "" if d is None else f"; largest departure: {_DEFORMATION_WORDS[d.largest]}"
    return f"collapse rejected (p = {f.gof_p:.3g}{largest})"


def _verdict(f) -> str:
    """The GOF verdict, then γ̂ as a collapse exponent only when the collapse is not rejected."""
    if f is None or f.score is None:
        return "—"
    if f.rejected is None:
        return f"RMS residual {f.score.spread:.3g} (no standard errors: K = 1)"
    if f.rejected:
        return f"{_gof_md(f)}: γ̂ = {f.gamma:.3f} is only the best-aligning exponent"
    return f"{_gof_md(f)}: collapses at γ̂ = {f.gamma:.3f}"


def _half_md(f, noun: str = "") -> str:
    """Where γ = ½ lies against the interval, in bootstrap standard errors of γ̂."""
    if f is None or f.gamma is None or f.interval is None:
        return "—"
    inside = f.interval[0] <= 0.5 <= f.interval[1]
    z = f.z_of(0.5)
    where = "" if z is None else f", {abs(z):.1f} s.e. {'below' if z < 0 else 'above'} γ̂"
    return ("inside" if inside else "outside") + noun + where


def _render(sweep, cells_tab, collapse, trans, tspread, bv, consistency, figs, opts) -> str:
    n_exc = len(sweep.excluded)
    out = [f"# Sweep report: {sweep.name}", ""]
    if sweep.incomplete:
        out += ["> **Incomplete input** — some rows or endpoint files could not be read:"] + \
               [f"> - {_md_escape(w)}" for w in sweep.warnings] + [""]
    out += [f"Sweep: `{sweep.directory}` — {len(sweep.ok) + n_exc} trials read, {len(sweep.ok)} used "
            f"(status ok, finite E_gen/E_mem; values `*_{opts['which']}`), {n_exc} excluded (listed below).", ""]
    out += ["## Per-cell results (mean ± sd over seeds)", "",
            "| model | \\|θ\\| | N | log₂(N/√\\|θ\\|) | K | " + " | ".join(n for _, n in _CELL_KEYS) + " |",
            "|---|---|---|---|---|" + "---|" * len(_CELL_KEYS)]
    for c in cells_tab:
        x = math.log2(c["n_train"]) - 0.5 * math.log2(c["n_params"])
        out.append(f"| {_md_escape(c['model_label'])} | {c['n_params']} | {c['n_train']} | {x:.2f} | {c['k']} | "
                   + " | ".join(_md_cell(c[k]) for k, _ in _CELL_KEYS) + " |")
    out += ["", "FID and KID: student vs teacher endpoints of the same seeds in Ψ space (FID = squared "
            "Fréchet distance of the Gaussian fits; KID = unbiased paired MMD², cubic kernel, "
            + ("all seeds" if opts["kid_max_samples"] is None else f"first {opts['kid_max_samples']} seeds at most")
            + ").", ""]
    out += _collapse_md(collapse, opts)
    prim = _primary(collapse)
    out += _transition_md(trans, tspread, None if prim is None else prim.gamma)
    out += _bv_md(bv, sweep.spec)
    if consistency:
        out += ["## Endpoint consistency", ""] + [f"- {c}" for c in consistency] + [""]
    out += ["## Excluded trials", ""]
    if sweep.excluded:
        out += ["| trial | status | model | N | seed | reason |", "|---|---|---|---|---|---|"]
        for r in sweep.excluded:
            out.append(f"| {_md_escape(r.get('trial_id'))} | {_md_escape(r.get('status'))} | "
                       f"{_md_escape(r.get('model_label', ''))} | {_md_escape(r.get('n_train'))} | "
                       f"{_md_escape(r.get('seed', ''))} | {_md_escape(str(r['_reason'])[:300])} |")
        out.append("")
    else:
        out += ["None.", ""]
    if figs:
        out += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figs] + [""]
    out += ["Definitions (collapse objective, bootstrap, transition, Def. 3, FID/KID in Ψ space): "
            "docs/sweeps_analysis.md.", ""]
    return "\n".join(out)


def _collapse_md(collapse: dict, opts: dict) -> list:
    fits = collapse["fits"]
    out = ["## Collapse: x = log₂(N/|θ|^γ) (PFD paper §4.1, Fig. 2)", ""]
    j = fits.get(PRIMARY)
    q0 = next(q for q in COLLAPSE_QUANTITIES if q.key == PRIMARY)
    if j is None or j.gamma is None:
        out += [f"No γ̂ for {q0.label}: {'fewer than two widths' if j is None else j.reason}.", ""]
    else:
        out += [f"**{q0.label}: {_gof_md(j)}.** " + _estimate_md(j) + f" S(½) = "
                f"{_md_spread(j, '0.5', j.references.get(0.5))}, S(0) = {_md_spread(j, '0.0', j.references.get(0.0))}.", ""]
        out += _sensitivity_md(collapse, j)
    warn = [w for k, f in fits.items() if f is not None for w in _collapse_warnings(f, opts["bounds"], k)]
    out += [f"> {w}" for w in warn] + [""] * bool(warn)
    out += ["| quantity | widths \\|θ\\| | goodness of fit | γ̂ | interval (with model error) | sd (repeats / widths) "
            "| repeats only | γ = ½ | S(γ̂) | S(0): N alone | S(½): N/√\\|θ\\| |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for q in COLLAPSE_QUANTITIES:
        f = fits.get(q.key)
        widths = ", ".join(str(w) for w in collapse["used"][q.key])
        if f is None or f.gamma is None:
            why = "fewer than two widths" if f is None else f.reason
            out.append(f"| {q.label} | {widths} | {_md_escape(why)} | — | — | — | — | — | — | — | — |")
            continue
        out.append(f"| {q.label} | {widths} | {_gof_md(f)} | {f.gamma:.3f} | {_md_interval(f)} | "
                   f"{_sd_md(f)} | {_md_interval(f, 'interval_repeats')} | {_half_md(f)} | "
                   f"{_md_spread(f, 'gamma_hat', f.score)} | {_md_spread(f, '0.0', f.references.get(0.0))} | "
                   f"{_md_spread(f, '0.5', f.references.get(0.5))} |")
    out.append("")
    for q in COLLAPSE_QUANTITIES:
        for w, why in collapse["excluded"][q.key].items():
            out.append(f"- {q.label}: width \\|θ\\| = {w} excluded — {why}.")
    out += [f"- {q.label}: {q.why}." for q in COLLAPSE_QUANTITIES] + [""]
    for q in COLLAPSE_QUANTITIES:
        f = fits.get(q.key)
        if f is None or not f.floors:
            continue
        out += [f"Per-width levels subtracted in {q.label} (data-rich end: the mean at the largest N ± "
                "s.e.; fitted: plus the shift fitted jointly with γ̂, the shifts summing to 0):", "",
                "| \\|θ\\| | at the largest N | fitted |", "|---|---|---|"]
        for s, rec in sorted(f.floors.items()):
            fit_v = "—" if rec["fitted"] is None else format_value(rec["fitted"][0])
            out.append(f"| {int(round(2 ** s))} | {format_value(rec['data_rich'][0])} ± {format_value(rec['se'][0], 2)} | {fit_v} |")
        out.append("")
    lo, hi = opts["bounds"]
    level = next((f.level for f in fits.values() if f is not None and f.level), None)
    lv = '' if level is None else f'{100 * level:g} % '
    return out + ["Goodness of fit: p-value of the deformation test (do some widths follow a shifted, steeper or "
                  "taller copy of the master curve, or sit at their own level where no levels are fitted?) against a "
                  "parametric bootstrap of the fitted collapse model "
                  "(a sweep that collapses exactly at γ̂ with the measured noise), rejected below "
                  f"{_alpha(fits)}; only a quantity that is not rejected collapses at γ̂; the largest departure "
                  "is the deformation with the smallest χ² tail. S = RMS residual of each "
                  "cell mean against the other widths' interpolated curves, in standard errors (from the K "
                  "repeats, moderated, plus the master curve's and an interpolation term). Interval (with model "
                  f"error) = {lv}interval γ̂ ± z·sd, sd² = sd²(repeats) + c·sd²(widths): the bootstrap sd of γ̂ "
                  "and the jackknife over widths; repeats only = the bootstrap percentile interval; after S(γ̂): the "
                  f"{lv}range of S(γ̂) over the bootstrap sweeps that collapse exactly; γ = ½ column: inside/outside the interval and (½ − γ̂)/sd; "
                  f"γ searched in [{lo:g}, {hi:g}]. Definitions: docs/sweeps_analysis.md.", ""]


def _alpha(fits) -> str:
    a = next((f.gof_alpha for f in fits.values() if f is not None and f.gof_alpha is not None), None)
    return "—" if a is None else f"{a:g}"


def _sd_md(f) -> str:
    if f.gamma_se is None:
        return "—"
    if f.se_widths is None:
        return f"{f.gamma_se:.3f} (repeats only)"
    return f"{f.gamma_se:.3f} ({f.se_repeats:.3f} / {f.se_widths:.3f})"


def _estimate_md(f) -> str:
    """γ̂ with its interval: 'collapses at γ̂' only when the GOF test does not reject."""
    head = ("it collapses at" if f.rejected is False else
            "the exponent that aligns the curves best (not a collapse exponent) is" if f.rejected else "best γ̂")
    lv = f"{100 * f.level:g} %"
    me = "with model error" if f.se_widths is not None else "repeats only"
    return (f"{head[0].upper() + head[1:]} γ̂ = {f.gamma:.3f}, {lv} interval {_md_interval(f)} ({me}; sd "
            f"{_sd_md(f)}; {f.method} bootstrap, B = {f.bootstrap.size}); the paper's γ = ½ lies "
            f"{_half_md(f, ' the interval')}.")


def _sensitivity_md(collapse: dict, j) -> list:
    """The sensitivity table of the primary fit: each width left out, the smallest N left out, and
    the secondary quantities; the summary states the spread of γ̂."""
    rows = collapse.get("sensitivity") or []
    if not rows:
        return []
    q0 = next(q for q in COLLAPSE_QUANTITIES if q.key == PRIMARY)
    b = next((r["fit"].bootstrap.size for r in rows if r["fit"] is not None), None)
    out = [f"Sensitivity of γ̂ ({q0.label} unless named; the refits with B = {b} resamples):", "",
           "| fit | γ̂ | interval (with model error) | goodness of fit |", "|---|---|---|---|",
           f"| all cells (the fit above) | {j.gamma:.3f} | {_md_interval(j)} | {_gof_md(j)} |"]
    gs = [j.gamma]
    for r in rows:
        f = r["fit"]
        if f is None or f.gamma is None:
            out.append(f"| {_md_escape(r['variant'])} | — | — | {'fewer than two widths' if f is None else _md_escape(f.reason)} |")
            continue
        gs.append(f.gamma)
        out.append(f"| {_md_escape(r['variant'])} | {f.gamma:.3f} | {_md_interval(f)} | {_gof_md(f)} |")
    sec = []
    for q in COLLAPSE_QUANTITIES[1:]:
        f = collapse["fits"].get(q.key)
        if f is not None and f.gamma is not None:
            sec.append(f.gamma)
            out.append(f"| {q.label} (widths {', '.join(str(w) for w in collapse['used'][q.key])}) | {f.gamma:.3f} | "
                       f"{_md_interval(f)} | {_gof_md(f)} |")
    out += ["", f"Spread: leaving out one width or the smallest N moves γ̂ over [{min(gs):.3f}, {max(gs):.3f}]"
            + ("" if not sec else f"; the other quantities give {', '.join(f'{g:.3f}' for g in sec)}") + ".", ""]
    return out


def _collapse_warnings(fit, bounds, key: str = "") -> list:
    """Reasons not to trust γ̂: a minimum on the edge of the search range."""
    out = []
    near = 0.05  # two steps of the coarse grid
    if fit.gamma is not None and min(abs(fit.gamma - bounds[0]), abs(fit.gamma - bounds[1])) < near:
        out.append(f"{key + ': ' if key else ''}γ̂ lies at the edge of the search range [{bounds[0]:g}, "
                   f"{bounds[1]:g}]: the minimum may be outside it (widen --gamma-bounds) or the curves may "
                   "not collapse at all.")
    return out


def _transition_md(trans, tspread, gamma) -> list:
    out = ["## MtoG transition: E_gen = E_mem", "",
           "| \\|θ\\| | log₂N* | N* | log₂(N*/\\|θ\\|^γ̂) | log₂(N*/√\\|θ\\|) |", "|---|---|---|---|---|"]
    for t in trans:
        out.append(f"| {t['n_params']} | {format_value(t['log2_n'])} | {format_value(t['n'])} | {format_value(t['x_gamma_hat'])} | "
                   f"{format_value(t['x_gamma_half'])} |")
    out += ["", "— = the mean curves do not cross from E_gen > E_mem to E_gen ≤ E_mem inside the N range. "
            f"Spread (sd) of the crossing across sizes: against log₂N {format_value(tspread['x_gamma0'])}, "
            f"against log₂(N/|θ|^γ̂) {format_value(tspread['x_gamma_hat'])}"
            + ("" if gamma is None else f" (γ̂ = {gamma:.3f})")
            + f", against log₂(N/√|θ|) {format_value(tspread['x_gamma_half'])}.", ""]
    return out


def _repeats_md(spec: Optional[dict]) -> str:
    """What the repeats of a cell differ by, read off the sweep file's ``seed_keys``."""
    keys = (spec or {}).get("seed_keys")
    if isinstance(keys, dict) and keys:
        listed = ", ".join(f"`{k}` = {f} × seed" if f != 1 else f"`{k}` = seed" for k, f in keys.items())
    elif isinstance(keys, (list, tuple)) and keys:
        listed = ", ".join(f"`{k}` = seed" for k in keys)
    else:
        return ("The repeats of a cell differ by their `seed` (the sweep's default seed keys); E_var "
                "measures the variability over whatever that seed changes (Def. 3 asks for "
                "independent training sets).")
    changes_data = any("train_seed_offset" in k or k.startswith("data.") and "seed" in k for k in
                       (keys if isinstance(keys, (list, tuple)) else keys.keys()))
    return (f"The repeats of a cell differ by the sweep's `seed_keys`: {listed}. "
            + ("The training set changes with the repeat, so E_var is Def. 3's variance over "
               "independent training sets (and initialisations and training noise)."
               if changes_data else "No data key is among them: E_var measures the variability over "
               "initialisation and training noise only, not over training sets as Def. 3 asks."))


def _bv_md(bv: List[dict], spec: Optional[dict] = None) -> list:
    out = ["## Bias–variance (PFD paper §4.3, Def. 3, eq. 9)", ""]
    done = [c for c in bv if "skipped" not in c]
    if not done:
        return out + ["No cell with K ≥ 2 successful repeats that saved endpoints.", ""]
    out += ["Plug-in values as the paper defines them (eq. 45), ± the standard error over the M evaluation "
            "seeds; the unbiased variant (E_var·K/(K−1), E_bias² − E_var/(K−1): the plug-in E_bias² carries "
            "Var/K) ± the delete-one-student jackknife (K ≥ 3; none at K = 2).", "",
            "| model | \\|θ\\| | N | K | M | E_bias² | E_var | mean E_gen² | E_bias² unbiased | E_var unbiased | "
            "E_gen per repeat | identity error (abs / rel) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in done:
        seeds, stud = c.get("se_seeds") or {}, c.get("se_students")
        pm = lambda key, se: format_value(c[key]) + (f" ± {se[key]:.2g}" if se else "")  # noqa: E731
        out.append(f"| {_md_escape(c['model_label'])} | {c['n_params']} | {c['n_train']} | {c['k']} | {c['m']} | "
                   f"{pm('e_bias_sq', seeds)} | {pm('e_var', seeds)} | {pm('e_gen_sq_mean', seeds)} | "
                   f"{format_value(c['e_bias_sq_unbiased'])}" + (f" ± {stud['e_bias_sq']:.2g}" if stud else "")
                   + f" | {format_value(c['e_var_unbiased'])}" + (f" ± {stud['e_var']:.2g}" if stud else "")
                   + f" | {', '.join(format_value(v) for v in c['e_gen'])} | {c['identity_abs_error']:.1e} / "
                   f"{c['identity_rel_error']:.1e} |")
    skipped = [c for c in bv if "skipped" in c]
    out += [""] + [f"- skipped |θ| = {c['n_params']}, N = {c['n_train']}: {c['skipped']}" for c in skipped]
    out += ["", "The paper's four statements (§4.3; a difference of unbiased values decides beyond "
            f"{Z_DECIDE:g} jackknife standard errors):", "", "| statement | verdict | numbers |", "|---|---|---|"]
    out += [f"| {r['statement']} | **{r['verdict']}** | {_md_escape(r['numbers'])} |"
            for r in bias_variance_statements(done)]
    return out + ["", _repeats_md(spec), ""]


# ----------------------------------------------------------------------------- entry points
def free_sweep_report_dir(out, force: bool = False) -> Path:
    """``out`` when it holds no report (run or sweep) or ``force``, else the first free
    ``<out>-2``, ``<out>-3``, ... — the rule of :func:`lightning_pfd.analysis.report.free_report_dir`
    extended to the sweep report's files."""
    out = Path(out)

    def holds(d: Path) -> bool:
        return holds_report(d) or any((d / n).exists() for n in SWEEP_REPORT_FILES)

    if force or not holds(out):
        return out
    i = 2
    while holds(out.with_name(f"{out.name}-{i}")):
        i += 1
    return out.with_name(f"{out.name}-{i}")


def _gamma_bounds(gamma_bounds) -> tuple:
    """(lo, hi): two finite numbers lo < hi."""
    try:
        bounds = tuple(float(b) for b in gamma_bounds)
    except (TypeError, ValueError):
        raise ConfigError("gamma_bounds", "must be two numbers LO HI", value=gamma_bounds) from None
    if len(bounds) != 2:
        raise ConfigError("gamma_bounds", "must be two numbers LO HI", value=gamma_bounds)
    lo, hi = bounds
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("gamma_bounds", "must be two finite numbers LO < HI", value=bounds)
    return bounds


def _pick_size(rows, model_size) -> int:
    sizes = _by_size(rows)
    if model_size is None:
        return max(sizes)
    for p, rs in sizes.items():
        if str(model_size) in (str(p), _label(rs)) or str(model_size) in {str(r.get("model_label")) for r in rs}:
            return p
    raise ConfigError("model_size", "no successful trial of this model size", value=model_size,
                      accepted=[f"{_label(rs)} ({p})" for p, rs in sizes.items()])


def _consistency(sweep, per_trial, mismatch) -> list:
    """E_gen / E_mem recomputed from endpoints.pt against the trial rows, teacher agreement."""
    out = []
    for q in ("gen", "mem"):
        for key in ("final", "best"):
            col = f"e_{q}_{key}"
            diffs = [abs(per_trial[r["trial_id"]][f"e_{q}_psi"] - r[col]) / max(abs(r[col]), 1e-300)
                     for r in sweep.ok if f"e_{q}_psi" in per_trial.get(r["trial_id"], {}) and _finite(r.get(col))]
            if diffs:
                out.append(f"E_{q} recomputed from endpoints.pt vs `{col}`: max relative difference "
                           f"{max(diffs):.2e} over {len(diffs)} trials")
    if any("e_gen_psi" in v for v in per_trial.values()):
        out.append(f"teacher endpoints of the same seed across trials: max |difference| {mismatch:.2e}")
    return out


def write_sweep_report(sweep_dir, out_dir=None, force: bool = False, *, model_size=None,
                       bootstrap: PositiveInt = 200, bootstrap_seed: NonNegativeInt = 0,
                       level: OpenUnitInterval = 0.90, gamma_bounds=(-0.5, 1.5), which: Which = "final",
                       kid_max_samples: Optional[IntAtLeastTwo] = 4096) -> dict:
    """Analyse a sweep and write the figures, ``report.md`` and ``analysis.json``.

    ``out_dir`` defaults to ``SWEEP_DIR/report``; a directory holding a report is kept and the
    first free ``<out>-2``, ... is used unless ``force``. ``model_size`` (|θ| or model label)
    picks the size of the Fig. 7 panel (default the largest). ``which``: ``final`` or ``best``
    E_gen/E_mem of each trial. Returns ``{"out_dir", "markdown", "json", "figures", "incomplete",
    "analysis"}``. Raises ConfigError (nothing written) for a bad option, a missing or malformed
    ``sweep_results.json`` or a sweep without any successful trial; its field is the argument's
    name (:func:`main` names the option)."""
    check_args(write_sweep_report, locals())
    bounds = _gamma_bounds(gamma_bounds)
    sweep = load_sweep(sweep_dir, which=which)
    if not sweep.ok:
        reasons = "; ".join(f"{r.get('trial_id')}: {r['_reason']}" for r in sweep.excluded[:5])
        raise ConfigError("sweep_dir", "no successful trial (status 'ok' with finite E_gen/E_mem) to analyse",
                          value=str(sweep.directory), suggestion=reasons or "the results file holds no trial")
    size = _pick_size(sweep.ok, model_size)
    want = Path(out_dir) if out_dir is not None else sweep.directory / "report"
    if want.exists() and not want.is_dir():
        raise ConfigError("out_dir", "is a file, not a directory", value=str(want))
    out = free_sweep_report_dir(want, force=force)

    per_trial, bv, problems, mismatch = _endpoint_metrics(sweep, kid_max_samples)
    if problems:
        sweep.incomplete = True
        sweep.warnings += problems
    for r in sweep.ok:
        r.update({k: per_trial.get(r["trial_id"], {}).get(k) for k in ("fid", "kid")})
    cells_tab = _cell_table(sweep)
    collapse = _collapse(sweep, bootstrap, bootstrap_seed, level, bounds)
    prim = _primary(collapse)
    trans = _transitions(collapse["cells"], None if prim is None else prim.gamma)
    tspread = _transition_spread(trans)
    opts = {"which": which, "bounds": bounds, "kid_max_samples": kid_max_samples}

    out.mkdir(parents=True, exist_ok=True)
    sizes = _by_size(sweep.ok)
    figs = [_plot_vs_logn(sweep.ok, out / FIGURES[0], trans), _plot_collapsed(sweep.ok, out / FIGURES[1], prim),
            _plot_practical(sizes[size], out / FIGURES[2], _size_label(_label(sizes[size]), size)),
            _plot_bias_variance(bv, out / FIGURES[3])]
    figs = [f for f in figs if f is not None]
    for stale in set(FIGURES) - {Path(f).name for f in figs}:
        (out / stale).unlink(missing_ok=True)
    consistency = _consistency(sweep, per_trial, mismatch)
    md = _render(sweep, cells_tab, collapse, trans, tspread, bv, consistency, figs, opts)
    analysis = {
        "format": 1, "sweep": sweep.name, "directory": str(sweep.directory), "which": which,
        "n_used": len(sweep.ok), "n_excluded": len(sweep.excluded), "incomplete": sweep.incomplete,
        "warnings": sweep.warnings, "practical_model_size": size,
        "cells": cells_tab,
        "collapse": {k: None if f is None else dict(f.to_dict(), warnings=_collapse_warnings(f, bounds),
                                                    widths=collapse["used"][k],
                                                    excluded={str(w): why for w, why in collapse["excluded"][k].items()},
                                                    verdict=_verdict(f))
                     for k, f in collapse["fits"].items()},
        "collapse_primary": PRIMARY,
        "collapse_sensitivity": [{"variant": r["variant"], "fit": None if r["fit"] is None else r["fit"].to_dict()}
                                 for r in collapse["sensitivity"]],
        "transitions": trans, "transition_spread": tspread, "bias_variance": bv,
        "bias_variance_statements": bias_variance_statements([c for c in bv if "skipped" not in c]),
        "trials": {str(k): v for k, v in per_trial.items()}, "consistency": consistency,
        "excluded": [{"trial_id": r.get("trial_id"), "status": r.get("status"), "reason": r["_reason"]}
                     for r in sweep.excluded]}
    md_path, js_path = out / "report.md", out / "analysis.json"
    atomic_write(js_path, json.dumps(analysis, indent=2, default=_json_default) + "\n")
    atomic_write(md_path, md)
    return {"out_dir": str(out), "markdown": str(md_path), "json": str(js_path), "figures": figs,
            "incomplete": sweep.incomplete, "analysis": analysis}


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def build_parser() -> argparse.ArgumentParser:
    p = ShortErrorParser(
        prog="python -m lightning_pfd report",
        description="Sweep report (SWEEP_DIR holds sweep_results.json): PFD paper Fig. 2 (E_gen, "
                    "E_mem vs log2 N and collapsed on log2(N/|θ|^γ)), Fig. 7 (practical metrics), "
                    "bias-variance (Def. 3) and report.md. Exit status: 0 written, 1 written from "
                    "incomplete input, 2 error (nothing written).")
    p.add_argument("sweep_dir", help="sweep directory (holds sweep_results.json) or that file")
    p.add_argument("--out", default=None, help="output directory (default: SWEEP_DIR/report); if it "
                                               "holds a report, the first free OUT-2, OUT-3, ... is used")
    p.add_argument("--force", action="store_true", help="overwrite a report in the output directory")
    p.add_argument("--model-size", default=None,
                   help="|θ| or model label of the Fig. 7 panel (default: the largest model)")
    p.add_argument("--which", choices=get_args(Which), default="final",
                   help="E_gen/E_mem of each trial: at the end of training (default) or the best epoch")
    p.add_argument("--bootstrap", type=int, default=200,
                   help="bootstrap resamples for γ̂ and S (default 200; parametric from the repeats)")
    p.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap generator")
    p.add_argument("--level", type=float, default=0.90, help="interval level (default 0.90)")
    p.add_argument("--gamma-bounds", type=float, nargs=2, default=(-0.5, 1.5), metavar=("LO", "HI"),
                   help="search range of γ (default -0.5 1.5)")
    p.add_argument("--kid-max-samples", type=int, default=4096,
                   help="KID on the first K seeds at most (O(K²d) time; default 4096)")
    return p


#: the option of each argument of :func:`write_sweep_report` (an error names what the user typed)
_OPTIONS = {"sweep_dir": "SWEEP_DIR", "out_dir": "--out", "model_size": "--model-size",
            "bootstrap": "--bootstrap", "bootstrap_seed": "--bootstrap-seed", "level": "--level",
            "gamma_bounds": "--gamma-bounds", "which": "--which", "kid_max_samples": "--kid-max-samples"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Sweep branch of ``python -m lightning_pfd report``; returns the exit status (0 written, 1
    written from incomplete input, 2 error: one short block on stderr)."""
    argv = list(argv) if argv is not None else None
    if argv and argv[0] == "report" and len(argv) > 1:
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        with renamed_fields(_OPTIONS):
            res = write_sweep_report(args.sweep_dir, args.out, args.force, model_size=args.model_size,
                                     bootstrap=args.bootstrap, bootstrap_seed=args.bootstrap_seed,
                                     level=args.level, gamma_bounds=args.gamma_bounds, which=args.which,
                                     kid_max_samples=args.kid_max_samples)
    except ConfigError as err:
        print(err.block(), file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {err.filename or args.sweep_dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    want = Path(args.out) if args.out else Path(res["analysis"]["directory"]) / "report"
    if Path(res["out_dir"]) != want:
        print(f"note: {want} already holds a report (kept); writing to {res['out_dir']} (--force overwrites)",
              file=sys.stderr)
    a = res["analysis"]
    print(f"sweep {a['sweep']}: {a['n_used']} trials used, {a['n_excluded']} excluded")
    labels = {q.key: q.label for q in COLLAPSE_QUANTITIES}
    for key, j in a["collapse"].items():
        if j is None or j["gamma"] is None:
            continue
        iv = "" if j["interval"] is None else f" [{j['interval'][0]:.3f}, {j['interval'][1]:.3f}]"
        print(f" - collapse of {labels.get(key, key)}: γ̂ = {j['gamma']:.3f}{iv} (paper: 0.5); {j['verdict']}")
        for w in j["warnings"]:
            print(f"   note: {w}")
    print(f"wrote {res['markdown']}" + "".join(f", {f}" for f in res["figures"]))
    for w in a["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    return 1 if res["incomplete"] else 0
