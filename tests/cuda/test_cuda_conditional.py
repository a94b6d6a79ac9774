"""Conditional nodes built natively by the cuda backend (API.md §9.1), on the fake runtime or a
GPU: the programs of ``tests/contract/graph/test_graph_conditional.py`` with kernels that have a
CUDA body too, run on cpu:0 and on cuda:0, giving the same results on both. A kernel sets a
condition by writing ``*h.ptr`` (ACL's model; on cuda the backend's bridge kernel hands it to
``cudaGraphSetConditional`` right before the node evaluates). Then the cuda-only parts: the
cuda-bindings version gate, the body's pinned-memory rule, and the fake's own model of
``cudaGraphAddNode`` / ``cudaGraphSetConditional``.
"""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda

T = srt.ConditionalType
ACC, CNT, AUX = 0, 1, 2  # int64 slots of ``mem``
SLOTS = 8


# -- kernels: a Python body for cpu, CUDA C for cuda ----------------------------------------------
def _py_add(ctx, p, v):
    ctx.array(p, (1,), np.int64)[0] += v


add_k = srt.kernel(_py_add, name="cond_add_k", signature="ptr, i64", cuda=r"""
extern "C" __global__ void cond_add_k(long long* p, long long v) { p[0] += v; }
""")


def _py_poke(ctx, ptr, v):
    ctx.array(ptr, (1,), np.uint64)[0] = v


# writes the uint64 at ptr: with ptr = h.ptr, what ctx.set_condition / cudaGraphSetConditional do
poke_k = srt.kernel(_py_poke, name="cond_poke_k", signature="ptr, u64", cuda=r"""
extern "C" __global__ void cond_poke_k(unsigned long long* p, unsigned long long v) { p[0] = v; }
""")


def _py_init(ctx, hptr, c):
    ctx.array(hptr, (1,), np.uint64)[0] = int(ctx.array(c, (1,), np.int64)[0] > 0)


# starts a counted loop: the condition is c[0] > 0
init_k = srt.kernel(_py_init, name="cond_init_k", signature="ptr, ptr", cuda=r"""
extern "C" __global__ void cond_init_k(unsigned long long* h, const long long* c) {
    h[0] = c[0] > 0;
}
""")


def _py_countdown(ctx, hptr, c):
    x = ctx.array(c, (1,), np.int64)
    x[0] -= 1
    ctx.array(hptr, (1,), np.uint64)[0] = int(x[0] > 0)


# one trip of a counted loop: c[0] -= 1, the condition c[0] > 0
countdown_k = srt.kernel(_py_countdown, name="cond_countdown_k", signature="ptr, ptr", cuda=r"""
extern "C" __global__ void cond_countdown_k(unsigned long long* h, long long* c) {
    c[0] -= 1;
    h[0] = c[0] > 0;
}
""")


# -- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(params=["cpu", "cuda"])
def dev(request):
    """cpu:0 (the reference) and cuda:0: each program gives the same results on both."""
    d = srt.Device("cpu:0") if request.param == "cpu" else request.getfixturevalue("cuda0")
    with d:
        yield d
        d.synchronize()


@pytest.fixture
def cuda(cuda0):
    with cuda0:
        yield cuda0
        cuda0.synchronize()


@pytest.fixture
def s(dev):
    st = srt.Stream(non_blocking=True)
    yield st
    st.synchronize()


@pytest.fixture
def mem(dev):
    p = srt.malloc(SLOTS * 8, dev)
    srt.write(p, np.zeros(SLOTS, np.int64))
    yield p
    dev.synchronize()
    srt.free(p)


def slot(mem, k):
    return mem + 8 * k


def get(mem, k=ACC):
    return int(srt.read(slot(mem, k), (1,), np.int64)[0])


def put(mem, k, v):
    srt.write(slot(mem, k), np.array([v], np.int64))


def value(h):
    return int(srt.read(h.ptr, (1,), np.uint64)[0])


def run(ge, s, times=1):
    for _ in range(times):
        ge.launch(s)
    s.synchronize()


