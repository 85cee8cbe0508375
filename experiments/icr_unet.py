"""ICR dynamics on a conv U-Net, data-limited vs data-rich (ICR paper Sec. 5.2, Fig. 5 / 8 / 3).

Runs the two CLI configs (``lightning_pfd/configs/experiments/icr_unet_{small,large}.yaml``:
N = 64 and N = 1024 UCI digits at 16x16, a 0.18M-parameter ddpm++ U-Net, EDM, 20 epochs x 75
steps) through ``python -m lightning_pfd fit``, reads the per-epoch CSV log (ICR at the default
tap ``dec.8x8_block1`` at the ICR paper's default augmentation level 3 as ``icr/icr``, the series
ICR early stopping and the kept checkpoint read; a level-1 (crop-only) variant as ``icr_l1/icr``;
traces, memorization ratio, ICR early stopping in observe mode), then:

- diagnostics on the same images, views and seeds as the monitor: ICR of a random linear map
  of the input (the trivial baseline the tap must differ from), of an untrained net's tap, of
  the exact empirical denoiser's output D*(view; sigma*) (the perfect memorizer) and of the
  trained net's output D_theta, all through the same 16-d random projection;
- the measurement noise of ICR (the last and the ICR-minimum checkpoints re-measured with 4 view
  seeds, at level 3 and at the level-1 variant's level; the rise from the minimum to the last
  epoch set beside that spread, and the paired per-seed rise last - minimum), and, for the small run, both re-measured with 16 view pairs per image (two seeds), where
  the view-sampling noise averages out, through the 16-d projection and on the full 32-d tap;
- the effect of tau (ICR of the same features with tau = "auto" and the former "relative");
- the checkpoint kept at the ICR minimum (epoch, and ICR re-measured on it);
- the sigma sweep with the linear probe (``python -m lightning_pfd icr-sweep``) on the last
  checkpoints and on the small run's ICR-minimum checkpoint.

Writes ``experiments/results/icr_unet.json`` and ``docs/figures/icr_unet_{dynamics,traces,
sweep}.png``.

    OMP_NUM_THREADS=1 nice -n 5 python experiments/icr_unet.py            # train + analyse
    OMP_NUM_THREADS=1 python experiments/icr_unet.py --skip-train         # analyse existing runs
    OMP_NUM_THREADS=1 python experiments/icr_unet.py --events-only        # report events, paired tests
    OMP_NUM_THREADS=1 python experiments/icr_unet.py --doc-tables         # docs/icr.md's tables
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
LEVEL, D_PROJ, SEED = 3, 16, 1      # LEVEL: the reported series icr/icr (the ICR paper's default)
VARIANT = {"name": "icr_l1", "level": 1}  # the named level-1 (crop-only) variant monitor
LEVELS = {"icr/icr": {"level": LEVEL, "role": "reported series (ICREarlyStopping, checkpoint, "
                      "diagnostics and sweeps)", "augment": "crop + flip + brightness/contrast"},
          f"{VARIANT['name']}/icr": {"level": VARIANT["level"], "role": "named variant",
                                      "augment": "random crop only"}}
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
    sec = time.time() - t0
    (run / "fit_wall_seconds.json").write_text(json.dumps({"seconds": sec, "command": " ".join(cmd[1:])}))
    return sec


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
                if v not in ("", None) and k.split("/")[0] in ("icr", VARIANT["name"], "mem"):
                    rows[e][k] = float(v)
    return [{"epoch": e, **rows[e]} for e in sorted(rows) if "icr/icr" in rows[e]]


def callback_states(ckpt_path: Path) -> dict:
    return torch.load(ckpt_path, map_location="cpu", weights_only=True)["callbacks"]


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
    """ICR of features feature_fn(views) on the monitor's subset / views / seeds (LEVEL, sigma*)."""
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
    # measurement noise: the last checkpoint re-measured with other view seeds (same images;
    # the seed draws the views and the 16-d projection), at LEVEL and at the variant's level
    out["view_seed_spread_last"] = _seed_spread(module, data, views, LEVEL)
    out[f"view_seed_spread_last_{VARIANT['name']}"] = _seed_spread(module, data, views, VARIANT["level"])
    if best:
        _, bm = load(run, Path(best[-1]))
        ck = torch.load(best[-1], map_location="cpu", weights_only=True)
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
        out["view_seed_spread_best"] = _seed_spread(bm, data, views, LEVEL)
        out[f"view_seed_spread_best_{VARIANT['name']}"] = _seed_spread(bm, data, views, VARIANT["level"])
    return out


