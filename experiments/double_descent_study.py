"""Epoch-wise double descent, the study (PFD paper §4.2, Fig. 4 right; issue 39 item 3).

Every run is a command-line fit of ``lightning_pfd/configs/experiments/double_descent_study.yaml``
(VP-preconditioned MLP student of the analytic GMM teacher, N = 8192, M = 2048 evaluation seeds at
every epoch) with one arm's optimizer and one training seed::

    python -m lightning_pfd fit --config lightning_pfd/configs/experiments/double_descent_study.yaml \\
        --run_dir ROOT/ARM/seedS --seed_everything S --model.init_args.train_seed S <arm flags>

Arms: SGD with momentum 0.9 (the paper's optimizer) at lr 0.003 / 0.01 / 0.03, and Adam + EMA
(the earlier recorded run's optimizer, lr 1e-3, EMA half-life 64 kimg), all with the paper's VP
student family. Every run checkpoints every epoch, so ``run`` resumes each unfinished run exactly
(``--ckpt_path last``) and skips finished ones: the grid can be run over several sessions.

    python experiments/double_descent_study.py run --root /work/dd_study --jobs 1 [--arms ...] [--seeds 0 1 2]
    python experiments/double_descent_study.py status --root /work/dd_study
    python experiments/double_descent_study.py analyse --root /work/dd_study   # -> experiments/results/

``analyse`` (per run, from its CSV log, and per arm): the regime by App. C.6's criterion (the
frozen-noise gap l_test - l_train relative to l_test stays below ``--regime-tol`` for the whole
run: generalization), where the first descent of E_gen ends, the project's own event detectors
(``lightning_pfd.analysis.analyze_history`` with the run's RegimeMonitor settings: a double
descent confirmed on held-out seeds), and the verdict per arm: confirmed on >= 2 of 3 seeds, or a
scoped negative with the epochs run, the regime and the runs still in their first descent.
Partial results (runs not finished) are recorded as such.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Optional
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "lightning_pfd/configs/experiments/double_descent_study.yaml"
RESULT = ROOT / "experiments/results/double_descent_study.json"
SGD = ["--model.init_args.optimizer", "{class_path: torch.optim.SGD, init_args: {momentum: 0.9}}"]
ARMS = {
    "sgd_lr0.01": SGD + ["--model.init_args.lr", "0.01"],
    "adam_ema": ["--model.init_args.optimizer", "null", "--model.init_args.lr", "0.001",
                 "--model.init_args.ema_halflife_kimg", "64", "--model.init_args.ema_rampup", "true"],
    "sgd_lr0.03": SGD + ["--model.init_args.lr", "0.03"],
    "sgd_lr0.003": SGD + ["--model.init_args.lr", "0.003"],
    # the paper's optimizer with the evaluation the Adam arm has: an EMA of the weights (half-life
    # 64 kimg, ramp-up), whose epoch-to-epoch noise is far below the raw SGD weights'
    "sgd_ema_lr0.01": SGD + ["--model.init_args.lr", "0.01", "--model.init_args.ema_halflife_kimg", "64",
                             "--model.init_args.ema_rampup", "true"],
}
METRICS = {"e_gen": "pfd/e_gen", "e_mem": "pfd/e_mem", "loss_train": "loss/train_fixed",
           "loss_test": "loss/test_fixed"}


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return root / arm / f"seed{seed}"


def fit_command(root: Path, arm: str, seed: int, max_epochs: int) -> list:
    d = run_dir(root, arm, seed)
    cmd = [sys.executable, "-m", "lightning_pfd", "fit", "--config", str(CONFIG), "--run_dir", str(d),
           "--seed_everything", str(seed), "--model.init_args.train_seed", str(seed),
           "--trainer.max_epochs", str(max_epochs), "--threads", "1", *ARMS[arm]]
    if (d / "checkpoints/last.ckpt").is_file():
        cmd += ["--ckpt_path", "last"]
    return cmd


def _one(root: Path, arm: str, seed: int, max_epochs: int) -> dict:
    d = run_dir(root, arm, seed)
    d.parent.mkdir(parents=True, exist_ok=True)
    cmd = fit_command(root, arm, seed, max_epochs)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               LIGHTNING_PFD_CACHE=os.environ.get("LIGHTNING_PFD_CACHE", str(root / "cache")))
    t0 = time.time()
    with open(d.parent / f"seed{seed}.log", "a") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"arm": arm, "seed": seed, "rc": rc, "wall_s": round(time.time() - t0, 1)}


def cmd_run(args) -> int:
    jobs = [(a, s) for a in args.arms for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(lambda j: _one(args.root, j[0], j[1], args.max_epochs), jobs):
            print(json.dumps(r), flush=True)
    return 0


# ----------------------------------------------------------------------------- analysis
def read_run(d: Path, upto: Optional[int] = None) -> dict:
    """The run's per-epoch curves from its CSV log (``load_history``: the latest value per epoch)."""
    from lightning_pfd.analysis import load_history

    h = load_history(d / "csv", source="csv")
    out = {}
    for k, key in METRICS.items():
        ep, v = h.series(key)
        keep = ep < upto if upto is not None else np.ones(ep.size, bool)
        out[k] = (ep[keep].astype(int), v[keep])
    return out


