"""What ``Graph.instantiate`` refuses before an executable graph is made
(``cudaGraphInstantiateWithParams``'s ``result_out`` and ``errNode_out``).

Refused, as :class:`~streamrt.errors.GraphInstantiateError` with a :class:`GraphInstantiateResult`
and the node:

- MULTIPLE_DEVICES_NOT_SUPPORTED: kernel or MEM_ALLOC nodes (child graphs' too) of devices of
  two backends (one exec runs on one backend's graph runner), or of two devices of a backend
  whose graphs cannot span devices (``DeviceImpl.graph_spans_devices``). CUDA's host graphs may
  span the GPUs of one process, and so may cpu graphs;
- NODE_OPERATION_NOT_SUPPORTED: a node its device's backend cannot run in a graph
  (``DeviceImpl.graph_node_check``: a kernel without a CUDA body on cuda; a conditional node on
  a backend that neither replays operations nor builds conditional nodes of its own);
- INVALID_STRUCTURE: a MEM_FREE node not ordered after its MEM_ALLOC node (found where the
  exec maps its memory, ``GraphExec._map_memory``). Cycles cannot be built (``Graph`` refuses
  the edge that would close one), so no refusal names them.

- CONDITIONAL_HANDLE_UNUSED: a conditional handle made for the graph (or a graph inside it) that
  no conditional node uses; ``.node`` is None (conditional.refuse_unused, called by the exec).

ERROR is what a backend reports for any other reason. This module imports only errors and node
types, so backends may raise the same error with the same results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import GraphInstantiateError, NamedIntEnum
from .node import NodeType

if TYPE_CHECKING:
    from .graph import Graph
    from .node import Node

__all__ = ["GraphInstantiateResult", "check", "refuse"]


class GraphInstantiateResult(NamedIntEnum):
    """``cudaGraphInstantiateResult``."""

    SUCCESS = 0
    ERROR = 1
    INVALID_STRUCTURE = 2
    NODE_OPERATION_NOT_SUPPORTED = 3
    MULTIPLE_DEVICES_NOT_SUPPORTED = 4
    CONDITIONAL_HANDLE_UNUSED = 5


def refuse(result: GraphInstantiateResult, node: Node | None, why: str) -> GraphInstantiateError:
    """The error of an instantiate refused for ``result`` at ``node``."""
    return GraphInstantiateError(f"instantiate refused ({result.name}): {why}", result=result,
                                 node=node)


def devices(graph: Graph) -> dict[Any, Node]:
    """The devices of ``graph``'s kernel and MEM_ALLOC nodes, child graphs' too, each with the
    first such node of it (creation order, a child graph's nodes where the child lies)."""
    out: dict[Any, Node] = {}
    nodes = graph._nodes
    for dev, i in graph._devices.items():
        out.setdefault(dev, nodes[i])
    for n in graph._marked((NodeType.GRAPH, NodeType.CONDITIONAL), nested=False):
        inner = (n._params["graph"],) if n.type is NodeType.GRAPH else n._params["bodies"]
        for g in inner:
            for dev, m in devices(g).items():
                out.setdefault(dev, m)
    return out


def check(graph: Graph) -> None:
    """Refuse a graph no backend of its devices can run (see the module docstring)."""
    found = devices(graph)
    if not found:
        return
    first = next(iter(found))
    for dev, node in found.items():
        if dev.backend != first.backend:
            raise refuse(GraphInstantiateResult.MULTIPLE_DEVICES_NOT_SUPPORTED, node,
                         f"{node!r} is of {dev.name}, other nodes of {first.name}: an executable "
                         "graph runs on one backend")
        if dev is not first and not first._impl.graph_spans_devices:
            raise refuse(GraphInstantiateResult.MULTIPLE_DEVICES_NOT_SUPPORTED, node,
                         f"{node!r} is of {dev.name}, other nodes of {first.name}: a graph of the "
                         f"{first.backend} backend runs on one device")
    for dev in found:
        impl = dev._impl
        if not (impl.graph_conditionals_native or impl.runner_per_stream):
            # a backend building graphs of its own, without conditional nodes: refused, never
            # run as something else
            for n in graph._walk():
                if n.type is NodeType.CONDITIONAL:
                    raise refuse(GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED, n,
                                 f"{n!r}: the {dev.backend} backend does not build conditional "
                                 "nodes yet")
        node_check = impl.graph_node_check()
        if node_check is None:
            continue
        for n in graph._walk():
            if n.type is NodeType.KERNEL and n._params["device"] is dev:
                why = node_check(n)
                if why is not None:
                    raise refuse(GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED, n, why)
