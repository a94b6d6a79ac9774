"""Stream-order sanitizer: a happens-before checker over the accesses every operation declares.

State and invariants (guarded by ``_lock``):
- Every allocation is a *generation*: a range with its alloc event and, once freed, its free
  event. Stream-ordered allocations are events of their stream (a malloc enqueues a marker so
  it has a position); ``srt.malloc``/``srt.free`` are host events, ordered by enqueue sequence
  (``srt.free`` synchronizes the device first). A graph allocation is an event of the graph
  launch that runs its MEM_ALLOC node: ordered before that launch's descendants of the node
  and before whatever is ordered after the launch; a MEM_FREE node likewise. Freed
  generations are kept for a while, so a late access is reported as a use-after-free rather
  than as an unknown address.
- Each generation keeps its accesses per stream in stream order, less those a later write
  ordered after them covers and those the host saw complete before every operation still to be
  checked (past ``_MAX_ACCESSES`` unproven ones, the oldest go). A new access is checked
  against the newest generation whose alloc is ordered before it (none: use-before-alloc),
  against that generation's bounds (out-of-bounds) and free (not ordered before the free:
  use-after-free), and against earlier accesses that conflict and are not ordered before it
  (race). Operation A is ordered before X when X's clock covers A's position (graph nodes of one
  launch: when A is an ancestor of X in the DAG). A stream's accesses up to the position X's clock
  (or a host proof) covers are all ordered before X: the race check scans only the later ones,
  so a long run of ordered work on one buffer costs nothing per access.
- Findings are kept in order. In ``raise`` mode the next synchronize raises the first one not yet
  raised as :class:`SanitizerError`; in ``collect`` mode they only accumulate (``report()``).
  A correct program produces no finding: a false positive is a bug.
"""

from __future__ import annotations

import atexit
import bisect
import heapq
import itertools
import math
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from .. import instrument
from ..backends import get_backend
from ..device import devices, range_of
from ..errors import InvalidValueError, SanitizerError
from ..instrument import GRAPH_MEMORY, OpInfo
from ..validate import check_bool, env_flag, is_int

__all__ = ["enable", "disable", "enabled", "report", "clear", "check_leaks", "Finding"]

KINDS = ("race", "use-after-free", "use-before-alloc", "out-of-bounds", "invalid-address",
         "workspace", "leak")
_HISTORY = 4096  # freed generations remembered
_MAX_ACCESSES = 4096  # unproven accesses per generation past which the oldest are forgotten
_PER_ADDRESS = 4  # generations remembered per start address (more while not proven freed)
_PROOFS = 4096  # host proofs remembered per stream


@dataclass
class Finding:
    """One stream-ordering bug: what, where, and the two operations involved."""

    kind: str
    ptr: int
    nbytes: int
    message: str
    op: Any = None
    other: Any = None
    streams: tuple = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class _Event:
    """An alloc or free: on a stream at a position (with its clock), or on the host; or a
    graph memory node (``index`` >= 0) of the graph launch at that stream position, with the
    bitset of the launch's nodes ordered before it."""

    __slots__ = ("stream", "pos", "clock", "seq", "site", "what", "index", "ancestors", "node")

    def __init__(self, stream: Any, what: str, clock: dict[int, int] | None = None) -> None:
        self.stream = stream
        self.pos = stream._pos if stream is not None else 0
        self.clock = clock or {}
        self.seq = next(instrument._seq)
        self.site = instrument.user_site()
        self.what = what
        self.index = -1
        self.ancestors = 0
        self.node = ""

    @classmethod
    def of_launch(cls, launch: OpInfo, what: str, seq: float, index: int = -1,
                  ancestors: int = 0, node: str = "") -> _Event:
        """An event of graph launch ``launch``: at its node ``index``, or at its start (-1)."""
        e = cls.__new__(cls)
        e.stream, e.pos, e.clock, e.seq = launch.stream, launch.pos, launch.clock, seq
        e.site, e.what, e.index, e.ancestors, e.node = launch.site, what, index, ancestors, node
        return e

    def in_launch_of(self, x: OpInfo) -> bool:
        """Whether ``x`` is a node of the graph launch this node event belongs to."""
        p = x.parent
        return self.index >= 0 and p is not None and p.stream is self.stream and p.pos == self.pos

    def describe(self) -> str:
        where = f"{self.stream.name}@{self.pos}" if self.stream is not None else "the host"
        if self.index >= 0:
            where += f" node {self.node or f'#{self.index}'}"
        return f"{self.what} on {where}" + (f" (at {self.site})" if self.site else "")


