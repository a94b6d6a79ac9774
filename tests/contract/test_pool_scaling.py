"""How much work a pool decision does as the pool holds more blocks (DESIGN.md §6: growth and
synchronize cost O(log n) in live/free blocks), counted as Python lines run inside the pool
package, never timed; and the runs merged before growing, found from the pool's seams, checked
against a scan of every block."""

from __future__ import annotations

import random
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

import streamrt as srt
from streamrt.pool import reuse
from tests.conftest import no_sanitizer
from tests.contract.pools import BIG, stream

POOL_DIR = reuse.__file__.rsplit("/", 1)[0]


def pool_lines(fn: Callable[[], Any]) -> int:
    """Python lines run in ``streamrt/pool/`` by ``fn()`` on this thread."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if not frame.f_code.co_filename.startswith(POOL_DIR):
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def no_reuse_pool(dev) -> srt.MemPool:
    """A pool that may not reuse another stream's frees before a synchronize."""
    return srt.MemPool(dev, release_threshold=BIG, reuse_follow_event_dependencies=False,
                       reuse_allow_opportunistic=False, reuse_allow_internal_dependencies=False)


@pytest.fixture(autouse=True)
def _plain():
    no_sanitizer("counts the pool's own lines; the sanitizer adds its own per call")


def test_pool_growth_work_does_not_depend_on_live_blocks(dev):
    """A malloc that must grow looked at every block (the merge-before-growing step scanned the
    whole block list, and the top block was found in a sorted index): 12 us at 10 live blocks,
    11 ms at 100k. It must do the same work whatever the number of live blocks."""
    def grow_work(live: int) -> int:
        pool = no_reuse_pool(dev)
        s, t = stream(dev), stream(dev)
        keep = [s.malloc(512, pool) for _ in range(live)]
        p = s.malloc(2 << 20, pool)
        t.wait(s.record())
        t.free(p)  # pending on t: s may not take it, nor merge it
        before = pool.stats()["grow_count"]
        work = pool_lines(lambda: keep.append(s.malloc(2 << 20, pool)))
        assert pool.stats()["grow_count"] == before + 1
        for q in keep:
            s.free(q)
        s.synchronize()
        t.synchronize()
        pool.destroy()
        return work

    few, many = grow_work(10), grow_work(5000)
    assert many <= few + 20, (few, many)


def test_pool_synchronize_work_does_not_depend_on_free_blocks(dev):
    """A synchronize above the release threshold sorted every free block to find granules to
    release (12 ms with 50k free blocks); promoting the proven frees walked every pending block.
    With nothing releasable, it must do the same work whatever the number of free blocks, and
    promoting one free must cost the same."""
    def sync_work(free: int) -> tuple[int, int]:
        pool = srt.MemPool(dev, release_threshold=0)
        s = stream(dev)
        ptrs = [s.malloc(512, pool) for _ in range(2 * free + 4)]
        for p in ptrs[1:2 * free:2]:
            s.free(p)  # each between two live blocks: nothing can be released
        s.synchronize()
        idle = pool_lines(s.synchronize)
        s.free(ptrs[-2])
        one = pool_lines(s.synchronize)
        assert pool.stats()["release_count"] == 0
        for p in ptrs[0:2 * free:2] + ptrs[2 * free:-2] + ptrs[-1:]:
            s.free(p)
        s.synchronize()
        pool.destroy()
        return idle, one

    (idle_few, one_few), (idle_many, one_many) = sync_work(10), sync_work(5000)
    assert idle_many <= idle_few + 10, (idle_few, idle_many)
    assert one_many <= one_few + 40, (one_few, one_many)


def test_pool_pair_work_does_not_depend_on_free_blocks(dev):
    """With many free blocks of one size, a pair that splits a block and merges it back does the
    same work as with few (no search or removal walks the blocks of a size)."""
    def pair_work(free: int) -> int:
        pool = srt.MemPool(dev, release_threshold=BIG)
        s = stream(dev)
        ptrs = [s.malloc(4096, pool) for _ in range(2 * free + 2)]
        for p in ptrs[1:2 * free:2]:
            s.free(p)  # many free 4 KiB blocks, each between two live ones
        big = s.malloc(1 << 20, pool)
        s.free(big)  # one free block of its own size, next to the rest of the granule
        # each pair splits, then coalesces; the least of a few leaves out the occasional
        # amortized upkeep (an index rebuilt every so many frees)
        work = min(pool_lines(lambda: s.free(s.malloc(8192, pool))) for _ in range(8))
        for p in ptrs[0:2 * free:2] + ptrs[2 * free:]:
            s.free(p)
        s.synchronize()
        pool.destroy()
        return work

    few, many = pair_work(10), pair_work(3000)
    assert many <= few + 10, (few, many)


