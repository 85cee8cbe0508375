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
from typing import Any, Sequence, Tuple, Union

from .errors import ConfigError

__all__ = ["import_class", "load_class"]


def import_class(path: str) -> Any:
    """The object ``Name`` of module ``package.module`` for ``path = "package.module.Name"``,
    imported now. Raises what the import raises: ``ImportError`` (no such module),
    ``AttributeError`` (no such name), ``ValueError`` (no module part, e.g. ``"Name"``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _names(base: Union[type, Tuple[type, ...]]) -> str:
    bases = base if isinstance(base, tuple) else (base,)
    return " or ".join(f"{b.__module__}.{b.__qualname__}" for b in bases)


def load_class(path: Any, base: Union[type, Tuple[type, ...]], field: str,
               namespaces: Sequence[str] = ()) -> type:
    """The class named by ``path``, checked to be a subclass of ``base`` before it is returned.

    ``path`` is ``"package.module.Class"`` or, with ``namespaces`` (e.g. ``("torch.optim",)``),
    a bare name looked up in them (``"SGD"``); a class object is checked the same way. Anything
    else, a class that is not a ``base``, or a name that cannot be imported, is a
    :class:`ConfigError` naming ``field``: nothing named is called."""
    if isinstance(path, type):
        cls = path
    elif isinstance(path, str) and path.strip():
        cls = _import(path.strip(), field, namespaces)
    else:
        raise ConfigError(field, "must be a class path 'package.module.Class'", value=path,
                          accepted=f"a subclass of {_names(base)}")
    if not isinstance(cls, type) or not issubclass(cls, base):
        what = "a class" if isinstance(cls, type) else f"a {type(cls).__name__}, not a class"
        raise ConfigError(field, f"names {what} that is not a {_names(base)}", value=path,
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
