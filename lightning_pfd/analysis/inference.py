"""Statistical tests for training-dynamics events: paired per-unit errors plus training noise
(pure numpy; derivation in docs/events.md, "The test").

An event compares the metric at two places of its curve (the E_gen minimum and the end of
training, a peak and a minimum, ...). Each place is the mean of the curve over a window of
``window`` evaluations, so a leg is a *contrast* c·y with weights c over the evaluations
(+1/|B| on one window, -1/|A| on the other, sum c = 0). Its variance has two parts:

1. **Seed (unit) noise**, exact and paired: the same evaluation seeds (samples, groups) are used
   at every epoch, so the contrast is a mean over units of per-unit contrasts. For E = sqrt(mean
   d²) the delta method linearizes E_t around its value: u_i = sum_t c_t d²_{t,i} / (2 E_t), and
   Var_seed = var_i(u_i) / U; for a mean of indicators u_i = sum_t c_t x_{t,i}; for jackknife
   replicates r_{t,g}, Var = (G-1)/G sum_g (u_g - mean u)². Slow per-seed changes (a seed whose
   endpoint flips between mixture components) are inside this term whatever their time scale.
2. **Training noise**: checkpoint-to-checkpoint variation common to every unit (EMA, optimizer
   noise). It is read off the curve's variogram V(h) = Var(y_{t+h} - y_t). Third differences at
   lag h, D_h(t) = y_{t+2h} - 3y_{t+h} + 3y_t - y_{t-h}, cancel any locally quadratic trend
   (the curvature of a real event too, to first order) and satisfy
   Var D_h = 15V(h) - 6V(2h) + V(3h) (the variogram identity below); for an increasing concave
   variogram (white noise, AR(1) with φ > 0, random walks) V(2h) <= 2V(h) and V(3h) >= V(h),
   hence V(h) <= Var(D_h)/4 — the bound used (white noise gets 2.5x its true variance, a
   random walk 1.5x). Var(D_h) is estimated robustly (MAD) over t, the seed part of D_h (term
   1, its mean over t: the per-t estimates are right-skewed, a median under-subtracts) is subtracted when per-unit values exist, every lag up to a short lag
   h_s is estimated, and beyond h_s V is the smaller of the estimate on longer lags and the
   secant extension from h_s/2 to h_s (:func:`variogram`). Then
   Var_train(c·y) = -1/2 sum_{s,t} c_s c_t V(|s-t|) (the variogram identity for sum c = 0).

z = c·y / sqrt(Var_seed + Var_train). Candidates are *proposed* on one half of the units (the
selection half) and *tested* once on the other half (the held-out half), so picking the most
extreme epochs does not bias the test; the z of the held-out half is the event's significance.
A curve without per-unit values (a run logged before they were kept, a user metric) has no
held-out half: it is proposed and tested on the same values, with the variogram carrying all the
noise, and the event says ``held_out = False``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..validation import NonNegativeInt, PositiveFloat, PositiveInt, check_args
from .per_unit import UnitSeries

__all__ = ["Curve", "curves_from_units", "scalar_curves", "window_indices", "contrast",
           "isolated_jumps", "tail_check", "variogram", "shape_exponent", "shape_factor", "NoiseModel", "LegTest", "leg_test"]

_MAD = 1.482602218505602
#: every SELECT_EVERY-th unit proposes candidates, the others test them
SELECT_EVERY = 2


@dataclass
class Curve:
    """One metric curve as the tests see it: ``epochs`` (T,), values ``y`` (T,) and, when
    per-unit values exist, ``units`` (T, U) with ``kind``: ``"linear"`` (y_t is linear in the
    unit columns to first order: the columns are the delta-method terms, mean over units) or
    ``"jackknife"`` (the columns are delete-a-group replicates); ``"scalar"``: no units."""

    epochs: np.ndarray
    y: np.ndarray
    units: Optional[np.ndarray] = None
    kind: str = "scalar"
    #: the units are 0/1 indicators (a memorization ratio): the training part of the variogram
    #: has a binomial floor (:func:`variogram`)
    discrete: bool = False

    def __len__(self) -> int:
        return int(self.y.size)

    def slice(self, lo: int, hi: int) -> "Curve":
        """The evaluations lo..hi-1 (a local segment of the curve)."""
        u = None if self.units is None else self.units[lo:hi]
        return Curve(self.epochs[lo:hi], self.y[lo:hi], u, self.kind, self.discrete)

    def take(self, keep: np.ndarray) -> "Curve":
        """The evaluations where the boolean mask ``keep`` is True."""
        u = None if self.units is None else self.units[keep]
        return Curve(self.epochs[keep], self.y[keep], u, self.kind, self.discrete)

    def seed_var(self, rows: np.ndarray) -> np.ndarray:
        """Seed variance of each contrast row (K, T) (0 without units)."""
        rows = np.atleast_2d(rows)
        if self.units is None:
            return np.zeros(rows.shape[0])
        return self.unit_var(rows @ self.units)

    def unit_var(self, q: np.ndarray) -> np.ndarray:
        """Variance of the per-unit contrast values ``q`` (K, U) as an error of the curve's
        contrast (module docstring, term 1)."""
        n = q.shape[1]
        if n < 2:
            return np.full(q.shape[0], np.nan)
        if self.kind == "jackknife":
            return (n - 1) / n * np.sum((q - q.mean(1, keepdims=True)) ** 2, axis=1)
        return q.var(axis=1, ddof=1) / n


def _linear_units(kind: str, values: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The delta-method columns: E = sqrt(mean d²) -> d²/(2E); a ratio -> the indicators."""
    if kind == "sq_dist":
        with np.errstate(divide="ignore", invalid="ignore"):
            return values / (2.0 * y[:, None])
    return values


