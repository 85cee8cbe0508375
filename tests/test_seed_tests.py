"""Exact seed-comparison tests (lightning_pfd.metrics.seed_tests) against scipy.stats."""
import math

import numpy as np
import pytest
from scipy import stats

from lightning_pfd.metrics.seed_tests import (compare, hodges_lehmann_ratio, holm, prob_superiority,
                                              rank_sum_test, sign_flip_test)


def _exact_perm(data, statistic, kind):
    return stats.permutation_test(data, statistic, permutation_type=kind, n_resamples=np.inf,
                                  alternative="two-sided")


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_matches_scipy_permutation_test(seed):
    """Two-sided and one-sided p of the sign-flip test = scipy's exact paired permutation test
    (statistic: sum of the differences), random and tied differences, n = 5 and 7."""
    rng = np.random.default_rng(seed)
    for n in (5, 7):
        x = rng.lognormal(0.3, 1.0, n)
        y = rng.lognormal(0.0, 1.0, n)
        if seed == 3:
            y[:2] = x[:2] * 2.0  # equal log ratios: ties in |d|
        d = np.log(x) - np.log(y)
        got = sign_flip_test(d)
        want = _exact_perm((d, np.zeros(n)), lambda a, b: np.sum(a - b), "samples")
        assert got["p"] == pytest.approx(want.pvalue, rel=1e-12)
        less = stats.permutation_test((d, np.zeros(n)), lambda a, b: np.sum(a - b),
                                      permutation_type="samples", n_resamples=np.inf, alternative="less")
        assert got["p_less"] == pytest.approx(less.pvalue, rel=1e-12)
    all_neg = sign_flip_test([-1.0, -2.0, -0.5, -3.0, -1.5])
    assert all_neg["p"] == pytest.approx(2 / 32) and all_neg["p_less"] == pytest.approx(1 / 32)


@pytest.mark.parametrize("seed", range(4))
def test_rank_sum_matches_scipy_mann_whitney(seed):
    """Without ties: U and the exact two-/one-sided p = scipy.stats.mannwhitneyu(method="exact");
    with ties: = scipy's exact permutation test of the rank sum (mid-ranks)."""
    rng = np.random.default_rng(10 + seed)
    for n, m in ((5, 5), (4, 6), (3, 5)):
        x, y = rng.normal(0.0, 1.0, n), rng.normal(0.8, 1.0, m)
        got = rank_sum_test(x, y)
        want = stats.mannwhitneyu(x, y, method="exact", alternative="two-sided")
        assert got["U"] == want.statistic and got["p"] == pytest.approx(want.pvalue, rel=1e-12)
        less = stats.mannwhitneyu(x, y, method="exact", alternative="less")
        assert got["p_less"] == pytest.approx(less.pvalue, rel=1e-12)
    x, y = np.array([1.0, 2.0, 2.0, 3.0, 5.0]), np.array([2.0, 3.0, 4.0, 4.0, 6.0])

    def ranksum(a, b):
        return stats.rankdata(np.concatenate([a, b]))[: len(a)].sum()

    want = _exact_perm((x, y), ranksum, "independent")
    assert rank_sum_test(x, y)["p"] == pytest.approx(want.pvalue, rel=1e-12)
    assert rank_sum_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])["p"] == pytest.approx(2 / 252)


def test_effect_sizes_and_holm_against_brute_force_and_scipy():
    x, y = [1.0, 4.0, 2.0, 8.0], [3.0, 4.0, 16.0]
    pairs = [(a, b) for a in x for b in y]
    assert prob_superiority(x, y) == pytest.approx(
        (sum(a < b for a, b in pairs) + 0.5 * sum(a == b for a, b in pairs)) / len(pairs))
    u = stats.mannwhitneyu(x, y).statistic  # U of x = # (x > y) + ties / 2
    assert prob_superiority(x, y) == pytest.approx(1 - u / 12)
    assert hodges_lehmann_ratio(x, y) == pytest.approx(math.exp(np.median([math.log(a / b) for a, b in pairs])))
    assert hodges_lehmann_ratio([2.0, 8.0, 1.0], [1.0, 2.0, 4.0], paired=True) == pytest.approx(2.0)
    assert math.isnan(hodges_lehmann_ratio([0.0, 1.0], [1.0, 2.0]))
    p = [0.01, 0.04, float("nan"), 0.03, 0.2]
    adj = holm(p)
    # Holm: sorted 0.01, 0.03, 0.04, 0.2 with k = 4 -> 0.04, 0.09, 0.09 (monotone), 0.2
    assert adj[0] == pytest.approx(0.04) and adj[3] == pytest.approx(0.09)
    assert adj[1] == pytest.approx(0.09) and adj[4] == pytest.approx(0.2) and math.isnan(adj[2])


def test_compare_verdicts_follow_the_test():
    """holds / reversed need p < level in the claimed / opposite direction; the design picks the
    test; separated 5 vs 5 seeds give p = 2/252 unpaired, at best 2/32 paired (undecided at 0.05)."""
    lo, hi = [1.0, 2.0, 1.5, 1.2, 1.8], [5.0, 7.0, 6.0, 9.0, 8.0]
    c = compare(lo, hi)
    assert c["verdict"] == "holds" and c["p"] == pytest.approx(2 / 252) and c["prob_better"] == 1.0
    assert c["p_other"] == pytest.approx(2 / 32) and c["ratio"] < 1
    assert compare(hi, lo)["verdict"] == "reversed"
    cp = compare(lo, hi, design="paired")
    assert cp["verdict"] == "undecided" and cp["p"] == pytest.approx(2 / 32)
    assert compare(lo, hi, design="paired", level=0.1)["verdict"] == "holds"
    mixed = compare([1.0, 5.0, 2.0, 7.0, 3.0], [2.5, 6.0, 1.5, 4.0, 8.0])
    assert mixed["verdict"] == "undecided" and mixed["p"] > 0.3
    assert compare([1.0, float("nan")], [2.0, 3.0])["verdict"] == "undecided"
    for kw, field in ((dict(design="pairs"), "design"), (dict(level=1.5), "level")):
        with pytest.raises(ValueError, match=field):
            compare(lo, hi, **kw)
    with pytest.raises(ValueError, match="paired"):
        compare([1.0, 2.0], [3.0], design="paired")
