"""A generation: one allocation's range (the requested bytes, and the rounded ``cap`` its
memory really spans), its alloc and free events, and its shadow: what each byte range's last
accesses were.

State and invariants (guarded by the checker's lock):
- The shadow is a partition of ``[lo, hi)`` into segments (``starts``, increasing, the first
  ``lo``), each with its entries: ``(arrival, op, write)`` for the writes no later write is
  ordered after, and the reads no later access of the same kind supersedes. An access ordered
  after an entry supersedes it where it conflicts with everything the entry does: a write
  supersedes every entry ordered before it, a read the reads ordered before it. So a segment
  holds, per stream, at most its last write and its reads since (more only where accesses are
  unordered: concurrent readers, graph branches, and races, each reported): nothing needs a
  cap, and nothing unordered is ever forgotten.
- Accesses are checked in an order consistent with happens-before (an operation runs only after
  what it is ordered after completed), so an entry present when an access arrives either is
  ordered before it or is concurrent with it.
- Segments split where an access starts or ends inside one and merge again under a write that
  covers them (a whole-buffer write leaves one segment).
"""

from __future__ import annotations

import bisect
import itertools

from ..instrument import OpInfo
from .order import _Event, op_before_op

# an entry: (order of arrival, operation, write)
_Entry = tuple[int, OpInfo, bool]
_arrival = itertools.count()
_PRUNE_AT = 32


class _Gen:
    __slots__ = ("lo", "hi", "cap", "alloc", "free", "label", "starts", "states", "uid", "_prune_at")

    def __init__(self, lo: int, hi: int, cap: int, alloc: _Event, label: str, uid: int) -> None:
        self.lo, self.hi, self.cap = lo, hi, max(cap, hi)
        self.alloc = alloc
        self.free: _Event | None = None
        self.label = label
        self.starts = [lo]
        self.states: list[list[_Entry]] = [[]]
        self.uid = uid
        self._prune_at = _PRUNE_AT  # segments past which proven entries are dropped (doubling)

    def entries(self) -> list[_Entry]:
        """Every remembered access, in order of arrival (once each)."""
        seen: dict[tuple[int, bool], _Entry] = {}
        for st in self.states:
            for e in st:
                seen[(e[0], e[2])] = e
        return sorted(seen.values())

    def prune(self, floor: dict[int, int]) -> None:
        """Drop the entries of operations the host saw complete before anything still to be
        checked was enqueued (``floor``: the oldest such operation's proofs): nothing can race
        with them. Equal neighbouring segments merge, so slices the program is done with cost
        nothing."""
        starts, states = [], []
        for lo, st in zip(self.starts, self.states):
            st = [e for e in st if floor.get(_top_sid(e[1]), 0) < _top_pos(e[1])]
            if states and st == states[-1]:
                continue
            starts.append(lo)
            states.append(st)
        self.starts, self.states = starts, states
        self._prune_at = max(_PRUNE_AT, 2 * len(starts))

    def access(self, op: OpInfo, lo: int, hi: int, write: bool) -> _Entry | None:
        """Record ``op``'s access of ``[lo, hi)`` (inside the generation) and return the oldest
        remembered access it conflicts with that is not ordered before it, if any."""
        starts, states = self.starts, self.states
        if len(starts) == 1 and lo == self.lo and hi == self.hi:
            # the whole allocation, one segment: the common case, and mostly with entries only
            # of earlier operations of op's own stream (all superseded, or a write before a read)
            top = op if op.parent is None else op.parent
            sid = top.sid
            st = states[0]
            keep = []
            for e in st:
                a = e[1]
                if a.parent is not None or a.sid != sid or a is top:
                    return self._access(op, lo, hi, write, 0, 1)  # anything else: in full
                if e[2] and not write:
                    keep.append(e)
            keep.append((next(_arrival), op, write))
            states[0] = keep
            return None
        return self._access(op, lo, hi, write, -1, -1)

    def _access(self, op: OpInfo, lo: int, hi: int, write: bool, i: int, j: int) -> _Entry | None:
        starts, states = self.starts, self.states
        if i < 0:
            i = bisect.bisect_right(starts, lo) - 1
            if starts[i] != lo:  # split the segment holding lo
                i += 1
                starts.insert(i, lo)
                states.insert(i, list(states[i - 1]))
            j = bisect.bisect_left(starts, hi, i)
            if hi < self.hi and (j == len(starts) or starts[j] != hi):  # split at hi
                starts.insert(j, hi)
                states.insert(j, list(states[j - 1]))
        race: _Entry | None = None
        before = op_before_op
        top = op if op.parent is None else op.parent
        sid = top.sid
        verdict: dict[int, bool] = {}  # arrival -> ordered before op (an entry spans segments)
        mine: _Entry | None = None
        for k in range(i, j):
            keep = []
            own = False  # op already holds an entry here that covers this access
            for e in states[k]:
                a = e[1]
                if a is op:  # op's own earlier view: kept if it covers this one
                    if e[2] or not write:
                        keep.append(e)
                        own = True
                    continue
                if a.parent is None and a.sid == sid and a is not top:
                    ordered = True  # earlier on op's own stream (a later one is not checked yet)
                else:
                    ordered = verdict.get(e[0])
                    if ordered is None:
                        ordered = verdict[e[0]] = before(a, op)
                if not ordered:
                    if (write or e[2]) and (race is None or e[0] < race[0]):
                        race = e
                    keep.append(e)
                elif e[2] and not write:
                    keep.append(e)  # a write before a read stays: later writes conflict with it
            if not own:
                if mine is None:
                    mine = (next(_arrival), op, write)
                keep.append(mine)
            states[k] = keep
        if write and j - i > 1 and all(states[k] == states[i] for k in range(i + 1, j)):
            del starts[i + 1:j]  # one write over several segments left them equal: one again
            del states[i + 1:j]
        return race


def _top_sid(op: OpInfo) -> int:
    return op.sid if op.parent is None else op.parent.sid


def _top_pos(op: OpInfo) -> int:
    return op.pos if op.parent is None else op.parent.pos
