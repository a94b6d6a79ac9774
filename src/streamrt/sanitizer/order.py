"""The happens-before relation the checker judges by: alloc and free events, and whether an
operation or event is ordered before another.

Operation A is ordered before X when both are on one stream and A comes first, when X's clock
covers A's position (graph nodes of one launch: when A is an ancestor of X in the DAG), or when
the host had seen A's stream complete A's position before X was enqueued: ``X.host``, the
host's proofs as one per-stream clock taken at X's enqueue (``instrument.host_seen``: replaced
on each proof, never trimmed, so no proof is ever forgotten). An event on the host is ordered
by enqueue sequence.

Event nodes of graph launches (``instrument.GRAPH_EVENTS``, graph/eventnodes.py) add the rest:
a node A of a launch also has the positions of the launch's record nodes it is an ancestor of
(each record node's point at the launch's count), and a node X of a launch also has the clocks
of the launch's wait nodes it descends from; A is before X when any of X's clocks covers any of
A's positions. A launch's own clock does not cover what its wait nodes waited for: only their
dependents are ordered after it.

Nothing here holds a stream: operations and events name theirs by id and name, so a stream the
program dropped goes (with its worker thread) while its work is still remembered.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import instrument
from ..graph.compile import reaches
from ..instrument import GRAPH_EVENTS, OpInfo


class _Event:
    """An alloc or free: on a stream at a position (with its clock and the host's proofs), or
    on the host (``sid`` 0); or a graph memory node (``index`` >= 0) of the graph launch at that
    stream position, with its place in the launch's DAG (``graph.compile.reach``)."""

    __slots__ = ("_sref", "sid", "sname", "pos", "clock", "host", "seq", "_site", "what", "index",
                 "ancestors", "node", "launch")

    def __init__(self, stream: Any, what: str, clock: dict[int, int] | None = None) -> None:
        if stream is not None:
            self._sref: Any = weakref.ref(stream)
            self.sid, self.sname, self.pos = stream.id, stream.name, stream._pos
        else:
            self._sref = None
            self.sid, self.sname, self.pos = 0, "", 0
        self.clock = clock or {}
        self.host = instrument.host_seen
        self.seq: float = next(instrument._seq)
        self._site: Any = instrument._raw_site()
        self.what = what
        self.index = -1
        self.ancestors: Any = None
        self.node = ""
        self.launch: OpInfo | None = None  # a graph memory node's launch

    @classmethod
    def of_launch(cls, launch: OpInfo, what: str, seq: float, index: int = -1,
                  ancestors: Any = None, node: str = "") -> _Event:
        """An event of graph launch ``launch``: at its node ``index``, or at its start (-1)."""
        e = cls.__new__(cls)
        e._sref = launch._sref
        e.sid, e.sname, e.pos, e.clock, e.host = launch.sid, launch.sname, launch.pos, \
            launch.clock, launch.host
        e.seq, e._site, e.what, e.index, e.ancestors, e.node = seq, launch._site, what, index, \
            ancestors, node
        e.launch = launch
        return e

    @property
    def stream(self) -> Any:
        """The stream (None on the host, or once the stream is gone)."""
        return None if self._sref is None else self._sref()

    def in_launch_of(self, x: OpInfo) -> bool:
        """Whether ``x`` is a node of the graph launch this node event belongs to."""
        p = x.parent
        return self.index >= 0 and p is not None and p.sid == self.sid and p.pos == self.pos

    def describe(self) -> str:
        where = f"{self.sname}@{self.pos}" if self.sid else "the host"
        if self.index >= 0:
            where += f" node {self.node or f'#{self.index}'}"
        s = self._site
        site = s if isinstance(s, str) else instrument.format_site(s)
        return f"{self.what} on {where}" + (f" (at {site})" if site else "")

    def __str__(self) -> str:  # a finding's ``other`` prints as what it says of it
        return self.describe()

    def __repr__(self) -> str:
        return f"<{self.describe()}>"



class _HostFree(_Event):
    """A host free ordered after only what the host had proven complete when it was called
    (ACL's ``aclrtFree``, which waits for no stream work), not after everything enqueued before
    it: its stream id (-1) is no stream's, so ``_before_free`` judges it by ``host`` alone."""

    __slots__ = ()

    def __init__(self, what: str) -> None:
        super().__init__(None, what)
        self.sid = -1

    def describe(self) -> str:
        s = self._site
        site = s if isinstance(s, str) else instrument.format_site(s)
        return f"{self.what} on the host" + (f" (at {site})" if site else "")

def _top(op: OpInfo) -> OpInfo:
    return op.parent if op.parent is not None else op


def op_before_op(a: OpInfo, x: OpInfo) -> bool:
    """Operation ``a`` happens before operation ``x``."""
    pa = a.parent
    if pa is not None and pa is x.parent:
        return reaches(a.ancestors, x.ancestors)
    ta = a if pa is None else pa
    px = x.parent
    tx = x if px is None else px
    if ta is tx:
        return False
    sid, pos = ta.sid, ta.pos
    if sid == tx.sid:
        return pos < tx.pos  # one stream: in order
    if tx.clock.get(sid, 0) >= pos or tx.host.get(sid, 0) >= pos:
        return True
    return (pa is not None or px is not None) and _by_event_nodes(
        sid, pos, pa, a.ancestors if pa is not None else None, tx.clock, tx.host, px,
        x.ancestors if px is not None else None)


def _by_event_nodes(sid: int, pos: int, a_launch: OpInfo | None, a_reach: Any,
                    clock: dict[int, int], host: dict[int, int], x_launch: OpInfo | None,
                    x_reach: Any) -> bool:
    """Whether position ``(sid, pos)`` of A, or for a graph node A (at ``a_reach`` in launch
    ``a_launch``) a record node of its launch it is an ancestor of, is covered by X's
    ``clock`` or ``host`` proofs, or for a graph node X (at ``x_reach`` in ``x_launch``) by
    the clock of a wait node of its launch it descends from (see the module docstring)."""
    ae = a_launch.args.get(GRAPH_EVENTS) if a_launch is not None else None
    xe = x_launch.args.get(GRAPH_EVENTS) if x_launch is not None else None
    if ae is None and xe is None:
        return False
    points = [(sid, pos)]
    if ae is not None:
        points += [(pid, k) for pid, k, r in ae[0] if reaches(a_reach, r)]
    clocks = [clock, host]
    if xe is not None:
        clocks += [c for r, c in xe[1] if reaches(r, x_reach)]
    return any(c.get(s, 0) >= p for s, p in points for c in clocks)


def _alloc_before(e: _Event, x: OpInfo) -> bool:
    if e.in_launch_of(x):  # a node of the launch that allocated: the DAG orders them
        return reaches(e.ancestors, x.ancestors)
    tx = _top(x)
    if not e.sid:
        return e.seq < tx.seq
    sid, pos = e.sid, e.pos
    if sid == tx.sid:
        return pos < tx.pos
    if tx.clock.get(sid, 0) >= pos or tx.host.get(sid, 0) >= pos:
        return True
    node = e.launch is not None and e.index >= 0  # a MEM_ALLOC node (not the launch's start)
    return (node or x.parent is not None) and _by_event_nodes(
        sid, pos, e.launch if node else None, e.ancestors if node else None, tx.clock, tx.host,
        x.parent, x.ancestors if x.parent is not None else None)


def _before_free(x: OpInfo, e: _Event) -> bool:
    if e.in_launch_of(x):
        return reaches(x.ancestors, e.ancestors)
    tx = _top(x)
    if not e.sid:
        return tx.seq < e.seq
    sid, pos = tx.sid, tx.pos
    if sid == e.sid:
        return pos <= e.pos  # (a launch's own nodes are judged by the DAG above)
    if e.clock.get(sid, 0) >= pos or e.host.get(sid, 0) >= pos:
        return True
    node = e.launch is not None and e.index >= 0  # a MEM_FREE node (not an auto-free)
    return (node or x.parent is not None) and _by_event_nodes(
        sid, pos, x.parent, x.ancestors if x.parent is not None else None, e.clock, e.host,
        e.launch if node else None, e.ancestors if node else None)
