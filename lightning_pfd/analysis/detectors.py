"""Event detectors of your own: the plug-in point of the event analysis (docs/extending.md,
"An event detector of your own").

A detector is a function of one logged curve::

    @register_detector("plateau", keys=("pfd/e_gen",))
    def detect_plateau(epochs, values, *, units=None, window=5, min_sigma=2.5, min_rel=0.0,
                       confirm=3, **_) -> Optional[Event]: ...

returning an :class:`~lightning_pfd.analysis.events.Event` (its ``name`` is replaced by
``<key slug>_<detector>``) or None. ``units`` is the curve's per-unit record
(:class:`~lightning_pfd.analysis.per_unit.UnitSeries`) when the metric logs one, for a held-out
test; the other keywords are the run's detector settings. It runs on the curves of ``keys``
(built-in keys such as ``pfd/e_gen`` or a user metric's) and on every key that names it in its
``detectors`` (registering makes the name acceptable there: ``MetricKey(...,
detectors=("plateau",))`` or a metric class's ``detectors = ("plateau",)``), in
:func:`~lightning_pfd.analysis.events.analyze_history`: live (RegimeMonitor) and in
``python -m lightning_pfd report``.

A run names the modules that register its detectors in ``RegimeMonitor(detector_modules=[...])``
(one config block); they are imported when the monitor is built and saved with the run's detector
settings. ``report`` never imports a module because a results file names it: it runs them when
given ``--detector-modules`` (and says which ones the run used otherwise).
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional, Sequence

from .. import keys as keys_registry
from ..errors import ConfigError

__all__ = ["register_detector", "unregister_detector", "get_detector", "detectors_for",
           "registered_detectors", "import_detector_modules"]

_REGISTRY: Dict[str, Callable] = {}
_KEYS: Dict[str, tuple] = {}


def register_detector(name: str, keys: Sequence[str] = ()) -> Callable[[Callable], Callable]:
    """Decorator registering a user event detector under ``name``, run on the curves of ``keys``
    and of every key that declares it (module docstring). A built-in name, a name taken by another
    function, a non-callable or a key that is not a metric name is a ConfigError."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    for k in keys:
        keys_registry.MetricKey(k)  # a ConfigError for a malformed name

    def wrap(fn: Callable) -> Callable:
        if not callable(fn):
            raise ConfigError("detector", "must be a function of (epochs, values, *, units, ...)", value=fn)
        where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        keys_registry.register_detector_name(name, where)
        _REGISTRY[name], _KEYS[name] = fn, keys
        fn.__lightning_pfd_detector__ = name
        return fn
    return wrap


def unregister_detector(name: str) -> None:
    """Forget the user detector ``name`` (a notebook redefining it, a test cleaning up)."""
    _REGISTRY.pop(name, None)
    _KEYS.pop(name, None)
    keys_registry.unregister_detector_name(name)


def detectors_for(key: str) -> list:
    """The registered detectors that watch ``key`` through their ``keys``."""
    return [n for n, ks in _KEYS.items() if key in ks]


def get_detector(name: str) -> Optional[Callable]:
    """The registered detector ``name``, or None."""
    return _REGISTRY.get(name)


def registered_detectors() -> Dict[str, str]:
    """{name: module.function} of the registered user detectors."""
    return {n: f"{fn.__module__}.{fn.__qualname__}" for n, fn in sorted(_REGISTRY.items())}


def import_detector_modules(modules: Sequence[str], field: str = "detector_modules") -> list:
    """Import each module of ``modules`` (whose import registers detectors); a module that cannot
    be imported, or that registers none, is a ConfigError naming ``field``. Returns the names."""
    if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
        raise ConfigError(field, "must be a list of module names", value=modules,
                          accepted="e.g. [my_detectors]")
    for m in modules:
        before = dict(_REGISTRY)
        try:
            mod = importlib.import_module(m)
        except ImportError as e:
            raise ConfigError(field, f"cannot import {m!r}: {e}", value=m,
                              suggestion="put the module on PYTHONPATH (or next to the config)") from None
        mine = [n for n, fn in _REGISTRY.items() if getattr(fn, "__module__", None) == mod.__name__]
        if not mine and _REGISTRY == before:
            raise ConfigError(field, f"{m!r} registers no event detector", value=m,
                              suggestion="decorate its detector with @lightning_pfd.analysis.register_detector(name)")
    return list(modules)
