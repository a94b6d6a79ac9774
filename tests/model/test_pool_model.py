"""Property test: random malloc/free/record/wait/synchronize programs over 2-3 streams, checked
against a small reference model of the rules of DESIGN.md §2-3, with delay injection on.

The model keeps its own vector clocks (``pos``, ``clock``, ``host`` per stream) and the freed
address ranges with their free tag ``(stream, position)``. Every allocation must justify the
step counter it moved: a reused byte was freed on the allocating stream (step 1), or proven by
a host synchronize (2), or ordered by events (3, flag on), or already executed (4, flag on),
or the allocating stream now really waits for it (6, flag on); a grown block is fresh memory
or extends a free block the allocating stream may use (freed on it, or proven). Memory a host
synchronize proved free is reusable by any step: a free absorbs proven-free neighbours; with
opportunistic reuse on, memory whose free has run is too (a free absorbs such neighbours of
other streams).
Placement (best fit): before each allocation the model reads the pool's block boundaries and
vets them (live blocks are exactly the model's allocations, each free block's tag covers the
unproven frees inside it, neighbours that may coalesce have); then the block taken must be
reusable at the step the pool counted, no fitting block may have been reusable at an earlier
step, and none reusable at the same step may be smaller (ties and the end of the block a piece
is cut from are not specified by DESIGN.md, so not checked); memory a synchronize released
(unmapped granules) is taken again only when no step has a block landing on mapped memory.
Every owner writes its tag into its block, and the free is preceded by a check on the freeing
stream that the block still holds that tag: a reuse that jumped the order shows up as data.
Hand-offs (free on F, an event of F waited on by A, malloc on A) exercise event-dependency reuse,
also with the event one operation short of the free; after a device synchronize, only granules
under live blocks (or kept by the release threshold) may stay reserved.
"""

from __future__ import annotations

import bisect
import itertools
import threading

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import streamrt as srt
from streamrt.backends import cpu
from streamrt.pool.arena import landing
from streamrt.sync import ran
from tests.conftest import no_sanitizer

ALIGN = 512
SIZES = [1, 4096, 300_000, (1 << 20) + 1, 2 << 20, 2 << 20, 3 << 20]
REUSE = (
    "reuse_same_stream", "reuse_after_sync", "reuse_event_dependency", "reuse_opportunistic",
    "reuse_internal_dependency", "reuse_merged",
)
STEPS = (*REUSE, "fresh_count", "grow_count")
# reuse rules whose block is a pending free: every byte of it was freed by the program
PENDING_RULES = {
    "reuse_same_stream", "reuse_event_dependency", "reuse_opportunistic",
    "reuse_internal_dependency",
}


# DESIGN.md §3's order of the steps (reuse_merged is the pool's own: before growing, it merges
# adjacent blocks that the allocating stream may use)
RANK = {
    "reuse_same_stream": 1, "reuse_after_sync": 2, "fresh_count": 2, "reuse_event_dependency": 3,
    "reuse_opportunistic": 4, "reuse_merged": 4.5, "grow_count": 5, "reuse_internal_dependency": 6,
}
REUSE_STEPS = (1, 2, 3, 4, 6)  # the steps that take one existing free block

# an index into a list that changes during the run (drawn as a plain int: ``st.data()`` draws
# would trip Hypothesis' check on the global ``random`` state, which the cpu workers' delay
# injection uses from other threads)
PICK = st.integers(0, 255)


