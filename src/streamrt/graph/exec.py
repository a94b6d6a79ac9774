"""GraphExec: an instantiated graph, its launches and updates (``cudaGraphExec_t``).

State and invariants:
- ``_template`` is a private clone of the instantiated graph; user nodes (of the original graph)
  map to it through ``find_in_clone``. Parameter updates edit the template and drop the cached
  plans, so they apply to later launches only: a launch holds the plan it was enqueued with.
- A plan (``compile.Compiled``) is the device's graph runner for the flattened DAG, one per
  launch stream (and instrumented or not) where the backend's runner holds the stream's kernel
  contexts (cpu: every node's operation precomputed), else one per device. Per-stream plans
  holding memory views are made again once the device's memory generation moved.
- A launch is one operation of the launch stream, ordered after the previous launch of the same
  exec (as CUDA orders them), so launches of one exec never overlap. Graph-memory bookkeeping is
  applied on the host at launch, around that operation; event record/wait nodes act where they
  sit in the graph, bound on the host at each launch (eventnodes.py), with one record point per
  record node and device (``_points``). Per-node updates: setters.py (``NodeUpdates``).
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .. import instrument, legacy
from .. import stream as _stream_mod
from ..device import current_device
from ..errors import (
    GraphExecUpdateError,
    InvalidHandleError,
    InvalidTypeError,
    InvalidValueError,
)
from ..pool import device_of
from ..stream import Stream
from ..validate import is_bool, is_int
from . import memory
from .compile import Compiled, compile_graph, node_label
from .conditional import refuse_unused
from .eventnodes import Point
from .gcpause import paused
from .graph import EVENTS, MEMORY, Graph
from .instantiate import GraphInstantiateResult, refuse
from .instantiate import check as check_instantiable
from .instantiate import devices as graph_devices
from .node import Node, NodeType
from .setters import NodeUpdates
from .update import adopt, diff

if TYPE_CHECKING:

    pass

class GraphExec(NodeUpdates):
    """An executable graph (``cudaGraphExec_t``)."""

    def __init__(self, graph: Graph, *, auto_free_on_launch: bool = False,
                 use_node_priority: bool = False) -> None:
        if not isinstance(graph, Graph):
            raise InvalidTypeError(f"instantiate needs a Graph, not {type(graph).__name__}")
        if not is_bool(auto_free_on_launch) or not is_bool(use_node_priority):
            raise InvalidTypeError("auto_free_on_launch and use_node_priority must be bools")
        graph._check_alive()
        refuse_unused(graph)
        check_instantiable(graph)  # the refusals that need no copy of the graph
        self.auto_free_on_launch = bool(auto_free_on_launch)
        # cudaGraphInstantiateFlagUseNodePriority, passed to the backend's graph runner
        self.use_node_priority = bool(use_node_priority)
        with paused():  # cloning makes many long-lived objects: keep instantiate linear
            self._template = graph.clone()
        template = self._template
        # event nodes anywhere, child graphs included: they act at launch on the host, so a
        # child's waits and records must be found here, not by the child's own replay
        self._event_nodes = template._marked(EVENTS)
        # memory nodes (top level only: child graphs refuse them), in topological order: launch
        # bookkeeping walks only these, not the graph; the order (and the memory ancestry) is
        # computed only for a graph that has some, the replay plan orders the rest at compile
        mem = template._marked(MEMORY, nested=False)
        self._mem_nodes: list[Node] = []
        mem_anc: list[int] = []
        if mem:
            self._mem_nodes, mem_anc = memory.order(template._nodes, mem)
        self._disabled: set[int] = set()
        # compiled per stream (and instrumented or not), or per device: see DeviceImpl
        self._plans: dict[Any, Compiled] = {}
        self._bound_at = -1  # the memory generation when per-stream plans were compiled
        self._has_binds: bool | None = None
        self._destroyed = False
        # the previous launch: its stream, position and that stream's clock then (merged whole by
        # the next launch, so what the previous launch waited for stays known to be ordered)
        self._last: tuple[Stream, int, dict[int, int]] | None = None
        self._lock = threading.Lock()
        self._mem = memory.ExecMemory(repr(self))
        self._allocs = self._mem.allocs
        self._last_box: list[tuple[Stream, int] | None] = [None]  # for the finalizer
        self._finalizer: weakref.finalize | None = None
        self.memory_footprint = 0
        self._map_memory(mem, mem_anc)
        # made in the current device's context, as cudaGraphInstantiate: its reset destroys it,
        # launched there or not (an exec of memset nodes only named no device otherwise)
        current_device()._add_exec(self)
        # the devices whose streams may launch it: those of its kernel and MEM_ALLOC nodes (a
        # cpu graph may span several); None: any (a graph of host, memset, memcpy nodes only)
        self._devices = frozenset(graph_devices(template)) or None
        # the devices whose memory memcpy and memset nodes touch, each with a node and range
        # touching it (setters and updates never move a node's memory to another device)
        self._ends = _node_memory(template)
        for dev in self._devices or ():
            self._check_reach(dev, " (instantiate)")

    def __repr__(self) -> str:
        return f"<GraphExec of {len(self._template._nodes)} nodes>"

    # -- graph memory --------------------------------------------------------------------------
    def _map_memory(self, mem: list[Node], anc: list[int]) -> None:
        """Check the memory nodes ``mem`` (creation order) and map their allocations; ``anc[i]``:
        the memory nodes among node ``i``'s ancestors, a bitset by position in ``mem``."""
        if not mem:
            return
        bit = {id(n): 1 << i for i, n in enumerate(mem)}
        alloc_nodes = [n for n in self._mem_nodes if n.type is NodeType.MEM_ALLOC]
        free_nodes = [n for n in mem if n.type is NodeType.MEM_FREE]
        # one free node per allocation: Graph._add refuses a second
        freed = {f._params["alloc"]: f for f in free_nodes}
        by_device: dict[Any, list] = {}
        for n in alloc_nodes:
            a = n._params["alloc"]
            f = freed.get(a)
            if f is not None and not anc[f.index] & bit[id(n)]:
                raise refuse(GraphInstantiateResult.INVALID_STRUCTURE, self._original(f),
                             f"{f!r} frees {a!r} but is not ordered after {n!r}")
            by_device.setdefault(a.device, []).append((a, n, f))
            self._allocs.append(a)
        for device, allocs in by_device.items():
            offsets, footprint = memory.pack(allocs, anc, bit)
            self._mem.map(device, offsets, footprint)
            self.memory_footprint += footprint
            device._add_exec(self)  # a device reset destroys it (and unmaps its memory)
        if self._mem.arenas:
            # collected without destroy(): its memory retires as by destroy()
            self._finalizer = weakref.finalize(self, _collected, self._mem, self._last_box)

    # -- compile -------------------------------------------------------------------------------
    def _plan(self, stream: Stream) -> Compiled:
        impl = stream.device._impl
        key: Any = (stream.id, bool(instrument.listeners)) if impl.runner_per_stream else stream.device
        plan = self._plans.get(key)
        if plan is not None and impl.runner_per_stream and self._bound_at != impl.memory_generation() \
                and self._binds():
            # memory was freed or remapped since kernel binders, copies and memsets made their
            # views: make them again (a view of memory that is gone must fail as the kernel body
            # would; graph memory mapped again by another exec is another buffer)
            self._plans = {k: v for k, v in self._plans.items() if not isinstance(k, tuple)}
            plan = None
        if plan is None:
            self._bound_at = impl.memory_generation()
            stream.device._add_exec(self)  # a device reset destroys the execs it ran
            gc_was = gc.isenabled()
            gc.disable()  # many long-lived objects: generational passes would make it quadratic
            try:
                plan = self._plans[key] = compile_graph(
                    self._template, self._disabled, stream,
                    self._point if self._event_nodes else None,
                    use_node_priority=self.use_node_priority)
            finally:
                if gc_was:
                    gc.enable()
        return plan

    # the record points of the record nodes: (index in the flattened graph, device) -> Point,
    # made with the first plan for that device and kept (a launch's k counts on from the last)
    _points: dict[tuple[int, Any], Point] | None = None

    def _point(self, i: int, node: Node, device: Any) -> Point:
        points = self._points
        if points is None:
            points = self._points = {}
        p = points.get((i, device))
        if p is None:
            p = points[i, device] = Point(
                device, f"{device.name}/graph record node {node_label(node, self._template)}",
                points)
        return p

    def _binds(self) -> bool:
        """Whether any node (child graphs too) has memory views made at compile time: a kernel
        with a binder, or a copy or memset of device memory (cached per template)."""
        if self._has_binds is None:
            self._has_binds = any(_binds(n) for n in self._template._walk())
        return self._has_binds

    # -- launch --------------------------------------------------------------------------------
    # the launch record (see _record): (stream, plans, generation, generation getter, op,
    # the queue's ops.extend or None, the queue, the stream's clock version and clock copy then;
    # a launch's ``_last`` clock may lack the stream's own entry: its position is beside it)
    _rec: tuple | None = None
    _label: str | None = None  # the launch's label for observers (made once)

    def launch(self, stream: Stream) -> None:
        """Enqueue the whole graph as one operation of ``stream`` (``cudaGraphLaunch``)."""
        rec = self._rec
        # the launch record's path: what the general path does for this exec on this stream,
        # with every decision taken the last time (see _record for what it covers)
        if rec is not None and rec[0] is stream and not stream._slow \
                and not _stream_mod._global_slow:
            lock = self._lock
            lock.acquire()  # (not ``with``: twice the cost, on the path that is one operation)
            try:
                if self._rec is rec and self._plans is rec[1] and not self._destroyed and (
                        rec[2] is None or rec[3]() == rec[2]):
                    stream._pos += 1
                    push = rec[5]
                    if push is not None:  # an InlineQueue: fn, args onto its ops (Stream.launch)
                        push(rec[4])
                        if rec[6].idle:
                            rec[6].wake()
                    else:
                        rec[6].submit(*rec[4])
                    # the clock copied when the record was made, while the stream's clock is
                    # unchanged since (a copy never newer than the position: Stream._snapshot)
                    clock = rec[8] if stream._cv == rec[7] else stream._clock.copy()
                    self._last = (stream, stream._pos, clock)
                    return
            finally:
                lock.release()
        self._check(stream)
        stream._target.launch_graph(stream, self)  # a capture adds it as a child graph node

    def _captured_graph(self) -> Graph:
        """What a launch into a capture adds as a child graph: its disabled nodes stay empty
        there too (the raw template was captured before, so a disabled node ran)."""
        with self._lock:
            graph = self._template.clone()
            for i in self._disabled:
                n = graph._nodes[i]
                n.type, n._params = NodeType.EMPTY, {}
        return graph

    def _launch_on(self, stream: Stream) -> None:
        """The launch itself: one operation of ``stream``."""
        with self._lock:
            mem_nodes = self._mem_nodes
            if mem_nodes:
                memory.check_launch(mem_nodes, self._allocs, self.auto_free_on_launch)
            plan = self._plan(stream)  # may refuse too (memory a node uses is gone)
            # nothing can refuse the launch now
            auto_freed = memory.auto_free(self._allocs) if self.auto_free_on_launch else []
            last = self._last
            if last is not None and last[0] is not stream:
                other, pos, clock = last
                if stream._clock.get(other.id, 0) < pos:  # (the clock may lack other's entry)
                    stream._order_after(other, pos, {**clock, other.id: pos}, "the graph's previous launch")
            events = plan.events
            if events is None:
                op = plan.runner.op_launch(stream._q)
            else:
                if not stream.non_blocking:  # first: its implicit waits precede the launch's records
                    legacy.order(stream)
                before = stream._snapshot()  # what is ordered before the launch
                bound = events.bind(stream)
                op = plan.runner.op_launch(stream._q, bound[0])
            extra = None
            if plan.mem:  # an instrumented plan of a graph with memory
                extra = {instrument.GRAPH_MEMORY: memory.launch_events(mem_nodes, plan.mem,
                                                                       auto_freed)}
            if events is not None and instrument.listeners:
                seen = events.observed(*bound)
                if seen is not None:
                    extra = {**(extra or {}), instrument.GRAPH_EVENTS: seen}
            label = self._label
            if label is None:  # a launch's label names its size; updates keep the topology
                label = self._label = f"graph launch ({len(self._template._nodes)} nodes)"
            stream._submit(op[0], op[1], "graph", label, extra=extra)
            if events is not None:
                events.publish(stream, before, *bound)
            if mem_nodes:
                memory.launched(mem_nodes, stream)
            snap = stream._snapshot()  # position and clock of one moment (see Stream._snapshot)
            self._last = (stream, snap[stream.id], snap)
            self._last_box[0] = self._last[:2]
            self._rec = self._record(stream, op)

    def _record(self, stream: Stream, op: tuple) -> tuple | None:
        """The launch record for the next launches on ``stream``, or None where a launch must
        take the general path every time. It covers an exec without event or memory nodes
        (nothing to do on the host around the operation), launched on a non-blocking stream
        that does not capture, while no sanitizer, tracer or launch blocking is on (``_slow``,
        ``_global_slow``), again on the same stream (no order to add after the previous
        launch). It holds the plans dict (an update or an enable replaces it) and, where
        the plan holds memory views, the memory generation they were made in."""
        if self._event_nodes or self._mem_nodes or stream._slow or _stream_mod._global_slow:
            return None
        impl = stream.device._impl
        gen = self._bound_at if impl.runner_per_stream and self._binds() else None
        q = stream._q
        push = stream._push  # an InlineQueue's ops.extend: one operation is its two items
        # (a stream's queue, its ops deque, its clock dict and its id never change)
        cv = stream._cv  # read before the copy: a change meanwhile makes the copy look stale
        return (stream, self._plans, gen, impl.memory_generation, op, push, q, cv,
                stream._clock.copy())

    def _check(self, stream: Any) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        if not isinstance(stream, Stream):
            raise InvalidTypeError(f"launch needs a Stream, not {type(stream).__name__}")
        stream._check_alive()
        # what the event nodes' waits and records would refuse, refused before anything is
        # enqueued: a launch that fails has launched nothing (it ran and overlapped the next)
        for n in self._event_nodes:
            event = n._params["event"]
            if n.type is NodeType.EVENT_RECORD:
                event._check_recordable(stream)
            else:
                event._check_alive()
        devices = self._devices
        if devices is not None and stream.device not in devices:
            # as cudaGraphLaunch on a stream of another context than the exec's
            raise InvalidValueError(
                f"{self!r} was instantiated for {_names(devices)}: it cannot be launched on "
                f"{stream!r}, a stream of {stream.device.name} (instantiate the graph there)")
        if self._ends:
            self._check_reach(stream.device, "")

    def _check_reach(self, dev: Any, when: str) -> None:
        """Refuse memcpy and memset nodes that, run by ``dev``, would touch memory of a device it
        has no peer access to (as eager copies and memsets are refused)."""
        for other, (node, ptr, nbytes) in self._ends.items():
            if other is not dev:
                dev._check_reach(ptr, nbytes, f"{node!r}{when}")

    def upload(self, stream: Stream) -> None:
        """Prepare the replay plan for ``stream`` ahead of the first launch (``cudaGraphUpload``)."""
        self._check(stream)
        with self._lock:
            self._plan(stream).runner.upload(stream._q)

    def destroy(self) -> None:
        """Release the exec (``cudaGraphExecDestroy``); its memory outlives it while allocated."""
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        with self._lock:
            self._destroyed = True
            self._plans.clear()
            self._has_binds = None
            last = self._last
        if self._finalizer is not None:
            self._finalizer.detach()
        self._mem.retire(None if last is None else (last[0], last[1]))

    # -- whole-graph update ------------------------------------------------------------------------
    def update(self, graph: Graph) -> None:
        """Take the parameters of ``graph`` (same topology) for later launches (``cudaGraphExecUpdate``)."""
        if not isinstance(graph, Graph):
            raise InvalidTypeError(f"update needs a Graph, not {type(graph).__name__}")
        graph._check_alive()
        if self._destroyed:
            raise InvalidHandleError(f"{self!r} was destroyed")
        problem = diff(self._template, graph)
        if problem is not None:
            result, node, why = problem
            raise GraphExecUpdateError(f"update refused ({result.name}): {why}", result=result,
                                       node=node)
        with self._lock:
            changed = adopt(self._template, graph)
            self._refresh(lambda plan: all(plan.update(n) for n in changed))

