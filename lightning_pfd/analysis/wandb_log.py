"""Read a W&B offline run's transaction log (``run-<id>.wandb``) back into records.

**Why this module exists.** wandb 0.31 has no public Python API that reads a local ``.wandb``
file: ``wandb.Api()`` queries the W&B server (an offline run must be synced first, which needs an
account and a network), and the Python ``DataStore`` reader of older releases left the SDK when
the Go ``wandb-core`` service took over writing the log. The one public reader is the CLI
``wandb leet inspect --json PATH`` (one JSON record per line; ``--summary --json`` for the final
summary and config), so :func:`read_wandb_records` runs it first.

The built-in reader (:func:`scan_wandb_log`, :func:`read_wandb_log`) stays for two jobs the CLI
does not do: it checks every record's length and CRC-32 and stops at the first damaged one
(``report`` states exactly what could be verified from a run that was cut mid-write), and it
reads a log when ``wandb leet`` is not installed (wandb < 0.25). It decodes the framing only --
a LevelDB-style log of 32 KiB blocks -- and parses each record with the protobuf class the SDK
ships, ``wandb.proto.wandb_internal_pb2.Record``. No Lightning import; wandb is imported lazily
by :func:`read_wandb_log` only.
"""
from __future__ import annotations

import copy
import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Optional

__all__ = ["read_wandb_records", "read_wandb_log", "scan_wandb_log", "check_wandb_log",
           "wandb_leet_available"]

_BLOCK = 32768
_HEADER = 7


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


def scan_wandb_log(data: bytes) -> tuple:
    """``(payloads, problem)`` of the W&B LevelDB-style log: a 7-byte file header (":W&B",
    magic 0xBEE1, version), then 32 KiB blocks of records [crc32:4][length:2][type:1][data],
    type 1 = full, 2/3/4 = first/middle/last fragment, crc32 = zlib CRC-32 of the type byte and
    the data; a block tail shorter than 7 bytes is padding. Reading stops at the first record
    that is cut, crosses a block, fails its checksum or breaks a fragment sequence; ``problem``
    says where (None for an intact log) and ``payloads`` holds every record before it."""
    if not data:
        return [], "the file is empty"
    if len(data) < _HEADER or data[:4] != b":W&B" or struct.unpack("<H", data[4:6])[0] != 0xBEE1:
        return [], "not a W&B transaction log (bad header)"
    out, buf, pos = [], None, _HEADER
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        if pos + _HEADER > len(data):
            return out, f"cut inside a record header at byte {pos} of {len(data)}"
        crc, length, rtype = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if rtype == 0 and length == 0:
            pos += _HEADER  # zero padding
            continue
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        where = f"record at byte {pos} of {len(data)}"
        if len(chunk) < length:
            return out, f"cut mid-record ({where} declares {length} bytes, {len(chunk)} present)"
        if length + _HEADER > left or rtype not in (1, 2, 3, 4) \
                or zlib.crc32(bytes([rtype]) + chunk) != crc:
            return out, f"corrupt {where} (bad checksum, type or length)"
        if (rtype in (1, 2)) != (buf is None):
            return out, f"broken fragment sequence at {where}"
        pos += _HEADER + length
        if rtype == 1:
            out.append(chunk)
        elif rtype == 4:
            out.append(buf + chunk)
            buf = None
        else:
            buf = chunk if rtype == 2 else buf + chunk
    if buf is not None:
        return out, f"cut inside a record split over blocks (end of file at byte {len(data)})"
    return out, None


def check_wandb_log(wandb_file) -> Optional[str]:
    """What is wrong with a ``.wandb`` file (see :func:`scan_wandb_log`), or None."""
    return scan_wandb_log(Path(wandb_file).read_bytes())[1]


def _item_key(item) -> str:
    return ".".join(item.nested_key) if len(item.nested_key) else item.key


def read_wandb_log(wandb_file) -> tuple:
    """Built-in fallback for :func:`read_wandb_records` (no ``wandb leet``): parses the intact
    records of the log (:func:`scan_wandb_log`) with ``wandb.proto.wandb_internal_pb2.Record``;
    same return shape."""
    from wandb.proto import wandb_internal_pb2 as pb  # lazy: only this fallback needs wandb

    recs, summary, config = [], {}, {}
    for payload in scan_wandb_log(Path(wandb_file).read_bytes())[0]:
        rec = pb.Record()
        try:
            rec.ParseFromString(payload)
        except Exception:  # an intact frame holding an unparseable record: skip it
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
        elif kind == "exit":
            recs.append(("exit", {"exit_code": rec.exit.exit_code}))
    config.pop("_wandb", None)
    return recs, summary, config



def _set_nested(d: dict, keys: list, value):
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            return
    d[keys[-1]] = value
