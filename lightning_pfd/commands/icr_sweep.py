"""``python -m lightning_pfd icr-sweep``: ICR(sigma) and a linear probe over a noise grid (Fig. 3 of
*Evaluating the Representation Space of Diffusion Models via Self-Supervised Principles*, the ICR paper).

The computation is :func:`lightning_pfd.evaluation.icr_sweep.sweep` (ICR, the traces and a linear
probe on the same evaluation's features, per sigma); this command loads the checkpoint and the
data, prints a table (ICR ± its delete-a-group jackknife standard error, as the ICRMonitor's
``icr/icr_se``) and writes ``icr_sweep.csv``, ``icr_sweep.json`` and ``icr_sweep.png`` (error
bars: ±1 s.e.) into ``--out`` (default ``RUN/icr_sweep/<checkpoint name>``, beside the
checkpoint's run; an earlier sweep there is kept and the first free ``OUT-2``, ... used). The
semantic window is where ICR is lowest and the probe most accurate; a minimum at the smallest or
largest sigma of the grid is flagged (the curve may fall further outside the grid).

Examples::

    python -m lightning_pfd icr-sweep --ckpt runs/x/checkpoints/last.ckpt --data runs/x/config.yaml
    python -m lightning_pfd icr-sweep --ckpt last.ckpt --data digits --data-args '{"image_size": 8}' \
        --net '{"class_path": "lightning_pfd.nets.UNet",
               "init_args": {"img_resolution": 8, "in_channels": 1}}'

``--data`` is a LightningCLI config file (its ``data`` entry is used, and its ``model.init_args.net``
when the checkpoint does not record the network), a short name (digits, fashion, cifar10, gmm) or
a datamodule class path.

Bad arguments fail before anything heavy is loaded, in one block naming the flag and the
value (exit status 2; ``--debug`` shows the traceback). The ranges are the options' types, refused
by argparse while parsing (shown by ``--help``): noise levels that are not finite and > 0,
``--num-images`` < 2, ``--level`` outside 0..5, ``--d-proj`` / ``--probe-train`` /
``--batch-size`` / ``--views-per-image`` < 1, a negative ``--seed``. Then, as a
:class:`~lightning_pfd.errors.ConfigError`: a missing checkpoint or config file, duplicate noise
levels, an unknown short name or a malformed class path in ``--data`` / ``--module-class``,
``--out`` naming a file, malformed
``--data-args`` / ``--net``. After loading: an unknown ``--tap`` (with the net's taps and the
closest name), ``--num-images`` larger than the training set, noise levels outside the
denoiser's range, ``--d-proj`` larger than the tap's feature dimension; a datamodule or network
that refuses its arguments (named as ``--data`` / ``--data-args`` / ``--net``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..classpath import instantiate, load_class
from ..errors import ConfigError, ShortErrorParser, renamed_fields
from ..evaluation.icr_sweep import DEFAULT_SIGMAS, sweep, sweep_evaluation
from ..validation import FinitePositiveFloat, IntAtLeastTwo, NonNegativeInt, PositiveInt
from ..launch import run_guarded
from . import COMMANDS, typed

__all__ = ["main", "validate_args", "check_loaded", "build_datamodule", "load_module", "build",
           "format_table", "plot", "SHORT_NAMES", "fit_data_to_model", "reliability_warnings",
           "edge_minimum", "default_out", "output_dir", "SWEEP_FILES"]

SHORT_NAMES = {
    "digits": "lightning_pfd.data.DigitsDataModule",
    "fashion": "lightning_pfd.data.FashionMNISTDataModule",
    "cifar10": "lightning_pfd.data.CIFAR10DataModule",
    "gmm": "lightning_pfd.data.GaussianMixtureDataModule",
}
PROG = COMMANDS["icr-sweep"].prog
#: the evaluation arguments the command's flags set (errors about them name the flag)
_FLAG_ARGS = ("num_images", "sigma", "sigmas", "tap", "d_proj", "level", "views_per_image",
              "batch_size", "seed")


# ----------------------------------------------------------------------------- loading
def build(spec: Any, base):
    """Build ``{"class_path": ..., "init_args": {...}}`` (LightningCLI format, bare names of
    :data:`SHORT_NAMES` too) as a ``base``, type-checked before anything is called
    (:func:`lightning_pfd.classpath.instantiate`)."""
    return instantiate(spec, base, "class_path", short_names=SHORT_NAMES)


def _parse_mapping(text: Optional[str], field: str) -> Optional[dict]:
    if text is None:
        return None
    import yaml

    p = Path(text)
    try:
        value = yaml.safe_load(p.read_text() if p.is_file() else text)
    except yaml.YAMLError as e:
        raise ConfigError(field, f"not valid JSON/YAML: {e}", value=text) from e
    if not isinstance(value, dict):
        raise ConfigError(field, f"expected a mapping, got {type(value).__name__}", value=text)
    return value


def build_datamodule(data: str, data_args: Optional[dict]):
    """(datamodule after setup("fit"), net spec from a config file or None)."""
    net_spec = None
    if data.endswith((".yaml", ".yml")):
        cfg = _parse_mapping(data, "--data")
        if "data" not in cfg:
            raise ConfigError("--data", "the config has no `data` entry", value=data)
        spec = dict(cfg["data"])
        if data_args:
            spec["init_args"] = {**(spec.get("init_args") or {}), **data_args}
        net_spec = ((cfg.get("model") or {}).get("init_args") or {}).get("net")
    else:
        spec = {"class_path": SHORT_NAMES.get(data, data), "init_args": data_args or {}}
    import lightning.pytorch as pl

    dm = build(spec, pl.LightningDataModule)
    dm.setup("fit")
    return dm, net_spec


def load_module(ckpt: str, net_spec: Optional[dict], module_class: str):
    import lightning.pytorch as pl
    import torch

    cls = load_class(module_class, pl.LightningModule, "--module-class")
    kwargs = {"map_location": "cpu"}
    try:
        module = cls.load_from_checkpoint(ckpt, **kwargs)
    except Exception as first:  # the checkpoint may not record the net (built in Python)
        if net_spec is None:
            raise ConfigError("--ckpt", f"could not load {module_class} from it ({first})", value=ckpt,
                              suggestion="pass --net with the network's class_path/init_args") from first
        module = cls.load_from_checkpoint(ckpt, net=build(net_spec, torch.nn.Module), **kwargs)
    return module.eval()


class _Reshaped:
    """A datamodule's splits with every sample reshaped to ``shape`` (labels unchanged)."""

    def __init__(self, dm: Any, shape: tuple):
        for name in ("train_labels", "val_labels"):
            setattr(self, name, getattr(dm, name, None))
        for name in ("train_data", "val_data"):
            x = getattr(dm, name, None)
            setattr(self, name, None if x is None else x.reshape(x.shape[0], *shape))
        self.data_shape = shape