SPREAD_SEEDS = (1, 2, 3, 4)


def _seed_spread(module, data, views: int, level: int) -> dict:
    from lightning_pfd.evaluation.representation import RepresentationEvaluation

    vals = [float(RepresentationEvaluation(data, level=level, views_per_image=views, d_proj=D_PROJ, seed=s)
                  .evaluate(module)[SIGMA]["icr"]) for s in SPREAD_SEEDS]
    return {"level": level, "seeds": list(SPREAD_SEEDS), "values": vals,
            "std": float(torch.tensor(vals).std()), "mean": sum(vals) / len(vals),
            "range": max(vals) - min(vals)}


def rise_vs_spread(summary: dict, diag: dict, suffix: str = "") -> dict:
    """The logged rise (last - minimum, and max after the minimum - minimum) beside the view-seed
    spread of one measurement at the last and the kept checkpoint, and the paired rise: for each
    view seed, ICR(last) - ICR(kept checkpoint) with the same views and projection."""
    last, best = diag.get("view_seed_spread_last" + suffix), diag.get("view_seed_spread_best" + suffix)
    rise = summary["icr_last"] - summary["icr_min"]
    out = {"rise_last_minus_min": rise, "rise_max_minus_min": summary["icr_max_after_min"] - summary["icr_min"]}
    if last is None or best is None:
        return out
    sd = max(last["std"], best["std"])
    paired = [a - b for a, b in zip(last["values"], best["values"])]
    pm = sum(paired) / len(paired)
    psd = float(torch.tensor(paired).std())
    out.update({"sd_last": last["std"], "sd_best": best["std"], "range_last": last["range"],
                "range_best": best["range"], "rise_over_sd": rise / sd if sd > 0 else math.inf,
                "rise_exceeds_sd": rise > sd, "rise_exceeds_range": rise > max(last["range"], best["range"]),
                "rise_exceeds_2sd_of_difference": rise > 2 * math.sqrt(last["std"] ** 2 + best["std"] ** 2),
                "seed_mean_last_minus_best": last["mean"] - best["mean"],
                "paired_rise_by_seed": paired, "paired_rise_mean": pm, "paired_rise_sd": psd,
                "paired_rise_se": psd / math.sqrt(len(paired)),
                "paired_rise_t": pm / (psd / math.sqrt(len(paired))) if psd > 0 else math.inf,
                "paired_rise_positive_seeds": sum(d > 0 for d in paired), "n_seeds": len(paired)})
    # the minimum's epoch was chosen on the monitor's seed (SEED): its paired rise is selected,
    # the other seeds' are not
    held = [d for sd_, d in zip(last.get("seeds", SPREAD_SEEDS), paired) if sd_ != SEED]
    if len(held) > 1:
        hm, hsd = sum(held) / len(held), float(torch.tensor(held).std())
        out.update({"paired_rise_other_seeds": held, "paired_rise_other_seeds_mean": hm,
                    "paired_rise_other_seeds_se": hsd / math.sqrt(len(held)),
                    "paired_rise_other_seeds_min": min(held)})
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


