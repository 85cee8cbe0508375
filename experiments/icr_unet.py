"""ICR dynamics on a conv U-Net, data-limited vs data-rich (ICR paper Sec. 5.2, Fig. 5 / 8 / 3).

Runs the two CLI configs (``lightning_pfd/configs/experiments/icr_unet_{small,large}.yaml``:
N = 64 and N = 1024 UCI digits at 16x16, a 0.18M-parameter ddpm++ U-Net, EDM, 20 epochs x 75
steps) through ``python -m lightning_pfd fit``, reads the per-epoch CSV log (ICR at the default
tap ``dec.8x8_block1``, traces, memorization ratio, ICR early stopping in observe mode), then:

- diagnostics on the same images, views and seeds as the monitor: ICR of a random linear map
  of the input (the trivial baseline the tap must differ from), of an untrained net's tap, of
  the exact empirical denoiser's output D*(view; sigma*) (the perfect memorizer) and of the
  trained net's output D_theta, all through the same 16-d random projection;
- the measurement noise of ICR (the last and the ICR-minimum checkpoints re-measured with 4 view
  seeds), and, for the small run, both re-measured with 16 view pairs per image (two seeds), where
  the view-sampling noise averages out, through the 16-d projection and on the full 32-d tap;
- the effect of tau (ICR of the same features with tau = "auto" and the former "relative");
- the checkpoint kept at the ICR minimum (epoch, and ICR re-measured on it);
- the sigma sweep with the linear probe (``python -m lightning_pfd icr-sweep``) on the last
  checkpoints and on the small run's ICR-minimum checkpoint.

Writes ``experiments/results/icr_unet.json`` and ``docs/figures/icr_unet_{dynamics,traces,
sweep}.png``.

    OMP_NUM_THREADS=1 nice -n 5 python experiments/icr_unet.py            # train + analyse
    OMP_NUM_THREADS=1 python experiments/icr_unet.py --skip-train         # analyse existing runs
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "lightning_pfd" / "configs" / "experiments"
RUNS = {"small": "icr_unet_small", "large": "icr_unet_large"}
SIGMA = 0.29
LEVEL, D_PROJ, SEED = 1, 16, 1
MANY_VIEWS = 16
SWEEP_SIGMAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.29, 0.5, 1.0, 2.0, 5.0)


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def train(name: str, runs_dir: Path) -> float:
    run = runs_dir / RUNS[name]
    shutil.rmtree(run, ignore_errors=True)
    t0 = time.time()
    cmd = [sys.executable, "-m", "lightning_pfd", "fit", "--config", str(CONFIGS / f"{RUNS[name]}.yaml")]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)
    return time.time() - t0


# ----------------------------------------------------------------------------- reading the run
def read_epochs(run: Path) -> list:
    """Per-epoch values from the CSV log (epoch-level keys only)."""
    rows = defaultdict(dict)
    with open(run / "csv" / "version_0" / "metrics.csv") as f:
        for r in csv.DictReader(f):
            if not r.get("epoch"):
                continue
            e = int(float(r["epoch"]))
            for k, v in r.items():
                if v not in ("", None) and k.split("/")[0] in ("icr", "icr_l3", "mem"):
                    rows[e][k] = float(v)
    return [{"epoch": e, **rows[e]} for e in sorted(rows) if "icr/icr" in rows[e]]


def callback_states(ckpt_path: Path) -> dict:
    return torch.load(ckpt_path, map_location="cpu", weights_only=False)["callbacks"]


def monitor_history(states: dict, name: str = "icr") -> list:
    for k, v in states.items():
        if k.startswith("ICRMonitor") and f"'name': '{name}'" in k:
            return v["history"]
    raise KeyError(f"no ICRMonitor {name!r} in {list(states)}")


def early_stopping_state(states: dict) -> dict:
    return next(v for k, v in states.items() if k.startswith("ICREarlyStopping"))


def onset(mem: list) -> dict:
    """First epoch from which the ratio stays above max(0.05, first + 0.05) (icr_dynamics.py rule),
    and the first epoch with any memorized sample."""
    thr = max(0.05, mem[0] + 0.05)
    stay = next((i for i in range(len(mem)) if all(m > thr for m in mem[i:])), None)
    first = next((i for i, m in enumerate(mem) if m > 0), None)
    return {"onset_epoch": stay, "first_nonzero_epoch": first, "threshold": thr}


# ----------------------------------------------------------------------------- diagnostics
def load(run: Path, ckpt: Path):
    from lightning_pfd.commands.icr_sweep import build_datamodule, load_module

    dm, net_spec = build_datamodule(str(run / "csv" / "version_0" / "config.yaml"), None)
    return dm, load_module(str(ckpt), net_spec, "lightning_pfd.modules.DiffusionModule")


def icr_of_map(feature_fn, data: torch.Tensor, views_per_image: int, seed: int = SEED,
               batch: int = 256) -> dict:
    """ICR of features feature_fn(views) on the monitor's subset / views / seeds (level 1, sigma*)."""
    from lightning_pfd.evaluation.representation import RepresentationEvaluation

    ev = RepresentationEvaluation(data.float(), level=LEVEL, sigma=SIGMA,
                                  views_per_image=views_per_image, seed=seed, batch_size=batch)
    out = ev.evaluate(lambda v, s: feature_fn(v))[SIGMA]
    return {"icr": float(out["icr"]), "icr_tau_relative": float(out["icr_tau_relative"]),
            "trace_s": float(out["trace_s"]), "trace_xi": float(out["trace_xi"]),
            "cond_xi": float(out["cond_xi"]), "n_pairs": int(out["n"]), "d": int(out["d"])}