def _curve(kind: str, epochs: np.ndarray, values: np.ndarray, logged: np.ndarray) -> Curve:
    if kind == "sq_dist":
        y = np.sqrt(values.mean(1))
    elif kind in ("indicator", "mean"):
        y = values.mean(1)
    else:  # jackknife replicates: the value is the logged full-sample estimate
        return Curve(epochs, logged.astype(np.float64), values, "jackknife")
    return Curve(epochs, y, _linear_units(kind, values, y), "linear", kind == "indicator")


def curves_from_units(series: UnitSeries) -> Tuple[Curve, Curve, Curve, bool]:
    """``(selection, held-out, full, held_out)`` curves from a metric's per-unit matrix. The units
    are split by position: even columns select, odd columns test (a 1/3 selection part was
    measured to lose more power in the candidate's location than it gains in the test); jackknife
    replicates cannot be
    split (the estimate needs every group), so all three are the full curve and ``held_out`` is
    False. Epochs with a non-finite unit are dropped."""
    v = np.asarray(series.values, dtype=np.float64)
    keep = np.all(np.isfinite(v), axis=1)
    logged = series.logged if series.logged.size == v.shape[0] else np.full(v.shape[0], np.nan)
    if series.kind == "jackknife":
        keep &= np.isfinite(logged)
    ep, v, logged = series.epochs[keep], v[keep], logged[keep]
    full = _curve(series.kind, ep, v, logged)
    if series.kind == "jackknife" or v.shape[1] < 4:
        return full, full, full, False
    pick = np.arange(v.shape[1]) % SELECT_EVERY == 0
    sel = _curve(series.kind, ep, v[:, pick], logged)
    test = _curve(series.kind, ep, v[:, ~pick], logged)
    return sel, test, full, True


def scalar_curves(epochs, values) -> Tuple[Curve, Curve, Curve, bool]:
    """The same triple for a curve without per-unit values (no held-out half)."""
    c = Curve(np.asarray(epochs, dtype=np.float64), np.asarray(values, dtype=np.float64))
    return c, c, c, False


# ----------------------------------------------------------------------------- contrasts
def window_indices(i: int, n: int, window: int, end: bool = False) -> np.ndarray:
    """The evaluations averaged for place ``i``: ``window`` of them centred on i, clipped to the
    curve; ``end=True``: the last ``window`` evaluations (the end of training)."""
    w = max(1, min(int(window), n))
    if end:
        return np.arange(n - w, n)
    h = w // 2
    lo, hi = max(0, i - h), min(n, i + h + 1)
    return np.arange(lo, hi)


