"""CUDA interop protocols on the cuda backend (API.md §9.2), checked against their written specs
field by field: the CUDA Array Interface v3, DLPack kDLCUDA capsules (dlpack.h 1.1, read back at
the header's byte offsets, not through streamrt's own structs) with the array API's stream
handshake, the ``__cuda_stream__`` protocol and ``Stream.from_external``. The handshake tests
hold the producer's work behind a gate: work the consumer enqueues afterwards must still see it."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest
from cuda.bindings import runtime as rt

import streamrt as srt
from streamrt import dlpack

pytestmark = pytest.mark.cuda

KDL_CPU, KDL_CUDA = 1, 2
_api = ctypes.pythonapi
_get_name = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyCapsule_GetName", _api))
_get_ptr = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", _api))
_USED = {b"dltensor": ctypes.create_string_buffer(b"used_dltensor"),  # static, as the spec asks
         b"dltensor_versioned": ctypes.create_string_buffer(b"used_dltensor_versioned")}


def _u(addr, ctype):
    return ctype.from_address(addr).value


def read_capsule(cap, *, consume=True) -> dict:
    """The fields of a DLPack capsule at dlpack.h's offsets (64-bit ABI); ``consume``: rename it
    and call the deleter afterwards, as a consumer does."""
    name = ctypes.string_at(_get_name(cap))
    p = _get_ptr(cap, name)
    out: dict = {"name": name.decode()}
    if name == b"dltensor_versioned":
        # {DLPackVersion{u32 major, u32 minor}, void* manager_ctx, deleter, u64 flags, DLTensor}
        out["version"] = (_u(p, ctypes.c_uint32), _u(p + 4, ctypes.c_uint32))
        deleter = _u(p + 16, ctypes.c_void_p)
        out["flags"] = _u(p + 24, ctypes.c_uint64)
        t = p + 32
    else:  # {DLTensor dl_tensor (48 bytes), void* manager_ctx, deleter}
        t = p
        deleter = _u(p + 56, ctypes.c_void_p)
    # DLTensor: void* data, DLDevice{i32, i32}, i32 ndim, DLDataType{u8, u8, u16}, i64* shape,
    # i64* strides, u64 byte_offset
    ndim = _u(t + 16, ctypes.c_int32)
    shape_p, strides_p = _u(t + 24, ctypes.c_void_p), _u(t + 32, ctypes.c_void_p)
    out.update(
        data=_u(t, ctypes.c_void_p) or 0,
        device=(_u(t + 8, ctypes.c_int32), _u(t + 12, ctypes.c_int32)), ndim=ndim,
        dtype=(_u(t + 20, ctypes.c_uint8), _u(t + 21, ctypes.c_uint8), _u(t + 22, ctypes.c_uint16)),
        shape=tuple(_u(shape_p + 8 * i, ctypes.c_int64) for i in range(ndim)),
        strides=None if not strides_p else tuple(_u(strides_p + 8 * i, ctypes.c_int64)
                                                 for i in range(ndim)),
        byte_offset=_u(t + 40, ctypes.c_uint64))
    assert deleter, "a streamrt capsule always has a deleter"
    if consume:
        _set_name(cap, ctypes.cast(_USED[name], ctypes.c_char_p))
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(p)
    return out


def raw_stream(non_blocking=True) -> int:
    err, h = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking if non_blocking else 0)
    assert err == rt.cudaError_t.cudaSuccess
    return int(h)


def raw_copy(stream: int, dst: int, src: int, n: int) -> None:
    """What a foreign library does on its own stream: cudaMemcpyAsync."""
    err, = rt.cudaMemcpyAsync(dst, src, n, rt.cudaMemcpyKind.cudaMemcpyDefault, rt.cudaStream_t(stream))
    assert err == rt.cudaError_t.cudaSuccess


def idle(stream: int) -> bool:
    err, = rt.cudaStreamQuery(rt.cudaStream_t(stream))
    return err == rt.cudaError_t.cudaSuccess


def raw_sync(stream: int) -> None:
    assert rt.cudaStreamSynchronize(rt.cudaStream_t(stream))[0] == rt.cudaError_t.cudaSuccess


def fake_only() -> None:
    from tests.cuda.fake import installed

    if not installed():
        pytest.skip("a garbage stream handle may crash a real driver (it dereferences handles)")


class Pinned:
    """``n`` bytes of pinned host memory and a numpy view (allocated before any gate closes)."""

    def __init__(self, n: int) -> None:
        with srt.Device("cuda:0"):  # the cuda backend's pinned memory: a real host address
            self.ptr = srt.malloc_host(n)
        self.view = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(self.ptr))
        self.view[:] = 0

    def close(self) -> None:
        with srt.Device("cuda:0"):
            srt.free_host(self.ptr)


# -- CUDA Array Interface v3 ---------------------------------------------------------------------
def test_cai_v3_field_by_field(cuda0):
    with cuda0:
        t = srt.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
        cai = t.__cuda_array_interface__
        assert set(cai) == {"shape", "typestr", "data", "version", "strides", "descr", "mask",
                            "stream"}
        assert cai["shape"] == (3, 4) and isinstance(cai["shape"], tuple)
        assert cai["typestr"] == "<f4"
        assert cai["data"] == (t.ptr, False) and type(cai["data"][0]) is int
        assert cai["version"] == 3
        assert cai["strides"] is None  # C-contiguous
        assert cai["descr"] == [("", "<f4")]
        assert cai["mask"] is None
        assert cai["stream"] == 1  # the legacy default stream (never 0, which CAI disallows)
        v = t.as_strided((2, 2), (4, 2), offset=1)
        cv = v.__cuda_array_interface__
        assert cv["data"][0] == t.ptr + 4  # the first element: CAI has no offset field
        assert cv["strides"] == (16, 8)  # bytes
        e = srt.Tensor.empty((0, 3), np.int16)
        assert e.__cuda_array_interface__["data"] == (0, False)  # "for zero-size arrays, use 0"
        assert e.__cuda_array_interface__["typestr"] == "<i2"


def test_cai_stream_is_the_current_stream(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    t = srt.Tensor.empty((4,), np.float64, stream=s)
    with s:
        assert t.__cuda_array_interface__["stream"] == s.__cuda_stream__()[1]
    assert t.__cuda_array_interface__["stream"] == 1  # outside: the default stream


def test_cai_stream_covers_a_pending_writer_of_another_stream(cuda0, gate):
    n = 64
    host = Pinned(n)
    p = srt.Stream(cuda0, non_blocking=True)
    c = srt.Stream(cuda0, non_blocking=True)
    t = srt.Tensor.from_numpy(np.zeros(n, np.uint8), stream=p)
    p.synchronize()
    g = gate(p)
    p.memset(t.ptr, 0x5A, n)  # held behind the gate
    with c:
        h = t.__cuda_array_interface__["stream"]
    assert h == c.__cuda_stream__()[1]
    raw_copy(h, host.ptr, t.ptr, n)  # a consumer's work on the stream CAI names
    assert not idle(h)  # waits for the gated writer
    g.open()
    raw_sync(h)
    assert (host.view == 0x5A).all()
    host.close()


def test_cai_inside_a_capture_leaves_the_capture_valid(cuda0, gate):
    p = srt.Stream(cuda0, non_blocking=True)
    s = srt.Stream(cuda0, non_blocking=True)
    t = srt.Tensor.from_numpy(np.zeros(4), stream=p)
    p.synchronize()
    g = gate(p)
    p.memset(t.ptr, 0, 32)  # pending outside the capture
    s.begin_capture()
    with s:
        assert t.__cuda_array_interface__["stream"] == s.__cuda_stream__()[1]
    s.end_capture()  # a wait on the outside work would have invalidated it
    g.open()


# -- DLPack export --------------------------------------------------------------------------------
def test_dlpack_device_and_capsule_fields(cuda0):
    with cuda0:
        t = srt.Tensor.from_numpy(np.arange(24, dtype=np.int32).reshape(2, 3, 4))
        assert t.__dlpack_device__() == (KDL_CUDA, 0)
        v = t.as_strided((2, 3), (12, 4), offset=1)
        f = read_capsule(v.__dlpack__(stream=1, max_version=(1, 0)))
        assert f["name"] == "dltensor_versioned"
        assert f["version"] == (1, 1)  # ours: the major versions match (the standard's advice)
        assert f["flags"] == 0  # writable, not a copy
        assert f["data"] == t.ptr and f["byte_offset"] == 4
        assert f["device"] == (KDL_CUDA, 0)
        assert f["ndim"] == 2 and f["shape"] == (2, 3) and f["strides"] == (12, 4)
        assert f["dtype"] == (0, 32, 1)  # kDLInt, 32 bits, 1 lane
        g = read_capsule(t.__dlpack__())
        assert g["name"] == "dltensor" and "version" not in g
        assert g["shape"] == (2, 3, 4) and g["strides"] == (12, 4, 1) and g["byte_offset"] == 0
        assert read_capsule(t.__dlpack__(max_version=(0, 8)))["name"] == "dltensor"
        for dt, code in ((np.float16, (2, 16, 1)), (np.uint8, (1, 8, 1)), (np.bool_, (6, 8, 1)),
                         (np.complex64, (5, 64, 1))):
            x = srt.Tensor.empty((2,), dt)
            assert read_capsule(x.__dlpack__())["dtype"] == code
        e = srt.Tensor.empty((0,), np.float32)
        assert read_capsule(e.__dlpack__(max_version=(1, 0)))["data"] == 0  # NULL when empty


def test_capsule_keeps_the_tensor_until_the_deleter(cuda0):
    with cuda0:
        base = dlpack.live_exports()
        t = srt.Tensor.from_numpy(np.ones(4, np.float32))
        alive = weakref.ref(t)
        cap = t.__dlpack__(max_version=(1, 0))
        del t
        gc.collect()
        assert alive() is not None  # the unconsumed capsule holds it
        del cap  # collected unconsumed: its destructor calls the deleter
        gc.collect()
        assert alive() is None and dlpack.live_exports() == base
        t = srt.Tensor.from_numpy(np.ones(4, np.float32))
        cap = t.__dlpack__()
        read_capsule(cap, consume=False)
        assert dlpack.live_exports() == base + 1
        read_capsule(cap)  # consumed: renamed, the deleter called once
        del cap
        gc.collect()
        assert dlpack.live_exports() == base


def _gated_producer(cuda0, gate, n):
    p = srt.Stream(cuda0, non_blocking=True)
    t = srt.Tensor.from_numpy(np.zeros(n, np.uint8), stream=p)
    p.synchronize()
    g = gate(p)
    p.memset(t.ptr, 0x7E, n)  # held behind the gate: pending when the consumer asks
    return t, g


def test_handshake_makes_a_foreign_consumer_stream_wait(cuda0, gate):
    n = 256
    host = Pinned(n)
    c = raw_stream()
    t, g = _gated_producer(cuda0, gate, n)
    cap = t.__dlpack__(stream=c, max_version=(1, 0))
    raw_copy(c, host.ptr, t.ptr, n)
    assert not idle(c)  # the handshake's event wait holds the consumer's copy
    g.open()
    raw_sync(c)
    assert (host.view == 0x7E).all()
    read_capsule(cap)
    rt.cudaStreamDestroy(rt.cudaStream_t(c))
    host.close()


def test_handshake_none_is_the_legacy_stream_and_minus_one_no_sync(cuda0, gate):
    n = 64
    host, other = Pinned(n), Pinned(n)
    c = raw_stream()
    t, g = _gated_producer(cuda0, gate, n)
    read_capsule(t.__dlpack__(stream=-1))  # no synchronization: the consumer runs at once
    raw_copy(c, other.ptr, t.ptr, n)
    raw_sync(c)  # returns while the gate is closed
    assert (other.view == 0).all()
    read_capsule(t.__dlpack__())  # None: the legacy default stream waits
    raw_copy(rt.cudaStreamLegacy, host.ptr, t.ptr, n)
    assert not idle(rt.cudaStreamLegacy)
    g.open()
    raw_sync(rt.cudaStreamLegacy)
    assert (host.view == 0x7E).all()
    rt.cudaStreamDestroy(rt.cudaStream_t(c))
    host.close()
    other.close()


def test_handshake_with_a_streamrt_stream_orders_its_clock(cuda0, gate):
    n = 64
    host = Pinned(n)
    c = srt.Stream(cuda0, non_blocking=True)
    t, g = _gated_producer(cuda0, gate, n)
    read_capsule(t.__dlpack__(stream=c.__cuda_stream__()[1]))
    c.memcpy(host.ptr, t.ptr, n)
    assert not c.query()
    g.open()
    c.synchronize()
    assert (host.view == 0x7E).all()
    host.close()


def test_export_refusals(cuda0):
    with cuda0:
        t = srt.Tensor.from_numpy(np.ones(3, np.float32))
        with pytest.raises(srt.InvalidValueError):
            t.__dlpack__(stream=0)  # disallowed by the standard: ambiguous
        with pytest.raises(ValueError):
            t.__dlpack__(stream=-2)
        with pytest.raises(srt.InvalidTypeError):
            t.__dlpack__(stream="1")
        with pytest.raises(BufferError):
            t.__dlpack__(dl_device=(KDL_CUDA, 1))
        with pytest.raises(BufferError):
            t.__dlpack__(copy=True)  # no device copy is made
        with pytest.raises(BufferError):
            t.__dlpack__(dl_device=(KDL_CPU, 0), copy=False)
        with pytest.raises(srt.InvalidTypeError):
            t.__dlpack__(max_version=1)
        with pytest.raises(srt.InvalidTypeError):
            t.__dlpack__(dl_device="cuda")


def test_garbage_consumer_stream_is_refused(cuda0):
    fake_only()
    t = srt.Tensor.from_numpy(np.ones(3, np.float32), stream=cuda0.default_stream)
    with pytest.raises(srt.InvalidHandleError):
        t.__dlpack__(stream=0xDEAD0)


def test_host_copy_export_to_kdlcpu(cuda0):
    with cuda0:
        t = srt.Tensor.from_numpy(np.arange(5, dtype=np.float64))
        f = read_capsule(t.__dlpack__(dl_device=(KDL_CPU, 0), max_version=(1, 0)), consume=False)
        assert f["device"] == (KDL_CPU, 0) and f["flags"] == dlpack.FLAG_IS_COPIED

        class Host:
            def __dlpack__(self, **kw):
                return t.__dlpack__(dl_device=(KDL_CPU, 0), **kw)

            def __dlpack_device__(self):
                return (KDL_CPU, 0)

        np.testing.assert_array_equal(np.from_dlpack(Host()), np.arange(5.0))


# -- DLPack import --------------------------------------------------------------------------------
class Producer:
    """A foreign kDLCUDA producer: records the keywords of each ``__dlpack__`` call."""

    def __init__(self, make, device=(KDL_CUDA, 0), *, old=False) -> None:
        self.make, self.device, self.old, self.calls = make, device, old, []

    def __dlpack__(self, *, stream=None, **kw):
        if self.old and kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        self.calls.append({"stream": stream, **kw})
        return self.make(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.device


def test_import_round_trip_shares_memory_and_keeps_the_producer(cuda0):
    with cuda0:
        base = dlpack.live_exports()
        t = srt.Tensor.from_numpy(np.arange(8, dtype=np.float32))
        s = srt.Stream(cuda0, non_blocking=True)
        prod = Producer(t.__dlpack__)
        u = srt.from_dlpack(prod, stream=s)
        assert prod.calls == [{"stream": s.__cuda_stream__()[1], "max_version": (1, 1)}]
        assert u.ptr == t.ptr and u.shape == (8,) and u.dtype == np.float32
        assert u.device is cuda0
        with pytest.raises(srt.InvalidValueError):
            u.free()  # the producer's memory
        del t, prod
        gc.collect()
        s.memset(u.ptr, 0, 4)  # a write through the import is the producer's memory
        s.synchronize()
        np.testing.assert_array_equal(u.numpy(), [0, 1, 2, 3, 4, 5, 6, 7])
        assert dlpack.live_exports() == base + 1
        del u
        gc.collect()
        assert dlpack.live_exports() == base  # the producer's deleter ran with the Tensor
        old = Producer(srt.Tensor.from_numpy(np.ones(2)).__dlpack__, old=True)
        np.testing.assert_array_equal(srt.from_dlpack(old).numpy(), [1.0, 1.0])
        assert old.calls == [{"stream": 1}]  # the current (default) stream; no max_version


class Owner:
    """A foreign array's owner (weakly referenceable)."""


