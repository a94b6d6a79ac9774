"""The frontend's stream-ordered memory pool (DESIGN.md §3): blocks, frees, synchronize points.

:class:`ArenaPool` is the :class:`~streamrt.pool.mempool.MemPool` of a backend without pools of
its own (the cpu backend). It owns an :class:`~streamrt.pool.arena.Arena` (the address range and
its mapped granules, ``reserved`` being the mapped bytes) and the blocks that tile it; the reuse
decision is :func:`streamrt.pool.reuse.find` over this state.

State and invariants (all guarded by ``_lock``):
- ``_blocks`` (a :class:`~streamrt.pool.block.BlockList`) tiles ``[arena.base,
  arena.base + arena.top)``, each block linked to its neighbours. Free blocks may cross
  granule boundaries, so free space never stays split at a reservation edge.
- A block is live (allocated, in the registry's ``_owners``) or free. A free block is either
  *pending*: freed on stream F at position p (``block.stream``/``block.pos``), indexed in
  ``_pending[F.id]`` (``_pstream[F.id]`` is F; a pool with pending lists is in the registry's
  ``_busy``); or *ready*: its free was proven complete by a host synchronize (``block.stream is
  None``), indexed in ``_ready``. A synchronize promotes the pending blocks it proved. Live and
  pending blocks lie on mapped granules, except that a free may absorb a ready neighbour whose
  granules went back to the device (``arena.holes``); an allocation maps what it lands on.
- Frees coalesce (:func:`~streamrt.pool.block.coalesce`, which never loses ordering
  knowledge; with opportunistic reuse allowed, a free also takes the neighbours other streams
  freed whose free has run, ``_takes``: else frees on several streams leave memory in pieces
  no request fits), but the fast free path defers absorbing ready neighbours (``_dirty``)
  until a decision looks at sizes (``_settle``); an exact-size reuse on the fast path takes the block
  as it is, and ``stats()`` counts the deferred merges without making them, so observing the
  pool never changes where a later block goes.
- Placement: a request of at most 1 MiB takes the high end of its block, a larger one the low
  end, which keeps small and large blocks apart (:func:`~streamrt.pool.arena.landing`). When
  best fit picks a stream's newest pending block, the fast path splits it in place (the rest
  stays the newest), and a free whose only mergeable neighbour is that block merges into it in
  place: the layout, positions and counters are those of the general path.
- ``_seams[F.id]``: ready blocks that may lie next to a block pending on F (recorded whenever a
  ready or pending block is put into a free list next to the other kind; checked when used):
  the only places where a run of blocks F may merge before growing can start (reuse.py).
- ``_used`` is the bytes of live blocks (rounded to 512), as CUDA's USED_MEM_CURRENT ("in use by
  the application"); ``used <= reserved`` always. High watermarks only grow, and reset only to
  the current value. The step counters move only once an allocation succeeded (no copy of
  them to restore); ``live_allocations`` is ``alloc_count - free_count``.
- The release threshold is applied only at synchronize points, after promoting the frees the
  synchronize proved; ``trim_to`` releases down to its argument, whatever the threshold
  (release.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import instrument, legacy
from ..device import Device
from ..errors import InvalidAddressError, OutOfMemoryError
from ..sync import ran
from . import fast, release, reuse
from .arena import ALIGN, SMALL_REQUEST, Arena
from .arena_stats import COUNTERS, attr_of, stats_of
from .attrs import OPTIONS, MemPoolAttr
from .attrs import parse as parse_attr
from .block import Block, BlockList, coalesce, split
from .freelist import PendingList, ReadyList
from .mempool import MemPool
from .registry import _busy, _owners, _pools

if TYPE_CHECKING:
    from ..stream import Stream


class ArenaPool(MemPool):
    """A :class:`MemPool` run by the frontend (DESIGN.md §3) over an arena of the device."""

    native = False

    def __init__(self, device: Any = None, **options: Any) -> None:
        super().__init__(device, **options)
        self._arena = Arena(self.device._impl, self.max_size)
        self._blocks = BlockList(self._arena.granule)  # live and free, in address order
        self._by_addr = self._blocks.by_addr  # (one dict for the pool's life: cleared in place)
        self._dirty: set[Block] = set()  # fast-path frees not yet merged with ready neighbours
        self._ready = ReadyList(self._arena.granule)
        self._pending: dict[int, PendingList] = {}
        self._pstream: dict[int, Stream] = {}  # stream id -> stream, for pending lists
        self._seams: dict[int, set[Block]] = {}
        self._used = self._used_high = 0
        self._stats = dict.fromkeys(COUNTERS, 0)
        self._fast_allocs = self._fast_frees = 0  # counted apart: the fast paths stay short
        self._spare: Block | None = None  # a block the fast free absorbed, for the next split
        self._gone = 0  # live allocations forgotten by a device reset
        self.device._pools.add(self)
        _pools.add(self)

    @classmethod
    def _default(cls, device: Device) -> MemPool:
        pool = cls(device)
        pool._is_default = True
        return pool

    def _describe(self) -> str:
        return f"reserved={self._arena.reserved} used={self._used}"

    # -- attributes -------------------------------------------------------------------------
    def get_attr(self, attr: MemPoolAttr | int) -> int:
        """``cudaMemPoolGetAttribute``: flags as 0/1, sizes in bytes."""
        return attr_of(self, parse_attr(attr))

    def _store_attr(self, attr: MemPoolAttr, value: int) -> None:
        with self._lock:  # one write at a time: another thread's option change is not lost
            if attr in OPTIONS:
                self._opts = self._opts.with_attr(attr, value)
            elif attr is MemPoolAttr.RESERVED_MEM_HIGH:
                self._arena.reserved_high = self._arena.reserved
            else:
                self._used_high = self._used

    def _collect_stats(self) -> dict[str, Any]:
        """``stats()``: the counters of the frontend's reuse steps (every key documented there)."""
        with self._lock:
            return stats_of(self)

    # -- allocation -----------------------------------------------------------------------------
    _malloc = fast.malloc  # the fast paths (fast.py); the other cases:

    def _malloc_rest(self, stream: Stream, nbytes: int) -> int:
        """An allocation the fast paths do not make: capture, legacy ordering, checks."""
        self._check_alive()
        self._serves(stream)
        cap = stream._capture  # once: a capture another thread began after the fast-path test
        if cap is not None:
            return cap.malloc(stream, self, nbytes)  # type: ignore[no-any-return]
        size = (max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN
        if not stream.non_blocking:
            # The allocation is a stream operation, as the free is (see ``_free``): legacy
            # default-stream ordering applies before it (DESIGN.md §2, §3 step 3).
            legacy.order(stream)
        with self._lock:
            return self._alloc(stream, size, nbytes)

    def _alloc(self, stream: Stream, size: int, nbytes: int) -> int:
        """Allocate ``size`` bytes for ``stream`` by the reuse steps (the lock held)."""
        if self._dirty:
            self._settle()
        own = self._pending.get(stream.id)
        block = None
        if own is not None and own.count and not self._arena.holes:
            # step 1 as reuse.find would take it, without its set-up
            v = own.newest
            if not own.sizes and v is not None and v.size >= size:  # the only block
                block = v
                own.newest = v.fl = None
                own.count -= 1
            else:
                block = own.best(size)
                if block is not None:
                    own.remove(block)
            if block is not None:
                step = "reuse_same_stream"
        if block is None:
            block, step = reuse.find(self, stream, size, nbytes)
        if block.size > size:
            if size <= SMALL_REQUEST:  # small: the high end (see arena.landing)
                rest = block
                block = split(self._blocks, rest, rest.size - size)
            else:
                rest = split(self._blocks, block, size)
            self._insert_free(rest)
        if self._arena.holes:
            try:
                self._arena.map_range(block.addr, block.size)
            except OutOfMemoryError:  # the device itself is full (max_size was checked)
                block.live = False
                self._insert_free(coalesce(self._blocks, block))
                raise reuse.oom(self, nbytes, size, stream) from None
        block.live = True
        block.req = nbytes
        block.stream = None
        block.fresh = False  # used: once freed, its memory is reused memory
        _owners[block.addr] = self
        used = self._used = self._used + size
        if used > self._used_high:
            self._used_high = used
        st = self._stats
        st[step] += 1
        st["alloc_count"] += 1
        return block.addr

    def _check_range(self, ptr: int, nbytes: int) -> None:
        """The arena's ``check``: ``[ptr, ptr + nbytes)`` must lie in one live block."""
        with self._lock:
            b = self._blocks.holding(ptr)
            if b is None or not b.live or ptr + nbytes > b.addr + b.size:
                where = (f"its block [{hex(b.addr)}, {hex(b.addr + b.size)})" if b is not None
                         and b.live else "no live stream-ordered allocation")
                raise InvalidAddressError(
                    f"range {hex(ptr)}+{nbytes} is not inside one live pool allocation: "
                    f"{hex(ptr)} is in {where}"
                )

    # -- free lists and coalescing ----------------------------------------------------------------
    def _insert_free(self, b: Block) -> None:
        """Put free ``b`` into its list; note the seams it makes (see the module docstring)."""
        p, n = b.prev, b.next
        if b.stream is None:
            self._ready.add(b)
            if self._pending:
                for nb in (p, n):
                    if nb is not None and nb.stream is not None and not nb.live:
                        self._seam(nb.stream.id, b)
            return
        sid = b.stream.id
        fl = self._pending.get(sid)
        if fl is None:
            fl = self._pending[sid] = PendingList()
            self._pstream[sid] = b.stream
            _busy.add(self)  # work may still use its memory: not collectable until proven
        fl.add(b)
        if (p is not None and p.stream is None and not p.live) or (
                n is not None and n.stream is None and not n.live):
            for nb in (p, n):
                if nb is not None and nb.stream is None and not nb.live:
                    self._seam(sid, nb)

    def _seam(self, sid: int, ready: Block) -> None:
        seams = self._seams.get(sid)
        if seams is None:
            self._seams[sid] = {ready}
            return
        seams.add(ready)
        n = len(seams)
        if n >= 64 and not n & (n - 1):  # at each power of two: drop what no longer qualifies
            # (only growth on that stream looks at them: without this they would pile up)
            rl = self._ready
            seams -= {r for r in seams if r.fl is not rl or not any(
                nb is not None and not nb.live and nb.stream is not None and nb.stream.id == sid
                for nb in (r.prev, r.next))}

    def _settle(self) -> None:
        """Merge the blocks the fast free path left next to ready neighbours (before any
        decision that looks at block sizes: best fit, statistics, release)."""
        dirty, self._dirty = self._dirty, set()
        for b in sorted(dirty, key=lambda x: x.addr):  # address order: who absorbs a shared one
            if not b.live and b.stream is not None and self._blocks.get(b.addr) is b:
                b.fl.remove(b)
                self._insert_free(coalesce(self._blocks, b))

    # -- free -----------------------------------------------------------------------------------
    _free = fast.free  # the fast paths (fast.py); the other cases:

    def _free_rest(self, stream: Stream, ptr: int) -> None:
        """A free the fast paths do not make: capture, legacy ordering, checks."""
        self._frees_on(stream, ptr)
        cap = stream._capture  # once: a capture another thread began after the fast-path test
        if cap is not None:
            return cap.free(stream, ptr, self)  # type: ignore[no-any-return]
        if not stream.non_blocking:
            legacy.order(stream)  # the free is a stream operation: legacy ordering applies
        self._release_block(ptr, stream, stream._pos)

    def _free_now(self, ptr: int) -> None:
        self._release_block(ptr, None, 0)  # after a device synchronize: ready at once
        self._on_sync()

    def _release_block(self, ptr: int, stream: Stream | None, pos: int) -> None:
        with self._lock:
            b = self._blocks.get(ptr)
            if b is None or not b.live or _owners.get(ptr) is not self:
                raise InvalidAddressError(f"free of {hex(ptr)}: not a live allocation of {self!r}")
            self._free_block(b, ptr, stream, pos)
            if self._destroyed:
                release.destroyed_free(self)

    def _free_block(self, b: Block, ptr: int, stream: Stream | None, pos: int) -> None:
        """Free live ``b`` on ``stream`` at ``pos`` (None: ready), coalesced (the lock held)."""
        if self._dirty:
            self._settle()
        del _owners[ptr]
        b.live = False
        b.stream = stream
        clock = stream._snapshot() if stream is not None and instrument.listeners else None
        # with a clock, the position is the clock's own (a later one: the free waits no less);
        # ``pos`` read apart may precede a wait the clock already merged (see Stream._snapshot)
        b.pos = pos if clock is None else clock[stream.id]  # type: ignore[union-attr]
        b.clock = clock
        self._used -= b.size
        self._stats["free_count"] += 1
        self._insert_free(self._coalesce(b))

    def _takes(self, nb: Block) -> bool:
        """Whether a free of another stream's block next to free block ``nb``, pending, would
        absorb it (see ``coalesce``): the pool allows opportunistic reuse and its free has run."""
        return self._opts.reuse_allow_opportunistic and self._ran(nb)

    def _coalesce(self, b: Block) -> Block:
        """``coalesce(b)``, taking other streams' neighbours whose free has run (``_takes``) when
        the pool allows opportunistic reuse (their memory is then reusable without a dependency)."""
        return coalesce(self._blocks, b, self._ran if self._opts.reuse_allow_opportunistic else None)

    def _defers_past(self, far: Block | None, stream: Stream) -> bool:
        """Whether a fast free may leave the merge with its ready neighbour to ``_settle`` (which
        takes only same-tag blocks), given ``far``, the block beyond that neighbour: not when
        ``far`` is another stream's free that has run (the general path merges it too)."""
        return (far is None or far.live or far.stream is None or far.stream is stream
                or not self._takes(far))

    def _ran(self, nb: Block) -> bool:
        """Whether pending ``nb``'s free has run (``coalesce``'s test; ``_takes`` adds the flag)."""
        return ran(nb.stream) >= nb.pos  # type: ignore[arg-type]

    # -- lookups --------------------------------------------------------------------------------
    def _usable(self, ptr: int) -> int | None:
        b = self._blocks.get(ptr)
        return b.req if b is not None and b.live else None

    def _room(self, ptr: int) -> int | None:
        """Bytes from ``ptr`` to the end of the live block holding it (None: in no live block)."""
        with self._lock:
            b = self._blocks.holding(ptr)
            end = b.addr + b.req if b is not None and b.live else ptr
            return end - ptr if end > ptr else None

    # -- synchronize points, threshold, trim, destroy (release.py) --------------------------------
    def _on_sync(self) -> None:
        """Promote the frees a host synchronize proved, then apply the release threshold."""
        release.on_sync(self)

    def _release(self, keep: int) -> None:
        """Unmap granules of ready free blocks while ``reserved - granule >= keep``."""
        self._stats["release_count"] += self._arena.release(keep, self._ready.big)

    def _trim(self, keep: int) -> None:
        release.trim(self, keep)

    def _destroy(self) -> None:
        release.destroy(self)

    def _reset(self) -> None:
        release.reset(self)
