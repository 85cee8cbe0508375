"""Calibration of the event detectors on nulls that look like real runs (pure numpy).

A developers' tool, not part of the package (issue 43): ``experiments/calibrate_events.py``
and the tests import it as ``calibration`` with ``experiments/`` on the path.

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

**Whole runs** (second part of the module). :func:`simulate_run` generates a whole synthetic run
of a :class:`Family` — E_gen and E_mem with M per-seed squared distances, the memorization ratio
with per-sample 0/1 indicators, ICR with 16 delete-a-group jackknife replicates — in the input
format of :func:`~lightning_pfd.analysis.events.analyze_history` (``series``, ``units``), with no
event (nulls) or one planted event (power). :data:`FAMILIES` holds the named null structures
(per-seed noise; common training noise: AR(1), fractional Gaussian noise, fractional Brownian
motion, random walk, smooth, white, jumps, with a size constant, growing or shrinking over the
run; discrete ratios; jackknife ICR; short runs; runs without a ratio), and :data:`TUNE` /
:data:`HELD_OUT` a fixed split of them: detectors are tuned on the first half only and their
false-event rates are reported on the second (docs/events.md, "Null families").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Literal, Optional, get_args

import numpy as np

from lightning_pfd.validation import (FiniteNonNegativeFloat, FinitePositiveFloat, HalfOpenUnitInterval, IntAtLeastTwo,
                          OpenUnitInterval, PositiveInt, check_args, ranged)
from lightning_pfd.analysis.per_unit import UnitSeries

__all__ = ["NULLS", "NullSpec", "trend", "planted_trend", "simulate", "calibrate",
           # the generator of whole synthetic runs (second part of this module)
           "Family", "FAMILIES", "TUNE", "HELD_OUT", "split", "noise_process", "envelope",
           "gen_trend", "mem_trend", "simulate_run", "PLANTED", "POWER_FAMILIES", "POWER_FAMILIES_TAILS",
           "schedule_envelope", "spike_process",
           "wilson_interval", "event_status", "calibrate_families", "write_run"]

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


# ============================================================================= whole runs
# A generator of many null structures for whole synthetic runs: every curve the detectors of
# :func:`lightning_pfd.analysis.events.analyze_history` read (E_gen, E_mem with M per-seed squared
# distances; the memorization ratio with per-sample 0/1 indicators; ICR with delete-a-group
# jackknife replicates), in the exact input format of ``analyze_history(series, units=...)``.
# The families, their parameters and the tune / held-out split are documented in docs/events.md
# ("Null families").

#: common training-noise processes (:func:`noise_process`)
NoiseKind = Literal["none", "white", "ar1", "fgn", "fbm", "walk", "smooth", "jumps"]
NOISE_KINDS = get_args(NoiseKind)
#: per-seed noise of the squared distances (:func:`_seed_levels`)
SeedNoise = Literal["flip", "heavy", "drift", "hetero"]
#: what a family varies (every structure type is on both sides of the split)
Structure = Literal["per_seed", "training_noise", "ratio", "icr", "short", "e_only", "tails", "schedule", "long"]
#: how the size of the common training noise changes along the run (:func:`schedule_envelope`)
Schedule = Literal["constant", "cosine", "restart"]
#: innovations of the AR(1) common training noise
Innovations = Literal["gaussian", "student_t"]
#: events planted on a whole run for power (:func:`simulate_run`)
PLANTED = ("early_learning", "double_descent", "memorization_onset", "icr_minimum")
Planted = Literal["early_learning", "double_descent", "memorization_onset", "icr_minimum"]
ProbabilityOpen = HurstIndex = OpenUnitInterval
PositiveNumber, NonNegativeNumber, NumGroups = FinitePositiveFloat, FiniteNonNegativeFloat, IntAtLeastTwo
#: Student-t degrees of freedom with a finite variance; an anneal factor (first / last noise size)
TailIndex = ranged("TailIndex", float, [(">", 2.0), ("<", float("inf"))], "a finite number > 2 (a finite variance)")
AnnealFactor = ranged("AnnealFactor", float, [(">=", 1.0), ("<", float("inf"))], "a finite number >= 1")


@dataclass(frozen=True)
class Family:
    """A named null structure for whole runs (docs/events.md, "Null families").

    Curves: ``pfd/e_gen`` and ``pfd/e_mem`` (kind ``sq_dist``, ``num_seeds`` seeds), ``mem/ratio``
    (kind ``indicator``, ``num_samples`` samples) and ``icr/icr`` (kind ``jackknife``,
    ``icr_groups`` groups); ``curves="e_only"`` logs E_gen and E_mem only.

    - Per-seed noise ``seed_noise`` (:func:`_seed_levels`), sized so that E has residual sd
      ``seed_sd`` at ``m_ref`` seeds (less with more seeds): ``flip`` (two basins, flip
      probability ``p_flip``), ``heavy`` (Pareto-weighted seeds with persistent log-normal d²),
      ``drift`` (every seed's log d² a random walk), ``hetero`` (per-seed noise amplitudes
      spread over a factor ~10).
    - Common training noise ``noise`` (:func:`noise_process`, unit variance, times
      :func:`envelope` ``growth``: the sd grows geometrically by that factor from the first to the
      last evaluation), of sd at the last evaluation ``noise_sd`` on E (E units), ``ratio_noise_sd`` on the ratio's
      probit threshold and ``icr_noise_sd`` on ICR; ``phi`` (AR(1)), ``hurst`` (fGn / fBm),
      ``length`` (smooth noise: Gaussian kernel sd; jumps: mean evaluations between jumps).
      ``ratio_noise`` overrides the process of the ratio (None: ``noise``). ``innovations``
      ``"student_t"``: the AR(1) noise is driven by Student-t innovations with ``nu`` degrees of
      freedom (unit variance; heavy-tailed increments). ``schedule`` (:func:`schedule_envelope`):
      the noise size follows a cosine learning-rate schedule falling ``anneal``-fold
      (``"cosine"``), or restarts ``restarts`` times (``"restart"``, SGDR); ``noise_sd`` is then
      the size at the start of the run (the largest).
    - Spikes (a bad batch): at each evaluation with probability ``spike_rate`` every unit's error
      (E_gen, E_mem: each seed's distance; ICR: every group) is raised by the same factor
      1 + X, X exponential of mean ``spike_size`` (a share of the value), for that one evaluation;
      ``spike_ema`` > 0 logs an exponential moving average of the metric, so a spike decays as
      ``spike_ema``^k over the following evaluations (:func:`spike_process`).
    - Ratio: each sample copies when a latent N(0, 1) variable, a per-sample AR(1) of lag-1
      correlation ``ratio_persistence`` mixed with a per-sample constant (share
      ``ratio_heterogeneity``), is below the common threshold Φ⁻¹(``ratio_base``) + noise: a
      constant rate with per-sample persistence, over-dispersed by the common noise.
    - ICR: per-group contributions (level ``icr_level``, ``icr_trend`` flat or slowly falling,
      persistent per-group deviations of sd ``icr_group_sd``, Student-t(3) innovations when
      ``icr_heavy``) plus the common noise; the logged ICR is their mean and the replicates the
      delete-a-group means (their mean is the full estimate).
    """

    name: str
    structure: Structure
    description: str = ""
    n_eval: NumEvaluations = 500
    num_seeds: NumSeeds = 256
    seed_noise: SeedNoise = "flip"
    seed_sd: NonNegativeNumber = 0.049
    m_ref: PositiveInt = 256
    p_flip: ProbabilityOpen = 0.02
    noise: NoiseKind = "none"
    noise_sd: NonNegativeNumber = 0.02
    phi: HalfOpenUnitInterval = 0.9
    hurst: HurstIndex = 0.7
    length: PositiveNumber = 10.0
    growth: PositiveNumber = 1.0
    curves: Literal["all", "e_only"] = "all"
    num_samples: NumSeeds = 300
    ratio_base: ProbabilityOpen = 0.02
    ratio_persistence: HalfOpenUnitInterval = 0.9
    ratio_heterogeneity: HalfOpenUnitInterval = 0.0
    ratio_noise: Optional[NoiseKind] = None
    ratio_noise_sd: NonNegativeNumber = 0.1
    icr_groups: NumGroups = 16
    icr_level: ProbabilityOpen = 0.45
    icr_trend: Literal["flat", "falling"] = "flat"
    icr_group_sd: NonNegativeNumber = 0.02
    icr_heavy: bool = False
    icr_noise_sd: NonNegativeNumber = 0.003
    innovations: Innovations = "gaussian"
    nu: TailIndex = 2.5
    schedule: Schedule = "constant"
    anneal: AnnealFactor = 7.0
    restarts: PositiveInt = 3
    spike_rate: HalfOpenUnitInterval = 0.0
    spike_size: NonNegativeNumber = 0.0
    spike_ema: HalfOpenUnitInterval = 0.0

    def __post_init__(self) -> None:
        check_args(Family, vars(self))
        if not isinstance(self.icr_heavy, bool):
            raise TypeError(f"icr_heavy must be True or False, got {self.icr_heavy!r}")


def envelope(n: int, growth: float) -> np.ndarray:
    """Size of the training noise along the run: growth^(t/(n−1)), 1 at the first evaluation and
    ``growth`` at the last (2.5: the measured growth of E_gen's residual sd on the 500-epoch run;
    < 1: shrinking)."""
    t = np.arange(n, dtype=np.float64)
    return float(growth) ** (t / max(n - 1, 1))


def schedule_envelope(n: int, schedule: Schedule, anneal: float = 7.0, restarts: int = 3) -> np.ndarray:
    """Size of the training noise under a learning-rate schedule, 1 at the start: the noise of SGD
    scales with the learning rate, so it follows the schedule's cosine
    f(u) = 1/anneal + (1 − 1/anneal)·(1 + cos πu)/2 over the run (``"cosine"``, u = t/(n − 1):
    falls ``anneal``-fold), or over each of ``restarts`` + 1 equal cycles (``"restart"``, SGDR:
    Loshchilov & Hutter 2017, "SGDR: stochastic gradient descent with warm restarts", eq. 5),
    jumping back to 1 at every restart; ``"constant"``: ones."""
    if schedule == "constant":
        return np.ones(n)
    t = np.arange(n, dtype=np.float64)
    if schedule == "cosine":
        u = t / max(n - 1, 1)
    else:
        cycle = n / (int(restarts) + 1)
        u = (t % cycle) / max(cycle - 1, 1)
    lo = 1.0 / float(anneal)
    return lo + (1.0 - lo) * 0.5 * (1.0 + np.cos(np.pi * np.clip(u, 0.0, 1.0)))


def spike_process(rng: np.random.Generator, n: int, rate: float, size: float, ema: float = 0.0) -> np.ndarray:
    """(n,) relative excess of the logged metric from bad batches: at each evaluation with
    probability ``rate`` a spike X ~ Exponential(mean ``size``) for that one evaluation; with an
    EMA of the logged value (``ema`` > 0) a spike at t0 contributes X·ema^(t − t0) at t >= t0
    (the shape; its peak is X). Zeros when ``rate`` or ``size`` is 0."""
    if rate <= 0 or size <= 0:
        return np.zeros(n)
    x = np.where(rng.random(n) < rate, rng.exponential(size, n), 0.0)
    if ema <= 0:
        return x
    return _ar1_filter(x[:, None], float(ema), np.zeros(1))[:, 0]


def _fgn(rng: np.random.Generator, n: int, hurst: float, k: int) -> np.ndarray:
    """(n, k) fractional Gaussian noise of unit variance, exact (circulant embedding: Davies &
    Harte 1987, "Tests for Hurst effect", Biometrika 74(1)), autocovariance
    γ(j) = (|j+1|^{2H} − 2|j|^{2H} + |j−1|^{2H})/2."""
    j = np.arange(n + 1, dtype=np.float64)
    g = 0.5 * ((j + 1) ** (2 * hurst) - 2 * j ** (2 * hurst) + np.abs(j - 1) ** (2 * hurst))
    c = np.concatenate([g, g[n - 1:0:-1]])  # circulant row, length 2n
    lam = np.clip(np.fft.fft(c).real, 0.0, None)  # >= 0 for fGn (the embedding is exact)
    big = c.size
    w = np.sqrt(lam / big)[:, None] * (rng.standard_normal((big, k)) + 1j * rng.standard_normal((big, k)))
    return np.fft.fft(w, axis=0).real[:n]


def noise_process(rng: np.random.Generator, kind: NoiseKind, n: int, k: int = 1, *,
                  phi: float = 0.9, hurst: float = 0.7, length: float = 10.0) -> np.ndarray:
    """``k`` independent draws (n, k) of a common training-noise process (vectorized: no loop
    over evaluations):

    - ``white``: i.i.d. N(0, 1);
    - ``ar1``: stationary AR(1), lag-1 correlation ``phi``, variance 1 (:func:`_ar1_filter`,
      a stationary start);
    - ``fgn``: fractional Gaussian noise with Hurst index ``hurst`` (long memory for H > 1/2),
      variance 1 (:func:`_fgn`);
    - ``fbm``: fractional Brownian motion, the cumulative sum of fGn scaled so that
      Var(B_t) = ((t+1)/n)^{2H}: variogram Var(B_{t+h} − B_t) = (h/n)^{2H}, exponent 2H;
    - ``walk``: a random walk (fBm with H = 1/2), Var = (t+1)/n;
    - ``smooth``: white noise low-pass filtered with a Gaussian kernel of sd ``length``
      evaluations, variance 1 (a Gaussian-process draw with a squared-exponential kernel);
    - ``jumps``: piecewise constant, N(0, 1) levels, a jump with probability 1/``length`` at
      every evaluation (stationary);
    - ``none``: zeros.
    """
    check_args(noise_process, locals())
    shape = (n, k)
    if kind == "none":
        return np.zeros(shape)
    if kind == "white":
        return rng.standard_normal(shape)
    if kind == "ar1":
        return _ar1_cols(rng, n, k, phi)
    if kind == "fgn":
        return _fgn(rng, n, hurst, k)
    if kind == "fbm":
        return np.cumsum(_fgn(rng, n, hurst, k), axis=0) / float(n) ** hurst
    if kind == "walk":
        return np.cumsum(rng.standard_normal(shape), axis=0) / math.sqrt(n)
    if kind == "smooth":  # linear convolution by FFT, the "valid" part
        half = int(math.ceil(4 * length))
        s = np.arange(-half, half + 1, dtype=np.float64)
        ker = np.exp(-0.5 * (s / length) ** 2)
        ker /= math.sqrt(float(np.sum(ker ** 2)))
        e = rng.standard_normal((n + 2 * half, k))
        size = e.shape[0] + ker.size - 1
        full = np.fft.irfft(np.fft.rfft(e, size, axis=0) * np.fft.rfft(ker, size)[:, None], size, axis=0)
        return full[ker.size - 1: e.shape[0]]
    # jumps
    seg = np.cumsum(rng.random(shape) < 1.0 / max(length, 1.0), axis=0)
    return np.take_along_axis(rng.standard_normal(shape), seg, axis=0)


def gen_trend(t: np.ndarray, n: int, event: Optional[str] = None, height: float = 0.0) -> np.ndarray:
    """E_gen's monotone trend on a run of ``n`` evaluations, 1.5 + 1.5·exp(−t/(0.12 n)) (falls
    from 3 and flattens: :func:`trend` at n = 500), with a planted ``early_learning`` /
    ``double_descent`` of ``height`` placed as in :func:`planted_trend` (fractions of the run)."""
    base = 1.5 + 1.5 * np.exp(-t / (0.12 * n))
    if event == "double_descent" and height:
        return base + height * np.exp(-0.5 * ((t - 0.6 * n) / (0.05 * n)) ** 2)
    if event == "early_learning" and height:
        return base + height / (1.0 + np.exp(-(t - 0.65 * n) / (0.03 * n)))
    return base


def mem_trend(t: np.ndarray, n: int) -> np.ndarray:
    """E_mem's monotone falling trend, 2.2 + 1.5·exp(−t/(0.2 n))."""
    return 2.2 + 1.5 * np.exp(-t / (0.2 * n))