# an access: (its operation's stream position, order of arrival, lo, hi, write, operation); a
# stream's accesses sorted by position, so ``(pos, _AFTER)`` bisects past every access at ``pos``
_Access = tuple[int, int, int, int, bool, OpInfo]
_AFTER = math.inf
_arrival = itertools.count()


class _Gen:
    __slots__ = ("lo", "hi", "alloc", "free", "streams", "count", "label")

    def __init__(self, lo: int, hi: int, alloc: _Event, label: str) -> None:
        self.lo, self.hi = lo, hi
        self.alloc = alloc
        self.free: _Event | None = None
        self.streams: dict[int, list[_Access]] = {}  # stream id -> its accesses, in stream order
        self.count = 0
        self.label = label

    def accesses(self) -> list[_Access]:
        """Every remembered access, in order of arrival."""
        return sorted((a for lst in self.streams.values() for a in lst), key=_arrival_of)


def _arrival_of(a: _Access) -> int:
    return a[1]


def _oldest_arrival(accs: list[_Access]) -> int:
    return accs[0][1]


def _seq_of(g: _Gen) -> int:
    return g.alloc.seq


def _top(op: OpInfo) -> OpInfo:
    return op.parent if op.parent is not None else op


# Host proofs: stream id -> [(seq, pos)], both increasing: at enqueue sequence ``seq`` the host
# had seen the stream complete ``pos`` (a synchronize, or a copy into pageable memory).
# Anything enqueued later is ordered after that work, as in CUDA.
_proofs: dict[int, list[tuple[int, int]]] = {}


def _proven(sid: int, seq: float) -> int:
    """The newest position of stream ``sid`` the host saw completed before enqueue sequence
    ``seq`` (0: none)."""
    proofs = _proofs.get(sid)
    if not proofs:
        return 0
    i = bisect.bisect_left(proofs, (seq, -1)) - 1
    return proofs[i][1] if i >= 0 else 0


def _host_saw(sid: int, pos: int, seq: int) -> bool:
    """The host saw stream ``sid`` reach ``pos`` before enqueue sequence ``seq``."""
    return _proven(sid, seq) >= pos


def op_before_op(a: OpInfo, x: OpInfo) -> bool:
    """Operation ``a`` happens before operation ``x``."""
    if a.parent is not None and a.parent is x.parent:
        return bool(x.ancestors >> a.index & 1)
    ta, tx = _top(a), _top(x)
    if ta is tx:
        return False
    sid = ta.stream.id
    return tx.clock.get(sid, 0) >= ta.pos or _host_saw(sid, ta.pos, tx.seq)


def _alloc_before(e: _Event, x: OpInfo) -> bool:
    if e.in_launch_of(x):  # a node of the launch that allocated: the DAG orders them
        return bool(x.ancestors >> e.index & 1)
    tx = _top(x)
    if e.stream is None:
        return e.seq < tx.seq
    sid = e.stream.id
    return tx.clock.get(sid, 0) >= e.pos or _host_saw(sid, e.pos, tx.seq)


def _before_free(x: OpInfo, e: _Event) -> bool:
    if e.in_launch_of(x):
        return bool(e.ancestors >> x.index & 1)
    tx = _top(x)
    if e.stream is None:
        return tx.seq < e.seq
    sid = tx.stream.id
    return e.clock.get(sid, 0) >= tx.pos or _host_saw(sid, tx.pos, e.seq)


