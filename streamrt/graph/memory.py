"""Graph memory (DESIGN.md §3): MEM_ALLOC addresses fixed at creation, physical sharing at instantiate.

State and invariants:
- A :class:`GraphAlloc` lies in a :class:`Range` of addresses reserved by its device's backend
  from the moment its MEM_ALLOC node exists (the cpu address space; ``cuMemAddressReserve`` on
  cuda); a range has no memory behind it until an exec maps it. Accessing an unmapped range is
  an ``InvalidAddressError`` on cpu (an illegal address on a GPU).
- Ranges are mapped whole, so their sizes and offsets are multiples of the backend's
  ``graph_granule`` (512 B on cpu, the VMM granularity, 2 MiB, on cuda). An allocation of at
  most half a granule takes 512-aligned bytes of its graph's current *slab*, a one-granule
  range that small allocations of one graph share (else each would cost a whole granule on
  cuda); a larger one has a range of its own. A slab's lifetime is the union of its members'.
- At instantiate, ranges whose lifetimes cannot overlap in any valid execution of the DAG
  (every member's free is an ancestor of every other member's alloc) are packed at
  overlapping offsets of one arena (``cuMemCreate`` + ``cuMemMap`` on cuda); the exec's
  footprint is the arena size, close to the peak live bytes. A range is mapped by at most one
  exec at a time.
- ``live`` is True from a launch that executed the alloc until a free (a MEM_FREE node of any
  graph, or ``s.free``). Launching again while it is live is refused unless the exec was
  instantiated with ``auto_free_on_launch``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..arena import ALIGN
from ..errors import InvalidAddressError, NotSupportedError, StreamRTError

if TYPE_CHECKING:
    from ..device import Device
    from .node import Node

# virtual address -> allocation, for every reserved graph allocation
_allocs: weakref.WeakValueDictionary[int, GraphAlloc] = weakref.WeakValueDictionary()


class Range:
    """Addresses reserved for graph memory: one large allocation's, or a slab of small ones."""

    __slots__ = ("ptr", "size", "device", "top", "exec", "__weakref__")

    def __init__(self, device: Device, size: int) -> None:
        impl = device._impl
        self.ptr = impl.graph_reserve(size)
        self.size = size
        self.device = device
        self.top = 0  # bytes of a slab handed out
        self.exec: Any = None  # the GraphExec mapping it, if any
        weakref.finalize(self, impl.reclaim, _release, impl, self.ptr, size)


class GraphAlloc:
    """A graph allocation: fixed addresses in a range that at most one exec maps."""

    __slots__ = ("ptr", "nbytes", "size", "range", "device", "live", "__weakref__")

    def __init__(self, device: Device, nbytes: int, slabs: dict[Device, Range]) -> None:
        granule = device._impl.graph_granule
        size = (max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN  # in a slab: aligned as pool blocks
        if size <= granule // 2:
            r = slabs.get(device)
            if r is None or r.top + size > r.size:
                r = slabs[device] = Range(device, granule)
            self.ptr = r.ptr + r.top
            r.top += size
        else:
            size = (size + granule - 1) // granule * granule
            r = Range(device, size)
            self.ptr = r.ptr
        self.nbytes = nbytes
        self.size = size
        self.range = r
        self.device = device
        self.live = False
        _allocs[self.ptr] = self

    def __repr__(self) -> str:
        return f"<GraphAlloc {hex(self.ptr)} {self.nbytes} B{' live' if self.live else ''}>"


def _release(impl: Any, ptr: int, size: int) -> None:
    try:
        impl.graph_release(ptr, size)
    except StreamRTError:
        pass  # at exit, or after a driver failure: the addresses go with the process


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
         bit: dict[Node, int]) -> tuple[dict[Range, int], int]:
    """First-fit offsets of the allocations' ranges such that ranges whose lifetimes may overlap
    never share bytes.

    ``allocs`` lists (allocation, alloc node, free node or None) in topological order of the
    alloc nodes; ``ancestors[n]`` is a bitset of n's ancestors, ``bit[n]`` n's own bit.
    """
    lives: dict[Range, list[tuple[Node, Node | None]]] = {}  # in order of first alloc
    for a, anode, fnode in allocs:
        lives.setdefault(a.range, []).append((anode, fnode))

    def disjoint(x: list[tuple[Node, Node | None]], y: list[tuple[Node, Node | None]]) -> bool:
        # one's free happens before the other's alloc, for every member of each
        return all((yf is not None and ancestors[xa] & bit[yf])
                   or (xf is not None and ancestors[ya] & bit[xf])
                   for xa, xf in x for ya, yf in y)

    placed: list[tuple[int, Range]] = []
    offsets: dict[Range, int] = {}
    footprint = 0
    for r, life in lives.items():
        busy = sorted((off, off + b.size) for off, b in placed if not disjoint(life, lives[b]))
        off = 0
        for lo, hi in busy:
            if off + r.size <= lo:
                break
            off = max(off, hi)
        offsets[r] = off
        placed.append((off, r))
        footprint = max(footprint, off + r.size)
    return offsets, footprint


def map_allocs(exec_: Any, device: Device, offsets: dict[Range, int], footprint: int) -> Any:
    """Back the ranges with one arena of ``footprint`` bytes; returns the arena's handle."""
    for r in offsets:
        if r.exec is not None and r.exec is not exec_ and not r.exec._destroyed:
            raise NotSupportedError(
                f"graph memory at {hex(r.ptr)} is already mapped by {r.exec!r}: a graph with "
                "memory nodes can have only one live executable graph at a time (destroy the "
                "other one first)"
            )
    if not offsets:
        return None
    base = device._impl.graph_map([(r.ptr, off, r.size) for r, off in offsets.items()], footprint)
    for r in offsets:
        r.exec = exec_
    device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) + footprint
    device.__dict__.setdefault("_execs", weakref.WeakSet()).add(exec_)  # for device reset
    return base


def unmap_allocs(exec_: Any, device: Device, allocs: list[GraphAlloc], base: Any,
                 footprint: int) -> None:
    """Destroying an exec: its allocations lose their backing; the arena goes back."""
    ranges: dict[Range, None] = {}
    for a in allocs:
        if a.range.exec is exec_ and a.device is device:
            ranges[a.range] = None
            if a.live:
                a.live = False
                _account(device, -a.size)
    for r in ranges:
        r.exec = None
    if base is not None:
        device._impl.graph_unmap([(r.ptr, 0, r.size) for r in ranges], base)
        device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) - footprint


def info(device: Device) -> dict[str, int]:
    """Graph memory of a device: bytes backing live execs and bytes of live allocations."""
    return {
        "reserved": device.__dict__.get("_graph_reserved", 0),
        "used": device.__dict__.get("_graph_used", 0),
    }
