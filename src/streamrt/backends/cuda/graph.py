"""CUDA graphs for the cuda backend: a frontend graph, flattened, built as a ``cudaGraph_t``.

Capture, the capture errors, exec update rules and events stay in the frontend (DESIGN.md §1);
this module turns the flattened node list of one exec into a real CUDA graph
(``cudaGraphAdd*Node``), instantiates it once per device (the device's graph runner, whichever
of its streams launches it; ``cudaGraphInstantiateWithParams``, whose refusal is a
``GraphInstantiateError`` naming the frontend node) and launches it with one
``cudaGraphLaunch``. Event nodes are CUDA's own (``cuGraphAddEventRecordNode``/
``cuGraphAddEventWaitNode``): a record node records its mark's CUDA event (mark.py); a wait node
waits for a CUDA event set on the exec just before each launch
(``cuGraphExecEventWaitNodeSetEvent``: the marker event of the position the frontend bound it
to), and set back to a never-recorded one right after, so the exec holds no event it does not
own between launches. Parameter updates and enable/disable reach the instantiated graph in place
(``cudaGraphExec*NodeSetParams``, ``cudaGraphNodeSetEnabled``), so the graph is kept as long as
its exec: CUDA names exec nodes by the graph's. Host nodes run through the backend's
host-function trampoline, so their Python callables run on a Python thread, never on the
driver's. Conditional nodes are CUDA's own, their bodies built as the top graph is, their
values bridged from ``h.ptr`` and their defaults written at each launch (conditional.py). A
launching queue holds the graph until it has passed the launch (``CudaQueue.hold``); the graph's
jobs go when it is collected.
"""

from __future__ import annotations

import weakref
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from ...graph.instantiate import GraphInstantiateResult, refuse
from ...graph.node import NodeType
from ...kernel import dim3
from ...labels import fn_label
from ...validate import host_view, is_int
from ..base import Flat, GraphRunner
from . import conditional, hostfn
from .errors import check
from .runtime import activate, drv, host_ptr, rt

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...graph.node import Node
    from .device import CudaDevice
    from .mark import CudaMark
    from .queue import CudaQueue

# nodes whose parameters the CUDA graph does not hold (empty and memory nodes are built as empty
# ones; an event node's event is the frontend's, bound at each launch): nothing to update
_PARAMLESS = (NodeType.EMPTY, NodeType.EVENT_RECORD, NodeType.WAIT_EVENT, NodeType.MEM_ALLOC,
              NodeType.MEM_FREE)


class _Launches:
    """Where a graph's host-node failures go: the queue and position of its latest launch. Kept
    apart from :class:`NativeGraph` so that the jobs (module-wide, in ``hostfn.jobs``) do not keep
    the graph alive: a graph with a host node was otherwise never released."""

    __slots__ = ("queue", "pos")

    def __init__(self) -> None:
        self.queue: Any = None
        self.pos = 0

    def error(self, exc: BaseException, label: str) -> None:
        if self.queue is not None:
            self.queue.errors.append((self.pos, exc, label))


