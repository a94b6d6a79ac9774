"""Graph calls of API.md §9.1 on every backend: destroying a graph (and ``with srt.Graph()``), the
exec's child graph and event node setters, instantiate's options and refusals
(``GraphInstantiateError``), the device's graph memory attributes and trim, and the refusal of a
0-byte graph allocation."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import streamrt as srt
from tests import conftest
from tests.conftest import PY_KERNELS, HostFlag, cpu_only, fill_kernel, flag_gate_kernel, in_thread
from tests.conftest import read_f32 as _read

N = 16
R = srt.GraphExecUpdateResult
IR = srt.GraphInstantiateResult


def _until_idle(s: srt.Stream) -> None:
    """Poll ``s.query()`` (``cudaStreamQuery``: no synchronize, so nothing a synchronize releases
    goes) until the stream has run everything."""
    for _ in range(10_000_000):
        if s.query():
            return
    raise AssertionError(f"{s!r} never went idle")


@contextmanager
def _gates(*streams: srt.Stream) -> Iterator[list[Callable[[], None]]]:
    """Gates closed on several streams at once; yields their openers (all opened at the end).

    The ``gate`` fixture allocates pinned memory per gate, which it refuses on cuda while one of
    its gates is closed (a GPU may synchronize for it): here every flag is made, and the kernels
    loaded, before the first gate closes."""
    flags = [HostFlag(st.device) for st in streams]
    for st in streams:
        if st.device.backend != "cpu":
            conftest._load_kernels(st.device, conftest, sys.modules[__name__])
    try:
        for st, f in zip(streams, flags):
            st.launch(flag_gate_kernel, f.ptr)
        yield [f.set for f in flags]
    finally:
        for f in flags:
            f.set()
        for st, f in zip(streams, flags):
            st.synchronize()
            with st.device:
                srt.free_host(f.ptr)


# -- g.destroy(), with srt.Graph() -----------------------------------------------------------
def test_graph_destroy_refuses_the_graph_and_its_nodes_exec_keeps_working(s, bufs):
    a, b, _ = bufs
    ev = srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 3.0)
    e = g.add_empty_node(deps=k)
    ge = g.instantiate()
    clone = g.clone()
    g.destroy()
    other = srt.Graph()
    child = srt.Graph()
    child.add_empty_node()
    refused = {
        "add_kernel_node": lambda: g.add_kernel_node(fill_kernel, b, N, 1.0),
        "add_empty_node": lambda: g.add_empty_node(),
        "add_memset_node": lambda: g.add_memset_node(b, 0, 4),
        "add_memcpy_node": lambda: g.add_memcpy_node(b, a, 4),
        "add_host_node": lambda: g.add_host_node(print),
        "add_event_record_node": lambda: g.add_event_record_node(ev),
        "add_event_wait_node": lambda: g.add_event_wait_node(ev),
        "add_mem_alloc_node": lambda: g.add_mem_alloc_node(64),
        "add_child_graph_node": lambda: g.add_child_graph_node(child),
        "add_dependencies": lambda: g.add_dependencies(k, e),
        "remove_dependencies": lambda: g.remove_dependencies(k, e),
        "nodes": g.nodes, "root_nodes": g.root_nodes, "edges": g.edges,
        "clone": g.clone, "to_dot": g.to_dot, "instantiate": g.instantiate,
        "node.params": lambda: k.params, "node.dependencies": lambda: e.dependencies,
        "node.dependents": lambda: k.dependents, "node.label": k.label,
        "a dependency on its node": lambda: other.add_empty_node(deps=k),
        "a child graph of it": lambda: other.add_child_graph_node(g),
        "destroy again": g.destroy,
        "find its node in a clone": lambda: clone.find_in_clone(k),
        "exec update from it": lambda: ge.update(g),
        "an exec setter naming its node": lambda: ge.set_kernel_node_params(k, b, N, 1.0),
    }
    for what, call in refused.items():
        try:
            call()
        except srt.InvalidHandleError:
            continue
        raise AssertionError(f"{what} was not refused after destroy()")
    assert "destroyed" in repr(g) and "destroyed" in repr(k) and k.type is srt.NodeType.KERNEL
    assert other.nodes() == []  # the refused calls added nothing
    # what was made of it stays: the exec launches, the clone instantiates
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 3.0).all()
    c = clone.nodes()
    assert [n.type for n in c] == [srt.NodeType.KERNEL, srt.NodeType.EMPTY] and c[1].dependencies == (c[0],)
    ge2 = clone.instantiate()
    ge2.set_kernel_node_params(c[0], b, N, 4.0)  # the clone's own nodes name it
    ge2.launch(s)
    s.synchronize()
    assert (_read(b) == 4.0).all()


def test_graph_context_manager_destroys_at_exit(s, bufs):
    a, _, _ = bufs
    with srt.Graph() as g:
        k = g.add_kernel_node(fill_kernel, a, N, 5.0)
        ge = g.instantiate()
    with pytest.raises(srt.InvalidHandleError):
        g.add_empty_node()
    with pytest.raises(srt.InvalidHandleError):
        k.params  # noqa: B018
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 5.0).all()
    # destroyed in the block already: the exit does not destroy it twice
    with srt.Graph() as g2:
        g2.destroy()
    # an exception in the block still destroys it, and goes on
    with pytest.raises(KeyError), srt.Graph() as g3:
        raise KeyError("boom")
    with pytest.raises(srt.InvalidHandleError):
        g3.nodes()


def test_graph_destroy_leaves_child_graph_node_copy_intact(s, bufs):
    a, _, _ = bufs
    child = srt.Graph()
    child.add_kernel_node(fill_kernel, a, N, 6.0)
    parent = srt.Graph()
    cg = parent.add_child_graph_node(child)
    child.destroy()
    inner = cg.params["graph"]  # the copy the node embedded is its own graph
    assert [n.type for n in inner.nodes()] == [srt.NodeType.KERNEL]
    parent.instantiate().launch(s)
    s.synchronize()
    assert (_read(a) == 6.0).all()


def test_graph_destroy_of_graph_with_memory_nodes_keeps_exec_memory(s, bufs):
    a, _, _ = bufs
    g = srt.Graph()
    m = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, m.ptr, N, 2.0, deps=m)
    c = g.add_memcpy_node(a, m.ptr, N * 4, deps=k)
    g.add_mem_free_node(m.ptr, deps=c)
    ge = g.instantiate()
    g.destroy()
    for _ in range(2):
        ge.launch(s)
    s.synchronize()
    assert (_read(a) == 2.0).all()
    ge.destroy()


def test_graph_destroy_refused_while_a_capture_builds_it(s):
    s.begin_capture()
    g = s.capture_info().graph
    with pytest.raises(srt.IllegalStateError):
        g.destroy()
    s.launch_host_func(print)
    assert s.end_capture() is g and len(g.nodes()) == 1
    g.destroy()


# -- ge.set_child_graph_node_params -----------------------------------------------------------
def test_graph_exec_set_child_graph_node_params_applies_to_later_launches_only(s, bufs, gate):
    a, b, _ = bufs
    child = srt.Graph()
    child.add_kernel_node(fill_kernel, a, N, 1.0)
    parent = srt.Graph()
    cg = parent.add_child_graph_node(child)
    ge = parent.instantiate()
    hold = gate(s)
    ge.launch(s)  # enqueued with the old child, held by the gate
    new = srt.Graph()
    new.add_kernel_node(fill_kernel, b, N, 2.0)
    ge.set_child_graph_node_params(cg, new)
    hold.open()
    s.synchronize()
    assert (_read(a) == 1.0).all() and (_read(b) == 0.0).all()
    ge.launch(s)
    s.synchronize()
    assert (_read(b) == 2.0).all()
    # the user's graphs are unchanged: only the exec's copy took the parameters
    assert cg.params["graph"].nodes()[0].params["args"] == (a, N, 1.0)


def test_graph_exec_set_child_graph_node_params_moves_event_nodes_too(s, bufs, gate):
    a, _, _ = bufs
    e1, e2 = srt.Event(), srt.Event()
    child = srt.Graph()
    k = child.add_kernel_node(fill_kernel, a, N, 1.0)
    child.add_event_record_node(e1, deps=k)
    parent = srt.Graph()
    cg = parent.add_child_graph_node(child)
    ge = parent.instantiate()
    new = srt.Graph()
    k2 = new.add_kernel_node(fill_kernel, a, N, 3.0)
    new.add_event_record_node(e2, deps=k2)
    ge.set_child_graph_node_params(cg, new)
    hold = gate(s)
    ge.launch(s)
    assert e1.query() and not e2.query()  # e2 marks the launch, e1 was never recorded
    hold.open()
    e2.synchronize()
    assert (_read(a) == 3.0).all()


def test_graph_exec_set_child_graph_node_params_refusals(s, bufs):
    a, b, _ = bufs
    child = srt.Graph()
    child.add_kernel_node(fill_kernel, a, N, 1.0)
    parent = srt.Graph()
    k = parent.add_kernel_node(fill_kernel, b, N, 1.0)
    cg = parent.add_child_graph_node(child, deps=k)
    ge = parent.instantiate()
    bigger = srt.Graph()
    x = bigger.add_kernel_node(fill_kernel, a, N, 2.0)
    bigger.add_empty_node(deps=x)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.set_child_graph_node_params(cg, bigger)
    assert ei.value.result is R.TOPOLOGY_CHANGED
    other_kind = srt.Graph()
    ms = other_kind.add_memset_node(a, 0, N * 4)
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.set_child_graph_node_params(cg, other_kind)
    assert ei.value.result is R.NODE_TYPE_CHANGED and ei.value.node is ms
    same = srt.Graph()
    same.add_kernel_node(fill_kernel, a, N, 9.0)
    with pytest.raises(srt.InvalidValueError):
        ge.set_child_graph_node_params(k, same)  # a kernel node, not a child graph node
    with pytest.raises(srt.InvalidValueError):
        ge.set_child_graph_node_params(child.nodes()[0], same)  # a node of another graph
    with pytest.raises(srt.InvalidTypeError):
        ge.set_child_graph_node_params(cg, "graph")
    dead = same.clone()
    dead.destroy()
    with pytest.raises(srt.InvalidHandleError):
        ge.set_child_graph_node_params(cg, dead)
    # refused changes changed nothing
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all() and (_read(b) == 1.0).all()
    ge.destroy()
    with pytest.raises(srt.InvalidHandleError):
        ge.set_child_graph_node_params(cg, same)


# -- ge.set_event_record_node_event / ge.set_event_wait_node_event -----------------------------
def test_graph_exec_set_event_record_node_event_applies_to_later_launches_only(s, s2, bufs):
    a, _, _ = bufs
    e1, e2 = srt.Event(), srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 4.0)
    r = g.add_event_record_node(e1, deps=k)
    ge = g.instantiate()
    with _gates(s2, s) as (open2, open1):
        s2.record(e2)  # e2 pending behind s2's gate
        ge.launch(s)  # records e1, held by s's gate
        ge.set_event_record_node_event(r, e2)
        assert not e1.query()
        open1()
        s.synchronize()
        assert e1.query() and not e2.query()  # the enqueued launch did not record e2
        ge.launch(s)  # records e2 (this record replaces s2's, still held)
        s.synchronize()
        assert e2.query()
        open2()
    assert r.params["event"] is e1  # the user's node is unchanged
    assert (_read(a) == 4.0).all()


def test_graph_exec_set_event_wait_node_event_applies_to_later_launches_only(s, s2, bufs):
    _, b, _ = bufs
    ready = s2.record()  # complete at once
    g = srt.Graph()
    w = g.add_event_wait_node(ready)
    g.add_kernel_node(fill_kernel, b, N, 7.0, deps=w)
    ge = g.instantiate()
    with _gates(s2, s) as (open2, open1):
        blocked = s2.record()  # behind s2's gate
        ge.launch(s)  # waits for ``ready``, held by s's gate
        mid = s.record()
        ge.set_event_wait_node_event(w, blocked)
        ge.launch(s)  # waits for ``blocked``
        open1()
        in_thread(mid.synchronize)  # the first launch ran: it did not take the new event
        assert not s.query()  # the second launch waits behind s2's gate
        open2()
        s.synchronize()
    assert (_read(b) == 7.0).all()


def test_graph_exec_event_node_setters_refusals(s, bufs):
    a, _, _ = bufs
    e = srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 1.0)
    r = g.add_event_record_node(e, deps=k)
    w = g.add_event_wait_node(e, deps=r)
    ge = g.instantiate()
    other = srt.Graph()
    o = other.add_event_record_node(e)
    for setter, right, wrong in ((ge.set_event_record_node_event, r, w),
                                 (ge.set_event_wait_node_event, w, r)):
        with pytest.raises(srt.InvalidValueError):
            setter(wrong, e)  # the other event node kind
        with pytest.raises(srt.InvalidValueError):
            setter(k, e)  # a kernel node
        with pytest.raises(srt.InvalidValueError):
            setter(o, e)  # a node of another graph
        with pytest.raises(srt.InvalidTypeError):
            setter(right, "event")
        dead = srt.Event()
        dead.destroy()
        with pytest.raises(srt.InvalidHandleError):
            setter(right, dead)
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 1.0).all() and e.query()


# -- g.instantiate(*, auto_free_on_launch, upload_stream, use_node_priority) -------------------
def test_graph_instantiate_upload_stream_and_node_priority(s, bufs, monkeypatch):
    a, _, _ = bufs
    uploads = []
    real = srt.GraphExec.upload

    def upload(self, stream):
        uploads.append(stream)
        real(self, stream)

    monkeypatch.setattr(srt.GraphExec, "upload", upload)
    g = srt.Graph()
    g.add_kernel_node(fill_kernel, a, N, 8.0)
    ge = g.instantiate(upload_stream=s, use_node_priority=True)
    assert uploads == [s]  # uploaded as part of instantiate
    assert ge.use_node_priority and not ge.auto_free_on_launch
    assert not g.instantiate().use_node_priority
    ge.launch(s)
    s.synchronize()
    assert (_read(a) == 8.0).all()
    for bad in ({"upload_stream": "s"}, {"use_node_priority": 1}, {"auto_free_on_launch": None}):
        with pytest.raises(srt.InvalidTypeError):
            g.instantiate(**bad)


def test_graph_instantiate_failed_upload_leaves_no_exec(s):
    g = srt.Graph()
    m = g.add_mem_alloc_node(N * 4)
    g.add_mem_free_node(m.ptr, deps=m)
    dead = srt.Stream(s.device, non_blocking=True)
    dead.destroy()
    with pytest.raises(srt.InvalidHandleError):
        g.instantiate(upload_stream=dead)
    # the refused exec is gone: its graph memory is free to map for another one
    ge = g.instantiate(upload_stream=s, auto_free_on_launch=True)
    assert ge.auto_free_on_launch
    ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_instantiate_error_is_an_invalid_value_and_update_error():
    assert issubclass(srt.GraphInstantiateError, srt.GraphExecUpdateError)
    assert issubclass(srt.GraphInstantiateError, srt.InvalidValueError)
    assert (srt.GraphInstantiateError.code, srt.GraphInstantiateError.name) == (1, "cudaErrorInvalidValue")
    assert {r.name: r.value for r in IR} == {
        "SUCCESS": 0, "ERROR": 1, "INVALID_STRUCTURE": 2, "NODE_OPERATION_NOT_SUPPORTED": 3,
        "MULTIPLE_DEVICES_NOT_SUPPORTED": 4, "CONDITIONAL_HANDLE_UNUSED": 5}


def test_graph_instantiate_refuses_free_not_ordered_after_its_alloc(s):
    g = srt.Graph()
    m = g.add_mem_alloc_node(N * 4)
    f = g.add_mem_free_node(m.ptr)  # not after m
    with pytest.raises(srt.GraphInstantiateError) as ei:
        g.instantiate()
    assert ei.value.result is IR.INVALID_STRUCTURE and ei.value.node is f
    assert isinstance(ei.value, srt.InvalidValueError) and "not ordered after" in str(ei.value)
    g.add_dependencies(m, f)
    ge = g.instantiate()  # the refused instantiate mapped nothing
    ge.launch(s)
    s.synchronize()
    ge.destroy()


def test_graph_instantiate_cpu_graph_spans_cpu_devices(dev):
    cpu_only(dev, "two devices of one backend in one graph (cuda refuses it: tests/cuda)")
    cpu_only(dev, PY_KERNELS)
    seen: list = []

    @srt.kernel
    def where(ctx):
        seen.append(ctx.device)

    d0, d1 = srt.Device("cpu:0"), srt.Device("cpu:1")
    g = srt.Graph()
    with d0:
        k0 = g.add_kernel_node(where)
    with d1:
        g.add_kernel_node(where, deps=k0)
    s = srt.Stream(d1, non_blocking=True)
    g.instantiate().launch(s)
    s.synchronize()
    assert seen == [d0, d1]  # CUDA host graphs may span devices: each node on its own


# -- dev.graph_mem_attrs(), dev.reset_graph_mem_high(), dev.graph_mem_trim() --------------------
def _attrs(dev: srt.Device) -> dict[str, int]:
    got = dev.graph_mem_attrs()
    assert set(got) == {"used_mem_current", "used_mem_high", "reserved_mem_current",
                        "reserved_mem_high"}
    assert got["used_mem_high"] >= got["used_mem_current"] >= 0
    assert got["reserved_mem_high"] >= got["reserved_mem_current"] >= 0
    return got


def _settled(dev: srt.Device) -> dict[str, int]:
    """The attributes once earlier tests' releasable graph memory went, highs reset."""
    dev.synchronize()
    dev.graph_mem_trim()
    dev.reset_graph_mem_high()
    got = _attrs(dev)
    assert got["used_mem_high"] == got["used_mem_current"]
    assert got["reserved_mem_high"] == got["reserved_mem_current"]
    return got


