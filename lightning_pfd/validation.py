"""Argument types and ranges declared once, in the signature.

A class states what each argument accepts in its signature, with jsonargparse's restricted
types (:data:`PositiveFloat`, :data:`NonNegativeInt`, :data:`ClosedUnitInterval`, ...; more
ranges below) and ``typing.Literal``. Two checkers read the same declaration:

* the command line: jsonargparse (under LightningCLI) checks every config value against the
  signature while it parses, and names the field and the value
  (``Parser key "model.init_args.lr": ... -1 does not conform to restriction v>0``);
* a Python caller: :func:`check_args` (called first thing in ``__init__``) raises a
  :class:`~lightning_pfd.errors.ConfigError` -- a ``ValueError``, or ``TypeError`` for a value
  of the wrong kind -- naming the argument itself (``lr``), never a config path. The command
  line adds the path of the component that raised it (``model.init_args.lr``; see
  :func:`lightning_pfd.launch.cli.PFDLightningCLI.instantiate_classes`).

Arguments annotated with plain types (``float``, ``Sequence[float]``, a class) are not checked
here; their constraints that no type expresses (a relation between two arguments) stay in the
class's own checks.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import os
import typing
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Tuple

from jsonargparse.typing import (ClosedUnitInterval, NonNegativeFloat, NonNegativeInt,
                                 OpenUnitInterval, PositiveFloat, PositiveInt,
                                 restricted_number_type)

from .errors import ConfigError

__all__ = ["PositiveFloat", "PositiveInt", "NonNegativeFloat", "NonNegativeInt",
           "ClosedUnitInterval", "OpenUnitInterval", "HalfOpenUnitInterval", "GreaterThanOne",
           "FinitePositiveFloat", "FiniteNonNegativeFloat", "IntAtLeastTwo", "StabilityIndex",
           "check_args", "describe", "plain_numbers", "ranged", "check_memory", "physical_memory"]

#: what each restricted type accepts, in words
_WORDS: Dict[type, str] = {
    PositiveFloat: "a number > 0", PositiveInt: "an integer > 0",
    NonNegativeFloat: "a number >= 0", NonNegativeInt: "an integer >= 0",
    ClosedUnitInterval: "a number in [0, 1]", OpenUnitInterval: "a number in (0, 1)",
}
#: the types :func:`ranged` made, by (base, restrictions)
_RANGED: Dict[tuple, type] = {}


def _restriction_key(restrictions: Any) -> tuple:
    pairs = [restrictions] if isinstance(restrictions, tuple) and isinstance(restrictions[0], str) \
        else list(restrictions)
    return tuple(sorted((str(op), float(v)) for op, v in pairs))


def ranged(name: str, base: type, restrictions: Any, words: str) -> type:
    """A restricted number type for a range the types above do not cover, with that range in
    words for :func:`describe` and the errors (``ranged("Octaves", float, [(">=", 0), ("<=", 4)],
    "a number in [0, 4]")``); ``restrictions`` as jsonargparse's ``restricted_number_type``.
    jsonargparse registers one type per range, so declaring a range twice returns the first type."""
    key = (base, _restriction_key(restrictions))
    if key in _RANGED:
        return _RANGED[key]
    kind = restricted_number_type(name, base, restrictions)
    _WORDS.setdefault(kind, words)
    _RANGED[key] = kind
    return kind


#: a number in [0, 1): an EMA decay, a quantile below the maximum
HalfOpenUnitInterval = ranged("HalfOpenUnitInterval", float, [(">=", 0), ("<", 1)], "a number in [0, 1)")
#: a finite number > 0 (``inf`` and ``nan`` refused): a learning rate, a sigma
FinitePositiveFloat = ranged("FinitePositiveFloat", float, [(">", 0), ("<", float("inf"))],
                             "a finite number > 0")
#: a finite number >= 0
FiniteNonNegativeFloat = ranged("FiniteNonNegativeFloat", float, [(">=", 0), ("<", float("inf"))],
                                "a finite number >= 0")
#: an integer >= 2: a sample count a split or a nearest-neighbour ratio needs
IntAtLeastTwo = ranged("IntAtLeastTwo", int, (">=", 2), "an integer >= 2")
#: a number > 1: a ratio that must grow
GreaterThanOne = ranged("GreaterThanOne", float, (">", 1), "a number > 1")
#: a number in (1, 2]: the stability index alpha of alpha-stable noise
StabilityIndex = ranged("StabilityIndex", float, [(">", 1), ("<=", 2)], "a number in (1, 2]")


def describe(annotation: Any) -> str:
    """What ``annotation`` accepts, in words (``"a number > 0"``, ``"one of ['heun', 'euler']"``)."""
    if annotation in _WORDS:
        return _WORDS[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is typing.Union:
        parts = [("None" if a is type(None) else describe(a)) for a in args]
        return " or ".join(parts)
    return getattr(annotation, "__name__", str(annotation))


def _is_number(value: Any, integral: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) if integral else True


def _accepts(annotation: Any, value: Any) -> Optional[bool]:
    """True / False when ``annotation`` is one this module checks; None when it is not."""
    if annotation in _WORDS:
        integral = issubclass(annotation, int)
        if not _is_number(value, integral):
            return False
        try:
            annotation(value)
        except ValueError:
            return False
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is typing.Union:
        if value is None:
            return type(None) in args
        verdicts = [_accepts(a, value) for a in args if a is not type(None)]
        if any(v is True for v in verdicts):
            return True
        if any(v is None for v in verdicts):
            return None  # an unchecked member may accept it
        return False
    return None


def _kind_error(annotation: Any, value: Any) -> bool:
    """Whether a refused value is of the wrong kind (TypeError) rather than out of range."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if typing.get_origin(annotation) is typing.Union else [annotation]
    for a in members:
        if a in _WORDS and _is_number(value, issubclass(a, int)):
            return False
        if typing.get_origin(a) is Literal and any(type(value) is type(x) for x in typing.get_args(a)):
            return False
    return True


