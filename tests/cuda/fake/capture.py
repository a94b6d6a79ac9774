"""Stream capture (``cudaStreamBeginCapture`` ... ``cudaStreamEndCapture``) into the fake's graphs.

While a stream captures, the work pushed into it is not run: each kernel launch, copy, memset,
host function and graph launch becomes a node of the capture's graph (``graphs.Node``, run on
the replaying stream's worker as any graph node), depending on the stream's *frontier* (the nodes
its next operation must follow). ``cudaEventRecord`` on a capturing stream stores that frontier
in the event (no node); ``cudaStreamWaitEvent`` of such an event makes a stream that is not
capturing join the capture (a fork) or adds the event's nodes to a capturing stream's frontier
(a join). ``cudaStreamEndCapture`` on the origin stream gives the graph, once every node is an
ancestor of the origin's frontier (else cudaErrorStreamCaptureUnjoined); the streams that joined
leave the capture with it.

Errors, as the CUDA runtime documents them (an error in a capture also invalidates it: its end
then gives cudaErrorStreamCaptureInvalidated and no graph):
- capturing the legacy stream, or waiting on it while a blocking stream of its device captures
  (cudaErrorStreamCaptureUnsupported / cudaErrorStreamCaptureImplicit: the legacy stream is
  unusable meanwhile, and so are the synchronous driver copies and fills that run on it);
- synchronizing or querying a capturing stream, or the device while one of its streams captures
  (cudaErrorStreamCaptureUnsupported);
- querying, synchronizing or timing an event last recorded in a capture, or waiting on one whose
  capture ended (cudaErrorCapturedEvent); a capturing stream waiting on an event recorded outside
  the capture (cudaErrorStreamCaptureIsolation) or in another capture (cudaErrorStreamCaptureMerge);
- a second begin on a capturing stream, or an end on one that does not capture
  (cudaErrorIllegalState); an end on a stream that joined but did not begin the capture
  (cudaErrorStreamCaptureUnmatched); an end from another thread unless the mode is Relaxed
  (cudaErrorStreamCaptureWrongThread, the capture goes on);
- "potentially unsafe" calls (``cudaMalloc``, ``cudaFree``, ``cuMemAlloc``, ``cuMemFree``) while a
  Global-mode capture runs on any thread or a ThreadLocal one on the calling thread
  (cudaErrorStreamCaptureUnsupported; those captures are invalidated).
Operations the fake does not capture (stream-ordered allocation, graph upload, VMM) raise
FakeUnsupported on a capturing stream rather than run.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda.bindings import runtime as rt

from . import graphs, state, streams
from .binding import runtime
from .state import LOCK, SUCCESS, E

MODE = rt.cudaStreamCaptureMode
STATUS = rt.cudaStreamCaptureStatus


class Capture:
    """One capture sequence: its graph, origin stream, mode, thread, and the streams in it."""

    def __init__(self, origin: streams.FakeStream, mode: Any) -> None:
        self.id = state.new_handle()
        self.origin = origin
        self.mode = MODE(int(mode))
        self.thread = threading.get_ident()
        self.graph = graphs.Graph()
        self.members: set[streams.FakeStream] = {origin}
        self.invalidated = False

    def invalidate(self) -> None:
        self.invalidated = True


ACTIVE: set[Capture] = set()


def _leave(s: streams.FakeStream) -> None:
    s.capture, s.frontier = None, []


def legacy_blocked(s: streams.FakeStream) -> bool:
    """``s`` is a legacy stream while a blocking stream of its device captures: invalidates those
    captures (the implicit dependency) and answers True."""
    if not s.legacy:
        return False
    hit = [c for c in ACTIVE if any(m.blocking and m.device == s.device for m in c.members)]
    for c in hit:
        c.invalidate()
    return bool(hit)


def intercept(s: streams.FakeStream, kind: str, run: Any) -> Any:
    """Called (under LOCK) by every fake that puts work into ``s``: None when ``s`` does not
    capture (run the work as usual); else the result code, the work recorded as a node."""
    if legacy_blocked(s):
        return E.cudaErrorStreamCaptureImplicit
    c = s.capture
    if c is None:
        return None
    if c.invalidated:
        return E.cudaErrorStreamCaptureInvalidated
    node = graphs.Node(c.graph, kind, run, list(dict.fromkeys(s.frontier)))
    c.graph.nodes[node.handle] = node
    s.frontier = [node.handle]
    return SUCCESS


def unsupported(s: streams.FakeStream, what: str) -> None:
    """Raise FakeUnsupported when ``s`` captures: ``what`` is not modelled inside a capture."""
    if s.capture is not None:
        raise state.FakeUnsupported(f"{what} on a capturing stream: not modelled by the fake")


def busy(s: streams.FakeStream) -> Any:
    """The error of a synchronize or query of ``s`` (None: allowed): a capturing stream, or the
    legacy stream while a blocking stream captures."""
    if legacy_blocked(s):
        return E.cudaErrorStreamCaptureImplicit
    if s.capture is not None:
        s.capture.invalidate()
        return E.cudaErrorStreamCaptureUnsupported
    return None


def device_busy(device: int) -> Any:
    """The error of a device-wide synchronize while a stream of ``device`` captures (or None)."""
    hit = [c for c in ACTIVE if c.origin.device == device]
    for c in hit:
        c.invalidate()
    return E.cudaErrorStreamCaptureUnsupported if hit else None


def unsafe_call() -> Any:
    """The error of a potentially unsafe call (``cudaMalloc``...) from this thread, or None."""
    me = threading.get_ident()
    with LOCK:
        hit = [c for c in ACTIVE if c.mode == MODE.cudaStreamCaptureModeGlobal
               or (c.mode == MODE.cudaStreamCaptureModeThreadLocal and c.thread == me)]
        for c in hit:
            c.invalidate()
    return E.cudaErrorStreamCaptureUnsupported if hit else None


def record_event(ev: Any, s: streams.FakeStream) -> Any:
    """``cudaEventRecord`` of ``ev`` on ``s``: None when ``s`` does not capture, else the result
    (the event now holds the capture and the stream's frontier)."""
    if legacy_blocked(s):
        return E.cudaErrorStreamCaptureImplicit
    c = s.capture
    if c is None:
        ev.captured = None
        return None
    if c.invalidated:
        return E.cudaErrorStreamCaptureInvalidated
    ev.captured = (c, list(s.frontier))
    return SUCCESS


def wait_event(s: streams.FakeStream, ev: Any) -> Any:
    """``cudaStreamWaitEvent(s, ev)``: None for an ordinary wait, else the result (a fork into,
    or a join within, a capture, or a capture error)."""
    if legacy_blocked(s):
        return E.cudaErrorStreamCaptureImplicit
    cap = getattr(ev, "captured", None)
    c = s.capture
    if cap is None:
        if c is None or ev.rec is None:
            return None  # an ordinary wait (a never-recorded event is no dependency)
        c.invalidate()
        return E.cudaErrorStreamCaptureIsolation
    ec, nodes = cap
    if ec not in ACTIVE:
        if c is not None:
            c.invalidate()
        return E.cudaErrorCapturedEvent
    if c is None:
        if s.legacy:
            ec.invalidate()
            return E.cudaErrorStreamCaptureImplicit
        s.capture, s.frontier = ec, list(nodes)  # a fork: s joins the capture
        ec.members.add(s)
        return SUCCESS
    if c is not ec:
        c.invalidate()
        ec.invalidate()
        return E.cudaErrorStreamCaptureMerge
    s.frontier = list(dict.fromkeys([*s.frontier, *nodes]))  # a join
    return SUCCESS


def _unjoined(c: Capture) -> bool:
    seen: set[int] = set()
    todo = list(c.origin.frontier)
    while todo:
        h = todo.pop()
        if h not in seen:
            seen.add(h)
            todo += c.graph.nodes[h].deps
    return len(seen) != len(c.graph.nodes)


# -- the API -------------------------------------------------------------------------------------
@runtime("cudaStreamBeginCapture")
def cudaStreamBeginCapture(stream: Any, mode: Any) -> tuple:
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle,)
        if s.legacy:
            return (E.cudaErrorStreamCaptureUnsupported,)
        if s.capture is not None:
            return (E.cudaErrorIllegalState,)
        c = Capture(s, mode)
        ACTIVE.add(c)
        s.capture, s.frontier = c, []
    return (SUCCESS,)


