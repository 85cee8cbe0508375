"""The training-dynamics report of a run: figures + markdown + events (library side of
``python -m lightning_pfd report``, whose command line is :mod:`lightning_pfd.commands.report`).

:func:`write_report` analyses a history (:mod:`lightning_pfd.analysis.history`: a W&B offline
run or CSVLogger logs, the segments of a resumed run merged by epoch; or ``{name: (epochs,
values)}``) and writes into a directory:

- ``dynamics.png`` — PFD paper Fig. 4: E_gen, E_mem, ℓ_train, ℓ_test and ℓ_test − ℓ_train vs epoch;
- ``icr_memorization.png`` — ICR paper Fig. 5: ICR and memorization ratio vs epoch;
- ``report.md`` — input read, regime, detected events (epoch, significance), per-metric summary
  (the curve of every role plus every other key of the run with a direction or detectors,
  :mod:`lightning_pfd.keys`: a user metric declared there appears without touching this file),
  detector settings with where each came from;
- ``events.json`` — the same, machine-readable.

**Never destroys** (:func:`free_report_dir`): a directory that already holds a report
(``report.md``, ``events.json`` or one of the PNGs) is kept; the caller writes to the first free
sibling ``<out>-2``, ``<out>-3``, ... unless it forces.

**Settings of the run.** RegimeMonitor saves its detector settings (keys, window, min_sigma,
min_rel, confirm, require_descent) with :func:`save_detector_settings` as
``detector_settings.json`` (:data:`SETTINGS_FILE`) in its report directory and in the run
directory of each logger; :func:`find_saved_settings` reads them back from the run's segment
directories, so a later report reproduces the run's analysis. :func:`check_settings` validates
them. The RegimeMonitor callback calls :func:`write_report` at the end of fit.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import keys as keys_registry
from ..atomic import atomic_write
from ..errors import ConfigError, renamed_fields
from ..validation import check_args
from .events import DEFAULT_KEYS, MIN_SIGMA, RunAnalysis, analyze_history, describe_transient
from .history import History

__all__ = ["write_report", "render_markdown", "SETTINGS_FILE", "saved_metric_keys",
           "DEFAULT_SETTINGS", "check_settings", "save_detector_settings",
           "load_detector_settings", "find_saved_settings", "free_report_dir", "holds_report"]

#: name of the file holding the detector settings a run was made with.
SETTINGS_FILE = "detector_settings.json"
#: the settings used when neither the run nor the command line gives one.
DEFAULT_SETTINGS = {"keys": dict(DEFAULT_KEYS), "window": 5, "min_sigma": MIN_SIGMA, "min_rel": 0.0,
                    "confirm": 3, "require_descent": True}
#: files that make a directory "hold a report".
REPORT_FILES = ("report.md", "events.json", "dynamics.png", "icr_memorization.png")
_FIGURES = ("dynamics.png", "icr_memorization.png")
_FORMAT = 1

_EXPLAIN = {
    "early_learning": "E_gen reaches an interior minimum, then rises until the end (PFD paper §4.2)",
    "double_descent": "E_gen decreases, increases, decreases again (PFD paper §4.2)",
    "icr_minimum": "ICR is U-shaped; its minimum is the early-stopping point (ICR paper §5.2)",
    "memorization_onset": "memorization starts: the memorization ratio rises and holds (needs a memorization signal)",
}


# ----------------------------------------------------------------------------- settings
def check_settings(settings: dict) -> dict:
    """Validated copy of (a subset of) the detector settings; the
    :class:`~lightning_pfd.errors.ConfigError` raised for a bad value names the setting
    (``window``; a caller maps it to where it was given: ``--window``, a file's ``window``).
    Unknown names are an error too. The ranges are those
    :func:`~lightning_pfd.analysis.events.analyze_history` declares for its arguments."""
    for name, v in settings.items():
        if name not in DEFAULT_SETTINGS:
            raise ConfigError(name, "unknown detector setting", value=name,
                              accepted=list(DEFAULT_SETTINGS))
        if name == "keys":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise ConfigError(name, "must map roles to metric names", value=v)
            unknown = sorted(set(v) - set(DEFAULT_KEYS))
            if unknown:
                raise ConfigError(name, "unknown role", value=unknown[0],
                                  accepted=list(DEFAULT_KEYS))
        elif name == "require_descent" and not isinstance(v, bool):
            raise ConfigError(name, "must be true or false", value=v)
    check_args(analyze_history, settings)
    return {name: dict(v) if name == "keys" else float(v) if name in ("min_sigma", "min_rel") else v
            for name, v in settings.items()}


def save_detector_settings(directory, settings: dict, **meta) -> Path:
    """Write ``directory/detector_settings.json`` atomically (:func:`lightning_pfd.atomic.atomic_write`):
    ``{"format": 1, "settings": {...}, **meta}`` (meta: who wrote it, its state key, ...)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    record = dict(format=_FORMAT, settings=check_settings(settings), **meta)
    path = d / SETTINGS_FILE
    atomic_write(path, json.dumps(record, indent=2, default=str) + "\n")
    return path


def saved_metric_keys(path) -> keys_registry.KeySet:
    """The run's keys saved in a ``detector_settings.json`` (``metric_keys``: the keys its
    callbacks declared beyond the built-in ones, written by
    :class:`~lightning_pfd.callbacks.regime.RegimeMonitor`) plus the built-in ones; just the
    built-in ones for ``path`` None or a file without that entry."""
    return saved_keys_and_detectors(path)[0]


def saved_keys_and_detectors(path) -> tuple:
    """(:func:`saved_metric_keys`, the detectors the keys name that are not registered in this
    process, {detector: [keys]}): a user detector whose module was not imported (``report
    --detector-modules``) is left out of its key, named here, and never imported by a file."""
    if path is None:
        return keys_registry.BUILTIN, {}
    known = set(keys_registry.known_detectors())
    missing: dict = {}
    try:
        record = json.loads(Path(path).read_text())
        declared = []
        for d in record.get("metric_keys", []):
            dets = (d.get("detectors") or ())
            dets = (dets,) if isinstance(dets, str) else tuple(dets)
            for det in dets:
                if det not in known:
                    missing.setdefault(det, []).append(d.get("key"))
            declared.append(keys_registry.MetricKey(**dict(d, detectors=tuple(x for x in dets if x in known))))
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ConfigError(str(path), f"metric_keys: not a list of metric-key definitions ({err})") from None
    return keys_registry.BUILTIN.with_keys(*declared), missing


def saved_detector_modules(path) -> list:
    """The modules whose detectors the run used (``detector_modules`` of its settings file)."""
    try:
        return list(json.loads(Path(path).read_text()).get("detector_modules", [])) if path else []
    except (OSError, ValueError, AttributeError):
        return []


def load_detector_settings(path) -> dict:
    """The validated settings of a ``detector_settings.json``; a file that is not valid JSON or
    holds a bad value raises :class:`~lightning_pfd.errors.ConfigError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("path", f"{str(path)!r} does not exist")
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(str(path), f"not a valid settings file ({err})") from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ConfigError(str(path), "not a detector settings file (no 'settings' object)")
    with renamed_fields({name: f"{path}: {name}" for name in record["settings"]}):
        return check_settings(record["settings"])


def find_saved_settings(history: History) -> tuple:
    """``(settings, path, warnings)`` saved with the run: the ``detector_settings.json`` of the
    latest segment that has one, in its directory or its ``report/`` subdirectory; ``({}, None,
    [])`` when none is found. A warning is returned when segments saved different settings."""
    found = []
    for seg in reversed(history.segments):
        for d in (seg.path.parent, seg.path.parent / "report"):
            if (d / SETTINGS_FILE).is_file():
                found.append(d / SETTINGS_FILE)
                break
    if not found:
        return {}, None, []
    chosen = load_detector_settings(found[0])
    differ = [str(f) for f in found[1:] if load_detector_settings(f) != chosen]
    warnings = [f"segments of this run were analysed with different detector settings "
                f"({', '.join(differ)}); using those of the latest one ({found[0]})"] if differ \
        else []
    return chosen, found[0], warnings


# ----------------------------------------------------------------------------- output dir
def holds_report(directory, files: Sequence[str] = REPORT_FILES) -> bool:
    """True when ``directory`` holds any of the report ``files`` (default: report.md,
    events.json, the PNGs)."""
    d = Path(directory)
    return any((d / n).exists() for n in files)


def free_report_dir(out, force: bool = False, files: Sequence[str] = REPORT_FILES) -> Path:
    """``out`` when it holds none of the report ``files`` (or ``force``), else the first
    ``<out>-2``, ``<out>-3`` ... that holds none: an existing report is never overwritten
    without ``force``. (A sweep report passes its own files as well.)"""
    out = Path(out)
    if force or not holds_report(out, files):
        return out
    i = 2
    while holds_report(out.with_name(f"{out.name}-{i}"), files):
        i += 1
    return out.with_name(f"{out.name}-{i}")


# ----------------------------------------------------------------------------- markdown
def format_value(v, digits=4) -> str:
    """A value as the reports print it (integers as such, booleans lower-case, ``digits``
    significant digits, "—" for None)."""
    if v is None:
        return "—"
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    if isinstance(v, bool):
        return str(v).lower()
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e9 else f"{v:.{digits}g}"


def _report_names(series: dict, keys: dict, metric_keys: keys_registry.KeySet) -> list:
    """``[(label, name)]`` of the metrics the report tabulates: the curve of every role, then
    every other key of ``metric_keys`` that has a direction or event detectors (quality
    metrics, user metrics; not the diagnostics), in declaration order."""
    out = [(metric_keys.display(name) if metric_keys.find(name) else role, name)
           for role, name in keys.items() if name in series]
    taken = {n for _, n in out}
    for mk in metric_keys.all_keys():
        if mk.key in series and mk.key not in taken and mk.group != "events" \
                and (mk.lower_is_better is not None or mk.detectors):
            out.append((mk.display, mk.key))
    return out


def _metric_rows(series: dict, keys: dict, metric_keys: keys_registry.KeySet) -> list:
    rows = []
    for label, name in _report_names(series, keys, metric_keys):
        x, y = series[name]
        i = int(np.argmin(y))
        j = int(np.argmax(y))
        rows.append(f"| {label} | `{name}` | {len(x)} | {format_value(y[0])} | "
                    f"{format_value(y[i])} (epoch {format_value(x[i])}) | {format_value(y[j])} (epoch {format_value(x[j])}) | "
                    f"{format_value(y[-1])} |")
    return rows


def _input_info(history) -> Optional[dict]:
    """What was read, for report.md / events.json (None for in-memory series)."""
    if not isinstance(history, History) or not history.segments:
        return None
    return {"incomplete": history.incomplete, "warnings": list(history.warnings),
            "segments": [s.to_dict() for s in history.segments]}


def _epochs_text(ep) -> str:
    return "—" if ep is None else f"{format_value(ep[0])}–{format_value(ep[1])}"


def _input_md(info: Optional[dict]) -> tuple:
    """(banner lines for the top, "## Input" section lines)."""
    if not info:
        return [], []
    top = []
    if info["incomplete"]:
        top = ["> **Incomplete input** — a log file is truncated or corrupt; this report covers "
               "only what could be read:"] + \
              [f"> - {w}" for w in info["warnings"]] + [""]
    segs = info["segments"]
    sec = ["## Input", ""]
    if len(segs) > 1:
        sec += [f"{len(segs)} segments of one resumed run, oldest first; for every epoch the rows "
                "of the latest segment that has it are kept.", ""]
    sec += ["| segment | rows read | epochs | rows kept | note |", "|---|---|---|---|---|"]
    for s in segs:
        note = s["problem"] or ""
        if s["problem"]:
            note += " (re-run by a later segment)" if s["covered"] else " (**incomplete**)"
        elif s["finished"] is False and s is segs[-1]:
            note = "no exit record (running or interrupted)"
        ep = None if s["epochs"] is None else tuple(s["epochs"])
        sec.append(f"| `{s['path']}` | {s['rows_read']} | {_epochs_text(ep)} | "
                   f"{s['rows_kept']} | {note} |")
    sec.append("")
    if info["warnings"] and not info["incomplete"]:
        sec += [f"- {w}" for w in info["warnings"]] + [""]
    return top, sec


def _settings_md(settings: dict, sources: Optional[dict]) -> list:
    out = ["## Detector settings", "", "| setting | value | from |", "|---|---|---|"]
    for name, v in settings.items():
        if name == "keys":
            v = ", ".join(f"{r}=`{m}`" for r, m in v.items())
        else:
            v = f"`{format_value(v)}`"
        src = (sources or {}).get(name, "arguments")
        out.append(f"| {name} | {v} | {src} |")
    return out + ["", "(window in evaluations, min_sigma = the z each leg must reach on held-out seeds, min_rel relative to the "
                      "curve, confirm in evaluations; see docs/events.md.)", ""]


def _no_regime(series: dict, k: dict, confirm: int) -> str:
    """Why a finished run has no regime (:func:`~lightning_pfd.analysis.events.classify_regime`)."""
    if k["e_gen"] not in series or k["e_mem"] not in series:
        return "Not determined (needs both `%s` and `%s`)." % (k["e_gen"], k["e_mem"])
    (xg, yg), (xm, ym) = series[k["e_gen"]], series[k["e_mem"]]
    fg = {float(x) for x, y in zip(xg, yg) if math.isfinite(float(y))}
    n = len(fg & {float(x) for x, y in zip(xm, ym) if math.isfinite(float(y))})
    need = max(5, int(confirm) + 2)
    if n < need:
        return (f"Not determined: `{k['e_gen']}` and `{k['e_mem']}` have {n} common finite evaluation(s); "
                f"the regime needs at least {need} (max(5, confirm + 2)) to tell early learning apart.")
    return (f"Not determined: the end-of-run means of `{k['e_gen']}` and `{k['e_mem']}` are not both "
            "positive (the score is log E_gen / E_mem).")


def _regime_md(analysis: RunAnalysis, k: dict, series: Optional[dict] = None, confirm: int = 3) -> list:
    out = ["## Regime", ""]
    reg = analysis.regime
    if reg is None and getattr(analysis, "diverged", None):
        return out + ["Not classified: the run diverged (above).", ""]
    if reg is None:
        return out + [_no_regime(series or {}, k, confirm), ""]
    out += [f"**{reg.name}** — log(E_gen/E_mem) = {reg.score:.3f} at the end of training "
            f"(means of the last smoothed evaluations, so they differ from the last values in the "
            f"metric table below: E_gen = {format_value(reg.detail['e_gen_end'])}, "
            f"E_mem = {format_value(reg.detail['e_mem_end'])}"
            + ("" if reg.detail.get("mem_ratio_end") is None
               else f", memorization ratio = {format_value(reg.detail['mem_ratio_end'])}")
            + ("" if reg.detail.get("gap_end") is None
               else f", ℓ_test − ℓ_train = {format_value(reg.detail['gap_end'])}") + ").", ""]
    return out + [f"- {r}" for r in reg.reasons] + [""]


def _outcome_md(analysis: RunAnalysis) -> list:
    """The divergence banner: a diverged run never reads as a healthy one."""
    d = getattr(analysis, "diverged", None)
    if not d:
        return []
    step = f", step {d['step']}" if d.get("step") is not None else ""
    return ["> **DIVERGED** at epoch " f"{d['epoch']}{step}: {d.get('cause', 'non-finite loss or gradients')}; training "
            "stopped there. The measurements end before it, no event is confirmed from the diverged "
            "part and the regime is not classified. The numbers below describe the run up to the "
            "divergence, not a trained model.", ""]


def _events_md(analysis: RunAnalysis) -> list:
    out = ["## Events", ""]
    if analysis.events:
        out += ["| event | epoch | z (weakest leg) | legs: difference ± s.e. (z) | test | description |",
                "|---|---|---|---|---|---|"]
        for e in analysis.events:
            legs = "; ".join(f"{k} {format_value(v['diff'], 3)} ± {format_value(v['se'], 2)} ({format_value(v['z'], 3)})"
                             for k, v in e.detail.get("legs", {}).items())
            test = "held-out seeds" if e.detail.get("held_out") else "same values (no per-unit record)"
            out.append(f"| {e.name} | {format_value(e.epoch)} | {format_value(e.significance, 3)} | {legs} | {test} | "
                       f"{e.describe()} |")
        out.append("")
    else:
        out += ["No event passed its test (every leg z >= min_sigma).", ""]
    if analysis.undecided:
        out += ["**Undecided** (the test passed, but the noise model failed its check on this run, "
                "so the event is not confirmed):", ""]
        out += [f"- {e.name} at epoch {format_value(e.epoch)}: {e.reason}" for e in analysis.undecided] + [""]
    out += ["(z = (difference − selection allowance) / s.e., the s.e. = paired seed part + local "
            "training-noise part; docs/events.md.)", ""]
    spikes = getattr(analysis, "transients", [])
    if spikes:
        out += ["**Transients** (excursions of E_gen narrower than an event's minimum extent: a bad "
                "batch or a loss spike; never reported as an event):", ""]
        out += [f"- epoch {format_value(t['epoch'])}: {describe_transient(t)}" for t in spikes] + [""]
    found = {e.name for e in analysis.events} | {e.name for e in analysis.undecided}
    missing = [n for n in _EXPLAIN if n not in found]
    if missing:
        out += ["Not detected: " + "; ".join(f"{n} ({_EXPLAIN[n]})" for n in missing) + ".", ""]
    return out


def render_markdown(analysis: RunAnalysis, series: dict, *, figures: Sequence[str] = (),
                    keys: Optional[dict] = None, source: str = "", params: Optional[dict] = None,
                    title: str = "Training-dynamics report", settings: Optional[dict] = None,
                    sources: Optional[dict] = None, input_info: Optional[dict] = None,
                    unit_info: Optional[dict] = None,
                    metric_keys: Optional[keys_registry.KeySet] = None) -> str:
    """Markdown summary: incomplete-input banner, regime, events table, metric table (the roles'
    curves and the quality metrics of ``metric_keys``, default the built-in keys), input
    segments, figures, detector settings (``settings`` with their ``sources``; ``params`` is
    the older name for the numeric settings)."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    top, input_sec = _input_md(input_info)
    out = [f"# {title}", ""] + top
    if unit_info and unit_info.get("problems"):
        out += ["> **Per-unit records not used** (their metrics' events come from the logged curve "
                "alone, without a held-out test):", ""] + [f"> - {p}" for p in unit_info["problems"]] + [""]
    if unit_info is not None:
        held = ", ".join(f"`{k}`" for k in unit_info.get("metrics", [])) or "none"
        out += [f"Per-unit records (paired, held-out tests): {held}.", ""]
    if source:
        out += [f"Run: `{source}`", ""]
    confirm = (settings or params or {}).get("confirm", 3)
    out += _outcome_md(analysis) + _regime_md(analysis, k, series, confirm) + _events_md(analysis)
    rows = _metric_rows(series, k, keys_registry.BUILTIN if metric_keys is None else metric_keys)
    if rows:
        out += ["## Metrics", "", "| metric | key | evaluations | first | min | max | last |",
                "|---|---|---|---|---|---|---|"] + rows + [""]
    out += input_sec
    if figures:
        out += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures] + [""]
    shown = settings if settings is not None else params
    if shown:
        out += _settings_md(shown, sources)
    return "\n".join(out)


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def write_report(history: History | dict, out_dir, *, keys: Optional[dict] = None,
                 window: int = 5, min_sigma: float = MIN_SIGMA, min_rel: float = 0.0,
                 confirm: int = 3, require_descent: bool = True,
                 title: str = "Training-dynamics report",
                 analysis: Optional[RunAnalysis] = None,
                 settings_sources: Optional[dict] = None, units: Optional[dict] = None,
                 unit_problems: Sequence[str] = (), unit_keys: Optional[Sequence[str]] = None,
                 metric_keys: Optional[keys_registry.KeySet] = None) -> dict:
    """Analyze ``history`` (a :class:`History` or ``{name: (epochs, values)}``), write the PNGs,
    ``report.md`` and ``events.json`` into ``out_dir`` (overwriting a report there: callers that
    must not, like the ``report`` command, pick the directory with :func:`free_report_dir`);
    returns ``{"markdown": path, "json": path, "figures": [paths], "analysis": RunAnalysis}``.
    ``settings_sources``: where each setting came from, shown in the report; ``units``: the
    run's per-unit records ({metric: UnitSeries}, :func:`~lightning_pfd.analysis.per_unit.load_units`),
    ``unit_problems``: the records left out (shown in a banner and in ``events.json``);
    ``metric_keys``: the run's keys (:func:`lightning_pfd.keys.collect`; default the built-in
    ones): user keys get their detectors and a row in the metric table."""
    from .plots import plot_dynamics, plot_icr_memorization  # matplotlib only when writing

    series = history.series_dict() if isinstance(history, History) else dict(history)
    params = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    settings = dict(keys=dict(DEFAULT_KEYS, **(keys or {})), **params,
                    require_descent=require_descent)
    if analysis is None:
        analysis = analyze_history(series, keys=keys, require_descent=require_descent, units=units,
                                   metric_keys=metric_keys, **params)
    unit_info = {"metrics": sorted(unit_keys if unit_keys is not None else (units or {})),
                 "problems": list(unit_problems)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = [f for f in (
        plot_dynamics(series, analysis.events, out / _FIGURES[0], keys=keys, window=window),
        plot_icr_memorization(series, analysis.events, out / _FIGURES[1], keys=keys,
                              window=window),
    ) if f is not None]
    for stale in set(_FIGURES) - {Path(f).name for f in figs}:  # a figure of an older report
        (out / stale).unlink(missing_ok=True)
    source = str(history.path) if isinstance(history, History) and history.path else ""
    info = _input_info(history)
    md = render_markdown(analysis, series, figures=figs, keys=keys, source=source,
                         title=title, settings=settings, sources=settings_sources,
                         input_info=info, unit_info=unit_info, metric_keys=metric_keys)
    md_path, js_path = out / "report.md", out / "events.json"
    atomic_write(md_path, md)
    atomic_write(js_path, json.dumps(dict(analysis.to_dict(), params=params, settings=settings,
                                           settings_source=settings_sources, input=info,
                                           per_unit=unit_info),
                                      indent=2, default=_json_default))
    return {"markdown": str(md_path), "json": str(js_path), "figures": figs, "analysis": analysis}
