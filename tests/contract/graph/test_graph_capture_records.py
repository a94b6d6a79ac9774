"""Stream capture (DESIGN.md §5): what is captured, fork/join, capture info and dependency updates, the
context manager, memory nodes, inlined execs."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import _grid_stride, add_one_kernel, copy_kernel, fill_kernel
from tests.conftest import read_f32 as _read
from tests.contract.backend_kernels import _dev_f32, add_one, scale
from tests.contract.graph.capturing import assert_left_capture, noop

N = 16


M = srt.CaptureMode


T = srt.NodeType


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


def test_backend_captured_graph_replays(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 512
    p = _dev_f32(bdev, np.zeros(n))
    s.begin_capture()
    s.launch(add_one, p, n, grid=2, block=256)
    s.launch(scale, p, n, 3.0, grid=2, block=256)
    g = s.end_capture()
    assert [x.type for x in g.nodes()] == [srt.NodeType.KERNEL, srt.NodeType.KERNEL]
    assert np.array_equal(srt.read(p, (n,), np.float32), np.zeros(n, np.float32))  # nothing ran
    ge = g.instantiate()
    ge.upload(s)
    ge.launch(s)
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(p, (n,), np.float32), np.full(n, 12.0, np.float32))  # (0+1)*3+1)*3
    ge.destroy()
    srt.free(p)
