"""GraphExec: an instantiated graph compiled into a replay plan (``cudaGraphExec_t``).

State and invariants:
- ``_template`` is a private clone of the instantiated graph; user nodes (of the original graph)
  map to it through ``find_in_clone``. Parameter updates edit the template and drop the cached
  plans, so they apply to later launches only: a launch holds the plan it was enqueued with.
- A plan (one per launch stream) is the flattened DAG (child graphs inlined) cut into chains
  (maximal runs of single-dependency nodes) with every kernel context, memory view and argument
  tuple precomputed; replaying a chain is one loop of ``fn(*args)`` calls. Independent chains
  run concurrently on a small thread pool.
- A launch is one operation of the launch stream, ordered after the previous launch of the same
  exec (as CUDA orders them), so launches of one exec never overlap. Event record/wait nodes and
  graph-memory bookkeeping are applied on the host at launch, around that operation.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import instrument
from ..backends import cpu
from ..backends.cpu import SPACE, copy_op, fill_op, host_call
from ..errors import (
    GraphExecUpdateError,
    InvalidHandleError,
    InvalidTypeError,
    InvalidValueError,
    StreamRTError,
)
from ..kernel import KernelContext, dim3
from ..stream import Stream
from ..validate import host_view
from . import memory
from .graph import Graph, host_params, memcpy_params, memset_params
from .node import Node, NodeType

if TYPE_CHECKING:
    from collections.abc import Callable

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_DISABLEABLE = (NodeType.KERNEL, NodeType.MEMCPY, NodeType.MEMSET)


class GraphExecUpdateResult(IntEnum):
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


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2),
                                           thread_name_prefix="streamrt-graph")
    return _pool


class _Plan:
    """The compiled replay of one exec for one stream."""

    __slots__ = ("chains", "succ", "npred", "roots", "single")

    def __init__(self, chains: list[list[tuple]], succ: list[list[int]], npred: list[int]) -> None:
        self.chains = chains
        self.succ = succ
        self.npred = npred
        self.roots = [i for i, n in enumerate(npred) if n == 0]
        # one chain, or chains that form a single line: replay is one loop
        self.single = [op for ch in chains for op in ch] if len(chains) == 1 else None


def _run_plan(plan: _Plan) -> None:
    """Stream operation: replay a plan (inline when it is one chain)."""
    ops = plan.single
    if ops is not None:
        if instrument.listeners:
            _launch_tls.parent = instrument.current()
        if cpu.delay_us():
            ops = _delayed(ops)
        for fn, args in ops:
            fn(*args)
        return
    _run_parallel(plan)


def _delayed(ops: list[tuple]) -> Any:
    """Delay injection reaches graph nodes too: a missing edge shows up as a wrong result."""
    for op in ops:
        time.sleep(random.random() * cpu.delay_us() * 1e-6)
        yield op


_launch_tls = threading.local()  # the graph launch an instrumented node belongs to


def _node_call(meta: tuple, fn: Any, args: tuple) -> None:
    """An instrumented node: its own OpInfo, nested in the launch, with its DAG ancestry."""
    index, kind, name, ancestors, accesses, site = meta
    parent = getattr(_launch_tls, "parent", None)
    if parent is not None and parent.site:
        site = f"{site}, launched at {parent.site}" if site else f"launched at {parent.site}"
    op = instrument.OpInfo(None, kind, name, {}, accesses, site=site)
    op.parent = parent
    op.index, op.ancestors = index, ancestors
    instrument.run(op, fn, args)


def _run_parallel(plan: _Plan) -> None:
    chains, succ = plan.chains, plan.succ
    remaining = list(plan.npred)
    left = [len(chains)]
    lock = threading.Lock()
    finished = threading.Event()
    errors: list[BaseException] = []
    pool = _workers()

    parent = instrument.current() if instrument.listeners else None

    def run(i: int) -> None:
        _launch_tls.parent = parent
        while i is not None:
            if not errors:
                try:
                    chain = _delayed(chains[i]) if cpu.delay_us() else chains[i]
                    for fn, args in chain:
                        fn(*args)
                except BaseException as exc:  # stop the replay; reported by the stream
                    errors.append(exc)
            ready = []
            with lock:
                for j in succ[i]:
                    remaining[j] -= 1
                    if remaining[j] == 0:
                        ready.append(j)
                left[0] -= 1
                if left[0] == 0:
                    finished.set()
            for j in ready[1:]:
                pool.submit(run, j)
            i = ready[0] if ready else None

    for r in plan.roots[1:]:
        pool.submit(run, r)
    run(plan.roots[0])
    finished.wait()
    if errors:
        raise errors[0]


class GraphExec:
    """An executable graph (``cudaGraphExec_t``)."""

    def __init__(self, graph: Graph, *, auto_free_on_launch: bool = False) -> None:
        if not isinstance(graph, Graph):
            raise InvalidTypeError(f"instantiate needs a Graph, not {type(graph).__name__}")
        if not isinstance(auto_free_on_launch, bool):
            raise InvalidTypeError("auto_free_on_launch must be a bool")
        self.auto_free_on_launch = auto_free_on_launch
        gc_was = gc.isenabled()
        gc.disable()  # cloning makes many long-lived objects: keep instantiate linear
        try:
            self._template = graph.clone()
            self._order = _topo(self._template)
        finally:
            if gc_was:
                gc.enable()
        # event nodes anywhere, child graphs included: they act at launch on the host, and
        # walking only the top level silently dropped the waits and records of child graphs
        self._event_nodes = [n for n in self._template._walk()
                             if n.type in (NodeType.WAIT_EVENT, NodeType.EVENT_RECORD)]
        # memory nodes, in topological order: launch bookkeeping walks only these, not the graph
        self._mem_nodes = [n for n in self._order
                           if n.type in (NodeType.MEM_ALLOC, NodeType.MEM_FREE)]
        self._disabled: set[int] = set()
        self._plans: dict[int, _Plan] = {}
        self._destroyed = False
        self._last: tuple[Stream, int] | None = None
        self._lock = threading.Lock()
        self._allocs: list[memory.GraphAlloc] = []
        self._arenas: list[tuple[Any, int, int]] = []
        self.memory_footprint = 0
        self._map_memory()

    def __repr__(self) -> str:
        return f"<GraphExec of {len(self._template._nodes)} nodes>"

    # -- graph memory --------------------------------------------------------------------------
    def _map_memory(self) -> None:
        order = self._order
        alloc_nodes = [n for n in order if n.type is NodeType.MEM_ALLOC]
        free_nodes = [n for n in order if n.type is NodeType.MEM_FREE]
        if not alloc_nodes and not free_nodes:
            return
        bit = {n: 1 << i for i, n in enumerate(order)}
        anc: dict[Node, int] = {}
        for n in order:
            acc = 0
            for d in n._deps:
                acc |= anc[d] | bit[d]
            anc[n] = acc
        freed: dict[memory.GraphAlloc, Node] = {}
        for f in free_nodes:
            a = f._params["alloc"]
            if a in freed:
                raise InvalidValueError(f"{a!r} is freed twice in the graph ({f!r})")
            freed[a] = f
        by_device: dict[Any, list] = {}
        for n in alloc_nodes:
            a = n._params["alloc"]
            f = freed.get(a)
            if f is not None and not anc[f] & bit[n]:
                raise InvalidValueError(f"{f!r} frees {a!r} but is not ordered after {n!r}")
            by_device.setdefault(a.device, []).append((a, n, f))
            self._allocs.append(a)
        for device, allocs in by_device.items():
            offsets, footprint = memory.pack(allocs, anc, bit)
            base = memory.map_allocs(self, device, offsets, footprint)
            self._arenas.append((device, base, footprint))
            self.memory_footprint += footprint

    # -- compile -------------------------------------------------------------------------------
    def _plan(self, stream: Stream) -> _Plan:
        key = (stream.id, bool(instrument.listeners))  # instrumented plans wrap every node
        plan = self._plans.get(key)
        if plan is None:
            gc_was = gc.isenabled()
            gc.disable()  # many long-lived objects: generational passes would make it quadratic
            try:
                plan = self._plans[key] = self._compile(stream)
            finally:
                if gc_was:
                    gc.enable()
        return plan

    def _compile(self, stream: Stream) -> _Plan:
        flat: list[tuple[Any, list[int]]] = []  # (op or None, deps as flat indices)
        nodes: list[Node | None] = []  # the node of each flat entry (None: a child's exit)

        def inline(graph: Graph, entry_deps: list[int], top: bool) -> list[int]:
            index: dict[int, int] = {}
            for n in _topo(graph):
                deps = [index[d.index] for d in n._deps] or list(entry_deps)
                if n.type is NodeType.GRAPH:
                    leaves = inline(n._params["graph"], deps, False)
                    flat.append((None, leaves))
                    nodes.append(None)
                else:
                    disabled = top and n.index in self._disabled
                    flat.append((None if disabled else _op(n, stream), deps))
                    nodes.append(n)
                index[n.index] = len(flat) - 1
            dependents = {d for _, deps in flat for d in deps}
            return [i for i in index.values() if i not in dependents] or list(entry_deps)

        inline(self._template, [], True)
        if instrument.listeners:
            flat = _instrumented(flat, nodes)
        return _chains(flat)

    # -- launch --------------------------------------------------------------------------------
    def launch(self, stream: Stream) -> None:
        """Enqueue the whole graph as one operation of ``stream`` (``cudaGraphLaunch``)."""
        self._check(stream)
        if stream._capture is not None:
            # captured as a child graph of what this exec runs: its disabled nodes must stay
            # empty there too (the raw template was captured before, so a disabled node ran)
            with self._lock:
                graph = self._template.clone()
                for i in self._disabled:
                    n = graph._nodes[i]
                    n.type, n._params = NodeType.EMPTY, {}
            return stream._capture.add_graph(stream, graph)
        with self._lock:
            self._check_memory()
            plan = self._plan(stream)
            last = self._last
            if last is not None and last[0] is not stream:
                other, pos = last
                if stream._clock.get(other.id, 0) < pos:
                    stream._order_after(other, pos, {other.id: pos})
            for n in self._event_nodes:
                if n.type is NodeType.WAIT_EVENT:
                    stream.wait(n._params["event"])
            stream._submit(_run_plan, (plan,), "graph",
                           f"graph launch ({len(self._template._nodes)} nodes)")
            for n in self._event_nodes:
                if n.type is NodeType.EVENT_RECORD:
                    stream.record(n._params["event"])
            for n in self._mem_nodes:
                t = n.type
                if t is NodeType.MEM_ALLOC:
                    a = n._params["alloc"]
                    a.live = True
                    memory._account(a.device, a.size)
                elif t is NodeType.MEM_FREE:
                    a = n._params["alloc"]
                    a.live = False
                    memory._account(a.device, -a.size)
            self._last = (stream, stream._pos)

    def _check(self, stream: Any) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        if not isinstance(stream, Stream):
            raise InvalidTypeError(f"launch needs a Stream, not {type(stream).__name__}")
        stream._check_alive()

    def _check_memory(self) -> None:
        mine = {id(a) for a in self._allocs}
        for n in self._mem_nodes:
            if n.type is NodeType.MEM_ALLOC:
                a = n._params["alloc"]
                if a.live and not self.auto_free_on_launch:
                    raise InvalidValueError(
                        f"{a!r} from the previous launch was never freed: free it (s.free) or "
                        "instantiate with auto_free_on_launch=True"
                    )
            elif n.type is NodeType.MEM_FREE:
                a = n._params["alloc"]
                if id(a) not in mine and not a.live:
                    raise InvalidValueError(f"{n!r} frees {a!r}, which is not live")
        if self.auto_free_on_launch:
            for a in self._allocs:
                if a.live:
                    a.live = False
                    memory._account(a.device, -a.size)

    def upload(self, stream: Stream) -> None:
        """Prepare the replay plan for ``stream`` ahead of the first launch (``cudaGraphUpload``)."""
        self._check(stream)
        with self._lock:
            self._plan(stream)

    def destroy(self) -> None:
        """Release the exec and its graph memory (``cudaGraphExecDestroy``)."""
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        with self._lock:
            self._destroyed = True
            arenas, self._arenas = self._arenas, []
            self._plans.clear()
            last = self._last
        if not arenas:
            return
        if last is None or last[0]._q.done >= last[1]:
            self._unmap(arenas)
            return
        # A launch is still in flight: unmapping now made its kernels fail on their own memory.
        # As cudaGraphExecDestroy does, let it finish and release the memory asynchronously
        # (a thread of its own: a pool worker could be needed by that very launch).
        stream, pos = last

        def release() -> None:
            stream._q.wait_done(pos)
            self._unmap(arenas)

        threading.Thread(target=release, name="streamrt-graph-release", daemon=True).start()

    def _unmap(self, arenas: list[tuple[Any, int, int]]) -> None:
        for device, base, footprint in arenas:
            try:
                memory.unmap_allocs(self, device, self._allocs, base, footprint)
            except StreamRTError:
                pass  # the device was reset meanwhile: its memory is already gone

    # -- per-node updates ------------------------------------------------------------------------
    def _node(self, node: Any, *types: NodeType) -> Node:
        if not isinstance(node, Node):
            raise InvalidTypeError(f"expected a Node, not {type(node).__name__}")
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        t = node if node.graph is self._template else self._template.find_in_clone(node)
        if types and t.type not in types:
            raise InvalidValueError(f"{node!r} is a {t.type.name} node, not {types[0].name}")
        return t

    def _set(self, t: Node, params: dict[str, Any]) -> None:
        with self._lock:
            t._params = params
            self._plans.clear()  # later launches only: enqueued launches keep their plan

    def set_kernel_node_params(self, node: Node, *args: Any, grid: Any = None,
                               block: Any = None) -> None:
        """Replace a kernel node's arguments (and launch shape) for later launches."""
        t = self._node(node, NodeType.KERNEL)
        p = dict(t._params)
        p["args"] = tuple(args)
        if grid is not None:
            p["grid"] = dim3(grid, "grid")
        if block is not None:
            p["block"] = dim3(block, "block")
        self._set(t, p)

    def set_memcpy_node_params(self, node: Node, dst: Any, src: Any, nbytes: int) -> None:
        """Replace a copy node's operands; the kinds of memory (host/device) cannot change."""
        t = self._node(node, NodeType.MEMCPY)
        p = memcpy_params(dst, src, nbytes)
        if _kinds(p) != _kinds(t._params):
            raise InvalidValueError("a copy node's direction (host/device operands) cannot change")
        self._set(t, p)

    def set_memset_node_params(self, node: Node, ptr: int, value: int, nbytes: int) -> None:
        """Replace a memset node's pointer, value and size."""
        t = self._node(node, NodeType.MEMSET)
        self._set(t, memset_params(ptr, value, nbytes))

    def set_host_node_params(self, node: Node, fn: Callable[..., Any], *args: Any) -> None:
        """Replace a host node's function and arguments."""
        t = self._node(node, NodeType.HOST)
        self._set(t, host_params(fn, args))

    def set_node_enabled(self, node: Node, enabled: bool) -> None:
        """Enable or disable a kernel, memcpy or memset node; a disabled node acts as empty."""
        if not isinstance(enabled, bool):
            raise InvalidTypeError("enabled must be a bool")
        t = self._node(node, *_DISABLEABLE)
        with self._lock:
            (self._disabled.discard if enabled else self._disabled.add)(t.index)
            self._plans.clear()

    def node_enabled(self, node: Node) -> bool:
        """Whether a node is enabled (``cudaGraphNodeGetEnabled``)."""
        return self._node(node).index not in self._disabled

    # -- whole-graph update ------------------------------------------------------------------------
    def update(self, graph: Graph) -> None:
        """Take the parameters of ``graph`` (same topology) for later launches (``cudaGraphExecUpdate``)."""
        if not isinstance(graph, Graph):
            raise InvalidTypeError(f"update needs a Graph, not {type(graph).__name__}")
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        problem = _diff(self._template, graph)
        if problem is not None:
            result, node, why = problem
            raise GraphExecUpdateError(f"update refused ({result.name}): {why}", result=result,
                                       node=node)
        with self._lock:
            _adopt(self._template, graph)
            self._plans.clear()


