"""Bad input to pools: each raises the right class of the API error hierarchy and leaves the
pool exactly as it was (stats identical before and after)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

import streamrt as srt
from streamrt import MemPoolAttr
from tests.conftest import cpu_only, no_sanitizer

BLOCK = 2 << 20


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: bad input is refused the same way by every backend's pools."""
    return any_dev


def stream(dev) -> srt.Stream:
    return srt.Stream(dev, non_blocking=True)


@contextmanager
def unchanged(*pools: srt.MemPool, ignore: tuple[str, ...] = ()):
    """Assert that the block leaves every pool's stats as they were."""
    before = [{k: v for k, v in p.stats().items() if k not in ignore} for p in pools]
    yield
    after = [{k: v for k, v in p.stats().items() if k not in ignore} for p in pools]
    assert after == before


@pytest.fixture
def setup(dev):
    """A pool with one live and one freed block, and the stream that owns them."""
    pool = srt.MemPool(dev, release_threshold=1 << 30)
    s = stream(dev)
    live = s.malloc(4096, pool)
    freed = s.malloc(4096, pool)
    s.memset(freed, 0, 4096)
    s.free(freed)
    yield pool, s, live, freed
    s.free(live)


@pytest.mark.parametrize(
    ("size", "error"),
    [
        (-1, srt.InvalidValueError),
        (np.int64(-4096), srt.InvalidValueError),
        (1.5, srt.InvalidTypeError),
        ("4096", srt.InvalidTypeError),
        (None, srt.InvalidTypeError),
        (True, srt.InvalidTypeError),
    ],
)
def test_pool_malloc_bad_size(setup, size, error):
    pool, s, _, _ = setup
    pos = s._pos  # the fixture's work (on cuda its pool calls are stream operations too)
    with unchanged(pool), pytest.raises(error):
        s.malloc(size, pool)
    assert s._pos == pos  # nothing was enqueued either


@pytest.mark.parametrize("size", [1 << 62, 2**70])
def test_pool_malloc_absurd_size_is_oom(setup, size):
    pool, s, _, _ = setup
    before = pool.stats()
    # a cudaMemPool has no OOM counter, and its driver may release cached memory to retry
    native = before["oom_count"] is None
    ignore = ("oom_count", "reserved_mem_current") if native else ("oom_count",)
    with unchanged(pool, ignore=ignore), pytest.raises(srt.OutOfMemoryError):
        s.malloc(size, pool)
    assert native or pool.stats()["oom_count"] == before["oom_count"] + 1


def test_pool_malloc_bad_pool_argument(setup):
    pool, s, _, _ = setup
    with unchanged(pool), pytest.raises(srt.InvalidTypeError):
        s.malloc(512, pool="default")


@pytest.mark.parametrize("which", ["unknown", "interior", "double", "host", "srt_malloc"])
def test_pool_free_bad_pointer(setup, dev, which):
    pool, s, live, freed = setup
    raw = srt.malloc(512, dev)
    pinned = srt.malloc_host(512)
    try:
        ptr = {
            "unknown": 0xDEAD000,
            "interior": live + 512,
            "double": freed,
            "host": pinned,
            "srt_malloc": raw,  # not pool memory: srt.free releases it, not s.free
        }[which]
        with unchanged(pool, dev.default_mem_pool), pytest.raises(srt.InvalidAddressError):
            s.free(ptr)
    finally:
        srt.free(raw)
        srt.free_host(pinned)
    s.memset(live, 1, 4096)  # the live block is still live


@pytest.mark.parametrize("ptr", [1.0, "0x1000", None])
def test_pool_free_bad_pointer_type(setup, ptr):
    pool, s, _, _ = setup
    with unchanged(pool), pytest.raises(srt.InvalidTypeError):
        s.free(ptr)


