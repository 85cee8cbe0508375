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

Which metric is which curve comes from the metric keys (:mod:`lightning_pfd.keys`): the built-in
key holding each role (``e_gen``, ``e_mem``, ``icr``...) forms :data:`DEFAULT_KEYS`, and a key of
the run (``metric_keys``) without a role that lists single-curve detectors (``early_learning``,
``double_descent``, ``minimum``) is analysed on its own by :func:`analyze_history` (events named
``<key slug>_<detector>``, e.g. ``sw_e_gen_early_learning``).

How an event is decided (the same in every detector; derivation in docs/events.md):

1. **Propose** on the *selection* half of the evaluation units (even-indexed seeds / samples):
   the curve shape (smoothed with a running median then mean over ``window`` evaluations,
   extrema with a hysteresis of :data:`PROPOSE_SIGMA` noise units, changes that hold for
   ``confirm`` evaluations) only picks the candidate epochs.
2. **Test** once on the *held-out* half (odd-indexed units): every leg of the event (descent,
   rise, second descent, onset) is a difference of two window means whose standard error is the
   paired per-unit error plus the training-noise term of the curve's
   :class:`~lightning_pfd.analysis.inference.NoiseModel` (variogram bound, local scale, shape
   check; :mod:`lightning_pfd.analysis.inference`); the held-out half shares the training noise
   with the selection half, so the difference is reduced by a *selection allowance* of
   :data:`SELECTION_ALLOWANCE` training-noise standard errors. The event passes when every leg's
   z reaches ``min_sigma`` (default :data:`MIN_SIGMA`, tuned on the tune half of the null
   families of ``experiments/calibration.py``, reported on the held-out half:
   docs/events.md). ``significance`` is the weakest z; ``detail`` has every leg (difference, s.e.
   and its seed / training parts, allowance, z) and the raw z on all units.
3. **Confirmed or undecided**: an event that passes with a noise model that failed one of its
   checks on the run (too few evaluations, a variogram too convex for the bound, no noise
   estimate) has ``status = "undecided"`` and ``detail["undecided_reason"]``; only confirmed
   events are in :attr:`RunAnalysis.events`. No event has an infinite or NaN significance.

Without per-unit values (``units=None``: runs logged before they were kept, user metrics) a
curve is proposed and tested on the same values with the noise model carrying all the noise and
the larger allowance :data:`SELF_SELECTION_ALLOWANCE` on the whole standard error (choosing the
extremes of the tested values biases their z upwards); ``detail["held_out"]`` is False. The same
holds for ICR's jackknife replicates, which cannot be split.

[choice] The detectors are deliberately conservative: a run too short or too noisy to show a
phenomenon reports no event rather than a guess.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Optional, Tuple

import numpy as np

from .. import keys as keys_registry
from .detectors import detectors_for, get_detector
from .inference import (_MAD, MAX_JUMP_SHARE, Curve, LegTest, NoiseModel, contrast, curves_from_units,
                        isolated_jumps, leg_test, scalar_curves, window_indices)
from ..validation import FiniteNonNegativeFloat, NonNegativeFloat, PositiveInt, check_args
from .per_unit import UnitSeries
from .smoothing import as_curve, estimate_noise, smooth

__all__ = [
    "Event",
    "Regime",
    "RunAnalysis",
    "DEFAULT_KEYS",
    "DIVERGED_KEYS",
    "divergence",
    "min_extent",
    "find_transients",
    "describe_transient",
    "MIN_SIGMA",
    "noise_unit",
    "turning_points",
    "detect_early_learning",
    "detect_double_descent",
    "detect_icr_minimum",
    "detect_memorization_onset",
    "classify_regime",
    "analyze_history",
    "detect_registered",
]

#: Role in the analysis → metric name, of the built-in keys (:func:`lightning_pfd.keys.roles`).
DEFAULT_KEYS = keys_registry.roles()

REGIMES = ("generalization", "transition", "memorization")

#: default selection-corrected z every leg of an event must reach (tuned on the tune half of the
#: null families, reported on the held-out half: docs/events.md)
MIN_SIGMA = 2.5
#: hysteresis of the candidate search on the selection half, in noise units of a leg
PROPOSE_SIGMA = 2.0
#: an event's legs last: each spans at least max(2 window + 1, min(MIN_EXTENT_SHARE x the run's
#: evaluations, MIN_EXTENT_CAP)) -- the paper's ascent lasts tens of epochs (PFD paper Fig. 4), a
#: bad batch's excursion (even smoothed by an EMA of the logged value) a few
MIN_EXTENT_SHARE = 0.04
#: the share stops growing at this many evaluations (reached at 500): a transient's width does not
#: grow with the run, so a longer run must not ask a longer ascent of an event (docs/events.md)
MIN_EXTENT_CAP = 20
#: a narrow peak is listed as a transient when it stands this many noise units above the minima
#: beside it (the jump component's JUMP_SIGMA: clearly not noise; an EMA of noisy values has
#: narrow bumps of a few units everywhere)
TRANSIENT_PEAK_SIGMA = 5.0


def min_extent(n: int, window: int) -> int:
    """The fewest evaluations a leg of an event spans on a run of ``n`` evaluations (see
    :data:`MIN_EXTENT_SHARE`, :data:`MIN_EXTENT_CAP`): whatever its height, an excursion shorter
    than that is a transient."""
    share = min(int(math.ceil(MIN_EXTENT_SHARE * int(n))), MIN_EXTENT_CAP)
    return max(2 * int(window) + 1, share)


def _half_width(s: np.ndarray, b: int, base: float) -> int:
    """Evaluations around the peak ``b`` where the smoothed curve is above half of its height
    over ``base`` (the full width at half maximum, contiguous)."""
    half = base + 0.5 * (s[b] - base)
    lo = b
    while lo > 0 and s[lo - 1] >= half:
        lo -= 1
    hi = b
    while hi < s.size - 1 and s[hi + 1] >= half:
        hi += 1
    return hi - lo + 1