# -- helpers -------------------------------------------------------------------------------------
def _topo(graph: Graph) -> list[Node]:
    """Kahn's order, ties by creation order; the builder guarantees acyclicity."""
    npred = {id(n): len(n._deps) for n in graph._nodes}
    ready = [n for n in graph._nodes if not n._deps]
    out: list[Node] = []
    i = 0
    while i < len(ready):
        n = ready[i]
        i += 1
        out.append(n)
        for d in n._dependents:
            npred[id(d)] -= 1
            if npred[id(d)] == 0:
                ready.append(d)
    if len(out) != len(graph._nodes):
        raise InvalidValueError(f"{graph!r} has a cycle")
    return out


def _instrumented(flat: list[tuple[Any, list[int]]],
                  nodes: list[Node | None]) -> list[tuple[Any, list[int]]]:
    """Wrap every node op with its index, name, ancestors and declared memory (for the
    sanitizer and traces)."""
    anc = [0] * len(flat)
    out = []
    for i, (op, deps) in enumerate(flat):
        acc = 0
        for d in deps:
            acc |= anc[d] | (1 << d)
        anc[i] = acc
        n = nodes[i]
        if op is not None and n is not None:
            kind, name, accesses = _describe(n)
            site = n._params.get("site", "")
            op = (_node_call, ((i, kind, name, acc, accesses, site), *op))
        out.append((op, deps))
    return out


