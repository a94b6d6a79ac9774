"""Stream launches on every backend: kernels, their context and array views, launch shapes and limits,
host functions, launch blocking."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt.sync import set_launch_blocking
from tests.conftest import BAD_ACCESS, PY_KERNELS, cpu_only, fill_kernel, no_sanitizer
from tests.contract.backend_kernels import _dev_f32, add_one, coords, every_type, python_only, scale


def test_stream_launch_returns_before_work_runs(s, gate):
    p = s.malloc(64)
    g = gate(s)
    s.launch(fill_kernel, p, 16, 3.0)
    assert not s.query()  # the gate holds the stream: launch returned at once
    g.open()
    s.synchronize()
    assert s.query()
    assert srt.read(p, (16,), np.float32).tolist() == [3.0] * 16
    s.free(p)


def test_stream_kernel_context(s):
    cpu_only(s.device, PY_KERNELS)
    seen = {}

    @srt.kernel
    def probe(ctx, tag):
        seen[tag] = (ctx.grid, ctx.block, ctx.device, ctx.stream)

    s.launch(probe, "a", grid=(4, 2), block=128)
    s.launch(probe, "b")
    s.synchronize()
    assert seen["a"] == ((4, 2, 1), (128, 1, 1), s.device, s)
    assert seen["a"][0].x == 4 and seen["a"][1].y == 1
    assert seen["b"][:2] == ((1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize(("grid", "err"), [
    (0, srt.InvalidValueError), (-1, srt.InvalidValueError), ((1, 2, 3, 4), srt.InvalidTypeError),
    (1.5, srt.InvalidTypeError), ((2, "x"), srt.InvalidTypeError),
])
def test_stream_launch_bad_dims(s, grid, err):
    with pytest.raises(err):
        s.launch(fill_kernel, 0, 0, 0.0, grid=grid)
    with pytest.raises(err):
        s.launch(fill_kernel, 0, 0, 0.0, block=grid)
    assert s._pos == 0  # nothing enqueued


@pytest.mark.parametrize(("grid", "block"), [
    (2**31, 1), ((1, 65536), 1), ((1, 1, 65536), 1), (1, 1025), (1, (1, 1025)), (1, (1, 1, 65)),
    (1, (32, 32, 2)), (1, (16, 16, 8)),
])
def test_stream_launch_past_cuda_limits_is_refused_on_every_backend(s, grid, block):
    # a launch the cpu backend ran would fail on a GPU (cudaErrorInvalidConfiguration)
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        s.launch(fill_kernel, 0, 0, 0.0, grid=grid, block=block)
    g = srt.Graph()
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        g.add_kernel_node(fill_kernel, 0, 0, 0.0, grid=grid, block=block)
    assert s._pos == 0 and g.nodes() == []
    g.add_kernel_node(fill_kernel, 0, 0, 0.0, grid=(2**31 - 1, 65535, 65535), block=(8, 8, 16))
    p = s.malloc(4)
    s.launch(fill_kernel, p, 1, 2.0, block=(8, 8, 16))  # the limits themselves are launches
    s.synchronize()
    assert srt.read(p, (1,), np.float32)[0] == 2.0
    s.free(p)


def test_stream_launch_grid_accepted_before_is_still_checked_as_a_block(s):
    # the normalised-dims cache was shared by grids and blocks: a grid of 2048 cached first let
    # a block of 2048 through (2048 threads: cudaErrorInvalidConfiguration on a GPU)
    p = s.malloc(4)
    s.launch(fill_kernel, p, 1, 1.0, grid=2048)
    s.launch(fill_kernel, p, 1, 1.0, grid=(4096, 2))
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        s.launch(fill_kernel, p, 1, 1.0, block=2048)
    with pytest.raises(srt.InvalidValueError, match="CUDA's limits"):
        srt.Graph().add_kernel_node(fill_kernel, p, 1, 1.0, block=(4096, 2))
    s.synchronize()
    s.free(p)


def test_stream_launch_needs_a_kernel(s):
    with pytest.raises(srt.InvalidTypeError):
        s.launch(lambda ctx: None)
    with pytest.raises(srt.InvalidTypeError):
        srt.kernel(42)


def test_stream_kernel_array_is_bounds_checked(s):
    cpu_only(s.device, PY_KERNELS)
    no_sanitizer(BAD_ACCESS)
    # a kernel view is checked against its allocation when the kernel runs (pool blocks are
    # checked by the sanitizer, which knows their stream-ordered lifetimes)
    p = srt.malloc(100)  # rounded to 512 bytes

    @srt.kernel
    def overrun(ctx, ptr):
        ctx.array(ptr, (1000,), np.float32)[:] = 1.0

    s.launch(overrun, p)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, srt.InvalidAddressError)
    assert "overrun" in str(info.value) and s.name in str(info.value)
    assert srt.read(p, (128,), np.float32).tolist() == [0.0] * 128  # nothing written
    srt.free(p)


def test_stream_kernel_array_readonly_and_interior_pointer(s):
    cpu_only(s.device, PY_KERNELS)
    p = s.malloc(64)
    s.synchronize()  # srt.write copies on the legacy stream: after the stream-ordered malloc
    srt.write(p, np.arange(16, dtype=np.float32))

    @srt.kernel
    def k(ctx, ptr, out):
        view = ctx.array(ptr + 8, (2,), np.float32, readonly=True)  # pointer arithmetic
        out.append(view.copy())
        view[0] = 5.0  # read-only: raises

    got = []
    s.launch(k, p, got)
    with pytest.raises(srt.LaunchError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert got[0].tolist() == [2.0, 3.0]
    assert srt.read(p, (16,), np.float32)[2] == 2.0
    s.free(p)


def test_stream_kernel_array_bad_pointer_types(s):
    cpu_only(s.device, PY_KERNELS)
    no_sanitizer(BAD_ACCESS)
    errors = []

    @srt.kernel
    def k(ctx, ptr):
        try:
            ctx.array(ptr, (1,), np.float32)
        except srt.StreamRTError as e:
            errors.append(type(e))

    for bad in (1.5, None, "0x10", 12345):
        s.launch(k, bad)
    s.synchronize()
    assert errors == [srt.InvalidTypeError] * 3 + [srt.InvalidAddressError]


def test_stream_host_func_args_and_type(s):
    got = []
    s.launch_host_func(got.extend, (1, 2))
    s.synchronize()
    assert got == [1, 2]
    with pytest.raises(srt.InvalidTypeError):
        s.launch_host_func(42)


def test_stream_launch_blocking(s, dev):
    ran = []
    prev = set_launch_blocking(True)
    try:
        s.launch_host_func(ran.append, 1)
        assert ran == [1]  # synchronous: done when the call returns
        p = srt.malloc(16)
        s.launch(fill_kernel, p, 4, 2.0)
        assert s.query()
    finally:
        set_launch_blocking(prev)
    srt.free(p)


def test_stream_launch_blocking_env():
    import os
    import subprocess
    import sys

    code = (
        "import streamrt as srt\nran=[]\ns=srt.Stream(non_blocking=True)\n"
        "s.launch_host_func(ran.append, 1)\nprint(ran)\n"
    )
    env = dict(os.environ, STREAMRT_LAUNCH_BLOCKING="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[1]"


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
