"""Reading weak collections that other threads change while we read them."""

from __future__ import annotations

import weakref
from typing import TypeVar

__all__ = ["members"]

_T = TypeVar("_T")


def members(ws: weakref.WeakSet[_T] | None) -> list[_T]:
    """The live members of ``ws`` (none for None), read at once. Iterating a WeakSet runs Python
    code between items, where another thread may add or discard a member (a stream or pool
    created or destroyed): "RuntimeError: Set changed size during iteration". Copying its set of
    references is one C call, which no other thread interrupts."""
    if ws is None:
        return []
    return [x for r in list(ws.data) if (x := r()) is not None]
