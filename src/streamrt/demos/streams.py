"""Demo section: a two-stream pipeline joined by events."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..device import Device
from ..kernel import kernel
from ..stream import Event, Stream
from .report import check, table

# -- streams and events -----------------------------------------------------------------------
# CUDA bodies loop grid-stride, so any launch shape covers all n elements, as the Python bodies do.
FILL_CUDA = r"""extern "C" __global__ void demo_fill(float* ptr, int n, float value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    ptr[i] = value;
}"""

SQUARE_CUDA = r"""extern "C" __global__ void demo_square(const float* src, float* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i] * src[i];
}"""

# no __restrict__: the demo accumulates a buffer into itself (src == dst)
ACCUMULATE_CUDA = r"""extern "C" __global__ void demo_accumulate(const float* src, float* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] += src[i];
}"""


@kernel(name="demo_fill", cuda=FILL_CUDA, signature="ptr, i32, f32")
def _fill(ctx, ptr, n, value):
    ctx.array(ptr, (n,), np.float32)[:] = value


@kernel(name="demo_square", cuda=SQUARE_CUDA, signature="ptr, ptr, i32")
def _square(ctx, src, dst, n):
    x = ctx.array(src, (n,), np.float32, readonly=True)
    np.multiply(x, x, out=ctx.array(dst, (n,), np.float32))


@kernel(name="demo_accumulate", cuda=ACCUMULATE_CUDA, signature="ptr, ptr, i32")
def _accumulate(ctx, src, dst, n):
    dst_view = ctx.array(dst, (n,), np.float32)
    dst_view += ctx.array(src, (n,), np.float32, readonly=True)


def _logged(s: Stream, log: list[tuple], what: str) -> None:
    """Log ``what`` once the kernel just enqueued on ``s`` has run. A host function (not the
    kernel) does it: a GPU kernel cannot append to a Python list; in stream order it runs after
    the kernel and before anything a later event on ``s`` releases."""

    def note() -> None:
        log.append((s.name, what, threading.current_thread().name))

    note.__qualname__ = f"log '{what}'"  # what a trace of the demo calls it
    s.launch_host_func(note)


def demo_streams(dev: Device, out: Callable[[str], None]) -> list[str]:
    """A two-stream pipeline joined by events."""
    out("== streams and events: a pipeline across two streams joined by events ==")
    failures: list[str] = []
    n = 1 << 16
    s1, s2 = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)
    a, b = s1.malloc(n * 4), s1.malloc(n * 4)
    log: list[tuple] = []
    start, stop = Event(dev, timing=True), Event(dev, timing=True)
    s1.record(start)
    for step in range(3):
        s1.launch(_fill, a, n, float(step + 1), grid=n // 256, block=256)
        _logged(s1, log, "fill")
        filled = s1.record()
        s2.wait(filled)  # s2's square must see s1's fill
        s2.launch(_square, a, b, n, grid=n // 256, block=256)
        _logged(s2, log, "square")
        squared = s2.record()
        s1.wait(squared)  # s1 must not refill a before s2 has read it
    s1.launch(_accumulate, b, b, n, grid=n // 256, block=256)
    _logged(s1, log, "accumulate")
    s1.record(stop)
    result = np.empty(n, np.float32)
    s1.memcpy(result, b, n * 4)  # into a pageable buffer: returns when the data is there
    s1.synchronize()
    # cpu: host functions run on the stream's worker thread, where its kernels ran; cuda: kernels
    # run on the GPU and host functions on the backend's one host-function thread
    who = "worker thread" if dev.backend == "cpu" else "host-function thread"
    table([(i, *row) for i, row in enumerate(log)], ("#", "stream", "kernel", who), out)
    out(f"  elapsed between timing events: {start.elapsed_time(stop):.3f} ms")
    check(bool(np.all(result == 18.0)), "result is 2 * 3**2 everywhere (events ordered the streams)",
           failures, out)
    check([r[1] for r in log] == ["fill", "square"] * 3 + ["accumulate"],
           "kernels ran in the order the events impose", failures, out)
    s1.free(a)
    s1.free(b)
    s1.synchronize()
    s1.destroy()
    s2.destroy()
    return failures
