"""Where a pool puts a block (DESIGN.md §3): rounding and alignment, best fit, split remainders,
coalescing, and pending frees kept through splits and merges."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.contract.pools import BLOCK, chunks, executed, pool_with, served, stream, used_then_freed


# -- best fit, split, coalesce, rounding --------------------------------------------------------
def test_pool_rounds_to_512_and_aligns(dev):
    pool = pool_with(dev)
    s = stream(dev)
    sizes = [1, 511, 512, 513, 1000, 1025]
    rounded = [512, 512, 512, 1024, 1024, 1536]
    ptrs = [s.malloc(n, pool) for n in sizes]
    assert all(p % 512 == 0 for p in ptrs)
    assert pool.used_mem_current == sum(rounded)
    # small requests are carved from the top of one fresh granule down: each block ends
    # where the previous one starts
    assert [a - b for a, b in zip(ptrs, ptrs[1:])] == rounded[1:]
    assert pool.reserved_mem_current == 2 << 20  # all small: one shared 2 MiB granule
    for p in ptrs:
        s.free(p)
    assert pool.used_mem_current == 0

    large = pool_with(dev)  # a fresh pool: no small-chunk remainder to carve from
    big = s.malloc((1 << 20) + 1, large)  # > 1 MiB: its own chunk, rounded to a 2 MiB granule
    assert big % 512 == 0
    assert large.reserved_mem_current == 2 << 20
    assert large.used_mem_current == (1 << 20) + 512
    huge = s.malloc((3 << 20) + 1, large)  # the remainder is too small: a 4 MiB chunk
    assert huge % 512 == 0
    assert large.reserved_mem_current == 6 << 20
    assert large.used_mem_current == (1 << 20) + 512 + (3 << 20) + 512
    s.free(big)
    s.free(huge)


def test_pool_best_fit_chooses_closest_size(dev):
    pool = pool_with(dev)
    s = stream(dev)
    a = s.malloc(4096, pool)
    s.malloc(512, pool)  # live separators: no two free blocks coalesce
    b = s.malloc(1024, pool)
    s.malloc(512, pool)
    c = s.malloc(2048, pool)
    s.malloc(512, pool)
    for p in (a, b, c):
        s.memset(p, 0, 512)
        s.free(p)
    # step 1 (pending on s): the closest size wins, not the latest freed or the largest;
    # a small request takes the high end of its block
    assert s.malloc(1000, pool) == b
    assert s.malloc(1536, pool) == c + 512
    assert s.malloc(3000, pool) == a + 1024
    for p in (a + 1024, b, c + 512):
        s.free(p)  # each merges back with the rest of its block
    s.synchronize()  # now all three are ready blocks (step 2): best fit again
    other = stream(dev)
    assert other.malloc(2000, pool) == c
    assert other.malloc(4000, pool) == a
    assert other.malloc(1, pool) == b + 512


def test_pool_best_fit_ties_go_to_the_oldest_free(dev):
    pool = pool_with(dev)
    s = stream(dev)
    a = s.malloc(4096, pool)
    s.malloc(512, pool)  # live separators: the two free blocks stay apart
    b = s.malloc(4096, pool)
    s.malloc(512, pool)
    s.free(b)  # freed first: the oldest of two equal sizes
    s.free(a)
    assert s.malloc(4096, pool) == b
    assert s.malloc(4096, pool) == a


def test_pool_best_fit_across_streams(dev):
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    p = used_then_freed(pool, b, 4 * BLOCK)
    q = used_then_freed(pool, c, BLOCK)
    a.wait(b.record())
    a.wait(c.record())
    before = pool.stats()
    assert a.malloc(BLOCK, pool) == q  # both allowed by events: the closer size wins
    assert served(pool, before) == ["reuse_event_dependency"]
    assert a.malloc(3 * BLOCK, pool) == p


def test_pool_split_remainder_keeps_pending_free(dev, gate):
    # A remainder split off a pending block is still pending on the same free: it must not
    # become reusable by an unrelated stream while the old owner's work is pending.
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b)
    a.wait(b.record())
    assert a.malloc(512, pool) == p + BLOCK - 512  # event dependency; the rest splits off
    before = pool.stats()
    q = c.malloc(BLOCK - 512, pool)  # fits the remainder, but c has no order with b
    assert not p <= q < p + BLOCK
    assert served(pool, before) == ["grow_count"]
    a.wait(b.record())  # with an order, the remainder is fair game
    before = pool.stats()
    r = a.malloc(BLOCK // 2, pool)
    assert p < r < p + BLOCK
    assert served(pool, before) == ["reuse_event_dependency"]


def test_pool_split_remainder_of_a_large_request_keeps_pending_free(dev, gate):
    # As above, for a request over 1 MiB, which takes the low end of its block (another split).
    pool = pool_with(dev)
    a, b, c = stream(dev), stream(dev), stream(dev)
    gate(b)
    p = used_then_freed(pool, b, 2 * BLOCK)
    a.wait(b.record())
    assert a.malloc(BLOCK, pool) == p  # event dependency; the upper half splits off
    before = pool.stats()
    q = c.malloc(BLOCK, pool)  # fits the remainder, but c has no order with b
    assert not p - BLOCK < q < p + 2 * BLOCK
    assert served(pool, before) == ["grow_count"]


def test_pool_coalesced_pending_free_keeps_the_later_position(dev, gate):
    # Two neighbours freed on b coalesce into one block pending at the later free: an event of
    # b between the two frees orders a after the first only, so a cannot reuse the whole.
    pool = pool_with(dev)
    a, b = stream(dev), stream(dev)
    gate(b)
    x = b.malloc(BLOCK, pool)
    y = b.malloc(BLOCK, pool)
    assert y == x + BLOCK  # neighbours
    b.memset(x, 1, BLOCK)
    b.free(x)
    a.wait(b.record())  # after x's free, before y's
    b.memset(y, 2, BLOCK)
    b.free(y)  # merges with x: the whole is freed at y's position
    before = pool.stats()
    q = a.malloc(2 * BLOCK, pool)
    assert not x - 2 * BLOCK < q < y + BLOCK
    assert served(pool, before) == ["grow_count"]


def test_pool_split_and_coalesce(dev):
    pool = pool_with(dev)
    s = stream(dev)
    x = s.malloc(512, pool)
    y = s.malloc(512, pool)
    z = s.malloc(512, pool)
    assert (x - y, y - z) == (512, 512)  # small blocks, from the top of the granule down
    st = pool.stats()
    assert st["chunks"] == 1 and st["largest_free_block"] == BLOCK - 3 * 512  # split remainder
    s.memset(x, 0, 512)
    s.free(x)
    s.memset(z, 0, 512)
    s.free(z)  # pending on s, and it absorbs the ready remainder below it
    st = pool.stats()
    assert st["largest_free_block"] == BLOCK - 2 * 512
    s.memset(y, 0, 512)
    s.free(y)  # the three and the remainder: one block, pending on s
    assert pool.stats()["largest_free_block"] == BLOCK
    assert s.malloc(3 * 512, pool) == z  # the high end of the merged block: z, y, x again
    s.free(z)
    s.synchronize()  # proven: the whole granule is one ready block (kept: high threshold)
    st = pool.stats()
    assert st["largest_free_block"] == BLOCK and st["chunks"] == 1
    base = z - (BLOCK - 3 * 512)
    assert stream(dev).malloc(BLOCK, pool) == base  # the whole granule, in one piece


def test_pool_statistics_do_not_change_where_a_block_goes(dev):
    # A fast free next to ready blocks defers merging with them; reading the statistics counts
    # the merge without making it, so a later exact-size request gets the same block either way.
    def run(observe: bool) -> tuple[int, ...]:
        pool = pool_with(dev)
        s = stream(dev)
        x = s.malloc(1024, pool)  # the top of the granule
        y = s.malloc(512, pool)  # below x; the rest of the granule below y is a ready block
        s.free(x)
        s.synchronize()  # x ready
        s.memset(y, 0, 512)
        s.free(y)  # between two ready blocks
        if observe:
            assert pool.stats()["largest_free_block"] == BLOCK  # y with both, once merged
        z = s.malloc(512, pool)
        w = s.malloc(1024, pool)
        s.synchronize()
        return y - x, z - x, w - x

    assert run(observe=False) == run(observe=True) == (-512, -512, 0)


def test_pool_free_coalesces_through_an_absorbed_ready_block(dev):
    # A free absorbs a ready neighbour, then what lies beyond it freed on the same stream: one
    # block, which another stream ordered after both frees reuses in one piece.
    pool = pool_with(dev, reuse_allow_opportunistic=False, reuse_allow_internal_dependencies=False)
    a, f = stream(dev), stream(dev)
    x = a.malloc(512, pool)  # the top of a first granule; the rest of it is a ready block
    f.wait(a.record())  # (f may use what a allocated)
    f.memset(x, 0, 512)
    f.free(x)  # the first granule: one block, pending on f
    y = a.malloc(512, pool)  # a may not reuse it: the top of a second granule
    f.wait(a.record())
    f.memset(y, 0, 512)
    f.free(y)  # absorbs the ready rest of the second granule, then the first granule
    assert pool.stats()["largest_free_block"] == 2 * BLOCK
    a.wait(f.record())
    before = pool.stats()
    assert a.malloc(BLOCK + BLOCK // 2, pool) == x + 512 - BLOCK  # the low end: the first granule
    assert served(pool, before) == ["reuse_event_dependency"]


# -- across streams: frees that have run, memory a synchronize released ---------------------------
@pytest.mark.parametrize("on", [True, False])
def test_pool_free_absorbs_another_streams_neighbour_whose_free_has_run(dev, on):
    # With opportunistic reuse on, a block freed on g whose free has run is as reusable as f's
    # own: f's free next to it takes it (one block, pending on f), and a stream ordered after
    # f's free reuses both in one piece. Off, it stays apart: a stream ordered after f only
    # may not use g's part, and grows.
    pool = pool_with(dev, reuse_allow_opportunistic=on, reuse_allow_internal_dependencies=False)
    f, g, a = stream(dev), stream(dev), stream(dev)
    x, y = chunks(pool, f, 2)
    assert y == x + BLOCK
    g.wait(f.record())
    g.free(x)
    executed(g)  # g's free has run; nothing synchronized it
    f.free(y)
    assert pool.stats()["largest_free_block"] == (2 * BLOCK if on else BLOCK)
    a.wait(f.record())
    before = pool.stats()
    z = a.malloc(2 * BLOCK, pool)
    assert (z == x) is on
    assert served(pool, before) == (["reuse_event_dependency"] if on else ["grow_count"])


def test_pool_free_keeps_apart_another_streams_neighbour_whose_free_has_not_run(dev, gate):
    pool = pool_with(dev)
    f, g = stream(dev), stream(dev)
    x, y = chunks(pool, f, 2)
    g.wait(f.record())
    gate(g)  # g's free cannot have run
    g.free(x)
    f.free(y)
    assert pool.stats()["largest_free_block"] == BLOCK  # two blocks, pending on g and on f
    executed(f)
    before = pool.stats()
    assert stream(dev).malloc(2 * BLOCK, pool) not in (x, y)  # no run of two to take
    assert served(pool, before) == ["grow_count"]


@pytest.mark.parametrize("on", [True, False])
def test_pool_released_memory_is_taken_after_every_step_on_mapped_memory(dev, on):
    # A ready block over a granule a synchronize released fits at step 2, another stream's
    # freed (and run) block on mapped memory at step 4: mapping the granule again is growth, so
    # step 4's block wins while it is allowed; without it, the released granule is mapped again
    # before the pool grows its range.
    pool = srt.MemPool(dev, reuse_allow_opportunistic=on)  # release threshold 0
    s, g, a = stream(dev), stream(dev), stream(dev)
    lo, mid, hi = chunks(pool, s, 3)
    s.free(lo)
    s.synchronize()  # lo's granule goes back to the device; its addresses stay a ready block
    assert pool.reserved_mem_current == 2 * BLOCK
    g.wait(s.record())
    g.free(hi)
    executed(g)
    before = pool.stats()
    p = a.malloc(BLOCK, pool)
    assert p == (hi if on else lo)
    assert served(pool, before) == (["reuse_opportunistic"] if on else ["reuse_after_sync"])
    assert pool.reserved_mem_current == (2 if on else 3) * BLOCK
    a.free(p)
    s.free(mid)


def test_pool_free_next_to_a_ready_block_takes_a_run_free_beyond_it(dev, gate):
    # q is ready (proven), r beyond it freed on g, whose free has run since; p's free on f
    # takes q and then r, as coalescing does, even where it could leave q to be merged later:
    # a stream ordered after f reuses the three in one piece
    pool = pool_with(dev, reuse_allow_internal_dependencies=False)
    f, g, h = stream(dev), stream(dev), stream(dev)
    p, q, r, _guard = (f.malloc(4096, pool) for _ in range(4))  # from the top down: p, q, r
    assert p - q == q - r == 4096
    f.malloc(BLOCK - 4 * 4096, pool)  # the rest of the chunk: no other free block fits
    f.synchronize()
    opened = gate(g)
    g.free(r)  # its free cannot have run
    h.free(q)
    h.synchronize()  # q is ready; r stays apart (its free had not run)
    opened.open()
    executed(g)
    f.free(p)
    a = stream(dev)
    a.wait(f.record())
    before = pool.stats()
    assert a.malloc(3 * 4096, pool) == r
    assert served(pool, before) == ["reuse_event_dependency"]


def test_pool_block_freed_twice_into_its_size_bin_is_taken_once(dev):
    # a block taken from the middle of a long bin leaves a stale entry there; when it comes back
    # to that size as the stream's newest, the entry is valid again: an allocation taking it
    # through the bin must not leave it the newest too (the next one would get it again)
    pool = pool_with(dev)
    s = stream(dev)
    n = 20
    trios = [(s.malloc(1024, pool), s.malloc(512, pool), s.malloc(512, pool)) for _ in range(n)]
    for c, a, _ in trios:
        assert a + 512 == c
        s.free(a)  # the 512 bin: all but the last, which is the newest
    s.free(trios[5][0])  # merges into trios[5]'s 512 block, out of the middle of the bin
    s.malloc(1024, pool)  # splits it back to 512: its stale entry in the bin is valid again
    got = [s.malloc(512, pool) for _ in range(n + 1)]
    assert len(set(got)) == len(got), "one block allocated twice"
