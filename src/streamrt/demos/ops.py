"""Demo section, seed 001: two-phase operators, workspaces and the executor cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import ops
from ..device import Device
from ..errors import StreamRTError
from ..stream import Stream
from ..tensor import Tensor, TensorDesc
from .report import check, guarded, not_available, table, unsupported

if TYPE_CHECKING:
    from ..tensor import Tensor


# -- two-phase operators (seed 001) ------------------------------------------------------------
def _ws_rows(stream: Stream, out: Callable[[str], None]) -> list[tuple]:
    """One row per (op, shape); an op the backend has no kernel for gets an n/a row and line."""

    rows = []
    for name, shapes, attrs in [
        ("reduce_sum", [(100,), ()], {}), ("reduce_sum", [(100_000,), ()], {}),
        ("softmax", [(8, 64), (8, 64)], {}), ("softmax", [(1024, 64), (1024, 64)], {}),
        ("matmul", [(4, 64), (64, 4), (4, 4)], {}), ("matmul", [(4, 8192), (8192, 4), (4, 4)], {}),
        ("cumsum", [(1000,), (1000,)], {}), ("cumsum", [(100_000,), (100_000,)], {}),
    ]:
        # phase 1 reads metadata only: a pointer that holds no data is enough
        tensors = [Tensor(TensorDesc(sh, np.float32), 4096, device=stream.device) for sh in shapes]
        inputs = " x ".join(str(sh) for sh in shapes[:-1])
        try:
            size, ex = ops.OPS[name].get_workspace_size(*tensors, **attrs)
        except StreamRTError as exc:
            if not unsupported(exc):
                raise
            not_available(f"{name} {inputs}", f"{type(exc).__name__}: {exc}", out)
            rows.append((name, inputs, "n/a", "n/a"))
            continue
        rows.append((name, inputs, ex.impl, size))
        ex.destroy()
    return rows


def demo_ops(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 001: phase 1 (workspace size printed), phase 2, then 1000 ``ops.run`` with a cache."""

    out("== two-phase operators (seed 001): GetWorkspaceSize, workspace, execute ==")
    failures: list[str] = []
    live0 = ops.stats()["live_executors"]
    s = Stream(dev, non_blocking=True)
    x = Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    total = Tensor.empty((3,), np.float32, stream=s)
    with guarded("phase 1 and 2 of reduce_sum", failures, out):
        ws_size, ex = ops.reduce_sum.get_workspace_size(x, total, axis=1)  # phase 1: metadata only
        out(f"  phase 1: reduce_sum (3, 4) axis=1 -> workspace_size {ws_size} bytes, {ex!r}")
        ws = s.malloc(max(ws_size, 1))  # size 0: a minimum unit anyway, as the seed advises
        try:
            ops.reduce_sum(ws, ws_size, ex, s)  # phase 2: enqueue only
        finally:
            s.free(ws)  # stream-ordered: after the kernels
        got = total.numpy(s)
        out(f"  phase 2: enqueued on {s.name}; out = {got.tolist()}")
        check(got.tolist() == [6.0, 22.0, 38.0], "phase 2 computed the row sums", failures, out)
    out("  the workspace size depends on the shape (phase 1 picks the implementation):")
    rows = _ws_rows(s, out)
    table(rows, ("op", "input", "implementation", "workspace bytes"), out)
    pairs = [(a[3], b[3]) for a, b in zip(rows[::2], rows[1::2]) if "n/a" not in (a[3], b[3])]
    if pairs:  # only ops that planned at both sizes can be compared
        check(all(small < large for small, large in pairs),
              "a larger shape asks for a larger workspace", failures, out)
    rng = np.random.default_rng(0)
    a = Tensor.from_numpy(rng.standard_normal((16, 64)).astype(np.float32), stream=s)
    y = Tensor.empty((16, 64), np.float32, stream=s)
    s.synchronize()
    with guarded("ops.run softmax with and without an ExecutorCache", failures, out):
        _demo_cache(s, a, y, failures, out)
    check(ops.stats()["live_executors"] == live0,
           "no executor leaked (one-shot ones released after their work, cache cleared)",
           failures, out)
    for t in (x, total, a, y):
        t.free()
    s.synchronize()
    s.destroy()
    return failures


def _demo_cache(s: Stream, a: Tensor, y: Tensor, failures: list[str],
                out: Callable[[str], None]) -> None:
    """1000 ``ops.run`` of softmax, planning every call, then through an ExecutorCache."""


    results = []
    for label, cache in (("no cache (phase 1 every call)", None),
                         ("ExecutorCache", ops.ExecutorCache())):
        before = ops.stats()["softmax"]
        t0 = time.perf_counter()
        try:
            for _ in range(1000):
                ops.run(ops.softmax, a, y, stream=s, cache=cache)
            host = time.perf_counter() - t0
            s.synchronize()
            after = ops.stats()["softmax"]
        finally:  # even when a call failed: a cached executor left alive would count as a leak
            if cache is not None:
                cache.clear()
        results.append((label, 1000, after["plans"] - before["plans"],
                        after["cache_hits"] - before["cache_hits"], host * 1e3))
    table([(*r[:4], f"{r[4]:.1f}") for r in results],
           ("ops.run softmax (16, 64)", "calls", "plans", "cache hits", "host ms"), out)
    plain, hit = results[0][4], results[1][4]
    out(f"  host time saved by the cache: {plain - hit:.1f} ms over 1000 calls "
        f"({plain / max(hit, 1e-9):.1f}x less)")  # reported, never checked: timings vary
    ref = a.numpy(s)
    e = np.exp(ref - ref.max(1, keepdims=True))
    check(bool(np.allclose(y.numpy(s), e / e.sum(1, keepdims=True), rtol=1e-5)),
           "the cached executor computed softmax right", failures, out)
    check(results[1][2] == 1 and results[1][3] == 999,
           "with the cache: one plan, 999 hits", failures, out)
