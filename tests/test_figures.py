"""Figures people read (issue 22, item 7), checked on the matplotlib Figure objects: every text
inside the figure (titles wrapped, not clipped), every axis naming its quantity with a unit, no
raw metric keys or command-line specs as labels, smoothed and raw curves told apart in the
legend, the raw E_gen minimum and every event marked."""
import re
import sys
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.text import Text

from lightning_pfd.analysis import sweep_report
from lightning_pfd.analysis.events import DEFAULT_KEYS, Event
from lightning_pfd.analysis.plots import build_dynamics, build_icr_memorization

sys.path.insert(0, str(Path(__file__).parent))
from test_sweep_analysis import _write_sweep  # noqa: E402 - a fake sweep directory

LONG = "a title far longer than the figure is wide, as a user may pass it, " * 3
RAW_KEY = re.compile("|".join(re.escape(v) for v in DEFAULT_KEYS.values()) + r"|\w+:\w+=")
UNIT = re.compile(r"\(.+\)")


def _tick_texts(fig) -> set:
    """Tick labels (matplotlib keeps some outside the view, undrawn): not checked here."""
    out = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                out |= {id(tick.label1), id(tick.label2)}
    return out


def clipped_texts(fig) -> list:
    """The visible, non-empty texts (titles, axis labels, legends) whose rendered box leaves
    the figure (1 px tolerance)."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    ticks = _tick_texts(fig)
    out = []
    for t in fig.findobj(Text):
        if id(t) in ticks or not t.get_visible() or not t.get_text().strip():
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append(t.get_text())
    return out


def axis_labels(fig) -> list:
    """(axes, x label, y label) of every axes holding data."""
    return [(ax, ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes if ax.lines or ax.collections]


def check_readable(fig) -> None:
    assert clipped_texts(fig) == []
    for ax, xl, yl in axis_labels(fig):
        assert yl.strip() and UNIT.search(yl), f"y label without a unit: {yl!r}"
        assert not RAW_KEY.search(yl) and not RAW_KEY.search(xl), (xl, yl)
        if xl and xl != "epoch":  # epochs are a count
            assert UNIT.search(xl), f"x label without a unit: {xl!r}"
    assert any(xl for _, xl, _ in axis_labels(fig))
    for t in fig.findobj(Text):
        assert not RAW_KEY.search(t.get_text()), t.get_text()


def test_the_clipping_check_sees_a_clipped_title():
    """The oracle itself: a plain figure with a long suptitle is reported as clipped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    fig.suptitle(LONG)
    assert clipped_texts(fig) == [LONG]


T = np.arange(30.0)
RNG = np.random.default_rng(0)
E_GEN = 3 + 0.5 * ((T - 8) / 8) ** 2 + 0.05 * RNG.standard_normal(T.size)
SERIES = {DEFAULT_KEYS["e_gen"]: (T, E_GEN), DEFAULT_KEYS["e_mem"]: (T, 3.5 - 0.02 * T),
          DEFAULT_KEYS["loss_train"]: (T, 1 - 0.01 * T), DEFAULT_KEYS["loss_test"]: (T, 1 + 0.005 * T),
          DEFAULT_KEYS["icr"]: (T, 0.5 + 0.001 * (T - 15) ** 2),
          DEFAULT_KEYS["mem_ratio"]: (T, np.clip((T - 10) / 20, 0, 1))}
EVENTS = [Event("early_learning", 8, 4.0, 12, {}), Event("memorization_onset", 14, 3.0, 18, {}),
          Event("icr_minimum", 15, 3.0, 20, {}), Event("sw_e_gen_minimum", 9, 2.0, 12, {})]


def legend_texts(fig) -> list:
    return [t.get_text() for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
            for t in lg.get_texts()]


def event_lines(ax) -> set:
    """Epochs of the vertical lines of ``ax``."""
    return {ln.get_xdata()[0] for ln in ax.lines
            if len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1]}


