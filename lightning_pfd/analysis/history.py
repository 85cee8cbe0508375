"""Read per-epoch metric histories from a run directory (CSVLogger or W&B offline run).

- CSV: Lightning's ``CSVLogger`` writes ``<save_dir>/<name>/version_k/metrics.csv`` with one row
  per logging call, an ``epoch`` and a ``step`` column and empty cells for metrics not logged in
  that call.
- W&B: an offline run directory ``wandb/offline-run-*/`` holds ``run-<id>.wandb`` (a LevelDB-style
  log of protobuf records) and ``files/media/`` (images, tables). No JSON history is written
  offline, so the log is read with ``wandb leet inspect --json`` (wandb ≥ 0.25; one JSON record
  per line; ``--summary --json`` for the final summary and config). When that command is not
  available it falls back to :func:`read_wandb_log`, a ~40-line reader of the log format using
  ``wandb.proto.wandb_internal_pb2.Record`` (wandb ≥ 0.19 no longer ships a Python reader).

:func:`load_history` returns a :class:`History`; ``History.series(name)`` gives
``(epochs, values)`` with one value per epoch (the last finite value logged in that epoch).
No Lightning import here; wandb is imported lazily and only for the fallback reader.
"""
from __future__ import annotations

import copy
import csv
import json
import math
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

__all__ = ["History", "load_history", "find_run", "read_csv_rows", "read_wandb_records",
           "read_wandb_log", "wandb_leet_available"]

_SOURCES = ("auto", "csv", "wandb")


@dataclass
class History:
    """Metric rows of one run plus what the logger stored besides them.

    ``rows``: one dict per logging call (metric name → float; ``epoch`` when it was logged);
    ``summary`` / ``config``: W&B run summary and config (empty for CSV; CSV config comes from a
    ``hparams.yaml`` only as text in ``config['hparams_yaml']``); ``images``: metric key → list of
    image file paths; ``tables``: key → path of the newest logged table (JSON with columns/data).
    """

    rows: list
    source: str = "memory"
    path: Optional[Path] = None
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)

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
def find_run(path, source: str = "auto"):
    """``(kind, file)`` for a run: kind "wandb" with the ``.wandb`` file or "csv" with the
    ``metrics.csv``. ``path`` may be the file itself, a run directory, a ``wandb`` directory or
    a logger save_dir (the most recently modified run below it is used)."""
    if source not in _SOURCES:
        raise ValueError(f"source must be one of {_SOURCES}, got {source!r}")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"run_dir: {str(p)!r} does not exist")
    if p.is_file():
        if p.suffix == ".wandb" and source in ("auto", "wandb"):
            return "wandb", p
        if p.suffix == ".csv" and source in ("auto", "csv"):
            return "csv", p
        raise ValueError(f"run_dir: {str(p)!r} is neither a .wandb log nor a metrics .csv "
                         f"(source={source!r})")
    found = {}
    if source in ("auto", "wandb"):
        direct = sorted(p.glob("run-*.wandb"))
        cands = direct or sorted(p.rglob("*.wandb"), key=lambda f: f.stat().st_mtime)
        if cands:
            found["wandb"] = cands[-1]
    if source in ("auto", "csv"):
        direct = p / "metrics.csv"
        cands = [direct] if direct.is_file() else sorted(p.rglob("metrics.csv"),
                                                         key=lambda f: f.stat().st_mtime)
        if cands:
            found["csv"] = cands[-1]
    if not found:
        raise ValueError(f"run_dir: no W&B run (*.wandb) or CSVLogger metrics.csv under {str(p)!r}")
    kind = "wandb" if "wandb" in found else "csv"
    return kind, found[kind]


def load_history(path, source: str = "auto", use_leet: Optional[bool] = None) -> History:
    """Load a run's history (see module docstring). ``use_leet``: None = try ``wandb leet
    inspect`` then fall back to the built-in reader, True = leet only, False = built-in only."""
    kind, f = find_run(path, source)
    if kind == "csv":
        rows = read_csv_rows(f)
        cfg = {}
        hp = f.parent / "hparams.yaml"
        if hp.is_file():
            cfg["hparams_yaml"] = hp.read_text()
        return History(rows=rows, source="csv", path=f, config=cfg)
    return _wandb_history(f, use_leet)


# ----------------------------------------------------------------------------- CSV
def read_csv_rows(path) -> list:
    """Rows of a CSVLogger ``metrics.csv`` as dicts of floats (empty cells dropped)."""
    rows = []
    with open(path, newline="") as fh:
        for raw in csv.DictReader(fh):
            row = {}
            for k, v in raw.items():
                if k is None or v is None or v == "":
                    continue
                try:
                    row[k] = float(v)
                except ValueError:
                    continue
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- W&B
def _wandb_cmd() -> list:
    exe = Path(sys.executable).parent / "wandb"
    if exe.is_file():
        return [str(exe)]
    w = shutil.which("wandb")
    return [w] if w else [sys.executable, "-m", "wandb"]


