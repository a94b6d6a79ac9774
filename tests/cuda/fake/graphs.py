"""CUDA graphs: nodes with dependencies, instantiated as a private copy, launched as one operation.

A node's parameters are copied when it is added (kernel parameters too, as the driver does).
``cudaGraphInstantiate`` copies the graph, so destroying the graph leaves the exec intact, and
an exec destroyed while a launch is in flight still completes that launch. The exec's node
parameters and enabled flags change in place (``cudaGraphExec*NodeSetParams``,
``cudaGraphNodeSetEnabled``) for later launches only: a launch takes a snapshot of them. Those
calls name the node by the graph's, so they fail once the graph was destroyed. A launch runs the
nodes on the stream's worker thread in a topological order that, among nodes whose
dependencies are met, takes the one added *last*: a dependency the caller forgot shows as work
run out of order, not hidden by insertion order. Host nodes run as host functions (no CUDA calls
from them). Event nodes act in place: a launch records each record node's event (it becomes the
event's record, complete once the node ran, stamped then) and binds each wait node to the record
its event has at the launch (``cuGraphExecEventWaitNodeSetEvent`` changes the event for later
launches); a wait node whose record is not complete holds back only its dependents: the nodes
that do not depend on it run first, and the worker blocks only when nothing else is ready.
Memcpy nodes may use pageable host memory (allowed in ordinary graphs; CUDA forbids it only in
conditional-node bodies, where the fake refuses it too) and read or write it when the node runs,
not when added. Conditional nodes, their bodies and handles: ``conditional.py``.

``cudaGraphInstantiateWithParams`` takes the flags the fake can honour (auto-free on launch and
node priority are recorded on the exec, ``Exec.flags``: there are no memory nodes and no
priorities among a launch's nodes here; upload with its stream) and reports in ``result_out``.
Updates of an exec's nodes: ``graph_updates.py``; the graph memory attributes:
``graph_memattrs.py``.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt

from . import capture, conditional, kernels, memory, state, streams
from .binding import driver, runtime
from .state import DRV_SUCCESS, LOCK, SUCCESS, E, R

_F = rt.cudaGraphInstantiateFlags


class Node:
    def __init__(self, graph: Graph, kind: str, run: Any, deps: list[int]) -> None:
        self.handle = state.new_handle()
        self.graph = graph
        self.kind = kind
        self.run = run  # callable run on the worker thread (None: empty node)
        self.deps = deps


class Graph:
    def __init__(self) -> None:
        self.handle = state.new_handle()
        self.nodes: dict[int, Node] = {}  # insertion order
        self.body_of: Node | None = None  # the conditional node of a body graph (conditional.py)

    def order(self) -> list[Node]:
        """Topological order, last-added first among the ready nodes."""
        waiting = {h: set(n.deps) for h, n in self.nodes.items()}
        done: list[Node] = []
        finished: set[int] = set()
        while waiting:
            ready = [h for h, deps in waiting.items() if deps <= finished]
            h = ready[-1]  # last added (dict order is insertion order)
            del waiting[h]
            finished.add(h)
            done.append(self.nodes[h])
        return done


class NodeMark:
    """One launch's record of an event record node: complete (``done`` 1) once the node ran;
    stands where an event's record names a stream and its operation (``FakeEvent.rec``)."""

    def __init__(self) -> None:
        self.done = 0

    def reach(self, stamp: list) -> None:
        with state.CHANGED:
            stamp[0] = time.perf_counter()
            self.done = 1
            state.CHANGED.notify_all()

    def saw(self, seq: int) -> None:
        """A host synchronize waited for it (streams remember that; a node mark needs not)."""


