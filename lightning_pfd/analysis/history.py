"""Read per-epoch metric histories from a run directory (CSVLogger or W&B offline run).

- CSV: Lightning's ``CSVLogger`` writes ``<save_dir>/<name>/version_k/metrics.csv`` with one row
  per logging call, an ``epoch`` and a ``step`` column and empty cells for metrics not logged in
  that call.
- W&B: an offline run directory ``wandb/offline-run-<time>-<id>/`` holds ``run-<id>.wandb`` (a
  log of protobuf records) and ``files/media/`` (images, tables). No JSON history is written
  offline; :mod:`lightning_pfd.analysis.wandb_log` reads the log (through ``wandb leet inspect
  --json``, the SDK's one public reader, and a built-in reader that verifies every record; that
  module says why both exist).

**Segments.** A resumed run is written in several *segments*: one W&B offline-run directory per
start (same run id, ``offline-run-<time>-<id>``) or one CSVLogger version directory per start
(``version_0``, ``version_1``, ...). :func:`load_history` merges the segments of one run ordered
by segment time (the time in the W&B directory name; the CSV version number) and keeps, for every
epoch, the rows of the *latest* segment that has that epoch (a resumed segment re-runs the epochs
after its checkpoint). W&B segments belong together by their run id. CSVLogger has no run id:
the version directories below one logger directory are *assumed* to be segments of one run;
point at one ``version_k`` directory (or pass ``segment=``) to read a single one.

**Integrity.** Every ``.wandb`` file is checked record by record (length and CRC-32 of each
record, complete fragment sequences) and every ``metrics.csv`` line by line (field count, a cut
last line). A file cut mid-record is read up to its last intact record; the problem is kept in
:attr:`Segment.problem` and :attr:`History.warnings`, and :attr:`History.incomplete` is true
unless a later segment re-ran the lost epochs. A run with no readable metric value raises
:class:`~lightning_pfd.errors.ConfigError`.

:func:`load_history` returns a :class:`History`; ``History.series(name)`` gives
``(epochs, values)`` with one value per epoch (the last finite value logged in that epoch).
No Lightning import here.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal, Optional

import numpy as np

from ..errors import ConfigError
from ..validation import check_args
from .wandb_log import (check_wandb_log, read_wandb_log, read_wandb_records, scan_wandb_log,
                        wandb_leet_available)

__all__ = ["History", "Segment", "load_history", "find_run", "find_segments", "read_csv_rows",
           "read_csv_segment", "read_wandb_records", "read_wandb_log", "scan_wandb_log",
           "merge_segments", "wandb_leet_available"]

#: where a run's history is read from: found by itself, a CSVLogger metrics.csv or a W&B run
Source = Literal["auto", "csv", "wandb"]


@dataclass
class Segment:
    """One file of a run: a ``.wandb`` log or a ``metrics.csv``.

    ``rows_read``: metric rows read from it; ``rows_kept``: rows left after merging (rows of
    epochs that a later segment re-ran are dropped); ``epochs``: (first, last) epoch read, or
    None; ``problem``: why the file is incomplete (truncated, corrupt), or None; ``covered``: a
    later segment re-ran the epochs that may be lost; ``finished``: the W&B log has an exit
    record (None for CSV, which has no such marker).
    """

    path: Path
    kind: str
    rows_read: int = 0
    rows_kept: int = 0
    epochs: Optional[tuple] = None
    problem: Optional[str] = None
    covered: bool = False
    finished: Optional[bool] = None

    @property
    def name(self) -> str:
        """The segment's directory name (``version_1``, ``offline-run-<time>-<id>``)."""
        return self.path.parent.name

    def describe(self) -> str:
        """``<path>: N rows, epochs a–b`` (+ what was kept and the problem)."""
        ep = "no epochs" if self.epochs is None else \
            f"epochs {_num(self.epochs[0])}–{_num(self.epochs[1])}"
        text = f"{self.path}: {self.rows_read} rows, {ep}"
        if self.rows_kept != self.rows_read:
            text += f", {self.rows_kept} kept"
        if self.problem:
            text += f"; {self.problem}"
        return text

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "rows_read": self.rows_read,
                "rows_kept": self.rows_kept, "epochs": None if self.epochs is None
                else [float(e) for e in self.epochs], "problem": self.problem,
                "covered": self.covered, "finished": self.finished}


