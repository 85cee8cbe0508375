"""Issue 41 item 1: events are phenomena of duration. A bad batch -- a one-epoch spike of any
height, raw or smoothed by an EMA of the logged value -- never becomes a double descent or early
learning; it is reported as a transient. A real ascent (tens of epochs) still is an event.

Oracle: the planted curves themselves (a monotone descent, so every event on it is false)."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_pfd.analysis.events import analyze_history, find_transients, min_extent

EPOCHS = np.arange(500.0)


def _descent(seed: int):
    rng = np.random.default_rng(seed)
    return 2.0 + 2.0 * np.exp(-EPOCHS / 60.0) + rng.normal(0.0, 0.01, EPOCHS.size)


def _ema(y, beta):
    out, m = np.empty_like(y), y[0]
    for i, v in enumerate(y):
        m = beta * m + (1 - beta) * v
        out[i] = m
    return out


def _events(y):
    a = analyze_history({"pfd/e_gen": (EPOCHS, y), "pfd/e_mem": (EPOCHS, y + 1.0)}, window=5, confirm=3)
    return a, {e.name for e in a.events} | {e.name for e in a.undecided}


def test_min_extent_is_twice_the_window_or_four_percent_of_the_run_at_most_20():
    assert min_extent(24, 3) == 7 and min_extent(500, 5) == 20 and min_extent(100, 5) == 11
    # the share stops at 20: a transient's width does not grow with the run (issue 39's 1000-epoch
    # runs read a 60-epoch ascent as a transient when it was 40)
    assert min_extent(1000, 5) == 20 and min_extent(10_000, 5) == 20 and min_extent(10_000, 12) == 25


@pytest.mark.parametrize("height", [0.05, 0.5, 5.0, 500.0])
@pytest.mark.parametrize("ema", [None, 0.5, 0.8])
@pytest.mark.parametrize("at", [300, 470])
def test_a_spike_of_any_height_is_never_an_event(height, ema, at):
    y = _descent(int(height * 10) + at)
    y[at] += height * y[at]  # a bad batch raises E_gen for one epoch
    if ema is not None:  # the logged value is an EMA of the raw one: the spike decays over epochs
        y = _ema(y, ema)
    a, names = _events(y)
    assert not names & {"double_descent", "early_learning"}, [e.to_dict() for e in a.events]


def test_an_ema_smoothed_spike_is_reported_as_a_transient():
    y = _ema(_descent(1) * np.where(EPOCHS == 300, 3.0, 1.0), 0.8)
    a, _ = _events(y)
    spikes = find_transients(EPOCHS, y, window=5)
    assert spikes and any(299 <= t["epoch"] <= 310 for t in spikes)
    assert a.transients == spikes and a.to_dict()["transients"] == spikes
    assert all(t["width_evaluations"] < min_extent(EPOCHS.size, 5) for t in spikes)


def test_an_ascent_over_tens_of_epochs_is_still_a_double_descent():
    y = _descent(2)
    t = np.arange(80)
    y[250:330] += 0.3 * 0.5 * (1 - np.cos(2 * np.pi * t / 80))  # up over 40 epochs, down over 40
    a, _ = _events(y)
    dd = a.event("double_descent")
    assert dd is not None and 260 <= dd.epoch <= 320
    assert find_transients(EPOCHS, y, window=5) == []


def _long_descent(seed: int, n: int = 1000):
    rng = np.random.default_rng(seed)
    t = np.arange(float(n))
    return t, 2.0 + 2.0 * np.exp(-t / 120.0) + rng.normal(0.0, 0.01, n)


def _long_events(t, y):
    a = analyze_history({"pfd/e_gen": (t, y), "pfd/e_mem": (t, y + 1.0)}, window=5, confirm=3)
    return a, {e.name for e in a.events} | {e.name for e in a.undecided}


def test_a_60_epoch_ascent_is_a_double_descent_on_a_1000_epoch_run_too():
    """The same ascent as on 500 epochs (raised cosine over 60, half-width 30 > 20) is an event on
    a run twice as long: the run's length does not decide what an event is."""
    for n in (500, 1000, 2000):
        t, y = _long_descent(3, n)
        s0 = int(0.7 * n)
        y[s0:s0 + 60] += 0.3 * 0.5 * (1 - np.cos(2 * np.pi * np.arange(60) / 60))
        a, _ = _long_events(t, y)
        dd = a.event("double_descent")
        assert dd is not None and s0 <= dd.epoch <= s0 + 60, (n, [e.to_dict() for e in a.events])


@pytest.mark.parametrize("ema", [None, 0.8])
def test_a_spike_is_never_an_event_on_a_long_run(ema):
    t, y = _long_descent(4, 2000)
    y[1500] *= 6.0  # a bad batch: E_gen five times higher for one epoch
    if ema is not None:
        y = _ema(y, ema)
    a, names = _long_events(t, y)
    assert not names & {"double_descent", "early_learning"}, [e.to_dict() for e in a.events]
    jumps = [s for s in a.transients if s["kind"] == "jump"]
    assert [s["epoch"] for s in jumps] == [1500] and jumps[0]["height"] > 1.0, a.transients
    assert not [s for s in a.transients if s["kind"] == "peak"], a.transients  # no noise bumps listed


@pytest.mark.parametrize("factor", [1.5, 6.0, 0.4])
def test_a_one_epoch_bad_batch_is_reported_as_a_jump_transient(factor):
    """A raw one-epoch spike (or dip) is invisible to the smoothed curve's peaks (the running
    median removes it), so it is reported from the jump component, with its signed size."""
    y = _descent(5)
    y[300] *= factor
    a, names = _events(y)
    assert not names & {"double_descent", "early_learning"}
    jumps = [s for s in a.transients if s["kind"] == "jump"]
    assert [s["epoch"] for s in jumps] == [300], a.transients
    assert jumps[0]["height"] == pytest.approx((factor - 1.0) * y[300] / factor, rel=0.05)
