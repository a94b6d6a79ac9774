"""Streams and events in ACL's terms: ``acl.rt.create_stream`` / ``destroy_stream`` /
``synchronize_stream`` / ``query_stream``, ``create_event`` / ``record_event`` /
``stream_wait_event`` / ``synchronize_event`` / ``query_event_status`` /
``event_elapsed_time`` / ``destroy_event``, each a call of ``srt.Stream`` / ``srt.Event``.

A stream argument of ``None`` or ``0`` (``nullptr``) is the default stream of the thread's
current device, as in ACL."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidHandleError, InvalidValueError
from ..event import Event
from ..stream import Stream
from . import constants as C
from .context import current_context, thread_context
from .errors import api

__all__ = ["create_event", "create_event_with_flag", "create_stream", "destroy_event",
           "destroy_stream", "event_elapsed_time", "query_event_status", "query_stream",
           "record_event", "stream_of", "stream_wait_event", "synchronize_event",
           "synchronize_stream"]


def stream_of(stream: Any) -> Stream:
    """The ``srt.Stream`` an ACL stream argument names (``None``/``0``: the default stream)."""
    if stream is None or (type(stream) is int and stream == 0):
        return current_context().device.default_stream
    if not isinstance(stream, Stream):
        raise InvalidHandleError(f"{stream!r} is not a stream (acl.rt.create_stream)")
    return stream


def _event(event: Any) -> Event:
    if not isinstance(event, Event):
        raise InvalidHandleError(f"{event!r} is not an event (acl.rt.create_event)")
    return event


@api(None)
def create_stream() -> Stream:
    """``aclrtCreateStream`` -> ``(stream, ret)``: ``srt.Stream()`` on the context's device
    (``ACL_ERROR_RT_CONTEXT_NULL`` in a thread that set no device or context)."""
    return Stream(thread_context().device)


@api()
def destroy_stream(stream: Stream) -> None:
    """``aclrtDestroyStream``: ``s.destroy()`` (its pending work still completes)."""
    s = stream_of(stream)
    if s is s.device.default_stream:
        raise InvalidHandleError("the default stream cannot be destroyed")
    s.destroy()


@api()
def synchronize_stream(stream: Stream) -> None:
    """``aclrtSynchronizeStream``: ``s.synchronize()``."""
    stream_of(stream).synchronize()


@api(None)
def query_stream(stream: Stream) -> int:
    """``aclrtStreamQuery`` -> ``(ACL_STREAM_STATUS_COMPLETE or _NOT_READY, ret)``."""
    done = stream_of(stream).query()
    return C.ACL_STREAM_STATUS_COMPLETE if done else C.ACL_STREAM_STATUS_NOT_READY


@api(None)
def create_event() -> Event:
    """``aclrtCreateEvent`` -> ``(event, ret)``: ``srt.Event(timing=True)``, as ACL's events
    carry a timestamp (``ACL_ERROR_RT_CONTEXT_NULL`` in a thread that set no device or context)."""
    return Event(thread_context().device, timing=True)


_EVENT_FLAGS = C.ACL_EVENT_SYNC | C.ACL_EVENT_CAPTURE_STREAM_PROGRESS | C.ACL_EVENT_TIME_LINE


@api(None)
def create_event_with_flag(flag: int) -> Event:
    """``aclrtCreateEventWithFlag`` -> ``(event, ret)``: timing only with ``ACL_EVENT_TIME_LINE``."""
    if type(flag) is not int or flag & ~_EVENT_FLAGS:
        raise InvalidValueError(f"event flag {flag!r} is not a combination of ACL_EVENT_*")
    return Event(thread_context().device, timing=bool(flag & C.ACL_EVENT_TIME_LINE))


@api()
def record_event(event: Event, stream: Stream) -> None:
    """``aclrtRecordEvent``: ``s.record(event)``."""
    stream_of(stream).record(_event(event))


@api()
def stream_wait_event(stream: Stream, event: Event) -> None:
    """``aclrtStreamWaitEvent``: ``s.wait(event)``."""
    stream_of(stream).wait(_event(event))


@api()
def synchronize_event(event: Event) -> None:
    """``aclrtSynchronizeEvent``: ``event.synchronize()``."""
    _event(event).synchronize()


@api(None)
def query_event_status(event: Event) -> int:
    """``aclrtQueryEventStatus`` -> ``(ACL_EVENT_RECORDED_STATUS_COMPLETE or _NOT_READY, ret)``."""
    done = _event(event).query()
    return (C.ACL_EVENT_RECORDED_STATUS_COMPLETE if done
            else C.ACL_EVENT_RECORDED_STATUS_NOT_READY)


@api(None)
def event_elapsed_time(start: Event, end: Event) -> float:
    """``aclrtEventElapsedTime`` -> ``(milliseconds, ret)``: ``start.elapsed_time(end)``."""
    return _event(start).elapsed_time(_event(end))


@api()
def destroy_event(event: Event) -> None:
    """``aclrtDestroyEvent``: ``event.destroy()``."""
    _event(event).destroy()
