"""How the cuda backend maps the graph calls of API.md §9.1: ``cudaGraphInstantiateWithParams``
(node priority flag, refusals with ``result_out``/``errNode_out``), instantiate's device and node
refusals, the graph memory attributes (``cudaDeviceGet/SetGraphMemAttribute``,
``cudaDeviceGraphMemTrim``), and the fake's own versions of those calls."""

from __future__ import annotations

import os

import pytest

import streamrt as srt
from tests.conftest import fill_kernel
from tests.conftest import read_f32 as _read

pytestmark = pytest.mark.cuda

N = 16
IR = srt.GraphInstantiateResult
FAKE = os.environ.get("STREAMRT_CUDA_FAKE") == "1"
needs_fake = pytest.mark.skipif(not FAKE, reason="reads the fake CUDA runtime's state "
                                "(STREAMRT_CUDA_FAKE=1)")


@srt.kernel
def python_only(ctx):
    """A kernel with a Python body only: no CUDA kernel node can run it."""


def _runtime():
    from cuda.bindings import runtime as rt

    return rt


def _native_exec(ge: srt.GraphExec, dev: srt.Device):
    """The ``cudaGraphExec_t`` handle of ``ge``'s graph on ``dev`` (compiled by a launch or upload)."""
    return int(ge._plans[dev].runner.exec)


@needs_fake
@pytest.mark.parametrize("priority", [False, True])
def test_cuda_instantiate_passes_node_priority_flag(cuda0, priority):
    from tests.cuda.fake import graphs

    rt = _runtime()
    with cuda0:
        p = srt.malloc(N * 4)
        s = srt.Stream(non_blocking=True)
        g = srt.Graph()
        g.add_kernel_node(fill_kernel, p, N, 3.0)
        ge = g.instantiate(upload_stream=s, use_node_priority=priority)
        flags = graphs.EXECS[_native_exec(ge, cuda0)].flags  # instantiated by the upload
        ge.launch(s)
        s.synchronize()
        assert (_read(p) == 3.0).all()
        srt.free(p)
    want = int(rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagUseNodePriority) if priority else 0
    assert flags == want


def test_cuda_instantiate_upload_stream_calls_graph_upload(cuda0, monkeypatch):
    rt = _runtime()
    calls = []
    real = rt.cudaGraphUpload

    def upload(exec_, stream):
        calls.append(int(stream))
        return real(exec_, stream)

    monkeypatch.setattr(rt, "cudaGraphUpload", upload)
    with cuda0:
        s = srt.Stream(non_blocking=True)
        g = srt.Graph()
        g.add_empty_node()
        ge = g.instantiate(upload_stream=s)
        assert calls == [int(s._q.stream)]  # uploaded on that stream, as part of instantiate
        ge.launch(s)
        s.synchronize()


@needs_fake
def test_cuda_backend_instantiate_refusal_names_result_and_node(cuda0, monkeypatch):
    # cudaGraphInstantiateWithParams refuses (as a driver may, for a reason of its own): the
    # error carries its result_out and the frontend node of its errNode_out
    from tests.cuda.fake import graphs

    rt = _runtime()
    real = rt.cudaGraphInstantiateWithParams
    seen = []

    def refusing(graph, params):
        g = graphs.GRAPHS[int(graph)]
        second = list(g.nodes)[1]  # the handles in insertion order: the kernel node's
        params.result_out = rt.cudaGraphInstantiateResult.cudaGraphInstantiateNodeOperationNotSupported
        params.errNode_out = rt.cudaGraphNode_t(second)
        seen.append(graph)
        return (rt.cudaError_t.cudaErrorInvalidValue, None)

    with cuda0:
        p = srt.malloc(N * 4)
        srt.memset(p, 0, N * 4)
        s = srt.Stream(non_blocking=True)
        g = srt.Graph()
        e = g.add_empty_node()
        k = g.add_kernel_node(fill_kernel, p, N, 5.0, deps=e)
        ge = g.instantiate()
        monkeypatch.setattr(rt, "cudaGraphInstantiateWithParams", refusing)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            ge.launch(s)  # the backend instantiates at the first launch on the device
        assert seen and ei.value.result is IR.NODE_OPERATION_NOT_SUPPORTED
        node = ei.value.node
        assert node.type is srt.NodeType.KERNEL and node.index == k.index
        assert isinstance(ei.value, srt.InvalidValueError)
        s.synchronize()
        assert (_read(p) == 0.0).all()  # nothing launched
        monkeypatch.setattr(rt, "cudaGraphInstantiateWithParams", real)
        ge.launch(s)  # a later launch instantiates again
        s.synchronize()
        assert (_read(p) == 5.0).all()
        srt.free(p)


