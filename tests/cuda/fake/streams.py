"""Streams: one worker thread each, running its operations in order, and the legacy default stream.

An operation is a Python callable with dependencies ``(stream, seq)``: it starts once each named
stream has completed its operation ``seq`` (event waits, legacy-stream ordering). ``done`` of a
stream counts its completed operations, so "operation ``seq`` of S completed" is one comparison.

The legacy default stream of a device (handles 0 and ``cudaStreamLegacy``, resolved against the
calling thread's current device) waits for the work of every blocking stream of its device
enqueued before it, and every blocking stream's later work waits for the legacy stream's work
enqueued before it. Non-blocking streams (``cudaStreamNonBlocking``) are not ordered with it.
A worker thread starts with its stream and ends once a destroyed stream has drained.
"""

from __future__ import annotations

import ctypes
import random
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from cuda.bindings import runtime as rt

from . import state
from .binding import runtime
from .state import CHANGED, LOCK, SUCCESS, E


class Op:
    __slots__ = ("seq", "fn", "deps", "label")

    def __init__(self, seq: int, fn: Callable[[], Any], deps: list, label: str) -> None:
        self.seq, self.fn, self.deps, self.label = seq, fn, deps, label


class FakeStream:
    """One stream: ``enqueued`` operations so far, ``done`` of them completed."""

    def __init__(self, device: int, *, legacy: bool = False, non_blocking: bool = False,
                 priority: int = 0, handle: int | None = None) -> None:
        self.handle = handle if handle is not None else state.new_handle()
        self.device = device
        self.legacy = legacy
        self.blocking = not legacy and not non_blocking
        self.priority = priority
        self.ops: deque[Op] = deque()
        self.enqueued = 0
        self.done = 0
        self.destroyed = False
        self.thread: threading.Thread | None = None
        # stream -> seq: operations of other streams that this stream's next operation follows
        # (event waits and legacy ordering); the pools' follow-event-dependencies reuse reads it
        self.follows: dict[FakeStream, int] = {}
        self.host_seen = 0  # the newest operation a host synchronize waited for
        self.capture: Any = None  # the capture.Capture this stream is in (None: not capturing)
        self.frontier: list[int] = []  # while capturing: the graph nodes its next node follows

    def __repr__(self) -> str:
        kind = "legacy" if self.legacy else ("blocking" if self.blocking else "non-blocking")
        return f"<fake stream {self.handle:#x} cuda:{self.device} {kind} {self.done}/{self.enqueued}>"

    __hash__ = object.__hash__

    # -- enqueue (caller holds LOCK) --------------------------------------------------------------
    def enqueue(self, fn: Callable[[], Any], label: str, deps: Iterable = ()) -> int:
        if self.capture is not None:  # every capturable call records a node instead (capture.py)
            raise state.FakeUnsupported(f"{label} on a capturing stream: not modelled by the fake")
        deps = [(s, q) for s, q in deps if s.done < q]
        dev = DEVICES[self.device]
        if self.legacy:
            deps += [(s, s.enqueued) for s in dev.streams if s.blocking and s.done < s.enqueued]
        elif self.blocking and dev.legacy.done < dev.legacy.enqueued:
            deps.append((dev.legacy, dev.legacy.enqueued))
        for s, q in deps:
            if self.follows.get(s, 0) < q:
                self.follows[s] = q
        self.enqueued += 1
        self.ops.append(Op(self.enqueued, fn, deps, label))
        CHANGED.notify_all()
        return self.enqueued

    def start(self) -> None:
        """Start the worker thread. Never under LOCK: a new thread may run a garbage collection
        whose finalizers (streamrt's stream retirement) call the fake, which takes LOCK."""
        self.thread = threading.Thread(target=self._work, daemon=True,
                                       name=f"fake-cuda:{self.device}-stream-{self.handle:#x}")
        self.thread.start()

    def idle(self) -> bool:
        return self.done >= self.enqueued

    def reached(self, seq: int) -> bool:
        return self.done >= seq

    def ordered_after(self, other: FakeStream, seq: int) -> bool:
        """True when this stream's next operation depends on ``other``'s operation ``seq``
        (an event wait or legacy-stream ordering; completion alone is no dependency)."""
        return other is self or self.follows.get(other, 0) >= seq

    def saw(self, seq: int) -> None:
        """A host synchronize waited for operation ``seq``."""
        self.host_seen = max(self.host_seen, seq)

    # -- the worker -------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with CHANGED:
                while True:
                    if not self.ops:
                        if self.destroyed:
                            DEVICES[self.device].retire(self)
                            return
                        CHANGED.wait()
                        continue
                    op = self.ops[0]
                    if all(s.done >= q for s, q in op.deps):
                        break
                    CHANGED.wait()
            if state.delay_us:
                time.sleep(random.uniform(0, state.delay_us) / 1e6)
            try:
                op.fn()
            except BaseException as exc:  # a fault of the fake itself: keep going, report it
                state.fault(f"{self!r}: {op.label} raised {exc!r}\n{traceback.format_exc()}")
            with CHANGED:
                self.ops.popleft()
                self.done = op.seq
                CHANGED.notify_all()