class Exec:
    def __init__(self, graph: Graph, device: int, flags: int = 0) -> None:
        self.handle = state.new_handle()
        self.device = device
        self.flags = flags  # cudaGraphInstantiateFlags it was made with
        self.graph = graph
        # node handle -> [kind, run, enabled], in the order a launch runs them (an event node's
        # run: its event's handle; a conditional node's: its bodies instantiated)
        self.steps = {n.handle: [n.kind, conditional.CondExec(n.run, device, flags)
                                 if n.kind == "conditional" else n.run, True]
                      for n in graph.order()}
        self.deps = {n.handle: list(n.deps) for n in graph.nodes.values()}
        self.cond_values = conditional.values_of(self)  # its handles' values, or None

    def node(self, node: Any, *kinds: str) -> list | None:
        """The exec's step of a live node of its graph, of one of ``kinds``; None otherwise."""
        h = state.as_int(node)
        step = self.steps.get(h)
        if step is None or NODES.get(h) is None or step[0] not in kinds:
            return None
        return step

    def snapshot(self) -> list[tuple]:
        """What a launch runs, ``(handle, kind, run, deps, wait)`` in order: later parameter and
        enabled changes do not reach it. Its record nodes record their events now and its wait
        nodes take their events' records now (call holding LOCK)."""
        from .events import EVENTS

        out = []
        for h, (kind, fn, on) in self.steps.items():
            wait = None
            if kind == "event_record":
                ev = EVENTS.get(fn)
                fn = None
                if ev is not None:
                    mark, stamp = NodeMark(), [None]
                    ev.rec = (mark, 1, stamp)
                    fn = lambda mark=mark, stamp=stamp: mark.reach(stamp)  # noqa: E731
            elif kind == "event_wait":
                ev = EVENTS.get(fn)
                fn = None
                if ev is not None and ev.rec is not None:
                    wait = ev.rec[:2]  # the record current now; later ones don't count
            elif kind == "conditional":
                fn = fn.snapshot()
            out.append((h, kind, fn if on else None, self.deps[h], wait))
        return out

    @staticmethod
    def run(steps: list[tuple]) -> None:
        if any(st[4] is not None for st in steps):
            return Exec._run_waiting(steps)
        for _h, kind, fn, _deps, _wait in steps:
            Exec._step(kind, fn)

    @staticmethod
    def _step(kind: str, fn: Any) -> None:
        if fn is None:
            return
        if kind == "host":
            with state.host_function_scope():
                fn()
        else:
            fn()

    @staticmethod
    def _run_waiting(steps: list[tuple]) -> None:
        """Run the first step (in order) whose dependencies ran and whose wait is complete;
        block only when no step is."""
        done: set[int] = set()
        pending = list(steps)

        def ready(st: tuple) -> bool:
            wait = st[4]
            return all(d in done for d in st[3]) and (wait is None or wait[0].done >= wait[1])

        while pending:
            i = next((i for i, st in enumerate(pending) if ready(st)), None)
            if i is None:
                streams.wait_for(lambda: any(ready(st) for st in pending))
                continue
            h, kind, fn, _deps, _wait = pending.pop(i)
            Exec._step(kind, fn)
            done.add(h)


GRAPHS: dict[int, Graph] = {}
NODES: dict[int, Node] = {}
EXECS: dict[int, Exec] = {}


def _add(graph: Any, deps: Any, n: int, kind: str, run: Any, bad: Any) -> tuple:
    """Add a node to ``graph`` after ``deps``; the ``bad`` result for an invalid call."""
    with LOCK:
        g = GRAPHS.get(state.as_int(graph))
        dep_handles = [state.as_int(d) for d in (deps or [])][: int(n)]
        if g is None or len(dep_handles) != int(n) or len(set(dep_handles)) != len(dep_handles):
            return None, bad
        if any(h not in g.nodes for h in dep_handles) or conditional.body_refuses(g, kind):
            return None, bad
        node = Node(g, kind, run, dep_handles)
        g.nodes[node.handle] = node
        NODES[node.handle] = node
    return node, None


@runtime("cudaGraphCreate")
def cudaGraphCreate(flags: int) -> tuple:
    if int(flags) != 0:
        return (E.cudaErrorInvalidValue, None)
    with LOCK:
        g = Graph()
        GRAPHS[g.handle] = g
    return (SUCCESS, rt.cudaGraph_t(g.handle))


@runtime("cudaGraphDestroy")
def cudaGraphDestroy(graph: Any) -> tuple:
    with LOCK:
        g = GRAPHS.get(state.as_int(graph))
        if g is None or g.body_of is not None:  # a body is its conditional node's
            return (E.cudaErrorInvalidValue,)
        del GRAPHS[g.handle]
        conditional.drop(g)
        for h in g.nodes:
            NODES.pop(h, None)
    return (SUCCESS,)


def _kernel_run(kp: Any) -> Any:
    """The work of a kernel node's parameters (copied now), or None when they are invalid."""
    if kp is None:
        return None
    with LOCK:
        fn = kernels.FUNCTIONS.get(state.as_int(kp.func))
    if fn is None:
        return None
    grid = (int(kp.gridDimX), int(kp.gridDimY), int(kp.gridDimZ))
    block = (int(kp.blockDimX), int(kp.blockDimY), int(kp.blockDimZ))
    smem = int(kp.sharedMemBytes)
    if kernels.check_dims(grid, block, smem, fn) is not None:
        return None
    if state.as_int(kp.extra):
        raise state.FakeUnsupported("kernel node with 'extra': not modelled")
    params = kernels.Params(int(kp.kernelParams), fn.lib.param_sizes)  # copied now
    return lambda: kernels.run(fn, params, grid, block, smem)


