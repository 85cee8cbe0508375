"""The seeded-stream registry: disjoint ranges, every use registered, index bounds."""
import re
from pathlib import Path

import pytest
import torch

from lightning_pfd.diffusion import streams
from lightning_pfd.diffusion.levy import sample_alpha_stable
from lightning_pfd.diffusion.noise import seeded_noise, seeded_uniform
from lightning_pfd.diffusion.streams import STREAMS, StreamRange, alpha_stable_stream, stream

PKG = Path(streams.__file__).resolve().parents[1]


def test_registered_ranges_are_pairwise_disjoint():
    items = list(STREAMS.items())
    for i, (a, ra) in enumerate(items):
        for b, rb in items[i + 1:]:
            assert ra.stop <= rb.start or rb.stop <= ra.start, (a, b)
    streams.check_disjoint()


def test_check_disjoint_names_an_overlap():
    bad = {"a": StreamRange(0, 10, ""), "b": StreamRange(9, 1, "")}
    with pytest.raises(ValueError, match="'a'.*'b'"):
        streams.check_disjoint(bad)


def test_no_literal_stream_numbers_in_the_package():
    """Every ``stream=`` argument in the package comes from the registry (or is a parameter)."""
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name in ("noise.py", "streams.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"stream\s*=\s*[0-9][0-9_]*\s*[,)]", line) or re.search(r"_STREAM\s*=\s*[0-9]", line):
                offenders.append(f"{path.relative_to(PKG)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_index_bounds_and_unknown_names():
    assert stream("augment.params", 3) == STREAMS["augment.params"].start + 3
    with pytest.raises(ValueError, match="index"):
        stream("augment.params", STREAMS["augment.params"].width)
    with pytest.raises(ValueError, match="index"):
        stream("pf_ode.x_T", -1)
    with pytest.raises(KeyError, match="registered"):
        stream("no.such.stream")


def test_alpha_stable_draws_land_inside_their_range():
    r = STREAMS["levy.sampler"]
    for i in (0, 1, 57):
        k = alpha_stable_stream("levy.sampler", i)
        assert r.start <= 2 * k and 2 * k + 1 < r.stop
    # the Gaussian factor of draw k is seeded stream 2k + 1: check against seeded_noise directly
    k = alpha_stable_stream("levy.loss_eps")
    assert {2 * k, 2 * k + 1} <= set(range(STREAMS["levy.loss_eps"].start, STREAMS["levy.loss_eps"].stop))
    x = sample_alpha_stable(2.0, (5,), False, seeds=[3, 4], stream=k)  # alpha = 2: Gaussian only
    g = seeded_noise([3, 4], (5,), stream=2 * k + 1)
    assert torch.allclose(x.double() / g, (x.double() / g)[0, 0].expand_as(g), rtol=1e-5)


def test_former_collision_is_gone():
    """ICR's subset choice and the heavy-tailed data's white noise used the same stream (11)."""
    assert stream("icr.subset") != stream("data.heavy_tailed")
    a = seeded_uniform([0], 4, stream=stream("icr.subset"))
    b = seeded_uniform([0], 4, stream=stream("data.heavy_tailed"))
    assert not torch.equal(a, b)