def wandb_leet_available() -> bool:
    """True when the installed wandb has ``wandb leet inspect`` (wandb ≥ 0.25)."""
    try:
        r = subprocess.run(_wandb_cmd() + ["leet", "inspect", "--help"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "--json" in r.stdout


def _leet(args: list, timeout: float = 120.0) -> str:
    r = subprocess.run(_wandb_cmd() + ["leet", "inspect"] + args, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"wandb leet inspect failed ({r.returncode}): {r.stderr.strip()[:500]}")
    return r.stdout


def read_wandb_records(wandb_file, use_leet: Optional[bool] = None) -> tuple:
    """``(records, summary, config)`` of a ``.wandb`` log. ``records``: list of
    ``(type, payload)`` with payload as printed by ``wandb leet inspect --json`` (history items
    flattened with "." and NaN/inf as strings)."""
    wandb_file = Path(wandb_file)
    st = wandb_file.stat()
    key = (str(wandb_file.resolve()), st.st_mtime_ns, st.st_size, use_leet)
    if key not in _RECORD_CACHE:
        if len(_RECORD_CACHE) > 8:
            _RECORD_CACHE.clear()
        _RECORD_CACHE[key] = _read_wandb_records(wandb_file, use_leet)
    return copy.deepcopy(_RECORD_CACHE[key])


_RECORD_CACHE: dict = {}


def _read_wandb_records(wandb_file: Path, use_leet: Optional[bool]) -> tuple:
    if use_leet is not False:
        try:
            recs = []
            for line in _leet(["--json", str(wandb_file)]).splitlines():
                line = line.strip()
                if line.startswith("{"):
                    d = json.loads(line)
                    recs.append((d.get("type"), d.get(d.get("type"), {})))
            summ = json.loads(_leet(["--summary", "--json", str(wandb_file)]))
            return recs, summ.get("summary", {}) or {}, summ.get("config", {}) or {}
        except (OSError, RuntimeError, subprocess.SubprocessError, json.JSONDecodeError):
            if use_leet:
                raise
    return read_wandb_log(wandb_file)


def _records_from_log(data: bytes) -> Iterable[bytes]:
    """Payloads of the W&B LevelDB-style log: a 7-byte file header (":W&B", magic 0xBEE1,
    version), then 32 KiB blocks of records [crc32c:4][length:2][type:1][data], type 1 = full,
    2/3/4 = first/middle/last fragment; a block tail shorter than 7 bytes is padding.
    (CRCs are not verified: a torn last record is dropped by the protobuf parse.)"""
    if len(data) < 7 or data[:4] != b":W&B" or struct.unpack("<H", data[4:6])[0] != 0xBEE1:
        raise ValueError("not a W&B transaction log (bad header)")
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, rtype = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if rtype == 0 and length == 0:
            continue
        if rtype == 1:
            yield chunk
        elif rtype == 2:
            buf = chunk
        elif rtype == 3:
            buf += chunk
        elif rtype == 4:
            yield buf + chunk
            buf = b""


def _item_key(item) -> str:
    return ".".join(item.nested_key) if len(item.nested_key) else item.key


def read_wandb_log(wandb_file) -> tuple:
    """Built-in fallback for :func:`read_wandb_records` (no ``wandb leet``): parses the log with
    ``wandb.proto.wandb_internal_pb2.Record``; same return shape."""
    from wandb.proto import wandb_internal_pb2 as pb  # lazy: only this fallback needs wandb

    recs, summary, config = [], {}, {}
    for payload in _records_from_log(Path(wandb_file).read_bytes()):
        rec = pb.Record()
        try:
            rec.ParseFromString(payload)
        except Exception:  # torn record at the end of a crashed run
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            item = {_item_key(i): json.loads(i.value_json) for i in rec.history.item}
            recs.append(("history", {"item": item, "step": {"num": rec.history.step.num}}))
        elif kind == "summary":
            upd = {}
            for i in rec.summary.update:
                val = json.loads(i.value_json)
                upd[_item_key(i)] = val
                _set_nested(summary, list(i.nested_key) or [i.key], val)
            for i in rec.summary.remove:
                summary.pop(i.key, None)
            recs.append(("summary", {"update": upd}))
        elif kind in ("run", "config"):
            items = rec.run.config.update if kind == "run" else rec.config.update
            for i in items:
                _set_nested(config, list(i.nested_key) or [i.key], json.loads(i.value_json))
        elif kind == "files":
            recs.append(("files", {"files": [{"path": f.path} for f in rec.files.files]}))
    config.pop("_wandb", None)
    return recs, summary, config


def _normalize(obj):
    """Summary as nested dicts of Python values: ``_wandb`` dropped, "NaN"/"Infinity" → float."""
    if isinstance(obj, dict):
        return {k: _normalize(v) for k, v in obj.items() if k != "_wandb"}
    f = _to_float(obj) if isinstance(obj, str) else None
    return f if f is not None else obj


def _set_nested(d: dict, keys: list, value):
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            return
    d[keys[-1]] = value


def _wandb_history(wandb_file: Path, use_leet: Optional[bool]) -> History:
    recs, summary, config = read_wandb_records(wandb_file, use_leet)
    run_dir = wandb_file.parent
    files_dir = run_dir / "files"
    rows, images, tables = [], {}, {}
    for kind, payload in recs:
        if kind != "history":
            continue
        item = payload.get("item", {})
        media = tuple(k[: -len("_type")] for k in item if k.endswith("._type"))
        row = {}
        for k, v in item.items():
            if k.startswith("_") or (media and k.startswith(media)):
                continue
            f = _to_float(v)
            if f is not None:
                row[k] = f
        rows.append(row)
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
    config = {k: v for k, v in config.items() if k != "_wandb"}
    summary = _normalize(summary)
    return History(rows=rows, source="wandb", path=wandb_file, summary=summary, config=config,
                   images=images, tables=tables)

