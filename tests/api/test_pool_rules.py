"""API.md §3 and DESIGN.md §3 (normative): pools, reuse order, threshold, trim, stats."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

import streamrt as srt

from .conftest import Gate, alloc_then_free, call_with_timeout, sync, two_streams

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


MiB = 1 << 20


BIG = 1 << 30


def _pool(**kw):
    kw.setdefault("release_threshold", BIG)
    return srt.MemPool(srt.Device("cpu:0"), **kw)


def _flags(pool, follow, opp, internal):
    pool.set_attr(srt.MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, follow)
    pool.set_attr(srt.MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC, opp)
    pool.set_attr(srt.MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES, internal)


def test_pool_attr_values():
    A = srt.MemPoolAttr
    assert [int(A.REUSE_FOLLOW_EVENT_DEPENDENCIES), int(A.REUSE_ALLOW_OPPORTUNISTIC),
            int(A.REUSE_ALLOW_INTERNAL_DEPENDENCIES), int(A.RELEASE_THRESHOLD),
            int(A.RESERVED_MEM_CURRENT), int(A.RESERVED_MEM_HIGH), int(A.USED_MEM_CURRENT),
            int(A.USED_MEM_HIGH)] == list(range(1, 9))


def test_pool_defaults_and_properties():
    p = srt.MemPool()
    A = srt.MemPoolAttr
    assert bool(p.get_attr(A.REUSE_FOLLOW_EVENT_DEPENDENCIES))
    assert bool(p.get_attr(A.REUSE_ALLOW_OPPORTUNISTIC))
    assert bool(p.get_attr(A.REUSE_ALLOW_INTERNAL_DEPENDENCIES))
    assert p.get_attr(A.RELEASE_THRESHOLD) == 0 == p.release_threshold
    assert p.reserved_mem_current == 0 == p.used_mem_current
    assert p.reserved_mem_high == 0 == p.used_mem_high
    assert p.reuse_follow_event_dependencies and p.reuse_allow_opportunistic
    assert p.reuse_allow_internal_dependencies
    p.release_threshold = 5 * MiB
    assert p.get_attr(A.RELEASE_THRESHOLD) == 5 * MiB
    p.set_attr(A.RELEASE_THRESHOLD, 7)
    assert p.release_threshold == 7
    p.reuse_allow_opportunistic = False
    assert not p.get_attr(A.REUSE_ALLOW_OPPORTUNISTIC)
    q = srt.MemPool(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
                    reuse_allow_internal_dependencies=False, release_threshold=3)
    assert not q.reuse_follow_event_dependencies and not q.reuse_allow_opportunistic
    assert not q.reuse_allow_internal_dependencies and q.release_threshold == 3


def test_pool_current_attrs_read_only():
    p = _pool()
    with pytest.raises((AttributeError, srt.StreamRTError)):
        p.reserved_mem_current = 0
    with pytest.raises((AttributeError, srt.StreamRTError)):
        p.used_mem_current = 0
    with pytest.raises(srt.InvalidValueError):
        p.set_attr(srt.MemPoolAttr.RESERVED_MEM_CURRENT, 0)
    with pytest.raises(srt.InvalidValueError):
        p.set_attr(srt.MemPoolAttr.USED_MEM_CURRENT, 0)


def test_pool_high_watermarks_reset_to_current():
    p = _pool()
    s = srt.Stream()
    a = s.malloc(2 * MiB, p)
    b = s.malloc(2 * MiB, p)
    s.free(b)
    sync(s)
    assert p.used_mem_high >= 4 * MiB and p.used_mem_current == 2 * MiB
    with pytest.raises(srt.InvalidValueError):
        p.set_attr(srt.MemPoolAttr.USED_MEM_HIGH, 5)
    with pytest.raises(srt.InvalidValueError):
        p.used_mem_high = 1
    p.used_mem_high = 0
    assert p.used_mem_high == p.used_mem_current == 2 * MiB
    p.set_attr(srt.MemPoolAttr.RESERVED_MEM_HIGH, 0)
    assert p.reserved_mem_high == p.reserved_mem_current
    s.free(a)
    sync(s)


def test_pool_sizes_round_and_align():
    p = _pool()
    s = srt.Stream()
    ptrs = [s.malloc(n, p) for n in (1, 100, 513, 4000)]
    assert all(x % 512 == 0 for x in ptrs)
    assert p.used_mem_current == 512 + 512 + 1024 + 4096
    assert p.get_attr(srt.MemPoolAttr.USED_MEM_CURRENT) == p.used_mem_current
    for x in ptrs:
        s.free(x)
    sync(s)
    assert p.used_mem_current == 0


def test_pool_seed000_example():
    @srt.kernel
    def add_custom(ctx, args_ptr):
        x, y, z = (int(q) for q in ctx.array(args_ptr, (3,), np.uint64, readonly=True))
        np.add(ctx.array(x, (1,), np.float64, readonly=True),
               ctx.array(y, (1,), np.float64, readonly=True), out=ctx.array(z, (1,), np.float64))

    pool = srt.MemPool(max_size=14 << 30)
    s = srt.Stream()
    x, y, z = (s.malloc(8, pool) for _ in range(3))
    args = s.malloc(24, pool)
    s.memcpy(x, np.array([1.5]), 8)
    s.memcpy(y, np.array([2.25]), 8)
    s.memcpy(args, np.array([x, y, z], np.uint64), 24)
    s.launch(add_custom, args, grid=32)
    out = np.zeros(1)
    s.memcpy(out, z, 8)
    for q in (args, x, y, z):
        s.free(q)
    assert pool.reserved_mem_current > 0
    sync(s)
    assert out[0] == 3.75
    assert pool.reserved_mem_current == 0
    st = pool.stats()
    assert st["alloc_count"] == 4 and st["free_count"] == 4
    pool.destroy()


def test_pool_stats_keys():
    st = _pool().stats()
    for k in ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
              "reuse_allow_internal_dependencies", "release_threshold", "reserved_mem_current",
              "reserved_mem_high", "used_mem_current", "used_mem_high", "alloc_count",
              "free_count", "reuse_same_stream", "reuse_event_dependency", "reuse_opportunistic",
              "reuse_internal_dependency", "reuse_after_sync", "grow_count", "release_count",
              "largest_free_block"):
        assert k in st, k


def _noop(*_):
    return None


def _poll_until_complete(A, B, e):
    call_with_timeout(lambda: [None for _ in iter(lambda: e.query(), True)])  # poll, no sync


def _record_then_use(B, a):
    e = B.record()          # recorded before the last use and the free: does not cover it
    B.memset(a, 0, 16)
    return e


class Reuse(NamedTuple):
    """B frees a block (its work held by a gate or not); then A asks for the same size."""

    flags: tuple[bool, bool, bool]      # follow event deps, opportunistic, internal deps
    reused: bool                        # A gets B's block back
    stats: dict                         # pool.stats() entries expected afterwards
    hold: bool = True                   # B's work (and so its free) is still pending
    before_free: Callable = _noop       # (B, a) -> state, enqueued on B before the free
    after_free: Callable = _noop        # (A, B, state), between B's free and A's malloc
    same_stream: bool = False           # A is B
    size: int = 3 * MiB


REUSE = {
    "step1_same_stream": Reuse((False, False, False), True, {"reuse_same_stream": 1},
                               same_stream=True, size=3000),
    "step2_after_sync_whatever_flags": Reuse((False, False, False), True, {"reuse_after_sync": 1},
                                             hold=False, after_free=lambda A, B, _: sync(B)),
    "step2_event_synchronize_proves": Reuse((False, False, False), True, {"reuse_after_sync": 1},
                                            hold=False, after_free=lambda A, B, _: sync(B.record())),
    "step3_event_dependency": Reuse((True, False, False), True, {"reuse_event_dependency": 1},
                                    after_free=lambda A, B, _: A.wait(B.record())),
    "step3_off_grows": Reuse((False, False, False), False,
                             {"grow_count": 2, "reuse_event_dependency": 0},
                             after_free=lambda A, B, _: A.wait(B.record())),
    "step3_not_when_record_before_free": Reuse((True, False, False), False, {},
                                               before_free=_record_then_use,
                                               after_free=lambda A, B, e: A.wait(e)),
    "step4_opportunistic": Reuse((False, True, False), True,
                                 {"reuse_opportunistic": 1, "reuse_after_sync": 0}, hold=False,
                                 after_free=lambda A, B, _: _poll_until_complete(A, B, B.record())),
    "step4_not_when_pending": Reuse((False, True, False), False, {}),
    "step5_grow_before_internal_dependency": Reuse((False, False, True), False,
                                                   {"reuse_internal_dependency": 0, "grow_count": 2}),
}


@pytest.mark.parametrize("case", REUSE.values(), ids=REUSE.keys())
def test_pool_reuse_step(case):
    p = _pool()
    _flags(p, *case.flags)
    A, B = two_streams()
    if case.same_stream:
        A = B
    g = Gate()
    if case.hold:
        g.hold(B)
    a = B.malloc(case.size, p)
    state = case.before_free(B, a)
    B.free(a)
    case.after_free(A, B, state)
    grow = p.stats()["grow_count"]
    b = A.malloc(case.size, p)
    assert (b == a) is case.reused
    st = p.stats()
    assert st["grow_count"] == grow + (not case.reused)
    for k, v in case.stats.items():
        assert st[k] == v, k
    g.open()
    sync(B)
    A.free(b)
    sync(A)


def _full_pool(*flags):
    """A 4 MiB pool filled by B's allocation, B then held by a gate."""
    p = _pool(max_size=4 * MiB)
    _flags(p, *flags)
    A, B = two_streams()
    a = B.malloc(4 * MiB, p)
    g = Gate()
    g.hold(B)
    return p, A, B, a, g


