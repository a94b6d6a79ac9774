"""The cuda backend's :class:`~..base.Mark`: the completions of a graph's EVENT_RECORD node, read
from the CUDA event its record node records (graph.py builds the node with it)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from ...errors import NotPermittedError, NotReadyError
from ..base import Mark
from . import hostfn
from .errors import check
from .queue import _Stamp
from .runtime import NOT_READY, SUCCESS, activate, rt

if TYPE_CHECKING:
    from .device import CudaDevice


class CudaMark(Mark):
    """The completions of a graph's EVENT_RECORD node (see :class:`~..base.Mark`): the CUDA event
    its record node records (a timing event: its stamp is the event itself). ``pos`` is the
    newest launch whose record was enqueued (set once ``cudaGraphLaunch`` returned), ``_done``
    the newest seen complete. Waiting for an older launch's record waits for the newest one,
    which the event holds: never less (launches of one exec run in order)."""

    def __init__(self, dev: CudaDevice, name: str) -> None:
        self.name = name
        self.dev = dev
        self.errors: list[tuple[int, BaseException, str]] = []
        activate(dev.index)
        self._stamp = _Stamp()
        self.event = self._stamp.event
        self.pos = 0
        self._done = 0

    @property
    def done(self) -> int:
        if self._done >= self.pos:
            return self._done
        pos = self.pos  # before the query: a later launch's record is not proven by it
        err = rt.cudaEventQuery(self.event)[0]
        if err == SUCCESS:
            self._done = max(self._done, pos)
        elif err != NOT_READY:
            check((err,))
        return self._done

    def wait_done(self, pos: int) -> None:
        if self._done >= pos:
            return
        if hostfn.on_worker() and self.done < pos:
            raise NotPermittedError(f"{self.name}: a host function waited for an event recorded "
                                    "by a graph node; host functions must not synchronize")
        if hostfn.deferred:
            hostfn.run_deferred()
        target, ev = self.pos, self.event
        hostfn.block(lambda: rt.cudaEventQuery(ev), lambda: rt.cudaEventSynchronize(ev),
                     settle=True)
        self._done = max(self._done, target)

    def wait_event(self, pos: int, pins: ExitStack) -> Any | None:
        """As :meth:`CudaQueue.wait_event`: the node's event (its newest record), or None."""
        return None if self._done >= pos else self.event

    def op_stamp(self) -> _Stamp:
        return self._stamp

    def elapsed_ms(self, start: Any, end: Any) -> float:
        err, ms = rt.cudaEventElapsedTime(start.event, end.event)
        if err == NOT_READY:
            raise NotReadyError("the event has not completed yet")
        check((err,))
        return float(ms)