class FakeDevice:
    """One GPU: its legacy stream, its other streams (destroyed ones until drained)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.legacy = FakeStream(index, legacy=True, handle=-(index + 1))
        self.streams: list[FakeStream] = []
        self.used = 0  # bytes of device memory in use (allocations, pool reservations, VMM)

    def retire(self, s: FakeStream) -> None:
        if s in self.streams:
            self.streams.remove(s)

    def all_streams(self) -> list[FakeStream]:
        return [self.legacy, *self.streams]


DEVICES: list[FakeDevice] = []
STREAMS: dict[int, FakeStream] = {}  # live (not destroyed) streams by handle


def reset_devices() -> None:
    DEVICES[:] = [FakeDevice(i) for i in range(state.device_count())]
    for d in DEVICES:
        d.legacy.start()


def resolve(handle: Any) -> FakeStream | None:
    """The stream of a handle: 0 and ``cudaStreamLegacy`` are the current device's legacy stream."""
    h = state.as_int(handle)
    if h in (0, rt.cudaStreamLegacy):
        d = state.current_device()
        return DEVICES[d].legacy if d < len(DEVICES) else None
    return STREAMS.get(h)


def wait_for(pred: Callable[[], bool]) -> None:
    """Block the calling thread (releasing lock and GIL) until ``pred()`` holds."""
    with CHANGED:
        while not pred():
            CHANGED.wait()


def synchronize_device(index: int) -> None:
    dev = DEVICES[index]
    with LOCK:
        tails = [(s, s.enqueued) for s in dev.all_streams()]
    wait_for(lambda: all(s.done >= q for s, q in tails))
    for s, q in tails:
        s.saw(q)
    from .pools import release_at_sync

    release_at_sync(index)


def wait_done(s: FakeStream, seq: int) -> None:
    wait_for(lambda: s.done >= seq)


def call_host_function(fn: int, user_data: Any) -> None:
    """Call a C host function the way the driver does, on this (worker) thread."""
    with state.host_function_scope():
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(fn)(user_data)


# -- the API -------------------------------------------------------------------------------------
def _create(flags: int, priority: int) -> tuple:
    if int(flags) & ~1:
        return (E.cudaErrorInvalidValue, None)
    d = state.current_device()
    s = FakeStream(d, non_blocking=bool(int(flags) & rt.cudaStreamNonBlocking), priority=int(priority))
    s.start()
    with LOCK:
        DEVICES[d].streams.append(s)
        STREAMS[s.handle] = s
    return (SUCCESS, rt.cudaStream_t(s.handle))


@runtime("cudaStreamCreate")
def cudaStreamCreate() -> tuple:
    return _create(0, 0)


@runtime("cudaStreamCreateWithFlags")
def cudaStreamCreateWithFlags(flags: int) -> tuple:
    return _create(flags, 0)


