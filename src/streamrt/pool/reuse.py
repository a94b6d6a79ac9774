"""The reuse decision of DESIGN.md §3, steps 1-7, for :class:`~streamrt.pool.MemPool`.

Mixed into the pool (its state, under its lock): each step looks for the best-fit block it
may use, skipping blocks whose unmapped granules could not be mapped under ``max_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import OutOfMemoryError
from .arena import ALIGN
from .freelist import Block as _Block

if TYPE_CHECKING:
    from ..stream import Stream


class ReuseMixin:
    """Steps 1-7 of a stream-ordered allocation (see the module docstring)."""

    def _find(self, a: Stream, size: int, requested: int) -> _Block:
        st = self._stats
        own = self._pending.get(a.id)
        ok = (lambda blk: self._mappable(blk, size)) if self._holes else None
        if own is not None:
            b = own.best(size, ok)
            if b is not None:
                own.remove(b)
                st["reuse_same_stream"] += 1
                return b
        b = self._ready.best(size, ok)
        if b is not None:
            self._ready.remove(b)
            st["reuse_after_sync"] += 1
            return b
        others = [(sid, fl) for sid, fl in self._pending.items() if sid != a.id and fl.count]
        if others and self._opts.reuse_follow_event_dependencies:
            clock = a._clock
            b = self._best_of(others, size, lambda sid: clock.get(sid, 0))
            if b is not None:
                st["reuse_event_dependency"] += 1
                return b
        if others and self._opts.reuse_allow_opportunistic:
            b = self._best_of(others, size, lambda sid: self._pstream[sid]._q.done)
            if b is not None:
                st["reuse_opportunistic"] += 1
                return b
        b = self._merge_for(a, size)
        if b is not None:
            st["reuse_merged"] += 1
            return b
        b = self._grow(a, size)
        if b is not None:
            st["grow_count"] += 1
            return b
        if others and self._opts.reuse_allow_internal_dependencies:
            b = self._best_of(others, size, None)
            if b is not None:
                f = b.stream
                # a real wait: later work on A follows the free (and what the free followed)
                a._order_after(f, b.pos, b.clock or {f.id: b.pos})
                st["reuse_internal_dependency"] += 1
                return b
        raise self._oom(requested, size)

    def _oom(self, requested: int, size: int) -> OutOfMemoryError:
        self._stats["oom_count"] += 1
        limit = f"max_size {self.max_size}" if self.max_size else "no pool limit"
        free, total = self.device.memory_info()
        return OutOfMemoryError(
            f"{self.device.name}: stream-ordered allocation of {requested} bytes ({size} after "
            f"rounding to {ALIGN}) failed: pool reserves "
            f"{self._reserved} bytes ({self._used} used), {limit}; device has {free} of {total} "
            "bytes free"
        )

    def _merge_for(self, a: Stream, size: int) -> _Block | None:
        """Before growing: merge the smallest run of adjacent blocks, each ready or freed on
        ``a``, that fits ``size``. Both kinds are usable by ``a`` (steps 1-2), so the merged
        block is tagged as freed on ``a`` (it must not become usable by other streams)."""
        best: list[_Block] | None = None
        best_size = 0
        run: list[_Block] = []
        total = 0
        for b in self._blocks.values():  # address order; a live block ends a run
            if not b.live and (b.stream is None or b.stream is a):
                run.append(b)
                total += b.size
                while total - run[0].size >= size:  # shortest run ending here
                    total -= run.pop(0).size
                if total >= size and len(run) > 1 and (best is None or total < best_size):
                    best, best_size = list(run), total
            else:
                run, total = [], 0
        if best is None:
            return None
        off = best[0].addr - self._arena  # the allocation takes the run's first bytes
        if self._holes and self.max_size and self._reserved + self._granule * len(
                self._missing(off, off + size)) > self.max_size:
            return None  # it could not map what it would land on
        pieces = [(b.addr, b.size, b.stream, b.pos) for b in best]
        for b in best:
            self._remove_free(b)
        lo = best[0]
        lo.pos = max((b.pos for b in best if b.stream is a), default=0)
        lo.stream = a
        for hi in best[1:]:
            lo.size += hi.size
            lo.next = hi.next
            if hi.next is not None:
                hi.next.prev = lo
            del self._blocks[hi.addr]
            hi.stream = None
        # give the part past the request back with its original tags (ready stays ready)
        end = lo.addr + lo.size
        lo.size = size
        parts: list[list] = []
        for addr, psize, stream, pos in pieces:
            start = max(addr, lo.addr + size)
            if start >= addr + psize:
                continue
            if parts and parts[-1][2] is stream:  # same kind next to each other: one block
                parts[-1][1] = addr + psize - parts[-1][0]
                parts[-1][3] = max(parts[-1][3], pos)
            else:
                parts.append([start, addr + psize - start, stream, pos])
        tail = lo
        created = []
        for start, psize, stream, pos in parts:
            rest = _Block(start, psize, lo.chunk)
            rest.stream, rest.pos = stream, pos
            rest.prev, rest.next = tail, tail.next
            if tail.next is not None:
                tail.next.prev = rest
            tail.next = rest
            self._blocks[start] = rest
            created.append(rest)
            tail = rest
        assert tail.addr + tail.size == end
        lo.live = True  # taken: the pieces must not coalesce back into it
        for r in created:
            self._insert_free(self._coalesce(r))
        return lo

    def _best_of(self, others: list, size: int, limit_of: Any) -> _Block | None:
        best: _Block | None = None
        for sid, fl in others:
            if limit_of is None:
                b = fl.best(size, (lambda blk: self._mappable(blk, size)) if self._holes else None)
            else:
                lim = limit_of(sid)
                b = fl.best(size, lambda blk, lim=lim: blk.pos <= lim and (
                    not self._holes or self._mappable(blk, size)))
            if b is not None and (best is None or b.size < best.size):
                best = b
        if best is not None:
            self._pending[best.stream.id].remove(best)
        return best
