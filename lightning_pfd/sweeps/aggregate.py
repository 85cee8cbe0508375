"""``sweep_results.csv`` / ``.json``: one row per trial, from the trials' own histories.

Every metric of a row is read back from the trial's logged history
(:func:`lightning_pfd.analysis.history.load_history` on ``runs/<sweep>/<trial-id>/``: the
CSVLogger's ``metrics.csv`` when there is one, else the W&B offline run), never from numbers
the driver kept: a row says what the run's own logs say. Status, error, |θ|, N and wall time
come from the trial's ``trial_result.json`` (or, for a trial that died without writing it, from
Ray Tune's record of the error).

Row schema (the fields :mod:`lightning_pfd.analysis` reads; see docs/sweeps.md):

``trial_id, status ("ok" | "failed" | "diverged" | "pending" | "missing"), error, overrides (dict), n_train
(N), n_params (|θ|, trainable parameters of the student net), model_label, seed, epochs,
e_gen_final, e_gen_best, e_gen_best_epoch, e_mem_final, e_mem_best, e_mem_best_epoch,
loss_train, loss_test, gap (final ℓ_train, ℓ_test, ℓ_test − ℓ_train with frozen noise),
memorization_ratio (final), icr_min, icr_min_epoch, regime, events ([{name, epoch}]),
wall_time_s, run_dir (relative to the sweep directory), endpoints (relative path or null)``
plus ``final_epoch`` (last measured epoch) and ``history_source`` ("csv" | "wandb" | null).

"pending" marks a trial that has not run yet (an interrupted sweep, before ``--resume``);
"missing" a trial that the earlier ``sweep_results.json`` records as run (ok, failed, diverged)
but whose ``trial_result.json`` is gone (its files were deleted or moved): ``--resume`` runs it
again.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Optional

from ..analysis.events import DEFAULT_KEYS, REGIMES
from ..errors import ConfigError
from .trial import read_trial_result

__all__ = ["ROW_FIELDS", "trial_row", "aggregate_sweep", "write_results", "history_metrics"]

ROW_FIELDS = ("trial_id", "status", "error", "overrides", "n_train", "n_params", "model_label",
              "seed", "epochs", "e_gen_final", "e_gen_best", "e_gen_best_epoch", "e_mem_final",
              "e_mem_best", "e_mem_best_epoch", "loss_train", "loss_test", "gap",
              "memorization_ratio", "icr_min", "icr_min_epoch", "regime", "events", "wall_time_s",
              "run_dir", "endpoints", "final_epoch", "history_source")
_EVENT_SKIP = ("diverged_step",)


def _load(trial_dir: Path):
    """The trial's history (CSV first: plain text, fast), or None when nothing was logged."""
    from ..analysis.history import load_history

    for source in ("csv", "wandb"):
        try:
            return load_history(trial_dir, source=source)
        except ConfigError:
            continue
    return None


def _final(hist, key: str):
    xs, ys = hist.series(key)
    return (float(ys[-1]), int(xs[-1])) if len(ys) else (None, None)


def _minimum(hist, key: str):
    xs, ys = hist.series(key)
    if not len(ys):
        return None, None
    i = int(ys.argmin())  # first epoch of the minimum
    return float(ys[i]), int(xs[i])


def _events(hist) -> list:
    out = []
    for k in hist.keys():
        if not (k.startswith("events/") and k.endswith("_epoch")):
            continue
        name = k[len("events/"):-len("_epoch")]
        if name in _EVENT_SKIP or name.endswith("_lead"):
            continue
        v, _ = _final(hist, k)
        if v is not None:
            out.append({"name": name, "epoch": int(v) if float(v).is_integer() else v})
    return sorted(out, key=lambda e: (e["epoch"], e["name"]))


def history_metrics(hist) -> dict:
    """The metric fields of a row from one trial's :class:`~lightning_pfd.analysis.history.History`."""
    k = DEFAULT_KEYS
    e_gen, e_gen_ep = _final(hist, k["e_gen"])
    e_mem, _ = _final(hist, k["e_mem"])
    g_best, g_ep = _minimum(hist, k["e_gen"])
    m_best, m_ep = _minimum(hist, k["e_mem"])
    icr, icr_ep = _minimum(hist, k["icr"])
    code, _ = _final(hist, "events/regime_code")
    regime = REGIMES[int(code)] if code is not None and 0 <= int(code) < len(REGIMES) else None
    return {"e_gen_final": e_gen, "e_gen_best": g_best, "e_gen_best_epoch": g_ep,
            "e_mem_final": e_mem, "e_mem_best": m_best, "e_mem_best_epoch": m_ep,
            "loss_train": _final(hist, k["loss_train"])[0], "loss_test": _final(hist, k["loss_test"])[0],
            "gap": _final(hist, k["gap"])[0], "memorization_ratio": _final(hist, k["mem_ratio"])[0],
            "icr_min": icr, "icr_min_epoch": icr_ep, "regime": regime, "events": _events(hist),
            "final_epoch": e_gen_ep, "history_source": hist.source if hist.source in ("csv", "wandb")
            else None}


