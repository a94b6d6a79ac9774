"""Conditional graph nodes (API.md §9.1, ``cudaGraphConditionalHandle`` / ``aclmdlRICond*``):
handles and their defaults, IF (and if/else), WHILE and SWITCH nodes, nesting, ``h.ptr`` written
by any kernel or copy, ``ctx.set_condition`` and its refusals, the body rules (building and
capture), instantiate, destroy, clone, update, DOT, failures, captures of launches, the
sanitizer and traces.

cpu backend only: the kernels are Python bodies that set conditions and count what ran.
Counters are int64 slots of one device buffer (``mem``); ``ACC`` collects what the bodies add,
``CNT`` is a WHILE loop's counter.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import streamrt as srt

T = srt.ConditionalType
ACC, CNT, AUX = 0, 1, 2  # int64 slots of ``mem``
SLOTS = 8


# -- kernels --------------------------------------------------------------------------------------
@srt.kernel
def add_k(ctx, p, v):
    """``p[0] += v`` (int64)."""
    ctx.array(p, (1,), np.int64)[0] += v


@srt.kernel
def set_k(ctx, h, v):
    """``cudaGraphSetConditional(h, v)``."""
    ctx.set_condition(h, v)


@srt.kernel
def init_k(ctx, h, c):
    """Start a counted loop: the condition is ``c[0] > 0``."""
    ctx.set_condition(h, int(ctx.array(c, (1,), np.int64, readonly=True)[0] > 0))


@srt.kernel
def countdown_k(ctx, h, c):
    """One trip of a counted loop: ``c[0] -= 1``, the condition ``c[0] > 0``."""
    x = ctx.array(c, (1,), np.int64)
    x[0] -= 1
    ctx.set_condition(h, int(x[0] > 0))


@srt.kernel
def poke_k(ctx, ptr, v):
    """Write the uint64 at ``ptr`` through a plain view (ACL: any kernel may write h.ptr)."""
    ctx.array(ptr, (1,), np.uint64)[0] = v


@srt.kernel
def log_k(ctx, log, tag):
    log.append(tag)


@srt.kernel
def boom_k(ctx):
    raise RuntimeError("body boom")


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def dev():
    """cpu:0 (conditional nodes with Python kernel bodies: the cpu backend)."""
    d = srt.Device("cpu:0")
    with d:
        yield d
        d.synchronize()


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
    """The handle's current value, read from its device storage."""
    return int(srt.read(h.ptr, (1,), np.uint64)[0])


def run(ge, s, times=1):
    for _ in range(times):
        ge.launch(s)
    s.synchronize()


def counted_while(g, mem, *, adds=1, default=None, deps=()):
    """A WHILE node of ``g`` whose body adds ``adds`` to ACC then counts CNT down; started by a
    kernel setting the condition to CNT > 0 (unless ``default`` is given: then no init kernel)."""
    h = g.create_conditional_handle(default=default)
    if default is None:
        deps = [g.add_kernel_node(init_k, h, slot(mem, CNT), deps=deps)]
    n = g.add_conditional_node(h, T.WHILE, deps=deps)
    body = n.bodies[0]
    a = body.add_kernel_node(add_k, slot(mem, ACC), adds)
    body.add_kernel_node(countdown_k, h, slot(mem, CNT), deps=a)
    return h, n


# -- IF -------------------------------------------------------------------------------------------
def test_conditional_types_match_cuda():
    assert (int(T.IF), int(T.WHILE), int(T.SWITCH)) == (0, 1, 2)  # cudaGraphCondType*
    assert srt.NodeType.CONDITIONAL in srt.NodeType


@pytest.mark.parametrize("v", [0, 1, 7, 2**32, 2**64 - 1])
def test_if_runs_its_body_when_the_value_is_not_zero(s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle(default=v)
    n = g.add_conditional_node(h, T.IF)
    assert n.type is srt.NodeType.CONDITIONAL and len(n.bodies) == 1
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s, 2)
    assert get(mem) == (2 if v else 0)


@pytest.mark.parametrize("v", [0, 1, 3])
def test_if_value_set_by_a_kernel_before_the_node(s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0 if v else 1)  # the kernel overrides the default
    k = g.add_kernel_node(set_k, h, v)
    n = g.add_conditional_node(h, T.IF, deps=k)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s)
    assert get(mem) == (1 if v else 0)
    assert value(h) == v


