"""A generation: one allocation's range, its alloc and free events, and the accesses to it that
an operation still to be checked may race with.

State and invariants (guarded by the checker's lock):
- Each generation keeps its accesses per stream in stream order, less those a later write
  ordered after them covers and those the host saw complete before every operation still to be
  checked (past ``_MAX_ACCESSES`` unproven ones, the oldest go).
- A stream's accesses up to the position X's clock (or a host proof) covers are all ordered
  before X: the race check scans only the later ones, so a long run of ordered work on one
  buffer costs nothing per access.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable

from ..instrument import OpInfo
from .order import _Event, _proven, op_before_op

_MAX_ACCESSES = 4096  # unproven accesses per generation past which the oldest are forgotten

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

    def race(self, op: OpInfo, top: OpInfo, lo: int, hi: int,
             write: bool) -> tuple[_Access | None, dict[int, int]]:
        """The oldest remembered access that conflicts with ``op``'s access of ``[lo, hi)`` and
        is not ordered before it (``top``: ``op``'s launch, or ``op``), if any; and per stream,
        the position up to which its accesses are ordered before ``op``."""
        # per stream, what op's clock or a host proof covers is ordered before it: only the
        # later accesses are checked; the race reported is with the oldest conflicting one
        bounds = {}
        first: _Access | None = None
        for sid, lst in self.streams.items():
            b = bounds[sid] = max(top.clock.get(sid, 0), _proven(sid, top.seq))
            for a in lst[bisect.bisect_right(lst, (b, _AFTER)):]:
                if (a[4] or write) and a[2] < hi and lo < a[3] and a[5] is not op \
                        and not op_before_op(a[5], op):
                    if first is None or a[1] < first[1]:
                        first = a
                    break
        return first, bounds

    def remember(self, a: _Access, sid: int, bounds: dict[int, int],
                 oldest_inflight: Callable[[], int]) -> None:
        """Add access ``a`` of stream ``sid`` to the history (``bounds``: per stream, the
        position up to which its accesses are ordered before ``a``), and forget what no later
        operation can race with (``oldest_inflight``: the checker's, read only when needed)."""
        streams = self.streams
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
                    self.count -= len(accs) - len(keep)
                    accs[:] = keep
        lst.append(a)
        self.count += 1
        # Forget the accesses the host saw complete before the oldest operation still in flight
        # was enqueued: no operation still to be checked can race with them (later ones come
        # later still). The rest are kept (an unordered write must never drop out), up to
        # ``_MAX_ACCESSES``; past it, the oldest go.
        oldest = oldest_inflight()
        for s, accs in list(streams.items()):
            if accs and accs[0][0] <= (seen := _proven(s, oldest)):
                k = bisect.bisect_right(accs, (seen, _AFTER))
                del accs[:k]
                self.count -= k
            if not accs:
                del streams[s]
        while self.count > _MAX_ACCESSES:
            min((x for x in streams.values() if x), key=_oldest_arrival).pop(0)
            self.count -= 1


def _arrival_of(a: _Access) -> int:
    return a[1]


def _oldest_arrival(accs: list[_Access]) -> int:
    return accs[0][1]


def _seq_of(g: _Gen) -> int:
    return g.alloc.seq
