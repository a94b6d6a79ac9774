"""The "binary" of seed 000's program: its ``add_custom`` kernel, as a streamrt kernel whose
declared signature is the layout of the seed's ``ArgsInfo`` struct (three pointers)."""

import numpy as np

import streamrt as srt


@srt.kernel(signature="const ptr, const ptr, ptr")
def add_custom(ctx, input_x, input_y, output_z):
    """``*output_z = *input_x + *input_y`` on one ``uint64_t`` each (the seed's allocations)."""
    x = ctx.array(input_x, (1,), np.uint64, readonly=True)
    y = ctx.array(input_y, (1,), np.uint64, readonly=True)
    ctx.array(output_z, (1,), np.uint64)[:] = x + y