#: statuses of a trial that ran (its result file existed when they were recorded)
_RAN = ("ok", "failed", "diverged", "missing")


def trial_row(sweep_dir, trial: dict, ray_error: Optional[str] = None,
              earlier_status: Optional[str] = None) -> dict:
    """One row for ``trial`` (its entry of ``sweep.json``); ``earlier_status``: its status in the
    earlier ``sweep_results.json`` (a trial that ran and has no result now is "missing")."""
    sweep_dir = Path(sweep_dir)
    tid = trial["trial_id"]
    trial_dir = sweep_dir / tid
    res = read_trial_result(trial_dir) if trial_dir.is_dir() else None
    row = dict.fromkeys(ROW_FIELDS)
    row.update(trial_id=tid, overrides=trial.get("overrides") or {}, n_train=trial.get("n_train"),
               n_params=trial.get("n_params"), model_label=trial.get("model_label"),
               seed=trial.get("seed"), events=[], run_dir=tid)
    if res is not None:
        row.update(status=res.get("status"), error=res.get("error"), wall_time_s=res.get("wall_time_s"),
                   epochs=res.get("epochs"))
        for key in ("n_train", "n_params"):
            if res.get(key) is not None:
                row[key] = res[key]
        ends = res.get("endpoints")
        if ends and (trial_dir / ends).is_file():
            row["endpoints"] = f"{tid}/{ends}"
    elif ray_error:
        row.update(status="failed", error=ray_error)
    elif earlier_status in _RAN:
        row.update(status="missing", error=f"{tid}/trial_result.json is gone (the earlier "
                                           f"sweep_results.json recorded this trial as {earlier_status})")
    else:
        row.update(status="pending")
    hist = _load(trial_dir) if trial_dir.is_dir() else None
    if hist is not None:
        row.update(history_metrics(hist))
        if row["epochs"] is None and row["final_epoch"] is not None:
            row["epochs"] = row["final_epoch"] + 1
    return row


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def write_results(sweep_dir, rows: list) -> tuple:
    """``sweep_results.csv`` and ``sweep_results.json`` in ``sweep_dir`` (atomic writes)."""
    from ..atomic import atomic_write

    sweep_dir = Path(sweep_dir)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(ROW_FIELDS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(r.get(k)) for k in ROW_FIELDS})
    csv_path, json_path = sweep_dir / "sweep_results.csv", sweep_dir / "sweep_results.json"
    atomic_write(csv_path, buf.getvalue())
    atomic_write(json_path, json.dumps(rows, indent=1, default=str) + "\n")
    return csv_path, json_path


def _earlier_statuses(sweep_dir: Path) -> dict:
    """trial id -> status in the ``sweep_results.json`` written before (empty when none)."""
    try:
        rows = json.loads((sweep_dir / "sweep_results.json").read_text())
        return {str(r["trial_id"]): r.get("status") for r in rows if isinstance(r, dict)}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def aggregate_sweep(sweep_dir, ray_errors: Optional[dict] = None, write: bool = True) -> list:
    """Rows of every trial listed in ``<sweep_dir>/sweep.json`` (see the module docstring);
    written to ``sweep_results.csv`` / ``.json`` unless ``write`` is False."""
    sweep_dir = Path(sweep_dir)
    try:
        meta = json.loads((sweep_dir / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("sweep_dir", f"no readable sweep.json in {str(sweep_dir)!r} (not a sweep "
                                       "directory, or the sweep never started)") from e
    ray_errors = ray_errors or {}
    earlier = _earlier_statuses(sweep_dir)
    rows = [trial_row(sweep_dir, t, ray_errors.get(t["trial_id"]), earlier.get(t["trial_id"]))
            for t in meta.get("trials", [])]
    if write:
        write_results(sweep_dir, rows)
    return rows