def test_cuda_instantiate_refuses_a_kernel_without_cuda_body(cuda0):
    with cuda0:
        g = srt.Graph()
        k = g.add_kernel_node(python_only)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            g.instantiate()
        assert ei.value.result is IR.NODE_OPERATION_NOT_SUPPORTED and ei.value.node is k
        assert "no CUDA body" in str(ei.value)
        parent = srt.Graph()  # inside a child graph: the child's node is named
        cg = parent.add_child_graph_node(g)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            parent.instantiate()
        assert ei.value.node is cg.params["graph"].nodes()[0]


def test_cuda_instantiate_refuses_nodes_of_two_gpus(cuda0, cuda1):
    with cuda0:
        p0 = srt.malloc(N * 4)
    with cuda1:
        p1 = srt.malloc(N * 4)
    try:
        g = srt.Graph()
        with cuda0:
            g.add_kernel_node(fill_kernel, p0, N, 1.0)
        with cuda1:
            k1 = g.add_kernel_node(fill_kernel, p1, N, 1.0)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            g.instantiate()
        assert ei.value.result is IR.MULTIPLE_DEVICES_NOT_SUPPORTED and ei.value.node is k1
        # memory nodes count too: a MEM_ALLOC node of the other GPU
        h = srt.Graph()
        with cuda0:
            h.add_kernel_node(fill_kernel, p0, N, 1.0)
        with cuda1:
            m = h.add_mem_alloc_node(64)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            h.instantiate()
        assert ei.value.node is m
    finally:
        srt.free(p0)
        srt.free(p1)


def test_instantiate_refuses_nodes_of_two_backends(cuda0):
    cpu = srt.Device("cpu:0")
    with cuda0:
        p = srt.malloc(N * 4)
    try:
        child = srt.Graph()
        with cuda0:
            kc = child.add_kernel_node(fill_kernel, p, N, 1.0)
        g = srt.Graph()
        with cpu:
            g.add_empty_node()
            g.add_kernel_node(python_only)
        g.add_child_graph_node(child)
        with pytest.raises(srt.GraphInstantiateError) as ei:
            g.instantiate()
        assert ei.value.result is IR.MULTIPLE_DEVICES_NOT_SUPPORTED
        assert ei.value.node.type is srt.NodeType.KERNEL and ei.value.node.index == kc.index
        assert "one backend" in str(ei.value)
    finally:
        srt.free(p)


def test_cuda_graph_mem_attrs_read_and_reset_cudas_own(cuda0, monkeypatch):
    rt = _runtime()
    A = rt.cudaGraphMemAttributeType
    real_get, real_set, real_trim = (rt.cudaDeviceGetGraphMemAttribute,
                                     rt.cudaDeviceSetGraphMemAttribute, rt.cudaDeviceGraphMemTrim)
    got, sets, trims = [], [], []
    native = {A.cudaGraphMemAttrUsedMemCurrent: 1000, A.cudaGraphMemAttrUsedMemHigh: 3000,
              A.cudaGraphMemAttrReservedMemCurrent: 2 << 20,
              A.cudaGraphMemAttrReservedMemHigh: 4 << 20}

    def get(device, attr):
        got.append((device, attr))
        err, value = real_get(device, attr)
        return err, type(value)(native[attr] + int(value)) if err == 0 else value

    def set_(device, attr, value):
        sets.append((device, attr, int(value)))
        return real_set(device, attr, value)

    def trim(device):
        trims.append(device)
        return real_trim(device)

    cuda0.synchronize()
    cuda0.graph_mem_trim()
    cuda0.reset_graph_mem_high()
    own = cuda0.graph_mem_info()
    monkeypatch.setattr(rt, "cudaDeviceGetGraphMemAttribute", get)
    monkeypatch.setattr(rt, "cudaDeviceSetGraphMemAttribute", set_)
    monkeypatch.setattr(rt, "cudaDeviceGraphMemTrim", trim)
    attrs = cuda0.graph_mem_attrs()
    # CUDA's own graph allocator holds other memory than the frontend maps: they add up
    assert attrs["used_mem_current"] == own["used"] + 1000
    assert attrs["reserved_mem_current"] == own["reserved"] + (2 << 20)
    assert attrs["used_mem_high"] == own["used"] + 3000
    assert attrs["reserved_mem_high"] == own["reserved"] + (4 << 20)
    assert sorted(int(a) for _d, a in got) == [0, 1, 2, 3] and {d for d, _a in got} == {0}
    cuda0.reset_graph_mem_high()
    assert sorted((d, int(a), v) for d, a, v in sets) == [(0, 1, 0), (0, 3, 0)]
    cuda0.graph_mem_trim()
    assert trims == [0]


