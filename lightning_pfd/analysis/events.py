"""Training-dynamics events from per-epoch metric histories (pure numpy).

Phenomena (PFD paper §4.2 / App. C.6, ICR paper §5.2):

- **early learning** (memorization / transition regime): E_gen reaches an *interior* minimum and
  then rises until the end of training (:func:`detect_early_learning`);
- **epoch-wise double descent** (generalization regime): E_gen decreases, increases, decreases
  again (:func:`detect_double_descent`);
- **memorization onset**: the memorization ratio crosses above its baseline, or E_mem starts a
  sustained fall; the ICR minimum (ICR paper Fig. 5: ICR is U-shaped, the ratio stays ≈ 0 until
  its minimum) is the early warning and ``lead = onset − ICR minimum`` epochs
  (:func:`detect_memorization_onset`, :func:`detect_icr_minimum`);
- **regime** of a finished run from the final E_gen and E_mem (:func:`classify_regime`).

Which metric is which curve comes from the key registry (:mod:`lightning_pfd.keys`): the key
holding each role (``e_gen``, ``e_mem``, ``icr``...) forms :data:`DEFAULT_KEYS`, and a registered
key without a role that lists single-curve detectors (``early_learning``, ``double_descent``,
``minimum``) is analysed on its own by :func:`analyze_history` (events named
``<key slug>_<detector>``, e.g. ``sw_e_gen_early_learning``).

Robustness (the same three devices in every detector):

1. the curve is smoothed (:func:`~lightning_pfd.analysis.smoothing.smooth`, running median then
   mean over ``window`` epochs);
2. an amplitude counts only if it exceeds ``threshold = max(min_sigma·√2·σ_s, min_rel·max|s|,
   min_amplitude)``, where σ_s is the noise left in the smoothed curve, estimated from the raw
   curve (:func:`~lightning_pfd.analysis.smoothing.estimate_noise`); √2 because an amplitude is a
   difference of two smoothed values;
3. a change must persist for ``confirm`` consecutive evaluations.

Every event carries its ``epoch`` and a ``significance`` = amplitude / (√2·σ_s), i.e. the
amplitude in units of the noise of a difference of two smoothed values (a z-score; ≥ min_sigma
by construction unless the relative floor set the threshold).

[choice] The detectors are deliberately conservative: a run too short or too noisy to show a
phenomenon above the threshold reports no event rather than a guess.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional

import numpy as np

from .. import keys as keys_registry
from .smoothing import as_curve, estimate_noise, smooth, smoothed_noise

__all__ = [
    "Event",
    "Regime",
    "RunAnalysis",
    "DEFAULT_KEYS",
    "noise_threshold",
    "turning_points",
    "detect_early_learning",
    "detect_double_descent",
    "detect_icr_minimum",
    "detect_memorization_onset",
    "classify_regime",
    "analyze_history",
    "detect_registered",
]

#: Role in the analysis → metric name, from the key registry (:func:`lightning_pfd.keys.roles`).
DEFAULT_KEYS = keys_registry.roles()

REGIMES = ("generalization", "transition", "memorization")


@dataclass(frozen=True)
class Event:
    """A detected phenomenon.

    ``epoch``: where it happened (the E_gen minimum for early learning, the intermediate E_gen
    maximum for double descent, the confirmed crossing for memorization onset, the ICR minimum);
    ``significance``: amplitude in noise units (see module docstring); ``detected_epoch``: the
    first epoch at which the confirmation rule was satisfied (what an online monitor could know);
    ``detail``: amplitudes, thresholds and auxiliary epochs.
    """

    name: str
    epoch: float
    significance: float
    detected_epoch: float
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One human-readable line (console, markdown)."""
        d = self.detail
        if "detector" in d:  # an event on a registered user key
            what = d.get("display", d.get("key", "?"))
            if d["detector"] == "double_descent":
                return (f"double descent of {what}: minimum at epoch {_fmt(d['first_min_epoch'])}, "
                        f"peak at {_fmt(self.epoch)}, descends again to epoch "
                        f"{_fmt(d['second_min_epoch'])} ({self.significance:.1f}σ weakest leg)")
            kind = "early learning of" if d["detector"] == "early_learning" else "minimum of"
            return (f"{kind} {what}: minimum {d['min_value']:.4g} at epoch {_fmt(self.epoch)}, "
                    f"then rises by {d['rise']:.3g} ({self.significance:.1f}σ)")
        if self.name == "early_learning":
            return (f"early learning: E_gen minimum {d['min_value']:.4g} at epoch {_fmt(self.epoch)}, "
                    f"then rises by {d['rise']:.3g} ({self.significance:.1f}σ)")
        if self.name == "double_descent":
            return (f"epoch-wise double descent: minimum at epoch {_fmt(d['first_min_epoch'])}, "
                    f"peak at {_fmt(self.epoch)}, descends again to epoch {_fmt(d['second_min_epoch'])} "
                    f"({self.significance:.1f}σ weakest leg)")
        if self.name == "icr_minimum":
            return (f"ICR minimum {d['min_value']:.4g} at epoch {_fmt(self.epoch)} "
                    f"(U-shape, rise {d['rise']:.3g}, {self.significance:.1f}σ)")
        if self.name == "memorization_onset":
            s = (f"memorization onset at epoch {_fmt(self.epoch)} from {d['source']} "
                 f"({self.significance:.1f}σ)")
            lead = d.get("lead_epochs")
            if lead is not None:
                how = (f"anticipates it by {_fmt(lead)} epochs" if float(lead) >= 0
                       else f"comes {_fmt(-float(lead))} epochs after it")
                s += f"; ICR minimum at epoch {_fmt(d['icr_min_epoch'])} {how}"
            return s
        return f"{self.name} at epoch {_fmt(self.epoch)} ({self.significance:.1f}σ)"