@dataclass
class History:
    """Metric rows of one run plus what the logger stored besides them.

    ``rows``: one dict per logging call (metric name → float; ``epoch`` when it was logged);
    ``summary`` / ``config``: W&B run summary and config (empty for CSV; CSV config comes from a
    ``hparams.yaml`` only as text in ``config['hparams_yaml']``); ``images``: metric key → list of
    image file paths; ``tables``: key → path of the newest logged table (JSON with columns/data);
    ``segments``: the :class:`Segment` files merged into ``rows`` (oldest first);
    ``warnings``: what a reader of a report must know (truncated files, unfinished run).
    """

    rows: list
    source: str = "memory"
    path: Optional[Path] = None
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    segments: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    @property
    def incomplete(self) -> bool:
        """True when a segment is truncated or corrupt and no later segment re-ran its epochs."""
        return any(s.problem and not s.covered for s in self.segments)

    def keys(self) -> list:
        """Metric names with at least one finite value (``epoch``/``step`` excluded)."""
        names = set()
        for r in self.rows:
            names.update(k for k, v in r.items() if _finite(v))
        return sorted(names - {"epoch", "step", "trainer/global_step"})

    def series(self, name: str, x: str = "epoch"):
        """``(x_values, values)`` float64 arrays, one entry per distinct ``x`` (the last finite
        value logged with that ``x``), sorted by ``x``. Empty arrays if never logged. Rows
        without ``x`` inherit the last ``x`` seen (Lightning logs ``epoch`` with every call)."""
        last = {}
        cur = None
        for r in self.rows:
            if _finite(r.get(x)):
                cur = float(r[x])
            v = r.get(name)
            if cur is not None and _finite(v):
                last[cur] = float(v)
        xs = np.array(sorted(last), dtype=np.float64)
        return xs, np.array([last[k] for k in xs], dtype=np.float64)

    def series_dict(self, names: Optional[Iterable[str]] = None) -> dict:
        """{name: (epochs, values)} for ``names`` (default: all keys) that have values."""
        out = {}
        for n in (self.keys() if names is None else names):
            xs, ys = self.series(n)
            if xs.size:
                out[n] = (xs, ys)
        return out

    def table(self, key: str = "events") -> Optional[dict]:
        """The newest logged W&B table ``key`` as ``{"columns": [...], "data": [[...]]}``."""
        p = self.tables.get(key)
        if p is None or not Path(p).is_file():
            return None
        with open(p) as f:
            return json.load(f)


def _finite(v) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) \
        and math.isfinite(float(v))


def _num(v) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() else f"{v:g}"