def fit_data_to_model(module: Any, dm: Any, data_arg: str):
    """(datamodule, image_shape): images for a model that takes them flattened (the quickstart's
    MLP on 8x8 digits) are flattened as the model expects, and their (C, H, W) kept for the
    augmentation (as ``ICRMonitor(image_shape=...)`` does in the run); samples whose size differs
    from the model's are refused naming ``--data``."""
    want = getattr(module, "data_shape", None)
    x = getattr(dm, "train_data", None)
    if want is None or x is None or tuple(x.shape[1:]) == tuple(want):
        return dm, None
    have, want = tuple(int(v) for v in x.shape[1:]), tuple(int(v) for v in want)
    if math.prod(have) != math.prod(want):
        raise ConfigError("--data", f"its samples have shape {have} but the checkpoint's model takes "
                          f"{want}", value=data_arg,
                          suggestion="use the data the model was trained on (e.g. the run's config.yaml), "
                                     "or pass --data-args to change the image size")
    print(f"[icr-sweep] the data's samples {have} are flattened to the model's {want}"
          + (f"; the augmentation sees them as {have} images" if len(have) == 3 else ""), flush=True)
    return _Reshaped(dm, want), (have if len(have) == 3 else None)


#: ICR needs several view pairs per feature dimension (Sigma_xi and Sigma_s are d x d estimates)
MIN_PAIRS_PER_DIM = 4