@dataclass(frozen=True)
class Regime:
    """Regime of a finished run: ``name`` in ("generalization", "transition", "memorization");
    ``score`` = log(E_gen_end / E_mem_end) (> 0: closer to the empirical distribution than to the
    data distribution); ``reasons``: the rules that fired."""

    name: str
    score: float
    reasons: tuple
    detail: dict = field(default_factory=dict)

    @property
    def code(self) -> int:
        """0 = generalization, 1 = transition, 2 = memorization (numeric for loggers)."""
        return REGIMES.index(self.name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


@dataclass
class RunAnalysis:
    """Events and regime of one run (output of :func:`analyze_history`)."""

    events: list
    regime: Optional[Regime]

    def event(self, name: str) -> Optional[Event]:
        return next((e for e in self.events if e.name == name), None)

    def to_dict(self) -> dict:
        return {"events": [e.to_dict() for e in self.events],
                "regime": None if self.regime is None else self.regime.to_dict()}


# ----------------------------------------------------------------------------- helpers
def _fmt(x) -> str:
    if x is None:
        return "—"
    x = float(x)
    return str(int(x)) if x.is_integer() else f"{x:.3g}"


def _epoch(x) -> float:
    x = float(x)
    return int(x) if x.is_integer() else x


def _check_params(window, min_sigma, min_rel, confirm, min_amplitude=0.0):
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive integer (epochs), got {window!r}")
    if isinstance(confirm, bool) or not isinstance(confirm, (int, np.integer)) or confirm < 1:
        raise ValueError(f"confirm must be a positive integer (evaluations), got {confirm!r}")
    for name, v in (("min_sigma", min_sigma), ("min_rel", min_rel), ("min_amplitude", min_amplitude)):
        if not (isinstance(v, (int, float, np.floating)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def _prepare(epochs, values, name: str):
    """Validate and drop non-finite values (epochs without a measurement)."""
    x = as_curve(epochs, "epochs")
    y = as_curve(values, name)
    if x.size != y.size:
        raise ValueError(f"epochs and {name} must have the same length, got {x.size} and {y.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("epochs must be finite numbers")
    if x.size > 1 and np.any(np.diff(x) < 0):
        raise ValueError("epochs must be non-decreasing (one value per evaluation, in order)")
    keep = np.isfinite(y)
    return x[keep], y[keep]


def noise_threshold(y, s, window: int, min_sigma: float, min_rel: float, min_amplitude: float = 0.0):
    """``(threshold, unit, sigma)``: unit = √2·σ_s is the noise of a difference of two smoothed
    values, threshold = max(min_sigma·unit, min_rel·max|s|, min_amplitude)."""
    sigma = estimate_noise(y)
    unit = math.sqrt(2.0) * smoothed_noise(sigma, window)
    scale = float(np.max(np.abs(s))) if s.size else 0.0
    thr = max(min_sigma * unit, min_rel * scale, float(min_amplitude))
    if thr <= 0.0:  # constant curve: nothing can be significant
        thr = np.finfo(np.float64).tiny
    # A curve with no measurable noise (e.g. a memorization ratio that is exactly 0 so far)
    # would give an unbounded z-score: floor the unit at 0.1 % of the curve's scale, which caps
    # the significance at amplitude / (1e-3 * max|s|).
    unit = max(unit, 1e-3 * scale, 1e-300)
    return thr, unit, sigma


def turning_points(s, threshold: float) -> list:
    """Significant extrema of a (smoothed) curve with hysteresis ``threshold`` (zigzag filter).

    Returns ``[(index, kind), ...]`` alternating "min"/"max": each listed extremum is separated
    from the next one by at least ``threshold``. The last entry is the extreme of the final,
    possibly unfinished, leg (kind "min" if the curve ends falling). An empty list means no
    movement larger than the threshold.
    """
    s = as_curve(s, "s")
    n = s.size
    if n < 2:
        return []
    pivots = []
    direction, hi, lo, cand = 0, 0, 0, 0
    for i in range(1, n):
        if direction == 0:
            hi = i if s[i] > s[hi] else hi
            lo = i if s[i] < s[lo] else lo
            if s[hi] - s[lo] >= threshold:
                if hi > lo:
                    pivots.append((lo, "min"))
                    direction, cand = 1, hi
                else:
                    pivots.append((hi, "max"))
                    direction, cand = -1, lo
        elif direction == 1:
            if s[i] > s[cand]:
                cand = i
            elif s[cand] - s[i] >= threshold:
                pivots.append((cand, "max"))
                direction, cand = -1, i
        else:
            if s[i] < s[cand]:
                cand = i
            elif s[i] - s[cand] >= threshold:
                pivots.append((cand, "min"))
                direction, cand = 1, i
    if direction != 0:
        pivots.append((cand, "max" if direction == 1 else "min"))
    return pivots


def _first_run(mask: np.ndarray, length: int) -> Optional[int]:
    """Index where the first run of ``length`` consecutive True values starts, else None."""
    if length <= 0 or mask.size < length:
        return None
    c = np.convolve(mask.astype(np.int64), np.ones(length, dtype=np.int64), mode="valid")
    hits = np.flatnonzero(c == length)
    return int(hits[0]) if hits.size else None


# ----------------------------------------------------------------------------- detectors
def _u_shape(x, y, *, name, window, min_sigma, min_rel, confirm, min_amplitude,
             require_descent=True):
    """Interior global minimum of the smoothed curve, with a descent before it and a sustained
    rise after it that does not come back down (shared by early learning and the ICR minimum)."""
    _check_params(window, min_sigma, min_rel, confirm, min_amplitude)
    if x.size < max(5, confirm + 2):
        return None
    s = smooth(y, window)
    thr, unit, sigma = noise_threshold(y, s, window, min_sigma, min_rel, min_amplitude)
    m = int(np.argmin(s))
    descent = float(np.max(s[: m + 1]) - s[m])
    if (m == 0 or descent < thr) and (require_descent or m > 0):
        return None
    after = s[m:]
    above = after - s[m] >= thr
    c = _first_run(above, confirm)
    if c is None:
        return None
    c += m
    # sustained: never falls back towards the minimum, and no significant second descent
    if np.any(s[c:] < s[m] + 0.5 * thr):
        return None
    peak = float(np.max(s[m:]))
    if peak - s[-1] >= thr:
        return None
    rise = float(s[-1] - s[m])
    return Event(
        name=name,
        epoch=_epoch(x[m]),
        significance=float((min(rise, descent) if m > 0 else rise) / unit),
        detected_epoch=_epoch(x[c + confirm - 1]),
        detail={"min_value": float(s[m]), "raw_min_value": float(y[m]), "descent": descent,
                "descent_observed": bool(m > 0),
                "rise": rise, "threshold": float(thr), "noise_sigma": float(sigma),
                "window": int(window), "confirm": int(confirm)},
    )


def detect_early_learning(epochs, e_gen, *, window: int = 5, min_sigma: float = 4.0,
                          min_rel: float = 0.02, confirm: int = 3,
                          min_amplitude: float = 0.0,
                          require_descent: bool = True) -> Optional[Event]:
    """Early learning (PFD paper §4.2, Fig. 4 left/middle): E_gen falls to an interior minimum,
    then rises until the end of training.

    ``require_descent=False`` also accepts a minimum at the *first* evaluation (the descent
    happened before it; ``detail["descent_observed"]`` is then False): useful when the first
    evaluation comes late relative to how fast a data-limited run generalizes.

    Rule on the smoothed curve s with threshold θ (module docstring): m = argmin s; the descent
    max(s[:m]) − s[m] ≥ θ; from the first of ``confirm`` consecutive evaluations with
    s − s[m] ≥ θ on, s never returns below s[m] + θ/2; and there is no later descent ≥ θ
    (that would be double descent). ``epoch`` = epoch of the minimum; ``significance`` =
    min(descent, rise)/(√2σ_s). Returns None when there is no such event (e.g. a monotone
    decrease) or fewer than max(5, confirm + 2) finite points.
    """
    x, y = _prepare(epochs, e_gen, "e_gen")
    return _u_shape(x, y, name="early_learning", window=window, min_sigma=min_sigma,
                    min_rel=min_rel, confirm=confirm, min_amplitude=min_amplitude,
                    require_descent=require_descent)


def detect_icr_minimum(epochs, icr, *, window: int = 5, min_sigma: float = 4.0,
                       min_rel: float = 0.02, confirm: int = 3,
                       min_amplitude: float = 0.0) -> Optional[Event]:
    """U-shaped ICR over training (ICR paper §5.2, Fig. 5): the interior minimum, confirmed by a
    sustained rise; same rule as :func:`detect_early_learning`. In the data-rich regime ICR
    decreases monotonically and this returns None."""
    x, y = _prepare(epochs, icr, "icr")
    return _u_shape(x, y, name="icr_minimum", window=window, min_sigma=min_sigma,
                    min_rel=min_rel, confirm=confirm, min_amplitude=min_amplitude)


def detect_double_descent(epochs, e_gen, *, window: int = 5, min_sigma: float = 4.0,
                          min_rel: float = 0.02, confirm: int = 3,
                          min_amplitude: float = 0.0) -> Optional[Event]:
    """Epoch-wise double descent (PFD paper §4.2, Fig. 4 right): E_gen decreases, increases, then
    decreases again, each leg ≥ θ on the smoothed curve.

    The significant extrema come from :func:`turning_points` (zigzag with hysteresis θ). A
    pattern min₁ < peak > min₂ preceded by a descent ≥ θ qualifies when the ascent and the second
    descent each hold for ``confirm`` evaluations beyond θ. Among several, the one with the
    largest weakest leg is returned. ``epoch`` = epoch of the intermediate peak;
    ``detail`` has first_min_epoch, second_min_epoch and the three leg amplitudes;
    ``significance`` = weakest leg/(√2σ_s).
    """
    _check_params(window, min_sigma, min_rel, confirm, min_amplitude)
    x, y = _prepare(epochs, e_gen, "e_gen")
    if x.size < max(7, 2 * confirm + 3):
        return None
    s = smooth(y, window)
    thr, unit, sigma = noise_threshold(y, s, window, min_sigma, min_rel, min_amplitude)
    piv = turning_points(s, thr)
    best = None
    for k in range(len(piv) - 1):
        (a, ka) = piv[k]
        if ka != "min" or k + 2 >= len(piv):
            continue
        b, c = piv[k + 1][0], piv[k + 2][0]
        d1 = float(np.max(s[: a + 1]) - s[a])
        up = float(s[b] - s[a])
        d2 = float(s[b] - s[c])
        if min(d1, up, d2) < thr:
            continue
        n_up = int(np.sum(s[a:c + 1][: b - a + 1] >= s[a] + thr))
        n_down = int(np.sum(s[b:] <= s[b] - thr))
        if n_up < confirm or n_down < confirm:
            continue
        weakest = min(d1, up, d2)
        if best is None or weakest > best[0]:
            j = b + int(np.flatnonzero(s[b:] <= s[b] - thr)[confirm - 1])
            best = (weakest, a, b, c, d1, up, d2, j)
    if best is None:
        return None
    weakest, a, b, c, d1, up, d2, j = best
    return Event(
        name="double_descent",
        epoch=_epoch(x[b]),
        significance=float(weakest / unit),
        detected_epoch=_epoch(x[j]),
        detail={"first_min_epoch": _epoch(x[a]), "peak_epoch": _epoch(x[b]),
                "second_min_epoch": _epoch(x[c]), "first_descent": d1, "ascent": up,
                "second_descent": d2, "threshold": float(thr), "noise_sigma": float(sigma),
                "window": int(window), "confirm": int(confirm)},
    )


def _onset_from_ratio(x, r, *, window, min_sigma, confirm, min_rise):
    """Confirmed crossing of the smoothed memorization ratio above baseline + θ."""
    s = smooth(r, window)
    thr, unit, sigma = noise_threshold(r, s, window, min_sigma, 0.0, min_rise)
    base = np.minimum.accumulate(s)  # running baseline: lowest value so far
    i = _first_run(s - base >= thr, confirm)
    if i is None:
        return None
    rise = float(np.max(s[i:]) - base[i])
    return Event(
        name="memorization_onset", epoch=_epoch(x[i]), significance=float(rise / unit),
        detected_epoch=_epoch(x[i + confirm - 1]),
        detail={"source": "mem/ratio", "baseline": float(base[i]), "rise": rise,
                "final_value": float(s[-1]), "threshold": float(thr), "noise_sigma": float(sigma)},
    )


def _onset_from_e_mem(x, e, *, window, min_sigma, min_rel, confirm, min_amplitude, not_before):
    """Confirmed fall of the smoothed E_mem below its running maximum by θ (the mirror of the
    ratio rule), searched from ``not_before`` on (the running maximum restarts there)."""
    s = smooth(e, window)
    thr, unit, sigma = noise_threshold(e, s, window, min_sigma, min_rel, min_amplitude)
    start = 0
    if not_before is not None:
        later = np.flatnonzero(x >= float(not_before))
        if later.size == 0:
            return None
        start = int(later[0])
    seg = s[start:]
    peak = np.maximum.accumulate(seg)
    i = _first_run(peak - seg >= thr, confirm)
    if i is None:
        return None
    drop = float(peak[i] - np.min(seg[i:]))
    return Event(
        name="memorization_onset", epoch=_epoch(x[start + i]), significance=float(drop / unit),
        detected_epoch=_epoch(x[start + i + confirm - 1]),
        detail={"source": "pfd/e_mem", "drop": drop, "from_start": bool(start + i <= confirm),
                "threshold": float(thr), "noise_sigma": float(sigma)},
    )


def detect_memorization_onset(epochs, mem_ratio=None, e_mem=None, icr=None, *,
                              e_gen_min_epoch: Optional[float] = None, window: int = 5,
                              min_sigma: float = 4.0, min_rel: float = 0.02, confirm: int = 3,
                              min_ratio_rise: float = 0.02,
                              icr_epochs=None, e_mem_epochs=None) -> Optional[Event]:
    """Memorization onset (ICR paper §5.2, Fig. 5; PFD paper §4.2).

    - From the memorization ratio (preferred when given): the first epoch where the smoothed
      ratio exceeds its running minimum by θ = max(min_sigma·√2σ_s, ``min_ratio_rise``) for
      ``confirm`` consecutive evaluations.
    - Only when no ratio was measured, from E_mem: the first epoch where the smoothed E_mem is θ below its running maximum
      for ``confirm`` consecutive evaluations; if ``e_gen_min_epoch`` is given the search (and
      the running maximum) starts there, since before the E_gen minimum E_mem also falls simply
      because the model learns the data.
    - Early warning: the ICR minimum (:func:`detect_icr_minimum` on ``icr``); ``detail`` then
      holds ``icr_min_epoch`` and ``lead_epochs = onset − icr_min_epoch`` (> 0: ICR anticipates).

    ``epochs`` are those of ``mem_ratio``; ``e_mem_epochs`` / ``icr_epochs`` default to them.
    Returns None when no onset is found.
    """
    _check_params(window, min_sigma, min_rel, confirm, min_ratio_rise)
    if mem_ratio is None and e_mem is None:
        raise ValueError("detect_memorization_onset needs mem_ratio or e_mem (got neither)")
    ev = None
    if mem_ratio is not None:
        x, r = _prepare(epochs, mem_ratio, "mem_ratio")
        if x.size >= max(5, confirm + 2):
            ev = _onset_from_ratio(x, r, window=window, min_sigma=min_sigma, confirm=confirm,
                                   min_rise=min_ratio_rise)
    if mem_ratio is None and e_mem is not None:  # a measured ratio that never rises is a "no"
        x, e = _prepare(epochs if e_mem_epochs is None else e_mem_epochs, e_mem, "e_mem")
        if x.size >= max(5, confirm + 2):
            ev = _onset_from_e_mem(x, e, window=window, min_sigma=min_sigma, min_rel=min_rel,
                                   confirm=confirm, min_amplitude=0.0, not_before=e_gen_min_epoch)
    if ev is None:
        return None
    if icr is not None:
        icr_ev = detect_icr_minimum(epochs if icr_epochs is None else icr_epochs, icr,
                                    window=window, min_sigma=min_sigma, min_rel=min_rel,
                                    confirm=confirm)
        if icr_ev is not None:
            detail = dict(ev.detail, icr_min_epoch=icr_ev.epoch,
                          lead_epochs=_epoch(float(ev.epoch) - float(icr_ev.epoch)))
            ev = Event(ev.name, ev.epoch, ev.significance, ev.detected_epoch, detail)
    return ev


def _tail_mean(epochs, values, window, confirm):
    x, y = _prepare(epochs, values, "values")
    if y.size == 0:
        return None
    s = smooth(y, window) if y.size >= 3 else y
    return float(np.mean(s[-max(1, min(confirm, s.size)):]))


def classify_regime(epochs, e_gen, e_mem, *, mem_ratio=None, gap=None,
                    early_learning: Optional[Event] = None, margin: float = 0.15,
                    ratio_memorized: float = 0.5, ratio_clean: float = 0.05,
                    window: int = 5, confirm: int = 3,
                    mem_ratio_epochs=None, gap_epochs=None) -> Optional[Regime]:
    """Regime of a finished run (PFD paper §4.1–4.2) [choice of rules]:

    score = log(Ē_gen / Ē_mem) with Ē the mean of the last ``confirm`` smoothed values
    (E_mem → 0 when the student reproduces the empirical flow, E_gen → 0 when it reproduces
    the data distribution):

    - **memorization** if score > ``margin`` (E_gen exceeds E_mem by > 16 % at the default), or the
      final memorization ratio ≥ ``ratio_memorized``;
    - **generalization** if score < −``margin``, no early learning was detected and the final
      memorization ratio (when measured) is < ``ratio_clean``;
    - **transition** otherwise (comparable errors, or early learning / some memorized samples
      while E_gen < E_mem).

    The final ℓ_test − ℓ_train gap is reported in ``detail`` (App. C.6: near zero in the
    generalization regime, growing in the memorization regime) but does not vote. Returns None
    with fewer than max(5, confirm + 2) finite E_gen values.
    """
    if not (isinstance(margin, (int, float)) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    _check_params(window, 0.0, 0.0, confirm)
    n_eval = int(np.sum(np.isfinite(np.asarray(e_gen, dtype=np.float64))))
    if n_eval < max(5, confirm + 2):
        return None  # too short to tell the dynamics (early learning) apart
    g = _tail_mean(epochs, e_gen, window, confirm)
    m = _tail_mean(epochs, e_mem, window, confirm)
    if g is None or m is None or g <= 0 or m <= 0:
        return None
    score = math.log(g / m)
    ratio_end = None
    if mem_ratio is not None:
        ratio_end = _tail_mean(epochs if mem_ratio_epochs is None else mem_ratio_epochs,
                               mem_ratio, window, confirm)
    gap_end = None
    if gap is not None:
        gap_end = _tail_mean(epochs if gap_epochs is None else gap_epochs, gap, window, confirm)
    reasons = []
    if score > margin:
        reasons.append(f"E_gen/E_mem = {math.exp(score):.3g} > {math.exp(margin):.3g}")
    if ratio_end is not None and ratio_end >= ratio_memorized:
        reasons.append(f"memorization ratio {ratio_end:.3g} >= {ratio_memorized}")
    if reasons:
        name = "memorization"
    elif (score < -margin and early_learning is None
          and (ratio_end is None or ratio_end < ratio_clean)):
        name = "generalization"
        reasons.append(f"E_gen/E_mem = {math.exp(score):.3g} < {math.exp(-margin):.3g}, "
                       "no early learning" + ("" if ratio_end is None else
                                              f", memorization ratio {ratio_end:.3g}"))
    else:
        name = "transition"
        if abs(score) <= margin:
            reasons.append(f"E_gen/E_mem = {math.exp(score):.3g} within ×{math.exp(margin):.3g} of 1")
        if early_learning is not None:
            reasons.append(f"early learning at epoch {_fmt(early_learning.epoch)}")
        if ratio_end is not None and ratio_end >= ratio_clean:
            reasons.append(f"memorization ratio {ratio_end:.3g} >= {ratio_clean}")
    return Regime(name=name, score=float(score), reasons=tuple(reasons),
                  detail={"e_gen_end": g, "e_mem_end": m, "mem_ratio_end": ratio_end,
                          "gap_end": gap_end, "margin": float(margin)})


# ----------------------------------------------------------------------------- all at once
def analyze_history(series: Mapping[str, tuple], *, keys: Optional[Mapping[str, str]] = None,
                    window: int = 5, min_sigma: float = 4.0, min_rel: float = 0.02,
                    confirm: int = 3, final: bool = True,
                    require_descent: bool = True) -> RunAnalysis:
    """Run every detector on ``series`` = {metric name: (epochs, values)} (e.g.
    :meth:`lightning_pfd.analysis.history.History.series_dict`). Missing metrics are skipped.
    ``keys`` overrides :data:`DEFAULT_KEYS`; ``final=False`` skips the regime (for a run still
    training); ``require_descent`` is passed to :func:`detect_early_learning`."""
    _check_params(window, min_sigma, min_rel, confirm)
    k = dict(DEFAULT_KEYS, **(keys or {}))
    unknown = set(keys or {}) - set(DEFAULT_KEYS)
    if unknown:
        raise ValueError(f"keys: unknown roles {sorted(unknown)}; allowed {sorted(DEFAULT_KEYS)}")
    get = {role: series.get(name) for role, name in k.items()}
    p = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    events = []
    el = dd = None
    if get["e_gen"] is not None:
        el = detect_early_learning(*get["e_gen"], require_descent=require_descent, **p)
        dd = detect_double_descent(*get["e_gen"], **p)
        events += [e for e in (el, dd) if e is not None]
    icr_ev = detect_icr_minimum(*get["icr"], **p) if get["icr"] is not None else None
    if icr_ev is not None:
        events.append(icr_ev)
    if get["mem_ratio"] is not None or get["e_mem"] is not None:
        ratio = get["mem_ratio"]
        base_x = ratio[0] if ratio is not None else get["e_mem"][0]
        onset = detect_memorization_onset(
            base_x, None if ratio is None else ratio[1],
            e_mem=None if get["e_mem"] is None else get["e_mem"][1],
            e_mem_epochs=None if get["e_mem"] is None else get["e_mem"][0],
            icr=None if get["icr"] is None else get["icr"][1],
            icr_epochs=None if get["icr"] is None else get["icr"][0],
            e_gen_min_epoch=None if el is None else el.epoch, **p)
        if onset is not None:
            events.append(onset)
    regime = None
    if final and get["e_gen"] is not None and get["e_mem"] is not None:
        xg, yg = get["e_gen"]
        xm, ym = get["e_mem"]
        common, ig, im = np.intersect1d(np.asarray(xg, float), np.asarray(xm, float),
                                        return_indices=True)
        if common.size:
            gap = get["gap"]
            if gap is None and get["loss_train"] is not None and get["loss_test"] is not None:
                xt, lt = get["loss_train"]
                xs, ls = get["loss_test"]
                c2, it, is_ = np.intersect1d(np.asarray(xt, float), np.asarray(xs, float),
                                             return_indices=True)
                gap = (c2, np.asarray(ls, float)[is_] - np.asarray(lt, float)[it]) if c2.size else None
            regime = classify_regime(
                common, np.asarray(yg, float)[ig], np.asarray(ym, float)[im],
                mem_ratio=None if get["mem_ratio"] is None else get["mem_ratio"][1],
                mem_ratio_epochs=None if get["mem_ratio"] is None else get["mem_ratio"][0],
                gap=None if gap is None else gap[1], gap_epochs=None if gap is None else gap[0],
                early_learning=el, window=window, confirm=confirm)
    events += detect_registered(series, exclude=set(k.values()),
                                require_descent=require_descent, **p)
    events.sort(key=lambda e: (float(e.epoch), e.name))
    return RunAnalysis(events=events, regime=regime)


def detect_registered(series: Mapping[str, tuple], *, exclude=(), window: int = 5,
                      min_sigma: float = 4.0, min_rel: float = 0.02, confirm: int = 3,
                      require_descent: bool = True) -> list:
    """Events on the registered keys without a role (user metrics, :mod:`lightning_pfd.keys`)
    present in ``series`` (names in ``exclude`` skipped): each of their single-curve
    ``detectors`` — ``early_learning`` (:func:`detect_early_learning`), ``double_descent``
    (:func:`detect_double_descent`), ``minimum`` / ``icr_minimum`` (the U-shaped minimum,
    :func:`detect_icr_minimum`) — runs on the curve alone. Events are named
    ``<key slug>_<detector>``; ``detail`` holds ``key``, ``display`` and ``detector``."""
    p = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    out = []
    for mk in keys_registry.all_keys():
        if mk.role is not None or mk.key in exclude or mk.key not in series:
            continue
        x, y = series[mk.key]
        for det in dict.fromkeys(mk.detectors):
            if det == "early_learning":
                ev = detect_early_learning(x, y, require_descent=require_descent, **p)
            elif det == "double_descent":
                ev = detect_double_descent(x, y, **p)
            elif det in ("minimum", "icr_minimum"):
                det = "minimum"
                ev = detect_icr_minimum(x, y, **p)
            else:  # memorization_onset / regime combine role curves: not for a lone key
                continue
            if ev is not None:
                out.append(Event(f"{keys_registry.slug(mk.key)}_{det}", ev.epoch, ev.significance,
                                 ev.detected_epoch, dict(ev.detail, key=mk.key, display=mk.display,
                                                         detector=det)))
    return out
