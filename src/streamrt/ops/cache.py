"""``ExecutorCache``: an LRU of repeatable executors, per thread (like aclnn's executor cache).

State: one ``_Store`` per (cache, thread), reached through a ``threading.local``, so that a
thread only ever sees executors it created (executors are owned by their thread) and the hot
path takes no lock. A store holds ``entries`` (key -> executor, least recently used first) and
``c = [hits, misses, evictions, bytes]``. ``bytes`` is the sum of the cached executors'
``workspace_size``: the device memory a run of each cached plan asks the pool for, which is what
a byte bound on this cache limits. Bounds (``max_entries``, ``max_bytes``) apply per thread; an
executor whose workspace alone exceeds ``max_bytes`` is not cached (it runs once and is
released). Evicted executors are released at once: work already enqueued holds its own
arguments, never the executor. When a thread ends (or the cache is collected) its store's
executors are released and its counters folded into the cache's totals.

Keys (built by ``ops.run``): the op, its implementation version, per tensor an interned id of
(shape, dtype, strides, offset, format, device), and the attributes with their types, inside
tuples too (so that ``axis=1`` never hits an executor planned for ``axis=1.0`` or ``True``, nor
``axis=(0, True)`` one planned for ``(0, 1)``). Never a data pointer:
a hit re-points the executor at the new tensors' addresses.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError
from ..reclaim import Reclaim
from ..validate import check_bool, is_int
from .executor import Executor

__all__ = ["ExecutorCache"]


class _Store:
    __slots__ = ("entries", "c", "thread", "__weakref__")

    def __init__(self) -> None:
        self.entries: OrderedDict[Any, Executor] = OrderedDict()
        self.c = [0, 0, 0, 0]  # hits, misses, evictions, bytes
        self.thread = threading.current_thread().name


def _retire(entries: OrderedDict, c: list, cache_ref: weakref.ref) -> None:
    """A store died with its thread (or its cache): release its executors, keep its counts."""
    for ex in entries.values():
        ex._release()
    entries.clear()
    cache = cache_ref()
    if cache is not None:
        with cache._lock:  # free now: Reclaim runs this only then
            for i in range(3):
                cache._dead[i] += c[i]


def _bound(value: Any, what: str, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if not is_int(value):
        raise InvalidTypeError(f"{what} must be an int{' or None' if allow_none else ''}, "
                               f"not {type(value).__name__}")
    if value < 0:
        raise InvalidValueError(f"{what} must be >= 0, got {value}")
    return int(value)


class ExecutorCache:
    """LRU of repeatable executors per thread, bounded by entries and by workspace bytes."""

    def __init__(self, max_entries: int = 10000, max_bytes: int | None = None) -> None:
        self.max_entries = _bound(max_entries, "max_entries", False)
        self.max_bytes = _bound(max_bytes, "max_bytes", True)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._reclaim = Reclaim(self._lock)  # a dead thread's store, retired by a finalizer
        self._stores: weakref.WeakSet[_Store] = weakref.WeakSet()
        self._dead = [0, 0, 0]

    def __repr__(self) -> str:
        st = self.stats()
        return (f"<ExecutorCache entries={st['entries']} bytes={st['bytes']} hits={st['hits']} "
                f"misses={st['misses']}>")

    def _store(self) -> _Store:
        try:
            return self._local.store
        except AttributeError:
            st = _Store()
            self._local.store = st
            weakref.finalize(st, self._reclaim, _retire, st.entries, st.c, weakref.ref(self))
            with self._lock:
                self._stores.add(st)
            self._reclaim.drain()
            return st

    def _get(self, key: Any) -> Executor | None:
        """The calling thread's executor for ``key`` (most recently used now), or None; an
        unhashable key raises TypeError before anything is counted."""
        try:
            st = self._local.store
        except AttributeError:
            st = self._store()
        entries = st.entries
        ex = entries.get(key)
        if ex is None:
            st.c[1] += 1
            return None
        entries.move_to_end(key)
        st.c[0] += 1
        return ex

    def _put(self, key: Any, ex: Executor) -> bool:
        """Make ``ex`` repeatable and cache it, evicting LRU entries; False if it cannot fit."""
        size = ex._ws
        if self.max_entries == 0 or (self.max_bytes is not None and size > self.max_bytes):
            return False
        st = self._store()
        entries, c = st.entries, st.c
        ex._repeatable = True  # just planned by this thread, never run: set_repeatable's case
        old = entries.pop(key, None)
        if old is not None:
            c[3] -= old._ws
            old._release()
        entries[key] = ex
        c[3] += size
        limit = self.max_bytes
        while len(entries) > self.max_entries or (limit is not None and c[3] > limit):
            _, victim = entries.popitem(last=False)  # never ``ex``: it fits on its own
            c[3] -= victim._ws
            c[2] += 1
            victim._release()
        return True

    def stats(self, *, this_thread: bool = False) -> dict[str, Any]:
        """Hits, misses, evictions, entries and bytes (all threads, or only the calling one)."""
        if check_bool(this_thread, "this_thread"):
            stores = [self._store()]
            dead = [0, 0, 0]
        else:
            self._reclaim.drain()  # retired stores' counts first
            with self._lock:
                stores = list(self._stores)
                dead = list(self._dead)
        c = [sum(s.c[i] for s in stores) for i in range(4)]
        return {
            "hits": c[0] + dead[0], "misses": c[1] + dead[1], "evictions": c[2] + dead[2],
            "entries": sum(len(s.entries) for s in stores), "bytes": c[3],
            "max_entries": self.max_entries, "max_bytes": self.max_bytes,
        }

    def clear(self) -> None:
        """Release the calling thread's entries and zero its counters (other threads own theirs)."""
        st = self._store()
        for ex in st.entries.values():
            ex._release()
        st.entries.clear()
        st.c[:] = [0, 0, 0, 0]

    def __len__(self) -> int:
        return len(self._store().entries)
