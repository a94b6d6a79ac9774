"""The checker's state machine (:class:`Sanitizer`): generations by address, operations in
flight, findings.

State and invariants (guarded by ``_lock``, except ``_inflight``: see there):
- Every allocation is a *generation* (``generation``): its requested range, the rounded range
  its memory spans (``cap``), its alloc event and, once freed, its free event. Stream-ordered
  allocations are events of their stream (a malloc enqueues a marker so it has a position);
  ``srt.malloc``/``srt.free`` are host events, ordered by enqueue sequence (``srt.free``
  synchronizes the device first). A graph allocation is an event of the graph launch that runs
  its MEM_ALLOC node: ordered before that launch's descendants of the node and before whatever
  is ordered after the launch (or after a record node of the launch the node is an ancestor
  of: order.py); a MEM_FREE node likewise. Freed generations are kept for a while,
  so a late access is reported as a use-after-free rather than as an unknown address.
- Lookup of the generation an access means: the newest allocated at its address before the
  operation was enqueued (among one graph launch's allocations, the one live in its DAG order).
  ``_at`` (base -> its generations, oldest first) for an access at a base, ``_live_bases``
  (the live generations' bases, sorted; live ones never overlap) for one inside; both answer
  only for a generation live when the operation was enqueued and outside its own graph
  launch's memory nodes. Anything else (the host ran ahead and reused the address, a graph's
  own memory, a bug) asks ``_index`` (lookup.py): per size class k, generations spanning fewer than
  ``2**k`` bytes by base, so only those that can reach the address are looked at.
- A new access is judged against that generation: its alloc not ordered before the access:
  use-before-alloc; outside the requested bytes: out-of-bounds (the rounding slack included);
  not ordered before its free: use-after-free; then against the generation's shadow (race).
- ``_inflight``: per stream, its operations not yet finished, oldest first (appended at
  enqueue and popped at the end without the lock: one deque operation each, atomic, in stream
  order). The oldest one's host proofs are what every operation still to be checked knows at
  least (``_floor``: what a shadow may forget). A freed generation is forgotten only once no
  operation enqueued before its free is left; operations enqueued before the latest restart
  (``_since``) go unjudged.
- Findings are kept in order. In ``raise`` mode the next synchronize raises the first one not yet
  raised as :class:`SanitizerError`; in ``collect`` mode they only accumulate (``report()``).
  A correct program produces no finding: a false positive is a bug.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any

from sortedcontainers import SortedList

from .. import instrument
from ..device import devices, range_of
from ..errors import SanitizerError
from ..graph import memory as graph_memory
from ..instrument import GRAPH_MEMORY, OpInfo
from ..labels import WRAPPER
from ..pool import registry
from ..pool.arena import ALIGN
from .finding import Finding, _finding
from .generation import _age, _Gen
from .lookup import SizeIndex
from .order import _alloc_before, _before_free, _Event, _top

_set_current, _reset_current = instrument._current.set, instrument._current.reset
_HISTORY = 4096  # freed generations remembered (more while operations may still touch them)
_PER_ADDRESS = 4  # generations remembered per start address (likewise)
_NONE = 1 << 62
UNTRACKED: Any = object()  # what an access returns in memory no generation covers


class Sanitizer:
    """The checker; one per process (``streamrt.sanitizer``)."""

    wants_sites = True
    wants_times = False  # (instrument.run times operations only for listeners that read it)
    needs_inline = True  # kernel accesses are seen as views made where the cpu backend runs them

    def __init__(self) -> None:
        self._lock = threading.Lock()  # never taken twice by one thread (no call out holds it)
        self.mode = "raise"
        self.findings: list[Finding] = []
        # (kind, range, op, other) -> its finding: an op touching one range several times (as
        # ``ops.add(t, t, t)`` does) reports each bug once, not once per access
        self._seen: dict[tuple, Finding] = {}
        self._raised = 0
        self._uid = itertools.count()
        self._at: dict[int, list[_Gen]] = {}
        self._live: dict[int, _Gen] = {}
        self._live_bases = SortedList()
        self._index = SizeIndex()
        self._freed: deque[_Gen] = deque()
        self._inflight: dict[int, deque[OpInfo]] = {}
        self._since = 0  # enqueue sequence of the latest restart: operations before it go unjudged
        self._host_frees: dict[int, _Event] = {}  # base -> its coming unordered free (see there)

    def _restart(self) -> None:
        """Start from the program as it is now (the sanitizer is being turned on): what happened
        while it was off is unknown, so the history goes, and the live allocations count as made
        before everything to come (pool memory allocated earlier was "never covered" before)."""
        with self._lock:
            for x in (self._at, self._live, self._live_bases, self._index,
                      self._freed, self._inflight, self._host_frees):
                x.clear()
            # ops enqueued while it was off may still run: checked against the new history,
            # their memory would have been allocated after them (a false use-before-alloc)
            self._since = next(instrument._seq)
        live = [(r.base, registry.requested(r.base) or r.size, r.end) for dev in devices()
                for r in dev._impl.ranges() if r.kind == "malloc"]  # srt.malloc's memory
        live += [(p, n, p + _round(n)) for p, n in registry.live_blocks()]  # pool blocks
        for ptr, nbytes, cap in live:
            self._allocated(ptr, nbytes, cap, _Event(
                None, f"allocation of {hex(ptr)} ({nbytes} B), made before the sanitizer was "
                      "enabled"), "allocation")

    # -- allocation events ---------------------------------------------------------------------
    def on_alloc(self, stream: Any, ptr: int, nbytes: int, label: str = "allocation") -> None:
        """A stream-ordered (stream given) or host allocation of ``[ptr, ptr + nbytes)``."""
        if stream is not None:
            # the malloc gets a position of its own (and a name in traces)
            stream._submit(_marker, (), "malloc", f"malloc {nbytes} B")
            cap = ptr + _round(nbytes)  # a pool block: the pool's rounding
        else:
            found = range_of(ptr)
            cap = found[1].end if found is not None else ptr + nbytes
        ev = _Event(stream, f"malloc of {hex(ptr)} ({nbytes} B)",
                    instrument.before_clock(stream) if stream is not None else None)
        self._allocated(ptr, nbytes, cap, ev, label)

    def _allocated(self, ptr: int, nbytes: int, cap: int, ev: _Event, label: str) -> None:
        with self._lock:
            g = _Gen(ptr, ptr + max(nbytes, 1), cap, ev, label, next(self._uid))
            if ptr not in self._live:
                self._live_bases.add(ptr)
            self._live[ptr] = g
            self._index.add(g)
            # a pool hands the same address out again and again: remember only the last few
            # generations that started there (older ones would only slow every lookup down)
            hist = self._at.setdefault(ptr, [])
            hist.append(g)
            if len(hist) > _PER_ADDRESS:
                # Forget a freed generation once no operation that may still touch it is left:
                # every operation enqueued before its free has run (later ones mean a newer
                # generation). The host seeing the free complete is not enough: an access on
                # another stream, unordered with the free (the bug to report), may still be
                # pending, and would then be blamed on the newer generation.
                oldest = self._oldest_inflight()
                for x in [x for x in hist if x is not g and x.free is not None
                          and x.free.seq < oldest]:
                    self._forget(x)

    def _forget(self, g: _Gen) -> None:
        hist = self._at.get(g.lo)
        if hist is not None and g in hist:
            hist.remove(g)
            if not hist:
                del self._at[g.lo]
        self._index.discard(g)

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
            self._live_bases.discard(ptr)
            # a host free announced as ordered after only the host's proofs (check_host_free)
            g.free = ev = self._host_frees.pop(ptr, ev)
            # an access that already ran is checked against this free here: left to the access's
            # own check, the finding would depend on whether it ran before the free was enqueued
            for aop in g.entries():
                if not _before_free(aop, ev):
                    self._find("workspace" if "workspace" in g.label else "use-after-free",
                               ptr, g.hi - g.lo, aop, ev,
                               f"{aop.describe()} touched {hex(ptr)}+{g.hi - g.lo} of a "
                               f"{g.label} that may already be freed: {ev.describe()} is not "
                               "ordered after it")
                    break
            freed = self._freed
            freed.append(g)
            if len(freed) > _HISTORY:
                oldest = self._oldest_inflight()
                while len(freed) > _HISTORY and freed[0].free.seq < oldest:  # type: ignore[union-attr]
                    self._forget(freed.popleft())

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
    def access(self, op: OpInfo | None, ptr: int, nbytes: int, write: bool,
               runs: list[tuple[int, int]] | None = None) -> Any:
        """Check one access of ``op`` (``runs``: the byte ranges a strided one touches inside
        ``[ptr, ptr + nbytes)``); returns the finding it caused, None, or :data:`UNTRACKED`
        (memory no generation covers, nor the rounding of one)."""
        if op is None:
            return None
        if nbytes <= 0:
            return UNTRACKED  # touches nothing: only its address is judged (the view's caller)
        top = op if op.parent is None else op.parent
        seq = top.seq
        if seq < self._since:  # enqueued before the sanitizer was last turned on
            return None
        lo, hi = ptr, ptr + nbytes
        with self._lock:
            g = None
            # the generation the program meant: the one live at lo when op was enqueued
            hist = self._at.get(lo)
            if hist is not None:
                x = hist[-1]
                a = x.alloc
                if x.free is None and a.seq < seq and hi <= x.hi and a.index < 0 and runs is None:
                    # the common case: a live allocation made before op was enqueued, by the
                    # host or by a stream whose position op's clocks cover, touched inside
                    sid = a.sid
                    if not sid or (a.pos < top.pos if sid == top.sid else (
                            top.clock.get(sid, 0) >= a.pos or top.host.get(sid, 0) >= a.pos)):
                        if len(x.starts) > x._prune_at:
                            x.prune(self._floor())
                        aop = x.access(op, lo, hi, write)
                        return None if aop is None else self._race(op, ptr, nbytes, write, x, aop)
                for x in reversed(hist):
                    if x.alloc.seq < seq:
                        f = x.free
                        if (f is None or f.seq > seq) and x.alloc.index < 0 and (
                                f is None or f.index < 0):
                            g = x
                        break
            if g is None:
                bases = self._live_bases
                i = bases.bisect_right(lo) - 1
                if i >= 0:
                    x = self._live[bases[i]]
                    if lo < x.cap and x.alloc.seq < seq and x.alloc.index < 0:
                        g = x
            if g is None:
                g = self._scan(op, lo, hi)
                if g is None:
                    if self._in_pool_chunk(ptr):
                        return self._find("invalid-address", ptr, nbytes, op, None,
                                          f"{op.describe()} touches {hex(ptr)}+{nbytes}, pool "
                                          "memory that no allocation ever covered")
                    return UNTRACKED  # not an allocation the sanitizer tracks (pinned host)
                a = g.alloc
                ordered = _alloc_before(a, op)
            else:  # allocated before op was enqueued: on the host (ordered), or on a stream
                a = g.alloc
                sid = a.sid
                ordered = not sid or (a.pos < top.pos if sid == top.sid else (
                    top.clock.get(sid, 0) >= a.pos or top.host.get(sid, 0) >= a.pos))
                if not ordered and op.parent is not None:  # a graph node after a wait node
                    ordered = _alloc_before(a, op)
            if not ordered:
                return self._find("use-before-alloc", ptr, nbytes, op, a,
                                  f"{op.describe()} touches {hex(ptr)}+{nbytes}, whose {g.label} "
                                  f"is not ordered before it: {a.describe()}")
            if not (g.lo <= lo and hi <= g.hi):
                return self._find("out-of-bounds", ptr, nbytes, op, g.alloc,
                                  f"{op.describe()} touches {hex(ptr)}+{nbytes}, outside its "
                                  f"{g.label} [{hex(g.lo)}, {hex(g.hi)}) from "
                                  f"{g.alloc.describe()}")
            if g.free is not None and not _before_free(op, g.free):
                kind = "workspace" if "workspace" in g.label else "use-after-free"
                return self._find(kind, ptr, nbytes, op, g.free,
                                  f"{op.describe()} touches {hex(ptr)}+{nbytes} of a {g.label} "
                                  f"that may already be freed: {g.free.describe()} is not "
                                  "ordered after it")
            if len(g.starts) > g._prune_at:
                g.prune(self._floor())
            if runs is None:
                aop = g.access(op, lo, hi, write)
            else:
                aop = None
                for a, b in runs:
                    r = g.access(op, a, b, write)
                    if r is not None and (aop is None or _age(r) < _age(aop)):
                        aop = r
            if aop is None:
                return None
            return self._race(op, ptr, nbytes, write, g, aop)

    def _race(self, op: OpInfo, ptr: int, nbytes: int, write: bool, g: _Gen, aop: OpInfo
              ) -> Finding:
        return self._find(
            "race", ptr, nbytes, op, aop,
            f"{op.describe()} {'writes' if write else 'reads'} {hex(ptr)}+{nbytes} "
            f"while {aop.describe()} {'writes' if not write or _wrote(g, aop) else 'reads'}"
            " it, and neither is ordered before the other", g)

    def _scan(self, op: OpInfo, lo: int, hi: int) -> _Gen | None:
        """The generation an access of ``[lo, hi)`` means, from every one remembered whose memory
        holds ``lo`` (else every one it overlaps): the newest allocated before op was enqueued
        (the one live there in op's own order among a launch's graph allocations), else the
        newest."""
        seq = _top(op).seq
        found = self._index.around(lo, hi)
        if not found:
            return None
        found.sort(key=_newest_first)
        meant = [g for g in found if g.alloc.seq < seq]
        if not meant:
            return found[0]  # allocated after op was enqueued: use-before-alloc
        # the newest allocated before op was enqueued, as the program meant it; of the graph
        # allocations of one launch (one sequence number), the one live in op's own DAG order
        ties = [g for g in meant if g.alloc.seq == meant[0].alloc.seq]
        return next((g for g in ties if _alloc_before(g.alloc, op) and (
            g.free is None or not _alloc_before(g.free, op))), ties[0])

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
            key = (kind, id(op), id(other)) if gen is None else (kind, id(op), id(other), gen.uid)
        f = self._seen.get(key)
        if f is not None:
            return f
        f = self._seen[key] = _finding(kind, ptr, nbytes, op, other, msg)
        self.findings.append(f)
        return f

    # -- listener interface ----------------------------------------------------------------------
    def on_enqueue(self, op: OpInfo) -> None:
        d = self._inflight.get(op.sid)
        if d is None:
            d = self._inflight.setdefault(op.sid, deque())
        d.append(op)
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
                a = graph_memory.find(ptr)
                self._allocated(ptr, nbytes, ptr + (a.size if a is not None else _round(nbytes)),
                                ev, "graph allocation")
            else:
                ev = _Event.of_launch(launch, f"graph free of {hex(ptr)}", launch.seq + 0.5,
                                      index if what == "free" else -1, ancestors, node)
                self._freed_at(ptr, ev)

    def _oldest_inflight(self) -> int:
        """The smallest sequence number of an enqueued operation that has not finished."""
        heads = [d[0].seq for d in list(self._inflight.values()) if d]
        return min(heads) if heads else _NONE

    def _floor(self) -> dict[int, int]:
        """What the host had proven when the oldest operation still to be checked was enqueued
        (every later one was enqueued knowing at least as much)."""
        heads = [d[0] for d in list(self._inflight.values()) if d]
        return min(heads, key=_seq).host if heads else instrument.host_seen

    def run_op(self, op: OpInfo, fn: Any, args: tuple, keep: Any = None) -> None:
        """``instrument.run`` while this checker is the only listener: the same steps."""
        token = _set_current(op)
        try:
            if op.accesses:
                self.op_start(op)
            fn(*args)
        finally:
            _reset_current(token)
            if op.parent is None:
                d = self._inflight.get(op.sid)
                if d and d[0] is op:
                    d.popleft()

    setattr(run_op, WRAPPER, True)  # failure labels name the operation it runs (see labels)

    def op_start(self, op: OpInfo) -> None:
        for ptr, nbytes, write in op.accesses:
            self.access(op, ptr, nbytes, write)

    def op_end(self, op: OpInfo) -> None:
        if op.parent is None:
            d = self._inflight.get(op.sid)
            if d and d[0] is op:
                d.popleft()

    def pending(self) -> Finding | None:
        """The first finding not yet raised (raise mode), marking it raised."""
        with self._lock:
            if self.mode == "raise" and self._raised < len(self.findings):
                f = self.findings[self._raised]
                self._raised = len(self.findings)
                return f
        return None


def _wrote(g: _Gen, op: OpInfo) -> bool:
    """Whether ``op`` is among the writers ``g`` remembers."""
    return any(op in w for w, _r in g.states)


def _round(nbytes: int) -> int:
    """A pool block's bytes for a request of ``nbytes`` (the pools' rounding)."""
    return (max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN


def _seq(op: OpInfo) -> int:
    return op.seq


def _newest_first(g: _Gen) -> tuple[float, int]:
    return (-g.alloc.seq, -g.uid)


def _marker() -> None:
    """Queue operation standing for a stream-ordered malloc."""