def contrast(n: int, plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Weights c (n,): mean over ``plus`` minus mean over ``minus`` (overlap cancels)."""
    c = np.zeros(n)
    c[plus] += 1.0 / len(plus)
    c[minus] -= 1.0 / len(minus)
    return c


def _robust_var(d: np.ndarray) -> float:
    """MAD variance of ``d``; when the MAD is 0 but ``d`` is not constant (a curve with few
    distinct values, e.g. a memorization ratio, whose differences are mostly exactly 0), the
    classical variance: a zero estimate there would be an artefact of the discreteness."""
    v = float((_MAD * np.median(np.abs(d - np.median(d)))) ** 2)
    if v == 0.0 and d.size > 1:
        return float(np.var(d, ddof=1))
    return v


#: differences used for the variogram: 2 (second differences, V <= Var/2) or 3 (third
#: differences, V <= Var/4: quadratic trends cancel too)
DIFF_ORDER = 3
_DIFF = {2: (np.array([1.0, -2.0, 1.0]), 0.5), 3: (np.array([-1.0, 3.0, -3.0, 1.0]), 0.25)}


def _diff(a: np.ndarray, h: int, order: int) -> np.ndarray:
    coef, _ = _DIFF[order]
    n, k = a.shape[0], len(coef)
    return sum(c * a[j * h: n - (k - 1 - j) * h] for j, c in enumerate(coef))


def _lag_values(curve: Curve, lags, order: int = DIFF_ORDER, tail: float = 1.0) -> np.ndarray:
    """bound · (``tail`` · robust variance of differences of ``order`` at each lag − their seed
    part); ``tail``: the heavy-tail factor of the totals (:func:`tail_check`)."""
    y = curve.y
    bound = _DIFF[order][1]
    vals = []
    for h in lags:
        d = _diff(y, h, order)
        if d.size < 3:
            vals.append(vals[-1] if vals else 0.0)
            continue
        total = tail * _robust_var(d)
        if curve.units is not None:
            seed = float(np.mean(curve.unit_var(_diff(curve.units, h, order))))
            total = max(0.0, total - seed)
        vals.append(bound * total)
    return _isotonic(np.asarray(vals, dtype=np.float64))


def _binomial_floor(curve: Curve, order: int) -> float:
    """The least training part of Var(D_h) of a ratio of 0/1 indicators, the same at every lag
    (issue: a discrete ratio's training-noise estimate was often exactly 0). Under the binomial
    model with no training noise, Var(D_1) is the seed part σ² and total − σ² scatters around 0:
    σ²·sqrt(2/count) is the standard error of a variance from ``count`` independent Gaussian
    differences (the MAD-based estimate's measured sd is about twice that,
    tests/test_per_unit.py), so an estimate below it is not evidence of no training noise and is
    raised to it. It enters the finished variogram (:func:`variogram`) as a nugget — white
    training noise added at every lag h >= 1 — that lifts V(1) to the floor: applied per lag
    before the secant extension it would flatten the secant and lower the long-lag bound, and a
    plain max(V, floor) would lower the variance of a contrast of window means (the within-window
    pairs enter −½ Σ c_s c_t V with a negative sign). 0 where no indicator ever changes
    (σ² = 0); no floor for any other curve."""
    if not curve.discrete or curve.units is None:
        return 0.0
    d = _diff(curve.y, 1, order)
    if d.size < 3:
        return 0.0
    seed = float(np.mean(curve.unit_var(_diff(curve.units, 1, order))))
    return seed * math.sqrt(2.0 / d.size) if seed > 0 else 0.0


def _isotonic(v: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit (scipy's pool adjacent violators): a variogram does not
    fall, and pooling, unlike a running maximum, does not turn estimation noise into a bias."""
    from scipy.optimize import isotonic_regression

    return isotonic_regression(v).x if len(v) else v


def variogram(curve: Curve, *, max_lag_frac: PositiveFloat = 1.0 / 6.0, max_lag: PositiveInt = 40,
              short_lag: PositiveInt = 10, short_lag_frac: PositiveFloat = 1.0 / 20.0,
              min_count: NonNegativeInt = 5, num_lags: PositiveInt = 12,
              tail_factor: PositiveFloat = 1.0) -> np.ndarray:
    """V(h) for h = 0..T-1 of the noise that the units do not explain (module docstring, term
    2): the minimum of two upper bounds beyond the short lags.

    - Every lag up to h_s = clip(``short_lag_frac``·T, 2, ``short_lag``): 1/4 of the robust
      variance of third differences at lag h minus their seed part (made non-decreasing by
      pooling).
    - Beyond h_s, (a) the same estimate on a geometric grid of lags up to ``max_lag_frac``·T and
      ``max_lag`` evaluations (constant beyond), and (b) the secant extension
      V(h_s) + (h − h_s)·(V(h_s) − V(h_s/2))/(h_s − h_s/2): a concave variogram never exceeds
      the line through two of its points beyond them. A flat (white-noise) variogram stays flat,
      a growing (slow, AR(1)-like) one keeps growing.

    A real event on the curve (a bump over tens of evaluations) inflates (a) at the lags of its
    own width; (b) is read where the event's curvature is small, so an event does not hide
    itself. At least ``min_count`` differences per lag; every robust total is multiplied by
    ``tail_factor`` (:func:`tail_check`) before its seed part is subtracted. A ratio of 0/1
    indicators whose V(1) is below its binomial floor (:func:`_binomial_floor`, times 1/4) gets
    the difference added at every lag h >= 1 (a nugget)."""
    check_args(variogram, locals())
    n = len(curve)
    out = np.zeros(max(n, 1))
    h_max = min(max(1, int(math.ceil(max_lag_frac * n))), int(max_lag), (n - min_count) // DIFF_ORDER)
    if h_max < 1:
        return out
    h_s = int(min(max(2, round(short_lag_frac * n)), short_lag, h_max))
    short = np.arange(1, h_s + 1)
    v_short = _lag_values(curve, short, tail=tail_factor)
    h_all = np.arange(1, n)
    v = np.interp(h_all, short, v_short)
    if h_max > h_s:
        lags = np.unique(np.round(np.geomspace(h_s, h_max, min(num_lags, h_max - h_s + 1))).astype(int))
        v_long = np.maximum(_lag_values(curve, lags, tail=tail_factor), v_short[-1])
        h_1 = max(1, h_s // 2)
        slope = (max(0.0, (v_short[-1] - v_short[h_1 - 1]) / (h_s - h_1)) if h_s > h_1
                 else v_short[-1] / h_s)
        secant = v_short[-1] + (h_all - h_s) * slope
        v = np.where(h_all > h_s, np.minimum(np.interp(h_all, lags, v_long), secant), v)
    elif h_s == h_max and h_s >= 2:
        slope = max(0.0, v_short[-1] - v_short[-2])
        v = np.where(h_all > h_s, v_short[-1] + (h_all - h_s) * slope, v)
    out[1:] = v
    out = np.maximum.accumulate(out)
    # a ratio's binomial floor as a nugget (white training noise) that lifts V(1) to the floor:
    # V + nugget is a variogram, and a nugget can only add variance to a contrast (raising V at
    # short lags alone, max(V, floor), would lower the variance of a contrast of window means)
    out[1:] += max(0.0, _DIFF[DIFF_ORDER][1] * _binomial_floor(curve, DIFF_ORDER) - out[1]) if n > 1 else 0.0
    return out


# ----------------------------------------------------------------------------- the jump component
#: an isolated jump: an evaluation beyond both neighbouring windows' medians by this many robust
#: units of the curve's residual from them (a bad batch, docs/events.md "Jumps and tails")
JUMP_SIGMA = 5.0
#: a jump's step to each neighbour is at least this share of its excess over the side medians
#: (a one-epoch spike: ~1; through an EMA of decay 0.6 / 0.9 and window 5: 0.51 / 0.37; a smooth
#: extremum: 0.25 at window 3, 0.11 at window 5)
JUMP_CONCENTRATION = 0.35
#: the robust unit of a jump is at least this share of the curve's median level
JUMP_FLOOR = 1e-3
#: the jump component's own assumption (jumps are sparse) fails beyond this share of evaluations
MAX_JUMP_SHARE = 0.1
#: an EMA tail: the evaluations after a jump stay in it while their excess over the level before it
#: exceeds this many robust units (at most ``window`` of them)
JUMP_TAIL_SIGMA = 2.5


def _side_medians(y: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(median of the ``k`` evaluations before t, median of the up to ``k`` after it) for every t
    >= k (NaN before; the last evaluation's "after" median is NaN)."""
    n = y.size
    from numpy.lib.stride_tricks import sliding_window_view

    med = np.median(sliding_window_view(y, k), axis=1)  # med[j] = median(y[j:j+k])
    left = np.full(n, np.nan)
    right = np.full(n, np.nan)
    left[k:] = med[: n - k]
    right[: n - k] = med[1: n - k + 1]
    for t in range(max(0, n - k), n - 1):  # fewer than k evaluations after t
        right[t] = float(np.median(y[t + 1:]))
    return left, right


def isolated_jumps(y: np.ndarray, window: int = 5) -> np.ndarray:
    """The jump component of a curve's training noise: a boolean mask of the evaluations that are
    isolated jumps — beyond *both* the median of the ``window`` evaluations before them and the
    median of those after them (up or down) by more than :data:`JUMP_SIGMA` robust units σ of the
    residual y_t − (left + right)/2 over the curve (MAD; its sd where the MAD is 0; at least
    :data:`JUMP_FLOOR` times the curve's median level, so a noiseless curve has none) — plus their
    decaying tail (an EMA of a logged metric): following evaluations whose excess over the level
    before the jump stays above :data:`JUMP_TAIL_SIGMA`·σ, at most ``window`` of them. A jump is
    also concentrated at its evaluation: it is beyond both neighbours, and its step to each is
    at least :data:`JUMP_CONCENTRATION` of its excess (a smooth extremum's excess is several times
    its steps; beside a tall smooth peak's top, about three times). The first ``window``
    evaluations and the last one (one side only) are never jumps; steep monotone stretches lie
    between the two medians and a level shift that persists is not isolated. All False for
    curves shorter than 2·window + 3."""
    y = np.asarray(y, dtype=np.float64)
    n, k = y.size, max(2, int(window))
    out = np.zeros(n, dtype=bool)
    if n < 2 * k + 3 or not np.all(np.isfinite(y)):
        return out
    left, right = _side_medians(y, k)
    t = np.arange(k, n - 1)  # the last evaluation has no after-side: a trend or a jump there look alike
    lo, hi = np.minimum(left[t], right[t]), np.maximum(left[t], right[t])
    excess = np.where(y[t] > hi, y[t] - hi, np.where(y[t] < lo, y[t] - lo, 0.0))
    e = (y[t] - 0.5 * (left[t] + right[t]))[: n - 2 * k]  # interior residuals set the scale
    sigma = _MAD * float(np.median(np.abs(e - np.median(e))))
    if sigma == 0.0:
        sigma = float(np.std(e))
    # a floor relative to the curve's level: on a (nearly) noiseless curve every extremum is
    # beyond both medians by its own curvature, which is no jump
    sigma = max(sigma, JUMP_FLOOR * float(np.median(np.abs(y))))
    if not sigma > 0:
        return out
    # concentrated at t: a jump leaves both neighbours behind (a smooth extremum's excess over the
    # side medians is several times its step to either neighbour)
    step = np.minimum(np.abs(y[t] - y[t - 1]), np.abs(y[t] - y[t + 1]))
    # and a jump is the extremum of its neighbourhood: beyond both neighbours in its direction
    # (on the flank of a tall smooth peak with little noise, the evaluation next to the top is
    # beyond both side medians with a step of a third of that excess, as a parabola has)
    up = (y[t] > y[t - 1]) & (y[t] > y[t + 1])
    down = (y[t] < y[t - 1]) & (y[t] < y[t + 1])
    extremum = np.where(excess > 0, up, down)
    out[t] = (np.abs(excess) > JUMP_SIGMA * sigma) & (step >= JUMP_CONCENTRATION * np.abs(excess)) & extremum
    for j in np.flatnonzero(out):  # the EMA tail of an upward / downward jump
        if j > 0 and out[j - 1]:
            continue
        sign, base = np.sign(y[j] - left[j]), left[j]
        for i in range(j + 1, min(n, j + 1 + k)):
            if sign * (y[i] - base) > JUMP_TAIL_SIGMA * sigma:
                out[i] = True
            else:
                break
    return out


#: the heavy-tail check: the largest 1 % of the squared third differences (at least one) may carry
#: at most this share of their sum (Gaussian noise: ~8 %; Student-t, nu = 2.5: median 24 %, 9 % of
#: runs above; nu <= 2, an infinite variance: most runs above)
MAX_TAIL_SHARE = 0.5
#: the leading evaluations whose third differences exceed this many MAD units are the run's
#: initial transient (the first steep epochs), not noise: the tail statistics skip them
TRANSIENT_SIGMA = 6.0
#: the sd of log(classical / MAD variance) of ``count`` lag-1 third differences of *Gaussian*
#: noise is TAIL_LOG_SD/sqrt(count) (measured: 2.0–2.4 for white noise and AR(1) φ 0.9–0.97,
#: 100–2000 evaluations): the tail factor is the ratio divided by exp(2·that sd), a test of the
#: Gaussian null, so Gaussian noise keeps τ = 1 in ~97 % of runs and heavy tails keep their ratio
TAIL_LOG_SD = 2.2


def _after_transient(d: np.ndarray) -> np.ndarray:
    """``d`` without its leading stretch of differences beyond TRANSIENT_SIGMA MAD units."""
    sd = _MAD * float(np.median(np.abs(d - np.median(d))))
    if not sd > 0:
        return d
    big = np.abs(d - np.median(d)) > TRANSIENT_SIGMA * sd
    start = int(np.argmin(big)) if not big.all() else d.size
    return d[start:]


def _local_mad_scale(d: np.ndarray, width: int) -> np.ndarray:
    """The running MAD scale of ``d`` over ``width`` (odd) differences centred on each one,
    clipped at the ends (a noise level that changes along the run, e.g. under a schedule)."""
    from numpy.lib.stride_tricks import sliding_window_view

    w = int(min(width, d.size - (1 - d.size % 2)))
    h = w // 2
    pad = np.concatenate([np.full(h, np.nan), d, np.full(h, np.nan)])
    win = sliding_window_view(pad, w)
    med = np.nanmedian(win, axis=1)
    return _MAD * np.nanmedian(np.abs(win - med[:, None]), axis=1)


def tail_check(curve: Curve) -> Tuple[float, float, int]:
    """(tail factor τ >= 1, tail share, count) of the lag-1 third differences of ``curve`` past
    its initial transient, each divided by the running MAD scale around it (so that noise whose
    size changes along the run, e.g. under a learning-rate schedule, is not mistaken for heavy
    tails). The MAD, which sets the variogram, sees the bulk of the noise; heavy-tailed
    increments (Student-t innovations) carry variance beyond it, and a leg, a contrast of window
    means, sums them (docs/events.md, "Jumps and tails"). τ is the ratio of their classical to
    their MAD variance, divided by exp(2·:data:`TAIL_LOG_SD`/sqrt(count)), twice the ratio's
    sampling sd under Gaussian noise: a test of the Gaussian null, so Gaussian noise gets τ = 1
    in ~97 % of runs while heavy tails keep most of their ratio. It scales the robust *totals*
    of every lag before their seed part (a classical mean, exact) is subtracted
    (:func:`variogram`): a training part that sits in the tails, invisible to the MAD next to the
    seed noise, is then not estimated as 0. The share: of the sum of squares, the part the
    largest 1 % (at least one) carry; above :data:`MAX_TAIL_SHARE` the variance is dominated by a few increments and a
    leg's Gaussian error does not hold (the model fails its check: undecided)."""
    d = _diff(curve.y, 1, 3)
    if d.size < 40:
        return 1.0, 0.0, int(d.size)
    start = d.size - _after_transient(d).size
    d = d[start:]
    if d.size < 40:
        return 1.0, 0.0, int(d.size)
    scale = _local_mad_scale(d, max(41, 2 * (d.size // 16) + 1))
    if not np.all(scale > 0):
        return 1.0, 0.0, int(d.size)
    z = (d - np.median(d)) / scale
    sq = np.sort(z ** 2)[::-1]
    total = float(np.sum(sq))
    share = float(np.sum(sq[: max(1, d.size // 100)]) / total) if total > 0 else 0.0
    mad, classical = _robust_var(z), total / (z.size - 1)
    if not mad > 0:
        return 1.0, share, int(d.size)
    tau = classical / mad * math.exp(-2.0 * TAIL_LOG_SD / math.sqrt(z.size))
    return max(1.0, tau), share, int(d.size)


def _train_var(c: np.ndarray, V: np.ndarray) -> float:
    idx = np.flatnonzero(c)
    w = c[idx]
    lag = np.abs(idx[:, None] - idx[None, :])
    return float(max(0.0, -0.5 * w @ V[lag] @ w))


# ----------------------------------------------------------------------------- the noise model
#: beyond this short-lag variogram exponent the bound V(h) <= Var(D_h)/4 no longer holds and is
#: replaced by the power-law factor 1/(15 - 6·2^a + 3^a) (docs/events.md, "The noise model")
CONCAVE_A = 1.37
#: at or above this exponent (noise smooth at the evaluation spacing: drifts, low-pass noise)
#: third differences cannot see the training noise: the model fails its check (undecided)
MAX_SHAPE_EXPONENT = 1.8
#: the training noise must be at least this share of the third differences' variance for its
#: shape to be checked (below it the seed part, exact and paired, carries the leg's error)
SHAPE_MIN_SHARE = 0.2
#: the longest lag 2h of the pairs (h, 2h) the shape is read at (longer lags mistake a real
#: event's own curvature for smooth noise)
SHAPE_MAX_LAG = 4
#: shortest local segment (evaluations) for the local scale of the training noise
MIN_SEGMENT = 40
#: a local scale ratio is divided by exp(LOCAL_SHRINK · its log-sd) (a lower confidence bound)
LOCAL_SHRINK = 1.5
#: fewest evaluations with which a training-noise variogram is estimated at all
MIN_EVALUATIONS = 8


def _third_diff_vars(curve: Curve, h: int, tail: float = 1.0) -> Tuple[float, float]:
    """(total, seed part) of the variance of third differences at lag ``h``: the total is the
    robust (MAD) variance times the heavy-tail factor ``tail`` (:func:`tail_check`)."""
    d = _diff(curve.y, h, 3)
    if d.size < 3:
        return math.nan, 0.0
    total = tail * _robust_var(d)
    seed = 0.0
    if curve.units is not None:
        seed = float(np.mean(curve.unit_var(_diff(curve.units, h, 3))))
    return total, seed


def _pair_exponent(curve: Curve, h: int, tail: float = 1.0) -> Tuple[float, str]:
    """A lower 95 % bound of the exponent from the lag pair (h, 2h): log2 of the ratio of the
    training parts of Var(D_2h) and Var(D_h), minus twice its sampling sd (the log of a MAD
    variance of third differences at lag h has sd ≈ 3·sqrt(h/count), inflated by total/training
    where the seed part is subtracted). A short or seed-dominated curve thus never fails the
    check by chance; a training part below :data:`SHAPE_MIN_SHARE` of the total at lag h is
    taken at that share (noise invisible at lag h but present at 2h: a large exponent)."""
    n = len(curve)
    t1, s1 = _third_diff_vars(curve, h, tail)
    t2, s2 = _third_diff_vars(curve, 2 * h, tail)
    if not (np.isfinite(t1) and np.isfinite(t2)) or t1 <= 0:
        return math.nan, "too few evaluations"
    v1, v2 = t1 - s1, t2 - s2
    visible = v1 > SHAPE_MIN_SHARE * t1
    if v2 <= 0:
        return (0.0, "") if visible else (math.nan, "training noise small next to the seed noise")
    v1e = max(v1, SHAPE_MIN_SHARE * t1)
    sd1 = 3.0 * math.sqrt(h / max(1, n - 3 * h)) * (t1 / v1e)
    sd2 = 3.0 * math.sqrt(2 * h / max(1, n - 6 * h)) * (t2 / v2)
    a_lo = math.log2(v2 / v1e) - 2.0 * math.sqrt(sd1 ** 2 + sd2 ** 2) / math.log(2.0)
    if not visible and a_lo < MAX_SHAPE_EXPONENT:
        return math.nan, "training noise small next to the seed noise"
    return float(a_lo), ""


def shape_exponent(curve: Curve, max_lag: Optional[int] = None, tail: float = 1.0) -> Tuple[float, str]:
    """A lower 95 % bound of the exponent a of the training-noise variogram at short lags,
    V(h) ∝ h^a, from the variances of third differences at lags h and 2h (seed part removed):
    for a power law Var(D_2h)/Var(D_h) = 2^a (:func:`_pair_exponent`). White noise: 0; AR(1), a random walk: ≈ 1; fBm: 2H; noise that is
    smooth at the evaluation spacing: ≫ 2. The pairs h = 1, 2, ... up to ``max_lag``/2
    (default :data:`SHAPE_MAX_LAG`) are read and the largest measurable exponent is returned
    (noise smooth over a few evaluations is invisible at lag 1 but not at lag 2). Returns (a, note); a is NaN with the reason in ``note`` when the training part is not
    measurable at any pair. ``tail``: the heavy-tail factor of the totals (:func:`tail_check`)."""
    n = len(curve)
    if max_lag is None:
        max_lag = SHAPE_MAX_LAG
    best, notes, h = math.nan, [], 1
    while 2 * h <= max(2, max_lag) and 3 * 2 * h + 3 <= n:
        a, note = _pair_exponent(curve, h, tail)
        if np.isfinite(a) or np.isinf(a):
            best = a if not np.isfinite(best) else max(best, a)
        elif note:
            notes.append(f"lags {h}/{2 * h}: {note}")
        h *= 2
    if np.isnan(best):
        return math.nan, "; ".join(notes) or "too few evaluations"
    return float(best), ""


def shape_factor(a: float) -> float:
    """Multiplier of the bound V(h) = Var(D_h)/4 that keeps it an upper bound for a power-law
    variogram of exponent ``a``: 1 up to :data:`CONCAVE_A`, then (1/4)⁻¹/(15 − 6·2^a + 3^a);
    infinite where third differences cannot see the noise (a → 2)."""
    if not np.isfinite(a) or a <= CONCAVE_A:
        return 1.0 if not (np.isinf(a) and a > 0) else math.inf
    denom = 15.0 - 6.0 * 2.0 ** a + 3.0 ** a
    return math.inf if denom <= 0 else max(1.0, 4.0 / denom)


@dataclass
class NoiseModel:
    """The training-noise model of a curve, fitted once on all its units, with its checks.

    - ``V``: the variogram (:func:`variogram`) times ``factor`` (:func:`shape_factor` of the
      short-lag exponent ``exponent``);
    - local scale: the curve is cut into segments of ``segment`` evaluations; a leg's training
      variance uses V times the largest ratio of a segment's short-lag variogram to the whole
      curve's, over the segments around the leg's evaluations, so noise that grows or shrinks
      over the run (a learning-rate schedule) is measured where the leg is (``scale`` in the
      leg's record). A ratio is taken at its confidence bound toward 1 (the lower bound above 1,
      the upper bound below it): noise that agrees with the whole curve within its error leaves
      the pooled model unchanged;
    - ``tail_factor`` (:func:`tail_check`): the heavy-tail factor of the increments, which
      scales the robust totals of every lag before their seed part is subtracted; ``jumps``: the epochs the jump component removed (:func:`isolated_jumps`,
      done before fitting);
    - ``problems``: the checks that failed (too few evaluations, a variogram too convex for the
      bound, a variance dominated by a few increments, jumps that are not sparse); an event
      tested with a failing model is *undecided*, never confirmed.
    """

    curve: Curve
    V: np.ndarray
    exponent: float
    factor: float
    segment: int
    problems: Tuple[str, ...]
    notes: Tuple[str, ...] = ()
    tail_factor: float = 1.0
    tail_share: float = 0.0
    jumps: Tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self._scales: dict = {}

    @classmethod
    def fit(cls, curve: Curve, window: int = 5, jumps=(), jump_problem: Optional[str] = None) -> "NoiseModel":
        """The model of ``curve`` (its isolated jumps already removed: their epochs ``jumps``;
        ``jump_problem``: why they could not be, a failed check)."""
        n = len(curve)
        problems, notes = ([jump_problem] if jump_problem else []), []
        if n < MIN_EVALUATIONS:
            problems.append(f"{n} evaluations: at least {MIN_EVALUATIONS} are needed to estimate "
                            "the training noise")
        # the tail factor scales the robust totals before the seed part is subtracted (a training
        # part the MAD does not see, all in the tails, is then not estimated as 0)
        tau, share, _ = tail_check(curve) if n >= MIN_EVALUATIONS else (1.0, 0.0, 0)
        V = variogram(curve, tail_factor=tau) if n >= 2 else np.zeros(max(n, 1))
        a, note = (shape_exponent(curve, tail=tau) if n >= MIN_EVALUATIONS
                   else (math.nan, "too few evaluations"))
        if note:
            notes.append(f"shape not checked: {note}")
        f = shape_factor(a)
        if not np.isfinite(f) or (np.isfinite(a) and a >= MAX_SHAPE_EXPONENT):
            problems.append(f"the training noise is smooth at the evaluation spacing (variogram "
                            f"exponent {a:.2f} >= {MAX_SHAPE_EXPONENT}): third differences cannot "
                            "bound it")
            f = 1.0
        if share > MAX_TAIL_SHARE:
            problems.append(f"heavy-tailed training noise: the largest 1 % of the increments carry "
                            f"{share:.0%} of their variance (> {MAX_TAIL_SHARE:.0%}), so a leg's error is "
                            "not Gaussian")
        seg = max(MIN_SEGMENT, n // 4, 4 * int(window))
        return cls(curve, V * f, float(a), float(f), int(seg), tuple(problems), tuple(notes),
                   float(tau), float(share), tuple(float(e) for e in jumps))

    def _lag_train_var(self, lo: int, hi: int, h: int) -> Tuple[float, float]:
        """(training part of the robust variance of third differences at lag ``h`` on [lo, hi),
        the sd of its logarithm): the log of a MAD variance of lag-1 third differences has sd
        ≈ 3/sqrt(count) (measured on Gaussian noise); at lag h the differences are correlated over
        ~h evaluations (sd ≈ 3·sqrt(h/count)); inflated by total/training when the seed part is
        subtracted."""
        total, seed = _third_diff_vars(self.curve.slice(lo, hi), h, self.tail_factor)
        train = max(0.0, total - seed) if np.isfinite(total) else math.nan
        count = max(1, hi - lo - 3 * h)
        sd_log = 3.0 * math.sqrt(h / count) * (total / train if train > 0 else math.inf)
        return train, sd_log

    def _local_lags(self) -> Tuple[int, ...]:
        """Lag 1 (least affected by a trend's curvature) and half the variogram's short range
        (where slow training noise stands out of fast seed noise)."""
        h_s = int(min(max(2, round(len(self.curve) / 20)), 10))
        return tuple(sorted({1, max(1, h_s // 2)}))

    def _segment_scale(self, lo: int) -> float:
        """Ratio of the segment [lo, lo + segment)'s training-noise level to the whole curve's,
        read at the lag of :meth:`_local_lags` where the ratio is most precise, moved toward 1 by
        exp(LOCAL_SHRINK·sd) of its own sampling error (divided above 1, multiplied below, never
        past 1), so that windows that agree within their noise leave the pooled model unchanged
        and a quiet stretch (an annealed learning rate) is tested against its own noise."""
        if lo not in self._scales:
            best = None
            for h in self._local_lags():
                v_seg, sd_seg = self._lag_train_var(lo, lo + self.segment, h)
                if ("all", h) not in self._scales:
                    self._scales[("all", h)] = self._lag_train_var(0, len(self.curve), h)
                v_all, sd_all = self._scales[("all", h)]
                if not np.isfinite(v_seg) or v_seg <= 0:
                    continue
                if not v_all > 0:
                    best = (0.0, math.inf)
                    break
                sd_log = math.sqrt(sd_seg ** 2 + sd_all ** 2)
                ratio = v_seg / v_all
                toward_one = (max(1.0, ratio * math.exp(-LOCAL_SHRINK * sd_log)) if ratio >= 1.0
                              else min(1.0, ratio * math.exp(min(LOCAL_SHRINK * sd_log, 50.0))))
                if best is None or sd_log < best[0]:
                    best = (sd_log, toward_one)
            self._scales[lo] = 1.0 if best is None else float(best[1])
        return self._scales[lo]

    def local_scale(self, c: np.ndarray) -> float:
        """The variance multiplier for contrast ``c``: the largest segment ratio around its
        evaluations (1 when the curve is too short to have segments)."""
        n = len(self.curve)
        if n < 2 * self.segment:
            return 1.0
        r = 0.0
        for i in np.flatnonzero(c):
            lo = int(min(max(0, i - self.segment // 2), n - self.segment))
            lo -= lo % max(1, self.segment // 4)  # a coarse grid of segments: computed once each
            r = max(r, self._segment_scale(lo))
        return r if r > 0 else 1.0

    def train_var(self, c: np.ndarray) -> Tuple[float, float]:
        """(training variance of contrast ``c``, the local scale used)."""
        r = self.local_scale(c)
        if not np.isfinite(r):  # no noise on the whole curve, some locally: the local one
            lo = int(min(max(0, int(np.flatnonzero(c)[-1]) - self.segment // 2), len(self.curve) - self.segment))
            if ("V", lo) not in self._scales:
                v = variogram(self.curve.slice(lo, lo + self.segment), tail_factor=self.tail_factor) * self.factor
                self._scales[("V", lo)] = np.concatenate([v, np.full(max(0, self.V.size - v.size), v[-1])])
            return _train_var(c, self._scales[("V", lo)]), r
        return _train_var(c, self.V * r), r

    def to_dict(self) -> dict:
        return {"exponent": self.exponent, "shape_factor": self.factor, "segment": self.segment,
                "tail_factor": self.tail_factor, "tail_share": self.tail_share,
                "jumps_removed": list(self.jumps),
                "segment_scales": {int(k): float(v) for k, v in sorted(
                    (k, v) for k, v in self._scales.items() if isinstance(k, int))},
                "problems": list(self.problems), "notes": list(self.notes)}


@dataclass(frozen=True)
class LegTest:
    """One leg: ``diff`` = c·y (oriented: > 0 in the hypothesized direction), its standard error
    ``se`` = sqrt(``se_seed``² + ``se_train``²) and the selection-corrected
    ``z`` = (diff − ``allowance``)/se, where ``allowance`` is the bias that choosing the leg's
    places from the data can put into ``diff`` (docs/events.md, "Selection"). ``z`` is NaN when
    ``se`` is 0 (no noise estimate: the leg is undecided, never infinitely significant)."""

    diff: float
    se_seed: float
    se_train: float
    allowance: float = 0.0
    scale: float = 1.0

    @property
    def se(self) -> float:
        return math.sqrt(self.se_seed ** 2 + self.se_train ** 2)

    @property
    def z(self) -> float:
        se = self.se
        return (self.diff - self.allowance) / se if se > 0 else math.nan

    @property
    def z_raw(self) -> float:
        se = self.se
        return self.diff / se if se > 0 else math.nan

    def to_dict(self) -> dict:
        return {"diff": self.diff, "se": self.se, "se_seed": self.se_seed,
                "se_train": self.se_train, "allowance": self.allowance, "z": self.z,
                "z_raw": self.z_raw, "local_scale": self.scale}


def leg_test(curve: Curve, c: np.ndarray, V=None, *, allowance_sd: float = 0.0,
             held_out: bool = True) -> LegTest:
    """The leg test of contrast ``c`` on ``curve``. ``V``: a :class:`NoiseModel` (fitted on the
    curve when not given) or a plain variogram array. ``allowance_sd``: the selection allowance
    in standard errors of the part of the noise the selection saw (the training part; the seed
    part too unless ``held_out``)."""
    if V is None:
        V = NoiseModel.fit(curve)
    if isinstance(V, NoiseModel):
        train, scale = V.train_var(c)
    else:
        train, scale = _train_var(c, V), 1.0
    seed = max(float(curve.seed_var(c)[0]), 0.0)
    seen = train + (0.0 if held_out else seed)
    return LegTest(float(c @ curve.y), math.sqrt(seed), math.sqrt(train),
                   float(allowance_sd) * math.sqrt(seen), float(scale))
