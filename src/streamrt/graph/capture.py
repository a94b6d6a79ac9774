"""Stream capture (DESIGN.md §5): the capture state machine, mode gating, and its errors.

State and invariants:
- A :class:`Capture` is begun on an origin stream by one thread, with a mode. Every stream
  that joined it (the origin, and any stream that waited on one of its captured events) has it
  as its enqueue target (``stream._target``, see ``eager.py``), and ``deps[stream]``: the node
  set the stream's next captured operation depends on. The target methods add nodes instead of
  running; a capture that ended meanwhile hands the call back to the stream's target then.
- A ``record`` on a capturing stream makes a captured event: the stream's current node set.
  Waiting on it from an idle stream forks (the stream joins); from a stream of the same capture
  joins (node sets merge); from another capture is a merge error; a capturing stream waiting
  on uncaptured work is an isolation error.
- A capture builds a new graph, or appends to an existing one (``begin_capture_to_graph``: its
  first node after the given nodes of it; at most one capture appends to a graph at a time).
- ``end_capture`` requires every captured node (of an existing graph: every node this capture
  added) to be an ancestor of the origin's dependency set, or of a node that
  ``update_capture_dependencies(replace=True)`` took out of a set (``dropped``): CUDA exempts
  those from ``cudaErrorStreamCaptureUnjoined``.
- Status is ACTIVE until a violation invalidates it; an invalidated capture refuses further
  work and ``end_capture`` raises. Ending (successfully or not) makes every joined stream leave
  the capture and forgets the captured events.
- Host threads: a capture's state (its graph, ``deps``, status, joined streams) changes only
  under its ``_lock``, so two threads enqueuing on its streams each extend what the other left,
  and ending is one step. A call that read a stream's capture just before another thread ended
  it finds the capture ended (status NONE) and runs as the call after the end that it is: on the
  stream, not into the graph already returned.
- What a capture refuses elsewhere (unsafe calls by mode, the legacy stream, a device
  synchronize) and the registry of active captures: ``refusals.py``.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import (
    CaptureImplicitError,
    CaptureInvalidatedError,
    CaptureIsolationError,
    CaptureMergeError,
    CaptureUnjoinedError,
    CaptureUnmatchedError,
    CaptureUnsupportedError,
    CaptureWrongThreadError,
    IllegalStateError,
    InvalidTypeError,
    InvalidValueError,
)
from .conditional import BODY_KINDS, body_refusal
from .conditional import RULE as BODY_RULE
from .graph import MEMORY, Graph, memcpy_params, memset_params
from .memory import GraphAlloc, find
from .node import NodeType
from .refusals import (  # noqa: F401 (the capture API's names, importable from here)
    CaptureInfo,
    CaptureMode,
    CaptureStatus,
    _active,
    _blocking_captures,
    _captures_on,
    _lock,
    check_device_sync,
    check_legacy,
    check_legacy_query,
    check_unsafe,
    exchange_capture_mode,
    illegal_event_use,
    illegal_sync,
)

if TYPE_CHECKING:
    from ..device import Device
    from ..stream import Event, Stream
    from .node import Node


_ids = itertools.count(1)


class Capture:
    """One capture sequence."""

    capturing = True  # an enqueue target that records instead of running (see eager.Eager)

    def __init__(self, origin: Stream, mode: CaptureMode, graph: Graph | None = None,
                 deps: tuple[Node, ...] = ()) -> None:
        self.id = next(_ids)
        self.origin = origin
        self.mode = mode
        self.thread = threading.get_ident()
        # a new graph, or an existing one captured into (begin_capture_to_graph): its nodes
        # from ``first`` on are this capture's, the only ones end_capture checks are joined
        self.graph = Graph() if graph is None else graph
        self.first = len(self.graph._nodes)
        self.status = CaptureStatus.ACTIVE
        self.deps: dict[Stream, tuple[Node, ...]] = {origin: deps}
        self.events: list[Event] = []
        # nodes update_capture_dependencies(replace=True) took out of a dependency set: CUDA
        # does not count them unjoined ("if they are unreachable from the stream")
        self.dropped: dict[Node, None] = {}
        self.reason = ""
        self._lock = threading.RLock()  # see the module docstring (host threads)

    def __repr__(self) -> str:
        return f"<Capture #{self.id} {self.mode.name} {self.status.name} on {self.origin!r}>"

    # -- state ------------------------------------------------------------------------------
    def invalidate(self, reason: str) -> bool:
        """Invalidate an active capture; False if it had ended (nothing to invalidate)."""
        with self._lock:
            if self.status is CaptureStatus.ACTIVE:
                self.status = CaptureStatus.INVALIDATED
                self.reason = reason
            return self.status is not CaptureStatus.NONE

    def join(self, stream: Stream, deps: tuple[Node, ...]) -> bool:
        """``stream`` joins; False if the capture ended meanwhile (it must not join then)."""
        with self._lock:
            if self.status is CaptureStatus.NONE:
                return False
            self.deps[stream] = deps
            stream._set_target(self)
            return True

    def finish(self) -> None:
        """Every joined stream leaves the capture; captured events are forgotten."""
        with self._lock:
            self.status = CaptureStatus.NONE  # first: a call that read the capture sees it ended
            with _lock:
                _active.discard(self)
            for s in self.deps:
                s._set_target(None)
            for e in self.events:
                if e._capture is self:
                    e._capture = None
                    e._nodes = ()

    # -- capturing work ---------------------------------------------------------------------
    def add(self, stream: Stream, type: Any, params: dict[str, Any]) -> Node | None:
        """Add a node after the stream's dependencies; None if the capture ended meanwhile
        (the caller then runs the call on the stream: it came after the end)."""
        with self._lock:  # the dependencies read and replaced at once (two threads, one stream)
            if self.status is CaptureStatus.NONE:
                return None
            if self.status is CaptureStatus.INVALIDATED:
                raise CaptureInvalidatedError(f"{self!r} was invalidated: {self.reason}")
            if self.graph._body:
                self._body_rule(type, params)
            node = self.graph._add(type, params, self.deps[stream])
            self.deps[stream] = (node,)
            return node

    def _body_rule(self, type: Any, params: dict[str, Any]) -> None:
        """Capturing into a conditional body: work of a kind a body cannot hold is a violation
        (the capture is invalidated, as for any unsupported call)."""
        why = None
        if type not in BODY_KINDS:
            why = f"a {type.name} node: {BODY_RULE}"
        elif type is NodeType.GRAPH:
            why = body_refusal(params["graph"])
        if why is not None:
            reason = f"{self.graph!r} is a conditional body, which cannot take {why}"
            self.invalidate(reason)
            raise CaptureUnsupportedError(reason)

    # -- the enqueue target's methods (see eager.Eager) --------------------------------------
    def kernel(self, s: Stream, kernel: Any, ctx: Any, args: tuple) -> None:
        """A KERNEL node."""
        if self.add(s, NodeType.KERNEL, {"kernel": kernel, "args": tuple(args), "grid": ctx.grid,
                                         "block": ctx.block, "device": s.device,
                                         "shared_mem": ctx.shared_mem}) is None:
            s._target.kernel(s, kernel, ctx, args)

    def memcpy(self, s: Stream, dst: Any, src: Any, n: int) -> None:
        """A MEMCPY node (graph memory may have no backing yet: validated, not resolved)."""
        if self.add(s, NodeType.MEMCPY, memcpy_params(dst, src, n)) is None:
            s._target.memcpy(s, dst, src, n)

    def memset(self, s: Stream, ptr: int, value: int, n: int) -> None:
        """A MEMSET node (graph memory, unmapped while capturing, is checked against its
        reserved range only)."""
        if self.add(s, NodeType.MEMSET, memset_params(ptr, value, n)) is None:
            s._target.memset(s, ptr, value, n)

    def host(self, s: Stream, fn: Any, args: tuple) -> None:
        """A HOST node."""
        if self.add(s, NodeType.HOST, {"fn": fn, "args": tuple(args)}) is None:
            s._target.host(s, fn, args)

    def after_record(self, s: Stream) -> None:
        """A free after a captured record needs no position: the free is a node after it."""

    def malloc(self, s: Stream, pool: Any, nbytes: int) -> int:
        """A MEM_ALLOC node: graph memory, its address fixed now (``cudaMallocAsync`` captured)."""
        pool._check_alive()
        if s.device is not pool.device:
            raise InvalidValueError(
                f"{pool!r} cannot serve a stream of {s.device.name}: pools are per device")
        with self._lock:  # no graph memory reserved for a capture that ended meanwhile
            if self.status is not CaptureStatus.NONE:
                if self.status is CaptureStatus.INVALIDATED:
                    raise CaptureInvalidatedError(f"{self!r} was invalidated: {self.reason}")
                if not nbytes:  # a MEM_ALLOC node of 0 bytes, as Graph.add_mem_alloc_node
                    # refuses it (cudaMallocAsync captured makes cudaGraphAddMemAllocNode's node);
                    # a bad argument, as any other, leaves the capture as it was
                    raise InvalidValueError(f"a stream-ordered allocation of 0 bytes cannot be "
                                            f"captured into {self!r} (a graph allocation of 0 "
                                            "bytes is refused)")
                if self.graph._body:  # before any graph memory is reserved for it
                    self._body_rule(NodeType.MEM_ALLOC, {})
                alloc = GraphAlloc(s.device, nbytes, self.graph._slabs)
                self.add(s, NodeType.MEM_ALLOC, {"nbytes": nbytes, "ptr": alloc.ptr, "alloc": alloc})
                return alloc.ptr
        return s._target.malloc(s, pool, nbytes)  # type: ignore[no-any-return]

    def free(self, s: Stream, ptr: int, pool: Any) -> None:
        """A MEM_FREE node, of graph memory only."""
        alloc = find(ptr)
        if alloc is None:
            raise InvalidValueError(
                f"{hex(ptr)} was not allocated by a graph: memory allocated outside the capture "
                "cannot be freed inside it"
            )
        if self.add(s, NodeType.MEM_FREE, {"ptr": ptr, "alloc": alloc}) is None:
            s._target.free(s, ptr, pool)

    def launch_graph(self, s: Stream, ge: Any) -> None:
        """A GRAPH node running what the exec ``ge`` runs (its disabled nodes empty)."""
        graph = ge._captured_graph()
        # the same rule as Graph.add_child_graph_node: graph memory cannot live in a child graph
        # (the outer exec would neither map it nor check its relaunch rules)
        if graph._marked(MEMORY):
            raise InvalidValueError(
                "an executable graph with memory allocation or free nodes cannot be launched into "
                "a capture (it would become a child graph)"
            )
        if self.add(s, NodeType.GRAPH, {"graph": graph._embedded_clone()}) is None:
            s._target.launch_graph(s, ge)

    def record(self, s: Stream, event: Event) -> Event:
        """A captured event: the stream's current node set."""
        with self._lock:
            if self.status is not CaptureStatus.NONE:
                if self.status is CaptureStatus.INVALIDATED:
                    raise CaptureInvalidatedError(f"{self!r} was invalidated: {self.reason}")
                event._nodes = self.deps[s]  # before _capture: a reader of it gets these
                event._capture = self
                self.events.append(event)
                return event
        return s._target.record(s, event)  # type: ignore[no-any-return]

    def wait(self, s: Stream, event: Event, ce: Capture | None = None) -> None:
        """A wait of capturing ``s``, or (``ce`` is this capture, the event's as the caller read
        it once) a wait on an event this capture recorded."""
        capture_wait(s, event, event._capture if ce is None else ce)

    def release_after(self, s: Stream, release: Any) -> None:
        """The graph (every clone and exec of it) owns what ``release`` frees: it runs when the
        last of them is gone, not at each replay."""
        self.graph._keep.append(_Keeper(release))

    def refuse_event(self, event: Event, what: str) -> None:
        """A synchronize or query of an event this capture recorded (see
        :func:`illegal_event_use`)."""
        illegal_event_use(event, self, what)

    def refuse(self, s: Stream, what: str) -> None:
        """A synchronize, query or destroy of a capturing stream (see :func:`illegal_sync`)."""
        illegal_sync(s, self, what)


