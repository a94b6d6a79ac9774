"""Pausing the cyclic garbage collector's full collections around bulk graph work.

Building, capturing, cloning or instantiating a large graph makes a few objects per node that all
survive: every full collection then walks all of them again, so with the collector on the
per-node cost grows with the graph. A pause defers full collections (a third threshold no count
reaches); young ones still run, on objects still in the caches (one big young collection of cold
objects after a total pause cost more than it saved), and they still free the program's own
garbage. The switch ``gc.enable``/``gc.disable`` stays the program's; ``gc.collect`` collects.

- ``paused()``: a block (clone, instantiate).
- the building lease (``building``): node-by-node building (``Graph._add``, explicit or captured)
  has no end to hang a block on. A watcher thread ends the lease as soon as fewer than ``DENSE``
  nodes were added in ``QUIET`` seconds; a new one starts only after ``BULK`` adds since the last
  one ended.

State and invariants, under ``_lock``: ``_depth`` counts the ``paused()`` blocks in progress
(nested, any thread); ``_leased``: a lease is held; ``_ticks`` counts adds (the watcher only
looks for change). ``_saved`` holds the program's thresholds while a pause is in force (None:
none is, or the collector was off then and is left alone) and ``_last`` what was set: when no
pause is left they are the program's again, unless the program set thresholds of its own
meanwhile (those stay). A pause ends on every path, errors included (``paused`` is a context
manager).
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
_leased = False
_ticks = 0
_next = 0  # _ticks from which a new lease may start
_saved: tuple[int, int, int] | None = None
_last: tuple[int, int, int] | None = None
_NO_FULL = 1 << 30  # a third threshold no count reaches: full collections wait


def _update() -> None:
    """Set the thresholds for the pauses in force (under ``_lock``)."""
    global _saved, _last
    active = bool(_depth) or _leased
    if _saved is None:
        if not active:
            return
        cur = gc.get_threshold()
        if not gc.isenabled() or cur[0] == 0:
            return  # automatic collection is off already: nothing to pause
        _saved = _last = cur
    if gc.get_threshold() != _last:  # the program set thresholds meanwhile: they stay
        _saved = _last = None
        return
    want = (*_saved[:2], _NO_FULL) if active else _saved
    gc.set_threshold(*want)
    _last = want
    if not active:
        _saved = _last = None


def pause() -> None:
    """Begin a ``paused()`` block (nested-safe); each call needs one :func:`resume`."""
    global _depth
    with _lock:
        _depth += 1
        _update()


def resume() -> None:
    """End a ``paused()`` block; the thresholds follow what is still in force."""
    global _depth
    with _lock:
        assert _depth > 0, "resume() without pause()"
        _depth -= 1
        _update()


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
        _update()
    try:
        threading.Thread(target=_watch, name="streamrt-gc-lease", daemon=True).start()
    except RuntimeError:  # no thread (at exit, or out of threads): no lease, nothing else
        _end_lease()


def _end_lease() -> None:
    global _leased, _next
    with _lock:
        _leased = False
        _next = _ticks + BULK
        _update()


def _watch() -> None:
    """The lease's watcher: ends it once adds slow down below ``DENSE`` per ``QUIET``."""
    seen = _ticks
    while True:
        time.sleep(QUIET)
        now = _ticks
        if now - seen < DENSE:
            break
        seen = now
    _end_lease()


def _after_fork() -> None:
    """A forked child has none of the parent's threads: no pause of theirs (nor the lease's
    watcher) will ever end there, so the child starts with none in force."""
    global _lock, _depth, _leased, _next
    _lock = threading.Lock()
    _depth, _leased, _next = 0, False, _ticks
    _update()


os.register_at_fork(after_in_child=_after_fork)
