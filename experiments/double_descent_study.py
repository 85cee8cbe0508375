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
def read_run(d: Path) -> dict:
    """The run's per-epoch curves from its CSV log (``load_history``: the latest value per epoch)."""
    from lightning_pfd.analysis import load_history

    h = load_history(d / "csv", source="csv")
    out = {}
    for k, key in METRICS.items():
        ep, v = h.series(key)
        out[k] = (ep.astype(int), v)
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


def events(d: Path) -> dict:
    """The project's own detectors on the run's log (the report's events.json when present)."""
    f = next(iter(sorted(d.glob("report/events.json"))), None)
    if f is None:
        return {"available": False}
    data = json.loads(f.read_text())
    evs = data.get("events", data) if isinstance(data, dict) else data
    names = sorted({str(e.get("event", e.get("name", ""))) for e in evs if isinstance(e, dict)}) \
        if isinstance(evs, list) else []
    dd = [e for e in evs if isinstance(e, dict) and "double" in str(e.get("event", e.get("name", "")))] \
        if isinstance(evs, list) else []
    return {"available": True, "events": names, "double_descent": dd}


def cmd_analyse(args) -> int:
    runs, arms = [], {}
    for arm in args.arms:
        for seed in args.seeds:
            d = run_dir(args.root, arm, seed)
            if not (d / "csv").is_dir():
                continue
            try:
                c = read_run(d)
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
                 "events": events(d)}
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
        verdicts[arm] = {"verdict": verdict, "seeds": [r["seed"] for r in rs], "confirmed_seeds": confirmed,
                         "first_descent_still_running": still,
                         "regimes": sorted({r["regime"]["regime"] for r in rs})}
    out = {"config": str(CONFIG.relative_to(ROOT)), "arms": {a: ARMS[a] for a in args.arms},
           "command": f"python experiments/double_descent_study.py run --root {args.root} --jobs N",
           "analysis": f"python experiments/double_descent_study.py analyse --root {args.root}",
           "max_epochs": args.max_epochs, "regime_tol": args.regime_tol, "runs": runs, "verdicts": verdicts,
           "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=_json) + "\n")
    print(json.dumps(verdicts, indent=1))
    return 0


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
    p.add_argument("--regime-tol", type=float, default=0.02)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    return {"run": cmd_run, "analyse": cmd_analyse, "status": cmd_status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
