"""ExecutorCache: hits and misses, LRU eviction by entries and bytes, keys, addresses, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from tests.contract.ops_fixtures import ops_stream  # noqa: F401 (the fixture s)

F32, F64 = np.float32, np.float64




def live() -> int:
    return ops.stats()["live_executors"]


def T(s, a, dtype=F32):
    return srt.Tensor.from_numpy(np.asarray(a, dtype), stream=s)


def ws_size(op, *tensors, **attrs) -> int:
    """Phase 1's workspace size; the executor is destroyed (a dropped one is a leak)."""
    size, ex = op.get_workspace_size(*tensors, **attrs)
    ex.destroy()
    return size


def rnd(shape, seed=0, dtype=F32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_cache_hit_after_miss(s):
    c = ops.ExecutorCache()
    before = ops.stats()["softmax"]
    x, out = T(s, rnd((4, 8))), T(s, np.zeros((4, 8)))
    for _ in range(3):
        ops.run(ops.softmax, x, out, stream=s, cache=c)
    st = c.stats()
    assert (st["hits"], st["misses"], st["entries"]) == (2, 1, 1)
    assert st["bytes"] == ws_size(ops.softmax, x, out) > 0
    after = ops.stats()["softmax"]
    assert after["plans"] - before["plans"] == 1 + 1  # the run's plan and the size query above
    assert after["cache_hits"] - before["cache_hits"] == 2
    assert after["reuses"] - before["reuses"] == 2
    assert after["calls"] - before["calls"] == 3
    c.clear()


def test_cache_hit_results_are_right_with_new_tensors(s):
    c = ops.ExecutorCache()
    for seed in range(3):
        a, b = rnd((5, 6), seed), rnd((6,), seed + 10)
        out = T(s, np.zeros((5, 6)))
        ops.run("add", T(s, a), T(s, b), out, stream=s, cache=c, alpha=0.5)
        np.testing.assert_allclose(out.numpy(s), a + 0.5 * b, rtol=1e-6)
    assert c.stats()["hits"] == 2
    c.clear()


def test_cache_never_returns_stale_addresses(s, gate):
    c = ops.ExecutorCache()
    data = [rnd((64,), i) for i in range(4)]
    xs = [T(s, d) for d in data]
    outs = [T(s, np.zeros(64)) for _ in data]
    g = gate(s)  # all four runs are queued before any executes
    for x, o in zip(xs, outs):
        ops.run(ops.cumsum, x, o, stream=s, cache=c)
    g.open()
    for d, o in zip(data, outs):
        np.testing.assert_allclose(o.numpy(s), np.cumsum(d), rtol=1e-5, atol=1e-5)
    assert c.stats()["hits"] == 3
    # memory freed and reused for new tensors: the hit follows the new tensors only
    for x in xs:
        x.free()
    y = T(s, data[0] * 2)
    ops.run(ops.cumsum, y, outs[0], stream=s, cache=c)
    np.testing.assert_allclose(outs[0].numpy(s), np.cumsum(data[0] * 2), rtol=1e-5, atol=1e-5)
    c.clear()


def test_cache_never_hits_with_a_freed_tensor(s):
    c = ops.ExecutorCache()
    x, out = T(s, rnd((4, 8))), T(s, np.zeros((4, 8)))
    ops.run(ops.softmax, x, out, stream=s, cache=c)
    x.free()
    with pytest.raises(srt.ExecutorError) as info:
        ops.run(ops.softmax, x, out, stream=s, cache=c)
    assert info.value.code == 161001 and c.stats()["hits"] == 0
    c.clear()


def _variants(s):
    """(name, first call args, second call args): same op, metadata differing in one way."""
    base = rnd((4, 6))
    big = T(s, np.zeros((8, 12)))
    s1 = srt.Stream("cpu:1", non_blocking=True)
    return s1, [
        ("shape", (T(s, base), T(s, np.zeros((4, 6)))), {},
         (T(s, base[:3]), T(s, np.zeros((3, 6)))), {}),
        ("dtype", (T(s, base), T(s, np.zeros((4, 6)))), {},
         (T(s, base, F64), T(s, np.zeros((4, 6)), F64)), {}),
        ("strides", (T(s, base), T(s, np.zeros((4, 6)))), {},
         (big.as_strided((4, 6), (24, 2)), T(s, np.zeros((4, 6)))), {}),
        ("offset", (big.as_strided((4, 6), (12, 1)), T(s, np.zeros((4, 6)))), {},
         (big.as_strided((4, 6), (12, 1), 1), T(s, np.zeros((4, 6)))), {}),
        ("format", (T(s, np.zeros((1, 2, 3, 4))), T(s, np.zeros((1, 2, 3, 4)))), {},
         (T(s, np.zeros((1, 2, 3, 4))).as_strided((1, 2, 3, 4), (24, 12, 4, 1), format="NCHW"),
          T(s, np.zeros((1, 2, 3, 4)))), {}),
        ("attrs", (T(s, base), T(s, np.zeros((4, 6)))), {"axis": -1},
         (T(s, base), T(s, np.zeros((4, 6)))), {"axis": 0}),
        ("device", (T(s, base), T(s, np.zeros((4, 6)))), {},
         (srt.Tensor.from_numpy(base, stream=s1), srt.Tensor.empty((4, 6), F32, stream=s1)), {}),
    ]


def test_cache_never_hits_on_different_metadata(s):
    s1, variants = _variants(s)
    for name, args1, attrs1, args2, attrs2 in variants:
        c = ops.ExecutorCache()
        ops.run(ops.softmax, *args1, stream=s, cache=c, **attrs1)
        stream2 = s1 if name == "device" else s
        ops.run(ops.softmax, *args2, stream=stream2, cache=c, **attrs2)
        stream2.synchronize()
        st = c.stats()
        assert (st["hits"], st["misses"], st["entries"]) == (0, 2, 2), name
        x = args2[0].numpy(stream2).astype(F64)
        axis = attrs2.get("axis", -1)
        e = np.exp(x - x.max(axis, keepdims=True))
        np.testing.assert_allclose(args2[1].numpy(stream2), e / e.sum(axis, keepdims=True),
                                   rtol=1e-5, err_msg=name)
        c.clear()
    s1.synchronize()
    s1.destroy()


@pytest.mark.parametrize("good, bad", [({"alpha": 1}, {"alpha": True}),
                                       ({"alpha": 2.0}, {"alpha": "2.0"})])
def test_cache_keys_attrs_by_type(s, good, bad):
    """An attribute equal to a cached one but of another type is planned (and refused)."""
    c = ops.ExecutorCache()
    x = T(s, np.ones(4))
    ops.run(ops.add, x, x, x, stream=s, cache=c, **good)
    with pytest.raises(srt.ExecutorError) as info:
        ops.run(ops.add, x, x, x, stream=s, cache=c, **bad)
    assert info.value.code == 161002
    c.clear()


def test_cache_keys_float_attrs_by_their_exact_value(s):
    # -0.0 == 0.0: alpha=-0.0 hit alpha=0.0's executor and gave +0.0 where numpy gives -0.0;
    # nan != nan: alpha=nan never hit, planned every call and pushed live entries out
    c = ops.ExecutorCache()
    x = T(s, np.full(2, -0.0))
    y = T(s, np.array([1.0, 5.0]))
    o = T(s, np.zeros(2))
    for alpha in (0.0, -0.0, np.float32(-0.0)):
        ops.run(ops.add, x, y, o, stream=s, alpha=alpha, cache=c)
        want = np.float32(-0.0) + np.float32(alpha) * np.array([1.0, 5.0], np.float32)
        assert (np.signbit(o.numpy(s)) == np.signbit(want)).all(), alpha
    assert c.stats()["hits"] == 0 and len(c) == 3
    for _ in range(3):
        ops.run(ops.add, x, y, o, stream=s, alpha=float("nan"), cache=c)
    assert c.stats()["hits"] == 2 and len(c) == 4
    c.clear()


def test_cache_reduce_axis_as_list_is_not_cached_but_runs(s):
    c = ops.ExecutorCache()
    a = rnd((3, 4, 5))
    out = T(s, np.zeros(4))
    ops.run(ops.reduce_sum, T(s, a), out, stream=s, cache=c, axis=[0, 2])
    np.testing.assert_allclose(out.numpy(s), a.sum((0, 2)), rtol=1e-5)
    assert c.stats()["entries"] == 0


def test_cache_evicts_least_recently_used_by_entries(s):
    c = ops.ExecutorCache(max_entries=2)
    before = live()
    ts = {n: (T(s, rnd((n,))), T(s, np.zeros(n))) for n in (10, 20, 30)}

    def run(n):
        ops.run(ops.cumsum, *ts[n], stream=s, cache=c)

    run(10)
    run(20)
    run(10)  # 10 is now the most recently used
    run(30)  # evicts 20
    st = c.stats()
    assert (st["entries"], st["evictions"], st["hits"], st["misses"]) == (2, 1, 1, 3)
    run(10)
    assert c.stats()["hits"] == 2
    run(20)
    assert c.stats()["misses"] == 4
    s.synchronize()
    assert live() == before + 2  # evicted executors were released
    c.clear()
    assert live() == before and c.stats()["entries"] == 0 and c.stats()["hits"] == 0


def test_cache_evicts_by_bytes(s):
    x1, o1 = T(s, rnd((256, 8))), T(s, np.zeros((256, 8)))
    x2, o2 = T(s, rnd((128, 8))), T(s, np.zeros((128, 8)))
    w1 = ws_size(ops.softmax, x1, o1)
    w2 = ws_size(ops.softmax, x2, o2)
    assert w1 > w2 > 0
    c = ops.ExecutorCache(max_bytes=w1 + w2 - 1)
    ops.run(ops.softmax, x1, o1, stream=s, cache=c)
    ops.run(ops.softmax, x2, o2, stream=s, cache=c)  # w1 + w2 > max_bytes: x1's goes
    st = c.stats()
    assert (st["entries"], st["bytes"], st["evictions"]) == (1, w2, 1)
    ops.run(ops.softmax, x2, o2, stream=s, cache=c)
    assert c.stats()["hits"] == 1
    c.clear()


def test_cache_skips_an_executor_larger_than_max_bytes(s):
    before = live()
    x, o = T(s, rnd((64, 8))), T(s, np.zeros((64, 8)))
    c = ops.ExecutorCache(max_bytes=16)
    ops.run(ops.softmax, x, o, stream=s, cache=c)
    s.synchronize()
    assert c.stats()["entries"] == 0 and live() == before  # ran once, released
    ws0 = ops.ExecutorCache(max_entries=0)
    ops.run(ops.softmax, x, o, stream=s, cache=ws0, sync=True)
    assert ws0.stats()["entries"] == 0 and live() == before


def test_cache_entries_are_per_thread(s):
    c = ops.ExecutorCache()
    x, o = T(s, rnd((4, 8))), T(s, np.zeros((4, 8)))
    ops.run(ops.softmax, x, o, stream=s, cache=c)
    ops.run(ops.softmax, x, o, stream=s, cache=c)
    before = live()
    seen = {}

    def worker():
        ts = srt.Stream(non_blocking=True)  # each thread its own stream, like the seed says
        xo = (T(ts, rnd((4, 8))), T(ts, np.zeros((4, 8))))
        ops.run(ops.softmax, *xo, stream=ts, cache=c)
        ops.run(ops.softmax, *xo, stream=ts, cache=c)
        ts.synchronize()
        seen.update(c.stats(this_thread=True))
        seen["live_in_thread"] = live()
        ts.destroy()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert (seen["hits"], seen["misses"], seen["entries"]) == (1, 1, 1)  # no hit on ours
    assert seen["live_in_thread"] == before + 1
    assert live() == before  # the thread ended: its entries were released
    st = c.stats()  # all threads: its counts are kept
    assert (st["hits"], st["misses"], st["entries"]) == (2, 2, 1)
    c.clear()


@pytest.mark.parametrize("kwargs, exc", [({"max_entries": -1}, srt.InvalidValueError),
                                         ({"max_entries": 2.0}, srt.InvalidTypeError),
                                         ({"max_bytes": -5}, srt.InvalidValueError),
                                         ({"max_bytes": "1k"}, srt.InvalidTypeError)])
def test_cache_rejects_bad_bounds(kwargs, exc):
    with pytest.raises(exc):
        ops.ExecutorCache(**kwargs)


def test_cache_repr_and_len(s):
    c = ops.ExecutorCache()
    x = T(s, np.ones(3))
    ops.run(ops.mul, x, x, x, stream=s, cache=c)
    assert len(c) == 1 and "entries=1" in repr(c)
    c.clear()
    assert len(c) == 0


def test_cache_thread_store_retired_while_the_cache_is_locked(s, monkeypatch):
    # a thread's store is retired by a finalizer, wherever the collector runs it: it must never
    # wait for the cache's lock (held here by this thread, as by a collection inside stats())
    from tests.conftest import reentry_lock

    c = ops.ExecutorCache()
    ready, leave = threading.Event(), threading.Event()

    def worker():
        ts = srt.Stream(non_blocking=True)
        xo = (T(ts, rnd((4, 8))), T(ts, np.zeros((4, 8))))
        ops.run(ops.softmax, *xo, stream=ts, cache=c)
        ops.run(ops.softmax, *xo, stream=ts, cache=c)
        ts.synchronize()
        ts.destroy()
        ready.set()
        leave.wait()

    lock = reentry_lock(monkeypatch, c, c._reclaim)
    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    with lock:
        leave.set()
        t.join(timeout=60)  # the store's finalizer runs as the thread ends
        assert not t.is_alive(), "the store's finalizer waited for the cache's lock"
    st = c.stats()  # the retired store's counts arrive once the lock is free
    assert (st["hits"], st["misses"], st["entries"]) == (1, 1, 0)


def test_cache_keys_the_implementation_version(s, monkeypatch):
    """A plan change bumps ``Op.version``: executors planned by the old version never hit."""
    c = ops.ExecutorCache()
    x, out = T(s, rnd((4, 8))), T(s, np.zeros((4, 8)))
    ops.run(ops.softmax, x, out, stream=s, cache=c)
    monkeypatch.setattr(type(ops.softmax), "version", ops.softmax.version + 1)
    ops.run(ops.softmax, x, out, stream=s, cache=c)
    st = c.stats()
    assert (st["hits"], st["misses"], st["entries"]) == (0, 2, 2)
    c.clear()


@pytest.mark.parametrize("bad", [(0, True), (0, 1.0)])
def test_cache_keys_tuple_attrs_by_element_type(s, bad):
    """``(0, True) == (0, 1)``: a hit would skip phase 1, which refuses a bool or float axis."""
    c = ops.ExecutorCache()
    a = rnd((3, 4, 5))
    x, out = T(s, a), T(s, np.zeros(5))
    ops.run(ops.reduce_sum, x, out, stream=s, cache=c, axis=(0, 1))
    with pytest.raises(srt.ExecutorError) as info:
        ops.run(ops.reduce_sum, x, out, stream=s, cache=c, axis=bad)
    assert info.value.code == 161002 and c.stats()["hits"] == 0
    ops.run(ops.reduce_sum, x, out, stream=s, cache=c, axis=(0, 1))  # equal, same types: a hit
    np.testing.assert_allclose(out.numpy(s), a.sum((0, 1)), rtol=1e-5)
    assert c.stats()["hits"] == 1
    c.clear()


def test_cache_stats_exact_under_threads(s):
    """Counters are per-thread lists summed on read (no lock on the hit path): calls, reuses and
    cache hits of many threads hitting at once, with resets of another thread, stay exact."""
    c = ops.ExecutorCache()
    threads, calls = 4, 300
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            ts = srt.Stream(non_blocking=True)
            x, out = T(ts, rnd((4, 8))), T(ts, np.zeros((4, 8)))
            start.wait()
            for _ in range(calls):
                ops.run(ops.add, x, x, out, stream=ts, cache=c)
            ts.synchronize()
            ts.destroy()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    ops.stats(reset=True)
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not errors
    st = ops.stats()["add"]
    # each thread plans once (a miss), then hits: every call counted once, every hit a reuse
    assert st["calls"] == threads * calls and st["plans"] == threads
    assert st["cache_hits"] == threads * (calls - 1) == st["reuses"]
    assert c.stats()["hits"] == threads * (calls - 1) and c.stats()["misses"] == threads
    assert ops.stats(reset=True)["add"]["calls"] == threads * calls
    assert ops.stats()["add"]["calls"] == 0  # a reset zeroes what every thread counted


def test_cache_hit_after_set_addr_in_place_still_checks_overlap(s):
    """The overlap check is skipped only for the very addresses it last accepted: a repeatable
    executor whose output is re-pointed (``_addrs`` changed in place) onto its input is refused."""
    a = T(s, np.arange(64) % 5)
    x = srt.Tensor(srt.TensorDesc((16,), F32), a.ptr)
    out = srt.Tensor(srt.TensorDesc((16,), F32), a.ptr + 128)
    size, ex = ops.cumsum.get_workspace_size(x, out, axis=0)
    ex.set_repeatable()
    ws = s.malloc(size) if size else None
    try:
        ops.cumsum(ws, size, ex, s)  # apart: accepted
        ops.cumsum(ws, size, ex, s)  # the same addresses again: accepted
        ex.set_output_addr(0, a.ptr + 4)  # now overlapping its input, not the same view
        with pytest.raises(srt.ExecutorError, match="overlaps"):
            ops.cumsum(ws, size, ex, s)
    finally:
        s.synchronize()
        if ws is not None:
            s.free(ws)
        ex.destroy()
