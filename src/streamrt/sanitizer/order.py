"""The happens-before relation the checker judges by: alloc and free events, host proofs, and
whether an operation or event is ordered before another.

Operation A is ordered before X when X's clock covers A's position (graph nodes of one launch:
when A is an ancestor of X in the DAG), or when the host saw A's stream complete A's position
before X was enqueued (a host proof). An event on the host is ordered by enqueue sequence.

State and invariants (guarded by the checker's lock: :func:`_prove` is called only under it, and
every reader runs under it):
- Host proofs: stream id -> [(seq, pos)], both increasing: at enqueue sequence ``seq`` the host
  had seen the stream complete ``pos`` (a synchronize, or a copy into pageable memory). Anything
  enqueued later is ordered after that work, as in CUDA. Past ``2 * _PROOFS`` proofs of one
  stream, the oldest ``_PROOFS`` go: only operations enqueued long ago need them.
"""

from __future__ import annotations

import bisect
from typing import Any

from .. import instrument
from ..instrument import OpInfo

_PROOFS = 4096  # host proofs remembered per stream


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


def _top(op: OpInfo) -> OpInfo:
    return op.parent if op.parent is not None else op


_proofs: dict[int, list[tuple[int, int]]] = {}


def _prove(sid: int, pos: int) -> None:
    """The host saw stream ``sid`` complete ``pos``: what is enqueued from now on is ordered
    after it."""
    proofs = _proofs.setdefault(sid, [])
    if not proofs or pos > proofs[-1][1]:
        proofs.append((next(instrument._seq), pos))
        if len(proofs) > 2 * _PROOFS:  # only operations enqueued long ago need old ones
            del proofs[:_PROOFS]


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
