"""``cudaGraphExecUpdate``'s rules (DESIGN.md §5): which differences between an exec's graph and
a new one are refused, and taking the new parameters.

Nodes pair by creation order. Refused: a topology change (TOPOLOGY_CHANGED), a node-type change
(NODE_TYPE_CHANGED), a kernel node moved to another device, a copy or memset whose direction or
device changed (PARAMETERS_CHANGED), any change to a memory node (NOT_SUPPORTED); a kernel node
may switch to another kernel function on its device. A conditional node keeps its kind, size and
device (PARAMETERS_CHANGED) and pairs its bodies' nodes as a child graph's; it takes the new
graph's handle (the new graph's kernels set that one), whose default comes with it.
"""

from __future__ import annotations

from typing import Any

from ..errors import NamedIntEnum
from ..pool import device_of
from ..validate import is_int
from .graph import Graph
from .node import Node, NodeType

__all__ = ["GraphExecUpdateResult", "adopt", "diff", "kinds"]


class GraphExecUpdateResult(NamedIntEnum):
    """``cudaGraphExecUpdateResult``."""

    SUCCESS = 0
    ERROR = 1
    TOPOLOGY_CHANGED = 2
    NODE_TYPE_CHANGED = 3
    FUNCTION_CHANGED = 4
    PARAMETERS_CHANGED = 5
    NOT_SUPPORTED = 6
    UNSUPPORTED_FUNCTION_CHANGE = 7
    ATTRIBUTES_CHANGED = 8


def kinds(p: dict[str, Any]) -> tuple:
    """Where a copy's two ends are: ("device", its device) or ("host",)."""
    def kind(x: Any) -> Any:
        if is_int(x):
            return ("device", device_of(int(x)))  # any backend's (None: pinned host memory)
        return ("host",)

    return kind(p["dst"]), kind(p["src"])


def diff(old: Graph, new: Graph) -> tuple[GraphExecUpdateResult, Node | None, str] | None:
    """Why ``new`` cannot update an exec of ``old``: (result, node, reason); None if it can."""
    R = GraphExecUpdateResult
    if len(old._nodes) != len(new._nodes):
        return R.TOPOLOGY_CHANGED, None, f"{len(new._nodes)} nodes instead of {len(old._nodes)}"
    for o, n in zip(old._nodes, new._nodes):
        if sorted(d.index for d in o._deps) != sorted(d.index for d in n._deps):
            return R.TOPOLOGY_CHANGED, n, f"the dependencies of {n!r} changed"
    for o, n in zip(old._nodes, new._nodes):
        if o.type is not n.type:
            return R.NODE_TYPE_CHANGED, n, f"node #{n.index} is {n.type.name}, was {o.type.name}"
        po, pn = o._params, n._params
        t = o.type
        if t is NodeType.KERNEL and po["device"] is not pn["device"]:
            return R.UNSUPPORTED_FUNCTION_CHANGE, n, f"{n!r} moved to another device"
        if t is NodeType.MEMCPY and kinds(po) != kinds(pn):
            return R.PARAMETERS_CHANGED, n, f"{n!r} changed its direction or device"
        if t is NodeType.MEMSET and kinds({"dst": po["ptr"], "src": po["ptr"]}) != kinds(
                {"dst": pn["ptr"], "src": pn["ptr"]}):
            return R.PARAMETERS_CHANGED, n, f"{n!r} moved to another device"
        if t in (NodeType.MEM_ALLOC, NodeType.MEM_FREE) and (
                po["ptr"], po.get("nbytes")) != (pn["ptr"], pn.get("nbytes")):
            return R.NOT_SUPPORTED, n, f"{n!r}: memory nodes cannot be updated"
        if t is NodeType.GRAPH:
            sub = diff(po["graph"], pn["graph"])
            if sub is not None:
                return sub[0], n, f"in child graph {n!r}: {sub[2]}"
        if t is NodeType.CONDITIONAL:
            if po["kind"] is not pn["kind"] or len(po["bodies"]) != len(pn["bodies"]):
                return R.PARAMETERS_CHANGED, n, f"{n!r} changed its kind or size"
            if po["device"] is not pn["device"]:
                return R.PARAMETERS_CHANGED, n, f"{n!r} moved to another device"
            if (po["handle"].default is None) != (pn["handle"].default is None):
                return R.PARAMETERS_CHANGED, n, f"{n!r}: its handle's default was added or removed"
            for k, (bo, bn) in enumerate(zip(po["bodies"], pn["bodies"])):
                sub = diff(bo, bn)
                if sub is not None:
                    return sub[0], n, f"in body {k} of {n!r}: {sub[2]}"
    return None


def adopt(old: Graph, new: Graph) -> list[Node]:
    """Take the parameters of ``new``'s nodes; returns the nodes (child graphs' too) that took them."""
    changed: list[Node] = []
    for o, n in zip(old._nodes, new._nodes):
        if o.type is NodeType.GRAPH:
            changed += adopt(o._params["graph"], n._params["graph"])
        elif o.type is NodeType.CONDITIONAL:
            # the new graph's handle (its kernels set that one) with the exec's bodies, which
            # take the new bodies' parameters
            for bo, bn in zip(o._params["bodies"], n._params["bodies"]):
                changed += adopt(bo, bn)
            o._params = {**n._params, "bodies": o._params["bodies"]}
            changed.append(o)
        elif o.type not in (NodeType.MEM_ALLOC, NodeType.MEM_FREE):
            o._params = dict(n._params)
            changed.append(o)
    return changed
