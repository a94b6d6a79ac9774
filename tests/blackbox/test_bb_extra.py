"""Further normative rules: threshold vs trim arithmetic, destroyed objects, bounds."""
from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops

from .conftest import alloc_then_free, call_with_timeout, fill, sync, sync_error

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


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


def test_executor_destroyed_cannot_run(dev):
    s = srt.Stream()
    x = srt.Tensor.from_numpy(np.ones(4, np.float32), stream=s)
    ws, ex = ops.add.get_workspace_size(x, x, x)
    ex.destroy()
    with pytest.raises(srt.ExecutorError):
        ops.add(None if ws == 0 else s.malloc(ws), ws, ex, s)
    sync(s)


def test_stream_destroyed_use_raises(dev):
    s = srt.Stream(non_blocking=True)
    s.destroy()
    with pytest.raises(srt.StreamRTError):
        s.launch_host_func(lambda: None)


def test_device_reset_destroys_streams_and_pools():
    d = srt.Device("cpu:1")
    with d:
        s = srt.Stream(non_blocking=True)
        pool = srt.MemPool(d)
        p = s.malloc(1024, pool)
        call_with_timeout(d.reset)
        with pytest.raises(srt.StreamRTError):
            s.launch_host_func(lambda: None)
        with pytest.raises(srt.StreamRTError):
            srt.read(p, (4,), np.uint8)
        s2 = srt.Stream(non_blocking=True)
        q = s2.malloc(64)
        s2.free(q)
        sync(s2)


def test_memcpy_nbytes_beyond_host_buffer(dev):
    s = srt.Stream()
    p = s.malloc(1024)
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(p, np.zeros(4, np.float32), 1024)
    s.free(p)
    sync(s)


def test_kernel_view_out_of_allocation_fails_launch(dev):
    s = srt.Stream()
    p = srt.malloc(16)
    s.launch(fill, p, 1 << 20, 1.0)
    if srt.sanitizer.enabled():      # a STREAMRT_SANITIZE run: the bad access is its finding
        assert "bound" in str(sync_error(s, srt.SanitizerError).kind).lower()
    else:
        sync_error(s)
    srt.free(p)


def test_read_invalid_address(dev):
    with pytest.raises(srt.InvalidAddressError):
        srt.read(0x7777_0000_0000, (4,), np.uint8)


def test_graph_exec_update_error_node_and_kernel_params(dev):
    g = srt.Graph()
    p = srt.malloc(64)
    k = g.add_kernel_node(fill, p, 16, 1.0, grid=2, block=8)
    assert k.params is not None
    ge = g.instantiate()
    h = srt.Graph()
    h.add_empty_node()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(h)
    assert ei.value.node is not None
    assert isinstance(ei.value, srt.StreamRTError)
    ge.destroy()
    srt.free(p)


def test_event_query_before_record_is_true(dev):
    # cudaEventQuery on a never-recorded event returns cudaSuccess
    assert srt.Event().query() is True
    call_with_timeout(srt.Event().synchronize)
