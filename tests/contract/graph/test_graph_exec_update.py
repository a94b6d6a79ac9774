"""Whole-graph update of an executable graph (``GraphExec.update``, DESIGN.md §5): what it accepts,
what it refuses and with which result, and that a refusal leaves the exec unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import add_one_kernel, cpu_only, fill_kernel
from tests.conftest import read_f32 as _read
from tests.contract.graph.exec_kernels import scale_kernel

N = 16


R = srt.GraphExecUpdateResult


# -- whole-graph update ----------------------------------------------------------------------------
def _chain(a, b, *, second=add_one_kernel, value=1.0):
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, value)
    k2 = g.add_kernel_node(second, a, N, deps=k1)
    g.add_memcpy_node(b, a, N * 4, deps=k2)
    return g


def test_graph_exec_update_accepts_new_params_and_kernel_function(s, bufs, gate):
    a, b, c = bufs
    ge = _chain(a, b).instantiate()
    hold = gate(s)
    ge.launch(s)  # held: keeps the old params
    new = srt.Graph()
    k1 = new.add_kernel_node(fill_kernel, a, N, 5.0)
    k2 = new.add_kernel_node(scale_kernel, a, N, 2.0, deps=k1)  # another kernel function
    new.add_memcpy_node(c, a, N * 4, deps=k2)
    ge.update(new)
    ge.launch(s)
    hold.open()
    s.synchronize()
    assert (_read(b) == 2.0).all()  # first launch: fill 1, +1
    assert (_read(c) == 10.0).all()  # second launch: fill 5, *2
    # the exec does not follow later edits of the graph it was updated from
    new.add_empty_node()
    ge.launch(s)
    s.synchronize()
    assert (_read(c) == 10.0).all()


def test_graph_exec_update_topology_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    more = _chain(a, b)
    more.add_empty_node()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(more)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.code == 910
    rewired = _chain(a, b)
    n0, _, n2 = rewired.nodes()
    rewired.add_dependencies(n0, n2)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(rewired)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is n2


def test_graph_exec_update_compares_edges_not_their_count_or_order(s, bufs):
    a, b, c = bufs

    def join(first, second, value):
        # fill a and b, then c = a (a join node whose dependencies are listed in a given order)
        g = srt.Graph()
        fa = g.add_kernel_node(fill_kernel, a, N, value)
        fb = g.add_kernel_node(fill_kernel, b, N, value)
        nodes = (fa, fb)
        g.add_memcpy_node(c, a, N * 4, deps=[nodes[first], nodes[second]])
        return g

    ge = join(0, 1, 1.0).instantiate()
    # the same edges listed the other way round: the same topology (dependencies are a set)
    ge.update(join(1, 0, 3.0))
    ge.launch(s)
    s.synchronize()
    assert (_read(c) == 3.0).all()
    # as many edges as before, but one comes from another node: a topology change
    moved = srt.Graph()
    fa = moved.add_kernel_node(fill_kernel, a, N, 1.0)
    fb = moved.add_kernel_node(fill_kernel, b, N, 1.0, deps=fa)
    cp = moved.add_memcpy_node(c, a, N * 4, deps=fb)
    orig = srt.Graph()
    oa = orig.add_kernel_node(fill_kernel, a, N, 1.0)
    ob = orig.add_kernel_node(fill_kernel, b, N, 1.0)
    orig.add_memcpy_node(c, a, N * 4, deps=oa)
    orig.add_dependencies(oa, ob)  # orig: a -> b, a -> c; moved: a -> b, b -> c
    ge2 = orig.instantiate()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge2.update(moved)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is cp


def test_graph_exec_update_and_set_params_refuse_a_move_to_another_device(s, dev, bufs):
    cpu_only(dev, "needs a second device of the same backend (the cpu backend has two)")
    a, _, _ = bufs
    other = srt.Device("cpu:1")
    far = srt.malloc(N * 4, other)
    try:
        g = srt.Graph()
        k = g.add_kernel_node(fill_kernel, a, N, 1.0)
        ms = g.add_memset_node(a, 0, N * 4, deps=k)
        ge = g.instantiate()
        # the kernel node now belongs to the other device: its function's context changed
        moved_kernel = srt.Graph()
        with other:
            k2 = moved_kernel.add_kernel_node(fill_kernel, a, N, 1.0)
        moved_kernel.add_memset_node(a, 0, N * 4, deps=k2)
        with pytest.raises(srt.GraphExecUpdateError) as ei:
            ge.update(moved_kernel)
        assert ei.value.result is R.UNSUPPORTED_FUNCTION_CHANGE and ei.value.node is k2
        # the memset's memory is on the other device
        moved_memset = srt.Graph()
        k3 = moved_memset.add_kernel_node(fill_kernel, a, N, 1.0)
        ms3 = moved_memset.add_memset_node(far, 0, N * 4, deps=k3)
        with pytest.raises(srt.GraphExecUpdateError) as ei:
            ge.update(moved_memset)
        assert ei.value.result is R.PARAMETERS_CHANGED and ei.value.node is ms3
        # the per-node setter refuses what update refuses (cudaGraphExecMemsetNodeSetParams)
        with pytest.raises(srt.InvalidValueError, match="device"):
            ge.set_memset_node_params(ms, far, 0, N * 4)
        srt.memset(far, 0x11, N * 4)
        ge.launch(s)
        s.synchronize()
        # the refusals changed nothing: the exec still fills a, then clears it; far is untouched
        assert (_read(a) == 0.0).all() and (srt.read(far, (N * 4,), np.uint8) == 0x11).all()
        ge.destroy()
    finally:
        srt.free(far)


def test_graph_exec_update_takes_the_new_event_of_a_record_node(s, bufs, gate):
    a, _, _ = bufs

    def graph(event):
        g = srt.Graph()
        k = g.add_kernel_node(fill_kernel, a, N, 1.0)
        g.add_event_record_node(event, deps=k)
        return g

    old, new = srt.Event(), srt.Event()
    ge = graph(old).instantiate()
    ge.update(graph(new))
    hold = gate(s)
    ge.launch(s)
    # recorded by this launch, behind the gate (an event never recorded reads as complete)
    assert not new.query()
    assert old.query()  # the replaced event is not recorded any more
    hold.open()
    new.synchronize()
    assert (_read(a) == 1.0).all()


def test_graph_exec_update_node_type_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    m = g.add_memset_node(a, 0, 4, deps=k1)  # was a kernel
    g.add_memcpy_node(b, a, N * 4, deps=m)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(g)
    assert ei.value.result is R.NODE_TYPE_CHANGED and ei.value.node is m


def test_graph_exec_update_copy_direction_changed(bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    k2 = g.add_kernel_node(add_one_kernel, a, N, deps=k1)
    cp = g.add_memcpy_node(np.zeros(N, np.float32), a, N * 4, deps=k2)  # now device -> host
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(g)
    assert ei.value.result is R.PARAMETERS_CHANGED and ei.value.node is cp


def test_graph_exec_update_memory_nodes_not_supported(bufs):
    a, _, _ = bufs

    def graph(nbytes):
        g = srt.Graph()
        al = g.add_mem_alloc_node(nbytes)
        k = g.add_kernel_node(fill_kernel, al.ptr, N, 1.0, deps=al)
        g.add_mem_free_node(al.ptr, deps=k)
        return g

    base = graph(N * 4)
    ge = base.instantiate()
    other = graph(N * 8)  # another allocation (and size)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(other)
    assert ei.value.result is R.NOT_SUPPORTED and ei.value.node is other.nodes()[0]
    # the same allocation, but the free node changes to another allocation's address
    g = srt.Graph()
    al = g.add_mem_alloc_node(N * 4)
    g.add_mem_free_node(al.ptr, deps=al)
    ge2 = g.instantiate()
    h = srt.Graph()
    al2 = h.add_mem_alloc_node(N * 4)
    f = h.add_mem_free_node(al.ptr, deps=al2)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge2.update(h)
    assert ei.value.result is R.NOT_SUPPORTED and ei.value.node in (al2, f)
    ge.destroy()
    ge2.destroy()


def test_graph_exec_update_of_clone_with_same_memory_nodes_accepted(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    al = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, al.ptr, N, 1.0, deps=al)
    cp = g.add_memcpy_node(a, al.ptr, N * 4, deps=k)
    g.add_mem_free_node(al.ptr, deps=cp)
    ge = g.instantiate()
    ge.set_kernel_node_params(k, al.ptr, N, 4.0)
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 4.0).all()
    c = g.clone()
    with pytest.raises(srt.InvalidValueError):  # a clone's node is not a node of this exec
        ge.set_kernel_node_params(c.find_in_clone(k), al.ptr, N, 2.0)
    ge.update(c)  # the clone's params (fill 1.0) with the very same memory nodes: accepted
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all()


def test_graph_exec_update_refused_leaves_exec_unchanged(s, bufs):
    a, b, _ = bufs
    ge = _chain(a, b).instantiate()
    bad = srt.Graph()
    bad.add_kernel_node(fill_kernel, a, N, 9.0)
    with pytest.raises(srt.GraphExecUpdateError):
        ge.update(bad)
    ge.launch(s)
    s.synchronize()
    assert (_read(b) == 2.0).all()
    with pytest.raises(srt.InvalidTypeError):
        ge.update("graph")


def test_graph_exec_update_child_graph(s, bufs):
    a, _, _ = bufs

    def parent(value, extra=False):
        child = srt.Graph()
        k = child.add_kernel_node(fill_kernel, a, N, value)
        if extra:
            child.add_empty_node(deps=k)
        p = srt.Graph()
        p.add_child_graph_node(child)
        return p

    original = parent(1.0)
    ge = original.instantiate()
    ge.update(parent(8.0))
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 8.0).all()
    # the update reached the exec's own copy of the child graph, not the user's graph
    inner = original.nodes()[0].params["graph"]
    assert inner.nodes()[0].params["args"] == (a, N, 1.0)
    original.instantiate().launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all()
    bad = parent(2.0, extra=True)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(bad)
    assert ei.value.result is R.TOPOLOGY_CHANGED and ei.value.node is bad.nodes()[0]
