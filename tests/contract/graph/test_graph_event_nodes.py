"""Event record and wait nodes of graphs: they mark graph work and order it after other streams, also
inside child graphs."""

from __future__ import annotations

import threading

import streamrt as srt
from tests.conftest import copy_kernel, fill_kernel
from tests.conftest import read_f32 as _read

N = 16


WINDOW = 0.25  # seconds a correct runtime keeps something blocked; only a failing one is faster


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