def test_import_of_foreign_device_memory_registers_it(cuda0):
    with cuda0:
        err, ptr = rt.cudaMalloc(64)  # memory streamrt never allocated
        ptr = int(ptr)
        assert err == rt.cudaError_t.cudaSuccess
        with pytest.raises(srt.InvalidAddressError):
            srt.memset(ptr, 0, 64)  # unknown to streamrt: not an endpoint
        owner = [Owner()]  # what the producer's memory needs alive
        ref = weakref.ref(owner[0])

        def make(stream=None, max_version=None, **kw):
            return dlpack.make_capsule(ptr, (KDL_CUDA, 0), (4, 2), (2, 1), np.dtype(np.float64),
                                       0, owner[0], versioned=max_version is not None)

        u = srt.from_dlpack(Producer(make))
        owner.clear()
        srt.memset(u.ptr, 0, 64)  # registered: a copy and fill endpoint now
        srt.write(u.ptr, np.arange(8, dtype=np.float64))
        np.testing.assert_array_equal(u.numpy(), np.arange(8.0).reshape(4, 2))
        gc.collect()
        assert ref() is not None  # the producer's owner, kept until the deleter
        del u
        gc.collect()
        assert ref() is None
        with pytest.raises(srt.InvalidAddressError):
            srt.memset(ptr, 0, 64)  # the range went with the Tensor
        assert rt.cudaFree(ptr)[0] == rt.cudaError_t.cudaSuccess