def _ar1_filter(e: np.ndarray, phi: float, x_prev: np.ndarray) -> np.ndarray:
    """x_t = phi·x_{t−1} + e_t along axis 0 of ``e`` (n, k), from x_{−1} = ``x_prev`` (k,),
    without a loop over t: in a block of L evaluations x_{t0+s} = phi^s·(phi·x_{t0−1} +
    sum_{j<=s} phi^{−j} e_{t0+j}), a cumulative sum; blocks are as long as phi^{−L} stays below
    e^100 (one block for phi >= 0.82 and n <= 500), so the rounding error stays ~eps/(1 − phi)."""
    n = e.shape[0]
    if phi == 0:
        return e.copy()
    step = n if phi >= 1 else max(1, int(100.0 / -math.log(phi)))
    out = np.empty_like(e, dtype=np.float64)
    prev = np.asarray(x_prev, dtype=np.float64)
    for t0 in range(0, n, step):
        blk = e[t0:t0 + step]
        pw = phi ** np.arange(blk.shape[0], dtype=np.float64)[:, None]
        out[t0:t0 + step] = pw * (phi * prev[None, :] + np.cumsum(blk / pw, axis=0))
        prev = out[t0 + blk.shape[0] - 1]
    return out


def _ar1_cols(rng: np.random.Generator, n: int, m: int, phi: float, innov=None) -> np.ndarray:
    """(n, m) independent unit-variance AR(1) columns, stationary from the start (x_{−1} ~
    N(0, 1)); ``innov``: unit-variance innovations to use instead of N(0, 1) ones."""
    e = rng.standard_normal((n, m)) if innov is None else innov
    x_prev = rng.standard_normal(m)
    return _ar1_filter(math.sqrt(1.0 - phi ** 2) * e, phi, x_prev)