@pytest.mark.parametrize("v", [0, 1, 5])
def test_if_else_runs_exactly_one_body(s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle()
    k = g.add_kernel_node(set_k, h, v)
    n = g.add_conditional_node(h, T.IF, size=2, deps=k)
    then, other = n.bodies
    assert then is not other
    then.add_kernel_node(add_k, slot(mem, ACC), 1)
    other.add_kernel_node(add_k, slot(mem, ACC), 100)
    run(g.instantiate(), s)
    assert get(mem) == (1 if v else 100)


# -- WHILE ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("trips", [0, 1, 5])
def test_while_runs_its_body_as_long_as_the_value_is_not_zero(s, mem, trips):
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    for launch in range(1, 3):
        put(mem, CNT, trips)
        run(ge, s)
        assert get(mem) == trips * launch
        assert get(mem, CNT) == 0


def test_while_tests_the_value_before_the_first_iteration(s, mem):
    # the body would run (and count CNT down) if it ran once: the value is 0 before it
    g = srt.Graph()
    counted_while(g, mem, default=0)
    put(mem, CNT, 5)
    run(g.instantiate(), s)
    assert get(mem) == 0 and get(mem, CNT) == 5


def test_while_body_with_several_nodes_runs_them_all_each_trip(s, mem):
    log = []
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    b = n.bodies[0]
    a = b.add_kernel_node(log_k, log, "a")
    c = b.add_kernel_node(log_k, log, "b", deps=a)
    b.add_kernel_node(countdown_k, h, slot(mem, CNT), deps=c)
    put(mem, CNT, 3)
    run(g.instantiate(), s)
    assert log == ["a", "b"] * 3


# -- SWITCH ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("v", [0, 1, 2, 3, 4, 9, 2**64 - 1])
def test_switch_runs_the_selected_body_or_none(s, mem, v):
    g = srt.Graph()
    h = g.create_conditional_handle()
    k = g.add_kernel_node(set_k, h, v)
    n = g.add_conditional_node(h, T.SWITCH, size=4, deps=k)
    assert len(n.bodies) == 4
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    run(g.instantiate(), s)
    assert get(mem) == (10**v if v < 4 else 0)


def test_switch_of_one_body_is_an_if_on_zero(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    n = g.add_conditional_node(h, T.SWITCH, size=1)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    ge = g.instantiate()
    run(ge, s)
    assert get(mem) == 1  # SWITCH 0 runs body 0 (IF 0 would not)


# -- nesting --------------------------------------------------------------------------------------
def _nested(mem, log, outer, pick):
    """IF(outer) -> SWITCH(pick) of 3 -> body 2: WHILE counting CNT; body 0 adds 100."""
    g = srt.Graph()
    h1 = g.create_conditional_handle(default=outer)
    n1 = g.add_conditional_node(h1, T.IF)
    b1 = n1.bodies[0]
    h2 = g.create_conditional_handle(default=pick)  # a handle of the top graph, used in a body
    first = b1.add_kernel_node(log_k, log, "level1")
    n2 = b1.add_conditional_node(h2, T.SWITCH, size=3, deps=first)
    n2.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 100)
    b2 = n2.bodies[2]
    h3 = b2.create_conditional_handle()  # a handle of the body itself
    i = b2.add_kernel_node(init_k, h3, slot(mem, CNT))
    n3 = b2.add_conditional_node(h3, T.WHILE, deps=i)
    b3 = n3.bodies[0]
    a = b3.add_kernel_node(add_k, slot(mem, ACC), 1)
    b3.add_kernel_node(log_k, log, "level3", deps=a)
    b3.add_kernel_node(countdown_k, h3, slot(mem, CNT), deps=a)
    return g


@pytest.mark.parametrize("outer, pick, acc, level3", [
    (1, 2, 3, 3), (0, 2, 0, 0), (1, 0, 100, 0), (1, 1, 0, 0), (1, 7, 0, 0)])
def test_nesting_to_depth_three(s, mem, outer, pick, acc, level3):
    log = []
    g = _nested(mem, log, outer, pick)
    ge = g.instantiate()
    for launch in range(1, 3):
        put(mem, CNT, 3)
        run(ge, s)
        assert get(mem) == acc * launch
        assert log.count("level1") == launch * bool(outer)
        assert log.count("level3") == level3 * launch


# -- defaults and h.ptr ---------------------------------------------------------------------------
def test_default_is_written_at_every_launch(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.add_kernel_node(set_k, h, 0, deps=n)  # each launch leaves 0 behind
    ge = g.instantiate()
    run(ge, s, 3)
    assert get(mem) == 3 and value(h) == 0
    srt.write(h.ptr, np.array([0], np.uint64))  # a write between launches: the default wins
    run(ge, s)
    assert get(mem) == 4


def test_default_restarts_a_while_loop_at_every_launch(s, mem):
    g = srt.Graph()
    h, _ = counted_while(g, mem, default=1)
    ge = g.instantiate()
    for launch in range(1, 4):
        put(mem, CNT, 2)
        run(ge, s)
        assert get(mem) == 2 * launch and value(h) == 0


def test_default_is_also_the_value_before_any_launch(mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=5)
    g.add_conditional_node(h, T.IF)
    assert value(h) == 5
    assert h.default == 5 and isinstance(h, srt.ConditionalHandle)


def test_no_default_keeps_the_last_value_across_launches(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle()
    assert h.default is None
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.add_kernel_node(set_k, h, 1, deps=n)
    ge = g.instantiate()
    srt.write(h.ptr, np.array([0], np.uint64))
    run(ge, s)
    assert get(mem) == 0  # 0 at the first launch; the launch left 1
    run(ge, s, 2)
    assert get(mem) == 2 and value(h) == 1


def test_h_ptr_written_by_srt_write_between_launches(s, mem):
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


def test_h_ptr_written_by_a_memset_node(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    m = g.add_memset_node(h.ptr, 2, 1)  # the low byte: value 2 (the default zeroed the rest)
    n = g.add_conditional_node(h, T.SWITCH, size=3, deps=m)
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    run(g.instantiate(), s, 2)
    assert get(mem) == 200


def test_h_ptr_written_by_memcpy_nodes(s, mem):
    host = np.array([1], np.uint64)  # a host endpoint: read when the node runs
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    m = g.add_memcpy_node(h.ptr, host, 8)
    n = g.add_conditional_node(h, T.SWITCH, size=3, deps=m)
    for i, b in enumerate(n.bodies):
        b.add_kernel_node(add_k, slot(mem, ACC), 10**i)
    ge = g.instantiate()
    run(ge, s)
    assert get(mem) == 10
    host[0] = 2
    run(ge, s)
    assert get(mem) == 110
    # a device-to-device copy from a slot a kernel node wrote
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle(default=0)
    w = g2.add_kernel_node(poke_k, slot(mem, AUX), 1)
    c = g2.add_memcpy_node(h2.ptr, slot(mem, AUX), 8, deps=w)
    n2 = g2.add_conditional_node(h2, T.IF, deps=c)
    n2.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1000)
    run(g2.instantiate(), s)
    assert get(mem) == 1110


def test_h_ptr_written_by_plain_kernels(s, mem):
    # eager work on the launching stream before the launch, and a graph kernel through a view
    g = srt.Graph()
    h = g.create_conditional_handle()
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    ge = g.instantiate()
    s.launch(poke_k, h.ptr, 1)
    ge.launch(s)
    s.launch(poke_k, h.ptr, 0)
    ge.launch(s)
    s.synchronize()
    assert get(mem) == 1
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle(default=0)
    k = g2.add_kernel_node(poke_k, h2.ptr, 3)
    n2 = g2.add_conditional_node(h2, T.WHILE, deps=k)
    n2.bodies[0].add_kernel_node(countdown_k, h2, slot(mem, CNT))
    put(mem, CNT, 4)
    run(g2.instantiate(), s)
    assert get(mem, CNT) == 0


def test_h_ptr_is_a_device_uint64_of_the_handle(dev):
    g = srt.Graph()
    h1, h2 = g.create_conditional_handle(), g.create_conditional_handle()
    assert isinstance(h1.ptr, int) and h1.ptr != h2.ptr
    srt.write(h1.ptr, np.array([2**64 - 1], np.uint64))
    srt.memset(h2.ptr, 0, 8)
    assert value(h1) == 2**64 - 1 and value(h2) == 0


# -- ctx.set_condition ----------------------------------------------------------------------------
def test_set_condition_refused_in_an_eager_launch(s):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    g.add_conditional_node(h, T.IF)
    s.launch(set_k, h, 1)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert isinstance(ei.value.__cause__, srt.IllegalStateError)
    assert value(h) == 0


def test_set_condition_refused_for_a_handle_of_another_graph(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    g.add_conditional_node(h, T.IF)
    other = srt.Graph()
    other.add_kernel_node(set_k, h, 1)
    ge = other.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert isinstance(ei.value.__cause__, srt.IllegalStateError)
    assert value(h) == 0
    # the same kernel in the owner's child graph may set it
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle(default=0)
    child = srt.Graph()
    child.add_kernel_node(set_k, h2, 1)
    c = g2.add_child_graph_node(child)
    n = g2.add_conditional_node(h2, T.IF, deps=c)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g2.instantiate(), s)
    assert get(mem) == 1


def test_set_condition_needs_a_handle(s):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    g.add_conditional_node(h, T.IF)
    g.add_kernel_node(set_k, h.ptr, 1)  # the address is not the handle
    g.instantiate().launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert isinstance(ei.value.__cause__, TypeError)


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (2**64, ValueError), (1.5, TypeError),
                                      ("1", TypeError), (None, TypeError)])
def test_set_condition_refuses_bad_values(s, mem, bad, exc):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    k = g.add_kernel_node(set_k, h, bad)
    n = g.add_conditional_node(h, T.IF, deps=k)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    ge = g.instantiate()
    ge.launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert isinstance(ei.value.__cause__, exc)
    assert isinstance(ei.value.__cause__, srt.StreamRTError)
    assert get(mem) == 0 and value(h) == 0


@pytest.mark.parametrize("good", [np.uint64(1), np.int32(2), 2**64 - 1])
def test_set_condition_takes_any_integer_in_range(s, mem, good):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    k = g.add_kernel_node(set_k, h, good)
    n = g.add_conditional_node(h, T.IF, deps=k)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    run(g.instantiate(), s)
    assert get(mem) == 1 and value(h) == int(good)


@pytest.mark.parametrize("bad, exc", [(-1, srt.InvalidValueError), (2**64, srt.InvalidValueError),
                                      (1.0, srt.InvalidTypeError), ("0", srt.InvalidTypeError)])
def test_default_refuses_bad_values(bad, exc):
    g = srt.Graph()
    with pytest.raises(exc):
        g.create_conditional_handle(default=bad)
    assert g.create_conditional_handle(default=2**64 - 1).default == 2**64 - 1


# -- building refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind, size", [(T.WHILE, 2), (T.IF, 3), (T.IF, 0), (T.WHILE, 0),
                                        (T.SWITCH, 0), (T.SWITCH, -1)])
