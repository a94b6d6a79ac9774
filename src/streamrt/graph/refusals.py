"""What a capture refuses elsewhere (DESIGN.md §5): the capture registry, mode gating of
unsafe calls, and the legacy-stream and device-synchronize rules.

Unsafe synchronous calls are gated by the calling thread's interaction mode: GLOBAL is refused
if this thread has a non-relaxed capture or any thread has a GLOBAL capture; THREAD_LOCAL only
if this thread has a non-relaxed capture; RELAXED never.

State: ``_active`` holds every capture not yet ended (changed under ``_lock`` by
``capture.begin`` and ``Capture.finish``); ``_tls.mode`` is each thread's interaction mode
(``cudaThreadExchangeStreamCaptureMode``, default GLOBAL). A refusal invalidates the
captures it names, unless another thread ended them meanwhile: the call then came after the
end and goes ahead.
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from .. import sync
from ..errors import (
    CapturedEventError,
    CaptureImplicitError,
    CaptureUnsupportedError,
    InvalidTypeError,
)
from ..weak import members

if TYPE_CHECKING:
    from ..device import Device
    from ..event import Event
    from ..stream import Stream
    from .capture import Capture
    from .graph import Graph
    from .node import Node


class CaptureMode(Enum):
    """``cudaStreamCaptureMode``."""

    GLOBAL = 0
    THREAD_LOCAL = 1
    RELAXED = 2


class CaptureStatus(Enum):
    """``cudaStreamCaptureStatus``."""

    NONE = 0
    ACTIVE = 1
    INVALIDATED = 2


class CaptureInfo(NamedTuple):
    """``cudaStreamGetCaptureInfo``: status, id, the graph being built, the stream's dependencies."""

    status: CaptureStatus
    capture_id: int
    graph: Graph | None
    dependencies: tuple[Node, ...]


_active: set[Capture] = set()
_lock = threading.Lock()
_tls = threading.local()


def _captures_on(device: Device) -> list[Capture]:
    """The active captures that a stream of ``device`` takes part in."""
    with _lock:
        caps = list(_active)
    return [c for c in caps if any(s.device is device for s in list(c.deps))]


def _blocking_captures(device: Device) -> list[tuple[Stream, Capture]]:
    """Each blocking stream of ``device`` taking part in a capture, with that capture."""
    return [(b, cap) for b in members(device._blocking) if (cap := b._capture) is not None]


def illegal_sync(stream: Stream, cap: Capture, what: str) -> None:
    """A synchronize or query of a stream capturing into ``cap`` (read once by the caller):
    invalidates it and raises, unless another thread ended it meanwhile (the call then came after
    the end, and proceeds)."""
    if cap.invalidate(f"{what} of capturing {stream!r}"):
        raise CaptureUnsupportedError(f"{what} of {stream!r} is not permitted while it is capturing")


def illegal_event_use(event: Event, cap: Capture, what: str) -> None:
    """A synchronize or query of an event captured by ``cap``: invalidates it and raises, unless
    it ended meanwhile."""
    if cap.invalidate(f"{what} of captured {event!r}"):
        raise CapturedEventError(f"{what} of {event!r} is not permitted: it was recorded in {cap!r}")


def check_device_sync(device: Device) -> None:
    """A device synchronize while one of its streams captures: refused, captures invalidated."""
    if not _active:
        return
    hit = [c for c in _captures_on(device)
           if c.invalidate(f"{device.name} was synchronized during the capture")]
    if hit:
        raise CaptureUnsupportedError(
            f"synchronize of {device.name} is not permitted while {hit[0]!r} is active"
        )


sync.device_sync_checks.append(check_device_sync)


def check_legacy(stream: Stream) -> None:
    """Work on the legacy default stream while a blocking stream of its device captures."""
    for b, cap in _blocking_captures(stream.device):
        if cap.invalidate(f"the legacy default stream was used while {b!r} captures"):
            raise CaptureImplicitError(
                f"the legacy default stream of {stream.device.name} would implicitly synchronize "
                f"with capturing {b!r}; use non-blocking streams"
            )


def check_legacy_query(stream: Stream) -> None:
    """A capture query of the legacy default stream while a blocking stream of its device takes
    part in a capture: ``cudaErrorStreamCaptureImplicit``, as CUDA returns it; unlike a use of the
    legacy stream, the query leaves the capture as it is."""
    for b, cap in _blocking_captures(stream.device):
        if cap.status is not CaptureStatus.NONE:
            raise CaptureImplicitError(
                f"the capture status of the legacy default stream of {stream.device.name} is "
                f"unspecified while blocking {b!r} captures; use non-blocking streams"
            )


def exchange_capture_mode(mode: CaptureMode) -> CaptureMode:
    """Set this thread's interaction mode for unsafe calls (``cudaThreadExchangeStreamCaptureMode``)."""
    if not isinstance(mode, CaptureMode):
        raise InvalidTypeError(f"mode must be a srt.CaptureMode, not {mode!r}")
    prev = getattr(_tls, "mode", CaptureMode.GLOBAL)
    _tls.mode = mode
    return prev


def check_unsafe(what: str) -> None:
    """Gate a potentially unsafe synchronous call (``srt.malloc``, ``srt.memcpy``...) by mode."""
    if not _active:
        return
    mode = getattr(_tls, "mode", CaptureMode.GLOBAL)
    if mode is CaptureMode.RELAXED:
        return
    me = threading.get_ident()
    with _lock:
        caps = list(_active)
    culprits = [c for c in caps if c.thread == me and c.mode is not CaptureMode.RELAXED]
    if mode is CaptureMode.GLOBAL:
        culprits += [c for c in caps if c.mode is CaptureMode.GLOBAL and c not in culprits]
    # a capture that another thread ended since the copy above is no culprit: the call came
    # after its end (the others are invalidated as they are found, at once)
    culprits = [c for c in culprits if c.invalidate(f"{what} was called during the capture")]
    if culprits:
        raise CaptureUnsupportedError(
            f"{what} is not permitted while {culprits[0]!r} is active (use stream-ordered calls, "
            "a THREAD_LOCAL/RELAXED capture, or call it outside the capture)"
        )


def capture_building(graph: Graph) -> Capture | None:
    """The active capture adding nodes to ``graph``, if any."""
    with _lock:
        caps = list(_active)
    return next((c for c in caps if c.graph is graph), None)