def _seed_levels(rng: np.random.Generator, fam: Family, n: int, final: float) -> np.ndarray:
    """(n, M) per-seed squared-distance levels with expectation 1 per evaluation (up to the
    sample mean of the seeds' fixed levels), sized so that sqrt(mean over ``m_ref`` seeds) has
    relative sd ``seed_sd``/``final``."""
    m = fam.num_seeds
    rel = fam.seed_sd / float(final)
    cv = 2.0 * rel * math.sqrt(fam.m_ref)  # relative sd of one seed's d² that gives ``rel``
    if fam.seed_sd == 0:
        return np.ones((n, m))
    if fam.seed_noise == "flip":  # two basins, a two-state Markov chain per seed (vectorized)
        low = rng.uniform(0.5, 1.5, m)
        g = rng.lognormal(0.0, 1.0, m)
        g /= g.mean()
        # one seed's d² moves by s·g/2 around E² = mean(low) + s/2: cv = a·sqrt(mean g²)/2 with
        # a = s/E² (as :func:`simulate`: a = 4·rel·sqrt(m_ref)/sqrt(mean g²))
        a = 2.0 * cv / math.sqrt(float(np.mean(g ** 2)))
        if a >= 2.0:
            raise ValueError(f"seed_sd = {fam.seed_sd} is more seed noise than two basins can make at "
                             f"m_ref = {fam.m_ref}")
        s = a * float(low.mean()) / (1.0 - a / 2.0)
        state = (rng.random(m) < 0.5)[None, :] ^ (np.cumsum(rng.random((n, m)) < fam.p_flip, axis=0) % 2 == 1)
        return (low[None, :] + state * (s * g)[None, :]) / (float(low.mean()) + s / 2.0)
    if fam.seed_noise == "heavy":  # Pareto-weighted seeds (a few dominate), persistent log-normal d²
        w = rng.pareto(2.5, m) + 1.0
        w /= w.mean()
        c = math.sqrt(math.log1p(cv ** 2 / float(np.mean(w ** 2))))
        z = _ar1_cols(rng, n, m, 0.95)
        return w[None, :] * np.exp(c * z - 0.5 * c * c)
    low = rng.uniform(0.5, 1.5, m)
    if fam.seed_noise == "drift":  # log d² of every seed a random walk: variance σ²t, E[·] = low
        sig2 = math.log1p(cv ** 2) / n  # relative sd cv at the end of the run
        w = np.cumsum(rng.standard_normal((n, m)) * math.sqrt(sig2), axis=0)
        var = sig2 * np.arange(1, n + 1, dtype=np.float64)[:, None]
        return low[None, :] * np.exp(w - 0.5 * var)
    # hetero: per-seed amplitudes c_i = c·v_i spread over a factor ~10, persistent AR(1) noise
    v = np.exp(rng.uniform(0.0, math.log(10.0), m))  # log-uniform over a factor 10
    v /= math.sqrt(float(np.mean(v ** 2)))
    lo_c, hi_c = 0.0, 3.0
    for _ in range(50):  # mean_i (exp(c² v_i²) − 1) = cv²  (bisection)
        c = 0.5 * (lo_c + hi_c)
        if float(np.mean(np.expm1(np.minimum((c * v) ** 2, 50.0)))) > cv ** 2:
            hi_c = c
        else:
            lo_c = c
    ci = (0.5 * (lo_c + hi_c)) * v
    z = _ar1_cols(rng, n, m, 0.8)
    return low[None, :] * np.exp(ci[None, :] * z - 0.5 * ci[None, :] ** 2)


