"""The enqueue target of a stream that is not capturing: its work goes to the backend queue.

A stream hands every operation, once validated, to its target (``Stream._target``): this
module's :data:`EAGER`, or the :class:`~streamrt.graph.capture.Capture` it takes part in, which
adds graph nodes instead. Both offer the same methods, each taking the stream first; a capture
that another thread ended meanwhile hands the call back to :data:`EAGER`, as the call after the
end that it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import instrument, legacy
from .copy_ends import release as release_ends
from .copy_ends import resolve
from .event import Event
from .graph import memory as graph_memory
from .labels import fn_label
from .pool import pool_of
from .sync import ran, reach
from .validate import host_view, is_int

if TYPE_CHECKING:
    from .kernel import Kernel, KernelContext
    from .stream import Stream


def endpoint(impl: Any, obj: Any, n: int, *, writable: bool) -> Any:
    """A copy end: ``n`` bytes of device memory at ``obj`` (an int, checked by the backend), or
    a host buffer as a view (by reference: read when the copy runs). Other libraries' device
    memory was resolved to its address first (copy_ends.resolve)."""
    if is_int(obj):
        return impl.endpoint(int(obj), n)
    return host_view(obj, n, writable=writable)


def _nothing() -> None:
    """Queue operation doing nothing: the position of a free that follows an event record (see
    after_record), or of a wait for work that has run (see wait)."""


def _did_nothing(s: Any, before: int) -> None:
    """Note the operation just enqueued on ``s`` (its position was ``before``) as one doing
    nothing, for :func:`~streamrt.sync.ran`; its position is known only if no other thread's
    operation came between."""
    pos = s._pos
    first, last = s._nops
    s._nops = (1, 0) if pos != before + 1 else (first, pos) if last == before else (pos, pos)


class Eager:
    """Enqueue on the stream's queue (the target of every stream that is not capturing)."""

    __slots__ = ()
    capturing = False

    def kernel(self, s: Stream, kernel: Kernel, ctx: KernelContext, args: tuple) -> None:
        """Launch ``kernel``."""
        fn, a = s._q.op_launch(kernel, ctx, args)
        s._submit(fn, a, "kernel", kernel.name, extra=ctx._info)

    def memcpy(self, s: Stream, dst: Any, src: Any, n: int) -> None:
        """Copy ``n`` bytes; a pageable host end is staged (source) or waited for (destination);
        another library's device memory (copy_ends.py) is kept until the copy has run."""
        impl = s.device._impl
        held: list[Any] = []  # what other libraries' device memory ends need until the copy has run
        if not is_int(dst):
            dst, keep = resolve(s, dst, n, writable=True)
            if keep is not None:
                held.append(keep)
        if not is_int(src):
            src, keep = resolve(s, src, n, writable=False)
            if keep is not None:
                held.append(keep)
        dst_view = endpoint(impl, dst, n, writable=True)
        src_view = endpoint(impl, src, n, writable=False)
        if n == 0:
            s._check_alive()  # nothing to enqueue, but still a call on this stream
            return
        if not isinstance(src, int | np.integer) and s._inline:
            src_view = src_view.copy()  # pageable source: staged at call time (CUDA stages itself)
        fn, args = s._q.op_copy(dst_view, src_view, n)
        s._submit(fn, args, "memcpy", f"memcpy {n} B",
                  tuple((int(p), n, w) for p, w in ((dst, True), (src, False))
                        if isinstance(p, int | np.integer)), {"bytes": n})
        if not isinstance(dst, int | np.integer):  # pageable destination: synchronous
            clock = s._clock.copy()  # then the position: not later work (see synchronize)
            reach(s, s._pos, clock)  # the host saw the stream get this far
        elif held:  # released in stream order, once the copy has run
            self.host(s, release_ends, (held,))

    def memset(self, s: Stream, ptr: int, value: int, n: int) -> None:
        """Fill ``n`` bytes at ``ptr`` with ``value``."""
        view = s.device._impl.endpoint(ptr, n)
        if n:
            fn, args = s._q.op_fill(view, value, n)
            s._submit(fn, args, "memset", f"memset {n} B",
                      ((ptr, n, True),), {"bytes": n, "value": value})
        else:
            s._check_alive()  # nothing to enqueue, but still a call on this stream

    def host(self, s: Stream, fn: Callable[..., Any], args: tuple) -> None:
        """Run ``fn(*args)`` on a host thread in stream order."""
        op, a = s._q.op_host(fn, args)
        # the label only where an observer reads it (a stream reads it only when instrumented)
        s._submit(op, a, "host", fn_label(fn) if instrument.listeners else "host")

    def after_record(self, s: Stream) -> None:
        """Give a free right after an event record a position of its own. A free adds no work
        (it is tagged with the stream's position), but it is a stream operation after the
        record (``cudaFreeAsync``): a stream waiting on that event must not count as ordered
        after the free (DESIGN.md §3, reuse by event dependency)."""
        if not s._destroyed:
            before = s._pos
            s._submit(_nothing, (), "free", "pool free")
            _did_nothing(s, before)

    def malloc(self, s: Stream, pool: Any, nbytes: int) -> int:
        """A stream-ordered allocation from ``pool``."""
        ptr: int = pool._malloc(s, nbytes)
        if instrument.listeners:
            instrument.notify("alloc", s, ptr, nbytes)
        return ptr

    def free(self, s: Stream, ptr: int, pool: Any) -> None:
        """A stream-ordered free of a pool block (``pool``) or of graph memory (None)."""
        if not s.non_blocking:
            # the free is a stream operation: legacy ordering applies before it, and before
            # the sanitizer reads its clock (the pool's own ordering below is then a no-op)
            legacy.order(s)
        if instrument.listeners and pool is not None:
            instrument.notify("free", s, ptr)
        if pool is None and graph_memory.find(ptr) is not None:
            graph_memory.free_outside(ptr, s)  # graph memory, freed outside the graph
            if instrument.listeners:
                instrument.notify("free", s, ptr)
            return
        (pool or pool_of(ptr))._free(s, ptr)
        if instrument.listeners:
            instrument.notify("freed", s, pool)

    def record(self, s: Stream, event: Event) -> Event:
        """Record ``event`` at the stream's tail."""
        stamp = None
        if event.timing:
            fn, args, stamp = s._q.op_stamp()
            s._submit(fn, args, "record", "timing event")
        elif not s.non_blocking:
            legacy.order(s)
        s._q.mark()
        # published whole, its position taken from the clock snapshot: a reader on another
        # thread must never pair this stream with an older record's clock, nor a position with
        # a clock that already merged a wait enqueued after it (see Stream._snapshot)
        clock = s._snapshot()
        event._rec = (s, clock[s.id], clock, stamp)
        event._capture = None
        s._recorded = clock[s.id]
        return event

    def wait(self, s: Stream, event: Event) -> None:
        """Order later work after ``event``; waiting on a captured event joins its capture."""
        ce = event._capture  # once: another thread's record may reset it
        if ce is not None:
            return ce.wait(s, event, ce)  # type: ignore[no-any-return]
        legacy.check_capture(s)
        other, pos, clock, _stamp = event._rec  # once: another thread may re-record it
        if other is None or other is s:
            return  # never recorded: a no-op, as in CUDA
        if s._clock.get(other.id, 0) >= pos:
            return  # already ordered: no new dependency needed
        # (``other`` is a stream, or the point of a graph's record node: no ``_inline``)
        if s._inline and getattr(other, "_inline", False) and ran(other) >= pos and not (
                instrument.listeners):
            # the work it waits for has run (``done`` counts exactly on an inline queue): the wait
            # is an operation doing nothing at its position, which counts as run at once (a later
            # free on s is reusable opportunistically without a worker pass: DESIGN.md §3 step 4)
            before = s._pos
            s._enqueue(_nothing, (), "wait", "wait", (), None, clock)
            _did_nothing(s, before)
            return
        s._order_after(other, pos, clock, event)

    def launch_graph(self, s: Stream, ge: Any) -> None:
        """Launch an executable graph."""
        ge._launch_on(s)

    def release_after(self, s: Stream, release: Callable[[], None]) -> None:
        """Call ``release`` once the work enqueued so far has run (an executor's release)."""
        s.launch_host_func(release)

    def refuse(self, s: Stream, what: str) -> None:
        """``what`` (a synchronize, query or destroy) is allowed: nothing to refuse."""


EAGER = Eager()

