"""Access to graph memory: captured and explicit copies and memsets, frees on other streams and outside
the graph, and the device's graph memory info."""

from __future__ import annotations

import streamrt as srt
from tests.conftest import add_one_kernel, copy_kernel, fill_kernel
from tests.conftest import read_f32 as _read

N = 16


UNIT = 2 << 20  # 2 MiB: a multiple of every backend's graph granule (cuda: the VMM granularity)


def test_graph_memory_captured_free_on_other_stream(s, dev, out):
    s2 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    p = s.malloc(N * 4)
    s.launch(fill_kernel, p, N, 2.0)
    s2.wait(s.record())
    s2.launch(copy_kernel, out, p, N)
    s2.free(p)
    s.wait(s2.record())
    g = s.end_capture()
    types = [n.type for n in g.nodes()]
    assert types.count(srt.NodeType.MEM_ALLOC) == 1 and types.count(srt.NodeType.MEM_FREE) == 1
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 2.0).all()
    ge.destroy()


def test_graph_memory_captured_alloc_escapes_then_freed_outside(s, out):
    s.begin_capture()
    p = s.malloc(N * 4)
    s.launch(fill_kernel, p, N, 8.0)
    g = s.end_capture()
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
        s.launch(copy_kernel, out, p, N)
        s.free(p)
    s.synchronize()
    assert (_read(out) == 8.0).all()
    ge.destroy()


def test_graph_memory_captured_copy_and_memset_of_graph_memory(s, out):
    s.begin_capture()
    try:
        p = s.malloc(N * 4)
        s.memset(p, 0, N * 4)
        s.launch(add_one_kernel, p, N)
        s.memcpy(out, p, N * 4)
        s.free(p)
    finally:
        g = s.end_capture()
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 1.0).all()
    ge.destroy()


def test_graph_memory_explicit_copy_and_memset_of_graph_memory(s, out):
    g = srt.Graph()
    a = g.add_mem_alloc_node(N * 4)
    m = g.add_memset_node(a.ptr, 0, N * 4, deps=a)
    k = g.add_kernel_node(add_one_kernel, a.ptr, N, deps=m)
    c = g.add_memcpy_node(out, a.ptr, N * 4, deps=k)
    g.add_mem_free_node(a.ptr, deps=c)
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 1.0).all()
    ge.destroy()


def test_graph_memory_device_info(dev):
    base = dev.graph_mem_info()
    g = srt.Graph()
    a = g.add_mem_alloc_node(UNIT)
    ge = g.instantiate()
    info = dev.graph_mem_info()
    assert info["reserved"] - base["reserved"] == ge.memory_footprint >= UNIT
    s = srt.Stream(dev, non_blocking=True)
    ge.launch(s)
    assert dev.graph_mem_info()["used"] - base["used"] == UNIT  # live until freed
    s.free(a.ptr)
    s.synchronize()
    assert dev.graph_mem_info()["used"] == base["used"]
    ge.destroy()
    s.synchronize()
    dev.synchronize()
    assert dev.graph_mem_info()["reserved"] == base["reserved"]
