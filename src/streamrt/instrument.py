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
from .labels import WRAPPER, site_line

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
# key of a graph launch's ``OpInfo.args``: what its event nodes publish and wait for, as
# ``(records, waits)`` (graph/eventnodes.py; the sanitizer orders its nodes by them)
GRAPH_EVENTS = "_graph_events"
# what the host has seen complete: stream id -> position (host synchronizes, copies into
# pageable memory). Replaced, never mutated, on each change (``prove``): an OpInfo keeps the
# one current at its enqueue, so work enqueued later is ordered after what the host saw then.
host_seen: dict[int, int] = {}
_host_lock = threading.Lock()


def prove(sid: int, pos: int, clock: dict[int, int]) -> None:
    """The host saw stream ``sid`` complete ``pos``, and so what ``clock`` covers: work enqueued
    from now on is ordered after it (one new ``host_seen`` for all of it)."""
    global host_seen
    with _host_lock:
        seen = host_seen
        new = None
        for k, v in ((sid, pos), *clock.items()):
            if (seen if new is None else new).get(k, 0) < v:  # (a key may come twice)
                if new is None:
                    new = dict(seen)
                new[k] = v
        if new is not None:
            host_seen = new


class OpInfo:
    """One enqueued operation, as the sanitizer and the tracer see it.

    The stream is held weakly (``stream``: None once it is gone): a checker remembering the
    operation does not keep the stream, or its worker thread, alive; the queued work holds it
    while the operation runs. ``site`` is formatted when read (findings, traces), not at enqueue.
    """

    __slots__ = (
        "_sref", "sid", "sname", "device", "pos", "seq", "kind", "name", "_site", "clock", "host",
        "accesses", "t0", "t1", "args", "parent", "index", "ancestors", "node", "thread", "stamps",
    )

    def __init__(self, stream: Any, kind: str, name: str, clock: dict[int, int],
                 accesses: tuple = (), args: dict | None = None, site: Any = None) -> None:
        if stream is not None:
            self._sref: Any = stream._wref
            self.sid = stream.id
            self.sname = stream.name
            self.device = stream.device
            self.pos = stream._pos  # 1-based position of this op
        else:
            self._sref = None
            self.sid, self.sname, self.device, self.pos = 0, "", None, 0
        self.seq = next(_seq)  # global enqueue order (host-ordered events compare with it)
        self.kind = kind
        self.name = name
        self._site = site if site is not None else (_raw_site() if _sites else "")
        # what other streams' work is ordered before this op: stream id -> position (its own
        # stream's earlier work is, by position; a copy shared by operations, never changed)
        self.clock = clock
        self.host = host_seen  # what the host had seen complete when it was enqueued
        self.accesses = accesses  # declared (ptr, nbytes, write) ranges (copies, memsets)
        self.args = args or {}
        self.parent: OpInfo | None = None  # the graph launch of a graph node
        self.stamps: tuple | None = None  # (queue, start, end) timing stamps on an enqueuing backend
        # set where they apply (unset slots, not stores on every enqueue): ``t0``, ``t1`` and
        # ``thread`` by ``run`` for listeners that read times; a graph node's ``index`` in its
        # launch (topological), ``node`` (its name: "#3", creation order in its graph) and
        # ``ancestors`` (its place in the launch's DAG: graph.compile.reach) by its launch

    @property
    def stream(self) -> Any:
        """The stream (None for a graph node, or once the stream is gone)."""
        return None if self._sref is None else self._sref()

    @property
    def site(self) -> str:
        """``file:line`` where the program enqueued it ("" when unknown); a graph node's names
        where the node was made and where its graph was launched."""
        s = self._site
        s = s if isinstance(s, str) else format_site(s)
        p = self.parent
        if p is not None and p._site:
            return f"{s}, launched at {p.site}" if s else f"launched at {p.site}"
        return s

    def where(self) -> str:
        """``stream@pos`` (and the node within its graph launch)."""
        if self.parent is not None:
            return f"{self.parent.where()} node {self.node or f'#{self.index}'}"
        return f"{self.sname}@{self.pos}" if self.sname else "host"

    def describe(self) -> str:
        """``kernel 'scale' on cpu:0/3@7 (enqueued at file.py:12)``."""
        site = self.site
        site = f" (enqueued at {site})" if site else ""
        return f"{self.kind} {self.name!r} on {self.where()}{site}"

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"<OpInfo {self.describe()}>"


def wait_args(other: Any, pos: int, why: Any) -> dict:
    """A labelled wait's ``OpInfo.args``: the stream and position it waits for (``on``) and why
    (``_why``: a few words, or the Event waited on: a trace numbers it when it writes the wait,
    so the operation holds it till then, as it holds ``other``; no listener keeps a finished
    wait)."""
    return {"on": (other, pos), "_why": why}


def active() -> bool:
    """Whether any listener wants operations instrumented."""
    return bool(listeners)


# recomputed whenever a listener comes or goes (``_changed``): read on every enqueue
_sites = False  # some listener wants each operation's call site
_timed = False  # some listener reads when and where operations ran (t0, t1, thread)
_on_enqueue: list[Callable[[OpInfo], None]] = []  # the listeners' on_enqueue hooks


def _changed() -> None:
    global _sites, _timed, _on_enqueue, _runner
    _sites = any(getattr(lst, "wants_sites", False) for lst in listeners)
    _timed = any(getattr(lst, "wants_times", True) for lst in listeners)
    _on_enqueue = [h for lst in listeners if (h := getattr(lst, "on_enqueue", None)) is not None]
    own = getattr(listeners[0], "run_op", None) if len(listeners) == 1 else None
    _runner = own if own is not None else run
    for fn in on_change:
        fn()