def test_dynamics_figure_marks_minimum_and_every_event_and_says_what_is_smoothed():
    fig = build_dynamics(SERIES, EVENTS, window=5, title=LONG)
    check_readable(fig)
    texts = legend_texts(fig)
    for name in (r"$\mathcal{E}_{gen}$", r"$\mathcal{E}_{mem}$", r"$\ell_{train}$", r"$\ell_{test}$"):
        assert f"{name} (smoothed, 5 epochs)" in texts
    assert "faint: raw values, per epoch" in texts
    # the raw minimum, from the data (not from the detector)
    i = int(np.argmin(E_GEN))
    marks = [ln for ln in fig.axes[0].lines if ln.get_marker() == "v"]
    assert len(marks) == 1 and marks[0].get_xdata()[0] == T[i] and marks[0].get_ydata()[0] == E_GEN[i]
    assert any(t.startswith(r"$\mathcal{E}_{gen}$ minimum") and f"epoch {T[i]:g}" in t for t in texts)
    # every event, on both rows, in the legend with its epoch; the custom one in words
    rows = fig.axes[:2]  # the two rows (subplots first, the loss twin after them)
    assert rows[1].get_xlabel() == "epoch" and rows[1].get_ylabel().startswith(r"$\ell_{test}-\ell_{train}$")
    # the twin axes say which curves they carry (issue 40 item 14)
    twin = fig.axes[2]
    def label(ax):  # (wrapped to fit the figure)
        return ax.get_ylabel().replace("\n", " ")
    assert label(fig.axes[0]).startswith(r"left axis, solid: $\mathcal{E}_{gen}$, $\mathcal{E}_{mem}$")
    assert label(twin).startswith(r"right axis, dashed: $\ell_{train}$, $\ell_{test}$")
    assert {ln.get_linestyle() for ln in twin.lines} == {"--"} and "--" not in {ln.get_linestyle() for ln in
                                                                               fig.axes[0].lines[:4]}
    for ev in EVENTS:
        assert all(ev.epoch in event_lines(ax) for ax in rows), ev.name
        assert any(t.endswith(f": epoch {ev.epoch:g}") for t in texts), ev.name
    assert "sw e gen minimum: epoch 9" in texts
    assert "\n" in fig.axes[0].get_title()  # wrapped, and inside the figure (check_readable)


def test_dynamics_figure_without_smoothing_says_raw():
    fig = build_dynamics({k: (x[:2], y[:2]) for k, (x, y) in SERIES.items()}, [], window=5)
    check_readable(fig)
    texts = legend_texts(fig)
    assert r"$\mathcal{E}_{gen}$ (raw)" in texts and not any("smoothed" in t for t in texts)
    assert "faint: raw values, per epoch" not in texts


def test_icr_figure_marks_its_events_and_names_units():
    fig = build_icr_memorization(SERIES, EVENTS, window=5)
    check_readable(fig)
    texts = legend_texts(fig)
    assert "ICR (smoothed, 5 epochs)" in texts and "memorization ratio (smoothed, 5 epochs)" in texts
    assert "ICR minimum: epoch 15" in texts and "memorization onset: epoch 14" in texts
    assert {ax.get_ylabel() for ax in fig.axes} == {"ICR (dimensionless)",
                                                  "memorization ratio (fraction of samples)"}


def test_sweep_report_figures_fit_and_name_units(tmp_path, monkeypatch):
    figs = {}
    save = sweep_report._save

    def capture(fig, path, *args, **kwargs):
        out = save(fig, path, *args, **kwargs)
        figs[Path(path).name] = fig
        return out

    monkeypatch.setattr(sweep_report, "_save", capture)
    sweep_report.write_sweep_report(_write_sweep(tmp_path / "sw"), tmp_path / "r", bootstrap=5)
    assert set(figs) == set(sweep_report.FIGURES)
    for name, fig in figs.items():
        check_readable(fig)
        sup = [t for t in fig.findobj(Text) if t.get_text().startswith(("MtoG", "Collapse", "Practical", "Bias"))]
        assert len(sup) == 1, name  # the suptitle, inside the figure (check_readable)


class _StubEvaluation:
    """What pite's density figure needs of a TailEvaluation: ``density_data``."""

    def __init__(self, ref):
        self.ref = ref

    def density_data(self, curves):
        from lightning_pfd.evaluation.tail import kde_curves

        return kde_curves({"data": self.ref, **curves}, 0.3)


def test_pite_density_figure_labels_observables_in_words_with_units():
    from lightning_pfd.commands.pite import density_figure, observable_label

    g = torch.Generator().manual_seed(0)
    evs = {"max": _StubEvaluation(torch.rand(200, generator=g) * 50),
           "exceedance:threshold=25": _StubEvaluation(torch.rand(200, generator=g))}
    curves = {o: {"SBM (EDM)": torch.rand(100, generator=g) * 40,
                  "LIM (alpha = 1.7)": torch.rand(100, generator=g) * 60} for o in evs}
    fig = density_figure(evs, curves, "PITE (StageIV crops, 512 samples per model and seed, "
                                      "3 training seeds pooled)" * 2, unit="mm/h")
    check_readable(fig)
    assert [ax.get_xlabel().replace("\n", " ") for ax in fig.axes] == [
        "crop maximum (mm/h)", "fraction of pixels above 25 mm/h (dimensionless)"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["density (KDE, per mm/h)",
                                                  "density (KDE, per unit fraction)"]
    assert observable_label("mean", None) == "crop mean (data units)"
    assert observable_label("exceedance", "mm/h") == "fraction of pixels above 10 mm/h (dimensionless)"
