"""The "binary" of the seeds' ACL programs: their kernels as streamrt kernels whose declared
signatures are the layouts of the argument structs the programs pass (aclrtLaunchKernelV2)."""

import numpy as np

import streamrt as srt


@srt.kernel(signature="const ptr, const ptr, ptr")
def add_custom(ctx, input_x, input_y, output_z):
    """Seed 000: ``*output_z = *input_x + *input_y`` on one ``uint64_t`` each."""
    x = ctx.array(input_x, (1,), np.uint64, readonly=True)
    y = ctx.array(input_y, (1,), np.uint64, readonly=True)
    ctx.array(output_z, (1,), np.uint64)[:] = x + y


@srt.kernel(signature="ptr, i32")
def foo(ctx, data, n):
    """Seed 002: ``data[i] = data[i] * 2.0f``."""
    x = ctx.array(data, (n,), np.float32)
    x *= 2.0


@srt.kernel(signature="ptr, i32")
def bar(ctx, data, n):
    """Seed 002: ``data[i] = data[i] + 1.0f``."""
    x = ctx.array(data, (n,), np.float32)
    x += 1.0
