"""Lévy–Itō model math (Yoon et al. 2023, "Score-based Generative Models with Lévy Processes"; derivations in docs/levy.md), pure torch.

Conventions
-----------
* alpha-stable noise uses the standard stable convention E exp(i u·eps) = exp(-|u|^alpha)
  per coordinate (scale 1, scipy's ``levy_stable(alpha, 0)``). At alpha = 2 this is
  N(0, 2) -- *not* N(0, 1) -- exactly as scipy's alpha = 2 and as the Lévy process
  L^2_t = sqrt(2) B_t. Everything below is consistent with it: at alpha = 2 the fractional
  score is the ordinary score of the N(0, 2)-noise VP process (tested).
* Isotropic noise is sub-Gaussian: eps = sqrt(A) G, G ~ N(0, I_d), one A per example,
  A = c_alpha A', c_alpha = 2 cos(pi alpha/4)^(2/alpha), A' ~ S_{alpha/2}(1, beta=1, 0) in
  the S1 parameterization (Samorodnitsky & Taqqu 1994, Prop. 1.3.1). A' is drawn by
  Chambers–Mallows–Stuck (Weron 1996 form) in float64 with V strictly inside (-pi/2, pi/2).
  For beta = 1 and alpha/2 < 1 the CMS constants simplify: B = pi/2 and
  c_alpha * S = 2 exactly, so A = 2 sin(a'(V+pi/2))/cos(V)^(1/a') (cos(V - a'(V+pi/2))/W)^((1-a')/a')
  with a' = alpha/2; this is finite for every alpha in (1, 2] and equals 2 at alpha = 2.
* Schedule (VP-cosine, s = 0.008): gamma(t) = cos(pi/2 (t+s)/(1+s)) / cos(pi/2 s/(1+s)),
  sigma(t) = (1 - gamma^alpha)^(1/alpha), beta(t) = -alpha d ln gamma/dt. Forward:
  x_t = gamma(t) x_0 + sigma(t) eps.
* Fractional DSM: the network s_theta regresses -eps/alpha; the fractional score is
  S_theta = sigma(t)^(1-alpha) s_theta (LIM eq. for the denoising score matching target).
* Reverse steps from s to t < s, a = gamma(t)/gamma(s), h = beta(s)(s - t):
  ODE x <- a x + alpha (a - 1) S (exponential integrator of dx/dt = -beta/alpha x - beta S);
  SDE x <- a x + 2 h S + h^(1/alpha) eps'. The drift 2 h S keeps the marginal scale
  (sigma_t^alpha = sigma_s^alpha - h gamma_s^alpha to first order); the reference code's
  alpha h S inflates it for alpha < 2 (docs/levy.md, "Samplers"; tested). The last step is noiseless
  (an ODE step).
* Noise-to-signal coordinates (docs/levy.md, "Samplers"): with r = sigma/gamma and
  y = x/gamma the probability-flow ODE is exactly dy/dr = eps_hat(x, t), where
  eps_hat = -alpha sigma^(alpha-1) S = (x - gamma D)/sigma is the predicted noise and D the
  predicted clean sample -- the EDM ODE dx/dsigma = (x - D)/sigma in (r, y). "ddim" is Euler in
  r (exact for a point mass on any grid), "heun" the second-order Heun step in r (EDM Alg. 1
  without churn); the "edm" time grid is EDM's rho-grid in r (dense near r -> 0 and spread
  over log r near T).
"""
from __future__ import annotations

import math
from typing import Callable, Literal, Sequence, get_args

import torch

from ..errors import ConfigError, check_choice
from ..validation import PositiveFloat, check_args
from .streams import stream as _stream
from .noise import seeded_noise, seeded_uniform

__all__ = [
    "sample_alpha_stable", "sample_positive_stable", "check_truncation", "sample_subgaussian_factor",
    "MAX_REJECTION_ROUNDS", "subgaussian_constant", "check_alpha", "lim_reference_scale",
    "factor_scale", "A_SCALES", "AScale",
    "CosineSchedule", "fractional_dsm_loss", "denoiser_dsm_loss", "levy_time_grid",
    "levy_ode_step", "levy_ddim_step", "levy_sde_step", "levy_sample", "score_to_eps",
    "denoiser_to_score", "LEVY_SAMPLERS", "LEVY_TIME_GRIDS", "PARAMETERIZATIONS",
]

