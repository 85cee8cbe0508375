"""``python -m lightning_pfd pite``: train SBM(s) and a LIM on the same data and U-Net, each with
several training seeds, and print the blog's table (RMSQE, LOADER, same-law floor) for physical
observables, with its spread over the seeds and the diagnostics that show what decides a score
(PITE: the blog post "A Physically Interpretable Evaluation Strategy" for heavy-tailed diffusion
models).

Defaults (docs/levy.md, "PITE at CPU scale"): the configs ``experiments/pite_sbm`` (EDM
preconditioning) and ``experiments/pite_lim`` (alpha = ``--alpha`` = 1.7, x0 parameterisation,
Heun in r = sigma/gamma on EDM's grid, 100 steps, A = c_alpha A' >= 20 rejected on the standard
scale; ``--reference-row`` adds ``lim_ref``, the same with A on the LIM reference code's scale,
``a_scale=lim_reference``): 16x16 crops, a 78k-parameter U-Net, 1500 steps each, training seeds
``--seeds 0,1,2,3,4`` (initialisation, batch order and training noise). ``--sbm-families edm,vp``
adds an SBM row with VP preconditioning; any registered diffusion family
(:func:`lightning_pfd.diffusion.families.family_names`: edm, vp, ve, ...) can be a row. Every
(row, seed) generates ``--num-samples`` samples from the same evaluation seeds 0..n-1; the
observables (default: crop maximum and the fraction of pixels above 25 mm/h, after the inverse
log1p transform) are compared with those of the training crops.

Per (row, seed) and observable: the blog's RMSQE (no root) and LOADER against matched same-law
floors, the scores of the samples clipped to the training range [-1, 1] (what the reference
codes do when saving), the fraction of samples outside that range, the share of the RMSQE from
its largest single-sample contribution, and the bulk quantile error (the same integral over
[0, eta]). The table gives mean ± sd [min, max] over the seeds and, for each of the blog's
claims (LIM better in RMSQE / in LOADER, SBM better in the bulk), an exact test over the
seeds (:mod:`lightning_pfd.metrics.seed_tests`: Mann-Whitney for a LIM row against SBM, the
paired sign-flip test for lim_ref against lim) with its p-value, effect sizes and verdict
("holds" / "reversed" at p < 0.05 two-sided, else "undecided"). The data's tail index (Hill) is
recorded next to alpha. ``--out-of-range clip`` caps generated values at log_max before the
inverse transform for every score (default ``keep``: faithful; the clipped scores are reported
either way). Writes ``results.json``, ``table.md``, ``observables.pt`` (the finite observables
per row and seed) and ``density.png`` (the blog's Fig. 9, seeds pooled) under ``--out``. Bad
arguments and configs fail before anything is trained (one block, exit status 2; ``--debug``
shows the traceback).
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
from ..validation import NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveInt, StabilityIndex, ranged
from ..launch import run_guarded
from . import COMMANDS, typed

__all__ = ["main", "build_parser", "format_table", "tail_evaluations", "NUM_SPLITS",
           "parse_observable", "sbm_families", "summarize", "verdict", "claims", "bulk_qe",
           "bulk_qe_floor", "train_seeds", "RUN_METRICS", "CLAIMS", "observable_label", "density_figure"]

PROG = COMMANDS["pite"].prog
DEFAULT_OBSERVABLES = ("max", "exceedance:threshold=25")
_LIM_SAMPLERS = ("ode", "ddim", "heun", "sde")
_TIME_GRIDS = ("uniform", "edm")


#: the option types: argparse refuses a value outside them naming the option (status 2)
_POSITIVE = typed(PositiveInt)
_COUNT = typed(NonNegativeInt)
_EMA_DECAY = typed(ranged("AtMostOne", float, ("<=", 1), "a number <= 1"))
#: the stability index of a Levy-Ito model (:mod:`lightning_pfd.diffusion.levy`)
_ALPHA = typed(StabilityIndex)


def build_parser() -> argparse.ArgumentParser:
    p = ShortErrorParser(prog=PROG, description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sbm-config", default="experiments/pite_sbm",
                   help="SBM config (path or embedded name)")
    p.add_argument("--lim-config", default="experiments/pite_lim",
                   help="LIM config (path or embedded name)")
    p.add_argument("--sbm-families", default="edm",
                   help="comma-separated SBM rows, each a diffusion family: "
                        "edm, vp, ve or another registered one (e.g. edm,vp)")
    p.add_argument("--max-steps", type=_POSITIVE, default=None,
                   help="training steps per model, an integer > 0 (default: the configs' "
                        "trainer.max_steps)")
    p.add_argument("--crop-size", type=_COUNT, default=0,
                   help="crop side (overrides data crop_size and net img_resolution); 0 = config")
    p.add_argument("--model-channels", type=_COUNT, default=0, help="U-Net width; 0 = config")
    p.add_argument("--num-blocks", type=_COUNT, default=0, help="U-Net blocks per level; 0 = config")
    p.add_argument("--lr", type=typed(NonNegativeFloat), default=0.0,
                   help="learning rate of all models, a number >= 0; 0 = config")
    p.add_argument("--ema-decay", type=_EMA_DECAY, default=-1.0,
                   help="EMA decay of all models, a number <= 1; < 0 = config")
    p.add_argument("--n-train", type=_COUNT, default=0, help="training crops; 0 = config")
    p.add_argument("--batch-size", type=_COUNT, default=0, help="training batch; 0 = config")
    p.add_argument("--num-samples", type=_POSITIVE, default=512,
                   help="generated samples per model and training seed, an integer > 0 and < "
                        "--n-train (evaluation seeds 0..num_samples-1, the same for every model)")
    p.add_argument("--seeds", default="0,1,2,3,4",
                   help="comma-separated training seeds: every row is trained once per seed "
                        "(network initialisation, batch order, training noise); the table "
                        "reports mean ± sd [min, max] over them")
    p.add_argument("--scale-aware-row", action="store_true",
                   help="add the row lim_x0A: the LIM config with parameterization x0_A (EDM's "
                        "preconditioning at the per-image level r sqrt(A), docs/levy.md)")
    p.add_argument("--reference-row", action="store_true",
                   help="add the row lim_ref: the LIM config with a_scale=lim_reference (A scaled "
                        "by kappa(alpha) and reject_A applied to that A, the noise law of the LIM "
                        "reference code; docs/levy.md)")
    p.add_argument("--rows", default="",
                   help="comma-separated subset of the rows to train (names as in the table: "
                        "sbm_<family>, lim, lim_ref, lim_x0A; default: all), e.g. one process "
                        "per (row, seed) whose records --merge combines")
    p.add_argument("--alpha", type=_ALPHA, default=1.7,
                   help="stability index of the LIM row, in (1, 2] (the blog: 1.7); the data's "
                        "Hill tail index is recorded next to it")
    p.add_argument("--lim-steps", type=_POSITIVE, default=None,
                   help="LIM sampler steps, an integer > 0 (default: the config's num_steps)")
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
    p.add_argument("--eta", type=typed(OpenUnitInterval), default=0.975,
                   help="RMSQE tail level, a number in (0, 1)")
    p.add_argument("--floor", type=float, default=1e-3, help="LOADER density floor (x peak)")
    p.add_argument("--threads", type=_COUNT, default=0,
                   help="torch threads (0 = leave as is: the choice of `python -m lightning_pfd "
                        "--threads N|auto`, printed as the first line)")
    p.add_argument("--out", default="runs/pite", help="output directory")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument("--merge", default="",
                   help="train nothing: merge the runs in these comma-separated directories (the "
                        "same settings, different --seeds; an interrupted run contributes what it "
                        "finished) into one record in --out")
    p.add_argument("--rescore", action="store_true",
                   help="train nothing: recompute the claims' tests, the data's tail indices and "
                        "the table of the earlier run in --out from its results.json (its saved "
                        "arguments rebuild the data), and rewrite results.json and table.md")
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
    with renamed_fields({"observable": "--observable", "observable_kwargs": "--observable"}):
        get_observable(name, **kw)  # keyword arguments the observable does not take
    return str(spec), name, kw


def sbm_families() -> tuple:
    """The diffusion families an SBM row can have: every registered diffusion family (a row is
    the SBM config with ``--model.init_args.family=<family>``)."""
    from ..diffusion.families import family_names

    return tuple(family_names())


def _families(a) -> list:
    accepted = list(sbm_families())
    out = [q.strip() for q in str(a.sbm_families).split(",") if q.strip()]
    if not out:
        raise ConfigError("--sbm-families", "needs at least one diffusion family",
                          value=a.sbm_families, accepted=accepted)
    for q in out:
        if q not in accepted:
            raise ConfigError("--sbm-families", "unknown diffusion family", value=q,
                              accepted=accepted)
    if len(set(out)) != len(out):
        raise ConfigError("--sbm-families", "lists a diffusion family twice", value=a.sbm_families)
    return out


def _check_config_arg(flag: str, value: str) -> None:
    from ..launch.cli import resolve_config_path

    try:
        resolve_config_path(value)
    except ConfigError as e:
        raise ConfigError(flag, e.problem, value=value, accepted=e.accepted) from None


def _validate(a) -> None:
    _check_config_arg("--sbm-config", a.sbm_config)
    _check_config_arg("--lim-config", a.lim_config)
    if a.n_train and a.num_samples >= a.n_train:
        raise ConfigError("--num-samples", f"must be < --n-train ({a.n_train}) for the same-law "
                          "floor (n_gen = num_samples)", value=a.num_samples)
    _families(a)
    _rows(a)
    train_seeds(a)
    for spec in a.observable or DEFAULT_OBSERVABLES:
        parse_observable(spec)


def train_seeds(a) -> list:
    """The ``--seeds`` list (distinct integers >= 0, at least one)."""
    try:
        out = [int(x) for x in str(a.seeds).split(",") if x.strip()]
    except ValueError:
        raise ConfigError("--seeds", "must be comma-separated integers >= 0", value=a.seeds) from None
    if not out or any(x < 0 for x in out) or len(set(out)) != len(out):
        raise ConfigError("--seeds", "needs distinct integers >= 0", value=a.seeds)
    return out


def _seed_overrides(seed: int) -> list:
    """One training seed: the network's initialisation (seed_everything), the batch order (the
    datamodule's seed) and the training noise (the module's train_seed)."""
    return [f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
            f"--model.init_args.train_seed={seed}"]


def _cli_args(a, config: str, name: str, extra: Sequence[str] = ()) -> list[str]:
    from ..launch.cli import resolve_config_path

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
    rows = [(f"sbm_{q}", a.sbm_config, [f"--model.init_args.family={q}", *a.sbm_override])
            for q in _families(a)]
    lim = [f"--model.init_args.alpha={a.alpha}"] + list(a.lim_override) + _overrides(a, _LIM_OVERRIDES)
    rows.append(("lim", a.lim_config, lim))
    if getattr(a, "reference_row", False):
        rows.append(("lim_ref", a.lim_config, lim + ["--model.init_args.a_scale=lim_reference"]))
    if getattr(a, "scale_aware_row", False):
        rows.append(("lim_x0A", a.lim_config, lim + ["--model.init_args.parameterization=x0_A"]))
    want = [r.strip() for r in str(getattr(a, "rows", "") or "").split(",") if r.strip()]
    names = [r[0] for r in rows]
    for r in want:
        if r not in names:
            raise ConfigError("--rows", "not a row of this run (the row flags decide which exist)",
                              value=r, accepted=names)
    return [r for r in rows if r[0] in want] if want else rows


def build_one(a, config: str, name: str, extra: Sequence[str] = ()):
    """Instantiate (model, datamodule, trainer) from the config + overrides and run the
    framework's validation phase (shapes, data, callbacks); nothing is trained or written yet.
    The config's checkpoints are redirected to ``--out/<name>/checkpoints``; its measurement
    callbacks (e.g. the configs' TailMonitor) are dropped: pite measures once, at the end."""
    from unittest import mock

    from ..callbacks.base import MeasurementCallback
    from ..launch.cli import PFDLightningCLI

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


#: the LIM rows: the config's LIM, the reference's scale of A (--reference-row), x0_A
LIM_ROWS = ("lim", "lim_ref", "lim_x0A")

NUM_SPLITS = 8  # reference splits for the same-law floor and the matched model scores


def tail_evaluations(a, dm, specs) -> dict:
    """One :class:`~lightning_pfd.evaluation.tail.TailEvaluation` per observable (label ->
    evaluation) against the training crops: seeds 0..num_samples-1, ``NUM_SPLITS`` reference
    splits, RMSQE over [eta, 1], LOADER over the real line with ``--floor`` x the reference
    KDE's peak; non-finite sample observables dropped (and counted); the clipped scores and the
    above/below-range fractions use the datamodule's declared ``value_range`` (precipitation:
    [-1, 1], what the reference codes clamp to when saving), else the data's range. Checks
    ``--num-samples`` < the number of training crops (the same-law floor's n_gen)."""
    from ..evaluation.tail import TailEvaluation

    with renamed_fields({"num_samples": "--num-samples", "eta": "--eta", "floor": "--floor"}):
        evs = {label: TailEvaluation(dm.train_data, observable=name, observable_kwargs=kw,
                                     num_samples=a.num_samples, eta=a.eta, floor=a.floor,
                                     num_splits=NUM_SPLITS, seed_offset=0, batch_size=256,
                                     nonfinite="drop", inverse_transform=_inverse(dm, a.out_of_range),
                                     value_range=getattr(dm, "value_range", None))
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
    """``SBM (EDM)``, ``SBM (VP)``, ... for the SBM rows ``sbm_<family>``; ``LIM (alpha = a)``
    (with its truncation of A when recorded)."""
    if row in LIM_ROWS:
        t = res.get("lim_truncation") or ""
        extra = {"lim_x0A": ", scale-aware x0_A",
                 "lim_ref": ", A scaled as the LIM reference code"}.get(row, "")
        return f"LIM (alpha = {res.get('alpha', float('nan')):g}{', ' + t if t else ''}{extra})"
    return f"SBM ({row[4:].upper()})" if row.startswith("sbm_") else row


def _truncation_label(tr: dict) -> str:
    if tr.get("reject_A") is not None:
        return f"A >= {tr['reject_A']:g} rejected"
    if tr.get("clamp_A") is not None:
        return f"A clamped at {tr['clamp_A']:g}"
    return "A not truncated"


#: per (row, seed, observable): the blog's scores, the diagnostics and the bulk quantile error
RUN_METRICS = ("rmsqe", "loader", "rmsqe_clipped", "loader_clipped", "rmsqe_top_share",
               "above_range", "bulk_qe", "below_range", "nonfinite")
_METRIC_NAMES = {
    "rmsqe": "RMSQE (blog, no root)", "loader": "LOADER",
    "rmsqe_clipped": "RMSQE, samples clipped to the data range",
    "loader_clipped": "LOADER, samples clipped to the data range",
    "bulk_qe": "bulk QE (int_0^eta of the squared quantile difference)",
    "rmsqe_top_share": "share of RMSQE from its largest single sample",
    "above_range": "samples with a value above the data range",
}


def summarize(values: Sequence[float]) -> dict:
    """mean, sd (ddof 1; 0 for one value), median, min, max and the values (non-finite kept)."""
    import numpy as np

    v = np.asarray(list(values), dtype=np.float64)
    f = v[np.isfinite(v)]
    if not f.size:
        nan = float("nan")
        return {"mean": nan, "sd": nan, "median": nan, "min": nan, "max": nan, "values": v.tolist()}
    return {"mean": float(f.mean()), "sd": float(f.std(ddof=1)) if f.size > 1 else 0.0,
            "median": float(np.median(f)), "min": float(f.min()), "max": float(f.max()),
            "values": v.tolist()}


def verdict(better: Sequence[float], worse: Sequence[float]) -> str:
    """Whether "``better`` < ``worse``" (lower is better) holds across training seeds:
    "holds" when every value of ``better`` is below every value of ``worse``, "reversed" when
    every one is above, "undecided" otherwise (the seed ranges overlap) or with a NaN."""
    import math

    b, w = list(better), list(worse)
    if not b or not w or any(not math.isfinite(x) for x in b + w):
        return "undecided"
    if max(b) < min(w):
        return "holds"
    if min(b) > max(w):
        return "reversed"
    return "undecided"


#: the blog's claims (the LIM row against the first SBM row): (key, text, metric, LIM better?)
CLAIMS = (("lim_rmsqe", "LIM better in RMSQE", "rmsqe", True),
          ("lim_rmsqe_clipped", "LIM better in RMSQE (samples clipped to the data range)",
           "rmsqe_clipped", True),
          ("lim_loader", "LIM better in LOADER", "loader", True),
          ("sbm_bulk", "SBM better in the bulk (bulk QE)", "bulk_qe", False))
#: the reference's scale of A against the standard one (lim_ref against lim, same seeds)
REFERENCE_CLAIMS = (("ref_rmsqe", "A scaled as the LIM reference: lower RMSQE than the standard scale", "rmsqe"),
                    ("ref_rmsqe_clipped", "A scaled as the LIM reference: lower clipped RMSQE than "
                     "the standard scale", "rmsqe_clipped"),
                    ("ref_loader", "A scaled as the LIM reference: lower LOADER than the standard scale", "loader"),
                    ("ref_bulk", "A scaled as the LIM reference: lower bulk QE than the standard scale", "bulk_qe"))
#: the design of each comparison: LIM rows against an SBM row are different models with
#: different noise processes (a shared seed value gives only the same batch order and
#: initialisation), so their runs are independent samples (Mann-Whitney); lim_ref against lim
#: is one module whose only difference is the scale of A (same seeds, initialisation, batch
#: order and noise streams): paired by seed (sign-flip test)
CLAIM_DESIGN = {"sbm": "unpaired", "reference": "paired"}


def _claim(text, better_row, worse_row, sm, m, design, level, **extra) -> dict:
    from ..metrics.seed_tests import compare

    bv, wv = sm[better_row][m]["values"], sm[worse_row][m]["values"]
    t = compare(bv, wv, design=design, level=level)
    return {"claim": text, **extra, "verdict": t["verdict"], "p": t["p"], "test": t["test"],
            "design": design, "level": level, "p_other": t["p_other"],
            "prob_better": t["prob_better"], "ratio": t["ratio"], "better_row": better_row,
            "worse_row": worse_row, "all_seeds": verdict(bv, wv)}


def claims(res: dict, level: Optional[float] = None) -> dict:
    """observable -> claim key -> the claim, its test and verdict, for every LIM row ("lim",
    "lim_ref", "lim_x0A") against the first SBM row (keys of the other rows end in ``@<row>``)
    and, when both rows are there, lim_ref against lim (keys ``ref_*``).

    Each claim: {"claim", "verdict", "p", "test", "design", "level", "p_other" (the other
    design's test), "prob_better" (probability that a run of the claimed-better row scores
    lower), "ratio" (Hodges–Lehmann ratio better/worse), "all_seeds" (:func:`verdict`, the
    former every-seed rule), "p_holm" (Holm over every claim of the record), "lim_row",
    "sbm_row", "lim", "sbm" (the summaries)}. The verdict follows the design's exact test at
    ``level`` (default :data:`lightning_pfd.metrics.seed_tests.LEVEL` = 0.05, two-sided;
    :func:`lightning_pfd.metrics.seed_tests.compare`)."""
    from ..metrics.seed_tests import LEVEL, holm

    level = LEVEL if level is None else float(level)
    rows = res["rows"]
    lims = [r for r in rows if r in LIM_ROWS]
    if not lims or not any(r.startswith("sbm_") for r in rows):
        return {}
    sbm = next(r for r in rows if r.startswith("sbm_"))
    out = {}
    for o in res["observables"]:
        sm = res["summary"][o]
        out[o] = {}
        for lim in lims:
            for key, text, m, lim_better in CLAIMS:
                b, w = (lim, sbm) if lim_better else (sbm, lim)
                out[o][key if lim == "lim" else f"{key}@{lim}"] = _claim(
                    text, b, w, sm, m, CLAIM_DESIGN["sbm"], level, sbm_row=sbm, lim_row=lim,
                    lim=sm[lim][m], sbm=sm[sbm][m])
        if "lim" in lims and "lim_ref" in lims:
            for key, text, m in REFERENCE_CLAIMS:
                out[o][key] = _claim(text, "lim_ref", "lim", sm, m, CLAIM_DESIGN["reference"], level,
                                     sbm_row="lim", lim_row="lim_ref", lim=sm["lim_ref"][m],
                                     sbm=sm["lim"][m])
    flat = [c for o in out.values() for c in o.values()]
    for c, p in zip(flat, holm([c["p"] for c in flat])):
        c["p_holm"] = p
    return out


def _ms(d: dict, pct: bool = False) -> str:
    """``mean ± sd [min, max]`` (3 significant digits; percentages with pct)."""
    f = (lambda x: f"{100 * x:.3g} %") if pct else (lambda x: f"{x:.3g}")
    if len(d["values"]) == 1:
        return f(d["values"][0])
    return f"{f(d['mean'])} ± {f(d['sd'])} [{f(d['min'])}, {f(d['max'])}]"


def _claims_heading(cl: dict) -> str:
    c0 = next(iter(cl.values()))
    if "p" not in c0:  # a record from before the tests (v3): the every-seed rule
        return ("The blog's claims across training seeds (holds = every seed of the better row "
                "below every seed of the other; undecided = the ranges overlap):")
    return (f"The claims across training seeds, each tested at the two-sided level "
            f"{c0['level']:g}: LIM rows against SBM with the exact Mann-Whitney test (independent "
            f"runs), the reference's scale of A against the standard one with the exact "
            f"sign-flip test of the per-seed log ratios (paired by seed); holds / reversed = "
            f"p < {c0['level']:g} in / against the claim's direction, else undecided. P(better) = "
            f"probability that a run of the claimed-better row scores lower; ratio = "
            f"Hodges-Lehmann ratio claimed-better / other; p_Holm over every claim of the run:")


def _claim_line(res: dict, c: dict) -> str:
    if "p" not in c:
        vals = (f"{_label(res, c['lim_row'])} {_ms(c['lim'])}, {_label(res, c['sbm_row'])} "
                f"{_ms(c['sbm'])}")
        return f"- {c['claim']}: **{c['verdict']}** ({vals})"
    vals = f"{c['lim_row']} {_ms(c['lim'])}, {c['sbm_row']} {_ms(c['sbm'])}"
    other = "sign-flip" if c["design"] == "unpaired" else "Mann-Whitney"
    return (f"- {c['claim']} [{c['lim_row']} vs {c['sbm_row']}]: "
            f"**{c['verdict']} (p = {c['p']:.2g})**, P(better) = {c['prob_better']:.2f}, "
            f"ratio = {c['ratio']:.3g}, p_Holm = {c.get('p_holm', float('nan')):.2g}, "
            f"{other} p = {c['p_other']:.2g}, every-seed rule: {c['all_seeds']} ({vals})")


def format_table(res: dict) -> str:
    """Markdown: per observable, mean ± sd [min, max] over the training seeds of every score
    and diagnostic of every row next to the same-law floor, the per-seed values, the claims'
    verdicts, the quantiles and the data's Hill tail index."""
    rows, seeds = res["rows"], res["train_seeds"]
    head = "| Metric | " + " | ".join(_label(res, r) for r in rows) + " | same-law floor |"
    sep = "|---" * (len(rows) + 2) + "|"
    out = [f"Training seeds {', '.join(map(str, seeds))} per row; evaluation seeds 0..."
           f"{res['num_samples'] - 1} (the same for every model); cells: mean ± sd [min, max] "
           f"over the training seeds. Out-of-range policy of the inverse transform: "
           f"`{res['out_of_range']}`.", ""]
    for obs in res["observables"]:
        sm, fl = res["summary"][obs], res["floor"][obs]
        out += [f"**Observable `{obs}`**", "", head, sep]
        for m in RUN_METRICS[:-2]:
            pct = m in ("rmsqe_top_share", "above_range")
            floor = f"{fl[m]:.4g}" if m in fl else ("" if m != "rmsqe_clipped" else f"{fl['rmsqe']:.4g}")
            if m == "loader_clipped":
                floor = f"{fl['loader']:.4g}"
            name = _METRIC_NAMES[m] + (f" (eta = {res['eta']})" if m == "rmsqe" else "")
            out.append(f"| {name} | " + " | ".join(_ms(sm[r][m], pct) for r in rows) + f" | {floor} |")
        out.append("")
        out.append("Per training seed (RMSQE / clipped RMSQE / LOADER / bulk QE / top share):")
        for r in rows:
            cells = []
            for i, sd in enumerate(seeds):
                v = [sm[r][m]["values"][i] for m in ("rmsqe", "rmsqe_clipped", "loader", "bulk_qe",
                                                      "rmsqe_top_share")]
                cells.append(f"seed {sd}: {v[0]:.4g} / {v[1]:.4g} / {v[2]:.4g} / {v[3]:.4g} / "
                             f"{100 * v[4]:.0f} %")
            out.append(f"- {_label(res, r)}: " + "; ".join(cells))
        out.append("")
        cl = res.get("claims", {}).get(obs)
        if cl:
            out.append(_claims_heading(cl))
            for c in cl.values():
                out.append(_claim_line(res, c))
            out.append("")
        q = res["quantiles"][obs]
        ps = res.get("pooled_seeds")
        if ps and any(list(v) != list(seeds) for v in ps.values()):
            out.append("Quantiles q50 / q90 / q97.5 / q99 / max (generated: pooled over the seeds "
                       "whose observables were saved: " + "; ".join(
                           f"{r} {', '.join(map(str, v))}" for r, v in ps.items()) + "):")
        else:
            out.append("Quantiles q50 / q90 / q97.5 / q99 / max (generated: all seeds pooled):")
        for k in ["data"] + list(rows):
            out.append(f"- {k}: " + " / ".join(f"{x:.4g}" for x in q[k]))
        h = res.get("hill", {}).get(obs)
        if h:
            out.append("")
            out.append(f"Tail index of the data's observable (Hill, n = {res['n_ref']}): " + "; ".join(
                f"k = {e['k']}: {e['alpha']:.3g} ± {e['se']:.2g}"
                + (f" ({e['distinct_top']} distinct among the top {e['k']})" if "distinct_top" in e else "")
                for e in h)
                + f" (alpha of the LIM noise: {res.get('alpha', float('nan')):g}; Hill assumes a "
                "Pareto-type upper tail: not meaningful for a bounded observable such as a fraction)")
        hi = res.get("hill_images", {}).get(obs)
        if hi:
            cells = [f"k = {e['k']} ({100 * e['k_fraction']:g} %): {e['alpha']:.3g} "
                     f"[{e['lo']:.3g}, {e['hi']:.3g}]" if "error" not in e else
                     f"k = {100 * e['k_fraction']:g} %: {e['error']}" for e in hi["estimates"]]
            lvl = next((e["level"] for e in hi["estimates"] if "level" in e), HILL_LEVEL)
            out.append("")
            out.append(f"Tail index without shared peaks (Hill on {hi['description']}, "
                       f"{100 * lvl:g} % percentile interval of {HILL_BOOT} resamples): "
                       + "; ".join(cells))
        out.append("")
    out += ["**Out of the training range** (generated pixels outside it, in training space; "
            "precipitation: [-1, 1] = [0, log_max] mm/h), mean over the training seeds:", "",
            "| | " + " | ".join(_label(res, r) for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for key, name in (("pixels_above", "pixels > +1"), ("samples_above", "samples with a pixel > +1"),
                      ("pixels_below", "pixels < -1 (-> 0 mm/h)")):
        cells = []
        for r in rows:
            oors = [res["runs"][r][str(sd)]["out_of_range"] for sd in seeds]
            cells.append("n/a" if any(o is None for o in oors) else
                         f"{100 * sum(o[key] for o in oors) / len(oors):.3g} %")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for r in rows:
        oors = [res["runs"][r][str(sd)]["out_of_range"] for sd in seeds]
        cells.append("n/a" if any(o is None for o in oors) else
                     " / ".join(f"{o['max']:.3g}" for o in oors))
    out.append("| largest value per seed (training space) | " + " | ".join(cells) + " |")
    return "\n".join(out)


def observable_label(spec: str, unit: Optional[str]) -> str:
    """Axis label of an observable given as ``--observable`` (``name[:key=value...]``): the
    quantity in words and its unit (``unit``: that of the fields after the inverse transform;
    None: data units)."""
    _, name, kw = parse_observable(spec)
    u = unit or "data units"
    if name == "max":
        return f"crop maximum ({u})"
    if name == "mean":
        return f"crop mean ({u})"
    if name == "exceedance":
        thr = kw.get("threshold", 10.0)
        thr = f"{thr:g}" if isinstance(thr, float) else str(thr)
        return f"fraction of pixels above {thr} {u} (dimensionless)"
    args = ", ".join(f"{k} = {v}" for k, v in kw.items())
    return f"observable {name}" + (f" ({args})" if args else "") + " (its own units)"


def _density_unit(label: str) -> str:
    """The density's unit: per unit of the observable (1 for a dimensionless fraction)."""
    if label.endswith("(dimensionless)"):
        return "density (KDE, per unit fraction)"
    unit = label[label.rindex("(") + 1:-1] if label.endswith(")") else "unit"
    return f"density (KDE, per {unit})"


def density_figure(evs: dict, curves: dict, title: str, unit: Optional[str] = None):
    """One panel per observable: log-density KDEs of the data and of every row (LOADER's
    bandwidth, from each observable's evaluation), each x axis the observable in words with its
    unit, the title wrapped to the figure's width."""
    from ..analysis.plots import fit_text, fit_titles
    from ..evaluation.tail import density_figure as panels

    labels = {o: observable_label(o, unit) for o in evs}
    fig = panels({labels[o]: evs[o].density_data(curves[o]) for o in evs}, title)
    for ax, o in zip(fig.axes, evs):
        ax.set_ylabel(_density_unit(labels[o]))
        fit_text(fig, ax.xaxis.label, ax.get_window_extent().width * 1.1)
    fig.set_layout_engine("constrained")
    fit_titles(fig, [fig.suptitle(title, fontsize=9)])
    return fig


def _density_plot(path: Path, evs: dict, curves: dict, title: str, unit: Optional[str] = None) -> None:
    import matplotlib.pyplot as plt

    fig = density_figure(evs, curves, title, unit)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _unit(dm) -> Optional[str]:
    """Unit of the observables: the datamodule's ``physical_unit`` when it maps samples back
    (``inverse_transform``), else None (data units)."""
    return getattr(dm, "physical_unit", None) if getattr(dm, "inverse_transform", None) else None


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


def bulk_qe(ev, obs) -> float:
    """The bulk counterpart of the blog's RMSQE: int_0^eta (Q_gen - Q_ref)^2 du, matched to the
    evaluation's reference splits (mean over the splits' rest) on the finite observables."""
    import math

    import torch

    from ..metrics.tails import quantile_step_integral, reference_splits

    s = ev.settings
    g = torch.as_tensor(obs, dtype=torch.float64).reshape(-1)
    g = g[torch.isfinite(g)]
    if not g.numel():
        return math.nan
    ref = ev.reference_observable
    sp = reference_splits(len(ref), s.num_samples, s.num_splits, s.split_seed)
    return sum(quantile_step_integral(g.numpy(), ref[b].numpy(), 0.0, s.eta) for _, b in sp) / len(sp)


def bulk_qe_floor(ev) -> float:
    """Same-law floor of :func:`bulk_qe` (reference subset vs the rest, the same splits)."""
    from ..metrics.tails import quantile_step_integral, reference_splits

    s = ev.settings
    ref = ev.reference_observable
    sp = reference_splits(len(ref), s.num_samples, s.num_splits, s.split_seed)
    return sum(quantile_step_integral(ref[a].numpy(), ref[b].numpy(), 0.0, s.eta)
               for a, b in sp) / len(sp)


def _hill(ref) -> list:
    """Hill tail index of the data's observable at k = 2 %, 5 %, 10 % of n (when >= 2 points),
    on the observables of the (overlapping, random) training crops, with the number of distinct
    values among the k largest (overlapping crops share peak pixels: their naive standard error
    overstates the precision; :func:`_hill_images` is the honest one)."""
    from ..metrics.tails import hill_tail_index

    n = int(ref.numel())
    ks = sorted({k for k in (n // 50, n // 20, n // 10) if 2 <= k <= n - 1})
    return [hill_tail_index(ref, k) for k in ks]


#: tail index on images: the fractions k/n and the bootstrap of :func:`_hill_images`
HILL_FRACTIONS, HILL_BOOT, HILL_LEVEL = (0.05, 0.1), 1000, 0.9


def _tile_observables(dm, name: str, kw: dict, ev):
    """(values, image index, description) of the observable on data without shared pixels:
    for the precipitation data, every non-overlapping crop_size x crop_size tile of every
    training frame in mm/h (one value per tile; tiles of one frame share its image index); for
    other data, the training samples' own observables (one image each)."""
    import torch

    from ..data.precip import PrecipitationDataModule, load_stageiv
    from ..metrics.observables import get_observable
    from ..metrics.tails import image_tiles

    if isinstance(dm, PrecipitationDataModule):
        frames = load_stageiv(dm.path)[list(dm.train_frames)]
        tiles, img = image_tiles(frames, dm.crop_size)
        v = get_observable(name, **kw)(tiles.to(torch.float64))
        return v, img, (f"{tiles.shape[0]} non-overlapping {dm.crop_size}x{dm.crop_size} tiles of "
                        f"the {frames.shape[0]} training frames, bootstrap over frames")
    ref = ev.reference_observable
    return ref, torch.arange(ref.numel()), f"{ref.numel()} training samples, bootstrap over samples"


def _hill_images(dm, name: str, kw: dict, ev) -> dict:
    """The data's tail index with an honest interval: Hill on one value per non-overlapping
    tile (:func:`_tile_observables`), k = 5 % and 10 % of the values, the 90 % percentile
    interval of 1000 seeded bootstrap resamples of the images (frames)."""
    from ..metrics.tails import hill_bootstrap

    v, img, desc = _tile_observables(dm, name, kw, ev)
    out = {"description": desc, "estimates": []}
    for f in HILL_FRACTIONS:
        try:
            out["estimates"].append(hill_bootstrap(v, img, f, HILL_BOOT, seed=0, level=HILL_LEVEL))
        except ValueError as e:  # e.g. too few values for this k (ConfigError is a ValueError)
            out["estimates"].append({"k_fraction": f, "error": str(e)})
        out["estimates"][-1]["k_fraction"] = f
    return out


def _tail_indices(res: dict, dm, specs, evs) -> None:
    """``res["hill"]`` (overlapping crops, k = 2/5/10 %) and ``res["hill_images"]`` (tiles,
    bootstrap over frames) for every observable."""
    res["hill"], res["hill_images"] = {}, {}
    for label, name, kw in specs:
        res["hill"][label] = _hill(evs[label].reference_observable)
        res["hill_images"][label] = _hill_images(dm, name, kw, evs[label])


def run(a) -> dict:
    import lightning.pytorch as pl
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    t_start = time.time()
    specs = [parse_observable(s) for s in (a.observable or DEFAULT_OBSERVABLES)]
    seeds = train_seeds(a)
    _check_out(a)
    rows = _rows(a)
    # every (row, seed) is built (and validated) before anything is trained
    clis = {(name, sd): build_one(a, cfg, f"{name}_seed{sd}", list(extra) + _seed_overrides(sd))
            for name, cfg, extra in rows for sd in seeds}
    evs = tail_evaluations(a, clis[(rows[0][0], seeds[0])].datamodule, specs)
    os.makedirs(a.out, exist_ok=True)
    sampler = next(iter(evs.values()))  # every evaluation draws the same seeds
    res: dict = {"eta": a.eta, "observables": list(evs), "rows": [r[0] for r in rows],
                 "train_seeds": seeds, "num_samples": a.num_samples,
                 "out_of_range": a.out_of_range, "args": vars(a), "runs": {},
                 "n_ref": sampler.n_ref}
    gen_obs = {o: {} for o in evs}
    for name, _, _ in rows:
        res["runs"][name] = {}
        for sd in seeds:
            pl.seed_everything(sd, workers=True, verbose=False)  # this run's training randomness
            model, dm, t_fit = train_one(clis[(name, sd)])
            t0 = time.time()
            model.eval()
            x = sampler.sample(model)
            t_sample = time.time() - t0
            hp = model.hparams
            info = {"fit_s": round(t_fit, 1), "sample_s": round(t_sample, 1), "steps": model.global_step,
                    "out_of_range": _out_of_range(dm, x.cpu()), "metrics": {}}
            if hasattr(model, "alpha"):  # LevyItoModule
                res["alpha"] = float(model.alpha)
                tr = model.truncation("train")
                res["lim_truncation"] = _truncation_label(tr)
                info["truncation"] = {"train": tr, "generate": model.truncation("generate"),
                                      "a_scale": getattr(model, "a_scale", "standard")}
                info["sampler"] = (f"{hp.sampler}, {hp.num_steps} steps, time grid "
                                   f"{hp.get('time_grid', 'uniform')}, parameterization "
                                   f"{hp.get('parameterization', 'eps')}")
            else:
                info["sampler"] = f"{hp.sampler}, {hp.num_steps} steps, family {hp.family}"
            for o, ev in evs.items():
                rws = ev.observe_rows(x, inverse_transform=_inverse(dm, a.out_of_range)).cpu()
                vals = ev.measure_rows(rws)
                vals["bulk_qe"] = bulk_qe(ev, rws[:, 0])
                v = rws[:, 0]
                gen_obs[o].setdefault(name, []).append(v[torch.isfinite(v)])
                info["metrics"][o] = {k: vals[k] for k in RUN_METRICS}
                if vals["nonfinite"] == 1.0:
                    print(f"[pite] {name} seed {sd} / {o}: rmsqe and loader undefined (every "
                          "sample non-finite)", flush=True)
            res["runs"][name][str(sd)] = info
            _save_partial(Path(a.out), res, gen_obs, seeds)
            m0 = info["metrics"][next(iter(evs))]
            print(f"[pite] {name} seed {sd}: trained {model.global_step} steps in {t_fit:.0f} s, "
                  f"sampled {a.num_samples} in {t_sample:.0f} s ({info['sampler']}); "
                  f"{next(iter(evs))}: RMSQE {m0['rmsqe']:.4g} (clipped {m0['rmsqe_clipped']:.4g}, "
                  f"top share {100 * m0['rmsqe_top_share']:.0f} %), LOADER {m0['loader']:.4g}; "
                  f"pixels above the training range: {_pct(info['out_of_range'], 'pixels_above')}",
                  flush=True)
            del clis[(name, sd)]
    return _finish(a, res, gen_obs, evs, specs, dm, seeds, t_start)


def _save_partial(out: Path, res: dict, gen_obs: dict, seeds) -> None:
    """After every (row, seed): ``partial.json`` (the finished runs) and
    ``partial_observables.pt``, so that an interrupted run keeps what it finished
    (``pite --merge`` reads them)."""
    import torch

    keep = {k: res[k] for k in ("eta", "observables", "rows", "train_seeds", "num_samples",
                                "out_of_range", "args", "runs", "n_ref") if k in res}
    (out / "partial.json").write_text(json.dumps(keep, indent=2, default=str))
    torch.save({o: {f"{r}/seed{sd}": v for r, vs in gen_obs[o].items() for sd, v in zip(seeds, vs)}
                for o in gen_obs}, out / "partial_observables.pt")


def _finish(a, res: dict, gen_obs: dict, evs: dict, specs, dm, seeds, t_start: float,
            pooled: Optional[dict] = None) -> dict:
    """Summaries, floors, quantiles, tail indices, claims and the files of a run (or a merge;
    ``pooled``: row -> the seeds whose observables ``gen_obs`` holds, default all)."""
    import torch

    pooled = pooled or {r: list(seeds) for r in res["rows"]}
    res["summary"] = {o: {r: {m: summarize(res["runs"][r][str(sd)]["metrics"][o][m] for sd in seeds)
                              for m in RUN_METRICS} for r in res["rows"]} for o in evs}
    res["floor"], res["quantiles"] = {}, {}
    qs = torch.tensor([0.5, 0.9, 0.975, 0.99], dtype=torch.float64)
    for o, ev in evs.items():
        fl = ev.floors()
        res["floor"][o] = {"rmsqe": fl["rmsqe_floor"], "loader": fl["loader_floor"],
                           "bulk_qe": bulk_qe_floor(ev)}
        cat = {r: torch.cat(gen_obs[o][r]) if gen_obs[o][r] else torch.zeros(0) for r in res["rows"]}
        res["quantiles"][o] = {
            k: (torch.quantile(v.double(), qs).tolist() + [float(v.max())]) if v.numel()
            else [float("nan")] * 5
            for k, v in [("data", ev.reference_observable)] + list(cat.items())}
    _tail_indices(res, dm, specs, evs)
    res["claims"] = claims(res)
    res["floor_method"] = (f"same_law_floor: {NUM_SPLITS} splits, n_gen = {a.num_samples} vs the "
                           f"other {res['n_ref'] - a.num_samples} reference points; models scored "
                           f"against the same {NUM_SPLITS} reference subsets (matched_score); "
                           f"RMSQE = the blog's integral over [eta, 1], LOADER over the real line, "
                           f"bulk QE = the same integral over [0, eta]")
    res["wall_s"] = round(time.time() - t_start, 1)
    table = format_table(res)
    out = Path(a.out)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    torch.save({o: {"data": evs[o].reference_observable,
                    **{f"{r}/seed{sd}": v for r, vs in gen_obs[o].items() for sd, v in zip(pooled[r], vs)}}
                for o in evs}, out / "observables.pt")
    labels = {r: _label(res, r) for r in res["rows"]}
    npool = sorted({len(v) for v in pooled.values()})
    pooled_txt = (f"{npool[0]} training seeds pooled" if len(npool) == 1 else
                  f"{npool[0]}-{npool[-1]} training seeds pooled per row")
    _density_plot(out / "density.png", evs,
                  {o: {labels[k]: torch.cat(v) for k, v in gen_obs[o].items() if v} for o in evs},
                  f"PITE (StageIV crops, {a.num_samples} samples per model and seed, "
                  f"{pooled_txt})", unit=_unit(dm))
    print(table)
    print(f"[pite] wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'density.png'} "
          f"({res['wall_s']:.0f} s)")
    return res


def rescore(a) -> dict:
    """``pite --rescore``: the claims (:func:`claims`), tail indices and table of the run in
    ``--out`` recomputed from its ``results.json`` with this version's tests; its per-seed scores
    are kept as they are. The data (for the tail indices) come from the run's saved arguments."""
    t0 = time.time()
    path = Path(a.out) / "results.json"
    if not path.exists():
        raise ConfigError("--out", "holds no results.json of an earlier pite run to rescore", value=a.out)
    res = json.loads(path.read_text())
    saved = argparse.Namespace(**{**vars(build_parser().parse_args([])), **res["args"], "out": a.out})
    specs = [parse_observable(s) for s in res["observables"]]
    name, cfg, extra = _rows(saved)[0]
    cli = build_one(saved, cfg, f"{name}_rescore", list(extra))
    evs = tail_evaluations(saved, cli.datamodule, specs)
    _tail_indices(res, cli.datamodule, specs, evs)
    res["claims"] = claims(res)
    res["rescored_s"] = round(time.time() - t0, 1)
    table = format_table(res)
    (Path(a.out) / "table.md").write_text(table + "\n")
    path.write_text(json.dumps(res, indent=2, default=str))
    print(table)
    print(f"[pite] rescored {path} ({res['rescored_s']:.0f} s)")
    return res


def _merge_file_error(path, problem: str) -> ConfigError:
    return ConfigError("--merge", f"{path}: {problem}", value=str(path))


def _load_part(d: Path):
    """(record, observables or None) of an earlier run: a directory with results.json +
    observables.pt, else what an interrupted run saved (partial.json +
    partial_observables.pt); or a results JSON file alone (its per-seed scores, no observables,
    e.g. a recorded ``experiments/results/pite_*.json``). The observables are read weights-only
    (:func:`~lightning_pfd.checkpoint.load_weights_only`): a file holding other objects is refused."""
    from ..checkpoint import load_weights_only

    if d.is_file():
        return json.loads(d.read_text()), None
    for rj, ob in (("results.json", "observables.pt"), ("partial.json", "partial_observables.pt")):
        if (d / rj).exists() and (d / ob).exists():
            return json.loads((d / rj).read_text()), load_weights_only(d / ob, d / ob, "cpu", _merge_file_error)
    raise ConfigError("--merge", "holds no results of a pite run (results.json or partial.json)",
                      value=str(d))


#: the arguments that must agree between merged runs (the experiment's settings)
MERGE_SETTINGS = ("sbm_config", "lim_config", "max_steps", "crop_size", "model_channels",
                  "num_blocks", "lr", "ema_decay", "n_train", "batch_size", "num_samples", "alpha",
                  "lim_steps", "lim_sampler", "lim_time_grid", "observable", "out_of_range", "eta",
                  "floor", "override", "sbm_override", "lim_override")
_ROW_ORDER = ("lim", "lim_ref", "lim_x0A")


def merge(a) -> dict:
    """``pite --merge PART,PART,... --out OUT``: one record from runs of the same settings
    (:data:`MERGE_SETTINGS` must agree) with different rows or training seeds, e.g. one
    process per (row, seed) (``--rows``, ``--seeds``). A part is a run directory (an
    interrupted run contributes the (row, seed) runs it finished) or a results JSON file (its
    per-seed scores only). A row enters the record when every merged seed has it. Summaries,
    floors, claims and tail indices as by a single run; the pooled quantiles and the density
    plot use the (row, seed) runs whose observables were saved (``res["pooled_seeds"]``)."""
    t0 = time.time()
    _check_out(a)
    names = [d.strip() for d in str(a.merge).split(",") if d.strip()]
    if not names:
        raise ConfigError("--merge", "needs at least one run directory or results file", value=a.merge)
    parts = [_load_part(Path(d)) for d in names]
    base = parts[0][0]
    for (rec, _), d in zip(parts[1:], names[1:]):
        for k in ("eta", "observables", "num_samples", "out_of_range", "n_ref"):
            if rec.get(k) != base.get(k):
                raise ConfigError("--merge", f"{d} differs from {names[0]} in {k}", value=a.merge)
        for k in MERGE_SETTINGS:
            if rec["args"].get(k) != base["args"].get(k):
                raise ConfigError("--merge", f"{d} differs from {names[0]} in the setting {k} "
                                  f"({rec['args'].get(k)!r} vs {base['args'].get(k)!r})", value=a.merge)
    runs, obs_all = {}, {o: {} for o in base["observables"]}
    for (rec, ob), d in zip(parts, names):
        for r, per in rec["runs"].items():
            for sd, info in per.items():
                if sd in runs.get(r, {}):
                    raise ConfigError("--merge", f"row {r} seed {sd} appears twice", value=a.merge)
                runs.setdefault(r, {})[sd] = {**info, "from": d}
        if ob is not None:
            for o in base["observables"]:
                obs_all[o].update({k: v for k, v in ob[o].items() if k != "data"})
    seeds = sorted({int(sd) for per in runs.values() for sd in per})
    order = [r for r in runs if r.startswith("sbm_")] + [r for r in _ROW_ORDER if r in runs]
    rows = [r for r in order if all(str(sd) in runs[r] for sd in seeds)]
    pooled = {r: [sd for sd in seeds if all(f"{r}/seed{sd}" in obs_all[o] for o in obs_all)]
              for r in rows}
    gen_obs = {o: {r: [obs_all[o][f"{r}/seed{sd}"] for sd in pooled[r]] for r in rows}
               for o in base["observables"]}
    saved = argparse.Namespace(**{**vars(build_parser().parse_args([])),
                                  **{k: base["args"].get(k) for k in MERGE_SETTINGS if k in base["args"]},
                                  "out": a.out, "seeds": ",".join(map(str, seeds)),
                                  "reference_row": "lim_ref" in rows, "scale_aware_row": "lim_x0A" in rows})
    specs = [parse_observable(x) for x in base["observables"]]
    name, cfg, extra = _rows(saved)[0]
    dm = build_one(saved, cfg, f"{name}_merge", list(extra)).datamodule
    evs = tail_evaluations(saved, dm, specs)
    os.makedirs(a.out, exist_ok=True)
    res = {k: base[k] for k in ("eta", "observables", "num_samples", "out_of_range", "n_ref")}
    res.update({"rows": rows, "train_seeds": seeds, "args": vars(saved),
                "runs": {r: {str(sd): runs[r][str(sd)] for sd in seeds} for r in rows},
                "merged_from": [{"part": d, "wall_s": rec.get("wall_s"), "complete": "summary" in rec,
                                 "runs": {r: sorted(per) for r, per in rec["runs"].items()}}
                                for d, (rec, _) in zip(names, parts)],
                "dropped_rows": {r: sorted(runs[r]) for r in runs if r not in rows},
                "pooled_seeds": pooled})
    for r in rows:
        for sd in seeds:
            tr = runs[r][str(sd)].get("truncation")
            if tr:
                res["lim_truncation"] = _truncation_label(tr["train"])
                res["alpha"] = float(saved.alpha)
    return _finish(saved, res, gen_obs, evs, specs, dm, seeds, t0, pooled)


def _pite(argv: list) -> int:
    a = build_parser().parse_args(argv)
    if a.merge:
        merge(a)
        return 0
    if a.rescore:
        rescore(a)
        return 0
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