def _common(rng: np.random.Generator, fam: Family, n: int, kind: Optional[str] = None) -> np.ndarray:
    """One draw (n,) of the family's common training noise with its envelope (unit size)."""
    kind = fam.noise if kind is None else kind
    if kind == "ar1" and fam.innovations == "student_t":
        innov = rng.standard_t(fam.nu, (n, 1)) / math.sqrt(fam.nu / (fam.nu - 2.0))
        z = _ar1_cols(rng, n, 1, fam.phi, innov)[:, 0]
    else:
        z = noise_process(rng, kind, n, 1, phi=fam.phi, hurst=fam.hurst, length=fam.length)[:, 0]
    if fam.schedule != "constant":  # the family's sd is the size at the start
        return z * schedule_envelope(n, fam.schedule, fam.anneal, fam.restarts)
    return z * envelope(n, fam.growth) / fam.growth  # the family's sd is the size at the end


def _e_curve(rng: np.random.Generator, fam: Family, key: str, t: np.ndarray, target: np.ndarray,
             spikes: Optional[np.ndarray] = None):
    n = t.size
    levels = _seed_levels(rng, fam, n, float(target[-1]))
    tgt = target + fam.noise_sd * _common(rng, fam, n)
    if spikes is not None:
        tgt = tgt * (1.0 + spikes)
    d2 = levels * (tgt ** 2)[:, None]
    values = np.sqrt(d2.mean(1))
    return values, UnitSeries(key, "sq_dist", t.copy(), d2, np.arange(fam.num_seeds, dtype=np.int64),
                              values.copy())


def _probit(p: np.ndarray) -> np.ndarray:
    """Φ⁻¹ elementwise (the standard normal quantile)."""
    from statistics import NormalDist

    inv = NormalDist().inv_cdf
    uniq, idx = np.unique(p, return_inverse=True)
    return np.array([inv(float(q)) for q in uniq])[idx].reshape(p.shape)


def _ratio_curve(rng: np.random.Generator, fam: Family, t: np.ndarray, event: Optional[str],
                 height: float):
    n, m = t.size, fam.num_samples
    p = np.full(n, fam.ratio_base)
    if event == "memorization_onset" and height:
        p = fam.ratio_base + height / (1.0 + np.exp(-(t - 0.6 * n) / (0.03 * n)))
    thr = _probit(np.clip(p, 1e-6, 1 - 1e-6)) + fam.ratio_noise_sd * _common(rng, fam, n, fam.ratio_noise)
    k = fam.ratio_heterogeneity
    latent = math.sqrt(1.0 - k) * _ar1_cols(rng, n, m, fam.ratio_persistence)
    if k > 0:
        latent += math.sqrt(k) * rng.standard_normal(m)[None, :]
    ind = (latent < thr[:, None]).astype(np.float64)
    values = ind.mean(1)
    return values, UnitSeries("mem/ratio", "indicator", t.copy(), ind, np.arange(m, dtype=np.int64),
                              values.copy())


def _icr_curve(rng: np.random.Generator, fam: Family, t: np.ndarray, event: Optional[str],
               height: float, spikes: Optional[np.ndarray] = None):
    n, g = t.size, fam.icr_groups
    level = np.full(n, fam.icr_level)
    if fam.icr_trend == "falling":
        level = level + 0.05 * np.exp(-t / (0.3 * n))
    if event == "icr_minimum" and height:
        tm = 0.4 * (n - 1)
        level = level + height * np.where(t <= tm, ((tm - t) / tm) ** 2, ((t - tm) / (n - 1 - tm)) ** 2)
    innov = None
    if fam.icr_heavy:  # Student-t(3) innovations, scaled to unit variance
        innov = rng.standard_t(3.0, (n, g)) / math.sqrt(3.0)
    dev = fam.icr_group_sd * _ar1_cols(rng, n, g, 0.9, innov)
    a = level[:, None] + fam.icr_noise_sd * _common(rng, fam, n)[:, None] + dev
    if spikes is not None:
        a = a * (1.0 + spikes)[:, None]
    full = a.mean(1)
    reps = (a.sum(1, keepdims=True) - a) / (g - 1)  # delete-a-group replicates
    return full, UnitSeries("icr/icr", "jackknife", t.copy(), reps, np.arange(g, dtype=np.int64),
                            full.copy())


def _planted(event) -> tuple:
    """``event`` as a tuple of planted-event names (None: none); a clear error otherwise."""
    if event is None:
        return ()
    events = (event,) if isinstance(event, str) else tuple(event)
    bad = [e for e in events if e not in PLANTED]
    if bad:
        raise ValueError(f"event: unknown planted event {bad[0]!r}; allowed {list(PLANTED)} (or a tuple of them)")
    return events


