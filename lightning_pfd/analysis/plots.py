"""Training-dynamics figures in the style of the papers (matplotlib, Agg canvas, no pyplot).

- :func:`plot_dynamics` — PFD paper Fig. 4 (top): E_gen, E_mem (left axis) and ℓ_train, ℓ_test
  (right axis) vs epoch, plus ℓ_test − ℓ_train (App. C.6) in a second row; events marked.
- :func:`plot_icr_memorization` — ICR paper Fig. 5 (left): ICR (blue, left axis) and the
  memorization ratio (red, right axis) vs epoch; the ICR minimum and memorization onset marked.

Both take ``series = {metric name: (epochs, values)}`` (see
:meth:`lightning_pfd.analysis.history.History.series_dict`) and a list of
:class:`~lightning_pfd.analysis.events.Event`, draw the raw values faintly and the smoothed curve
(the one the detectors use) solidly, say which is which in the legend, write a PNG and return
its path, or None when none of the needed metrics is present. Every axis names its quantity and
unit; titles and y labels are wrapped to fit (:func:`fit_titles`). :func:`build_dynamics` /
:func:`build_icr_memorization` return the Figure without writing it. Figures are built on an Agg
canvas directly, so importing this module never changes the user's matplotlib backend.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import re
import textwrap

import numpy as np

from ..atomic import atomic_open
from .events import DEFAULT_KEYS
from .smoothing import smooth

__all__ = ["plot_dynamics", "plot_icr_memorization", "build_dynamics", "build_icr_memorization",
           "EVENT_STYLE", "fit_text", "fit_titles", "event_label", "PFD_LABEL", "LOSS_LABEL"]

#: colour / line style / label of each event marker.
EVENT_STYLE = {
    "early_learning": ("tab:green", "--", "early learning (E_gen min)"),
    "double_descent": ("tab:purple", "-.", "double descent (E_gen peak)"),
    "memorization_onset": ("tab:red", ":", "memorization onset"),
    "icr_minimum": ("tab:blue", (0, (1, 3)), "ICR minimum"),
}
#: style of an event without an entry in EVENT_STYLE (e.g. ``<key slug>_<detector>``)
OTHER_EVENT_STYLE = ("tab:gray", (0, (3, 1, 1, 1)))

#: axis labels: the quantity and its unit
PFD_LABEL = "PFD (Ψ-space distance)"
LOSS_LABEL = "denoising loss (dimensionless)"
GAP_LABEL = r"$\ell_{test}-\ell_{train}$ (dimensionless)"

_MATH = re.compile(r"\$[^$]*\$")
_NBSP = "\u00a0"


def _wrap(text: str, width: int) -> str:
    """``textwrap.fill`` that never breaks inside ``$...$`` (mathtext) or existing lines."""
    guarded = _MATH.sub(lambda m: m.group(0).replace(" ", _NBSP), text)
    lines = [textwrap.fill(ln, width, break_long_words=False, break_on_hyphens=False) or ln
             for ln in guarded.split("\n")]
    return "\n".join(lines).replace(_NBSP, " ")


def _length(artist, renderer) -> float:
    """Rendered length in pixels along the text's direction (height for a vertical label)."""
    box = artist.get_window_extent(renderer)
    return box.height if round(artist.get_rotation()) % 180 == 90 else box.width


def fit_text(fig, artist, max_width: Optional[float] = None) -> None:
    """Wrap ``artist``'s text at spaces until its rendered length (along its direction) is at
    most ``max_width`` pixels (default: 96 % of the figure's width), measured with the figure's
    renderer."""
    text = artist.get_text()
    if not text:
        return
    renderer = fig.canvas.get_renderer()
    limit = 0.96 * fig.bbox.width if max_width is None else float(max_width)
    width = max(len(ln) for ln in text.split("\n"))
    while _length(artist, renderer) > limit and width > 12:
        width = int(width * 0.9)
        artist.set_text(_wrap(text, width))


def fit_titles(fig, figure_texts: Sequence = ()) -> None:
    """After a first layout pass: :func:`fit_text` on ``figure_texts`` (e.g. the Text that
    ``fig.suptitle`` returned; the figure's width), on every axes title (its axes' width) and
    y label (its axes' height); then a second layout pass."""
    fig.draw_without_rendering()
    for t in figure_texts:
        fit_text(fig, t)
    for ax in fig.axes:
        box = ax.get_window_extent()
        fit_text(fig, ax.title, max(box.width, 0.3 * fig.bbox.width))
        fit_text(fig, ax.yaxis.label, max(box.height, 0.2 * fig.bbox.height))
    fig.draw_without_rendering()


