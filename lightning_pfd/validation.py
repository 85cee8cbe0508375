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
  :func:`lightning_pfd.commands.fit.PFDLightningCLI.instantiate_classes`).

Arguments annotated with plain types (``float``, ``Sequence[float]``, a class) are not checked
here; their constraints that no type expresses (a relation between two arguments) stay in the
class's own checks.
"""
from __future__ import annotations

import inspect
import numbers
import typing
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Tuple

from jsonargparse import Namespace
from jsonargparse.typing import (ClosedUnitInterval, NonNegativeFloat, NonNegativeInt,
                                 OpenUnitInterval, PositiveFloat, PositiveInt,
                                 restricted_number_type)

from .errors import ConfigError

__all__ = ["PositiveFloat", "PositiveInt", "NonNegativeFloat", "NonNegativeInt",
           "ClosedUnitInterval", "OpenUnitInterval", "HalfOpenUnitInterval", "GreaterThanOne",
           "FinitePositiveFloat", "FiniteNonNegativeFloat", "StabilityIndex",
           "check_args", "describe", "plain_numbers"]

#: a number in [0, 1): an EMA decay, a quantile below the maximum
HalfOpenUnitInterval = restricted_number_type("HalfOpenUnitInterval", float, [(">=", 0), ("<", 1)])
#: a finite number > 0 (``inf`` and ``nan`` refused): a learning rate, a sigma
FinitePositiveFloat = restricted_number_type("FinitePositiveFloat", float, [(">", 0), ("<", float("inf"))])
#: a finite number >= 0
FiniteNonNegativeFloat = restricted_number_type("FiniteNonNegativeFloat", float,
                                                [(">=", 0), ("<", float("inf"))])
#: a number > 1: a ratio that must grow
GreaterThanOne = restricted_number_type("GreaterThanOne", float, (">", 1))
#: a number in (1, 2]: the stability index alpha of alpha-stable noise
StabilityIndex = restricted_number_type("StabilityIndex", float, [(">", 1), ("<=", 2)])

#: what each restricted type accepts, in words
_WORDS: Dict[type, str] = {
    PositiveFloat: "a number > 0", PositiveInt: "an integer > 0",
    NonNegativeFloat: "a number >= 0", NonNegativeInt: "an integer >= 0",
    ClosedUnitInterval: "a number in [0, 1]", OpenUnitInterval: "a number in (0, 1)",
    HalfOpenUnitInterval: "a number in [0, 1)", GreaterThanOne: "a number > 1",
    FinitePositiveFloat: "a finite number > 0", FiniteNonNegativeFloat: "a finite number >= 0",
    StabilityIndex: "a number in (1, 2]",
}
_RESTRICTED = tuple(_WORDS)


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


class ArgumentTypeError(ConfigError, TypeError):
    """A value of the wrong kind for its declared type: a ConfigError that is also a TypeError."""


def _hints(fn: Callable) -> Dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that cannot be resolved is simply not checked
        return {}


def check_args(fn: Callable, values: Mapping[str, Any], skip: Tuple[str, ...] = ()) -> None:
    """Check ``values`` (e.g. ``locals()`` at the top of ``__init__``) against the restricted
    types and ``Literal`` choices of ``fn``'s signature; raise a ConfigError naming the first
    argument that does not conform (a TypeError for a value of the wrong kind)."""
    hints = _hints(fn)
    for name in inspect.signature(fn).parameters:
        if name in skip or name not in values or name not in hints:
            continue
        value, annotation = values[name], hints[name]
        if _accepts(annotation, value) is False:
            cls = ArgumentTypeError if _kind_error(annotation, value) else ConfigError
            if typing.get_origin(annotation) is Literal:
                raise cls(name, "unknown value", value=value, accepted=list(typing.get_args(annotation)))
            raise cls(name, f"must be {describe(annotation)}", value=value)


def plain_numbers(value: Any) -> Any:
    """``value`` with every restricted number -- what jsonargparse makes of a value of a declared
    type, an instance of a subclass of int or float such as :data:`PositiveInt` -- turned into the
    plain int or float, through namespaces (in place), lists, tuples and dicts. The command line
    hands classes plain numbers, so their saved hyper-parameters, ``hparams.yaml`` and
    checkpoints hold plain numbers too."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return type(value)(plain_numbers(v) for v in value)
    if isinstance(value, dict):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, Namespace):
        for k, v in vars(value).items():
            setattr(value, k, plain_numbers(v))
    return value