class _Keeper:
    """Shared by a captured graph and its clones: calls ``release`` when the last goes."""

    __slots__ = ("__weakref__",)

    def __init__(self, release: Any) -> None:
        weakref.finalize(self, release)


# -- stream entry points ---------------------------------------------------------------------
def begin(stream: Stream, mode: Any, graph: Graph | None = None, deps: Any = ()) -> None:
    """``cudaStreamBeginCapture``, or with ``graph`` ``cudaStreamBeginCaptureToGraph``: the
    nodes go into that graph, the first of them after ``deps`` (nodes of it)."""
    if not isinstance(mode, CaptureMode):
        raise InvalidTypeError(f"mode must be a srt.CaptureMode, not {mode!r}")
    stream._check_alive()
    if stream._legacy:
        raise CaptureUnsupportedError("the legacy default stream cannot be captured; use a Stream")
    first: tuple[Node, ...] = ()
    if graph is not None:
        if not isinstance(graph, Graph):
            raise InvalidTypeError(f"begin_capture_to_graph needs a srt.Graph, not "
                                   f"{type(graph).__name__}")
        graph._check_alive()
        first = tuple(dict.fromkeys(graph._as_nodes(deps, "deps")))
    cap = Capture(stream, mode, graph, first)
    with _lock:  # checked and set at once: of two threads beginning on it, one captures
        other = stream._capture
        if other is not None:
            raise IllegalStateError(f"{stream!r} is already capturing ({other!r})")
        into = next((c for c in _active if c.graph is graph), None) if graph is not None else None
        if into is not None:  # two captures appending to one graph would interleave their nodes
            raise IllegalStateError(f"{graph!r} is already being captured into by {into!r}")
        _active.add(cap)
        stream._set_target(cap)


