"""Stream capture (DESIGN.md §5): what is captured, fork/join, capture info, every capture error
(900-908), invalidation and leaving capture, and unsafe-call gating by mode across threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import streamrt as srt
from tests.conftest import _grid_stride, add_one_kernel, copy_kernel, cpu_only, fill_kernel, in_thread
from tests.conftest import read_f32 as _read

N = 16
M = srt.CaptureMode
T = srt.NodeType


@pytest.fixture
def dev(any_dev):
    """Each backend's device 0: capture is frontend code, its graphs run on every backend."""
    return any_dev


def noop():
    pass




def assert_left_capture(*streams):
    for st in streams:
        assert not st.is_capturing()
        info = st.capture_info()
        assert info.status is srt.CaptureStatus.NONE and info.graph is None


def assert_invalidated_then_ended(origin, *joined):
    """end_capture of an invalidated capture raises 901, returns no graph, and all streams leave."""
    for st in (origin, *joined):
        assert st.capture_info().status is srt.CaptureStatus.INVALIDATED
        assert st.is_capturing()  # until end_capture, as CUDA's status and PyTorch's test
    with pytest.raises(srt.CaptureInvalidatedError) as ei:
        origin.end_capture()
    assert ei.value.code == 901
    assert_left_capture(origin, *joined)


# -- what capture records -----------------------------------------------------------------------
def test_graph_capture_records_work_instead_of_running(s, buf):
    host = np.arange(N, dtype=np.float32)
    out = np.zeros(N, np.float32)
    ran = []
    s.begin_capture()
    assert s.is_capturing()
    s.memcpy(buf, host, N * 4)
    s.launch(add_one_kernel, buf, N, grid=2, block=(8, 1))
    s.launch_host_func(ran.append, 1)
    s.memset(buf, 0, 4)
    s.memcpy(out, buf, N * 4)
    g = s.end_capture()
    assert not s.is_capturing()
    assert ran == [] and (out == 0).all() and (_read(buf) == 0).all()  # nothing ran
    nodes = g.nodes()
    assert [n.type for n in nodes] == [T.MEMCPY, T.KERNEL, T.HOST, T.MEMSET, T.MEMCPY]
    assert g.edges() == list(zip(nodes, nodes[1:]))  # one stream: a chain
    k = nodes[1].params
    assert k["kernel"] is add_one_kernel and tuple(k["grid"]) == (2, 1, 1)
    assert tuple(k["block"]) == (8, 1, 1)
    ge = g.instantiate()
    for i in range(3):
        host[:] = i  # a captured copy from a host buffer reads it when the node runs
        ge.launch(s)
        s.synchronize()
        expect = np.full(N, i + 1, np.float32)
        expect[0] = 0.0
        assert (out == expect).all()
    assert ran == [1, 1, 1]


def test_graph_capture_fork_join_by_events(s, s2, dev, buf):
    tmp, other = srt.malloc(N * 4, dev), srt.malloc(N * 4, dev)
    s.begin_capture(M.THREAD_LOCAL)
    s.launch(fill_kernel, buf, N, 1.0)
    fork = s.record()
    s2.wait(fork)
    assert s2.is_capturing() and s2.capture_info().capture_id == s.capture_info().capture_id
    s2.launch(copy_kernel, tmp, buf, N)  # branch on s2: reads buf
    s2.launch(add_one_kernel, tmp, N)
    s.launch(fill_kernel, other, N, 5.0)  # branch on s: another buffer
    join = s2.record()
    s.wait(join)
    s.launch(copy_kernel, buf, tmp, N)  # after both branches
    s.launch(add_kernel, buf, other, N)
    g = s.end_capture()
    assert_left_capture(s, s2)
    fill, b1, b2, a1, last, add = g.nodes()
    assert g.root_nodes() == [fill]
    assert b1.dependencies == (fill,) and a1.dependencies == (fill,)
    assert b2.dependencies == (b1,) and set(last.dependencies) == {a1, b2}
    assert add.dependencies == (last,)
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(buf) == 7.0).all()
    srt.free(tmp)
    srt.free(other)


@srt.kernel(cuda=_grid_stride("add_kernel", "float* dst, const float* src, int n", "dst[i] += src[i]"),
            signature="ptr, ptr, i32")
def add_kernel(ctx, dst, src, n):
    ctx.array(dst, (n,), np.float32)[:] += ctx.array(src, (n,), np.float32, readonly=True)


def test_graph_capture_join_of_independent_branches_keeps_them_parallel(s, s2, dev):
    # three branches recorded separately and joined only by the origin: no chain between them
    s3 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    root = s.record()
    for side in (s2, s3):
        side.wait(root)
        side.launch_host_func(noop)
    s.launch_host_func(noop)
    for side in (s2, s3):
        s.wait(side.record())
    s.launch_host_func(noop)
    g = s.end_capture()
    h2, h3, h1, end = g.nodes()
    assert g.root_nodes() == [h2, h3, h1]
    assert set(end.dependencies) == {h1, h2, h3}