def test_import_refusals(cuda0):
    with cuda0:
        base = dlpack.live_exports()
        t = srt.Tensor.from_numpy(np.arange(4, dtype=np.float32))

        def negative(stream=None, max_version=None, **kw):
            return dlpack.make_capsule(t.ptr + 12, (KDL_CUDA, 0), (4,), (-1,), t.dtype, 0, t,
                                       versioned=True)

        with pytest.raises(BufferError):
            srt.from_dlpack(Producer(negative))
        with pytest.raises(BufferError):
            srt.from_dlpack(Producer(t.__dlpack__, device=(KDL_CUDA, 0)), device="cpu:0")
        with pytest.raises(srt.InvalidTypeError):
            srt.from_dlpack(Producer(t.__dlpack__), stream=3)
        with pytest.raises(BufferError):  # an unversioned producer cannot honour copy=True
            srt.from_dlpack(Producer(t.__dlpack__, old=True), copy=True)
        gc.collect()
        assert dlpack.live_exports() == base  # each refused capsule was released


# -- __cuda_stream__ and Stream.from_external ---------------------------------------------------
def test_cuda_stream_protocol(cuda0):
    s = srt.Stream(cuda0, non_blocking=True)
    version, handle = s.__cuda_stream__()
    assert version == 0 and type(handle) is int and handle not in (0, 1, 2)
    assert cuda0.default_stream.__cuda_stream__() == (0, 1)  # cudaStreamLegacy
    s.destroy()
    assert hasattr(s, "__cuda_stream__")
    with pytest.raises(srt.InvalidHandleError):
        s.__cuda_stream__()