def test_device_graph_mem_attrs_and_reset_of_the_highs(dev, s, bufs):
    a, _, _ = bufs
    base = _settled(dev)
    g = srt.Graph()
    m = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, m.ptr, N, 1.0, deps=m)
    g.add_memcpy_node(a, m.ptr, N * 4, deps=k)  # no free node: the allocation outlives the launch
    ge = g.instantiate()
    foot = ge.memory_footprint
    assert foot >= N * 4
    got = _attrs(dev)
    assert got["reserved_mem_current"] == base["reserved_mem_current"] + foot
    assert got["reserved_mem_high"] == got["reserved_mem_current"]
    assert got["used_mem_current"] == base["used_mem_current"]  # nothing allocated yet
    ge.launch(s)
    s.synchronize()
    live = _attrs(dev)["used_mem_current"] - base["used_mem_current"]
    assert live >= N * 4
    s.free(m.ptr)
    s.synchronize()
    got = _attrs(dev)
    assert got["used_mem_current"] == base["used_mem_current"]
    assert got["used_mem_high"] == base["used_mem_current"] + live  # the high keeps the peak
    ge.destroy()
    got = _attrs(dev)
    assert got["reserved_mem_current"] == base["reserved_mem_current"]
    assert got["reserved_mem_high"] == base["reserved_mem_current"] + foot
    dev.reset_graph_mem_high()  # the highs go back to the current values, not to 0
    got = _attrs(dev)
    assert (got["used_mem_high"], got["reserved_mem_high"]) == (
        got["used_mem_current"], got["reserved_mem_current"])
    assert (_read(a) == 1.0).all()


