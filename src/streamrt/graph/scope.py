"""``with srt.graph_capture(s):``: a block whose work on ``s`` is captured into a graph."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidTypeError
from ..stream import Stream
from .capture import CaptureMode
from .graph import Graph

__all__ = ["graph_capture"]


class graph_capture:  # noqa: N801 - used like a function, as torch.cuda.graph
    """``with srt.graph_capture(s, mode=...) as cap:`` captures ``s`` (current in the block)."""

    def __init__(self, stream: Any, mode: CaptureMode = CaptureMode.GLOBAL) -> None:
        if not isinstance(stream, Stream):
            raise InvalidTypeError(f"graph_capture needs a Stream, not {type(stream).__name__}")
        self.stream = stream
        self.mode = mode
        self.graph: Graph | None = None

    def __enter__(self) -> graph_capture:
        # the stream is current inside the block (as torch.cuda.graph): ``ops.run``,
        # ``Tensor.empty`` and the rest that default to the current stream are captured too,
        # not run eagerly on the legacy stream
        self.stream.__enter__()
        try:
            self.stream.begin_capture(self.mode)
        except BaseException:
            self.stream.__exit__()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self.graph = self.stream.end_capture()
                return
            cap = self.stream._capture
            if cap is not None:  # an error inside the block: end the capture, keep the error
                cap.invalidate(f"{exc_type.__name__} raised inside graph_capture")
                cap.finish()
        finally:
            self.stream.__exit__()
