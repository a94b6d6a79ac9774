"""The graph part of the backend contract (imported by base.py, where backends find it):
flattened graphs, node operations, record marks and graph runners."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..graph.node import Node
    from .base import Queue

__all__ = ["Flat", "GraphRunner", "Mark", "NodeOp"]

# a flattened graph: ``(node, deps, enabled)`` in dependency order, child graphs inlined (a
# None node is a child graph's exit, a join; a conditional node is one node, its bodies its
# own); ``deps`` index into the list
Flat = list[tuple["Node | None", list[int], bool]]
# the queue operation of a node, or None for one that does nothing on the device
NodeOp = tuple[Callable[..., Any], tuple] | None


class Mark(ABC):
    """The completions of one EVENT_RECORD node of an executable graph on one device, made by
    :meth:`DeviceImpl.graph_mark`: ``done`` counts the launches whose record node has run (or
    whose launch ended), as a queue counts operations, so the record of the k-th launch is
    "position k" of the mark. Events recorded by the node name it as their queue: a queue's
    :meth:`Queue.op_wait` takes a mark as ``other``, a graph's wait node may wait for one, the
    host waits with :meth:`wait_done`, timing events read its stamps. Nothing is submitted to
    it, and nothing fails on it (a launch's failures are its stream's)."""

    done: int
    name: str
    errors: list[tuple[int, BaseException, str]]  # always empty

    @abstractmethod
    def wait_done(self, pos: int) -> None:
        """Block the calling host thread until ``done >= pos``."""

    @abstractmethod
    def op_stamp(self) -> Any:
        """The timing stamp the next launch's record sets, for :meth:`elapsed_ms` (the queues'
        stamps and a mark's compare with each other)."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed stamps; :class:`NotReadyError` if one is pending."""

    def take_errors(self, upto: int | None = None) -> list[tuple[int, BaseException, str]]:
        """Nothing: see the class docstring."""
        return []


class GraphRunner(ABC):
    """An instantiated graph of one backend (``cudaGraphExec_t``): made by
    :meth:`DeviceImpl.graph_runner`, launched as one queue operation.

    Event nodes act where they sit (API.md §9.1): a WAIT_EVENT node holds back only its
    dependents, an EVENT_RECORD node advances its mark once its dependencies are done. What they
    wait for and record is bound by the frontend at each launch (``events`` of
    :meth:`op_launch`): one entry per event node, in the order of the flattened graph, for a
    WAIT_EVENT node ``(queue or mark, pos)``, to wait until it has completed ``pos``, or None
    (nothing to wait for); for an EVENT_RECORD node ``(k, stamp)``: its mark reaches ``k`` when
    the node runs (and at the latest when the launch ends), ``stamp`` (from
    :meth:`Mark.op_stamp`, or None) is taken then."""

    @abstractmethod
    def op_launch(self, queue: Queue, events: tuple = ()) -> tuple[Callable[..., Any], tuple]:
        """The operation of ``queue`` that runs the whole graph, with this launch's ``events``."""

    def upload(self, queue: Queue) -> None:
        """Prepare the graph for launches on ``queue`` (``cudaGraphUpload``)."""
        return None

    def update(self, node: Node) -> bool:
        """Take ``node``'s new parameters in place; False: the frontend makes a new runner."""
        return False

    def set_enabled(self, node: Node, enabled: bool) -> bool:
        """Enable or disable ``node`` in place; False: the frontend makes a new runner."""
        return False