# ----------------------------------------------------------------------------- events, paired tests
def paired_contrasts(run: Path, key: str, ref_epoch: int) -> dict:
    """ICR(e) - ICR(ref_epoch) for every epoch e, with the paired delete-a-group jackknife standard
    error from the run's per-unit records (the monitor measures the same images, views and
    projection every epoch, so the replicates pair across epochs): d_g = r_g(e) - r_g(ref),
    se^2 = (G-1)/G sum_g (d_g - mean d)^2. Within-seed sampling of images only: the spread over
    view seeds / projections is the diagnostics' view_seed_spread."""
    import numpy as np
    from lightning_pfd.analysis.per_unit import read_records, value_and_se

    recs, problems = read_records(run / "per_unit")
    by_epoch = {r.epoch: r for r in recs.get(key, [])}
    if ref_epoch not in by_epoch:
        return {"key": key, "problems": problems, "rows": []}
    ref = by_epoch[ref_epoch]
    order = np.argsort(ref.units)
    rows = []
    for e in sorted(by_epoch):
        r = by_epoch[e]
        assert np.array_equal(np.sort(r.units), ref.units[order])
        d = r.values[np.argsort(r.units)] - ref.values[order]
        diff = r.value - ref.value
        se = value_and_se(d, "jackknife", diff)[1]  # the paired replicates' jackknife error
        rows.append({"epoch": e, "diff": diff, "se": se, "z": diff / se if se > 0 else None})
    return {"key": key, "ref_epoch": ref_epoch, "groups": int(ref.units.size), "problems": problems,
            "rows": rows}


def report_events(run: Path) -> dict:
    """The training-dynamics detectors (``python -m lightning_pfd report``) on the run's CSV log
    and per-unit records: detected events, undecided candidates and transients, compact."""
    out = run / "report"
    cmd = [sys.executable, "-m", "lightning_pfd", "report", str(run / "csv"), "--out", str(out), "--force"]
    subprocess.run(cmd, cwd=ROOT, env=_env(), check=True, stdout=subprocess.DEVNULL)
    ev = json.loads((out / "events.json").read_text())

    def compact(e):
        legs = {k: {kk: v[kk] for kk in ("diff", "se", "z") if kk in v}
                for k, v in e.get("detail", {}).get("legs", {}).items()}
        return {"name": e["name"], "epoch": e.get("epoch"), "z": e.get("significance"),
                "status": e.get("status"), "source": e.get("detail", {}).get("source"), "legs": legs}
    return {"command": f"python -m lightning_pfd report {os.path.relpath(run / 'csv', ROOT)}",
            "events": [compact(e) for e in ev.get("events", [])],
            "undecided": [compact(e) for e in ev.get("undecided", [])],
            "transients": [compact(e) for e in ev.get("transients", [])],
            "per_unit_metrics": ev.get("per_unit", {}).get("metrics")}


def plain_patience_stop(icr: list, patience: int):
    """Where Lightning's plain patience rule (min_delta 0, mode min; ``min_rise_z=None``) would stop
    on the logged series: the epoch its count of checks without a new minimum reaches patience."""
    best, wait = math.inf, 0
    for e, v in enumerate(icr):
        if v < best:
            best, wait = v, 0
        else:
            wait += 1
            if wait >= patience:
                return e
    return None


def es_log(run: Path) -> list:
    """ICREarlyStopping's logged rows (icr/best_epoch, icr/rise_z, icr/stop_epoch; logged by step,
    without an epoch column)."""
    rows = []
    with open(run / "csv" / "version_0" / "metrics.csv") as f:
        for r in csv.DictReader(f):
            if r.get("icr/stop_epoch") not in ("", None):
                rows.append({"step": int(float(r["step"])),
                             **{k.split("/")[1]: (float(r[k]) if r.get(k) not in ("", None) else None)
                                for k in ("icr/best_epoch", "icr/rise_z", "icr/stop_epoch")}})
    return rows