#: reverse samplers: "ode" (the first-order exponential integrator in t),
#: "ddim" (Euler in r = sigma/gamma), "heun" (second order in r), "sde"
LevySamplerName = Literal["ode", "ddim", "heun", "sde"]
LEVY_SAMPLERS = get_args(LevySamplerName)
#: time grids: "uniform" in t, "edm" = EDM's rho-grid in r = sigma/gamma
LevyTimeGrid = Literal["uniform", "edm"]
LEVY_TIME_GRIDS = get_args(LevyTimeGrid)
#: network output: "eps" (regresses -eps/alpha, LIM) or "x0" (EDM-preconditioned denoiser)
#: "x0_A" = x0 with EDM preconditioning at the per-example level r sqrt(A) (docs/levy.md)
Parameterization = Literal["eps", "x0", "x0_A"]
PARAMETERIZATIONS = get_args(Parameterization)
#: per-example penalties of the regression: "squared" (LIM), "huber" (smooth L1), "l2" (DLPM)
LevyLoss = Literal["squared", "huber", "l2"]
#: scale of the sub-Gaussian factor A: "standard" (A = c_alpha A', unit stable scale) or
#: "lim_reference" (A scaled by kappa(alpha), as the LIM reference code's sampler draws it)
AScale = Literal["standard", "lim_reference"]
A_SCALES = get_args(AScale)

_EPS_V = 1e-12  # keeps V strictly inside (-pi/2, pi/2)


def check_alpha(alpha) -> float:
    """Validate the stability index: alpha must lie in (1, 2]."""
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha: must be a number in (1, 2], got {alpha!r}") from None
    if not (1.0 < a <= 2.0) or math.isnan(a):
        raise ValueError(f"alpha: must lie in (1, 2], got {alpha!r}")
    return a


def subgaussian_constant(alpha: float) -> float:
    """c_alpha = 2 cos(pi alpha / 4)^(2/alpha) (Samorodnitsky & Taqqu 1994, Prop. 1.3.1); 0 at alpha = 2 (limit)."""
    a = check_alpha(alpha)
    if a == 2.0:
        return 0.0
    return 2.0 * max(math.cos(math.pi * a / 4.0), 0.0) ** (2.0 / a)


def lim_reference_scale(alpha: float) -> float:
    """kappa(alpha) = ((1 + tan(pi alpha/4)) cos^2(pi alpha/4))^(1/alpha): the factor by which the
    Lévy–Itō model's reference sampler scales A (docs/levy.md, "The reference's scale of A").

    Chambers–Mallows–Stuck in Weron's form (Weron 1996, "On the Chambers-Mallows-Stuck method
    for simulating skewed stable random variables") has the constant
    S = (1 + beta^2 tan^2(pi a'/2))^(1/(2a')); with tan instead of tan^2 (and beta = 1,
    a' = alpha/2) the ratio of the two constants is kappa. 0.85 / 0.63 / 0.474 / 0.38 at
    alpha = 1.2 / 1.5 / 1.7 / 1.8; kappa -> 0 as alpha -> 2, where the reference returns
    sqrt(2) G (so kappa(2) = 1 here, as there)."""
    a = check_alpha(alpha)
    if a == 2.0:
        return 1.0
    x = math.pi * a / 4.0
    return ((1.0 + math.tan(x)) * math.cos(x) ** 2) ** (1.0 / a)


def factor_scale(alpha: float, a_scale: str = "standard") -> float:
    """The multiplier of the standard factor A for ``a_scale``: 1 ("standard") or
    ``lim_reference_scale(alpha)`` ("lim_reference"); the noise's stable scale is its root."""
    check_choice("a_scale", a_scale, A_SCALES)
    return 1.0 if a_scale == "standard" else lim_reference_scale(alpha)


