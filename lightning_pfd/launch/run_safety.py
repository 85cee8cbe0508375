"""Checks and housekeeping of a ``fit`` that protect earlier work, made before training starts.

Used by :meth:`lightning_pfd.launch.cli.PFDLightningCLI.validate_run`:

- :func:`check_run_length` — ``trainer.max_epochs 0`` / ``trainer.max_steps 0`` train nothing
  (Lightning would exit 0 and write an empty run): refused.
- :func:`probe_output_places` — every place the run writes (default_root_dir and its
  ``per_unit/``, each logger's directory, each checkpoint ``dirpath``, a callback's
  ``report_dir`` / ``out_dir``...) can be created and written: no path component longer than
  the file system allows, no path longer than its limit, the nearest existing directory
  writable (a read-only run directory or file system). Nothing is created by the probe.
- :func:`epoch_end_last_checkpoints` — Lightning's ``ModelCheckpoint(save_last=True,
  save_top_k=0)`` writes ``last.ckpt`` only at the end of fit (a SIGTERM loses every epoch): it
  is replaced by an :class:`lightning_pfd.callbacks.EpochCheckpoint` with the same directory
  and file name, which writes ``last.ckpt`` at every epoch end.
- :func:`remove_unfinished_writes` — the temporary files of a checkpoint write that a kill
  interrupted (``.last.ckpt.<random>.tmp``) are removed at the next start of that run, under
  the run's lock (so no writer of this run is active).
- :func:`check_unique_keys` — a config file that gives a key twice in one mapping is refused,
  naming the key, the file and both lines (YAML keeps the last one silently).
- :func:`set_aside_earlier_checkpoints` — ``fit --overwrite``: once every check has passed,
  the earlier run's checkpoints move to ``<dirpath>/overwritten-<time>/``, so
  ``checkpoints/last.ckpt`` is always this run's.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

from ..errors import ConfigError
from .paths import callback_path, logger_path

__all__ = ["check_run_length", "probe_output_places", "output_places", "epoch_end_last_checkpoints",
           "remove_unfinished_writes", "set_aside_earlier_checkpoints", "OVERWRITTEN_PREFIX",
           "check_unique_keys"]

#: the folder (inside a checkpoint dirpath) where ``--overwrite`` moves an earlier run's checkpoints
OVERWRITTEN_PREFIX = "overwritten-"

#: init arguments of a callback that name a directory it writes to
_CALLBACK_DIRS = ("report_dir", "out_dir", "output_dir", "log_dir", "save_dir")

#: room left for the names the run creates below a place (``wandb/offline-run-<time>-<id>/files/...``)
_TAIL = {"per_unit": "per_unit/leaf_name_of_a_monitor_key.npz",
         "wandb": "wandb/offline-run-20260101_000000-abcdefgh/files/report/report.md",
         "csv": "version_0/metrics.csv", "ckpt": "egen-min-000-v1.ckpt"}


def check_run_length(trainer: Any) -> None:
    """ConfigError for ``max_epochs == 0`` or ``max_steps == 0`` (a fit that trains nothing)."""
    for name in ("max_epochs", "max_steps"):
        value = getattr(trainer, name, None)
        if value == 0:
            raise ConfigError(f"trainer.{name}", "0 trains nothing (the run would end at once, "
                              "with empty logs)", value=0,
                              accepted="a positive number, or -1 for no limit (then another of "
                                       "max_epochs / max_steps / max_time ends the run)")


def output_places(trainer: Any) -> List[Tuple[str, str, str]]:
    """``(field, directory, tail)`` for every directory the run writes: ``tail`` is a typical
    name the run creates below it (for the length check)."""
    places: List[Tuple[str, str, str]] = []
    root = getattr(trainer, "default_root_dir", None)
    if root:
        places.append(("trainer.default_root_dir", str(root), _TAIL["per_unit"]))
    for lg in getattr(trainer, "loggers", None) or []:
        name = type(lg).__name__
        save_dir = getattr(lg, "save_dir", None)
        if not save_dir:
            continue
        if "Wandb" in name:
            places.append((logger_path(lg, arg="save_dir"), str(save_dir), _TAIL["wandb"]))
        else:
            sub = getattr(lg, "name", None) or ""
            places.append((logger_path(lg, arg="save_dir"), os.path.join(str(save_dir), str(sub)), _TAIL["csv"]))
    for cb in getattr(trainer, "checkpoint_callbacks", None) or []:
        d = getattr(cb, "dirpath", None)
        if d:
            places.append((callback_path(cb, arg="dirpath"), str(d), _TAIL["ckpt"]))
    for cb in getattr(trainer, "callbacks", None) or []:
        for arg in _CALLBACK_DIRS:
            d = getattr(cb, arg, None)
            if isinstance(d, (str, os.PathLike)) and str(d):
                places.append((callback_path(cb, arg=arg), str(d), "report.md"))
    return [p for p in places if "://" not in p[1]]


def _limits(existing: Path) -> Tuple[int, int]:
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # pragma: no cover - no pathconf on this platform / file system
        return 255, 4096


def probe_output_places(trainer: Any, places: Optional[List[Tuple[str, str, str]]] = None) -> None:
    """ConfigError naming the first output place that cannot be created or written (see the
    module doc); creates nothing."""
    for field, value, tail in (output_places(trainer) if places is None else places):
        p = Path(value).expanduser().absolute()
        existing = next((q for q in (p, *p.parents) if os.path.exists(q)), Path(p.anchor))
        if not os.path.isdir(existing):
            raise ConfigError(field, f"{existing} is a regular file, so the directory {p} cannot be "
                              "created", value=value, suggestion="choose another output path (or move that file)")
        name_max, path_max = _limits(existing)
        for part in p.relative_to(existing).parts + tuple(Path(tail).parts):
            if len(part.encode()) > name_max:
                raise ConfigError(field, f"the path component {part[:40]}... ({len(part.encode())} "
                                  f"bytes) is longer than the file system allows ({name_max})",
                                  value=value, suggestion="choose a shorter directory name")
        full = len(str(p / tail).encode())
        if full >= path_max:
            raise ConfigError(field, f"the paths the run writes there would be {full} bytes long, over "
                              f"the file system's limit ({path_max})", value=value,
                              suggestion="choose a shorter output path")
        if not os.access(existing, os.W_OK | os.X_OK):
            why = "is on a read-only file system" if _read_only(existing) else "is not writable by this user"
            raise ConfigError(field, f"{existing} {why}, so the run cannot write {p}", value=value,
                              suggestion="choose a writable output path (e.g. --trainer.default_root_dir "
                                         "and the loggers' save_dir / the checkpoint dirpath)")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # pragma: no cover
        return False


def epoch_end_last_checkpoints(trainer: Any) -> List[str]:
    """Replace (in ``trainer.callbacks``) every Lightning ``ModelCheckpoint`` with ``save_last``
    and ``save_top_k=0`` by an ``EpochCheckpoint`` writing to the same place (see the module
    doc). Returns one line per replaced callback."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ..callbacks.checkpoint import EpochCheckpoint

    lines = []
    callbacks = getattr(trainer, "callbacks", None) or []
    for i, cb in enumerate(list(callbacks)):
        if type(cb) is not ModelCheckpoint or not cb.save_last or cb.save_top_k != 0 \
                or cb.save_weights_only or getattr(cb, "monitor", None):
            continue
        new = EpochCheckpoint(dirpath=cb.dirpath, filename=cb.filename, save_top_k=0, save_last=True,
                              verbose=cb.verbose)
        if any(other.state_key == new.state_key for other in callbacks if other is not cb):
            continue  # an EpochCheckpoint like it is there already (its state would be overwritten)
        callbacks[i] = new
        lines.append(f"ModelCheckpoint(save_last=True, save_top_k=0) writes last.ckpt only when fit "
                     f"ends (Lightning): an EpochCheckpoint writes it to "
                     f"{cb.dirpath or 'the same place'} at every epoch end instead (resumable after a stop)")
    return lines


