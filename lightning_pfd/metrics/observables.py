"""Physical observables: one heavy-tailed scalar per field (PITE step 2; REFERENCE §13).

An observable maps a batch of fields (B, *shape) to float64 scalars (B,). They are pluggable:
register your own with ``@register_observable("name")`` and select it by name (configs,
``TailMonitor(observable="name", observable_kwargs={...})``).
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["OBSERVABLES", "register_observable", "get_observable", "field_max", "field_mean",
           "exceedance_fraction"]

OBSERVABLES: dict[str, Callable[..., torch.Tensor]] = {}


def register_observable(name: str):
    """Decorator adding ``fn(x, **kwargs) -> (B,)`` to the registry under ``name``."""
    def deco(fn):
        if name in OBSERVABLES and OBSERVABLES[name] is not fn:
            raise ValueError(f"observable: name {name!r} is already registered")
        OBSERVABLES[name] = fn
        return fn
    return deco


def _flat(x: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(f"x: need a non-empty batch of fields (B, ...), got shape {tuple(x.shape)}")
    return x.reshape(x.shape[0], -1).to(torch.float64)


@register_observable("max")
def field_max(x: torch.Tensor) -> torch.Tensor:
    """Spatial maximum of each field (the blog's observable: maximum precipitation)."""
    return _flat(x).amax(1)


@register_observable("mean")
def field_mean(x: torch.Tensor) -> torch.Tensor:
    """Spatial mean of each field."""
    return _flat(x).mean(1)


@register_observable("exceedance")
def exceedance_fraction(x: torch.Tensor, threshold: float = 10.0) -> torch.Tensor:
    """Fraction of the grid points of each field strictly above ``threshold``."""
    return (_flat(x) > float(threshold)).to(torch.float64).mean(1)


def get_observable(name: str, **kwargs) -> Callable[[torch.Tensor], torch.Tensor]:
    """The observable ``name`` with ``kwargs`` bound (e.g. ``get_observable('exceedance',
    threshold=25.0)``)."""
    if name not in OBSERVABLES:
        raise ValueError(f"observable: must be one of {sorted(OBSERVABLES)}, got {name!r}")
    fn = OBSERVABLES[name]
    if not kwargs:
        return fn
    return lambda x: fn(x, **kwargs)