def _cms_A(alpha: float, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A = c_alpha A' from uniforms u in (0,1) and exponentials w (CMS, beta = 1, a' = alpha/2).

    Uses B = pi/2 and c_alpha S = 2 (see module docstring), stable at alpha -> 2.
    """
    ap = alpha / 2.0
    v = (u - 0.5) * math.pi
    v = v.clamp(-math.pi / 2 + _EPS_V, math.pi / 2 - _EPS_V)
    vb = ap * (v + math.pi / 2)
    out = 2.0 * torch.sin(vb) / torch.cos(v).pow(1.0 / ap)
    if ap < 1.0:
        out = out * (torch.cos(v - vb) / w).pow((1.0 - ap) / ap)
    return out


def _draw_uw(n_rows: int, numel: int, generator, device, seeds, stream: int):
    """Uniforms (V) and Exp(1) (W) of shape (n_rows, numel), float64."""
    if seeds is None:
        u = torch.rand(n_rows, numel, generator=generator, dtype=torch.float64, device=device)
        u = u.clamp_min(2.0**-60)
        e = torch.rand(n_rows, numel, generator=generator, dtype=torch.float64, device=device)
        w = -torch.log1p(-e.clamp_max(1 - 2.0**-53))
    else:
        uu = seeded_uniform(seeds, 2 * numel, device=device, stream=stream)
        u, w = uu[:, :numel], -torch.log(uu[:, numel:])
    return u, w


#: the most redraws of one factor A before ``sample_alpha_stable(reject_A=c)`` gives up
MAX_REJECTION_ROUNDS = 1000


def check_truncation(alpha: float, clamp_A=None, reject_A=None, prefix: str = "") -> None:
    """ValueError for a bad truncation of A: a threshold <= 0 (or not a number), both a clamp and
    a rejection, or ``reject_A`` <= 2 at alpha = 2 (A = 2 always: every draw would be rejected)."""
    for name, v in (("clamp_A", clamp_A), ("reject_A", reject_A)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise ValueError(f"{prefix}{name}: must be a finite number > 0 or None (off), got {v!r}")
    if clamp_A is not None and reject_A is not None:
        raise ValueError(f"{prefix}clamp_A, {prefix}reject_A: give at most one truncation of A "
                         f"(clamp = point mass at the threshold, reject = redraw above it), "
                         f"got clamp_A={clamp_A} and reject_A={reject_A}")
    if reject_A is not None and alpha == 2.0 and not reject_A > 2.0:
        raise ValueError(f"{prefix}reject_A: at alpha = 2 the factor is A = 2, so reject_A must "
                         f"be > 2 (or None), got {reject_A}")


def _seeded_uniform_at(seeds, start: int, numel: int, device, stream: int) -> torch.Tensor:
    """Elements [start, start + numel) of ``seeded_uniform(seeds, start + numel, stream=stream)``
    without computing the first ``start`` (the same counter-based formula, offset index)."""
    from .noise import _GOLDEN, _STREAM, _as_seed_tensor, _lshr, splitmix64

    s = _as_seed_tensor(seeds, device)
    idx = torch.arange(int(start), int(start) + int(numel), dtype=torch.int64, device=s.device)
    key = splitmix64(s * _STREAM + stream)
    bits = splitmix64(key[:, None] + idx[None, :] * _GOLDEN)
    return (_lshr(bits, 11).to(torch.float64) + 0.5) * (1.0 / 9007199254740992.0)


def _redraw_above(alpha: float, A: torch.Tensor, c: float, generator, seeds,
                  stream: int) -> torch.Tensor:
    """Redraw every entry A >= c until A < c (``sample_alpha_stable(reject_A=c)``).

    Only the rows with a rejected entry are recomputed in each round (vectorised). With
    ``seeds``, round k uses the uniforms [2 k n, 2 (k+1) n) of the row's seed (n = A.shape[1]):
    the result of a row depends on its seed only."""
    A = A.clone()
    n = A.shape[1]
    seed_t = None if seeds is None else torch.as_tensor(seeds, dtype=torch.int64).reshape(-1)
    for k in range(1, MAX_REJECTION_ROUNDS + 1):
        bad = A >= c
        if not bool(bad.any()):
            return A
        if seed_t is None:
            m = int(bad.sum())
            u, w = _draw_uw(1, m, generator, A.device, None, 0)
            A[bad] = _cms_A(alpha, u, w)[0]
        else:
            rows = bad.any(1).nonzero().reshape(-1)
            uu = _seeded_uniform_at(seed_t[rows.cpu()], 2 * n * k, 2 * n, A.device, stream)
            fresh = _cms_A(alpha, uu[:, :n], -torch.log(uu[:, n:]))
            sub = A[rows]
            A[rows] = torch.where(bad[rows], fresh, sub)
    raise ValueError(f"reject_A: {c} accepts too rarely at alpha = {alpha}: some factors A were "
                     f"still >= {c} after {MAX_REJECTION_ROUNDS} redraws (P(A < c) is tiny; use "
                     f"a larger threshold)")


def sample_positive_stable(alpha: float, n: int, generator: torch.Generator | None = None,
                           device=None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A' ~ S_{alpha/2}(scale 1, beta = 1, 0) in the S1 parameterization, shape (n,).

    Chambers–Mallows–Stuck in float64. Defined for alpha in (1, 2) (at alpha = 2 the
    factor c_alpha vanishes and A = c_alpha A' -> 2, see ``sample_alpha_stable``).
    """
    a = check_alpha(alpha)
    if a >= 2.0:
        raise ValueError("alpha: sample_positive_stable needs alpha in (1, 2); at alpha = 2 "
                         "the sub-Gaussian factor is the constant A = 2")
    u, w = _draw_uw(1, int(n), generator, device, None, 0)
    return (_cms_A(a, u, w)[0] / subgaussian_constant(a)).to(dtype)


