"""Early stopping at a metric's minimum that controls its false stops over the whole run (pure numpy).

Two rules, used by :class:`~lightning_pfd.callbacks.ICREarlyStopping` (derivation and measured
false-stop rates in docs/icr.md, "ICREarlyStopping: the rise test"):

- :class:`PatienceRule`: Lightning's ``EarlyStopping`` criteria on plain floats (non-finite
  value, stopping / divergence threshold, improvement by more than ``min_delta``, else one more
  check without improvement; stop after ``patience``). Not error-controlled: on a flat noisy
  curve it stops after about ``patience`` checks.
- :func:`rise_test`: is the metric now *significantly* above its minimum, with the minimum chosen
  from the same noisy curve and the question asked at many checks? The checks are cut into
  blocks of ``window`` consecutive values; at the end of each block the mean of the newest block
  is compared with the mean of every earlier block (every candidate minimum), each contrast
  standardized by its own noise estimate, and the largest standardized rise S is the statistic.
  Its null distribution is drawn by Monte Carlo from the fitted noise model, so the choice of the
  minimum (the max over candidates) is corrected for; a Bonferroni split over the block ends of
  the run (``horizon``) makes the error rate hold over the whole run. The noise model has two
  parts:

  1. **image-group noise**, paired: the delete-a-group jackknife replicates r_{t,g} of every
     check (the same G groups of images at every epoch) give the jackknife variance of any
     contrast c·y, v = (G−1)/G Σ_g (c·r_g − mean_g c·r_g)² (Efron & Stein's delete-a-group
     jackknife; the same estimator as ICRMonitor's ``se``). The Monte Carlo redraws the G group
     deviations with Gaussian multipliers and re-estimates v on every draw (a studentized
     multiplier bootstrap), so the draws carry the G − 1 degrees of freedom of the estimated
     error, not a normal reference. Without replicates, per-check standard errors ``se`` are used
     as independent noise (conservative when the group noise is positively correlated over
     epochs, as with a fixed image subset);
  2. **training noise** common to all groups (checkpoint to checkpoint, invisible to the
     jackknife): an AR(1) process with stationary variance τ² and coefficient φ per check, fitted
     to the excess of the second differences over their jackknife variance at lags 1..4:
     E[(y_{t+h} − 2y_t + y_{t−h})²] − v_jk = 4V(h) − V(2h) = 2τ²(1 − φ^h)(3 − φ^h) for the AR(1)
     variogram V(h) = 2τ²(1 − φ^h). Second differences cancel a local linear trend, so a rising
     curve does not inflate the estimate. The excess at each lag is bounded above by its mean,
     floored at 0, plus two standard errors, so it is never 0 while the curve moves (a zero
     estimate early in a run let slow training noise stop flat runs). The model is fitted on
     the whole run and on the last
     ``noise_window`` checks; the one that gives the larger variance to the tested contrasts is
     used (training noise that grows over the run is seen where it is largest).

  The whole-run p-value is p_run = min(1, K · p_check), K = block ends in the run, and the
  reported z = Φ⁻¹(1 − min(p_run, 1/2)) is on the one-sided normal scale (0: no evidence). A test that cannot be made —
  too few checks, a non-finite value, a zero or undefined noise estimate — is **undecided**
  (z = NaN, the reason in :attr:`RiseTest.reason`) and never a stop.

References: Efron & Stein, *The jackknife estimate of variance* (Ann. Statist. 1981) for the
delete-a-group variance; Chernozhukov, Chetverikov & Kato, *Gaussian approximations and
multiplier bootstrap for maxima of sums of high-dimensional random vectors*
(https://arxiv.org/abs/1212.6906, Sec. 2, the multiplier bootstrap of a maximum) for drawing the
null of the maximum over candidates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, Optional, Sequence, Tuple

import numpy as np

__all__ = ["PatienceRule", "RiseTest", "rise_test", "fit_training_noise", "block_ends_in",
           "DEFAULT_WINDOW", "DEFAULT_NOISE_WINDOW"]

#: checks per block: the minimum and the current level are block means
DEFAULT_WINDOW = 3
#: the recent checks on which the training noise is fitted a second time (local estimate)
DEFAULT_NOISE_WINDOW = 30
#: AR(1) coefficients tried for the training noise
_PHIS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
_MAX_LAG = 4
_MIN_DIFFS = 5  # second differences needed at a lag to use it
_MAX_PHI = 0.9  # the slowest training noise (AR(1) coefficient per check) of the model
#: the excess is taken this many standard errors above its mean floored at 0 (an upper bound of
#: the training noise: 1 s.e. above the mean let a flat ICR with AR(1) training noise stop in
#: 4/300 runs at z = 3, 2 s.e. in 0/300; without the floor at 0, smooth and random-walk training
#: noise stopped 3-4 % of flat runs, most of them with a fitted training noise of exactly 0)
_EXCESS_SE = 2.0
_NORMAL = NormalDist()


# ----------------------------------------------------------------------------- patience (Lightning's rule)
class PatienceRule:
    """Lightning's ``EarlyStopping`` decision on plain floats (module docstring).

    ``update(value)`` returns ``(stop, reason, message)`` with ``reason`` one of
    ``"NON_FINITE_METRIC"``, ``"STOPPING_THRESHOLD"``, ``"DIVERGENCE_THRESHOLD"``,
    ``"PATIENCE_EXHAUSTED"`` or None, and updates ``best`` / ``wait_count``."""

    def __init__(self, name: str = "metric", mode: Literal["min", "max"] = "min", min_delta: float = 0.0,
                 patience: int = 3, check_finite: bool = True, stopping_threshold: Optional[float] = None,
                 divergence_threshold: Optional[float] = None) -> None:
        self.name, self.mode, self.patience = name, mode, int(patience)
        self.min_delta = abs(float(min_delta))
        self.check_finite = bool(check_finite)
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.best = math.inf if mode == "min" else -math.inf
        self.wait_count = 0

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def update(self, value: float) -> Tuple[bool, Optional[str], Optional[str]]:
        v, order = float(value), "<" if self.mode == "min" else ">"
        if self.check_finite and not math.isfinite(v):
            return True, "NON_FINITE_METRIC", (f"Monitored metric {self.name} = {v} is not finite. Previous best "
                                               f"value was {self.best:.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and self._better(v, self.stopping_threshold):
            return True, "STOPPING_THRESHOLD", (f"Stopping threshold reached: {self.name} = {v} {order} "
                                                f"{self.stopping_threshold}. Signaling Trainer to stop.")
        if self.divergence_threshold is not None and self._better(-v, -self.divergence_threshold):
            return True, "DIVERGENCE_THRESHOLD", (f"Divergence threshold reached: {self.name} = {v} {order} "
                                                  f"{self.divergence_threshold}. Signaling Trainer to stop.")
        shifted = v + self.min_delta if self.mode == "min" else v - self.min_delta
        if self._better(shifted, self.best):
            message = (f"Metric {self.name} improved by {abs(self.best - v):.3f} >= min_delta = {self.min_delta}. "
                       f"New best score: {v:.3f}" if math.isfinite(self.best)
                       else f"Metric {self.name} improved. New best score: {v:.3f}")
            self.best, self.wait_count = v, 0
            return False, None, message
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, "PATIENCE_EXHAUSTED", (f"Monitored metric {self.name} did not improve in the last "
                                                f"{self.wait_count} records. Best score: {self.best:.3f}. "
                                                "Signaling Trainer to stop.")
        return False, None, None

    def state_dict(self) -> dict:
        return {"best": self.best, "wait_count": self.wait_count}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.wait_count = float(state["best"]), int(state["wait_count"])


# ----------------------------------------------------------------------------- the rise test
@dataclass(frozen=True)
class RiseTest:
    """One check of :func:`rise_test`.

    ``tested``: this check ends a block (otherwise nothing was tested and z is NaN);
    ``z``: whole-run, selection-corrected z (NaN when undecided or untested); ``p_run`` /
    ``p_check``: the whole-run and this check's p-values; ``stat``: the largest standardized rise
    S; ``minimum``: (first, last) check index of the block chosen as the minimum; ``tau2`` /
    ``phi``: the training-noise model used; ``reason``: why a test is undecided or untested."""

    tested: bool
    z: float = math.nan
    p_run: float = math.nan
    p_check: float = math.nan
    stat: float = math.nan
    minimum: Tuple[int, int] = (-1, -1)
    tau2: float = math.nan
    phi: float = math.nan
    draws: int = 0
    reason: str = ""

    @property
    def decided(self) -> bool:
        return self.tested and math.isfinite(self.z)

    def significant(self, min_z: float) -> bool:
        """A stop at level ``min_z``: decided and z >= min_z (an undecided test never stops)."""
        return self.decided and self.z >= min_z


def block_ends_in(horizon: int, window: int = DEFAULT_WINDOW) -> int:
    """K: the block ends of a run of ``horizon`` checks at which a test is made (two blocks or more)."""
    return max(1, horizon // window - 1)


def _second_differences(y: np.ndarray, reps: Optional[np.ndarray], se: Optional[np.ndarray], lag: int):
    """(squared second differences at ``lag``, their group-noise variances), one per interior t."""
    d = y[2 * lag:] - 2.0 * y[lag:-lag] + y[:-2 * lag]
    if reps is not None:
        dr = reps[2 * lag:] - 2.0 * reps[lag:-lag] + reps[:-2 * lag]
        g = reps.shape[1]
        v = (g - 1) / g * ((dr - dr.mean(1, keepdims=True)) ** 2).sum(1)
    else:
        s2 = se ** 2
        v = s2[2 * lag:] + 4.0 * s2[lag:-lag] + s2[:-2 * lag]
    return d ** 2, v


def fit_training_noise(y: np.ndarray, reps: Optional[np.ndarray] = None, se: Optional[np.ndarray] = None,
                       max_phi: float = _MAX_PHI) -> Optional[Tuple[float, float, np.ndarray, np.ndarray]]:
    """The AR(1) training-noise models allowed by the curve (module docstring, part 2):
    ``(lags, excess, tau2 per phi, phis)`` or None when no lag has enough second differences.

    ``excess[h]`` is an upper estimate of the mean excess of the squared second differences at
    lag h over their jackknife (or ``se``) variance: the mean floored at 0 plus ``_EXCESS_SE``
    standard errors (positive whenever the differences vary); for every phi of the grid up to
    ``max_phi``, tau2 is the least-squares fit of 2 tau2 (1 - phi^h)(3 - phi^h) to it."""
    lags, excess = [], []
    for h in range(1, _MAX_LAG + 1):
        if y.size - 2 * h < _MIN_DIFFS:
            break
        d2, v = _second_differences(y, reps, se, h)
        x = d2 - v
        lags.append(h)
        # the mean floored at 0, plus _EXCESS_SE standard errors: a mean excess at or below 0 is
        # not evidence of no training noise (a short run's excess is often negative by chance
        # while its slow training noise is real), so it cannot pull the bound to 0
        excess.append(max(0.0, float(x.mean())) + _EXCESS_SE * float(x.std(ddof=1)) / math.sqrt(x.size))
    if not lags:
        return None
    h, m = np.array(lags, dtype=np.float64), np.array(excess)
    phis = np.array([p for p in _PHIS if p <= max_phi])
    tau2 = np.empty(phis.size)
    for i, phi in enumerate(phis):
        f = 2.0 * (1.0 - phi ** h) * (3.0 - phi ** h)
        tau2[i] = max(0.0, float(m @ f / (f @ f)))
    return h, m, tau2, phis


def _block_cov(n_blocks: int, window: int, tau2: float, phi: float) -> np.ndarray:
    """Covariance of the block means of an AR(1) process (variance tau2, coefficient phi)."""
    t = np.arange(n_blocks * window)
    lag = np.abs(t[:, None] - t[None, :])
    cov = tau2 * np.where(lag == 0, 1.0, phi ** lag.astype(np.float64) if phi > 0 else 0.0)
    blocks = cov.reshape(n_blocks, window, n_blocks, window).mean(axis=(1, 3))
    return blocks


def _contrast_var(cov_b: np.ndarray, cur: int) -> np.ndarray:
    a = np.arange(cur)
    return cov_b[cur, cur] + cov_b[a, a] - 2.0 * cov_b[a, cur]


def rise_test(values: Sequence[float], replicates: Optional[np.ndarray] = None, se: Optional[Sequence[float]] = None,
              *, horizon: int, window: int = DEFAULT_WINDOW, mode: Literal["min", "max"] = "min",
              noise_window: int = DEFAULT_NOISE_WINDOW, seed: int = 0, min_z: Optional[float] = None,
              max_draws: int = 2 ** 17) -> RiseTest:
    """The rise test at the newest of ``values`` (module docstring).

    Args:
        values: the monitored values of every check so far (n,).
        replicates: their delete-a-group jackknife replicates (n, G), the same groups at every
            check; or None.
        se: per-check standard errors (n,), used when ``replicates`` is None.
        horizon: the number of checks the run will make (K = :func:`block_ends_in`).
        window: checks per block.
        mode: ``"min"`` (a rise from the minimum) or ``"max"`` (a fall from the maximum).
        noise_window: the recent checks of the local training-noise fit.
        seed: the Monte Carlo seed (the draws of check n use ``(seed, n)``: deterministic).
        min_z: the level a caller stops at: the number of draws is sized so that a z of about
            ``min_z`` can be resolved, and drawing ends once z >= ``min_z`` is established (the
            reported z is then a lower bound); None: ``max_draws``.
        max_draws: most Monte Carlo draws.
    """
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    n = y.size
    if window < 1 or horizon < 1:
        raise ValueError(f"window and horizon must be >= 1, got {window} and {horizon}")
    if n == 0 or n % window:
        return RiseTest(False, reason="not the end of a block")
    n_blocks = n // window
    if n_blocks < 2:
        return RiseTest(False, reason="one block: no earlier minimum yet")
    reps = None if replicates is None else np.asarray(replicates, dtype=np.float64)
    s = None if se is None else np.asarray(se, dtype=np.float64).reshape(-1)
    if reps is not None and (reps.ndim != 2 or reps.shape[0] != n or reps.shape[1] < 2):
        raise ValueError(f"replicates must be (n, G) with n = {n} checks and G >= 2, got {reps.shape}")
    if reps is None and (s is None or s.size != n):
        return RiseTest(True, reason="no jackknife replicates and no standard errors: undecided")
    if not np.all(np.isfinite(y)) or (reps is not None and not np.all(np.isfinite(reps))) or \
            (reps is None and not np.all(np.isfinite(s))):
        return RiseTest(True, reason="a non-finite value or replicate: undecided")
    fits = [fit_training_noise(y, reps, s, _MAX_PHI)]
    if n > noise_window:
        lo = n - noise_window
        fits.append(fit_training_noise(y[lo:], None if reps is None else reps[lo:], None if s is None else s[lo:],
                                       _MAX_PHI))
    if any(f is None for f in fits):
        return RiseTest(True, reason=f"{n} checks are too few to estimate the training noise: undecided")
    sign = 1.0 if mode == "min" else -1.0
    cur = n_blocks - 1
    yb = y.reshape(n_blocks, window).mean(1)
    diff = sign * (yb[cur] - yb[:cur])  # (A,) rise of the newest block over every earlier block
    # the training-noise model: of every allowed (tau2, phi), the one that gives the tested
    # contrasts the largest variance (the slowest noise the short lags cannot rule out)
    models = [(float(t2), float(ph)) for f in fits for t2, ph in zip(f[2], f[3])]
    v_all = [_contrast_var(_block_cov(n_blocks, window, t2, ph), cur) for t2, ph in models]
    k = int(np.argmax([v.sum() for v in v_all]))
    (tau2, phi), v_tr = models[k], v_all[k]
    if reps is not None:
        g = reps.shape[1]
        rb = reps.reshape(n_blocks, window, g).mean(1)
        e = sign * (rb[cur][None, :] - rb[:cur])  # (A, G) replicate contrasts
        e = e - e.mean(1, keepdims=True)
        v_jk = (g - 1) / g * (e ** 2).sum(1)
        delta = (-(g - 1) * e).T  # (G, A) pseudo-value deviations of each contrast
    else:
        sb2 = (s ** 2).reshape(n_blocks, window).sum(1) / window ** 2
        v_jk = sb2[cur] + sb2[:cur]
    var = v_jk + v_tr
    if not np.all(np.isfinite(var)) or np.any(v_jk <= 0):  # identical replicates: a broken measurement
        return RiseTest(True, tau2=tau2, phi=phi,
                        reason="a zero or undefined jackknife noise estimate for a candidate minimum: undecided")
    zs = diff / np.sqrt(var)
    a_best = int(np.argmax(zs))
    stat = float(zs[a_best])
    minimum = (a_best * window, a_best * window + window - 1)
    # Monte Carlo null of max_a Z_a: group noise by Gaussian multipliers (studentized), training
    # noise from the block covariance of the fitted AR(1)
    k_run = max(block_ends_in(horizon, window), cur)
    cov_b = _block_cov(n_blocks, window, tau2, phi)
    w, u = np.linalg.eigh(cov_b)
    root = u * np.sqrt(np.clip(w, 0.0, None))[None, :]
    rng = np.random.default_rng([int(seed), n])
    target = None
    if min_z is not None and math.isfinite(min_z):
        target = max(1.0 - _NORMAL.cdf(float(min_z)), 1e-300)
        limit = int(min(max(int(math.ceil(50.0 * k_run / target)), 2 ** 14), 2 ** 21))
    else:
        limit = int(max_draws)
    chunk, drawn, hits = 1024, 0, 0
    while drawn < limit:
        m = min(chunk, limit - drawn)
        eta = (rng.standard_normal((m, n_blocks)) @ root.T) * sign
        eta_c = eta[:, [cur]] - eta[:, :cur]
        if reps is not None:
            xi = rng.standard_normal((m, g))
            c = math.sqrt(g / (g - 1))
            s1, s2 = xi @ delta, (xi ** 2) @ (delta ** 2)
            d_jk = c * s1 / g
            v_sim = c * c * np.clip(s2 - s1 ** 2 / g, 0.0, None) / (g * (g - 1))
        else:
            d_jk = rng.standard_normal((m, cur + 1)) * np.sqrt(np.append(sb2[:cur], sb2[cur]))[None, :]
            d_jk = sign * (d_jk[:, [cur]] - d_jk[:, :cur])
            v_sim = np.broadcast_to(v_jk, d_jk.shape)
        den = np.sqrt(v_sim + v_tr[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            zmax = np.where(den > 0, (d_jk + eta_c) / den, -np.inf).max(1)
        hits += int((zmax >= stat).sum())
        drawn += m
        if hits >= 64:  # the p-value is known to ~12 %: far from the tails that need more draws
            break
        if target is not None and k_run * (hits + 1) / (drawn + 1) <= target:
            break  # already significant at min_z with the conservative (hits + 1) / (draws + 1)
        chunk = min(chunk * 2, 2 ** 16)
    p_check = (hits + 1) / (drawn + 1)
    p_run = min(1.0, k_run * p_check)
    z = _NORMAL.inv_cdf(1.0 - min(p_run, 0.5))  # floored at 0: p_run >= 1/2 is no evidence of a rise
    return RiseTest(True, z=float(z), p_run=float(p_run), p_check=float(p_check), stat=stat, minimum=minimum,
                    tau2=float(tau2), phi=float(phi), draws=drawn)
