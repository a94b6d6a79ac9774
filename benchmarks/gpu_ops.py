"""``ops.run`` with an executor-cache hit on CUDA tensors vs CuPy doing the same operation.

Two operators: ``reduce_sum`` over axis 1 (CuPy: ``cupy.sum(x, axis=1, out=r)``) and ``add`` of
a row vector broadcast over a matrix (CuPy: ``cupy.add(x, y, out=o)``), each on a tiny (32, 64)
and a large (2048, 1024) float32 tensor. Ours: N ``ops.run(op, ..., stream=s, cache=cache)``
calls after the one planning miss (every timed call is a cache hit: workspace malloc, enqueue,
stream-ordered free), then one synchronize; µs per call, best of several repetitions. CuPy runs
the same N calls on its own non-blocking stream, then synchronizes it. The result of each side
is checked against numpy. The issue gives no target: every row is reported (target "info").

Needs a cuda device: without one, ``run`` returns ``{"rows": [], "skipped": reason}``.
``STREAMRT_BENCH_SMOKE=1``: a smoke run (two calls, one repetition) that only checks that the
script works, e.g. on ``tests/cuda/fake``; its figures mean nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from _common import best_us, smoke
from _gpu import (
    attempt,
    errors,
    finish,
    gpu_skip_reason,
    optional_peer,
    parser,
    quietly,
    report,
    row,
)

import streamrt as srt
from streamrt import ops

SHAPES = {"tiny": (32, 64), "large": (2048, 1024)}


def _data(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape[1]).astype(np.float32))


def _expected(name: str, xh: np.ndarray, yh: np.ndarray) -> np.ndarray:
    return xh.sum(axis=1) if name == "reduce_sum" else xh + yh


def _ours(name: str, shape: tuple[int, int], n: int, repeat: int) -> dict[str, Any]:
    """µs per ``ops.run`` call (cache hit) and the cache's hit count."""
    s = srt.Stream(srt.Device("cuda:0"), non_blocking=True)
    xh, yh = _data(shape)
    tensors: list[Any] = []
    try:
        x = srt.Tensor.from_numpy(xh, stream=s)
        tensors.append(x)
        if name == "reduce_sum":
            out = srt.Tensor.empty((shape[0],), np.float32, stream=s)
            tensors.append(out)
            args, attrs = (x, out), {"axis": 1}
        else:
            y = srt.Tensor.from_numpy(yh, stream=s)
            out = srt.Tensor.empty(shape, np.float32, stream=s)
            tensors += [y, out]
            args, attrs = (x, y, out), {}
        op = ops.OPS[name]
        cache = ops.ExecutorCache()
        run = ops.run

        def loop(k: int) -> None:
            for _ in range(k):
                run(op, *args, stream=s, cache=cache, **attrs)
            s.synchronize()

        loop(2)  # the planning miss, then a hit
        us = best_us(loop, n, repeat)
        got = out.numpy(s)
        if not np.allclose(got, _expected(name, xh, yh), rtol=1e-3, atol=1e-3):
            raise AssertionError(f"streamrt {name} computed a wrong result")
        hits = cache.stats()["hits"]
        cache.clear()
        return {"us": us, "cache_hits": hits}
    finally:
        for t in tensors:
            quietly(t.free, s)
        quietly(s.synchronize)
        quietly(s.destroy)


def _cupy(cp: Any, name: str, shape: tuple[int, int], n: int, repeat: int) -> float:
    xh, yh = _data(shape)
    st = cp.cuda.Stream(non_blocking=True)
    with st:
        x, y = cp.asarray(xh), cp.asarray(yh)
        out = cp.empty((shape[0],) if name == "reduce_sum" else shape, cp.float32)
        if name == "reduce_sum":
            def call() -> None:
                cp.sum(x, axis=1, out=out)
        else:
            def call() -> None:
                cp.add(x, y, out=out)

        def loop(k: int) -> None:
            for _ in range(k):
                call()
            st.synchronize()

        loop(2)  # compiles and caches CuPy's kernels
        us = best_us(loop, n, repeat)
        got = cp.asnumpy(out)
    if not np.allclose(got, _expected(name, xh, yh), rtol=1e-3, atol=1e-3):
        raise AssertionError(f"cupy {name} computed a wrong result")
    return us


def run(n: int = 2000, repeat: int = 5, quick: bool = False) -> dict:
    """µs per call of ``ops.run`` (cache hit) and CuPy for each op and shape; ``rows``."""
    reason = gpu_skip_reason()
    if reason is not None:
        return {"rows": [], "skipped": reason}
    if quick:
        n, repeat = min(n, 300), 3
    if smoke():
        n, repeat = min(n, 2), 1
    cp, why = optional_peer("cupy")
    res: dict = {"n": n, "repeat": repeat, "cases": {}, "notes": []}
    if cp is None:
        res["notes"].append(f"cupy: {why}; CuPy peer skipped (rows have no peer)")
    rows = []
    for name in ("reduce_sum", "add"):
        for label, shape in SHAPES.items():
            k = n if label == "tiny" else max(n // 10, min(n, 20))  # a large call runs ~10x longer
            ours, ours_err = attempt(lambda name=name, shape=shape, k=k: _ours(name, shape, k, repeat))
            ours_us = ours["us"] if ours else None
            peer, peer_err = (None, why) if cp is None else attempt(
                lambda name=name, shape=shape, k=k: _cupy(cp, name, shape, k, repeat))
            res["cases"][f"{name} {label} {shape}"] = {
                "calls": k, "ops_run_us": ours_us, "cupy_us": peer,
                "cache_hits": ours["cache_hits"] if ours else None}
            rows.append(row(f"ops.run {name} {label} {shape} (cache hit) vs CuPy", ours_us, peer,
                            "us/call", error=errors(("streamrt", ours_err), ("cupy", peer_err))))
    return finish(res, rows)


def main() -> None:
    """Command line: a readable report, or the result as JSON with ``--json``."""
    ap = parser(__doc__, "fewer calls and repetitions")
    ap.add_argument("-n", type=int, default=2000, help="calls per timed repetition (tiny shape)")
    args = ap.parse_args()
    r = run(args.n, quick=args.quick)
    title = "" if "skipped" in r else (
        f"ops.run (executor-cache hit) on CUDA tensors vs CuPy, best of {r['repeat']}")
    report(r, args.json, title, "us")


if __name__ == "__main__":
    main()