class Sanitizer:
    """The checker; one per process (``streamrt.sanitizer``)."""

    wants_sites = True
    needs_inline = True  # kernel accesses are seen as views made where the cpu backend runs them

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.mode = "raise"
        self.findings: list[Finding] = []
        # (kind, range, op, other) -> its finding: an op touching one range several times (as
        # ``ops.add(t, t, t)`` does) reports each bug once, not once per access
        self._seen: dict[tuple, Finding] = {}
        self._raised = 0
        self._gens = SortedList(key=lambda g: (g.lo, g.alloc.seq))
        self._live: dict[int, _Gen] = {}
        self._freed: deque[_Gen] = deque()
        self._max = 0
        self._by_lo: dict[int, deque[_Gen]] = {}
        self._inflight: list[int] = []  # heap of enqueued operations' sequence numbers
        self._finished: set[int] = set()  # finished ones still in the heap (lazy deletion)
        self._tags: dict[int, str] = {}
        self._since = 0  # enqueue sequence of the latest restart: operations before it go unjudged

    def _restart(self) -> None:
        """Start from the program as it is now (the sanitizer is being turned on): what happened
        while it was off is unknown, so the history goes, and the live allocations count as made
        before everything to come (pool memory allocated earlier was "never covered" before)."""
        from ..memory import _owners

        with self._lock:
            self._gens.clear()
            self._live.clear()
            self._freed.clear()
            self._by_lo.clear()
            self._max = 0
            self._inflight.clear()  # ops enqueued while on, whose end it then did not see
            self._finished.clear()
            # those ops may still run: checked against the new history, their memory would have
            # been allocated after them (a false use-before-alloc)
            self._since = next(instrument._seq)
        live = [(r.base, r.size) for dev in devices() for r in dev._impl.ranges()
                if r.kind == "malloc"]  # srt.malloc's memory
        for ptr, pool in list(_owners.items()):  # pool blocks
            size = pool._usable(ptr)
            if size is not None:
                live.append((ptr, size))
        for ptr, nbytes in live:
            self._allocated(ptr, nbytes, _Event(None, f"allocation of {hex(ptr)} ({nbytes} B), "
                                                      "made before the sanitizer was enabled"),
                            "allocation")

    # -- allocation events ---------------------------------------------------------------------
    def on_alloc(self, stream: Any, ptr: int, nbytes: int, label: str = "allocation") -> None:
        """A stream-ordered (stream given) or host allocation of ``[ptr, ptr + nbytes)``."""
        if stream is not None:
            # the malloc gets a position of its own (and a name in traces)
            stream._submit(_marker, (), "malloc", f"malloc {nbytes} B")
        ev = _Event(stream, f"malloc of {hex(ptr)} ({nbytes} B)",
                    instrument.before_clock(stream) if stream is not None else None)
        self._allocated(ptr, nbytes, ev, label)

    def _allocated(self, ptr: int, nbytes: int, ev: _Event, label: str) -> None:
        with self._lock:
            g = _Gen(ptr, ptr + max(nbytes, 1), ev, label)
            self._live[ptr] = g
            self._gens.add(g)
            self._max = max(self._max, g.hi - g.lo)
            # a pool hands the same address out again and again: remember only the last few
            # generations that started there (older ones would only slow every lookup down)
            hist = self._by_lo.setdefault(ptr, deque())
            hist.append(g)
            if len(hist) > _PER_ADDRESS:
                # Forget a freed generation once no operation that may still touch it is left:
                # every operation enqueued before its free has run (later ones mean a newer
                # generation). The host seeing the free complete is not enough: an access on
                # another stream, unordered with the free (the bug to report), may still be
                # pending, and would then be blamed on the newer generation.
                oldest = self._oldest_inflight()
                keep = deque(x for x in hist if x is g or not (
                    x.free is not None and x.free.seq < oldest))
                if len(keep) < len(hist):
                    kept = set(map(id, keep))
                    for x in hist:
                        if id(x) not in kept:
                            self._gens.discard(x)
                    self._by_lo[ptr] = keep

    def on_free(self, stream: Any, ptr: int) -> None:
        """A stream-ordered (stream given) or host free of the allocation at ``ptr``."""
        clock = None
        if stream is not None:
            clock = stream._clock.copy()
            clock[stream.id] = stream._pos
        self._freed_at(ptr, _Event(stream, f"free of {hex(ptr)}", clock))

    def _freed_at(self, ptr: int, ev: _Event) -> None:
        with self._lock:
            g = self._live.pop(ptr, None)
            if g is None:
                return
            g.free = ev
            # an access that already ran is checked against this free here: left to the access's
            # own check, the finding would depend on whether it ran before the free was enqueued
            for _pos, _n, alo, ahi, _w, aop in g.accesses():
                if not _before_free(aop, g.free):
                    self._find("workspace" if "workspace" in g.label else "use-after-free", alo,
                               ahi - alo, aop, g.free,
                               f"{aop.describe()} touched {hex(alo)}+{ahi - alo} of a {g.label} "
                               f"that may already be freed: {g.free.describe()} is not ordered "
                               "after it")
                    break
            self._tags.pop(ptr, None)
            self._freed.append(g)
            while len(self._freed) > _HISTORY:
                self._gens.discard(self._freed.popleft())

    def tag(self, ptr: int, label: str) -> None:
        """Name an allocation's role in messages (an operator's workspace)."""
        with self._lock:
            g = self._live.get(ptr)
            if g is not None:
                g.label = label

    # -- accesses ------------------------------------------------------------------------------
    def access(self, op: OpInfo | None, ptr: int, nbytes: int, write: bool) -> Finding | None:
        """Check one access of ``op``; returns the finding it caused, if any."""
        if op is None or nbytes <= 0:
            return None
        lo, hi = ptr, ptr + nbytes
        with self._lock:
            start = self._gens.bisect_key_left((lo - self._max, 0))
            stop = self._gens.bisect_key_left((hi, 0))
            gens = [g for g in self._gens[start:stop] if g.lo < hi and lo < g.hi]
            gens.sort(key=_seq_of, reverse=True)
            # the generation the program meant: the newest allocated before the op was enqueued
            seq = _top(op).seq
            if seq < self._since:  # enqueued before the sanitizer was last turned on
                return None
            cur = next((g for g in gens if g.alloc.seq < seq), None)
            if cur is None or not _alloc_before(cur.alloc, op):
                if gens:
                    g = cur or gens[-1]
                    return self._find("use-before-alloc", ptr, nbytes, op, g.alloc,
                                      f"{op.describe()} touches {hex(ptr)}+{nbytes}, whose {g.label} "
                                      f"is not ordered before it: {g.alloc.describe()}")
                if self._in_pool_chunk(ptr):
                    return self._find("invalid-address", ptr, nbytes, op, None,
                                      f"{op.describe()} touches {hex(ptr)}+{nbytes}, pool memory "
                                      "that no allocation ever covered")
                return None  # not an allocation the sanitizer tracks (pinned host, graph memory)
            if not (cur.lo <= lo and hi <= cur.hi):
                return self._find("out-of-bounds", ptr, nbytes, op, cur.alloc,
                                  f"{op.describe()} touches {hex(ptr)}+{nbytes}, outside its "
                                  f"{cur.label} [{hex(cur.lo)}, {hex(cur.hi)}) from "
                                  f"{cur.alloc.describe()}")
            if cur.free is not None and not _before_free(op, cur.free):
                kind = "workspace" if "workspace" in cur.label else "use-after-free"
                return self._find(kind, ptr, nbytes, op, cur.free,
                                  f"{op.describe()} touches {hex(ptr)}+{nbytes} of a {cur.label} "
                                  f"that may already be freed: {cur.free.describe()} is not "
                                  "ordered after it")
            # per stream, what op's clock or a host proof covers is ordered before it: only the
            # later accesses are checked; the race reported is with the oldest conflicting one
            top = _top(op)
            bounds = {}
            first: _Access | None = None
            for sid, lst in cur.streams.items():
                b = bounds[sid] = max(top.clock.get(sid, 0), _proven(sid, top.seq))
                for a in lst[bisect.bisect_right(lst, (b, _AFTER)):]:
                    if (a[4] or write) and a[2] < hi and lo < a[3] and a[5] is not op \
                            and not op_before_op(a[5], op):
                        if first is None or a[1] < first[1]:
                            first = a
                        break
            found = None
            if first is not None:
                _p, _n, alo, ahi, aw, aop = first
                found = self._find(
                    "race", ptr, nbytes, op, aop,
                    f"{op.describe()} {'writes' if write else 'reads'} {hex(ptr)}+{nbytes} "
                    f"while {aop.describe()} {'writes' if aw else 'reads'} "
                    f"{hex(alo)}+{ahi - alo}, and neither is ordered before the other", cur)
            self._remember(cur, (top.pos, next(_arrival), lo, hi, write, op), top.stream.id,
                           bounds)
            return found

    def _remember(self, g: _Gen, a: _Access, sid: int, bounds: dict[int, int]) -> None:
        """Add access ``a`` of stream ``sid`` to ``g``'s history (``bounds``: per stream, the
        position up to which its accesses are ordered before ``a``), and forget what no later
        operation can race with."""
        streams = g.streams
        lst = streams.setdefault(sid, [])
        _p, _n, lo, hi, write, op = a
        if lst and lst[-1][5] is op and lst[-1][2:5] == (lo, hi, write):
            return  # the same view again (``ops.add(t, t, t)``)
        if write:  # superseded: earlier accesses ordered before this write, inside it
            for s, accs in streams.items():
                b = bounds.get(s, 0)
                keep = [x for x in accs if not (lo <= x[2] and x[3] <= hi and (
                    x[0] <= b or op_before_op(x[5], op)))]
                if len(keep) < len(accs):
                    g.count -= len(accs) - len(keep)
                    accs[:] = keep
        lst.append(a)
        g.count += 1
        # Forget the accesses the host saw complete before the oldest operation still in flight
        # was enqueued: no operation still to be checked can race with them (later ones come
        # later still). The rest are kept (an unordered write must never drop out), up to
        # ``_MAX_ACCESSES``; past it, the oldest go.
        oldest = self._oldest_inflight()
        for s, accs in list(streams.items()):
            if accs and accs[0][0] <= (seen := _proven(s, oldest)):
                k = bisect.bisect_right(accs, (seen, _AFTER))
                del accs[:k]
                g.count -= k
            if not accs:
                del streams[s]
        while g.count > _MAX_ACCESSES:
            min((x for x in streams.values() if x), key=_oldest_arrival).pop(0)
            g.count -= 1

    @staticmethod
    def _in_pool_chunk(ptr: int) -> bool:
        found = range_of(ptr)
        return found is not None and found[1].kind == "arena"

    def _find(self, kind: str, ptr: int, nbytes: int, op: Any, other: Any, msg: str,
              gen: _Gen | None = None) -> Finding:
        # one finding per pair of operations and allocation (ids stay valid: the finding holds
        # both), whichever parts of it they touch: two views of one buffer are one bug, not two;
        # ``other`` (an alloc or free event) names the allocation, else ``gen`` does (a race)
        if other is None:
            key: tuple = (kind, ptr, nbytes, id(op))
        else:
            key = (kind, id(op), id(other)) if gen is None else (
                kind, id(op), id(other), gen.lo, gen.alloc.seq)
        f = self._seen.get(key)
        if f is not None:
            return f
        f = self._seen[key] = _finding(kind, ptr, nbytes, op, other, msg)
        self.findings.append(f)
        return f

    # -- listener interface ----------------------------------------------------------------------
    def on_enqueue(self, op: OpInfo) -> None:
        with self._lock:
            heapq.heappush(self._inflight, op.seq)
        mem = op.args.get(GRAPH_MEMORY)
        if mem:
            self._graph_memory(op, mem)

    def _graph_memory(self, launch: OpInfo, mem: tuple) -> None:
        """The memory nodes of graph launch ``launch``, in topological order: ``(what, ptr,
        nbytes, index, ancestors, node label)``, what being "alloc", "free", or "auto-free" (the
        previous launch's allocation, freed as this one starts: ``auto_free_on_launch``)."""
        for what, ptr, nbytes, index, ancestors, node in mem:
            if what == "alloc":  # before any node of the launch (whose seq is the launch's)
                ev = _Event.of_launch(launch, f"graph allocation of {hex(ptr)} ({nbytes} B)",
                                      launch.seq - 0.5, index, ancestors, node)
                self._allocated(ptr, nbytes, ev, "graph allocation")
            else:
                ev = _Event.of_launch(launch, f"graph free of {hex(ptr)}", launch.seq + 0.5,
                                      index if what == "free" else -1, ancestors, node)
                self._freed_at(ptr, ev)

    def _oldest_inflight(self) -> int:
        """The smallest sequence number of an enqueued operation that has not finished."""
        heap, done = self._inflight, self._finished
        while heap and heap[0] in done:
            done.discard(heapq.heappop(heap))
        if not heap:
            done.clear()  # ends of operations enqueued before a restart: never in the heap
        return heap[0] if heap else 1 << 62

    def op_start(self, op: OpInfo) -> None:
        for ptr, nbytes, write in op.accesses:
            self.access(op, ptr, nbytes, write)

    def op_end(self, op: OpInfo) -> None:
        if op.parent is None:
            with self._lock:
                self._finished.add(op.seq)

    def on_proved(self, sid: int, pos: int) -> None:
        with self._lock:
            proofs = _proofs.setdefault(sid, [])
            if not proofs or pos > proofs[-1][1]:
                proofs.append((next(instrument._seq), pos))
                if len(proofs) > 2 * _PROOFS:  # only operations enqueued long ago need old ones
                    del proofs[:_PROOFS]

    def pending(self) -> Finding | None:
        """The first finding not yet raised (raise mode), marking it raised."""
        with self._lock:
            if self.mode == "raise" and self._raised < len(self.findings):
                f = self.findings[self._raised]
                self._raised = len(self.findings)
                return f
        return None