def test_from_external_round_trip(cuda0, gate):
    h = raw_stream(non_blocking=True)
    w = srt.Stream.from_external(h)
    assert w.device is cuda0 and w.non_blocking and w.__cuda_stream__() == (0, h)
    # one CUDA stream is one frontend stream: wrapping it again (here through cuda-bindings'
    # __cuda_stream__) gives the live wrapper
    assert srt.Stream.from_external(rt.cudaStream_t(h), device=cuda0) is w
    assert srt.Stream.from_external(w) is w  # a live streamrt stream's handle: that stream
    assert srt.Stream.from_external(1) is cuda0.default_stream
    blocking = srt.Stream.from_external(raw_stream(non_blocking=False))
    assert not blocking.non_blocking
    host = Pinned(32)
    p = srt.malloc(32, cuda0)
    other = srt.Stream(cuda0, non_blocking=True)
    g = gate(w)  # a kernel launched on the foreign stream
    w.memset(p, 0x33, 32)
    other.wait(w.record())  # event record and wait across the wrapper
    other.memcpy(host.ptr, p, 32)
    assert not other.query() and not w.query()
    g.open()
    w.synchronize()
    other.synchronize()
    assert (host.view == 0x33).all()
    w.destroy()
    del w
    gc.collect()
    assert idle(h)  # the CUDA stream lives on: its owner's
    assert rt.cudaStreamDestroy(rt.cudaStream_t(h))[0] == rt.cudaError_t.cudaSuccess
    srt.free(p)
    host.close()


