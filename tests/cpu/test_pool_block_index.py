"""The pool's block index on the cpu backend: granules counted from the arena's base."""

from __future__ import annotations

import streamrt as srt


def test_pool_block_index_counts_granules_from_the_arena_base():
    # cpu arenas are 512-aligned, not granule-aligned: a 512 B allocation made first moves the
    # next arena's base off a 2 MiB boundary. The first chunk must still be one granule of the
    # block index, so that a split of it and the free merging it back change only that
    # granule's list, never the sorted list of granules (when granules were counted from
    # address 0, a 1 MiB block at the chunk's high end started in a granule of its own: every
    # pair added it to the sorted list and took it out again)
    keep = [srt.malloc(512)]
    s = srt.Stream(non_blocking=True)
    pool = srt.MemPool()
    s.free(s.malloc(4096, pool))  # the arena, and its first chunk
    while pool._arena.base % (2 << 20) == 0:  # (this process's other allocations aligned it)
        s.synchronize()
        pool.destroy()
        keep.append(srt.malloc(512))
        pool = srt.MemPool()
        s.free(s.malloc(4096, pool))
    try:
        base = pool._arena.base
        blocks = pool._blocks
        assert blocks.origin == base
        before = list(blocks.granules)
        for size in (4 << 10, 64 << 10, 1 << 20) * 4:
            p = s.malloc(size, pool)
            assert p + size == base + (2 << 20)  # the chunk's high end
            assert list(blocks.granules) == before == [0]
            assert blocks.holding(p + size - 1).addr == p
            s.free(p)
            assert list(blocks.granules) == before
    finally:
        s.synchronize()
        pool.destroy()
        for p in keep:
            srt.free(p)