def test_graph_capture_info_and_update_dependencies(s, s2):
    assert s.capture_info() == (srt.CaptureStatus.NONE, 0, None, ())
    s.begin_capture()
    info = s.capture_info()
    assert isinstance(info, srt.CaptureInfo)
    assert info.status is srt.CaptureStatus.ACTIVE and info.capture_id > 0
    assert isinstance(info.graph, srt.Graph) and info.dependencies == ()
    s.launch_host_func(noop)
    a = s.capture_info().dependencies
    assert len(a) == 1 and a[0].type is T.HOST and s.capture_info().graph is info.graph
    s.launch_host_func(noop)
    b = s.capture_info().dependencies
    # add a: the next node depends on both
    s.update_capture_dependencies(a)
    assert s.capture_info().dependencies == (*b, *a)
    s.launch_host_func(noop)
    c = s.capture_info().dependencies[0]
    assert c.dependencies == (*b, *a)
    # replace: the next node depends on exactly a
    s.update_capture_dependencies(list(a), replace=True)
    s.launch_host_func(noop)
    d = s.capture_info().dependencies[0]
    assert d.dependencies == a
    with pytest.raises(srt.InvalidValueError):  # a node of another graph
        s.update_capture_dependencies(srt.Graph().add_empty_node())
    with pytest.raises(srt.IllegalStateError):
        s2.update_capture_dependencies(a)  # not capturing
    # another capture has its own id
    s2.begin_capture()
    assert s2.capture_info().capture_id != info.capture_id
    s2.end_capture()
    # c and d are both leaves: with only d as the final set, c would be unjoined (904)
    s.update_capture_dependencies([c, d], replace=True)
    g = s.end_capture()
    assert len(g.nodes()) == 4


def test_graph_capture_nodes_dropped_by_replace_are_not_unjoined(s, s2):
    # cudaStreamUpdateCaptureDependencies: "Nodes that are removed from the dependency set via
    # this API do not result in cudaErrorStreamCaptureUnjoined if they are unreachable from the
    # stream" (end_capture used to raise 904 for them)
    s.begin_capture()
    s.launch_host_func(noop)
    a = s.capture_info().dependencies
    s.launch_host_func(noop)  # b, dropped below with its ancestor a
    s.update_capture_dependencies([], replace=True)
    s.launch_host_func(noop)  # c, a new root
    assert s.capture_info().dependencies[0].dependencies == ()
    g = s.end_capture()
    assert len(g.nodes()) == 3 and len(g.root_nodes()) == 2 and a[0] in g.root_nodes()
    # a forked stream whose set is replaced, then never joined back: its dropped nodes are
    # exempt, nodes it captured after the replace are not
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(noop)
    s2.update_capture_dependencies([], replace=True)
    s.launch_host_func(noop)
    assert len(s.end_capture().nodes()) == 2
    s.begin_capture()
    s2.wait(s.record())
    s2.update_capture_dependencies([], replace=True)
    s2.launch_host_func(noop)  # captured after the replace, never joined
    with pytest.raises(srt.CaptureUnjoinedError):
        s.end_capture()
    assert not s.is_capturing() and not s2.is_capturing()


def test_graph_capture_info_of_joined_stream_is_its_own(s, s2):
    # a joined stream shares the capture (id, graph) but has its own dependency set
    s.begin_capture()
    s.launch_host_func(noop)
    fork = s.record()
    s.launch_host_func(noop)
    s2.wait(fork)
    mine, joined = s.capture_info(), s2.capture_info()
    assert joined.status is srt.CaptureStatus.ACTIVE
    assert joined.capture_id == mine.capture_id and joined.graph is mine.graph
    h1, h2 = mine.graph.nodes()
    assert mine.dependencies == (h2,) and joined.dependencies == (h1,)
    s2.launch_host_func(noop)
    h3 = mine.graph.nodes()[2]
    assert h3.dependencies == (h1,)
    assert s2.capture_info().dependencies == (h3,) and s.capture_info().dependencies == (h2,)
    s2.update_capture_dependencies(h2)  # updates the joined stream's set only
    assert s2.capture_info().dependencies == (h3, h2) and s.capture_info().dependencies == (h2,)
    s.wait(s2.record())
    assert set(s.capture_info().dependencies) == {h2, h3}
    assert len(s.end_capture().nodes()) == 3


def test_graph_capture_dependency_sets_hold_each_node_once(s, s2):
    # a dependency set is a set: adding a node already in it, or joining nodes already
    # depended on, changes nothing
    s.begin_capture()
    s.launch_host_func(noop)
    a = s.capture_info().dependencies
    s.update_capture_dependencies(a)
    assert s.capture_info().dependencies == a
    s.wait(s.record())  # waiting on its own tail
    assert s.capture_info().dependencies == a
    e = s.record()
    s2.wait(e)  # fork
    s2.wait(e)  # then a join within the capture on the same nodes
    assert s2.capture_info().dependencies == a
    s.launch_host_func(noop)
    assert s.capture_info().dependencies[0].dependencies == a
    assert len(s.end_capture().nodes()) == 2