#: the selection allowance, in standard errors of the part of a leg's noise that the choice of
#: its places saw: the training noise (common to all units, so the held-out half shares it) and,
#: without a held-out half, the seed noise too. z = (diff − allowance)/se (docs/events.md)
SELECTION_ALLOWANCE = 1.0
#: the selection allowance of a curve without a held-out half (ICR's jackknife, a logged curve
#: alone): its places were chosen on the very values tested, seed noise included
SELF_SELECTION_ALLOWANCE = 1.5
#: an event's status: its test passed with a noise model that passed its checks ("confirmed"),
#: or its test passed but the noise model failed a check or gave no estimate ("undecided")
STATUSES = ("confirmed", "undecided")


def _z_needed(min_sigma: float, held: bool) -> float:
    """The z every leg must reach (the selection allowance is inside each leg's z)."""
    return float(min_sigma)


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
    status: str = "confirmed"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def reason(self) -> Optional[str]:
        """Why an undecided event is undecided (None when confirmed)."""
        return self.detail.get("undecided_reason")

    def describe(self) -> str:
        """One human-readable line (console, markdown)."""
        d = self.detail
        if "detector" in d:  # an event on a user key
            what = d.get("display", d.get("key", "?"))
            if d["detector"] == "double_descent":
                return (f"double descent of {what}: minimum at epoch {format_epoch(d['first_min_epoch'])}, "
                        f"peak at {format_epoch(self.epoch)}, descends again to epoch "
                        f"{format_epoch(d['second_min_epoch'])} ({self.significance:.1f}σ weakest leg)")
            if d["detector"] == "memorization_onset":
                return (f"onset of {what} at epoch {format_epoch(self.epoch)}"
                        f"{_leg_text(d, 'rise', ': rises by ')}")
            if d["detector"] in ("early_learning", "minimum"):
                kind = "early learning of" if d["detector"] == "early_learning" else "minimum of"
                return (f"{kind} {what}: minimum {d['min_value']:.4g} at epoch {format_epoch(self.epoch)}"
                        f"{_leg_text(d, 'rise', ', then rises by ')}")
            return (f"{d['detector'].replace('_', ' ')} of {what} at epoch {format_epoch(self.epoch)} "
                    f"(significance {self.significance:.3g}; a detector of your own)")
        if self.status == "undecided":
            return (f"{self.name.replace('_', ' ')} at epoch {format_epoch(self.epoch)}: undecided "
                    f"({self.reason})")
        if self.name == "early_learning":
            return (f"early learning: E_gen minimum {d['min_value']:.4g} at epoch {format_epoch(self.epoch)}"
                    f"{_leg_text(d, 'descent', ', after a descent of ')}"
                    f"{_leg_text(d, 'rise', ', then rises by ')}")
        if self.name == "double_descent":
            return (f"epoch-wise double descent: minimum at epoch {format_epoch(d['first_min_epoch'])}, "
                    f"peak at {format_epoch(self.epoch)}, descends again to epoch {format_epoch(d['second_min_epoch'])} "
                    f"({self.significance:.1f}σ weakest leg)")
        if self.name == "icr_minimum":
            return (f"ICR minimum {d['min_value']:.4g} at epoch {format_epoch(self.epoch)} (U-shape"
                    f"{_leg_text(d, 'descent', ': descent ')}{_leg_text(d, 'rise', ', rise ')})")
        if self.name == "memorization_onset":
            s = (f"memorization onset at epoch {format_epoch(self.epoch)} from {d.get('source', 'mem/ratio')}"
                 f"{_leg_text(d, 'rise', ': rises by ')}")
            lead = d.get("lead_epochs")
            if lead is not None:
                how = (f"anticipates it by {format_epoch(lead)} epochs" if float(lead) >= 0
                       else f"comes {format_epoch(-float(lead))} epochs after it")
                s += f"; ICR minimum at epoch {format_epoch(d['icr_min_epoch'])} {how}"
            return s
        return f"{self.name} at epoch {format_epoch(self.epoch)} ({self.significance:.1f}σ)"


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
    """Events and regime of one run (output of :func:`analyze_history`): ``events`` are the
    confirmed ones, ``undecided`` those whose test passed with a noise model that failed its
    checks (each says why in ``detail["undecided_reason"]``)."""

    events: list
    regime: Optional[Regime]
    undecided: list = field(default_factory=list)
    #: ``{"epoch", "step"}`` where the run diverged (its module logged ``events/diverged_*``), else None
    diverged: Optional[dict] = None
    #: E_gen's excursions too short to be events (:func:`find_transients`): spikes, bad batches
    transients: list = field(default_factory=list)

    def event(self, name: str) -> Optional[Event]:
        return next((e for e in self.events if e.name == name), None)

    def to_dict(self) -> dict:
        return {"outcome": "diverged" if self.diverged else "finished", "diverged": self.diverged,
                "events": [e.to_dict() for e in self.events],
                "undecided": [e.to_dict() for e in self.undecided],
                "transients": list(self.transients),
                "regime": None if self.regime is None else self.regime.to_dict()}


# ----------------------------------------------------------------------------- helpers
def _leg_text(d: dict, leg: str, prefix: str) -> str:
    """``prefix`` + the leg's size and its own held-out z ("" when the event has no such leg)."""
    rec = (d.get("legs") or {}).get(leg)
    if rec is None:
        return ""
    return f"{prefix}{float(rec['diff']):.3g} (z {float(rec['z']):.1f})"


def format_epoch(x) -> str:
    """An epoch as the event messages print it: an integer without a decimal point, else 3
    significant digits; "—" for None."""
    if x is None:
        return "—"
    x = float(x)
    return str(int(x)) if x.is_integer() else f"{x:.3g}"


def _epoch(x) -> float:
    x = float(x)
    return int(x) if x.is_integer() else x


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


# ----------------------------------------------------------------------------- curves
def _curves(x, y, units, name, window: int = 5):
    """(selection, held-out, full, held_out, noise model) curves: from per-unit values when
    ``units`` (a :class:`~lightning_pfd.analysis.per_unit.UnitSeries`) covers every finite
    evaluation of the logged curve, else from the logged values alone; the training-noise model
    is fitted once on the full curve (the training noise is common to every unit)."""
    key = None if units is None else (id(units), np.shape(units.values), float(np.sum(units.values)),
                                      x.tobytes(), y.tobytes(), name, int(window))
    hit = _CURVES.get(key) if key is not None else None
    if hit is not None and hit[0]() is units:  # the same record, e.g. E_gen for two detectors
        return hit[1]
    sel, test, full, held = _split_curves(x, y, units, name)
    out = (*_without_jumps(sel, test, full, window), held)
    out = (out[0], out[1], out[2], held, out[3])
    if key is not None:
        _CURVES[key] = (weakref.ref(units), out)
        while len(_CURVES) > 8:
            _CURVES.pop(next(iter(_CURVES)))
    return out