def rounded(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


@srt.kernel
def fill_kernel(ctx, ptr, n, tag):
    ctx.array(ptr, (n,), np.uint8)[:] = tag


@srt.kernel
def check_kernel(ctx, ptr, n, tag, errors):
    """The owner's last use before its free: the block must still hold the owner's tag."""
    seen = ctx.array(ptr, (n,), np.uint8, readonly=True)
    if not (seen == tag).all():
        errors.append(f"block {hex(ptr)} (+{n}) of tag {tag} was overwritten by another owner")


def _mapped_run(lo: int, n: int, mapped: set[int], gr: int) -> int:
    """The longest part of arena offsets ``[lo, lo + n)`` lying on mapped granules of ``gr``."""
    best = run = 0
    for g in range(lo // gr * gr, lo + n, gr):
        part = min(g + gr, lo + n) - max(g, lo)
        run = run + part if g in mapped else 0
        best = max(best, run)
    return best


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dev = srt.Device("cpu:0")
        self.prev_delay = cpu.set_delay_us(200)
        self.pool: srt.MemPool | None = None
        self.streams: list[srt.Stream] = []
        self.errors: list[str] = []
        self.tags = itertools.cycle(range(1, 256))
        self.live: dict[int, tuple[int, int, int, int]] = {}  # ptr -> (rsize, size, owner, tag)
        self.freed: list[tuple[int, int, int, int]] = []  # (lo, hi, stream, free position)
        self.events: list[tuple[srt.Event, int, int, dict[int, int]]] = []
        self.mallocs = self.frees = 0

    # -- model helpers --------------------------------------------------------------------
    def s(self, i: int) -> tuple[int, srt.Stream]:
        i %= len(self.streams)
        return i, self.streams[i]

    def enqueued(self, i: int) -> None:
        self.pos[i] += 1
        assert self.streams[i]._pos == self.pos[i]

    def merge(self, i: int, clock: dict[int, int]) -> None:
        mine = self.clock[i]
        for t, p in clock.items():
            if p > mine.get(t, 0):
                mine[t] = p

    def ran_past(self, f: int, q: int) -> bool:
        """Whether stream ``f``'s free at ``q`` has run and the pool may reuse it without a
        dependency (opportunistic reuse on): its memory is then as reusable as a proven free's
        for whoever may take the block it was merged into."""
        return bool(self.pool.reuse_allow_opportunistic) and ran(self.streams[f]) >= q

    def lands_mapped(self, b: tuple, rsize: int) -> bool:
        """Whether an allocation of ``rsize`` placed in free block ``b`` lands on mapped memory
        (as of the last ``free_blocks``)."""
        base, gr, mapped = self._arena
        off = b[0] - base
        lo, hi = landing(off, off + b[1], rsize)
        return all(g in mapped for g in range(lo // gr * gr, hi, gr))

    def proved(self, i: int, p: int, clock: dict[int, int]) -> None:
        self.host[i] = max(self.host[i], p)
        for t, q in clock.items():
            self.host[t] = max(self.host[t], q)

    def record(self, i: int) -> tuple[srt.Event, int, int, dict[int, int]]:
        e = self.streams[i].record()
        snap = dict(self.clock[i])
        snap[i] = self.pos[i]
        ev = (e, i, self.pos[i], snap)
        self.events = [*self.events[-7:], ev]
        return ev

    def wait(self, i: int, ev: tuple) -> None:
        e, j, p, snap = ev
        self.streams[i].wait(e)
        if j != i and self.clock[i].get(j, 0) < p:
            self.merge(i, snap)
            self.enqueued(i)  # a real wait op

    # -- the pool's free blocks, as the model sees them -----------------------------------------
    def free_blocks(self) -> list[tuple[int, int, tuple[int, int] | None, bool]]:
        """The pool's free blocks in address order, as ``(addr, size, tag, usable)``: ``tag`` is
        ``(freeing stream, position)``, None for a ready block; ``usable`` is False for a block
        over granules a synchronize released (under ``max_size`` the pool may have to skip it).
        Only the boundaries come from the pool, with the merges the fast free path defers made
        first (as any allocation but an exact-size reuse makes them); the rest is checked
        against the model."""
        pool = self.pool
        index = {s.id: i for i, s in enumerate(self.streams)}
        largest = pool.stats()["largest_free_block"]  # counts the deferred merges, not made
        with pool._lock:
            pool._settle()
            raw = [(b.addr, b.size, b.live, None if b.stream is None else index[b.stream.id],
                    b.pos) for b in pool._blocks.values()]
            mapped, base, gr = set(pool._arena.mapped), pool._arena.base, pool._arena.granule
        self._arena = (base, gr, mapped)
        assert largest == max([_mapped_run(a - base, n, mapped, gr) for a, n, live, *_ in raw
                               if not live], default=0), (
            "largest_free_block is not the largest run of memory (mapped) in one free block, once "
            "the deferred merges are made")
        assert {a: n for a, n, live, _, _ in raw if live} == {
            p: r[0] for p, r in self.live.items()}, "the pool's live blocks are not the allocations"
        tags = {a: None if f is None else (f, p) for a, _, live, f, p in raw if not live}
        starts = [a for a, *_ in raw]
        for lo, hi, f, q in self.freed:  # a tag must cover every unproven free inside its block
            if self.host[f] >= q or self.ran_past(f, q):  # (run: any block may have taken it)
                continue
            for a, n, *_ in raw[bisect.bisect_right(starts, lo) - 1:bisect.bisect_left(starts, hi)]:
                tag = tags[a]
                assert tag is not None and tag[0] == f and q <= tag[1] <= self.pos[f], (
                    f"{show((a, n, tag))} holds memory freed on stream {f} at {q}, unproven")
        blocks = [(a, n, tags[a], not pool.max_size or all(g in mapped for g in range(
            (a - base) // gr * gr, a + n - base, gr))) for a, n, live, _, _ in raw
            if not live]
        for x, y in zip(blocks, blocks[1:]):  # coalesced on free, unless their tags differ
            if x[0] + x[1] == y[0]:  # (a ready block next to a pending one: promoted later)
                assert (x[2] is None) != (y[2] is None) or (x[2] and x[2][0] != y[2][0]), (
                    f"free neighbours did not coalesce: {show(x)}, {show(y)}")
        return blocks

    def steps_for(self, i: int, tag: tuple[int, int] | None, clock: dict[int, int],
                  done: list[int]) -> set[int]:
        """The steps of DESIGN.md §3 at which stream ``i`` (vector clock ``clock``) may take a
        free block tagged ``tag``, when the streams have executed ``done`` operations."""
        if tag is None:
            return {2}
        f, p = tag
        if f == i:
            return {1, 2} if self.host[f] >= p else {1}
        return {step for step, ok in (
            (2, self.host[f] >= p),
            (3, self.pool.reuse_follow_event_dependencies and clock.get(f, 0) >= p),
            (4, self.pool.reuse_allow_opportunistic and done[f] >= p),
            (6, self.pool.reuse_allow_internal_dependencies)) if ok}

    def check_placement(self, i: int, step: str, ptr: int, rsize: int, blocks: list,
                        clock: dict[int, int], done: list[int]) -> None:
        """DESIGN.md §3: the first step with a fitting block wins, and within it the closest size
        (``blocks``, ``clock`` and ``done`` as they were before the allocation)."""
        k = RANK[step]
        fits = [b for b in blocks if b[1] >= rsize and b[3]]
        taken = next((b for b in blocks if b[0] <= ptr and ptr + rsize <= b[0] + b[1]), None)
        # steps 1-4 take memory a synchronize released (mapping it again) only when none has a
        # block landing on mapped memory; the later steps come after both
        tier = (0 if taken is not None and self.lands_mapped(taken, rsize) else 1) if k <= 4 else 2
        for b in fits:
            bt = 0 if self.lands_mapped(b, rsize) else 1
            for first in sorted(self.steps_for(i, b[2], clock, done)):
                if first > 4:
                    assert first >= k, f"{step}, but {show(b)} fitted at step {first}"
                else:
                    assert (bt, first) >= (tier, k), (
                        f"{step}, but {show(b)} fitted at step {first}"
                        f"{'' if bt == tier else ' on mapped memory'}")
        if k not in REUSE_STEPS:
            return
        assert taken is not None, f"{step}: {hex(ptr)}+{rsize} is not inside one free block"
        now = [ran(t) for t in self.streams]  # a later count may only add step-4 blocks
        assert k in self.steps_for(i, taken[2], clock, now), f"{step} may not take {show(taken)}"
        closer = [b for b in fits if b[1] < taken[1] and k in self.steps_for(i, b[2], clock, done)
                  and (k > 4 or (0 if self.lands_mapped(b, rsize) else 1) == tier)]
        assert not closer, (
            f"{step}: not best fit for {rsize}: took {show(taken)}, {show(closer[0])} fits closer")

    # -- setup ------------------------------------------------------------------------------
    @initialize(
        n=st.integers(2, 3),
        follow=st.booleans(),
        opportunistic=st.booleans(),
        internal=st.booleans(),
        threshold=st.sampled_from([0, 4 << 20, 1 << 30]),
        limit=st.sampled_from([0, 6 << 20, (1 << 20) + (8 << 10)]),  # the last: a small granule
    )
    def setup(self, n, follow, opportunistic, internal, threshold, limit):
        self.pool = srt.MemPool(
            self.dev, max_size=limit, release_threshold=threshold,
            reuse_follow_event_dependencies=follow, reuse_allow_opportunistic=opportunistic,
            reuse_allow_internal_dependencies=internal,
        )
        self.streams = [srt.Stream(self.dev, non_blocking=True) for _ in range(n)]
        self.pos = [0] * n
        self.host = [0] * n
        self.clock: list[dict[int, int]] = [{} for _ in range(n)]

    # -- rules --------------------------------------------------------------------------------
    @rule(si=st.integers(0, 2), size=st.sampled_from(SIZES))
    def malloc(self, si, size):
        i, s = self.s(si)
        pool = self.pool
        rsize = rounded(size)
        before = pool.stats()
        blocks = self.free_blocks()
        clock_before = dict(self.clock[i])
        real_before = dict(s._clock)
        done_before = [ran(t) for t in self.streams]
        try:
            ptr = s.malloc(size, pool)
        except srt.OutOfMemoryError:
            after = pool.stats()
            assert after["oom_count"] == before["oom_count"] + 1
            del after["oom_count"], before["oom_count"]
            assert after == before  # a failed allocation changes nothing
            assert not [b for b in blocks if b[1] >= rsize and b[3] and self.steps_for(
                i, b[2], clock_before, done_before)], "out of memory while a usable block fitted"
            gr = pool._arena.granule  # memory is mapped by whole granules
            assert pool.max_size and before["reserved_mem_current"] + -(-rsize // gr) * gr > \
                pool.max_size
            # (a free block as large may exist: one whose memory went back to the device at a
            # synchronize cannot be mapped again past max_size)
            assert s._pos == self.pos[i]
            return
        after = pool.stats()
        self.mallocs += 1
        moved = [k for k in STEPS if after[k] != before[k]]
        assert len(moved) == 1 and after[moved[0]] == before[moved[0]] + 1, moved
        step = moved[0]
        self.check_placement(i, step, ptr, rsize, blocks, clock_before, done_before)
        lo, hi = ptr, ptr + rsize
        assert ptr % ALIGN == 0
        for p, (n, _, _, _) in self.live.items():
            assert hi <= p or p + n <= lo, "two live allocations overlap"
        overlap = [r for r in self.freed if r[0] < hi and lo < r[1]]
        # fresh: a ready block no allocation ever used (the rest of a grown chunk)
        assert step != "fresh_count" or not overlap, "a fresh allocation landed on freed memory"
        for _, _, f, p in overlap:
            if self.host[f] >= p or self.ran_past(f, p):
                continue  # proven free by a host synchronize (or run): usable whatever the step
            if step == "grow_count":
                assert f == i, "a grown block took memory another stream may still use"
            elif step == "reuse_same_stream":
                assert f == i
            elif step == "reuse_after_sync":
                assert self.host[f] >= p, "reused before a host synchronize proved the free"
            elif step == "reuse_merged":  # adjacent pieces freed on this stream or proven
                assert f == i or self.host[f] >= p, "merged a block another stream may still use"
            elif step == "reuse_event_dependency":
                assert pool.reuse_follow_event_dependencies
                assert clock_before.get(f, 0) >= p, "no event orders the free before the malloc"
            elif step == "reuse_opportunistic":
                assert pool.reuse_allow_opportunistic
                assert ran(self.streams[f]) >= p, "the free had not executed"
            elif step == "reuse_internal_dependency":
                assert pool.reuse_allow_internal_dependencies
                assert f != i
        if step == "reuse_internal_dependency":
            # one pending block, freed on one stream; it may also hold proven or fresh memory
            changed = [j for j, t in enumerate(self.streams)
                       if s._clock.get(t.id, 0) > real_before.get(t.id, 0)]
            unproven = [r for r in overlap if self.host[r[2]] < r[3] and not self.ran_past(r[2], r[3])]
            assert len(changed) <= 1 and len({r[2] for r in unproven} | set(changed)) <= 1
            owners = changed or sorted({r[2] for r in unproven})
            if owners:  # else the wait was already implied by the clock
                (f,) = owners
                real = s._clock.get(self.streams[f].id, 0)
                assert max((r[3] for r in unproven), default=0) <= real <= self.pos[f]
                self.merge(i, {f: real})
            self.enqueued(i)  # the pool enqueued a real wait on the allocating stream
        assert s._pos == self.pos[i]
        self.freed = [piece for r in self.freed for piece in _subtract(r, lo, hi)]
        tag = next(self.tags)
        s.launch(fill_kernel, ptr, size, tag)  # the new owner writes at once
        self.enqueued(i)
        self.live[ptr] = (rsize, size, i, tag)

    # (no ``precondition`` on ``self.live``: whether an allocation ran out of memory may depend on
    # timing, through opportunistic reuse, and Hypothesis needs the same rules enabled on replay:
    # else it reports FlakyStrategyDefinition)
    @rule(pick=PICK, via=st.integers(0, 2))
    def free(self, pick, via):
        if self.live:
            self.free_ptr(sorted(self.live)[pick % len(self.live)], via)

    def free_ptr(self, ptr: int, via: int, early: list | None = None) -> int:
        """Free ``ptr`` on stream ``via`` after a last use there; returns the freeing stream.
        ``early`` receives an event recorded just before that last use (it does not cover
        the free)."""
        rsize, size, owner, tag = self.live.pop(ptr)
        f, fs = self.s(via)
        if f != owner:  # a correct program orders the freeing stream after the owner's work
            self.wait(f, self.record(owner))
        if early is not None:
            early.append(self.record(f))
        fs.launch(check_kernel, ptr, size, tag, self.errors)  # the owner's pending last use
        self.enqueued(f)
        before = self.pool.stats()
        fs.free(ptr)
        after = self.pool.stats()
        assert after["free_count"] == before["free_count"] + 1
        assert after["used_mem_current"] == before["used_mem_current"] - rsize
        assert fs._pos == self.pos[f]
        self.frees += 1
        self.freed.append((ptr, ptr + rsize, f, self.pos[f]))
        return f

    @rule(pick=PICK, via=st.integers(0, 2), to=st.integers(1, 2), early=st.booleans())
    def hand_off(self, pick, via, to, early):
        """Free on F, then allocate the same size on another stream A that waits for an event of
        F: recorded after the free (event-dependency reuse may take the block) or, ``early``,
        just before the owner's last use on F (it may not: the event does not cover the free)."""
        if not self.live:
            return
        ptr = sorted(self.live)[pick % len(self.live)]
        size = self.live[ptr][1]
        mark: list = []
        f = self.free_ptr(ptr, via, mark if early else None)
        a = (f + to) % len(self.streams)
        if a != f:
            self.wait(a, mark[0] if early else self.record(f))
        self.malloc(a, size)

    @rule(si=st.integers(0, 2), size=st.sampled_from(SIZES), via=st.integers(0, 2))
    def churn(self, si, size, via):
        """A short-lived allocation: malloc, use, free (leaves pending frees on every stream)."""
        before = set(self.live)
        self.malloc(si, size)
        (ptr,) = set(self.live) - before or (None,)
        if ptr is not None:
            self.free_ptr(ptr, via)

    @rule(si=st.integers(0, 2))
    def record_event(self, si):
        self.record(self.s(si)[0])

    @rule(pick=PICK, si=st.integers(0, 2))
    def wait_event(self, pick, si):
        if self.events:  # (no precondition: what was recorded can depend on timing, see free)
            self.wait(self.s(si)[0], self.events[pick % len(self.events)])

    @rule(si=st.integers(0, 2))
    def drain(self, si):
        """Let a stream run everything so far, with no host synchronize (opportunistic reuse)."""
        i, s = self.s(si)
        ran = threading.Event()
        s.launch_host_func(ran.set)
        self.enqueued(i)
        assert ran.wait(timeout=30)

    @rule(kind=st.sampled_from(["stream", "event", "device"]), si=st.integers(0, 2), pick=PICK)
    def synchronize(self, kind, si, pick):
        pool = self.pool
        before = pool.stats()
        if kind == "stream":
            i, s = self.s(si)
            s.synchronize()
            self.proved(i, self.pos[i], self.clock[i])
        elif kind == "event" and self.events:
            e, j, p, snap = self.events[pick % len(self.events)]
            e.synchronize()
            self.proved(j, p, snap)
        else:
            self.dev.synchronize()
            for i in range(len(self.streams)):
                self.proved(i, self.pos[i], self.clock[i])
        after = pool.stats()
        threshold = pool.release_threshold
        # the threshold never releases below itself, and nothing is released without need
        assert after["reserved_mem_current"] >= min(threshold, before["reserved_mem_current"])
        if kind == "device":  # every free proven: only granules under live blocks, or needed to
            # stay at the threshold, may stay mapped
            base, gr = pool._arena.base, pool._arena.granule
            touched = {g for p, (n, _, _, _) in self.live.items()
                       for g in range((p - base) // gr, (p - base + n - 1) // gr + 1)}
            assert after["reserved_mem_current"] <= max(len(touched) * gr,
                                                        threshold + gr - 1), "not released"

    @rule(keep=st.sampled_from([0, 2 << 20, 5 << 20, 1 << 30]))
    def trim(self, keep):
        before = self.pool.reserved_mem_current
        self.pool.trim_to(keep)
        after = self.pool.reserved_mem_current
        assert after <= before
        assert after == before if before <= keep else after >= keep

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        if self.pool is None:
            return
        st_ = self.pool.stats()
        assert not self.errors, self.errors
        self.free_blocks()
        assert st_["used_mem_current"] == sum(r for r, _, _, _ in self.live.values())
        assert st_["used_mem_current"] <= st_["reserved_mem_current"]
        assert st_["used_mem_current"] <= st_["used_mem_high"]
        assert st_["reserved_mem_current"] <= st_["reserved_mem_high"]
        if self.pool.max_size:
            assert st_["reserved_mem_high"] <= self.pool.max_size
        assert st_["alloc_count"] == sum(st_[k] for k in STEPS) == self.mallocs
        assert st_["free_count"] == self.frees
        assert st_["live_allocations"] == len(self.live)
        for i, s in enumerate(self.streams):
            assert s._pos == self.pos[i]
            assert s._clock == {self.streams[t].id: p for t, p in self.clock[i].items()}

    def teardown(self):
        try:
            if self.pool is not None:
                # after a failed step the model may be behind the pool: then only clean up
                clean = self.pool.stats()["live_allocations"] == len(self.live)
                for ptr, (_, size, owner, tag) in list(self.live.items()):
                    s = self.streams[owner]
                    s.launch(check_kernel, ptr, size, tag, self.errors)
                    s.free(ptr)
                self.dev.synchronize()  # raises LaunchError if any kernel touched dead memory
                self.pool.trim_to(0)
                if clean:
                    assert not self.errors, self.errors
                    assert self.pool.reserved_mem_current == 0
                self.pool.destroy()
        finally:
            for s in self.streams:
                s.destroy()
            cpu.set_delay_us(self.prev_delay)


def show(block: tuple) -> str:
    """A free block of ``PoolMachine.free_blocks`` for a message."""
    addr, size, tag = block[:3]
    return f"block {hex(addr)}+{size} " + ("(ready)" if tag is None else
                                           f"(freed on stream {tag[0]} at {tag[1]})")


def _subtract(r: tuple[int, int, int, int], lo: int, hi: int) -> list[tuple[int, int, int, int]]:
    """What is left of freed range ``r`` once ``[lo, hi)`` is allocated again."""
    a, b, f, p = r
    if b <= lo or hi <= a:
        return [r]
    return [piece for piece in ((a, lo, f, p), (hi, b, f, p)) if piece[0] < piece[1]]


def test_pool_model_random_programs():
    no_sanitizer("the model counts stream positions; the sanitizer gives each malloc one of its own")
    run_state_machine_as_test(
        PoolMachine,
        settings=settings(
            max_examples=150,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
