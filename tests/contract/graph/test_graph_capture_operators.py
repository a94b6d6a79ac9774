"""Operators captured with their executors: ``ops.run`` in a capture records its plan, workspace and
kernels, and the graph owns the executor until the last graph holding it is released."""

from __future__ import annotations

import streamrt as srt


def test_graph_capture_operators_and_executor_lifetime(dev):
    import gc

    import numpy as np

    from streamrt import ops

    s = srt.Stream(dev, non_blocking=True)
    x = srt.Tensor.from_numpy(np.arange(64, dtype=np.float32).reshape(8, 8), stream=s)
    y = srt.Tensor.empty((8, 8), np.float32, stream=s)
    s.synchronize()
    gc.collect()  # an earlier test's graph in a reference cycle must not count in the baseline
    live = ops.stats()["live_executors"]
    with srt.graph_capture(s, mode=srt.CaptureMode.THREAD_LOCAL) as cap:
        ops.run(ops.softmax, x, y, stream=s)  # plan, workspace malloc, kernels, free: captured
    g = cap.graph
    types = [n.type for n in g.nodes()]
    assert srt.NodeType.MEM_ALLOC in types and srt.NodeType.MEM_FREE in types
    assert srt.NodeType.KERNEL in types and srt.NodeType.HOST not in types
    assert ops.stats()["live_executors"] == live + 1  # the graph owns the executor
    ge = g.instantiate()
    ref = x.numpy(s)
    e = np.exp(ref - ref.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    for _ in range(3):
        s.memset(y.ptr, 0, y.nbytes)
        ge.launch(s)
        assert np.allclose(y.numpy(s), want, rtol=1e-5)
    assert ops.stats()["live_executors"] == live + 1
    del g, cap, ge
    gc.collect()
    assert ops.stats()["live_executors"] == live  # released with the last graph holding it
    x.free(s)
    y.free(s)
    s.synchronize()
