"""Bias–variance of the generalization error on a sweep (PFD paper §4.3, Def. 3, eq. 9, 45).

- :func:`bias_variance_cell` decomposes the mean E_gen² of the K students of one (N, |θ|) cell
  (the paper's plug-in values and the named unbiased variant), delegating to
  :func:`lightning_pfd.metrics.bias_variance_decomposition` (the metric the project tests, imported
  lazily: the rest needs no torch);
- :func:`bias_variance_errors`: a standard error per cell over the evaluation seeds and, for
  K ≥ 3, over the students (the training sets);
- :func:`bias_variance_statements`: the four statements of §4.3 (Fig. 5), each marked holds /
  fails / undecided with its numbers.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["bias_variance_cell", "bias_variance_errors", "bias_variance_statements", "STATEMENTS", "Z_DECIDE"]


def bias_variance_cell(teacher, students) -> dict:
    """Def. 3 of the PFD paper (eq. 9, 45) on one (N, |θ|) cell, from endpoints in Ψ space.

    ``teacher`` (M, d): Ψ(Φ_data(x_T^i)); ``students`` (K, M, d), K ≥ 2: Ψ(Φ_θk(x_T^i)) on the
    same seeds. With m(x_T) = (1/K) Σ_k Ψ_k(x_T):

        E_bias² = mean_i ‖Ψ_teacher − m‖²,   E_var = mean_i (1/K) Σ_k ‖Ψ_k − m‖²,
        E_gen,k = (mean_i ‖Ψ_k − Ψ_teacher‖²)^{1/2}   (eq. 4: the monitor's E_gen)

    and the identity (1/K) Σ_k E_gen,k² = E_bias² + E_var holds exactly on the sample; its
    absolute and relative rounding error are returned. Computed by
    :class:`lightning_pfd.metrics.BiasVarianceDecomposition` (float64). These are the paper's
    plug-in values; ``e_bias_sq_unbiased`` / ``e_var_unbiased`` are the named unbiased variant
    (E_var·K/(K−1), E_bias² − E_var/(K−1): the plug-in E_bias² carries Var/K,
    :mod:`lightning_pfd.metrics.bias_variance`).

    Uncertainties (:func:`bias_variance_errors`): ``se_seeds`` — the standard error over the M
    evaluation seeds (the noise of the finite x_T sample, students fixed); ``se_students`` — the
    delete-one-student jackknife of the unbiased values, the uncertainty from the K training sets
    (None for K = 2: one student left is no variance).
    """
    import torch

    from ..metrics.bias_variance import bias_variance_decomposition

    t = np.asarray(teacher, dtype=np.float64)
    s = np.asarray(students, dtype=np.float64)
    if t.ndim != 2 or s.ndim != 3 or s.shape[1:] != t.shape:
        raise ConfigError("students", "expected teacher (M, d) and students (K, M, d) on the same seeds",
                          value=(t.shape, s.shape))
    if s.shape[0] < 2:
        raise ConfigError("students", "the bias-variance decomposition needs K >= 2 students",
                          value=s.shape[0])
    out = bias_variance_decomposition(torch.from_numpy(t), torch.from_numpy(s))
    fair = bias_variance_decomposition(torch.from_numpy(t), torch.from_numpy(s), correction="unbiased")
    e_bias, e_var = float(out["e_bias"]), float(out["e_var"])
    gen_sq_mean = float(out["e_gen_sq_mean"])
    err = abs(gen_sq_mean - (e_bias ** 2 + e_var))
    return {"k": int(s.shape[0]), "m": int(t.shape[0]), "e_bias": e_bias, "e_bias_sq": e_bias ** 2,
            "e_var": e_var, "e_gen": [float(v) for v in out["e_gen"]], "e_gen_sq_mean": gen_sq_mean,
            "e_bias_sq_unbiased": float(fair["e_bias_sq"]), "e_var_unbiased": float(fair["e_var"]),
            **bias_variance_errors(t, s),
            "identity_abs_error": err, "identity_rel_error": err / gen_sq_mean if gen_sq_mean > 0 else err}


def _per_seed_bias_variance(t: np.ndarray, s: np.ndarray) -> tuple:
    """Per evaluation seed i: ‖Ψ_teacher − m‖², (1/K) Σ_k ‖Ψ_k − m‖² and (1/K) Σ_k ‖Ψ_k − Ψ_teacher‖²."""
    m = s.mean(0)
    return (np.square(t - m).sum(1), np.square(s - m).sum(2).mean(0), np.square(s - t).sum(2).mean(0))


def bias_variance_errors(teacher: np.ndarray, students: np.ndarray) -> dict:
    """Standard errors of a cell's Def. 3 values (:func:`bias_variance_cell`):

    - ``se_seeds``: {e_bias_sq, e_var, e_gen_sq_mean}: sd/√M of the per-seed values (the plug-in
      values are their means over the M seeds);
    - ``se_students``: {e_bias_sq, e_var, e_gen_sq_mean}: the delete-one-student jackknife,
      sqrt((K−1)/K Σ_k (θ_(−k) − θ̄)²), of the unbiased values (which stay unbiased with K − 1
      students) and of mean E_gen²; None when K < 3."""
    t, s = np.asarray(teacher, np.float64), np.asarray(students, np.float64)
    k, m = s.shape[0], t.shape[0]
    per = dict(zip(("e_bias_sq", "e_var", "e_gen_sq_mean"), _per_seed_bias_variance(t, s)))
    se_seeds = {name: float(np.std(v, ddof=1) / math.sqrt(m)) if m > 1 else math.nan for name, v in per.items()}
    if k < 3:
        return {"se_seeds": se_seeds, "se_students": None}
    reps = []
    for drop in range(k):
        b, v, g = (float(np.mean(a)) for a in _per_seed_bias_variance(t, np.delete(s, drop, axis=0)))
        kk = k - 1
        reps.append((b - v / (kk - 1), v * kk / (kk - 1), g))
    reps = np.asarray(reps)
    jack = np.sqrt((k - 1) / k * np.square(reps - reps.mean(0)).sum(0))
    return {"se_seeds": se_seeds,
            "se_students": dict(zip(("e_bias_sq", "e_var", "e_gen_sq_mean"), map(float, jack)))}


#: the four statements of the PFD paper's §4.3 (Fig. 5), in its words
STATEMENTS = {
    "u_shape": "at the largest N, E_gen is U-shaped across |θ| (Fig. 5a)",
    "n_reduces": "increasing N reduces both E_bias and E_var (Fig. 5b)",
    "var_grows": "increasing |θ| consistently increases E_var (Fig. 5b)",
    "bias_depends": "increasing |θ| decreases E_bias when N ≥ 2^15 but increases it when N ≤ 2^11 (Fig. 5b)",
}
#: a difference decides a statement when it is beyond this many standard errors
Z_DECIDE = 2.0


def _diff(cells: Dict[tuple, dict], a: tuple, b: tuple, key: str):
    """(value(b) − value(a), its s.e. over the students) of the unbiased ``key``; s.e. None at K = 2."""
    ca, cb = cells[a], cells[b]
    d = cb[key + "_unbiased"] - ca[key + "_unbiased"] if key != "e_gen_sq_mean" else cb[key] - ca[key]
    se = [c.get("se_students") for c in (ca, cb)]
    return d, (math.hypot(se[0][key], se[1][key]) if all(se) else None)


def _sign(d: float, se) -> int:
    """+1 / −1 beyond :data:`Z_DECIDE` standard errors, 0 within; None without a standard error."""
    if se is None:
        return None
    return 0 if abs(d) <= Z_DECIDE * se else (1 if d > 0 else -1)


def _fmt(d: float, se) -> str:
    return f"{d:+.3g}" + (f" ± {se:.2g}" if se is not None else " (no s.e.: K = 2)")


def _all(signs: Sequence, want: int) -> str:
    """holds when every sign is ``want``, fails when one is the opposite, else undecided."""
    if any(s is None for s in signs):
        return "undecided"
    if all(s == want for s in signs):
        return "holds"
    return "fails" if any(s == -want for s in signs) else "undecided"


def bias_variance_statements(cells: Sequence[dict]) -> List[dict]:
    """The four statements of :data:`STATEMENTS` on a sweep's cells (:func:`bias_variance_cell`
    dicts with ``n_params`` and ``n_train``): ``[{"key", "statement", "verdict", "numbers"}]``,
    verdict "holds" / "fails" / "undecided" / "not in this grid". Differences use the unbiased
    values and the students' jackknife standard error (K ≥ 3); a difference decides when beyond
    :data:`Z_DECIDE` s.e.; at K = 2 there is no such error and every verdict is "undecided"."""
    done = {(int(c["n_params"]), int(c["n_train"])): c for c in cells if "skipped" not in c}
    widths = sorted({p for p, _ in done})
    ns = sorted({n for _, n in done})
    out = []

    def row(key, verdict, numbers):
        out.append({"key": key, "statement": STATEMENTS[key], "verdict": verdict, "numbers": numbers})

    if len(widths) < 2 or len(ns) < 2:
        for key in STATEMENTS:
            row(key, "undecided", "fewer than 2 widths or 2 training-set sizes")
        return out
    top = ns[-1]
    line = [w for w in widths if (w, top) in done]
    g = [done[(w, top)]["e_gen_sq_mean"] for w in line]
    i = int(np.argmin(g))
    ends = [_diff(done, (line[i], top), (line[j], top), "e_gen_sq_mean") for j in (0, len(line) - 1)]
    signs = [_sign(d, se) for d, se in ends]
    numbers = (f"N = {top}: mean E_gen² by |θ| " + ", ".join(f"{v:.3g}" for v in g)
               + f"; smallest and largest |θ| minus the minimum: {_fmt(*ends[0])}, {_fmt(*ends[1])}")
    if None in signs:
        verdict = "undecided"
    elif 0 < i < len(line) - 1 and signs == [1, 1]:
        verdict = "holds"
    elif i in (0, len(line) - 1) and max(signs) == 1:
        verdict = "fails"  # the minimum at an end, the other end beyond it: monotone, no U
    else:
        verdict = "undecided"
    row("u_shape", verdict, numbers)
    per_width = [(w, *_diff(done, (w, ns[0]), (w, ns[-1]), key), key) for w in widths for key in ("e_bias_sq", "e_var")
                 if (w, ns[0]) in done and (w, ns[-1]) in done]
    row("n_reduces", _all([_sign(d, se) for _, d, se, _ in per_width], -1),
        f"N = {ns[0]} → {ns[-1]}: " + "; ".join(f"|θ| {w} {'E_bias²' if k == 'e_bias_sq' else 'E_var'} {_fmt(d, se)}"
                                              for w, d, se, k in per_width))
    per_n = [(n, *_diff(done, (widths[0], n), (widths[-1], n), "e_var")) for n in ns
             if (widths[0], n) in done and (widths[-1], n) in done]
    row("var_grows", _all([_sign(d, se) for _, d, se in per_n], 1),
        f"|θ| {widths[0]} → {widths[-1]}, E_var: " + "; ".join(f"N {n} {_fmt(d, se)}" for n, d, se in per_n))
    big = [(n, *_diff(done, (widths[0], n), (widths[-1], n), "e_bias_sq")) for n in ns if n >= 2 ** 15
           and (widths[0], n) in done and (widths[-1], n) in done]
    small = [(n, *_diff(done, (widths[0], n), (widths[-1], n), "e_bias_sq")) for n in ns if n <= 2 ** 11
             and (widths[0], n) in done and (widths[-1], n) in done]
    parts = [("N ≥ 2^15 (decreases)", big, -1), ("N ≤ 2^11 (increases)", small, 1)]
    verdicts = [_all([_sign(d, se) for _, d, se in cells_], want) if cells_ else "not in this grid"
                for _, cells_, want in parts]
    tested = [v for v in verdicts if v != "not in this grid"]
    verdict = ("not in this grid" if not tested else "fails" if "fails" in tested else
               "undecided" if "undecided" in tested else "holds")
    if verdict == "holds" and len(tested) < 2:
        verdict = "holds in part"
    row("bias_depends", verdict, f"|θ| {widths[0]} → {widths[-1]}, E_bias²: " + "; ".join(
        f"{name}: " + (", ".join(f"N {n} {_fmt(d, se)}" for n, d, se in c) if c else "none in this grid")
        + f" [{v}]" for (name, c, _), v in zip(parts, verdicts)))
    return out