def test_pool_step6_internal_dependency_makes_stream_wait():
    p, A, B, a, g = _full_pool(False, False, True)
    log = []
    B.launch_host_func(log.append, "B")
    B.free(a)
    b = A.malloc(4 * MiB, p)
    assert b == a
    assert p.stats()["reuse_internal_dependency"] == 1
    A.launch_host_func(log.append, "A")
    assert not A.query()
    g.open()
    sync(A)
    assert log == ["B", "A"]
    A.free(b)
    sync(A)


def test_pool_step7_oom_when_internal_off():
    p, A, B, a, g = _full_pool(True, True, False)
    B.free(a)
    with pytest.raises(srt.OutOfMemoryError) as ei:
        A.malloc(4 * MiB, p)
    assert isinstance(ei.value, MemoryError)
    assert ei.value.code == 2
    g.open()
    sync(B)


def test_pool_max_size_oom_message_mentions_request():
    p = _pool(max_size=4 * MiB)
    s = srt.Stream()
    with pytest.raises(srt.OutOfMemoryError) as ei:
        s.malloc(6 * MiB, p)
    assert str(6 * MiB) in str(ei.value).replace(",", "").replace("_", "") or "6" in str(ei.value)


def test_pool_best_fit_exact_sizes():
    p = _pool()
    s = srt.Stream(non_blocking=True)
    sizes = [4096, 8192, 2048, 16384]
    blocks, seps = [], []
    for n in sizes:
        blocks.append(s.malloc(n, p))
        seps.append(s.malloc(512, p))
    for b in blocks:
        s.free(b)
    assert s.malloc(2048, p) == blocks[2]
    assert s.malloc(8192, p) == blocks[1]
    assert s.malloc(4096, p) == blocks[0]
    q = s.malloc(10000, p)   # closest-size free block is the 16 KiB one
    assert blocks[3] <= q < blocks[3] + 16384
    sync(s)