def _marker() -> None:
    """Queue operation standing for a stream-ordered malloc."""


_SAN = Sanitizer()
_on = False


def enable(mode: str = "raise", *, leaks: bool = False) -> None:
    """Turn the sanitizer on: ``mode`` "raise" (synchronize raises) or "collect"."""
    global _on
    if not isinstance(mode, str) or mode not in ("raise", "collect"):
        raise InvalidValueError(f"sanitizer mode must be 'raise' or 'collect', not {mode!r}")
    check_bool(leaks, "leaks")
    with _SAN._lock:
        if mode == "raise" and _SAN.mode == "collect":
            _SAN._raised = len(_SAN.findings)  # collected findings were reported by report()
        _SAN.mode = mode
    if not _on:
        from ..kernel import KernelContext

        _SAN._restart()
        KernelContext.array = _checked_array  # views declare their accesses
        _on = True
        instrument.add(_SAN)
    if leaks:
        atexit.register(_report_leaks_at_exit)


def disable() -> None:
    """Turn the sanitizer off (findings are kept until :func:`clear`)."""
    global _on
    if _on:
        from ..kernel import KernelContext

        KernelContext.array = KernelContext._fast_array
        _on = False
        instrument.remove(_SAN)


def enabled() -> bool:
    """Whether the sanitizer is on."""
    return _on


