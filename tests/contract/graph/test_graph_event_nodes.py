"""Event record and wait nodes of graphs: they mark graph work and order it after other streams, also
inside child graphs, and they act where they sit in the graph (API.md §9.1): a record node records
when its dependencies are done, a wait node holds back only its dependents.

The story: both once acted at the launch's edges (every wait node made the whole launch wait, every
record node recorded once the whole launch was done). Never a weaker order, but a later one: a
stream waiting for an early record node started only after the whole graph, two timing record
nodes of one graph measured about 0 ms, and the program of the first test deadlocked."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import PY_KERNELS, add_one_kernel, copy_kernel, cpu_only, fill_kernel
from tests.conftest import read_f32 as _read

N = 16


WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster
DONE_S = 20  # seconds a correct runtime takes at most to get somewhere; a failing one never does

BUSY = r"""extern "C" __global__ void busy_kernel(float* out, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = acc * 0.999999f + 1.0f;
  out[0] = acc;
}"""


@srt.kernel(cuda=BUSY, signature="ptr, i32")
def busy_kernel(ctx, out, n):
    """A known amount of work (``n`` steps of a recurrence), its result in ``out[0]``."""
    acc = np.zeros(max(n // 1000, 1), np.float64)
    for _ in range(50):
        acc = np.sqrt(acc * 0.5 + 1.0)
    ctx.array(out, (1,), np.float32)[0] = acc[-1]


@srt.kernel
def timed_kernel(ctx, out, n, log):
    """``busy_kernel``'s work, logging when it started and ended (perf_counter: the cpu backend's
    event stamps)."""
    log.append(time.perf_counter())
    busy_kernel.fn(ctx, out, n)
    log.append(time.perf_counter())


# -- event nodes ---------------------------------------------------------------------------------------
def test_graph_exec_event_record_node_marks_graph_work(s, s2, bufs, gate):
    a, b, _ = bufs
    ev = srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(fill_kernel, a, N, 4.0)
    g.add_event_record_node(ev, deps=k)
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    assert not ev.query()  # recorded at the launch, behind the gate
    s2.wait(ev)
    s2.launch(copy_kernel, b, a, N)
    hold.open()
    s2.synchronize()
    assert ev.query() and (_read(b) == 4.0).all()


def test_graph_exec_event_wait_node_orders_after_other_stream(s, s2, bufs, gate):
    a, b, _ = bufs
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 6.0)
    ev = s2.record()
    done = threading.Event()
    g = srt.Graph()
    w = g.add_event_wait_node(ev)
    g.add_kernel_node(copy_kernel, b, a, N, deps=w)
    g.add_host_node(done.set, deps=g.nodes()[1])
    g.instantiate().launch(s)
    assert not done.wait(timeout=WINDOW)  # the graph waits for s2's gate
    hold.open()
    s.synchronize()
    assert (_read(b) == 6.0).all()


def test_graph_exec_event_nodes_inside_child_graph(s, s2, bufs, gate):
    """Wait and record nodes inside a child graph act as they do at the top level.

    The story: instantiate collected event nodes from the top level only, so a child graph's
    wait was dropped (the graph read ``a`` before s2 wrote it) and its record never fired.
    """
    a, b, _ = bufs
    # a wait node in a child graph: the graph waits for s2
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 2.0)
    ready = s2.record()
    done = threading.Event()
    child = srt.Graph()
    w = child.add_event_wait_node(ready)
    c = child.add_kernel_node(copy_kernel, b, a, N, deps=w)
    recorded = srt.Event()
    child.add_event_record_node(recorded, deps=c)
    parent = srt.Graph()
    cg = parent.add_child_graph_node(child)
    parent.add_host_node(done.set, deps=cg)
    parent.instantiate().launch(s)
    assert not recorded.query()  # a record node in a child graph marks the launch
    assert not done.wait(timeout=WINDOW)
    hold.open()
    recorded.synchronize()
    assert (_read(b) == 2.0).all()


# -- where they act -------------------------------------------------------------------------------------
def test_graph_exec_early_record_node_and_late_wait_node_do_not_deadlock(dev, s, s2, bufs, gate):
    """Issue 23's program: a third stream waits for the graph's early record node, then opens the
    gate of the stream whose event a later node of the same graph waits for (a wait node bound at
    the launch to that stream's record). Acting at the launch's edges, the third stream waited for
    the whole graph, the graph for the gated stream, the gated stream for the third: a deadlock."""
    a, b, c = bufs
    s3 = srt.Stream(dev, non_blocking=True)
    early, late = srt.Event(), srt.Event()
    finished = threading.Event()
    hold = gate(s2)
    s2.launch(fill_kernel, c, N, 7.0)
    s2.record(late)
    g = srt.Graph()
    w = g.add_event_wait_node(late)  # first in creation order (and in the replay's walk)
    k2 = g.add_kernel_node(copy_kernel, b, c, N, deps=w)
    g.add_host_node(finished.set, deps=k2)
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    g.add_event_record_node(early, deps=k1)
    g.instantiate().launch(s)
    s3.wait(early)
    s3.launch_host_func(hold.open)
    assert finished.wait(timeout=DONE_S)
    s.synchronize()
    assert (_read(b) == 7.0).all() and (_read(a) == 1.0).all()  # k2 read c after s2 wrote it


def test_graph_exec_waiter_on_record_node_runs_before_the_rest_of_the_graph(dev, s, s2, bufs,
                                                                           gate):
    """A stream waiting for a record node is ordered after the node's ancestors only: it runs while
    a branch of the graph that is no ancestor of the node is still held, and its clock names the
    node's point, not the launch."""
    a, b, c = bufs
    s3 = srt.Stream(dev, non_blocking=True)
    hold = gate(s3)
    held = s3.record()
    e = srt.Event()
    done = threading.Event()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 2.0)
    g.add_event_record_node(e, deps=k1)
    w = g.add_event_wait_node(held)  # another branch, held by s3's gate
    g.add_kernel_node(fill_kernel, c, N, 3.0, deps=w)
    g.instantiate().launch(s)
    launched = s._pos
    s2.wait(e)
    s2.launch(copy_kernel, b, a, N)
    s2.launch_host_func(done.set)
    assert done.wait(timeout=DONE_S)  # while the graph is held in its other branch
    assert not s.query()
    assert s2._clock.get(s.id, 0) < launched  # ordered after the node, not the launch
    hold.open()
    s.synchronize()
    s2.synchronize()
    assert (_read(b) == 2.0).all() and (_read(c) == 3.0).all()


