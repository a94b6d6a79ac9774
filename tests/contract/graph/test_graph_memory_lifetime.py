"""Graph memory and exec lifetime: one live exec per allocation, memory of collected and destroyed
execs, reinstantiation while an old exec still runs, finalizers inside locked sections."""

from __future__ import annotations

import gc
import weakref

import pytest

import streamrt as srt
from tests.conftest import copy_kernel, fill_kernel, reentry_lock
from tests.conftest import read_f32 as _read
from tests.contract.graph.graph_memory import FREES, _fill_use_free, _free_outside, _pairs_chain, add_kernel

N = 16


def test_graph_memory_one_live_exec_per_allocation(s):
    g, _ = _pairs_chain(2, N * 4)
    ge = g.instantiate()
    with pytest.raises(srt.NotSupportedError):
        g.instantiate()
    ge.destroy()
    ge2 = g.instantiate()  # allowed once the first is gone
    ge2.launch(s)
    s.synchronize()
    ge2.destroy()


@pytest.mark.parametrize("how", FREES)
def test_graph_memory_unmapped_without_live_exec(s, how):
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(a.ptr, 0, 4)  # not instantiated: no backing yet
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    ge.destroy()
    # CUDA: "graph destruction does not automatically free any live graph-allocated memory"
    srt.memset(a.ptr, 7, 4)
    assert srt.Device().graph_mem_info()["used"] >= N * 4
    with pytest.raises(srt.InvalidValueError):
        g.instantiate()  # its memory is still held for the live allocation
    _free_outside(how, s, a.ptr)  # the last live allocation: the destroyed exec's memory goes
    s.synchronize()
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(a.ptr, 0, 4)
    g.instantiate().destroy()  # the addresses are free to map again


def test_graph_memory_of_a_collected_exec_goes_back(s):
    # an exec dropped without destroy() releases its memory (it used to stay mapped, and
    # counted as reserved, for the life of the process)
    dev = s.device
    before = dev.graph_mem_info()["reserved"]
    g, _ = _pairs_chain(2, N * 4)
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    assert dev.graph_mem_info()["reserved"] > before
    del ge
    gc.collect()
    assert dev.graph_mem_info()["reserved"] == before
    g.instantiate().destroy()  # its addresses are free to map again


def test_graph_memory_live_allocation_outlives_its_collected_exec_until_freed(s):
    # collected without destroy(): as destroyed, its live allocation stays valid until freed
    dev = s.device
    before = dev.graph_mem_info()["reserved"]
    g, (a,) = _pairs_chain(1, N * 4, free=False)
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    ref = weakref.ref(ge)
    del ge
    gc.collect()
    assert ref() is None
    srt.memset(a.ptr, 1, 4)  # still mapped
    assert dev.graph_mem_info()["reserved"] > before
    s.free(a.ptr)
    s.synchronize()
    assert dev.graph_mem_info()["reserved"] == before
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(a.ptr, 0, 4)


def test_graph_memory_reinstantiate_while_a_collected_exec_still_runs(s, out, gate):
    # dropped with its launch queued: its memory is not mapped again under that launch
    g = _fill_use_free(add_kernel, out, 3.0)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    del ge
    gc.collect()
    with pytest.raises((srt.InvalidValueError, srt.NotSupportedError)):
        g.instantiate()
    hold.open()
    s.synchronize()
    gc.collect()
    ge2 = g.instantiate()
    ge2.launch(s)
    s.synchronize()
    assert (_read(out) == 6.0).all()
    ge2.destroy()


@pytest.mark.parametrize("by", ["stream", "graph"])
def test_graph_memory_of_a_destroyed_exec_outlives_it_until_freed_in_stream_order(s, out, gate, by):
    # a destroyed exec's live allocation is read by later work and freed on a held stream, by
    # s.free or by a MEM_FREE node of another graph: the memory stays mapped until the stream
    # passes the free (for a graph, until its launch has run: its copy reads the allocation
    # before the free node), not only until the work enqueued before it has
    g = srt.Graph()
    a = g.add_mem_alloc_node(N * 4)
    g.add_kernel_node(fill_kernel, a.ptr, N, 5.0, deps=a)
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    ge.destroy()
    if by == "graph":
        s.begin_capture(srt.CaptureMode.RELAXED)  # the gate's pinned flag (cuda) is made here
    hold = gate(s)  # captured: a node of the graph, so the launch itself waits for it
    s.launch(copy_kernel, out, a.ptr, N)
    s.free(a.ptr)
    if by == "graph":
        consumer = s.end_capture().instantiate()
        consumer.launch(s)
    hold.open()
    s.synchronize()  # no LaunchError: the copy ran on mapped memory
    assert (_read(out) == 5.0).all()
    if by == "graph":
        consumer.destroy()
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(a.ptr, 0, 4)


def test_graph_memory_destroy_with_launch_in_flight(s, out, gate):
    # cudaGraphExecDestroy of an exec still running: the launch completes on its own memory
    g = _fill_use_free(copy_kernel, out, 3.0)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.destroy()
    hold.open()
    s.synchronize()  # no LaunchError: the memory outlived the destroy
    assert (_read(out) == 3.0).all()
    with pytest.raises(srt.InvalidHandleError):
        ge.launch(s)


def test_graph_memory_reinstantiate_while_a_destroyed_exec_still_runs(s, dev, out, gate):
    # the destroyed exec's memory goes back when its launch ends; until then the same
    # addresses cannot be mapped again (its kernels still use them): a clear refusal on every
    # backend, and once the launch is over a new exec maps them
    g = _fill_use_free(add_kernel, out, 3.0)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.destroy()
    with pytest.raises(srt.InvalidValueError, match="synchronize first"):
        g.instantiate()
    hold.open()
    s.synchronize()
    ge2 = g.instantiate()  # the launch is over: its memory is let go at once
    ge2.launch(s)
    s.synchronize()
    assert (_read(out) == 6.0).all()
    ge2.destroy()


# -- finalizers: a graph allocation collected inside a locked section ------------------------------
def test_graph_memory_allocation_collected_inside_a_locked_section_is_released_later(dev,
                                                                                       monkeypatch):
    # the garbage collector may run the allocation's finalizer on a thread that holds the lock its
    # release takes (found by a hypothesis run that hung): the release waits for the lock instead
    import gc

    from streamrt.backends.cpu import SPACE

    guarded = SPACE if dev.backend == "cpu" else dev._impl._reserved  # what the release updates
    lock = reentry_lock(monkeypatch, guarded)
    g = srt.Graph()
    ptr = g.add_mem_alloc_node(4096).ptr
    reserved = SPACE.get if dev.backend == "cpu" else guarded.__contains__
    with lock:  # as when a collection starts inside a section that holds it
        del g
        gc.collect()  # the allocation's finalizer runs here
        assert reserved(ptr)  # its release waits for the lock
    assert lock.reentered == []
    g2 = srt.Graph()
    g2.add_mem_alloc_node(4096)  # the next update of the same table runs the waiting release
    assert not reserved(ptr)
