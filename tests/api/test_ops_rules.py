"""API.md §4 and DESIGN.md §4, seed 001: two-phase operators, executors, cache, ops.run."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops

from .conftest import Gate, call_with_timeout, other_thread, sync

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


@pytest.fixture
def s(dev):
    return srt.Stream(non_blocking=True)


def T(a, s):
    return srt.Tensor.from_numpy(np.ascontiguousarray(a), stream=s)


def plan_on_ones(op, s):
    """op planned with four ones as both inputs into a new 4-float out: (x, out, ws_size, ex)."""
    x = T(np.ones((4,), np.float32), s)
    out = srt.Tensor.empty((4,), np.float32, stream=s)
    ws, ex = op.get_workspace_size(x, x, out)
    return x, out, ws, ex


def test_ops_api_md_example(s):
    x = srt.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    out = srt.Tensor.empty((3,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    assert isinstance(ws_size, int) and ws_size >= 0
    assert ex.workspace_size == ws_size and ex.op_name == "reduce_sum" and ex.repeatable is False
    ws = s.malloc(max(ws_size, 1))
    ops.reduce_sum(ws, ws_size, ex, s)
    s.free(ws)
    res = call_with_timeout(out.numpy, s)
    assert res.tolist() == [6.0, 22.0, 38.0]


def test_ops_OPS_lists_every_operator():
    for name in ("add", "mul", "reduce_sum", "softmax", "layer_norm", "matmul", "cumsum"):
        assert name in ops.OPS and ops.OPS[name] is getattr(ops, name)


def test_tensor_attributes(s):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = T(a, s)
    assert t.shape == (2, 3) and np.dtype(t.dtype) == np.float32 and t.nbytes == 24
    assert isinstance(t.ptr, int) and isinstance(t.desc, srt.TensorDesc)
    assert (call_with_timeout(t.numpy, s) == a).all()
    e = srt.Tensor.empty((4,), np.int32, stream=s)
    assert e.shape == (4,) and e.nbytes == 16
    t.free(s)
    e.free(s)
    sync(s)


def test_tensor_desc_and_wrap(s):
    d = srt.TensorDesc((2, 2), np.float32)
    assert tuple(d.shape) == (2, 2)
    p = s.malloc(16)
    s.memcpy(p, np.array([1, 2, 3, 4], np.float32), 16)
    t = srt.Tensor(d, p)
    assert t.ptr == p and (call_with_timeout(t.numpy, s) == [[1, 2], [3, 4]]).all()
    # strided view (transpose) via strides in elements
    dt = srt.TensorDesc((2, 2), np.float32, strides=(1, 2))
    out = srt.Tensor.empty((2,), np.float32, stream=s)
    ops.run(ops.reduce_sum, srt.Tensor(dt, p), out, stream=s, axis=1)
    assert call_with_timeout(out.numpy, s).tolist() == [4.0, 6.0]


def test_tensor_pool_argument(s):
    pool = srt.MemPool(release_threshold=1 << 30)
    t = srt.Tensor.empty((256,), np.float32, stream=s, pool=pool)
    assert pool.used_mem_current >= 1024
    t.free(s)
    sync(s)


def test_ops_phase1_never_reads_data(s):
    x = srt.Tensor.empty((4, 8), np.float32, stream=s)
    out = srt.Tensor.empty((4,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    data = np.random.default_rng(0).random((4, 8), dtype=np.float32)
    s.memcpy(x.ptr, data, data.nbytes)    # data arrives after phase 1, before phase 2
    ws = s.malloc(max(ws_size, 1))
    ops.reduce_sum(ws, ws_size, ex, s)
    s.free(ws)
    np.testing.assert_allclose(call_with_timeout(out.numpy, s), data.sum(1), rtol=1e-5)


def test_ops_phase2_enqueues_only(s):
    g = Gate()
    x = T(np.ones((4, 4), np.float32), s)
    out = srt.Tensor.empty((4,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    ws = s.malloc(max(ws_size, 1))
    g.hold(s)
    ops.reduce_sum(ws, ws_size, ex, s)    # returns while the stream is held
    assert not s.query()
    g.open()
    s.free(ws)
    assert call_with_timeout(out.numpy, s).tolist() == [4, 4, 4, 4]


def test_ops_workspace_depends_on_shape(s):
    def ws_of(rows, cols):
        x = srt.Tensor.empty((rows, cols), np.float32, stream=s)
        o = srt.Tensor.empty((rows,), np.float32, stream=s)
        size, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
        ex.destroy()
        return size

    assert ws_of(1024, 1024) > ws_of(1, 1)


def test_ops_size_mismatch_and_small_workspace(s):
    x = T(np.ones((64, 4096), np.float32), s)
    out = srt.Tensor.empty((64,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    assert ws_size > 0
    ws = s.malloc(ws_size)
    with pytest.raises(srt.ExecutorError) as ei:
        ops.reduce_sum(ws, ws_size + 512, ex, s)     # size passed must equal phase 1's
    assert ei.value.code == 161002
    small = s.malloc(max(ws_size // 4, 1))
    with pytest.raises(srt.ExecutorError):
        ops.reduce_sum(small, ws_size, ex, s)
    with pytest.raises(srt.ExecutorError):
        ops.reduce_sum(None, ws_size, ex, s)
    with pytest.raises(srt.ExecutorError):
        ops.reduce_sum(0x1234_0000, ws_size, ex, s)  # not a valid device allocation
    ops.reduce_sum(ws, ws_size, ex, s)               # the executor is still usable once
    s.free(ws)
    s.free(small)
    assert call_with_timeout(out.numpy, s).tolist() == [4096.0] * 64


def test_ops_zero_workspace_accepts_none(s):
    x = T(np.ones((2, 3), np.float32), s)
    y = T(np.ones((2, 3), np.float32), s)
    out = srt.Tensor.empty((2, 3), np.float32, stream=s)
    ws, ex = ops.add.get_workspace_size(x, y, out)
    if ws == 0:
        ops.add(None, 0, ex, s)
        assert (call_with_timeout(out.numpy, s) == 2).all()
    else:
        ex.destroy()


def test_ops_non_repeatable_runs_once(s):
    _, _, ws, ex = plan_on_ones(ops.mul, s)
    w = s.malloc(max(ws, 1))
    ops.mul(w, ws, ex, s)
    with pytest.raises(srt.ExecutorError):
        ops.mul(w, ws, ex, s)
    ex.destroy()       # safe on an executor that already ran once
    s.free(w)
    sync(s)


def test_ops_repeatable_and_set_addr(s):
    a = T(np.full((4096,), 2, np.float32), s)
    b = T(np.full((4096,), 3, np.float32), s)
    c = T(np.full((4096,), 10, np.float32), s)
    out = srt.Tensor.empty((4096,), np.float32, stream=s)
    out2 = srt.Tensor.empty((4096,), np.float32, stream=s)
    ws, ex = ops.add.get_workspace_size(a, b, out)
    ex.set_repeatable()
    assert ex.repeatable is True
    w = s.malloc(max(ws, 1))
    ops.add(w, ws, ex, s)
    ops.add(w, ws, ex, s)
    assert (call_with_timeout(out.numpy, s) == 5).all()
    ex.set_input_addr(1, c.ptr)
    ex.set_output_addr(0, out2.ptr)
    ops.add(w, ws, ex, s)
    assert (call_with_timeout(out2.numpy, s) == 12).all()
    assert (call_with_timeout(out.numpy, s) == 5).all()
    with pytest.raises(srt.ExecutorError):
        ex.set_input_addr(0, 0xBAD000)            # not live memory
    small = s.malloc(1024)
    with pytest.raises(srt.ExecutorError):
        ex.set_input_addr(0, small)               # no room for the tensor
    ex.destroy()
    s.free(w)
    s.free(small)
    sync(s)


def test_ops_set_addr_needs_repeatable(s):
    a, _, ws, ex = plan_on_ones(ops.add, s)
    with pytest.raises(srt.ExecutorError):
        ex.set_input_addr(0, a.ptr)
    ex.destroy()


def test_ops_executor_owned_by_thread(s):
    _, out, ws, ex = plan_on_ones(ops.add, s)
    w = s.malloc(max(ws, 1))
    box = other_thread(ops.add, w, ws, ex, s)
    assert isinstance(box.get("e"), srt.ExecutorError)
    ops.add(w, ws, ex, s)
    s.free(w)
    assert (call_with_timeout(out.numpy, s) == 2).all()


def test_ops_run_numerics(s):
    rng = np.random.default_rng(1)
    x = rng.random((5, 7), dtype=np.float32)
    y = rng.random((5, 7), dtype=np.float32)
    row = rng.random((7,), dtype=np.float32)
    tx, ty, tr = T(x, s), T(y, s), T(row, s)
    o = srt.Tensor.empty((5, 7), np.float32, stream=s)
    ops.run(ops.add, tx, ty, o, stream=s)
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), x + y, rtol=1e-6)
    ops.run(ops.add, tx, tr, o, stream=s, alpha=2.0)        # broadcast, alpha
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), x + 2 * row, rtol=1e-6)
    ops.run(ops.mul, tx, ty, o, stream=s)
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), x * y, rtol=1e-6)
    ops.run(ops.softmax, tx, o, stream=s)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), e / e.sum(-1, keepdims=True), rtol=1e-5)
    ops.run(ops.cumsum, tx, o, stream=s, axis=1)
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), np.cumsum(x, 1), rtol=1e-5)
    m = srt.Tensor.empty((5, 5), np.float32, stream=s)
    ops.run(ops.matmul, tx, T(y.T.copy(), s), m, stream=s)
    np.testing.assert_allclose(call_with_timeout(m.numpy, s), x @ y.T, rtol=1e-4)
    r = srt.Tensor.empty((5,), np.float32, stream=s)
    ops.run(ops.reduce_sum, tx, r, stream=s, axis=1, sync=True)
    np.testing.assert_allclose(r.numpy(s), x.sum(1), rtol=1e-5)


def test_ops_run_large_shapes_use_workspace(s):
    rng = np.random.default_rng(2)
    x = rng.random((300, 2000), dtype=np.float32)
    tx = T(x, s)
    r = srt.Tensor.empty((300,), np.float32, stream=s)
    ops.run(ops.reduce_sum, tx, r, stream=s, axis=1)
    np.testing.assert_allclose(call_with_timeout(r.numpy, s), x.sum(1), rtol=1e-4)
    a = rng.random((64, 4096), dtype=np.float32)
    b = rng.random((4096, 32), dtype=np.float32)
    o = srt.Tensor.empty((64, 32), np.float32, stream=s)
    ops.run(ops.matmul, T(a, s), T(b, s), o, stream=s)
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), a @ b, rtol=1e-3)
    c = srt.Tensor.empty((300, 2000), np.float32, stream=s)
    ops.run(ops.cumsum, tx, c, stream=s, axis=1)
    np.testing.assert_allclose(call_with_timeout(c.numpy, s), np.cumsum(x, 1), rtol=1e-3)


def test_ops_inplace_ok_partial_overlap_refused(s):
    a = np.arange(16, dtype=np.float32)
    t = T(a, s)
    ops.run(ops.add, t, t, t, stream=s)
    assert (call_with_timeout(t.numpy, s) == 2 * a).all()
    shifted = srt.Tensor(srt.TensorDesc((8,), np.float32), t.ptr + 16)
    head = srt.Tensor(srt.TensorDesc((8,), np.float32), t.ptr)
    live = ops.stats()["live_executors"]
    with pytest.raises(srt.ExecutorError) as ei:
        ops.run(ops.add, head, head, shifted, stream=s)
    assert ei.value.code == 161002
    assert ops.stats()["live_executors"] == live


def test_ops_run_error_releases_everything(s):
    pool = srt.MemPool(release_threshold=1 << 30)
    srt.Device("cpu:0").set_mem_pool(pool)
    try:
        x = T(np.ones((3, 4), np.float32), s)
        y = T(np.ones((5, 6), np.float32), s)
        o = srt.Tensor.empty((3, 4), np.float32, stream=s)
        sync(s)
        used = pool.used_mem_current
        live = ops.stats()["live_executors"]
        with pytest.raises(srt.StreamRTError):
            ops.run(ops.add, x, y, o, stream=s)   # shapes do not broadcast
        with pytest.raises(srt.StreamRTError):
            ops.run(ops.reduce_sum, x, o, stream=s, axis=7)
        sync(s)
        assert pool.used_mem_current == used
        assert ops.stats()["live_executors"] == live
    finally:
        srt.Device("cpu:0").set_mem_pool(srt.Device("cpu:0").default_mem_pool)


def test_ops_phase1_validates_metadata(s):
    x = srt.Tensor.empty((3, 4), np.float32, stream=s)
    bad_out = srt.Tensor.empty((4,), np.float32, stream=s)
    with pytest.raises(srt.StreamRTError):
        ops.reduce_sum.get_workspace_size(x, bad_out, axis=1)
    i = srt.Tensor.empty((3, 4), np.int64, stream=s)
    with pytest.raises(srt.StreamRTError):
        ops.softmax.get_workspace_size(i, i)


def test_ops_cache_hits_and_stats(s):
    x = srt.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    cache = ops.ExecutorCache()
    before = ops.stats().get("softmax", {})
    for _ in range(50):
        ops.run(ops.softmax, x, x, stream=s, cache=cache)
    sync(s)
    st = cache.stats()
    assert isinstance(st, dict)
    after = ops.stats()["softmax"]
    plans = after.get("plans", 0) - before.get("plans", 0)
    hits = after.get("cache_hits", after.get("hits", 0)) - before.get("cache_hits", before.get("hits", 0))
    assert plans == 1 and hits == 49
    assert after["calls"] - before.get("calls", 0) == 50
    assert "live_executors" in ops.stats()
    cache.clear()
    # softmax applied 50 times in place on rows: each row converges to uniform-ish values
    r = call_with_timeout(x.numpy, s)
    np.testing.assert_allclose(r.sum(1), 1.0, rtol=1e-5)


def test_ops_cache_keyed_by_metadata_and_attrs(s):
    cache = ops.ExecutorCache()
    a = T(np.ones((4, 4), np.float32), s)
    b = T(np.ones((4, 8), np.float32), s)
    oa = srt.Tensor.empty((4,), np.float32, stream=s)
    ob = srt.Tensor.empty((4,), np.float32, stream=s)
    ops.run(ops.reduce_sum, a, oa, stream=s, cache=cache, axis=1)
    ops.run(ops.reduce_sum, b, ob, stream=s, cache=cache, axis=1)
    assert call_with_timeout(oa.numpy, s).tolist() == [4] * 4
    assert call_with_timeout(ob.numpy, s).tolist() == [8] * 4
    o2 = srt.Tensor.empty((4,), np.float32, stream=s)
    ops.run(ops.add, a, a, a, stream=s, cache=cache, alpha=1.0)
    ops.run(ops.add, a, a, a, stream=s, cache=cache, alpha=3.0)   # 1+1=2; 2+3*2=8
    assert (call_with_timeout(a.numpy, s) == 8).all()
    # different addresses, same metadata: a hit that must use the new addresses
    c = T(np.full((4, 4), 5, np.float32), s)
    ops.run(ops.reduce_sum, c, o2, stream=s, cache=cache, axis=1)
    assert call_with_timeout(o2.numpy, s).tolist() == [20] * 4


def test_ops_cache_max_entries(s):
    cache = ops.ExecutorCache(max_entries=2)
    for n in (2, 3, 4, 5):
        x = T(np.ones((n,), np.float32), s)
        ops.run(ops.add, x, x, x, stream=s, cache=cache)
    sync(s)
    st = cache.stats()
    size = st.get("entries", st.get("size", st.get("len")))
    if size is not None:
        assert size <= 2


def test_ops_live_executors_return_to_baseline(s):
    x = T(np.ones((8, 8), np.float32), s)
    o = srt.Tensor.empty((8,), np.float32, stream=s)
    sync(s)
    base = ops.stats()["live_executors"]
    for _ in range(5):
        ops.run(ops.reduce_sum, x, o, stream=s, axis=1)
    sync(s)
    assert ops.stats()["live_executors"] == base


def test_ops_seed001_template_flow(s):
    # InvokeAclnnTwoPhase: phase 1, workspace (min 1 unit), phase 2, sync, free, destroy
    x = T(np.arange(8, dtype=np.float32).reshape(2, 4), s)
    out = srt.Tensor.empty((2, 4), np.float32, stream=s)
    size, ex = ops.cumsum.get_workspace_size(x, out, axis=1)
    ws = srt.malloc(max(size, 1))
    ops.cumsum(ws, size, ex, s)
    sync(s)
    srt.free(ws)
    ex.destroy()
    assert call_with_timeout(out.numpy, s).tolist() == [[0, 1, 3, 6], [4, 9, 15, 22]]


def test_ops_layer_norm_runs(s):
    rng = np.random.default_rng(3)
    x = rng.random((4, 16), dtype=np.float32)
    o = srt.Tensor.empty((4, 16), np.float32, stream=s)
    w = T(np.ones(16, np.float32), s)
    b = T(np.zeros(16, np.float32), s)
    ops.run(ops.layer_norm, T(x, s), w, b, o, stream=s)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(call_with_timeout(o.numpy, s), ref, rtol=1e-3, atol=1e-4)


def test_ops_captured_executor_kept_alive(s):
    x = T(np.ones((4, 4), np.float32), s)
    o = srt.Tensor.empty((4,), np.float32, stream=s)
    sync(s)
    s.begin_capture(srt.CaptureMode.THREAD_LOCAL)
    ops.run(ops.reduce_sum, x, o, stream=s, axis=1)
    g = s.end_capture()
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    sync(s)
    assert call_with_timeout(o.numpy, s).tolist() == [4] * 4
    s.memcpy(x.ptr, np.full((4, 4), 2, np.float32), 64)
    ge.launch(s)
    assert call_with_timeout(o.numpy, s).tolist() == [8] * 4
    ge.destroy()


def test_executor_destroyed_cannot_run(dev):
    s = srt.Stream()
    x = srt.Tensor.from_numpy(np.ones(4, np.float32), stream=s)
    ws, ex = ops.add.get_workspace_size(x, x, x)
    ex.destroy()
    with pytest.raises(srt.ExecutorError):
        ops.add(None if ws == 0 else s.malloc(ws), ws, ex, s)
    sync(s)