def empirical_denoiser(train: torch.Tensor, sigma: float):
    """D*(x; sigma) = sum_i softmax_i(-|x - y_i|^2 / 2 sigma^2) y_i, the exact minimizer of the
    denoising loss on the training set (a perfect memorizer)."""
    y = train.reshape(train.shape[0], -1).double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        xf = x.reshape(x.shape[0], -1).double()
        d2 = torch.cdist(xf, y).pow(2)
        return torch.softmax(-d2 / (2 * sigma ** 2), dim=1) @ y
    return fn


@torch.no_grad()
def diagnostics(name: str, run: Path, views: int) -> dict:
    from lightning_pfd.evaluation.representation import RepresentationEvaluation
    from lightning_pfd.diffusion.features import extract_features, random_projection
    from lightning_pfd.modules import DiffusionModule

    best = sorted(glob.glob(str(run / "checkpoints" / "icr-min-*.ckpt")))
    last = run / "checkpoints" / "last.ckpt"
    dm, module = load(run, last)
    data = dm.train_data
    D = data[0].numel()
    proj = random_projection(D, D_PROJ, 12345, "cpu")  # input-space projection (fixed)
    flat = lambda f: (lambda v: f(v).reshape(v.shape[0], -1).double() @ proj.double())  # noqa: E731

    def tap_fn(mod):
        den = mod.denoiser
        p = None

        def fn(v):
            nonlocal p
            h = extract_features(den, v, SIGMA)
            if p is None:
                p = random_projection(h.shape[1], D_PROJ, SEED, h.device)  # the monitor's
            return h @ p
        return fn

    def output_fn(mod):
        return lambda v: mod.denoiser(v, torch.full((v.shape[0],), SIGMA))

    out = {"random_linear_map_of_input": icr_of_map(flat(lambda v: v), data, views),
           "empirical_denoiser_output": icr_of_map(flat(empirical_denoiser(data, SIGMA)), data, views),
           "net_output_last": icr_of_map(flat(output_fn(module)), data, views),
           "tap_last": icr_of_map(tap_fn(module), data, views)}
    # untrained net, same architecture (seed 0): what the tap measures before any learning
    torch.manual_seed(0)
    fresh = DiffusionModule(_fresh_net(module), family="edm")
    out["tap_untrained"] = icr_of_map(tap_fn(fresh), data, views)
    # measurement noise: the last checkpoint re-measured with other view seeds (same images)
    vals = []
    for s in (1, 2, 3, 4):
        ev = RepresentationEvaluation(data, level=LEVEL, views_per_image=views, d_proj=D_PROJ, seed=s)
        vals.append(float(ev.evaluate(module)[SIGMA]["icr"]))
    out["view_seed_spread_last"] = {"values": vals, "std": float(torch.tensor(vals).std()),
                                    "mean": sum(vals) / len(vals), "range": max(vals) - min(vals)}
    if best:
        _, bm = load(run, Path(best[-1]))
        ck = torch.load(best[-1], map_location="cpu", weights_only=False)
        ev = RepresentationEvaluation(data, level=LEVEL, views_per_image=views, d_proj=D_PROJ, seed=SEED)
        out["best_checkpoint"] = {"path": os.path.relpath(best[-1], ROOT), "epoch": int(ck["epoch"]),
                                  "icr_remeasured": float(ev.evaluate(bm)[SIGMA]["icr"])}
        out["net_output_best"] = icr_of_map(flat(output_fn(bm)), data, views)
        # many views per image: the view-sampling noise averages out, so ICR of the whole
        # training set is compared between the ICR-minimum and the last checkpoint
        # (the seed also draws the d_proj projection: with d_proj = 16 the two seeds are two
        # different 16-d projections of the 32-channel tap; d_proj = None is the full tap, d = 32)
        if name == "small":
            out["many_views"] = {"views_per_image": MANY_VIEWS, "seeds": [1, 2]}
            for dp in (D_PROJ, None):
                for tag, mod in (("best", bm), ("last", module)):
                    out["many_views"][f"d_proj={dp}/{tag}"] = [
                        float(RepresentationEvaluation(data, level=LEVEL, views_per_image=MANY_VIEWS, d_proj=dp, seed=s)
                              .evaluate(mod)[SIGMA]["icr"]) for s in (1, 2)]
        vals = [float(RepresentationEvaluation(data, level=LEVEL, views_per_image=views, d_proj=D_PROJ, seed=s)
                      .evaluate(bm)[SIGMA]["icr"]) for s in (1, 2, 3, 4)]
        out["view_seed_spread_best"] = {"values": vals, "std": float(torch.tensor(vals).std()),
                                        "mean": sum(vals) / len(vals), "range": max(vals) - min(vals)}
    return out