@driver("cuGraphAddKernelNode", 1)
def cuGraphAddKernelNode(graph: Any, deps: Any, n: int, kp: Any) -> tuple:
    run = _kernel_run(kp)
    if run is None:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    node, bad = _add(graph, deps, n, "kernel", run, (R.CUDA_ERROR_INVALID_VALUE, None))
    return bad or (DRV_SUCCESS, drv.CUgraphNode(node.handle))


def _memcpy_run(dst: Any, src: Any, count: int, kind: Any) -> tuple[Any, Any]:
    """(the copy, None), or (None, the error) for invalid operands."""
    d, s_, c = memory.address(dst), memory.address(src), int(count)
    if int(kind) not in (0, 1, 2, 3, 4):
        return None, E.cudaErrorInvalidMemcpyDirection
    try:
        memory.classify(d, c)
        memory.classify(s_, c)
    except memory.BadRange:
        return None, E.cudaErrorInvalidValue
    return (lambda: ctypes.memmove(d, s_, c)), None


@runtime("cudaGraphAddMemcpyNode1D")
def cudaGraphAddMemcpyNode1D(graph: Any, deps: Any, n: int, dst: Any, src: Any, count: int,
                             kind: Any) -> tuple:
    run, err = _memcpy_run(dst, src, count, kind)
    if err is not None:
        return (err, None)
    with LOCK:  # CUDA refuses pageable host memory in a conditional node's body
        g = GRAPHS.get(state.as_int(graph))
        if g is not None and g.body_of is not None and "pageable" in (
                memory.classify(memory.address(dst), int(count))[0],
                memory.classify(memory.address(src), int(count))[0]):
            return (E.cudaErrorInvalidValue, None)
    node, bad = _add(graph, deps, n, "memcpy", run, (E.cudaErrorInvalidValue, None))
    return bad or (SUCCESS, rt.cudaGraphNode_t(node.handle))


def _memset_run(ms: Any) -> Any:
    """The fill of memset parameters, or None when they are invalid (pageable memory too)."""
    if ms is None:
        return None
    p, esize, width, height = int(ms.dst), int(ms.elementSize), int(ms.width), int(ms.height)
    value, pitch = int(ms.value), int(ms.pitch)
    if esize not in (1, 2, 4) or height < 1 or (height > 1 and pitch < width * esize):
        return None
    span = (height - 1) * pitch + width * esize
    try:
        k, _ = memory.classify(p, span)
    except memory.BadRange:
        return None
    if k == "pageable":
        return None
    elem = value.to_bytes(8, "little")[:esize]
    row = elem * width

    def fill() -> None:
        for r in range(height):
            ctypes.memmove(p + r * pitch, row, len(row))

    return fill


@runtime("cudaGraphAddMemsetNode")
def cudaGraphAddMemsetNode(graph: Any, deps: Any, n: int, ms: Any) -> tuple:
    run = _memset_run(ms)
    if run is None:
        return (E.cudaErrorInvalidValue, None)
    node, bad = _add(graph, deps, n, "memset", run, (E.cudaErrorInvalidValue, None))
    return bad or (SUCCESS, rt.cudaGraphNode_t(node.handle))


@runtime("cudaGraphAddHostNode")
def cudaGraphAddHostNode(graph: Any, deps: Any, n: int, hp: Any) -> tuple:
    if hp is None or not state.as_int(hp.fn):
        return (E.cudaErrorInvalidValue, None)
    fn, data = state.as_int(hp.fn), state.as_int(hp.userData)
    node, bad = _add(graph, deps, n, "host",
                     lambda: ctypes.CFUNCTYPE(None, ctypes.c_void_p)(fn)(data),
                     (E.cudaErrorInvalidValue, None))
    return bad or (SUCCESS, rt.cudaGraphNode_t(node.handle))


def _event_node(graph: Any, deps: Any, n: int, event: Any, kind: str) -> tuple:
    from .events import EVENTS

    with LOCK:
        ev = EVENTS.get(state.as_int(event))
    if ev is None:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    node, bad = _add(graph, deps, n, kind, ev.handle, (R.CUDA_ERROR_INVALID_VALUE, None))
    return bad or (DRV_SUCCESS, drv.CUgraphNode(node.handle))


@driver("cuGraphAddEventRecordNode", 1)
def cuGraphAddEventRecordNode(graph: Any, deps: Any, n: int, event: Any) -> tuple:
    return _event_node(graph, deps, n, event, "event_record")