def test_bad_sizes_refused(kind, size):
    g = srt.Graph()
    h = g.create_conditional_handle()
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(h, kind, size)
    assert g.nodes() == []
    g.add_conditional_node(h, kind)  # the refusal did not use the handle up


@pytest.mark.parametrize("kind, size", [(T.IF, 1), (T.IF, 2), (T.WHILE, 1), (T.SWITCH, 1),
                                        (T.SWITCH, 6)])
def test_good_sizes_make_that_many_bodies(kind, size):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(), kind, size)
    assert len(n.bodies) == size and len(set(map(id, n.bodies))) == size
    assert all(isinstance(b, srt.Graph) and b.nodes() == [] for b in n.bodies)


def test_bad_kinds_and_handles_refused():
    g = srt.Graph()
    h = g.create_conditional_handle()
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(h, 7)
    with pytest.raises(srt.InvalidTypeError):
        g.add_conditional_node(h, "IF")
    with pytest.raises(srt.InvalidTypeError):
        g.add_conditional_node(h.ptr, T.IF)  # the address is not the handle
    with pytest.raises(srt.InvalidTypeError):
        g.add_conditional_node(h, T.SWITCH, size=2.0)
    assert g.nodes() == []


def test_a_handle_of_another_graph_is_refused():
    g, other = srt.Graph(), srt.Graph()
    h = other.create_conditional_handle()
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(h, T.IF)
    # a body's own handle is not the outer graph's either
    n = g.add_conditional_node(g.create_conditional_handle(), T.IF)
    hb = n.bodies[0].create_conditional_handle()
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(hb, T.IF)
    n.bodies[0].add_conditional_node(hb, T.IF)  # in the body it is fine
    assert g.nodes() == [n]