def reliability_warnings(rows: List[Dict[str, float]], views_per_image: int = 1) -> List[str]:
    """Warnings printed with the table: fewer than ``MIN_PAIRS_PER_DIM * d`` view pairs (the d x d
    covariances are rank-deficient or noisy: ICR is not reliable), no probe (no labels)."""
    out = []
    if rows:
        n_pairs, d = rows[0]["n"] * views_per_image, rows[0]["d"]
        if n_pairs < MIN_PAIRS_PER_DIM * d:
            out.append(f"warning: ICR from n = {n_pairs:.0f} view pairs in d = {d:.0f} feature dimensions "
                       f"(n < {MIN_PAIRS_PER_DIM} d): the d x d covariance estimates are rank-deficient or "
                       "noisy, so these ICR values are not reliable; use more images (--num-images, a "
                       "larger training set), more views (--views-per-image) or fewer dimensions (--d-proj)")
    if rows and all(math.isnan(r["probe_acc"]) for r in rows):
        out.append("note: no linear probe (probe acc = nan): the data has no labels or no validation split")
    return out


# ----------------------------------------------------------------------------- output
def edge_minimum(rows: List[Dict[str, float]]) -> Optional[str]:
    """A warning when the ICR minimum lies at the smallest or largest sigma of the grid: the
    curve may keep falling beyond it, so the grid does not locate the semantic window (None for
    an interior minimum; rows sorted by sigma)."""
    finite = [r for r in rows if math.isfinite(r["icr"])]
    if not finite:
        return None
    best = min(finite, key=lambda r: r["icr"])
    sig = [r["sigma"] for r in rows]
    if len(rows) >= 2 and best["sigma"] in (min(sig), max(sig)):
        side, step = ("smallest", "smaller") if best["sigma"] == min(sig) else ("largest", "larger")
        return (f"warning: the ICR minimum is at the grid's {side} noise level (sigma = "
                f"{best['sigma']:.4g}): ICR may fall further beyond it, so this grid does not locate "
                f"the minimum; extend --sigmas to {step} values")
    return None


def _pm(value: float, se: float) -> str:
    return f"{value:.4f} ± {se:.4f}" if math.isfinite(se) else f"{value:.4f} ± nan"


def format_table(rows: List[Dict[str, float]]) -> str:
    """The printed table: ICR with its jackknife standard error, the traces, the probe; then
    where the ICR minimum and the best probe are (the minimum flagged when at the grid's edge)."""
    head = f"{'sigma':>8} {'ICR ± s.e.':>17} {'Tr S_s':>9} {'Tr S_xi':>9} {'probe acc':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['sigma']:>8.4g} {_pm(r['icr'], r.get('icr_se', math.nan)):>17} "
                     f"{r['trace_s']:>9.4f} {r['trace_xi']:>9.4f} {r['probe_acc']:>9.4f}")
    best_icr = min(rows, key=lambda r: r["icr"])
    edge = edge_minimum(rows)
    lines.append(f"n = {rows[0]['n']:.0f} images, d = {rows[0]['d']:.0f}; "
                 f"ICR minimum at sigma = {best_icr['sigma']:.4g} "
                 f"(ICR {_pm(best_icr['icr'], best_icr.get('icr_se', math.nan))}"
                 + ("; at the grid's edge)" if edge else ")"))
    accs = [r for r in rows if not math.isnan(r["probe_acc"])]
    if accs:
        best = max(accs, key=lambda r: r["probe_acc"])
        lines.append(f"best linear probe at sigma = {best['sigma']:.4g} (acc {best['probe_acc']:.4f})")
    return "\n".join(lines)