def _describe(n: Node) -> tuple[str, str, tuple]:
    p = n._params
    if n.type is NodeType.MEMCPY:
        acc = tuple((int(x), p["nbytes"], w) for x, w in ((p["dst"], True), (p["src"], False))
                    if isinstance(x, int | np.integer) and not isinstance(x, bool))
        return "memcpy", f"memcpy {p['nbytes']} B", acc
    if n.type is NodeType.MEMSET:
        return "memset", f"memset {p['nbytes']} B", ((p["ptr"], p["nbytes"], True),)
    if n.type is NodeType.HOST:
        return "host", getattr(p["fn"], "__qualname__", repr(p["fn"])), ()
    return "kernel", p["kernel"].name, ()


def _op(n: Node, stream: Stream) -> tuple | None:
    p = n._params
    t = n.type
    if t is NodeType.KERNEL:
        ctx = KernelContext(p["grid"], p["block"], stream.device, stream)
        return (p["kernel"].fn, (ctx, *p["args"]))
    if t is NodeType.MEMCPY:
        k = p["nbytes"]
        if not k:
            return None
        return (copy_op, (_view(p["dst"], k, True), _view(p["src"], k, False)))
    if t is NodeType.MEMSET:
        return (fill_op, (SPACE.span(p["ptr"], p["nbytes"]), p["value"])) if p["nbytes"] else None
    if t is NodeType.HOST:
        return (host_call, (p["fn"], p["args"]))
    return None  # EMPTY, events and memory nodes: handled at launch on the host