def end(stream: Stream) -> Graph:
    """``cudaStreamEndCapture``: the graph, or the error that ended the capture."""
    cap = stream._capture
    if cap is None:
        raise IllegalStateError(f"{stream!r} is not capturing")
    if stream is not cap.origin:
        cap.invalidate(f"end_capture called on {stream!r}, which did not begin the capture")
        raise CaptureUnmatchedError(
            f"{stream!r} joined {cap!r} but did not begin it; end the capture on {cap.origin!r}"
        )
    if cap.mode is not CaptureMode.RELAXED and threading.get_ident() != cap.thread:
        raise CaptureWrongThreadError(
            f"{cap!r} was begun by another thread; a {cap.mode.name} capture must be ended by it"
        )
    with cap._lock:  # one step: no node added, nor invalidation, between the checks and the end
        if cap.status is CaptureStatus.NONE:  # a RELAXED capture ended by another thread
            raise IllegalStateError(f"{stream!r} is not capturing")
        if cap.status is CaptureStatus.INVALIDATED:
            cap.finish()
            raise CaptureInvalidatedError(f"capture invalidated: {cap.reason}")
        unjoined = _unjoined(cap)
        cap.finish()
    if unjoined:
        raise CaptureUnjoinedError(
            f"{len(unjoined)} captured node(s) are not joined back into the origin stream, e.g. "
            f"{unjoined[0]!r}: make the origin wait on an event recorded after them"
        )
    return cap.graph