def test_a_handle_serves_one_conditional_node():
    g = srt.Graph()
    h = g.create_conditional_handle()
    n = g.add_conditional_node(h, T.IF)
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(h, T.IF)
    with pytest.raises(srt.InvalidValueError):
        g.add_conditional_node(h, T.WHILE)
    with pytest.raises(srt.InvalidValueError):
        n.bodies[0].add_conditional_node(h, T.IF)  # nor a second one in a body
    assert g.nodes() == [n] and n.bodies[0].nodes() == []


@pytest.mark.parametrize("what", ["host", "record", "wait", "alloc"])
def test_body_refuses_host_event_and_memory_nodes(what, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(), T.IF)
    b = n.bodies[0]
    ev = srt.Event()
    add = {"host": lambda: b.add_host_node(print),
           "record": lambda: b.add_event_record_node(ev),
           "wait": lambda: b.add_event_wait_node(ev),
           "alloc": lambda: b.add_mem_alloc_node(64)}[what]
    with pytest.raises(srt.InvalidValueError):
        add()
    assert b.nodes() == []


def test_body_takes_kernel_empty_memcpy_memset_child_and_conditional_nodes(s, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    b = n.bodies[0]
    e = b.add_empty_node()
    m = b.add_memset_node(slot(mem, AUX), 1, 1, deps=e)
    c = b.add_memcpy_node(slot(mem, ACC), slot(mem, AUX), 8, deps=m)  # ACC = 1
    child = srt.Graph()
    child.add_kernel_node(add_k, slot(mem, ACC), 10)
    cg = b.add_child_graph_node(child, deps=c)
    inner = b.add_conditional_node(g.create_conditional_handle(default=1), T.IF, deps=cg)
    inner.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 100)
    assert [x.type for x in b.nodes()] == [srt.NodeType.EMPTY, srt.NodeType.MEMSET,
                                           srt.NodeType.MEMCPY, srt.NodeType.GRAPH,
                                           srt.NodeType.CONDITIONAL]
    run(g.instantiate(), s)
    assert get(mem) == 111