def test_graph_exec_wait_node_holds_back_only_its_dependents(s, s2, bufs, gate):
    a, b, c = bufs
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 3.0)
    ready = s2.record()
    other_ran, dependent_ran = threading.Event(), threading.Event()
    g = srt.Graph()
    w = g.add_event_wait_node(ready)
    k = g.add_kernel_node(copy_kernel, b, a, N, deps=w)
    g.add_host_node(dependent_ran.set, deps=k)
    m = g.add_kernel_node(fill_kernel, c, N, 5.0)  # no dependency on the wait node
    g.add_host_node(other_ran.set, deps=m)
    g.instantiate().launch(s)
    assert other_ran.wait(timeout=DONE_S)  # while s2, which the wait node waits for, is held
    assert not dependent_ran.is_set()
    hold.open()
    s.synchronize()
    assert dependent_ran.is_set()
    assert (_read(b) == 3.0).all() and (_read(c) == 5.0).all()  # k copied after s2 wrote a


def test_graph_exec_wait_node_orders_the_launch_streams_later_work(s, s2, bufs, gate):
    """The launch completes only once its wait nodes did: the launch stream's later work is ordered
    after what they waited for (its clock says so: the sanitizer and the pools read it)."""
    a, b, _ = bufs
    hold = gate(s2)
    s2.launch(fill_kernel, a, N, 4.0)
    ready = s2.record()
    g = srt.Graph()
    g.add_event_wait_node(ready)
    g.instantiate().launch(s)
    assert s._clock.get(s2.id, 0) >= ready._pos
    s.launch(copy_kernel, b, a, N)  # after the launch: after s2's fill
    hold.open()
    s.synchronize()
    assert (_read(b) == 4.0).all()


def test_graph_exec_wait_node_on_its_own_record_node_event(s, s2, bufs):
    """A wait node whose event the exec's own record node recorded in an earlier launch: that
    launch came before this one whole, so there is nothing to wait for (on a GPU the wait node
    would otherwise wait for the very event this launch records again)."""
    a, _, _ = bufs
    e = srt.Event()
    g = srt.Graph()
    w = g.add_event_wait_node(e)
    k = g.add_kernel_node(add_one_kernel, a, N, deps=w)
    g.add_event_record_node(e, deps=k)
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    ge.launch(s2)  # on another stream: ordered after the launches before it
    s2.wait(e)
    s2.synchronize()
    assert (_read(a) == 4.0).all()
    s.synchronize()


def test_graph_exec_timing_record_nodes_measure_the_node_between_them(dev, s, bufs):
    """Two timing record nodes around a slow node measure it, not the whole graph: their interval
    holds the node's work, and exceeds that of two record nodes with nothing between them."""
    a, b, _ = bufs
    t0, t1, t2 = (srt.Event(timing=True) for _ in range(3))
    g = srt.Graph()
    r0 = g.add_event_record_node(t0)
    slow = g.add_kernel_node(busy_kernel, a, 2_000_000, deps=r0)
    r1 = g.add_event_record_node(t1, deps=slow)
    g.add_event_record_node(t2, deps=r1)
    g.add_kernel_node(busy_kernel, b, 8_000_000)  # more work, in a branch of its own
    ge = g.instantiate()
    for _ in range(2):  # (the first launch compiles the kernels)
        ge.launch(s)
        s.synchronize()
    around, after = t0.elapsed_time(t1), t1.elapsed_time(t2)
    assert around > after >= 0


