"""Task graphs: builder (Graph, Node), stream capture, executable graphs, graph memory."""

from __future__ import annotations

from typing import Any

from .capture import CaptureInfo, CaptureMode, CaptureStatus, exchange_capture_mode
from .exec import GraphExec, GraphExecUpdateResult
from .graph import Graph
from .node import Node, NodeType

__all__ = [
    "Graph", "Node", "NodeType", "GraphExec", "GraphExecUpdateResult", "CaptureMode",
    "CaptureStatus", "CaptureInfo", "graph_capture", "exchange_capture_mode",
]


class graph_capture:  # noqa: N801 - used like a function, as torch.cuda.graph
    """``with srt.graph_capture(s, mode=...) as cap:`` captures ``s``; then ``cap.graph``."""

    def __init__(self, stream: Any, mode: CaptureMode = CaptureMode.GLOBAL) -> None:
        from ..errors import InvalidTypeError
        from ..stream import Stream

        if not isinstance(stream, Stream):
            raise InvalidTypeError(f"graph_capture needs a Stream, not {type(stream).__name__}")
        self.stream = stream
        self.mode = mode
        self.graph: Graph | None = None

    def __enter__(self) -> graph_capture:
        self.stream.begin_capture(self.mode)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.graph = self.stream.end_capture()
            return
        cap = self.stream._capture
        if cap is not None:  # an error inside the block: end the capture, keep the error
            cap.invalidate(f"{exc_type.__name__} raised inside graph_capture")
            cap.finish()