@needs_fake
def test_fake_graph_mem_attributes_of_cudas_own_allocator(cuda0):
    from cuda.bindings import driver as drv

    rt = _runtime()
    A, E = rt.cudaGraphMemAttributeType, rt.cudaError_t
    for attr in A:
        err, value = rt.cudaDeviceGetGraphMemAttribute(0, attr)
        assert err == E.cudaSuccess and int(value) == 0  # nothing in the fake uses it
    assert rt.cudaDeviceGetGraphMemAttribute(99, A.cudaGraphMemAttrUsedMemHigh)[0] == E.cudaErrorInvalidDevice
    zero, one = drv.cuuint64_t(0), drv.cuuint64_t(1)
    assert rt.cudaDeviceSetGraphMemAttribute(0, A.cudaGraphMemAttrUsedMemHigh, zero)[0] == E.cudaSuccess
    assert rt.cudaDeviceSetGraphMemAttribute(0, A.cudaGraphMemAttrReservedMemHigh, one)[0] == \
        E.cudaErrorInvalidValue  # a high watermark may only be reset
    assert rt.cudaDeviceSetGraphMemAttribute(0, A.cudaGraphMemAttrUsedMemCurrent, zero)[0] == \
        E.cudaErrorInvalidValue  # a current value cannot be set
    assert rt.cudaDeviceGraphMemTrim(0)[0] == E.cudaSuccess
    assert rt.cudaDeviceGraphMemTrim(99)[0] == E.cudaErrorInvalidDevice


@needs_fake
def test_fake_instantiate_with_params_reports_result_and_uploads(cuda0):
    from tests.cuda.fake import graphs

    rt = _runtime()
    F, E = rt.cudaGraphInstantiateFlags, rt.cudaError_t
    rt.cudaSetDevice(0)
    g = rt.cudaGraphCreate(0)[1]
    rt.cudaGraphAddEmptyNode(g, [], 0)
    s = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1]
    p = rt.cudaGraphInstantiateParams()
    p.flags = int(F.cudaGraphInstantiateFlagUpload) | int(F.cudaGraphInstantiateFlagUseNodePriority)
    p.uploadStream = s
    err, exe = rt.cudaGraphInstantiateWithParams(g, p)
    assert err == E.cudaSuccess
    assert p.result_out == rt.cudaGraphInstantiateResult.cudaGraphInstantiateSuccess
    assert graphs.EXECS[int(exe)].flags == int(p.flags)
    assert rt.cudaStreamSynchronize(s)[0] == E.cudaSuccess  # the upload ran on the stream
    bad = rt.cudaGraphInstantiateParams()
    bad.flags = 1 << 10  # no such flag
    assert rt.cudaGraphInstantiateWithParams(g, bad)[0] == E.cudaErrorInvalidValue
    assert bad.result_out == rt.cudaGraphInstantiateResult.cudaGraphInstantiateError
    assert rt.cudaGraphExecDestroy(exe)[0] == E.cudaSuccess
    assert rt.cudaGraphDestroy(g)[0] == E.cudaSuccess
    assert rt.cudaStreamDestroy(s)[0] == E.cudaSuccess