def test_from_external_refusals(cuda0):
    h = raw_stream()

    class Odd:
        def __init__(self, answer):
            self.answer = answer

        def __cuda_stream__(self):
            return self.answer

    for bad in ("7", 1.5, True, None, Odd([0, h]), Odd((0,))):
        with pytest.raises(srt.InvalidTypeError):
            srt.Stream.from_external(bad)
    with pytest.raises(srt.InvalidValueError):
        srt.Stream.from_external(Odd((1, h)))  # protocol version 1 is unknown
    with pytest.raises(srt.InvalidValueError):
        srt.Stream.from_external(-5)
    with pytest.raises(srt.NotSupportedError):
        srt.Stream.from_external(h, device="cpu:0")
    rt.cudaStreamDestroy(rt.cudaStream_t(h))


def test_from_external_garbage_and_device_mismatch(cuda0):
    fake_only()
    with pytest.raises(srt.InvalidHandleError):
        srt.Stream.from_external(0xBAD0)
    if srt.device_count("cuda") > 1:
        h = raw_stream()
        with pytest.raises(srt.InvalidValueError):
            srt.Stream.from_external(h, device="cuda:1")
        rt.cudaStreamDestroy(rt.cudaStream_t(h))


# -- copies with other libraries' device memory (issue 24: DLPack kDLCUDA producers, CAI v3) -------
class CAI:
    """Any object with a ``__cuda_array_interface__`` (v3) over ``n`` bytes at ``ptr``."""

    def __init__(self, ptr, n, *, stream=None, readonly=False, **extra) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, readonly),
                                         "version": 3, "strides": None, "descr": [("", "|u1")],
                                         "mask": None, "stream": stream, **extra}


