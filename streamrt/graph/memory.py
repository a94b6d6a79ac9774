"""Graph memory (DESIGN.md §3): MEM_ALLOC addresses fixed at creation, physical sharing at instantiate.

State and invariants:
- A :class:`GraphAlloc` owns a reserved virtual range in the cpu address space from the moment
  its MEM_ALLOC node exists; the range has no backing (``buf is None``) until an exec maps it.
  Accessing an unmapped range is an ``InvalidAddressError``.
- At instantiate, allocations whose lifetimes cannot overlap in any valid execution of the DAG
  (the free of one is an ancestor of the other's alloc) are packed at overlapping offsets of
  one arena; the exec's footprint is the arena size, close to the peak live bytes.
- ``live`` is True from a launch that executed the alloc until a free (a MEM_FREE node of any
  graph, or ``s.free``). Launching again while it is live is refused unless the exec was
  instantiated with ``auto_free_on_launch``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..backends.cpu import SPACE
from ..errors import InvalidAddressError, NotSupportedError

if TYPE_CHECKING:
    from ..device import Device
    from .node import Node

ALIGN = 512
# virtual address -> allocation, for every reserved graph allocation
_allocs: weakref.WeakValueDictionary[int, GraphAlloc] = weakref.WeakValueDictionary()


class GraphAlloc:
    """A graph allocation: a fixed virtual range, mapped by at most one live exec."""

    __slots__ = ("ptr", "nbytes", "size", "device", "live", "exec", "__weakref__")

    def __init__(self, device: Device, nbytes: int) -> None:
        self.nbytes = nbytes
        self.size = (max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN
        self.device = device
        self.ptr = SPACE.reserve(device.index, self.size).base
        self.live = False
        self.exec: Any = None  # the GraphExec mapping it, if any
        _allocs[self.ptr] = self
        weakref.finalize(self, SPACE.unreserve, self.ptr)

    def __repr__(self) -> str:
        return f"<GraphAlloc {hex(self.ptr)} {self.nbytes} B{' live' if self.live else ''}>"


def find(ptr: int) -> GraphAlloc | None:
    """The graph allocation starting at ``ptr``, or None."""
    return _allocs.get(ptr)


def free_outside(ptr: int) -> None:
    """``s.free`` of graph memory after a launch: the allocation is no longer live."""
    a = _allocs.get(ptr)
    if a is None or not a.live:
        raise InvalidAddressError(f"free of {hex(ptr)}: graph allocation is not live (double free?)")
    a.live = False
    _account(a.device, -a.size)


def _account(device: Device, delta: int) -> None:
    device.__dict__["_graph_used"] = device.__dict__.get("_graph_used", 0) + delta


def pack(allocs: list[tuple[GraphAlloc, Node, Node | None]], ancestors: dict[Node, int],
         bit: dict[Node, int]) -> tuple[dict[GraphAlloc, int], int]:
    """First-fit offsets such that allocations whose lifetimes may overlap never share bytes.

    ``allocs`` lists (allocation, alloc node, free node or None) in topological order of the
    alloc nodes; ``ancestors[n]`` is a bitset of n's ancestors, ``bit[n]`` n's own bit.
    """
    placed: list[tuple[int, int, GraphAlloc, Node, Node | None]] = []
    offsets: dict[GraphAlloc, int] = {}
    footprint = 0
    for a, anode, fnode in allocs:
        busy = []
        for off, size, _b, bnode, bfree in placed:
            # disjoint lifetimes: one's free happens before the other's alloc
            before = bfree is not None and ancestors[anode] & bit[bfree]
            after = fnode is not None and ancestors[bnode] & bit[fnode]
            if not (before or after):
                busy.append((off, off + size))
        busy.sort()
        off = 0
        for lo, hi in busy:
            if off + a.size <= lo:
                break
            off = max(off, hi)
        offsets[a] = off
        placed.append((off, a.size, a, anode, fnode))
        footprint = max(footprint, off + a.size)
    return offsets, footprint


def map_allocs(exec_: Any, device: Device, offsets: dict[GraphAlloc, int], footprint: int) -> int:
    """Back the allocations with one arena of ``footprint`` bytes; returns the arena pointer."""
    for a in offsets:
        if a.exec is not None and a.exec is not exec_ and not a.exec._destroyed:
            raise NotSupportedError(
                f"{a!r} is already mapped by {a.exec!r}: a graph with memory nodes can have only "
                "one live executable graph at a time (destroy the other one first)"
            )
    if not offsets:
        return 0
    base = device._impl.malloc(footprint)
    arena = SPACE.get(base)
    assert arena is not None
    for a, off in offsets.items():
        SPACE.map_reserved(a.ptr, arena.buf[off : off + a.size])
        a.exec = exec_
    device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) + footprint
    device.__dict__.setdefault("_execs", weakref.WeakSet()).add(exec_)  # for device reset
    return base


def unmap_allocs(exec_: Any, device: Device, allocs: list[GraphAlloc], base: int,
                 footprint: int) -> None:
    """Destroying an exec: its allocations lose their backing; the arena goes back."""
    for a in allocs:
        if a.exec is exec_:
            SPACE.map_reserved(a.ptr, None)
            a.exec = None
            if a.live:
                a.live = False
                _account(device, -a.size)
    if base:
        device._impl.free(base)
        device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) - footprint


def info(device: Device) -> dict[str, int]:
    """Graph memory of a device: bytes backing live execs and bytes of live allocations."""
    return {
        "reserved": device.__dict__.get("_graph_reserved", 0),
        "used": device.__dict__.get("_graph_used", 0),
    }