def event_label(name: str) -> str:
    """Legend label of an event: its :data:`EVENT_STYLE` label, else its name in words."""
    return EVENT_STYLE[name][2] if name in EVENT_STYLE else name.replace("_", " ")


def _figure(nrows: int, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, height), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, axes


def _curve(ax, xy, color, label, window, ls="-", se=None):
    """Raw values faint, the smoothed curve solid (labelled so, with its window), and a ±1
    standard-error band around the raw values when ``se`` = (epochs, s.e.) was logged."""
    x, y = (np.asarray(a, dtype=np.float64) for a in xy)
    ax.plot(x, y, color=color, alpha=0.3, lw=0.8, ls=ls)
    if se is not None:
        xe, e = (np.asarray(a, dtype=np.float64) for a in se)
        common, i, j = np.intersect1d(x, xe, return_indices=True)
        if common.size:
            ax.fill_between(common, y[i] - e[j], y[i] + e[j], color=color, alpha=0.15, lw=0,
                            label=None)
    smoothed = window > 1 and y.size >= 3
    s = smooth(y, window) if smoothed else y
    return ax.plot(x, s, color=color, lw=1.8, ls=ls,
                   label=f"{label} (smoothed, {window} epochs)" if smoothed else f"{label} (raw)")[0]


def _raw_key(ax, lines) -> list:
    """A legend entry for the faint raw curves (one for all), when some curve was smoothed."""
    if not any("(smoothed" in ln.get_label() for ln in lines):
        return []
    return [ax.plot([], [], color="0.4", alpha=0.3, lw=0.8, label="faint: raw values, per epoch")[0]]


def _mark_events(axes, events: Sequence, names: Optional[Sequence[str]] = None):
    """A vertical line per event (``names`` None: every event) on every axes; returns
    (handle, legend label) pairs."""
    handles = []
    for ev in events:
        if names is not None and ev.name not in names:
            continue
        color, ls = EVENT_STYLE[ev.name][:2] if ev.name in EVENT_STYLE else OTHER_EVENT_STYLE
        for ax in axes:
            h = ax.axvline(float(ev.epoch), color=color, ls=ls, lw=1.3, alpha=0.9)
        handles.append((h, f"{event_label(ev.name)}: epoch {ev.epoch:g}"))
    return handles


def _legend_below(fig, lines, marks) -> None:
    """One legend under the axes (curves, then events), in two columns: it covers no data."""
    fig.legend(lines + [h for h, _ in marks], [ln.get_label() for ln in lines] + [lab for _, lab in marks],
               fontsize=7, loc="outside lower center", ncols=2)


