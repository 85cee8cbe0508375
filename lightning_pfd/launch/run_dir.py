"""``fit --run_dir PATH`` (and ``validate``/``test``/``predict``): one option that moves every
output of a run to ``PATH``.

A config names its outputs in several places: ``trainer.default_root_dir`` (the per-unit records
``per_unit/`` and the report live below it), each logger's ``save_dir`` (CSV, W&B, TensorBoard)
and the callbacks' output paths (a checkpoint's ``dirpath``, a RegimeMonitor's ``report_dir``, ...:
:data:`OUTPUT_PATH_KEYS`, the same keys as the sweeps' ``lightning_pfd.sweeps.spec.OUTPUT_PATH_KEYS``,
a layer above this one: tested equal). ``--run_dir`` rewrites all of them after the
config is parsed, by the rule the sweeps use for their trials
(:func:`lightning_pfd.sweeps.spec.relocate_outputs`): a path below the config's
``default_root_dir`` keeps its relative part (``runs/quickstart/checkpoints`` →
``PATH/checkpoints``), any other goes to ``PATH/<its last name>``; every logger's ``save_dir``
becomes ``PATH``, and a W&B logger's run ``name`` becomes ``PATH``'s last name. The option is
saved in the run's ``config.yaml``, so resuming (``--ckpt_path last`` with the same
``--run_dir``, or with ``--config PATH/config.yaml``) finds the same places. No Lightning import.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from .paths import callback_path, logger_path

__all__ = ["RUN_DIR_HELP", "OUTPUT_PATH_KEYS", "relocate", "relocated_path"]

#: the callback arguments that name an output path (moved by ``--run_dir``)
OUTPUT_PATH_KEYS = ("dirpath", "report_dir", "save_dir", "out_dir", "output_dir", "log_dir")

RUN_DIR_HELP = ("move every output of the run (trainer.default_root_dir, the loggers' save_dir, "
                "checkpoint dirpath, report_dir, per-unit records; the W&B run name becomes its "
                "last name) into this directory; a path below default_root_dir keeps its "
                "relative part")


def relocated_path(path: Any, old_root: Optional[str], run_dir: Path) -> Any:
    """Where ``path`` goes: below ``old_root`` it keeps its relative part, else ``run_dir / name``
    (None and non-strings are returned as they are)."""
    if not isinstance(path, str) or not path:
        return path
    if old_root:
        try:
            return str(run_dir / Path(path).relative_to(old_root))
        except ValueError:
            pass
        try:  # the same folder written another way (./runs/x, an absolute path)
            return str(run_dir / Path(path).resolve().relative_to(Path(old_root).resolve()))
        except ValueError:
            pass
    return str(run_dir / Path(path).name)


def _entries(node) -> list:
    return node if isinstance(node, list) else [node]


def _init_args(entry):
    """A logger's / callback's ``init_args`` (a jsonargparse Namespace or a dict), or None."""
    if entry is None or isinstance(entry, (bool, str)) or not hasattr(entry, "get"):
        return None
    if not entry.get("class_path"):
        return None
    return entry.get("init_args")


def relocate(cfg, run_dir: str) -> list:
    """Rewrite the output paths of the parsed subcommand config ``cfg`` (a jsonargparse
    Namespace, or a dict of the same shape) to lie in ``run_dir``, in place; returns
    ``[(config path, old, new)]`` of what changed (for the run's first lines)."""
    text = str(run_dir).strip()
    if not text:
        raise ConfigError("--run_dir", "must be a directory path", value=run_dir)
    target = Path(text)
    trainer = cfg.get("trainer")
    if trainer is None:
        raise ConfigError("--run_dir", "the config has no trainer section to move")
    old_root = trainer.get("default_root_dir")
    old_root = str(old_root) if old_root else None
    changed = []

    def put(node, key, value, where):
        old = node.get(key)
        if old != value:
            node[key] = value
            changed.append((where, old, value))

    put(trainer, "default_root_dir", str(target), "trainer.default_root_dir")
    for lg in _entries(trainer.get("logger")):
        args = _init_args(lg)
        if args is None:
            continue
        put(args, "save_dir", str(target), logger_path(None, lg, "save_dir"))
        if args.get("dir"):  # WandbLogger's alias of save_dir
            put(args, "dir", str(target), logger_path(None, lg, "dir"))
        if "wandb" in str(lg.get("class_path")).lower():
            put(args, "name", target.name, logger_path(None, lg, "name"))
    for cb in _entries(trainer.get("callbacks")):
        args = _init_args(cb)
        if args is None:
            continue
        for key in OUTPUT_PATH_KEYS:
            value = args.get(key)
            if isinstance(value, str) and value:
                put(args, key, relocated_path(value, old_root, target), callback_path(None, cb, key))
    return changed
