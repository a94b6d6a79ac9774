"""cuda backend kernels: bodies, names and images (CUBIN, or PTX for a GPU NVRTC does not know)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt

pytestmark = pytest.mark.cuda


def test_kernel_named_unlike_its_cuda_function_is_a_clear_error(cuda0):
    # CUDA_ERROR_NOT_FOUND (500) from cuModuleGetFunction: the Python name and the extern "C"
    # name differ, the likeliest first mistake; it names the kernel, and nothing was enqueued
    src = 'extern "C" __global__ void other_name(int* p) { *p = 1; }'

    @srt.kernel(cuda=src, signature="ptr")
    def my_kernel(ctx, p):
        pass

    s = srt.Stream(cuda0, non_blocking=True)
    p = srt.malloc(4, cuda0)
    srt.memset(p, 0, 4)
    with pytest.raises(srt.InvalidValueError, match="my_kernel.*extern") as ei:
        s.launch(my_kernel, p)
    assert ei.value.code == 500
    s.synchronize()
    assert srt.read(p, (1,), np.int32)[0] == 0
    srt.free(p)
