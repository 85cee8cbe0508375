"""Training-dynamics figures in the style of the papers (matplotlib, Agg canvas, no pyplot).

- :func:`plot_dynamics` — PFD paper Fig. 4 (top): E_gen, E_mem (left axis) and ℓ_train, ℓ_test
  (right axis) vs epoch, plus ℓ_test − ℓ_train (App. C.6) in a second row; events marked.
- :func:`plot_icr_memorization` — ICR paper Fig. 5 (left): ICR (blue, left axis) and the
  memorization ratio (red, right axis) vs epoch; the ICR minimum and memorization onset marked.

Both take ``series = {metric name: (epochs, values)}`` (see
:meth:`lightning_pfd.analysis.history.History.series_dict`) and a list of
:class:`~lightning_pfd.analysis.events.Event`, draw the raw values faintly and the smoothed curve
(the one the detectors use) solidly, write a PNG and return its path, or None when none of the
needed metrics is present. Figures are built on an Agg canvas directly, so importing this module
never changes the user's matplotlib backend.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from .events import DEFAULT_KEYS
from .smoothing import smooth

__all__ = ["plot_dynamics", "plot_icr_memorization", "EVENT_STYLE"]

#: colour / line style / label of each event marker.
EVENT_STYLE = {
    "early_learning": ("tab:green", "--", "early learning (E_gen min)"),
    "double_descent": ("tab:purple", "-.", "double descent (E_gen peak)"),
    "memorization_onset": ("tab:red", ":", "memorization onset"),
    "icr_minimum": ("tab:blue", (0, (1, 3)), "ICR minimum"),
}


def _figure(nrows: int, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, height), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, axes


def _curve(ax, xy, color, label, window, ls="-", se=None):
    """Raw values faint, the smoothed curve solid (labelled so), and a ±1 standard-error band
    around the raw values when ``se`` = (epochs, s.e.) was logged."""
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
                   label=f"{label} (smoothed)" if smoothed else label)[0]


def _mark_events(axes, events: Sequence, names: Sequence[str]):
    handles = []
    for ev in events:
        if ev.name not in names or ev.name not in EVENT_STYLE:
            continue
        color, ls, label = EVENT_STYLE[ev.name]
        for ax in axes:
            h = ax.axvline(float(ev.epoch), color=color, ls=ls, lw=1.3, alpha=0.9)
        handles.append((h, f"{label}: epoch {ev.epoch:g}"))
    return handles


def _save(fig, path) -> str:
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return str(path)


def plot_dynamics(series: Mapping[str, tuple], events: Sequence = (), path="dynamics.png", *,
                  keys: Optional[Mapping[str, str]] = None, window: int = 5,
                  title: Optional[str] = None) -> Optional[str]:
    """PFD paper Fig. 4: E_gen, E_mem, ℓ_train, ℓ_test vs epoch (+ gap row); returns the PNG
    path or None when neither E_gen/E_mem nor the losses were logged."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    have = {r: series.get(k[r]) for r in ("e_gen", "e_mem", "loss_train", "loss_test", "gap")}
    if all(v is None for v in have.values()):
        return None
    gap = have["gap"]
    if gap is None and have["loss_train"] is not None and have["loss_test"] is not None:
        (xt, lt), (xs, ls) = have["loss_train"], have["loss_test"]
        common, it, is_ = np.intersect1d(np.asarray(xt, float), np.asarray(xs, float),
                                         return_indices=True)
        if common.size:
            gap = (common, np.asarray(ls, float)[is_] - np.asarray(lt, float)[it])
    fig, axes = _figure(2 if gap is not None else 1, 6.0 if gap is not None else 3.8)
    ax = axes[0]
    lines = []
    if have["e_gen"] is not None:
        lines.append(_curve(ax, have["e_gen"], "tab:blue", r"$\mathcal{E}_{gen}$", window,
                            se=series.get(k["e_gen"] + "_se")))
    if have["e_mem"] is not None:
        lines.append(_curve(ax, have["e_mem"], "tab:orange", r"$\mathcal{E}_{mem}$", window,
                            se=series.get(k["e_mem"] + "_se")))
    if have["e_gen"] is not None:  # the raw E_gen minimum, marked whatever the events
        xg, yg = (np.asarray(a, dtype=np.float64) for a in have["e_gen"])
        if np.isfinite(yg).any():
            i = int(np.nanargmin(yg))
            lines.append(ax.plot([xg[i]], [yg[i]], "v", color="tab:blue", ms=7,
                                 label=f"$\\mathcal{{E}}_{{gen}}$ minimum {yg[i]:.3g} (raw, epoch {xg[i]:g})")[0])
    ax.set_ylabel("PFD (band: ±1 s.e. over seeds)")
    if have["loss_train"] is not None or have["loss_test"] is not None:
        ax2 = ax.twinx()
        if have["loss_train"] is not None:
            lines.append(_curve(ax2, have["loss_train"], "tab:gray", r"$\ell_{train}$", window, "--"))
        if have["loss_test"] is not None:
            lines.append(_curve(ax2, have["loss_test"], "black", r"$\ell_{test}$", window, "--"))
        ax2.set_ylabel("denoising loss (fixed noise)")
    marks = _mark_events(axes, events, ("early_learning", "double_descent", "memorization_onset"))
    handles = lines + [h for h, _ in marks]
    labels = [ln.get_label() for ln in lines] + [lab for _, lab in marks]
    ax.legend(handles, labels, fontsize=7, loc="best")
    ax.set_title(title or "Training dynamics (PFD paper Fig. 4)", fontsize=10)
    if gap is not None:
        _curve(axes[1], gap, "tab:brown", r"$\ell_{test}-\ell_{train}$", window)
        axes[1].axhline(0.0, color="k", lw=0.5)
        axes[1].set_ylabel(r"$\ell_{test}-\ell_{train}$")
        axes[1].legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("epoch")
    return _save(fig, path)


def plot_icr_memorization(series: Mapping[str, tuple], events: Sequence = (),
                          path="icr_memorization.png", *, keys: Optional[Mapping[str, str]] = None,
                          window: int = 5, title: Optional[str] = None) -> Optional[str]:
    """ICR paper Fig. 5: ICR (left axis) and memorization ratio (right axis) vs epoch; returns
    the PNG path or None when neither metric was logged."""
    k = dict(DEFAULT_KEYS, **(keys or {}))
    icr, ratio = series.get(k["icr"]), series.get(k["mem_ratio"])
    if icr is None and ratio is None:
        return None
    fig, axes = _figure(1, 3.8)
    ax = axes[0]
    lines = []
    if icr is not None:
        lines.append(_curve(ax, icr, "tab:blue", "ICR", window, se=series.get(k["icr"] + "_se")))
        ax.set_ylabel("ICR", color="tab:blue")
    if ratio is not None:
        ax2 = ax.twinx() if icr is not None else ax
        lines.append(_curve(ax2, ratio, "tab:red", "memorization ratio", window,
                            se=series.get(k["mem_ratio"] + "_se")))
        ax2.set_ylabel("memorization ratio", color="tab:red")
    marks = _mark_events(axes, events, ("icr_minimum", "memorization_onset"))
    ax.legend(lines + [h for h, _ in marks],
              [ln.get_label() for ln in lines] + [lab for _, lab in marks], fontsize=7, loc="best")
    ax.set_title(title or "ICR and memorization (ICR paper Fig. 5)", fontsize=10)
    ax.set_xlabel("epoch")
    return _save(fig, path)
