"""cuda backend graphs: a bug found on the fake CUDA runtime (a graph with a host node released while
its launch is in flight), and event nodes built as CUDA's own."""

from __future__ import annotations

import gc
import os

import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


def test_graph_with_host_node_is_released_and_completes_in_flight(cuda0, gate):
    from streamrt.backends.cuda import hostfn as cuda_hostfn

    gc.collect()
    before = len(cuda_hostfn.jobs)
    s = srt.Stream(cuda0, non_blocking=True)
    ran = []
    g = srt.Graph()
    g.add_host_node(ran.append, "in flight")
    ge = g.instantiate()
    hold = gate(s)
    ge.launch(s)
    ge.destroy()  # while its launch waits behind the gate: CUDA completes it
    del ge, g
    gc.collect()
    hold.open()
    s.synchronize()
    assert ran == ["in flight"]
    for i in range(3):
        g = srt.Graph()
        g.add_host_node(ran.append, i)
        ge = g.instantiate()
        ge.launch(s)
        s.synchronize()
        ge.destroy()
        del ge, g
    gc.collect()
    assert ran == ["in flight", 0, 1, 2]
    assert len(cuda_hostfn.jobs) == before  # no host-node job (nor its graph exec) kept alive


def test_graph_event_nodes_are_cuda_event_nodes(cuda0):
    """Record and wait nodes are CUDA's own (``cuGraphAddEventRecordNode``,
    ``cuGraphAddEventWaitNode``), acting inside the graph: the record node records its mark's
    CUDA event, and the wait node waits for no foreign event between launches."""
    if os.environ.get("STREAMRT_CUDA_FAKE") != "1":
        pytest.skip("reads the graph the fake CUDA runtime built")
    from tests.cuda.fake import events as fake_events
    from tests.cuda.fake import graphs as fake_graphs

    s, s2 = srt.Stream(cuda0, non_blocking=True), srt.Stream(cuda0, non_blocking=True)
    ready, done = s2.record(), srt.Event(cuda0)
    g = srt.Graph()
    w = g.add_event_wait_node(ready)
    g.add_event_record_node(done, deps=g.add_empty_node(deps=w))
    ge = g.instantiate()
    for _ in range(2):
        s2.launch_host_func(lambda: None)
        ready = s2.record(ready)  # a new record to wait for at each launch
        ge.launch(s)
        s.synchronize()
    runner = next(iter(ge._plans.values())).runner
    graph = fake_graphs.GRAPHS[int(runner.graph)]
    kinds = [n.kind for n in graph.nodes.values()]
    assert kinds.count("event_record") == 1 and kinds.count("event_wait") == 1
    point = done._rec[0]
    record = next(n for n in graph.nodes.values() if n.kind == "event_record")
    assert record.run == int(point._q.event)  # the node records the mark's event
    steps = fake_graphs.EXECS[int(runner.exec)].steps
    waited = next(st[1] for st in steps.values() if st[0] == "event_wait")
    assert fake_events.EVENTS[waited].rec is None  # back to the never-recorded event
    assert done.query()
    ge.destroy()
