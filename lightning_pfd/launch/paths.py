"""Config paths: the one place where a component's refusal gets the path the user writes
(``model.init_args.lr``, ``trainer.callbacks[ICRMonitor].tap``).

Library code raises a :class:`~lightning_pfd.errors.ConfigError` naming its own argument
(``lr``), or ``model.<arg>`` / ``data.<arg>`` for an argument of the model / datamodule it read;
the command line (:mod:`lightning_pfd.launch.cli`), the run checks and the sweep pre-flight
turn it into a config path here.
"""
from __future__ import annotations

import contextlib
import re
from typing import Optional

from ..errors import ConfigError

__all__ = ["config_path", "at_config_path", "callback_path", "logger_path", "refused_at", "check_callbacks",
           "nested_paths"]


#: a field that already names where it is set (a config path or an option)
_QUALIFIED = re.compile(r"(model|data|trainer|optimizer|lr_scheduler|ckpt_path|seed_everything|config)\b|--")
#: ``model.<arg>`` / ``data.<arg>``: an argument of the model / the datamodule that another
#: component read from them and refuses
_MODEL_OR_DATA_ARG = re.compile(r"(model|data)\.(?!init_args\.|class_path\b)")


def config_path(field: str, where: Optional[str] = None, entry=None) -> str:
    """The config path of a refused field, as the user writes it: the one place where a
    component's refusal gets its path. A class names its own argument (``lr``): ``where`` is the
    place of the component that refused it (``model.init_args``, ``data.init_args``,
    ``trainer.callbacks[Name]``) and ``entry`` its parsed config, where an argument of a class
    nested in it is found (``model.init_args.net.init_args.preset``). ``model.<arg>`` /
    ``data.<arg>`` (an argument of the model / datamodule that another component read) become
    ``model.init_args.<arg>`` / ``data.init_args.<arg>``; any other field that already names where
    it is set (a config path, an option) is kept."""
    m = _MODEL_OR_DATA_ARG.match(field)
    if m:
        return f"{m.group(1)}.init_args.{field[m.end():]}"
    if where is None or _QUALIFIED.match(field):
        return field
    head, dot, rest = field.partition(".")
    node = entry.as_dict() if hasattr(entry, "as_dict") else entry
    args = node.get("init_args") if isinstance(node, dict) else None
    if isinstance(args, dict) and head not in args:  # not its own: an argument of a nested class?
        nested = nested_paths(where, node, head)
        if len(nested) == 1:
            return nested[0] + dot + rest
    return f"{where}.{field}"


def at_config_path(error: ConfigError, where: Optional[str] = None, entry=None) -> ConfigError:
    """``error`` (in place: a MissingFileError stays one) under :func:`config_path`."""
    field = config_path(error.field, where, entry)
    return error if field == error.field else error.renamed(field)


def callback_path(callback, entry=None, arg: Optional[str] = None) -> str:
    """``trainer.callbacks[Name]`` (``.arg`` when given): ``Name`` is the short name of the
    class_path of the callback's config entry (a class, or a function returning a callback), else
    the configuration the callback was built as (a monitor's ``preset``), else its class."""
    return _listed_path("callbacks", callback, entry, arg)


def logger_path(logger, entry=None, arg: Optional[str] = None) -> str:
    """``trainer.logger[Name]`` (``.arg`` when given), named as :func:`callback_path` names a
    callback."""
    return _listed_path("logger", logger, entry, arg)


def _listed_path(where: str, obj, entry, arg: Optional[str]) -> str:
    class_path = entry.get("class_path") if hasattr(entry, "get") else None
    if class_path:
        name = str(class_path).rsplit(".", 1)[-1]
    else:
        name = "?" if obj is None else getattr(obj, "preset", None) or type(obj).__name__
    return f"trainer.{where}[{name}]" + (f".{arg}" if arg else "")


@contextlib.contextmanager
def refused_at(where: Optional[str], entry=None):
    """A ConfigError the block raises gets the config path of the component at ``where``."""
    try:
        yield
    except ConfigError as e:
        raise at_config_path(e, where, entry) from e.__cause__


def check_callbacks(trainer, model, datamodule, configured=()) -> None:
    """Every callback's ``check_setup(trainer, model, datamodule)``; a ConfigError it raises gets
    the callback's config path (:func:`callback_path`). ``configured``: ``(callback, config
    entry)`` for each callback built from the config."""
    entries = {id(cb): entry for cb, entry in configured}
    for cb in trainer.callbacks:
        check = getattr(cb, "check_setup", None)
        if callable(check):
            entry = entries.get(id(cb))
            with refused_at(callback_path(cb, entry), entry):
                check(trainer, model, datamodule)


def nested_paths(prefix: str, node, key: str) -> list:
    """The paths below ``prefix`` where a ``{class_path, init_args}`` block ``node`` (or one
    nested in its arguments) sets ``key``."""
    args = node.get("init_args") if isinstance(node, dict) else None
    if not isinstance(args, dict):
        return []
    found = []
    for name, value in args.items():
        here = f"{prefix}.{name}"
        if name == key:
            found.append(here)
        found += nested_paths(f"{here}.init_args", value, key)
    return found