@runtime("cudaStreamCreateWithPriority")
def cudaStreamCreateWithPriority(flags: int, priority: int) -> tuple:
    return _create(flags, min(max(int(priority), -5), 0))  # clamped to [greatest, least]


@runtime("cudaStreamGetPriority")
def cudaStreamGetPriority(stream: Any) -> tuple:
    with LOCK:
        s = resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        return (SUCCESS, s.priority)  # as clamped at creation; the legacy stream's is 0


@runtime("cudaStreamGetFlags")
def cudaStreamGetFlags(stream: Any) -> tuple:
    with LOCK:
        s = resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        non_blocking = not s.legacy and not s.blocking
        return (SUCCESS, rt.cudaStreamNonBlocking if non_blocking else rt.cudaStreamDefault)


@runtime("cudaStreamGetDevice")
def cudaStreamGetDevice(stream: Any) -> tuple:
    # the legacy handles (0, cudaStreamLegacy) name the calling thread's current device's stream
    with LOCK:
        s = resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        return (SUCCESS, s.device)


@runtime("cudaStreamDestroy")
def cudaStreamDestroy(stream: Any) -> tuple:
    with LOCK:
        s = resolve(stream)
        if s is None or s.legacy:
            return (E.cudaErrorInvalidResourceHandle,)
        del STREAMS[s.handle]
        s.destroyed = True  # enqueued work still completes; the handle is dead now
        CHANGED.notify_all()
    return (SUCCESS,)


def _queryable(stream: Any) -> tuple[Any, Any]:
    """The stream, or the error of querying or synchronizing it (call holding LOCK)."""
    s = resolve(stream)
    if s is None:
        return None, E.cudaErrorInvalidResourceHandle
    return s, capture.busy(s)


@runtime("cudaStreamQuery")
def cudaStreamQuery(stream: Any) -> tuple:
    with LOCK:
        s, err = _queryable(stream)
        if err is not None:
            return (err,)
        return (SUCCESS,) if s.idle() else (E.cudaErrorNotReady,)


@runtime("cudaStreamSynchronize")
def cudaStreamSynchronize(stream: Any) -> tuple:
    with LOCK:
        s, err = _queryable(stream)
        if err is not None:
            return (err,)
        seq = s.enqueued
    wait_done(s, seq)
    s.saw(seq)
    from .pools import release_at_sync

    release_at_sync(s.device)
    return (SUCCESS,)


@runtime("cudaStreamWaitEvent")
def cudaStreamWaitEvent(stream: Any, event: Any, flags: int = 0) -> tuple:
    from .events import EVENTS

    with LOCK:
        s = resolve(stream)
        ev = EVENTS.get(state.as_int(event))
        if s is None or ev is None:
            return (E.cudaErrorInvalidResourceHandle,)
        if int(flags) & ~1:
            return (E.cudaErrorInvalidValue,)
        res = capture.wait_event(s, ev)
        if res is not None:
            return (res,)
        deps = [] if ev.rec is None else [ev.rec[:2]]  # the record current now; later ones don't count
        s.enqueue(lambda: None, "wait event", deps)
    return (SUCCESS,)


@runtime("cudaLaunchHostFunc")
def cudaLaunchHostFunc(stream: Any, fn: Any, user_data: Any) -> tuple:
    addr = state.as_int(fn)
    with LOCK:
        s = resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle,)
        if not addr:
            return (E.cudaErrorInvalidValue,)
        data = state.as_int(user_data)
        res = capture.intercept(s, "host", lambda: call_host_function(addr, data))
        if res is not None:
            return (res,)
        s.enqueue(lambda: call_host_function(addr, data), "host function")
    return (SUCCESS,)


@runtime("cudaDeviceSynchronize")
def cudaDeviceSynchronize() -> tuple:
    with LOCK:
        busy = capture.device_busy(state.current_device())
    if busy is not None:
        return (busy,)
    synchronize_device(state.current_device())
    return (SUCCESS,)


from . import capture  # noqa: E402 (capture.py builds on this module's streams)