def plain_numbers(value: Any) -> Any:
    """``value`` with every restricted number jsonargparse parsed (a ``PositiveInt(16)``, an
    ``int`` subclass) turned into the plain ``int`` / ``float`` it equals, in place through
    namespaces, dicts and lists: so saved hyperparameters, checkpoints (loaded with
    ``weights_only=True``) and YAML dumps hold only built-in numbers."""
    cls = type(value)
    if isinstance(value, (int, float)) and cls not in (int, float, bool) \
            and cls.__module__ == "jsonargparse.typing":
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, dict):
        for k, v in value.items():
            value[k] = plain_numbers(v)
    elif isinstance(value, list):
        value[:] = [plain_numbers(v) for v in value]
    elif isinstance(value, tuple):
        return type(value)(plain_numbers(v) for v in value) if cls is tuple else value
    elif hasattr(value, "__dict__") and cls.__name__ == "Namespace":
        for k, v in vars(value).items():
            setattr(value, k, plain_numbers(v))
    return value


class ArgumentTypeError(ConfigError, TypeError):
    """A value of the wrong kind for its declared type: a ConfigError that is also a TypeError."""


def _hints(fn: Callable) -> Dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that cannot be resolved is simply not checked
        return {}


@functools.lru_cache(maxsize=None)
def _declared(fn: Callable) -> Tuple[Tuple[str, Any], ...]:
    """``(name, annotation)`` of ``fn``'s parameters, in order (resolved once per function:
    :func:`check_args` runs on every call of a hot function)."""
    hints = _hints(fn)
    return tuple((name, hints[name]) for name in inspect.signature(fn).parameters if name in hints)


def check_args(fn: Callable, values: Mapping[str, Any], skip: Tuple[str, ...] = ()) -> None:
    """Check ``values`` (e.g. ``locals()`` at the top of ``__init__``) against the restricted
    types and ``Literal`` choices of ``fn``'s signature; raise a ConfigError naming the first
    argument that does not conform (a TypeError for a value of the wrong kind)."""
    for name, annotation in _declared(fn):
        if name in skip or name not in values:
            continue
        value = values[name]
        if _accepts(annotation, value) is False:
            cls = ArgumentTypeError if _kind_error(annotation, value) else ConfigError
            if typing.get_origin(annotation) is Literal:
                raise cls(name, "unknown value", value=value, accepted=list(typing.get_args(annotation)))
            raise cls(name, f"must be {describe(annotation)}", value=value)



#: a measurement may hold at most this share of the machine's physical memory at once
MEMORY_SHARE = 0.5


def physical_memory() -> Optional[int]:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not POSIX
        return None


def check_memory(name: str, value: Any, nbytes: float, what: str) -> None:
    """Refuse ``value`` of argument ``name`` before any work when what it makes one process hold
    at once (``nbytes``, an estimate described by ``what``) exceeds :data:`MEMORY_SHARE` of the
    machine's physical memory: a ConfigError naming the estimate and the limit."""
    total = physical_memory()
    if total is None or nbytes <= MEMORY_SHARE * total:
        return
    gib = 2.0 ** 30
    raise ConfigError(name, f"needs about {nbytes / gib:,.1f} GiB of memory at once ({what}), more "
                      f"than {MEMORY_SHARE:.0%} of this machine's {total / gib:,.1f} GiB",
                      value=value, suggestion=f"lower {name} (the estimate grows linearly with it)")
