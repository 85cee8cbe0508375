"""Calibration of the event detectors on nulls that look like real runs (pure numpy).

A detector is trusted only with a measured false-event rate on curves *without* the event and a
measured power on curves *with* one. The null families reproduce the noise of real E_gen curves
(measured on the 500-epoch double-descent run: residual sd ≈ 0.05 around the trend, lag-1
autocorrelation ≈ 0.96, i.e. slow noise that second differences barely see):

- ``white``: monotone trend + i.i.d. Gaussian noise (logged curve only);
- ``ar1``: monotone trend + AR(1) noise with ``phi`` (0.9–0.97) and stationary sd ``sd``
  (logged curve only — the case without per-unit values);
- ``seed_flip``: M per-seed squared distances, each seed's endpoint flipping between two basins
  (a two-state Markov chain, flip probability ``p_flip`` per evaluation, so lag-1 ≈ 1 − 2p); the
  basin gap is set so that E = sqrt(mean d²) has residual sd ``sd`` at ``m_ref`` = 256 seeds (the
  real monitor), smaller with more seeds;
- ``seed_flip_common``: the same plus a training-noise component common to all seeds (AR(1),
  sd ``common_sd`` = 0.02, φ ``common_phi`` = 0.9).

Planted events on the same trends (:func:`planted_trend`): a bump of height ``h`` (double
descent: down, up by h, down again) or a rise of ``h`` from an interior minimum to the end
(early learning). :func:`calibrate` runs a detector over many seeds and returns the fraction of
runs with an event; ``experiments/calibrate_events.py`` writes the table of docs/events.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Literal, Optional, get_args

import numpy as np

from ..validation import HalfOpenUnitInterval, PositiveInt, check_args, ranged
from .per_unit import UnitSeries

__all__ = ["NULLS", "NullSpec", "trend", "planted_trend", "simulate", "calibrate"]

#: the null families (module docstring)
Null = Literal["white", "ar1", "seed_flip", "seed_flip_common"]
NULLS = get_args(Null)
#: an event planted on the trend (:func:`planted_trend`)
PlantedEvent = Literal["double_descent", "early_learning"]
#: evaluations of a synthetic run, seeds of a per-seed null (fewer leave no curve to test)
NumEvaluations = ranged("NumEvaluations", int, (">=", 10), "an integer >= 10")
NumSeeds = ranged("NumSeeds", int, (">=", 4), "an integer >= 4")


@dataclass(frozen=True)
class NullSpec:
    """A null family and its parameters (module docstring)."""

    kind: Null = "seed_flip"
    n_eval: NumEvaluations = 500
    sd: float = 0.049
    phi: HalfOpenUnitInterval = 0.96
    num_seeds: NumSeeds = 256
    m_ref: int = 256
    p_flip: float = 0.02
    common_sd: float = 0.02
    common_phi: HalfOpenUnitInterval = 0.9

    def __post_init__(self) -> None:
        check_args(NullSpec, vars(self))


def trend(t: np.ndarray) -> np.ndarray:
    """The monotone E_gen trend of the nulls: 1.5 + 1.5·exp(−t/60) (falls from 3 to 1.5)."""
    return 1.5 + 1.5 * np.exp(-t / 60.0)


def planted_trend(t: np.ndarray, event: Optional[PlantedEvent], height: float) -> np.ndarray:
    """:func:`trend` with a planted event of ``height`` where the trend has flattened (after 50 %
    of the run it moves by < 0.02), so that ``height`` is the size of the legs:
    ``"double_descent"`` adds a Gaussian bump centred at 60 % of the run (sd 5 % of it: down, up
    by ``height``, down again); ``"early_learning"`` adds a smooth step of ``height`` centred at
    65 % (width 3 %): a minimum, then a rise of ``height`` that holds to the end."""
    check_args(planted_trend, locals())
    n = t.size
    base = trend(t)
    if event is None or height == 0:
        return base
    if event == "double_descent":
        return base + height * np.exp(-0.5 * ((t - 0.6 * n) / (0.05 * n)) ** 2)
    return base + height / (1.0 + np.exp(-(t - 0.65 * n) / (0.03 * n)))  # early_learning


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    e = rng.standard_normal(n) * sd * math.sqrt(1.0 - phi ** 2)
    out = np.empty(n)
    out[0] = rng.standard_normal() * sd
    for i in range(1, n):
        out[i] = phi * out[i - 1] + e[i]
    return out


def _flips(rng: np.random.Generator, n: int, m: int, p: float) -> np.ndarray:
    """(n, m) two-state Markov chains in {0, 1}, stationary start, flip probability p."""
    state = rng.random(m) < 0.5
    out = np.empty((n, m), dtype=bool)
    for i in range(n):
        out[i] = state
        state = state ^ (rng.random(m) < p)
    return out


def simulate(spec: NullSpec, seed: int, event: Optional[PlantedEvent] = None, height: float = 0.0):
    """One synthetic run: ``(epochs, values, units)`` where ``units`` is a
    :class:`~lightning_pfd.analysis.per_unit.UnitSeries` of per-seed squared distances
    (``seed_flip*``) or None (``white``, ``ar1``)."""
    rng = np.random.default_rng(seed)
    n = spec.n_eval
    t = np.arange(n, dtype=np.float64)
    f = planted_trend(t, event, height)
    if spec.kind == "white":
        return t, f + spec.sd * rng.standard_normal(n), None
    if spec.kind == "ar1":
        return t, f + _ar1(rng, n, spec.phi, spec.sd), None
    m = spec.num_seeds
    # seed i: d² = low_i in one basin, low_i + s·g_i in the other (heavy-tailed gaps g: a few far
    # components dominate, as on the real run); the state flips with probability p_flip.
    low = rng.uniform(0.5, 1.5, m)
    g = rng.lognormal(0.0, 1.0, m)
    g /= g.mean()
    # relative sd of E at m_ref seeds: rel = s·sqrt(mean g²)/(4·sqrt(m_ref)·E²), E² = mean(low) + s/2
    rel = spec.sd / float(f[-1])
    a = 4.0 * rel * math.sqrt(spec.m_ref) / math.sqrt(float(np.mean(g ** 2)))
    if a >= 2.0:
        raise ValueError(f"sd = {spec.sd} is more seed noise than two basins can make at m_ref = {spec.m_ref}")
    s = a * float(low.mean()) / (1.0 - a / 2.0)
    e0 = math.sqrt(float(low.mean()) + s / 2.0)
    levels = low[None, :] + _flips(rng, n, m, spec.p_flip) * (s * g)[None, :]
    # a common scale per evaluation carries the trend (and the common training noise):
    # E_t = target_t·sqrt(mean levels_t)/e0, fluctuating with sd ≈ ``sd``·target_t/target_end
    target = f + (_ar1(rng, n, spec.common_phi, spec.common_sd) if spec.kind == "seed_flip_common" else 0.0)
    d2 = levels * ((target / e0) ** 2)[:, None]
    values = np.sqrt(d2.mean(1))
    units = UnitSeries("pfd/e_gen", "sq_dist", t.copy(), d2, np.arange(m, dtype=np.int64), values.copy())
    return t, values, units


def calibrate(detector: Callable, spec: NullSpec, runs: PositiveInt, *, event: Optional[PlantedEvent] = None,
              height: float = 0.0, seed0: int = 0, use_units: bool = True, **kwargs) -> Dict[str, float]:
    """Run ``detector(epochs, values, units=..., **kwargs)`` on ``runs`` synthetic runs; returns
    ``{"rate", "events", "runs", "median_z"}`` (rate = fraction of runs with an event)."""
    check_args(calibrate, locals())
    hits, zs = 0, []
    for r in range(runs):
        x, y, u = simulate(spec, seed0 + r, event, height)
        ev = detector(x, y, units=u if use_units else None, **kwargs)
        if ev is not None:
            hits += 1
            zs.append(ev.significance)
    return {"rate": hits / runs, "events": hits, "runs": runs,
            "median_z": float(np.median(zs)) if zs else math.nan}