def abandon(device: Device) -> None:
    """End, with no graph, every capture that a stream of ``device`` takes part in (a reset)."""
    for c in _captures_on(device):
        c.finish()


def _unjoined(cap: Capture) -> list[Node]:
    seen: set[int] = set()
    stack = [*cap.deps[cap.origin], *cap.dropped]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n._deps)
    return [n for n in cap.graph._nodes[cap.first:] if id(n) not in seen]


def info(stream: Stream) -> CaptureInfo:
    """``cudaStreamGetCaptureInfo``."""
    if stream._legacy and _active:
        check_legacy_query(stream)
    cap = stream._capture
    if cap is not None:
        with cap._lock:
            if cap.status is not CaptureStatus.NONE:  # not ended meanwhile by another thread
                return CaptureInfo(cap.status, cap.id, cap.graph, tuple(cap.deps[stream]))
    return CaptureInfo(CaptureStatus.NONE, 0, None, ())


def is_capturing(stream: Stream) -> bool:
    """``cudaStreamIsCapturing`` status not NONE: ACTIVE, or INVALIDATED until ``end_capture``
    (as PyTorch): the stream is still in its capture sequence, and ``if s.is_capturing():
    s.end_capture()`` must end an invalidated one too, or the stream stays refused."""
    if stream._legacy and _active:
        check_legacy_query(stream)
    return stream._capture is not None