def test_device_graph_mem_trim_releases_what_no_exec_needs(dev, s, gate):
    base = _settled(dev)
    g = srt.Graph()
    m = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, m.ptr, N, 1.0, deps=m)
    g.add_mem_free_node(m.ptr, deps=k)
    ge = g.instantiate()
    foot = ge.memory_footprint
    hold = gate(s)
    ge.launch(s)
    ge.destroy()  # while its launch waits: the memory is held for it
    dev.graph_mem_trim()  # the launch has not run: nothing to trim
    assert _attrs(dev)["reserved_mem_current"] == base["reserved_mem_current"] + foot
    hold.open()
    _until_idle(s)  # the launch ran; no synchronize has released its memory
    assert _attrs(dev)["reserved_mem_current"] == base["reserved_mem_current"] + foot
    dev.graph_mem_trim()
    assert _attrs(dev)["reserved_mem_current"] == base["reserved_mem_current"]
    # memory a live allocation holds stays through a trim, until the allocation is freed
    g2 = srt.Graph()
    m2 = g2.add_mem_alloc_node(N * 4)
    ge2 = g2.instantiate()
    ge2.launch(s)
    s.synchronize()
    ge2.destroy()
    dev.graph_mem_trim()
    assert _attrs(dev)["reserved_mem_current"] == base["reserved_mem_current"] + ge2.memory_footprint
    s.free(m2.ptr)
    s.synchronize()
    assert _attrs(dev)["reserved_mem_current"] == base["reserved_mem_current"]


# -- 0-byte graph allocations -------------------------------------------------------------------
def test_graph_mem_alloc_node_of_zero_bytes_refused(s):
    g = srt.Graph()
    with pytest.raises(srt.InvalidValueError, match="0 bytes"):
        g.add_mem_alloc_node(0)
    assert g.nodes() == []
    s.begin_capture()
    with pytest.raises(srt.InvalidValueError, match="0 bytes"):
        s.malloc(0)  # cudaMallocAsync captured: a MEM_ALLOC node of 0 bytes
    assert s.capture_info().status is srt.CaptureStatus.ACTIVE  # a bad argument, not a misuse
    p = s.malloc(N * 4)
    s.free(p)
    captured = s.end_capture()
    assert [n.type for n in captured.nodes()] == [srt.NodeType.MEM_ALLOC, srt.NodeType.MEM_FREE]
    q = s.malloc(0)  # outside a capture, as before: a pointer of its own
    assert q
    s.free(q)
    s.synchronize()