def _view(end: Any, n: int, writable: bool) -> np.ndarray:
    if isinstance(end, int | np.integer) and not isinstance(end, bool):
        return SPACE.span(int(end), n)
    return host_view(end, n, writable=writable)  # by reference: read when the node runs


def _chains(flat: list[tuple[Any, list[int]]]) -> _Plan:
    n = len(flat)
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, (_, deps) in enumerate(flat):
        for d in deps:
            dependents[d].append(i)
    chain_of = [0] * n
    chains: list[list[tuple]] = []
    heads: list[int] = []
    for i, (op, deps) in enumerate(flat):  # flat is topologically ordered
        if len(deps) == 1 and len(dependents[deps[0]]) == 1:
            c = chain_of[deps[0]]
        else:
            c = len(chains)
            chains.append([])
            heads.append(i)
        chain_of[i] = c
        if op is not None:
            chains[c].append(op)
    succ: list[list[int]] = [[] for _ in chains]
    npred = [0] * len(chains)
    for c, head in enumerate(heads):
        for d in dict.fromkeys(chain_of[d] for d in flat[head][1]):
            succ[d].append(c)
            npred[c] += 1
    if not chains:
        return _Plan([[]], [[]], [0])
    return _Plan(chains, succ, npred)


def _kinds(p: dict[str, Any]) -> tuple:
    def kind(x: Any) -> Any:
        if isinstance(x, int | np.integer) and not isinstance(x, bool):
            a = SPACE.find(int(x))
            return ("device", a.device if a is not None else None)
        return ("host",)

    return kind(p["dst"]), kind(p["src"])


