"""Helpers of the pool tests: streams, pools with given reuse flags, blocks used then freed, the
reuse step that served an allocation, and proof that a stream ran without a host synchronize."""

from __future__ import annotations

import threading

import numpy as np

import streamrt as srt

BLOCK = 2 << 20  # a whole chunk: no fresh remainder competes with the block under test


BIG = 1 << 30  # a release threshold that keeps every chunk


RULES = (
    "reuse_same_stream", "reuse_after_sync", "reuse_event_dependency", "reuse_opportunistic",
    "fresh_count", "grow_count", "reuse_internal_dependency",
)


FLAG_NAMES = (
    "reuse_follow_event_dependencies", "reuse_allow_opportunistic",
    "reuse_allow_internal_dependencies",
)


@srt.kernel
def snapshot_kernel(ctx, ptr, n, out):
    """Pending work of a block's owner: records the bytes it sees."""
    out.append(ctx.array(ptr, (n,), np.uint8, readonly=True).copy())


def served(pool: srt.MemPool, before: dict) -> list[str]:
    """The step counters that moved since ``before``."""
    after = pool.stats()
    return [r for r in RULES if after[r] != before[r]]


def stream(dev) -> srt.Stream:
    return srt.Stream(dev, non_blocking=True)


def pool_with(dev, flag: bool | None = None, **kw) -> srt.MemPool:
    """A pool that keeps its chunks at synchronize; ``flag`` sets all three reuse flags."""
    kw.setdefault("release_threshold", BIG)
    if flag is not None:
        kw.update(dict.fromkeys(FLAG_NAMES, flag))
    return srt.MemPool(dev, **kw)


def used_then_freed(pool: srt.MemPool, s: srt.Stream, size: int = BLOCK, value: int = 0x11) -> int:
    """A block that ``s`` writes and then frees (the free is not at stream position 0)."""
    p = s.malloc(size, pool)
    s.memset(p, value, size)
    s.free(p)
    return p


def executed(s: srt.Stream) -> None:
    """Return once ``s`` has executed everything enqueued so far, without a host synchronize."""
    ran = threading.Event()
    s.launch_host_func(ran.set)
    assert ran.wait(timeout=30)


def chunks(pool: srt.MemPool, s: srt.Stream, n: int) -> list[int]:
    """``n`` whole-chunk allocations, each written by ``s``."""
    ptrs = [s.malloc(BLOCK, pool) for _ in range(n)]
    for p in ptrs:
        s.memset(p, 0, BLOCK)
    return ptrs


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}
