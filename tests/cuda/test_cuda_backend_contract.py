"""The cuda backend's side of ``backends/base.py``: ranges, native pools, graph runners. They need a
usable cuda device (a GPU, or ``STREAMRT_CUDA_FAKE=1``)."""

from __future__ import annotations

import pytest

import streamrt as srt
from streamrt.backends import get_backend
from streamrt.backends.base import GraphRunner, MemRange, NativePools
from tests.conftest import backend_device

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda0():
    """cuda:0, current for the test (the conftest's is not current)."""
    with backend_device("cuda") as d:
        yield d
        d.synchronize()


def test_cuda_range_of_malloc_is_the_whole_allocation_from_any_byte_of_it(cuda0):
    p = srt.malloc(1000, cuda0)
    impl = cuda0._impl
    try:
        want = MemRange(p, 1000, 0, "malloc", True)
        assert impl.range_of(p) == want
        assert impl.range_of(p + 999) == want
        assert get_backend("cuda").range_of(p + 10) == want
        assert impl.range_of(p + 1000) is None or impl.range_of(p + 1000).base != p
        assert want in impl.ranges()
    finally:
        srt.free(p)
    assert impl.range_of(p) is None
    assert get_backend("cuda").range_of(p) is None


def test_cuda_range_of_zero_bytes_holds_its_base(cuda0):
    p = srt.malloc(0, cuda0)
    try:
        assert cuda0._impl.range_of(p) == MemRange(p, 1, 0, "malloc", True)
    finally:
        srt.free(p)


def test_cuda_range_of_pinned_host_memory_has_no_device(cuda0):
    h = srt.malloc_host(64)  # of the current device's backend
    try:
        want = MemRange(h, 64, -1, "host", True)
        assert cuda0._impl.range_of(h + 63) == want
        assert get_backend("cuda").range_of(h) == want
    finally:
        srt.free_host(h)
    assert get_backend("cuda").range_of(h) is None


def test_cuda_range_of_a_native_pool_block_is_kind_pool(cuda0):
    s = srt.Stream(cuda0)
    p = s.malloc(256)
    s.synchronize()
    try:
        r = cuda0._impl.range_of(p + 5)
        assert (r.base, r.size, r.device, r.kind, r.mapped) == (p, 256, 0, "pool", True)
    finally:
        s.free(p)
        s.synchronize()
    assert cuda0._impl.range_of(p) is None


def test_cuda_range_of_graph_memory_is_mapped_only_while_an_exec_maps_it(cuda0):
    g = srt.Graph()
    a = g.add_mem_alloc_node(4096)  # graph memory of the current device
    r = cuda0._impl.range_of(a.ptr)
    assert (r.kind, r.device, r.mapped) == ("graph", 0, False)
    assert r.base <= a.ptr < r.end
    assert r in cuda0._impl.ranges()
    g.add_mem_free_node(a.ptr, deps=a)
    ge = g.instantiate()
    r = cuda0._impl.range_of(a.ptr)
    assert (r.kind, r.mapped) == ("graph", True)
    assert [x.base for x in cuda0._impl.ranges()].count(r.base) == 1  # once, mapped
    ge.destroy()
    cuda0.synchronize()


def test_cuda_device_declares_native_pools_runner_and_no_views(cuda0):
    impl = cuda0._impl
    assert isinstance(impl.pools, NativePools)
    assert impl.runner_per_stream is False
    with pytest.raises(srt.NotSupportedError):
        impl.view(0, (1,), "uint8", True)


def test_cuda_graph_runner_launches_as_one_queue_operation(cuda0):
    s = srt.Stream(cuda0)
    p = srt.malloc(16, cuda0)
    g = srt.Graph()
    g.add_memset_node(p, 7, 16)
    ge = g.instantiate()
    ge.upload(s)
    ge.launch(s)
    s.synchronize()
    runner = next(iter(ge._plans.values())).runner
    assert isinstance(runner, GraphRunner)
    fn, args = runner.op_launch(s._q)
    assert args == (s._q,)
    assert srt.read(p, 16, "uint8").tolist() == [7] * 16
    ge.destroy()
    srt.free(p)