@driver("cuGraphAddEventWaitNode", 1)
def cuGraphAddEventWaitNode(graph: Any, deps: Any, n: int, event: Any) -> tuple:
    return _event_node(graph, deps, n, event, "event_wait")


@runtime("cudaGraphAddEmptyNode")
def cudaGraphAddEmptyNode(graph: Any, deps: Any, n: int) -> tuple:
    node, bad = _add(graph, deps, n, "empty", None, (E.cudaErrorInvalidValue, None))
    return bad or (SUCCESS, rt.cudaGraphNode_t(node.handle))


@runtime("cudaGraphInstantiate")
def cudaGraphInstantiate(graph: Any, flags: int) -> tuple:
    with LOCK:
        g = GRAPHS.get(state.as_int(graph))
        if g is None or g.body_of is not None or conditional.unused(g):
            return (E.cudaErrorInvalidValue, None)
        x = Exec(g, state.current_device())
        EXECS[x.handle] = x
    return (SUCCESS, rt.cudaGraphExec_t(x.handle))


@runtime("cudaGraphInstantiateWithParams")
def cudaGraphInstantiateWithParams(graph: Any, params: Any) -> tuple:
    R_ = rt.cudaGraphInstantiateResult
    if params is None:
        return (E.cudaErrorInvalidValue, None)
    flags = int(params.flags)
    known = int(_F.cudaGraphInstantiateFlagAutoFreeOnLaunch) | int(_F.cudaGraphInstantiateFlagUpload) \
        | int(_F.cudaGraphInstantiateFlagDeviceLaunch) | int(_F.cudaGraphInstantiateFlagUseNodePriority)
    if flags & ~known:
        params.result_out = R_.cudaGraphInstantiateError
        return (E.cudaErrorInvalidValue, None)
    if flags & int(_F.cudaGraphInstantiateFlagDeviceLaunch):
        raise state.FakeUnsupported("cudaGraphInstantiateFlagDeviceLaunch: device launch is not modelled")
    with LOCK:
        g = GRAPHS.get(state.as_int(graph))
        if g is None or g.body_of is not None:
            params.result_out = R_.cudaGraphInstantiateError
            return (E.cudaErrorInvalidValue, None)
        if conditional.unused(g):
            params.result_out = R_.cudaGraphInstantiateConditionalHandleUnused
            return (E.cudaErrorInvalidValue, None)
        upload = None
        if flags & int(_F.cudaGraphInstantiateFlagUpload):
            upload = streams.resolve(params.uploadStream)
            if upload is None:
                params.result_out = R_.cudaGraphInstantiateError
                return (E.cudaErrorInvalidResourceHandle, None)
        x = Exec(g, state.current_device(), flags)
        EXECS[x.handle] = x
        if upload is not None:
            upload.enqueue(lambda: None, "graph upload")
        params.result_out = R_.cudaGraphInstantiateSuccess
    return (SUCCESS, rt.cudaGraphExec_t(x.handle))


def _exec_and_stream(exec_: Any, stream: Any) -> tuple[Any, Any, Any]:
    """The exec and stream named by the handles, or the error CUDA gives (call holding LOCK)."""
    x = EXECS.get(state.as_int(exec_))
    s = streams.resolve(stream)
    if x is None:
        return None, None, E.cudaErrorInvalidValue
    if s is None:
        return None, None, E.cudaErrorInvalidResourceHandle
    return x, s, None


@runtime("cudaGraphLaunch")
def cudaGraphLaunch(exec_: Any, stream: Any) -> tuple:
    with LOCK:
        x, s, err = _exec_and_stream(exec_, stream)
        if err is not None:
            return (err,)
        if s.device != x.device:
            return (E.cudaErrorInvalidValue,)
        run = conditional.launch_run(x, x.snapshot())
        res = capture.intercept(s, "graph", run)  # a child graph node
        if res is not None:
            return (res,)
        s.enqueue(run, "graph launch")  # alive past an exec destroy
    return (SUCCESS,)


@runtime("cudaGraphUpload")
def cudaGraphUpload(exec_: Any, stream: Any) -> tuple:
    with LOCK:
        _x, s, err = _exec_and_stream(exec_, stream)
        if err is not None:
            return (err,)
        capture.unsupported(s, "cudaGraphUpload")
        s.enqueue(lambda: None, "graph upload")
    return (SUCCESS,)


@runtime("cudaGraphExecDestroy")
def cudaGraphExecDestroy(exec_: Any) -> tuple:
    with LOCK:
        if EXECS.pop(state.as_int(exec_), None) is None:
            return (E.cudaErrorInvalidValue,)
    return (SUCCESS,)