def report() -> list[Finding]:
    """Every finding so far, in order."""
    with _SAN._lock:
        return list(_SAN.findings)


def clear() -> None:
    """Forget the findings (and what was raised)."""
    with _SAN._lock:
        _SAN.findings.clear()
        _SAN._seen.clear()
        _SAN._raised = 0


def _checked_array(ctx: Any, ptr: int, shape: Any, dtype: Any, *, readonly: bool = False) -> Any:
    """``KernelContext.array`` while the sanitizer is on: check the access, then make the view."""
    import numpy as np

    try:
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
        nbytes = math.prod(shp) * dt.itemsize
        p = int(ptr) if is_int(ptr) else None
    except (TypeError, ValueError):
        p = None
    if p is not None:
        op = instrument.current()
        unmapped = get_backend(ctx.device.backend).range_of(p) is None
        # a freed generation still names the free (use-after-free); else: no allocation at all
        found = _SAN.access(op, p, nbytes, not readonly)
        if found is None and unmapped and op is not None:
            with _SAN._lock:
                found = _SAN._find("invalid-address", p, nbytes, op, None,
                                   f"{op.describe()} touches {hex(p)}+{nbytes}, which is inside "
                                   "no allocation")
        if found is not None and (unmapped or found.kind in ("out-of-bounds", "invalid-address")):
            # stop the kernel before it writes (as compute-sanitizer aborts it), in collect mode
            # too: the synchronize reports no LaunchError for it (see hostsync)
            raise SanitizerError(str(found), found)
    return ctx._view(ptr, shape, dtype, readonly)  # type: ignore[no-any-return]