def _diff(old: Graph, new: Graph) -> tuple[GraphExecUpdateResult, Node | None, str] | None:
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
        if t is NodeType.MEMCPY and _kinds(po) != _kinds(pn):
            return R.PARAMETERS_CHANGED, n, f"{n!r} changed its direction or device"
        if t is NodeType.MEMSET and _kinds({"dst": po["ptr"], "src": po["ptr"]}) != _kinds(
                {"dst": pn["ptr"], "src": pn["ptr"]}):
            return R.PARAMETERS_CHANGED, n, f"{n!r} moved to another device"
        if t in (NodeType.MEM_ALLOC, NodeType.MEM_FREE) and (
                po["ptr"], po.get("nbytes")) != (pn["ptr"], pn.get("nbytes")):
            return R.NOT_SUPPORTED, n, f"{n!r}: memory nodes cannot be updated"
        if t is NodeType.GRAPH:
            sub = _diff(po["graph"], pn["graph"])
            if sub is not None:
                return sub[0], n, f"in child graph {n!r}: {sub[2]}"
    return None


def _adopt(old: Graph, new: Graph) -> None:
    for o, n in zip(old._nodes, new._nodes):
        if o.type is NodeType.GRAPH:
            _adopt(o._params["graph"], n._params["graph"])
        elif o.type not in (NodeType.MEM_ALLOC, NodeType.MEM_FREE):
            o._params = dict(n._params)