def _fresh_net(module):
    from lightning_pfd.nets import UNet

    n = module.net
    return UNet(img_resolution=n.img_resolution, in_channels=n.in_channels,
                model_channels=n.model_channels, channel_mult=list(n.channel_mult),
                num_blocks=n.num_blocks, attn_resolutions=list(n.attn_resolutions), dropout=0.0)


def sweep(name: str, run: Path, ckpt: Path, views: int, tag: str) -> tuple:
    out = run / f"icr_sweep_{tag}"
    cmd = [sys.executable, "-m", "lightning_pfd", "icr-sweep", "--ckpt", str(ckpt),
           "--data", str(run / "csv" / "version_0" / "config.yaml"), "--level", str(LEVEL),
           "--d-proj", str(D_PROJ),
           "--views-per-image", str(views), "--seed", str(SEED), "--out", str(out),
           "--sigmas", *[str(s) for s in SWEEP_SIGMAS]]
    print("$", " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd),
          flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)
    return json.loads((out / "icr_sweep.json").read_text()), time.time() - t0


# ----------------------------------------------------------------------------- figures
def figures(res: dict, fig_dir: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name in zip(axes, ("small", "large")):
        r = res["runs"][name]
        ep = [e["epoch"] for e in r["epochs"]]
        lines = ax.plot(ep, [e["icr/icr"] for e in r["epochs"]], "o-", ms=3, color="tab:blue",
                        label="ICR (level 1, tap, left)")
        if "icr_l3/icr" in r["epochs"][0]:
            ax2b = ax.twinx()
            ax2b.spines["right"].set_position(("axes", 1.2))
            lines += ax2b.plot(ep, [e["icr_l3/icr"] for e in r["epochs"]], "^:", ms=3,
                               color="tab:cyan", label="ICR level 3 (outer right axis)")
            ax2b.tick_params(axis="y", colors="tab:cyan", labelsize=7)
        s = r["summary"]
        ax.axvline(s["icr_min_epoch"], color="tab:blue", ls="--", lw=0.8)
        if s["would_stop_epoch"] is not None and s["would_stop_epoch"] >= 0:
            ax.axvline(s["would_stop_epoch"], color="gray", ls=":", lw=0.8)
        ax.set_xlabel("epoch (75 steps)")
        ax.set_ylabel("ICR", color="tab:blue")
        ax2 = ax.twinx()
        lines += ax2.plot(ep, [e.get("mem/ratio", math.nan) for e in r["epochs"]], "s-", ms=3,
                          color="tab:red", label="memorization ratio (right)")
        ax2.set_ylabel("memorization ratio", color="tab:red")
        ax2.set_ylim(-0.02, max(0.1, 1.1 * max(e.get("mem/ratio", 0) for e in r["epochs"])))
        if s["mem_onset_epoch"] is not None:
            ax2.axvline(s["mem_onset_epoch"], color="tab:red", ls="--", lw=0.8)
        onset_txt = "no onset" if s["mem_onset_epoch"] is None else f"onset ep {s['mem_onset_epoch']}"
        ax.set_title(f"N = {r['n_train']}: ICR min ep {s['icr_min_epoch']}, {onset_txt}, "
                     f"ES stop ep {s['would_stop_epoch']}", fontsize=9)
        ax.legend(handles=lines, fontsize=7, loc="upper center")
    fig.tight_layout()
    p = fig_dir / "icr_unet_dynamics.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key, title in zip(axes, ("icr/trace_s", "icr/trace_xi"),
                              (r"Tr $\Sigma_s$ (l2-normalized)", r"Tr $\Sigma_\xi$ (l2-normalized)")):
        for name, c in (("small", "tab:red"), ("large", "tab:green")):
            r = res["runs"][name]
            ax.plot([e["epoch"] for e in r["epochs"]], [e[key] for e in r["epochs"]], "o-", ms=3,
                    color=c, label=f"N = {r['n_train']}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        ax.legend(fontsize=8)
    fig.tight_layout()
    p = fig_dir / "icr_unet_traces.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    styles = {"small_last": ("tab:red", "o-"), "small_best": ("tab:orange", "o--"),
              "large_last": ("tab:green", "s-")}
    for tag, rows in res["sweeps"].items():
        c, st = styles[tag]
        s = [r["sigma"] for r in rows["rows"]]
        axes[0].plot(s, [r["icr"] for r in rows["rows"]], st, ms=3, color=c, label=rows["label"])
        axes[1].plot(s, [r["probe_acc"] for r in rows["rows"]], st, ms=3, color=c, label=rows["label"])
    for ax, t in zip(axes, ("ICR vs noise level", "linear probe accuracy (held-out digits)")):
        ax.set_xscale("log")
        ax.set_xlabel(r"$\sigma$")
        ax.set_title(t, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = fig_dir / "icr_unet_sweep.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths


# ----------------------------------------------------------------------------- main
def summarize(epochs: list, es_state: dict) -> dict:
    icr = [e["icr/icr"] for e in epochs]
    mem = [e.get("mem/ratio", math.nan) for e in epochs]
    i_min = min(range(len(icr)), key=icr.__getitem__)
    on = onset(mem)
    would = int(es_state.get("would_stop_epoch", -1))
    return {"icr_first": icr[0], "icr_min": icr[i_min], "icr_min_epoch": i_min, "icr_last": icr[-1],
            "icr_max_after_min": max(icr[i_min:]),
            "mem_first": mem[0], "mem_last": mem[-1], "mem_onset_epoch": on["onset_epoch"],
            "mem_first_nonzero_epoch": on["first_nonzero_epoch"], "mem_onset_threshold": on["threshold"],
            "lead_epochs": None if on["onset_epoch"] is None else on["onset_epoch"] - i_min,
            "would_stop_epoch": would if would >= 0 else None,
            "es_best_epoch": int(es_state.get("best_epoch", -1)),
            "stop_before_onset": (None if on["onset_epoch"] is None or would < 0
                                  else would < on["onset_epoch"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-train", action="store_true", help="analyse existing runs")
    p.add_argument("--only", choices=["small", "large"], default=None)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--figures-only", action="store_true", help="redraw the figures from --out")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"))
    p.add_argument("--out", default=str(ROOT / "experiments" / "results" / "icr_unet.json"))
    p.add_argument("--fig-dir", default=str(ROOT / "docs" / "figures"))
    args = p.parse_args()
    torch.set_num_threads(1)
    runs_dir = Path(args.runs_dir)
    out_path = Path(args.out)
    res = json.loads(out_path.read_text()) if out_path.exists() and (args.skip_train or
                                                                     args.figures_only) else {}
    if args.figures_only:
        for pth in figures(res, Path(args.fig_dir)):
            print(f"wrote {pth} ({pth.stat().st_size // 1024} KB)")
        return
    res.setdefault("runs", {})
    res.setdefault("sweeps", {})
    res.setdefault("wall_seconds", {})
    names = [args.only] if args.only else ["small", "large"]
    for name in names:
        if not args.skip_train:
            res["wall_seconds"][f"fit_{name}"] = train(name, runs_dir)
    for name in names:
        run = runs_dir / RUNS[name]
        views = 4 if name == "small" else 1
        epochs = read_epochs(run)
        states = callback_states(run / "checkpoints" / "last.ckpt")
        hist = monitor_history(states)
        es = early_stopping_state(states)
        for e, h in zip(epochs, hist):
            assert h["epoch"] == e["epoch"]
            e.update({k: h[k] for k in ("icr/tau", "icr/cond_xi", "icr/icr_tau_auto",
                                          "icr/icr_tau_relative") if k in h})
        t0 = time.time()
        diag = diagnostics(name, run, views)
        res["wall_seconds"][f"diagnostics_{name}"] = time.time() - t0
        tau_diff = [abs(e["icr/icr_tau_relative"] - e["icr/icr_tau_auto"]) for e in epochs]
        rel_curve = [e["icr/icr_tau_relative"] for e in epochs]
        res["runs"][name] = {
            "config": os.path.relpath(CONFIGS / f"{RUNS[name]}.yaml", ROOT),
            "n_train": 64 if name == "small" else 1024, "views_per_image": views,
            "epochs": epochs, "summary": summarize(epochs, es), "diagnostics": diag,
            "tau_effect": {"max_abs_diff": max(tau_diff),
                           "max_cond_xi": max(e["icr/cond_xi"] for e in epochs),
                           "tau_applied_epochs": [e["epoch"] for e in epochs if e["icr/tau"] > 0],
                           "argmin_relative": min(range(len(rel_curve)), key=rel_curve.__getitem__)}}
        print(name, json.dumps(res["runs"][name]["summary"]), flush=True)
        if not args.no_sweep:
            ck = run / "checkpoints" / "last.ckpt"
            rows, sec = sweep(name, run, ck, views, "last")
            res["sweeps"][f"{name}_last"] = {"label": f"N = {res['runs'][name]['n_train']}, last",
                                            "ckpt": os.path.relpath(ck, ROOT), "rows": rows}
            res["wall_seconds"][f"sweep_{name}_last"] = sec
            if name == "small" and "best_checkpoint" in diag:
                ck = ROOT / diag["best_checkpoint"]["path"]
                rows, sec = sweep(name, run, ck, views, "best")
                res["sweeps"]["small_best"] = {
                    "label": f"N = 64, ICR-min ckpt (ep {diag['best_checkpoint']['epoch']})",
                    "ckpt": os.path.relpath(ck, ROOT), "rows": rows}
                res["wall_seconds"]["sweep_small_best"] = sec
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1))
    if all(n in res["runs"] for n in ("small", "large")):
        for pth in figures(res, Path(args.fig_dir)):
            print(f"wrote {pth} ({pth.stat().st_size // 1024} KB)")
    out_path.write_text(json.dumps(res, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