def sample_subgaussian_factor(alpha: float, rows: int, per_row: int = 1,
                              generator: torch.Generator | None = None, device=None, seeds=None,
                              stream: int = 0, clamp_A: float | None = None,
                              reject_A: float | None = None,
                              a_scale: AScale = "standard") -> torch.Tensor:
    """The factor A = c_alpha A' of ``sample_alpha_stable`` (float64, shape (rows, per_row)),
    truncated by ``clamp_A`` / ``reject_A`` as documented there; with
    ``a_scale="lim_reference"`` the factor is kappa(alpha) A (``lim_reference_scale``) and the
    thresholds apply to that scaled factor, as in the reference code.

    With ``seeds`` (``rows`` = len(seeds)) it uses the seeded stream 2 ``stream``, so
    ``sample_alpha_stable(..., seeds=seeds, stream=k)`` has exactly
    ``sample_subgaussian_factor(alpha, len(seeds), per_row, seeds=seeds, stream=k)`` as its A;
    without, ``generator`` (drawn before nothing else: ``sample_alpha_stable`` draws G first).
    At alpha = 2, A = 2."""
    a = check_alpha(alpha)
    check_truncation(a, clamp_A, reject_A)
    kappa = factor_scale(a, a_scale)
    if a == 2.0:
        A = torch.full((int(rows), int(per_row)), 2.0, dtype=torch.float64, device=device)
    else:
        u, w = _draw_uw(int(rows), int(per_row), generator, device, seeds, 2 * stream)
        A = _cms_A(a, u, w)
        if reject_A is not None:  # kappa A >= c  <=>  A >= c / kappa
            A = _redraw_above(a, A, float(reject_A) / kappa, generator, seeds, 2 * stream)
        if kappa != 1.0:
            A = A * kappa
    if clamp_A is not None:
        A = A.clamp_max(float(clamp_A))
    return A