def test_graph_capture_context_manager(s, buf):
    with srt.graph_capture(s, mode=M.THREAD_LOCAL) as cap:
        assert s.is_capturing() and cap.graph is None
        s.launch(fill_kernel, buf, N, 4.0)
    assert not s.is_capturing()
    assert [n.type for n in cap.graph.nodes()] == [T.KERNEL]
    cap.graph.instantiate().launch(s)
    s.synchronize()
    assert (_read(buf) == 4.0).all()
    with pytest.raises(srt.InvalidTypeError):
        srt.graph_capture("stream")


def test_graph_capture_context_manager_error_ends_capture(s, s2):
    with pytest.raises(KeyError), srt.graph_capture(s) as cap:
        s2.wait(s.record())  # s2 joins
        raise KeyError("boom")
    assert cap.graph is None
    assert_left_capture(s, s2)
    s.begin_capture()  # the stream is usable for a new capture
    s.end_capture()


def test_graph_capture_context_manager_begins_with_its_mode(s, buf):
    with srt.graph_capture(s, mode=M.RELAXED) as cap:
        srt.memset(buf, 0, 4)  # an unsafe call: refused in the default GLOBAL mode
        s.launch_host_func(noop)
    assert len(cap.graph.nodes()) == 1


def test_graph_capture_context_manager_makes_its_stream_current(s, buf):
    # as torch.cuda.graph: calls that default to the current stream are captured, not run
    from streamrt import ops

    before = srt.current_stream()
    x = srt.Tensor.from_numpy(np.ones((2, 3), np.float32), stream=s)
    out = srt.Tensor(srt.TensorDesc((2,), np.float32), buf)
    s.synchronize()
    with srt.graph_capture(s) as cap:
        assert srt.current_stream() is s
        ops.run(ops.reduce_sum, x, out, axis=1)  # no stream: the capturing one
    assert srt.current_stream() is before
    assert cap.graph.nodes() and (_read(buf)[:2] == 0).all()  # captured, not run
    cap.graph.instantiate().launch(s)
    s.synchronize()
    assert (_read(buf)[:2] == 3.0).all()
    with pytest.raises(KeyError), srt.graph_capture(s):
        raise KeyError("boom")
    assert srt.current_stream() is before and not s.is_capturing()
    with pytest.raises(srt.CaptureUnsupportedError), srt.graph_capture(s.device.default_stream):
        pass  # the legacy stream cannot capture: refused at the start, nothing left current
    assert srt.current_stream() is before
    x.free(s)


def test_graph_capture_invalidated_stream_is_capturing_until_ended(s):
    # cudaStreamIsCapturing reports INVALIDATED until cudaStreamEndCapture; the usual cleanup
    # ``if s.is_capturing(): s.end_capture()`` must end it, or the stream stays refused
    s.begin_capture()
    with pytest.raises(srt.CaptureUnsupportedError):
        s.synchronize()
    assert s.is_capturing() and s.capture_info().status is srt.CaptureStatus.INVALIDATED
    with pytest.raises(srt.CaptureUnsupportedError):
        s.query()  # still in the capture sequence: refused
    if s.is_capturing():
        with pytest.raises(srt.CaptureInvalidatedError):
            s.end_capture()
    assert not s.is_capturing()
    assert s.query()  # usable again
    s.synchronize()


def test_graph_capture_malloc_free_become_memory_nodes(s, buf):
    s.begin_capture()
    tmp = s.malloc(N * 4)
    s.launch(fill_kernel, tmp, N, 3.0)
    s.launch(copy_kernel, buf, tmp, N)
    s.free(tmp)
    g = s.end_capture()
    alloc, _, _, free = g.nodes()
    assert alloc.type is T.MEM_ALLOC and free.type is T.MEM_FREE
    assert alloc.ptr == tmp and free.params["ptr"] == tmp and alloc.params["nbytes"] == N * 4
    ge = g.instantiate()
    for _ in range(3):
        ge.launch(s)
    s.synchronize()
    assert (_read(buf) == 3.0).all()


def test_graph_capture_free_of_memory_from_outside_refused(s):
    p = s.malloc(64)  # pool memory, allocated before the capture
    s.begin_capture()
    with pytest.raises(srt.InvalidValueError, match="outside the capture"):
        s.free(p)
    s.end_capture()
    s.free(p)


def test_graph_capture_launch_of_exec_inlines_graph(s, buf):
    inner = srt.Graph()
    inner.add_kernel_node(add_one_kernel, buf, N)
    ge = inner.instantiate()
    s.begin_capture()
    s.launch(fill_kernel, buf, N, 0.0)
    ge.launch(s)
    ge.launch(s)
    g = s.end_capture()
    assert [n.type for n in g.nodes()] == [T.KERNEL, T.GRAPH, T.GRAPH]
    g.instantiate().launch(s)
    s.synchronize()
    assert (_read(buf) == 2.0).all()


def test_graph_capture_blocking_stream_captures_without_legacy_waits(dev, buf):
    b = srt.Stream(dev)  # blocking
    b.begin_capture()
    b.launch(fill_kernel, buf, N, 9.0)
    g = b.end_capture()
    assert [n.type for n in g.nodes()] == [T.KERNEL]
    g.instantiate().launch(b)
    b.synchronize()
    assert (_read(buf) == 9.0).all()


