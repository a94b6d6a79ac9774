"""Steady-state stream-ordered ``s.malloc`` + ``s.free`` pair on a CUDA stream vs raw CUDA and CuPy.

One non-blocking stream allocates and frees the same size in a Python loop; µs per pair, the
best of several repetitions, at 512 B, 64 KiB and 1 MiB. After a warm-up every allocation is
served by the block the previous free returned on the same stream, so the pool neither grows nor
shrinks: no stream is synchronized inside or between timed repetitions (a synchronize could hand
the memory back to the device when the release threshold is 0, CUDA's default). Peers:

* raw cuda-bindings: ``cudaMallocFromPoolAsync`` on the device's default pool +
  ``cudaFreeAsync`` on a raw non-blocking stream;
* CuPy: ``cupy.cuda.MemoryAsyncPool`` (cudaMallocAsync on the current device pool) and CuPy's
  default ``MemoryPool`` (its own caching allocator), each freeing by dropping the pointer.

The issue asks for the figures and ratios only, so every row is reported (target "info").
Needs a cuda device: without one, ``run`` returns ``{"rows": [], "skipped": reason}``.
``STREAMRT_BENCH_SMOKE=1``: a smoke run (a few pairs, one repetition) that only checks that the
script works, e.g. on ``tests/cuda/fake``; its figures mean nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _common import best_us, fmt_size, smoke, smoke_size
from _gpu import (
    attempt,
    check,
    errors,
    finish,
    gpu_skip_reason,
    optional_peer,
    parser,
    quietly,
    raw_context,
    report,
    row,
)

import streamrt as srt

SIZES = (512, 64 << 10, 1 << 20)


def _time(loop: Callable[[int], None], n: int, repeat: int) -> float:
    loop(smoke_size(1000, 5))  # warm-up: the pool reserves its memory, free lists reach steady state
    return best_us(loop, n, repeat)


def _ours(sizes: tuple[int, ...], n: int, repeat: int) -> dict[int, float | str]:
    """µs per pair per size, or the error string of a size that failed."""
    s = srt.Stream(srt.Device("cuda:0"), non_blocking=True)
    out: dict[int, float | str] = {}
    try:
        for size in sizes:

            def loop(k: int, size: int = size) -> None:
                malloc, free = s.malloc, s.free
                for _ in range(k):
                    free(malloc(size))

            us, err = attempt(lambda loop=loop: _time(loop, n, repeat))
            out[size] = us if err is None else err
        s.synchronize()
    finally:
        quietly(s.destroy)
    return out


def _raw(sizes: tuple[int, ...], n: int, repeat: int) -> dict[int, float | str]:
    from cuda.bindings import runtime as rt

    raw_context()
    pool = check(rt.cudaDeviceGetDefaultMemPool(0))
    stream = check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    out: dict[int, float | str] = {}
    try:
        for size in sizes:

            def loop(k: int, size: int = size) -> None:
                malloc, free = rt.cudaMallocFromPoolAsync, rt.cudaFreeAsync
                for _ in range(k):
                    err, p = malloc(size, pool, stream)
                    if err:
                        check((err,))
                    err, = free(p, stream)
                    if err:
                        check((err,))

            us, err = attempt(lambda loop=loop: _time(loop, n, repeat))
            out[size] = us if err is None else err
        check(rt.cudaStreamSynchronize(stream))
    finally:
        quietly(rt.cudaStreamDestroy, stream)
    return out


def _cupy(cp: Any, make_pool: Callable[[], Any], sizes: tuple[int, ...], n: int,
          repeat: int) -> dict[int, float | str]:
    pool = make_pool()
    st = cp.cuda.Stream(non_blocking=True)
    out: dict[int, float | str] = {}
    with st:  # CuPy allocates and frees on the current stream
        for size in sizes:

            def loop(k: int, size: int = size) -> None:
                malloc = pool.malloc
                for _ in range(k):
                    malloc(size)  # the MemoryPointer dies at once: that is CuPy's free

            us, err = attempt(lambda loop=loop: _time(loop, n, repeat))
            out[size] = us if err is None else err
    st.synchronize()
    return out


def _split(v: float | str | None) -> tuple[float | None, str | None]:
    return (v, None) if v is None or isinstance(v, float) else (None, v)


def run(n: int = 20000, repeat: int = 5, sizes: tuple[int, ...] = SIZES, quick: bool = False) -> dict:
    """µs per malloc+free pair for streamrt and each peer at each size; ``rows``."""
    reason = gpu_skip_reason()
    if reason is not None:
        return {"rows": [], "skipped": reason}
    if quick:
        n, repeat = min(n, 3000), 3
    if smoke():
        n, repeat = min(n, 20), 1
    res: dict = {"n": n, "repeat": repeat, "notes": [], "sizes": {}}
    ours, ours_err = attempt(lambda: _ours(sizes, n, repeat))
    peers: dict[str, tuple[str, dict | None, str | None]] = {}
    raw, raw_err = attempt(lambda: _raw(sizes, n, repeat))
    peers["raw"] = ("raw cudaMallocFromPoolAsync + cudaFreeAsync", raw, raw_err)
    cp, why = optional_peer("cupy")
    if cp is None:
        res["notes"].append(f"cupy: {why}; CuPy peers skipped")
    else:
        for key, label, make in (
            ("cupy_async", "CuPy MemoryAsyncPool", lambda: cp.cuda.MemoryAsyncPool()),
            ("cupy_default", "CuPy default MemoryPool", cp.get_default_memory_pool),
        ):
            got, err = attempt(lambda make=make: _cupy(cp, make, sizes, n, repeat))
            peers[key] = (label, got, err)
    rows = []
    for size in sizes:
        o, o_err = _split(ours.get(size) if ours else None)
        o_err = o_err or ours_err
        res["sizes"][size] = {"ours_us": o}
        for key, (label, got, err) in peers.items():
            p, p_err = _split(got.get(size) if got else None)
            res["sizes"][size][f"{key}_us"] = p
            rows.append(row(f"stream-ordered malloc+free pair, {fmt_size(size)}: streamrt vs {label}",
                            o, p, "us/pair", error=errors(("streamrt", o_err), (key, p_err or err))))
    return finish(res, rows)


def main() -> None:
    """Command line: a readable report, or the result as JSON with ``--json``."""
    ap = parser(__doc__, "fewer pairs and repetitions")
    ap.add_argument("-n", type=int, default=20000, help="pairs per timed repetition")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes")
    args = ap.parse_args()
    r = run(args.n, sizes=tuple(args.sizes), quick=args.quick)
    title = "" if "skipped" in r else (
        f"stream-ordered malloc + free pair on a CUDA stream, {r['n']} pairs, best of {r['repeat']}")
    report(r, args.json, title, "us")


if __name__ == "__main__":
    main()
