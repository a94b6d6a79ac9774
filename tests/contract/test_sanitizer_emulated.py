"""The sanitizer on CUDA C kernels the cpu backend emulates: their global-memory accesses, recorded
by the kernel's sanitizer build, are checked as a Python kernel's views are (stream order, exact
bounds, use after free), an out-of-bounds access stops the kernel with its writes dropped, and
kernels on several streams writing their own parts of one buffer are clean and keep what each
wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import streamrt as srt
from streamrt import emu
from tests.contract.sanitizer_helpers import kinds, streams

pytestmark = pytest.mark.skipif(emu.unavailable() is not None,
                                reason=f"the CUDA C emulator needs g++: {emu.unavailable()}")

HERE = f"{Path(__file__).name}:"

# x[lo + i] = v for i < n (one thread per element); with n one past the end: a stray write
FILL = r"""
extern "C" __global__ void fill(float* x, long long lo, long long n, float v) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) x[lo + i] = v;
}
"""
# out[i] = a[i] + 1 (reads a, writes out), and a block-sum with an atomic, read-only input
INC = r"""
extern "C" __global__ void inc(float* out, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + 1.0f;
}
"""
COUNT = r"""
extern "C" __global__ void count(int* total, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && a[i] > 0.0f) atomicAdd(total, 1);
}
"""
fill = srt.cuda_kernel(FILL, "fill", signature="ptr, i64, i64, f32")
inc = srt.cuda_kernel(INC, "inc", signature="ptr, const ptr, i32")
count = srt.cuda_kernel(COUNT, "count", signature="ptr, const ptr, i32")


def _host(p: int, n: int, dtype=np.float32) -> np.ndarray:
    out = np.empty(n, dtype)
    srt.memcpy(out, p, out.nbytes)
    return out


@pytest.mark.parametrize("mode", ["raise", "collect"])
def test_an_out_of_bounds_write_names_the_kernel_and_its_launch_line(dev, san, mode):
    srt.sanitizer.enable(mode)
    s, = streams(dev, 1)
    p = srt.malloc(4 * 64)
    srt.memset(p, 0, 4 * 64)
    s.launch(fill, p, 0, 65, 3.0, grid=1, block=128)  # BUG: one float past the end
    line = f"{HERE}{_line_of('BUG: one float past the end')}"
    if mode == "raise":
        with pytest.raises(srt.SanitizerError) as info:
            s.synchronize()
        found = info.value.finding
    else:
        s.synchronize()
        found, = san.report()
    assert found.kind == "out-of-bounds" and found.ptr == p + 256 and found.nbytes == 4
    assert "kernel 'fill'" in found.message and line in found.message
    assert "writes 4 B" in found.message and "0 B past its end" in found.message
    s.synchronize()  # reported once
    assert (_host(p, 64) == 0).all()  # the kernel was stopped: none of its writes landed
    srt.free(p)


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if marker in t and "_line_of" not in t)


def test_bounds_are_the_requested_bytes_not_the_rounded_ones(dev, san):
    s, = streams(dev, 1)
    p = srt.malloc(800)  # rounded up to 1024 by the allocator: the slack is not the program's
    s.launch(fill, p, 199, 2, 1.0, grid=1, block=32)  # BUG: float 200 lies in the slack
    s.synchronize()
    found, = san.report()
    assert found.kind == "out-of-bounds" and found.ptr == p + 800
    srt.free(p)


def test_four_streams_writing_their_own_quarters_are_clean(dev, san):
    n = 4096
    p = srt.malloc(4 * n)
    ss = streams(dev, 4)
    for k, s in enumerate(ss):
        s.launch(fill, p, k * n // 4, n // 4, float(k + 1), grid=n // 4 // 128, block=128)
    for s in ss:
        s.synchronize()
    assert san.report() == []
    want = np.repeat(np.arange(1, 5, dtype=np.float32), n // 4)
    assert np.array_equal(_host(p, n), want)  # each kept what it wrote
    srt.free(p)


def test_a_read_unordered_after_a_write_is_a_race(dev, san, gate):
    a, b = streams(dev)
    n = 256
    x, y = srt.malloc(4 * n), srt.malloc(4 * n)
    g = gate(a)
    a.launch(fill, x, 0, n, 5.0, grid=2, block=128)
    b.launch(inc, y, x, n, grid=2, block=128)  # BUG: no wait for a's write of x
    g.open()
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and rep[0].ptr == x
    assert "kernel 'inc'" in rep[0].message and "kernel 'fill'" in rep[0].message
    srt.sanitizer.clear()
    # ordered by an event: clean, and the read saw the write
    a.launch(fill, x, 0, n, 6.0, grid=2, block=128)
    b.wait(a.record())
    b.launch(inc, y, x, n, grid=2, block=128)
    dev.synchronize()
    assert san.report() == []
    assert (_host(y, n) == 7.0).all()
    srt.free(x)
    srt.free(y)


def test_an_access_after_a_free_is_use_after_free(dev, san, gate):
    a, b = streams(dev)
    p = a.malloc(1024)
    a.launch(fill, p, 0, 256, 1.0, grid=2, block=128)
    b.wait(a.record())
    g = gate(b)
    b.launch(inc, p, p, 256, grid=2, block=128)  # still pending behind the gate
    a.free(p)  # BUG: the free is not ordered after b's kernel
    g.open()
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["use-after-free"] and "kernel 'inc'" in rep[0].message
    srt.sanitizer.clear()
    q = srt.malloc(1024)
    srt.free(q)
    b.launch(fill, q, 0, 4, 1.0, grid=1, block=32)  # BUG: freed and unmapped
    b.synchronize()
    found, = san.report()
    assert found.kind == "use-after-free" and found.ptr == q and HERE in found.message


def test_a_clean_program_is_clean_and_correct(dev, san):
    # reads and writes of several allocations, interior pointers, two streams ordered by events,
    # a graph replay: no finding, and the results the kernels compute
    a, b = streams(dev)
    n = 512
    x, y = srt.malloc(4 * n), srt.malloc(4 * n)
    tot = srt.malloc(4)
    srt.memset(tot, 0, 4)
    a.launch(fill, x, 0, n, 1.0, grid=4, block=128)
    a.launch(fill, x + 4 * 100, 0, 10, -1.0, grid=1, block=32)  # an interior pointer
    b.wait(a.record())
    b.launch(inc, y, x, n, grid=4, block=128)
    b.launch(count, tot, x, n, grid=4, block=128)
    b.begin_capture()
    b.launch(inc, y, y, n, grid=4, block=128)
    ge = b.end_capture().instantiate()
    ge.launch(b)
    ge.launch(b)
    dev.synchronize()
    assert san.report() == []
    want = np.full(n, 4.0, np.float32)
    want[100:110] = 2.0
    assert np.array_equal(_host(y, n), want)
    assert _host(tot, 1, np.int32)[0] == n - 10
    for p in (x, y, tot):
        srt.free(p)


def test_neighbouring_blocks_passed_together_are_told_apart(dev, san):
    # two pool blocks side by side: the end of one is the start of the other, and a pointer
    # to the second must not be taken for the end of the first (no false out-of-bounds)
    s, = streams(dev, 1)
    a, b = s.malloc(1024), s.malloc(1024)
    p, q = min(a, b), max(a, b)
    assert q == p + 1024
    s.launch(fill, p, 0, 256, 2.0, grid=2, block=128)
    s.launch(inc, q, p, 256, grid=2, block=128)
    s.launch(inc, p, q, 256, grid=2, block=128)
    s.synchronize()
    assert san.report() == []
    assert (_host(p, 256) == 4.0).all() and (_host(q, 256) == 3.0).all()
    s.free(p)
    s.free(q)