def foreign_malloc(n: int) -> int:
    """Device memory streamrt never allocated (another library's)."""
    err, ptr = rt.cudaMalloc(n)
    assert err == rt.cudaError_t.cudaSuccess
    return int(ptr)


def foreign_producer(ptr: int, n: int, owner, *, flags=0) -> Producer:
    """A kDLCUDA producer of ``n`` bytes at ``ptr`` whose capsule keeps ``owner`` until its deleter."""

    def make(stream=None, max_version=None, **kw):
        return dlpack.make_capsule(ptr, (KDL_CUDA, 0), (n,), (1,), np.dtype(np.uint8), 0, owner,
                                   versioned=max_version is not None, flags=flags)

    return Producer(make)


def test_memcpy_with_a_dlpack_cuda_producer_keeps_it_until_the_copy_ran(cuda0, gate):
    n = 256
    src, out = Pinned(n), Pinned(n)
    src.view[:] = np.arange(n, dtype=np.uint8)
    ptr = foreign_malloc(n)
    s = srt.Stream(cuda0, non_blocking=True)
    owner = Owner()
    ref = weakref.ref(owner)
    prod = foreign_producer(ptr, n, owner)
    s.memcpy(prod, src.ptr, n)  # into the producer's memory
    assert prod.calls == [{"stream": s.__cuda_stream__()[1], "max_version": (1, 1)}]  # handshake
    s.synchronize()
    g = gate(s)
    s.memcpy(out.ptr, prod, n)  # out of it, held behind the gate
    del prod, owner
    gc.collect()
    assert ref() is not None  # the copy has not run: the producer's memory is still needed
    g.open()
    s.synchronize()
    np.testing.assert_array_equal(out.view, np.arange(n, dtype=np.uint8))
    s.memset(out.ptr, 0, 1)  # a later enqueue runs the release deferred off the host function
    s.synchronize()
    gc.collect()
    assert ref() is None  # released once the copy ran: the producer's deleter was called
    with pytest.raises(srt.InvalidAddressError):
        s.memset(ptr, 0, n)  # the import's registration went with it
    assert rt.cudaFree(ptr)[0] == rt.cudaError_t.cudaSuccess
    src.close()
    out.close()


