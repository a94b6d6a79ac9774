"""Graph memory relaunch rules (DESIGN.md §3): an unfreed allocation refuses a relaunch unless freed
(in the graph, by auto-free on launch, outside the graph, or by another graph); addresses stay."""

from __future__ import annotations

import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, copy_kernel
from tests.conftest import read_f32 as _read
from tests.contract.graph.graph_memory import FREES, _free_outside, _pairs_chain, add_kernel

N = 16


UNIT = 2 << 20  # 2 MiB: a multiple of every backend's graph granule (cuda: the VMM granularity)


def test_graph_memory_relaunch_with_unfreed_allocation_refused(s, out):
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.InvalidValueError, match="never freed"):
        ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_memory_auto_free_on_launch_allows_relaunch(s, out):
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    g.add_kernel_node(add_kernel, out, a.ptr, N, deps=g.nodes()[-1])
    ge = g.instantiate(auto_free_on_launch=True)
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(out) == 0.0).all()  # fill value 0.0 in _pairs_chain(1)
    ge.destroy()


def test_graph_memory_auto_free_on_launch_frees_the_previous_allocation(s, dev):
    # the relaunch frees what the previous launch left live: one allocation's bytes stay in
    # use however many launches ran, and none once it is freed outside the graph
    base = dev.graph_mem_info()["used"]
    g, (a,) = _pairs_chain(1, UNIT, free=False)
    ge = g.instantiate(auto_free_on_launch=True)
    for _ in range(3):
        ge.launch(s)
        assert dev.graph_mem_info()["used"] - base == UNIT
    s.free(a.ptr)
    s.synchronize()
    assert dev.graph_mem_info()["used"] == base
    ge.destroy()


def test_graph_memory_auto_free_waits_for_a_launch_that_cannot_be_refused(s, dev):
    # a relaunch refused while making its plan (a memset node of memory freed since) freed the
    # previous launch's allocation anyway: the program's pointer to it died with no launch
    if s.device.backend != "cpu":
        pytest.skip("a launch writing freed memory is undefined in CUDA (an illegal address); "
                    "the cpu backend refuses it")
    base = dev.graph_mem_info()["used"]
    p = srt.malloc(64)
    g = srt.Graph()
    a = g.add_mem_alloc_node(UNIT)
    g.add_memset_node(p, 1, 64, deps=a)
    ge = g.instantiate(auto_free_on_launch=True)
    ge.launch(s)
    s.synchronize()
    srt.free(p)
    with pytest.raises(srt.InvalidAddressError):
        ge.launch(s)
    assert dev.graph_mem_info()["used"] - base == UNIT  # still live: nothing launched
    s.memset(a.ptr, 2, UNIT)  # still the program's
    s.free(a.ptr)
    s.synchronize()
    assert dev.graph_mem_info()["used"] == base
    ge.destroy()


@pytest.mark.parametrize("how", FREES)
def test_graph_memory_free_outside_the_graph_allows_relaunch(s, how):
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    ge = g.instantiate()
    ptrs = []
    for _ in range(3):
        ge.launch(s)
        s.synchronize()
        ptrs.append(a.ptr)
        assert (_read(a.ptr) == 0.0).all()  # usable outside the graph until freed
        s.launch(add_one_kernel, a.ptr, N)
        s.synchronize()
        assert (_read(a.ptr) == 1.0).all()
        _free_outside(how, s, a.ptr)  # graph memory freed outside the graph
    assert len(set(ptrs)) == 1  # the address is stable across launches
    with pytest.raises(srt.InvalidAddressError):
        _free_outside(how, s, a.ptr)  # double free
    ge.destroy()


def test_graph_memory_freed_by_another_graph(s, out):
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    producer = g.instantiate()
    h = srt.Graph()
    k = h.add_kernel_node(copy_kernel, out, a.ptr, N)
    h.add_mem_free_node(a.ptr, deps=k)
    consumer = h.instantiate()
    for _ in range(3):
        producer.launch(s)
        consumer.launch(s)
    with pytest.raises(srt.InvalidValueError, match="not live"):
        consumer.launch(s)  # nothing to free now
    s.synchronize()
    producer.destroy()
    consumer.destroy()


def test_graph_memory_addresses_stable_and_data_persists(s, out):
    # alloc without free: the data a launch leaves stays at the same address until freed
    g = srt.Graph()
    a = g.add_mem_alloc_node(N * 4)
    g.add_kernel_node(add_one_kernel, a.ptr, N, deps=a)
    ge = g.instantiate(auto_free_on_launch=True)
    ptr = a.ptr
    srt.memset(ptr, 0, N * 4)  # mapped by the exec: usable before the first launch
    for i in range(3):
        ge.launch(s)
        s.synchronize()
        assert a.ptr == ptr and (_read(ptr) == i + 1).all()
    ge.destroy()


def test_graph_memory_free_not_ordered_after_alloc_refused():
    g = srt.Graph()
    a = g.add_mem_alloc_node(64)
    g.add_mem_free_node(a.ptr)  # no edge from the alloc
    with pytest.raises(srt.InvalidValueError, match="not ordered after"):
        g.instantiate()


def test_graph_memory_double_free_in_graph_refused():
    # at the second free node, as cudaGraphAddMemFreeNode does (not first at instantiate)
    g = srt.Graph()
    a = g.add_mem_alloc_node(64)
    f = g.add_mem_free_node(a.ptr, deps=a)
    with pytest.raises(srt.InvalidValueError, match="already freed"):
        g.add_mem_free_node(a.ptr, deps=f)
    assert len(g.nodes()) == 2
    g.instantiate().destroy()