def test_body_refuses_a_child_graph_with_a_host_node():
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(), T.IF)
    child = srt.Graph()
    child.add_host_node(print)
    with pytest.raises(srt.InvalidValueError):
        n.bodies[0].add_child_graph_node(child)
    outer = srt.Graph()  # also one level down
    outer.add_child_graph_node(child)
    with pytest.raises(srt.InvalidValueError):
        n.bodies[0].add_child_graph_node(outer)
    assert n.bodies[0].nodes() == []
    g.add_child_graph_node(child)  # the top level takes it


def test_capture_into_a_body_takes_kernels(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    s.begin_capture_to_graph(n.bodies[0])
    s.launch(add_k, slot(mem, ACC), 1)
    s.launch(countdown_k, h, slot(mem, CNT))
    got = s.end_capture()
    assert got is n.bodies[0]
    a, c = got.nodes()
    assert got.edges() == [(a, c)]
    put(mem, CNT, 4)
    run(g.instantiate(), s)
    assert get(mem) == 4


@pytest.mark.parametrize("what", ["host", "malloc"])
def test_capture_into_a_body_invalidated_by_unsupported_work(s, mem, what):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    s.begin_capture_to_graph(n.bodies[0])
    s.launch(add_k, slot(mem, ACC), 1)
    with pytest.raises(srt.CaptureUnsupportedError):
        if what == "host":
            s.launch_host_func(print, "never")
        else:
            s.malloc(64)
    assert s.capture_info().status is srt.CaptureStatus.INVALIDATED
    with pytest.raises(srt.CaptureInvalidatedError):
        s.end_capture()
    assert not s.is_capturing()
    assert all(x.type is srt.NodeType.KERNEL for x in n.bodies[0].nodes())


# -- instantiate, destroy -------------------------------------------------------------------------
def test_instantiate_refuses_an_unused_handle(mem):
    g = srt.Graph()
    g.add_kernel_node(add_k, slot(mem, ACC), 1)
    g.create_conditional_handle()
    with pytest.raises(srt.GraphInstantiateError) as ei:
        g.instantiate()
    assert ei.value.result is srt.GraphInstantiateResult.CONDITIONAL_HANDLE_UNUSED
    assert ei.value.node is None


def test_instantiate_refuses_an_unused_handle_of_a_body(mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(), T.IF)
    n.bodies[0].create_conditional_handle()
    with pytest.raises(srt.GraphInstantiateError) as ei:
        g.instantiate()
    assert ei.value.result is srt.GraphInstantiateResult.CONDITIONAL_HANDLE_UNUSED


def test_a_body_cannot_be_instantiated_or_destroyed(mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(), T.IF)
    b = n.bodies[0]
    b.add_kernel_node(add_k, slot(mem, ACC), 1)
    with pytest.raises(srt.InvalidValueError):
        b.instantiate()
    with pytest.raises(srt.InvalidValueError):
        b.destroy()
    assert b.nodes()  # still alive
    g.instantiate()


def test_destroy_makes_bodies_refuse_use_and_execs_keep_working(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.IF)
    b = n.bodies[0]
    inner = b.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    ib = inner.bodies[0]
    ib.add_kernel_node(add_k, slot(mem, ACC), 1)
    ge = g.instantiate()
    g.destroy()
    for body in (b, ib):
        with pytest.raises(srt.InvalidHandleError):
            body.nodes()
        with pytest.raises(srt.InvalidHandleError):
            body.add_kernel_node(add_k, slot(mem, ACC), 1)
        with pytest.raises(srt.InvalidHandleError):
            body.to_dot()
    with pytest.raises(srt.InvalidHandleError):
        n.bodies  # noqa: B018 - the property refuses
    with pytest.raises(srt.InvalidHandleError):
        g.create_conditional_handle()
    run(ge, s, 2)
    assert get(mem) == 2


def test_graph_as_context_manager_destroys_bodies(mem):
    with srt.Graph() as g:
        n = g.add_conditional_node(g.create_conditional_handle(), T.SWITCH, 2)
        b0, b1 = n.bodies
    for b in (b0, b1):
        with pytest.raises(srt.InvalidHandleError):
            b.add_empty_node()


# -- clone, update, DOT ---------------------------------------------------------------------------
def test_clone_keeps_conditional_behaviour_and_is_independent(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    n = g.add_conditional_node(h, T.IF, 2)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[1].add_kernel_node(add_k, slot(mem, ACC), 100)
    counted_while(g, mem, adds=10, deps=[n])
    c = g.clone()
    cn = c.find_in_clone(n)
    assert cn.type is srt.NodeType.CONDITIONAL and len(cn.bodies) == 2
    assert not set(map(id, cn.bodies)) & set(map(id, n.bodies))
    put(mem, CNT, 2)
    run(c.instantiate(), s)
    assert get(mem) == 120
    cn.bodies[1].add_kernel_node(add_k, slot(mem, ACC), 1000,  # the clone's body only
                                 deps=cn.bodies[1].nodes())
    put(mem, ACC, 0)
    put(mem, CNT, 2)
    run(g.instantiate(), s)
    assert get(mem) == 120
    put(mem, ACC, 0)
    put(mem, CNT, 2)
    run(c.instantiate(), s)
    assert get(mem) == 1120


def _if_else(mem, v, *, default=1, kind=T.IF, size=2):
    g = srt.Graph()
    h = g.create_conditional_handle(default=default)
    n = g.add_conditional_node(h, kind, size)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), v)
    if size > 1:
        n.bodies[1].add_kernel_node(add_k, slot(mem, ACC), -v)
    return g