def counted_while(g, mem, *, adds=1, default=None, deps=()):
    """A WHILE node of ``g`` whose body adds ``adds`` to ACC then counts CNT down; started by a
    kernel setting the condition to CNT > 0 (unless ``default`` is given)."""
    h = g.create_conditional_handle(default=default)
    if default is None:
        deps = [g.add_kernel_node(init_k, h.ptr, slot(mem, CNT), deps=deps)]
    n = g.add_conditional_node(h, T.WHILE, deps=deps)
    body = n.bodies[0]
    a = body.add_kernel_node(add_k, slot(mem, ACC), adds)
    body.add_kernel_node(countdown_k, h.ptr, slot(mem, CNT), deps=a)
    return h, n


def native(dev):
    """Whether ``dev`` builds conditional nodes of its own (cuda)."""
    return dev._impl.graph_conditionals_native


# -- IF -------------------------------------------------------------------------------------------
# 2**32: not 0, though its low 32 bits are (CUDA's values are 32-bit: the bridge saturates)
@pytest.mark.parametrize("v", [0, 1, 7, 2**32, 2**64 - 1])
def test_if_runs_its_body_when_the_value_is_not_zero(dev, s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle(default=v)
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s, 2)
    assert get(mem) == (2 if v else 0)
    assert value(h) == v  # the default, written by the launch


@pytest.mark.parametrize("v", [0, 1, 3])
def test_if_value_set_by_a_kernel_before_the_node(dev, s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0 if v else 1)  # the kernel overrides the default
    k = g.add_kernel_node(poke_k, h.ptr, v)
    n = g.add_conditional_node(h, T.IF, deps=k)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s)
    assert get(mem) == (1 if v else 0)
    assert value(h) == v


