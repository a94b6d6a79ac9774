"""Task graphs: builder (Graph, Node), stream capture, executable graphs, graph memory.

``exec`` (GraphExec) and ``scope`` (``graph_capture``) are not imported here: they build on
streams, which build on capture and graph memory; importing them from this package's
``__init__`` would close that loop."""

from __future__ import annotations

from .capture import CaptureInfo, CaptureMode, CaptureStatus, exchange_capture_mode
from .graph import Graph
from .node import Node, NodeType

__all__ = [
    "Graph", "Node", "NodeType", "CaptureMode",
    "CaptureStatus", "CaptureInfo", "exchange_capture_mode",
]