def sample_alpha_stable(alpha: float, shape: Sequence[int], isotropic: bool = True,
                        generator: torch.Generator | None = None,
                        dtype: torch.dtype = torch.float64, device=None, seeds=None,
                        stream: int = 0, clamp_A: float | None = None,
                        reject_A: float | None = None, return_factor: bool = False,
                        a_scale: AScale = "standard"):
    """Symmetric alpha-stable noise with scale 1 per coordinate (E e^{iu eps} = e^{-|u|^alpha}).

    ``isotropic=True``: sub-Gaussian construction eps = sqrt(A) G with one A = c_alpha A'
    per example (per index of the first dimension); ``isotropic=False``: one A per
    coordinate (independent 1-D SaS coordinates). alpha = 2 gives N(0, 2) exactly.

    Without ``seeds``: ``shape`` is the full output shape (B, *dims), drawn from ``generator``
    (or the global RNG). With ``seeds`` (a sequence of non-negative ints): ``shape`` is the
    per-example shape and the output has shape (len(seeds), *shape); row i depends only on
    seeds[i] and ``stream`` (counter-based ``seeded_uniform`` / ``seeded_noise``), so samples
    are reproducible whatever the batch, device or world size. ``stream`` k uses the seeded
    streams 2k (uniforms of A) and 2k + 1 (Gaussian factor): avoid them for other draws.

    ``return_factor=True`` returns ``(eps, A)`` with A of shape (rows, 1) (isotropic) or
    (rows, numel), float64.

    Truncation of the heavy-tailed factor A (at most one of the two; the result is then no
    longer exactly alpha-stable; docs/levy.md, "Truncating A"):

    * ``reject_A = c``: every A >= c is *redrawn* until A < c, so A has the law of A
      conditioned on A < c (independent of G). The Lévy–Itō model's reference code rejects in
      the same way (``LevyStable.sample(reject_threshold=20)`` of its vendored sampler, for the
      training noise, the prior and the SDE noise), but on its own, kappa-scaled A: its "A >= 20"
      is ``a_scale="lim_reference"`` with ``reject_A=20`` (A_standard >= 42.2 at alpha = 1.7),
      not the standard A >= 20. With ``seeds`` the redraws are counter-based: draw k
      of row i uses the uniforms with element indices [2 k n, 2 (k+1) n) of (seeds[i], stream 2
      ``stream``) (n = factors per row; k = 0 are the unconditioned draw's own uniforms), so a
      row still depends only on its seed, and equals the unconditioned draw whenever that one
      is accepted. Without ``seeds`` the rejected entries are redrawn from ``generator``.
    * ``clamp_A = c``: A <- min(A, c), a point mass at c (at alpha = 1.7 and c = 20: P(A >= 20)
      = 2.5 %). Not what either reference code does: DLPM clamps A' at 20 *before* the factor
      c_alpha (i.e. A at 20 c_alpha = 7.22 at alpha = 1.7). Kept as a named variant.

    ``a_scale``: "standard" (default, the law above) or "lim_reference": the factor is
    kappa(alpha) A (``lim_reference_scale``: 0.474 at alpha = 1.7), as the Lévy–Itō model's
    reference sampler draws it (its CMS constant has tan where CMS has tan^2), so the noise has
    stable scale sqrt(kappa), and ``reject_A`` / ``clamp_A`` act on the scaled factor (the
    reference's "reject A >= 20" is A_standard >= 20/kappa = 42.2 at alpha = 1.7). Row by row
    this is the standard draw truncated at c/kappa, times sqrt(kappa) (docs/levy.md).
    """
    a = check_alpha(alpha)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape: dimensions must be >= 0, got {shape}")
    check_truncation(a, clamp_A, reject_A)
    if seeds is None:
        if len(shape) == 0:
            raise ValueError("shape: needs at least one dimension (the example axis)")
        rows, per = shape[0], shape[1:]
    else:
        rows, per = len(torch.as_tensor(seeds).reshape(-1)), shape
    numel = math.prod(per)
    # Gaussian factor
    if seeds is None:
        G = torch.randn(rows, numel, generator=generator, dtype=torch.float64, device=device)
    else:
        G = seeded_noise(seeds, (numel,), device=device, stream=2 * stream + 1)
    A = sample_subgaussian_factor(a, rows, 1 if isotropic else numel, generator, G.device, seeds,
                                  stream, clamp_A, reject_A, a_scale)
    eps = A.sqrt() * G
    eps = eps.reshape(rows, *per).to(dtype)
    return (eps, A) if return_factor else eps


