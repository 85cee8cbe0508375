"""``python -m lightning_pfd pite``: train SBM and LIM on the same data and U-Net, print the
blog's table (RMSQE, LOADER, same-law floor) of a physical observable (PITE: the blog post on evaluating heavy-tailed
diffusion models with tail metrics).

Both models are built from their LightningCLI configs (default: the embedded
``sbm_precip.yaml`` and ``lim_precip.yaml``) with CPU-budget overrides (crop size, U-Net width,
training steps), trained one after the other, then each generates ``--num-samples`` seeded
samples. The observable (default: crop maximum in mm/h, after the inverse log1p transform) of
the samples is compared with that of the training crops. Writes ``results.json``,
``table.md``, ``observables.pt`` (the finite observables: data / sbm / lim) and ``density.png``
(the blog's Fig. 9: data vs SBM vs LIM) under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["main", "build_parser", "format_table", "matched_kwargs", "NUM_SPLITS"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_pfd pite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sbm-config", default="sbm_precip", help="SBM config (path or embedded name)")
    p.add_argument("--lim-config", default="lim_precip", help="LIM config (path or embedded name)")
    p.add_argument("--max-steps", type=int, default=1000, help="training steps per model")
    p.add_argument("--crop-size", type=int, default=16,
                   help="crop side (overrides data crop_size and net img_resolution); 0 = config")
    p.add_argument("--model-channels", type=int, default=8, help="U-Net width; 0 = config")
    p.add_argument("--num-blocks", type=int, default=1, help="U-Net blocks per level; 0 = config")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of both; 0 = config")
    p.add_argument("--ema-decay", type=float, default=0.99,
                   help="EMA decay of both (short runs need a short EMA); <0 = config")
    p.add_argument("--n-train", type=int, default=2048, help="training crops; 0 = config")
    p.add_argument("--batch-size", type=int, default=32, help="training batch; 0 = config")
    p.add_argument("--num-samples", type=int, default=1024, help="generated samples per model")
    p.add_argument("--lim-steps", type=int, default=50, help="LIM sampler steps")
    p.add_argument("--lim-sampler", default="ode", choices=["ode", "sde"])
    p.add_argument("--observable", default="max", help="registered observable name")
    p.add_argument("--eta", type=float, default=0.975, help="RMSQE tail level")
    p.add_argument("--floor", type=float, default=1e-3, help="LOADER density floor (x peak)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0 = leave as is)")
    p.add_argument("--out", default="runs/pite", help="output directory")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument("--override", action="append", default=[],
                   help="extra LightningCLI override applied to both, e.g. --override=--model.init_args.lr=1e-3")
    return p


def _validate(a) -> None:
    for name in ("max_steps", "num_samples", "lim_steps"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(a, name)}")
    if a.ema_decay > 1:
        raise ValueError(f"--ema-decay: must be <= 1 (negative = config), got {a.ema_decay}")
    if a.lr < 0:
        raise ValueError(f"--lr: must be >= 0, got {a.lr}")
    for name in ("crop_size", "model_channels", "num_blocks", "n_train", "batch_size", "threads"):
        if getattr(a, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(a, name)}")
    if not 0 < a.eta < 1:
        raise ValueError(f"--eta: must lie in (0, 1), got {a.eta}")
    if a.n_train and a.num_samples >= a.n_train:
        raise ValueError(f"--num-samples: must be < --n-train ({a.n_train}) for the same-law "
                         f"floor (n_gen = num_samples), got {a.num_samples}")


def _cli_args(a, config: str, name: str) -> list[str]:
    from .cli import resolve_config_path

    args = ["--config", resolve_config_path(config),
            f"--trainer.max_steps={a.max_steps}", "--trainer.max_epochs=-1",
            "--trainer.logger=false",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu",
            f"--trainer.default_root_dir={os.path.join(a.out, name)}"]
    if a.crop_size:
        args += [f"--data.init_args.crop_size={a.crop_size}",
                 f"--model.init_args.net.init_args.img_resolution={a.crop_size}"]
    if a.model_channels:
        args.append(f"--model.init_args.net.init_args.model_channels={a.model_channels}")
    if a.num_blocks:
        args.append(f"--model.init_args.net.init_args.num_blocks={a.num_blocks}")
    if a.lr:
        args.append(f"--model.init_args.lr={a.lr}")
    if a.ema_decay >= 0:
        args.append(f"--model.init_args.ema_decay={a.ema_decay}")
    if a.n_train:
        args.append(f"--data.init_args.n_train={a.n_train}")
    if a.batch_size:
        args.append(f"--data.init_args.batch_size={a.batch_size}")
    return args + list(a.override)


def build_one(a, config: str, name: str):
    """Instantiate (model, datamodule, trainer) from the config + overrides and run the
    framework's validation phase (shapes, data, callbacks); nothing is trained or written yet.
    The config's checkpoints are redirected to ``--out/<name>/checkpoints``; its measurement
    callbacks (e.g. the configs' TailMonitor) are dropped: pite measures once, at the end."""
    from .callbacks._schedule import ScheduledMonitor

    from .lightning_cli import PFDLightningCLI

    from unittest import mock

    with mock.patch.object(sys, "argv", [sys.argv[0]]):  # silence LightningCLI's mixed-args warning
        cli = PFDLightningCLI(args=_cli_args(a, config, name), run=False,
                              save_config_kwargs={"overwrite": True})
    for cb in cli.trainer.checkpoint_callbacks:
        cb.dirpath = os.path.join(a.out, name, "checkpoints")
    cli.trainer.callbacks = [cb for cb in cli.trainer.callbacks if not isinstance(cb, ScheduledMonitor)]
    cli.validate_run()
    return cli


def train_one(cli):
    """Fit a validated CLI's model; returns (model, datamodule, seconds)."""
    t0 = time.time()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model, cli.datamodule, time.time() - t0


def _check_reference(a, dm) -> None:
    from .errors import ConfigError

    n_ref = int(dm.train_data.shape[0])
    if not a.num_samples < n_ref:
        raise ConfigError("--num-samples", f"must be < the number of training crops ({n_ref}) for "
                          "the same-law floor (n_gen = num_samples)", value=a.num_samples,
                          suggestion=f"use --num-samples {n_ref // 2} or raise --n-train")


def _check_out(a) -> None:
    from .errors import ConfigError

    done = [n for n in ("results.json", "table.md", "density.png") if (Path(a.out) / n).exists()]
    if done and not a.force:
        raise ConfigError("--out", f"holds the results of an earlier run ({', '.join(done)})",
                          value=a.out, suggestion="choose another --out, or pass --force to replace them")


def _generate(model, seeds, a):
    import torch

    kw = {"batch_size": 256}
    if hasattr(model, "alpha"):  # LevyItoModule
        kw.update(num_steps=a.lim_steps, sampler=a.lim_sampler)
    model.eval()
    with torch.no_grad():
        return model.generate(seeds, **kw)


NUM_SPLITS = 8  # reference splits for the same-law floor and the matched model scores


def matched_kwargs(ref, n_gen: int, eta: float, floor: float, window=None) -> dict:
    """Explicit metric settings shared by the model scores and the same-law floors.

    **[choice]** A perfect model must score the floor in expectation (docs/levy.md): the
    floor is metric(ref[S_k], ref[R_k]) averaged over ``NUM_SPLITS`` seeded splits
    (|S_k| = n_gen = ``--num-samples``, without replacement; R_k the other n_ref - n_gen
    points), and each model is scored by ``matched_score``: metric(gen, ref[R_k]) averaged over
    the *same* R_k. So both compare n_gen samples with the same n_ref - n_gen reference points
    (scoring against the full reference would compare with n_ref points, a small mismatch).
    RMSQE: the blog's integral over [eta, 1] (sample maxima included). LOADER: bandwidth
    (Silverman) and absolute density floor (``floor`` x reference KDE peak) frozen on the full
    reference; window None = the whole real line (each comparison's support of both samples
    plus the kernels' reach), so generated mass beyond the data maximum counts.
    """
    from .metrics.tails import loader_settings

    return {"rmsqe": dict(eta=eta),
            "loader": loader_settings(ref, window=window, floor=floor)}


def format_table(res: dict) -> str:
    lim_label = f"LIM (alpha = {res['alpha']:g})"
    rows = [
        "| Metric | SBM | " + lim_label + " | same-law floor |",
        "|---|---|---|---|",
        f"| RMSQE (eta = {res['eta']}) | {res['sbm']['rmsqe']:.4g} | {res['lim']['rmsqe']:.4g} | "
        f"{res['floor']['rmsqe']:.4g} |",
        f"| LOADER | {res['sbm']['loader']:.4g} | {res['lim']['loader']:.4g} | "
        f"{res['floor']['loader']:.4g} |",
    ]
    q = ["", f"Observable `{res['observable']}` quantiles (q50 / q90 / q97.5 / q99 / max):"]
    for k in ("data", "sbm", "lim"):
        v = res["quantiles"][k]
        bad = "" if k == "data" else f" (non-finite: {100 * res[k]['nonfinite']:.1f} %)"
        q.append(f"- {k}: " + " / ".join(f"{x:.4g}" for x in v) + bad)
    return "\n".join(rows + q)


def _density_plot(path: Path, obs: dict, window, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    from .metrics.tails import _bandwidth, kde_density

    d = obs["data"]
    lo = float(d.min())
    gmax = max([float(v.max()) for v in obs.values() if v.numel()] + [float(d.max())])
    hi = max(1.5 * float(d.max()), min(gmax, 3.0 * float(d.max())))  # tail, outliers cut
    xs = np.linspace(lo, hi, 600)
    bw = _bandwidth(d.numpy(), "silverman")  # one bandwidth for all curves, as in LOADER
    fig, ax = plt.subplots(figsize=(6, 4))
    for (k, v), c in zip(obs.items(), ("C0", "C1", "C2")):
        if v.numel() < 2:
            continue
        ax.plot(xs, kde_density(v, xs, bw), label=k, color=c)
    if window is not None:
        ax.axvspan(*window, color="0.92", zorder=0, label="LOADER window")
    ax.set_yscale("log")
    peak = float(kde_density(obs["data"], xs, bw).max())
    ax.set_ylim(peak * 1e-5, peak * 3)
    ax.set_xlabel("observable (physical units)")
    ax.set_ylabel("density (KDE, log scale)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(a) -> dict:
    import torch

    from .metrics.observables import get_observable
    from .metrics.tails import matched_score, same_law_floor

    if a.threads:
        torch.set_num_threads(a.threads)
    obs_fn = get_observable(a.observable)
    _check_out(a)
    clis = {name: build_one(a, cfg, name) for name, cfg in (("sbm", a.sbm_config), ("lim", a.lim_config))}
    _check_reference(a, clis["sbm"].datamodule)
    os.makedirs(a.out, exist_ok=True)
    seeds = torch.arange(a.num_samples)
    res: dict = {"eta": a.eta, "observable": a.observable, "args": vars(a)}
    gen_obs, timings = {}, {}
    ref = None
    for name in ("sbm", "lim"):
        model, dm, t_fit = train_one(clis[name])
        inv = getattr(dm, "inverse_transform", lambda x: x.double())
        if ref is None:
            ref = obs_fn(inv(dm.train_data)).cpu()
            res["n_ref"] = int(ref.numel())
        t0 = time.time()
        x = _generate(model, seeds, a)
        o = obs_fn(inv(x)).cpu()
        timings[name] = {"fit_s": round(t_fit, 1), "sample_s": round(time.time() - t0, 1)}
        gen_obs[name] = o[torch.isfinite(o)]
        res[name] = {"nonfinite": float((~torch.isfinite(o)).double().mean())}
        if name == "lim":
            res["alpha"] = float(model.alpha)
        print(f"[pite] {name}: trained {a.max_steps} steps in {t_fit:.0f} s, "
              f"sampled {a.num_samples} in {timings[name]['sample_s']:.0f} s", flush=True)
    window = None  # LOADER over the whole real line (see matched_kwargs)
    # model and floor on identical terms (see ``matched_kwargs``)
    kws = matched_kwargs(ref, a.num_samples, a.eta, a.floor, window)
    for name in ("sbm", "lim"):
        for key in ("rmsqe", "loader"):
            try:
                res[name][key] = float(matched_score(gen_obs[name], ref, key, NUM_SPLITS, 0,
                                                     a.num_samples, **kws[key]))
            except ValueError as e:  # e.g. every sample non-finite
                print(f"[pite] {name}: {key} undefined ({e})", flush=True)
                res[name][key] = float("nan")
    res["floor"] = {k: float(same_law_floor(ref, k, NUM_SPLITS, 0, a.num_samples, **kws[k]))
                    for k in ("rmsqe", "loader")}
    res["floor_method"] = (f"same_law_floor: {NUM_SPLITS} splits, n_gen = {a.num_samples} vs the "
                           f"other {ref.numel() - a.num_samples} reference points; models scored "
                           f"against the same {NUM_SPLITS} reference subsets (matched_score)")
    res["window"] = window
    qs = torch.tensor([0.5, 0.9, 0.975, 0.99], dtype=torch.float64)
    res["quantiles"] = {k: (torch.quantile(v.double(), qs).tolist() + [float(v.max())]) if v.numel()
                        else [float("nan")] * 5
                        for k, v in (("data", ref), ("sbm", gen_obs["sbm"]), ("lim", gen_obs["lim"]))}
    res["timings"] = timings
    table = format_table(res)
    out = Path(a.out)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    torch.save({"data": ref, "sbm": gen_obs["sbm"], "lim": gen_obs["lim"]}, out / "observables.pt")
    _density_plot(out / "density.png", {"data": ref, "SBM": gen_obs["sbm"], "LIM": gen_obs["lim"]},
                  window, f"PITE: {a.observable} ({a.max_steps} steps per model)")
    print(table)
    print(f"[pite] wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'density.png'}")
    return res


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Validate the arguments and both configs (data, shapes, callbacks) before training anything;
    user errors are raised as ConfigError and printed by ``lightning_pfd.cli.main``."""
    from .errors import ConfigError

    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        _validate(a)
    except ConfigError:
        raise
    except ValueError as e:
        field, _, problem = str(e).partition(": ")
        raise ConfigError(field, problem or str(e)) from None
    run(a)
    return 0