def test_pool_free_on_stream_of_another_device(dev):
    dev1 = srt.Device("cpu:1")
    pool1 = srt.MemPool(dev1)
    s1 = srt.Stream(dev1, non_blocking=True)
    s0 = stream(dev)
    p = s1.malloc(4096, pool1)
    with unchanged(pool1), pytest.raises(srt.InvalidValueError):
        s0.free(p)  # a pool on cpu:1, a stream on cpu:0
    with unchanged(pool1), pytest.raises(srt.InvalidValueError):
        s0.malloc(4096, pool1)
    s1.free(p)  # still a live allocation of pool1: freeing it on its own device works
    assert pool1.stats()["free_count"] == 1
    s1.synchronize()
    pool1.destroy()


@pytest.mark.parametrize(
    "attr",
    [MemPoolAttr.RESERVED_MEM_CURRENT, MemPoolAttr.USED_MEM_CURRENT],
)
def test_pool_read_only_attributes(setup, attr):
    pool, _, _, _ = setup
    with unchanged(pool):
        for value in (0, 4096):
            with pytest.raises(srt.InvalidValueError):
                pool.set_attr(attr, value)
            with pytest.raises(srt.InvalidValueError):
                pool.set_attr(int(attr), value)
            with pytest.raises(srt.InvalidValueError):
                setattr(pool, attr.name.lower(), value)


@pytest.mark.parametrize("attr", [MemPoolAttr.RESERVED_MEM_HIGH, MemPoolAttr.USED_MEM_HIGH])
@pytest.mark.parametrize(("value", "error"), [(1, srt.InvalidValueError),
                                              (-1, srt.InvalidValueError),
                                              (1 << 40, srt.InvalidValueError),
                                              (0.0, srt.InvalidTypeError),
                                              ("0", srt.InvalidTypeError)])
def test_pool_high_watermark_accepts_only_zero(setup, attr, value, error):
    pool, _, _, _ = setup
    with unchanged(pool):
        with pytest.raises(error):
            pool.set_attr(attr, value)
        with pytest.raises(error):
            setattr(pool, attr.name.lower(), value)


@pytest.mark.parametrize("attr", [0, 9, -1, 100])
def test_pool_unknown_attribute(setup, attr):
    pool, _, _, _ = setup
    with unchanged(pool):
        with pytest.raises(srt.InvalidValueError):
            pool.get_attr(attr)
        with pytest.raises(srt.InvalidValueError):
            pool.set_attr(attr, 0)


@pytest.mark.parametrize(
    ("attr", "value", "error"),
    [
        (MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, 2, srt.InvalidValueError),
        (MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC, -1, srt.InvalidValueError),
        (MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES, "yes", srt.InvalidValueError),
        (MemPoolAttr.RELEASE_THRESHOLD, -1, srt.InvalidValueError),
        (MemPoolAttr.RELEASE_THRESHOLD, 1.5, srt.InvalidTypeError),
        (MemPoolAttr.RELEASE_THRESHOLD, True, srt.InvalidTypeError),
    ],
)
def test_pool_bad_attribute_values(setup, attr, value, error):
    pool, _, _, _ = setup
    with unchanged(pool):
        with pytest.raises(error):
            pool.set_attr(attr, value)
        with pytest.raises(error):
            setattr(pool, attr.name.lower(), value)


def test_pool_attributes_round_trip(setup):
    pool, _, _, _ = setup
    for attr, prop in [
        (MemPoolAttr.REUSE_FOLLOW_EVENT_DEPENDENCIES, "reuse_follow_event_dependencies"),
        (MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC, "reuse_allow_opportunistic"),
        (MemPoolAttr.REUSE_ALLOW_INTERNAL_DEPENDENCIES, "reuse_allow_internal_dependencies"),
    ]:
        assert pool.get_attr(attr) == 1 and getattr(pool, prop) is True
        pool.set_attr(attr, 0)
        assert pool.get_attr(attr) == 0 and getattr(pool, prop) is False
        setattr(pool, prop, True)
        assert pool.get_attr(int(attr)) == 1
    pool.release_threshold = 12345
    assert pool.get_attr(MemPoolAttr.RELEASE_THRESHOLD) == 12345
    st = pool.stats()
    for attr in MemPoolAttr:
        assert st[attr.name.lower()] == pool.get_attr(attr)


