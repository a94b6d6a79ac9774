"""CUDA streams as the backend's queues: enqueue calls made at once, completion read from events.

State and invariants:
- A :class:`CudaQueue` wraps one ``cudaStream_t`` (the legacy default stream for a device's
  default stream). Its ``op_*`` pairs are the enqueue calls themselves, so ``submit`` runs them
  at once on the calling thread; ``pos`` counts them in step with the frontend's ``Stream._pos``.
- Positions a host may wait for later are marked with a CUDA event when the frontend records
  an event (``mark``); ``done`` is the newest marked position whose event has completed, or
  ``pos`` once the whole stream is idle. Waiting for an unmarked position waits for the next
  marked one (or the whole stream): never too little.
- Marker events are destroyed once a query proves them passed, but never while another thread
  reads them (``_pinned``); objects a launch needs (graphs) are held until the stream passes it.
- Host functions: run by :mod:`.hostfn` on a Python thread, never on the driver's.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import NotPermittedError, NotReadyError
from ...labels import fn_label
from ..base import Queue
from . import hostfn
from .errors import check
from .runtime import NOT_READY, SUCCESS, activate, current, drv, host_ptr, legacy_stream, rt

if TYPE_CHECKING:
    from .device import CudaDevice


class _Stamp:
    """A timing event (``cudaEventCreate``), destroyed with its last reference."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = check(rt.cudaEventCreate())

    def __del__(self) -> None:
        try:  # a pending event is released by CUDA once it completes
            hostfn.release(rt.cudaEventDestroy, self.event)
        except Exception:  # noqa: S110 - at interpreter exit the bindings may be gone
            pass


