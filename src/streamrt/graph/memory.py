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
- An exec's memory is an :class:`ExecMemory`, which its ranges refer to (not the exec). As in
  CUDA, destroying an exec does not free its live allocations: its memory, *retired*, stays
  mapped (in ``held``) until none of its allocations is live and the stream positions it must
  outlive (the last launch, the frees) have passed. An exec collected without ``destroy()``
  retires its memory the same way. Instantiating the graph again while its memory is held is
  refused with a clear error. A device reset releases it regardless.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidAddressError,
    InvalidValueError,
    NotSupportedError,
    OutOfMemoryError,
    StreamRTError,
)
from ..pool import registry
from ..pool.arena import ALIGN
from ..sync import sync_listeners
from .node import NodeType

if TYPE_CHECKING:
    from ..device import Device
    from .node import Node

Arena = tuple[Any, Any, int, list]  # (device, backend handle, footprint, the ranges it backs)

# virtual address -> allocation, for every reserved graph allocation
_allocs: weakref.WeakValueDictionary[int, GraphAlloc] = weakref.WeakValueDictionary()
# guards the mapping of ranges (which exec maps each) and destroyed execs' held arenas: frees
# and releases come from any thread
LOCK = threading.RLock()
held: set[ExecMemory] = set()  # retired memory still mapped (kept alive until released)


class Range:
    """Addresses reserved for graph memory: one large allocation's, or a slab of small ones."""

    __slots__ = ("ptr", "size", "device", "top", "owner", "__weakref__")

    def __init__(self, device: Device, size: int) -> None:
        impl = device._impl
        self.ptr = impl.graph_reserve(size)
        self.size = size
        self.device = device
        self.top = 0  # bytes of a slab handed out
        self.owner: ExecMemory | None = None  # the exec memory mapping it, if any
        weakref.finalize(self, impl.reclaim, _release, impl, self.ptr, size)


class GraphAlloc:
    """A graph allocation: fixed addresses in a range that at most one exec maps."""

    __slots__ = ("ptr", "nbytes", "size", "range", "device", "live", "__weakref__")

    def __init__(self, device: Device, nbytes: int, slabs: dict[Device, Range]) -> None:
        capacity = device._impl.capacity
        if nbytes > capacity:  # never mappable; reserving it would spill past the device's addresses
            raise OutOfMemoryError(f"graph allocation of {nbytes} bytes on {device.name}: more "
                                   f"than the device's {capacity} bytes")
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
        # what phase 2 and the sanitizer may use from ptr: the bytes asked for, not the rounding
        registry._requested[self.ptr] = nbytes
        weakref.finalize(self, _forget_requested, self.ptr, nbytes)

    def __repr__(self) -> str:
        return f"<GraphAlloc {hex(self.ptr)} {self.nbytes} B{' live' if self.live else ''}>"


def _forget_requested(ptr: int, nbytes: int) -> None:
    if registry._requested.get(ptr) == nbytes:  # (not a newer allocation's entry)
        del registry._requested[ptr]


def _release(impl: Any, ptr: int, size: int) -> None:
    try:
        impl.graph_release(ptr, size)
    except StreamRTError:
        pass  # at exit, or after a driver failure: the addresses go with the process


def find(ptr: int) -> GraphAlloc | None:
    """The graph allocation starting at ``ptr``, or None."""
    return _allocs.get(ptr)


def free_outside(ptr: int, stream: Any) -> None:
    """``s.free`` (``stream``) or ``srt.free`` (None, after a device synchronize) of graph memory
    after a launch: the allocation is no longer live."""
    a = _allocs.get(ptr)
    if a is None or not a.live:
        raise InvalidAddressError(f"free of {hex(ptr)}: graph allocation is not live (double free?)")
    freed(a, stream, 0 if stream is None else stream._pos)


def freed(a: GraphAlloc, stream: Any, pos: int) -> None:
    """``a`` is no longer live once ``stream`` passes ``pos`` (at once for None): retired memory
    held for it may now go (after ``pos``)."""
    with LOCK:
        a.live = False
        _account(a.device, -a.size)
        owner = a.range.owner
        if owner is not None and owner.retired:
            if stream is not None:
                owner.after.append((stream, pos))
            owner.release()


def _account(device: Device, delta: int) -> None:
    device._count_graph_memory(used=delta)


