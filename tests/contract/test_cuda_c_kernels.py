"""CUDA C kernels on the cpu backend (API.md 9.3): ``srt.cuda_kernel`` runs its source through the
emulator in stream order and in graphs; signatures are checked against the source when the
kernel is made; ``k.compile()`` checks the CUDA C with NVRTC.

The emulator builds each kernel once with g++ and keeps it on disk (``streamrt.emu.cache_dir``),
so a rerun loads the libraries it built before.
"""

from __future__ import annotations

import ctypes
import importlib

import numpy as np
import pytest

import streamrt as srt
from streamrt import emu
from streamrt.backends.cuda.nvrtc import nvrtc_available
from tests.conftest import BAD_ACCESS, delayed, no_sanitizer

ORDERS = ["forward", "reverse", "ahead", "behind", "random:7"]

VADD = r"""
extern "C" __global__ void vadd(float* out, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""

# a block sums its 256 values in shared memory, then thread 0 adds the block's sum to *out;
# BARRIER is the barrier between loading shared memory and the tree (planted missing below)
REDUCE = r"""
extern "C" __global__ void block_sum(int* out, const int* x, int n) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? x[i] : 0;
  BARRIER
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) atomicAdd(out, s[0]);
}
"""

needs_gxx = pytest.mark.skipif(emu.unavailable() is not None,
                               reason=f"the CUDA C emulator needs g++: {emu.unavailable()}")
needs_nvrtc = pytest.mark.skipif(nvrtc_available() is not None,
                                 reason=f"compile() needs NVRTC: {nvrtc_available()}")

vadd = srt.cuda_kernel(VADD, "vadd", signature="ptr, const ptr, const ptr, i32")
block_sum = srt.cuda_kernel(REDUCE.replace("BARRIER", "__syncthreads();"), "block_sum",
                            signature="ptr, const ptr, i32")
racy_sum = srt.cuda_kernel(REDUCE.replace("BARRIER", "/* the barrier is missing */"),
                           "block_sum", signature="ptr, const ptr, i32")


@srt.kernel
def fill_range(ctx, p, n, base):
    """p[i] = base + i (a Python kernel)."""
    ctx.array(p, (n,), np.float32)[:] = base + np.arange(n, dtype=np.float32)


@srt.kernel
def add_one(ctx, p, n):
    """p[i] += 1 (a Python kernel)."""
    ctx.array(p, (n,), np.float32)[:] += 1


@srt.kernel
def double(ctx, p, n):
    """p[i] *= 2 (a Python kernel)."""
    ctx.array(p, (n,), np.float32)[:] *= 2


def _device(a: np.ndarray) -> int:
    p = srt.malloc(a.nbytes)
    srt.memcpy(p, a, a.nbytes)
    return p


def _host(p: int, n: int, dtype=np.float32) -> np.ndarray:
    out = np.empty(n, dtype)
    srt.memcpy(out, p, out.nbytes)
    return out


def _sum(k: srt.Kernel, x: np.ndarray, s: srt.Stream) -> int:
    px, po = _device(x), _device(np.zeros(1, np.int32))
    s.launch(k, po, px, x.size, grid=(x.size + 255) // 256, block=256)
    s.synchronize()
    got = int(_host(po, 1, np.int32)[0])
    srt.free(px)
    srt.free(po)
    return got


@needs_gxx
@pytest.mark.parametrize("order", ORDERS)
def test_vector_add_equals_numpy_in_every_order(dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    n = 1000  # not a multiple of the block: the last block's tail threads do nothing
    a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    pa, pb, po = _device(a), _device(b), srt.malloc(4 * n)
    s = srt.Stream(dev)
    s.launch(vadd, po, pa, pb, n, grid=(n + 127) // 128, block=128)
    assert np.array_equal(_host(po, n), a + b)
    for p in (pa, pb, po):
        srt.free(p)


@needs_gxx
def test_one_source_on_every_backend(any_dev):
    # the same kernel object: NVRTC's build on cuda, the emulator on cpu, equal results
    n = 300
    a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
    pa, pb, po = _device(a), _device(b), srt.malloc(4 * n)
    s = srt.Stream(any_dev)
    s.launch(vadd, po, pa, pb, n, grid=3, block=128)
    x = np.random.default_rng(5).integers(-9, 9, 700).astype(np.int32)
    assert np.array_equal(_host(po, n), a + b)
    assert _sum(block_sum, x, s) == int(x.sum())
    for p in (pa, pb, po):
        srt.free(p)


@srt.kernel(name="vadd", cuda=VADD, signature="ptr, const ptr, const ptr, i32")
def vadd_stub(ctx, out, a, b, n):
    """A kernel declared for its CUDA C alone: no usable Python body."""
    ...


@srt.kernel(name="vadd", cuda=VADD, signature="ptr, const ptr, const ptr, i32")
def vadd_todo(ctx, out, a, b, n):
    raise NotImplementedError("written in CUDA C")


@needs_gxx
@pytest.mark.parametrize("k", [vadd_stub, vadd_todo], ids=["ellipsis", "not-implemented"])
def test_a_kernel_without_a_python_body_runs_its_cuda_c(any_dev, k):
    n = 200
    a, b = np.arange(n, dtype=np.float32), np.full(n, 2.0, np.float32)
    pa, pb, po = _device(a), _device(b), srt.malloc(4 * n)
    s = srt.Stream(any_dev)
    s.launch(k, po, pa, pb, n, grid=2, block=128)
    assert np.array_equal(_host(po, n), a + b)
    with pytest.raises(srt.InvalidTypeError, match="takes 4 argument"):
        s.launch(k, po, pa, pb, grid=2, block=128)  # the signature's count, at the launch line
    for p in (pa, pb, po):
        srt.free(p)


def test_a_kernel_with_a_python_body_keeps_it(dev):
    ran = []

    @srt.kernel(name="vadd", cuda=VADD, signature="ptr, const ptr, const ptr, i32")
    def body(ctx, out, a, b, n):
        ran.append(n)

    s = srt.Stream(dev)
    s.launch(body, 0, 0, 0, 7)
    s.synchronize()
    assert ran == [7]


def test_a_stub_body_needs_a_signature_and_its_function():
    with pytest.raises(srt.InvalidValueError, match="only a CUDA C body: give its signature"):
        @srt.kernel(cuda=VADD)
        def vadd(ctx, *args):
            pass
    with pytest.raises(srt.InvalidValueError, match='no extern "C" __global__ void vsub'):
        @srt.kernel(cuda=VADD, signature="ptr, const ptr, const ptr, i32")
        def vsub(ctx, *args):
            ...


@needs_gxx
def test_options_reach_both_compilers(any_dev):
    src = VADD.replace("a[i] + b[i]", "a[i] + SCALE * b[i]")
    k = srt.cuda_kernel(src, "vadd", signature="ptr, const ptr, const ptr, i32",
                        options=("-DSCALE=3",))
    assert k.options == ("-DSCALE=3",)
    a, b = np.arange(64, dtype=np.float32), np.ones(64, np.float32)
    pa, pb, po = _device(a), _device(b), srt.malloc(4 * 64)
    srt.Stream(any_dev).launch(k, po, pa, pb, 64, grid=1, block=64)
    assert np.array_equal(_host(po, 64), a + 3)
    for p in (pa, pb, po):
        srt.free(p)


COORDS = r"""
extern "C" __global__ void coords(unsigned* out) {
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  out[b * nt + t] = blockIdx.x | blockIdx.y << 4 | blockIdx.z << 8 | threadIdx.x << 12
                    | threadIdx.y << 16 | threadIdx.z << 20 | gridDim.x << 24 | blockDim.z << 28;
}
"""


@needs_gxx
def test_grid_and_block_as_given(dev, monkeypatch):
    monkeypatch.setenv(emu.ORDER_ENV, "random:3")
    k = srt.cuda_kernel(COORDS, "coords", signature="ptr")
    grid, block = (5, 3, 2), (4, 2, 3)  # more blocks along x and z than the operators' tests run
    n = 5 * 3 * 2 * 4 * 2 * 3
    po = srt.malloc(4 * n)
    srt.Stream(dev).launch(k, po, grid=grid, block=block)
    want = [bx | by << 4 | bz << 8 | tx << 12 | ty << 16 | tz << 20 | 5 << 24 | 3 << 28
            for bz in range(2) for by in range(3) for bx in range(5)
            for tz in range(3) for ty in range(2) for tx in range(4)]
    assert _host(po, n, np.uint32).tolist() == want
    srt.free(po)


@needs_gxx
@pytest.mark.parametrize("order", ORDERS)
def test_shared_memory_reduction_with_atomics(dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    x = np.random.default_rng(3).integers(-1000, 1000, 1500).astype(np.int32)  # 6 blocks
    assert _sum(block_sum, x, srt.Stream(dev)) == int(x.sum())


WARPS = r"""
extern "C" __global__ void warps(long long* out, const int* x, int n) {
  __shared__ int block_total;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = i < n ? x[i] : 0;
  if (threadIdx.x == 0) block_total = 0;
  __syncthreads();
  int w = v;  // a warp's sum by shuffles down, lane 0 adding it to the block's (shared) total
  for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
  const unsigned pos = __ballot_sync(0xffffffffu, v > 0);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&block_total, w);
    atomicAdd((unsigned long long*)&out[1], (unsigned long long)__popc(pos));
  }
  atomicMax(&out[2], (long long)v);
  if (__all_sync(0xffffffffu, v >= 0)) atomicAdd((unsigned long long*)&out[3], 1ull);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd((unsigned long long*)&out[0], (unsigned long long)block_total);
}
"""


@needs_gxx
@pytest.mark.parametrize("order", ORDERS)
def test_warp_shuffles_votes_and_atomics(dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    k = srt.cuda_kernel(WARPS, "warps", signature="ptr, const ptr, i32")
    x = np.random.default_rng(6).integers(-5, 100, 640).astype(np.int32)  # 5 blocks, 4 warps each
    x[:64] = np.abs(x[:64])  # the first two warps' lanes are all >= 0
    px, po = _device(x), _device(np.zeros(4, np.int64))
    srt.Stream(dev).launch(k, po, px, x.size, grid=5, block=128)
    total, positive, top, all_nonneg = _host(po, 4, np.int64).tolist()
    lanes_ok = sum(32 for w in range(20) if (x[32 * w: 32 * w + 32] >= 0).all())
    assert (total, positive, top, all_nonneg) == (int(x.sum()), int((x > 0).sum()), int(x.max()),
                                                  lanes_ok)
    srt.free(px)
    srt.free(po)


@needs_gxx
def test_a_missing_syncthreads_shows_in_some_order(dev, monkeypatch):
    x = np.random.default_rng(4).integers(1, 1000, 1024).astype(np.int32)
    s = srt.Stream(dev)
    got = {}
    for order in ORDERS:
        monkeypatch.setenv(emu.ORDER_ENV, order)
        assert _sum(block_sum, x, s) == int(x.sum())
        got[order] = _sum(racy_sum, x, s)
    assert any(v != int(x.sum()) for v in got.values()), got


@pytest.mark.parametrize("signature, why", [
    ("ptr, const ptr, const ptr, bogus", "'bogus', not a type"),
    ("ptr, const ptr, i32", "has 3 parameter"),
    ("ptr, const ptr, const ptr, i32, i32", "has 5 parameter"),
    ("ptr, const ptr, const ptr, f32", "'int n'"),
    ("ptr, const ptr, i32, i32", "'const float\\* b'"),
    ("const ptr, const ptr, const ptr, i32", "declare the pointee const"),
    ("ptr,, const ptr, i32", "parameter 1 is ''"),
])
def test_a_signature_that_does_not_match_is_refused_when_made(signature, why):
    with pytest.raises(srt.InvalidValueError, match=why):
        srt.cuda_kernel(VADD, "vadd", signature=signature)
    with pytest.raises(srt.InvalidValueError, match=why):  # cuda= bodies are checked alike
        srt.kernel(lambda ctx, *a: None, name="vadd", cuda=VADD, signature=signature)


def test_cuda_kernel_needs_its_function_in_the_source():
    with pytest.raises(srt.InvalidTypeError, match="options must be a tuple or list of str"):
        srt.cuda_kernel(VADD, "vadd", signature="ptr, ptr, ptr, i32", options="-DX=1")
    with pytest.raises(srt.InvalidValueError, match='no extern "C" __global__ void vsub'):
        srt.cuda_kernel(VADD, "vsub", signature="ptr, const ptr, const ptr, i32")
    # whitespace in tokens is free; ptr may name a pointer to const
    k = srt.cuda_kernel(VADD, "vadd", signature=" ptr,ptr , const  ptr,i32")
    assert k.signature == " ptr,ptr , const  ptr,i32" and k.cuda_source == VADD


@needs_nvrtc
def test_compile_checks_the_cuda_c_with_nvrtc():
    vadd.compile()
    for src, name, sig in [(VADD, "vadd", "ptr, const ptr, const ptr, i32"),
                           (REDUCE.replace("BARRIER", ""), "block_sum", "ptr, const ptr, i32"),
                           (WARPS, "warps", "ptr, const ptr, i32"), (COORDS, "coords", "ptr"),
                           (DYN, "reverse_block", "ptr"),
                           (INTRINSICS, "intrinsics", "ptr, const ptr, i32")]:
        for arch in ("sm_80", "sm_90"):  # every source the emulator runs here is CUDA C
            srt.cuda_kernel(src, name, signature=sig).compile(arch)
    broken = srt.cuda_kernel(VADD.replace("a[i] + b[i];", "a[i] + b[i]"), "vadd",
                             signature="ptr, const ptr, const ptr, i32")
    with pytest.raises(srt.CompileError, match=r"line 5: \}") as info:
        broken.compile()
    assert "vadd(5): error" in info.value.log


@needs_gxx
def test_stream_order_with_python_kernels(dev):
    # Python kernels make a on s1 in ten steps; s2 waits for them, adds on the emulator, and a
    # Python kernel doubles the sum: with random delays before each operation, s2 without the
    # wait would read a before s1's last steps (and s1 without its wait would refill it early)
    n, s1, s2 = 512, srt.Stream(dev, non_blocking=True), srt.Stream(dev, non_blocking=True)
    pa, pb, po = srt.malloc(4 * n), _device(np.ones(n, np.float32)), srt.malloc(4 * n)
    with delayed(300):
        for rnd in range(4):
            s1.launch(fill_range, pa, n, float(rnd))
            for _ in range(9):
                s1.launch(add_one, pa, n)
            s2.wait(s1.record())
            s2.launch(vadd, po, pa, pb, n, grid=n // 128, block=128)
            s2.launch(double, po, n)
            s1.wait(s2.record())  # the next fill waits for this round's reads
            got = np.empty(n, np.float32)
            s2.memcpy(got, po, 4 * n)
            s2.synchronize()
            assert np.array_equal(got, 2 * (rnd + 9 + np.arange(n) + 1)), rnd
    for p in (pa, pb, po):
        srt.free(p)


@needs_gxx
def test_captured_graph_replays_the_cuda_c(dev):
    n, s = 256, srt.Stream(dev)
    pa, pb, po = srt.malloc(4 * n), _device(np.full(n, 10, np.float32)), srt.malloc(4 * n)
    s.begin_capture()
    s.launch(fill_range, pa, n, 0.0)
    s.launch(vadd, po, pa, pb, n, grid=2, block=128)
    ge = s.end_capture().instantiate()
    for fill in (5.0, 7.0):  # each replay runs the CUDA C again, after the fill
        srt.memcpy(pb, np.full(n, fill, np.float32), 4 * n)
        ge.launch(s)
        assert np.array_equal(_host(po, n), np.arange(n) + fill)
    for p in (pa, pb, po):
        srt.free(p)


@needs_gxx
def test_explicit_kernel_node_and_its_new_params(dev):
    n, s = 128, srt.Stream(dev)
    a, b = np.arange(n, dtype=np.float32), np.full(n, 3, np.float32)
    pa, pb, po, po2 = _device(a), _device(b), srt.malloc(4 * n), srt.malloc(4 * n)
    g = srt.Graph()
    node = g.add_kernel_node(vadd, po, pa, pb, n, grid=1, block=128)
    ge = g.instantiate()
    ge.launch(s)
    assert np.array_equal(_host(po, n), a + b)
    ge.set_kernel_node_params(node, po2, pa, pa, n // 2, grid=4, block=32)
    ge.launch(s)
    out2 = _host(po2, n)
    assert np.array_equal(out2[: n // 2], 2 * a[: n // 2])
    for p in (pa, pb, po, po2):
        srt.free(p)


@needs_gxx
def test_launch_refusals(dev, monkeypatch):
    no_sanitizer(BAD_ACCESS)  # (test_sanitizer_emulated: the finding the dead pointer gives)
    n, s = 64, srt.Stream(dev)
    pa = srt.malloc(4 * n)
    with pytest.raises(srt.InvalidTypeError, match="takes 4 argument"):  # at the launch's line
        s.launch(vadd, pa, pa, n, grid=1, block=n)
    # a pointer outside every live allocation: the launch fails, reported at synchronize
    dead = srt.malloc(4 * n)
    srt.free(dead)
    s.launch(vadd, pa, dead, pa, n, grid=1, block=n)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.InvalidAddressError)
    assert "argument 1" in str(info.value.__cause__)
    monkeypatch.setenv(emu.ORDER_ENV, "sideways")
    s.launch(vadd, pa, pa, pa, n, grid=1, block=n)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.InvalidValueError)
    assert "STREAMRT_EMU_ORDER" in str(info.value.__cause__)
    monkeypatch.delenv(emu.ORDER_ENV)
    s.launch(vadd, pa, pa, pa, 1.5, grid=1, block=n)  # a float for an i32
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.InvalidTypeError)
    srt.free(pa)


@needs_gxx
def test_builds_are_cached_by_source_and_options(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMRT_EMU_CACHE", str(tmp_path))
    src = VADD.replace("a[i] + b[i]", "a[i] + b[i] * SCALE")
    first = emu.build(src, "vadd", ("-DSCALE=2",))
    assert first.parent == tmp_path and first.exists()
    stamp = first.stat().st_mtime_ns
    assert emu.build(src, "vadd", ("-DSCALE=2",)) == first  # a hit: not rebuilt
    assert first.stat().st_mtime_ns == stamp
    other = emu.build(src, "vadd", ("--define-macro=SCALE=3",))
    assert other != first and other.exists()
    # the options reach g++: SCALE=3 computes a + 3 b
    lib = emu.library(src, "vadd", ("-DSCALE=3",))
    a, b, out = (np.arange(4, dtype=np.float32), np.ones(4, np.float32),
                 np.zeros(4, np.float32))
    emu.launch(lib, [out.ctypes.data, a.ctypes.data, b.ctypes.data, 4],
               [ctypes.c_void_p] * 3 + [ctypes.c_int32], (1, 1, 1), (4, 1, 1))
    assert out.tolist() == [3.0, 4.0, 5.0, 6.0]


DYN = r"""
extern "C" __global__ void reverse_block(int* x) {
  extern __shared__ int tile[];
  const unsigned t = threadIdx.x;
  tile[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  x[blockIdx.x * blockDim.x + t] = tile[blockDim.x - 1 - t];
}
"""


@needs_gxx
@pytest.mark.parametrize("order", ["forward", "behind"])
def test_dynamic_shared_memory(order):
    x = np.arange(192, dtype=np.int32)
    emu.launch(emu.library(DYN, "reverse_block"), [x.ctypes.data], [ctypes.c_void_p],
               (3, 1, 1), (64, 1, 1), shared_mem=64 * 4, order=order)
    assert x.tolist() == [b * 64 + 63 - t for b in range(3) for t in range(64)]


def test_without_gxx_the_error_says_what_to_install(monkeypatch):
    build = importlib.import_module("streamrt.emu.build")  # (emu.build is its function)
    monkeypatch.setenv("PATH", "/nonexistent")
    build._unavailable.cache_clear()
    try:
        with pytest.raises(srt.BackendUnavailableError,
                           match="g\\+\\+ is not on PATH.*apt-get install g\\+\\+"):
            emu.build(VADD.replace("vadd", "vadd_nogxx"), "vadd_nogxx")
    finally:
        monkeypatch.undo()
        build._unavailable.cache_clear()


# float16 through cuda_fp16.h's names: __half arithmetic rounds each operation to float16, as the
# GPU's __hmul/__hadd; a float4 load reads four floats at once (CUDA's vector types)
HALF = r"""
#include <cuda_fp16.h>
extern "C" __global__ void hfma(__half* y, const __half* x, const float4* q, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float4 v = q[i / 4];
    const float w = (i % 4 == 0) ? v.x : (i % 4 == 1) ? v.y : (i % 4 == 2) ? v.z : v.w;
    y[i] = __hadd(__hmul(__float2half(a), x[i]), y[i]) + __float2half(w);
  }
  if (i == 0) atomicAdd(&y[n], __float2half(1.5f));
}
"""


@needs_gxx
@pytest.mark.parametrize("order", ["forward", "random:3"])
def test_half_and_vector_types(any_dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    k = srt.cuda_kernel(HALF, "hfma", signature="ptr, const ptr, const ptr, f32, i32")
    n = 301
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n).astype(np.float16)
    y = np.append(rng.standard_normal(n), 0.25).astype(np.float16)
    q = rng.standard_normal(n + 3).astype(np.float32)
    px, py, pq = _device(x), _device(y), _device(q)
    s = srt.Stream(any_dev)
    s.launch(k, py, px, pq, 0.75, n, grid=3, block=128)
    got = _host(py, n + 1, np.float16)
    want = (np.float16(0.75) * x + y[:n]).astype(np.float16)  # numpy float16 rounds per operation
    want = want + q[:n].astype(np.float16)
    assert np.array_equal(got[:n], want)
    assert got[n] == np.float16(1.75)
    for p in (px, py, pq):
        srt.free(p)


@needs_nvrtc
def test_half_source_compiles_with_nvrtc_for_sm_80_and_sm_90():
    from streamrt.backends.cuda.nvrtc import toolkit_include

    if toolkit_include() is None:
        pytest.skip("no CUDA headers (cuda_fp16.h) on this machine: set CUDA_PATH")
    k = srt.cuda_kernel(HALF, "hfma", signature="ptr, const ptr, const ptr, f32, i32")
    for arch in ("sm_80", "sm_90"):
        k.compile(arch)


# block-wide votes, bit tricks, rounding conversions and read-only loads (CUDA's intrinsics)
INTRINSICS = r"""
extern "C" __global__ void intrinsics(int* out, const float* x, int n) {
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  const float v = i < n ? __ldg(&x[i]) : 0.0f;
  const int positives = __syncthreads_count(v > 0.0f);
  const int all_small = __syncthreads_and(fabsf(v) < 100.0f);
  const int any_big = __syncthreads_or(v > 2.5f);
  if (i < n) {
    int* o = out + 8 * i;
    o[0] = positives; o[1] = all_small; o[2] = any_big;
    o[3] = __float2int_rn(v * 10.0f); o[4] = __float2int_rd(v * 10.0f);
    o[5] = (int)__brev((unsigned)i); o[6] = (int)__umulhi(0x80000000u, (unsigned)i * 6u);
    o[7] = __mul24(i - 100, 3);
  }
}
"""


@needs_gxx
@pytest.mark.parametrize("order", ["forward", "reverse", "random:5"])
def test_block_votes_and_intrinsics(dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    k = srt.cuda_kernel(INTRINSICS, "intrinsics", signature="ptr, const ptr, i32")
    n, block = 200, 64
    x = np.random.default_rng(11).standard_normal(n).astype(np.float32) * 1.5
    px, po = _device(x), srt.malloc(8 * 4 * n)
    srt.Stream(dev).launch(k, po, px, n, grid=(n + block - 1) // block, block=block)
    got = _host(po, 8 * n, np.int32).reshape(n, 8)
    i = np.arange(n)
    xs = np.append(x, np.zeros(-n % block, np.float32)).reshape(-1, block)  # the padded blocks
    per_block = lambda a: np.repeat(a, block)[:n]  # noqa: E731
    assert np.array_equal(got[:, 0], per_block((xs > 0).sum(1)))
    assert np.array_equal(got[:, 1], np.ones(n))
    assert np.array_equal(got[:, 2], per_block((xs > 2.5).any(1)))
    assert np.array_equal(got[:, 3], np.rint(x * np.float32(10)).astype(np.int32))
    assert np.array_equal(got[:, 4], np.floor(x * np.float32(10)).astype(np.int32))
    rev = [int(f"{v:032b}"[::-1], 2) for v in range(n)]
    assert np.array_equal(got[:, 5], np.array(rev, np.uint32).view(np.int32))
    assert np.array_equal(got[:, 6], (i * 6 * 0x80000000) >> 32)
    assert np.array_equal(got[:, 7], (i - 100) * 3)
    for p in (px, po):
        srt.free(p)


@needs_gxx
def test_a_kernel_g_plus_plus_cannot_compile_fails_with_its_line(dev, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMRT_EMU_CACHE", str(tmp_path))
    src = VADD.replace("a[i] + b[i]", "a[i] + undefined_thing(i)")
    k = srt.cuda_kernel(src, "vadd", signature="ptr, const ptr, const ptr, i32")
    p = srt.malloc(64)
    s = srt.Stream(dev)
    s.launch(k, p, p, p, 4, block=4)
    with pytest.raises(srt.LaunchError, match="raised KernelCompileError") as info:
        s.synchronize()
    err = info.value.__cause__
    assert isinstance(err, srt.CompileError)
    assert "line 4: if (i < n) out[i] = a[i] + undefined_thing(i);" in str(err)
    assert "vadd(4): error:" in err.log and "undefined_thing" in err.log
    s.launch(vadd, p, p, p, 4, block=4)  # the stream goes on: the next kernel runs
    s.synchronize()
    srt.free(p)
