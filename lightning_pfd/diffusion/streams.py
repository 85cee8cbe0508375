"""The registry of seeded random streams: one name per independent use of the seeded generators.

``seeded_noise`` / ``seeded_uniform`` (:mod:`lightning_pfd.diffusion.noise`) draw row i from
``(seeds[i], stream)`` only. Two uses of the *same* stream number with overlapping seeds draw the
*same* numbers -- e.g. if the ICR subset and the heavy-tailed data both used stream 11 with seed
0, the subset choice would be a function of the data's white noise. Every use therefore takes its
stream number from this table by name, and ``tests/test_streams.py`` checks that the ranges are
pairwise disjoint.

A :class:`StreamRange` is a half-open interval ``[start, start + width)`` of stream numbers: most
uses need one number, indexed families (augmentation views, sampler steps) need one per index.
:func:`stream` returns ``start + index`` after checking ``index < width``.

``sample_alpha_stable(stream=k)`` draws from the seeded streams 2k (uniforms of the sub-Gaussian
factor A) and 2k + 1 (the Gaussian factor), so its registered ranges are in those seeded numbers
and :func:`alpha_stable_stream` converts (the start of such a range is even).

Seed *ranges* are a separate matter: two monitors that use ``pf_ode.x_T`` with disjoint seed
offsets draw independent noise (the seed differs); the monitors document their offsets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

__all__ = ["StreamRange", "STREAMS", "stream", "alpha_stable_stream", "check_disjoint"]


@dataclass(frozen=True)
class StreamRange:
    """Stream numbers ``[start, start + width)`` reserved for one use (``doc`` says which)."""

    start: int
    width: int
    doc: str

    @property
    def stop(self) -> int:
        return self.start + self.width


STREAMS: Dict[str, StreamRange] = {
    "pf_ode.x_T": StreamRange(0, 1, "initial noise x_T of every Gaussian PF-ODE (PFD eq. 7)"),
    "loss.noise": StreamRange(1, 1, "frozen-noise loss: the noise n of eq. 10"),
    "loss.sigma": StreamRange(2, 1, "frozen-noise loss: the per-sample sigma (or t)"),
    "gmm.noise": StreamRange(7, 1, "exact GMM/Gaussian samplers: the Gaussian factor"),
    "gmm.component": StreamRange(8, 1, "exact GMM sampler: the mixture component"),
    "data.heavy_tailed": StreamRange(11, 1, "heavy-tailed random fields: white noise"),
    "augment.params": StreamRange(7_000, 1_000, "ICR augmentation parameters, one per view"),
    "icr_sweep.noise": StreamRange(8_000, 1, "icr-sweep: noise added to the fixed images"),
    "icr.projection": StreamRange(9_000, 1, "ICR: the fixed random feature projection"),
    "icr.subset": StreamRange(9_001, 1, "ICR: which training images form the fixed subset"),
    "augment.noise": StreamRange(1_007_000, 1_000, "ICR views: the diffusion noise, one per view"),
    "levy.loss_t": StreamRange(1_000_001, 1, "Levy-Ito frozen-noise loss: the time t"),
    "levy.loss_eps": StreamRange(2_000_004, 2, "Levy-Ito frozen-noise loss: alpha-stable noise"),
    "levy.sampler": StreamRange(3_000_000, 2 * 100_001,
                                "Levy-Ito sampler: x_T (index 0) and step i noise (index 1 + i)"),
}


def stream(name: str, index: int = 0) -> int:
    """The stream number of use ``name`` (``index`` within an indexed family)."""
    try:
        r = STREAMS[name]
    except KeyError:
        raise KeyError(f"unknown seeded stream {name!r}; registered: {sorted(STREAMS)}") from None
    index = int(index)
    if not 0 <= index < r.width:
        raise ValueError(f"stream {name!r}: index must be in [0, {r.width}), got {index}")
    return r.start + index


def alpha_stable_stream(name: str, index: int = 0) -> int:
    """The ``stream`` argument of ``sample_alpha_stable`` for draw ``index`` of use ``name``.

    ``sample_alpha_stable(stream=k)`` uses the seeded streams 2k and 2k + 1, so draw ``index``
    occupies ``start + 2 index`` and ``start + 2 index + 1`` of the registered range."""
    r = STREAMS[name]
    if r.start % 2:
        raise ValueError(f"stream {name!r}: an alpha-stable range must start at an even number")
    first = stream(name, 2 * int(index) + 1) - 1  # checks that both numbers are in range
    return first // 2


def check_disjoint(streams: Dict[str, StreamRange] = STREAMS) -> None:
    """Raise ``ValueError`` naming the first two overlapping ranges."""
    ordered = sorted(streams.items(), key=lambda kv: kv[1].start)
    for (a, ra), (b, rb) in zip(ordered, ordered[1:]):
        if rb.start < ra.stop:
            raise ValueError(f"seeded streams {a!r} [{ra.start}, {ra.stop}) and {b!r} "
                             f"[{rb.start}, {rb.stop}) overlap")
