"""Seed 001, ported: aclnn two-phase invocation (GetWorkspaceSize, workspace, execute), then the
same through ops.run, and an InvokeAclnnTwoPhase-style helper that never leaks on error paths."""

from typing import Any

import numpy as np

import streamrt as srt
from streamrt import ops


def invoke_two_phase(op: Any, stream: srt.Stream, *tensors: srt.Tensor, **attrs: Any) -> None:
    """The seed's template: phase 1, workspace from the pool, phase 2, release on every path."""
    ws_size, executor = op.get_workspace_size(*tensors, **attrs)   # aclnnXxxGetWorkspaceSize
    workspace = None
    try:
        # size 0: allocate the minimum unit anyway, as the seed advises
        workspace = stream.malloc(max(ws_size, 1))
        op(workspace, ws_size, executor, stream)                    # aclnnXxx(ws, size, ex, stream)
    except BaseException:
        executor.destroy()                                          # never leak the executor
        raise
    finally:
        if workspace is not None:
            stream.free(workspace)                                  # stream-ordered: after the kernels


def main() -> int:
    stream = srt.Stream(non_blocking=True)
    x_host = np.arange(12, dtype=np.float32).reshape(3, 4)
    # prepare the input on the device BEFORE phase 1 (phase 1 reads metadata only)
    x = srt.Tensor.from_numpy(x_host, stream=stream)                # aclCreateTensor + copy
    out = srt.Tensor.empty((3,), np.float32, stream=stream)
    # phase 1: workspace size and executor from metadata
    ws_size, executor = ops.reduce_sum.get_workspace_size(x, out, axis=1)
    print(f"reduce_sum workspace_size = {ws_size} bytes")           # print it as a baseline
    workspace = stream.malloc(max(ws_size, 1))
    # phase 2: enqueue on the stream with exactly phase 1's size
    ops.reduce_sum(workspace, ws_size, executor, stream)
    stream.free(workspace)
    got = out.numpy(stream)                                         # synchronizes the stream
    print("row sums:", got)

    # the same through ops.run: plan (or cache hit), workspace, execute, free, release
    cache = ops.ExecutorCache()
    y = srt.Tensor.empty((3, 4), np.float32, stream=stream)
    for _ in range(100):
        ops.run(ops.softmax, x, y, stream=stream, cache=cache)
    print("softmax via ops.run:", cache.stats())

    # the helper, including an error path that must not leak
    invoke_two_phase(ops.reduce_sum, stream, x, out, axis=1)
    stream.synchronize()  # one-shot executors are released once their work completes
    live = ops.stats()["live_executors"]
    try:
        invoke_two_phase(ops.reduce_sum, stream, x, out, axis=7)    # bad attr: phase 1 refuses
    except srt.ExecutorError as e:
        print("phase 1 refused:", e.code, e.name)
    other = srt.Stream("cpu:1", non_blocking=True)                  # x and out live on cpu:0
    pool = other.device.mem_pool
    try:  # phase 1 makes an executor and the workspace is allocated: phase 2 refuses the stream
        invoke_two_phase(ops.reduce_sum, other, x, out, axis=1)
    except srt.ExecutorError as e:
        print("phase 2 refused:", e.code, e.name)
    stream.synchronize()
    other.synchronize()
    leaked = ops.stats()["live_executors"] - live
    ws_left = pool.used_mem_current
    print("executors leaked by the error paths:", leaked, "| workspace bytes left:", ws_left)
    cache.clear()
    for t in (x, out, y):
        t.free(stream)
    stream.synchronize()
    return 0 if np.allclose(got, x_host.sum(1)) and leaked == 0 and ws_left == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