def _to_float(v):
    """JSON scalar → float (W&B writes NaN/inf as the strings "NaN", "Infinity")."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
        return float(v.replace("Infinity", "inf"))
    return None


# ----------------------------------------------------------------------------- locate
_WANDB_DIR = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-(.+)$")
_VERSION_DIR = re.compile(r"^version_(\d+)$")


def _unique(files: Iterable[Path]) -> list:
    """Files deduplicated by their resolved path (``wandb/latest-run`` is a symlink)."""
    seen = {}
    for f in files:
        seen.setdefault(f.resolve(), f.resolve())
    return list(seen.values())


def _newest(files: list) -> Path:
    return max(files, key=lambda f: f.stat().st_mtime)


def _wandb_run_id(f: Path) -> str:
    """Run id of a ``run-<id>.wandb`` file (else from its ``offline-run-<time>-<id>`` dir)."""
    if f.name.startswith("run-") and f.suffix == ".wandb":
        return f.name[len("run-"):-len(".wandb")]
    m = _WANDB_DIR.match(f.parent.name)
    return m.group(2) if m else f.stem


def _wandb_order(f: Path) -> tuple:
    """Segment time of a W&B log: the time in its directory name, then its mtime."""
    m = _WANDB_DIR.match(f.parent.name)
    return (m.group(1) if m else "", f.stat().st_mtime)


def _csv_order(f: Path) -> tuple:
    """Segment time of a CSVLogger file: its version number, then its mtime."""
    m = _VERSION_DIR.match(f.parent.name)
    return (int(m.group(1)) if m else math.inf, f.stat().st_mtime)


def _wandb_segments(p: Path) -> list:
    """``.wandb`` files of the most recent run at or below ``p``, with all files of the same
    run id in the same ``wandb`` directory (its resumed segments), oldest first."""
    if p.is_file():
        chosen = p.resolve()
    else:
        direct = _unique(p.glob("run-*.wandb"))
        cands = direct or _unique(p.rglob("*.wandb"))
        if not cands:
            return []
        chosen = _newest(cands)
    rid = _wandb_run_id(chosen)
    sibs = _unique(chosen.parent.parent.glob(f"*/run-{rid}.wandb")) or [chosen]
    if chosen not in sibs:
        sibs.append(chosen)
    return sorted(sibs, key=_wandb_order)


def _csv_segments(p: Path) -> list:
    """``metrics.csv`` files: the file or version dir given, else every version directory of
    the logger directory holding the most recent ``metrics.csv`` below ``p``, oldest first."""
    if p.is_file():
        return [p.resolve()]
    if (p / "metrics.csv").is_file():
        return [(p / "metrics.csv").resolve()]
    files = _unique(p.rglob("metrics.csv"))
    if not files:
        return []
    root = _newest(files).parent.parent
    return sorted((f for f in files if f.parent.parent == root), key=_csv_order)


def find_segments(path, source: Source = "auto") -> tuple:
    """``(kind, files)``: kind "wandb" with the ``.wandb`` logs of one run, or "csv" with its
    ``metrics.csv`` files, oldest segment first (see the module docstring for what counts as
    one run). ``path`` may be a file, a run or version directory, a ``wandb`` directory or a
    logger save_dir. Raises :class:`~lightning_pfd.errors.ConfigError` when nothing is found."""
    check_args(find_segments, locals())
    p = Path(path)
    if not p.exists():
        raise ConfigError("run_dir", f"{str(p)!r} does not exist")
    if p.is_file():
        if p.suffix == ".wandb" and source in ("auto", "wandb"):
            return "wandb", _wandb_segments(p)
        if p.suffix == ".csv" and source in ("auto", "csv"):
            return "csv", _csv_segments(p)
        raise ConfigError("run_dir", f"{str(p)!r} is neither a .wandb log nor a metrics .csv "
                                     f"(source={source!r})")
    if source in ("auto", "wandb"):
        files = _wandb_segments(p)
        if files:
            return "wandb", files
    if source in ("auto", "csv"):
        files = _csv_segments(p)
        if files:
            return "csv", files
    what = {"auto": "W&B run (*.wandb) or CSVLogger metrics.csv", "wandb": "W&B run (*.wandb)",
            "csv": "CSVLogger metrics.csv"}[source]
    raise ConfigError("run_dir", f"no {what} under {str(p)!r}")


def find_run(path, source: Source = "auto"):
    """``(kind, file)`` of the *latest* segment of a run: kind "wandb" with the ``.wandb`` file
    or "csv" with the ``metrics.csv`` (see :func:`find_segments`)."""
    kind, files = find_segments(path, source)
    return kind, files[-1]


def _select(files: list, segment) -> list:
    """The segments named by ``segment``: "all", "latest", an index (0 = oldest, -1 = latest)
    or a directory name (``version_1``, ``offline-run-<time>-<id>``)."""
    if segment in (None, "all"):
        return files
    if segment == "latest":
        return files[-1:]
    names = [f.parent.name for f in files]
    if isinstance(segment, int) or re.fullmatch(r"-?\d+", str(segment)):
        i = int(segment)
        if -len(files) <= i < len(files):
            return [files[i]]
    elif str(segment) in names:
        return [files[names.index(str(segment))]]
    raise ConfigError("segment", "no such segment of this run", value=segment,
                      accepted=["all", "latest"] + list(range(len(files))) + names)


def load_history(path, source: Source = "auto", use_leet: Optional[bool] = None,
                 segment="all") -> History:
    """Load a run's history, merging its segments (see module docstring). ``use_leet``: None =
    try ``wandb leet inspect`` then fall back to the built-in reader, True = leet only, False =
    built-in only; ``segment``: "all" (merge), "latest", an index or a directory name."""
    kind, files = find_segments(path, source)
    files = _select(files, segment)
    parts = [_read_csv(f) if kind == "csv" else _read_wandb(f, use_leet) for f in files]
    hist = _combine(kind, parts)
    if not hist.keys() and kind == "wandb" and source == "auto":
        fallback = _csv_instead(path, segment, hist)  # a run still training: W&B not flushed yet
        if fallback is not None:
            return fallback
    if not hist.keys():
        raise ConfigError("run_dir", _nothing_read(hist))
    return hist


def _csv_instead(path, segment, empty: History) -> Optional[History]:
    """The CSV logs of the run at ``path`` when its W&B log holds no metric value yet (W&B
    buffers records in its service process: the log of a run that is still training, or was
    killed, can be empty while the CSV logger has written its rows). None when there is no CSV
    log with a value either."""
    try:
        _, files = find_segments(path, "csv")
        files = _select(files, segment)
    except ConfigError:
        return None
    hist = _combine("csv", [_read_csv(f) for f in files])
    if not hist.keys():
        return None
    where = ", ".join(str(s.path) for s in empty.segments)
    hist.warnings.insert(0, f"the W&B log ({where}) holds no metric value yet (the run is still "
                            "running, or W&B had not written its buffer when it stopped): read "
                            "the CSV log instead")
    return hist


def _nothing_read(hist: History) -> str:
    """One line for a run without a single metric value."""
    probs = "; ".join(f"{s.path}: {s.problem}" for s in hist.segments if s.problem)
    where = ", ".join(str(s.path) for s in hist.segments)
    return f"no metric values could be read from {where}" + (f" ({probs})" if probs else "")


# ----------------------------------------------------------------------------- merge
def _row_epochs(rows: list) -> list:
    """Epoch of every row: its own, else the last one seen before it (None before any)."""
    out, cur = [], None
    for r in rows:
        if _finite(r.get("epoch")):
            cur = float(r["epoch"])
        out.append(cur)
    return out


def merge_segments(segment_rows: list) -> tuple:
    """Merge the row lists of a run's segments (oldest first): for each epoch keep the rows of
    the latest segment that has that epoch. Rows without their own ``epoch`` get the epoch they
    inherit (so the merged list reads the same with :meth:`History.series`); rows before the
    first epoch of a segment are kept only for the latest segment. Returns ``(rows,
    kept_per_segment)``."""
    if len(segment_rows) == 1:
        return list(segment_rows[0]), [len(segment_rows[0])]
    epochs = [_row_epochs(rows) for rows in segment_rows]
    later: set = set()
    keep = [None] * len(segment_rows)
    for i in range(len(segment_rows) - 1, -1, -1):
        last = i == len(segment_rows) - 1
        keep[i] = [dict(r, epoch=e) if e is not None else dict(r)
                   for r, e in zip(segment_rows[i], epochs[i])
                   if (e is None and last) or (e is not None and e not in later)]
        later |= {e for e in epochs[i] if e is not None}
    return [r for rows in keep for r in rows], [len(k) for k in keep]


def _epoch_range(rows: list) -> Optional[tuple]:
    ep = [e for e in _row_epochs(rows) if e is not None]
    return (min(ep), max(ep)) if ep else None


def _mark_covered(segments: list) -> None:
    """A damaged segment is covered when a later one starts at most one epoch after the last
    epoch read from it (the resumed segment re-ran whatever the damage may have lost)."""
    for i, s in enumerate(segments):
        last = s.epochs[1] if s.epochs else -1.0
        s.covered = bool(s.problem) and any(t.epochs and t.epochs[0] <= last + 1
                                            for t in segments[i + 1:])


def _warnings(segments: list) -> list:
    out = []
    for s in segments:
        if s.problem:
            ep = "nothing" if s.epochs is None else \
                f"{s.rows_read} rows, epochs {_num(s.epochs[0])}–{_num(s.epochs[1])}"
            tail = "a later segment re-ran the epochs after it" if s.covered else \
                "the report covers only what was read"
            out.append(f"{s.path}: {s.problem}; read {ep}; {tail}")
    last = segments[-1] if segments else None
    if last is not None and last.finished is False and not last.problem:
        out.append(f"{last.path}: the log has no exit record (the run is still running or was "
                   "stopped before it finished)")
    return out


def _combine(kind: str, parts: list) -> History:
    """One :class:`History` from the per-segment reads (oldest first)."""
    rows, kept = merge_segments([p["rows"] for p in parts])
    segments = []
    for p, k in zip(parts, kept):
        segments.append(Segment(path=p["path"], kind=kind, rows_read=len(p["rows"]), rows_kept=k,
                                epochs=_epoch_range(p["rows"]), problem=p.get("problem"),
                                finished=p.get("finished")))
    _mark_covered(segments)
    summary, config, images, tables = {}, {}, {}, {}
    for p in parts:
        summary = p.get("summary") or summary
        config.update(p.get("config") or {})
        tables.update(p.get("tables") or {})
        for k, v in (p.get("images") or {}).items():
            images.setdefault(k, []).extend(v)
    return History(rows=rows, source=kind, path=parts[-1]["path"], summary=summary,
                   config=config, images=images, tables=tables, segments=segments,
                   warnings=_warnings(segments))


# ----------------------------------------------------------------------------- CSV
def read_csv_segment(path) -> tuple:
    """``(rows, problem)`` of a CSVLogger ``metrics.csv``: rows as dicts of floats (empty cells
    dropped); a last line without its newline (the file was cut while being written) and lines
    with the wrong number of fields are left out and described in ``problem`` (None if none)."""
    text = Path(path).read_text(errors="replace")
    if not text.strip():
        return [], "the file is empty"
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    records = [(reader.line_num, r) for r in reader if r]
    problems = []
    if records and not text.endswith(("\n", "\r")):
        line, _ = records.pop()
        problems.append(f"the last line ({line}) is cut (no newline at the end of the file)")
    bad = [line for line, r in records if len(r) != len(header)]
    if bad:
        problems.append(f"{len(bad)} line(s) with a wrong number of fields (first: line {bad[0]})")
    rows = []
    for _, rec in records:
        if len(rec) != len(header):
            continue
        row = {}
        for k, v in zip(header, rec):
            try:
                row[k] = float(v) if v != "" else None
            except ValueError:
                continue
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows, "; ".join(problems) or None


def read_csv_rows(path) -> list:
    """Rows of a CSVLogger ``metrics.csv`` as dicts of floats (see :func:`read_csv_segment`)."""
    return read_csv_segment(path)[0]


def _read_csv(f: Path) -> dict:
    rows, problem = read_csv_segment(f)
    cfg = {}
    hp = f.parent / "hparams.yaml"
    if hp.is_file():
        cfg["hparams_yaml"] = hp.read_text()
    return {"path": f, "rows": rows, "problem": problem, "config": cfg}


# ----------------------------------------------------------------------------- W&B
def _normalize(obj):
    """Summary as nested dicts of Python values: ``_wandb`` dropped, "NaN"/"Infinity" → float."""
    if isinstance(obj, dict):
        return {k: _normalize(v) for k, v in obj.items() if k != "_wandb"}
    f = _to_float(obj) if isinstance(obj, str) else None
    return f if f is not None else obj


def _media(item: dict, files_dir: Path, images: dict, tables: dict) -> None:
    """Collect the image files and the table file referenced by one history item."""
    for k, v in item.items():
        if not k.endswith("._type"):
            continue
        base = k[: -len("._type")]
        if v == "image-file" and isinstance(item.get(base + ".path"), str):
            images.setdefault(base, []).append(str(files_dir / item[base + ".path"]))
        elif v == "images/separated" and isinstance(item.get(base + ".filenames"), list):
            images.setdefault(base, []).extend(str(files_dir / p)
                                               for p in item[base + ".filenames"])
        elif v in ("table-file", "incremental-table-file", "partitioned-table") \
                and isinstance(item.get(base + ".path"), str):
            tables[base] = str(files_dir / item[base + ".path"])


def _history_row(item: dict) -> dict:
    """Metric values of one history item (W&B internals and media keys dropped)."""
    media = tuple(k[: -len("_type")] for k in item if k.endswith("._type"))
    row = {}
    for k, v in item.items():
        if k.startswith("_") or (media and k.startswith(media)):
            continue
        f = _to_float(v)
        if f is not None:
            row[k] = f
    return row


def _read_wandb(wandb_file: Path, use_leet: Optional[bool]) -> dict:
    """One W&B segment. A damaged log is read with the built-in reader, which stops at the
    last intact record, so what is reported is exactly what could be verified."""
    problem = check_wandb_log(wandb_file)
    if problem:
        recs, summary, config = read_wandb_log(wandb_file)
    else:
        recs, summary, config = read_wandb_records(wandb_file, use_leet)
    files_dir = wandb_file.parent / "files"
    rows, images, tables = [], {}, {}
    for kind, payload in recs:
        if kind == "history":
            item = payload.get("item", {})
            rows.append(_history_row(item))
            _media(item, files_dir, images, tables)
    return {"path": wandb_file, "rows": rows, "problem": problem,
            "finished": any(kind == "exit" for kind, _ in recs),
            "summary": _normalize(summary),
            "config": {k: v for k, v in config.items() if k != "_wandb"},
            "images": images, "tables": tables}
