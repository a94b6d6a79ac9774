"""Graph memory (DESIGN.md §3): MEM_ALLOC addresses fixed at creation, physical sharing at instantiate.

State and invariants:
- A :class:`GraphAlloc` owns a range of addresses reserved by its device's backend from the
  moment its MEM_ALLOC node exists (the cpu address space; ``cuMemAddressReserve`` on cuda); the
  range has no memory behind it until an exec maps it. Accessing an unmapped range is an
  ``InvalidAddressError`` on cpu (an illegal address on a GPU).
- At instantiate, allocations whose lifetimes cannot overlap in any valid execution of the DAG
  (the free of one is an ancestor of the other's alloc) are packed at overlapping offsets of
  one arena (``cuMemCreate`` + ``cuMemMap`` on cuda); the exec's footprint is the arena size,
  close to the peak live bytes. Sizes and offsets are multiples of the backend's
  ``graph_granule`` (512 B on cpu, the VMM granularity, 2 MiB, on cuda).
- ``live`` is True from a launch that executed the alloc until a free (a MEM_FREE node of any
  graph, or ``s.free``). Launching again while it is live is refused unless the exec was
  instantiated with ``auto_free_on_launch``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..errors import InvalidAddressError, NotSupportedError, StreamRTError

if TYPE_CHECKING:
    from ..device import Device
    from .node import Node

# virtual address -> allocation, for every reserved graph allocation
_allocs: weakref.WeakValueDictionary[int, GraphAlloc] = weakref.WeakValueDictionary()


class GraphAlloc:
    """A graph allocation: a fixed virtual range, mapped by at most one live exec."""

    __slots__ = ("ptr", "nbytes", "size", "device", "live", "exec", "__weakref__")

    def __init__(self, device: Device, nbytes: int) -> None:
        impl = device._impl
        granule = impl.graph_granule
        self.nbytes = nbytes
        self.size = (max(nbytes, 1) + granule - 1) // granule * granule
        self.device = device
        self.ptr = impl.graph_reserve(self.size)
        self.live = False
        self.exec: Any = None  # the GraphExec mapping it, if any
        _allocs[self.ptr] = self
        weakref.finalize(self, impl.reclaim, _release, impl, self.ptr, self.size)

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


def map_allocs(exec_: Any, device: Device, offsets: dict[GraphAlloc, int], footprint: int) -> Any:
    """Back the allocations with one arena of ``footprint`` bytes; returns the arena's handle."""
    for a in offsets:
        if a.exec is not None and a.exec is not exec_ and not a.exec._destroyed:
            raise NotSupportedError(
                f"{a!r} is already mapped by {a.exec!r}: a graph with memory nodes can have only "
                "one live executable graph at a time (destroy the other one first)"
            )
    if not offsets:
        return None
    base = device._impl.graph_map([(a.ptr, off, a.size) for a, off in offsets.items()], footprint)
    for a in offsets:
        a.exec = exec_
    device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) + footprint
    device.__dict__.setdefault("_execs", weakref.WeakSet()).add(exec_)  # for device reset
    return base


def unmap_allocs(exec_: Any, device: Device, allocs: list[GraphAlloc], base: Any,
                 footprint: int) -> None:
    """Destroying an exec: its allocations lose their backing; the arena goes back."""
    mine = [a for a in allocs if a.exec is exec_ and a.device is device]
    for a in mine:
        a.exec = None
        if a.live:
            a.live = False
            _account(device, -a.size)
    if base is not None:
        device._impl.graph_unmap([(a.ptr, 0, a.size) for a in mine], base)
        device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) - footprint


def info(device: Device) -> dict[str, int]:
    """Graph memory of a device: bytes backing live execs and bytes of live allocations."""
    return {
        "reserved": device.__dict__.get("_graph_reserved", 0),
        "used": device.__dict__.get("_graph_used", 0),
    }