def test_update_takes_body_kernel_params(s, mem):
    ge = _if_else(mem, 1).instantiate()
    run(ge, s)
    assert get(mem) == 1
    ge.update(_if_else(mem, 7))
    run(ge, s)
    assert get(mem) == 8
    ge.update(_if_else(mem, 7, default=0))  # the new handle, with its default
    run(ge, s)
    assert get(mem) == 1


def test_update_of_a_while_loop_sets_the_new_graphs_handle(s, mem):
    def loop(adds):
        g = srt.Graph()
        counted_while(g, mem, adds=adds)
        return g

    ge = loop(1).instantiate()
    put(mem, CNT, 3)
    run(ge, s)
    assert get(mem) == 3
    ge.update(loop(10))  # its kernels set the new graph's handle
    put(mem, CNT, 3)
    run(ge, s)
    assert get(mem) == 33


@pytest.mark.parametrize("change", [dict(kind=T.SWITCH), dict(size=1), dict(default=None)])
def test_update_refuses_a_kind_or_size_change(s, mem, change):
    ge = _if_else(mem, 1).instantiate()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(_if_else(mem, 5, **change))
    assert ei.value.node is not None and ei.value.node.type is srt.NodeType.CONDITIONAL
    run(ge, s)
    assert get(mem) == 1  # the exec is unchanged


def test_update_refuses_a_body_topology_or_node_type_change(s, mem):
    def body(edge, memset=False):
        g = srt.Graph()
        n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
        a = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
        if memset:
            n.bodies[0].add_memset_node(slot(mem, AUX), 0, 8)
        else:
            n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1, deps=a if edge else ())
        return g

    ge = body(True).instantiate()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(body(False))
    assert ei.value.result is srt.GraphExecUpdateResult.TOPOLOGY_CHANGED
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(body(True, memset=True))
    assert ei.value.result in (srt.GraphExecUpdateResult.TOPOLOGY_CHANGED,
                               srt.GraphExecUpdateResult.NODE_TYPE_CHANGED)
    run(ge, s)
    assert get(mem) == 2


def test_to_dot_shows_bodies(tmp_path, mem):
    g = srt.Graph()
    h = g.create_conditional_handle()
    n = g.add_conditional_node(h, T.WHILE)
    n.bodies[0].add_kernel_node(countdown_k, h, slot(mem, CNT))
    sw = g.add_conditional_node(g.create_conditional_handle(), T.SWITCH, 3, deps=n)
    sw.bodies[2].add_kernel_node(add_k, slot(mem, ACC), 1)
    text = g.to_dot(tmp_path / "g.dot")
    assert (tmp_path / "g.dot").read_text() == text
    assert text.startswith("digraph") and text.count("{") == text.count("}")
    assert "CONDITIONAL" in text and "WHILE" in text and "SWITCH" in text
    assert text.count("subgraph cluster") == 4  # one per body
    assert "countdown_k" in text and "add_k" in text
    for k in range(3):
        assert f"body {k}" in text


