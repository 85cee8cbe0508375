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
           "variogram", "LegTest", "leg_test"]

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

    def __len__(self) -> int:
        return int(self.y.size)

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
    return Curve(epochs, y, _linear_units(kind, values, y), "linear")


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
    return float((_MAD * np.median(np.abs(d - np.median(d)))) ** 2)


#: differences used for the variogram: 2 (second differences, V <= Var/2) or 3 (third
#: differences, V <= Var/4: quadratic trends cancel too)
DIFF_ORDER = 3
_DIFF = {2: (np.array([1.0, -2.0, 1.0]), 0.5), 3: (np.array([-1.0, 3.0, -3.0, 1.0]), 0.25)}


def _diff(a: np.ndarray, h: int, order: int) -> np.ndarray:
    coef, _ = _DIFF[order]
    n, k = a.shape[0], len(coef)
    return sum(c * a[j * h: n - (k - 1 - j) * h] for j, c in enumerate(coef))


def _lag_values(curve: Curve, lags, order: int = DIFF_ORDER) -> np.ndarray:
    """bound · (robust variance of differences of ``order`` at each lag − their seed part)."""
    y = curve.y
    bound = _DIFF[order][1]
    vals = []
    for h in lags:
        d = _diff(y, h, order)
        if d.size < 3:
            vals.append(vals[-1] if vals else 0.0)
            continue
        total = _robust_var(d)
        if curve.units is not None:
            q = _diff(curve.units, h, order)
            total = max(0.0, total - float(np.mean(curve.unit_var(q))))
        vals.append(bound * total)
    return _isotonic(np.asarray(vals, dtype=np.float64))


def _isotonic(v: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit (pool adjacent violators): a variogram does not fall,
    and pooling, unlike a running maximum, does not turn estimation noise into a bias."""
    blocks = []  # [mean, count]
    for x in v:
        blocks.append([float(x), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(c, m) for m, c in blocks]) if blocks else v


def variogram(curve: Curve, *, max_lag_frac: PositiveFloat = 1.0 / 6.0, max_lag: PositiveInt = 40,
              short_lag: PositiveInt = 10, short_lag_frac: PositiveFloat = 1.0 / 20.0,
              min_count: NonNegativeInt = 5, num_lags: PositiveInt = 12) -> np.ndarray:
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
    itself. At least ``min_count`` differences per lag."""
    check_args(variogram, locals())
    n = len(curve)
    out = np.zeros(max(n, 1))
    h_max = min(max(1, int(math.ceil(max_lag_frac * n))), int(max_lag), (n - min_count) // DIFF_ORDER)
    if h_max < 1:
        return out
    h_s = int(min(max(2, round(short_lag_frac * n)), short_lag, h_max))
    short = np.arange(1, h_s + 1)
    v_short = _lag_values(curve, short)
    h_all = np.arange(1, n)
    v = np.interp(h_all, short, v_short)
    if h_max > h_s:
        lags = np.unique(np.round(np.geomspace(h_s, h_max, min(num_lags, h_max - h_s + 1))).astype(int))
        v_long = np.maximum(_lag_values(curve, lags), v_short[-1])
        h_1 = max(1, h_s // 2)
        slope = (max(0.0, (v_short[-1] - v_short[h_1 - 1]) / (h_s - h_1)) if h_s > h_1
                 else v_short[-1] / h_s)
        secant = v_short[-1] + (h_all - h_s) * slope
        v = np.where(h_all > h_s, np.minimum(np.interp(h_all, lags, v_long), secant), v)
    elif h_s == h_max and h_s >= 2:
        slope = max(0.0, v_short[-1] - v_short[-2])
        v = np.where(h_all > h_s, v_short[-1] + (h_all - h_s) * slope, v)
    out[1:] = v
    return np.maximum.accumulate(out)


def _train_var(c: np.ndarray, V: np.ndarray) -> float:
    idx = np.flatnonzero(c)
    w = c[idx]
    lag = np.abs(idx[:, None] - idx[None, :])
    return float(max(0.0, -0.5 * w @ V[lag] @ w))


@dataclass(frozen=True)
class LegTest:
    """One leg: ``diff`` = c·y (oriented: > 0 in the hypothesized direction), its standard error
    ``se`` = sqrt(``se_seed``² + ``se_train``²) and ``z`` = diff/se."""

    diff: float
    se_seed: float
    se_train: float

    @property
    def se(self) -> float:
        return math.sqrt(self.se_seed ** 2 + self.se_train ** 2)

    @property
    def z(self) -> float:
        se = self.se
        if se > 0:
            return self.diff / se
        return math.copysign(math.inf, self.diff) if self.diff != 0 else 0.0

    def to_dict(self) -> dict:
        return {"diff": self.diff, "se": self.se, "se_seed": self.se_seed,
                "se_train": self.se_train, "z": self.z}


def leg_test(curve: Curve, c: np.ndarray, V: Optional[np.ndarray] = None) -> LegTest:
    """The leg test of contrast ``c`` on ``curve`` (``V``: its :func:`variogram`, computed when
    not given)."""
    V = variogram(curve) if V is None else V
    seed = float(curve.seed_var(c)[0])
    return LegTest(float(c @ curve.y), math.sqrt(max(seed, 0.0)), math.sqrt(_train_var(c, V)))
