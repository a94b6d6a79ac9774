"""Contract tests run on every backend: the same program, the same results (cuda ones need a GPU).

Each kernel carries a Python body (cpu) and a CUDA C body (cuda). "Not yet complete" is made
certain by conftest's gate (on cuda, a kernel spinning on a flag in pinned host memory).
"""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

from .conftest import cuda_reason

ADD_ONE = r"""extern "C" __global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}"""

SCALE = r"""extern "C" __global__ void scale(float* x, int n, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}"""

@srt.kernel(cuda=ADD_ONE, signature="ptr, i32")
def add_one(ctx, x, n):
    ctx.array(x, (n,), np.float32)[:] += 1


@srt.kernel(cuda=SCALE, signature="ptr, i32, f32")
def scale(ctx, x, n, factor):
    ctx.array(x, (n,), np.float32)[:] *= factor


COORDS = r"""extern "C" __global__ void coords(int* out, int* lane) {
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned i = b * blockDim.x * blockDim.y * blockDim.z + t;
  out[i] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z
         + 1000 * blockIdx.x + 10000 * blockIdx.y + 100000 * blockIdx.z;
  lane[i] = __shfl_xor_sync(0xffffffffu, (int)t, 1);  // a warp: 32 consecutive linear ids
}"""


@srt.kernel(cuda=COORDS, signature="ptr, ptr")
def coords(ctx, out, lane):
    g, b = ctx.grid, ctx.block
    shape = (g.z, g.y, g.x, b.z, b.y, b.x)
    kz, ky, kx, tz, ty, tx = np.indices(shape)
    ctx.array(out, shape, np.int32)[...] = tx + 10 * ty + 100 * tz + 1000 * kx + 10000 * ky + 100000 * kz
    ctx.array(lane, shape, np.int32)[...] = (tx + b.x * (ty + b.y * tz)) ^ 1


EVERY_TYPE = r"""extern "C" __global__ void every_type(signed char i8, unsigned char u8, short i16,
    unsigned short u16, int i32, unsigned int u32, long long i64, unsigned long long u64, float f32,
    double f64, double* out) {
  out[0] = i8; out[1] = u8; out[2] = i16; out[3] = u16; out[4] = i32; out[5] = u32;
  out[6] = (double)i64; out[7] = (double)u64; out[8] = f32; out[9] = f64;
}"""


@srt.kernel(cuda=EVERY_TYPE, signature="i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, ptr")
def every_type(ctx, *args):
    ctx.array(args[-1], (10,), np.float64)[:] = args[:-1]


@srt.kernel
def python_only(ctx, x):
    pass


@pytest.fixture
def bdev(any_dev):
    """Device 0 of each backend (conftest's ``any_dev``)."""
    return any_dev


def _dev_f32(bdev, values) -> int:
    a = np.asarray(values, np.float32)
    p = srt.malloc(a.nbytes, bdev)
    srt.write(p, a)
    return p


def test_backend_memory_roundtrip_and_memset(bdev):
    p = _dev_f32(bdev, np.arange(64))
    assert np.array_equal(srt.read(p, (64,), np.float32), np.arange(64, dtype=np.float32))
    srt.memset(p, 0, 128)
    out = srt.read(p, (64,), np.float32)
    assert not out[:32].any() and np.array_equal(out[32:], np.arange(32, 64, dtype=np.float32))
    free, total = bdev.memory_info()
    assert 0 <= free <= total
    srt.free(p)
    with pytest.raises(srt.InvalidAddressError):
        srt.free(p)