# -- helpers -------------------------------------------------------------------------------------
def _names(devices: frozenset) -> str:
    return " and ".join(sorted(d.name for d in devices))


def _node_memory(template: Graph) -> dict[Any, tuple[Node, int, int]]:
    """The devices whose memory the memcpy and memset nodes (child graphs' too) touch, each
    with the first such node, its pointer and its bytes."""
    out: dict[Any, tuple[Node, int, int]] = {}
    for n in template._walk():
        t = n.type
        if t is NodeType.MEMSET:
            ends: tuple = (n._params["ptr"],)
        elif t is NodeType.MEMCPY:
            ends = (n._params["dst"], n._params["src"])
        else:
            continue
        for end in ends:
            if is_int(end):
                dev = device_of(int(end))
                if dev is not None and dev not in out:
                    out[dev] = (n, int(end), n._params["nbytes"])
    return out


def _binds(n: Node) -> bool:
    """Whether a node's compiled op holds views of device memory (see ``compile._ops_for``)."""
    p = n._params
    if n.type is NodeType.KERNEL:
        return p["kernel"].bind is not None
    if n.type is NodeType.MEMCPY:
        return is_int(p["dst"]) or is_int(p["src"])
    return n.type is NodeType.MEMSET


def _collected(mem: memory.ExecMemory, last: list[tuple[Stream, int] | None]) -> None:
    """An exec collected without destroy(): its memory retires as by destroy()."""
    mem.retire(last[0])
