"""Invariant Contamination Ratio (ICR), eq. 3-5 and App. B.6 of *Evaluating the Representation
Space of Diffusion Models via Self-Supervised Principles* (the ICR paper).

Two perturbed views h1 = s + xi1, h2 = s + xi2 of every image give (App. B.6)

    t = (h1 + h2)/2,  delta = h1 - h2,
    Sigma_xi = 1/2 Cov(delta),  Sigma_s = Cov(t) - 1/4 Cov(delta).

The generalized eigenvalues of Sigma_s v = lambda (Sigma_xi + tau I) v (eq. 4) summarise how
strongly the invariant component dominates the residual one along every Fisher direction, and

    ICR = 1 / (1 + (1/d) sum_i lambda_i) = 1 / (1 + Tr((Sigma_xi + tau I)^-1 Sigma_s)/d)   (eq. 5).

Numerics: everything is accumulated as float64 *sums* (sum t, sum delta, sum t t^T, sum delta
delta^T, count), so the metric syncs exactly across processes (dist_reduce_fx="sum"). The
eigenproblem is solved by Cholesky whitening, L L^T = Sigma_xi + tau I, M = L^-1 Sigma_s L^-T
(two triangular solves, never an explicit inverse), lambda = eigvalsh(M).

tau (the ridge of eq. 4, the paper's footnote 2: "we assume Sigma_xi > 0; in practice we can add
a small tau > 0 ... to ensure invertibility"):

- ``tau="auto"`` (default; ``None`` means the same): tau = 0 -- the estimator of eq. 5 as written
  -- unless Sigma_xi is ill-conditioned, i.e. not positive definite or with condition number
  cond(Sigma_xi) = lambda_max / lambda_min > ``cond_max`` (default 1e8); only then the relative
  ridge below is added. The condition number is reported (``cond_xi``) with the ``tau`` used.
- ``tau="relative"`` (the behaviour before "auto"; always on): tau = tau_rel * Tr(Sigma_xi)/d
  with tau_rel = 1e-3, one thousandth of the mean residual eigenvalue. Scaling with
  Tr(Sigma_xi)/d keeps ICR invariant to a global rescaling of the features.
- a number: an absolute tau (0 allowed when Sigma_xi is positive definite).

Both "auto" and "relative" keep ICR exactly invariant to h -> c Q h + b (c != 0, Q orthogonal);
"auto" (when it resolves to 0) and tau = 0 keep it invariant to any invertible linear map.
cond_max = 1e8 **[choice]**: float64 Cholesky whitening loses about log10(cond) of its ~16
digits, so below 1e8 the eigenvalues are accurate to ~1e-8 relative; above it (or for a
rank-deficient estimate, n <= d) the ridge is what makes the problem solvable at all.

Traces (Fig. 8): ``trace_s`` and ``trace_xi`` are Tr(Sigma_s), Tr(Sigma_xi) computed on
l2-normalized features, so that they measure how the representation energy is split rather than
its norm growth; only traces are needed there, so those states are d-vectors and scalars.
Raw-feature traces are reported as ``trace_s_raw`` / ``trace_xi_raw``.

Failures: when Sigma_xi + tau I is not positive definite the error says why -- non-finite
features (NaN/inf covariances; a diverged model), identical views (Sigma_xi = 0), too few view
pairs (only when n <= d, where the estimate must be singular), or a singular Sigma_xi. With
``tau="auto"`` the last two get the relative ridge instead of an error (only an explicit tau = 0,
or a ridge of 0 because Sigma_xi = 0, can still fail there). Callers
that may see non-finite features (``RepresentationEvaluation``) filter and count them before
``update``.

Pure torch; torchmetrics is the only extra dependency (no Lightning import).
"""
from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple, Union

import torch
from torchmetrics import Metric

from .. import keys
from ..errors import ConfigError
from ..validation import FiniteNonNegativeFloat, NonNegativeFloat, PositiveInt, check_args

