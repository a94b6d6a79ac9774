"""Graph: explicit construction of a task DAG (``cudaGraph_t``), clone, DOT, instantiate.

Invariants: nodes are kept in creation order (``Node.index``); edges are stored on both ends;
the graph is always acyclic (an edge that would close a cycle is refused); a child graph is
cloned when added, so later changes to the original do not leak into the parent. A destroyed
graph (``destroy``, ``cudaGraphDestroy``) and its nodes refuse every further use; what was
made of it (clones, execs, the copy a child graph node holds) is independent of it and stays.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import instrument
from ..device import Device, current_device
from ..errors import IllegalStateError, InvalidHandleError, InvalidTypeError, InvalidValueError
from ..event import Event
from ..kernel import Kernel, dim3, shared_mem_bytes
from ..validate import check_ptr, check_size
from . import dot, memory
from .conditional import BODY_KINDS, ConditionalHandle, ConditionalType, body_refusal, check_value, node_args
from .conditional import RULE as _RULE
from .edges import Edges
from .gcpause import BULK, building, paused
from .memory import GraphAlloc
from .node import Node, NodeType
from .params import _event, host_params, memcpy_params, memset_params

if TYPE_CHECKING:
    from types import TracebackType

    from ..stream import Stream
    from .exec import GraphExec

_ids = itertools.count(1)
_ONE_GRID, _ONE_BLOCK = dim3(1, "grid"), dim3(1, "block")
MEMORY = (NodeType.MEM_ALLOC, NodeType.MEM_FREE)
EVENTS = (NodeType.WAIT_EVENT, NodeType.EVENT_RECORD)
MARKED = frozenset((*MEMORY, *EVENTS, NodeType.GRAPH, NodeType.CONDITIONAL))  # ``_marks``' kinds
NESTS = (NodeType.GRAPH, NodeType.CONDITIONAL)  # the kinds holding graphs


class Graph(Edges):
    """A task graph built explicitly or by stream capture."""

    def __init__(self) -> None:
        self.id = next(_ids)
        self._nodes: list[Node] = []
        # for find_in_clone: the graphs this one is a clone of (its source, the source's sources)
        # and how many nodes each had then; a clone keeps its node indices, and nodes are never
        # removed, so an original node maps to the node of the same index here
        self._sources: tuple[tuple[Graph, int], ...] = ()
        self._keep: list[Any] = []  # objects the graph's work needs alive (captured executors)
        self._slabs: dict[Any, Any] = {}  # device -> the range its next small MEM_ALLOC takes bytes of
        self._embedded = False  # a child graph node's own graph: no memory nodes may join it
        # allocations a MEM_FREE node of this graph frees: a second one is refused when added, as
        # cudaGraphAddMemFreeNode (and cudaFreeAsync in capture) does, not first at instantiate
        self._freed: set[GraphAlloc] = set()
        # indices of the nodes that instantiate must find (events, memory, child graphs), in
        # creation order: it walks these, not the whole graph (a node's type never changes to
        # or from one of these kinds)
        self._marks: list[int] = []
        # the devices of its kernel and MEM_ALLOC nodes (not its child graphs'), each with the
        # index of its first such node; ``_device`` is the first of them (the one a graph has,
        # compared by identity as nodes are added), for instantiate's device rules
        self._device: Device | None = None
        self._devices: dict[Device, int] = {}
        # conditional handles made for this graph (``create_conditional_handle``) and those of
        # them a conditional node (here or in a body inside) uses; a body (``node.bodies``) knows
        # the graph holding its node (``_parent``) and takes only BODY_KINDS
        self._handles: list[ConditionalHandle] = []
        self._cond_used: set[ConditionalHandle] = set()
        self._body = False
        self._parent: Graph | None = None
        self._destroyed = False

    def __repr__(self) -> str:
        if self._destroyed:
            return f"<Graph #{self.id} destroyed>"
        return f"<Graph #{self.id} {len(self._nodes)} nodes>"

    # -- lifetime -----------------------------------------------------------------------------
    def __enter__(self) -> Graph:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._destroyed:  # a destroy() inside the block already did it
            self.destroy()

    def destroy(self) -> None:
        """Destroy the graph (``cudaGraphDestroy``): it and its nodes refuse further use; execs,
        clones and child graph nodes made from it stay. A second destroy is refused."""
        self._check_alive()
        if self._body:
            raise InvalidValueError(f"{self!r} is a conditional node's body: it is destroyed with "
                                    "the graph holding the node")
        from .refusals import capture_building  # (capture builds on this module)

        cap = capture_building(self)
        if cap is not None:  # the capture would go on adding nodes to a destroyed graph
            raise IllegalStateError(f"{self!r} cannot be destroyed while {cap!r} captures into it")
        self._kill()
        # nothing refers to these any more: what was made of the graph copied what it needs
        # (clones and execs find nodes by index and count, never through this graph's list)
        self._nodes, self._marks, self._keep = [], [], []
        self._slabs, self._freed, self._devices = {}, set(), {}

    def _kill(self) -> None:
        """Mark this graph and its nodes' bodies destroyed."""
        self._destroyed = True
        for i in self._marks:
            n = self._nodes[i]
            if n.type is NodeType.CONDITIONAL:
                for b in n._params["bodies"]:
                    b._kill()

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"graph #{self.id} was destroyed")

    # -- building ---------------------------------------------------------------------------
    def _add(self, type: NodeType, params: dict[str, Any], deps: Any) -> Node:
        if self._destroyed:
            self._check_alive()
        if self._body and type not in BODY_KINDS:
            raise InvalidValueError(f"a {type.name} node cannot be added to {self!r}: "
                                    f"{_RULE}")
        cls = deps.__class__
        if (cls is list or cls is tuple) and len(deps) <= 1 and (
                not deps or (deps[0].__class__ is Node and deps[0].graph is self)):
            dep_nodes: Any = deps  # the usual call (none, or one node of this graph): checked
        elif cls is Node and deps.graph is self:
            dep_nodes = (deps,)
        else:  # duplicates collapse to one edge
            dep_nodes = dict.fromkeys(self._as_nodes(deps, "deps"))
        if type is NodeType.MEM_FREE and params["alloc"] in self._freed:
            raise InvalidValueError(f"{params['alloc']!r} is already freed by a node of {self!r}")
        node = Node(self, type, len(self._nodes), params)
        if instrument.listeners:  # the sanitizer names a node by where it was made
            node.site = instrument.user_site()
        if dep_nodes:
            own = node._deps
            for d in dep_nodes:
                own.append(d)
                d._dependents.append(node)
        self._nodes.append(node)
        if type is NodeType.KERNEL:
            if params["device"] is not self._device:
                self._note_device(params["device"], node.index)
        elif type in MARKED:
            self._marks.append(node.index)
            if type is NodeType.MEM_FREE:
                self._freed.add(params["alloc"])
            elif type is NodeType.MEM_ALLOC and params["alloc"].device is not self._device:
                self._note_device(params["alloc"].device, node.index)
        if len(self._nodes) >= BULK:  # a large graph: no full collections while it grows
            building()
        return node

    def _note_device(self, device: Device, index: int) -> None:
        """Node ``index`` (a kernel or MEM_ALLOC node) is of ``device``."""
        if self._device is None:
            self._device = device
        self._devices.setdefault(device, index)

    def _as_nodes(self, nodes: Any, what: str) -> list[Node]:
        if isinstance(nodes, Node):
            nodes = (nodes,)
        try:
            out = list(nodes)
        except TypeError:  # not iterable (a 0-d array passes the Iterable test, then fails)
            raise InvalidTypeError(f"{what} must be a Node or a sequence of Nodes, not "
                                   f"{type(nodes).__name__}") from None
        for n in out:
            if not isinstance(n, Node):
                raise InvalidTypeError(f"{what} must contain Nodes, not {type(n).__name__}")
            if n.graph is not self:
                n.graph._check_alive()
                raise InvalidValueError(f"{n!r} belongs to {n.graph!r}, not to {self!r}")
        return out

    def add_kernel_node(self, kernel: Kernel, *args: Any, grid: Any = 1, block: Any = 1,
                        deps: Any = (), shared_mem: int = 0) -> Node:
        """Add a KERNEL node (``cudaGraphAddKernelNode``; ``shared_mem``: its sharedMemBytes)."""
        if not isinstance(kernel, Kernel):
            raise InvalidTypeError(f"a kernel node needs an @srt.kernel, not {type(kernel).__name__}")
        kernel.check_args(args)
        # the default launch shape without a lookup (dim3 caches the same objects)
        params = {"kernel": kernel, "args": args,
                  "grid": _ONE_GRID if grid.__class__ is int and grid == 1 else dim3(grid, "grid"),
                  "block": _ONE_BLOCK if block.__class__ is int and block == 1 else
                  dim3(block, "block"), "device": current_device(),
                  "shared_mem": 0 if shared_mem.__class__ is int and shared_mem == 0 else
                  shared_mem_bytes(shared_mem)}
        return self._add(NodeType.KERNEL, params, deps)

    def add_memcpy_node(self, dst: Any, src: Any, nbytes: int, deps: Any = ()) -> Node:
        """Add a MEMCPY node; host buffers are read/written when the node runs (as pinned memory)."""
        return self._add(NodeType.MEMCPY, memcpy_params(dst, src, nbytes), deps)

    def add_memset_node(self, ptr: int, value: int, nbytes: int, deps: Any = ()) -> Node:
        """Add a MEMSET node (byte value 0-255)."""
        return self._add(NodeType.MEMSET, memset_params(ptr, value, nbytes), deps)

    def add_host_node(self, fn: Callable[..., Any], *args: Any, deps: Any = ()) -> Node:
        """Add a HOST node running ``fn(*args)``."""
        return self._add(NodeType.HOST, host_params(fn, args), deps)

    def add_child_graph_node(self, child: Graph, deps: Any = ()) -> Node:
        """Add a GRAPH node; the child is cloned, as ``cudaGraphAddChildGraphNode`` does."""
        if not isinstance(child, Graph):
            raise InvalidTypeError(f"a child graph node needs a Graph, not {type(child).__name__}")
        self._check_alive()
        child._check_alive()
        if child._marked(MEMORY):
            raise InvalidValueError("a child graph cannot contain memory allocation or free nodes")
        if self._body:
            why = body_refusal(child)
            if why is not None:
                raise InvalidValueError(f"{child!r} cannot be a child graph of {self!r}: {why}")
        return self._add(NodeType.GRAPH, {"graph": child._embedded_clone()}, deps)

    def add_empty_node(self, deps: Any = ()) -> Node:
        """Add an EMPTY node (a join point)."""
        return self._add(NodeType.EMPTY, {}, deps)

    def add_event_record_node(self, event: Event, deps: Any = ()) -> Node:
        """Add an EVENT_RECORD node."""
        return self._add(NodeType.EVENT_RECORD, {"event": _event(event)}, deps)

    def add_event_wait_node(self, event: Event, deps: Any = ()) -> Node:
        """Add a WAIT_EVENT node."""
        return self._add(NodeType.WAIT_EVENT, {"event": _event(event)}, deps)

    def add_mem_alloc_node(self, nbytes: int, deps: Any = ()) -> Node:
        """Add a MEM_ALLOC node; ``node.ptr`` is fixed now and stays valid across launches."""
        self._check_alive()
        self._refuse_memory_node()
        n = check_size(nbytes)
        if not n:  # as cudaGraphAddMemAllocNode (and cuda.core's graph allocations)
            raise InvalidValueError("a graph allocation of 0 bytes is refused")
        alloc = GraphAlloc(Device(), n, self._slabs)
        return self._add(NodeType.MEM_ALLOC, {"nbytes": n, "ptr": alloc.ptr, "alloc": alloc}, deps)

    def add_mem_free_node(self, ptr: int, deps: Any = ()) -> Node:
        """Add a MEM_FREE node for graph memory (from a MEM_ALLOC node of this or another graph)."""
        self._check_alive()
        self._refuse_memory_node()
        ptr = check_ptr(ptr)
        alloc = memory.find(ptr)
        if alloc is None:
            raise InvalidValueError(f"{hex(ptr)} is not graph memory (from a MEM_ALLOC node)")
        return self._add(NodeType.MEM_FREE, {"ptr": ptr, "alloc": alloc}, deps)

    # -- conditional nodes -------------------------------------------------------------------------
    def create_conditional_handle(self, default: int | None = None) -> ConditionalHandle:
        """A handle for a conditional node of this graph or of a body inside it
        (``cudaGraphConditionalHandleCreate``); ``default`` is set at every launch
        (``cudaGraphCondAssignDefault``), None: the value stays as the last launch left it."""
        self._check_alive()
        d = None if default is None else check_value(default, "default")
        h = ConditionalHandle(self, d, current_device())
        self._handles.append(h)
        return h

    def add_conditional_node(self, handle: ConditionalHandle, kind: ConditionalType,
                             size: int = 1, deps: Any = ()) -> Node:
        """Add a CONDITIONAL node (``cudaGraphAddNode``, ``cudaGraphCondType``): IF (size 2:
        if/else), WHILE (size 1) or SWITCH (any size); its bodies are ``node.bodies``."""
        self._check_alive()
        kind, owner = node_args(self, handle, kind, size)
        bodies = []
        for _ in range(size):
            b = Graph()
            b._body, b._parent = True, self
            bodies.append(b)
        node = self._add(NodeType.CONDITIONAL, {"handle": handle, "kind": kind,
                                                "bodies": tuple(bodies), "device": handle.device},
                         deps)
        owner._cond_used.add(handle)
        if handle.device is not self._device:
            self._note_device(handle.device, node.index)
        return node

    # -- queries ----------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        """Every node, in creation order (``cudaGraphGetNodes``)."""
        self._check_alive()
        return list(self._nodes)

    def root_nodes(self) -> list[Node]:
        """Nodes without dependencies, in creation order (``cudaGraphGetRootNodes``)."""
        self._check_alive()
        return [n for n in self._nodes if not n._deps]

    def edges(self) -> list[tuple[Node, Node]]:
        """Every edge as ``(from, to)``, ordered by the ``to`` node's creation then dependency order."""
        self._check_alive()
        return [(d, n) for n in self._nodes for d in n._deps]

    def _walk(self) -> Iterable[Node]:
        for n in self._nodes:
            yield n
            if n.type is NodeType.GRAPH:
                yield from n._params["graph"]._walk()
            elif n.type is NodeType.CONDITIONAL:
                for b in n._params["bodies"]:
                    yield from b._walk()

    def _marked(self, types: tuple[NodeType, ...], *, nested: bool = True) -> list[Node]:
        """The nodes of ``types`` in ``_walk`` order (child graphs' too, if ``nested``), found
        through ``_marks`` (no walk of the whole graph)."""
        out: list[Node] = []
        nodes = self._nodes
        for i in self._marks:
            n = nodes[i]
            if n.type in types:
                out.append(n)
            if nested and n.type is NodeType.GRAPH:
                out += n._params["graph"]._marked(types)
            elif nested and n.type is NodeType.CONDITIONAL:
                for b in n._params["bodies"]:
                    out += b._marked(types)
        return out

    # -- clone, DOT, instantiate -------------------------------------------------------------
    def _embedded_clone(self) -> Graph:
        """The clone a child graph node owns (``node.params["graph"]``)."""
        g = self.clone()
        g._embedded = True
        return g

    def _body_clone(self, parent: Graph) -> Graph:
        """A copy of this body for the copy ``parent`` of the graph holding its node."""
        g = self._clone()
        g._body, g._parent = True, parent
        return g

    def _refuse_memory_node(self) -> None:
        if self._embedded:  # as cudaGraphChildGraphNodeGetGraph's graph: the outer exec would
            # neither map the memory nor check its relaunch rule
            raise InvalidValueError("memory allocation and free nodes cannot be added to the "
                                    "graph of a child graph node")

    def clone(self) -> Graph:
        """A copy with the same nodes, params and edges (``cudaGraphClone``)."""
        self._check_alive()
        with paused():  # many long-lived objects at once (see gcpause)
            return self._clone()

    def _clone(self) -> Graph:
        g = Graph()
        g._keep = list(self._keep)
        g._freed = set(self._freed)
        g._marks = list(self._marks)
        g._device, g._devices = self._device, dict(self._devices)
        g._handles, g._cond_used = list(self._handles), set(self._cond_used)
        g._sources = ((self, len(self._nodes)), *self._sources)
        out = g._nodes
        graph_type = NodeType.GRAPH
        # one pass over the nodes (a second one over a graph larger than the caches costs as
        # much again): an edge from a node not made yet (an added edge may point to a later
        # node) waits in ``pending`` until it is. Dependents come out in creation order of the
        # dependent, as every clone has made them (they are the topological order's ties)
        pending: dict[int, list[tuple[Node, int]]] = {}
        for n in self._nodes:
            i = n.index
            params = n._params
            if n.type is graph_type:
                params = dict(params)
                params["graph"] = params["graph"]._embedded_clone()
            elif n.type is NodeType.CONDITIONAL:
                params = dict(params)
                params["bodies"] = tuple(b._body_clone(g) for b in params["bodies"])
            # other params dicts are shared: a node's dict is never changed in place (see Node)
            c = Node(g, n.type, i, params)
            c.site = n.site
            out.append(c)
            if pending:
                waiting = pending.pop(i, None)
                if waiting is not None:  # dependents made before it, in their creation order
                    for dependent, pos in waiting:
                        dependent._deps[pos] = c
                        c._dependents.append(dependent)
            deps = c._deps
            for d in n._deps:
                j = d.index
                if j < i:
                    cd = out[j]
                    deps.append(cd)
                    cd._dependents.append(c)
                else:
                    pending.setdefault(j, []).append((c, len(deps)))
                    deps.append(c)  # a placeholder, replaced when node j is made
        assert not pending, "every dependency is a node of the graph"
        return g

    def find_in_clone(self, original: Node) -> Node:
        """The node of this clone that copies ``original`` (``cudaGraphNodeFindInClone``)."""
        if not isinstance(original, Node):
            raise InvalidTypeError(f"find_in_clone needs a Node, not {type(original).__name__}")
        self._check_alive()
        original.graph._check_alive()  # (the exec's per-node setters name nodes this way too)
        for source, count in self._sources:
            if original.graph is source and original.index < count:
                return self._nodes[original.index]
        raise InvalidValueError(f"{original!r} is not an original node of {self!r}")

    def to_dot(self, path: str | Path | None = None) -> str:
        """Graphviz text of the graph (``cudaGraphDebugDotPrint``); written to ``path`` if given."""
        self._check_alive()
        return dot.render(self, path)

    def instantiate(self, *, auto_free_on_launch: bool = False, upload_stream: Stream | None = None,
                    use_node_priority: bool = False) -> GraphExec:
        """Validate and compile into an executable graph (``cudaGraphInstantiateWithParams``);
        a refusal is a ``GraphInstantiateError``. ``upload_stream``: uploaded there too."""
        from ..stream import Stream
        from .exec import GraphExec

        if not isinstance(self, Graph):  # (called unbound, as Graph.instantiate(x))
            raise InvalidTypeError(f"instantiate needs a Graph, not {type(self).__name__}")
        self._check_alive()
        if self._body:
            raise InvalidValueError(f"{self!r} is a conditional node's body: it runs as part of "
                                    "the graph holding the node, not on its own")
        if upload_stream is not None and not isinstance(upload_stream, Stream):
            raise InvalidTypeError(f"upload_stream must be a Stream or None, not "
                                   f"{type(upload_stream).__name__}")
        ge = GraphExec(self, auto_free_on_launch=auto_free_on_launch,
                       use_node_priority=use_node_priority)
        if upload_stream is not None:  # as cudaGraphInstantiateFlagUpload: part of instantiate
            try:
                ge.upload(upload_stream)
            except BaseException:
                ge.destroy()  # a refused instantiate leaves no exec (its memory unmapped)
                raise
        return ge
