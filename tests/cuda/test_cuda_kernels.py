"""cuda backend kernels: bodies, names and images (CUBIN, or PTX for a GPU NVRTC does not know)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from tests.conftest import cuda_reason
from tests.contract.backend_kernels import ADD_ONE, _dev_f32, add_one, python_only

pytestmark = pytest.mark.cuda


def test_kernel_named_unlike_its_cuda_function_is_a_clear_error(cuda0):
    # CUDA_ERROR_NOT_FOUND (500) from cuModuleGetFunction: the Python name and the extern "C"
    # name differ, the likeliest first mistake; it names the kernel, and nothing was enqueued
    src = 'extern "C" __global__ void other_name(int* p) { *p = 1; }'

    @srt.kernel(cuda=src, signature="ptr")
    def my_kernel(ctx, p):
        ctx.array(p, (1,), np.int32)[0] = 1  # a Python body: the CUDA C is looked up at launch

    s = srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(4, cuda0)
    srt.memset(p, 0, 4)
    with pytest.raises(srt.InvalidValueError, match="my_kernel.*extern") as ei:
        s.launch(my_kernel, p)
    assert ei.value.code == 500
    s.synchronize()
    assert srt.read(p, (1,), np.int32)[0] == 0
    srt.free(p)


def test_stub_kernel_named_unlike_its_cuda_function_is_refused_when_made():
    # with no Python body the CUDA C is the only body: the mismatch is refused at the decorator,
    # before any device is involved
    src = 'extern "C" __global__ void other_name(int* p) { *p = 1; }'
    with pytest.raises(srt.InvalidValueError, match="my_kernel.*function"):
        @srt.kernel(cuda=src, signature="ptr")
        def my_kernel(ctx, p):
            pass


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

    from streamrt.backends.cuda import nvrtc

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