def test_pool_trim_to_bad_argument(setup):
    pool, _, _, _ = setup
    with unchanged(pool):
        with pytest.raises(srt.InvalidValueError):
            pool.trim_to(-1)
        with pytest.raises(srt.InvalidTypeError):
            pool.trim_to(1.0)
        with pytest.raises(srt.InvalidTypeError):
            pool.trim_to(None)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_size": -1}, srt.InvalidValueError),
        ({"max_size": 1.5}, srt.InvalidTypeError),
        ({"release_threshold": -1}, srt.InvalidValueError),
        ({"release_threshold": "1"}, srt.InvalidTypeError),
        ({"reuse_allow_opportunistic": 2}, srt.InvalidValueError),
    ],
)
def test_pool_create_bad_arguments(dev, kwargs, error):
    with pytest.raises(error):
        srt.MemPool(dev, **kwargs)


def test_pool_destroyed_pool_refuses_use(dev):
    pool = srt.MemPool(dev)
    s = stream(dev)
    p = s.malloc(4096, pool)
    pool.destroy()
    with unchanged(pool):
        with pytest.raises(srt.InvalidHandleError):
            s.malloc(4096, pool)
        with pytest.raises(srt.InvalidHandleError):
            pool.destroy()
        with pytest.raises(srt.InvalidHandleError):
            pool.set_attr(MemPoolAttr.RELEASE_THRESHOLD, 0)
        with pytest.raises(srt.InvalidHandleError):
            pool.trim_to(0)
    s.free(p)  # freeing its last allocation is still allowed
    s.synchronize()
    assert pool.reserved_mem_current == 0


def test_pool_default_pool_cannot_be_destroyed(dev):
    default = dev.default_mem_pool
    with unchanged(default), pytest.raises(srt.InvalidValueError):
        default.destroy()
    assert dev.default_mem_pool is default
    s = stream(dev)
    before = default.stats()
    p = s.malloc(64)  # still the working default pool
    s.free(p)
    assert default.stats()["alloc_count"] == before["alloc_count"] + 1


def test_pool_copies_and_memsets_stay_inside_one_live_block(dev):
    cpu_only(dev, "it relies on the cpu pool's block layout (a cudaMemPool places blocks its own way)")
    no_sanitizer("it uses a block's rounding slack, which the sanitizer holds out of bounds, as "
                 "compute-sanitizer does")
    pool = srt.MemPool(dev, release_threshold=1 << 30)
    s = stream(dev)
    b = s.malloc(512, pool)  # small requests fill a granule from its top down:
    a = s.malloc(1000, pool)  # 1024 bytes, right below b
    assert b == a + 1024
    s.memset(a, 1, 1024)  # the whole rounded block
    s.memset(a + 1000, 2, 24)  # an interior pointer, up to the end of the block
    s.memcpy(b, np.zeros(512, np.uint8), 512)
    host = np.zeros(2048, np.uint8)
    with unchanged(pool):
        pos = s._pos
        with pytest.raises(srt.InvalidAddressError):
            s.memset(a + 512, 0, 1024)  # runs into b: inside the chunk, outside the block
        with pytest.raises(srt.InvalidAddressError):
            s.memcpy(host, a, 1536)
        with pytest.raises(srt.InvalidAddressError):
            s.memcpy(b + 256, host, 512)
        with pytest.raises(srt.InvalidAddressError):
            s.memset(a - 1024, 0, 16)  # the free rest of the arena
        assert s._pos == pos  # nothing was enqueued
    s.free(b)
    with pytest.raises(srt.InvalidAddressError):
        s.memset(b, 0, 16)  # freed (in stream order): no new work may use it
    s.synchronize()
    out = srt.read(a, (1024,), np.uint8)
    assert (out[:1000] == 1).all() and (out[1000:] == 2).all()
    s.free(a)