def _save(fig, path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        fig.savefig(f, dpi=120, format="png")
    return str(path)


def _integer_epochs(fig) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _gap_of(have: dict):
    gap = have["gap"]
    if gap is None and have["loss_train"] is not None and have["loss_test"] is not None:
        (xt, lt), (xs, ls) = have["loss_train"], have["loss_test"]
        common, it, is_ = np.intersect1d(np.asarray(xt, float), np.asarray(xs, float),
                                         return_indices=True)
        if common.size:
            gap = (common, np.asarray(ls, float)[is_] - np.asarray(lt, float)[it])
    return gap


def _egen_minimum(ax, xy):
    """The raw E_gen minimum (whatever the events), as a marker; None when no value is finite."""
    xg, yg = (np.asarray(a, dtype=np.float64) for a in xy)
    if not np.isfinite(yg).any():
        return None
    i = int(np.nanargmin(yg))
    return ax.plot([xg[i]], [yg[i]], "v", color="tab:blue", ms=7, zorder=5,
                   label=f"$\\mathcal{{E}}_{{gen}}$ minimum {yg[i]:.3g} (raw, epoch {xg[i]:g})")[0]


def build_dynamics(series: Mapping[str, tuple], events: Sequence = (), *,
                   keys: Optional[Mapping[str, str]] = None, window: int = 5,
                   title: Optional[str] = None):
    """The Figure of :func:`plot_dynamics` (None when nothing to draw); every event is marked."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    have = {r: series.get(k[r]) for r in ("e_gen", "e_mem", "loss_train", "loss_test", "gap")}
    if all(v is None for v in have.values()):
        return None
    gap = _gap_of(have)
    fig, axes = _figure(2 if gap is not None else 1, 7.0 if gap is not None else 4.8)
    ax = axes[0]
    lines = []
    if have["e_gen"] is not None:
        lines.append(_curve(ax, have["e_gen"], "tab:blue", r"$\mathcal{E}_{gen}$", window,
                            se=series.get(k["e_gen"] + "_se")))
    if have["e_mem"] is not None:
        lines.append(_curve(ax, have["e_mem"], "tab:orange", r"$\mathcal{E}_{mem}$", window,
                            se=series.get(k["e_mem"] + "_se")))
    if have["e_gen"] is not None:
        lines += [m for m in [_egen_minimum(ax, have["e_gen"])] if m is not None]
    twin = have["loss_train"] is not None or have["loss_test"] is not None
    left = (r"left axis, solid: $\mathcal{E}_{gen}$, $\mathcal{E}_{mem}$" + "\n") if twin else ""
    ax.set_ylabel(left + (PFD_LABEL if not any(series.get(k[r] + "_se") for r in ("e_gen", "e_mem"))
                          else PFD_LABEL + "\nband: ±1 s.e. over seeds"))
    if twin:  # the two scales differ: each axis label names its curves
        ax2 = ax.twinx()
        if have["loss_train"] is not None:
            lines.append(_curve(ax2, have["loss_train"], "tab:gray", r"$\ell_{train}$", window, "--"))
        if have["loss_test"] is not None:
            lines.append(_curve(ax2, have["loss_test"], "black", r"$\ell_{test}$", window, "--"))
        ax2.set_ylabel(r"right axis, dashed: $\ell_{train}$, $\ell_{test}$" + "\nfixed-noise " + LOSS_LABEL)
    lines += _raw_key(ax, lines)
    marks = _mark_events(axes, events)
    _legend_below(fig, lines, marks)
    ax.set_title(title or "Training dynamics (PFD paper Fig. 4)", fontsize=10)
    if gap is not None:
        g = [_curve(axes[1], gap, "tab:brown", r"$\ell_{test}-\ell_{train}$", window)]
        axes[1].axhline(0.0, color="k", lw=0.5)
        axes[1].set_ylabel(GAP_LABEL)
        axes[1].legend(handles=g + _raw_key(axes[1], g), fontsize=7, loc="best")
    axes[-1].set_xlabel("epoch")
    _integer_epochs(fig)
    fit_titles(fig)
    return fig


def plot_dynamics(series: Mapping[str, tuple], events: Sequence = (), path="dynamics.png", *,
                  keys: Optional[Mapping[str, str]] = None, window: int = 5,
                  title: Optional[str] = None) -> Optional[str]:
    """PFD paper Fig. 4: E_gen, E_mem, ℓ_train, ℓ_test vs epoch (+ gap row), the raw E_gen
    minimum and every event marked; returns the PNG path or None when neither E_gen/E_mem nor
    the losses were logged."""
    fig = build_dynamics(series, events, keys=keys, window=window, title=title)
    return None if fig is None else _save(fig, path)


def build_icr_memorization(series: Mapping[str, tuple], events: Sequence = (), *,
                           keys: Optional[Mapping[str, str]] = None, window: int = 5,
                           title: Optional[str] = None):
    """The Figure of :func:`plot_icr_memorization` (None when nothing to draw)."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    icr, ratio = series.get(k["icr"]), series.get(k["mem_ratio"])
    if icr is None and ratio is None:
        return None
    fig, axes = _figure(1, 4.6)
    ax = axes[0]
    lines = []
    if icr is not None:
        lines.append(_curve(ax, icr, "tab:blue", "ICR", window, se=series.get(k["icr"] + "_se")))
        ax.set_ylabel("ICR (dimensionless)", color="tab:blue")
    if ratio is not None:
        ax2 = ax.twinx() if icr is not None else ax
        lines.append(_curve(ax2, ratio, "tab:red", "memorization ratio", window,
                            se=series.get(k["mem_ratio"] + "_se")))
        ax2.set_ylabel("memorization ratio (fraction of samples)", color="tab:red")
    lines += _raw_key(ax, lines)
    marks = _mark_events(axes, events, ("icr_minimum", "memorization_onset"))
    _legend_below(fig, lines, marks)
    ax.set_title(title or "ICR and memorization (ICR paper Fig. 5)", fontsize=10)
    ax.set_xlabel("epoch")
    _integer_epochs(fig)
    fit_titles(fig)
    return fig


def plot_icr_memorization(series: Mapping[str, tuple], events: Sequence = (),
                          path="icr_memorization.png", *, keys: Optional[Mapping[str, str]] = None,
                          window: int = 5, title: Optional[str] = None) -> Optional[str]:
    """ICR paper Fig. 5: ICR (left axis) and memorization ratio (right axis) vs epoch, the ICR
    minimum and memorization onset marked; returns the PNG path or None when neither metric was
    logged."""
    fig = build_icr_memorization(series, events, keys=keys, window=window, title=title)
    return None if fig is None else _save(fig, path)