def _checkpoint_dirs(trainer: Any) -> List[Path]:
    dirs = []
    for cb in getattr(trainer, "checkpoint_callbacks", None) or []:
        d = getattr(cb, "dirpath", None)
        if d and "://" not in str(d) and Path(d).is_dir() and Path(d).absolute() not in dirs:
            dirs.append(Path(d).absolute())
    return dirs


def remove_unfinished_writes(trainer: Any) -> List[str]:
    """Remove the temporary files of interrupted atomic checkpoint writes (``.<name>.ckpt.*.tmp``)
    in the run's checkpoint directories; returns the removed names. Call with the run's lock held."""
    removed = []
    for d in _checkpoint_dirs(trainer):
        for p in sorted(d.glob(".*.ckpt.*.tmp")):
            try:
                p.unlink()
                removed.append(p.name)
            except FileNotFoundError:  # pragma: no cover - gone meanwhile
                pass
    return removed


def set_aside_earlier_checkpoints(trainer: Any, stamp: Optional[str] = None) -> List[str]:
    """Move the ``*.ckpt`` files (and ``stopped/``) of each checkpoint directory into
    ``<dirpath>/overwritten-<time>/`` (an atomic rename each); returns one line per directory."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    lines = []
    for d in _checkpoint_dirs(trainer):
        found = sorted(p for p in d.glob("*.ckpt") if p.is_file())
        if (d / "stopped").is_dir():  # EpochCheckpoint's weights of a cut epoch
            found.append(d / "stopped")
        if not found:
            continue
        aside = d / f"{OVERWRITTEN_PREFIX}{stamp}"
        k = 1
        while aside.exists():
            aside, k = d / f"{OVERWRITTEN_PREFIX}{stamp}-{k}", k + 1
        aside.mkdir()
        for p in found:
            try:
                os.replace(p, aside / p.name)
            except OSError as e:  # pragma: no cover - same directory: a rename does not fail
                if e.errno != errno.ENOENT:
                    raise
        lines.append(f"--overwrite: the earlier run's checkpoints ({len(found)} entries) in {d} moved to "
                     f"{aside} (delete it when no longer needed)")
    return lines


def check_unique_keys(path, field: str = "--config") -> None:
    """ConfigError naming the key, the file and both lines when a YAML mapping of ``path`` gives
    the same key twice (YAML loaders keep the last one without a word). A file that is not
    valid YAML is left to the parser's own message."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            try:
                key = loader.construct_object(key_node, deep=True)
                hash(key)
            except Exception:  # noqa: BLE001 - an unhashable key: the parser reports it
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(field, f"the key {key!r} is given twice in the same mapping (lines "
                                  f"{seen[key]} and {line}); YAML would silently keep the second",
                                  value=str(path), suggestion=f"keep one {key!r} in {path} (line "
                                  f"{seen[key]} or {line})")
            seen[key] = line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return
    try:
        yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        return