def test_graph_exec_timing_record_nodes_hold_the_node_they_surround(dev, s, bufs):
    """On the cpu backend event stamps and the host share a clock (perf_counter): the interval of
    the record nodes around a node holds the interval the node itself logged."""
    cpu_only(dev, PY_KERNELS)
    a, b, _ = bufs
    t0, t1 = srt.Event(timing=True), srt.Event(timing=True)
    log: list[float] = []
    g = srt.Graph()
    r0 = g.add_event_record_node(t0)
    k = g.add_kernel_node(timed_kernel, a, 2_000_000, log, deps=r0)
    g.add_event_record_node(t1, deps=k)
    g.add_kernel_node(busy_kernel, b, 8_000_000)  # the rest of the graph, slower
    g.instantiate().launch(s)
    t1.synchronize()
    assert len(log) == 2
    assert t0.elapsed_time(t1) >= (log[1] - log[0]) * 1000.0 > 0
    s.synchronize()


def test_graph_exec_record_node_of_a_failed_launch_still_completes(dev, s, s2, bufs):
    """A failing node stops the replay before later nodes: the record node's event completes as
    the launch ends (a stream waiting for it must not wait forever), the failure is the launch's."""
    cpu_only(dev, PY_KERNELS)

    @srt.kernel
    def boom(ctx):
        raise RuntimeError("boom")

    e = srt.Event()
    g = srt.Graph()
    k = g.add_kernel_node(boom)
    g.add_event_record_node(e, deps=k)
    g.instantiate().launch(s)
    s2.wait(e)
    s2.synchronize()
    assert e.query()
    with pytest.raises(srt.LaunchError, match="boom"):
        s.synchronize()


# -- what the sanitizer sees ----------------------------------------------------------------------------
def _sanitized(dev, san):
    cpu_only(dev, "the sanitizer observes work where the cpu backend runs it")
    return san


def test_sanitizer_waiter_on_record_node_is_ordered_after_its_ancestors(dev, s, s2, bufs, san):
    _sanitized(dev, san)
    a, b, c = bufs
    e = srt.Event()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    g.add_event_record_node(e, deps=k1)
    g.add_kernel_node(fill_kernel, c, N, 2.0)  # no ancestor of the record node
    g.instantiate().launch(s)
    s2.wait(e)
    s2.launch(copy_kernel, b, a, N)  # reads what an ancestor wrote: ordered
    s.synchronize()
    s2.synchronize()
    assert san.report() == []


def test_sanitizer_waiter_on_record_node_races_with_the_other_nodes(dev, s, s2, bufs, san):
    _sanitized(dev, san)
    a, b, c = bufs
    e = srt.Event()
    g = srt.Graph()
    k1 = g.add_kernel_node(fill_kernel, a, N, 1.0)
    g.add_event_record_node(e, deps=k1)
    g.add_kernel_node(fill_kernel, c, N, 2.0)  # no ancestor of the record node
    g.instantiate().launch(s)
    s2.wait(e)
    s2.launch(copy_kernel, b, c, N)  # reads what the other node writes: a race
    s.synchronize()
    s2.synchronize()
    found = san.report()
    assert [f.kind for f in found] == ["race"]
    assert "node #2" in str(found[0])


def test_sanitizer_wait_node_orders_its_dependents_only(dev, s, s2, bufs, san):
    _sanitized(dev, san)
    a, b, c = bufs
    p = s2.malloc(N * 4)  # allocated on s2 before its record: a node after the wait node may use it
    s2.launch(fill_kernel, a, N, 1.0)
    s2.launch(fill_kernel, p, N, 1.0)
    ready = s2.record()
    g = srt.Graph()
    w = g.add_event_wait_node(ready)
    g.add_kernel_node(copy_kernel, b, a, N, deps=w)  # ordered after s2's write
    g.add_kernel_node(copy_kernel, p, p, N, deps=w)
    g.instantiate().launch(s)
    s.launch(copy_kernel, c, a, N)  # after the launch: after what its wait node waited for
    s.synchronize()
    assert san.report() == []
    s2.launch(fill_kernel, a, N, 2.0)
    ready = s2.record()
    g = srt.Graph()
    g.add_event_wait_node(ready)
    g.add_kernel_node(copy_kernel, b, a, N)  # no dependent of the wait node: a race
    g.instantiate().launch(s)
    s.synchronize()
    s2.synchronize()
    assert [f.kind for f in san.report()] == ["race"]
    s.free(p)
    s.synchronize()


def test_sanitizer_waiter_on_record_node_after_a_graph_allocation(dev, s, s2, bufs, san):
    _sanitized(dev, san)
    _, b, _ = bufs
    e = srt.Event()
    g = srt.Graph()
    alloc = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, alloc.ptr, N, 6.0, deps=alloc)
    g.add_event_record_node(e, deps=k)
    ge = g.instantiate()
    ge.launch(s)
    s2.wait(e)
    s2.launch(copy_kernel, b, alloc.ptr, N)  # the allocation and the fill are before the record
    s2.synchronize()
    s.synchronize()
    assert san.report() == []
    assert (_read(b) == 6.0).all()
    s.free(alloc.ptr)
    s.synchronize()