def test_pool_coalesce_on_free():
    p = _pool()
    s = srt.Stream(non_blocking=True)
    ptrs = [s.malloc(4096, p) for _ in range(64)]
    for q in ptrs:
        s.free(q)
    sync(s)
    st = p.stats()
    assert st["largest_free_block"] == p.reserved_mem_current
    # the whole coalesced range serves one request without growing
    big = s.malloc(64 * 4096, p)
    assert p.stats()["grow_count"] == st["grow_count"]
    s.free(big)
    sync(s)


def test_pool_threshold_zero_releases_at_sync_only():
    p = srt.MemPool()
    s, _ = alloc_then_free(p, 4 * MiB)
    assert p.reserved_mem_current >= 4 * MiB
    sync(s)
    assert p.reserved_mem_current == 0
    assert p.stats()["release_count"] >= 1


def test_pool_threshold_keeps_reserved():
    p = srt.MemPool(release_threshold=4 * MiB)
    s, reserved = alloc_then_free(p, *[2 * MiB] * 3)
    assert reserved == 6 * MiB
    sync(s)
    assert p.reserved_mem_current == 4 * MiB
    p.release_threshold = 0
    sync(s)
    assert p.reserved_mem_current == 0


def test_pool_threshold_applies_on_event_and_device_sync():
    p = srt.MemPool()
    s, _ = alloc_then_free(p, 4 * MiB)
    sync(s.record())
    assert p.reserved_mem_current == 0
    alloc_then_free(p, 4 * MiB, stream=s)
    sync(srt.Device("cpu:0"))
    assert p.reserved_mem_current == 0


