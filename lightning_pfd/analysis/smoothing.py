"""Curve smoothing and noise-level estimation for per-epoch metric histories (pure numpy).

The event detectors in :mod:`lightning_pfd.analysis.events` work on a *smoothed* curve and
compare every amplitude with an *estimated noise level*, so that an epoch-to-epoch wiggle of a
Monte-Carlo estimate (E_gen at M = 256 seeds, an ICR on a few hundred images) is never reported
as a phenomenon.

- :func:`moving_median` — centred running median (robust to single-epoch outliers), windows
  shrink symmetrically at the ends so the end points are not biased by padding.
- :func:`smooth` — running median followed by a centred running mean of the same width
  (median removes outliers, mean removes the remaining jitter).
- :func:`estimate_noise` — robust standard deviation of the i.i.d. noise around a smooth trend,
  from the median absolute deviation of second differences:
  for y_i = f(t_i) + ε_i with ε_i ~ (0, σ²) and slowly varying f,
  Δ²y_i = y_{i-1} − 2y_i + y_{i+1} ≈ ε_{i-1} − 2ε_i + ε_{i+1} has variance 6σ², so
  σ̂ = 1.4826 · MAD(Δ²y) / √6. Curvature of the trend contributes only at the few points where f
  bends sharply, which the median ignores.
- :func:`smoothed_noise` — the standard deviation left in the smoothed curve, σ̂ / √w for a window
  of w points (times 1.2533 for the median part, the asymptotic efficiency loss of the median).
"""
from __future__ import annotations

import numpy as np

from ..validation import PositiveInt, check_args

__all__ = [
    "as_curve",
    "moving_median",
    "moving_average",
    "smooth",
    "estimate_noise",
    "smoothed_noise",
    "fill_nan",
]

_MAD_TO_SIGMA = 1.482602218505602  # 1 / Φ⁻¹(3/4): MAD of a Gaussian = 0.6745 σ


def as_curve(y, name: str = "y") -> np.ndarray:
    """1-D float64 copy of ``y``; ValueError if it is not one-dimensional."""
    arr = np.asarray(y, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of per-epoch values, got shape {arr.shape}")
    return arr.copy()


def fill_nan(y) -> np.ndarray:
    """Replace NaN / ±inf entries by linear interpolation between finite neighbours
    (constant extrapolation at the ends). All-NaN input is returned unchanged."""
    y = as_curve(y)
    finite = np.isfinite(y)
    if finite.all() or not finite.any():
        return y
    idx = np.arange(y.size)
    y[~finite] = np.interp(idx[~finite], idx[finite], y[finite])
    return y


def _centred_windows(n: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Start/stop indices of a centred window of ``window`` points that shrinks symmetrically at
    the ends (point i uses i−h..i+h with h = min(window//2, i, n−1−i))."""
    i = np.arange(n)
    h = np.minimum(window // 2, np.minimum(i, n - 1 - i))
    return i - h, i + h + 1


def moving_median(y, window: PositiveInt = 5) -> np.ndarray:
    """Centred running median over ``window`` points (odd windows are symmetric)."""
    check_args(moving_median, locals())
    y, window = fill_nan(y), int(window)
    if window == 1 or y.size < 3:
        return y
    lo, hi = _centred_windows(y.size, window)
    h_max = window // 2
    pad = np.pad(y, h_max, mode="edge")
    # Sliding windows over the padded array, then mask entries outside each shrunken window.
    win = np.lib.stride_tricks.sliding_window_view(pad, 2 * h_max + 1)  # (n, 2h+1)
    offs = np.arange(-h_max, h_max + 1)
    h = (hi - lo - 1) // 2
    masked = np.where(np.abs(offs)[None, :] <= h[:, None], win, np.nan)
    return np.nanmedian(masked, axis=1)


def moving_average(y, window: PositiveInt = 5) -> np.ndarray:
    """Centred running mean over ``window`` points (windows shrink symmetrically at the ends)."""
    check_args(moving_average, locals())
    y, window = fill_nan(y), int(window)
    if window == 1 or y.size < 3:
        return y
    lo, hi = _centred_windows(y.size, window)
    csum = np.concatenate([[0.0], np.cumsum(y)])
    return (csum[hi] - csum[lo]) / (hi - lo)


def smooth(y, window: PositiveInt = 5) -> np.ndarray:
    """Running median then running mean, both over ``window`` points; NaNs interpolated first.

    Short curves (fewer than 3 points) and ``window == 1`` are returned unchanged.
    """
    return moving_average(moving_median(y, window), window)


def estimate_noise(y) -> float:
    """Robust σ̂ of the epoch-to-epoch noise: 1.4826·MAD(Δ²y)/√6 (see module docstring).

    Returns 0.0 for curves with fewer than 4 finite points (no estimate possible).
    """
    y = as_curve(y)
    y = y[np.isfinite(y)]
    if y.size < 4:
        return 0.0
    d2 = y[:-2] - 2.0 * y[1:-1] + y[2:]
    mad = np.median(np.abs(d2 - np.median(d2)))
    return float(_MAD_TO_SIGMA * mad / np.sqrt(6.0))


def smoothed_noise(sigma: float, window: PositiveInt) -> float:
    """Standard deviation of the noise left after :func:`smooth` with ``window`` points:
    1.2533 · σ / √window (median efficiency 2/π; the following mean adds a little more
    averaging, so this is a slightly conservative bound)."""
    check_args(smoothed_noise, locals())
    window = int(window)
    return float(np.sqrt(np.pi / 2.0) * sigma / np.sqrt(window))
