"""Pausing the cyclic garbage collector around bulk work that makes many long-lived objects.

Building, capturing, cloning or instantiating a large graph makes a few objects per node that all
survive: every full collection then walks all of them again, so with the collector on the
per-node cost grows with the graph. A pause switches automatic collection off meanwhile: the
first generation's threshold is 0 (CPython's own "no automatic collection"), and the switch
``gc.enable``/``gc.disable`` is left to the program (``gc.collect`` still collects).

State and invariants: ``_depth`` counts the pauses in progress (nested, any thread), under
``_lock``; ``_owned`` holds the thresholds the outermost pause replaced (None when it replaced
none: the collector was off, or automatic collection was already off), and only then does the
end of the last pause put them back, unless the program set thresholds of its own meanwhile. A
pause ends on every path, errors included (``paused`` is a context manager).

Building node by node (``Graph._add``, explicit or captured) has no end to hang a pause on, so
it takes a *lease* (``building``): one pause that a watcher thread ends as soon as fewer than
``DENSE`` nodes were added in ``QUIET`` seconds (the bulk stopped, or it is too slow for the
collector to matter; automatic collection then runs as usual). ``_leased``: a lease is held;
``_ticks`` counts adds (read by the watcher only to see change); a new lease starts only after
``BULK`` adds since the last one ended, so a slow builder never runs long without collection.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from types import TracebackType

__all__ = ["paused", "pause", "resume", "building", "BULK"]

BULK = 512  # nodes of one graph before its building counts as bulk (and adds between leases)
DENSE = 256  # adds per QUIET seconds that keep a lease
QUIET = 0.05

_lock = threading.Lock()
_depth = 0
_owned: tuple[int, ...] | None = None
_leased = False
_ticks = 0
_next = 0  # _ticks from which a new lease may start


def pause() -> None:
    """Begin a pause (nested-safe); each call needs one :func:`resume`."""
    global _depth, _owned
    with _lock:
        if _depth == 0:
            was = gc.get_threshold()
            _owned = None
            if gc.isenabled() and was[0]:
                _owned = was
                gc.set_threshold(0, *was[1:])
        _depth += 1


def resume() -> None:
    """End a pause; the last one puts the thresholds the first one replaced back."""
    global _depth, _owned
    with _lock:
        assert _depth > 0, "resume() without pause()"
        _depth -= 1
        if _depth == 0 and _owned is not None:
            now = gc.get_threshold()
            if now[0] == 0:  # else the program set thresholds of its own: they stay
                gc.set_threshold(_owned[0], *now[1:])
            _owned = None


class paused:  # noqa: N801 - used like a function: ``with paused():``
    """``with paused():`` pauses automatic collection for the block, errors included."""

    __slots__ = ()

    def __enter__(self) -> None:
        pause()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        resume()


def building() -> None:
    """One node added to a graph of at least ``BULK`` nodes: keep (or take) the building lease."""
    global _ticks, _leased
    _ticks += 1  # unlocked: a lost increment only delays the watcher's verdict
    if _leased or _ticks < _next:
        return
    with _lock:
        if _leased:
            return
        _leased = True
    pause()
    try:
        threading.Thread(target=_watch, name="streamrt-gc-lease", daemon=True).start()
    except RuntimeError:  # no thread (at exit, or out of threads): no lease, nothing else
        with _lock:
            _leased = False
        resume()


def _watch() -> None:
    """The lease's watcher: ends the pause once adds slow down below ``DENSE`` per ``QUIET``."""
    global _leased, _next
    seen = _ticks
    while True:
        time.sleep(QUIET)
        with _lock:
            now = _ticks
            if now - seen < DENSE:
                _leased = False
                _next = now + BULK
                break
            seen = now
    resume()


def _after_fork() -> None:
    """A forked child has none of the parent's threads: no pause of theirs (nor the lease's
    watcher) will ever end there, so the child starts with none in force."""
    global _lock, _depth, _owned, _leased, _next
    _lock = threading.Lock()
    owned, _depth, _owned, _leased, _next = _owned, 0, None, False, _ticks
    if owned is not None and gc.get_threshold()[0] == 0:
        gc.set_threshold(owned[0], *gc.get_threshold()[1:])


os.register_at_fork(after_in_child=_after_fork)
