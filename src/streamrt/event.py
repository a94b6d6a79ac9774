"""Events: markers in a stream's order (``cudaEvent_t``), with optional timing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .device import Device
from .errors import InvalidHandleError, InvalidTypeError, NotReadyError
from .sync import after_sync, covered, reach
from .validate import is_bool

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["Event"]

Record = tuple["Stream | None", int, dict[int, int], Any]
UNRECORDED: Record = (None, 0, {}, None)  # its clock is shared: records are never changed in place


class Event:
    """A marker in a stream (``cudaEvent_t``); ``timing=True`` lets it measure elapsed time."""

    __slots__ = ("device", "timing", "_rec", "_destroyed", "_capture", "_nodes", "__weakref__")

    def __init__(self, device: Any = None, *, timing: bool = False) -> None:
        if not is_bool(timing):
            raise InvalidTypeError("timing must be a bool")
        timing = bool(timing)
        self.device = Device(device)
        self.timing = timing
        # the record: (stream, position, clock, timing stamp), replaced whole by each record and
        # read once by each use, as another thread may re-record the event meanwhile
        self._rec: Record = UNRECORDED
        self._destroyed = False
        self._capture = None  # the capture that recorded it, while that capture lasts
        self._nodes: tuple = ()  # captured node set
        self.device._events.add(self)

    @property
    def _stream(self) -> Stream | None:
        return self._rec[0]

    @property
    def _pos(self) -> int:
        return self._rec[1]

    def __repr__(self) -> str:
        s, pos = self._rec[:2]
        state = "unrecorded" if s is None else f"at {s.name}@{pos}"
        return f"<Event {self.device.name} {state}{' timing' if self.timing else ''}>"

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")

    def _check_recordable(self, stream: Stream) -> None:
        """What ``cudaEventRecord`` refuses: a destroyed event, or one of another device."""
        self._check_alive()
        if self.device is not stream.device:
            raise InvalidHandleError(
                f"event of {self.device.name} cannot be recorded on a stream of "
                f"{stream.device.name}")

    def _check_capture(self, what: str) -> None:
        cap = self._capture  # read once: another thread may end the capture
        if cap is not None:
            cap.refuse_event(self, what)

    def query(self) -> bool:
        """True when the recorded work has completed, or the event was never recorded."""
        self._check_alive()
        self._check_capture("query")
        s, pos = self._rec[:2]
        return s is None or s._q.done >= pos

    def synchronize(self) -> None:
        """Block until the recorded work has completed (``cudaEventSynchronize``)."""
        self._check_alive()
        self._check_capture("synchronize")
        s, pos, clock, _stamp = self._rec
        if s is None:
            return
        pos, clock = reach(s, pos, clock)
        # the record's clock names its stream; a short proof (see reach) names nothing
        after_sync(self.device, covered(clock) if clock else [(s, pos)])

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both must be timing events, recorded, complete."""
        if not isinstance(end, Event):
            raise InvalidTypeError(f"elapsed_time needs an Event, not {type(end).__name__}")
        for e in (self, end):  # cudaErrorCapturedEvent: last recorded in a capturing stream
            e._check_alive()
            e._check_capture("elapsed_time")
        recs = self._rec, end._rec
        for e, (s, _pos, _clock, stamp) in zip((self, end), recs, strict=True):
            if not e.timing:
                raise InvalidHandleError(
                    f"{e!r} was created without timing=True; it cannot measure elapsed time"
                )
            if s is None or stamp is None:
                raise InvalidHandleError(f"{e!r} has not been recorded")
        if self.device is not end.device:  # two devices' clocks (the driver refuses the pair)
            raise InvalidHandleError(f"elapsed_time between events of two devices: {self!r} and "
                                     f"{end!r}")
        try:
            return recs[0][0]._q.elapsed_ms(recs[0][3], recs[1][3])
        except NotReadyError:
            pending = self if not self.query() else end
            raise NotReadyError(f"{pending!r} has not completed yet") from None

    def destroy(self) -> None:
        """Destroy the event (``cudaEventDestroy``)."""
        self._check_alive()
        self._destroyed = True
        self.device._events.discard(self)


# graph/ imports this module: bind it once this module is fully defined