def raise_pending() -> None:
    """Called by every synchronize: raise the first new finding (raise mode)."""
    f = _SAN.pending()
    if f is not None:
        raise SanitizerError(f"{f.kind}: {f.message}", f)


def _finding(kind: str, ptr: int, nbytes: int, op: Any, other: Any, msg: str) -> Finding:
    streams = tuple(x.where() if isinstance(x, OpInfo) else x.describe()
                    for x in (op, other) if x is not None)
    return Finding(kind, ptr, nbytes, msg, op, other, streams)


def check_leaks() -> list[Finding]:
    """Findings for what is still alive: executors, stream-ordered and synchronous allocations.
    Returned only: what is alive now may be freed later, so none is raised at a synchronize."""
    from ..ops.executor import live_executors

    found = []
    with _SAN._lock:
        n = live_executors()
        if n:
            found.append(_finding("leak", 0, 0, None, None,
                                  f"{n} operator executor(s) never released (destroy them, or "
                                  "let ops.run manage them)"))
        for ptr, g in sorted(_SAN._live.items()):
            found.append(_finding("leak", ptr, g.hi - g.lo, None, g.alloc,
                                  f"{g.label} {hex(ptr)} ({g.hi - g.lo} B) never freed: "
                                  f"{g.alloc.describe()}"))
    return found


def _report_leaks_at_exit() -> None:
    for f in check_leaks():
        print(f"streamrt sanitizer: {f}", file=sys.stderr)


# STREAMRT_SANITIZE: on (raise mode), or the mode by name
_MODE = env_flag("STREAMRT_SANITIZE", {"raise": "raise", "collect": "collect"})
if _MODE:
    enable("raise" if _MODE is True else _MODE)
