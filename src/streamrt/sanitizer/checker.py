"""The checker's state machine (:class:`Sanitizer`): generations by address, operations in
flight, findings.

State and invariants (guarded by ``_lock``):
- Every allocation is a *generation*: a range with its alloc event and, once freed, its free
  event. Stream-ordered allocations are events of their stream (a malloc enqueues a marker so
  it has a position); ``srt.malloc``/``srt.free`` are host events, ordered by enqueue sequence
  (``srt.free`` synchronizes the device first). A graph allocation is an event of the graph
  launch that runs its MEM_ALLOC node: ordered before that launch's descendants of the node
  and before whatever is ordered after the launch; a MEM_FREE node likewise. Freed
  generations are kept for a while, so a late access is reported as a use-after-free rather
  than as an unknown address.
- A new access is checked against the newest generation whose alloc is ordered before it (none:
  use-before-alloc), against that generation's bounds (out-of-bounds) and free (not ordered
  before the free: use-after-free), and against earlier accesses that conflict and are not
  ordered before it (race; what a generation remembers: ``generation``).
- Operations in flight: a heap of enqueued operations' sequence numbers, those finished
  removed lazily. A generation of a reused address, or an access the host saw complete, is
  forgotten only once no operation in flight can still touch it; operations enqueued before
  the latest restart (``_since``) go unjudged.
- Findings are kept in order. In ``raise`` mode the next synchronize raises the first one not yet
  raised as :class:`SanitizerError`; in ``collect`` mode they only accumulate (``report()``).
  A correct program produces no finding: a false positive is a bug.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from typing import Any

from sortedcontainers import SortedList

from .. import instrument
from ..device import devices, range_of
from ..errors import SanitizerError
from ..instrument import GRAPH_MEMORY, OpInfo
from ..pool import registry
from .finding import Finding, _finding
from .generation import _arrival, _Gen, _seq_of
from .order import _alloc_before, _before_free, _Event, _prove, _top

_HISTORY = 4096  # freed generations remembered
_PER_ADDRESS = 4  # generations remembered per start address (more while not proven freed)


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
        live += registry.live_blocks()  # pool blocks
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

    def sync_failures(self, failures: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """At a synchronize (``sync.after_sync``): a kernel this checker stopped failed with its
        SanitizerError, which the finding reports, so those failures go; with no other failure
        left, the first new finding is raised (raise mode). Else it waits for the next
        synchronize: the failures taken here would be lost behind it."""
        failures = [e for e in failures if not isinstance(e[1], SanitizerError)]
        if not failures:
            f = self.pending()
            if f is not None:
                raise SanitizerError(f"{f.kind}: {f.message}", f)
        return failures

    def on_tag(self, ptr: int, label: str) -> None:
        """A label for the allocation at ``ptr`` in later findings (``instrument.notify``)."""
        self.tag(ptr, label)

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
            top = _top(op)
            first, bounds = cur.race(op, top, lo, hi, write)
            found = None
            if first is not None:
                _p, _n, alo, ahi, aw, aop = first
                found = self._find(
                    "race", ptr, nbytes, op, aop,
                    f"{op.describe()} {'writes' if write else 'reads'} {hex(ptr)}+{nbytes} "
                    f"while {aop.describe()} {'writes' if aw else 'reads'} "
                    f"{hex(alo)}+{ahi - alo}, and neither is ordered before the other", cur)
            cur.remember((top.pos, next(_arrival), lo, hi, write, op), top.stream.id, bounds,
                         self._oldest_inflight)
            return found

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
            _prove(sid, pos)

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
