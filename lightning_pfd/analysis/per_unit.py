"""Per-unit measurement records: what a value and its standard error are made of (pure numpy).

Every scheduled measurement of E_gen / E_mem keeps its M per-seed squared distances
d²_i = ||Psi(Phi_student(x_T^i)) - Psi(Phi_ref(x_T^i))||² (PFD paper eq. 4: E = sqrt(mean_i d²_i)),
the memorization ratio its per-sample indicators (ratio = mean), and ICR its delete-a-group
jackknife replicates. From them come

- a **standard error** of each logged value (:func:`value_and_se`): for E = sqrt(mean d²) the delta
  method, se(E) = sd(d²) / (2 E sqrt(M)); for a mean of indicators sd/sqrt(M); for jackknife
  replicates r_g (G groups), se² = (G-1)/G sum_g (r_g - mean r)²;
- **paired** tests of the change between two epochs (the same seeds / samples / groups at both),
  and a split of the units into a selection half and a held-out half
  (:mod:`lightning_pfd.analysis.inference`).

On disk (the run directory's ``per_unit/``), one file per (metric, epoch)::

    per_unit/<metric slug>/epoch_000012.npz
        values  float64 (U,)   per-unit values (d², indicator, jackknife replicate, or any
                               per-unit value whose mean is logged: kind ``mean``)
        units   int64   (U,)   unit ids (evaluation seeds, sample seeds, group index)
        meta    str            JSON: key, epoch, step, kind, value, format

Each file is written atomically (temporary file + rename), so a killed run leaves whole files
only, and a resumed run that measures an epoch again replaces that epoch's file: every epoch
appears once. :func:`read_records` checks every file (readable archive, 1-D ``values`` and
``units`` of one length, known kind, metadata matching the file name) and reports the bad ones
instead of using them.

The files are for resume and ``report``: during a fit the consumers get the records in memory
(the monitors' ``latest``, :mod:`lightning_pfd.callbacks.monitor`). :class:`UnitMemory` keeps a
run's records as the store would hold them (seeded from the files once after a resume) and gives
the same series and problem lines as :func:`load_units` on the files (:func:`unit_series`,
:func:`pairing_problems` are shared by both).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence, Tuple, get_args

import numpy as np

from ..atomic import atomic_open
from ..validation import check_args

__all__ = ["KINDS", "UnitRecord", "PerUnitStore", "UnitSeries", "UnitMemory", "value_and_se", "read_records",
           "pairing_problems", "unit_series", "find_store", "load_units", "STORE_DIR"]

#: what the per-unit values are and how the logged value is made from them
Kind = Literal["sq_dist", "indicator", "jackknife", "mean"]
KINDS = get_args(Kind)
STORE_DIR = "per_unit"
_FORMAT = 1
_NAME_RE = re.compile(r"^epoch_(\d{6,})\.npz$")


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")


def value_and_se(values: np.ndarray, kind: Kind, value: Optional[float] = None) -> Tuple[float, float]:
    """``(value, standard error)`` from per-unit values (module docstring). For ``jackknife`` the
    value is the full-sample estimate ``value`` (the replicates only give the error)."""
    check_args(value_and_se, locals())
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n == 0 or not np.all(np.isfinite(v)):
        return math.nan, math.nan
    if kind == "sq_dist":
        mean = float(v.mean())
        e = math.sqrt(mean)
        if n < 2:
            return e, math.nan
        return e, (float(v.std(ddof=1)) / (2.0 * e * math.sqrt(n)) if e > 0 else 0.0)
    if kind in ("indicator", "mean"):  # a mean of per-unit values
        return float(v.mean()), (float(v.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan)
    est = float(v.mean()) if value is None else float(value)  # jackknife
    return est, math.sqrt((n - 1) / n * float(np.sum((v - v.mean()) ** 2))) if n > 1 else math.nan


@dataclass(frozen=True)
class UnitRecord:
    """One measurement: metric ``key`` at ``epoch`` (global ``step``), ``kind`` in :data:`KINDS`,
    per-unit ``values`` with their ``units`` ids, and the logged ``value``."""

    key: str
    epoch: int
    step: int
    kind: Kind
    values: np.ndarray
    units: np.ndarray
    value: float = math.nan

    def __post_init__(self) -> None:
        check_args(UnitRecord, vars(self))
        v = np.asarray(self.values, dtype=np.float64).reshape(-1)
        u = np.asarray(self.units, dtype=np.int64).reshape(-1)
        if v.shape != u.shape:
            raise ValueError(f"values and units must have one length, got {v.size} and {u.size}")
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "units", u)

    def se(self) -> float:
        return value_and_se(self.values, self.kind, self.value)[1]


class PerUnitStore:
    """The per-unit records of one run under ``root`` (``<run dir>/per_unit``)."""

    def __init__(self, root) -> None:
        self.root = Path(root)

    def path(self, key: str, epoch: int) -> Path:
        return self.root / _slug(key) / f"epoch_{int(epoch):06d}.npz"

    def write(self, record: UnitRecord) -> Path:
        """Write ``record`` atomically; an earlier record of the same (key, epoch) is replaced."""
        path = self.path(record.key, record.epoch)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = json.dumps({"key": record.key, "epoch": int(record.epoch), "step": int(record.step),
                           "kind": record.kind, "value": float(record.value), "format": _FORMAT})
        with atomic_open(path) as f:
            np.savez(f, values=record.values, units=record.units, meta=np.array(meta))
        return path

    def read(self) -> Tuple[Dict[str, List[UnitRecord]], List[str]]:
        """:func:`read_records` of this store."""
        return read_records(self.root)

    def get(self, key: str, epoch: int) -> Optional[UnitRecord]:
        """The record of ``key`` at ``epoch``, or None when absent or unreadable."""
        path = self.path(key, epoch)
        try:
            return _read_one(path) if path.is_file() else None
        except Exception:  # noqa: BLE001 - a damaged record is not used
            return None


def _check_arrays(values: np.ndarray, units: np.ndarray) -> None:
    """The checks a record's arrays must pass to be used (on disk and in memory)."""
    if values.ndim != 1 or units.ndim != 1 or values.shape != units.shape:
        raise ValueError(f"values {values.shape} and units {units.shape} must be 1-D of one length")
    if values.size == 0:
        raise ValueError("no units")