class NativeGraph(GraphRunner):
    """One instantiated CUDA graph (``cudaGraphExec_t``) of a frontend exec on one device."""

    def __init__(self, dev: CudaDevice, flat: Flat, marks: dict[int, CudaMark], *,
                 use_node_priority: bool = False) -> None:
        self.dev = dev
        self._launches = _Launches()
        self._keep: list[Any] = []  # parameter buffers the nodes point at
        self._jobs: list[int] = []
        self._built: dict[Node, int] = {}  # kernel, memcpy and memset nodes -> their CUDA nodes
        self._host: dict[Node, tuple] = {}  # host node -> the (fn, args) it was built with
        self._nested: set[Node] = set()  # the nodes of conditional bodies (built again to update)
        self._views: dict[Node, list[Any]] = {}  # memcpy node -> the host views it copies
        self._retired: list[tuple[Any, int, list[Any]]] = []  # views enqueued launches may use
        self._marks = marks
        # the event nodes in flat order: (the mark of a record node, or None; the CUDA node)
        self._events: list[tuple[CudaMark | None, int]] = []
        activate(dev.index)
        # what a wait node waits for between launches and when the launch binds nothing: a
        # never-recorded event (waiting for one returns at once)
        self._never: Any = None
        if any(n is not None and n.type is NodeType.WAIT_EVENT for n, _, _ in flat):
            self._never = check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
        self.graph = check(rt.cudaGraphCreate(0))
        try:
            # the handles' defaults, written before every root node (conditional.py)
            roots = [self._one_thread(self.graph, [], conditional.DEFAULT, (h.ptr, h.default))
                     for h in conditional.defaults(flat)]
            made: list[int] = []
            for i, (node, deps, _on) in enumerate(flat):
                made.append(self._add(self.graph, node, [made[d] for d in deps] or roots, i))
            self.exec = self._instantiate(flat, made, use_node_priority)
        except BaseException:
            self._release_jobs()
            rt.cudaGraphDestroy(self.graph)
            if self._never is not None:
                rt.cudaEventDestroy(self._never)
            raise
        weakref.finalize(self, _destroy, self.exec, self.graph, list(self._jobs), self._never)
        for node, _deps, on in flat:  # disabled nodes: built, then switched off
            if not on and node in self._built:
                self._enable(self._built[node], False)

    def _instantiate(self, flat: Flat, made: list[int], use_node_priority: bool) -> Any:
        """``cudaGraphInstantiateWithParams``; a refusal with a result raises
        ``GraphInstantiateError`` naming the flattened node CUDA names (None for a join)."""
        params = rt.cudaGraphInstantiateParams()
        params.flags = (int(rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagUseNodePriority)
                        if use_node_priority else 0)
        err, exec_ = rt.cudaGraphInstantiateWithParams(self.graph, params)
        result = int(params.result_out)
        if err != 0 and result != GraphInstantiateResult.SUCCESS:
            at = 0 if params.errNode_out is None else int(params.errNode_out)
            node = next((n for (n, _d, _on), h in zip(flat, made) if at and h == at), None)
            why = f"cudaGraphInstantiateWithParams: {getattr(err, 'name', err)}"
            try:
                res = GraphInstantiateResult(result)
            except ValueError:  # a result newer than this enum
                res = GraphInstantiateResult.ERROR
                why += f" (cudaGraphInstantiateResult {result})"
            raise refuse(res, node, why)
        return check((err, exec_))

    # -- nodes ---------------------------------------------------------------------------------
    def _add(self, graph: Any, node: Node | None, deps: list[int], i: int) -> int:
        rdeps = [rt.cudaGraphNode_t(d) for d in deps]
        t = node.type if node is not None else NodeType.EMPTY
        p = node._params if node is not None else {}
        if t is NodeType.EVENT_RECORD:  # records its mark's event, where it sits
            mark = self._marks[i]
            made = check(drv.cuGraphAddEventRecordNode(
                drv.CUgraph(int(graph)), [drv.CUgraphNode(d) for d in deps], len(deps),
                drv.CUevent(int(mark.event))))
            self._events.append((mark, int(made)))
        elif t is NodeType.WAIT_EVENT:  # its event is set at each launch (launch)
            made = check(drv.cuGraphAddEventWaitNode(
                drv.CUgraph(int(graph)), [drv.CUgraphNode(d) for d in deps], len(deps),
                drv.CUevent(int(self._never))))
            self._events.append((None, int(made)))
        elif t is NodeType.KERNEL:
            made = self._kernel_node(graph, deps, self._kernel_params(p))
            self._built[node] = made
        elif t is NodeType.CONDITIONAL:  # a native one, its bodies built as this graph is
            made = conditional.add_node(self, graph, node, deps)
        elif t is NodeType.MEMCPY and p["nbytes"]:
            dst, src = self._views[node] = self._endpoints(p)
            made = check(rt.cudaGraphAddMemcpyNode1D(
                graph, rdeps, len(deps), host_ptr(dst), host_ptr(src), p["nbytes"],
                rt.cudaMemcpyKind.cudaMemcpyDefault))
            self._built[node] = int(made)
        elif t is NodeType.MEMSET and p["nbytes"]:
            made = check(rt.cudaGraphAddMemsetNode(graph, rdeps, len(deps), _memset_params(p)))
            self._built[node] = int(made)
        elif t is NodeType.HOST:
            fn, args = p["fn"], tuple(p["args"])
            label = f"host node {fn_label(fn)!r}"
            job = hostfn.add_repeating(
                fn, args, lambda exc, label=label, to=self._launches: to.error(exc, label))
            self._jobs.append(job)
            self._host[node] = (fn, args)
            hp = rt.cudaHostNodeParams()
            hp.fn = hostfn.HOST_FN
            hp.userData = job
            made = check(rt.cudaGraphAddHostNode(graph, rdeps, len(deps), hp))
        else:
            # empty, a copy or memset of nothing, a child's exit and memory nodes: the exec
            # mapped graph memory at instantiate (GraphExec._map_memory), so a MEM_ALLOC/MEM_FREE
            # node only orders its neighbours here
            made = check(rt.cudaGraphAddEmptyNode(graph, rdeps, len(deps)))
        return int(made)

    def _kernel_node(self, graph: Any, deps: list[int], kp: Any) -> int:
        self._keep.append(kp)
        return int(check(drv.cuGraphAddKernelNode(
            drv.CUgraph(int(graph)), [drv.CUgraphNode(d) for d in deps], len(deps), kp)))

    def _one_thread(self, graph: Any, deps: list[int], kernel: Any, args: tuple) -> int:
        """A kernel node of one thread running ``kernel`` (the backend's own) after ``deps``."""
        one = dim3(1)
        return self._kernel_node(graph, deps, self._kernel_params(
            {"kernel": kernel, "grid": one, "block": one, "args": args}))

    def _kernel_params(self, p: dict[str, Any]) -> Any:
        fn, pack = self.dev.function(p["kernel"])
        kp = drv.CUDA_KERNEL_NODE_PARAMS()
        kp.func = fn
        g, b = p["grid"], p["block"]
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = g.x, g.y, g.z
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = b.x, b.y, b.z
        kp.sharedMemBytes = self.dev.opt_in_shared(fn, p.get("shared_mem", 0))
        kp.kernelParams = pack(tuple(p["args"]))
        return kp

    def _endpoints(self, p: dict[str, Any]) -> list[Any]:
        # device pointers checked by the device (a peer's and pinned memory too), host buffers
        # as views
        n = p["nbytes"]
        return [self.dev.endpoint(int(x), n) if is_int(x) else host_view(x, n, writable=w)
                for x, w in ((p["dst"], True), (p["src"], False))]

    # -- updates in place ------------------------------------------------------------------------
    def update(self, node: Node) -> bool:
        """Give the exec ``node``'s current parameters (``cudaGraphExec*NodeSetParams``) for later
        launches; False when CUDA cannot, and the graph must be built again."""
        t, p = node.type, node._params
        if t is NodeType.CONDITIONAL or node in self._nested:
            return False  # its handle (bridges) or a body changed: built again
        made = self._built.get(node)
        if made is None:  # built as an empty node, or a host node
            if t is NodeType.HOST:
                fn, args = self._host[node]
                return p["fn"] is fn and len(p["args"]) == len(args) and all(
                    a is b for a, b in zip(p["args"], args))
            return t in _PARAMLESS or not p["nbytes"]  # a copy or memset of nothing stays empty
        if t is not NodeType.KERNEL and not p["nbytes"]:
            return False  # CUDA cannot make a copy or memset node empty
        activate(self.dev.index)
        try:
            if t is NodeType.KERNEL:
                check(drv.cuGraphExecKernelNodeSetParams(  # the driver copies the parameters
                    drv.CUgraphExec(int(self.exec)), drv.CUgraphNode(made), self._kernel_params(p)))
            elif t is NodeType.MEMCPY:
                views = self._endpoints(p)
                check(rt.cudaGraphExecMemcpyNodeSetParams1D(
                    self.exec, rt.cudaGraphNode_t(made), host_ptr(views[0]), host_ptr(views[1]),
                    p["nbytes"], rt.cudaMemcpyKind.cudaMemcpyDefault))
                self._retire(self._views[node])
                self._views[node] = views
            else:
                check(rt.cudaGraphExecMemsetNodeSetParams(self.exec, rt.cudaGraphNode_t(made),
                                                          _memset_params(p)))
        except Exception:
            # CUDA refused (e.g. memory of another context), or the parameters do not pack: the
            # graph is built again, which succeeds or raises as a first build would
            return False
        return True

    def set_enabled(self, node: Node, enabled: bool) -> bool:
        """``cudaGraphNodeSetEnabled`` for later launches (a node built empty has nothing to do);
        False when CUDA refused, and the graph must be built again."""
        made = self._built.get(node)
        if made is not None:
            try:
                self._enable(made, enabled)
            except Exception:
                return False
        return True

    def _enable(self, made: int, enabled: bool) -> None:
        activate(self.dev.index)
        check(rt.cudaGraphNodeSetEnabled(self.exec, rt.cudaGraphNode_t(made), int(enabled)))

    def _retire(self, views: list[Any]) -> None:
        # launches already enqueued still copy from the old host views: keep them until the
        # queue of the latest launch has passed it (launches of one exec never overlap)
        q, pos = self._launches.queue, self._launches.pos
        if q is not None:
            self._retired.append((q, pos, views))
        self._retired = [r for r in self._retired if r[0].done < r[1]]

    def _release_jobs(self) -> None:
        for job in self._jobs:
            hostfn.drop(job)

    # -- launch --------------------------------------------------------------------------------
    def op_launch(self, queue: CudaQueue, events: tuple = ()  # type: ignore[override]
                  ) -> tuple[Callable[..., Any], tuple]:
        """The queue operation launching the graph on ``queue``'s stream."""
        return (self.launch, (queue, events)) if events else (self.launch, (queue,))

    def launch(self, q: CudaQueue, events: tuple = ()) -> None:
        """``cudaGraphLaunch`` on the queue's stream, its wait nodes set to this launch's events
        first; the queue holds the graph until it has passed the launch."""
        self._launches.queue, self._launches.pos = q, q.pos
        if self._jobs:
            hostfn.count(len(self._jobs))
        activate(self.dev.index)
        with ExitStack() as pins:  # the events waited for stay alive until the launch took them
            set_: list[int] = []
            try:
                for (mark, node), e in zip(self._events, events, strict=True):
                    if mark is None and e is not None:
                        ev = e[0].wait_event(e[1], pins)
                        if ev is not None:
                            self._wait_on(node, ev)
                            set_.append(node)
                check(rt.cudaGraphLaunch(self.exec, q.stream))
            except BaseException:
                if self._jobs:
                    hostfn.count(-len(self._jobs))
                raise
            finally:
                for node in set_:
                    self._wait_on(node, self._never)
        for (mark, _node), e in zip(self._events, events, strict=True):
            if mark is not None:
                mark.pos = e[0]
        q.hold(self)

    def _wait_on(self, node: int, event: Any) -> None:
        check(drv.cuGraphExecEventWaitNodeSetEvent(drv.CUgraphExec(int(self.exec)),
                                                    drv.CUgraphNode(node), drv.CUevent(int(event))))

    def upload(self, queue: CudaQueue) -> None:  # type: ignore[override]
        """``cudaGraphUpload``: do the launch's one-time work ahead of it."""
        activate(self.dev.index)
        check(rt.cudaGraphUpload(self.exec, queue.stream))


def _memset_params(p: dict[str, Any]) -> Any:
    ms = rt.cudaMemsetParams()
    ms.dst = p["ptr"]
    ms.value = p["value"]
    ms.elementSize = 1
    ms.width = p["nbytes"]
    ms.height = 1
    ms.pitch = 0
    return ms


def _destroy(exec_: Any, graph: Any, jobs: list[int], never: Any) -> None:
    # Runs once no queue holds the graph any more (a queue keeps the graphs it launched until it
    # has passed them), so no launch of it is in flight and its host-node jobs can go.
    hostfn.release(rt.cudaGraphExecDestroy, exec_)
    hostfn.release(rt.cudaGraphDestroy, graph)
    if never is not None:
        hostfn.release(rt.cudaEventDestroy, never)
    for job in jobs:
        hostfn.drop(job)