def update_dependencies(stream: Stream, nodes: Any, replace: bool) -> None:
    """``cudaStreamUpdateCaptureDependencies``: add (or set) the stream's dependency set."""
    cap = stream._capture
    if cap is None:
        raise IllegalStateError(f"{stream!r} is not capturing")
    if cap.status is CaptureStatus.INVALIDATED:
        raise CaptureInvalidatedError(f"{cap!r} was invalidated: {cap.reason}")
    new = cap.graph._as_nodes(nodes, "nodes")
    with cap._lock:
        if cap.status is CaptureStatus.NONE:  # ended meanwhile by another thread
            raise IllegalStateError(f"{stream!r} is not capturing")
        old = cap.deps[stream]
        if replace:
            cap.dropped.update(dict.fromkeys(n for n in old if n not in new))
        cap.deps[stream] = tuple(dict.fromkeys((*(() if replace else old), *new)))


def capture_wait(stream: Stream, event: Event, ce: Capture | None) -> None:
    """``s.wait(event)`` when the stream or ``ce``, the event's capture as the caller read it
    once, takes part in a capture (read again, another thread's record could have reset it)."""
    cs = stream._capture
    if cs is not None and cs.status is CaptureStatus.INVALIDATED:
        # an invalidated capture refuses further work, a wait (a join) included, as CUDA does
        raise CaptureInvalidatedError(f"{cs!r} was invalidated: {cs.reason}")
    if ce is None:  # uncaptured (or never recorded) event
        if cs is None:  # the stream's capture ended meanwhile: the wait came after the end
            return stream.wait(event)
        if event._stream is None:
            return
        cs.invalidate(f"{stream!r} waited on work recorded outside the capture")
        raise CaptureIsolationError(
            f"capturing {stream!r} cannot wait on {event!r}, recorded outside the capture"
        )
    if cs is None:  # fork: the stream joins the event's capture
        if ce.status is CaptureStatus.INVALIDATED:
            raise CaptureInvalidatedError(f"{ce!r} was invalidated: {ce.reason}")
        if stream._legacy:
            ce.invalidate("the legacy default stream tried to join the capture")
            raise CaptureImplicitError("the legacy default stream cannot join a capture")
        if not ce.join(stream, event._nodes):
            stream.wait(event)  # the capture ended meanwhile (forgetting the event): wait after it
        return
    if cs is ce:  # join within the capture
        with cs._lock:  # read and replaced at once (two threads, one stream)
            if cs.status is not CaptureStatus.NONE:
                cs.deps[stream] = tuple(dict.fromkeys((*cs.deps[stream], *event._nodes)))
                return
        stream.wait(event)  # ended meanwhile: the wait came after the end
        return
    cs.invalidate(f"{stream!r} waited on an event of {ce!r}")
    ce.invalidate(f"an event of it was waited on by {cs!r}")
    raise CaptureMergeError(f"{stream!r} ({cs!r}) cannot wait on an event captured by {ce!r}")