__all__ = [
    "InvariantContaminationRatio",
    "invariant_contamination_ratio",
    "icr_from_covariances",
    "generalized_eigenvalues",
    "pool_features",
    "not_positive_definite_message",
    "DEFAULT_TAU_REL",
    "DEFAULT_COND_MAX",
    "TAU_MODES",
    "resolve_tau",
    "condition_number",
    "check_tau",
    "ICR_STATES",
]

DEFAULT_TAU_REL = 1e-3
DEFAULT_COND_MAX = 1e8
TAU_MODES = ("auto", "relative")
#: the ridge: "auto" (also None), "relative" or a finite number >= 0
TauSpec = Union[Literal[TAU_MODES], FiniteNonNegativeFloat, None]


def pool_features(h: torch.Tensor) -> torch.Tensor:
    """Mean-pool (B, C, *spatial) to (B, C) (App. C); (B, d) is returned unchanged."""
    if h.ndim < 2:
        raise ValueError(f"features: expected shape (B, d) or (B, C, H, W), got {tuple(h.shape)}")
    return h if h.ndim == 2 else h.flatten(2).mean(-1)


def _check_views(h1: torch.Tensor, h2: torch.Tensor) -> None:
    if not (torch.is_tensor(h1) and torch.is_tensor(h2)):
        raise ValueError("h1, h2: must be tensors")
    if h1.shape != h2.shape:
        raise ValueError(f"h1, h2: the two views must have the same shape, got {tuple(h1.shape)} "
                         f"and {tuple(h2.shape)}")
    if h1.ndim < 2:
        raise ValueError(f"h1, h2: expected shape (B, d) or (B, C, H, W), got {tuple(h1.shape)}")


def check_tau(tau: TauSpec, tau_rel: NonNegativeFloat = DEFAULT_TAU_REL,
              cond_max: float = DEFAULT_COND_MAX) -> TauSpec:
    """Validate (the declared types, and ``cond_max`` >= 1) and normalise the ridge spec:
    "auto" (also None), "relative" or a finite number >= 0 (as a float)."""
    check_args(check_tau, locals())
    if isinstance(cond_max, bool) or not isinstance(cond_max, (int, float)) or not float(cond_max) >= 1:
        raise ConfigError("cond_max", "must be a number >= 1", value=cond_max)
    return "auto" if tau is None else tau if isinstance(tau, str) else float(tau)