def test_graph_capture_begin_errors(s):
    with pytest.raises(srt.InvalidTypeError):
        s.begin_capture("global")
    s.begin_capture()
    with pytest.raises(srt.IllegalStateError):
        s.begin_capture()
    s.end_capture()
    with pytest.raises(srt.IllegalStateError):
        s.end_capture()


# -- 900 unsupported ------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["synchronize", "query"])
def test_graph_capture_sync_or_query_of_capturing_stream_unsupported(s, s2, what):
    s.begin_capture()
    s2.wait(s.record())
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnsupportedError) as ei:
        getattr(s2, what)()  # a joined stream counts as capturing
    assert ei.value.code == 900
    with pytest.raises(srt.CaptureInvalidatedError):  # further work is refused
        s.launch_host_func(print)
    assert_invalidated_then_ended(s, s2)
    assert s2.query() and s.query()  # usable again once out of capture


def test_graph_capture_device_synchronize_unsupported(s):
    s.begin_capture()
    with pytest.raises(srt.CaptureUnsupportedError):
        s.device.synchronize()
    assert_invalidated_then_ended(s)


def test_graph_capture_device_synchronize_of_joined_streams_device_unsupported(s, dev):
    cpu_only(dev, "a capture spanning two devices needs a second device of the backend")
    # the capture began on cpu:0, a stream of cpu:1 joined it: cpu:1 now has a capturing stream
    other = srt.Stream(srt.Device("cpu:1"), non_blocking=True)
    s.begin_capture()
    s.launch_host_func(noop)
    other.wait(s.record())
    with pytest.raises(srt.CaptureUnsupportedError):
        other.device.synchronize()
    assert_invalidated_then_ended(s, other)
    other.device.synchronize()  # fine once the capture is over


def test_graph_capture_other_device_or_stream_sync_allowed(s, s2):
    other = srt.Device("cpu:1")
    s.begin_capture()
    s2.launch_host_func(noop)
    s2.synchronize()  # not capturing
    assert s2.query()
    other.synchronize()  # no capture on that device
    s.launch_host_func(noop)
    g = s.end_capture()
    assert len(g.nodes()) == 1


# -- 901 invalidated: every joined stream leaves ---------------------------------------------------
def test_graph_capture_invalidated_end_releases_every_joined_stream(s, s2, dev, buf):
    s3 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    e = s.record()
    s2.wait(e)
    s3.wait(s2.record())
    s3.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnsupportedError):
        s3.query()
    with pytest.raises(srt.CaptureInvalidatedError):
        s2.launch(add_one_kernel, buf, N)
    assert_invalidated_then_ended(s, s2, s3)
    # the events are no longer captured, the streams run eagerly again
    assert e.query()
    s3.launch(fill_kernel, buf, N, 2.0)
    s3.synchronize()
    assert (_read(buf) == 2.0).all()


@pytest.mark.parametrize(
    "call", ["launch", "malloc", "record", "update_dependencies", "fork", "join"])
def test_graph_capture_invalidated_capture_refuses_every_capture_call(s, s2, dev, call):
    s3 = srt.Stream(dev, non_blocking=True)
    s.begin_capture()
    s.launch_host_func(noop)
    fork = s.record()  # recorded while the capture is still active
    s2.wait(fork)
    s2.launch_host_func(noop)
    branch = s2.record()
    branch_nodes = s2.capture_info().dependencies
    with pytest.raises(srt.CaptureUnsupportedError):
        s2.query()  # invalidates the capture
    deps = s.capture_info().dependencies
    nodes = len(s.capture_info().graph.nodes())
    with pytest.raises(srt.CaptureInvalidatedError):
        if call == "launch":
            s.launch_host_func(noop)
        elif call == "malloc":
            s.malloc(64)
        elif call == "record":
            s.record()
        elif call == "update_dependencies":
            s.update_capture_dependencies(branch_nodes)
        elif call == "fork":
            s3.wait(fork)  # an idle stream cannot join an invalidated capture
        else:
            s.wait(branch)  # nor can a joined one merge more dependencies
    assert s.capture_info().dependencies == deps
    assert len(s.capture_info().graph.nodes()) == nodes
    assert_left_capture(s3)
    assert_invalidated_then_ended(s, s2)


# -- 902 merge ---------------------------------------------------------------------------------------
def test_graph_capture_merge_of_two_captures(s, s2):
    s.begin_capture()
    s2.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    with pytest.raises(srt.CaptureMergeError) as ei:
        s2.wait(e)
    assert ei.value.code == 902
    assert_invalidated_then_ended(s)
    assert_invalidated_then_ended(s2)


# -- 903 unmatched -------------------------------------------------------------------------------------
def test_graph_capture_end_on_joined_stream_unmatched(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnmatchedError) as ei:
        s2.end_capture()
    assert ei.value.code == 903
    assert_invalidated_then_ended(s, s2)


