"""An executable graph's per-node updates (``cudaGraphExec*NodeSetParams``, enabling nodes,
a child graph node's graph, event nodes' events): :class:`NodeUpdates`, a part of
:class:`~streamrt.graph.exec.GraphExec`.

Each edits the exec's private template (never the user's graph) under the exec's lock and
drops or updates the cached plans, so a change applies to later launches only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import GraphExecUpdateError, InvalidHandleError, InvalidTypeError, InvalidValueError
from ..kernel import dim3, shared_mem_bytes
from ..pool import device_of
from ..validate import is_bool
from .graph import Graph
from .node import Node, NodeType
from .params import _event, host_params, memcpy_params, memset_params
from .update import adopt, diff, kinds

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from ..event import Event

_DISABLEABLE = (NodeType.KERNEL, NodeType.MEMCPY, NodeType.MEMSET)  # as cudaGraphNodeSetEnabled


class NodeUpdates:
    """The per-node update calls of an executable graph (see the module docstring)."""

    _template: Graph
    _destroyed: bool
    _lock: threading.RLock
    _plans: dict[Any, Any]
    _has_binds: bool | None
    _disabled: set[int]

    # -- per-node updates ------------------------------------------------------------------------
    def _node(self, node: Any, *types: NodeType) -> Node:
        if not isinstance(node, Node):
            raise InvalidTypeError(f"expected a Node, not {type(node).__name__}")
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        if node.graph._body:  # as cudaGraphExec*NodeSetParams: nodes of the exec's graph only
            raise InvalidValueError(f"{node!r} lies in a conditional node's body: an exec's "
                                    "per-node setters take nodes of its graph; update bodies "
                                    "with ge.update(graph)")
        t = node if node.graph is self._template else self._template.find_in_clone(node)
        if types and t.type not in types:
            raise InvalidValueError(f"{node!r} is a {t.type.name} node, not {types[0].name}")
        return t

    def _set(self, t: Node, params: dict[str, Any]) -> None:
        with self._lock:
            t._params = params
            self._refresh(lambda plan: plan.update(t))

    def _refresh(self, keep: Callable[[Any], bool]) -> None:
        """After a change of parameters or of enabled nodes, for later launches only (enqueued
        launches keep their plan): cpu plans are compiled again at the next launch; a backend
        graph takes the change in place (``cudaGraphExec*NodeSetParams``) when ``keep(plan)``
        can apply it, else it is built again."""
        self._plans = {k: p for k, p in self._plans.items() if keep(p.runner)}
        self._has_binds = None

    def set_kernel_node_params(self, node: Node, *args: Any, grid: Any = None,
                               block: Any = None, shared_mem: int | None = None) -> None:
        """Replace a kernel node's arguments (and launch shape, dynamic shared memory) for later
        launches."""
        t = self._node(node, NodeType.KERNEL)
        t._params["kernel"].check_args(args)
        p = dict(t._params)
        p["args"] = tuple(args)
        if grid is not None:
            p["grid"] = dim3(grid, "grid")
        if block is not None:
            p["block"] = dim3(block, "block")
        if shared_mem is not None:
            p["shared_mem"] = shared_mem_bytes(shared_mem)
        self._set(t, p)

    def set_memcpy_node_params(self, node: Node, dst: Any, src: Any, nbytes: int) -> None:
        """Replace a copy node's operands; the kinds of memory (host/device) cannot change."""
        t = self._node(node, NodeType.MEMCPY)
        p = memcpy_params(dst, src, nbytes)
        if kinds(p) != kinds(t._params):
            raise InvalidValueError("a copy node's direction and devices (which operand is host "
                                    "memory, which is memory of which device) cannot change")
        self._set(t, p)

    def set_memset_node_params(self, node: Node, ptr: int, value: int, nbytes: int) -> None:
        """Replace a memset node's pointer, value and size; the device of the memory cannot change."""
        t = self._node(node, NodeType.MEMSET)
        p = memset_params(ptr, value, nbytes)
        # as cudaGraphExecMemsetNodeSetParams (the memory must come from the same context), and
        # as update() already refuses the same change with PARAMETERS_CHANGED
        if device_of(p["ptr"]) != device_of(t._params["ptr"]):
            raise InvalidValueError("a memset node's memory cannot move to another device")
        self._set(t, p)

    def set_host_node_params(self, node: Node, fn: Callable[..., Any], *args: Any) -> None:
        """Replace a host node's function and arguments."""
        t = self._node(node, NodeType.HOST)
        self._set(t, host_params(fn, args))

    def set_node_enabled(self, node: Node, enabled: bool) -> None:
        """Enable or disable a kernel, memcpy or memset node; a disabled node acts as empty."""
        if not is_bool(enabled):
            raise InvalidTypeError("enabled must be a bool")
        enabled = bool(enabled)
        t = self._node(node, *_DISABLEABLE)
        with self._lock:
            (self._disabled.discard if enabled else self._disabled.add)(t.index)
            self._refresh(lambda plan: plan.set_enabled(t, enabled))

    def node_enabled(self, node: Node) -> bool:
        """Whether a kernel, memcpy or memset node is enabled (``cudaGraphNodeGetEnabled``, which
        supports only those, as the setter)."""
        return self._node(node, *_DISABLEABLE).index not in self._disabled

    # -- child graph and event nodes -------------------------------------------------------------
    def set_child_graph_node_params(self, node: Node, child: Graph) -> None:
        """Take the parameters of ``child`` into a child graph node for later launches
        (``cudaGraphExecChildGraphNodeSetParams``): ``child`` must have the topology and node
        kinds of the graph instantiated there, as ``update`` requires of a whole graph
        (``GraphExecUpdateError`` otherwise, its ``.result`` saying why)."""
        t = self._node(node, NodeType.GRAPH)
        if not isinstance(child, Graph):
            raise InvalidTypeError(f"a child graph node needs a Graph, not {type(child).__name__}")
        child._check_alive()
        mine = t._params["graph"]  # the exec's own copy of the child (never the user's)
        problem = diff(mine, child)
        if problem is not None:
            result, bad, why = problem
            raise GraphExecUpdateError(f"set_child_graph_node_params refused ({result.name}): "
                                       f"{why}", result=result, node=bad)
        with self._lock:
            changed = adopt(mine, child)
            # a backend graph holds the child inlined: its nodes take the change in place
            self._refresh(lambda plan: all(plan.update(n) for n in changed))

    def set_event_record_node_event(self, node: Node, event: Event) -> None:
        """Make an EVENT_RECORD node record ``event`` in later launches
        (``cudaGraphExecEventRecordNodeSetEvent``)."""
        t = self._node(node, NodeType.EVENT_RECORD)
        self._set(t, {"event": _event(event)})

    def set_event_wait_node_event(self, node: Node, event: Event) -> None:
        """Make a WAIT_EVENT node wait for ``event`` in later launches
        (``cudaGraphExecEventWaitNodeSetEvent``)."""
        t = self._node(node, NodeType.WAIT_EVENT)
        self._set(t, {"event": _event(event)})

    def _original(self, node: Node) -> Node:
        """The instantiated graph's node that the template's top-level ``node`` copies."""
        source = self._template._sources[0][0]
        return node if source._destroyed else source._nodes[node.index]
