"""A small typed user program: each capability once, checked by ``mypy --strict`` in ``make test``.

It runs as an example too (``tests`` run every example), so its types and its behaviour are both
checked: a public name whose type mypy cannot see (``Any`` leaking into the program, a missing
``py.typed``) or whose signature changed fails ``make test``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import streamrt as srt
from streamrt import ops

N = 256


@srt.kernel
def scale(ctx: srt.KernelContext, ptr: int, n: int, factor: float) -> None:
    """x *= factor over n float32 elements."""
    x = ctx.array(ptr, (n,), np.float32)
    x *= factor


def pools(s: srt.Stream) -> int:
    """Stream-ordered allocation from a pool with a release threshold."""
    pool = srt.MemPool(s.device, release_threshold=1 << 20)
    ptr: int = s.malloc(N * 4, pool=pool)
    s.memset(ptr, 0, N * 4)
    s.free(ptr)
    s.synchronize()
    used: int = pool.get_attr(srt.MemPoolAttr.USED_MEM_CURRENT)
    stats: dict[str, int] = pool.stats()
    pool.destroy()
    return used + stats["alloc_count"]


def two_phase(s: srt.Stream) -> npt.NDArray[np.float32]:
    """aclnn's two phases: workspace size and executor, then the enqueue."""
    x = srt.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    out = srt.Tensor.empty((3,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    ws = s.malloc(max(ws_size, 1))
    ops.reduce_sum(ws, ws_size, ex, s)
    s.free(ws)
    result: npt.NDArray[np.float32] = out.numpy(s)
    x.free(s)
    out.free(s)
    return result


def graphs(s: srt.Stream, ptr: int) -> None:
    """Capture, instantiate, replay, and an event between two streams."""
    s.begin_capture(srt.CaptureMode.THREAD_LOCAL)
    s.launch(scale, ptr, N, 2.0, grid=1, block=N)
    g: srt.Graph = s.end_capture()
    ge: srt.GraphExec = g.instantiate(upload_stream=s, use_node_priority=False)
    g.destroy()  # the exec keeps working
    for _ in range(3):
        ge.launch(s)
    other = srt.Stream(s.device, non_blocking=True)
    done: srt.Event = s.record()
    other.wait(done)
    other.synchronize()
    ge.destroy()
    with srt.Graph() as built:  # destroyed at the end of the block
        built.add_empty_node()
        built.instantiate().destroy()
    attrs: dict[str, int] = s.device.graph_mem_attrs()
    assert attrs["used_mem_high"] >= attrs["used_mem_current"]


def main() -> None:
    """Run the three capabilities on the default device."""
    dev: srt.Device = srt.Device()
    s = srt.Stream(dev, non_blocking=True)
    print("pools:", pools(s))
    print("two-phase:", two_phase(s).tolist())
    ptr = srt.malloc(N * 4)
    srt.write(ptr, np.ones(N, np.float32))
    graphs(s, ptr)
    back: npt.NDArray[np.float32] = srt.read(ptr, (N,), np.float32)
    assert float(back[0]) == 8.0, back[0]
    srt.free(ptr)
    print("graphs: x =", float(back[0]))


if __name__ == "__main__":
    main()