# -- 904 unjoined -----------------------------------------------------------------------------------
def test_graph_capture_unjoined_fork(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    s2.launch_host_func(noop)
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureUnjoinedError) as ei:
        s.end_capture()
    assert ei.value.code == 904
    assert_left_capture(s, s2)


def test_graph_capture_join_recorded_before_the_branch_work_is_unjoined(s, s2):
    s.begin_capture()
    s2.wait(s.record())
    early = s2.record()
    s2.launch_host_func(noop)  # after the joined record
    s.wait(early)
    with pytest.raises(srt.CaptureUnjoinedError):
        s.end_capture()
    assert_left_capture(s, s2)


def test_graph_capture_empty_fork_needs_no_join(s, s2):
    s.begin_capture()
    s.launch_host_func(noop)
    s2.wait(s.record())  # joined, but adds no node
    g = s.end_capture()
    assert len(g.nodes()) == 1
    assert_left_capture(s, s2)


# -- 905 isolation --------------------------------------------------------------------------------
def test_graph_capture_wait_on_uncaptured_work_isolation(s, s2, gate):
    gate(s2)
    outside = s2.record()  # real work, outside the capture
    s.begin_capture()
    with pytest.raises(srt.CaptureIsolationError) as ei:
        s.wait(outside)
    assert ei.value.code == 905
    assert_invalidated_then_ended(s)


def test_graph_capture_wait_on_unrecorded_event_is_noop(s, dev):
    s.begin_capture()
    s.wait(srt.Event(dev))
    s.launch_host_func(noop)
    assert len(s.end_capture().nodes()) == 1


@pytest.mark.parametrize("which", ["origin", "joined"])
def test_graph_capture_destroy_of_a_capturing_stream_is_refused(s, s2, which):
    # destroying a stream of the capture left the capture active for good: every later unsafe
    # call (GLOBAL) and device synchronize was refused, with no stream left to end it on
    s.begin_capture()
    s.launch_host_func(noop)
    s2.wait(s.record())
    with pytest.raises(srt.CaptureUnsupportedError) as ei:
        (s if which == "origin" else s2).destroy()
    assert ei.value.code == 900
    assert_invalidated_then_ended(s, s2)
    s2.destroy()  # after the end: allowed
    p = srt.malloc(16)
    srt.free(p)
    s.device.synchronize()


# -- 906 implicit ---------------------------------------------------------------------------------
def test_graph_capture_legacy_stream_refused(dev):
    with pytest.raises(srt.CaptureError):
        dev.default_stream.begin_capture()
    assert not dev.default_stream.is_capturing()


@pytest.mark.parametrize("use", ["launch", "memset", "srt.memset_relaxed"])
def test_graph_capture_legacy_use_while_blocking_stream_captures_implicit(dev, buf, use):
    b = srt.Stream(dev)  # blocking: implicitly synchronizes with the legacy stream
    mode = M.RELAXED if use.endswith("relaxed") else M.GLOBAL
    b.begin_capture(mode)
    b.launch_host_func(noop)
    legacy = dev.default_stream
    with pytest.raises(srt.CaptureImplicitError) as ei:
        if use == "launch":
            legacy.launch(add_one_kernel, buf, N)
        elif use == "memset":
            legacy.memset(buf, 0, 4)
        else:
            srt.memset(buf, 0, 4)  # mode-gating allows it; the legacy stream still refuses
    assert ei.value.code == 906
    assert_invalidated_then_ended(b)


@pytest.mark.parametrize("use", ["synchronize", "query", "wait"])
def test_graph_capture_legacy_sync_query_or_wait_while_blocking_stream_captures_implicit(
        s, dev, use):
    # regression: these enqueue nothing, yet CUDA leaves the legacy stream unusable until a
    # blocking stream's capture ends (they used to succeed silently)
    done = s.record()  # uncaptured work to wait on
    b = srt.Stream(dev)
    b.begin_capture()
    b.launch_host_func(noop)
    legacy = dev.default_stream
    with pytest.raises(srt.CaptureImplicitError):
        if use == "wait":
            legacy.wait(done)
        else:
            getattr(legacy, use)()
    assert_invalidated_then_ended(b)
    legacy.wait(done)  # usable again
    assert legacy.query()
    legacy.synchronize()


@pytest.mark.parametrize("query", ["is_capturing", "capture_info"])
def test_graph_capture_legacy_query_while_blocking_stream_captures_implicit(s, dev, query):
    # cudaStreamIsCapturing / cudaStreamGetCaptureInfo on cudaStreamLegacy while a blocking
    # stream captures: cudaErrorStreamCaptureImplicit, and the capture is not invalidated
    legacy = dev.default_stream
    s.begin_capture()  # a non-blocking stream's capture leaves the legacy stream queryable
    assert getattr(legacy, query)() in (False, srt.CaptureInfo(srt.CaptureStatus.NONE, 0, None, ()))
    s.end_capture()
    b = srt.Stream(dev)
    b.begin_capture()
    b.launch_host_func(noop)
    with pytest.raises(srt.CaptureImplicitError) as ei:
        getattr(legacy, query)()
    assert ei.value.code == 906
    assert b.is_capturing()  # left as it was
    assert len(b.end_capture().nodes()) == 1
    assert getattr(legacy, query)() in (False, srt.CaptureInfo(srt.CaptureStatus.NONE, 0, None, ()))