def plot(rows: List[Dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = [r["sigma"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar(s, [r["icr"] for r in rows], yerr=[r.get("icr_se", math.nan) for r in rows],
                fmt="o-", color="tab:blue", capsize=3, label="ICR ± 1 s.e.")
    ax.set_xscale("log")
    ax.set_xlabel(r"noise level $\sigma$")
    ax.set_ylabel("ICR", color="tab:blue")
    if not all(math.isnan(r["probe_acc"]) for r in rows):
        ax2 = ax.twinx()
        ax2.plot(s, [r["probe_acc"] for r in rows], "s--", color="slategray", label="probe acc")
        ax2.set_ylabel("linear probe accuracy", color="slategray")
    ax.set_title("semantic window: ICR vs linear probe")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- command
#: the option types: argparse refuses a value outside them naming the option (status 2)
_SIGMA = typed(FinitePositiveFloat)
_POSITIVE = typed(PositiveInt)
_NUM_IMAGES = typed(IntAtLeastTwo)


def _parser() -> argparse.ArgumentParser:
    p = ShortErrorParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint of a DiffusionModule")
    p.add_argument("--data", required=True,
                   help="LightningCLI config file, short name (digits, fashion, cifar10, gmm) or "
                        "datamodule class path")
    p.add_argument("--data-args", default=None, help="JSON/YAML mapping of datamodule init args")
    p.add_argument("--net", default=None,
                   help="JSON/YAML {class_path, init_args} of the net, when the checkpoint lacks it")
    p.add_argument("--module-class", default="lightning_pfd.modules.DiffusionModule")
    p.add_argument("--sigmas", type=_SIGMA, nargs="+", default=list(DEFAULT_SIGMAS),
                   help=f"noise levels, distinct, each {_SIGMA.words}")
    p.add_argument("--num-images", type=_NUM_IMAGES, default=None,
                   help=f"ICR subset size, {_NUM_IMAGES.words} (default: min(4096, N), the paper's 4096)")
    p.add_argument("--level", type=int, choices=range(6), default=3, help="augmentation level")
    p.add_argument("--tap", default=None)
    p.add_argument("--d-proj", type=_POSITIVE, default=None, help=f"{_POSITIVE.words} (or left out)")
    p.add_argument("--views-per-image", type=_POSITIVE, default=1, help=_POSITIVE.words)
    p.add_argument("--probe-train", type=_POSITIVE, default=None,
                   help=f"training images for the probe, {_POSITIVE.words} (default: all)")
    p.add_argument("--batch-size", type=_POSITIVE, default=256, help=_POSITIVE.words)
    p.add_argument("--seed", type=typed(NonNegativeInt), default=0, help=typed(NonNegativeInt).words)
    p.add_argument("--out", default=None,
                   help="output folder (icr_sweep.csv, .json, .png); default: the checkpoint's run, "
                        "RUN/icr_sweep/<checkpoint name> (RUN: the folder holding checkpoints/); "
                        "a folder that already holds a sweep is kept and OUT-2, OUT-3, ... is used")
    p.add_argument("--force", action="store_true", help="overwrite a sweep already in the output folder")
    return p


#: the files a sweep writes (a folder holding one of them holds a sweep)
SWEEP_FILES = ("icr_sweep.csv", "icr_sweep.json", "icr_sweep.png")


def default_out(ckpt: str) -> Path:
    """``RUN/icr_sweep/<checkpoint stem>``: RUN is the folder holding the checkpoint's
    ``checkpoints/`` folder (``runs/quickstart/checkpoints/last.ckpt`` ->
    ``runs/quickstart/icr_sweep/last``), else the checkpoint's own folder."""
    p = Path(ckpt)
    run = p.parent.parent if p.parent.name == "checkpoints" else p.parent
    return run / "icr_sweep" / p.stem


def output_dir(args) -> Path:
    """Where this sweep writes: ``--out`` (or :func:`default_out`), or its first free sibling
    when that folder already holds a sweep (``--force``: that folder)."""
    from ..analysis.report import free_report_dir

    want = Path(args.out) if args.out else default_out(args.ckpt)
    return free_report_dir(want, force=args.force, files=SWEEP_FILES)


def validate_args(args) -> None:
    """Every check of the command's arguments that needs no data, no checkpoint, no network."""
    if not Path(args.ckpt).is_file():
        raise ConfigError("--ckpt", "no such checkpoint file", value=args.ckpt)
    if len(set(args.sigmas)) != len(args.sigmas):
        raise ConfigError("--sigmas", "noise levels repeat", value=args.sigmas)
    _validate_data_arg(args.data)
    if "." not in args.module_class.strip("."):
        raise ConfigError("--module-class", "expected a class path 'package.module.Class'",
                          value=args.module_class)
    out = Path(args.out) if args.out else default_out(args.ckpt)
    for part in (out, *out.parents):
        if part.exists():
            if not part.is_dir():
                raise ConfigError("--out", f"{part} exists and is not a folder", value=str(out))
            break


def _validate_data_arg(data: str) -> None:
    """--data: an existing config file, a short name or a dotted class path."""
    if data.endswith((".yaml", ".yml")):
        if not Path(data).is_file():
            raise ConfigError("--data", "no such config file", value=data)
    elif data not in SHORT_NAMES and "." not in data.strip("."):
        raise ConfigError("--data", "unknown data name", value=data,
                          accepted=sorted(SHORT_NAMES) + ["a config file (.yaml)", "a class path"])


def _flag(arg: str) -> str:
    """The command-line flag of an evaluation argument (``sigma`` and ``sigmas`` are ``--sigmas``)."""
    return "--sigmas" if arg.startswith("sigma") else "--" + arg.replace("_", "-")


def _flags():
    """Errors about an evaluation argument name its flag (``tap`` -> ``--tap``)."""
    return renamed_fields({arg: _flag(arg) for arg in _FLAG_ARGS})


def check_loaded(module, dm, sigmas: Sequence[float], num_images: Optional[int],
                 tap: Optional[str], **settings: Any):
    """The checks that need the loaded module and data (--tap, --num-images, --sigmas range,
    --d-proj); returns the :class:`~lightning_pfd.evaluation.representation.RepresentationEvaluation`
    of the sweep (``settings``: its other arguments)."""
    with _flags():
        return sweep_evaluation(module, dm.train_data, sigmas, num_images, tap, **settings)


@contextlib.contextmanager
def _refusal_names(field: str) -> Iterator[None]:
    """A loader's own ValueError (a datamodule or net refusing its arguments) as a ConfigError
    naming ``field``."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(field, f"refused: {e}") from e


def _write(rows: List[Dict[str, float]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "icr_sweep.csv", "w") as f:
        keys = list(rows[0])
        f.write(",".join(keys) + "\n")
        f.writelines(",".join(repr(r[k]) for k in keys) + "\n" for r in rows)
    (out / "icr_sweep.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "icr_sweep.png")


def _icr_sweep(argv: list) -> int:
    args = _parser().parse_args(argv)
    validate_args(args)  # nothing loaded yet
    data_args = _parse_mapping(args.data_args, "--data-args")
    net_spec_cli = _parse_mapping(args.net, "--net")
    with _refusal_names("--data-args" if data_args else "--data"):
        dm, net_spec_cfg = build_datamodule(args.data, data_args)
    with _refusal_names("--net"):
        module = load_module(args.ckpt, net_spec_cli or net_spec_cfg, args.module_class)
    dm, image_shape = fit_data_to_model(module, dm, args.data)
    settings = dict(level=args.level, d_proj=args.d_proj, views_per_image=args.views_per_image,
                    batch_size=args.batch_size, seed=args.seed)
    if image_shape is not None:
        settings["image_shape"] = image_shape
    check_loaded(module, dm, args.sigmas, args.num_images, args.tap, **settings)
    with _flags():
        rows = sweep(module, dm, sorted(args.sigmas), num_images=args.num_images, tap=args.tap,
                     probe_train=args.probe_train, **settings)
    out = output_dir(args)
    print(format_table(rows))
    edge = edge_minimum(rows)
    for line in reliability_warnings(rows, args.views_per_image) + ([edge] if edge else []):
        print(line, file=sys.stderr, flush=True)
    want = Path(args.out) if args.out else default_out(args.ckpt)
    if out != want:
        print(f"note: {want} already holds a sweep (kept); writing to {out} (--force overwrites)",
              file=sys.stderr)
    _write(rows, out)
    print(f"wrote {out / 'icr_sweep.csv'}, {out / 'icr_sweep.json'}, {out / 'icr_sweep.png'}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lightning_pfd icr-sweep ...``; returns the exit status (2: a bad argument,
    one block on stderr, before anything heavy is loaded where possible)."""
    return run_guarded(_icr_sweep, argv, PROG)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
