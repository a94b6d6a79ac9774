"""Kernels of the graph exec tests: scale, log a tag, wait for an event then log."""

from __future__ import annotations

import numpy as np

import streamrt as srt
from tests.conftest import _grid_stride


@srt.kernel(cuda=_grid_stride("scale_kernel", "float* ptr, int n, float factor", "ptr[i] *= factor"),
            signature="ptr, i32, f32")
def scale_kernel(ctx, ptr, n, factor):
    ctx.array(ptr, (n,), np.float32)[:] *= factor


@srt.kernel
def log_kernel(ctx, log, tag):
    log.append(tag)


@srt.kernel
def wait_kernel(ctx, event, log, tag, timeout):
    """Holds until ``event`` is set (or ``timeout`` passes), then logs ``(tag, was_set)``."""
    log.append((tag, event.wait(timeout=timeout)))