class CudaQueue(Queue):
    """One CUDA stream: enqueue calls run at once; completion is read from CUDA events."""


    def __init__(self, dev: CudaDevice, name: str, priority: int, non_blocking: bool,
                 legacy: bool, external: int | None = None) -> None:
        self.name = name
        self.dev = dev
        self._index = dev.index
        self._functions = dev._functions  # loaded kernels: read on every launch
        self.pos = 0
        self._done = 0
        self._enqueuing = 0  # submits between counting an operation and handing it to CUDA
        self._markers: deque[tuple[int, Any]] = deque()
        # Any thread may ask a stream how far it got, or wait on it, and the answer frees the
        # marker events it proves passed. A thread holding a marker outside the lock pins the
        # queue; events passed meanwhile wait in _dead, so no handle is destroyed in use.
        self._lock = threading.Lock()
        self._pins = 0
        self._dead: list[Any] = []
        # what launches maybe still running need (graphs), with the newest such position: kept
        # alive until the stream passes it (hold)
        self._held: dict[Any, int] = {}
        self.errors: list[tuple[int, BaseException, str]] = []
        self._legacy = legacy
        self._closed = False
        # a foreign stream (Stream.from_external) is its owner's: close never destroys it
        self._owned = external is None
        activate(dev.index)
        if external is not None:
            self.stream = rt.cudaStream_t(external)
        elif legacy:
            self.stream = legacy_stream()
        else:
            flags = rt.cudaStreamNonBlocking if non_blocking else rt.cudaStreamDefault
            self.stream = check(rt.cudaStreamCreateWithPriority(flags, priority))
        self._cu_stream = drv.CUstream(int(self.stream))

    # -- completion ------------------------------------------------------------------------
    @property
    def done(self) -> int:
        """Completed operations: the stream's tail once idle, else the newest completed mark."""
        if self._done >= self.pos:
            return self._done
        tail = self.pos - self._enqueuing  # before the query: later work is not proven by it
        if not self._closed:
            activate(self.dev.index)  # the legacy stream is the current device's
        err = NOT_READY if self._closed else rt.cudaStreamQuery(self.stream)[0]
        if err == SUCCESS:
            self._advance(tail)
        elif err != NOT_READY:
            check((err,))
        else:
            with self._pinned():
                with self._lock:
                    markers = list(self._markers)
                for p, ev in reversed(markers):
                    if p <= self._done:
                        break
                    if rt.cudaEventQuery(ev)[0] == SUCCESS:
                        self._advance(p)
                        break
        return self._done

    def _advance(self, p: int) -> None:
        with self._lock:
            if p > self._done:
                self._done = p
            while self._markers and self._markers[0][0] <= self._done:
                self._dead.append(self._markers.popleft()[1])
            dead, self._dead = (self._dead, []) if not self._pins else ([], self._dead)
            if self._held:
                self._held = {g: q for g, q in self._held.items() if q > self._done}
        for ev in dead:
            rt.cudaEventDestroy(ev)

    @contextmanager
    def _pinned(self) -> Iterator[None]:
        """Keep the marker events this thread reads alive until it is done with them."""
        with self._lock:
            self._pins += 1
        try:
            yield
        finally:
            with self._lock:
                self._pins -= 1
                dead, self._dead = (self._dead, []) if not self._pins else ([], self._dead)
            for ev in dead:
                rt.cudaEventDestroy(ev)

    def _event_at(self, pos: int) -> Any | None:
        """The marker event of the first marked position >= ``pos`` (None: the tail); call it
        pinned."""
        with self._lock:
            for p, ev in self._markers:
                if p >= pos:
                    return ev
        return None

    def mark(self) -> tuple[int, Any]:
        """Record a marker event at the tail: a host or another stream may wait for it later.
        Returns its position and event; operations other threads are still handing to CUDA
        come after it."""
        activate(self.dev.index)
        ev = check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
        with self._lock:
            pos = self.pos - self._enqueuing  # before the record: it covers no less than this
        check(rt.cudaEventRecord(ev, self.stream))
        with self._lock:
            self._markers.append((pos, ev))
        return pos, ev

    def wait_done(self, pos: int) -> None:
        if self._done >= pos:
            return
        if hostfn.on_worker():  # a host function: every one runs there
            if self.done >= pos:  # finished work nobody had queried yet: no wait needed
                return
            raise NotPermittedError(
                f"{self.name}: a host function waited for stream work; the work may be waiting "
                "for this very host function (or one behind it, run by the same thread). Host "
                "functions must not synchronize: CUDA forbids API calls in them")
        if hostfn.deferred:
            hostfn.run_deferred()
        with self._pinned():
            ev = self._event_at(pos) if pos < self.pos or self._closed else None
            if ev is None:
                if self._closed:
                    return  # nothing was pending when it closed
                if hostfn.outstanding[0]:  # to be polled: an event, so that a synchronize ends it
                    pos, ev = self.mark()
                else:
                    stream, tail = self.stream, self.pos - self._enqueuing  # later work: not covered
                    activate(self.dev.index)  # the legacy stream is the current device's
                    check(rt.cudaStreamSynchronize(stream))
                    self._advance(tail)
                    return
            hostfn.block(lambda: rt.cudaEventQuery(ev), lambda: rt.cudaEventSynchronize(ev),
                         settle=True)
            self._advance(pos)

    def drain(self) -> None:
        self.wait_done(self.pos)  # enqueue calls ran at once: the queue counts them

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        if hostfn.deferred:
            hostfn.run_deferred()
        self._enqueuing += 1  # counted in ``pos`` before CUDA has it: no query may prove it yet
        self.pos += 1
        try:
            fn(*args)
        finally:
            self._enqueuing -= 1

    def close(self) -> None:
        if hostfn.on_driver_thread():  # the stream's finalizer, run in the trampoline
            hostfn.release(self.close)  # deferred
            return
        if self._legacy or self._closed:
            return
        if self.pos > self._done:
            try:
                self.mark()  # the handle dies now; a later synchronize waits on this event
            except Exception:  # noqa: BLE001 - a foreign stream destroyed before its wrapper (a
                self._advance(self.pos)  # contract breach): nothing is left to wait on
        self._closed = True
        if self._owned:
            rt.cudaStreamDestroy(self.stream)  # work already enqueued still completes

    def handle(self) -> int:
        """The ``cudaStream_t`` as an int (``cudaStreamLegacy``, 1, for the legacy stream)."""
        return int(self.stream)

    # -- operations: each pair is the enqueue call --------------------------------------------
    def op_launch(self, kernel: Any, ctx: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
        # the eager hot path on cuda: a dict hit, one generated argument test, no attribute walk
        fn, pack = self._functions.get(kernel) or self.dev.function(kernel)
        (gx, gy, gz), (bx, by, bz) = ctx.grid, ctx.block
        smem = ctx.shared_mem
        if smem:
            smem = self.dev.opt_in_shared(fn, smem)
        return self._launch, (fn, gx, gy, gz, bx, by, bz, pack(args), smem)

    def _launch(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                params: Any, smem: int = 0) -> None:
        if getattr(current, "device", None) != self._index:  # activate's own test, inline: the
            activate(self._index)  # eager hot path skips a call when the device is current
        err, = drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, self._cu_stream, params, 0)
        if err != 0:
            check((err,))

    def op_copy(self, dst: Any, src: Any, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        # keep host views referenced by the pair: pinned or pageable, CUDA reads them in order
        return self._copy, (dst, src, nbytes)

    def _copy(self, dst: Any, src: Any, nbytes: int) -> None:
        if hostfn.outstanding[0] and (isinstance(dst, np.ndarray) or isinstance(src, np.ndarray)):
            # a copy with pageable memory may wait for the stream inside the driver; with a
            # host function pending, that function's thread needs the GIL: wait here first,
            # polling, so the GIL is free while it runs
            stream = self.stream
            hostfn.block(lambda: rt.cudaStreamQuery(stream), lambda: rt.cudaStreamSynchronize(stream))
        activate(self.dev.index)
        check(rt.cudaMemcpyAsync(host_ptr(dst), host_ptr(src), nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyDefault, self.stream))

    def op_fill(self, dst: Any, value: int, nbytes: int) -> tuple[Callable[..., Any], tuple]:
        return self._fill, (dst, value, nbytes)

    def _fill(self, dst: int, value: int, nbytes: int) -> None:
        activate(self.dev.index)
        check(rt.cudaMemsetAsync(dst, value, nbytes, self.stream))

    def op_host(self, fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
        return self._host, (fn, args)

    def _host(self, fn: Callable[..., Any], args: tuple) -> None:
        pos = self.pos
        label = f"host function {fn_label(fn)!r}"
        job = hostfn.add(fn, args, lambda exc: self.errors.append((pos, exc, label)))
        activate(self.dev.index)
        try:
            check(rt.cudaLaunchHostFunc(self.stream, hostfn.HOST_FN, job))
        except BaseException:
            hostfn.drop(job, counted=True)
            raise

    def op_wait(self, other: Any, pos: int) -> tuple[Callable[..., Any], tuple]:
        return self._wait, (other, pos)

    def _wait(self, other: Any, pos: int) -> None:
        assert hasattr(other, "wait_event"), "streams of one backend only"
        with ExitStack() as pins:
            ev = other.wait_event(pos, pins)
            if ev is not None:
                activate(self.dev.index)
                check(rt.cudaStreamWaitEvent(self.stream, ev, 0))

    def order_foreign(self, handle: int, pos: int) -> None:
        with ExitStack() as pins:
            ev = self.wait_event(pos, pins)
            if ev is not None:
                activate(self.dev.index)
                check(rt.cudaStreamWaitEvent(rt.cudaStream_t(handle), ev, 0))

    def op_wait_foreign(self, handle: int) -> tuple[Callable[..., Any], tuple]:
        return self._wait_foreign, (handle,)

    def _wait_foreign(self, handle: int) -> None:
        activate(self.dev.index)
        ev = check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
        try:  # the wait takes the record current now: the event may go at once
            check(rt.cudaEventRecord(ev, rt.cudaStream_t(handle)))
            check(rt.cudaStreamWaitEvent(self.stream, ev, 0))
        finally:
            rt.cudaEventDestroy(ev)

    def wait_event(self, pos: int, pins: ExitStack) -> Any | None:
        """The CUDA event to wait on for position ``pos`` of this stream (None: it has passed),
        kept alive by ``pins`` until it closes (a graph's wait node takes one too)."""
        if self._done >= pos:
            return None
        pins.enter_context(self._pinned())
        ev = self._event_at(pos)  # a marked position at or after pos (an event record)
        if ev is None:  # the tail: mark it now
            ev = self.mark()[1]
        return ev

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` alive until the stream has passed the operation being submitted (a graph
        launched by it: its host nodes and host buffers must outlive an exec update)."""
        with self._lock:  # _advance may be rebuilding the dict on another thread
            self._held[obj] = self.pos

    def op_stamp(self) -> tuple[Callable[..., Any], tuple, Any]:
        activate(self.dev.index)
        st = _Stamp()
        return self._stamp, (st,), st

    def _stamp(self, st: _Stamp) -> None:
        activate(self.dev.index)
        check(rt.cudaEventRecord(st.event, self.stream))

    def elapsed_ms(self, start: Any, end: Any) -> float:
        err, ms = rt.cudaEventElapsedTime(start.event, end.event)
        if err == NOT_READY:
            raise NotReadyError("the event has not completed yet")
        check((err,))
        return float(ms)
