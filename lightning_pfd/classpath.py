"""``class_path`` strings of configs: the one loader of the package (pure Python).

A config names a class (or any attribute of a module) as ``"package.module.Name"``, the
``class_path`` form of jsonargparse / LightningCLI. Where the CLI's parser does not build the
object itself (a user metric of a monitor's ``metrics`` mapping, a sweep's trial configs), the
package loads the name with :func:`import_class`.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_class"]


def import_class(path: str) -> Any:
    """The object ``Name`` of module ``package.module`` for ``path = "package.module.Name"``,
    imported now. Raises what the import raises: ``ImportError`` (no such module),
    ``AttributeError`` (no such name), ``ValueError`` (no module part, e.g. ``"Name"``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
