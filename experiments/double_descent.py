"""Epoch-wise double descent, attempted (PFD paper §4.2, Fig. 4 right) on the analytic teacher.

For every config given (default: ``lightning_pfd/configs/experiments/double_descent.yaml``):

1. **fit** with the command line, exactly as a user would run it::

       python -m lightning_pfd fit --config CONFIG

   (skipped with ``--reuse`` when the run directory already holds a finished run);
2. reads the CSV log back (``lightning_pfd.analysis.load_history``) and runs the detectors with
   the run's RegimeMonitor settings; lists the significant extrema (turning points) of the
   smoothed E_gen at the detector's threshold and at lower thresholds (2σ, 1σ), so that a bump
   below the threshold is seen, not only the verdict;
3. **noise diagnosis**: σ̂ of the detector (MAD of second differences) against the scatter of
   E_gen around a wide (25-epoch) running mean and the lag-k autocorrelation of that residual
   (the EMA makes consecutive evaluations correlated, which a second-difference estimate cannot
   see); then re-evaluates the kept checkpoints (every 20th epoch) on the monitor's M seeds (must
   reproduce the logged E_gen) and on ``--fresh`` new seeds of the reserved x_gen,T range, with
   standard errors of E_gen differences between checkpoints from the *paired* per-seed squared
   distances (the same x_T for both checkpoints);
4. runs ``python -m lightning_pfd report CSV_DIR`` and keeps its output and events.json;
5. writes ``experiments/results/double_descent.json`` and ``docs/figures/double_descent.png``
   (E_gen, E_mem, ℓ_train, ℓ_test vs epoch; raw faint, smoothed solid; fresh-seed E_gen of the
   checkpoints with ±1 s.e.).

    OMP_NUM_THREADS=1 python experiments/double_descent.py            # fit + analysis (~30 min)
    OMP_NUM_THREADS=1 python experiments/double_descent.py --reuse    # analysis of an existing run
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "lightning_pfd/configs/experiments/double_descent.yaml"
METRICS = {"e_gen": "pfd/e_gen", "e_mem": "pfd/e_mem", "loss_train": "loss/train_fixed",
           "loss_test": "loss/test_fixed", "gap": "loss/gap", "mem_ratio": "mem/ratio"}


# ----------------------------------------------------------------------------- config helpers
def load_config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def callback_args(cfg: dict, name: str) -> dict:
    for cb in cfg["trainer"].get("callbacks", []):
        if cb["class_path"].endswith("." + name):
            return dict(cb.get("init_args") or {})
    return {}


def csv_dir(cfg: dict) -> Path:
    for lg in cfg["trainer"].get("logger", []):
        if lg["class_path"].endswith("CSVLogger"):
            a = lg["init_args"]
            return ROOT / a["save_dir"] / a.get("name", "lightning_logs")
    raise SystemExit("the config has no CSVLogger")


def finished(cfg: dict) -> bool:
    """The run's CSV log reaches max_epochs - 1 (or the kept checkpoint of the last epoch exists)."""
    d = csv_dir(cfg)
    files = sorted(d.glob("version_*/metrics.csv"))
    if not files:
        return False
    from lightning_pfd.analysis import load_history
    ep, _ = load_history(d, source="csv").series(METRICS["e_gen"])
    return len(ep) > 0 and int(ep[-1]) >= int(cfg["trainer"]["max_epochs"]) - 1