def _l2_normalize(h: torch.Tensor) -> torch.Tensor:
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _cov_from_sums(s1: torch.Tensor, s2: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Unbiased covariance (S2 - n m m^T)/(n - 1) from the sum S1 and the scatter sum S2."""
    m = s1 / n
    return (s2 - n * torch.outer(m, m)) / (n - 1)


def _trace_from_sums(s1: torch.Tensor, sq: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Tr(Cov) = (sum ||x||^2 - n ||m||^2)/(n - 1) from the sum and the sum of squared norms."""
    m = s1 / n
    return (sq - n * m.dot(m)) / (n - 1)


def condition_number(sigma_xi: torch.Tensor) -> float:
    """lambda_max / lambda_min of the symmetrized Sigma_xi (inf when lambda_min <= 0 or non-finite)."""
    x = sigma_xi.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    lam = torch.linalg.eigvalsh(0.5 * (x + x.T))
    lo, hi = float(lam[0]), float(lam[-1])
    return hi / lo if lo > 0 and hi > 0 else float("inf")


def relative_tau(sigma_xi: torch.Tensor, tau_rel: float = DEFAULT_TAU_REL) -> float:
    """tau_rel * Tr(Sigma_xi)/d, one ``tau_rel``-th of the mean residual eigenvalue."""
    d = sigma_xi.shape[0]
    return float(tau_rel) * max(float(torch.diagonal(sigma_xi).sum()) / d, 0.0)


def resolve_tau(sigma_xi: torch.Tensor, tau: TauSpec = "auto", tau_rel: float = DEFAULT_TAU_REL,
                cond_max: float = DEFAULT_COND_MAX, cond: Optional[float] = None) -> float:
    """The ridge actually added (module docstring): a number as is; "relative": the relative
    ridge; "auto" / None: 0 unless cond(Sigma_xi) > cond_max (or Sigma_xi is not positive
    definite), then the relative ridge. ``cond``: the condition number, if already known."""
    tau = check_tau(tau, tau_rel, cond_max)
    if not isinstance(tau, str):
        return tau
    if tau == "relative":
        return relative_tau(sigma_xi, tau_rel)
    if (condition_number(sigma_xi) if cond is None else float(cond)) <= float(cond_max):
        return 0.0
    return relative_tau(sigma_xi, tau_rel)


def generalized_eigenvalues(sigma_s: torch.Tensor, sigma_xi: torch.Tensor,
                            tau: TauSpec = "auto",
                            tau_rel: float = DEFAULT_TAU_REL,
                            n: Optional[float] = None,
                            cond_max: float = DEFAULT_COND_MAX) -> torch.Tensor:
    """Eigenvalues of Sigma_s v = lambda (Sigma_xi + tau I) v (eq. 4), descending, float64.

    ``tau``: "auto" (default, also None), "relative" or a number (module docstring).
    Cholesky whitening: L L^T = Sigma_xi + tau I, M = L^-1 Sigma_s L^-T, lambda = eig(M).
    Negative eigenvalues (finite-sample Sigma_s is not PSD) are kept. ``n`` (the number of view
    pairs behind the estimates, if known) only sharpens the error message.
    """
    tau = check_tau(tau, tau_rel, cond_max)
    s = sigma_s.to(torch.float64)
    x = sigma_xi.to(torch.float64)
    d = x.shape[0]
    _require_finite(s, x, None if isinstance(tau, str) else tau, n)
    t = resolve_tau(x, tau, tau_rel, cond_max)
    a = 0.5 * (x + x.T) + t * torch.eye(d, dtype=x.dtype, device=x.device)
    L, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:
        raise ValueError(not_positive_definite_message(s, x, t, n))
    y = torch.linalg.solve_triangular(L, 0.5 * (s + s.T), upper=False)  # L^-1 S
    m = torch.linalg.solve_triangular(L, y.T, upper=False)  # L^-1 (L^-1 S)^T = L^-1 S L^-T
    lam = torch.linalg.eigvalsh(0.5 * (m + m.T))
    return lam.flip(0)


def _require_finite(sigma_s: torch.Tensor, sigma_xi: torch.Tensor, tau: Optional[float],
                    n: Optional[float]) -> None:
    """Raise the non-finite-features message before tau (a trace of NaN) is even resolved."""
    if not (bool(torch.isfinite(sigma_xi).all()) and bool(torch.isfinite(sigma_s).all())):
        raise ValueError(not_positive_definite_message(sigma_s, sigma_xi,
                                                       float("nan") if tau is None else tau, n))


def not_positive_definite_message(sigma_s: torch.Tensor, sigma_xi: torch.Tensor, tau: float,
                                  n: Optional[float] = None) -> str:
    """Why the eigenproblem of eq. 4 cannot be solved, in the order the causes are checked.

    Non-finite covariances (non-finite features) first; then identical views (Sigma_xi = 0, so
    only tau can make it definite); then too few samples -- only when n <= d, where the
    (n - 1)-rank estimate of Sigma_xi must be singular; otherwise a singular Sigma_xi.
    """
    d = sigma_xi.shape[0]
    tau_text = f", tau={tau:g}" if tau == tau else ""  # tau is NaN when it could not be resolved
    head = f"Sigma_xi + tau I is not positive definite (d={d}{tau_text})"
    if not (bool(torch.isfinite(sigma_xi).all()) and bool(torch.isfinite(sigma_s).all())):
        return (f"{head}: the covariances contain NaN/inf because the features are non-finite "
                "(a diverged model, or a net overflowing at this noise level); ICR is undefined "
                "for such features -- check torch.isfinite(features) before update()")
    if float(torch.diagonal(sigma_xi).sum()) <= 0:
        return (f"{head}: Sigma_xi = 0, i.e. the two views of every image are identical (no "
                "augmentation and no noise?); use views that differ, or a tau > 0")
    if n is not None and float(n) <= d:
        return (f"{head}: too few samples -- n={int(n)} view pairs for d={d} feature dimensions, "
                "so the estimated Sigma_xi has rank <= n - 1 < d; use tau='auto' (default) or "
                "'relative', a larger tau, fewer feature dimensions (d_proj) or more view pairs")
    return (f"{head}: Sigma_xi is singular (the residual features do not vary along some "
            f"direction{'' if n is None else f'; n={int(n)} view pairs'}); use tau='auto' "
            "(default) or 'relative', a larger tau, or fewer feature dimensions (d_proj)")


def icr_from_covariances(sigma_s: torch.Tensor, sigma_xi: torch.Tensor,
                         tau: TauSpec = "auto",
                         tau_rel: float = DEFAULT_TAU_REL,
                         cond_max: float = DEFAULT_COND_MAX) -> torch.Tensor:
    """ICR = 1/(1 + mean_i lambda_i) (eq. 5) from population or estimated covariances."""
    lam = generalized_eigenvalues(sigma_s, sigma_xi, tau, tau_rel, cond_max=cond_max)
    return 1.0 / (1.0 + lam.mean())


# ----------------------------------------------------------------------------- update / compute
#: the sufficient statistics of ICR: float64 sums over view pairs (shapes: d-vectors, d x d, scalars)
ICR_STATES = ("n", "sum_t", "sum_delta", "sum_tt", "sum_dd", "sum_t_unit", "sum_delta_unit",
              "sq_t_unit", "sq_delta_unit")


def _icr_zero_states(d: int, device=None) -> Dict[str, torch.Tensor]:
    """The sums of no view pair, for d feature dimensions."""
    z = lambda *shape: torch.zeros(shape, dtype=torch.float64, device=device)  # noqa: E731
    return {"n": z(), "sum_t": z(d), "sum_delta": z(d), "sum_tt": z(d, d), "sum_dd": z(d, d),
            "sum_t_unit": z(d), "sum_delta_unit": z(d), "sq_t_unit": z(), "sq_delta_unit": z()}


def _icr_update(h1: torch.Tensor, h2: torch.Tensor, normalize: bool = False) -> Dict[str, torch.Tensor]:
    """The sums (:data:`ICR_STATES`) of one batch of view pairs, float64.

    With t = (h1 + h2)/2 and delta = h1 - h2 (App. B.6): sum t, sum delta, sum t t^T,
    sum delta delta^T (on l2-normalized features when ``normalize``) and, for the traces of Fig. 8,
    the same first moments and squared norms on l2-normalized features. Adding the sums of two
    batches (or of two ranks) gives the sums of their union, exactly.
    """
    _check_views(h1, h2)
    h1 = pool_features(h1).to(torch.float64)
    h2 = pool_features(h2).to(torch.float64)
    u1, u2 = _l2_normalize(h1), _l2_normalize(h2)
    a1, a2 = (u1, u2) if normalize else (h1, h2)
    t, delta = 0.5 * (a1 + a2), a1 - a2
    tu, du = 0.5 * (u1 + u2), u1 - u2
    return {"n": torch.tensor(float(h1.shape[0]), dtype=torch.float64, device=h1.device),
            "sum_t": t.sum(0), "sum_delta": delta.sum(0), "sum_tt": t.T @ t, "sum_dd": delta.T @ delta,
            "sum_t_unit": tu.sum(0), "sum_delta_unit": du.sum(0),
            "sq_t_unit": (tu * tu).sum(), "sq_delta_unit": (du * du).sum()}


def _icr_feature_dim(states: Dict[str, torch.Tensor]) -> int:
    return int(states["sum_t"].shape[0])


def _icr_covariances(states: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Sigma_s = Cov(t) - Cov(delta)/4 and Sigma_xi = Cov(delta)/2 (App. B.6) from the sums."""
    if float(states["n"]) < 2:
        raise ValueError("InvariantContaminationRatio: needs at least 2 view pairs before compute()")
    cov_t = _cov_from_sums(states["sum_t"], states["sum_tt"], states["n"])
    cov_d = _cov_from_sums(states["sum_delta"], states["sum_dd"], states["n"])
    return {"sigma_s": cov_t - 0.25 * cov_d, "sigma_xi": 0.5 * cov_d}


def unit_traces(states: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(Tr Σ_s, Tr Σ_ξ) on l2-normalized features (Fig. 8) from the sums of App. B.6."""
    n = states["n"]
    tr_t = _trace_from_sums(states["sum_t_unit"], states["sq_t_unit"], n)
    tr_d = _trace_from_sums(states["sum_delta_unit"], states["sq_delta_unit"], n)
    return tr_t - 0.25 * tr_d, 0.5 * tr_d


def _icr_compute(states: Dict[str, torch.Tensor], tau: TauSpec = "auto",
                 tau_rel: float = DEFAULT_TAU_REL,
                 cond_max: float = DEFAULT_COND_MAX) -> Dict[str, torch.Tensor]:
    """ICR (eq. 5), traces, ridge, condition number and spectrum from the sums (class docstring)."""
    tau = check_tau(tau, tau_rel, cond_max)
    cov = _icr_covariances(states)
    sigma_s, sigma_xi, n = cov["sigma_s"], cov["sigma_xi"], states["n"]
    _require_finite(sigma_s, sigma_xi, None if isinstance(tau, str) else tau, float(n))
    cond = condition_number(sigma_xi)
    ridge = resolve_tau(sigma_xi, tau, tau_rel, cond_max, cond=cond)
    lam = generalized_eigenvalues(sigma_s, sigma_xi, tau=ridge, n=float(n))
    trace_s, trace_xi = unit_traces(states)
    dev, f64 = lam.device, torch.float64
    return {
        "icr": 1.0 / (1.0 + lam.mean()),
        "trace_s": trace_s,
        "trace_xi": trace_xi,
        "trace_s_raw": torch.diagonal(sigma_s).sum(),
        "trace_xi_raw": torch.diagonal(sigma_xi).sum(),
        "n": n.clone(),
        "d": torch.tensor(float(_icr_feature_dim(states)), dtype=f64, device=dev),
        "tau": torch.tensor(ridge, dtype=f64, device=dev),
        "cond_xi": torch.tensor(cond, dtype=f64, device=dev),
        "eigenvalues": lam,
    }


def _icr_at(states: Dict[str, torch.Tensor], tau: TauSpec, tau_rel: float = DEFAULT_TAU_REL,
            cond_max: float = DEFAULT_COND_MAX) -> torch.Tensor:
    """ICR of the same sums under another ridge rule ``tau`` (eq. 4-5)."""
    cov = _icr_covariances(states)
    lam = generalized_eigenvalues(cov["sigma_s"], cov["sigma_xi"], tau=tau, tau_rel=tau_rel,
                                  n=float(states["n"]), cond_max=cond_max)
    return 1.0 / (1.0 + lam.mean())


def _icr_undefined(n: torch.Tensor, d: Optional[int]) -> Dict[str, torch.Tensor]:
    """The compute() dict of an ICR without two view pairs: NaN values, the count, no spectrum."""
    f64, dev = torch.float64, n.device
    nan = torch.tensor(float("nan"), dtype=f64, device=dev)
    out = {k: nan.clone() for k in ("icr", "trace_s", "trace_xi", "trace_s_raw", "trace_xi_raw", "tau", "cond_xi")}
    out.update(n=n.clone().to(f64), d=torch.tensor(float("nan") if d is None else float(d), dtype=f64, device=dev),
               eigenvalues=torch.zeros(0, dtype=f64, device=dev))
    return out


class InvariantContaminationRatio(Metric):
    """ICR (eq. 5 of the ICR paper) from pairs of views, exact under DDP.

    Args:
        tau: ridge added to Sigma_xi: ``"auto"`` (default, also None: 0 unless cond(Sigma_xi) >
            ``cond_max`` or Sigma_xi is not positive definite, then the relative ridge),
            ``"relative"`` (always ``tau_rel * Tr(Sigma_xi)/d``) or an
            absolute number >= 0 (module docstring).
        normalize: l2-normalize every feature vector before estimating Sigma_s, Sigma_xi for ICR
            (the traces are always on l2-normalized features).
        tau_rel: factor of the relative ridge (``"relative"``, and ``"auto"`` when it applies).
        cond_max: condition number of Sigma_xi above which ``"auto"`` adds the ridge.
        num_features: d, if known: the d-dependent states are created with their shape. Without
            it they start as 0-dim zeros that the first ``update`` (or ``merge_state``, or a
            loaded ``state_dict``) gives their shape, so ``forward``, ``merge_state`` into an
            empty metric and ``load_state_dict`` into a fresh one work as for any torchmetrics
            metric. Under DDP a rank that saw no data takes the other ranks' d before the
            gather (:meth:`sync`).

    ``update(h1, h2)``: the two views' features, (B, d) or (B, C, H, W) (mean-pooled over space);
    row i of h1 and h2 must come from the same image. ``compute()`` returns a dict with ``icr``,
    ``trace_s``, ``trace_xi`` (l2-normalized features, Fig. 8), ``trace_s_raw``, ``trace_xi_raw``,
    ``n`` (number of view pairs), ``d``, ``tau`` (the ridge actually added), ``cond_xi`` (the
    condition number of the estimated Sigma_xi, inf when it is singular) and ``eigenvalues``
    (descending, for plots). :meth:`icr_at` gives ICR of the same state under another ``tau``.
    The class and :func:`invariant_contamination_ratio` share ``_icr_update`` / ``_icr_compute``.
    """

    is_differentiable = False
    higher_is_better = keys.higher_is_better("icr/icr")  # the key table declares it
    full_state_update = False

    def __init__(self, tau: TauSpec = "auto", normalize: bool = False,
                 tau_rel: NonNegativeFloat = DEFAULT_TAU_REL, num_features: Optional[PositiveInt] = None,
                 cond_max: float = DEFAULT_COND_MAX, **kwargs) -> None:
        check_args(InvariantContaminationRatio.__init__, locals())
        tau = check_tau(tau, tau_rel, cond_max)
        if not isinstance(normalize, bool):
            raise ConfigError("normalize", "must be a bool", value=normalize)
        super().__init__(**kwargs)
        self.tau = tau
        self.tau_rel = float(tau_rel)
        self.cond_max = float(cond_max)
        self.normalize = normalize
        self._d: Optional[int] = None if num_features is None else int(num_features)
        # every state exists from the start (torchmetrics' reduced forward, merge_state and
        # load_state_dict need them): with d unknown, a 0-dim zero that the first sum broadcasts
        # to its (d,) / (d, d) shape
        for name, zero in _icr_zero_states(1 if num_features is None else int(num_features), None).items():
            self.add_state(name, zero if num_features is not None or name == "n"
                           else torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    @property
    def num_features(self) -> Optional[int]:
        """d, once known (``num_features``, or the shape of the summed states after an
        ``update``, a ``merge_state`` or a loaded ``state_dict``)."""
        if self._d is not None:
            return self._d
        st = getattr(self, "sum_t", None)
        return int(st.shape[0]) if isinstance(st, torch.Tensor) and st.ndim == 1 else None

    def sync(self, dist_sync_fn=None, process_group=None, should_sync: bool = True,
             distributed_available=None) -> None:
        """torchmetrics' ``sync``, after the ranks agree on d: a rank that saw no data while d was
        not given (its sums still 0-dim) takes zero sums of the other ranks' shape, so the gather
        neither fails nor hangs (one ``all_reduce`` of d, only when d was not given)."""
        available = self.distributed_available_fn if distributed_available is None else distributed_available
        if should_sync and self._d is None and callable(available) and available():  # torchmetrics' test
            import torch.distributed as dist

            d = torch.tensor(float(self.num_features or 0), dtype=torch.float64, device=self.n.device)
            dist.all_reduce(d, op=dist.ReduceOp.MAX, group=process_group or self.process_group)
            if self.num_features is None and int(d) > 0:
                for name, zero in _icr_zero_states(int(d), self.n.device).items():
                    if name != "n":
                        setattr(self, name, getattr(self, name) + zero)
        super().sync(dist_sync_fn=dist_sync_fn, process_group=process_group, should_sync=should_sync,
                     distributed_available=distributed_available)

    def _states(self) -> Dict[str, torch.Tensor]:
        if self.num_features is None:
            raise ValueError("InvariantContaminationRatio: needs at least 2 view pairs before compute()")
        return {name: getattr(self, name) for name in ICR_STATES}

    def update(self, h1: torch.Tensor, h2: torch.Tensor) -> None:
        batch = _icr_update(h1, h2, self.normalize)
        d, known = _icr_feature_dim(batch), self.num_features
        if known is not None and d != known:
            raise ValueError(f"h1, h2: feature dimension changed from {known} to {d}")
        for name, value in batch.items():
            setattr(self, name, getattr(self, name) + value)

    def covariances(self) -> Dict[str, torch.Tensor]:
        """Sigma_s and Sigma_xi (App. B.6) from the (synced) sums."""
        return _icr_covariances(self._states())

    def compute(self) -> Dict[str, torch.Tensor]:
        """ICR and its companions (class docstring); before two view pairs were seen (no update:
        torchmetrics warns) every value is NaN (``n`` the count, ``eigenvalues`` empty), as for
        every metric of :mod:`lightning_pfd.metrics`."""
        if self.num_features is None or float(self.n) < 2:
            return _icr_undefined(self.n, self.num_features)
        return _icr_compute(self._states(), self.tau, self.tau_rel, self.cond_max)

    def icr_at(self, tau: TauSpec) -> torch.Tensor:
        """ICR of the current (synced) state with another ridge spec (e.g. to measure the effect
        of tau on the same features: ``m.icr_at(0.0)``, ``m.icr_at("relative")``)."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync,
                               should_unsync=self._should_unsync):  # the same states as compute()
            states = {k: v.clone() for k, v in self._states().items()}
        return _icr_at(states, tau, self.tau_rel, self.cond_max)

    def eigenvalues(self) -> torch.Tensor:
        """Generalized eigenvalues (descending) of the current (synced) state."""
        return self.compute()["eigenvalues"]

    def plot(self, val=None, ax=None):  # torchmetrics convention
        val = self.compute()["icr"] if val is None else val
        return self._plot(val, ax)


def invariant_contamination_ratio(h1: torch.Tensor, h2: torch.Tensor, tau: TauSpec = "auto",
                                  normalize: bool = False,
                                  tau_rel: float = DEFAULT_TAU_REL,
                                  cond_max: float = DEFAULT_COND_MAX) -> Dict[str, torch.Tensor]:
    """Functional twin of :class:`InvariantContaminationRatio` (same dict)."""
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize: must be a bool, got {normalize!r}")
    check_tau(tau, tau_rel, cond_max)
    return _icr_compute(_icr_update(h1, h2, normalize), tau, tau_rel, cond_max)