class CosineSchedule:
    """VP-cosine schedule of the Lévy–Itō model (Yoon et al. 2023; docs/levy.md), float64 throughout.

    gamma(t) = cos(pi/2 (t+s)/(1+s)) / cos(pi/2 s/(1+s)), sigma(t) = (1 - gamma^alpha)^(1/alpha),
    beta(t) = -alpha d ln gamma/dt = alpha pi / (2 (1+s)) tan(pi/2 (t+s)/(1+s)).
    Training times t ~ U(t_min, T) with T = 0.9946 (beta blows up at 1).
    """

    def __init__(self, alpha: float, s: PositiveFloat = 0.008, T: float = 0.9946, t_min: float = 1e-5):
        self.alpha = check_alpha(alpha)
        check_args(CosineSchedule.__init__, locals())
        if not 0 < t_min < T < 1:
            raise ValueError(f"t_min, T: need 0 < t_min < T < 1, got {t_min}, {T}")
        self.s, self.T, self.t_min = float(s), float(T), float(t_min)

    def _phase(self, t):
        t = torch.as_tensor(t, dtype=torch.float64)
        return 0.5 * math.pi * (t + self.s) / (1 + self.s)

    def gamma(self, t) -> torch.Tensor:
        return torch.cos(self._phase(t)) / math.cos(0.5 * math.pi * self.s / (1 + self.s))

    def sigma(self, t) -> torch.Tensor:
        # 1 - gamma^alpha = -expm1(alpha log gamma): no cancellation near t -> 0
        g = self.gamma(t).clamp_min(0)
        return (-torch.expm1(self.alpha * torch.log(g))).clamp_min(0).pow(1 / self.alpha)

    def nsr(self, t) -> torch.Tensor:
        """Noise-to-signal ratio r(t) = sigma(t)/gamma(t) (the EDM sigma of y = x/gamma)."""
        return self.sigma(t) / self.gamma(t)

    def t_of_nsr(self, r) -> torch.Tensor:
        """Inverse of ``nsr``: gamma = (1 + r^alpha)^(-1/alpha) (from gamma^alpha + sigma^alpha
        = 1), t = 2(1+s)/pi arccos(gamma cos(pi/2 s/(1+s))) - s."""
        r = torch.as_tensor(r, dtype=torch.float64)
        g = torch.exp(-torch.log1p(r.pow(self.alpha)) / self.alpha)
        c0 = math.cos(0.5 * math.pi * self.s / (1 + self.s))
        return torch.acos((g * c0).clamp(-1.0, 1.0)) * 2 * (1 + self.s) / math.pi - self.s

    def time_grid(self, num_steps: int, grid: LevyTimeGrid = "uniform", rho: PositiveFloat = 7.0,
                  t_end: float | None = None, device=None) -> torch.Tensor:
        """Reverse grid T = t_0 > ... > t_N = t_end (default t_min), N + 1 points, float64.

        ``grid="uniform"``: uniform in t. ``grid="edm"``: r_i = (r_max^(1/rho) + i/N
        (r_min^(1/rho) - r_max^(1/rho)))^rho with r = sigma/gamma (EDM eq. 5 in r), mapped back
        to t by ``t_of_nsr``; the end points are exactly T and t_end.
        """
        check_choice("time_grid", grid, LEVY_TIME_GRIDS)
        t_end = self.t_min if t_end is None else float(t_end)
        ts = levy_time_grid(num_steps, self.T, t_end, device=device)
        if grid == "uniform":
            return ts
        check_args(CosineSchedule.time_grid, {"rho": rho})
        n = int(num_steps)
        r_max, r_min = float(self.nsr(self.T)), float(self.nsr(t_end))
        i = torch.arange(n + 1, dtype=torch.float64, device=device)
        r = (r_max ** (1 / rho) + i / n * (r_min ** (1 / rho) - r_max ** (1 / rho))) ** rho
        ts = self.t_of_nsr(r)
        ts[0], ts[-1] = self.T, t_end
        return ts

    def beta(self, t) -> torch.Tensor:
        return self.alpha * math.pi / (2 * (1 + self.s)) * torch.tan(self._phase(t))

    def sample_t(self, n: int, device=None, seeds=None, stream: int | None = None) -> torch.Tensor:
        """t ~ U(t_min, T), float64 (seeded per example when ``seeds`` is given; ``stream``
        defaults to the registered ``levy.loss_t``)."""
        if stream is None:
            stream = _stream("levy.loss_t")
        if seeds is None:
            u = torch.rand(n, dtype=torch.float64, device=device)
        else:
            u = seeded_uniform(seeds, 1, device=device, stream=stream)[:, 0]
        return self.t_min + u * (self.T - self.t_min)


