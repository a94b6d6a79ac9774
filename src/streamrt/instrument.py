"""Instrumentation shared by the sanitizer and the tracer: one record per enqueued operation.

When any listener is active, every stream operation is wrapped: it carries an :class:`OpInfo`
(stream, position, vector clock at enqueue, kind, name, the user's call site, the memory it
declares) and runs through :func:`run`, which marks it as the worker thread's current operation
(kernel views find their operation there) and tells the listeners when it starts and ends.
With no listener, nothing here runs: the streams take their fast paths.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from .errors import NotSupportedError
from .labels import WRAPPER

_PKG = os.path.dirname(os.path.abspath(__file__))
_seq = itertools.count(1)
# the operation being run (see run): a context variable, so that work a graph replay hands
# to other threads in a copy of its context still knows the launch it belongs to
_current: ContextVar[OpInfo | None] = ContextVar("streamrt_op", default=None)
listeners: list[Any] = []  # objects with op_start(op), op_end(op) and optional on_* hooks
# called after a listener came or went: the streams recompute their process-wide slow-path
# switch (stream.py registers it; this module is below it)
on_change: list[Callable[[], None]] = []
# key of a graph launch's ``OpInfo.args``: what its memory nodes do (keys starting with "_" are
# for listeners, not shown in traces)
GRAPH_MEMORY = "_graph_memory"


class OpInfo:
    """One enqueued operation, as the sanitizer and the tracer see it."""

    __slots__ = (
        "stream", "pos", "seq", "kind", "name", "site", "clock", "accesses", "t0", "t1", "args",
        "parent", "index", "ancestors", "node", "thread", "stamps",
    )

    def __init__(self, stream: Any, kind: str, name: str, clock: dict[int, int],
                 accesses: tuple = (), args: dict | None = None, site: str | None = None) -> None:
        self.stream = stream
        self.pos = stream._pos if stream is not None else 0  # 1-based position of this op
        self.seq = next(_seq)  # global enqueue order (host-ordered events compare with it)
        self.kind = kind
        self.name = name
        self.site = site if site is not None else (user_site() if _want_sites() else "")
        self.clock = clock  # what is ordered before this op: stream id -> position
        self.accesses = accesses  # declared (ptr, nbytes, write) ranges (copies, memsets)
        self.args = args or {}
        self.t0 = self.t1 = 0.0
        self.parent: OpInfo | None = None  # the graph launch of a graph node
        self.index = -1  # node index within its launch (topological: ancestor bitsets use it)
        self.node = ""  # the node as the program knows it: "#3" (creation order in its graph)
        self.ancestors = 0  # bitset of node indices ordered before it within the launch
        self.thread = ""
        self.stamps: tuple | None = None  # (queue, start, end) timing stamps on an enqueuing backend

    def where(self) -> str:
        """``stream@pos`` (and the node within its graph launch)."""
        if self.parent is not None:
            return f"{self.parent.where()} node {self.node or f'#{self.index}'}"
        return f"{self.stream.name}@{self.pos}" if self.stream is not None else "host"

    def describe(self) -> str:
        """``kernel 'scale' on cpu:0/3@7 (enqueued at file.py:12)``."""
        site = f" (enqueued at {self.site})" if self.site else ""
        return f"{self.kind} {self.name!r} on {self.where()}{site}"

    def __repr__(self) -> str:
        return f"<OpInfo {self.describe()}>"


def active() -> bool:
    """Whether any listener wants operations instrumented."""
    return bool(listeners)


def _want_sites() -> bool:
    return any(getattr(lst, "wants_sites", False) for lst in listeners)


def user_site() -> str:
    """``file:line`` of the innermost caller outside the streamrt package."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PKG):
        f = f.f_back
    if f is None:
        return ""
    name = f.f_code.co_filename
    short = _short.get(name)
    if short is None:
        try:
            short = _short[name] = os.path.relpath(name)
        except ValueError:  # another drive (Windows)
            short = _short[name] = name
    return f"{short}:{f.f_lineno}"


_short: dict[str, str] = {}  # file name -> as shown in messages (relpath is slow)


def before_clock(stream: Any) -> dict[int, int]:
    """The clock of the next operation of ``stream``: its own earlier ops and what it waited on."""
    clock = stream._clock.copy()
    clock[stream.id] = stream._pos - 1
    return clock


def wrap(stream: Any, fn: Callable[..., Any], args: tuple, kind: str, name: str,
         accesses: tuple = (), extra: dict | None = None) -> tuple[Callable[..., Any], tuple]:
    """Wrap a queue operation (call after ``stream._pos`` was incremented for it)."""
    op = OpInfo(stream, kind, name, before_clock(stream), accesses, extra)
    for lst in listeners:
        hook = getattr(lst, "on_enqueue", None)
        if hook is not None:
            hook(op)
    return (run, (op, fn, args)) if stream._inline else (run_stamped, (op, stream._q, fn, args))


def check_backend(stream: Any) -> None:
    """Refuse an operation of a backend that enqueues its work (cuda) that a listener cannot see."""
    for lst in listeners:
        if getattr(lst, "needs_inline", False):
            raise NotSupportedError(
                f"the {type(lst).__name__.lower()} observes work where the cpu backend runs it; it "
                f"does not support {stream.device.name} (disable it for {stream.device.backend} streams)")


def run_stamped(op: OpInfo, q: Any, fn: Callable[..., Any], args: tuple) -> None:
    """Queue operation of a backend whose operations enqueue the work (cuda): the host times the
    enqueue call, and timing stamps recorded on the stream around it time the work itself."""
    f0, a0, start = q.op_stamp()
    f1, a1, end = q.op_stamp()

    def stamped() -> None:
        f0(*a0)
        fn(*args)
        f1(*a1)
        op.stamps = (q, start, end)  # both recorded (a failed enqueue keeps its host times)

    run(op, stamped, ())


def run(op: OpInfo, fn: Callable[..., Any], args: tuple) -> None:
    """Queue operation: run ``fn(*args)`` as ``op``."""
    token = _current.set(op)
    op.thread = threading.current_thread().name
    op.t0 = time.perf_counter()
    try:
        for lst in listeners:
            lst.op_start(op)
        fn(*args)
    finally:
        op.t1 = time.perf_counter()
        _current.reset(token)
        for lst in listeners:
            lst.op_end(op)


setattr(run, WRAPPER, True)  # failure labels name the operation it runs (see labels)


def current() -> OpInfo | None:
    """The operation the calling worker thread is running, if instrumented (a graph replay
    running nodes on other threads copies its context there: a node sees its launch)."""
    return _current.get()


def notify(event: str, *args: Any) -> None:
    """Call ``on_<event>(*args)`` on every listener that has it."""
    for lst in listeners:
        hook = getattr(lst, "on_" + event, None)
        if hook is not None:
            hook(*args)


def add(listener: Any) -> None:
    """Activate a listener (turns the streams' slow path on)."""
    if listener not in listeners:
        listeners.append(listener)
    for fn in on_change:
        fn()


def remove(listener: Any) -> None:
    """Deactivate a listener."""
    if listener in listeners:
        listeners.remove(listener)
    for fn in on_change:
        fn()
