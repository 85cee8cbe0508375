"""View augmentation levels on one-channel images (ICR paper App. B.6, "Aug.1".."Aug.5")."""
import itertools

import pytest
import torch

from lightning_pfd.diffusion.augment import AUG_LEVELS, augment, noisy_view


def _gray(b=16, h=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 1, h, h, generator=g) * 2 - 1


@pytest.mark.parametrize("size", [8, 16, 32])
def test_levels_give_pairwise_different_views_on_one_channel_data(size):
    """Same seeds, levels 1..5: every pair of levels gives a different batch of views."""
    x, seeds = _gray(16, size), torch.arange(100, 116)
    views = {lv: augment(x, seeds, level=lv) for lv in range(1, 6)}
    for a, b in itertools.combinations(range(1, 6), 2):
        assert not torch.allclose(views[a], views[b], atol=1e-4), (a, b)
    # each added step changes most rows (the flip only half of them: p = 1/2)
    for lv in (3, 4, 5):
        changed = [(views[lv][i] - views[lv - 1][i]).abs().max() > 1e-4 for i in range(16)]
        assert sum(changed) >= 15, lv
    assert torch.equal(augment(x, seeds, level=0), x)
    assert set(AUG_LEVELS) == {0, 1, 2, 3, 4, 5}


def test_one_channel_level3_is_brightness_then_contrast():
    """Level 3 on one channel = level 2, then brightness x k_b and contrast blend with the
    per-image mean (k_c), factors in [0.6, 1.4], on [0, 1] intensities, clamped."""
    x, seeds = _gray(64, 8, seed=3), torch.arange(64)
    l2, l3 = augment(x, seeds, level=2), augment(x, seeds, level=3)
    y2, y3 = (l2 + 1) / 2, (l3 + 1) / 2
    ks = []
    for i in range(64):
        # where nothing clamps, y3 = k_c k_b y2 + (1 - k_c) mean(k_b y2): affine in y2
        a = torch.stack([y2[i].flatten(), torch.ones(y2[i].numel())], 1)
        inside = (y3[i].flatten() > 1e-6) & (y3[i].flatten() < 1 - 1e-6) & (y2[i].flatten() * 1.4 < 1)
        coef = torch.linalg.lstsq(a[inside].double(), y3[i].flatten()[inside].double()[:, None]).solution
        ks.append(float(coef[0]))
        resid = a[inside].double() @ coef - y3[i].flatten()[inside].double()[:, None]
        assert float(resid.abs().max()) < 1e-5
    ks = torch.tensor(ks)
    assert 0.6 * 0.6 - 1e-6 <= ks.min() and ks.max() <= 1.4 * 1.4 + 1e-6
    assert ks.std() > 0.1  # random per image
    # reproducible and per-row seeded
    assert torch.equal(l3, augment(x, seeds, level=3))
    assert torch.allclose(augment(x[5:6], seeds[5:6], level=3), l3[5:6], atol=1e-6)


@pytest.mark.parametrize("shape, level, jitter", [((3, 8, 8), lv, 0.0) for lv in AUG_LEVELS]
                         + [((1, 8, 8), 3, 0.0), ((1, 8, 8), 5, 0.0), ((7,), 3, 0.3), ((7,), 3, 0.0)])
def test_a_stream_per_row_equals_one_call_per_sample(shape, level, jitter):
    """``stream`` (and noisy_view's ``view``) may be a tensor, one stream per row: how
    RepresentationEvaluation draws all views of a batch at once. Reference: one call per sample
    with its own integer stream -- bit for bit."""
    g = torch.Generator().manual_seed(level)
    x = torch.rand(12, *shape, generator=g) * 2 - 1
    seeds = torch.arange(500, 512) % 5  # repeated seeds with different streams, as in the views
    streams = torch.arange(12) // 2
    got = augment(x, seeds, level=level, stream=streams, vector_jitter=jitter)
    got_view = noisy_view(x, seeds, 0.4, level=level, view=streams, vector_jitter=jitter)
    for i in range(12):
        one = augment(x[i:i + 1], seeds[i:i + 1], level=level, stream=int(streams[i]), vector_jitter=jitter)
        assert torch.equal(got[i:i + 1], one), i
        one_view = noisy_view(x[i:i + 1], seeds[i:i + 1], 0.4, level=level, view=int(streams[i]),
                              vector_jitter=jitter)
        assert torch.equal(got_view[i:i + 1], one_view), i
    # the per-row stream matters: all rows on stream 0 give other views (noise always differs)
    assert not torch.equal(got_view, noisy_view(x, seeds, 0.4, level=level, view=0, vector_jitter=jitter))
    if level > 0 and (len(shape) == 3 or jitter > 0):
        assert not torch.equal(got, augment(x, seeds, level=level, stream=0, vector_jitter=jitter))