def regime(curves: dict, tol: float) -> dict:
    """App. C.6: the generalization regime keeps l_test - l_train close to 0 for the whole run;
    measured as the largest relative gap (l_test - l_train) / l_test over the epochs."""
    (e1, tr), (e2, te) = curves["loss_train"], curves["loss_test"]
    common = np.intersect1d(e1, e2)
    if common.size == 0:
        return {"regime": "unknown", "max_relative_gap": None}
    tr = tr[np.searchsorted(e1, common)]
    te = te[np.searchsorted(e2, common)]
    rel = (te - tr) / te
    worst = float(np.max(rel))
    return {"regime": "generalization" if worst <= tol else "transition or memorization",
            "max_relative_gap": worst, "epoch_of_max_gap": int(common[int(np.argmax(rel))]),
            "final_gap": float(te[-1] - tr[-1]), "criterion": f"max (l_test - l_train) / l_test <= {tol}"}


def first_descent_end(epochs: np.ndarray, e_gen: np.ndarray, window: int = 25) -> dict:
    """Where the first descent of E_gen ends: the epoch of the minimum of a centred running mean
    (``window`` epochs); ``ended`` only when that minimum is at least ``window`` epochs before the
    last epoch (else the run is still descending or the minimum is at its edge)."""
    if e_gen.size < window + 1:
        return {"ended": False, "epoch": None, "why": "too few epochs"}
    kernel = np.ones(window) / window
    smooth = np.convolve(e_gen, kernel, mode="valid")
    i = int(np.argmin(smooth))
    epoch = int(epochs[i + window // 2])
    ended = epoch <= int(epochs[-1]) - window
    return {"ended": ended, "epoch": epoch if ended else None, "smoothed_min": float(smooth[i]),
            "last_epoch": int(epochs[-1]), "window": window}


def _series_units(d: Path, upto: Optional[int] = None):
    """The run's logged curves and per-seed records, cut to the epochs before ``upto`` (the
    analysis of a run at a length it has since been extended beyond)."""
    from dataclasses import replace

    from lightning_pfd.analysis import load_history
    from lightning_pfd.analysis.per_unit import find_store, load_units

    h = load_history(d / "csv", source="csv")
    series = h.series_dict()
    units, _problems = load_units(find_store(d / "csv"))
    if upto is None:
        return series, units
    series = {k: (ep[ep < upto], v[ep < upto]) for k, (ep, v) in series.items()}
    cut = {}
    for k, u in units.items():
        keep = np.asarray(u.epochs) < upto
        cut[k] = replace(u, epochs=u.epochs[keep], values=u.values[keep],
                         logged=u.logged[keep] if u.logged.size == keep.size else u.logged)
    return series, cut


def detector_events(d: Path, upto: Optional[int] = None) -> dict:
    """The project's own detectors (``analyze_history``, the RegimeMonitor settings of the
    config: window 5, confirm 3, the calibrated ``min_sigma``) on the run's log and per-seed
    records: held-out tests; a confirmed ``double_descent`` is the study's positive."""
    from lightning_pfd.analysis import analyze_history

    series, units = _series_units(d, upto)
    a = analyze_history(series, units=units, window=5, confirm=3)
    evs = [e.to_dict() for e in a.events]
    return {"events": [{"name": e["name"], "status": e["status"], "epoch": e["epoch"],
                        "significance": e["significance"]} for e in evs],
            "double_descent": [e for e in evs if e["name"] == "double_descent" and e["status"] == "confirmed"],
            "regime_detector": None if a.regime is None else a.regime.to_dict()}


def _planted(series, ep, bump):
    """``series`` (E_gen's per-seed squared distances, UnitSeries) with E_gen raised by ``bump``
    (per epoch of ``ep``): every seed's d^2 scaled by ((E + bump) / E)^2, so the per-seed noise
    and its correlations stay the run's own."""
    from dataclasses import replace

    e = np.sqrt(series.values.mean(axis=1))
    at = {float(x): b for x, b in zip(ep, bump)}
    f = np.array([(ei + at.get(float(t), 0.0)) / ei for t, ei in zip(series.epochs, e)])
    logged = series.logged * f if series.logged.size == f.size else series.logged
    return replace(series, values=series.values * (f ** 2)[:, None], logged=logged)


def planted_power(d: Path, heights, width: int = 60, positions: int = 5, upto: Optional[int] = None) -> dict:
    """The smallest ascent this run's noise lets the project's detector confirm. A bump of
    ``height`` (a raised-cosine ascent and descent over ``width`` epochs, the tens-of-epochs ascent
    of the paper's Fig. 4) is planted into the run's own per-seed records at ``positions`` places in
    its second half, and the detectors run exactly as on the run (held-out seeds). Power = the
    share of placements with a confirmed double descent peaking inside the bump; the unplanted
    run's own result is reported beside it (``detector_events``)."""
    from lightning_pfd.analysis import analyze_history

    series, units = _series_units(d, upto)
    g = units.get("pfd/e_gen")
    ep, y = series["pfd/e_gen"]
    n = ep.size
    if n < 2 * width or g is None:
        return {"note": "too few epochs or no per-seed records"}
    starts = np.linspace(n // 2, n - width - 10, positions).astype(int)
    out = {}
    for hgt in heights:
        hits = 0
        for s0 in starts:
            bump = np.zeros(n)
            bump[s0:s0 + width] = hgt * 0.5 * (1 - np.cos(2 * np.pi * np.arange(width) / width))
            planted = dict(units, **{"pfd/e_gen": _planted(g, ep, bump)})
            a = analyze_history({"pfd/e_gen": (ep, y + bump), "pfd/e_mem": series["pfd/e_mem"]},
                                units=planted, window=5, confirm=3, final=False)
            hits += any(e.name == "double_descent" and e.status == "confirmed"
                        and ep[s0] <= e.epoch <= ep[min(n - 1, s0 + width)] for e in a.events)
        out[f"{hgt:g}"] = hits / len(starts)
    return {"width_epochs": width, "placements": [int(ep[s]) for s in starts], "power": out,
            "e_gen_median_second_half": float(np.median(y[n // 2:]))}


#: the share of placements of a planted ascent that the detector must confirm for its height to
#: count as one the study would have found (the power of a test, conventionally 80 %)
DETECTABLE_POWER = 0.8


def detectable_height(runs: list):
    """The smallest planted height (E_gen units) confirmed in at least :data:`DETECTABLE_POWER`
    of the placements pooled over an arm's seeds, with that power and the height as a share of the
    arm's median second-half E_gen; None when no height tried reaches it."""
    pw = [r["power"] for r in runs if isinstance(r.get("power"), dict) and "power" in r["power"]]
    if not pw:
        return None
    heights = sorted({float(h) for p in pw for h in p["power"]})
    level = float(np.median([p["e_gen_median_second_half"] for p in pw]))
    for h in heights:
        shares = [p["power"].get(f"{h:g}") for p in pw]
        if any(v is None for v in shares):
            continue
        power = float(np.mean(shares))
        if power >= DETECTABLE_POWER:
            return {"height": h, "power": power, "share_of_e_gen": h / level, "seeds": len(pw)}
    return None


def random_feature_psi(dim: int = 64, features: int = 512, seed: int = 0):
    """The second descriptor: a fixed random ReLU feature map Psi(x) = ReLU(W x + b) / sqrt(F),
    W ~ N(0, 1/dim), b ~ N(0, 1), drawn once from ``seed`` (no weights are downloaded)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(features, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
    b = torch.randn(features, generator=g, dtype=torch.float64)
    return lambda x: torch.relu(x.reshape(x.shape[0], -1) @ w.T + b) / math.sqrt(features)


def checkpoint_psi(d: Path, fresh: int, every: int = 50) -> dict:
    """E_gen of the kept checkpoints every ``every`` epochs on ``fresh`` new evaluation seeds
    (disjoint from the monitor's M), for Psi = identity and the random-feature Psi, with
    delta-method s.e. and, between consecutive ones, the paired difference (same x_T)."""
    import re

    import torch
    from lightning_pfd.data import TeacherDistillationDataModule
    from lightning_pfd.diffusion import clamp_sigmas, sample_endpoints
    from lightning_pfd.evaluation.flow import DEFAULT_GEN_SEED_OFFSET
    from lightning_pfd.modules import DiffusionModule

    import yaml
    files = [f for f in sorted((d / "checkpoints").glob("epoch*.ckpt"))
             if (int(re.search(r"epoch(\d+)", f.name).group(1)) + 1) % every == 0]
    if not files:
        return {"note": "no kept checkpoints"}
    cfg = yaml.safe_load(CONFIG.read_text())
    m = int(cfg["trainer"]["callbacks"][0]["init_args"]["num_eval"])
    dm = TeacherDistillationDataModule(**cfg["data"]["init_args"])
    dm.setup("fit")
    offset = int(getattr(dm, "gen_seed_offset", DEFAULT_GEN_SEED_OFFSET))
    seeds = torch.arange(offset + m, offset + m + fresh)
    first = DiffusionModule.load_from_checkpoint(str(files[0]), map_location="cpu")
    t_grid = clamp_sigmas(torch.as_tensor(dm.teacher_sigmas, dtype=torch.float64), dm.teacher)
    teacher = sample_endpoints(dm.teacher, seeds, tuple(dm.train_data.shape[1:]), sigmas=t_grid,
                               sampler=first.hparams.sampler, batch_size=256)
    psis = {"identity": lambda x: x.reshape(x.shape[0], -1), "random_relu_512": random_feature_psi()}
    rows, prev = [], {}
    for f in files:
        mod = DiffusionModule.load_from_checkpoint(str(f), map_location="cpu").eval()
        with torch.no_grad():
            st = mod.generate(seeds, batch_size=256)
        row = {"epoch": int(re.search(r"epoch(\d+)", f.name).group(1))}
        for name, psi in psis.items():
            sq = (psi(st) - psi(teacher)).pow(2).sum(1)
            e = float(sq.mean().sqrt())
            row[name] = {"e_gen": e, "se": float(sq.std() / (2 * math.sqrt(fresh) * e))}
            if name in prev:  # paired: E(t) - E(t-1) ~ mean(d2_t - d2_{t-1}) / (2 E)
                (sq0, e0) = prev[name]
                u = sq / (2 * e) - sq0 / (2 * e0)
                row[name]["change"] = e - e0
                row[name]["change_se"] = float(u.std() / math.sqrt(fresh))
            prev[name] = (sq, e)
        rows.append(row)
    return {"fresh_seeds": fresh, "every_epochs": every, "psi": {"identity": "the endpoints",
            "random_relu_512": random_feature_psi.__doc__.split(".")[0]},
            "fresh_seed_range": [int(seeds[0]), int(seeds[-1])], "checkpoints": rows}


def _recorded_fresh(args, arm: str, seed: int, epochs_run: int):
    """With ``--reuse-fresh``: the fresh-seed re-evaluation already recorded in ``--out`` for this
    run, when it was made on the same number of epochs with the same settings (the kept
    checkpoints do not change; only the detectors' analysis is redone). None otherwise."""
    if not args.reuse_fresh or not args.out.is_file():
        return None
    for r in json.loads(args.out.read_text()).get("runs", []):
        c = r.get("checkpoints_psi") or {}
        if (r.get("arm"), r.get("seed"), r.get("epochs_run")) == (arm, seed, epochs_run) and \
                c.get("fresh_seeds") == args.fresh and c.get("every_epochs") == args.fresh_every:
            return c
    return None


def cmd_analyse(args) -> int:
    runs, arms = [], {}
    for arm in args.arms:
        for seed in args.seeds:
            d = run_dir(args.root, arm, seed)
            if not (d / "csv").is_dir():
                continue
            try:
                c = read_run(d, args.upto_epochs)
            except Exception as e:  # an unreadable or empty log: recorded, not skipped silently
                runs.append({"arm": arm, "seed": seed, "error": f"{type(e).__name__}: {e}"})
                continue
            ep, eg = c["e_gen"]
            r = {"arm": arm, "seed": seed, "epochs_run": int(ep[-1]) + 1 if ep.size else 0,
                 "finished": bool(ep.size) and int(ep[-1]) + 1 >= args.max_epochs,
                 "e_gen_first": float(eg[0]) if eg.size else None,
                 "e_gen_last": float(eg[-1]) if eg.size else None,
                 "e_gen_min": float(eg.min()) if eg.size else None,
                 "e_gen_argmin": int(ep[int(np.argmin(eg))]) if eg.size else None,
                 "regime": regime(c, args.regime_tol), "first_descent": first_descent_end(ep, eg),
                 "gap_first_last": [float(c["loss_test"][1][0] - c["loss_train"][1][0]),
                                    float(c["loss_test"][1][-1] - c["loss_train"][1][-1])],
                 "events": detector_events(d, args.upto_epochs)}
            if args.power:
                r["power"] = planted_power(d, args.power, upto=args.upto_epochs)
            if args.fresh:
                kept = _recorded_fresh(args, arm, seed, r["epochs_run"])
                r["checkpoints_psi"] = kept if kept is not None else checkpoint_psi(d, args.fresh, args.fresh_every)
            runs.append(r)
            arms.setdefault(arm, []).append(r)
    verdicts = {}
    for arm, rs in arms.items():
        confirmed = [r["seed"] for r in rs if r["events"].get("double_descent")]
        done = [r for r in rs if r.get("finished")]
        still = [r["seed"] for r in rs if not r["first_descent"]["ended"]]
        if len(done) < 3:
            verdict = f"incomplete: {len(done)} of 3 seeds finished {args.max_epochs} epochs"
        elif len(confirmed) >= 2:
            verdict = f"double descent confirmed on {len(confirmed)} of {len(rs)} seeds"
        elif still:
            verdict = (f"not observed in this setup: seeds {still} are still in their first descent "
                       f"at epoch {args.max_epochs}")
        else:
            verdict = "not observed in this setup"
        found = detectable_height(rs)
        if found is not None and not confirmed:
            verdict += (f"; a planted 60-epoch ascent of height {found['height']:g} "
                        f"({found['share_of_e_gen']:.0%} of E_gen) would have been found in "
                        f"{found['power']:.0%} of placements")
        elif found is None and not confirmed:
            verdict += "; no planted height tried was found in 80 % of placements (the study has no power)"
        verdicts[arm] = {"verdict": verdict, "detectable": found, "seeds": [r["seed"] for r in rs],
                         "confirmed_seeds": confirmed,
                         "first_descent_still_running": still,
                         "regimes": sorted({r["regime"]["regime"] for r in rs})}
    analysis = "python experiments/double_descent_study.py " + " ".join(args.argv)
    for r in runs:
        r["analysed_by"] = analysis
    if args.out.is_file():  # keep the recorded arms not analysed now (the grid runs over sessions)
        earlier = json.loads(args.out.read_text())
        kept = [dict(r, analysed_by=r.get("analysed_by", earlier.get("analysis")))
                for r in earlier.get("runs", []) if r["arm"] not in args.arms]
        runs = kept + runs
        verdicts = {**{a: v for a, v in earlier.get("verdicts", {}).items() if a not in args.arms}, **verdicts}
        args.arms = list(dict.fromkeys([r["arm"] for r in runs] + list(args.arms)))
    # a file merged over sessions names every analysis that made one of its rows, in order
    analysis = "; then ".join(dict.fromkeys(r["analysed_by"] for r in runs if r.get("analysed_by")))
    out = {"config": str(CONFIG.relative_to(ROOT)), "arms": {a: ARMS[a] for a in args.arms},
           "command": f"python experiments/double_descent_study.py run --root {args.root} --jobs N",
           "analysis": analysis,
           "max_epochs": args.max_epochs, "regime_tol": args.regime_tol, "runs": runs, "verdicts": verdicts,
           "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=_json) + "\n")
    args.out.with_suffix(".md").write_text(table(json.loads(args.out.read_text())))
    print(json.dumps(verdicts, indent=1))
    return 0


def table(out: dict) -> str:
    """The markdown tables of a results file (per run, per arm): what the docs quote."""
    lines = [f"Results of `{out['analysis']}` ({out['recorded']}); runs: `{out['command']}`; config "
             f"`{out['config']}`. E_gen on the monitor's M = 2048 seeds every epoch; fresh = the last "
             f"kept checkpoint on {(out['runs'][0].get('checkpoints_psi') or {}).get('fresh_seeds', '—')} fresh seeds "
             "(identity Psi / random ReLU-feature Psi, +- 1 s.e.); gap = max over epochs of "
             "(l_test - l_train) / l_test; power = share of 5 placements of a planted 60-epoch "
             "ascent of that height (E_gen units) that the detector confirms.", "",
             "| arm | seed | epochs | E_gen first / min (epoch) / last | fresh E_gen, identity | fresh, random features | "
             "max rel. gap | regime (App. C.6) | first descent ended | events | power (height: share) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["runs"]:
        if "error" in r:
            lines.append(f"| {r['arm']} | {r['seed']} | — | {r['error']} |  |  |  |  |  |  |  |")
            continue
        ck = (r.get("checkpoints_psi") or {}).get("checkpoints") or []
        last = ck[-1] if ck else None
        fi = f"{last['identity']['e_gen']:.3f} ± {last['identity']['se']:.3f} (ep {last['epoch']})" if last else "—"
        fr = f"{last['random_relu_512']['e_gen']:.4f} ± {last['random_relu_512']['se']:.4f}" if last else "—"
        fd = r["first_descent"]
        ended = f"yes, epoch {fd['epoch']}" if fd.get("ended") else "no"
        evs = ", ".join(f"{e['name']} ({e['status']}, ep {e['epoch']:g})" for e in r["events"]["events"]) or "none"
        pw = ", ".join(f"{h}: {v:.1f}" for h, v in ((r.get("power") or {}).get("power") or {}).items()) or "—"
        lines.append(f"| {r['arm']} | {r['seed']} | {r['epochs_run']} | {r['e_gen_first']:.2f} / "
                     f"{r['e_gen_min']:.3f} ({r['e_gen_argmin']}) / {r['e_gen_last']:.3f} | {fi} | {fr} | "
                     f"{r['regime']['max_relative_gap']:.3f} | {r['regime']['regime']} | {ended} | {evs} | {pw} |")
    lines += ["", "| arm | verdict | confirmed seeds | seeds still in the first descent | regimes |",
              "|---|---|---|---|---|"]
    for arm, v in out["verdicts"].items():
        lines.append(f"| {arm} | {v['verdict']} | {v['confirmed_seeds'] or 'none'} | "
                     f"{v['first_descent_still_running'] or 'none'} | {', '.join(v['regimes'])} |")
    return "\n".join(lines) + "\n"


def _json(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return None if not math.isfinite(float(v)) else float(v)
    raise TypeError(type(v))


def cmd_status(args) -> int:
    for arm in args.arms:
        for seed in args.seeds:
            d = run_dir(args.root, arm, seed)
            f = sorted(d.glob("csv/version_*/metrics.csv"))
            n = 0
            if f:
                try:
                    n = int(read_run(d)["e_gen"][0][-1]) + 1
                except Exception:
                    n = 0
            print(f"{arm:12s} seed {seed}: {n} / {args.max_epochs} epochs")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["run", "analyse", "status"])
    p.add_argument("--root", type=Path, default=Path("/work/dd_study"))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--max-epochs", type=int, default=500)
    p.add_argument("--regime-tol", type=float, default=0.1)
    p.add_argument("--power", type=float, nargs="*", default=[0.1, 0.2, 0.4, 0.8, 1.6, 3.2],
                   help="planted ascent heights (E_gen units) for the per-run power")
    p.add_argument("--fresh", type=int, default=2048, help="fresh seeds per kept checkpoint (0: skip)")
    p.add_argument("--fresh-every", type=int, default=50, help="re-evaluate the kept checkpoint every N epochs")
    p.add_argument("--upto-epochs", type=int, default=None,
                   help="analyse every run on its epochs before N only (a run since extended beyond N)")
    p.add_argument("--reuse-fresh", action="store_true",
                   help="take the fresh-seed re-evaluation of a run from --out when recorded on the same epochs "
                        "(only the detectors' analysis and the power are redone)")
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    if args.upto_epochs is not None and args.upto_epochs < 2:
        p.error(f"--upto-epochs must be an integer >= 2 (the epochs before N are analysed), got {args.upto_epochs}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded: the command that made a results file
    return {"run": cmd_run, "analyse": cmd_analyse, "status": cmd_status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