#: the last few (curves, noise model) built from a per-unit record: (record id, values, name,
#: window) → (weak reference to the record, result)
_CURVES: dict = {}


def _without_jumps(sel: Curve, test: Curve, full: Curve, window: int):
    """(selection, held-out, full, noise model) with the isolated jumps of the full curve removed
    from all three (:func:`~lightning_pfd.analysis.inference.isolated_jumps`: a bad batch's
    one-epoch excursion, and its EMA tail, is no evidence of a phenomenon and must not make
    the extremum a leg is tested at); a ratio of 0/1 indicators keeps every evaluation. Jumps on
    more than MAX_JUMP_SHARE of the evaluations are not sparse: kept, and the model fails a check
    (undecided)."""
    jumps = np.zeros(len(full), dtype=bool) if full.discrete else isolated_jumps(full.y, window)
    problem = None
    if jumps.any() and jumps.mean() > MAX_JUMP_SHARE:
        problem = (f"isolated jumps on {jumps.mean():.0%} of the evaluations (> {MAX_JUMP_SHARE:.0%}): "
                   "not a sparse jump component")
        jumps[:] = False
    if jumps.any():
        keep = ~jumps
        gone = full.epochs[jumps]
        sel, test, full = sel.take(keep), test.take(keep), full.take(keep)
    else:
        gone = ()
    return sel, test, full, NoiseModel.fit(test, window, jumps=gone, jump_problem=problem)


def _split_curves(x, y, units, name):
    if units is not None:
        ue = np.asarray(units.epochs, dtype=np.float64)
        if x.size and np.all(np.isin(x, ue)):
            keep = np.isin(ue, x)
            sub = UnitSeries(units.key, units.kind, ue[keep], np.asarray(units.values)[keep],
                             units.units, units.logged[keep] if units.logged.size == ue.size
                             else units.logged)
            sel, test, full, held = curves_from_units(sub)
            if len(full) == x.size:
                return sel, test, full, held
    return scalar_curves(x, y)