# -- a launch's graph memory, in its order: checked, auto-freed, reported, then acted on --------
def check_launch(mem_nodes: list[Node], allocs: list[GraphAlloc], auto_free: bool) -> None:
    """Refuse a launch that would reuse live graph memory, or free memory that is not live."""
    mine = {id(a) for a in allocs}
    for n in mem_nodes:
        a = n._params["alloc"]
        if n.type is NodeType.MEM_ALLOC:
            if a.live and not auto_free:
                raise InvalidValueError(
                    f"{a!r} from the previous launch was never freed: free it (s.free) or "
                    "instantiate with auto_free_on_launch=True"
                )
        elif id(a) not in mine and not a.live:
            raise InvalidValueError(f"{n!r} frees {a!r}, which is not live")


def auto_free(allocs: list[GraphAlloc]) -> list[GraphAlloc]:
    """Free the allocations the previous launch left live (``auto_free_on_launch``, as the next
    launch starts); returns them (the sanitizer ends their generation)."""
    freed = []
    for a in allocs:
        if a.live:
            a.live = False
            _account(a.device, -a.size)
            freed.append(a)
    return freed


def launch_events(mem_nodes: list[Node], where: dict[int, Any], auto_freed: list[GraphAlloc]
                  ) -> tuple:
    """What a launch does to graph memory, for the sanitizer: ``auto_freed`` are freed as it
    starts, then each memory node acts where it lies in the DAG (``where``: the plan's
    position of each node, by id)."""
    auto = [("auto-free", a.ptr, a.nbytes, -1, 0, "") for a in auto_freed]
    nodes = []
    for n in mem_nodes:
        a = n._params["alloc"]
        what = "alloc" if n.type is NodeType.MEM_ALLOC else "free"
        nodes.append((what, a.ptr, a.nbytes, *where[id(n)]))
    return (*auto, *nodes)


def launched(mem_nodes: list[Node], stream: Any) -> None:
    """After a launch is enqueued: its allocations are live, its frees stream-ordered frees."""
    for n in mem_nodes:
        a = n._params["alloc"]
        if n.type is NodeType.MEM_ALLOC:
            a.live = True
            _account(a.device, a.size)
        elif n.type is NodeType.MEM_FREE:
            freed(a, stream, stream._pos)


def order(nodes: list[Node], mem: list[Node]) -> tuple[list[Node], list[int]]:
    """The memory nodes ``mem`` of a graph of ``nodes`` (both in creation order) in topological
    order, and each node's memory-node ancestors: ``anc[node.index]``, a bitset by position in
    ``mem``.

    One pass of Kahn's algorithm, ties by creation order (as the replay plan orders nodes): the
    same order every instantiate of the graph takes. The bitsets hold memory nodes only, so they
    cost O(edges x memory nodes / 64) words, not the square of the graph (DESIGN.md §6)."""
    count = len(nodes)
    own = [0] * count  # a memory node's own bit
    for i, n in enumerate(mem):
        own[n.index] = 1 << i
    anc = [0] * count
    npred = [len(n._deps) for n in nodes]
    ready = [n for n in nodes if not n._deps]
    for n in ready:  # the list grows while it is walked: FIFO, as Kahn's queue
        i = n.index
        reach = anc[i] | own[i]
        for d in n._dependents:
            j = d.index
            if reach:
                anc[j] |= reach
            npred[j] -= 1
            if not npred[j]:
                ready.append(d)
    if len(ready) != count:  # the builder refuses cycles: an invariant, checked as before
        raise InvalidValueError("the graph has a cycle")
    return [n for n in ready if own[n.index]], anc