def user_site() -> str:
    """``file:line`` of the innermost caller outside the streamrt package."""
    raw = _raw_site()
    return format_site(raw) if raw else ""


def _raw_site() -> tuple[str, int] | str:
    """``(file, line)`` of the innermost caller outside the package ("" if none): the walk is
    cheap (one dict lookup per frame); the text is made only when read (``format_site``)."""
    f: Any = sys._getframe(2)
    inside = _inside
    while f is not None:
        code = f.f_code
        known = inside.get(code)
        if known is None:
            known = inside[code] = code.co_filename.startswith(_PKG)
        if not known:
            return (code.co_filename, f.f_lineno)
        f = f.f_back
    return ""


def format_site(raw: tuple[Any, int]) -> str:
    """``file:line`` as shown in messages (the file relative to the working directory), from
    ``(file, line)`` or a frame's ``(f_code, f_lasti)``."""
    name, line = raw
    if not isinstance(name, str):
        return site_line(name, line)
    short = _short.get(name)
    if short is None:
        try:
            short = _short[name] = os.path.relpath(name)
        except ValueError:  # another drive (Windows)
            short = _short[name] = name
    return f"{short}:{line}"


_tl = threading.local()  # ``name``: the thread's name (threads are not renamed while they run work)
_inside: dict[Any, bool] = {}  # code object -> whether it is the package's own
_short: dict[str, str] = {}  # file name -> as shown in messages (relpath is slow)


def before_clock(stream: Any) -> dict[int, int]:
    """The clock of the next operation of ``stream``: its own earlier ops and what it waited on."""
    clock = stream._clock.copy()
    clock[stream.id] = stream._pos - 1
    return clock


def wrap(stream: Any, fn: Callable[..., Any], args: tuple, kind: str, name: str,
         accesses: tuple = (), extra: dict | None = None, site: Any = None
         ) -> tuple[Callable[..., Any], tuple]:
    """Wrap a queue operation (call after ``stream._pos`` was incremented for it)."""
    cv, clock = stream._snap
    if cv != stream._cv:  # the version read before the copy: a change meanwhile shows next time
        cv = stream._cv
        clock = stream._clock.copy()
        stream._snap = (cv, clock)
    op = OpInfo(stream, kind, name, clock, accesses, extra, site)
    for hook in _on_enqueue:
        hook(op)
    # the queued work holds the stream while it waits and runs (the OpInfo holds it weakly)
    return (_runner, (op, fn, args, stream)) if stream._inline else (
        run_stamped, (op, stream._q, fn, args, stream))


def launch(stream: Any, kernel: Any, ctx: Any, args: tuple, f: Any) -> None:
    """An observed launch on a non-blocking cpu stream that does not capture (Stream.launch
    checked it; ``f``: its caller's frame): what its general path (``Eager.kernel``,
    ``_submit``, ``_enqueue``) does there, in one step: counted, wrapped and queued under the
    stream's lock."""
    fn, a = stream._q.op_launch(kernel, ctx, args)  # (the body itself: failures name it)
    site: Any = ""
    if _sites:  # the caller of Stream.launch, unless the package called it (then: walk out)
        code = f.f_code
        known = _inside.get(code)
        if known is None:
            known = _inside[code] = code.co_filename.startswith(_PKG)
        site = _raw_site() if known else (code, f.f_lasti)  # (its line is found when read)
    with stream._lock:  # (the launch's site kept at its own position: Stream._site_of)
        p = stream._pos = stream._pos + 1
        sites = stream._sites
        sites[p & (len(sites) - 1)] = (p, f.f_code, f.f_lasti)
        stream._q.submit(*wrap(stream, fn, a, "kernel", kernel.name, (), ctx._info, site))


def check_backend(stream: Any) -> None:
    """Refuse an operation of a backend that enqueues its work (cuda) that a listener cannot see."""
    for lst in listeners:
        if getattr(lst, "needs_inline", False):
            raise NotSupportedError(
                f"the {type(lst).__name__.lower()} observes work where the cpu backend runs it; it "
                f"does not support {stream.device.name} (disable it for {stream.device.backend} streams)")


def run_stamped(op: OpInfo, q: Any, fn: Callable[..., Any], args: tuple, keep: Any = None) -> None:
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


def run(op: OpInfo, fn: Callable[..., Any], args: tuple, keep: Any = None) -> None:
    """Queue operation: run ``fn(*args)`` as ``op`` (``keep``: its stream, alive till then)."""
    token = _current.set(op)
    timed = _timed
    if timed:
        try:
            op.thread = _tl.name
        except AttributeError:  # this thread's first operation
            op.thread = _tl.name = threading.current_thread().name
        op.t0 = time.perf_counter()
    try:
        for lst in listeners:
            lst.op_start(op)
        fn(*args)
    finally:
        if timed:
            op.t1 = time.perf_counter()
        _current.reset(token)
        for lst in listeners:
            lst.op_end(op)


setattr(run, WRAPPER, True)  # failure labels name the operation it runs (see labels)
# what runs an instrumented queue operation: ``run``, or the one listener's own ``run_op`` (the
# same, without the loops over listeners); chosen whenever a listener comes or goes
_runner: Callable[..., None] = run


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
    _changed()


def remove(listener: Any) -> None:
    """Deactivate a listener."""
    if listener in listeners:
        listeners.remove(listener)
    _changed()