def simulate_run(family: Family, seed: int, event=None, height: float = 0.0) -> tuple:
    """One whole synthetic run of ``family``: ``(series, units)`` in the input format of
    :func:`~lightning_pfd.analysis.events.analyze_history` (``series`` = {key: (epochs, values)}
    with the built-in keys ``pfd/e_gen``, ``pfd/e_mem``, ``mem/ratio``, ``icr/icr``; ``units`` =
    {key: :class:`~lightning_pfd.analysis.per_unit.UnitSeries`}). Epochs are 0..n_eval−1.
    ``event`` (a name of :data:`PLANTED`, or a tuple of them: one per curve) plants an event of
    ``height`` (the size of its legs): ``early_learning`` /
    ``double_descent`` on E_gen (:func:`gen_trend`), ``memorization_onset`` (the ratio rises
    from ``ratio_base`` by ``height``, a logistic step at 60 % of the run) or ``icr_minimum``
    (ICR falls by ``height`` to a minimum at 40 % and rises by ``height`` to the end). Without
    ``event`` no curve has an event: E_gen and E_mem fall monotonically, the ratio and ICR are
    flat (ICR slowly falling with ``icr_trend="falling"``), plus noise. Deterministic in
    ``seed``."""
    if not isinstance(family, Family):
        raise TypeError(f"family must be a Family, got {type(family).__name__}")
    events = _planted(event)
    if not (isinstance(height, (int, float)) and not isinstance(height, bool) and math.isfinite(height)
            and height >= 0):
        raise ValueError(f"height must be a finite number >= 0, got {height!r}")
    if {"early_learning", "double_descent"} <= set(events):
        raise ValueError("event: early_learning and double_descent are both on E_gen; plant one of them")
    if set(events) & {"memorization_onset", "icr_minimum"} and family.curves == "e_only":
        raise ValueError(f"event={event!r} needs the ratio and ICR curves; family "
                         f"{family.name!r} logs E_gen and E_mem only (curves='e_only')")
    rng = np.random.default_rng(seed)
    n = family.n_eval
    t = np.arange(n, dtype=np.float64)
    series, units = {}, {}
    gen_event = next((e for e in events if e in ("early_learning", "double_descent")), None)
    spikes = None
    if family.spike_rate > 0 and family.spike_size > 0:  # one bad-batch process shared by every curve
        spikes = spike_process(np.random.default_rng([seed, 1]), n, family.spike_rate, family.spike_size,
                               family.spike_ema)
    for key, target in (("pfd/e_gen", gen_trend(t, n, gen_event, height)), ("pfd/e_mem", mem_trend(t, n))):
        y, u = _e_curve(rng, family, key, t, target, spikes)
        series[key], units[key] = (t.copy(), y), u
    if family.curves == "all":
        onset = "memorization_onset" if "memorization_onset" in events else None
        y, u = _ratio_curve(rng, family, t, onset, height)
        series["mem/ratio"], units["mem/ratio"] = (t.copy(), y), u
        y, u = _icr_curve(rng, family, t, "icr_minimum" if "icr_minimum" in events else None, height, spikes)
        series["icr/icr"], units["icr/icr"] = (t.copy(), y), u
    return series, units