def noise_unit(curve: Curve, window: int, V=None) -> float:
    """The local noise scale of ``curve``: the standard error of the contrast between two
    adjacent windows of ``window`` evaluations in its middle (seed part + training part,
    :func:`~lightning_pfd.analysis.inference.leg_test`)."""
    n = len(curve)
    w = max(1, min(window, n // 2))
    mid = n // 2
    c = contrast(n, np.arange(mid, min(n, mid + w)), np.arange(max(0, mid - w), mid))
    return leg_test(curve, c, V).se


def _refine(y: np.ndarray, i: int, window: int, kind: str) -> int:
    """The raw extremum (``"min"`` / ``"max"``) of ``y`` within ``window``//2 evaluations of the
    smoothed curve's extremum ``i`` (smoothing locates, the evaluation itself is tested)."""
    h = max(0, int(window) // 2)
    lo, hi = max(0, i - h), min(y.size, i + h + 1)
    seg = y[lo:hi]
    return lo + int(np.argmin(seg) if kind == "min" else np.argmax(seg))


class _Tester:
    """Leg tests on one curve with the training-noise model of the whole curve (fitted once on
    all its units: the training noise is common to them); ``allowance_sd``: the selection
    allowance of the tests (0 for the proposals); ``held``: whether the curve is a held-out
    half (its seed noise did not take part in the choice)."""

    def __init__(self, curve: Curve, window: int, model: Optional[NoiseModel] = None,
                 allowance_sd: float = 0.0, held: bool = True):
        self.curve, self.window, self.n = curve, int(window), len(curve)
        self.model = NoiseModel.fit(curve, window) if model is None else model
        self.allowance_sd, self.held = float(allowance_sd), bool(held)

    def place(self, i: int, end: bool = False) -> np.ndarray:
        """An extremum is compared at its own evaluation; the end of training is the mean of the
        last ``window`` evaluations."""
        return window_indices(i, self.n, self.window, end=True) if end else np.array([int(i)])

    def leg(self, hi, lo) -> LegTest:
        """Test of ``mean(y[hi]) > mean(y[lo])`` (index arrays, see :meth:`place`)."""
        return leg_test(self.curve, contrast(self.n, hi, lo), self.model,
                        allowance_sd=self.allowance_sd, held_out=self.held)

    def proposed(self, hi, lo) -> bool:
        """Whether the leg is large enough to propose (PROPOSE_SIGMA noise units, or any rise
        when the noise estimate is 0: the test then says undecided)."""
        t = self.leg(hi, lo)
        return t.z_raw >= PROPOSE_SIGMA if t.se > 0 else t.diff > 0

    def unit(self) -> float:
        return noise_unit(self.curve, self.window, self.model)


def _proposal_threshold(sel: Curve, window: int, min_rel: float, min_amplitude: float,
                        s: np.ndarray, model: Optional[NoiseModel] = None) -> Tuple[float, "_Tester"]:
    """Hysteresis of the candidate search on the selection curve: PROPOSE_SIGMA noise units of a
    leg, or the effect-size floors ``min_rel``·max|s| / ``min_amplitude`` when larger."""
    t = _Tester(sel, window, model)
    scale = float(np.max(np.abs(s))) if s.size else 0.0
    thr = max(PROPOSE_SIGMA * t.unit(), min_rel * scale, float(min_amplitude))
    return (thr if thr > 0 else np.finfo(np.float64).tiny), t


def _legs_detail(legs: dict, full_legs: dict) -> dict:
    return {"legs": {k: v.to_dict() for k, v in legs.items()},
            "z_all_units": {k: v.z_raw for k, v in full_legs.items()}}


def _testers(test: Curve, full: Curve, window: int, held: bool, model: NoiseModel):
    """The tester of the decision (held-out curve, selection allowance) and the one for
    information (all units, no allowance)."""
    allowance = SELECTION_ALLOWANCE if held else SELF_SELECTION_ALLOWANCE
    return (_Tester(test, window, model, allowance, held), _Tester(full, window, model, 0.0, False))


def _verdict(legs: dict, model: NoiseModel, min_sigma: float) -> Tuple[Optional[str], Optional[str], float]:
    """(status, reason, significance) of tested legs: None when a leg is not significant (no
    event); "undecided" when a leg has no noise estimate (se = 0) or the noise model failed a
    check (every reason listed); "confirmed" otherwise. The significance is the weakest finite
    z, 0.0 when no leg has one (never NaN or ±∞)."""
    zs = [v.z for v in legs.values()]
    if any(np.isfinite(z) and z < min_sigma for z in zs):
        return None, None, math.nan
    if any(v.se == 0 and v.diff <= 0 for v in legs.values()):
        return None, None, math.nan
    finite = [z for z in zs if np.isfinite(z)]
    significance = float(min(finite)) if finite else 0.0
    reasons = list(model.problems)
    zero = [k for k, v in legs.items() if not np.isfinite(v.z)]
    if zero:
        reasons.insert(0, f"no noise estimate for the {', '.join(zero)} leg(s): seed and training "
                          "noise both estimated as 0")
    if reasons:
        return "undecided", "; ".join(reasons), significance
    return "confirmed", None, significance


def _decided(status: Optional[str], reason: Optional[str], detail: dict, model: NoiseModel) -> dict:
    allowance = SELECTION_ALLOWANCE if detail.get("held_out") else SELF_SELECTION_ALLOWANCE
    out = dict(detail, noise_model=model.to_dict(), selection_allowance=allowance)
    if status == "undecided":
        out["undecided_reason"] = reason
    return out


def _effect_ok(legs: dict, min_rel: float, min_amplitude: float, scale: float) -> bool:
    floor = max(min_rel * scale, float(min_amplitude))
    return all(v.diff >= floor for v in legs.values())


# ----------------------------------------------------------------------------- detectors
def _rise_lasts(s: np.ndarray, m: int, c: int, thr: float, extent: int) -> bool:
    """The rise from the minimum ``m`` holds to the end: from its first confirmed evaluation ``c``
    it spans ``extent`` evaluations, and the smoothed curve stays raised (>= minimum + ``thr``/2)
    on at least 80 % of them."""
    tail = s[c:]
    return tail.size >= extent and float(np.mean(tail >= s[m] + 0.5 * thr)) >= 0.8


def _u_shape(x, y, units, *, name, window, min_sigma, min_rel, confirm, min_amplitude,
             require_descent=True):
    """Interior minimum of the curve with a descent before it and a rise after it that holds to
    the end (early learning, the ICR minimum). Proposed on the selection curve (smoothed:
    minimum, descent start, a rise confirmed for ``confirm`` evaluations that never falls back
    and no later descent), tested on the held-out curve: descent = window at the descent start
    minus window at the minimum, rise = last ``window`` evaluations minus window at the minimum;
    both z >= ``min_sigma``."""
    if x.size < max(5, confirm + 2):
        return None
    sel, test, full, held, model = _curves(x, y, units, name, window)
    x = full.epochs  # the evaluations tested (isolated jumps removed)
    s = smooth(sel.y, window)
    thr, ts = _proposal_threshold(sel, window, min_rel, min_amplitude, s, model)
    m = _refine(sel.y, int(np.argmin(s)), window, "min")
    if m > x.size - 1 - confirm:
        return None  # lowest at the end: no rise to confirm
    a = _refine(sel.y[: m + 1], int(np.argmax(s[: m + 1])), window, "max")
    descent_seen = m > 0 and ts.proposed(ts.place(a), ts.place(m))
    if not descent_seen and (require_descent or m > 0):
        return None
    if not ts.proposed(ts.place(0, end=True), ts.place(m)):
        return None
    body = s[m: x.size - window]  # before the end window
    partial = None
    if body.size:
        peak = _refine(sel.y, m + int(np.argmax(body)), window, "max")
        back = ts.leg(ts.place(peak), ts.place(0, end=True))
        if back.se > 0 and back.z_raw >= max(min_sigma, PROPOSE_SIGMA):
            # rises, then descends again: early learning with a partial descent when the end is
            # still above the minimum (the rise leg is tested below); a double descent when it
            # falls back (analyze_history prefers a confirmed double descent)
            partial = (peak, back.diff)
    c = _first_run(s[m:] - s[m] >= thr, confirm)
    c = x.size - confirm if c is None else c + m
    if not _rise_lasts(s, m, c, thr, min_extent(x.size, window)):
        return None  # a late excursion (a spike in the end window), not a rise to the end
    legs, legs_full = {}, {}
    for tt, out in zip(_testers(test, full, window, held, model), (legs, legs_full)):
        if descent_seen:
            out["descent"] = tt.leg(tt.place(a), tt.place(m))
        out["rise"] = tt.leg(tt.place(0, end=True), tt.place(m))
    status, reason, z = _verdict(legs, model, min_sigma)
    scale = float(np.max(np.abs(smooth(full.y, window))))
    if status is None or not _effect_ok(legs, min_rel, min_amplitude, scale):
        return None
    return Event(
        name=name, epoch=_epoch(x[m]), significance=z, status=status,
        detected_epoch=_epoch(x[min(c + confirm - 1, x.size - 1)]),
        detail=_decided(status, reason, {
            "min_value": float(full.y[m]), "descent": legs_full.get("descent", LegTest(0, 0, 0)).diff,
            "descent_observed": bool(descent_seen), "rise": legs_full["rise"].diff,
            "descent_start_epoch": _epoch(x[a]), "held_out": bool(held),
            "partial_descent": None if partial is None else {"peak_epoch": _epoch(x[partial[0]]),
                                                              "descent": float(partial[1])},
            "threshold_z": _z_needed(min_sigma, held), "window": int(window), "confirm": int(confirm),
            **_legs_detail(legs, legs_full)}, model),
    )


def detect_early_learning(epochs, e_gen, *, units=None, window: PositiveInt = 5,
                          min_sigma: FiniteNonNegativeFloat = MIN_SIGMA, min_rel: FiniteNonNegativeFloat = 0.0,
                          confirm: PositiveInt = 3, min_amplitude: FiniteNonNegativeFloat = 0.0,
                          require_descent: bool = True) -> Optional[Event]:
    """Early learning (PFD paper §4.2, Fig. 4 left/middle): E_gen falls to an interior minimum,
    then rises until the end of training.

    ``units``: the per-seed record of E_gen (:class:`~lightning_pfd.analysis.per_unit.UnitSeries`)
    — the minimum is proposed on half of the seeds and the two legs (descent to the minimum, rise
    from it to the last ``window`` evaluations) are tested on the other half with the paired
    per-seed error plus the training-noise term (:mod:`lightning_pfd.analysis.inference`);
    without it, on the logged curve alone. ``significance`` = the smaller held-out z of the two
    legs (>= ``min_sigma``). ``require_descent=False`` also accepts a minimum at the first
    evaluation (``detail["descent_observed"]`` False; then only the rise is tested).
    ``min_rel`` / ``min_amplitude``: optional effect-size floors (relative to max|E_gen|,
    absolute) on each leg. None when there is no such event or fewer than max(5, confirm + 2)
    finite points.
    """
    check_args(detect_early_learning, locals())
    x, y = _prepare(epochs, e_gen, "e_gen")
    return _u_shape(x, y, units, name="early_learning", window=window, min_sigma=min_sigma,
                    min_rel=min_rel, confirm=confirm, min_amplitude=min_amplitude,
                    require_descent=require_descent)


def detect_icr_minimum(epochs, icr, *, units=None, window: PositiveInt = 5,
                       min_sigma: FiniteNonNegativeFloat = MIN_SIGMA, min_rel: FiniteNonNegativeFloat = 0.0,
                       confirm: PositiveInt = 3, min_amplitude: FiniteNonNegativeFloat = 0.0) -> Optional[Event]:
    """U-shaped ICR over training (ICR paper §5.2, Fig. 5): the interior minimum, with a
    significant descent before it and a significant rise after it that holds to the end; the
    same test as :func:`detect_early_learning` (``units``: ICR's jackknife replicates, which give
    the paired error but no held-out half). In the data-rich regime ICR decreases monotonically
    and this returns None."""
    check_args(detect_icr_minimum, locals())
    x, y = _prepare(epochs, icr, "icr")
    return _u_shape(x, y, units, name="icr_minimum", window=window, min_sigma=min_sigma,
                    min_rel=min_rel, confirm=confirm, min_amplitude=min_amplitude)


def _lasts(s: np.ndarray, a: int, b: int, c: int, extent: int) -> bool:
    """A double descent's ascent (min a -> peak b) and second descent (b -> min c) each span
    ``extent`` evaluations, and the peak is that wide at half its height (:func:`min_extent`)."""
    return b - a >= extent and c - b >= extent and _half_width(s, b, max(s[a], s[c])) >= extent


def _transient_scale(y: np.ndarray, window: int) -> float:
    """The noise unit of :func:`find_transients`: the larger of the epoch-to-epoch noise
    (:func:`~lightning_pfd.analysis.smoothing.estimate_noise`) and the robust sd of the curve
    around a wide smoother (4·window + 1 evaluations), which sees noise that an EMA of the logged
    value made smooth at the evaluation spacing (its second differences are small, its bumps not)."""
    r = y - smooth(y, 4 * int(window) + 1)
    wide = _MAD * float(np.median(np.abs(r - np.median(r))))  # MAD -> sd
    return max(float(estimate_noise(y)), wide)


def _jump_transients(x: np.ndarray, y: np.ndarray, window: int) -> list:
    """The isolated jumps of the curve (:func:`~lightning_pfd.analysis.inference.isolated_jumps`:
    a bad batch, with the EMA tail it leaves), one transient per run of consecutive jump
    evaluations: its first epoch, its height over the median of the ``window`` evaluations before
    it (signed: a dip is negative) and its width."""
    mask = isolated_jumps(y, window)
    out, i, k = [], 0, max(2, int(window))
    while i < y.size:
        if not mask[i]:
            i += 1
            continue
        j = i
        while j + 1 < y.size and mask[j + 1]:
            j += 1
        base = float(np.median(y[max(0, i - k):i]))
        out.append({"epoch": _epoch(x[i]), "height": float(y[i] - base), "width_evaluations": int(j - i + 1),
                    "kind": "jump"})
        i = j + 1
    return out


def describe_transient(t: dict) -> str:
    """One line for a transient of :func:`find_transients` (console, report.md, W&B table)."""
    h, w = float(t["height"]), int(t["width_evaluations"])
    if t.get("kind") == "jump":
        tail = f" and {w - 1} evaluation(s) of its decay" if w > 1 else ""
        return (f"isolated jump of E_gen by {h:+.3g}{tail}: a bad batch, removed before any test "
                "(not an event)")
    return f"narrow peak of E_gen, {h:+.3g} over {w} evaluation(s) at half height (not an event)"


def find_transients(epochs, values, *, window: PositiveInt = 5, threshold: Optional[float] = None) -> list:
    """Excursions of a curve that are not events, reported beside the events, never as one:

    - ``kind = "jump"``: the isolated jumps the noise model removes before any test (a bad batch
      raising E_gen for one epoch, and its EMA tail; :func:`_jump_transients`);
    - ``kind = "peak"``: peaks of the smoothed curve at least ``threshold`` (default
      :data:`TRANSIENT_PEAK_SIGMA` units of :func:`_transient_scale`) above the higher of the
      minima beside them and narrower at half height than :func:`min_extent` evaluations, not
      already reported as a jump.

    ``[{"epoch", "height", "width_evaluations", "kind"}]`` in epoch order."""
    x, y = np.asarray(epochs, float), np.asarray(values, float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 2 * window + 3:
        return []
    jumps = _jump_transients(x, y, window)
    s = smooth(y, window)
    thr = threshold if threshold is not None else TRANSIENT_PEAK_SIGMA * _transient_scale(y, window)
    if not thr > 0:
        return jumps
    piv = turning_points(s, thr)
    extent, peaks = min_extent(x.size, window), []
    near = {j["epoch"] for j in jumps}
    for k in range(1, len(piv) - 1):
        b, kind = piv[k]
        if kind != "max":
            continue
        a, c = piv[k - 1][0], piv[k + 1][0]
        base = max(s[a], s[c])
        width = _half_width(s, b, base)
        lo, hi = x[max(0, b - window)], x[min(x.size - 1, b + window)]
        if width < extent and s[b] - base >= thr and not any(lo <= e <= hi for e in near):
            peaks.append({"epoch": _epoch(x[b]), "height": float(s[b] - base), "width_evaluations": int(width),
                          "kind": "peak"})
    return sorted(jumps + peaks, key=lambda t: t["epoch"])


def detect_double_descent(epochs, e_gen, *, units=None, window: PositiveInt = 5,
                          min_sigma: FiniteNonNegativeFloat = MIN_SIGMA, min_rel: FiniteNonNegativeFloat = 0.0,
                          confirm: PositiveInt = 3, min_amplitude: FiniteNonNegativeFloat = 0.0) -> Optional[Event]:
    """Epoch-wise double descent (PFD paper §4.2, Fig. 4 right): E_gen decreases, increases, then
    decreases again.

    Proposed on the selection curve: the significant extrema of the smoothed curve
    (:func:`turning_points`, hysteresis = a few noise units) give patterns min₁ < peak > min₂
    preceded by a descent, each leg holding ``confirm`` evaluations; the one whose weakest leg is
    largest is kept. Tested once on the held-out curve: first descent (window at the start of the
    descent minus window at min₁), ascent (peak minus min₁), second descent (peak minus min₂),
    each z >= ``min_sigma``. ``epoch`` = the peak; ``significance`` = the weakest held-out z.
    The ascent and the second descent each last :func:`min_extent` evaluations, and so does the
    peak at half its height: an excursion of a few epochs (a bad batch) is never one, whatever
    its height (:func:`find_transients` reports it).
    """
    check_args(detect_double_descent, locals())
    x, y = _prepare(epochs, e_gen, "e_gen")
    if x.size < max(7, 2 * confirm + 3):
        return None
    sel, test, full, held, model = _curves(x, y, units, "e_gen", window)
    x = full.epochs  # the evaluations tested (isolated jumps removed)
    s = smooth(sel.y, window)
    thr, _ = _proposal_threshold(sel, window, min_rel, min_amplitude, s, model)
    piv = turning_points(s, thr)
    extent = min_extent(x.size, window)
    best = None
    for k in range(len(piv) - 2):
        (a, ka) = piv[k]
        if ka != "min":
            continue
        b, c = piv[k + 1][0], piv[k + 2][0]
        a0 = int(np.argmax(s[: a + 1]))
        d1, up, d2 = float(s[a0] - s[a]), float(s[b] - s[a]), float(s[b] - s[c])
        if min(d1, up, d2) < thr:
            continue
        n_up = int(np.sum(s[a:b + 1] >= s[a] + thr))
        n_down = int(np.sum(s[b:] <= s[b] - thr))
        if n_up < confirm or n_down < confirm:
            continue
        if not _lasts(s, a, b, c, extent):  # a transient (a bad batch), not an ascent
            continue
        weakest = min(d1, up, d2)
        if best is None or weakest > best[0]:
            j = b + int(np.flatnonzero(s[b:] <= s[b] - thr)[confirm - 1])
            best = (weakest, a0, a, b, c, j)
    if best is None:
        return None
    _, a0, a, b, c, j = best
    a0 = _refine(sel.y, a0, window, "max")
    a, b, c = (_refine(sel.y, a, window, "min"), _refine(sel.y, b, window, "max"),
               _refine(sel.y, c, window, "min"))
    legs, legs_full = {}, {}
    for tt, out in zip(_testers(test, full, window, held, model), (legs, legs_full)):
        out["first_descent"] = tt.leg(tt.place(a0), tt.place(a))
        out["ascent"] = tt.leg(tt.place(b), tt.place(a))
        out["second_descent"] = tt.leg(tt.place(b), tt.place(c))
    status, reason, z = _verdict(legs, model, min_sigma)
    scale = float(np.max(np.abs(smooth(full.y, window))))
    if status is None or not _effect_ok(legs, min_rel, min_amplitude, scale):
        return None
    return Event(
        name="double_descent", epoch=_epoch(x[b]), significance=z, detected_epoch=_epoch(x[j]),
        status=status,
        detail=_decided(status, reason, {
            "first_min_epoch": _epoch(x[a]), "peak_epoch": _epoch(x[b]),
            "second_min_epoch": _epoch(x[c]), "first_descent": legs_full["first_descent"].diff,
            "ascent": legs_full["ascent"].diff, "second_descent": legs_full["second_descent"].diff,
            "held_out": bool(held), "threshold_z": _z_needed(min_sigma, held), "window": int(window),
            "confirm": int(confirm), **_legs_detail(legs, legs_full)}, model),
    )


def _onset_from_ratio(x, r, units, *, window, min_sigma, confirm, min_rise, source="mem/ratio"):
    """The smoothed ratio (selection half) exceeds its running minimum by the proposal threshold
    for ``confirm`` evaluations; tested: window at the later maximum minus window at the
    baseline minimum, on the held-out half."""
    sel, test, full, held, model = _curves(x, r, units, "mem_ratio", window)
    x = full.epochs  # the evaluations tested (isolated jumps removed)
    s = smooth(sel.y, window)
    thr, _ = _proposal_threshold(sel, window, 0.0, 0.0, s, model)
    base = np.minimum.accumulate(s)
    i = _first_run(s - base >= thr, confirm)
    if i is None:
        return None
    b0 = _refine(sel.y[: i + 1], int(np.argmin(s[: i + 1])), window, "min")
    # tested: the level the ratio holds at the end (last ``window`` evaluations) against the
    # baseline, the mean of up to 4·window evaluations before the onset (not their minimum, nor
    # the later maximum: long windows the choice of the onset barely biases)
    base_idx = np.arange(max(0, i - 4 * int(window)), max(i, 1))
    legs, legs_full = {}, {}
    for tt, out in zip(_testers(test, full, window, held, model), (legs, legs_full)):
        out["rise"] = tt.leg(tt.place(0, end=True), base_idx)
    status, reason, z = _verdict(legs, model, min_sigma)
    if status is None or legs_full["rise"].diff < min_rise:
        return None
    return Event(
        name="memorization_onset", epoch=_epoch(x[i]), significance=z, status=status,
        detected_epoch=_epoch(x[i + confirm - 1]),
        detail=_decided(status, reason, {
            "source": source, "baseline": float(full.y[b0]), "baseline_epoch": _epoch(x[b0]),
            "rise": legs_full["rise"].diff, "final_value": float(full.y[-1]),
            "held_out": bool(held), "threshold_z": _z_needed(min_sigma, held),
            **_legs_detail(legs, legs_full)}, model),
    )


def detect_memorization_onset(epochs, mem_ratio, icr=None, *, window: PositiveInt = 5,
                              min_sigma: FiniteNonNegativeFloat = MIN_SIGMA,
                              min_rel: FiniteNonNegativeFloat = 0.0, confirm: PositiveInt = 3,
                              min_ratio_rise: FiniteNonNegativeFloat = 0.02,
                              icr_epochs=None, units=None, icr_units=None) -> Optional[Event]:
    """Memorization onset (ICR paper §5.2, Fig. 5) from a memorization signal: the memorization
    ratio (or another metric declared with the ``memorization_onset`` detector).

    Proposed where the smoothed ratio of the selection half first exceeds its running minimum for
    ``confirm`` evaluations; tested on the held-out half (per-sample indicators ``units``): the
    window at the later maximum minus the window at the baseline minimum, at least
    ``min_ratio_rise``. A discrete ratio's training noise is never estimated as exactly 0 where
    it moves (:func:`~lightning_pfd.analysis.inference.variogram` falls back to the classical
    variance when most differences are 0); with no noise estimate at all the onset is undecided.
    E_gen / E_mem alone never give an onset (E_mem also falls while the model learns the data).

    Early warning: the ICR minimum (:func:`detect_icr_minimum` on ``icr``, confirmed only);
    ``detail`` then holds ``icr_min_epoch`` and ``lead_epochs = onset − icr_min_epoch`` (> 0: ICR
    anticipates). ``icr_epochs`` default to ``epochs``. None when no onset is found.
    """
    check_args(detect_memorization_onset, locals())
    if mem_ratio is None:
        raise ValueError("detect_memorization_onset needs mem_ratio (a memorization signal); "
                         "E_gen / E_mem alone give no onset")
    x, r = _prepare(epochs, mem_ratio, "mem_ratio")
    if x.size < max(5, confirm + 2):
        return None
    ev = _onset_from_ratio(x, r, units, window=window, min_sigma=min_sigma, confirm=confirm,
                           min_rise=min_ratio_rise)
    if ev is None or icr is None:
        return ev
    icr_ev = detect_icr_minimum(epochs if icr_epochs is None else icr_epochs, icr, units=icr_units,
                                window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    if icr_ev is not None and icr_ev.status == "confirmed":
        detail = dict(ev.detail, icr_min_epoch=icr_ev.epoch,
                      lead_epochs=_epoch(float(ev.epoch) - float(icr_ev.epoch)))
        ev = Event(ev.name, ev.epoch, ev.significance, ev.detected_epoch, detail, ev.status)
    return ev


def _tail_mean(epochs, values, window, confirm):
    x, y = _prepare(epochs, values, "values")
    if y.size == 0:
        return None
    s = smooth(y, window) if y.size >= 3 else y
    return float(np.mean(s[-max(1, min(confirm, s.size)):]))


def classify_regime(epochs, e_gen, e_mem, *, mem_ratio=None, gap=None,
                    early_learning: Optional[Event] = None, margin: NonNegativeFloat = 0.15,
                    ratio_memorized: float = 0.5, ratio_clean: float = 0.05,
                    window: PositiveInt = 5, confirm: PositiveInt = 3,
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
    check_args(classify_regime, locals())
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
            reasons.append(f"early learning at epoch {format_epoch(early_learning.epoch)}")
        if ratio_end is not None and ratio_end >= ratio_clean:
            reasons.append(f"memorization ratio {ratio_end:.3g} >= {ratio_clean}")
    return Regime(name=name, score=float(score), reasons=tuple(reasons),
                  detail={"e_gen_end": g, "e_mem_end": m, "mem_ratio_end": ratio_end,
                          "gap_end": gap_end, "margin": float(margin)})


# ----------------------------------------------------------------------------- all at once
def analyze_history(series: Mapping[str, tuple], *, keys: Optional[Mapping[str, str]] = None,
                    window: PositiveInt = 5, min_sigma: FiniteNonNegativeFloat = MIN_SIGMA,
                    min_rel: FiniteNonNegativeFloat = 0.0, confirm: PositiveInt = 3, final: bool = True,
                    require_descent: bool = True,
                    units: Optional[Mapping[str, UnitSeries]] = None,
                    metric_keys: Optional[keys_registry.KeySet] = None) -> RunAnalysis:
    """Run every detector on ``series`` = {metric name: (epochs, values)} (e.g.
    :meth:`lightning_pfd.analysis.history.History.series_dict`). Missing metrics are skipped.
    ``keys`` overrides :data:`DEFAULT_KEYS`; ``final=False`` skips the regime (for a run still
    training); ``require_descent`` is passed to :func:`detect_early_learning`; ``units`` =
    {metric name: :class:`~lightning_pfd.analysis.per_unit.UnitSeries`} (the run's per-unit
    records: held-out tests with paired errors); ``metric_keys``: the run's keys, whose user keys
    get their own detectors (:func:`detect_registered`)."""
    check_args(analyze_history, locals())
    k = dict(DEFAULT_KEYS, **(keys or {}))
    unknown = set(keys or {}) - set(DEFAULT_KEYS)
    if unknown:
        raise ValueError(f"keys: unknown roles {sorted(unknown)}; allowed {sorted(DEFAULT_KEYS)}")
    get = {role: series.get(name) for role, name in k.items()}
    u = {role: (units or {}).get(name) for role, name in k.items()}
    p = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    found = []
    el = dd = None
    if get["e_gen"] is not None:
        el = detect_early_learning(*get["e_gen"], units=u["e_gen"], require_descent=require_descent, **p)
        dd = detect_double_descent(*get["e_gen"], units=u["e_gen"], **p)
        if (el is not None and dd is not None and dd.status == "confirmed"
                and el.detail.get("partial_descent") is not None):
            el = None  # a rise that descends again is the double descent's ascent
        found += [e for e in (el, dd) if e is not None]
    if get["icr"] is not None:
        found.append(detect_icr_minimum(*get["icr"], units=u["icr"], **p))
    if get["mem_ratio"] is not None:  # an onset only from a memorization signal
        ratio = get["mem_ratio"]
        found.append(detect_memorization_onset(
            ratio[0], ratio[1], icr=None if get["icr"] is None else get["icr"][1],
            icr_epochs=None if get["icr"] is None else get["icr"][0],
            units=u["mem_ratio"], icr_units=u["icr"], **p))
    if el is not None and el.status != "confirmed":
        el = None
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
    found += detect_registered(series, exclude=set(k.values()), units=units,
                               require_descent=require_descent, metric_keys=metric_keys, **p)
    found = sorted((e for e in found if e is not None), key=lambda e: (float(e.epoch), e.name))
    diverged = divergence(series)
    if diverged is not None:  # nothing is confirmed from the diverged part; no healthy regime
        found = [_after_divergence(e, diverged) for e in found]
        regime = None
    transients = find_transients(*get["e_gen"], window=window) if get["e_gen"] is not None else []
    return RunAnalysis(events=[e for e in found if e.status == "confirmed"], regime=regime,
                       undecided=[e for e in found if e.status != "confirmed"], diverged=diverged,
                       transients=transients)


#: what a module logs when it diverges (``lightning_pfd.modules.base.ResumableModule``)
DIVERGED_KEYS = ("events/diverged_epoch", "events/diverged_step", "events/diverged_cause")
#: ``events/diverged_cause`` (1 + the index of ``lightning_pfd.modules.base.DIVERGENCE_CAUSES``)
#: in words
DIVERGED_CAUSES = {1: "non-finite loss or gradients", 2: "an exploding (finite) loss",
                   3: "exploding or non-finite weights", 4: "collapsed outputs (constant features)"}


def divergence(series: Mapping[str, tuple]) -> Optional[dict]:
    """``{"epoch", "step", "cause"}`` of the first divergence the run logged
    (``events/diverged_epoch`` / ``_step`` / ``_cause`` in ``series``; a run logged before the
    cause was: non-finite values), else None."""
    ep = series.get(DIVERGED_KEYS[0])
    if ep is None or len(ep[1]) == 0 or not np.isfinite(np.asarray(ep[1], float)).any():
        return None
    epoch = float(np.nanmin(np.asarray(ep[1], float)))
    st = series.get(DIVERGED_KEYS[1])
    step = float(np.nanmin(np.asarray(st[1], float))) if st is not None and len(st[1]) else None
    ca = series.get(DIVERGED_KEYS[2])
    code = (int(np.nanmin(np.asarray(ca[1], float))) if ca is not None and len(ca[1])
            and np.isfinite(np.asarray(ca[1], float)).any() else 1)
    return {"epoch": int(epoch), "step": None if step is None else int(step),
            "cause": DIVERGED_CAUSES.get(code, DIVERGED_CAUSES[1])}


def _after_divergence(e: Event, diverged: dict) -> Event:
    """An event whose evidence reaches the diverged epoch is not confirmed: undecided, saying so."""
    if e.status != "confirmed" or float(e.detected_epoch) < diverged["epoch"]:
        return e
    detail = dict(e.detail, undecided_reason=f"the run diverged at epoch {diverged['epoch']}: "
                  "no event is confirmed from measurements that reach it")
    return replace(e, status="undecided", detail=detail)


#: the built-in single-curve detectors a user key may declare (``icr_minimum`` is ``minimum``);
#: user detectors come from :mod:`lightning_pfd.analysis.detectors`
_CURVE_DETECTORS = {"early_learning": detect_early_learning, "double_descent": detect_double_descent,
                    "minimum": detect_icr_minimum, "memorization_onset": detect_memorization_onset}


def detect_registered(series: Mapping[str, tuple], *, exclude=(), window: PositiveInt = 5,
                      min_sigma: FiniteNonNegativeFloat = MIN_SIGMA, min_rel: FiniteNonNegativeFloat = 0.0,
                      confirm: PositiveInt = 3,
                      require_descent: bool = True,
                      units: Optional[Mapping[str, UnitSeries]] = None,
                      metric_keys: Optional[keys_registry.KeySet] = None) -> list:
    """Events on the keys of ``metric_keys`` (default: the built-in ones,
    :data:`lightning_pfd.keys.BUILTIN`) without a role (user metrics) present in ``series`` (names in ``exclude`` skipped): each of their single-curve
    ``detectors`` — ``early_learning`` (:func:`detect_early_learning`), ``double_descent``
    (:func:`detect_double_descent`), ``minimum`` / ``icr_minimum`` (the U-shaped minimum,
    :func:`detect_icr_minimum`), ``memorization_onset`` (a declared memorization signal: the
    ratio's onset rule, :func:`detect_memorization_onset`) or a registered user detector
    (:func:`lightning_pfd.analysis.detectors.register_detector`) — runs on the curve alone. Events
    are named ``<key slug>_<detector>``; ``detail`` holds ``key``, ``display`` and ``detector``;
    undecided events are returned too (``status``)."""
    check_args(detect_registered, locals())
    p = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
    out = []
    for mk in (keys_registry.BUILTIN if metric_keys is None else metric_keys).all_keys():
        if mk.key not in series:
            continue
        watching = detectors_for(mk.key)  # user detectors registered with this key (any key)
        if (mk.role is not None or mk.key in exclude) and not watching:
            continue
        x, y = series[mk.key]
        uk = (units or {}).get(mk.key)
        declared = () if mk.role is not None or mk.key in exclude else mk.detectors
        for det in dict.fromkeys([*declared, *watching]):
            det = "minimum" if det == "icr_minimum" else det
            fn = _CURVE_DETECTORS.get(det) or get_detector(det)
            if fn is None:  # the regime combines role curves: not for a lone key
                continue
            extra = {"require_descent": require_descent} if det == "early_learning" else {}
            ev = fn(x, y, units=uk, **extra, **p)
            if ev is not None and det == "memorization_onset":  # a declared memorization signal
                ev.detail["source"] = mk.key
            if ev is not None:
                out.append(Event(f"{keys_registry.slug(mk.key)}_{det}", ev.epoch, ev.significance,
                                 ev.detected_epoch, dict(ev.detail, key=mk.key, display=mk.display,
                                                         detector=det), ev.status))
    return out