def _unusable(path, error: Exception) -> str:
    return f"{path}: unreadable per-unit record ({type(error).__name__}: {error})"


def _read_one(path: Path) -> UnitRecord:
    with np.load(path, allow_pickle=False) as z:
        missing = {"values", "units", "meta"} - set(z.files)
        if missing:
            raise ValueError(f"missing arrays {sorted(missing)}")
        values, units, meta = z["values"], z["units"], json.loads(str(z["meta"]))
    _check_arrays(values, units)
    m = _NAME_RE.match(path.name)
    if m is None or int(m.group(1)) != int(meta["epoch"]):
        raise ValueError(f"epoch {meta.get('epoch')} in the file does not match its name")
    if _slug(str(meta["key"])) != path.parent.name:  # a record copied into another metric's folder
        raise ValueError(f"its metadata names the metric {meta['key']!r}, not the one of its folder "
                         f"{path.parent.name!r}")
    return UnitRecord(key=str(meta["key"]), epoch=int(meta["epoch"]), step=int(meta["step"]),
                      kind=str(meta["kind"]), values=values, units=units,
                      value=float(meta.get("value", math.nan)))


def read_records(root, cache: Optional[dict] = None) -> Tuple[Dict[str, List[UnitRecord]], List[str]]:
    """``({key: records sorted by epoch}, problems)``: every readable record below ``root``, and
    one line per file that was *not* used (unreadable or truncated archive, wrong shapes, unknown
    kind, metadata that contradicts the file name, units that differ from the metric's other
    epochs). A metric with any bad file is listed in the problems; its good files are returned.
    ``cache`` (a dict kept by the caller): records of files unchanged since the last call (same
    size and modification time) are not read again."""
    root = Path(root)
    out: Dict[str, List[UnitRecord]] = {}
    problems: List[str] = []
    if not root.is_dir():
        return out, problems
    for path in sorted(root.glob("*/epoch_*.npz")):
        try:
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            hit = cache.get(str(path)) if cache is not None else None
            rec = hit[1] if hit is not None and hit[0] == stamp else _read_one(path)
            if cache is not None:
                cache[str(path)] = (stamp, rec)
        except Exception as e:  # noqa: BLE001 - any damage is reported, never used
            problems.append(_unusable(path, e))
            continue
        out.setdefault(rec.key, []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.epoch)
    return out, problems + pairing_problems(root, out)


def pairing_problems(root, records: Dict[str, List[UnitRecord]]) -> List[str]:
    """One line per record (of ``{key: records sorted by epoch}``) whose units or kind differ from
    its metric's first epoch, named by its file under the store ``root``."""
    problems = []
    for key, recs in records.items():
        ref = recs[0]
        for r in recs[1:]:
            if r.kind != ref.kind or not np.array_equal(r.units, ref.units):
                problems.append(f"{Path(root) / _slug(key) / f'epoch_{r.epoch:06d}.npz'}: units or kind differ "
                                f"from epoch {ref.epoch} (records of one metric must be paired)")
    return problems


def find_store(path) -> Optional[Path]:
    """The ``per_unit`` directory of the run at ``path``: ``path/per_unit``, or that of an
    ancestor (a W&B run or CSV version directory inside the run directory), or the only one
    below ``path``; None when there is none."""
    p = Path(path)
    p = p.parent if p.is_file() else p
    for d in [p, *p.parents][:5]:
        if (d / STORE_DIR).is_dir():
            return d / STORE_DIR
    found = sorted(q for q in p.glob(f"**/{STORE_DIR}") if q.is_dir()) if p.is_dir() else []
    return found[0] if len(found) == 1 else None