def test_graph_capture_legacy_use_while_joined_blocking_stream_captures_implicit(s, dev, buf):
    # the capture began on a non-blocking stream, but a blocking stream joined it: that stream
    # is capturing too, and the legacy stream would implicitly synchronize with it
    b = srt.Stream(dev)
    s.begin_capture()
    s.launch_host_func(noop)
    b.wait(s.record())
    with pytest.raises(srt.CaptureImplicitError):
        dev.default_stream.launch(add_one_kernel, buf, N)
    assert_invalidated_then_ended(s, b)


def test_graph_capture_legacy_use_with_non_blocking_capture_allowed(s, dev, buf):
    s.begin_capture()
    s.launch_host_func(noop)
    dev.default_stream.launch(fill_kernel, buf, N, 3.0)
    dev.default_stream.synchronize()
    assert len(s.end_capture().nodes()) == 1
    assert (_read(buf) == 3.0).all()


def test_graph_capture_legacy_stream_cannot_join(s, dev):
    s.begin_capture()
    with pytest.raises(srt.CaptureImplicitError):
        dev.default_stream.wait(s.record())
    assert not dev.default_stream.is_capturing()
    assert_invalidated_then_ended(s)


# -- 907 captured events ---------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["synchronize", "query"])
def test_graph_capture_captured_event_sync_or_query(s, s2, what):
    s.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    with pytest.raises(srt.CapturedEventError) as ei:
        in_thread(getattr(e, what))  # from any thread
    assert ei.value.code == 907 and isinstance(ei.value, srt.CaptureError)
    assert_invalidated_then_ended(s)
    getattr(e, what)()  # no longer captured


@pytest.mark.parametrize("which", ["start", "end"])
def test_graph_capture_captured_event_elapsed_time(s, which):
    # cudaErrorCapturedEvent covers any use of an event last recorded in a capturing stream:
    # elapsed_time returned the timing of the event's previous, uncaptured record
    t0, t1 = srt.Event(timing=True), srt.Event(timing=True)
    s.record(t0)
    s.record(t1)
    s.synchronize()
    before = t0.elapsed_time(t1)
    s.begin_capture()
    s.record(t0 if which == "start" else t1)
    with pytest.raises(srt.CapturedEventError) as ei:
        t0.elapsed_time(t1)
    assert ei.value.code == 907
    assert_invalidated_then_ended(s)
    assert t0.elapsed_time(t1) == before  # the uncaptured records are what is left


def test_graph_capture_event_rerecorded_in_another_capture_stays_captured(s, s2):
    # an event belongs to the capture that recorded it last: ending the first capture must not
    # release it from the second
    s.begin_capture()
    s2.begin_capture()
    s.launch_host_func(noop)
    e = s.record()
    s2.launch_host_func(noop)
    s2.record(e)
    assert len(s.end_capture().nodes()) == 1
    with pytest.raises(srt.CapturedEventError):
        e.query()
    assert_invalidated_then_ended(s2)
    assert e.query()


# -- 908 wrong thread -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [M.GLOBAL, M.THREAD_LOCAL])
def test_graph_capture_end_from_other_thread(s, mode):
    s.begin_capture(mode)
    s.launch_host_func(noop)
    with pytest.raises(srt.CaptureWrongThreadError) as ei:
        in_thread(s.end_capture)
    assert ei.value.code == 908
    assert s.is_capturing()  # still this thread's capture
    assert len(s.end_capture().nodes()) == 1


def test_graph_capture_concurrent_thread_local_captures_on_two_threads(dev):
    # each thread captures its own stream and uses unsafe calls only outside its capture window
    ptrs = [srt.malloc(N * 4, dev) for _ in range(2)]
    graphs: list = [None, None]
    both_capturing = threading.Barrier(2, timeout=30)

    def worker(i):
        st = srt.Stream(dev, non_blocking=True)
        st.begin_capture(M.THREAD_LOCAL)
        st.launch(fill_kernel, ptrs[i], N, float(i + 1))
        both_capturing.wait()  # both captures are active now
        st.launch(add_one_kernel, ptrs[i], N)
        graphs[i] = st.end_capture()
        graphs[i].instantiate().launch(st)
        st.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(len(g.nodes()) == 2 for g in graphs)
    assert (_read(ptrs[0]) == 2.0).all() and (_read(ptrs[1]) == 3.0).all()
    for p in ptrs:
        srt.free(p)


def test_graph_capture_relaxed_may_end_on_other_thread(s):
    s.begin_capture(M.RELAXED)
    s.launch_host_func(noop)
    g = in_thread(s.end_capture)
    assert len(g.nodes()) == 1 and not s.is_capturing()


