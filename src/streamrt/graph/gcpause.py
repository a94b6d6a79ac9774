"""Pausing the cyclic garbage collector around bulk work that makes many long-lived objects.

Building, capturing, cloning or instantiating a large graph makes a few objects per node that all
survive: every full collection then walks all of them again, so with the collector on the
per-node cost grows with the graph. A pause switches automatic collection off meanwhile.

State and invariants: ``_depth`` counts the pauses in progress (nested, any thread), under
``_lock``; ``_owned`` is True when the outermost pause switched the collector off, and only then
does the end of the last pause switch it on again: a collector that was off when the first pause
began stays off. A pause ends on every path, errors included (``paused`` is a context manager).
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

__all__ = ["paused", "pause", "resume"]

_lock = threading.Lock()
_depth = 0
_owned = False


def pause() -> None:
    """Begin a pause (nested-safe); each call needs one :func:`resume`."""
    global _depth, _owned
    with _lock:
        if _depth == 0:
            _owned = gc.isenabled()
            if _owned:
                gc.disable()
        _depth += 1


def resume() -> None:
    """End a pause; the last one switches the collector on again if the first switched it off."""
    global _depth, _owned
    with _lock:
        assert _depth > 0, "resume() without pause()"
        _depth -= 1
        if _depth == 0 and _owned:
            _owned = False
            gc.enable()


class paused:  # noqa: N801 - used like a function: ``with paused():``
    """``with paused():`` pauses automatic collection for the block, errors included."""

    __slots__ = ()

    def __enter__(self) -> None:
        pause()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        resume()