# ----------------------------------------------------------------------------- 1. fit
def fit(config: str, log: Path) -> float:
    cmd = [sys.executable, "-m", "lightning_pfd", "fit", "--config", config]
    print("$", " ".join(cmd[1:]), f"  (log: {log})", flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.time() - t0
    if rc != 0:
        print(log.read_text()[-3000:])
        raise SystemExit(f"fit failed (exit {rc}); if it refused an existing run directory, delete it "
                         "or pass --reuse")
    print(f"fit: {wall:.0f} s", flush=True)
    return wall


# ----------------------------------------------------------------------------- 2. curves + detectors
def extrema(epochs, s, threshold):
    from lightning_pfd.analysis.events import turning_points
    return [{"epoch": int(epochs[i]), "kind": k, "smoothed": float(s[i])}
            for i, k in turning_points(s, threshold)]


def analyse(cfg: dict) -> dict:
    from lightning_pfd.analysis import (analyze_history, detect_double_descent, detect_early_learning,
                                        estimate_noise, load_history, smooth)
    from lightning_pfd.analysis.events import MIN_SIGMA, noise_unit
    from lightning_pfd.analysis.inference import curves_from_units, scalar_curves
    from lightning_pfd.analysis.per_unit import find_store, load_units
    from lightning_pfd.analysis.smoothing import moving_average

    rm = callback_args(cfg, "RegimeMonitor")
    p = {k: rm.get(k, d) for k, d in (("window", 5), ("min_sigma", MIN_SIGMA), ("min_rel", 0.0), ("confirm", 3))}
    p["min_sigma"] = float(p["min_sigma"])
    h = load_history(csv_dir(cfg), source="csv")
    units, unit_problems = load_units(find_store(csv_dir(cfg)))
    curves = {}
    for role, key in METRICS.items():
        if key in h.keys():
            ep, v = h.series(key)
            curves[role] = {"epoch": [int(e) for e in ep], "value": [float(x) for x in v]}
    ep = np.asarray(curves["e_gen"]["epoch"], float)
    y = np.asarray(curves["e_gen"]["value"], float)
    s = smooth(y, p["window"])
    sigma = estimate_noise(y)  # the former detectors' white-noise estimate, for comparison
    g_units = units.get(METRICS["e_gen"])
    full = (curves_from_units(g_units) if g_units is not None else scalar_curves(ep, y))[2]
    unit = noise_unit(full, p["window"])  # s.e. of a leg between adjacent windows (seed + training)
    thr = p["min_sigma"] * unit
    a = analyze_history(h.series_dict(), units=units, **p)
    dd = detect_double_descent(ep, y, units=g_units, **p)
    el = detect_early_learning(ep, y, units=g_units, **p)
    i_min = int(np.argmin(s))
    # noise: detector's sigma-hat (2nd differences) vs the scatter around a wide running mean
    # (after the first descent, epoch >= 50, and away from the shrinking windows at the end)
    resid = y - moving_average(y, 25)
    keep = (ep >= 50) & (np.arange(ep.size) < ep.size - 12)
    core = resid[keep] if keep.sum() > 40 else resid
    ac = {str(k): float(np.corrcoef(core[:-k], core[k:])[0, 1]) for k in (1, 2, 5, 10, 20)
          if core.size > k + 2}
    # extrema of the smoothed curve at the detector threshold and at lower ones
    ext = {"detector_threshold": extrema(ep, s, thr),
           "2_sigma": extrema(ep, s, 2 * unit), "1_sigma": extrema(ep, s, unit)}
    late = ep >= 50
    res = {
        "settings": p, "curves": curves, "smoothed_e_gen": [float(v) for v in s],
        "per_unit": {"metrics": sorted(units), "problems": unit_problems},
        "noise": {"sigma_hat_2nd_diff": float(sigma), "leg_se_adjacent_windows": float(unit),
                  "threshold": float(thr),
                  "resid_std_vs_25_epoch_mean": float(np.std(core)),
                  "resid_epochs": "epoch >= 50" if keep.sum() > 40 else "all",
                  "resid_autocorr": ac,
                  "ratio_resid_std_to_sigma_hat": float(np.std(core) / sigma) if sigma > 0 else None},
        "smoothed_extrema": ext,
        "e_gen_summary": {
            "first": float(y[0]), "last": float(y[-1]), "smoothed_last": float(s[-1]),
            "smoothed_min": float(s[i_min]), "smoothed_min_epoch": int(ep[i_min]),
            "raw_min": float(y.min()), "raw_min_epoch": int(ep[int(np.argmin(y))]),
            "smoothed_max_after_epoch_50": float(s[late].max()) if late.any() else None,
            "smoothed_max_after_epoch_50_epoch": int(ep[late][np.argmax(s[late])]) if late.any() else None,
            "rise_from_min_to_later_max": float(s[i_min:].max() - s[i_min]),
            "rise_from_min_in_units": float((s[i_min:].max() - s[i_min]) / unit),
            "fall_from_later_max_to_end": float(s[i_min:].max() - s[-1]),
        },
        "events": [e.to_dict() for e in a.events],
        "regime": None if a.regime is None else a.regime.to_dict(),
        "double_descent": None if dd is None else dd.to_dict(),
        "early_learning": None if el is None else el.to_dict(),
    }
    return res


# ----------------------------------------------------------------------------- 3. checkpoints
def checkpoint_eval(cfg: dict, fresh: int, analysis: dict) -> dict:
    """E_gen of every kept checkpoint on the monitor's M seeds (a check against the log) and on
    ``fresh`` new seeds, with per-seed squared distances kept for paired differences."""
    from lightning_pfd.evaluation.flow import DEFAULT_GEN_SEED_OFFSET
    from lightning_pfd.data import TeacherDistillationDataModule
    from lightning_pfd.diffusion import clamp_sigmas, sample_endpoints
    from lightning_pfd.metrics.pfd import paired_sq_distances
    from lightning_pfd.modules import DiffusionModule

    gm = callback_args(cfg, "GeneralizationMonitor")
    m = int(gm.get("num_eval", 1024))
    ck = callback_args(cfg, "EpochCheckpoint")
    ckdir = ROOT / ck["dirpath"]
    files = sorted(ckdir.glob("epoch*.ckpt"))
    if not files:
        return {"note": f"no kept checkpoints in {ckdir}"}
    dm = TeacherDistillationDataModule(**cfg["data"]["init_args"])
    dm.setup("fit")
    offset = int(getattr(dm, "gen_seed_offset", DEFAULT_GEN_SEED_OFFSET))
    n_gen = int(getattr(dm, "n_gen", m + fresh))
    fresh = min(fresh, n_gen - m)
    seeds_m = torch.arange(offset, offset + m)
    seeds_f = torch.arange(offset + m, offset + m + fresh)  # disjoint from the monitor's seeds
    shape = tuple(dm.train_data.shape[1:])
    first = DiffusionModule.load_from_checkpoint(str(files[0]), map_location="cpu")
    grid = first.sigmas.cpu()
    t_grid = getattr(dm, "teacher_sigmas", None)
    t_grid = grid if t_grid is None else torch.as_tensor(t_grid, dtype=torch.float64)
    t_grid = clamp_sigmas(t_grid, dm.teacher)
    sampler = first.hparams.sampler
    t0 = time.time()
    teach_m = sample_endpoints(dm.teacher, seeds_m, shape, sigmas=t_grid, sampler=sampler, batch_size=256)
    teach_f = sample_endpoints(dm.teacher, seeds_f, shape, sigmas=t_grid, sampler=sampler, batch_size=256)
    print(f"teacher endpoints ({m} + {fresh} seeds): {time.time() - t0:.0f} s", flush=True)
    logged = analysis["curves"]["e_gen"]
    log_map = dict(zip(logged["epoch"], logged["value"]))
    rows, sq_fresh, sq_mon = [], [], []
    for f in files:
        mod = DiffusionModule.load_from_checkpoint(str(f), map_location="cpu")
        mod.eval()
        epoch = int(re.search(r"epoch(\d+)", f.name).group(1))
        with torch.no_grad():
            st_m = mod.generate(seeds_m, batch_size=256)
            st_f = mod.generate(seeds_f, batch_size=256)
        d_m = paired_sq_distances(st_m, teach_m)
        d_f = paired_sq_distances(st_f, teach_f)
        sq_fresh.append(d_f.numpy())
        sq_mon.append(d_m.numpy())
        e_f = float(d_f.mean().sqrt())
        # s.e. of sqrt(mean d) by the delta method: sd(d) / (2 sqrt(M) E)
        se_f = float(d_f.std() / (2 * math.sqrt(fresh) * e_f))
        top = torch.sort(d_f, descending=True).values
        rows.append({"epoch": epoch, "e_gen_monitor_seeds": float(d_m.mean().sqrt()),
                     "share_of_e_gen2_top5pct_fresh": float(top[: max(1, fresh // 20)].sum() / top.sum()),
                     "median_sq_dist_fresh": float(top.median()),
                     "e_gen_logged": log_map.get(epoch), "e_gen_fresh": e_f, "se_fresh": se_f})
        print(f"  epoch {epoch:4d}: E_gen {rows[-1]['e_gen_monitor_seeds']:.4f} (logged "
              f"{log_map.get(epoch, float('nan')):.4f}), fresh {e_f:.4f} ± {se_f:.4f}", flush=True)
    sq = np.stack(sq_fresh)  # (checkpoints, fresh)
    sqm = np.stack(sq_mon)   # (checkpoints, M): the monitor's seeds
    ep = [r["epoch"] for r in rows]
    e = np.sqrt(sq.mean(1))

    def paired(i, j, d=None):
        """E_gen(j) - E_gen(i) on one seed set (default: the fresh seeds) and its paired s.e.
        (delta method: sqrt(mean a) - sqrt(mean b), per-seed gradient a/(2A) - b/(2B))."""
        d = sq if d is None else d
        ei, ej = math.sqrt(d[i].mean()), math.sqrt(d[j].mean())
        g = d[j] / (2 * ej) - d[i] / (2 * ei)
        se = float(g.std(ddof=1) / math.sqrt(d.shape[1]))
        return {"from_epoch": ep[i], "to_epoch": ep[j], "diff": float(ej - ei), "se": se,
                "z": float((ej - ei) / se) if se > 0 else None}

    # the detector's verdict on the monitor curve, re-tested at the nearest kept checkpoints:
    # the same legs on the monitor's M seeds (paired s.e. of an M-seed difference) and on the
    # fresh seeds
    legs = None
    ev = analysis.get("double_descent") or analysis.get("early_learning")
    if ev is not None:
        det = ev["detail"]
        marks = ([("first_min", det["first_min_epoch"]), ("peak", det["peak_epoch"]),
                  ("second_min", det["second_min_epoch"])] if ev["name"] == "double_descent"
                 else [("min", ev["epoch"]), ("end", logged["epoch"][-1])])
        idx = [(name, int(np.argmin([abs(x - float(t)) for x in ep]))) for name, t in marks]
        legs = {"event": ev["name"],
                "detector_epochs": {n: float(t) for n, t in marks},
                "nearest_checkpoints": {n: ep[i] for n, i in idx},
                "legs": [{"leg": f"{a[0]}->{b[0]}", "monitor_seeds": paired(a[1], b[1], sqm),
                          "fresh_seeds": paired(a[1], b[1])} for a, b in zip(idx, idx[1:])]}

    i_min = int(np.argmin(e))
    out = {"num_eval_monitor": m, "fresh_seeds": fresh, "detector_event_retested": legs,
           "fresh_seed_range": [int(seeds_f[0]), int(seeds_f[-1])], "checkpoints": rows,
           "fresh_min_epoch": ep[i_min],
           "consecutive": [paired(i, i + 1) for i in range(len(ep) - 1)],
           "min_to_later": [paired(i_min, j) for j in range(i_min + 1, len(ep))],
           "max_abs_logged_vs_recomputed": max(
               (abs(r["e_gen_monitor_seeds"] - r["e_gen_logged"]) for r in rows
                if r["e_gen_logged"] is not None), default=None)}
    if i_min + 1 < len(ep):
        j_max = i_min + 1 + int(np.argmax(e[i_min + 1:]))
        out["min_to_later_max"] = paired(i_min, j_max)
        out["later_max_to_end"] = paired(j_max, len(ep) - 1) if j_max < len(ep) - 1 else None
    out["first_to_end"] = paired(0, len(ep) - 1)
    return out


# ----------------------------------------------------------------------------- 4. report command
def report(cfg: dict) -> dict:
    d = csv_dir(cfg)
    out = d.parent / "report_cli"
    cmd = [sys.executable, "-m", "lightning_pfd", "report", str(d.relative_to(ROOT)),
           "--out", str(out.relative_to(ROOT)), "--force"]
    print("$", " ".join(cmd[1:]), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(r.stdout[-2500:], r.stderr[-1500:], flush=True)
    ev = json.loads((out / "events.json").read_text()) if (out / "events.json").exists() else None
    return {"command": " ".join(["python"] + cmd[1:]), "exit_status": r.returncode,
            "stdout": r.stdout[-4000:], "events_json": ev}


# ----------------------------------------------------------------------------- 5. figure
def figure(r: dict, path: Path, zoom_from: int = 100) -> None:
    """2 x 2: E_gen, E_mem over the whole run (symlog epochs) | E_gen from ``zoom_from`` on, with
    the fresh-seed re-evaluation and the detector's extrema; losses | losses and their gap, zoom."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from lightning_pfd.analysis import smooth

    a, c = r["analysis"], r["analysis"]["curves"]
    w = a["settings"]["window"]
    ck = r.get("checkpoints", {})
    m = ck.get("num_eval_monitor")
    ep = np.asarray(c["e_gen"]["epoch"])
    e_end = int(ep[-1])
    fig, ax = plt.subplots(2, 2, figsize=(11, 7), gridspec_kw={"height_ratios": [3, 2]})
    ev = a.get("double_descent")
    for col in (0, 1):
        x = ax[0, col]
        z = ep >= (0 if col == 0 else zoom_from)
        x.plot(ep[z], np.asarray(c["e_gen"]["value"])[z], color="C0", alpha=0.3, lw=0.8)
        x.plot(ep[z], np.asarray(a["smoothed_e_gen"])[z], color="C0", lw=1.6,
               label=r"$\mathcal{E}_{gen}$, monitor (M = %s seeds): raw, smoothed" % m)
        if col == 0 and "e_mem" in c:
            x.plot(c["e_mem"]["epoch"], c["e_mem"]["value"], color="C3", alpha=0.3, lw=0.8)
            x.plot(c["e_mem"]["epoch"], smooth(c["e_mem"]["value"], w), color="C3", lw=1.6,
                   label=r"$\mathcal{E}_{mem}$")
        if ck.get("checkpoints"):
            q = [p for p in ck["checkpoints"] if col == 0 or p["epoch"] >= zoom_from]
            x.errorbar([p["epoch"] for p in q], [p["e_gen_fresh"] for p in q],
                       yerr=[p["se_fresh"] for p in q], fmt="o", ms=3, color="k", capsize=2, lw=0.8,
                       label=r"$\mathcal{E}_{gen}$ of kept checkpoints, %d fresh seeds (±1 s.e.)"
                       % ck["fresh_seeds"])
        if ev is not None:
            d = ev["detail"]
            for t, lab in ((d["first_min_epoch"], "min"), (d["peak_epoch"], "peak"),
                           (d["second_min_epoch"], "min")):
                x.axvline(t, color="0.3", ls=":", lw=1)
                if col == 1:
                    x.text(t, x.get_ylim()[1], lab, fontsize=7, ha="center", va="bottom")
        x.grid(alpha=0.3)
        x.set_ylabel("PFD")
        if col == 0:
            x.set_xscale("symlog", linthresh=10)
            x.set_xlim(0, e_end + 1)
            x.set_title(r["title"], fontsize=9)
        else:
            x.set_xlim(zoom_from, e_end + 1)
            verdict = ("detector on the monitor curve: double descent, peak %g (%.1fσ by its σ̂)"
                       % (ev["epoch"], ev["significance"]) if ev else "detector: no double descent")
            x.set_title(f"epochs ≥ {zoom_from}; {verdict}", fontsize=8)
        x.legend(fontsize=7, loc="upper right")
    lt = np.asarray(c["loss_train"]["value"])
    ls = np.asarray(c["loss_test"]["value"])
    e2 = np.asarray(c["loss_train"]["epoch"])
    for col in (0, 1):
        x = ax[1, col]
        z = e2 >= (0 if col == 0 else zoom_from)
        x.plot(e2[z], lt[z], color="C2", lw=1.2, label=r"$\ell_{train}$ (frozen noise)")
        x.plot(e2[z], ls[z], color="C1", lw=1.2, ls="--", label=r"$\ell_{test}$")
        x.set_xlabel("epoch (one pass over the N training samples)")
        x.set_ylabel("loss")
        x.grid(alpha=0.3)
        t = x.twinx()
        t.plot(e2[z], (ls - lt)[z], color="0.5", lw=0.8, label=r"$\ell_{test}-\ell_{train}$ (right)")
        t.axhline(0, color="0.6", lw=0.5)
        t.set_ylabel(r"$\ell_{test}-\ell_{train}$", color="0.4", fontsize=8)
        h1, l1 = x.get_legend_handles_labels()
        h2, l2 = t.get_legend_handles_labels()
        x.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper right" if col == 0 else "lower left")
        if col == 0:
            x.set_xscale("symlog", linthresh=10)
            x.set_xlim(0, e_end + 1)
        else:
            x.set_xlim(zoom_from, e_end + 1)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")


# ----------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=[DEFAULT_CONFIG])
    p.add_argument("--reuse", action="store_true", help="analyse an existing finished run, no fit")
    p.add_argument("--fresh", type=int, default=2048, help="fresh evaluation seeds per checkpoint")
    p.add_argument("--out", default="experiments/results/double_descent.json")
    p.add_argument("--figure", default="docs/figures/double_descent.png")
    args = p.parse_args()
    torch.set_num_threads(1)
    results = []
    for config in args.configs:
        cfg = load_config(ROOT / config)
        root = ROOT / cfg["trainer"]["default_root_dir"]
        entry = {"config": config, "command": f"python -m lightning_pfd fit --config {config}"}
        if args.reuse and finished(cfg):
            print(f"reusing {root}")
            log = root.parent / f"{root.name}_fit.log"  # written by fit(), or by `/usr/bin/time -v`
            m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)",
                          log.read_text()) if log.exists() else None
            wall = None
            if m:
                parts = [float(x) for x in m.group(1).split(":")]
                wall = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
        else:
            root.parent.mkdir(parents=True, exist_ok=True)
            wall = fit(config, root.parent / f"{root.name}_fit.log")
        entry["fit_wall_s"] = wall
        t0 = time.time()
        entry["analysis"] = analyse(cfg)
        entry["checkpoints"] = checkpoint_eval(cfg, args.fresh, entry["analysis"])
        entry["report"] = report(cfg)
        entry["analysis_wall_s"] = time.time() - t0
        net = cfg["model"]["init_args"]["net"]["init_args"]
        d = cfg["data"]["init_args"]
        entry["title"] = (f"MLP hidden {net['hidden']} depth {net['depth']}, N = {d['n_train']}, "
                          f"batch {d['batch_size']}, {cfg['trainer']['max_epochs']} epochs")
        results.append(entry)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": results, "torch_threads": torch.get_num_threads()}, indent=1))
    print(f"wrote {out}")
    fig = ROOT / args.figure
    for k, r in enumerate(results):  # one figure per config: double_descent.png, double_descent_2.png
        figure(r, fig if k == 0 else fig.with_name(f"{fig.stem}_{k + 1}{fig.suffix}"))


if __name__ == "__main__":
    main()
