"""The "binary" of scrub_and_free.py: its kernels, as streamrt kernels (aclrtLaunchKernelV2)."""

import numpy as np

import streamrt as srt


@srt.kernel(signature="ptr, i32")
def scale(ctx, data, n):
    """``data[i] *= 3``."""
    x = ctx.array(data, (n,), np.float32)
    x *= 3.0


@srt.kernel(signature="ptr, i32")
def scrub(ctx, data, n):
    """``data[i] = 0``: a buffer wiped before it is given back."""
    ctx.array(data, (n,), np.float32)[:] = 0
