"""Event record and wait nodes of an executable graph: what each launch binds and publishes.

API.md §9.1: a record node records when its dependencies are done, a wait node holds back only
its dependents. The frontend binds both at each launch, on the host; the backend acts where they
sit in the graph (``backends/base.py``, :class:`~streamrt.backends.base.GraphRunner`):

- A wait node waits for the record its event has when the graph is launched (as
  ``cudaStreamWaitEvent`` binds to the record current at the call): that record's queue and
  position, or nothing when the launch stream is already ordered after it: the event was never
  recorded, or recorded by this exec (its earlier launches come before this one whole). A
  record made inside a capture is not one (the capture's node set).
- A record node's completions are counted by its *point*: a stream-like object (``id``,
  ``name``, ``device``, ``_q`` the backend's :class:`~streamrt.backends.base.Mark`, ``_host``)
  per exec, node and device. The event a node records names the point as its stream and the
  k-th launch's record as position k, so an event's query, synchronize, elapsed time and the
  waits on it work as for a stream's record, and end where the node ran.
- The clock a record publishes: what was ordered before the launch (the launch stream's clock
  and its position before the launch, its implicit legacy-stream waits included), what the
  wait nodes among the record node's ancestors waited for, and the point at k. Not the
  launch's own position: a waiter is ordered after the record node's ancestors only.
- The launch stream's later work is ordered after every wait node's event (a launch completes
  only once its wait nodes did): their clocks merge into the stream's once it is enqueued.
- What an instrumented launch tells the sanitizer (``instrument.GRAPH_EVENTS``):
  ``(records, waits)``, each record node's ``(point id, k, place in the DAG)`` and each bound
  wait node's ``(place in the DAG, clock)`` (``graph.compile.reach``; sanitizer/order.py).

State: a point's ``_launched`` (the launches that recorded it, so the next one is k + 1) and
the exec's points are changed under the exec's lock; a record is published whole
(``Event._rec``) after the launch is enqueued, as ``Stream.record`` publishes one.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from .node import Node, NodeType

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends.base import Flat
    from ..device import Device
    from ..stream import Stream
    from .compile import Reach

__all__ = ["EventNodes", "Point", "plan"]

_ids = itertools.count(-1, -1)  # points' ids: clock keys that no stream (ids from 1) has


class Point:
    """The completions of one record node of an exec on one device, as an event sees a stream."""

    __slots__ = ("id", "name", "device", "owner", "_q", "_host", "_launched", "__weakref__")

    def __init__(self, device: Device, name: str, owner: object) -> None:
        self.id = next(_ids)
        self.name = name
        self.device = device
        self.owner = owner  # what the exec's points share (a wait node of it skips them)
        self._q = device._impl.graph_mark(name)
        self._host = 0  # the launch count a host synchronize proved (sync.proved)
        self._launched = 0

    def __repr__(self) -> str:
        return f"<graph record point {self.name}>"


class _Slot(NamedTuple):
    """An event node of a compiled plan: its index in the flattened graph, the node, whether it
    records, its point (a record node's), the slots of the wait nodes among its ancestors (a
    record node's) and its place in the DAG (instrumented plans only)."""

    index: int
    node: Node
    record: bool
    point: Point | None
    before: tuple[int, ...]
    reach: Reach | None


class EventNodes:
    """The event nodes of one compiled plan, in the order of its flattened graph."""

    __slots__ = ("slots", "marks", "owner")

    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        # what the backend's runner is built with: the mark of each record node, by flat index
        self.marks = {s.index: s.point._q for s in slots if s.point is not None}
        self.owner = next((s.point.owner for s in slots if s.point is not None), None)

    def bind(self, stream: Stream) -> tuple[tuple, list[dict[int, int] | None]]:
        """This launch's ``events`` for the runner, and each bound wait node's clock."""
        args: list[Any] = []
        clocks: list[dict[int, int] | None] = []
        for s in self.slots:
            event = s.node._params["event"]
            if s.point is not None:
                args.append((s.point._launched + 1,
                             s.point._q.op_stamp() if event.timing else None))
                clocks.append(None)
                continue
            other, pos, clock, _stamp = event._rec  # once: another thread may re-record it
            if other is None or other is stream or stream._clock.get(other.id, 0) >= pos or (
                    self.owner is not None and getattr(other, "owner", None) is self.owner):
                args.append(None)  # the launch is ordered after it already (or nothing to wait)
                clocks.append(None)
            else:
                args.append((other._q, pos))
                clocks.append({**clock, other.id: pos})
        return tuple(args), clocks

    def observed(self, args: tuple, clocks: list[dict[int, int] | None]) -> tuple | None:
        """What the sanitizer reads of this launch (see the module docstring); None for a plan
        compiled without the places of its nodes."""
        if any(s.reach is None for s in self.slots):
            return None
        records = [(s.point.id, args[j][0], s.reach) for j, s in enumerate(self.slots)
                   if s.point is not None]
        waits = [(s.reach, clocks[j]) for j, s in enumerate(self.slots)
                 if s.point is None and clocks[j] is not None]
        return records, waits

    def publish(self, stream: Stream, before: dict[int, int], args: tuple,
                clocks: list[dict[int, int] | None]) -> None:
        """Once the launch is enqueued: each record node's event takes this launch's record, and
        the launch stream is ordered after what the wait nodes waited for. ``before``: the
        stream's snapshot just before the launch was enqueued."""
        for j, s in enumerate(self.slots):
            p = s.point
            if p is None:
                continue
            k, stamp = args[j]
            clock = dict(before)
            for w in s.before:
                _merge(clock, clocks[w])
            clock[p.id] = k
            event = s.node._params["event"]
            event._rec = (p, k, clock, stamp)  # whole, in one store (see Event._rec)
            event._capture = None
            p._launched = k
        waited: dict[int, int] = {}
        for c in clocks:
            _merge(waited, c)
        if waited:
            with stream._lock:  # (instrumented enqueues merge under it)
                stream._merge(waited)


def _merge(into: dict[int, int], clock: dict[int, int] | None) -> None:
    for sid, p in (clock or {}).items():
        if p > into.get(sid, 0):
            into[sid] = p


def plan(flat: Flat, anc: list[Reach] | None, device: Device,
         point: Callable[[int, Node, Device], Point]) -> EventNodes | None:
    """The event nodes of a flattened graph (None: it has none), with the points of its record
    nodes on ``device`` (``point``: the exec's, made once per node and device)."""
    found = [i for i, (n, _, _) in enumerate(flat)
             if n is not None and n.type in (NodeType.EVENT_RECORD, NodeType.WAIT_EVENT)]
    if not found:
        return None
    slot_of = {i: j for j, i in enumerate(found)}
    waits = {i for i in found if flat[i][0].type is NodeType.WAIT_EVENT}  # type: ignore[union-attr]
    below: list[int] = []  # node -> the wait nodes among its ancestors, a bitset by slot
    if waits and len(waits) < len(found):
        for _n, deps, _on in flat:
            b = 0
            for d in deps:
                b |= below[d]
                if d in waits:
                    b |= 1 << slot_of[d]
            below.append(b)
    slots = []
    for i in found:
        n = flat[i][0]
        assert n is not None
        record = i not in waits
        before = tuple(j for j in range(len(found)) if below[i] >> j & 1) if record and below \
            else ()
        slots.append(_Slot(i, n, record, point(i, n, device) if record else None, before,
                           None if anc is None else anc[i]))
    return EventNodes(slots)