def add_events(res: dict, runs_dir: Path, names) -> None:
    for name in names:
        r = res["runs"][name]
        run = runs_dir / RUNS[name]
        r["rise_vs_spread"] = rise_vs_spread(r["summary"], r["diagnostics"])
        if r.get("variant"):
            r["variant"]["rise_vs_spread"] = rise_vs_spread(r["variant"]["summary"], r["diagnostics"],
                                                            f"_{VARIANT['name']}")
        states = callback_states(run / "checkpoints" / "last.ckpt")
        es = early_stopping_state(states)
        r["early_stopping"] = {"monitor": "icr/icr", "patience": int(es.get("patience", -1)),
                               "best_epoch": int(es.get("best_epoch", -1)),
                               "would_stop_epoch": int(es.get("would_stop_epoch", -1)),
                               "rise_z_last": float(es.get("rise_z", math.nan)),
                               "plain_patience_stop_epoch": plain_patience_stop(
                                   [e["icr/icr"] for e in r["epochs"]], int(es.get("patience", 5))),
                               "log": es_log(run)}
        r["report"] = report_events(run)
        r["paired_vs_min"] = {"icr/icr": paired_contrasts(run, "icr/icr", r["summary"]["icr_min_epoch"])}
        if r.get("variant"):
            v = r["variant"]
            r["paired_vs_min"][v["summary"]["key"]] = paired_contrasts(run, v["summary"]["key"],
                                                                        v["summary"]["icr_min_epoch"])


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
        lv = r.get("summary", {}).get("level", LEVEL)
        lines = ax.plot(ep, [e["icr/icr"] for e in r["epochs"]], "o-", ms=3, color="tab:blue",
                        label=f"ICR (level {lv}, tap, left)")
        d = r.get("diagnostics", {})
        s = r["summary"]
        for key, e_at in (("view_seed_spread_best", s["icr_min_epoch"]),
                          ("view_seed_spread_last", ep[-1])):
            if key in d:  # the view-seed spread of one measurement (4 seeds), as mean +- sd
                ax.errorbar([e_at + 0.25], [d[key]["mean"]], yerr=[d[key]["std"]], fmt="x",
                            color="k", ms=4, capsize=3, lw=0.8)
        lines += ax.plot([], [], "x", color="k", label="4 view seeds: mean ± sd")
        vkey = f"{VARIANT['name']}/icr"
        if vkey in r["epochs"][0]:
            ax2b = ax.twinx()
            ax2b.spines["right"].set_position(("axes", 1.2))
            lines += ax2b.plot(ep, [e[vkey] for e in r["epochs"]], "^:", ms=3,
                               color="tab:cyan", label=f"ICR level {VARIANT['level']} variant (outer right axis)")
            ax2b.tick_params(axis="y", colors="tab:cyan", labelsize=7)
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
        es_txt = "ES: no stop" if s["would_stop_epoch"] is None else f"ES stop ep {s['would_stop_epoch']}"
        ax.set_title(f"N = {r['n_train']}: ICR (level {lv}) min ep {s['icr_min_epoch']}, {onset_txt}, "
                     f"{es_txt}", fontsize=9)
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