# -- launches ---------------------------------------------------------------------------------------
def test_a_body_kernel_failure_reaches_the_stream(s, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    n.bodies[0].add_kernel_node(boom_k)
    ge = g.instantiate()
    for _ in range(2):  # and the exec stays usable
        ge.launch(s)
        with pytest.raises(srt.LaunchError) as ei:
            s.synchronize()
        assert isinstance(ei.value.__cause__, RuntimeError)
        assert "body boom" in str(ei.value)


def test_a_failed_while_trip_stops_the_loop(s, mem):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    a = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[0].add_kernel_node(boom_k, deps=a)
    g.instantiate().launch(s)
    with pytest.raises(srt.LaunchError):
        s.synchronize()
    assert get(mem) == 1  # one trip, no endless loop


def test_a_body_kernel_failure_names_the_node(s, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    n.bodies[0].add_kernel_node(boom_k)
    g.instantiate().launch(s)
    with pytest.raises(srt.LaunchError) as ei:
        s.synchronize()
    assert "graph node: boom_k" in str(ei.value)


def test_two_execs_of_one_graph(s, s2, mem):
    g = srt.Graph()
    k = g.add_kernel_node(add_k, slot(mem, AUX), 1)
    counted_while(g, mem, deps=[k])
    a, b = g.instantiate(), g.instantiate()
    b.set_kernel_node_params(k, slot(mem, AUX), 100)
    for ge, stream in ((a, s), (b, s2), (a, s2), (b, s)):
        put(mem, CNT, 2)
        run(ge, stream)
    assert get(mem) == 8 and get(mem, AUX) == 202


def test_launch_of_an_exec_with_conditionals_into_a_capture(s, s2, mem):
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
    assert any(x.type in (srt.NodeType.GRAPH, srt.NodeType.CONDITIONAL) for x in cg.nodes())
    ce = cg.instantiate()
    for launch in range(1, 4):
        put(mem, CNT, 3)
        run(ce, s)
        assert get(mem) == 3 * launch and get(mem, AUX) == 11 * launch


def test_eager_launches_and_graph_launches_interleave_in_stream_order(s, mem):
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    for trips in (2, 0, 3):
        s.launch(poke_k, slot(mem, CNT), trips)  # the counter, set in stream order
        ge.launch(s)
    s.synchronize()
    assert get(mem) == 5


# -- the sanitizer --------------------------------------------------------------------------------
def _races(san, s):
    s.synchronize()
    rep = san.report()
    assert all(f.kind == "race" for f in rep), rep
    return rep


def test_sanitizer_race_between_unordered_body_nodes(s, mem, san):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 2)  # BUG: no edge to the first
    g.instantiate().launch(s)
    rep = _races(san, s)
    assert len(rep) == 1 and "body 0" in str(rep[0])


def test_sanitizer_race_between_a_body_node_and_a_concurrent_outer_node(s, mem, san):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=0), T.SWITCH, 2)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.add_kernel_node(add_k, slot(mem, ACC), 5)  # BUG: not ordered with the node
    g.instantiate().launch(s)
    assert len(_races(san, s)) == 1


def test_sanitizer_race_between_a_body_node_and_another_stream(s, s2, mem, san):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.instantiate().launch(s)
    s2.launch(add_k, slot(mem, ACC), 1)  # BUG: s2 does not wait for the launch
    s2.synchronize()
    assert len(_races(san, s)) == 1


def test_sanitizer_race_inside_a_nested_body(s, mem, san):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    inner = n.bodies[0].add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    inner.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)  # BUG: unordered with inner
    g.instantiate().launch(s)
    assert len(_races(san, s)) == 1


def test_sanitizer_no_finding_for_ordered_body_and_outer_nodes(s, s2, mem, san):
    g = srt.Graph()
    first = g.add_kernel_node(add_k, slot(mem, ACC), 1)
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF, deps=first)
    a = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    inner = n.bodies[0].add_conditional_node(g.create_conditional_handle(default=1), T.IF,
                                             deps=a)
    inner.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1, deps=inner)
    g.add_kernel_node(add_k, slot(mem, ACC), 1, deps=n)
    ge = g.instantiate()
    run(ge, s, 2)
    s2.wait(s.record())
    s2.launch(add_k, slot(mem, ACC), 1)
    s2.synchronize()
    assert san.report() == []
    assert get(mem) == 11