# ----------------------------------------------------------------------------- the families
def _families() -> list:
    F = Family
    return [
        # per-seed noise only (no common training noise)
        F("seed_flip_m256", "per_seed", "seeds flip between two basins (p 0.02), M = 256"),
        F("seed_flip_m2048", "per_seed", "seeds flip between two basins (p 0.02), M = 2048", num_seeds=2048),
        F("heavy_d2_m256", "per_seed", "heavy-tailed d² (Pareto-weighted seeds), M = 256", seed_noise="heavy"),
        F("heavy_d2_m1024", "per_seed", "heavy-tailed d² (Pareto-weighted seeds), M = 1024",
          seed_noise="heavy", num_seeds=1024),
        F("seed_drift_m2048", "per_seed", "seed×epoch drift (random-walk log d²), M = 2048",
          seed_noise="drift", num_seeds=2048),
        F("seed_drift_m256", "per_seed", "seed×epoch drift (random-walk log d²), M = 256", seed_noise="drift"),
        F("hetero_seeds_m256", "per_seed", "heteroscedastic seeds (amplitudes over ×10), M = 256",
          seed_noise="hetero"),
        F("hetero_seeds_m64", "per_seed", "heteroscedastic seeds (amplitudes over ×10), M = 64",
          seed_noise="hetero", num_seeds=64),
        # common training noise
        F("ar1_m256", "training_noise", "AR(1) φ 0.9, sd 0.02, M = 256", noise="ar1"),
        F("ar1_m4096", "training_noise", "AR(1) φ 0.95, sd 0.02, M = 4096", noise="ar1", phi=0.95,
          num_seeds=4096),
        F("ar1_grow2.5_m256", "training_noise", "AR(1) φ 0.9, sd growing 2.5× to 0.03, M = 256",
          noise="ar1", noise_sd=0.03, growth=2.5),
        F("ar1_grow2.5_m2048", "training_noise", "AR(1) φ 0.9, sd growing 2.5× to 0.03, M = 2048",
          noise="ar1", noise_sd=0.03, growth=2.5, num_seeds=2048),
        F("ar1_grow10_m2048", "training_noise", "AR(1) φ 0.9, sd growing 10× to 0.03, M = 2048",
          noise="ar1", noise_sd=0.03, growth=10.0, num_seeds=2048),
        F("ar1_grow10_m256", "training_noise", "AR(1) φ 0.9, sd growing 10× to 0.03, M = 256",
          noise="ar1", noise_sd=0.03, growth=10.0),
        F("ar1_shrink_m1024", "training_noise", "AR(1) φ 0.95, sd shrinking 2.5× to 0.02, M = 1024",
          noise="ar1", phi=0.95, growth=0.4, num_seeds=1024),
        F("ar1_shrink_m256", "training_noise", "AR(1) φ 0.9, sd shrinking 2.5× to 0.02, M = 256",
          noise="ar1", growth=0.4),
        F("fgn_h0.7_m256", "training_noise", "fractional Gaussian noise H 0.7, sd 0.02, M = 256",
          noise="fgn", hurst=0.7),
        F("fgn_h0.8_m1024", "training_noise", "fractional Gaussian noise H 0.8, sd 0.02, M = 1024",
          noise="fgn", hurst=0.8, num_seeds=1024),
        F("fbm_h0.65_m2048", "training_noise", "fractional Brownian motion H 0.65, sd 0.03 at the end, M = 2048",
          noise="fbm", hurst=0.65, noise_sd=0.03, num_seeds=2048),
        F("fbm_h0.75_m256", "training_noise", "fractional Brownian motion H 0.75, sd 0.03 at the end, M = 256",
          noise="fbm", hurst=0.75, noise_sd=0.03),
        F("walk_m256", "training_noise", "random walk, sd 0.03 at the end, M = 256", noise="walk", noise_sd=0.03),
        F("walk_grow2.5_m1024", "training_noise", "random walk times a size growing 2.5×, sd 0.03 at the end, M = 1024",
          noise="walk", noise_sd=0.03, growth=2.5, num_seeds=1024),
        F("smooth_l20_m2048", "training_noise", "smooth noise (Gaussian kernel sd 20), sd 0.01, M = 2048",
          noise="smooth", length=20.0, noise_sd=0.01, num_seeds=2048),
        F("smooth_l8_m256", "training_noise", "smooth noise (Gaussian kernel sd 8), sd 0.02, M = 256",
          noise="smooth", length=8.0),
        F("white_m64", "training_noise", "white common noise, sd 0.02, M = 64", noise="white", num_seeds=64),
        F("white_grow2.5_m4096", "training_noise", "white common noise, sd growing 2.5× to 0.01, M = 4096",
          noise="white", noise_sd=0.01, growth=2.5, num_seeds=4096),
        # discrete ratios
        F("ratio_few_values", "ratio", "ratio of 60 samples at rate 0.03, persistence 0.97 (few distinct values)",
          num_samples=60, ratio_base=0.03, ratio_persistence=0.97, noise="ar1", ratio_noise_sd=0.05),
        F("ratio_few_values_low", "ratio", "ratio of 200 samples at rate 0.01 + AR(1) probit noise sd 0.15",
          num_samples=200, ratio_base=0.01, noise="ar1", ratio_noise_sd=0.15),
        F("ratio_overdispersed", "ratio", "over-dispersed ratio: white probit noise sd 0.25, heterogeneous samples",
          ratio_noise="white", ratio_noise_sd=0.25, ratio_heterogeneity=0.5, ratio_base=0.04),
        F("ratio_overdispersed_grow", "ratio",
          "over-dispersed ratio: AR(1) probit noise growing 2.5× to sd 0.15, heterogeneous samples",
          noise="ar1", ratio_noise_sd=0.15, growth=2.5, ratio_heterogeneity=0.5, ratio_base=0.04),
        F("ratio_jumps", "ratio", "common jumps of the ratio's rate (probit sd 0.2, every ~50 evaluations)",
          ratio_noise="jumps", length=50.0, ratio_noise_sd=0.2, ratio_base=0.03),
        F("ratio_jumps_fast", "ratio", "common jumps of the ratio's rate (probit sd 0.15, every ~15 evaluations)",
          ratio_noise="jumps", length=15.0, ratio_noise_sd=0.15, ratio_base=0.03),
        # jackknife ICR
        F("icr_flat_ar1", "icr", "flat ICR + AR(1) training noise sd 0.003", noise="ar1"),
        F("icr_flat_fgn", "icr", "flat ICR + fGn H 0.75 training noise sd 0.003", noise="fgn", hurst=0.75),
        F("icr_heavy_groups", "icr", "flat ICR, heavy-tailed (t₃) group deviations", icr_heavy=True,
          icr_group_sd=0.03),
        F("icr_heavy_groups_walk", "icr", "slowly falling ICR, heavy-tailed groups + random-walk noise",
          icr_heavy=True, icr_trend="falling", noise="walk", icr_noise_sd=0.004),
        # short runs
        F("short_t20_ar1", "short", "20 evaluations, AR(1) φ 0.7 noise sd 0.02", n_eval=20, noise="ar1", phi=0.7),
        F("short_t40_ar1", "short", "40 evaluations, AR(1) φ 0.7 noise sd 0.02", n_eval=40, noise="ar1", phi=0.7),
        F("short_t30_flip", "short", "30 evaluations, seed flips only, M = 256", n_eval=30),
        F("short_t25_heavy_white", "short", "25 evaluations, heavy-tailed d², white noise sd 0.02, M = 1024",
          n_eval=25, seed_noise="heavy", noise="white", num_seeds=1024),
        # E_gen / E_mem only (no memorization ratio, no ICR)
        F("e_only_m256", "e_only", "E_gen and E_mem only (falling E_mem, no ratio), M = 256", curves="e_only"),
        F("e_only_ar1_m2048", "e_only", "E_gen and E_mem only + AR(1) noise sd 0.02, M = 2048",
          curves="e_only", noise="ar1", num_seeds=2048),
        # bad batches and heavy tails (issue 41): one-epoch spikes shared by every curve, an EMA
        # of a spiky metric, Student-t training noise
        F("spike_m256", "tails", "AR(1) sd 0.02 + one-epoch spikes (rate 0.01, mean 8 % of E), M = 256",
          noise="ar1", spike_rate=0.01, spike_size=0.08),
        F("spike_big_m2048", "tails", "AR(1) sd 0.02 + one-epoch spikes (rate 0.01, mean 18 % of E), M = 2048",
          noise="ar1", spike_rate=0.01, spike_size=0.18, num_seeds=2048),
        F("spike_white_m1024", "tails", "white sd 0.02 + one-epoch spikes (rate 0.02, mean 10 % of E), M = 1024",
          noise="white", spike_rate=0.02, spike_size=0.1, num_seeds=1024),
        F("ema_spike_m2048", "tails", "AR(1) sd 0.02 + spikes (rate 0.01, mean 15 %) through an EMA (0.7), M = 2048",
          noise="ar1", spike_rate=0.01, spike_size=0.15, spike_ema=0.7, num_seeds=2048),
        F("ema_spike_m256", "tails", "AR(1) sd 0.02 + spikes (rate 0.01, mean 18 %) through an EMA (0.5), M = 256",
          noise="ar1", spike_rate=0.01, spike_size=0.18, spike_ema=0.5),
        F("heavy_t_m256", "tails", "AR(1) φ 0.9 sd 0.02, Student-t (ν 2.5) innovations, M = 256",
          noise="ar1", innovations="student_t", nu=2.5),
        F("heavy_t_m1024", "tails", "AR(1) φ 0.9 sd 0.03, Student-t (ν 2.5) innovations, M = 1024",
          noise="ar1", innovations="student_t", nu=2.5, noise_sd=0.03, num_seeds=1024),
        F("heavy_t_spikes_m256", "tails", "Student-t (ν 2.5) AR(1) sd 0.02 + shared spikes (rate 0.005, mean 10 %), M = 256",
          noise="ar1", innovations="student_t", nu=2.5, spike_rate=0.005, spike_size=0.1),
        F("heavy_t_spikes_m1024", "tails",
          "Student-t (ν 3) AR(1) sd 0.02 + shared spikes (rate 0.01, mean 12 %), M = 1024",
          noise="ar1", innovations="student_t", nu=3.0, spike_rate=0.01, spike_size=0.12, num_seeds=1024),
        # learning-rate schedules: the training noise follows the rate (issue 41)
        F("cosine_m2048", "schedule", "AR(1) φ 0.9, sd 0.04 falling 7× under a cosine schedule, M = 2048",
          noise="ar1", noise_sd=0.04, schedule="cosine", anneal=7.0, num_seeds=2048),
        F("cosine_m256", "schedule", "AR(1) φ 0.9, sd 0.04 falling 7× under a cosine schedule, M = 256",
          noise="ar1", noise_sd=0.04, schedule="cosine", anneal=7.0),
        F("cosine_white_m1024", "schedule", "white, sd 0.03 falling 10× under a cosine schedule, M = 1024",
          noise="white", noise_sd=0.03, schedule="cosine", anneal=10.0, num_seeds=1024),
        F("restart_m256", "schedule", "AR(1) φ 0.9, sd 0.04, cosine with 3 warm restarts (7× per cycle), M = 256",
          noise="ar1", noise_sd=0.04, schedule="restart", restarts=3),
        F("restart_m1024", "schedule", "AR(1) φ 0.9, sd 0.04, cosine with 2 warm restarts (7× per cycle), M = 1024",
          noise="ar1", noise_sd=0.04, schedule="restart", restarts=2, num_seeds=1024),
        # long runs (issue 39's 1000-epoch study): the extent rule stops growing at 20 evaluations,
        # so bad batches and slow noise on long runs are nulls of their own
        F("long_t1000_ema_spike_m256", "long", "1000 evaluations, AR(1) sd 0.02 + spikes (rate 0.01, mean 15 %) "
          "through an EMA (0.7), M = 256", n_eval=1000, noise="ar1", spike_rate=0.01, spike_size=0.15,
          spike_ema=0.7),
        F("long_t1000_ar1_m2048", "long", "1000 evaluations, AR(1) φ 0.9 sd 0.02, M = 2048", n_eval=1000,
          noise="ar1", num_seeds=2048),
        F("long_t1000_spike_m1024", "long", "1000 evaluations, AR(1) sd 0.02 + one-epoch spikes (rate 0.01, "
          "mean 18 %), M = 1024", n_eval=1000, noise="ar1", spike_rate=0.01, spike_size=0.18, num_seeds=1024),
        F("long_t2000_fgn_m256", "long", "2000 evaluations, fractional Gaussian noise H 0.8, sd 0.02, M = 256",
          n_eval=2000, noise="fgn", hurst=0.8),
    ]


