"""``python -m lightning_pfd report RUN_DIR [--out DIR] [--force]``: figures + markdown of a run.

RUN_DIR is a W&B offline run (``wandb/offline-run-*``, a ``wandb`` directory or the ``.wandb``
file) or a CSVLogger directory (``metrics.csv`` below it); the segments of a resumed run are
merged by epoch (:mod:`lightning_pfd.analysis.history`). Writes ``dynamics.png``,
``icr_memorization.png``, ``report.md`` and ``events.json`` (:func:`lightning_pfd.analysis.report.write_report`)
to ``--out`` (default ``RUN_DIR/report`` for a directory, next to the file otherwise).

**Never destroys.** When the output directory already holds a report (e.g. the one
RegimeMonitor wrote at the end of the run), the new report goes to the first free sibling
``<out>-2``, ``<out>-3``, ...; ``--force`` overwrites instead.

**Detector settings**: the command line, over the run's ``detector_settings.json`` (found in its
segment directories, or ``--settings FILE``), over the defaults; the report says where each
came from.

Exit status: 0 report written; 1 report written from incomplete input (a truncated or corrupt
file, marked in report.md); 2 nothing written (no run, no readable metric, bad option: one line
``error: <field>: <problem>`` on stderr; ``--debug`` shows the traceback).

**Sweeps.** ``report SWEEP_DIR`` on a directory holding ``sweep_results.json`` (written by the
``sweep`` command) writes the sweep report instead (PFD paper Fig. 2, Fig. 7, Def. 3; options:
``report SWEEP_DIR --help``): :mod:`lightning_pfd.analysis.sweep_report`.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence, get_args

from ..analysis.events import DEFAULT_KEYS
from ..analysis.history import History, Source, load_history
from ..analysis.per_unit import find_store, load_units
from ..analysis.report import (DEFAULT_SETTINGS, format_value, check_settings, find_saved_settings,
                               free_report_dir, load_detector_settings, saved_detector_modules,
                               saved_keys_and_detectors,
                               write_report)
from ..errors import ConfigError, ShortErrorParser, renamed_fields
from ..launch import run_guarded

__all__ = ["main", "build_parser", "resolve_settings"]

PROG = "python -m lightning_pfd report"


# ----------------------------------------------------------------------------- settings
def _cli_settings(args) -> dict:
    """The detector settings given explicitly on the command line (validated)."""
    given = {k: getattr(args, k) for k in ("window", "min_sigma", "min_rel", "confirm",
                                           "require_descent") if getattr(args, k) is not None}
    with renamed_fields({name: "--" + name.replace("_", "-") for name in given}):
        out = check_settings(given)
    keys = {}
    for item in args.key or []:
        role, sep, name = item.partition("=")
        if not sep or not name:
            raise ConfigError("--key", "must be ROLE=METRIC", value=item,
                              accepted=list(DEFAULT_KEYS))
        keys[role.strip()] = name.strip()
    if keys:
        with renamed_fields({"keys": "--key"}):
            check_settings({"keys": keys})
        out["keys"] = keys
    return out


def resolve_settings(history: History, args) -> tuple:
    """``(settings, sources, warnings)``: defaults, overridden by the settings saved with the run
    (or ``--settings FILE``), overridden by the command line. ``sources[name]`` says where each
    came from: "default", "run: <file>", "file: <file>" or "command line"."""
    if args.settings:
        with renamed_fields({"path": "--settings"}):
            saved = load_detector_settings(args.settings)
        path, warnings = Path(args.settings), []
        origin = f"file: {path}"
    else:
        saved, path, warnings = find_saved_settings(history)
        origin = f"run: {path}"
    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULT_SETTINGS.items()}
    sources = {k: "default" for k in settings}
    for k, v in saved.items():
        settings[k] = dict(DEFAULT_KEYS, **v) if k == "keys" else v
        sources[k] = origin
    for k, v in _cli_settings(args).items():
        if k == "keys":
            settings[k] = dict(settings["keys"], **v)
            sources[k] = "command line" if sources[k] == "default" \
                else sources[k] + " + command line"
        else:
            settings[k] = v
            sources[k] = "command line"
    return settings, sources, warnings



# ----------------------------------------------------------------------------- command
def build_parser() -> argparse.ArgumentParser:
    p = ShortErrorParser(
        prog=PROG,
        description="Figures (PFD paper Fig. 4, ICR paper Fig. 5) and a markdown summary of the "
                    "training-dynamics events of a run (W&B offline run or CSVLogger logs). "
                    "Detector settings: command line > the run's detector_settings.json > "
                    "defaults. Exit status: 0 written, 1 written from incomplete input, "
                    "2 error (nothing written).")
    p.add_argument("run_dir", help="W&B offline run dir / wandb dir / .wandb file, or a CSVLogger "
                                   "dir / version dir / metrics.csv")
    p.add_argument("--out", default=None,
                   help="output directory (default: RUN_DIR/report); if it already holds a "
                        "report, the first free OUT-2, OUT-3, ... is used instead")
    p.add_argument("--force", action="store_true",
                   help="overwrite a report already in the output directory")
    p.add_argument("--source", choices=get_args(Source), default="auto")
    p.add_argument("--segment", default="all",
                   help="segments of a resumed run to read: all (merged by epoch, default), "
                        "latest, an index (0 = oldest) or a directory name (version_1, "
                        "offline-run-...)")
    p.add_argument("--settings", default=None, metavar="FILE",
                   help="detector_settings.json to use instead of the one saved with the run")
    p.add_argument("--detector-modules", nargs="+", default=[], metavar="MODULE",
                   help="import these modules first: their event detectors of your own "
                        "(lightning_pfd.analysis.register_detector) run on the keys that name them")
    p.add_argument("--window", type=int, default=None,
                   help="smoothing window (evaluations; default: the run's, else 5)")
    p.add_argument("--min-sigma", type=float, default=None,
                   help="minimum amplitude in noise units (√2·σ of the smoothed curve; "
                        "default: the run's, else 4)")
    p.add_argument("--min-rel", type=float, default=None,
                   help="minimum amplitude relative to the curve's max |value| (default: the "
                        "run's, else 0.02)")
    p.add_argument("--confirm", type=int, default=None,
                   help="evaluations a change must persist to count (default: the run's, else 3)")
    p.add_argument("--require-descent", action=argparse.BooleanOptionalAction, default=None,
                   help="early learning needs an observed descent (default: the run's, else yes)")
    p.add_argument("--key", action="append", metavar="ROLE=METRIC",
                   help=f"metric name of a role ({', '.join(DEFAULT_KEYS)}); repeatable")
    p.add_argument("--no-leet", action="store_true",
                   help="read W&B logs with the built-in reader instead of `wandb leet inspect`")
    return p


def _default_out(run_dir: str) -> Path:
    run = Path(run_dir)
    return run / "report" if run.is_dir() else run.parent / "report"


def _print_input(hist: History) -> None:
    segs = hist.segments
    if len(segs) == 1:
        print(f"read {len(hist.rows)} rows ({hist.source}) from {hist.path}")
        return
    print(f"read {len(hist.rows)} rows ({hist.source}) from {len(segs)} segments of one run, "
          "merged by epoch (the latest segment wins):")
    for i, s in enumerate(segs):
        print(f"  {i}. {s.describe()}")


def _print_settings(settings: dict, sources: dict) -> None:
    by_source: dict = {}
    for name, v in settings.items():
        text = "keys=" + ",".join(f"{r}:{m}" for r, m in v.items() if DEFAULT_KEYS.get(r) != m) \
            if name == "keys" else f"{name}={format_value(v)}"
        if text != "keys=":
            by_source.setdefault(sources[name], []).append(text)
    print("settings: " + "; ".join(f"{', '.join(v)} ({src})" for src, v in by_source.items()))


def training_now(run_dir) -> Optional[str]:
    """Who is still writing the run at ``run_dir``: the holder of a run lock
    (:mod:`lightning_pfd.locks`, taken by ``fit`` in the checkpoint folder) below it or its parent,
    found held by a live process (a shared ``flock`` is refused), as "pid N (command)"; None
    when no run is writing there (a lock file left by a finished or killed run is free)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the run lock is a no-op there too
        return None

    from ..locks import LOCK_NAME, read_holder

    p = Path(run_dir)
    p = p.parent if p.is_file() else p
    for root in (p, p.parent):
        for lock in sorted(root.glob(f"*/{LOCK_NAME}")) + sorted(root.glob(LOCK_NAME)):
            try:
                fd = os.open(lock, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                holder = read_holder(lock) or {}
                return f"pid {holder.get('pid', '?')} ({holder.get('command') or 'fit'})"
            except OSError:
                pass
            finally:
                os.close(fd)
    return None


def _portable(history: History, out: Path, given: str) -> tuple:
    """``(history, rewrite)``: the history with every file path (segments, the run, warnings)
    written relative to the report's folder ``out``, and ``rewrite(text)`` doing the same to any
    text (settings sources, per-unit problems): report.md and events.json hold no machine path
    (``../wandb/offline-run-*/run-*.wandb``, not ``/home/.../runs/x/wandb/...``)."""
    base = out.resolve()
    roots = {}
    for s in history.segments:
        for d in [Path(s.path).parent, *Path(s.path).parents][:6]:
            roots.setdefault(str(d.resolve()), None)
    given_dir = Path(given) if Path(given).is_dir() else Path(given).parent
    for d in (given_dir.resolve(),):
        roots.setdefault(str(d), None)
    # longest first, so a run directory is replaced before its parents
    pairs = sorted(((r, os.path.relpath(r, base)) for r in roots if r != "/"), key=lambda t: -len(t[0]))
    if str(given_dir) not in ("", ".") and not given_dir.is_absolute():  # a path as typed (per-unit store)
        pairs.append((str(given_dir), os.path.relpath(given_dir.resolve(), base)))

    def rewrite(text):
        if text is None:
            return None
        text = str(text)
        for old, new in pairs:  # a whole path component only (runs/x, not runs/x2)
            pattern = re.compile(re.escape(old) + r"(?![\w.-])")
            if pattern.search(text):
                return pattern.sub(lambda _: new, text)
        return text

    def rel(path):
        return None if path is None else Path(os.path.relpath(Path(path).resolve(), base))

    segments = [dataclasses.replace(s, path=rel(s.path), problem=rewrite(s.problem))
                for s in history.segments]
    return (dataclasses.replace(history, path=rel(history.path), segments=segments,
                                warnings=[rewrite(w) for w in history.warnings]), rewrite)


def _run(args) -> int:
    _cli_settings(args)  # bad options fail before anything is read
    if args.detector_modules:
        from ..analysis.detectors import import_detector_modules

        import_detector_modules(args.detector_modules, "--detector-modules")
    with renamed_fields({"segment": "--segment", "source": "--source"}):
        hist = load_history(args.run_dir, source=args.source,
                            use_leet=False if args.no_leet else None, segment=args.segment)
    settings, sources, warnings = resolve_settings(hist, args)
    running = training_now(args.run_dir)
    if running is not None:  # said in report.md (Input) and on stderr
        hist.warnings.insert(0, f"the run is still training ({running}): this report covers the "
                                "epochs logged so far; run the same command again when it has "
                                "finished")
    want = Path(args.out) if args.out else _default_out(args.run_dir)
    if want.exists() and not want.is_dir():
        raise ConfigError("--out", "is a file, not a directory", value=str(want))
    out = free_report_dir(want, force=args.force)
    _print_input(hist)
    _print_settings(settings, sources)
    for w in hist.warnings + warnings:
        print(f"warning: {w}", file=sys.stderr)
    if out != want:
        print(f"note: {want} already holds a report (kept); writing to {out} "
              "(--force overwrites)", file=sys.stderr)
    store = find_store(args.run_dir)
    units, problems = load_units(store)
    if store is not None:
        print(f"per-unit records: {store} ({', '.join(sorted(units)) or 'none usable'})")
    for p in problems:
        print(f"warning: {p} — not used; that metric's events come from its logged curve alone",
              file=sys.stderr)
    saved = Path(args.settings) if args.settings else find_saved_settings(hist)[1]
    metric_keys, missing = saved_keys_and_detectors(saved)
    unloaded = [m for m in saved_detector_modules(saved) if m not in sys.modules]
    if unloaded:  # a results file never makes this command import code
        print(f"warning: the run's event detectors of {', '.join(unloaded)} are not run: pass "
              f"--detector-modules {' '.join(unloaded)} to import them", file=sys.stderr)
    for det, ks in missing.items():
        print(f"warning: the run's event detector {det!r} (on {', '.join(map(str, ks))}) is not "
              "registered here: it is not run", file=sys.stderr)
    shown, rewrite = _portable(hist, out, args.run_dir)  # no machine path in the report
    res = write_report(shown, out, settings_sources={k: rewrite(v) for k, v in sources.items()},
                       units=units, unit_problems=[rewrite(p) for p in problems],
                       metric_keys=metric_keys, **settings)
    a = res["analysis"]
    for e in a.events:
        print(" -", e.describe())
    for e in a.undecided:
        print(" -", e.describe())
    if a.regime is not None:
        print(f" - regime: {a.regime.name}")
    print(f"wrote {res['markdown']}" + "".join(f", {f}" for f in res["figures"]))
    if hist.incomplete:
        print(f"warning: incomplete input: the report in {out} covers only what could be read",
              file=sys.stderr)
        return 1
    return 1 if problems else 0


def _names_sweep(argv: Sequence[str]) -> bool:
    """True when a positional argument is a sweep directory (it holds ``sweep_results.json``)
    or that file: ``report`` then writes the sweep report (:mod:`lightning_pfd.analysis.sweep_report`)."""
    from ..analysis.sweep_report import is_sweep_dir

    return any(not a.startswith("-") and is_sweep_dir(a) for a in argv)


def _report(argv: list) -> int:
    if argv and argv[0] == "report" and len(argv) > 1:
        argv = argv[1:]
    if _names_sweep(argv):  # a sweep: its own report
        from ..analysis.sweep_report import main as sweep_main

        return sweep_main(argv)
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError:  # (a MissingFileError is an OSError too)
        raise
    except OSError as err:  # a write names its output file (lightning_pfd.atomic), a read its input
        if err.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise ConfigError(str(err.filename or args.out or args.run_dir),
                              f"cannot be written: {err.strerror} (no space or over the file-size limit)",
                              suggestion="free space or choose another --out; the run's own files "
                              "are read only and unchanged") from err
        raise ConfigError(str(err.filename or args.run_dir), str(err.strerror or err)) from err


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m lightning_pfd report``; returns the exit status (0 written,
    1 written from incomplete input, 2 error: one line on stderr, no traceback)."""
    return run_guarded(_report, argv, prog=None, hint=False)  # the bare one-line block


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