def test_sanitizer_no_finding_across_while_iterations(s, mem, san):
    g = srt.Graph()
    counted_while(g, mem)
    ge = g.instantiate()
    put(mem, CNT, 4)
    run(ge, s)
    put(mem, CNT, 3)
    run(ge, s)
    assert san.report() == []
    assert get(mem) == 7


def test_sanitizer_race_in_every_trip_of_a_racy_while_body(s, mem, san):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    a = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    b = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)  # BUG: no edge to a
    n.bodies[0].add_kernel_node(countdown_k, h, slot(mem, CNT), deps=[a, b])
    put(mem, CNT, 3)
    g.instantiate().launch(s)
    rep = _races(san, s)
    assert 1 <= len(rep) <= 3  # a and b, in one trip or each


def test_sanitizer_race_between_a_handle_write_and_the_conditional_node(s, mem, san):
    g = srt.Graph()
    h = g.create_conditional_handle(default=0)
    g.add_memset_node(h.ptr, 1, 1)  # BUG: not ordered before the node reading the value
    n = g.add_conditional_node(h, T.IF)
    n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    g.instantiate().launch(s)
    assert len(_races(san, s)) >= 1


# -- traces ---------------------------------------------------------------------------------------
def test_trace_lists_body_nodes_inside_the_launch(s, mem, tmp_path):
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    n = g.add_conditional_node(h, T.WHILE)
    a = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    n.bodies[0].add_kernel_node(countdown_k, h, slot(mem, CNT), deps=a)
    h2 = g.create_conditional_handle(default=1)
    sw = g.add_conditional_node(h2, T.IF, 2, deps=n)
    sw.bodies[0].add_kernel_node(log_k, [], "then")
    sw.bodies[1].add_kernel_node(set_k, h2, 0)  # never runs
    ge = g.instantiate()
    put(mem, CNT, 3)
    path = tmp_path / "t.json"
    with srt.trace(path):
        ge.launch(s)
        s.synchronize()
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X"]
    names = [e["name"] for e in slices]
    assert names.count("add_k") == 3 and names.count("countdown_k") == 3
    assert names.count("log_k") == 1 and "set_k" not in names
    (launch,) = [e for e in slices if e.get("cat") == "graph"]
    lo, hi = launch["ts"], launch["ts"] + launch["dur"]
    for e in slices:
        if e["name"] in ("add_k", "countdown_k", "log_k"):
            assert lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3
            assert "body" in str(e["args"].get("position")), e


def test_sanitizer_orders_set_condition_before_the_next_test_and_defaults_first(s, mem, san):
    """A WHILE body kernel setting the handle, the node's reads between iterations and the
    launch's default write are ordered: a correct loop has no finding; a kernel outside the
    body setting the handle, unordered with the node, is one."""
    @srt.kernel
    def countdown(ctx, c, h):
        v = ctx.array(c, (1,), np.int64)
        v -= 1
        if v[0] <= 0:
            ctx.set_condition(h, 0)

    c = slot(mem, ACC)
    srt.write(c, np.array([3], np.int64))
    g = srt.Graph()
    h_ok = g.create_conditional_handle(default=1)
    w = g.add_conditional_node(h_ok, srt.ConditionalType.WHILE)
    w.bodies[0].add_kernel_node(countdown, c, h_ok)
    g.instantiate().launch(s)
    s.synchronize()
    assert san.report() == []
    assert get(mem) == 0  # three trips
    g2 = srt.Graph()
    h2 = g2.create_conditional_handle(default=1)
    n2 = g2.add_conditional_node(h2, srt.ConditionalType.IF)
    n2.bodies[0].add_empty_node()
    srt.write(c, np.array([1], np.int64))
    g2.add_kernel_node(countdown, c, h2)  # no edge to the node reading h2
    g2.instantiate().launch(s)
    s.synchronize()
    assert any(f.kind == "race" for f in san.report())


def test_per_node_setters_refuse_body_nodes_saying_why(s, mem):
    g = srt.Graph()
    n = g.add_conditional_node(g.create_conditional_handle(default=1), T.IF)
    k = n.bodies[0].add_kernel_node(add_k, slot(mem, ACC), 1)
    ge = g.instantiate()
    with pytest.raises(srt.InvalidValueError, match="ge.update"):
        ge.set_kernel_node_params(k, slot(mem, ACC), 2)
    with pytest.raises(srt.InvalidValueError, match="ge.update"):
        ge.set_node_enabled(k, False)
