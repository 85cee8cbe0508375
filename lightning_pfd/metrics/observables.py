"""Physical observables: one heavy-tailed scalar per field (step 2 of the PITE strategy in the
blog post "A Physically Interpretable Evaluation Strategy" for heavy-tailed diffusion models:
reduce each generated field to a physically meaningful scalar, e.g. its maximum precipitation).

An observable maps a batch of fields (B, *shape) to float64 scalars (B,). Every built-in one is
a reduction of the shared primitive :func:`flatten_fields` ((B, *shape) -> (B, D) float64), so
all of them accept the same inputs and refuse the same bad ones. They are pluggable: register
your own with ``@register_observable("name")`` and select it by name (configs,
``TailMonitor(observable="name", observable_kwargs={...})``, ``TailEvaluation``).
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from ..errors import ConfigError, did_you_mean

__all__ = ["OBSERVABLES", "register_observable", "get_observable", "flatten_fields", "field_max",
           "field_mean", "exceedance_fraction"]

OBSERVABLES: dict[str, Callable[..., torch.Tensor]] = {}


def register_observable(name: str):
    """Decorator adding ``fn(x, **kwargs) -> (B,)`` to the registry under ``name`` (a non-empty
    string without ':', which separates keyword arguments on pite's command line)."""
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise ConfigError("observable", "a registered name is a non-empty string without ':' "
                          "or surrounding spaces", value=name)

    def deco(fn):
        if name in OBSERVABLES and OBSERVABLES[name] is not fn:
            raise ConfigError("observable", f"the name {name!r} is already registered", value=name,
                              suggestion="register your observable under another name")
        OBSERVABLES[name] = fn
        return fn
    return deco


def flatten_fields(x: torch.Tensor) -> torch.Tensor:
    """The shared primitive of the observables: a non-empty batch (B, *shape) as (B, D) float64."""
    x = torch.as_tensor(x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ConfigError("x", "need a non-empty batch of fields (B, ...)", value=tuple(x.shape))
    return x.reshape(x.shape[0], -1).to(torch.float64)


@register_observable("max")
def field_max(x: torch.Tensor) -> torch.Tensor:
    """Spatial maximum of each field (the blog's observable: maximum precipitation)."""
    return flatten_fields(x).amax(1)


@register_observable("mean")
def field_mean(x: torch.Tensor) -> torch.Tensor:
    """Spatial mean of each field."""
    return flatten_fields(x).mean(1)


@register_observable("exceedance")
def exceedance_fraction(x: torch.Tensor, threshold: float = 10.0) -> torch.Tensor:
    """Fraction of the grid points of each field strictly above ``threshold``."""
    return (flatten_fields(x) > float(threshold)).to(torch.float64).mean(1)


def get_observable(name: str, **kwargs) -> Callable[[torch.Tensor], torch.Tensor]:
    """The observable ``name`` with ``kwargs`` bound (e.g. ``get_observable('exceedance',
    threshold=25.0)``). Unknown names and keyword arguments the observable does not take raise
    ConfigError here, before any data is seen."""
    if name not in OBSERVABLES:
        raise ConfigError("observable", "unknown observable", value=name, accepted=sorted(OBSERVABLES),
                          suggestion=None if did_you_mean(name, OBSERVABLES) else
                          "register your own with lightning_pfd.metrics.observables.register_observable")
    fn = OBSERVABLES[name]
    if not kwargs:
        return fn
    try:
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as e:
        raise ConfigError("observable_kwargs", f"observable {name!r} does not take these keyword "
                          f"arguments ({e})", value=dict(kwargs),
                          accepted=list(inspect.signature(fn).parameters)[1:]) from None
    except ValueError:  # no signature (a builtin): let the call decide
        pass
    return lambda x: fn(x, **kwargs)
