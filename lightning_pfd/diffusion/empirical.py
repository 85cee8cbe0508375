"""Closed-form denoiser of a finite training set (PFD paper eq. 46).

For the empirical distribution p_emp = (1/N) sum_i delta(y_i), the noisy density is a mixture of
N isotropic Gaussians and the ideal denoiser is a softmax-weighted average of the training points

    w_i(x, sigma) = softmax_i( -||x - y_i||^2 / (2 sigma^2) ),   D*(x; sigma) = sum_i w_i y_i,

equivalently the score of eq. 46, grad log p_sigma(x) = (D*(x; sigma) - x) / sigma^2.
Its probability-flow ODE ends on a training point, so its endpoints define E_mem (PFD paper
eq. 8 and App. D).

Two algorithms give the same D* (to float64 rounding, well within 1e-9 relative):

* ``precision="float64"``: every logit in float64, the training set streamed with an online
  log-sum-exp (two float64 matmuls of B x N x D per call).
* ``precision="mixed"`` (default): one float32 matmul per chunk finds, for each row, the
  training points whose log-weight can be within ``T = ln N + 37`` of the row's maximum, using a
  rigorous bound on the float32 error of the cross term (:func:`fp32_cross_term_bound`, derived in
  ``docs/empirical_denoiser.md``); only those candidates are rescored in float64 (from exact
  differences ||x - y_i||^2), every other point has total weight below e^-37 < 2^-53. Rows for
  which the margin admits many candidates (large sigma) take the float64 algorithm.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from typing import Literal, get_args

import torch
from torch import nn

from ..validation import PositiveInt, check_args

__all__ = ["EmpiricalDenoiser", "fp32_cross_term_bound", "PRECISIONS", "float64_matmul_is_fast"]

EmpiricalPrecision = Literal["mixed", "float64"]
PRECISIONS = get_args(EmpiricalPrecision)

#: T = ln N + LOG_WEIGHT_SLACK: the points the mixed path drops weigh < e^-37 < 2^-53 in total
LOG_WEIGHT_SLACK = 37.0
_U32, _U64 = 2.0 ** -24, 2.0 ** -53
#: (extra input rounding inside the matmul, accumulation unit roundoff) of one float32 matmul:
#: IEEE float32 on any device; TF32 on CUDA (inputs cut to a 10-bit mantissa, possibly by
#: truncation; float32 accumulation that tensor cores may truncate). docs/empirical_denoiser.md.
_UNIT_ROUNDOFF = {"ieee": (0.0, _U32), "tf32": (2.0 ** -10, 2.0 ** -22)}
#: the float32 pass is only used while every partial sum stays far below float32's max (2^128)
_FP32_SAFE_MAGNITUDE = 2.0 ** 120


def fp32_cross_term_bound(x_norm: torch.Tensor, y_norm_max: float, q_max: float, dim: int,
                          mode: str = "ieee") -> torch.Tensor:
    """Bound E on |G_i - t_i| for the float32 cross term, per row (docs/empirical_denoiser.md, eq. B).

    t_i = 2 X.Y_i - ||Y_i||^2 is the logit numerator of PFD paper eq. 46 with centred data
    (X = x - mu, Y_i = y_i - mu; logit_i = t_i / (2 sigma^2) + a constant per row) and
    G_i = fl32(2 a.b_i - r_i) the float32 ``addmm`` of a = fl32(fl64(x - mu)),
    b_i = fl32(fl64(y_i - mu)), r_i = fl32(fl64(||y_i - mu||^2)). Valid for any summation order
    of the matmul (Higham's gamma_n bound), with underflow accounted for.

    Args:
        x_norm: upper bound on ||X|| of each row (float64, shape (B,)).
        y_norm_max: upper bound on max_i ||Y_i||.
        q_max: max_i of the float64 ||Y_i||^2.
        dim: D, the number of features (terms of the dot product).
        mode: ``"ieee"`` (float32 matmul) or ``"tf32"`` (TF32 tensor cores on CUDA).

    Returns:
        E (float64, shape (B,)) with |G_i - t_i| <= E for every i, or +inf where the bound
        does not apply ((D + 1) times the accumulation unit roundoff is not below 1/2).
    """
    u_in, u_acc = _UNIT_ROUNDOFF[mode]
    n = dim + 1  # D products plus the -r_i term
    if n * u_acc >= 0.5:
        return torch.full_like(x_norm, math.inf)
    gamma = n * u_acc / (1 - n * u_acc)  # accumulation in any order
    eps64 = (dim + 2) * _U64 / (1 - (dim + 2) * _U64)  # float64 ||Y_i||^2
    u1 = (1 + _U64) * (1 + _U32) * (1 + u_in) - 1  # x - mu in float64, then matmul input
    ur = (1 + _U32) * (1 + u_in) - 1  # r_i = fl32(q_i)
    cross = 2 * gamma * (1 + u1) ** 2 + 2 * (2 * u1 + u1 * u1)
    sq = (gamma * (1 + ur) + ur) * (1 + eps64) + eps64
    underflow = 2.0 ** -140 * n * (1 + x_norm + y_norm_max)
    # (1 + 2^-20) covers the float64 evaluation of the norms and of this formula
    return (cross * x_norm * y_norm_max + sq * q_max) * (1 + 2.0 ** -20) + underflow


@contextlib.contextmanager
def _swapped(obj, attr: str, value):
    """Set ``obj.attr = value`` while inside, restore the old value after."""
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


class _Float32MatmulPrecision:
    """torch's legacy global switch as an attribute (torch without per-backend switches)."""
    value = property(lambda self: torch.get_float32_matmul_precision(),
                     lambda self, v: torch.set_float32_matmul_precision(v))


def _matmul_mode(device: torch.device, mode: str) -> contextlib.ExitStack:
    """Float32 matmuls on ``device`` in ``mode`` ("ieee" or "tf32") while inside, autocast off,
    the caller's settings restored after.

    Uses the per-backend ``fp32_precision`` switches where torch has them (recent torch raises
    when they are mixed with the legacy ``allow_tf32`` flags), the legacy ones otherwise. On CPU
    this keeps oneDNN from running float32 matmuls in bf16 (``set_float32_matmul_precision
    ("medium")`` would); the bound of docs/empirical_denoiser.md assumes IEEE float32 there.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device.type, enabled=False))
    backend = {"cuda": torch.backends.cuda.matmul,
               "cpu": getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)}.get(device.type)
    if backend is not None and hasattr(backend, "fp32_precision"):
        stack.enter_context(_swapped(backend, "fp32_precision", mode))
    elif device.type == "cuda":
        stack.enter_context(_swapped(backend, "allow_tf32", mode == "tf32"))
    elif device.type == "cpu":
        stack.enter_context(_swapped(_Float32MatmulPrecision(), "value", "highest"))
    return stack


def _round_down_f32(v: torch.Tensor) -> torch.Tensor:
    """Largest float32 <= v (float64 in): comparing a float32 against it keeps a superset."""
    f = v.to(torch.float32)
    return torch.where(f.to(torch.float64) > v, torch.nextafter(f, f.new_tensor(-math.inf)), f)


def _threshold(max_g: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """tau = max G - margin (eq. C) as a float32 rounded down; 2^-50 |max G| covers the float64
    subtraction."""
    m = max_g.to(torch.float64)
    return _round_down_f32(m - margin - 2.0 ** -50 * m.abs())


def _above(g: torch.Tensor, tau: torch.Tensor, k: int, top_v: torch.Tensor, top_i: torch.Tensor):
    """Flat (row, col, value) of the entries g >= tau of each row; of a row with more than k such
    entries, only its k largest. ``top_v``, ``top_i``: the two largest entries of each row (one if
    g has one column), which settle the common rows with at most one entry above tau."""
    multi = top_v[:, -1] >= tau if g.shape[1] > 1 else torch.zeros_like(tau, dtype=torch.bool)
    one = ((top_v[:, 0] >= tau) & ~multi).nonzero().squeeze(1)
    r, c, v = one, top_i[one, 0], top_v[one, 0]
    rm = multi.nonzero().squeeze(1)
    if rm.numel():
        sub = g[rm]
        mask = sub >= tau[rm].unsqueeze(1)
        big = mask.sum(1) > k
        if bool(big.any()):
            br = big.nonzero().squeeze(1)
            mask[br] = False
            mask[br.unsqueeze(1), sub[br].topk(k, dim=1, sorted=False)[1]] = True
        rr, cc = mask.nonzero(as_tuple=True)
        r, c, v = torch.cat([r, rm[rr]]), torch.cat([c, cc]), torch.cat([v, sub[rr, cc]])
    return r, c, v


def _top_per_row(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, k: int):
    """Keep at most the k largest values of each row of flat (row, col, value) lists."""
    if rows.numel() == 0 or int(torch.bincount(rows).max()) <= k:
        return rows, cols, vals
    order = torch.argsort(vals, descending=True, stable=True)
    order = order[torch.argsort(rows[order], stable=True)]  # by row, values descending
    rows, cols, vals = rows[order], cols[order], vals[order]
    first = torch.searchsorted(rows, rows, right=False)  # index of each row's first entry
    keep = torch.arange(rows.numel(), device=rows.device) - first < k
    return rows[keep], cols[keep], vals[keep]


#: device -> whether its float64 matmuls run at >= 1/2 its IEEE float32 rate (measured once)
_FAST_FLOAT64: dict = {}


def _seconds(fn, device: torch.device, repeats: int = 3) -> float:
    """Best wall time of ``fn()`` on ``device`` (synchronised), after one warm-up call."""
    import time

    fn()
    best = math.inf
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


def float64_matmul_is_fast(device) -> bool:
    """Whether float64 matmuls on ``device`` run at least half as fast as IEEE float32 ones.

    True on data-centre GPUs with float64 tensor cores (A100, H100), where the float32 candidate
    search of ``precision="mixed"`` cannot beat the float64 algorithm and only adds its
    bookkeeping; False on consumer GPUs (float64 at 1/32-1/64 of the float32 rate) and, without
    measuring, on CPUs. Measured once per CUDA device with two 2048^3 products and cached
    (docs/performance.md records the numbers).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return False
    key = str(device if device.index is not None else torch.device("cuda", torch.cuda.current_device()))
    if key not in _FAST_FLOAT64:
        a32 = torch.randn(2048, 2048, device=device)
        a64 = a32.double()
        with _matmul_mode(device, "ieee"):
            t32 = _seconds(lambda: a32 @ a32, device)
            t64 = _seconds(lambda: a64 @ a64, device)
        _FAST_FLOAT64[key] = t64 <= 2 * t32
    return _FAST_FLOAT64[key]


class EmpiricalDenoiser(nn.Module):
    """Exact denoiser D*(x; sigma) of the empirical distribution of ``data`` (PFD paper eq. 46).

    The logit of y_i is (2 x.y_i - ||y_i||^2) / (2 sigma^2): -||x - y_i||^2 / (2 sigma^2) up to
    ||x||^2 / (2 sigma^2), which does not depend on i and cancels in the softmax. The training
    set is streamed in chunks of ``chunk_size`` rows, so memory is O(B * chunk_size + B * D),
    never O(B * N * D).

    ``precision="float64"``: the logits of every chunk in float64 with an online log-sum-exp
    (running max m, normaliser l and weighted sum a, rescaled by exp(m_old - m_new)). Float32
    logits alone would be wrong: at sigma = 0.002 they are of order 1e6 and float32 rounding
    picks wrong winners.

    ``precision="mixed"`` (default, docs/empirical_denoiser.md): a float32 matmul per chunk
    computes G_i ~ 2 (x - mu).(y_i - mu) - ||y_i - mu||^2 (mu = data mean); with E the rigorous
    error bound of :func:`fp32_cross_term_bound`, a point is kept as a candidate iff
    G_i >= max_j G_j - 2 E - 2 sigma^2 T, T = ln N + 37. Every dropped point has
    log-weight < max - T, so all of them together weigh less than e^-37 < 2^-53 relative.
    Candidates are rescored in float64 from exact differences ||x - y_i||^2 (a single candidate
    is returned as is: its weight is 1 to within e^-37). Rows with more than ``max_candidates``
    candidates, and rows where float32 could overflow, take the float64 algorithm; if more than
    ``dense_fraction`` of a sample of ``probe_rows`` rows (done first) are dense, so do all the
    other rows, without a float32 pass (large sigma: the margin admits almost everything, the
    softmax needs all N weights to float64 accuracy, i.e. the two float64 matmuls). On CUDA the
    float32 pass uses TF32 where the TF32 bound is below T / 4 in log-weight (it then adds few
    candidates), IEEE float32 otherwise; on CPU it is always IEEE float32 (autocast and oneDNN
    bf16 settings are switched off while it runs).
    On a device whose float64 matmuls are at least half as fast as its float32 ones
    (:func:`float64_matmul_is_fast`: A100 / H100-class GPUs), ``"mixed"`` runs the float64
    algorithm: the float32 search cannot pay there (measured on an H100: benchmarks/gpu.py); so it
    does on a CPU for at most ``float64_max_n_cpu`` training points (the search's fixed cost).

    Both settings return D* to float64 rounding (well within 1e-9 relative), so endpoints,
    :meth:`fingerprint` and the caches keyed on it do not depend on ``precision``: caches written
    with the float64 denoiser stay valid.

    Args:
        data: training set, shape (N, *data_shape); stored flattened in float64.
        chunk_size: rows of the training set processed at once (memory knob).
        precision: ``"mixed"`` (float32 candidate search + float64 rescoring) or ``"float64"``.
    """

    sigma_range = (0.0, math.inf)  # exact at every noise level: no grid is clamped
    #: mixed path knobs (performance only; the result does not depend on them), chosen by
    #: measurement along the Heun-18 PF-ODE (docs/empirical_denoiser.md, "dense rows")
    probe_rows = 16
    dense_fraction = 0.7
    max_candidates = 16
    #: None: decide per call (:meth:`_float64_pays`); True / False: ``"mixed"`` always / never
    #: runs the float64 algorithm
    float64_fast = None
    #: on a CPU, training sets of at most this many points take the float64 algorithm: the float32
    #: search's fixed cost per call exceeds the float64 matmuls it saves (Heun-18 flow of 256 seeds,
    #: 1 thread, float64 / mixed CPU time: 0.29 at N = 64, 0.74 at N = 256, 1.16 at N = 1024 for
    #: D = 64; 0.61, 0.95, 1.33 for D = 784)
    float64_max_n_cpu = 256

    def __init__(self, data: torch.Tensor, chunk_size: PositiveInt = 4096, precision: EmpiricalPrecision = "mixed"):
        check_args(EmpiricalDenoiser.__init__, locals())
        super().__init__()
        data = torch.as_tensor(data)
        if data.ndim < 2 or data.shape[0] < 1:
            raise ValueError(f"data: expected shape (N >= 1, *data_shape), got {tuple(data.shape)}")
        y = data.detach().reshape(data.shape[0], -1).to(torch.float64)
        if not bool(torch.isfinite(y).all()):
            raise ValueError("data: contains NaN or inf")
        self.shape = tuple(data.shape[1:])
        self.chunk_size = int(chunk_size)
        self.precision = precision
        self.register_buffer("data", y.contiguous())
        self.register_buffer("sq_norms", y.square().sum(1))  # ||y_i||^2, once
        self.last_stats: dict = {}
        if precision == "mixed":
            self._init_fp32(y)

    def _init_fp32(self, y: torch.Tensor) -> None:
        """Centred float32 copy of the data and the constants of the error bound (derived buffers,
        not in the state dict)."""
        mu = y.mean(0)
        yc = y - mu
        q = yc.square().sum(1)  # ||y_i - mu||^2 in float64
        self.register_buffer("mean", mu, persistent=False)
        self.register_buffer("data32", yc.to(torch.float32).contiguous(), persistent=False)
        self.register_buffer("sq_norms32", q.to(torch.float32), persistent=False)
        self.y_norm_max = float(q.max().sqrt()) * (1 + 2.0 ** -20)  # >= max ||y_i - mu||
        self.q_max = float(q.max())

    @property
    def num_samples(self) -> int:
        return self.data.shape[0]

    def fingerprint(self) -> str:
        """Hash of the training set (order-sensitive, float64 bytes).

        Independent of ``precision`` and ``chunk_size``: both algorithms return the same D*
        to float64 rounding (within 1e-9 relative), so caches keyed on the data stay valid.
        """
        h = hashlib.sha256(str(tuple(self.data.shape)).encode())
        h.update(self.data.detach().cpu().numpy().tobytes())
        return "emp-" + h.hexdigest()[:16]

    def _sigma2(self, sigma, B: int, device) -> torch.Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float64, device=device)
        if s.ndim == 0:
            s = s.expand(B)
        s = s.reshape(-1)
        if s.shape[0] != B:
            raise ValueError(f"sigma: expected a scalar or shape ({B},), got {tuple(s.shape)}")
        if bool((s <= 0).any()):
            raise ValueError("sigma: must be > 0 (D* at sigma = 0 is not a function)")
        return (2.0 * s.square()).reshape(-1, 1)  # 2 sigma^2, (B, 1)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """D*(x; sigma) in float64, shape of ``x`` (eq. 46 as a denoiser)."""
        B = x.shape[0]
        xf = x.reshape(B, -1).to(device=self.data.device, dtype=torch.float64)
        if xf.shape[1] != self.data.shape[1]:
            raise ValueError(f"x: {xf.shape[1]} features per sample, training data has {self.data.shape[1]}")
        two_s2 = self._sigma2(sigma, B, xf.device)
        if self.precision == "float64":
            out = self._forward_float64(xf, two_s2)
        elif self._float64_pays(xf.device):  # float64 tensor cores, or a small training set on a CPU
            self.last_stats = {"rows": B, "dense_rows": B, "candidates": [], "mode": "float64 (cheaper here)"}
            out = self._forward_float64(xf, two_s2)
        else:
            out = self._forward_mixed(xf, two_s2)
        return out.reshape(x.shape).to(x.device)

    def _float64_pays(self, device: torch.device) -> bool:
        """Whether ``"mixed"`` runs the float64 algorithm on ``device``: ``float64_fast`` if set,
        else on devices with fast float64 matmuls (:func:`float64_matmul_is_fast`) and on CPUs for
        training sets of at most ``float64_max_n_cpu`` points."""
        if self.float64_fast is not None:
            return bool(self.float64_fast)
        if device.type == "cpu":
            return self.num_samples <= self.float64_max_n_cpu
        return float64_matmul_is_fast(device)

    def _forward_float64(self, xf: torch.Tensor, two_s2: torch.Tensor) -> torch.Tensor:
        """Float64 streamed softmax over all N points (online log-sum-exp)."""
        B = xf.shape[0]
        m = torch.full((B, 1), -math.inf, dtype=torch.float64, device=xf.device)  # running max
        l = torch.zeros((B, 1), dtype=torch.float64, device=xf.device)  # running normaliser
        a = torch.zeros_like(xf)  # running weighted sum of y_i
        with _matmul_mode(xf.device, "ieee"):
            for y, yy in zip(self.data.split(self.chunk_size), self.sq_norms.split(self.chunk_size)):
                logits = torch.addmm(yy, xf, y.T, beta=-1.0, alpha=2.0).div_(two_s2)  # (B, C)
                m_new = torch.maximum(m, logits.amax(1, keepdim=True))
                scale = torch.exp(m - m_new)  # exp(-inf) = 0 on the first chunk
                p = logits.sub_(m_new).exp_()
                l = l * scale + p.sum(1, keepdim=True)
                a = torch.addmm(a.mul_(scale), p, y)
                m = m_new
        return a / l

    # ---- mixed precision -----------------------------------------------------------------------

    def _forward_mixed(self, xf: torch.Tensor, two_s2: torch.Tensor) -> torch.Tensor:
        """Float32 candidate search, float64 rescoring, float64 algorithm for dense rows.

        The first ``probe_rows`` rows go first; if more than ``dense_fraction`` of them are dense
        (large sigma: the margin admits more than ``max_candidates`` points), the whole batch
        takes the float64 algorithm without a float32 pass for the other rows.
        """
        B = xf.shape[0]
        P = min(B, self.probe_rows)  # the first rows: slices, no copies
        rows, cols, dense = self._fp32_candidates(xf[:P], two_s2[:P])
        if P < B and float(dense.float().mean()) > self.dense_fraction:  # large sigma
            self.last_stats = {"rows": B, "dense_rows": B, "candidates": [], "mode": "float64"}
            return self._forward_float64(xf, two_s2)  # all rows: one well-shaped matmul, no copies
        if P < B:
            r2, c2, d2 = self._fp32_candidates(xf[P:], two_s2[P:])
            rows, cols, dense = torch.cat([rows, r2 + P]), torch.cat([cols, c2]), torch.cat([dense, d2])
        counts = torch.bincount(rows, minlength=B)
        dense |= counts == 0  # only rows the float32 pass skipped (the maximum is always kept)
        self.last_stats = {"rows": B, "dense_rows": int(dense.sum()),
                           "candidates": counts[~dense].tolist(), "mode": self._last_mode}
        if bool(dense.all()):  # large sigma: no copies
            return self._forward_float64(xf, two_s2)
        if bool((counts == 1).all()):  # one candidate per row (small sigma), sorted: D* = y_i
            return self.data.index_select(0, cols)
        out = torch.empty_like(xf)
        self._rescore(xf, two_s2, rows, cols, out)
        if bool(dense.any()):
            idx = dense.nonzero().squeeze(1)
            out[idx] = self._forward_float64(xf[idx], two_s2[idx])
        return out

    def _fp32_mode(self, x_norm: torch.Tensor, two_s2: torch.Tensor, device: torch.device) -> str:
        """TF32 on CUDA where its bound costs at most T/4 of log-weight margin, else IEEE."""
        if device.type != "cuda":
            return "ieee"
        e = fp32_cross_term_bound(x_norm, self.y_norm_max, self.q_max, self.data.shape[1], "tf32")
        return "tf32" if bool((2 * e / two_s2.squeeze(1) <= self._log_margin() / 4).all()) else "ieee"

    def _log_margin(self) -> float:
        return math.log(self.num_samples) + LOG_WEIGHT_SLACK

    def _fp32_setup(self, xf: torch.Tensor, two_s2: torch.Tensor):
        """Float32 rows a = fl32(x - mu), the margin 2E + 2 sigma^2 T of eq. C per row, the matmul
        mode, and the rows that must skip the float32 pass (overflow risk, non-finite x)."""
        a = torch.empty(xf.shape, dtype=torch.float32, device=xf.device)
        x_norm = torch.empty(xf.shape[0], dtype=torch.float64, device=xf.device)
        for s in range(0, xf.shape[0], 256):  # blocks of rows: no B x D float64 temporary
            xc = xf[s:s + 256] - self.mean
            x_norm[s:s + 256] = torch.linalg.vector_norm(xc, dim=1)
            a[s:s + 256] = xc
        x_norm *= 1 + 2.0 ** -20  # >= ||x - mu||
        mode = self._fp32_mode(x_norm, two_s2, xf.device)
        self._last_mode = mode
        err = fp32_cross_term_bound(x_norm, self.y_norm_max, self.q_max, self.data.shape[1], mode)
        margin = (2 * err + two_s2.squeeze(1) * self._log_margin()) * (1 + 2.0 ** -20)
        size = 2 * x_norm * self.y_norm_max + self.q_max  # NaN / inf in x make it non-finite
        ok = torch.isfinite(err) & (size < _FP32_SAFE_MAGNITUDE) & (x_norm < _FP32_SAFE_MAGNITUDE)
        return a, margin, mode, ~ok

    def _fp32_candidates(self, xf: torch.Tensor, two_s2: torch.Tensor):
        """Candidates of the rows of ``xf``: (rows, cols) sorted by row, and a dense flag per row.

        Streams the chunks once, keeping for each row at most k = max_candidates + 1 entries
        (the largest G) with G >= the threshold of the running maximum. At the end the threshold
        of the final maximum, tau = max_j G_j - 2E - 2 sigma^2 T (docs/empirical_denoiser.md,
        eq. C), selects the candidates; every point below it has logit < max - T. A row with k
        stored entries above tau has more than max_candidates candidates: dense.
        """
        N, k = self.num_samples, self.max_candidates + 1
        a, margin, mode, dense = self._fp32_setup(xf, two_s2)
        act = (~dense).nonzero().squeeze(1)  # rows that take the float32 pass
        if act.numel() < a.shape[0]:
            a, margin = a[act], margin[act]
        max_g = torch.full((act.numel(),), -math.inf, dtype=torch.float32, device=xf.device)
        rows = torch.empty(0, dtype=torch.long, device=xf.device)
        cols, vals = rows.clone(), torch.empty(0, dtype=torch.float32, device=xf.device)
        with _matmul_mode(xf.device, mode):
            for start in range(0, N if act.numel() else 0, self.chunk_size):
                stop = min(start + self.chunk_size, N)
                g = torch.addmm(self.sq_norms32[start:stop], a, self.data32[start:stop].T,
                                beta=-1.0, alpha=2.0)  # (b, C) float32, G_i of eq. B
                top_v, top_i = g.topk(min(2, stop - start), dim=1)
                max_g = torch.maximum(max_g, top_v[:, 0])
                tau = _threshold(max_g, margin)
                keep = vals >= tau[rows]  # earlier entries against the larger maximum
                r, c, v = _above(g, tau, k, top_v, top_i)
                rows, cols, vals = _top_per_row(torch.cat([rows[keep], r]),
                                                torch.cat([cols[keep], c + start]),
                                                torch.cat([vals[keep], v]), k)
        keep = vals >= _threshold(max_g, margin)[rows]
        rows, cols = rows[keep], cols[keep]
        over = torch.bincount(rows, minlength=act.numel()) > self.max_candidates
        dense[act[over]] = True
        keep = ~over[rows]
        rows, cols = act[rows[keep]], cols[keep]
        order = torch.argsort(rows * N + cols)
        return rows[order], cols[order], dense

    def _rescore(self, xf, two_s2, rows, cols, out) -> None:
        """Float64 softmax over each row's candidates, from exact differences ||x - y_i||^2."""
        B, N = xf.shape[0], self.num_samples
        if rows.numel() == 0:
            return
        counts = torch.bincount(rows, minlength=B)
        single = counts[rows] == 1
        out[rows[single]] = self.data[cols[single]]  # weight 1 to within e^-37
        rows, cols = rows[~single], cols[~single]
        if rows.numel() == 0:
            return
        logits = torch.empty(rows.numel(), dtype=torch.float64, device=xf.device)
        for s in range(0, rows.numel(), max(B, 1)):  # gathers of at most B x D
            r, c = rows[s:s + B], cols[s:s + B]
            diff = self.data.index_select(0, c).sub_(xf.index_select(0, r))
            logits[s:s + B] = diff.square_().sum(1).div_(two_s2[r, 0]).neg_()
        m = torch.full((B,), -math.inf, dtype=torch.float64, device=xf.device)
        m = m.scatter_reduce(0, rows, logits, reduce="amax")
        w = torch.exp(logits - m[rows])
        l = torch.zeros(B, dtype=torch.float64, device=xf.device).index_add_(0, rows, w)
        multi, compact = torch.unique_consecutive(rows, return_inverse=True)  # rows are sorted
        weights = torch.sparse_coo_tensor(torch.stack([compact, cols]), w / l[rows],
                                          size=(multi.numel(), N), is_coalesced=True,
                                          check_invariants=False)  # sorted, unique by construction
        out[multi] = torch.sparse.mm(weights, self.data)  # sum_i w_i y_i without gathering y

    def score(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """grad log p_sigma(x) = (D*(x; sigma) - x) / sigma^2 (eq. 46)."""
        s2 = torch.as_tensor(sigma, dtype=torch.float64, device=x.device) ** 2
        s2 = s2.reshape(-1, *([1] * (x.ndim - 1))) if s2.ndim else s2
        return (self.forward(x, sigma) - x.to(torch.float64)) / s2

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest training point of each row of x (chunked, float64)."""
        xf = x.reshape(x.shape[0], -1).to(device=self.data.device, dtype=torch.float64)
        best_v = torch.full((xf.shape[0],), -math.inf, dtype=torch.float64, device=xf.device)
        best_i = torch.zeros(xf.shape[0], dtype=torch.long, device=xf.device)
        with _matmul_mode(xf.device, "ieee"):
            for start in range(0, self.num_samples, self.chunk_size):
                y = self.data[start:start + self.chunk_size]
                v = torch.addmm(self.sq_norms[start:start + self.chunk_size], xf, y.T, beta=-1.0, alpha=2.0)
                cv, ci = v.max(1)
                better = cv > best_v
                best_v = torch.where(better, cv, best_v)
                best_i = torch.where(better, ci + start, best_i)
        return best_i