#: every null family by name (docs/events.md, "Null families")
FAMILIES: Dict[str, Family] = {f.name: f for f in _families()}
#: the families the detectors may be tuned on (a fixed list: about half of every structure type)
TUNE = ("seed_flip_m256", "heavy_d2_m256", "seed_drift_m2048", "hetero_seeds_m256",
        "ar1_m256", "ar1_m4096", "ar1_grow2.5_m256", "ar1_grow10_m2048", "ar1_shrink_m1024",
        "fgn_h0.7_m256", "fbm_h0.65_m2048", "walk_m256", "smooth_l20_m2048", "white_m64",
        "ratio_few_values", "ratio_overdispersed", "ratio_jumps",
        "icr_flat_ar1", "icr_heavy_groups",
        "short_t20_ar1", "short_t30_flip",
        "e_only_m256",
        "spike_m256", "ema_spike_m2048", "heavy_t_m256", "heavy_t_spikes_m256",
        "cosine_m2048", "restart_m256",
        "long_t1000_ema_spike_m256")
#: the families reported on and never tuned on
HELD_OUT = tuple(name for name in FAMILIES if name not in TUNE)
#: families for the power of planted events (height h on their noise)
POWER_FAMILIES = ("seed_flip_m2048", "ar1_grow2.5_m2048", "heavy_d2_m1024", "fgn_h0.8_m1024")
#: held-out families of the new kinds (issue 41) for the power of planted events
POWER_FAMILIES_TAILS = ("cosine_m256", "heavy_t_spikes_m1024", "spike_big_m2048", "restart_m1024")


def split(which: Literal["tune", "held_out", "all"]) -> tuple:
    """The family names of a side of the split: ``"tune"`` (:data:`TUNE`), ``"held_out"``
    (:data:`HELD_OUT`) or ``"all"``."""
    check_args(split, locals())
    return {"tune": TUNE, "held_out": HELD_OUT, "all": tuple(FAMILIES)}[which]


