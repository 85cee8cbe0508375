"""A callback's checkpoint key."""
from __future__ import annotations

from typing import Any

__all__ = ["callback_state_key"]


def callback_state_key(callback: Any, **kwargs: Any) -> str:
    """``ClassName{kwargs!r}``: the key under which a callback's state is saved in a checkpoint.

    The same string as Lightning's own callbacks' keys (e.g. ``ModelCheckpoint.state_key``), so
    several instances of one class with different settings keep separate states and checkpoints
    written earlier keep loading."""
    return f"{type(callback).__qualname__}{kwargs!r}"