def fractional_dsm_loss(s_pred: torch.Tensor, eps: torch.Tensor, alpha: float,
                        loss: str = "squared", huber_delta: float = 1.0) -> torch.Tensor:
    """Per-example fractional denoising score matching loss (B,), target -eps/alpha.

    ``squared``: ||s + eps/alpha||^2 summed over dimensions (LIM); ``huber``: smooth-L1
    (Huber with ``huber_delta``) summed over dimensions; ``l2``: the non-squared norm
    ||s + eps/alpha|| (DLPM). Computed in float32-or-better of the inputs.
    """
    if loss not in ("squared", "huber", "l2"):
        raise ValueError(f"loss: must be one of 'squared', 'huber', 'l2', got {loss!r}")
    return _penalty(s_pred + eps.to(s_pred.dtype) / alpha, loss, huber_delta)


def _penalty(r: torch.Tensor, loss: str, huber_delta: float) -> torch.Tensor:
    r = r.flatten(1)
    if loss == "squared":
        return r.square().sum(1)
    if loss == "l2":
        return r.square().sum(1).add(1e-12).sqrt()
    ar = r.abs()
    d = float(huber_delta)
    return torch.where(ar < d, 0.5 * r.square(), d * (ar - 0.5 * d)).sum(1)


def denoiser_dsm_loss(D: torch.Tensor, x0: torch.Tensor, c_out: torch.Tensor,
                      loss: str = "squared", huber_delta: float = 1.0) -> torch.Tensor:
    """Per-example loss of the x0 (denoiser) parameterization (B,): penalty of (D - x0)/c_out.

    D = c_skip y + c_out F, so (D - x0)/c_out = F - F* (EDM's effective target, eq. 8). In
    terms of the eps parameterization's residual s + eps/alpha = (D - x0)/(alpha r) this is the
    same regression weighted by (alpha r / c_out)^2 = alpha^2 (1 + r^2/sigma_data^2) per time.
    ``c_out`` has shape (B,) or broadcasts against D.
    """
    if loss not in ("squared", "huber", "l2"):
        raise ConfigError("loss", "unknown value", value=loss, accepted=["squared", "huber", "l2"])
    c = torch.as_tensor(c_out, dtype=torch.float64, device=D.device)
    if c.ndim == 1:
        c = c.reshape(-1, *([1] * (D.ndim - 1)))
    r = (D.to(torch.float64) - x0.to(torch.float64)) / c
    return _penalty(r.to(torch.float32) if D.dtype != torch.float64 else r, loss, huber_delta)


def score_to_eps(S: torch.Tensor, sigma, alpha: float) -> torch.Tensor:
    """Predicted noise from the fractional score: eps_hat = -alpha sigma^(alpha-1) S."""
    return -alpha * torch.as_tensor(sigma, dtype=torch.float64).pow(alpha - 1) * S


def denoiser_to_score(D: torch.Tensor, x: torch.Tensor, gamma, sigma, alpha: float) -> torch.Tensor:
    """Fractional score from a denoiser: S = -(x - gamma D)/(alpha sigma^alpha) (docs/levy.md).

    For the isotropic sub-Gaussian noise the conditional fractional score of x_t | x_0 is
    -(x_t - gamma x_0)/(alpha sigma^alpha) = sigma^(1-alpha)(-eps/alpha); averaging over the
    posterior of x_0 gives this with D = E[x_0 | x_t], the minimiser of the x0 loss."""
    g = torch.as_tensor(gamma, dtype=torch.float64)
    sg = torch.as_tensor(sigma, dtype=torch.float64)
    return -(x.to(torch.float64) - g * D.to(torch.float64)) / (alpha * sg.pow(alpha))


def levy_time_grid(num_steps: int, T: float = 0.9946, t_min: float = 1e-5,
                   device=None) -> torch.Tensor:
    """Uniform reverse time grid T = t_0 > ... > t_N = t_min (N+1 points), float64."""
    if int(num_steps) < 1:
        raise ValueError(f"num_steps: must be >= 1, got {num_steps}")
    return torch.linspace(T, t_min, int(num_steps) + 1, dtype=torch.float64, device=device)