def test_graph_capture_work_from_other_thread_is_captured(s):
    # capture is per stream: another thread enqueueing on a capturing stream adds nodes
    s.begin_capture(M.THREAD_LOCAL)
    in_thread(lambda: s.launch_host_func(noop))
    assert len(s.end_capture().nodes()) == 1


# -- unsafe calls gated by mode ----------------------------------------------------------------------
def _unsafe_calls(buf):
    host = np.zeros(N, np.float32)
    return {
        "srt.malloc": _malloc_and_remember,
        "srt.memcpy": lambda: srt.memcpy(host, buf, N * 4),
        "srt.memset": lambda: srt.memset(buf, 1, 4),
        "srt.malloc_host": _malloc_host_and_remember,
    }


_made: list[tuple[str, int]] = []


def _malloc_and_remember():
    _made.append(("dev", srt.malloc(64)))


def _malloc_host_and_remember():
    _made.append(("host", srt.malloc_host(64)))


def _cleanup_made():
    while _made:
        kind, p = _made.pop()
        (srt.free if kind == "dev" else srt.free_host)(p)


def _refused(capture_mode, same_thread, caller_mode):
    """DESIGN.md §5: GLOBAL refuses on an own non-relaxed capture or any GLOBAL capture;
    THREAD_LOCAL only on an own non-relaxed capture; RELAXED never."""
    if caller_mode is M.RELAXED:
        return False
    own = same_thread and capture_mode is not M.RELAXED
    if caller_mode is M.THREAD_LOCAL:
        return own
    return own or capture_mode is M.GLOBAL


@pytest.mark.parametrize("caller_mode", [M.GLOBAL, M.THREAD_LOCAL, M.RELAXED])
@pytest.mark.parametrize("same_thread", [True, False], ids=["same", "other"])
@pytest.mark.parametrize("capture_mode", [M.GLOBAL, M.THREAD_LOCAL, M.RELAXED])
def test_graph_capture_mode_gates_unsafe_calls(s, buf, capture_mode, same_thread, caller_mode):
    expect = _refused(capture_mode, same_thread, caller_mode)
    try:
        for name, call in _unsafe_calls(buf).items():
            s.begin_capture(capture_mode)
            s.launch_host_func(noop)

            def attempt(call=call):
                prev = srt.exchange_capture_mode(caller_mode)
                try:
                    call()
                finally:
                    assert srt.exchange_capture_mode(prev) is caller_mode

            if expect:
                with pytest.raises(srt.CaptureUnsupportedError):
                    attempt() if same_thread else in_thread(attempt)
                assert_invalidated_then_ended(s)
            else:
                attempt() if same_thread else in_thread(attempt)
                assert s.is_capturing(), name
                assert len(s.end_capture().nodes()) == 1, name
    finally:
        _cleanup_made()


def test_graph_capture_unsafe_call_without_capture_allowed(buf):
    srt.memset(buf, 0, 4)  # no capture anywhere: nothing to gate
    p = srt.malloc(64)
    srt.free(p)


@pytest.mark.parametrize(
    "capture_mode,same_thread,caller_mode",
    [
        pytest.param(M.GLOBAL, True, M.GLOBAL, id="refused-own-global"),
        pytest.param(M.THREAD_LOCAL, True, M.THREAD_LOCAL, id="refused-own-thread-local"),
        pytest.param(M.GLOBAL, False, M.GLOBAL, id="refused-other-global"),
        pytest.param(
            M.RELAXED, True, M.GLOBAL, id="allowed-relaxed-capture"),
        pytest.param(
            M.THREAD_LOCAL, False, M.GLOBAL, id="allowed-other-thread"),
    ],
)
def test_graph_capture_mode_gates_srt_free(s, capture_mode, same_thread, caller_mode):
    p = srt.malloc(64)
    s.begin_capture(capture_mode)
    s.launch_host_func(noop)

    def attempt():
        prev = srt.exchange_capture_mode(caller_mode)
        try:
            srt.free(p)
        finally:
            srt.exchange_capture_mode(prev)

    if _refused(capture_mode, same_thread, caller_mode):
        with pytest.raises(srt.CaptureUnsupportedError):
            attempt() if same_thread else in_thread(attempt)
        assert_invalidated_then_ended(s)
        srt.free(p)  # fine once the capture is over
        return
    graph = None
    try:
        attempt() if same_thread else in_thread(attempt)
        assert s.is_capturing()
    finally:
        try:
            graph = s.end_capture()
        except srt.CaptureError:
            pass
    assert graph is not None and len(graph.nodes()) == 1
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p)  # it was really freed


def test_graph_capture_srt_free_of_pool_memory_in_relaxed_capture(s):
    # srt.free of pool memory synchronizes the device first: the capturing stream, which has no
    # work to wait for, is skipped rather than refused
    p = s.malloc(64)
    s.synchronize()
    s.begin_capture(M.RELAXED)
    s.launch_host_func(noop)
    srt.free(p)
    assert s.is_capturing()
    assert len(s.end_capture().nodes()) == 1


