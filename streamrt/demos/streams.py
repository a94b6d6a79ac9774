"""Demo section: a two-stream pipeline joined by events."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..device import Device
from ..kernel import kernel
from ..stream import Event, Stream
from . import check, table


# -- streams and events -----------------------------------------------------------------------
@kernel
def _fill(ctx, ptr, n, value, log):
    ctx.array(ptr, (n,), np.float32)[:] = value
    log.append((ctx.stream.name, "fill", threading.current_thread().name))


@kernel
def _square(ctx, src, dst, n, log):
    x = ctx.array(src, (n,), np.float32, readonly=True)
    np.multiply(x, x, out=ctx.array(dst, (n,), np.float32))
    log.append((ctx.stream.name, "square", threading.current_thread().name))


@kernel
def _accumulate(ctx, src, dst, n, log):
    dst_view = ctx.array(dst, (n,), np.float32)
    dst_view += ctx.array(src, (n,), np.float32, readonly=True)
    log.append((ctx.stream.name, "accumulate", threading.current_thread().name))


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
        s1.launch(_fill, a, n, float(step + 1), log, grid=n // 256, block=256)
        filled = s1.record()
        s2.wait(filled)  # s2's square must see s1's fill
        s2.launch(_square, a, b, n, log, grid=n // 256, block=256)
        squared = s2.record()
        s1.wait(squared)  # s1 must not refill a before s2 has read it
    s1.launch(_accumulate, b, b, n, log)
    s1.record(stop)
    result = np.empty(n, np.float32)
    s1.memcpy(result, b, n * 4)  # into a pageable buffer: returns when the data is there
    s1.synchronize()
    table([(i, *row) for i, row in enumerate(log)], ("#", "stream", "kernel", "worker thread"), out)
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
