"""Streams, with the host-side ordering bookkeeping of DESIGN.md §2 (events: event.py).

State and invariants (per stream S):
- ``_pos``: operations enqueued on S; the backend queue's ``done`` counts completed ones;
  ``_nops``: the latest run of positions whose operations do nothing (``sync.ran``).
- ``_clock``: vector clock, stream id -> position of that stream known to be ordered before
  S's next operation. ``record`` snapshots it (with ``[S] = _pos``); ``wait`` merges an
  event's snapshot by element-wise maximum and enqueues a real wait only when needed.
- ``_host``: the position of S that a host synchronize (stream, event or device) proved
  complete. A ``query()`` that answers True proves nothing.
- Blocking streams and the legacy default stream of a device wait on each other implicitly
  (CUDA legacy semantics, legacy.py).
Failures inside queued work are kept by the queue with their position and raised, chained,
as :class:`LaunchError` by the first synchronize that covers them.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import foreign, instrument, legacy, stream_capture, sync
from .backends.base import InlineQueue
from .device import Device, current_stream, pop_stream, push_stream
from .eager import EAGER
from .errors import InvalidHandleError, InvalidTypeError
from .event import Event
from .graph import memory as graph_memory
from .kernel import Kernel, KernelContext, exact_ints, launch_context
from .labels import site_line
from .pool import ArenaPool, MemPool
from .pool.registry import _owners
from .ranges import check_name
from .sync import after_sync, covered, reach, retire
from .validate import check_byte, check_ptr, check_size, is_bool, is_int

_owners_get = _owners.get  # live pool pointer -> pool

__all__ = ["Stream", "Event", "current_stream"]  # current_stream: device.py, as the device

_ids = itertools.count(1)
# process-wide switches read on every enqueue, recomputed whenever one changes
_launch_blocking = False  # every enqueue synchronous (sync.set_launch_blocking)
_getframe = sys._getframe
_SITES = 256  # kernel launches whose sites a stream remembers (a power of two)
_SITE_MASK = _SITES - 1
_global_slow = False  # launch blocking, a sanitizer or a tracer: the slow path for every stream
_observed = False  # a sanitizer or tracer and no launch blocking (instrument.launch applies)


def _refresh_global() -> None:
    global _global_slow, _launch_blocking, _observed
    _launch_blocking = sync.launch_blocking()
    _global_slow = _launch_blocking or instrument.active()
    _observed = instrument.active() and not _launch_blocking


instrument.on_change.append(_refresh_global)
_refresh_global()

_ONE, _ZERO = 1, 0  # small ints are singletons in CPython: ``grid is _ONE`` is a cheap test


class Stream:
    """An in-order queue of device work (``cudaStream_t`` / ``aclrtStream``)."""

    __slots__ = (
        "device", "id", "priority", "non_blocking", "_legacy", "_q", "_pos", "_clock", "_host",
        "_destroyed", "_ctxs", "_ctx1", "_target", "_slow", "_lock", "_inline", "_recorded",
        "_push", "_cv", "_snap", "_wref", "_sites", "_name", "_nops", "__weakref__",
    )

    def __init__(
        self, device: Any = None, *, priority: int = 0, non_blocking: bool = False,
        name: str | None = None,
    ) -> None:
        if not is_int(priority):
            raise InvalidTypeError(f"priority must be an int, not {type(priority).__name__}")
        if not is_bool(non_blocking):
            raise InvalidTypeError("non_blocking must be a bool")
        name = None if name is None else check_name(name, "stream")
        # CUDA clamps priorities into [greatest, least] = [-5, 0]; lower is more urgent.
        self._setup(Device(device), min(max(int(priority), -5), 0), bool(non_blocking),
                    legacy=False)
        self._name = self._name if name is None else name

    @classmethod
    def _make_legacy(cls, device: Device) -> Stream:
        s = object.__new__(cls)
        s._setup(device, 0, False, legacy=True)
        return s

    from_external = classmethod(foreign.from_external)
    __cuda_stream__ = property(foreign.cuda_stream, doc=foreign.cuda_stream.__doc__)

    def _setup(self, device: Device, priority: int, non_blocking: bool, legacy: bool,
               wrap: int | None = None) -> None:
        self.device = device
        self.id = next(_ids)
        if wrap is None:
            self._q = device._impl.create_queue(f"{device.name}/{'default' if legacy else self.id}",
                                                priority=priority, non_blocking=non_blocking, legacy=legacy)
        else:  # a foreign stream (foreign.py): the flags and priority are its own
            self._q, non_blocking, priority = device._impl.wrap_queue(f"{device.name}/ext{self.id}", wrap)
        self.priority = priority
        self.non_blocking = non_blocking
        self._legacy = legacy
        self._name = self._q.name  # what messages and traces call it (or the user's name)
        # read on every launch: a slot, not an isinstance call
        self._inline = isinstance(self._q, InlineQueue)
        # an InlineQueue's ``ops.extend`` (its ``ops`` is never rebound), for the eager launch
        self._push = self._q.ops.extend if self._inline else None  # type: ignore[attr-defined]
        self._pos = 0
        self._recorded = -1  # position of the latest event record (see free)
        self._nops = (1, 0)  # (first, last): none yet
        self._clock: dict[int, int] = {}
        self._cv = 0  # the clock's version: counts changes of _clock (a copy of it stays valid)
        # (version, copy of _clock): instrumented operations share one copy while it is valid
        self._snap: tuple[int, dict[int, int]] = (-1, {})
        self._wref = weakref.ref(self)  # what instrumented operations hold of their stream
        self._host = 0
        self._destroyed = False
        self._ctxs: dict[Any, KernelContext] = {}
        self._ctx1 = launch_context(self, 1, 1)
        # where the latest kernel launches were made, for a LaunchError: slot pos % _SITES holds
        # (pos, code, instruction offset), the line worked out only when a failure names it
        self._sites: list[tuple[int, Any, int] | None] = [None] * _SITES
        # where validated work goes: EAGER (the queue), or the Capture the stream takes part in
        self._target: Any = EAGER
        # held by an instrumented enqueue on a cpu queue from its count to its submit, so
        # another thread's operation can neither share its label nor come between them
        self._lock = threading.Lock()
        self._refresh()
        device._add_stream(self, blocking=not non_blocking and not legacy)
        sync.streams[self.id] = self
        weakref.finalize(self, retire, device, self._q)

    def __repr__(self) -> str:
        kind = "legacy default" if self._legacy else (
            "non-blocking" if self.non_blocking else "blocking")
        named = f" {self._name!r}" if self._name != self._q.name else ""
        return f"<Stream {self.device.name}#{self.id} {kind}{named}>"

    @property
    def _capture(self) -> Any:
        """The capture this stream takes part in, or None (its enqueue target, if a capture)."""
        t = self._target
        return None if t is EAGER else t

    def _set_target(self, cap: Any) -> None:
        """Join ``cap`` (a Capture), or leave the capture with None: work goes there from now.
        The fast path is closed first, so no launch slips past the new target."""
        if cap is not None:
            self._slow = True
        self._target = EAGER if cap is None else cap
        self._refresh()

    @property
    def name(self) -> str:
        """The ``name`` it was made with, else ``cpu:0/default`` or ``cpu:0/<id>``
        (``cuda:0/ext<id>``: a foreign stream)."""
        return self._name

    # -- context manager: current stream ---------------------------------------------------
    def __enter__(self) -> Stream:
        """The current stream of its device, which becomes current too (as PyTorch's
        ``torch.cuda.stream``); both restored on exit."""
        self.device.__enter__()
        push_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        pop_stream()
        self.device.__exit__()

    # -- ordering bookkeeping --------------------------------------------------------------
    def _snapshot(self) -> dict[int, int]:
        """The clock with ``[self] = _pos``. The clock is copied before the position is read: a
        wait another thread enqueues meanwhile counts itself in ``_pos`` before it merges into
        ``_clock``, so the copy never claims more than the position. Take a published position
        from here (``snap[self.id]``), never from ``_pos`` read apart."""
        snap = self._clock.copy()
        snap[self.id] = self._pos
        return snap

    def _order_after(self, other: Stream, pos: int, clock: dict[int, int], why: Any = None) -> None:
        """Enqueue a real wait for ``other`` to reach ``pos``, merge its clock (``why``: traces)."""
        fn, args = self._q.op_wait(other._q, pos)
        labelled = _global_slow and instrument.listeners  # a label only where something reads it
        self._enqueue(fn, args, "wait", f"wait {other.name}@{pos}" if labelled else "wait", (),
                      instrument.wait_args(other, pos, why) if labelled else None, clock)

    def _enqueue(self, fn: Callable[..., Any], args: tuple, kind: str, name: str,
                 accesses: tuple, extra: dict | None, merge: dict[int, int] | None = None) -> None:
        """Count one operation and hand it to the queue, then merge ``merge`` into the clock (a
        wait's). Instrumented (sanitizer, tracer), the operation's label and clock are read after
        a call: another thread enqueuing on this stream meanwhile would share the label, or come
        first in the queue with a later one. A cpu queue's submit never blocks, so there the
        count, the label, the submit and the merge are one step under the stream's lock (not on
        cuda, whose enqueue may wait for work that needs this stream)."""
        q = self._q
        if _global_slow and instrument.listeners:
            if self._inline:
                with self._lock:
                    self._pos += 1
                    q.submit(*instrument.wrap(self, fn, args, kind, name, accesses, extra))
                    if merge:
                        self._merge(merge)
                return
            self._pos += 1
            fn, args = instrument.wrap(self, fn, args, kind, name, accesses, extra)
        else:
            self._pos += 1
        q.submit(fn, args)
        if merge:
            self._merge(merge)

    def _merge(self, clock: dict[int, int]) -> None:
        self._cv += 1
        mine = self._clock
        for sid, p in clock.items():
            if p > mine.get(sid, 0):
                mine[sid] = p

    def _host_call(self, what: str) -> None:
        """A synchronize or query: refused on a destroyed or capturing stream, and on the legacy
        stream while a blocking stream of its device captures."""
        self._check_alive()
        self._target.refuse(self, what)
        legacy.check_capture(self)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")

    def _refresh(self) -> None:
        """Recompute whether launches must leave the fast path (blocking, captured, destroyed)."""
        self._slow = not self.non_blocking or self._target is not EAGER or self._destroyed

    def _submit(self, fn: Callable[..., Any], args: tuple, kind: str = "op", name: str = "",
                accesses: tuple = (), extra: dict | None = None) -> None:
        if self._destroyed:
            self._check_alive()
        if _global_slow and instrument.listeners and not self._inline:
            instrument.check_backend(self)
        if not self.non_blocking:
            legacy.order(self)
        self._enqueue(fn, args, kind, name or kind, accesses, extra)
        if _launch_blocking:
            self.synchronize()

    # -- enqueue ---------------------------------------------------------------------------
    def launch(self, kernel: Kernel, *args: Any, grid: Any = 1, block: Any = 1,
               shared_mem: int = 0) -> None:
        """Enqueue ``kernel`` (``cudaLaunchKernel``; ``shared_mem``: bytes of dynamic shared
        memory per block, its ``sharedMem``); returns at once."""
        if shared_mem is not _ZERO:  # rare: a context of its own (validated, kept by shape)
            ctx = launch_context(self, grid, block, shared_mem)
        elif grid is _ONE and block is _ONE:  # the default launch shape: skip the lookup
            ctx = self._ctx1
        elif exact_ints(grid) and exact_ints(block):  # True == 1, 2.0 == 2: those never hit
            try:
                ctx = self._ctxs[grid, block]
            except KeyError:
                ctx = launch_context(self, grid, block)
        else:
            ctx = launch_context(self, grid, block)  # validates (numpy ints pass, others are refused)
        if self._slow or _global_slow or type(kernel) is not Kernel:
            if _observed and not self._slow and self._inline and type(kernel) is Kernel:
                kernel.check_args(args)
                instrument.launch(self, kernel, ctx, args, _getframe(1))  # the same, in fewer steps
                return None
            return self._launch_slow(kernel, ctx, args)
        # the hottest path of the runtime: a non-blocking stream with no capture or hooks
        n = len(args)
        if n < kernel._lo or n > kernel._hi:  # refused here, at the launch's line
            kernel._refuse(n)
        push = self._push
        if push is not None:  # the queue's operations are the work: add it (InlineQueue)
            try:  # the body bound to the context: no tuple made per launch holds the context
                run = ctx._runs[kernel.fn]
            except (KeyError, TypeError):
                run = ctx._runner(kernel.fn)
            p = self._pos + 1
            self._pos = p
            f = _getframe(1)
            self._sites[p & _SITE_MASK] = (p, f.f_code, f.f_lasti)
            push((run, args))
            q = self._q
            if q.idle:  # type: ignore[attr-defined]
                q.wake()  # type: ignore[attr-defined]
            return
        q = self._q
        fn, a = q.op_launch(kernel, ctx, args)  # a refused argument raises before counting
        self._pos += 1
        q.submit(fn, a)
        self._note_site(self._pos)

    def _launch_slow(self, kernel: Any, ctx: KernelContext, args: tuple) -> None:
        if type(kernel) is not Kernel:
            raise InvalidTypeError(f"launch needs an @srt.kernel, not {type(kernel).__name__}")
        kernel.check_args(args)
        self._check_alive()
        before = self._pos
        self._target.kernel(self, kernel, ctx, args)
        if self._pos != before:  # enqueued (not captured): the launch is the latest operation
            self._note_site(self._pos, 3)

    def _note_site(self, pos: int, depth: int = 2) -> None:
        """Remember where the launch at ``pos`` was made (``depth`` frames up: launch's caller)."""
        f = _getframe(depth)
        self._sites[pos & _SITE_MASK] = (pos, f.f_code, f.f_lasti)

    def _site_of(self, pos: int) -> str:
        """``file:line`` of the kernel launch at ``pos``, or "" (not a launch, or too long ago)."""
        e = self._sites[pos & _SITE_MASK]
        return "" if e is None or e[0] != pos else site_line(e[1], e[2])

    def memcpy(self, dst: Any, src: Any, nbytes: int) -> None:
        """Enqueue a copy (``cudaMemcpyAsync``); each side a device pointer or a host buffer.

        As in CUDA, a copy from a pageable host buffer takes the data at call time, and a copy
        into a pageable host buffer returns once the data is there; pinned memory
        (``srt.malloc_host``) is fully asynchronous.
        """
        n = check_size(nbytes)
        self.device._check_copy(dst, src, n)  # (srt.memcpy, cudaMemcpyPeer, copies without it)
        self._target.memcpy(self, dst, src, n)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Enqueue a byte fill (``cudaMemsetAsync``)."""
        n = check_size(nbytes)
        ptr = check_ptr(ptr)
        v = int(check_byte(value))
        self.device._check_reach(ptr, n, "memset")
        self._target.memset(self, ptr, v, n)

    def launch_host_func(self, fn: Callable[..., Any], *args: Any) -> None:
        """Enqueue ``fn(*args)`` to run on a host thread in stream order (``cudaLaunchHostFunc``)."""
        if not callable(fn):
            raise InvalidTypeError(f"launch_host_func needs a callable, not {type(fn).__name__}")
        self._target.host(self, fn, args)

    def malloc(self, nbytes: int, pool: Any = None) -> int:
        """Stream-ordered allocation from ``pool`` (default: the device's current pool)."""
        if pool is None:  # (the property only to make the default pool: a property costs 50 ns)
            pool = (d := self.device)._pool or d._default_pool or d.default_mem_pool
        elif type(pool) is not ArenaPool and not isinstance(pool, MemPool):
            raise InvalidTypeError(f"pool must be a MemPool, not {type(pool).__name__}")
        if type(nbytes) is not int or nbytes < 0:
            nbytes = check_size(nbytes)
        if not (self._slow or _global_slow):
            return pool._malloc(self, nbytes)
        self._check_alive()
        return self._target.malloc(self, pool, nbytes)  # type: ignore[no-any-return]

    def free(self, ptr: int) -> None:
        """Stream-ordered free (``cudaFreeAsync``): the block returns to its pool after prior work."""
        if type(ptr) is not int:
            ptr = check_ptr(ptr)
        pool = _owners_get(ptr)
        if self._recorded == self._pos and (pool is not None or graph_memory.find(ptr) is not None):
            self._target.after_record(self)  # an event recorded just before: the free is after it
        if pool is not None and not (self._slow or _global_slow):
            return pool._free(self, ptr)
        self._check_alive()
        self._target.free(self, ptr, pool)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) at the current tail (``cudaEventRecord``)."""
        self._check_alive()
        if event is None:
            event = Event(self.device)
        elif not isinstance(event, Event):
            raise InvalidTypeError(f"record needs an Event, not {type(event).__name__}")
        event._check_recordable(self)
        return self._target.record(self, event)  # type: ignore[no-any-return]

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (``cudaStreamWaitEvent``)."""
        self._check_alive()
        if not isinstance(event, Event):
            raise InvalidTypeError(f"wait needs an Event, not {type(event).__name__}")
        event._check_alive()
        self._target.wait(self, event)

    # -- capture (the calls: stream_capture.py) ---------------------------------------------
    begin_capture = stream_capture.begin_capture
    begin_capture_to_graph = stream_capture.begin_capture_to_graph
    end_capture = stream_capture.end_capture
    is_capturing = stream_capture.is_capturing
    capture_info = stream_capture.capture_info
    update_capture_dependencies = stream_capture.update_capture_dependencies

    # -- host synchronization ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Block until all work enqueued so far has completed (``cudaStreamSynchronize``)."""
        self._host_call("synchronize")
        # what is proved is read before waiting, the clock first: a wait another thread enqueues
        # meanwhile counts itself in _pos before it merges into _clock, so it is either in both
        # or in neither (the live dict would claim streams this synchronize never waited for)
        clock = self._clock.copy()
        pos, clock = reach(self, self._pos, clock)
        after_sync(self.device, [(self, pos)] + covered(clock))

    def query(self) -> bool:
        """True when all enqueued work has completed (``cudaStreamQuery``); not a synchronize."""
        self._host_call("query")
        return self._q.done >= self._pos

    def destroy(self) -> None:
        """Destroy the stream (``cudaStreamDestroy``); work already enqueued still completes."""
        if self._legacy:
            raise InvalidHandleError("the legacy default stream cannot be destroyed")
        self._check_alive()
        # a capture keeps its streams until end_capture: destroying one would leave the capture
        # active for good (refusing every unsafe call and device synchronize)
        self._target.refuse(self, "destroy")
        self._destroy_quiet()

    def _destroy_quiet(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._refresh()
        dev = self.device
        dev._drop_stream(self)  # pool blocks freed on it still need a synchronize to prove them
        retire(dev, self._q)
