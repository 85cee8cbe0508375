"""``python -m lightning_pfd pite``: train SBM(s) and a LIM on the same data and U-Net, print the
blog's table (RMSQE, LOADER, same-law floor) for physical observables (PITE: the blog post "A
Physically Interpretable Evaluation Strategy" for heavy-tailed diffusion models).

Defaults (docs/levy.md, "PITE at CPU scale"): the configs ``experiments/pite_sbm`` (EDM
preconditioning) and ``experiments/pite_lim`` (alpha = 1.7, x0 parameterisation, Heun in
r = sigma/gamma on EDM's grid, 100 steps): 16x16 crops, a 78k-parameter U-Net, 1500 steps each.
``--sbm-preconds edm,vp`` adds an SBM row with VP preconditioning (its network error is
multiplied by sigma, up to 80, in the denoised image); any registered diffusion family
(:func:`lightning_pfd.diffusion.families.family_names`: edm, vp, ve, ...) can be a row. Each model generates ``--num-samples``
seeded samples; the observables (default: crop maximum and the fraction of pixels above
25 mm/h, after the inverse log1p transform) are compared with those of the training crops. The
fraction of generated pixels outside the training range [-1, 1] (= [0, log_max] mm/h) is
always counted and reported; ``--out-of-range clip`` caps them at log_max before the inverse
transform (default ``keep``: faithful). Writes ``results.json``, ``table.md``,
``observables.pt`` (the finite observables per row) and ``density.png`` (the blog's Fig. 9)
under ``--out``. Bad arguments and configs fail before anything is trained (one block, exit
status 2; ``--debug`` shows the traceback).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..errors import ConfigError, ShortErrorParser, renamed_fields
from . import COMMANDS, run_guarded

__all__ = ["main", "build_parser", "format_table", "tail_evaluations", "NUM_SPLITS",
           "parse_observable", "sbm_preconds"]

PROG = COMMANDS["pite"].prog
DEFAULT_OBSERVABLES = ("max", "exceedance:threshold=25")
_LIM_SAMPLERS = ("ode", "ddim", "heun", "sde")
_TIME_GRIDS = ("uniform", "edm")


def build_parser() -> argparse.ArgumentParser:
    p = ShortErrorParser(prog=PROG, description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sbm-config", default="experiments/pite_sbm",
                   help="SBM config (path or embedded name)")
    p.add_argument("--lim-config", default="experiments/pite_lim",
                   help="LIM config (path or embedded name)")
    p.add_argument("--sbm-preconds", default="edm",
                   help="comma-separated SBM rows, each a diffusion family (preconditioning): "
                        "edm, vp, ve or another registered one (e.g. edm,vp)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="training steps per model (default: the configs' trainer.max_steps)")
    p.add_argument("--crop-size", type=int, default=0,
                   help="crop side (overrides data crop_size and net img_resolution); 0 = config")
    p.add_argument("--model-channels", type=int, default=0, help="U-Net width; 0 = config")
    p.add_argument("--num-blocks", type=int, default=0, help="U-Net blocks per level; 0 = config")
    p.add_argument("--lr", type=float, default=0.0, help="learning rate of all models; 0 = config")
    p.add_argument("--ema-decay", type=float, default=-1.0,
                   help="EMA decay of all models; < 0 = config")
    p.add_argument("--n-train", type=int, default=0, help="training crops; 0 = config")
    p.add_argument("--batch-size", type=int, default=0, help="training batch; 0 = config")
    p.add_argument("--num-samples", type=int, default=1024, help="generated samples per model")
    p.add_argument("--lim-steps", type=int, default=None,
                   help="LIM sampler steps (default: the config's num_steps)")
    p.add_argument("--lim-sampler", default=None, choices=list(_LIM_SAMPLERS),
                   help="LIM sampler (default: the config's)")
    p.add_argument("--lim-time-grid", default=None, choices=list(_TIME_GRIDS),
                   help="LIM time grid (default: the config's)")
    p.add_argument("--observable", action="append", default=None,
                   help="observable, repeatable: a registered name, with keyword arguments as "
                        "name:key=value[:key=value] (default: max and exceedance:threshold=25)")
    p.add_argument("--out-of-range", default="keep", choices=["keep", "clip"],
                   help="generated values above the training range (+1 = log_max mm/h): keep "
                        "(faithful extrapolation) or clip to log_max; always counted")
    p.add_argument("--eta", type=float, default=0.975, help="RMSQE tail level")
    p.add_argument("--floor", type=float, default=1e-3, help="LOADER density floor (x peak)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0 = leave as is: the choice of `python -m lightning_pfd "
                        "--threads N|auto`, printed as the first line)")
    p.add_argument("--out", default="runs/pite", help="output directory")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument("--override", action="append", default=[],
                   help="extra LightningCLI override applied to all models, e.g. "
                        "--override=--model.init_args.lr=1e-3")
    p.add_argument("--sbm-override", action="append", default=[],
                   help="extra LightningCLI override for the SBM rows only")
    p.add_argument("--lim-override", action="append", default=[],
                   help="extra LightningCLI override for the LIM row only, e.g. "
                        "--lim-override=--model.init_args.parameterization=eps")
    return p


def parse_observable(spec: str):
    """``"name"`` or ``"name:key=value[:key=value]"`` -> (label, name, kwargs); numbers are parsed
    as floats. Unknown names and malformed specs raise ConfigError naming ``--observable``."""
    from ..metrics.observables import OBSERVABLES, get_observable

    name, *pairs = str(spec).split(":")
    if name not in OBSERVABLES:
        raise ConfigError("--observable", "not a registered observable", value=name,
                          accepted=sorted(OBSERVABLES))
    kw = {}
    for pair in pairs:
        k, eq, v = pair.partition("=")
        if not eq or not k:
            raise ConfigError("--observable", "keyword arguments are written name:key=value",
                              value=spec)
        try:
            kw[k] = float(v)
        except ValueError:
            kw[k] = v
    with renamed_fields(lambda f: "--observable"):
        get_observable(name, **kw)  # keyword arguments the observable does not take
    return str(spec), name, kw


def sbm_preconds() -> tuple:
    """The preconditionings an SBM row can have: every registered diffusion family (a row is
    the SBM config with ``--model.init_args.precond=<family>``)."""
    from ..diffusion.families import family_names

    return tuple(family_names())


def _preconds(a) -> list:
    accepted = list(sbm_preconds())
    out = [q.strip() for q in str(a.sbm_preconds).split(",") if q.strip()]
    if not out:
        raise ConfigError("--sbm-preconds", "needs at least one preconditioning",
                          value=a.sbm_preconds, accepted=accepted)
    for q in out:
        if q not in accepted:
            raise ConfigError("--sbm-preconds", "unknown preconditioning", value=q,
                              accepted=accepted)
    if len(set(out)) != len(out):
        raise ConfigError("--sbm-preconds", "lists a preconditioning twice", value=a.sbm_preconds)
    return out


def _check_config_arg(flag: str, value: str) -> None:
    from .fit import resolve_config_path

    try:
        resolve_config_path(value)
    except ConfigError as e:
        raise ConfigError(flag, e.problem, value=value, accepted=e.accepted) from None


def _validate(a) -> None:
    _check_config_arg("--sbm-config", a.sbm_config)
    _check_config_arg("--lim-config", a.lim_config)
    for name in ("num_samples", "max_steps", "lim_steps"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1, got {v}")
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
    _preconds(a)
    for spec in a.observable or DEFAULT_OBSERVABLES:
        parse_observable(spec)


def _cli_args(a, config: str, name: str, extra: Sequence[str] = ()) -> list[str]:
    from .fit import resolve_config_path

    args = ["--config", resolve_config_path(config), "--trainer.max_epochs=-1",
            "--trainer.logger=false",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu",
            f"--trainer.default_root_dir={os.path.join(a.out, name)}"]
    args += _overrides(a, _SHARED_OVERRIDES)
    if a.ema_decay >= 0:
        args.append(f"--model.init_args.ema_decay={a.ema_decay}")
    return args + list(a.override) + list(extra)


# command-line argument -> the config keys it overrides (0 / None / empty = keep the config's)
_SHARED_OVERRIDES = (
    ("max_steps", ("trainer.max_steps",)),
    ("crop_size", ("data.init_args.crop_size", "model.init_args.net.init_args.img_resolution")),
    ("model_channels", ("model.init_args.net.init_args.model_channels",)),
    ("num_blocks", ("model.init_args.net.init_args.num_blocks",)),
    ("lr", ("model.init_args.lr",)),
    ("n_train", ("data.init_args.n_train",)),
    ("batch_size", ("data.init_args.batch_size",)),
)
_LIM_OVERRIDES = (
    ("lim_steps", ("model.init_args.num_steps",)),
    ("lim_sampler", ("model.init_args.sampler",)),
    ("lim_time_grid", ("model.init_args.time_grid",)),
)


def _overrides(a, table) -> list:
    """``--key=value`` for every argument of ``table`` that was set."""
    return [f"--{key}={getattr(a, name)}" for name, keys in table if getattr(a, name) for key in keys]


def _rows(a) -> list:
    """(row name, config, extra overrides) of every model: one SBM per preconditioning, the LIM."""
    rows = [(f"sbm_{q}", a.sbm_config, [f"--model.init_args.precond={q}", *a.sbm_override])
            for q in _preconds(a)]
    lim = list(a.lim_override) + _overrides(a, _LIM_OVERRIDES)
    return rows + [("lim", a.lim_config, lim)]


def build_one(a, config: str, name: str, extra: Sequence[str] = ()):
    """Instantiate (model, datamodule, trainer) from the config + overrides and run the
    framework's validation phase (shapes, data, callbacks); nothing is trained or written yet.
    The config's checkpoints are redirected to ``--out/<name>/checkpoints``; its measurement
    callbacks (e.g. the configs' TailMonitor) are dropped: pite measures once, at the end."""
    from unittest import mock

    from ..callbacks.base import MeasurementCallback
    from .fit import PFDLightningCLI

    with mock.patch.object(sys, "argv", [sys.argv[0]]):  # silence LightningCLI's mixed-args warning
        cli = PFDLightningCLI(args=_cli_args(a, config, name, extra), run=False,
                              save_config_kwargs={"overwrite": True})
    for cb in cli.trainer.checkpoint_callbacks:
        cb.dirpath = os.path.join(a.out, name, "checkpoints")
    cli.trainer.callbacks = [cb for cb in cli.trainer.callbacks
                          if not isinstance(cb, MeasurementCallback)]
    cli.validate_run()
    return cli


def train_one(cli):
    """Fit a validated CLI's model; returns (model, datamodule, seconds)."""
    t0 = time.time()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model, cli.datamodule, time.time() - t0


def _inverse(dm, policy: str):
    """``dm.inverse_transform`` with the ``--out-of-range`` policy (None: the data are physical)."""
    inv = getattr(dm, "inverse_transform", None)
    if inv is None:
        return None

    def f(x):
        try:
            return inv(x, out_of_range=policy)
        except TypeError:  # a datamodule without the policy argument
            return inv(x)
    return f


NUM_SPLITS = 8  # reference splits for the same-law floor and the matched model scores


def tail_evaluations(a, dm, specs) -> dict:
    """One :class:`~lightning_pfd.evaluation.tail.TailEvaluation` per observable (label ->
    evaluation) against the training crops: seeds 0..num_samples-1, ``NUM_SPLITS`` reference
    splits, RMSQE over [eta, 1], LOADER over the real line with ``--floor`` x the reference
    KDE's peak; non-finite sample observables dropped (and counted). Checks
    ``--num-samples`` < the number of training crops (the same-law floor's n_gen)."""
    from ..evaluation.tail import TailEvaluation

    with renamed_fields({"num_samples": "--num-samples", "eta": "--eta", "floor": "--floor"}):
        evs = {label: TailEvaluation(dm.train_data, observable=name, observable_kwargs=kw,
                                     num_samples=a.num_samples, eta=a.eta, floor=a.floor,
                                     num_splits=NUM_SPLITS, seed_offset=0, batch_size=256,
                                     nonfinite="drop", inverse_transform=_inverse(dm, a.out_of_range))
               for label, name, kw in specs}
        for ev in evs.values():
            ev.check_sizes()
    return evs


def _check_out(a) -> None:
    done = [n for n in ("results.json", "table.md", "density.png") if (Path(a.out) / n).exists()]
    if done and not a.force:
        raise ConfigError("--out", f"holds the results of an earlier run ({', '.join(done)})",
                          value=a.out, suggestion="choose another --out, or pass --force to replace them")


def _label(res: dict, row: str) -> str:
    """``SBM (EDM)``, ``SBM (VP)``, ... for the SBM rows ``sbm_<family>``; ``LIM (alpha = a)``."""
    if row == "lim":
        return f"LIM (alpha = {res.get('alpha', float('nan')):g})"
    return f"SBM ({row[4:].upper()})" if row.startswith("sbm_") else row


def format_table(res: dict) -> str:
    """Markdown: per observable, RMSQE and LOADER of every row next to the same-law floor, the
    quantiles (q50 / q90 / q97.5 / q99 / max) and the out-of-range fractions."""
    rows = res["rows"]
    head = "| Metric | " + " | ".join(_label(res, r) for r in rows) + " | same-law floor |"
    sep = "|---" * (len(rows) + 2) + "|"
    out = []
    for obs in res["observables"]:
        m = res["metrics"][obs]
        out += [f"**Observable `{obs}`**", "", head, sep]
        for key, name in (("rmsqe", f"RMSQE (eta = {res['eta']})"), ("loader", "LOADER")):
            out.append(f"| {name} | " + " | ".join(f"{m[r][key]:.4g}" for r in rows)
                       + f" | {m['floor'][key]:.4g} |")
        q = res["quantiles"][obs]
        out.append("| q50 / q90 / q99 | " + " | ".join(
            " / ".join(f"{q[r][i]:.3g}" for i in (0, 1, 3)) for r in rows)
            + " | data: " + " / ".join(f"{q['data'][i]:.3g}" for i in (0, 1, 3)) + " |")
        out.append("")
        out.append("Quantiles q50 / q90 / q97.5 / q99 / max:")
        for k in ["data"] + list(rows):
            bad = "" if k == "data" else \
                f" (non-finite: {100 * res['models'][k]['nonfinite'][obs]:.1f} %)"
            out.append(f"- {k}: " + " / ".join(f"{x:.4g}" for x in q[k]) + bad)
        out.append("")
    out += [f"**Out of the training range** (generated values outside it, in training space; "
            f"precipitation: [-1, 1] = [0, log_max] mm/h; policy `{res['out_of_range']}`):", "",
            "| | " + " | ".join(_label(res, r) for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    oors = [res["models"][r]["out_of_range"] for r in rows]
    for key, name in (("pixels_above", "pixels > +1"), ("samples_above", "samples with a pixel > +1"),
                      ("pixels_below", "pixels < -1 (-> 0 mm/h)")):
        out.append(f"| {name} | " + " | ".join(_pct(o, key) for o in oors) + " |")
    out.append("| largest value (training space) | " + " | ".join(
        "n/a" if o is None else f"{o['max']:.3g}" for o in oors) + " |")
    return "\n".join(out)


def _density_plot(path: Path, evs: dict, curves: dict, title: str) -> None:
    """One panel per observable: log-density KDEs of the data and of every row (LOADER's
    bandwidth, from each observable's evaluation)."""
    import matplotlib.pyplot as plt

    from ..evaluation.tail import density_figure

    fig = density_figure({o: evs[o].density_data(curves[o]) for o in evs}, title)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _out_of_range(dm, x) -> Optional[dict]:
    """Out-of-range counts of generated samples (training space): the datamodule's
    ``out_of_range_stats`` (precipitation: [-1, 1] = [0, log_max] mm/h), else its declared
    ``value_range``, else None (no training range to compare with)."""
    from ..data.precip import out_of_range_fraction

    stats = getattr(dm, "out_of_range_stats", None)
    if callable(stats):
        return stats(x)
    vr = getattr(dm, "value_range", None)
    return out_of_range_fraction(x, float(vr[0]), float(vr[1])) if vr is not None else None


def _pct(oor: Optional[dict], key: str) -> str:
    return "n/a" if oor is None else f"{100 * oor[key]:.3g} %"


def run(a) -> dict:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    t_start = time.time()
    specs = [parse_observable(s) for s in (a.observable or DEFAULT_OBSERVABLES)]
    _check_out(a)
    rows = _rows(a)
    clis = {name: build_one(a, cfg, name, extra) for name, cfg, extra in rows}
    evs = tail_evaluations(a, clis[rows[0][0]].datamodule, specs)
    os.makedirs(a.out, exist_ok=True)
    sampler = next(iter(evs.values()))  # every evaluation draws the same seeds
    res: dict = {"eta": a.eta, "observables": list(evs), "rows": [r[0] for r in rows],
                 "out_of_range": a.out_of_range, "args": vars(a), "models": {},
                 "n_ref": sampler.n_ref, "metrics": {o: {} for o in evs}}
    gen_obs = {o: {} for o in evs}
    for name, _, _ in rows:
        model, dm, t_fit = train_one(clis[name])
        t0 = time.time()
        model.eval()
        x = sampler.sample(model)
        t_sample = time.time() - t0
        hp = model.hparams
        info = {"fit_s": round(t_fit, 1), "sample_s": round(t_sample, 1),
                "out_of_range": _out_of_range(dm, x.cpu()), "nonfinite": {}}
        if hasattr(model, "alpha"):  # LevyItoModule
            res["alpha"] = float(model.alpha)
            info["sampler"] = (f"{hp.sampler}, {hp.num_steps} steps, time grid "
                               f"{hp.get('time_grid', 'uniform')}, parameterization "
                               f"{hp.get('parameterization', 'eps')}")
        else:
            info["sampler"] = f"{hp.sampler}, {hp.num_steps} steps, precond {hp.precond}"
        for o, ev in evs.items():
            v = ev.observe(x, inverse_transform=_inverse(dm, a.out_of_range)).cpu()
            vals = ev.scores(v)
            gen_obs[o][name] = v[torch.isfinite(v)]
            info["nonfinite"][o] = vals["nonfinite"]
            res["metrics"][o][name] = {k: vals[k] for k in ("rmsqe", "loader")}
            if vals["nonfinite"] == 1.0:
                print(f"[pite] {name} / {o}: rmsqe and loader undefined (every sample non-finite)",
                      flush=True)
        res["models"][name] = info
        print(f"[pite] {name}: trained {model.global_step} steps in {t_fit:.0f} s, sampled "
              f"{a.num_samples} in {t_sample:.0f} s ({info['sampler']}); pixels above the "
              f"training range: {_pct(info['out_of_range'], 'pixels_above')}", flush=True)
    res["quantiles"] = {}
    qs = torch.tensor([0.5, 0.9, 0.975, 0.99], dtype=torch.float64)
    for o, ev in evs.items():
        fl = ev.floors()
        res["metrics"][o]["floor"] = {k: fl[f"{k}_floor"] for k in ("rmsqe", "loader")}
        res["quantiles"][o] = {
            k: (torch.quantile(v.double(), qs).tolist() + [float(v.max())]) if v.numel()
            else [float("nan")] * 5
            for k, v in [("data", ev.reference_observable)] + [(r, gen_obs[o][r]) for r in res["rows"]]}
    res["floor_method"] = (f"same_law_floor: {NUM_SPLITS} splits, n_gen = {a.num_samples} vs the "
                           f"other {res['n_ref'] - a.num_samples} reference points; models scored "
                           f"against the same {NUM_SPLITS} reference subsets (matched_score); "
                           f"RMSQE = the blog's integral over [eta, 1], LOADER over the real line")
    res["window"] = None
    res["wall_s"] = round(time.time() - t_start, 1)
    table = format_table(res)
    out = Path(a.out)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    torch.save({o: {"data": evs[o].reference_observable, **gen_obs[o]} for o in evs},
               out / "observables.pt")
    labels = {r: _label(res, r) for r in res["rows"]}
    _density_plot(out / "density.png", evs,
                  {o: {labels[k]: v for k, v in gen_obs[o].items()} for o in evs},
                  f"PITE (StageIV crops, {a.num_samples} samples per model)")
    print(table)
    print(f"[pite] wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'density.png'} "
          f"({res['wall_s']:.0f} s)")
    return res


def _pite(argv: list) -> int:
    a = build_parser().parse_args(argv)
    try:
        _validate(a)
    except ConfigError:
        raise
    except ValueError as e:
        field, _, problem = str(e).partition(": ")
        raise ConfigError(field, problem or str(e)) from None
    run(a)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lightning_pfd pite ...``: validate the arguments and both configs (data, shapes,
    callbacks) before training anything; returns the exit status (2: a user error, one block)."""
    return run_guarded(_pite, argv, PROG)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