def test_graph_capture_exchange_capture_mode_is_per_thread():
    assert srt.exchange_capture_mode(M.RELAXED) is M.GLOBAL  # the default
    try:
        assert in_thread(lambda: srt.exchange_capture_mode(M.GLOBAL)) is M.GLOBAL  # own default
        assert srt.exchange_capture_mode(M.THREAD_LOCAL) is M.RELAXED
    finally:
        srt.exchange_capture_mode(M.GLOBAL)
    with pytest.raises(srt.InvalidTypeError):
        srt.exchange_capture_mode(1)


def test_graph_capture_relaxed_thread_mode_allows_unsafe_calls_in_global_capture(s, buf):
    s.begin_capture(M.GLOBAL)
    prev = srt.exchange_capture_mode(M.RELAXED)
    try:
        p = srt.malloc(64)
        srt.memcpy(p, np.ones(4, np.float32), 16)
    finally:
        srt.exchange_capture_mode(prev)
    assert len(s.end_capture().nodes()) == 0
    assert (srt.read(p, (4,), np.float32) == 1).all()
    srt.free(p)


@settings(max_examples=150, deadline=None)
@given(captures=hst.lists(hst.tuples(hst.sampled_from(list(M)), hst.booleans()), max_size=3),
       caller_mode=hst.sampled_from(list(M)), caller_on_worker=hst.booleans())
def test_graph_capture_mode_gating_with_several_captures_property(
        captures, caller_mode, caller_on_worker):
    """Several captures at once, begun on this thread or a worker: an unsafe call is refused iff
    some capture forbids it (DESIGN.md §5), and exactly those captures are invalidated."""
    dev = srt.Device("cpu:0")  # capture is frontend code: one backend is enough
    p = srt.malloc(64, dev)
    streams = [srt.Stream(dev, non_blocking=True) for _ in captures]
    outcomes = []
    # one long-lived worker: its captures keep its thread id until they end (a fresh thread per
    # call could reuse the id of a finished one)
    with ThreadPoolExecutor(1) as worker:

        def on(on_worker, fn):
            return worker.submit(fn).result() if on_worker else fn()

        here, there = threading.get_ident(), worker.submit(threading.get_ident).result()
        caller = there if caller_on_worker else here
        # the model: which captures forbid this caller's unsafe calls
        culprits = {
            i for i, (mode, on_worker) in enumerate(captures)
            if caller_mode is not M.RELAXED and (
                ((there if on_worker else here) == caller and mode is not M.RELAXED)
                or (caller_mode is M.GLOBAL and mode is M.GLOBAL))
        }

        def attempt():
            prev = srt.exchange_capture_mode(caller_mode)
            try:
                srt.memset(p, 1, 4)
            finally:
                srt.exchange_capture_mode(prev)

        try:
            for stream, (mode, on_worker) in zip(streams, captures):
                on(on_worker, lambda stream=stream, mode=mode: stream.begin_capture(mode))
                stream.launch_host_func(noop)
            if culprits:
                with pytest.raises(srt.CaptureUnsupportedError):
                    on(caller_on_worker, attempt)
            else:
                on(caller_on_worker, attempt)
            statuses = [stream.capture_info().status for stream in streams]
        finally:
            for stream, (_, on_worker) in zip(streams, captures):  # never leak a capture
                try:
                    outcomes.append(len(on(on_worker, stream.end_capture).nodes()))
                except srt.CaptureInvalidatedError:
                    outcomes.append("invalidated")
    srt.free(p)
    for stream in streams:
        stream.destroy()
    S = srt.CaptureStatus
    assert statuses == [S.INVALIDATED if i in culprits else S.ACTIVE for i in range(len(captures))]
    assert outcomes == ["invalidated" if i in culprits else 1 for i in range(len(captures))]


def test_graph_capture_operators_and_executor_lifetime(dev):
    import gc

    import numpy as np

    from streamrt import ops

    s = srt.Stream(dev, non_blocking=True)
    x = srt.Tensor.from_numpy(np.arange(64, dtype=np.float32).reshape(8, 8), stream=s)
    y = srt.Tensor.empty((8, 8), np.float32, stream=s)
    s.synchronize()
    live = ops.stats()["live_executors"]
    with srt.graph_capture(s, mode=srt.CaptureMode.THREAD_LOCAL) as cap:
        ops.run(ops.softmax, x, y, stream=s)  # plan, workspace malloc, kernels, free: captured
    g = cap.graph
    types = [n.type for n in g.nodes()]
    assert srt.NodeType.MEM_ALLOC in types and srt.NodeType.MEM_FREE in types
    assert srt.NodeType.KERNEL in types and srt.NodeType.HOST not in types
    assert ops.stats()["live_executors"] == live + 1  # the graph owns the executor
    ge = g.instantiate()
    ref = x.numpy(s)
    e = np.exp(ref - ref.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    for _ in range(3):
        s.memset(y.ptr, 0, y.nbytes)
        ge.launch(s)
        assert np.allclose(y.numpy(s), want, rtol=1e-5)
    assert ops.stats()["live_executors"] == live + 1
    del g, cap, ge
    gc.collect()
    assert ops.stats()["live_executors"] == live  # released with the last graph holding it
    x.free(s)
    y.free(s)
    s.synchronize()
