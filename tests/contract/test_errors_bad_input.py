"""Bad input gets an error of the API's hierarchy (API.md §6) and leaves state intact: argument
shapes a fuzzer of the public API found escaping as bare Python errors, or accepted silently."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt


@pytest.fixture
def s():
    st = srt.Stream("cpu:0", non_blocking=True)
    yield st
    st.synchronize()
    st.destroy()


# -- graph memory: a size no device can hold is refused before it takes addresses ---------------
@pytest.mark.parametrize("nbytes", [2**64, 2**48, np.uint64(2**64 - 1)])
def test_bad_input_graph_mem_alloc_node_larger_than_the_device_is_refused(nbytes):
    g = srt.Graph()
    with pytest.raises(srt.OutOfMemoryError, match="more than the device's"):
        g.add_mem_alloc_node(nbytes)
    assert g.nodes() == []
    # the reservation never happened: later allocations stay in the device's 64-bit window (a
    # 2**64-byte reservation pushed every later cpu:0 pointer past 2**64, and one of 2**48 into
    # cpu:1's addresses)
    p = srt.malloc(64, "cpu:0")
    try:
        assert p < 2 << 48
        assert srt.pool.device_of(p) is srt.Device("cpu:0")
    finally:
        srt.free(p)


def test_bad_input_captured_malloc_larger_than_the_device_is_refused(s):
    s.begin_capture()
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(2**64)
    s.memset(s.malloc(64), 0, 64)  # the capture goes on
    g = s.end_capture()
    assert [n.type for n in g.nodes()] == [srt.NodeType.MEM_ALLOC, srt.NodeType.MEMSET]
    p = srt.malloc(64)  # no address past the device's window for later allocations
    srt.free(p)
    assert p < 2 << 48


# -- tensor metadata: element counts are exact ---------------------------------------------------
@pytest.mark.parametrize("shape", [(2**32, 2**32), (2**31, 2**31, 3), (2**64,), (2**62, 4)])
def test_bad_input_tensor_desc_too_many_elements_is_refused(shape):
    # numpy's int64 product wrapped: (2**32, 2**32) had numel 0 and storage 0 bytes, so
    # Tensor.empty "succeeded" with no memory; (2**64,) raised a bare OverflowError
    with pytest.raises(srt.InvalidValueError, match="64-bit index"):
        srt.TensorDesc(shape, np.float32)


def test_bad_input_tensor_empty_too_many_elements_allocates_nothing(s):
    pool = s.device.mem_pool
    used = pool.used_mem_current
    with pytest.raises(srt.InvalidValueError):
        srt.Tensor.empty((2**32, 2**32), np.float32, stream=s)
    assert pool.used_mem_current == used


def test_bad_input_tensor_desc_numel_large_but_valid():
    d = srt.TensorDesc((2**20, 2**20), np.float32)
    assert d.numel == 2**40 and type(d.numel) is int
    assert d.storage_nbytes == 2**42


@pytest.mark.parametrize("shape", [b"\x02\x03", "", "23", {2, 3}, {2: 3}, bytearray(b"\x02")])
def test_bad_input_tensor_shape_of_bytes_text_or_a_set_is_refused(shape):
    # iterables of ints, or of nothing, but no shape: b"\x02\x03" was taken as (2, 3)
    with pytest.raises(srt.InvalidTypeError, match="sequence of ints"):
        srt.TensorDesc(shape, np.float32)
    with pytest.raises(srt.InvalidTypeError, match="sequence of ints"):
        srt.TensorDesc((2, 3), np.float32, strides=shape)


@pytest.mark.parametrize("dtype", ["f4,(", "i4,,"])
def test_bad_input_malformed_dtype_string(dtype):
    with pytest.raises(srt.InvalidTypeError, match="not a numpy dtype"):
        srt.TensorDesc((2,), dtype)
    with pytest.raises(srt.InvalidTypeError, match="not a numpy dtype"):
        srt.read(1, (1,), dtype)


# -- host arrays ---------------------------------------------------------------------------------
def test_bad_input_ragged_host_data(s):
    ragged = [[1, [2]]]
    pool = s.device.mem_pool
    used = pool.used_mem_current
    with pytest.raises(srt.InvalidValueError, match="Tensor.from_numpy"):
        srt.Tensor.from_numpy(ragged, stream=s)
    assert pool.used_mem_current == used
    p = s.malloc(64)
    s.synchronize()
    with pytest.raises(srt.InvalidValueError, match="srt.write"):
        srt.write(p, ragged)
    srt.write(p, np.arange(4, dtype=np.float32))  # still works
    assert srt.read(p, (4,), np.float32).tolist() == [0, 1, 2, 3]
    s.free(p)


# -- graphs: dependency lists and DOT paths --------------------------------------------------------
def test_bad_input_graph_deps_zero_dim_array():
    g = srt.Graph()
    a = g.add_empty_node()
    with pytest.raises(srt.InvalidTypeError, match="sequence of Nodes"):
        g.add_empty_node(deps=np.array(3))
    with pytest.raises(srt.InvalidTypeError, match="sequence of Nodes"):
        g.add_dependencies(np.array(3), a)
    with pytest.raises(srt.InvalidTypeError, match="sequence of Nodes"):
        g.add_empty_node(deps=5)
    assert g.nodes() == [a] and g.edges() == []


def test_bad_input_update_capture_dependencies_zero_dim_array(s):
    s.begin_capture()
    try:
        with pytest.raises(srt.InvalidTypeError):
            s.update_capture_dependencies(np.array(3))
        assert s.capture_info().status is srt.CaptureStatus.ACTIVE
    finally:
        s.end_capture()


@pytest.mark.parametrize("path", [1, 1.5, b"x.dot", ["x.dot"]])
def test_bad_input_to_dot_path_type(path):
    g = srt.Graph()
    g.add_empty_node()
    with pytest.raises(srt.InvalidTypeError, match="to_dot path"):
        g.to_dot(path)


def test_bad_input_to_dot_unwritable_path(tmp_path):
    g = srt.Graph()
    g.add_empty_node()
    with pytest.raises(srt.InvalidValueError, match="cannot write the graph"):
        g.to_dot(tmp_path)  # a directory
    assert "digraph" in g.to_dot(tmp_path / "g.dot")


@pytest.mark.parametrize("path", [None, 3, b"t.json"])
def test_bad_input_trace_path_type(path):
    with pytest.raises(srt.InvalidTypeError, match="trace path"):
        srt.trace(path)


# -- flags: a bool (numpy's too), refused before anything happens ---------------------------------
def test_bad_input_array_where_a_flag_is_expected(s):
    from streamrt import ops

    arr = np.array([1, 2])  # its truth is ambiguous: numpy's bare ValueError escaped
    x = srt.Tensor.from_numpy(np.ones(4, np.float32), stream=s)
    pos = s._pos
    with pytest.raises(srt.ExecutorError, match="sync must be a bool"):
        ops.run("add", x, x, x, stream=s, sync=arr)
    assert s._pos == pos  # nothing enqueued
    with pytest.raises(srt.InvalidTypeError, match="reset must be a bool"):
        ops.stats(reset=arr)
    with pytest.raises(srt.InvalidTypeError, match="this_thread must be a bool"):
        ops.ExecutorCache().stats(this_thread=arr)
    on = srt.sanitizer.enabled()
    with pytest.raises(srt.InvalidValueError, match="sanitizer mode"):
        srt.sanitizer.enable(mode=arr)
    with pytest.raises(srt.InvalidTypeError, match="leaks must be a bool"):
        srt.sanitizer.enable(leaks=arr)
    assert srt.sanitizer.enabled() is on
    with pytest.raises(srt.InvalidTypeError, match="backend is named by a str"):
        srt.device_count(arr)
    s.begin_capture()
    try:
        with pytest.raises(srt.InvalidTypeError, match="replace must be a bool"):
            s.update_capture_dependencies([], replace=arr)
    finally:
        s.end_capture()
    ops.run("add", x, x, x, stream=s, sync=np.bool_(True))  # numpy's bool is a bool
    x.free(s)


# -- addresses a GPU kernel faults on: refused on every backend -----------------------------------
@pytest.mark.parametrize(("dtype", "off"), [(np.float32, 1), (np.float32, 2), (np.float64, 4),
                                            (np.float16, 1)])
def test_bad_input_misaligned_tensor_pointer_is_refused(s, dtype, off):
    # the cpu backend ran ops on them; a GPU faults (cudaErrorMisalignedAddress) and its context
    # is lost for good
    from streamrt import ops

    p = s.malloc(1024)
    desc = srt.TensorDesc((4,), dtype)
    with pytest.raises(srt.InvalidValueError, match="not aligned"):
        srt.Tensor(desc, p + off)
    t = srt.Tensor(desc, p + np.dtype(dtype).itemsize)  # one element in: fine
    size, ex = ops.add.get_workspace_size(t, t, t)
    ex.set_repeatable()
    with pytest.raises(srt.ExecutorError, match="not aligned"):
        ex.set_input_addr(0, p + off)
    with pytest.raises(srt.ExecutorError, match="not aligned"):
        ex.set_output_addr(0, p + off)
    ops.add(None, size, ex, s)  # the executor still holds its aligned addresses
    ex.destroy()
    s.free(p)


def test_bad_input_misaligned_workspace_is_refused(s):
    # the operators keep float32/float64 partials there: a GPU faults on a workspace off 8 bytes.
    # Sizes are rounded to 8, so a workspace placed exactly at the end of a buffer stays aligned
    from streamrt import ops

    x = srt.Tensor.from_numpy(np.ones((3, 5000), np.float32), stream=s)
    out = srt.Tensor.empty((3,), np.float32, stream=s)
    size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    assert size and size % 8 == 0
    ex.set_repeatable()
    base = s.malloc(size + 64)
    for off in (1, 4):
        with pytest.raises(srt.ExecutorError, match="not aligned to 8"):
            ops.reduce_sum(base + off, size, ex, s)
    ops.reduce_sum(base + 64, size, ex, s)  # exactly size bytes before the end: aligned
    assert out.numpy(s).tolist() == [5000.0] * 3
    ex.destroy()
    s.free(base)
    x.free(s)
    out.free(s)


# -- bad input raises an error of the API's hierarchy, never a raw Python or numpy one --------
def _host_objects():
    return np.array([None, None])


BAD_INPUTS = {
    "malloc_host(2**64)": (srt.OutOfMemoryError, lambda s, p: srt.malloc_host(2 ** 64)),
    "memcpy from an object array": (srt.InvalidTypeError,
                                    lambda s, p: s.memcpy(p, _host_objects(), 16)),
    "memcpy into an object array": (srt.InvalidTypeError,
                                    lambda s, p: s.memcpy(_host_objects(), p, 16)),
    "write an object array": (srt.InvalidTypeError,
                              lambda s, p: srt.write(p, np.array([object()]))),
    "read a negative shape": (srt.InvalidValueError, lambda s, p: srt.read(p, (-1,), np.float32)),
    "read a float shape": (srt.InvalidTypeError, lambda s, p: srt.read(p, (2.5,), np.float32)),
    "read a bad dtype": (srt.InvalidTypeError, lambda s, p: srt.read(p, (2,), "nope")),
    "read into objects": (srt.InvalidTypeError, lambda s, p: srt.read(p, (2,), object)),
    # a str was copied as its UTF-32 text, a Python scalar as an 8-byte int64/float64
    "write a str": (srt.InvalidTypeError, lambda s, p: srt.write(p, "hello")),
    "write a list of str": (srt.InvalidTypeError, lambda s, p: srt.write(p, ["ab", "cd"])),
    "write an int": (srt.InvalidTypeError, lambda s, p: srt.write(p, 7)),
    "write None": (srt.InvalidTypeError, lambda s, p: srt.write(p, None)),
    "capture_info, destroyed stream": (srt.InvalidHandleError,
                                       lambda s, p: _destroyed().capture_info()),
    "0-byte memcpy, destroyed stream": (srt.InvalidHandleError,
                                        lambda s, p: _destroyed().memcpy(p, p, 0)),
    "0-byte memset, destroyed stream": (srt.InvalidHandleError,
                                        lambda s, p: _destroyed().memset(p, 0, 0)),
}


def _destroyed():
    d = srt.Stream(non_blocking=True)
    d.destroy()
    return d


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_errors_bad_input_is_an_api_error_and_changes_nothing(case):
    cls, call = BAD_INPUTS[case]
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(64)
    srt.write(p, np.arange(16, dtype=np.float32))
    with pytest.raises(cls):
        call(s, p)
    s.synchronize()
    assert srt.read(p, (16,), np.float32).tolist() == list(range(16))  # nothing written
    srt.free(p)


def test_bad_input_write_says_what_it_copies():
    p = srt.malloc(64)
    try:
        with pytest.raises(srt.InvalidTypeError, match=r"not a str: encode it"):
            srt.write(p, "hello")
        srt.write(p, b"\x01\x02")  # bytes and nested lists of numbers are still data
        srt.write(p + 2, [[3, 4]])
        assert srt.read(p, (2,), np.uint8).tolist() == [1, 2]
        assert srt.read(p + 2, (2,), np.int64).tolist() == [3, 4]
    finally:
        srt.free(p)