@runtime("cudaStreamEndCapture")
def cudaStreamEndCapture(stream: Any) -> tuple:
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        c = s.capture
        if c is None:
            return (E.cudaErrorIllegalState, None)
        if c.origin is not s:
            c.invalidate()
            return (E.cudaErrorStreamCaptureUnmatched, None)
        if c.mode != MODE.cudaStreamCaptureModeRelaxed and c.thread != threading.get_ident():
            return (E.cudaErrorStreamCaptureWrongThread, None)
        unjoined = not c.invalidated and _unjoined(c)
        ACTIVE.discard(c)
        for m in c.members:
            _leave(m)
        if c.invalidated:
            return (E.cudaErrorStreamCaptureInvalidated, None)
        if unjoined:
            return (E.cudaErrorStreamCaptureUnjoined, None)
        graphs.GRAPHS[c.graph.handle] = c.graph
        for h, n in c.graph.nodes.items():
            graphs.NODES[h] = n
    return (SUCCESS, rt.cudaGraph_t(c.graph.handle))


@runtime("cudaStreamIsCapturing")
def cudaStreamIsCapturing(stream: Any) -> tuple:
    with LOCK:
        s = streams.resolve(stream)
        if s is None:
            return (E.cudaErrorInvalidResourceHandle, None)
        if s.legacy and any(m.blocking and m.device == s.device for c in ACTIVE for m in c.members):
            return (E.cudaErrorStreamCaptureImplicit, None)  # the capture is not invalidated
        c = s.capture
        if c is None:
            return (SUCCESS, STATUS.cudaStreamCaptureStatusNone)
        return (SUCCESS, STATUS.cudaStreamCaptureStatusInvalidated if c.invalidated
                else STATUS.cudaStreamCaptureStatusActive)
