"""A stream's capture calls (``Stream.begin_capture`` ... ``update_capture_dependencies``),
bound as its methods: the capture itself (its graph, modes and dependencies) is graph/capture.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import instrument, legacy
from .graph import capture
from .graph.refusals import CaptureMode
from .validate import check_bool

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["begin_capture", "begin_capture_to_graph", "capture_info", "end_capture",
           "is_capturing", "update_capture_dependencies"]


def begin_capture(self: Stream, mode: Any = None) -> None:
    """Start capturing this stream into a graph (``cudaStreamBeginCapture``)."""
    legacy.capturing = True  # before the capture is visible (see legacy.capturing)
    capture.begin(self, CaptureMode.GLOBAL if mode is None else mode)
    if instrument.listeners:
        instrument.notify("capture", self, "begin")


def begin_capture_to_graph(self: Stream, graph: Any, deps: Any = (), mode: Any = None) -> None:
    """Capture this stream into the existing ``graph``, after its nodes ``deps``
    (``cudaStreamBeginCaptureToGraph``); ``end_capture`` returns that graph."""
    legacy.capturing = True  # before the capture is visible (see legacy.capturing)
    capture.begin(self, CaptureMode.GLOBAL if mode is None else mode, graph, deps)
    if instrument.listeners:
        instrument.notify("capture", self, "begin")


def end_capture(self: Stream) -> Any:
    """End the capture begun on this stream and return its graph (``cudaStreamEndCapture``)."""
    self._check_alive()
    try:
        return capture.end(self)
    finally:
        if instrument.listeners:
            instrument.notify("capture", self, "end")


def is_capturing(self: Stream) -> bool:
    """True from ``begin_capture`` (or joining one) to ``end_capture``, invalidated or not."""
    self._check_alive()  # (a destroyed stream's handle is refused, as by capture_info)
    return capture.is_capturing(self)


def capture_info(self: Stream) -> Any:
    """Status, id, graph and current dependencies of the capture (``cudaStreamGetCaptureInfo``)."""
    self._check_alive()
    return capture.info(self)


def update_capture_dependencies(self: Stream, nodes: Any, *, replace: bool = False) -> None:
    """Add (or, with ``replace``, set) the capture dependencies of this stream."""
    self._check_alive()
    capture.update_dependencies(self, nodes, check_bool(replace, "replace"))