def levy_ode_step(x: torch.Tensor, S: torch.Tensor, a: float, alpha: float) -> torch.Tensor:
    """Probability-flow ODE step: x <- a x + alpha (a - 1) S, a = gamma(t)/gamma(s)."""
    return a * x + alpha * (a - 1) * S


def levy_ddim_step(x: torch.Tensor, eps_hat: torch.Tensor, a: float, sigma_s: float,
                   sigma_t: float) -> torch.Tensor:
    """Euler step in (r, y): y_t = y_s + (r_t - r_s) eps_hat, i.e. x <- a x + (sigma_t - a
    sigma_s) eps_hat (the DDIM step of the LIM flow; exact for a point mass)."""
    return a * x + (sigma_t - a * sigma_s) * eps_hat


def levy_sde_step(x: torch.Tensor, S: torch.Tensor, a: float, h: float, alpha: float,
                  noise: torch.Tensor, drift_factor: float = 2.0) -> torch.Tensor:
    """Reverse SDE step: x <- a x + drift_factor h S + h^(1/alpha) eps'.

    ``drift_factor = 2`` keeps the marginal scale (docs/levy.md, "Samplers"); ``drift_factor = alpha``
    gives the reference code's *drift term* alpha h S (its scale inflation for alpha < 2; kept for
    comparison), not the reference's whole step: the x-coefficient here is the exact
    a = gamma(t)/gamma(s), and beta is not clamped, where the reference's Euler-Maruyama step is
    first order in h (docs/levy.md).
    """
    return a * x + drift_factor * h * S + h ** (1.0 / alpha) * noise


def levy_sample(score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x_T: torch.Tensor,
                schedule: CosineSchedule, num_steps: int = 100, sampler: LevySamplerName = "ode",
                noise_fn: Callable[[int], torch.Tensor] | None = None, t_end: float | None = None,
                drift_factor: float = 2.0, time_grid: str = "uniform",
                rho: float = 7.0) -> torch.Tensor:
    """Integrate the reverse process from T to ``t_end`` (default schedule.t_min), float64.

    ``score(x, t)`` returns the fractional score S(x, t) (t a float64 scalar tensor).
    ``sampler``: "ode" (first-order exponential integrator in t), "ddim" (Euler in
    r = sigma/gamma), "heun" (Heun in r, 2 score evaluations per step), or "sde";
    ``noise_fn(i)`` gives the alpha-stable noise eps' for step i (shape of x), required for
    "sde". The last step of "sde" is noiseless. ``time_grid`` / ``rho``: see
    ``CosineSchedule.time_grid``.
    """
    check_args(levy_sample, {"sampler": sampler})
    if sampler == "sde" and noise_fn is None:
        raise ValueError("noise_fn: required for sampler='sde'")
    ts = schedule.time_grid(num_steps, time_grid, rho, t_end, device=x_T.device)
    gam, sig, beta = schedule.gamma(ts), schedule.sigma(ts), schedule.beta(ts)
    x = x_T.to(torch.float64)
    alpha = schedule.alpha
    for i in range(len(ts) - 1):
        s_t, t_t = ts[i], ts[i + 1]
        a = float(gam[i + 1] / gam[i])
        S = score(x, s_t).to(torch.float64)
        last = i == len(ts) - 2
        if sampler in ("ddim", "heun"):
            ss, st = float(sig[i]), float(sig[i + 1])
            e = score_to_eps(S, ss, alpha)
            x_new = levy_ddim_step(x, e, a, ss, st)
            if sampler == "heun":
                e2 = score_to_eps(score(x_new, t_t).to(torch.float64), st, alpha)
                x_new = levy_ddim_step(x, 0.5 * (e + e2), a, ss, st)
            x = x_new
        elif sampler == "ode" or last:
            x = levy_ode_step(x, S, a, alpha)
        else:
            h = float(beta[i] * (s_t - t_t))
            eps = noise_fn(i).to(device=x.device, dtype=torch.float64)
            x = levy_sde_step(x, S, a, h, alpha, eps, drift_factor)
    return x
