"""A generation: one allocation's range (the requested bytes, and the rounded ``cap`` its
memory really spans), its alloc and free events, and its shadow: what each byte range's last
accesses were.

State and invariants (guarded by the checker's lock):
- The shadow is a partition of ``[lo, hi)`` into segments (``starts``, increasing, the first
  ``lo``), each with its state ``(writes, reads)``: the operations whose writes no later write
  is ordered after, and whose reads no later read or write is ordered after. An access ordered
  after an entry supersedes it where it conflicts with everything the entry does: a write
  supersedes every entry ordered before it, a read the reads ordered before it (a write before
  a read stays: later writes conflict with it). So a segment holds, per stream, at most its
  last write and its last read since (more only where accesses are unordered: concurrent
  readers, graph branches, and races, each reported): nothing needs a cap, and nothing
  unordered is ever forgotten. Entries are the operations themselves (no record per access),
  the lists changed in place: an access in the steady state allocates nothing.
- Accesses are checked in an order consistent with happens-before (an operation runs only after
  what it is ordered after completed), so an entry present when an access arrives either is
  ordered before it or is concurrent with it. Of several conflicting entries the race is
  reported with the one enqueued first (``_age``): the finding does not depend on the schedule.
- Segments split where an access starts or ends inside one and merge again under a write that
  covers them (a whole-buffer write leaves one segment).
- ``streak``: a stream id, or -1. Set (by the one-segment path) when the shadow is one segment
  holding only operations of that stream, none a graph node, after an access the checker had
  judged in bounds, live and with its alloc ordered before it; every later operation of that
  stream is then ordered after all the generation holds (stream order, transitively), so its
  next access of the whole allocation only replaces entries (``sanitizer._checked_array``). Any
  other change of the shadow resets it.
"""

from __future__ import annotations

import bisect

from ..instrument import OpInfo
from .order import _Event, op_before_op

_State = tuple[list[OpInfo], list[OpInfo]]  # (writes, reads)
_PRUNE_AT = 32


class _Gen:
    __slots__ = ("lo", "hi", "cap", "alloc", "free", "label", "starts", "states", "uid",
                 "_prune_at", "streak")

    def __init__(self, lo: int, hi: int, cap: int, alloc: _Event, label: str, uid: int) -> None:
        self.lo, self.hi, self.cap = lo, hi, max(cap, hi)
        self.alloc = alloc
        self.free: _Event | None = None
        self.label = label
        self.starts = [lo]
        self.states: list[_State] = [([], [])]
        self.uid = uid
        self._prune_at = _PRUNE_AT  # segments past which proven entries are dropped (doubling)
        self.streak = -1  # see the module's docstring

    def entries(self) -> list[OpInfo]:
        """Every remembered access's operation, once each, oldest first."""
        seen: dict[int, OpInfo] = {}
        for w, r in self.states:
            for op in w:
                seen[id(op)] = op
            for op in r:
                seen[id(op)] = op
        return sorted(seen.values(), key=_age)

    def prune(self, floor: dict[int, int]) -> None:
        """Drop the entries of operations the host saw complete before anything still to be
        checked was enqueued (``floor``: the oldest such operation's proofs): nothing can race
        with them. Equal neighbouring segments merge, so slices the program is done with cost
        nothing."""
        self.streak = -1
        starts: list[int] = []
        states: list[_State] = []
        for lo, (w, r) in zip(self.starts, self.states):
            st = ([a for a in w if floor.get(_top(a).sid, 0) < _top(a).pos],
                  [a for a in r if floor.get(_top(a).sid, 0) < _top(a).pos])
            if states and st == states[-1]:
                continue
            starts.append(lo)
            states.append(st)
        self.starts, self.states = starts, states
        self._prune_at = max(_PRUNE_AT, 2 * len(starts))

    def access(self, op: OpInfo, lo: int, hi: int, write: bool) -> OpInfo | None:
        """Record ``op``'s access of ``[lo, hi)`` (inside the generation) and return the oldest
        remembered operation it conflicts with that is not ordered before it, if any."""
        if len(self.starts) == 1 and lo == self.lo and hi == self.hi:
            # the whole allocation, one segment: the common case, and mostly with entries only
            # of earlier operations of op's own stream (superseded, or a write before a read)
            top = op if op.parent is None else op.parent
            sid = top.sid
            w, r = self.states[0]
            for a in w:
                if a.parent is not None or a.sid != sid or a is top:
                    return self._access(op, lo, hi, write, 0, 1)  # anything else: in full
            for a in r:
                if a.parent is not None or a.sid != sid or a is top:
                    return self._access(op, lo, hi, write, 0, 1)
            if write:
                w.clear()
                w.append(op)
            r.clear()
            if not write:
                r.append(op)
            self.streak = sid if op is top and sid else -1
            return None
        return self._access(op, lo, hi, write, -1, -1)

    def _access(self, op: OpInfo, lo: int, hi: int, write: bool, i: int, j: int
                ) -> OpInfo | None:
        self.streak = -1
        starts, states = self.starts, self.states
        if i < 0:
            i = bisect.bisect_right(starts, lo) - 1
            if starts[i] != lo:  # split the segment holding lo
                i += 1
                starts.insert(i, lo)
                w, r = states[i - 1]
                states.insert(i, (list(w), list(r)))
            j = bisect.bisect_left(starts, hi, i)
            if hi < self.hi and (j == len(starts) or starts[j] != hi):  # split at hi
                starts.insert(j, hi)
                w, r = states[j - 1]
                states.insert(j, (list(w), list(r)))
        race: OpInfo | None = None
        verdict: dict[int, bool] = {}  # id(entry) -> ordered before op (an entry spans segments)
        top = op if op.parent is None else op.parent

        def ordered(a: OpInfo) -> bool:
            if a.parent is None and a.sid == top.sid and a is not top:
                return True  # earlier on op's own stream (a later one is not checked yet)
            v = verdict.get(id(a))
            if v is None:
                v = verdict[id(a)] = op_before_op(a, op)
            return v

        for k in range(i, j):
            w, r = states[k]
            own = False  # op already holds an entry here that covers this access
            keep_w = []
            for a in w:
                if a is op:
                    own = True
                    keep_w.append(a)
                elif not ordered(a):
                    if race is None or _age(a) < _age(race):
                        race = a
                    keep_w.append(a)
                elif not write:
                    keep_w.append(a)  # a write before a read stays: later writes conflict with it
            keep_r = []
            for a in r:
                if a is op:
                    if not write:
                        own = True
                        keep_r.append(a)
                elif not ordered(a):
                    if write and (race is None or _age(a) < _age(race)):
                        race = a
                    keep_r.append(a)
            if not own:
                (keep_w if write else keep_r).append(op)
            w[:] = keep_w
            r[:] = keep_r
        if write and j - i > 1 and all(states[k] == states[i] for k in range(i + 1, j)):
            del starts[i + 1:j]  # one write over several segments left them equal: one again
            del states[i + 1:j]
        return race


def _top(op: OpInfo) -> OpInfo:
    return op if op.parent is None else op.parent


def _age(op: OpInfo) -> tuple[int, int]:
    """Enqueue order: a graph node by its launch, then by its place in the launch."""
    top = op.parent
    return (op.seq, -1) if top is None else (top.seq, op.index)