def test_backend_async_copies_every_direction(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 1000
    host = np.arange(n, dtype=np.float32)
    a, b = srt.malloc(4 * n, bdev), srt.malloc(4 * n, bdev)
    s.memcpy(a, host, 4 * n)  # pageable source: staged, so changing it now is harmless
    host[:] = -1
    s.memcpy(b, a, 4 * n)
    back = np.zeros(n, np.float32)
    s.memcpy(back, b, 4 * n)  # pageable destination: returns once the data is there
    assert np.array_equal(back, np.arange(n, dtype=np.float32))
    s.synchronize()
    for p in (a, b):
        srt.free(p)


def test_backend_kernels_same_results(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 1000
    p = _dev_f32(bdev, np.arange(n))
    s.launch(add_one, p, n, grid=(n + 255) // 256, block=256)
    s.launch(scale, p, n, 0.5, grid=(n + 255) // 256, block=256)
    s.synchronize()
    assert np.array_equal(srt.read(p, (n,), np.float32), (np.arange(n, dtype=np.float32) + 1) * 0.5)
    srt.free(p)


def test_backend_kernel_arguments_of_every_width_and_sign(bdev):
    # each argument type packed as the kernel's C parameter reads it: the extremes of each width
    # (a wrong width or signedness shifts the later arguments or flips the sign)
    values = (-128, 255, -32768, 65535, -(2**31), 2**32 - 1, -(2**53), 2**53, 0.5, -1.25)
    out = srt.malloc(80, bdev)
    s = srt.Stream(bdev, non_blocking=True)
    s.launch(every_type, *values, out)
    s.synchronize()
    assert srt.read(out, (10,), np.float64).tolist() == list(values)
    srt.free(out)


def test_backend_kernels_three_dimensional_grid_and_blocks(bdev):
    grid, block = (2, 3, 2), (4, 3, 2)  # 24 threads: one partial warp
    n = 12 * 24
    out, lane = srt.malloc(4 * n, bdev), srt.malloc(4 * n, bdev)
    s = srt.Stream(bdev, non_blocking=True)
    s.launch(coords, out, lane, grid=grid, block=block)
    s.synchronize()
    kz, ky, kx, tz, ty, tx = np.indices((2, 3, 2, 2, 3, 4))
    want = tx + 10 * ty + 100 * tz + 1000 * kx + 10000 * ky + 100000 * kz
    assert np.array_equal(srt.read(out, (n,), np.int32), want.ravel())
    assert np.array_equal(srt.read(lane, (n,), np.int32), np.tile(np.arange(24) ^ 1, 12))
    for p in (out, lane):
        srt.free(p)


def test_backend_event_wait_orders_streams(bdev, gate):
    s1, s2 = srt.Stream(bdev, non_blocking=True), srt.Stream(bdev, non_blocking=True)
    n = 256
    src, dst = _dev_f32(bdev, np.zeros(n)), _dev_f32(bdev, np.zeros(n))
    g = gate(s1)
    s1.launch(add_one, src, n, grid=1, block=256)
    e = s1.record()
    assert not e.query() and not s1.query()
    s2.wait(e)
    s2.memcpy(dst, src, 4 * n)  # must see add_one's result: it waits for the gate
    assert not s2.query()
    g.open()
    s2.synchronize()
    assert e.query()
    assert np.array_equal(srt.read(dst, (n,), np.float32), np.ones(n, np.float32))
    for p in (src, dst):
        srt.free(p)


def test_backend_host_functions_run_in_stream_order(bdev, gate):
    s = srt.Stream(bdev, non_blocking=True)
    seen: list[int] = []
    g = gate(s)
    for i in range(5):
        s.launch_host_func(seen.append, i)
    done = s.record()
    assert not done.query()
    assert seen == []  # the gate holds them back
    g.open()
    done.synchronize()
    assert seen == [0, 1, 2, 3, 4]


def test_backend_host_function_error_reported_at_synchronize(bdev):
    s = srt.Stream(bdev, non_blocking=True)

    def boom():
        raise RuntimeError("boom")

    s.launch_host_func(boom)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_backend_timing_events(bdev, gate):
    s = srt.Stream(bdev, non_blocking=True)
    start = srt.Event(bdev, timing=True)
    end = srt.Event(bdev, timing=True)
    s.record(start)
    g = gate(s)
    s.record(end)
    with pytest.raises(srt.NotReadyError):
        start.elapsed_time(end)
    g.open()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    with pytest.raises(srt.InvalidHandleError):
        srt.Event(bdev).elapsed_time(end)  # not a timing event


def test_backend_blocking_stream_follows_legacy_default_stream(bdev, gate):
    legacy = bdev.default_stream
    blocking = srt.Stream(bdev)  # implicitly ordered after the legacy stream
    g = gate(legacy)
    blocking.launch_host_func(lambda: None)
    assert not blocking.query()
    g.open()
    blocking.synchronize()
    assert legacy.query()


def test_backend_pool_stream_ordered_allocation(bdev):
    s1, s2 = srt.Stream(bdev, non_blocking=True), srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev, release_threshold=1 << 20)
    assert pool.get_attr(srt.MemPoolAttr.RELEASE_THRESHOLD) == 1 << 20
    assert pool.reuse_allow_opportunistic is True
    pool.reuse_allow_opportunistic = False
    assert pool.get_attr(srt.MemPoolAttr.REUSE_ALLOW_OPPORTUNISTIC) == 0
    n = 4096
    p = s1.malloc(4 * n, pool)
    s1.memcpy(p, np.arange(n, dtype=np.float32), 4 * n)
    s1.launch(add_one, p, n, grid=n // 256, block=256)
    back = np.empty(n, np.float32)
    s1.memcpy(back, p, 4 * n)
    assert np.array_equal(back, np.arange(n, dtype=np.float32) + 1)
    e = s1.record()
    s2.wait(e)
    s2.free(p)  # freed on another stream than it was allocated on
    s2.synchronize()
    st = pool.stats()
    assert st["alloc_count"] == 1 and st["free_count"] == 1
    assert st["used_mem_current"] == 0
    assert st["reserved_mem_high"] >= 4 * n and st["used_mem_high"] >= 4 * n
    pool.set_attr(srt.MemPoolAttr.USED_MEM_HIGH, 0)
    assert pool.used_mem_high == pool.used_mem_current
    with pytest.raises(srt.InvalidValueError):
        pool.set_attr(srt.MemPoolAttr.USED_MEM_CURRENT, 0)
    with pytest.raises(srt.InvalidAddressError):
        s1.free(p)  # double free
    pool.trim_to(0)
    assert pool.reserved_mem_current == 0
    pool.destroy()
    with pytest.raises(srt.InvalidValueError):
        bdev.default_mem_pool.destroy()


_REUSE_FLAGS = ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
                "reuse_allow_internal_dependencies")


@pytest.mark.parametrize("off", _REUSE_FLAGS)
def test_backend_pool_created_with_one_reuse_flag_off(bdev, off):
    # each constructor flag reaches its own attribute (a native pool sets them by number)
    pool = srt.MemPool(bdev, **{off: False})
    for flag in _REUSE_FLAGS:
        assert pool.get_attr(srt.MemPoolAttr[flag.upper()]) == (flag != off), flag
    pool.destroy()


def test_backend_pool_trim_to_keeps_its_argument(bdev):
    # cudaMemPoolTrimTo: "the pool will be guaranteed to have at least minBytesToKeep bytes
    # reserved after the operation"
    pool = srt.MemPool(bdev, release_threshold=1 << 30)  # synchronize releases nothing
    s = srt.Stream(bdev, non_blocking=True)
    for p in [s.malloc(2 << 20, pool) for _ in range(3)]:
        s.free(p)
    s.synchronize()
    assert pool.reserved_mem_current >= 6 << 20
    pool.trim_to(3 << 20)
    assert pool.reserved_mem_current >= 3 << 20
    pool.trim_to(0)
    assert pool.reserved_mem_current == 0
    pool.destroy()


def test_backend_free_of_pool_memory_is_a_synchronize_of_the_pool(bdev):
    # srt.free returns once the memory is freed: a synchronize point, where a pool releases
    # what it holds above its threshold (0 here)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    p = s.malloc(2 << 20, pool)
    s.memset(p, 0, 2 << 20)
    s.synchronize()
    assert pool.reserved_mem_current >= 2 << 20
    srt.free(p)
    assert pool.reserved_mem_current == 0 and pool.used_mem_current == 0
    pool.destroy()


def test_backend_synchronize_of_a_stream_that_only_allocated_and_freed(bdev):
    # pool allocations and frees are work of their stream: its synchronize is a synchronize
    # point even when it did nothing else (on cuda it returned at once, so the driver never
    # released the memory down to the threshold, 0 here)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    s.free(s.malloc(2 << 20, pool))
    s.synchronize()
    assert pool.reserved_mem_current == 0
    pool.destroy()


def test_backend_pool_zero_byte_allocations(bdev):
    # as malloc(0) in C: distinct live pointers, each freed once (CUDA's allocators may refuse
    # a size of 0, as cuMemAlloc documents: the backend must not pass it on)
    pool = srt.MemPool(bdev)
    s = srt.Stream(bdev, non_blocking=True)
    a, b = s.malloc(0, pool), s.malloc(0, pool)
    assert a and b and a != b
    s.free(a)
    s.free(b)
    with pytest.raises(srt.InvalidAddressError):
        s.free(a)
    s.synchronize()
    pool.destroy()


def test_backend_pool_limit_raises_out_of_memory(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev, max_size=64 << 20)
    with pytest.raises(srt.OutOfMemoryError):
        s.malloc(256 << 20, pool)
    p = s.malloc(1 << 20, pool)  # the pool still works
    s.free(p)
    s.synchronize()
    pool.destroy()


def test_backend_default_pool_and_current_pool(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    pool = srt.MemPool(bdev)
    bdev.set_mem_pool(pool)
    try:
        p = s.malloc(1024)
        assert srt.pool.find_pool(p) is pool
        s.free(p)
    finally:
        bdev.set_mem_pool(bdev.default_mem_pool)
    q = s.malloc(1024)
    assert srt.pool.find_pool(q) is bdev.default_mem_pool
    s.free(q)
    s.synchronize()
    pool.destroy()


def test_backend_stream_priorities_and_destroy(bdev):
    s = srt.Stream(bdev, priority=-1, non_blocking=True)
    p = _dev_f32(bdev, np.zeros(256))
    s.launch(add_one, p, 256, grid=1, block=256)
    s.destroy()  # pending work still completes
    bdev.synchronize()
    assert np.array_equal(srt.read(p, (256,), np.float32), np.ones(256, np.float32))
    srt.free(p)
    with pytest.raises(srt.InvalidHandleError):
        s.launch(add_one, p, 256)


@pytest.mark.cuda
def test_cuda_kernel_without_cuda_body_is_a_clear_error():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    dev = srt.Device("cuda:0")
    s = srt.Stream(dev, non_blocking=True)
    with pytest.raises(srt.NotSupportedError, match="no CUDA body"):
        s.launch(python_only, 0)
    s.synchronize()


@pytest.mark.cuda
def test_cuda_kernel_from_ptx_when_nvrtc_does_not_know_the_gpu(monkeypatch):
    # as for a GPU newer than NVRTC: PTX of an older architecture, compiled by the driver at load
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    from cuda.bindings import runtime as rt

    from streamrt.backends import nvrtc

    # the driver JIT-compiles PTX only up to its own CUDA version (cudaErrorUnsupportedPtxVersion,
    # 222, e.g. NVRTC 13.2 on a 580 driver, which is CUDA 13.0); a GPU newer than NVRTC always
    # comes with a driver newer than NVRTC, so only this test meets an older one
    major, minor = nvrtc._nvrtc_version()
    driver = rt.cudaDriverGetVersion()[1]  # 0 on the fake CUDA runtime, which loads any PTX
    if driver and driver < 1000 * major + 10 * minor:
        pytest.skip(f"the driver supports CUDA {driver // 1000}.{driver % 1000 // 10}, older than "
                    f"NVRTC {major}.{minor}: it cannot load this NVRTC's PTX")
    dev = srt.Device("cuda:0")
    target = f"compute_{nvrtc.supported_archs()[0]}"
    images: list[bytes] = []
    compile_module = nvrtc.compile_module
    monkeypatch.setattr(nvrtc, "compile_module",
                        lambda *a: images.append(compile_module(*a)) or images[-1])
    monkeypatch.setattr(dev._impl, "_target", target)
    fresh = srt.kernel(cuda=ADD_ONE, signature="ptr, i32")(add_one.fn)  # not loaded on dev yet
    p = _dev_f32(dev, np.arange(300))
    s = srt.Stream(dev, non_blocking=True)
    s.launch(fresh, p, 300, grid=2, block=256)
    s.synchronize()
    assert np.array_equal(srt.read(p, (300,), np.float32), np.arange(1, 301, dtype=np.float32))
    assert len(images) == 1 and f".target sm_{target[8:]}".encode() in images[0]  # PTX was loaded
    srt.free(p)


def test_cuda_unavailable_is_reported_clearly():
    reason = cuda_reason()
    if reason is None:
        pytest.skip("a CUDA device is usable here")
    assert srt.device_count("cuda") == 0
    with pytest.raises(srt.BackendUnavailableError) as info:
        srt.Device("cuda:0")
    assert "cuda" in str(info.value).lower()


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


def test_backend_explicit_graph_nodes_and_updates(bdev):
    s = srt.Stream(bdev, non_blocking=True)
    n = 256
    a, b = _dev_f32(bdev, np.zeros(n)), _dev_f32(bdev, np.zeros(n))
    seen: list[str] = []
    g = srt.Graph()
    fill = g.add_memset_node(a, 0, 4 * n)
    inc = g.add_kernel_node(add_one, a, n, grid=1, block=256, deps=(fill,))
    cp = g.add_memcpy_node(b, a, 4 * n, deps=(inc,))
    g.add_host_node(seen.append, "host", deps=(cp,))
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    assert seen == ["host"]
    assert np.array_equal(srt.read(b, (n,), np.float32), np.ones(n, np.float32))
    ge.set_kernel_node_params(inc, b, n, grid=1, block=256)  # now increments b, later launches only
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(a, (n,), np.float32), np.zeros(n, np.float32))
    assert np.array_equal(srt.read(b, (n,), np.float32), np.zeros(n, np.float32))  # copied after
    ge.set_node_enabled(cp, False)
    ge.launch(s)
    s.synchronize()
    assert np.array_equal(srt.read(b, (n,), np.float32), np.ones(n, np.float32))  # no copy: +1 stays
    assert seen == ["host"] * 3
    ge.destroy()
    for p in (a, b):
        srt.free(p)


@pytest.mark.cuda
def test_cuda_sanitizer_refuses_cuda_streams_clearly():
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    s = srt.Stream(srt.Device("cuda:0"), non_blocking=True)
    srt.sanitizer.enable()
    try:
        with pytest.raises(srt.NotSupportedError, match="sanitizer"):
            s.launch_host_func(lambda: None)
    finally:
        srt.sanitizer.disable()
    s.launch_host_func(lambda: None)  # and nothing was left half-enqueued
    s.synchronize()


def test_backend_refused_launch_leaves_the_stream_as_it_was(bdev):
    # cuda checks arguments at launch: a refused one enqueues nothing and counts nothing, so
    # the stream still reads idle, and its later work and events are tracked as before
    s = srt.Stream(bdev, non_blocking=True)
    p = _dev_f32(bdev, np.zeros(256))
    if bdev.backend == "cuda":
        for bad in ((p, 1.5), (p, 2**31), (p,), (-1, 256)):
            with pytest.raises((srt.InvalidTypeError, srt.InvalidValueError)):
                s.launch(add_one, *bad, grid=1, block=256)
        with pytest.raises(srt.NotSupportedError, match="no CUDA body"):
            s.launch(python_only, 0)
    assert s.query()
    s.synchronize()
    s.launch(add_one, p, 256, grid=1, block=256)
    e = s.record()
    e.synchronize()
    assert e.query() and s.query()
    assert np.array_equal(srt.read(p, (256,), np.float32), np.ones(256, np.float32))
    srt.free(p)