# -- runs merged before growing: from the seams, as a scan of every block finds them ----------
def scanned_run(pool: Any, a: srt.Stream, size: int) -> list[Any] | None:
    """The run a scan of every block in address order chooses (the pool's former algorithm)."""
    best = None
    best_size = 0
    run: deque = deque()
    total = 0
    for b in pool._blocks.values():
        if not b.live and (b.stream is None or b.stream is a):
            run.append(b)
            total += b.size
            while total - run[0].size >= size:
                total -= run.popleft().size
            if total >= size and len(run) > 1 and (best is None or total < best_size):
                best, best_size = list(run), total
        else:
            run, total = deque(), 0
    return best


PROBES = [512 << k for k in range(15)]  # 512 B to 8 MiB


@pytest.mark.parametrize("seed", range(12))
def test_pool_merge_runs_match_a_scan_of_every_block(dev, seed):
    rng = random.Random(seed)
    pool = srt.MemPool(dev, release_threshold=rng.choice([0, BIG]),
                       reuse_follow_event_dependencies=rng.random() < 0.5,
                       reuse_allow_opportunistic=False, reuse_allow_internal_dependencies=False)
    streams = [stream(dev) for _ in range(3)]
    live: list[tuple[int, int]] = []  # (ptr, owner)
    sizes = [512, 4096, 65536, 300_000, 1 << 20, 3 << 20]
    checked = 0
    for _ in range(250):
        r = rng.random()
        if r < 0.45 or not live:
            i = rng.randrange(3)
            size = rng.choice(sizes)
            with pool._lock:
                pool._settle()
                for probe in PROBES:
                    rounded = (probe + 511) // 512 * 512
                    want = scanned_run(pool, streams[i], rounded)
                    got = reuse.merge_run(pool, streams[i], rounded)
                    assert got == want, (probe, want, got)
                    checked += want is not None
            live.append((streams[i].malloc(size, pool), i))
        elif r < 0.85:
            ptr, owner = live.pop(rng.randrange(len(live)))
            via = owner if rng.random() < 0.5 else rng.randrange(3)
            if via != owner:
                streams[via].wait(streams[owner].record())
            streams[via].free(ptr)
        else:
            streams[rng.randrange(3)].synchronize()
    for ptr, owner in live:
        streams[owner].free(ptr)
    dev.synchronize()
    pool.destroy()
    assert checked, "no run to merge was ever found: the program does not reach that step"


@pytest.mark.parametrize("seed", range(4))
def test_pool_block_lookup_matches_a_scan(dev, seed):
    """The block list's index (exact starts, per-granule start lists, granules with starts) finds
    the block holding any address, as a walk of the list in address order does."""
    rng = random.Random(seed)
    pool = srt.MemPool(dev, release_threshold=rng.choice([0, BIG]))
    s = stream(dev)
    live: list[int] = []
    sizes = [512, 4096, 65536, 1 << 20, (1 << 20) + 512, 5 << 20]
    for step in range(300):
        if rng.random() < 0.55 or not live:
            live.append(s.malloc(rng.choice(sizes), pool))
        else:
            s.free(live.pop(rng.randrange(len(live))))
        if step % 50 == 49:
            s.synchronize()
            with pool._lock:
                blocks = list(pool._blocks.values())
                assert [b.addr for b in blocks] == sorted(b.addr for b in blocks)
                assert all(x.addr + x.size == y.addr for x, y in zip(blocks, blocks[1:]))
                lo, hi = blocks[0].addr, blocks[-1].addr + blocks[-1].size
                for ptr in [rng.randrange(lo, hi) for _ in range(200)] + [b.addr for b in blocks]:
                    want = next(b for b in blocks if b.addr <= ptr < b.addr + b.size)
                    assert pool._blocks.holding(ptr) is want, hex(ptr)
    for p in live:
        s.free(p)
    s.synchronize()
    pool.destroy()
