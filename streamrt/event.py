"""Events: markers in a stream's order (``cudaEvent_t``), with optional timing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .device import Device
from .errors import InvalidHandleError, InvalidTypeError, NotReadyError
from .hostsync import after_sync, covered, proved

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["Event"]


class Event:
    """A marker in a stream (``cudaEvent_t``); ``timing=True`` lets it measure elapsed time."""

    __slots__ = (
        "device", "timing", "_stream", "_pos", "_clock", "_stamp", "_destroyed", "_capture",
        "_nodes", "__weakref__",
    )

    def __init__(self, device: Any = None, *, timing: bool = False) -> None:
        if not isinstance(timing, bool):
            raise InvalidTypeError("timing must be a bool")
        self.device = Device(device)
        self.timing = timing
        self._stream: Stream | None = None
        self._pos = 0
        self._clock: dict[int, int] = {}
        self._stamp: list | None = None
        self._destroyed = False
        self._capture = None  # the capture that recorded it, while that capture lasts
        self._nodes: tuple = ()  # captured node set
        self.device._events.add(self)

    def __repr__(self) -> str:
        state = "unrecorded" if self._stream is None else f"at {self._stream.name}@{self._pos}"
        return f"<Event {self.device.name} {state}{' timing' if self.timing else ''}>"

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")

    def _check_capture(self, what: str) -> None:
        if self._capture is not None:
            from .graph.capture import illegal_event_use

            illegal_event_use(self, what)

    def query(self) -> bool:
        """True when the recorded work has completed, or the event was never recorded."""
        self._check_alive()
        self._check_capture("query")
        s = self._stream
        return s is None or s._q.done >= self._pos

    def synchronize(self) -> None:
        """Block until the recorded work has completed (``cudaEventSynchronize``)."""
        self._check_alive()
        self._check_capture("synchronize")
        s, pos, clock = self._stream, self._pos, self._clock  # once: another thread may re-record
        if s is None:
            return
        s._q.wait_done(pos)
        proved(s, pos, clock)
        after_sync(self.device, covered(clock))

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both must be timing events, recorded, complete."""
        if not isinstance(end, Event):
            raise InvalidTypeError(f"elapsed_time needs an Event, not {type(end).__name__}")
        for e in (self, end):
            e._check_alive()
            if not e.timing:
                raise InvalidHandleError(
                    f"{e!r} was created without timing=True; it cannot measure elapsed time"
                )
            if e._stream is None or e._stamp is None:
                raise InvalidHandleError(f"{e!r} has not been recorded")
        try:
            return self._stream._q.elapsed_ms(self._stamp, end._stamp)
        except NotReadyError:
            pending = self if not self.query() else end
            raise NotReadyError(f"{pending!r} has not completed yet") from None

    def destroy(self) -> None:
        """Destroy the event (``cudaEventDestroy``)."""
        self._check_alive()
        self._destroyed = True
        self.device._events.discard(self)


# graph/ imports this module: bind it once this module is fully defined