@pytest.mark.parametrize("v", [0, 1, 5])
def test_if_else_runs_exactly_one_body(dev, s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle()
    k = g.add_kernel_node(poke_k, h.ptr, v)
    n = g.add_conditional_node(h, T.IF, size=2, deps=k)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[1].add_kernel_node(add_k, slot(mem, ACC), 100)
    run(g.instantiate(), s)
    assert get(mem) == (1 if v else 100)


# -- WHILE ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("trips", [0, 1, 5])
def test_while_counts_down_through_a_kernel_setting_the_condition(dev, s, mem, trips):
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    for launch in range(1, 3):
        put(mem, CNT, trips)
        run(ge, s)
        assert get(mem) == trips * launch
        assert get(mem, CNT) == 0


def test_while_tests_the_value_before_the_first_iteration(dev, s, mem):
    g = srt.Graph()
    counted_while(g, mem, default=0)
    put(mem, CNT, 5)
    run(g.instantiate(), s)
    assert get(mem) == 0 and get(mem, CNT) == 5


def test_while_body_with_several_nodes_tests_after_all_of_them(dev, s, mem):
    # the countdown is not the body's last node: the next test reads what every node of the
    # trip wrote, so the loop never stops early or runs late
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    b = n.bodies[0]
    c = b.add_kernel_node(countdown_k, h.ptr, slot(mem, CNT))
    b.add_kernel_node(add_k, slot(mem, ACC), 1, deps=c)
    b.add_kernel_node(add_k, slot(mem, AUX), 1)  # a second sink, unordered with the others
    put(mem, CNT, 3)
    run(g.instantiate(), s)
    assert (get(mem), get(mem, AUX), get(mem, CNT)) == (3, 3, 0)


# -- SWITCH ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("v", [0, 1, 2, 3, 4, 9, 2**32, 2**32 + 1, 2**64 - 1])
def test_switch_runs_the_selected_body_or_none(dev, s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle()
    k = g.add_kernel_node(poke_k, h.ptr, v)
    n = g.add_conditional_node(h, T.SWITCH, size=4, deps=k)
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    run(g.instantiate(), s)
    assert get(mem) == (10**v if v < 4 else 0)  # out of range: no body runs


def test_switch_of_one_body_runs_it_on_zero(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    n = g.add_conditional_node(h, T.SWITCH, size=1)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s)
    assert get(mem) == 1


# -- nesting --------------------------------------------------------------------------------------
def _nested(mem, outer, pick):
    """IF(outer) -> SWITCH(pick) of 3 -> body 2: WHILE counting CNT; body 0 adds 100; the IF body
    counts its runs in AUX."""
    g = srt.Graph()
    h1 = g.create_conditional_handle(default=outer)
    n1 = g.add_conditional_node(h1, T.IF)
    b1 = n1.bodies[0]
    h2 = g.create_conditional_handle(default=pick)  # a handle of the top graph, used in a body
    first = b1.add_kernel_node(add_k, slot(mem, AUX), 1)
    n2 = b1.add_conditional_node(h2, T.SWITCH, size=3, deps=first)
    n2.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 100)
    b2 = n2.bodies[2]
    h3 = b2.create_conditional_handle()  # a handle of the body itself
    i = b2.add_kernel_node(init_k, h3.ptr, slot(mem, CNT))
    n3 = b2.add_conditional_node(h3, T.WHILE, deps=i)
    b3 = n3.bodies[0]
    a = b3.add_kernel_node(add_k, slot(mem, ACC), 1)
    b3.add_kernel_node(countdown_k, h3.ptr, slot(mem, CNT), deps=a)
    return g


@pytest.mark.parametrize("outer, pick, acc", [(1, 2, 3), (0, 2, 0), (1, 0, 100), (1, 1, 0),
                                              (1, 7, 0)])
def test_nesting_to_depth_three(dev, s, mem, outer, pick, acc):
    ge = _nested(mem, outer, pick).instantiate()
    for launch in range(1, 3):
        put(mem, CNT, 3)
        run(ge, s)
        assert get(mem) == acc * launch
        assert get(mem, AUX) == launch * bool(outer)


def test_nesting_depth_two_in_a_while_body(dev, s, mem):
    # an IF inside a WHILE body, its handle set by the trip's countdown: runs on every trip but
    # the last
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    b = n.bodies[0]
    c = b.add_kernel_node(countdown_k, h.ptr, slot(mem, CNT))
    hi = g.create_conditional_handle()
    k = b.add_kernel_node(init_k, hi.ptr, slot(mem, CNT), deps=c)
    inner = b.add_conditional_node(hi, T.IF, deps=k)
    inner.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    put(mem, CNT, 4)
    run(g.instantiate(), s)
    assert get(mem) == 3 and get(mem, CNT) == 0


# -- defaults and h.ptr ---------------------------------------------------------------------------
def test_default_is_written_at_every_launch(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.add_kernel_node(poke_k, h.ptr, 0, deps=n)  # each launch leaves 0 behind
    ge = g.instantiate()
    run(ge, s, 3)
    assert get(mem) == 3 and value(h) == 0
    srt.write(h.ptr, np.array([0], np.uint64))  # a write between launches: the default wins
    run(ge, s)
    assert get(mem) == 4


def test_default_restarts_a_while_loop_at_every_launch(dev, s, mem):
    g = srt.Graph()
    h, _ = counted_while(g, mem, default=1)
    ge = g.instantiate()
    for launch in range(1, 4):
        put(mem, CNT, 2)
        run(ge, s)
        assert get(mem) == 2 * launch and value(h) == 0


def test_default_of_a_handle_used_in_a_body_is_written_at_every_launch(dev, s, mem):
    g = srt.Graph()
    outer = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    b = outer.bodies[0]
    h = g.create_conditional_handle(default=2)
    n = b.add_conditional_node(h, T.SWITCH, size=3)
    for i, body in enumerate(n.bodies):
        body.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    b.add_kernel_node(poke_k, h.ptr, 0, deps=n)
    run(g.instantiate(), s, 2)
    assert get(mem) == 200 and value(h) == 0


def test_no_default_keeps_the_last_value_across_launches(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle()
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.add_kernel_node(poke_k, h.ptr, 1, deps=n)
    ge = g.instantiate()
    srt.write(h.ptr, np.array([0], np.uint64))
    run(ge, s)
    assert get(mem) == 0
    run(ge, s, 2)
    assert get(mem) == 2 and value(h) == 1


def test_h_ptr_written_by_srt_write_between_launches(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle()
    n = g.add_conditional_node(h, T.SWITCH, size=3)
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    ge = g.instantiate()
    total = 0
    for v in (2, 0, 1, 3, 1):
        srt.write(h.ptr, np.array([v], np.uint64))
        run(ge, s)
        total += 10**v if v < 3 else 0
        assert get(mem) == total


def test_h_ptr_written_by_memset_and_memcpy_nodes(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    m = g.add_memset_node(h.ptr, 2, 1)  # the low byte: value 2 (the default zeroed the rest)
    n = g.add_conditional_node(h, T.SWITCH, size=3, deps=m)
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    run(g.instantiate(), s, 2)
    assert get(mem) == 200
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle(default=0)
    w = g2.add_kernel_node(poke_k, slot(mem, AUX), 1)
    c = g2.add_memcpy_node(h2.ptr, slot(mem, AUX), 8, deps=w)
    n2 = g2.add_conditional_node(h2, T.IF, deps=c)
    n2.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1000)
    run(g2.instantiate(), s)
    assert get(mem) == 1200


def test_h_ptr_written_by_eager_kernels_in_stream_order(dev, s, mem):
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle()
    n2 = g2.add_conditional_node(h2, T.IF)
    n2.bodies[0].add_kernel_node(add_k, slot(mem, AUX), 1)
    ge2 = g2.instantiate()
    for trips in (2, 0, 3):
        s.launch(poke_k, slot(mem, CNT), trips)
        ge.launch(s)
        s.launch(poke_k, h2.ptr, trips)
        ge2.launch(s)
    s.synchronize()
    assert get(mem) == 5 and get(mem, AUX) == 2


# -- body memory copies ---------------------------------------------------------------------------
def test_body_copies_device_memory(dev, s, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    k = n.bodies[0].add_kernel_node(poke_k, slot(mem, AUX), 41)
    c = n.bodies[0].add_memcpy_node(slot(mem, ACC), slot(mem, AUX), 8, deps=k)
    n.bodies[0].add_memset_node(slot(mem, CNT), 1, 1, deps=c)
    run(g.instantiate(), s)
    assert (get(mem), get(mem, CNT)) == (41, 1)


# -- exec update, clone, several execs, capture ---------------------------------------------------
def _if_else(mem, v, *, default=1):
    g = srt.Graph()
    h = g.create_conditional_handle(default=default)
    n = g.add_conditional_node(h, T.IF, 2)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), v)
    n.bodies[1].add_kernel_node(add_k, slot(mem, ACC), -v)
    return g


def test_update_takes_body_kernel_params(dev, s, mem):
    ge = _if_else(mem, 1).instantiate()
    run(ge, s)
    assert get(mem) == 1
    ge.update(_if_else(mem, 7))
    run(ge, s)
    assert get(mem) == 8
    ge.update(_if_else(mem, 7, default=0))  # the new handle, with its default
    run(ge, s)
    assert get(mem) == 1


def test_update_of_a_while_loop_reads_the_new_graphs_handle(dev, s, mem):
    def loop(adds):
        g = srt.Graph()
        counted_while(g, mem, adds=adds)
        return g

    ge = loop(1).instantiate()
    put(mem, CNT, 3)
    run(ge, s)
    assert get(mem) == 3
    ge.update(loop(10))  # its kernels write the new graph's h.ptr
    put(mem, CNT, 3)
    run(ge, s)
    assert get(mem) == 33


def test_clone_keeps_conditional_behaviour(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    n = g.add_conditional_node(h, T.IF, 2)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[1].add_kernel_node(add_k, slot(mem, ACC), 100)
    counted_while(g, mem, adds=10, deps=[n])
    c = g.clone()
    put(mem, CNT, 2)
    run(c.instantiate(), s)
    assert get(mem) == 120


def test_two_execs_of_one_graph(dev, s, mem):
    s2 = srt.Stream(non_blocking=True)
    g = srt.Graph()
    k = g.add_kernel_node(add_k, slot(mem, AUX), 1)
    counted_while(g, mem, deps=[k])
    a, b = g.instantiate(), g.instantiate()
    b.set_kernel_node_params(k, slot(mem, AUX), 100)
    for ge, stream in ((a, s), (b, s2), (a, s2), (b, s)):
        put(mem, CNT, 2)
        run(ge, stream)
    assert get(mem) == 8 and get(mem, AUX) == 202


def test_launch_of_an_exec_with_conditionals_into_a_capture(dev, s, mem):
    s2 = srt.Stream(non_blocking=True)
    g = srt.Graph()
    counted_while(g, mem)
    sw = g.add_conditional_node(g.create_conditional_handle(default=1), T.SWITCH, 2,
                                deps=g.nodes()[-1])
    sw.bodies[1].add_kernel_node(add_k, slot(mem, AUX), 1)
    ge = g.instantiate()
    s2.begin_capture()
    ge.launch(s2)
    s2.launch(add_k, slot(mem, AUX), 10)
    cg = s2.end_capture()
    ce = cg.instantiate()
    for launch in range(1, 4):
        put(mem, CNT, 3)
        run(ce, s)
        assert get(mem) == 3 * launch and get(mem, AUX) == 11 * launch


def test_capture_into_a_while_body(dev, s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    s.begin_capture_to_graph(n.bodies[0])
    s.launch(add_k, slot(mem, ACC), 1)
    s.launch(countdown_k, h.ptr, slot(mem, CNT))
    assert s.end_capture() is n.bodies[0]
    put(mem, CNT, 4)
    run(g.instantiate(), s)
    assert get(mem) == 4 and get(mem, CNT) == 0


# -- cuda only: the bindings' version, the body rules CUDA adds ----------------------------------
def _gate_graphs(mem):
    """An IF, an IF/else, a WHILE and a SWITCH node, each in a graph of its own."""
    out = {}
    for name, kind, size in (("if", T.IF, 1), ("else", T.IF, 2), ("while", T.WHILE, 1),
                             ("switch", T.SWITCH, 2)):
        g = srt.Graph()
        n = g.add_conditional_node(g.create_conditional_handle(default=0), kind, size)
        for b in n.bodies:
            b.add_kernel_node(add_k, slot(mem, ACC), 1)
        out[name] = (g, n)
    return out


@pytest.mark.parametrize("version, refused", [
    ((12, 3), {"if", "else", "while", "switch"}),
    ((12, 4), {"else", "switch"}),
    ((12, 6), {"else", "switch"}),
    ((12, 8), set()),
    ((13, 0), set()),
])
def test_bindings_version_gate(cuda, monkeypatch, version, refused):
    from streamrt.backends.cuda import conditional

    monkeypatch.setattr(conditional, "bindings_version", lambda: version)
    mem = srt.malloc(SLOTS * 8)
    srt.write(mem, np.zeros(SLOTS, np.int64))
    s = srt.Stream()
    try:
        for name, (g, n) in _gate_graphs(mem).items():
            if name in refused:
                with pytest.raises(srt.GraphInstantiateError) as ei:
                    g.instantiate(upload_stream=s)
                assert ei.value.result is srt.GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED
                # the exec's copy of the node (a refusal at the native build, as every one)
                assert ei.value.node.type is srt.NodeType.CONDITIONAL
                assert ei.value.node.index == n.index
                assert f"{version[0]}.{version[1]}" in str(ei.value)
                assert ("12.4" if name in ("if", "while") else "12.8") in str(ei.value)
            else:
                run(g.instantiate(upload_stream=s), s)
        if not refused:
            assert get(mem) == 2  # the SWITCH and the else bodies ran (value 0)
    finally:
        s.synchronize()
        srt.free(mem)


def test_body_copy_of_pageable_host_memory_refused(cuda):
    mem = srt.malloc(64)
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    host = np.zeros(8, np.uint8)
    c = n.bodies[0].add_memcpy_node(mem, host, 8)
    s = srt.Stream()
    with pytest.raises(srt.GraphInstantiateError) as ei:
        g.instantiate(upload_stream=s)
    assert ei.value.result is srt.GraphInstantiateResult.NODE_OPERATION_NOT_SUPPORTED
    assert ei.value.node.type is srt.NodeType.MEMCPY and ei.value.node.index == c.index
    pinned = srt.malloc_host(8)
    try:
        g2 = srt.Graph()
        n2 = g2.add_conditional_node(g2.create_conditional_handle(default=1), T.IF)
        n2.bodies[0].add_memcpy_node(mem, pinned, 8)
        run(g2.instantiate(), s)  # pinned memory is fine
    finally:
        srt.free_host(pinned)
        srt.free(mem)


def test_handle_of_another_device_refused(cuda):
    with srt.Device("cpu:0"):  # the handle's value is cpu memory: no cuda kernel can reach it
        g = srt.Graph()
        h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.IF)
    mem = srt.malloc(64)
    n.bodies[0].add_kernel_node(add_k, mem, 1)
    s = srt.Stream()
    try:
        with pytest.raises(srt.GraphInstantiateError) as ei:
            g.instantiate(upload_stream=s)
        # (the frontend's check of the graph's devices finds it first; the backend checks too)
        assert ei.value.result is srt.GraphInstantiateResult.MULTIPLE_DEVICES_NOT_SUPPORTED
        assert "cpu:0" in str(ei.value)
    finally:
        srt.free(mem)


def test_native_graph_holds_conditional_nodes(cuda):
    from cuda.bindings import runtime as rt

    from tests.cuda.fake import conditional as fake_cond
    from tests.cuda.fake import graphs as fake_graphs
    from tests.cuda.fake import installed

    if not installed():
        pytest.skip("inspects the fake runtime's graphs")
    mem = srt.malloc(64)
    srt.write(mem, np.zeros(8, np.int64))
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    s = srt.Stream()
    put(mem, CNT, 2)
    run(ge, s)
    assert get(mem) == 2
    runner = next(iter(ge._plans.values())).runner
    native_g = fake_graphs.GRAPHS[int(runner.graph)]
    kinds = sorted(n.kind for n in native_g.nodes.values())
    assert kinds == ["conditional", "kernel", "kernel"]  # init kernel, bridge, the node
    cond = next(n for n in native_g.nodes.values() if n.kind == "conditional")
    assert cond.run.type == int(rt.cudaGraphConditionalNodeType.cudaGraphCondTypeWhile)
    assert len(cond.run.bodies[0].nodes) == 3  # add, countdown, the closing bridge
    assert not cond.run.handle.flags  # no CUDA default: the bridge sets it before each test
    assert fake_cond.HANDLES[cond.run.handle.handle] is cond.run.handle
    srt.free(mem)


# -- the fake's model of the CUDA API -------------------------------------------------------------
def test_fake_conditional_node_api(cuda):
    from cuda.bindings import runtime as rt

    from tests.cuda.fake import installed

    if not installed():
        pytest.skip("the fake runtime's own behaviour")

    def ok(res):
        assert res[0] == rt.cudaError_t.cudaSuccess, res
        return res[1] if len(res) == 2 else res[1:]

    g = ok(rt.cudaGraphCreate(0))
    assert rt.cudaGraphConditionalHandleCreate(g, 0, 7)[0] == rt.cudaError_t.cudaErrorInvalidValue
    h = ok(rt.cudaGraphConditionalHandleCreate(
        g, 1, rt.cudaGraphConditionalHandleFlags.cudaGraphCondAssignDefault))
    unused = ok(rt.cudaGraphConditionalHandleCreate(g, 0, 0))

    def params(handle, kind, size):
        p = rt.cudaGraphNodeParams()
        p.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
        p.conditional.handle = handle
        p.conditional.type = kind
        p.conditional.size = size
        return p

    W = rt.cudaGraphConditionalNodeType.cudaGraphCondTypeWhile
    bad = params(h, W, 2)  # a WHILE node has one body
    assert rt.cudaGraphAddNode(g, None, None, 0, bad)[0] == rt.cudaError_t.cudaErrorInvalidValue
    p = params(h, rt.cudaGraphConditionalNodeType.cudaGraphCondTypeSwitch, 3)
    ok(rt.cudaGraphAddNode(g, None, None, 0, p))
    bodies = p.conditional.phGraph_out  # written by the call, as the driver does
    assert len(bodies) == 3 and len({int(b) for b in bodies}) == 3
    body = rt.cudaGraph_t(int(bodies[0]))
    ok(rt.cudaGraphAddEmptyNode(body, None, 0))
    hp = rt.cudaHostNodeParams()
    hp.fn, hp.userData = 1, 0
    assert rt.cudaGraphAddHostNode(body, None, 0, hp)[0] != rt.cudaError_t.cudaSuccess
    assert rt.cudaGraphDestroy(body)[0] == rt.cudaError_t.cudaErrorInvalidValue  # CUDA-owned
    ip = rt.cudaGraphInstantiateParams()
    assert rt.cudaGraphInstantiateWithParams(g, ip)[0] != rt.cudaError_t.cudaSuccess
    assert int(ip.result_out) == int(
        rt.cudaGraphInstantiateResult.cudaGraphInstantiateConditionalHandleUnused)
    ok(rt.cudaGraphAddNode(g, None, None, 0, params(unused, W, 1)))
    ip = rt.cudaGraphInstantiateParams()
    x = ok(rt.cudaGraphInstantiateWithParams(g, ip))
    ok(rt.cudaGraphExecDestroy(x))
    ok(rt.cudaGraphDestroy(g))
    assert rt.cudaGraphAddEmptyNode(body, None, 0)[0] == rt.cudaError_t.cudaErrorInvalidValue


# -- examples/jacobi_until_converged.py with CUDA bodies -----------------------------------------
# The example's kernels are Python only (so it runs on cpu); here its program with kernels that
# have CUDA bodies too, the convergence test writing *h.ptr: one WHILE launch runs the solve, and
# its iterate equals the host-driven loop's, on each device
JN, JTOL, JMAX = 16, 1e-6, 5000
JH2 = (1.0 / (JN + 1)) ** 2
JSHAPE = (JN + 2, JN + 2)


def _py_sweep(ctx, u, f, res):
    x = ctx.array(u, JSHAPE, np.float64)
    rhs = ctx.array(f, JSHAPE, np.float64, readonly=True)
    r = rhs[1:-1, 1:-1] + (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:]
                           - 4.0 * x[1:-1, 1:-1]) / JH2
    ctx.array(res, (1,), np.float64)[0] = np.abs(r).max()
    x[1:-1, 1:-1] += 0.25 * JH2 * r


sweep_k = srt.kernel(_py_sweep, name="jacobi_sweep_k", signature="ptr, ptr, ptr", cuda=r"""
#define JN 16
#define JW (JN + 2)
extern "C" __global__ void jacobi_sweep_k(double* u, const double* f, double* res) {
    const double h2 = (1.0 / (JN + 1)) * (1.0 / (JN + 1));
    double r[JN * JN];
    double m = 0.0;
    for (int i = 1; i <= JN; ++i)
        for (int j = 1; j <= JN; ++j) {
            const double lap = (u[(i - 1) * JW + j] + u[(i + 1) * JW + j] + u[i * JW + j - 1]
                                + u[i * JW + j + 1] - 4.0 * u[i * JW + j]) / h2;
            const double v = f[i * JW + j] + lap;
            r[(i - 1) * JN + j - 1] = v;
            m = fabs(v) > m ? fabs(v) : m;
        }
    res[0] = m;
    for (int i = 1; i <= JN; ++i)
        for (int j = 1; j <= JN; ++j) u[i * JW + j] += 0.25 * h2 * r[(i - 1) * JN + j - 1];
}
""")


def _py_converged(ctx, res, iters, hptr):
    n = ctx.array(iters, (1,), np.int64)
    n += 1
    if ctx.array(res, (1,), np.float64, readonly=True)[0] < JTOL or n[0] >= JMAX:
        ctx.array(hptr, (1,), np.uint64)[0] = 0


converged_k = srt.kernel(_py_converged, name="jacobi_converged_k", signature="ptr, ptr, ptr",
                         cuda=r"""
extern "C" __global__ void jacobi_converged_k(const double* res, long long* iters,
                                              unsigned long long* h) {
    iters[0] += 1;
    if (res[0] < 1e-6 || iters[0] >= 5000) h[0] = 0;
}
""")


def test_jacobi_until_converged_in_one_launch(dev):
    nbytes = JSHAPE[0] * JSHAPE[1] * 8
    u, f, res, iters = srt.malloc(nbytes), srt.malloc(nbytes), srt.malloc(8), srt.malloc(8)
    s = srt.Stream(non_blocking=True)

    def start():
        srt.write(u, np.zeros(JSHAPE))
        srt.write(f, np.ones(JSHAPE))
        srt.write(iters, np.zeros(1, np.int64))

    try:
        g = srt.Graph()
        h = g.create_conditional_handle(default=1)
        loop = g.add_conditional_node(h, T.WHILE)
        step = loop.bodies[0].add_kernel_node(sweep_k, u, f, res)
        loop.bodies[0].add_kernel_node(converged_k, res, iters, h.ptr, deps=[step])
        ge = g.instantiate()
        start()
        run(ge, s)
        graph_iters = int(srt.read(iters, (1,), np.int64)[0])
        graph_u = srt.read(u, JSHAPE, np.float64)
        start()
        host_iters = 0
        while True:
            s.launch(sweep_k, u, f, res)
            host_iters += 1
            s.synchronize()
            if srt.read(res, (1,), np.float64)[0] < JTOL or host_iters >= JMAX:
                break
        assert 1 < graph_iters == host_iters < JMAX
        assert np.array_equal(graph_u, srt.read(u, JSHAPE, np.float64))
    finally:
        s.synchronize()
        for p in (u, f, res, iters):
            srt.free(p)


@pytest.mark.parametrize("default", [0, 5, 2**64 - 1])
def test_default_is_the_value_before_any_launch(dev, default):
    """h.ptr holds the default from creation on both backends (cuda: no host view, so it is
    written by a synchronous copy), not device garbage until the first launch."""
    g = srt.Graph()
    h = g.create_conditional_handle(default=default)
    g.add_conditional_node(h, srt.ConditionalType.IF)
    assert value(h) == default


def test_a_handle_collected_inside_a_host_function_is_freed_after_it(cuda):
    """The garbage collector may run a handle's finalizer on the thread running host
    functions, where CUDA calls are refused (and a device-synchronizing cudaFree would wait for
    the very host function it runs in): the value's cudaFree is deferred to the next enqueue,
    never refused, never leaked."""
    import gc
    import weakref

    from tests.cuda.fake import state

    impl = cuda._impl
    s = srt.Stream(non_blocking=True)
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    ptr = h.ptr
    gone = weakref.ref(h)
    box = [g, h]
    del g, h

    def drop():
        box.clear()
        gc.collect()

    refused = len(state.refused)
    for _ in range(100):  # a collection another thread is running makes gc.collect() a no-op:
        s.launch_host_func(drop)  # then the host function collects again
        s.synchronize()
        if gone() is None:
            break
    assert gone() is None
    s.launch_host_func(lambda: None)  # an enqueue: deferred releases run
    s.synchronize()
    assert state.refused[refused:] == []
    assert ptr not in impl._allocs