# ----------------------------------------------------------------------------- the harness
def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple:
    """Wilson score interval of a proportion k/n (Wilson 1927, "Probable inference, the law of
    succession, and statistical inference", JASA 22(158)): centre (k + z²/2)/(n + z²),
    half-width z·sqrt(k(n−k)/n + z²/4)/(n + z²), z the two-sided normal quantile; no continuity
    correction (the same as ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``).
    ``(nan, nan)`` for n = 0."""
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n:
        raise ValueError(f"k and n must be integers with 0 <= k <= n, got k={k!r}, n={n!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if n == 0:
        return (math.nan, math.nan)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    centre = (k + z * z / 2.0) / (n + z * z)
    half = z * math.sqrt(k * (n - k) / n + z * z / 4.0) / (n + z * z)
    return (max(0.0, centre - half), min(1.0, centre + half))


def event_status(ev) -> str:
    """``"confirmed"`` or ``"undecided"`` (an event without a ``status`` is confirmed)."""
    return str(getattr(ev, "status", "confirmed"))


def _run_seed(seed0: int, name: str, r: int) -> int:
    """The seed of run ``r`` of family ``name``: independent of the other families and runs."""
    import zlib

    return int(np.random.SeedSequence([int(seed0), zlib.crc32(name.encode()), int(r)]).generate_state(1)[0])


def _one_run(family: Family, r: int, detector: Callable, event, height: float, seed0: int,
             kwargs: dict) -> dict:
    import time

    series, units = simulate_run(family, _run_seed(seed0, family.name, r), event, height)
    t0 = time.perf_counter()
    analysis = detector(series, units=units, **kwargs)
    dt = time.perf_counter() - t0
    events = getattr(analysis, "events", analysis) or []
    return {"events": [(e.name, event_status(e), float(e.significance)) for e in events], "seconds": dt}


def _chunk(args) -> list:
    family, rs, detector, event, height, seed0, kwargs = args
    return [_one_run(family, r, detector, event, height, seed0, kwargs) for r in rs]


def _summary(family: Family, records: list, event, height: float) -> dict:
    n = len(records)
    names = sorted({name for rec in records for name, _, _ in rec["events"]})
    per = {}
    for name in names:
        conf = [rec for rec in records if any(e[0] == name and e[1] == "confirmed" for e in rec["events"])]
        und = [rec for rec in records if any(e[0] == name and e[1] != "confirmed" for e in rec["events"])]
        z = [e[2] for rec in records for e in rec["events"] if e[0] == name and e[1] == "confirmed"]
        per[name] = {"confirmed": len(conf), "rate": len(conf) / n, "ci95": list(wilson_interval(len(conf), n)),
                     "undecided": len(und),
                     "median_significance": float(np.median(z)) if z else math.nan}
    any_conf = sum(any(e[1] == "confirmed" for e in rec["events"]) for rec in records)
    any_und = sum(any(e[1] != "confirmed" for e in rec["events"]) for rec in records)
    z_all = [e[2] for rec in records for e in rec["events"] if e[1] == "confirmed"]
    secs = [rec["seconds"] for rec in records]
    out = {"family": family.name, "structure": family.structure, "description": family.description,
           "n_eval": family.n_eval, "num_seeds": family.num_seeds, "runs": n,
           "any_confirmed": any_conf, "rate": any_conf / n if n else math.nan,
           "ci95": list(wilson_interval(any_conf, n)), "any_undecided": any_und,
           "events": per, "median_significance": float(np.median(z_all)) if z_all else math.nan,
           "nonfinite_significance": int(sum(not math.isfinite(e[2]) for rec in records
                                             for e in rec["events"])),
           "detector_seconds_per_run": float(np.mean(secs)) if secs else math.nan}
    if event is not None:
        planted = _planted(event)
        found = {p: sum(any(e[0] == p and e[1] == "confirmed" for e in rec["events"]) for rec in records)
                 for p in planted}
        out["planted"] = {p: {"height": float(height), "found": k, "power": k / n,
                              "ci95": list(wilson_interval(k, n))} for p, k in found.items()}
    return out


def calibrate_families(families, runs, detector: Callable = None, *, event=None, height: float = 0.0,
                       seed0: int = 0, jobs: PositiveInt = 1, progress: Optional[Callable] = None,
                       **kwargs) -> Dict[str, dict]:
    """Run ``detector(series, units=units, **kwargs)`` (default
    :func:`~lightning_pfd.analysis.events.analyze_history`) on ``runs`` synthetic runs of each of
    ``families`` (names of :data:`FAMILIES` or :class:`Family` objects; ``runs``: an int or
    {name: int}) and count, per family:

    - ``any_confirmed``: runs with at least one *confirmed* event (an event counts as confirmed
      when ``getattr(ev, "status", "confirmed") == "confirmed"``), its ``rate`` and Wilson 95 %
      interval ``ci95`` (:func:`wilson_interval`); ``any_undecided``: runs with an undecided event
      (not a false event, reported beside it);
    - ``events``: per event name, the runs with that event confirmed (rate, ci95), undecided, and
      the median significance of the confirmed ones;
    - ``median_significance``, ``nonfinite_significance`` (events whose z is not finite),
      ``detector_seconds_per_run`` (the detector's time, without the simulation);
    - with ``event`` (planted, :func:`simulate_run`): ``planted`` = {name: found, power, ci95},
      found = runs where that event is confirmed.

    Run r of family f uses seed :func:`_run_seed` (seed0, f, r): results do not depend on
    ``jobs`` (worker processes; the detector must be picklable, a module-level function) nor
    on which other families are run. ``progress(name, summary)`` is called after each family."""
    if detector is None:
        from lightning_pfd.analysis.events import analyze_history as detector
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    fams = [FAMILIES[f] if isinstance(f, str) and f in FAMILIES else f for f in families]
    for f in fams:
        if not isinstance(f, Family):
            raise ValueError(f"families: unknown family {f!r}; known: {sorted(FAMILIES)}")
    n_of = (lambda f: int(runs[f.name])) if isinstance(runs, dict) else (lambda f: int(runs))
    for f in fams:
        if n_of(f) < 1:
            raise ValueError(f"runs must be >= 1 (family {f.name!r}: {n_of(f)})")
    _planted(event)
    out: Dict[str, dict] = {}
    pool = None
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(jobs)
    try:
        for f in fams:
            import time

            t0 = time.perf_counter()
            rs = list(range(n_of(f)))
            if pool is None:
                records = _chunk((f, rs, detector, event, height, seed0, kwargs))
            else:
                parts = [rs[i::jobs * 4] for i in range(jobs * 4) if rs[i::jobs * 4]]
                records = [rec for chunk in pool.map(_chunk, [(f, p, detector, event, height, seed0, kwargs)
                                                              for p in parts]) for rec in chunk]
            out[f.name] = dict(_summary(f, records, event, height), wall_s=time.perf_counter() - t0)
            if progress is not None:
                progress(f.name, out[f.name])
    finally:
        if pool is not None:
            pool.shutdown()
    return out


# ----------------------------------------------------------------------------- on disk
def write_run(run_dir, series: Dict[str, tuple], units: Optional[Dict[str, UnitSeries]] = None, *,
              float32: bool = True, steps_per_epoch: PositiveInt = 10) -> Dict[str, tuple]:
    """Write a run in the project's on-disk format, so that ``python -m lightning_pfd report
    RUN_DIR`` reads it: ``RUN_DIR/lightning_logs/version_0/metrics.csv`` as Lightning's
    CSVLogger writes it (columns sorted, one training-step row and one epoch row per epoch,
    empty cells for metrics not logged in a row; values as float32 tensors' ``item()`` when
    ``float32``) and ``RUN_DIR/per_unit/<metric>/epoch_XXXXXX.npz`` records as the monitors write
    them (:class:`~lightning_pfd.analysis.per_unit.PerUnitStore`). Epochs must be integers.
    Returns the series as written (float32-rounded values), the input the report analyses."""
    import csv
    from pathlib import Path

    from lightning_pfd.analysis.per_unit import PerUnitStore, UnitRecord

    run = Path(run_dir)
    by_epoch: Dict[int, dict] = {}
    written = {}
    for key, (x, y) in series.items():
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1:
            raise ValueError(f"series[{key!r}]: epochs and values must be 1-D of one length")
        if not np.all(x == np.round(x)):
            raise ValueError(f"series[{key!r}]: epochs must be integers (one row per epoch)")
        yw = y.astype(np.float32).astype(np.float64) if float32 else y.copy()
        written[key] = (x.copy(), yw)
        for e, v in zip(x.astype(int), yw):
            by_epoch.setdefault(int(e), {})[key] = float(v)
    d = run / "lightning_logs" / "version_0"
    d.mkdir(parents=True, exist_ok=True)
    cols = sorted({"epoch", "step", "train/loss", *series})
    with open(d / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for e in sorted(by_epoch):
            step = (e + 1) * int(steps_per_epoch) - 1
            w.writerow({"epoch": e, "step": step - 1, "train/loss": 0.5})
            w.writerow({"epoch": e, "step": step, **by_epoch[e]})
    store = PerUnitStore(run / "per_unit")
    for key, u in (units or {}).items():
        values = np.asarray(u.values, dtype=np.float64)
        logged = np.asarray(u.logged, dtype=np.float64)
        for i, e in enumerate(np.asarray(u.epochs)):
            value = float(logged[i]) if logged.size == values.shape[0] else math.nan
            store.write(UnitRecord(u.key, int(e), (int(e) + 1) * int(steps_per_epoch) - 1, u.kind,
                                   values[i], u.units, value))
    return written