def test_memcpy_with_a_streamrt_tensor_orders_after_its_writer(cuda0, gate, delay):
    n = 64
    host = Pinned(n)
    t, g = _gated_producer(cuda0, gate, n)  # a memset of t pending behind a gate on another stream
    c = srt.Stream(cuda0, non_blocking=True)
    c.memcpy(host.ptr, t, n)  # the handshake makes c wait for the producer's pending writer
    assert not c.query()
    g.open()
    c.synchronize()
    assert (host.view == 0x7E).all()
    back = np.arange(n, dtype=np.uint8)
    with cuda0:
        srt.memcpy(t, back, n)  # srt.memcpy too (on the current device's stream), into the Tensor
    np.testing.assert_array_equal(t.numpy(), back)
    host.close()


def test_memcpy_with_a_cai_object_waits_for_its_foreign_stream(cuda0, gate):
    n = 128
    out, staged = Pinned(n), Pinned(n)
    staged.view[:] = 0x42
    data = foreign_malloc(n)
    h = raw_stream()
    w = srt.Stream.from_external(h)
    g = gate(w)  # the foreign stream is blocked ...
    w.destroy()  # ... and no streamrt stream of it is left: a foreign library's stream
    del w
    raw_copy(h, data, staged.ptr, n)  # the foreign library's writer of its array, behind the gate
    arr = CAI(data, n, stream=h)
    s = srt.Stream(cuda0, non_blocking=True)
    s.memcpy(out.ptr, arr, n)
    assert not s.query()  # the copying stream waits on an event recorded on the foreign stream
    g.open()
    s.synchronize()
    assert (out.view == 0x42).all()
    s.memcpy(arr, np.arange(n, dtype=np.uint8), n)  # a destination too
    got = np.zeros(n, np.uint8)
    once = CAI(data, n)
    kept = weakref.ref(once)
    s.memcpy(got, once, n)  # a pageable destination: a synchronous copy, nothing kept after it
    del once
    gc.collect()
    assert kept() is None
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.uint8))
    again = np.zeros(n, np.uint8)
    with cuda0:
        srt.memcpy(again, CAI(data, n), n)  # srt.memcpy reads it too (no stream: no wait)
    np.testing.assert_array_equal(again, got)
    s.memset(out.ptr, 0, 1)  # a later enqueue runs the releases deferred off host functions
    s.synchronize()
    gc.collect()
    with pytest.raises(srt.InvalidAddressError):
        s.memset(data, 0, n)  # each copy's registration went after it
    assert rt.cudaFree(data)[0] == rt.cudaError_t.cudaSuccess
    assert rt.cudaStreamDestroy(rt.cudaStream_t(h))[0] == rt.cudaError_t.cudaSuccess
    out.close()
    staged.close()


