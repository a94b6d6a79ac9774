"""Events: a record is an operation of its stream that stamps the time it completes.

A never-recorded event is complete. Re-recording replaces what the event tracks;
``cudaStreamWaitEvent`` uses the record current at its call. ``cudaEventElapsedTime`` gives the
milliseconds between two completion stamps: cudaErrorNotReady while either is pending and
cudaErrorInvalidResourceHandle for a never-recorded or non-timing event, or events of two
devices. ``cudaEventRecord`` needs the event and the stream on one device.
"""

from __future__ import annotations

import time
from typing import Any

from cuda.bindings import runtime as rt

from . import capture, state, streams
from .binding import runtime
from .state import LOCK, SUCCESS, E


class FakeEvent:
    def __init__(self, device: int, flags: int) -> None:
        self.handle = state.new_handle()
        self.device = device
        self.timing = not (flags & rt.cudaEventDisableTiming)
        self.rec: tuple[streams.FakeStream, int, list] | None = None  # (stream, seq, [stamp])
        self.captured: tuple | None = None  # last recorded in a capture: (capture, its nodes)

    def complete(self) -> bool:
        return self.rec is None or self.rec[0].done >= self.rec[1]


EVENTS: dict[int, FakeEvent] = {}


def _create(flags: int) -> tuple:
    flags = int(flags)
    if flags & ~0xF or (flags & 4 and not flags & rt.cudaEventDisableTiming):
        return (E.cudaErrorInvalidValue, None)  # interprocess events must disable timing
    with LOCK:
        ev = FakeEvent(state.current_device(), flags)
        EVENTS[ev.handle] = ev
    return (SUCCESS, rt.cudaEvent_t(ev.handle))


@runtime("cudaEventCreate")
def cudaEventCreate() -> tuple:
    return _create(0)


@runtime("cudaEventCreateWithFlags")
def cudaEventCreateWithFlags(flags: int) -> tuple:
    return _create(flags)


@runtime("cudaEventRecord")
def cudaEventRecord(event: Any, stream: Any = 0) -> tuple:
    with LOCK:
        ev = EVENTS.get(state.as_int(event))
        s = streams.resolve(stream)
        if ev is None or s is None or ev.device != s.device:
            return (E.cudaErrorInvalidResourceHandle,)
        res = capture.record_event(ev, s)
        if res is not None:
            return (res,)
        stamp: list = [None]

        def mark() -> None:
            stamp[0] = time.perf_counter()

        seq = s.enqueue(mark, "event record")
        ev.rec = (s, seq, stamp)
    return (SUCCESS,)


def _usable(event: Any) -> tuple[Any, Any]:
    """The event, or the error of querying or synchronizing it (call holding LOCK)."""
    ev = EVENTS.get(state.as_int(event))
    if ev is None:
        return None, E.cudaErrorInvalidResourceHandle
    return ev, (E.cudaErrorCapturedEvent if ev.captured is not None else None)


@runtime("cudaEventQuery")
def cudaEventQuery(event: Any) -> tuple:
    with LOCK:
        ev, err = _usable(event)
        if err is not None:
            return (err,)
        return (SUCCESS,) if ev.complete() else (E.cudaErrorNotReady,)


@runtime("cudaEventSynchronize")
def cudaEventSynchronize(event: Any) -> tuple:
    with LOCK:
        ev, err = _usable(event)
        if err is not None:
            return (err,)
        rec = ev.rec
    if rec is not None:
        streams.wait_done(rec[0], rec[1])
        rec[0].saw(rec[1])
    from .pools import release_at_sync

    release_at_sync(ev.device)
    return (SUCCESS,)


@runtime("cudaEventDestroy")
def cudaEventDestroy(event: Any) -> tuple:
    with LOCK:
        if EVENTS.pop(state.as_int(event), None) is None:
            return (E.cudaErrorInvalidResourceHandle,)
    return (SUCCESS,)  # a pending record still completes; nothing waits on the handle


@runtime("cudaEventElapsedTime")
def cudaEventElapsedTime(start: Any, end: Any) -> tuple:
    with LOCK:
        a, b = EVENTS.get(state.as_int(start)), EVENTS.get(state.as_int(end))
        if a is None or b is None or not (a.timing and b.timing) or a.device != b.device:
            return (E.cudaErrorInvalidResourceHandle, None)
        if a.captured is not None or b.captured is not None:
            return (E.cudaErrorCapturedEvent, None)
        if a.rec is None or b.rec is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        if not (a.complete() and b.complete()):
            return (E.cudaErrorNotReady, None)
        return (SUCCESS, (b.rec[2][0] - a.rec[2][0]) * 1000.0)