# ----------------------------------------------------------------------------- docs tables
def _f(x, nd=4):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def doc_tables(res: dict) -> dict:
    """The markdown tables of docs/icr.md's U-Net section, generated from the record (the docs hold
    them between ``<!-- icr-unet-<name>:start -->`` / ``:end -->`` markers; a test compares)."""
    S, L = res["runs"]["small"], res["runs"]["large"]
    vk = f"{VARIANT['name']}/icr"
    out = {}
    rows = ["| epoch | N=64 ICR, level 3 | ICR (τ rel.) | s.e. | ICR, level 1 | Tr Σ_s | Tr Σ_ξ | mem/ratio "
            "| N=1024 ICR, level 3 | ICR, level 1 | Tr Σ_s | Tr Σ_ξ | mem/ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, b in zip(S["epochs"], L["epochs"]):
        bold = lambda r, e, v: f"**{v}**" if e["epoch"] == r["summary"]["icr_min_epoch"] else v  # noqa: E731
        rows.append(f"| {a['epoch']} | {bold(S, a, _f(a['icr/icr']))} | {_f(a['icr/icr_tau_relative'])} "
                    f"| {_f(a['icr/icr_se'], 3)} | {_f(a[vk])} | {_f(a['icr/trace_s'])} | {_f(a['icr/trace_xi'])} "
                    f"| {_f(a['mem/ratio'], 3)} | {bold(L, b, _f(b['icr/icr']))} | {_f(b[vk])} "
                    f"| {_f(b['icr/trace_s'])} | {_f(b['icr/trace_xi'])} | {_f(b['mem/ratio'], 3)} |")
    out["epochs"] = "\n".join(rows) + "\n"
    rows = ["| run, series | ICR first → min (epoch) → last | rise (last − min) | view-seed sd at min / last "
            "(range) | paired rise by seed, last − kept | seeds 2–4: mean ± s.e. | mem. first non-zero / "
            "onset (threshold; detector, z) |",
            "|---|---|---|---|---|---|---|"]
    for r in (S, L):
        for tag, summ, rv, sfx in (("level 3 (`icr/icr`)", r["summary"], r["rise_vs_spread"], ""),
                                   ("level 1 (`icr_l1/icr`)", r["variant"]["summary"],
                                    r["variant"]["rise_vs_spread"], f"_{VARIANT['name']}")):
            d = r["diagnostics"]
            sb, sl = d["view_seed_spread_best" + sfx], d["view_seed_spread_last" + sfx]
            ev = [e for e in r["report"]["events"] if e["name"] == "memorization_onset"]
            rs = r["summary"]
            mem = ("never / none" if rs["mem_first_nonzero_epoch"] is None else
                   f"{rs['mem_first_nonzero_epoch']} / {rs['mem_onset_epoch']}"
                   + (f"; {ev[0]['epoch']}, z {ev[0]['z']:.1f}" if ev else ""))
            rows.append(
                f"| N = {r['n_train']}, {tag} | {_f(summ['icr_first'], 3)} → **{_f(summ['icr_min'], 3)} "
                f"({summ['icr_min_epoch']})** → {_f(summ['icr_last'], 3)} | {_f(rv['rise_last_minus_min'], 3)} "
                f"| {_f(sb['std'], 3)} / {_f(sl['std'], 3)} ({_f(sb['range'], 3)} / {_f(sl['range'], 3)}) "
                f"| {' '.join(f'{x:+.3f}' for x in rv['paired_rise_by_seed'])} "
                f"| {rv['paired_rise_other_seeds_mean']:+.3f} ± {rv['paired_rise_other_seeds_se']:.3f} | {mem} |")
    out["runs"] = "\n".join(rows) + "\n"
    dg = lambda r, k: _f(r["diagnostics"][k]["icr"], 3)  # noqa: E731
    sp = lambda r, k: (" ".join(f"{v:.3f}" for v in r["diagnostics"][k]["values"])  # noqa: E731
                       + f" (sd {r['diagnostics'][k]['std']:.3f})")
    rows = ["| features (level 3 unless named) | N = 64 | N = 1024 |", "|---|---|---|",
            f"| random linear map of the input (trivial baseline) | {dg(S, 'random_linear_map_of_input')} "
            f"| {dg(L, 'random_linear_map_of_input')} |",
            f"| untrained net, tap | {dg(S, 'tap_untrained')} | {dg(L, 'tap_untrained')} |",
            f"| trained net, tap, last checkpoint | **{dg(S, 'tap_last')}** | **{dg(L, 'tap_last')}** |",
            f"| trained net, output D_θ, kept / last checkpoint | {dg(S, 'net_output_best')} / "
            f"{dg(S, 'net_output_last')} | {dg(L, 'net_output_best')} / {dg(L, 'net_output_last')} |",
            f"| exact empirical denoiser output D* (perfect memorizer) | {dg(S, 'empirical_denoiser_output')} "
            f"| {dg(L, 'empirical_denoiser_output')} |",
            f"| tap, 4 monitor seeds (views + projection), kept checkpoint (epoch "
            f"{S['diagnostics']['best_checkpoint']['epoch']} / {L['diagnostics']['best_checkpoint']['epoch']}) "
            f"| {sp(S, 'view_seed_spread_best')} | {sp(L, 'view_seed_spread_best')} |",
            f"| tap, 4 monitor seeds, last checkpoint | {sp(S, 'view_seed_spread_last')} "
            f"| {sp(L, 'view_seed_spread_last')} |",
            f"| level 1: tap, 4 monitor seeds, kept checkpoint | {sp(S, 'view_seed_spread_best_icr_l1')} "
            f"| {sp(L, 'view_seed_spread_best_icr_l1')} |",
            f"| level 1: tap, 4 monitor seeds, last checkpoint | {sp(S, 'view_seed_spread_last_icr_l1')} "
            f"| {sp(L, 'view_seed_spread_last_icr_l1')} |"]
    mv = S["diagnostics"].get("many_views") or {}
    if mv.get("d_proj=16/best"):
        for dp, txt in (("16", "16-d projection"), ("None", "full 32-d tap (n = 2d)")):
            b, l_ = mv[f"d_proj={dp}/best"], mv[f"d_proj={dp}/last"]
            rows.append(f"| tap, {mv['views_per_image']} view pairs/image, seeds 1, 2: kept → last, {txt} "
                        f"| {b[0]:.3f} → {l_[0]:.3f}, {b[1]:.3f} → {l_[1]:.3f} | – |")
    out["diagnostics"] = "\n".join(rows) + "\n"
    sig = [row["sigma"] for row in res["sweeps"]["small_last"]["rows"]]
    rows = ["| σ | " + " | ".join(f"{x:g}" for x in sig) + " |", "|---" * (len(sig) + 1) + "|"]
    for tag, lab in (("small_last", "N = 64, last"),
                     ("small_best", f"N = 64, kept (epoch {S['diagnostics']['best_checkpoint']['epoch']})"),
                     ("large_last", "N = 1024, last")):
        rr = res["sweeps"][tag]["rows"]
        i_min = min(range(len(rr)), key=lambda i: rr[i]["icr"])
        i_acc = max(range(len(rr)), key=lambda i: rr[i]["probe_acc"])
        cells = []
        for i, row in enumerate(rr):
            a = f"{row['icr']:.3f}" if i != i_min else f"**{row['icr']:.3f}**"
            b = f"{row['probe_acc']:.2f}" if i != i_acc else f"**{row['probe_acc']:.2f}**"
            cells.append(f"{a} / {b}")
        rows.append(f"| {lab} | " + " | ".join(cells) + " |")
    out["sweep"] = "\n".join(rows) + "\n"
    return out


# ----------------------------------------------------------------------------- main
def summarize(epochs: list, es_state: dict) -> dict:
    icr = [e["icr/icr"] for e in epochs]
    mem = [e.get("mem/ratio", math.nan) for e in epochs]
    on = onset(mem)
    out = {**curve_summary(icr, on), "level": LEVEL,
           "mem_first": mem[0], "mem_last": mem[-1], "mem_onset_epoch": on["onset_epoch"],
           "mem_first_nonzero_epoch": on["first_nonzero_epoch"], "mem_onset_threshold": on["threshold"]}
    would = int(es_state.get("would_stop_epoch", -1))
    out.update({"would_stop_epoch": would if would >= 0 else None,
                "es_best_epoch": int(es_state.get("best_epoch", -1)),
                "stop_before_onset": (None if on["onset_epoch"] is None or would < 0
                                      else would < on["onset_epoch"])})
    return out


def curve_summary(icr: list, on: dict) -> dict:
    """Minimum (epoch, value), last value, the maximum after the minimum and the rise last - min;
    the lead of the minimum over the memorization onset."""
    i_min = min(range(len(icr)), key=icr.__getitem__)
    after = icr[i_min:]
    i_max = i_min + max(range(len(after)), key=after.__getitem__)
    return {"icr_first": icr[0], "icr_min": icr[i_min], "icr_min_epoch": i_min, "icr_last": icr[-1],
            "icr_max_after_min": icr[i_max], "icr_max_after_min_epoch": i_max,
            "rise_last_minus_min": icr[-1] - icr[i_min],
            "lead_epochs": None if on["onset_epoch"] is None else on["onset_epoch"] - i_min,
            "min_before_onset": None if on["onset_epoch"] is None else i_min < on["onset_epoch"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-train", action="store_true", help="analyse existing runs")
    p.add_argument("--only", choices=["small", "large"], default=None)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--figures-only", action="store_true", help="redraw the figures from --out")
    p.add_argument("--doc-tables", action="store_true", help="print docs/icr.md's tables from --out")
    p.add_argument("--events-only", action="store_true",
                   help="add the report events and the paired contrasts to --out (existing runs)")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"))
    p.add_argument("--out", default=str(ROOT / "experiments" / "results" / "icr_unet.json"))
    p.add_argument("--fig-dir", default=str(ROOT / "docs" / "figures"))
    args = p.parse_args()
    torch.set_num_threads(1)
    runs_dir = Path(args.runs_dir)
    out_path = Path(args.out)
    res = json.loads(out_path.read_text()) if out_path.exists() and (args.skip_train or args.figures_only
                                                                     or args.events_only) else {}
    if args.doc_tables:
        for k, v in doc_tables(json.loads(out_path.read_text())).items():
            print(f"<!-- icr-unet-{k}:start -->\n{v}<!-- icr-unet-{k}:end -->\n")
        return
    if args.events_only:
        add_events(res, runs_dir, [args.only] if args.only else ["small", "large"])
        out_path.write_text(json.dumps(res, indent=1))
        print(f"wrote {out_path}")
        return
    if args.figures_only:
        for pth in figures(res, Path(args.fig_dir)):
            print(f"wrote {pth} ({pth.stat().st_size // 1024} KB)")
        return
    res.setdefault("runs", {})
    res.setdefault("sweeps", {})
    res.setdefault("wall_seconds", {})
    res["levels"] = LEVELS
    res.setdefault("commands", {})
    res["commands"]["analysis"] = " ".join(["OMP_NUM_THREADS=1 python experiments/icr_unet.py", *sys.argv[1:]])
    for n in ("small", "large"):
        res["commands"][f"fit_{n}"] = ("OMP_NUM_THREADS=1 python -m lightning_pfd fit --config "
                                       f"lightning_pfd/configs/experiments/{RUNS[n]}.yaml")
    names = [args.only] if args.only else ["small", "large"]
    for name in names:
        if not args.skip_train:
            res["wall_seconds"][f"fit_{name}"] = train(name, runs_dir)
    for name in names:
        run = runs_dir / RUNS[name]
        views = 4 if name == "small" else 1
        fw = run / "fit_wall_seconds.json"  # written by train() (or by hand for a fit run outside)
        if fw.exists():
            res["wall_seconds"][f"fit_{name}"] = json.loads(fw.read_text())["seconds"]
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
        summ = summarize(epochs, es)
        vkey = f"{VARIANT['name']}/icr"
        var_summ = ({**curve_summary([e[vkey] for e in epochs], onset([e.get("mem/ratio", math.nan) for e in epochs])),
                     "level": VARIANT["level"], "key": vkey} if all(vkey in e for e in epochs) else None)
        res["runs"][name] = {
            "config": os.path.relpath(CONFIGS / f"{RUNS[name]}.yaml", ROOT),
            "n_train": 64 if name == "small" else 1024, "views_per_image": views,
            "levels": LEVELS,
            "epochs": epochs, "summary": summ, "diagnostics": diag,
            "rise_vs_spread": rise_vs_spread(summ, diag),
            "variant": None if var_summ is None else {
                "name": VARIANT["name"], "summary": var_summ,
                "rise_vs_spread": rise_vs_spread(var_summ, diag, f"_{VARIANT['name']}"),
                "note": "the view-seed spread of the variant is measured on the same two checkpoints "
                        "(last, and the kept one at the level-3 minimum); its rise_vs_spread pairs "
                        "the last checkpoint with the kept one, not with the variant's own minimum"},
            "tau_effect": {"max_abs_diff": max(tau_diff),
                           "max_cond_xi": max(e["icr/cond_xi"] for e in epochs),
                           "tau_applied_epochs": [e["epoch"] for e in epochs if e["icr/tau"] > 0],
                           "argmin_relative": min(range(len(rel_curve)), key=rel_curve.__getitem__)}}
        add_events(res, runs_dir, [name])
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