@dataclass
class UnitSeries:
    """The paired per-unit matrix of one metric: ``epochs`` (T,), ``values`` (T, U), ``units``
    (U,), ``kind``, ``logged`` (T,) the values as logged (for jackknife: the full estimates)."""

    key: str
    kind: str
    epochs: np.ndarray
    values: np.ndarray
    units: np.ndarray
    logged: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def from_records(cls, records: Sequence[UnitRecord]) -> "UnitSeries":
        if not records:
            raise ValueError("no records")
        recs = sorted(records, key=lambda r: r.epoch)
        ref = recs[0]
        for r in recs:
            if r.kind != ref.kind or not np.array_equal(r.units, ref.units):
                raise ValueError(f"{ref.key}: the records are not paired (units differ at epoch {r.epoch})")
        return cls(ref.key, ref.kind, np.array([r.epoch for r in recs], dtype=np.float64),
                   np.stack([r.values for r in recs]), ref.units.copy(),
                   np.array([r.value for r in recs], dtype=np.float64))


def load_units(root, keys: Optional[Sequence[str]] = None,
               cache: Optional[dict] = None) -> Tuple[Dict[str, UnitSeries], List[str]]:
    """``({key: UnitSeries}, problems)`` of the store at ``root`` (None: nothing). A metric with a
    bad record is left out entirely (its events then come from the logged curve alone) and named
    in the problems, so a damaged file is never used."""
    if root is None:
        return {}, []
    records, problems = read_records(root, cache)
    return unit_series(records, problems, keys), problems


def unit_series(records: Dict[str, List[UnitRecord]], problems: Sequence[str],
                keys: Optional[Sequence[str]] = None) -> Dict[str, UnitSeries]:
    """``{key: UnitSeries}`` of ``records`` (``{key: records sorted by epoch}``, as
    :func:`read_records` returns them), leaving out every metric named in ``problems``: what
    :func:`load_units` returns for the same records, whether they were read from disk or kept in
    memory (:class:`UnitMemory`)."""
    bad_keys = {k for k in records if any(f"/{_slug(k)}/" in p for p in problems)}
    bad_dirs = {Path(p.split(":", 1)[0]).parent.name for p in problems}
    out = {}
    for key, recs in records.items():
        if keys is not None and key not in keys:
            continue
        if key in bad_keys or _slug(key) in bad_dirs:
            continue
        out[key] = UnitSeries.from_records(recs)
    return out


class UnitMemory:
    """The per-unit records of one run kept in memory, equal to what :func:`load_units` reads from
    the run's store at ``root`` after the same records were written: one record per (metric,
    epoch), a later one replacing an earlier one (as a rewritten file does), the metrics in the
    store's file order, the same problem lines (paths under ``root``).

    :meth:`load` seeds it from the files once (a resumed run: the records written before the
    resume); :meth:`add` keeps a record measured now; :meth:`series` is :func:`load_units`."""

    def __init__(self, root) -> None:
        self.root = Path(root)
        self._records: Dict[str, Dict[int, UnitRecord]] = {}
        self._problems: Dict[str, str] = {}  # path -> line (records not used)

    def load(self) -> List[str]:
        """Add every record of the files under ``root`` (:func:`read_records`, without the pairing
        check, which :meth:`series` makes); returns the problem lines of unusable files."""
        problems: List[str] = []
        for path in sorted(self.root.glob("*/epoch_*.npz")) if self.root.is_dir() else []:
            try:
                rec = _read_one(path)
            except Exception as e:  # noqa: BLE001 - any damage is reported, never used
                problems.append(_unusable(path, e))
                self._problems[str(path)] = problems[-1]
                continue
            self._records.setdefault(rec.key, {})[rec.epoch] = rec
        return problems

    def add(self, record: UnitRecord) -> None:
        """Keep ``record`` (replacing the metric's record of that epoch, and forgetting a problem
        of its file, as a rewritten file replaces a damaged one)."""
        path = str(PerUnitStore(self.root).path(record.key, record.epoch))
        self._problems.pop(path, None)
        try:
            _check_arrays(record.values, record.units)
        except ValueError as e:  # the file it is written to would not be used either
            self._problems[path] = _unusable(path, e)
            self._records.get(record.key, {}).pop(record.epoch, None)
            return
        self._records.setdefault(record.key, {})[record.epoch] = record

    def records(self) -> Dict[str, List[UnitRecord]]:
        """``{key: records sorted by epoch}`` in the order :func:`read_records` returns them."""
        def file_order(key: str) -> Tuple[str, str]:
            return (_slug(key), key)

        return {k: [r for _, r in sorted(self._records[k].items())]
                for k in sorted(self._records, key=file_order) if self._records[k]}

    def series(self, keys: Optional[Sequence[str]] = None) -> Tuple[Dict[str, UnitSeries], List[str]]:
        """``({key: UnitSeries}, problems)``: :func:`load_units` of the same records."""
        records = self.records()
        problems = sorted(self._problems.values()) + pairing_problems(self.root, records)
        return unit_series(records, problems, keys), problems