def test_memcpy_with_a_cai_object_on_a_streamrt_stream_orders_its_clock(cuda0, gate):
    n = 64
    out = Pinned(n)
    writer = srt.Stream(cuda0, non_blocking=True)
    t = srt.Tensor.from_numpy(np.zeros(n, np.uint8), stream=writer)
    writer.synchronize()
    g = gate(writer)
    writer.memset(t.ptr, 0x7E, n)  # the array's writer, behind the gate
    s = srt.Stream(cuda0, non_blocking=True)
    s.memcpy(out.ptr, CAI(t.ptr, n, stream=writer.__cuda_stream__()[1]), n)
    assert not s.query()
    assert s._clock.get(writer.id, 0) == writer._pos  # ordered through the clocks: known here
    g.open()
    s.synchronize()
    assert (out.view == 0x7E).all()
    out.close()


def test_memcpy_device_object_refusals(cuda0):
    n = 32
    ptr = foreign_malloc(n)
    s = srt.Stream(cuda0, non_blocking=True)
    base = dlpack.live_exports()
    host = np.zeros(n, np.uint8)

    class HostProducer:  # kDLCPU: stays a host endpoint (the copy fills the numpy array)
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (KDL_CPU, 0)

    fill = Pinned(n)
    fill.view[:] = 0x11
    c = raw_stream()
    raw_copy(c, ptr, fill.ptr, n)  # the foreign library's data
    raw_sync(c)
    rt.cudaStreamDestroy(rt.cudaStream_t(c))
    fill.close()
    other = foreign_producer(ptr, n, Owner())
    other.device = (KDL_CUDA, 1)
    with pytest.raises(srt.InvalidDeviceError):
        s.memcpy(host, other, n)  # another GPU's memory: not this stream's device
    assert other.calls == []  # refused before any export
    with pytest.raises(srt.InvalidDeviceError):
        srt.Stream("cpu:0").memcpy(host, foreign_producer(ptr, n, Owner()), n)
    read_only = foreign_producer(ptr, n, Owner(), flags=dlpack.FLAG_READ_ONLY)
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(read_only, host, n)
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(host, foreign_producer(ptr, n, Owner()), n + 1)  # more than it holds
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(CAI(ptr, n, readonly=True), host, n)  # a read-only CAI is no destination
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(host, CAI(ptr, n, stream=0), n)  # CAI v3 disallows stream 0
    with pytest.raises(srt.InvalidValueError):
        s.memcpy(host, CAI(ptr, 4, shape=(2, 2), strides=(1, 2)), 4)  # not C-contiguous
    with pytest.raises(srt.NotSupportedError):
        s.memcpy(host, CAI(ptr, n, mask=object()), n)
    with pytest.raises(srt.InvalidTypeError):
        s.memcpy(host, CAI("0x10", n), n)
    s.synchronize()
    gc.collect()
    assert dlpack.live_exports() == base  # every refused import was released
    with pytest.raises(srt.InvalidAddressError):
        s.memset(ptr, 0, n)  # and no refusal left a registration behind
    s.memcpy(host, CAI(ptr, n, readonly=True), n)  # a read-only CAI is a source
    s.memcpy(CAI(0, 0), host, 0)  # an empty array (its data NULL, as CAI says): nothing to copy
    s.memcpy(host, foreign_producer(0, 0, Owner()), 0)
    hp = HostProducer(np.zeros(n, np.uint8))
    s.memcpy(hp, CAI(ptr, n), n)
    s.synchronize()
    assert (hp.arr == 0x11).all() and (host == 0x11).all()
    s.begin_capture()
    with pytest.raises(srt.InvalidTypeError, match="device memory"):
        s.memcpy(host, CAI(ptr, n), n)  # a graph node needs an int pointer that outlives it
    s.end_capture()
    assert rt.cudaFree(ptr)[0] == rt.cudaError_t.cudaSuccess