def pack(allocs: list[tuple[GraphAlloc, Node, Node | None]], ancestors: list[int],
         bit: dict[int, int]) -> tuple[dict[Range, int], int]:
    """First-fit offsets of the allocations' ranges such that ranges whose lifetimes may overlap
    never share bytes.

    ``allocs`` lists (allocation, alloc node, free node or None) in topological order of the
    alloc nodes; ``ancestors[n.index]`` is a bitset of n's memory-node ancestors, ``bit[id(n)]``
    a memory node's own bit (see :func:`order`).
    """
    lives: dict[Range, list[tuple[Node, Node | None]]] = {}  # in order of first alloc
    for a, anode, fnode in allocs:
        lives.setdefault(a.range, []).append((anode, fnode))

    def disjoint(x: list[tuple[Node, Node | None]], y: list[tuple[Node, Node | None]]) -> bool:
        # one's free happens before the other's alloc, for every member of each
        return all((yf is not None and ancestors[xa.index] & bit[id(yf)])
                   or (xf is not None and ancestors[ya.index] & bit[id(xf)])
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


class ExecMemory:
    """The graph memory one exec maps: its arenas and allocations, and once the exec is destroyed
    or collected (*retired*), the stream positions the memory must outlive."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arenas: list[Arena] = []
        self.allocs: list[GraphAlloc] = []
        self.retired = False
        self.after: list[tuple[Any, int]] = []

    def __repr__(self) -> str:
        return f"<graph memory of {self.name}{' (retired)' if self.retired else ''}>"

    def map(self, device: Device, offsets: dict[Range, int], footprint: int) -> None:
        """Back the ranges with one arena of ``footprint`` bytes."""
        with LOCK:
            for r in offsets:
                other = r.owner
                if other is None or other is self:
                    continue
                if not other.retired:
                    raise NotSupportedError(
                        f"graph memory at {hex(r.ptr)} is already mapped by {other!r}: a graph "
                        "with memory nodes can have only one live executable graph at a time "
                        "(destroy the other one first)")
                other.release()  # retired memory nobody needs any more goes now
                if r.owner is not None:
                    live = [a for a in other.allocs if a.live and a.range is r]
                    raise InvalidValueError(
                        f"graph memory at {hex(r.ptr)} is still held by {other!r}: "
                        + (f"{live[0]!r} is live (free it first, s.free)" if live else
                           "its last launch, or a free of its memory, has not run yet "
                           "(synchronize first)"))
            if not offsets:
                return
            base = device._impl.graph_map([(r.ptr, off, r.size) for r, off in offsets.items()],
                                          footprint)
            for r in offsets:
                r.owner = self
            self.arenas.append((device, base, footprint, list(offsets)))
        device._count_graph_memory(reserved=footprint)

    def retire(self, last: tuple[Any, int] | None) -> None:
        """The exec is destroyed or collected: the memory goes once nothing needs it."""
        with LOCK:
            if self.retired:
                return
            self.retired = True
            if not self.arenas:
                return
            held.add(self)
            if last is not None:
                self.after.append(last)
            self.release()

    def release(self, *, force: bool = False) -> None:
        """Unmap retired memory once no allocation of it is live (CUDA: a live graph allocation
        outlives its exec, until freed) and its last launch and the frees have run. Work still in
        flight would fail on that memory: as cudaGraphExecDestroy does, it then goes later, at
        the host synchronize that proves that work (a ``sync_listeners`` hook, as pools release
        memory), so a program that synchronized never sees it mapped. ``force``: a reset."""
        with LOCK:
            if not self.arenas:
                return
            if not force:
                if any(a.live for a in self.allocs):
                    return  # the allocation's free calls this again
                self.after = [(s, p) for s, p in self.after if s._q.done < p]
                if self.after:
                    return  # a later synchronize calls this again
            arenas, self.arenas = self.arenas, []
            held.discard(self)
            for arena in arenas:
                try:
                    self._unmap(arena)
                except StreamRTError:
                    pass  # the device was reset meanwhile: its memory is already gone

    def _unmap(self, arena: Arena) -> None:
        # the allocations lose their backing (any still live is no longer: a device reset)
        device, base, footprint, ranges = arena
        mine = set(ranges)
        for a in self.allocs:
            if a.range in mine and a.live:
                a.live = False
                _account(device, -a.size)
        for r in ranges:
            r.owner = None
        if base is not None:
            device._count_graph_memory(reserved=-footprint)
            device._impl.graph_unmap([(r.ptr, 0, r.size) for r in ranges], base)


def trim(device: Device) -> None:
    """``cudaDeviceGraphMemTrim``: retired memory of ``device`` whose work has run (its last
    launch and the frees it waits for are done: the queues' counts, no synchronize) and none of
    whose allocations is live goes now; the rest stays until it may."""
    with LOCK:
        mine = [mem for mem in held if any(arena[0] is device for arena in mem.arenas)]
    for mem in mine:
        mem.release()


def _on_sync(device: Device) -> None:
    """A host synchronize: retired memory whose work it proved goes now."""
    if held:
        for mem in list(held):
            mem.release()


sync_listeners.append(_on_sync)
