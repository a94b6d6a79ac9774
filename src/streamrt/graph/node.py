"""Graph nodes: a type, parameters, and dependency edges (``cudaGraphNode_t``)."""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import InvalidValueError
from ..labels import fn_label

if TYPE_CHECKING:
    from .graph import Graph


class NodeType(Enum):
    """Node types, as ``cudaGraphNodeType``."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    HOST = 3
    GRAPH = 4
    EMPTY = 5
    WAIT_EVENT = 6
    EVENT_RECORD = 7
    MEM_ALLOC = 10
    MEM_FREE = 11
    CONDITIONAL = 13


class Node:
    """One node of a :class:`Graph`; edges are kept on both ends, in creation order.

    A node's ``_params`` dict is never changed in place, only replaced (``set_*_node_params``,
    exec update): clones share it (``Graph.clone``). A node of a destroyed graph refuses its
    queries (``InvalidHandleError``); its ``type``, ``index`` and repr stay readable."""

    __slots__ = ("graph", "type", "index", "_params", "_deps", "_dependents", "site",
                 "__weakref__")

    def __init__(self, graph: Graph, type: NodeType, index: int, params: dict[str, Any]) -> None:
        self.graph = graph
        self.type = type
        self.index = index  # creation order within its graph: exec update pairs nodes by it
        self._params = params
        self._deps: list[Node] = []
        self._dependents: list[Node] = []
        self.site = ""  # where it was made (recorded while a sanitizer or tracer is active)

    @property
    def dependencies(self) -> tuple[Node, ...]:
        """Nodes this one waits for."""
        self.graph._check_alive()
        return tuple(self._deps)

    @property
    def dependents(self) -> tuple[Node, ...]:
        """Nodes waiting for this one."""
        self.graph._check_alive()
        return tuple(self._dependents)

    @property
    def params(self) -> MappingProxyType:
        """The node's parameters (read-only view; use the exec's ``set_*_node_params`` to change)."""
        self.graph._check_alive()
        return MappingProxyType(self._params)

    @property
    def ptr(self) -> int:
        """The address of a MEM_ALLOC node's allocation (fixed at node creation)."""
        self.graph._check_alive()
        if self.type is not NodeType.MEM_ALLOC:
            raise InvalidValueError(f"{self!r} is not a MEM_ALLOC node")
        return self._params["ptr"]

    @property
    def bodies(self) -> tuple[Graph, ...]:
        """A CONDITIONAL node's body graphs (``cudaConditionalNodeParams.phGraph_out``): add
        their nodes there; IF with size 2 is if/else, SWITCH runs body ``value``."""
        self.graph._check_alive()
        if self.type is not NodeType.CONDITIONAL:
            raise InvalidValueError(f"{self!r} is not a CONDITIONAL node")
        return self._params["bodies"]  # type: ignore[no-any-return]

    def label(self) -> str:
        """A short description: type, kernel name, key parameters."""
        self.graph._check_alive()
        return self._label()

    def _label(self) -> str:
        p = self._params
        t = self.type
        if t is NodeType.KERNEL:
            smem = p.get("shared_mem", 0)
            return (f"KERNEL {p['kernel'].name} grid={tuple(p['grid'])} block={tuple(p['block'])}"
                    + (f" shared_mem={smem}" if smem else ""))
        if t is NodeType.MEMCPY:
            return f"MEMCPY {_end(p['dst'])} <- {_end(p['src'])} {p['nbytes']} B"
        if t is NodeType.MEMSET:
            return f"MEMSET {hex(p['ptr'])} = {p['value']} x {p['nbytes']} B"
        if t is NodeType.HOST:
            return f"HOST {fn_label(p['fn'])}"
        if t is NodeType.GRAPH:
            return f"GRAPH ({len(p['graph']._nodes)} nodes)"
        if t is NodeType.MEM_ALLOC:
            return f"MEM_ALLOC {hex(p['ptr'])} {p['nbytes']} B"
        if t is NodeType.MEM_FREE:
            return f"MEM_FREE {hex(p['ptr'])}"
        if t is NodeType.CONDITIONAL:
            return (f"CONDITIONAL {p['kind'].name} handle #{p['handle'].id}"
                    f" ({len(p['bodies'])} {'body' if len(p['bodies']) == 1 else 'bodies'})")
        if t in (NodeType.EVENT_RECORD, NodeType.WAIT_EVENT):
            return f"{t.name} {p['event']!r}"
        return t.name

    def __repr__(self) -> str:
        if self.graph._destroyed:
            return f"<Node #{self.index} {self.type.name} of a destroyed graph>"
        return f"<Node #{self.index} {self._label()}>"


def _end(x: Any) -> str:
    return hex(x) if isinstance(x, int) else f"host<{type(x).__name__}>"
