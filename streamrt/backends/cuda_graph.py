"""CUDA graphs for the cuda backend: a frontend graph, flattened, built as a ``cudaGraph_t``.

Capture, the capture errors, exec update rules and events stay in the frontend (DESIGN.md §1);
this module only turns the flattened node list of one exec into a real CUDA graph
(``cudaGraphAdd*Node``), instantiates it once per device and launches it with one
``cudaGraphLaunch``. Host nodes run through the backend's host-function trampoline, so their
Python callables run on a Python thread, never on the driver's.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

from ..graph.node import NodeType
from ..stream import _endpoint  # device pointers checked by the backend, host buffers as views
from . import cuda
from .cuda import _activate, _host_fn, _host_ptr, check, drv, rt

if TYPE_CHECKING:
    from ..graph.node import Node

_ids = itertools.count(cuda._ONE_SHOT_END)  # graph host-node jobs: run at every launch


class _Launches:
    """Where a graph's host-node failures go: the queue and position of its latest launch. Kept
    apart from :class:`NativeGraph` so that the jobs (module-wide, in ``cuda._jobs``) do not keep
    the graph alive: a graph with a host node was otherwise never released."""

    __slots__ = ("queue", "pos")

    def __init__(self) -> None:
        self.queue: Any = None
        self.pos = 0

    def error(self, exc: BaseException, label: str) -> None:
        if self.queue is not None:
            self.queue._errors.append((self.pos, exc, label))


class NativeGraph:
    """One instantiated CUDA graph (``cudaGraphExec_t``) of a frontend exec on one device."""

    def __init__(self, dev: Any, flat: list[tuple[Node | None, list[int]]]) -> None:
        self.dev = dev
        self._launches = _Launches()
        self._keep: list[Any] = []  # parameter buffers and host views the nodes point at
        self._jobs: list[int] = []
        _activate(dev.index)
        graph = check(rt.cudaGraphCreate(0))
        try:
            made: list[int] = []
            for node, deps in flat:
                made.append(self._add(graph, node, [made[d] for d in deps]))
            self.exec = check(rt.cudaGraphInstantiate(graph, 0))
        except BaseException:
            self._release_jobs()
            raise
        finally:
            rt.cudaGraphDestroy(graph)  # the exec keeps what it needs
        weakref.finalize(self, _destroy, self.exec, list(self._jobs))

    # -- nodes ---------------------------------------------------------------------------------
    def _add(self, graph: Any, node: Node | None, deps: list[int]) -> int:
        rdeps = [rt.cudaGraphNode_t(d) for d in deps]
        t = node.type if node is not None else NodeType.EMPTY
        p = node._params if node is not None else {}
        if t is NodeType.KERNEL:
            fn, types = self.dev.function(p["kernel"])
            from .nvrtc import pack_args

            kp = drv.CUDA_KERNEL_NODE_PARAMS()
            kp.func = fn
            g, b = p["grid"], p["block"]
            kp.gridDimX, kp.gridDimY, kp.gridDimZ = g.x, g.y, g.z
            kp.blockDimX, kp.blockDimY, kp.blockDimZ = b.x, b.y, b.z
            kp.sharedMemBytes = 0
            kp.kernelParams = pack_args(types, tuple(p["args"]))
            self._keep.append(kp)
            made = check(drv.cuGraphAddKernelNode(drv.CUgraph(int(graph)),
                                                  [drv.CUgraphNode(d) for d in deps], len(deps), kp))
        elif t is NodeType.MEMCPY and p["nbytes"]:
            dst, src = (_endpoint(self.dev, x, p["nbytes"], writable=w)
                        for x, w in ((p["dst"], True), (p["src"], False)))
            self._keep += [dst, src]
            made = check(rt.cudaGraphAddMemcpyNode1D(
                graph, rdeps, len(deps), _host_ptr(dst), _host_ptr(src), p["nbytes"],
                rt.cudaMemcpyKind.cudaMemcpyDefault))
        elif t is NodeType.MEMSET and p["nbytes"]:
            ms = rt.cudaMemsetParams()
            ms.dst = p["ptr"]
            ms.value = p["value"]
            ms.elementSize = 1
            ms.width = p["nbytes"]
            ms.height = 1
            ms.pitch = 0
            made = check(rt.cudaGraphAddMemsetNode(graph, rdeps, len(deps), ms))
        elif t is NodeType.HOST:
            job = next(_ids)
            fn, args = p["fn"], tuple(p["args"])
            label = f"host node {getattr(fn, '__qualname__', repr(fn))!r}"
            cuda._jobs[job] = (fn, args, lambda exc, label=label, to=self._launches: to.error(exc, label))
            self._jobs.append(job)
            hp = rt.cudaHostNodeParams()
            hp.fn = _host_fn
            hp.userData = job
            made = check(rt.cudaGraphAddHostNode(graph, rdeps, len(deps), hp))
        else:
            # empty, disabled, a child's exit, events (they act around the launch on the host) and
            # memory nodes: the exec mapped graph memory at instantiate (GraphExec._map_memory),
            # so a MEM_ALLOC/MEM_FREE node only orders its neighbours here
            made = check(rt.cudaGraphAddEmptyNode(graph, rdeps, len(deps)))
        return int(made)

    def _release_jobs(self) -> None:
        for job in self._jobs:
            cuda._jobs.pop(job, None)

    # -- launch --------------------------------------------------------------------------------
    def launch(self, q: Any) -> None:
        """``cudaGraphLaunch`` on the queue's stream (one queue operation)."""
        self._launches.queue, self._launches.pos = q, q.pos
        if self._jobs:
            cuda._ensure_worker()
            cuda._count_outstanding(len(self._jobs))
        _activate(self.dev.index)
        try:
            check(rt.cudaGraphLaunch(self.exec, q.stream))
        except BaseException:
            if self._jobs:
                cuda._count_outstanding(-len(self._jobs))
            raise

    def upload(self, q: Any) -> None:
        """``cudaGraphUpload``: do the launch's one-time work ahead of it."""
        _activate(self.dev.index)
        check(rt.cudaGraphUpload(self.exec, q.stream))


def _destroy(exec_: Any, jobs: list[int]) -> None:
    # Runs once no queue holds the graph any more (a queue keeps the graphs it launched until it
    # has passed them), so no launch of it is in flight and its host-node jobs can go.
    cuda.release(rt.cudaGraphExecDestroy, exec_)
    for job in jobs:
        cuda._jobs.pop(job, None)