def test_pool_query_is_not_a_sync():
    p = srt.MemPool()
    s, _ = alloc_then_free(p, 4 * MiB)
    call_with_timeout(lambda: [None for _ in iter(lambda: s.query(), True)])
    assert p.reserved_mem_current == 4 * MiB
    sync(s)
    assert p.reserved_mem_current == 0


def test_pool_trim_to():
    p = _pool()
    s, _ = alloc_then_free(p, *[2 * MiB] * 3)
    sync(s)
    assert p.reserved_mem_current == 6 * MiB
    p.trim_to(2 * MiB)
    assert p.reserved_mem_current == 2 * MiB
    p.trim_to(4 * MiB)   # no-op when reserved <= k
    assert p.reserved_mem_current == 2 * MiB
    p.trim_to(0)         # explicit trim wins over the threshold
    assert p.reserved_mem_current == 0


def test_pool_trim_keeps_used_and_unproven():
    p = _pool()
    s = srt.Stream(non_blocking=True)
    live = s.malloc(2 * MiB, p)
    g = Gate()
    dead = s.malloc(2 * MiB, p)
    g.hold(s)
    s.free(dead)
    p.trim_to(0)
    assert p.reserved_mem_current == 4 * MiB   # free not proven by a sync
    g.open()
    sync(s)
    p.trim_to(0)
    assert p.reserved_mem_current == 2 * MiB   # the live allocation stays
    s.free(live)
    sync(s)
    p.trim_to(0)
    assert p.reserved_mem_current == 0


def test_pool_destroy_with_live_allocation():
    p = srt.MemPool()
    s = srt.Stream()
    a = s.malloc(1000, p)
    p.destroy()
    s.memset(a, 1, 1000)     # still valid until freed
    out = np.zeros(1000, np.uint8)
    s.memcpy(out, a, 1000)
    s.free(a)
    sync(s)
    assert (out == 1).all()


def test_pool_default_pool_used_by_none(dev):
    pool = dev.mem_pool
    s = srt.Stream()
    before = pool.used_mem_current
    a = s.malloc(2048)
    assert pool.used_mem_current == before + 2048
    s.free(a)
    sync(s)


def test_pool_cross_stream_reuse_data_safe(dev, delay):
    # internal dependency: the reused block must not be overwritten before B's reader ran
    @srt.kernel
    def slow_copy(ctx, dst, src, n):
        ctx.array(dst, (n,), np.float32)[:] = ctx.array(src, (n,), np.float32, readonly=True)

    p = _pool(max_size=2 * MiB)
    _flags(p, False, False, True)
    A, B = two_streams()
    n = (2 * MiB) // 4
    res = srt.malloc(n * 4)
    for _ in range(5):
        a = B.malloc(2 * MiB, p)
        B.memcpy(a, np.full(n, 1, np.float32), n * 4)
        B.launch(slow_copy, res, a, n)
        B.free(a)
        b = A.malloc(2 * MiB, p)
        A.memset(b, 0, n * 4)
        A.free(b)
        sync(A)
        sync(B)
        assert (srt.read(res, (n,), np.float32) == 1).all()
    srt.free(res)


def _six(pool):
    return alloc_then_free(pool, *[2 * MiB] * 3)[0]


def test_pool_threshold_releases_while_exceeding():
    p = srt.MemPool(release_threshold=3 * MiB)
    s = _six(p)
    sync(s)
    # DESIGN's "released while reserved exceeds the threshold" read literally gives 2 MiB;
    # CUDA and the README keep reserved at or above the threshold: 4 MiB (ambiguity, reported)
    assert p.reserved_mem_current in (2 * MiB, 4 * MiB)
    assert p.reserved_mem_current >= 2 * MiB


def test_pool_trim_keeps_at_least_k():
    p = srt.MemPool(release_threshold=1 << 30)
    s = _six(p)
    sync(s)
    p.trim_to(3 * MiB)
    # release while reserved - chunk >= k: 6 -> 4, then 4 - 2 < 3 stops
    assert p.reserved_mem_current == 4 * MiB


def test_pool_threshold_only_at_sync_not_at_free():
    p = srt.MemPool()
    s = srt.Stream()
    a = s.malloc(2 * MiB, p)
    s.free(a)
    b = s.malloc(2 * MiB, p)
    assert b == a and p.stats()["grow_count"] == 1
    s.free(b)
    sync(s)
