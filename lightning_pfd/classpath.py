"""``class_path`` strings of configs: the one loader of the package (pure Python).

A config names a class (or any attribute of a module) as ``"package.module.Name"``, the
``class_path`` form of jsonargparse / LightningCLI. Where the CLI's parser does not build the
object itself (a user metric of a monitor's ``metrics`` mapping, a sweep's trial configs, the
optimizer and LR schedule of a module), the package loads the name with :func:`import_class`.

A ``class_path`` is code: :func:`load_class` checks that the named object *is a class* and a
subclass of the declared type before anything can call it (a config naming ``os.system`` is
refused, never run). Importing the module part still executes that module's top level, as any
``import`` would; nothing in it is called by the loader.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from .errors import ConfigError

__all__ = ["import_class", "load_class", "declared_class", "instantiate"]


def import_class(path: str) -> Any:
    """The object ``Name`` of module ``package.module`` for ``path = "package.module.Name"``,
    imported now. Raises what the import raises: ``ImportError`` (no such module),
    ``AttributeError`` (no such name), ``ValueError`` (no module part, e.g. ``"Name"``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _names(base: Union[type, Tuple[type, ...]]) -> str:
    bases = base if isinstance(base, tuple) else (base,)
    return " or ".join(f"{b.__module__}.{b.__qualname__}" for b in bases)


def _factory_returns(obj: Any, base) -> bool:
    """Whether ``obj`` is a Python function whose return annotation is a ``base`` (jsonargparse's
    class_path to a function "returning the class", e.g. a preset monitor)."""
    import inspect
    import typing

    if not inspect.isfunction(obj):
        return False
    try:
        ret = typing.get_type_hints(obj).get("return")
    except Exception:
        return False
    return isinstance(ret, type) and issubclass(ret, base)


def load_class(path: Any, base: Union[type, Tuple[type, ...]], field: str,
               namespaces: Sequence[str] = (), factories: bool = False) -> Any:
    """The class named by ``path``, checked to be a subclass of ``base`` before it is returned.

    ``path`` is ``"package.module.Class"`` or, with ``namespaces`` (e.g. ``("torch.optim",)``),
    a bare name looked up in them (``"SGD"``); a class object is checked the same way. With
    ``factories``, a Python function annotated to return a ``base`` is accepted too (as
    jsonargparse accepts it). Anything else -- a builtin such as ``os.system``, a class that is
    not a ``base``, a name that cannot be imported -- is a :class:`ConfigError` naming ``field``:
    nothing named is called."""
    if isinstance(path, type):
        cls = path
    elif isinstance(path, str) and path.strip():
        cls = _import(path.strip(), field, namespaces)
    else:
        raise ConfigError(field, "must be a class path 'package.module.Class'", value=path,
                          accepted=f"a subclass of {_names(base)}")
    if factories and _factory_returns(cls, base):
        return cls
    if not isinstance(cls, type) or not issubclass(cls, base):
        what = "a class that is not" if isinstance(cls, type) else f"a {type(cls).__name__}, not a class:"
        raise ConfigError(field, f"names {what} a {_names(base)}", value=path,
                          accepted=f"a subclass of {_names(base)}")
    return cls


def _import(path: str, field: str, namespaces: Sequence[str]) -> Any:
    candidates = [path] if "." in path else [f"{ns}.{path}" for ns in namespaces]
    if not candidates:
        raise ConfigError(field, "expected a class path 'package.module.Class'", value=path)
    error = None
    for candidate in candidates:
        try:
            return import_class(candidate)
        except (ImportError, AttributeError, ValueError) as e:
            error = e
    raise ConfigError(field, f"cannot import it ({type(error).__name__}: {error})", value=path,
                      accepted="an importable package.module.Class") from None


#: annotations whose values are data, never built from a ``class_path`` mapping
_PLAIN = (object, str, int, float, bool, dict, list, tuple, set, bytes, type(None))


def declared_class(annotation: Any):
    """The class (or tuple of classes) an argument annotated ``annotation`` is built as, as
    jsonargparse does: a class type, or the class members of a Union / Optional; None for plain
    data (``Any``, ``dict``, numbers, no annotation), where a ``class_path`` stays a mapping."""
    import typing

    if annotation is typing.Any:  # a class from Python 3.11 on
        return None
    if isinstance(annotation, type):
        return None if annotation in _PLAIN else annotation
    if typing.get_origin(annotation) is typing.Union:
        members = tuple(a for a in typing.get_args(annotation)
                        if isinstance(a, type) and a not in _PLAIN and a is not typing.Any)
        return members or None
    return None


def _init_hints(cls: Any) -> dict:
    import typing

    try:
        return typing.get_type_hints(cls.__init__ if isinstance(cls, type) else cls)
    except Exception:  # an annotation that cannot be resolved: its argument is plain data
        return {}


def instantiate(spec: Any, base: Union[type, Tuple[type, ...], None], field: str = "class_path",
                short_names: Optional[dict] = None, net: Optional[Callable[[dict], Any]] = None) -> Any:
    """Build a ``{class_path, init_args}`` config (nested, lists too) where a class is declared.

    ``base`` is the declared class (or tuple) of ``spec``; below it, each argument is built as
    the class its annotation declares (:func:`declared_class`). The named class is checked to be
    a subclass of the declared one *before* it is called (:func:`load_class`); a mapping where no
    class is declared (``base`` None, an ``Any`` or ``dict`` argument: a user metric, an
    optimizer spec) is returned as the data it is, as LightningCLI's parser leaves it.
    ``short_names`` maps bare names to class paths; ``net``, when given, builds a ``net``
    argument that is a class config (e.g. on the meta device)."""
    if isinstance(spec, list):
        return [instantiate(s, base, field, short_names, net) for s in spec]
    if base is None or not (isinstance(spec, dict) and isinstance(spec.get("class_path"), str)):
        return spec
    path = (short_names or {}).get(spec["class_path"], spec["class_path"])
    cls = load_class(path, base, field, factories=True)
    hints = _init_hints(cls)
    args = {}
    for k, v in (spec.get("init_args") or {}).items():
        declared = declared_class(hints.get(k))
        if k == "net" and net is not None and declared is not None and isinstance(v, dict) and "class_path" in v:
            args[k] = net(v)
        else:
            args[k] = instantiate(v, declared, f"{k}.class_path", short_names, net)
    return cls(**args)
