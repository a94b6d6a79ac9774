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
- As in CUDA, destroying an exec does not free its live allocations: a destroyed exec keeps
  its arenas (``held``) until none of its allocations is live and the stream positions they
  must outlive (its last launch, the frees) have passed. Instantiating the graph again while
  they are held is refused with a clear error. A device reset releases them regardless.
- A range refers to its exec weakly; a live allocation holds its exec, so an exec is collected
  only with no live allocation, and its memory then goes with it (after its last launch).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..arena import ALIGN
from ..errors import InvalidAddressError, InvalidValueError, NotSupportedError, StreamRTError

if TYPE_CHECKING:
    from ..device import Device
    from .node import Node

Arena = tuple[Any, Any, int, list]  # (device, backend handle, footprint, the ranges it backs)

# virtual address -> allocation, for every reserved graph allocation
_allocs: weakref.WeakValueDictionary[int, GraphAlloc] = weakref.WeakValueDictionary()
# guards the mapping of ranges (which exec maps each) and destroyed execs' held arenas: frees
# and releases come from any thread
LOCK = threading.RLock()
held: set[Any] = set()  # destroyed execs still holding memory (kept alive until released)


class Range:
    """Addresses reserved for graph memory: one large allocation's, or a slab of small ones."""

    __slots__ = ("ptr", "size", "device", "top", "_exec", "__weakref__")

    def __init__(self, device: Device, size: int) -> None:
        impl = device._impl
        self.ptr = impl.graph_reserve(size)
        self.size = size
        self.device = device
        self.top = 0  # bytes of a slab handed out
        self._exec: Any = None  # a weak reference to the GraphExec mapping it, if any
        weakref.finalize(self, impl.reclaim, _release, impl, self.ptr, size)

    @property
    def exec(self) -> Any:
        """The GraphExec mapping the range, or None."""
        return None if self._exec is None else self._exec()

    @exec.setter
    def exec(self, exec_: Any) -> None:
        self._exec = None if exec_ is None else weakref.ref(exec_)


class GraphAlloc:
    """A graph allocation: fixed addresses in a range that at most one exec maps."""

    __slots__ = ("ptr", "nbytes", "size", "range", "device", "live", "holder", "__weakref__")

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
        self.holder: Any = None  # while live: the exec whose memory it is (kept alive by it)
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


def free_outside(ptr: int, stream: Any) -> None:
    """``s.free`` of graph memory after a launch: the allocation is no longer live."""
    a = _allocs.get(ptr)
    if a is None or not a.live:
        raise InvalidAddressError(f"free of {hex(ptr)}: graph allocation is not live (double free?)")
    freed(a, stream, stream._pos)


def freed(a: GraphAlloc, stream: Any, pos: int) -> None:
    """``a`` is no longer live once ``stream`` passes ``pos``: if a destroyed exec held its
    memory for it, that exec may now let its memory go (after ``pos``)."""
    with LOCK:
        a.live = False
        a.holder = None
        _account(a.device, -a.size)
        owner = a.range.exec
        if owner is not None and owner._destroyed:
            owner._after.append((stream, pos))
    if owner is not None and owner._destroyed:
        owner._release()


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
    with LOCK:
        for r in offsets:
            other = r.exec
            if other is None or other is exec_:
                continue
            if not other._destroyed:
                raise NotSupportedError(
                    f"graph memory at {hex(r.ptr)} is already mapped by {other!r}: a graph with "
                    "memory nodes can have only one live executable graph at a time (destroy the "
                    "other one first)"
                )
            other._release()  # a destroyed exec whose memory nobody needs lets go now
            if r.exec is not None:
                live = [a for a in other._allocs if a.live and a.range is r]
                raise InvalidValueError(
                    f"graph memory at {hex(r.ptr)} is still held by destroyed {other!r}: "
                    + (f"{live[0]!r} is live (free it first, s.free)" if live else
                       "its last launch, or a free of its memory, has not run yet (synchronize "
                       "first)"))
        if not offsets:
            return None
        base = device._impl.graph_map([(r.ptr, off, r.size) for r, off in offsets.items()],
                                      footprint)
        for r in offsets:
            r.exec = exec_
    device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) + footprint
    device.__dict__.setdefault("_execs", weakref.WeakSet()).add(exec_)  # for device reset
    return base


def unmap_allocs(arena: Arena, allocs: list[GraphAlloc]) -> None:
    """An exec's memory goes: its allocations lose their backing (any still live is no longer:
    a device reset), and the arena goes back. Call holding ``LOCK``."""
    device, base, footprint, ranges = arena
    mine = set(ranges)
    for a in allocs:
        if a.range in mine and a.live:
            a.live = False
            a.holder = None
            _account(device, -a.size)
    for r in ranges:
        r.exec = None
    if base is not None:
        device.__dict__["_graph_reserved"] = device.__dict__.get("_graph_reserved", 0) - footprint
        device._impl.graph_unmap([(r.ptr, 0, r.size) for r in ranges], base)


def release_later(arenas: list[Arena], allocs: list[GraphAlloc], after: tuple[Any, int] | None,
                  *, name: str = "streamrt-graph-release") -> None:
    """Unmap ``arenas`` once ``after`` (a stream and position) has run: at once if it has,
    else from a thread of its own (a pool worker could be needed by that very launch)."""
    def unmap() -> None:
        with LOCK:
            for arena in arenas:
                try:
                    unmap_allocs(arena, allocs)
                except StreamRTError:
                    pass  # the device was reset meanwhile: its memory is already gone

    if after is None or after[0]._q.done >= after[1]:
        unmap()
        return

    def wait_then_unmap() -> None:
        after[0]._q.wait_done(after[1])
        unmap()

    threading.Thread(target=wait_then_unmap, name=name, daemon=True).start()


def info(device: Device) -> dict[str, int]:
    """Graph memory of a device: bytes backing live execs and bytes of live allocations."""
    return {
        "reserved": device.__dict__.get("_graph_reserved", 0),
        "used": device.__dict__.get("_graph_used", 0),
    }
