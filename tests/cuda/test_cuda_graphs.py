"""cuda backend graphs, a bug found on the fake CUDA runtime: a graph with a host node released while
its launch is in flight."""

from __future__ import annotations

import gc

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
