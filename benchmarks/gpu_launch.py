"""Eager launch of a tiny CUDA kernel: streamrt ``s.launch`` vs raw ``cuLaunchKernel``, CuPy, PyTorch.

The kernel adds two 256-float32 vectors (grid 1, block 256). Each figure is end-to-end
throughput: N launches on a non-blocking stream, then one synchronize; µs per launch, the best of
several repetitions after a warm-up. Peers:

* raw cuda-bindings: ``driver.cuLaunchKernel`` of the same source (compiled with NVRTC) on a raw
  non-blocking stream, kernelParams given as the ``(values, ctypes types)`` tuple that
  cuda-bindings packs on every call. Target: streamrt <= 1.5x of it.
* raw cuda-bindings with kernelParams pre-packed once (an ``int`` address of a ``void*[]``): the
  floor of a Python launch loop (reported).
* CuPy ``RawKernel`` of the same source, and PyTorch ``torch.add(a, b, out=c)`` (reported).

Needs a cuda device: without one, ``run`` returns ``{"rows": [], "skipped": reason}``.
``STREAMRT_BENCH_SMOKE=1``: a smoke run (a few launches, one repetition) that only checks that the
script works, e.g. on ``tests/cuda/fake``; its figures mean nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from _common import best_us, smoke, smoke_size
from _gpu import (
    N_ELEMS,
    SRC,
    RawTiny,
    attempt,
    check,
    errors,
    finish,
    gpu_skip_reason,
    optional_peer,
    parser,
    quietly,
    report,
    row,
    tiny_add,
)

import streamrt as srt

TARGET_RAW = 1.5
WARMUP = 1000  # launches before timing (a smoke run: a few)


def _ours(n: int, repeat: int) -> float:
    dev = srt.Device("cuda:0")
    s = srt.Stream(dev, non_blocking=True)
    nbytes = N_ELEMS * 4
    ptrs: list[int] = []
    try:
        for _ in range(3):
            ptrs.append(srt.malloc(nbytes, device=dev))
        pa, pb, pc = ptrs
        srt.write(pa, np.ones(N_ELEMS, np.float32))
        srt.write(pb, np.ones(N_ELEMS, np.float32))

        def loop(k: int) -> None:
            launch = s.launch
            for _ in range(k):
                launch(tiny_add, pa, pb, pc, N_ELEMS, grid=1, block=N_ELEMS)
            s.synchronize()

        loop(smoke_size(WARMUP, 5))  # warm-up: module load, argument packing caches
        us = best_us(loop, n, repeat)
        got = srt.read(pc, (N_ELEMS,), np.float32)
        if not np.allclose(got, 2.0):
            raise AssertionError(f"streamrt tiny_add computed {got[:4]}..., expected 2.0")
        return us
    finally:
        for p in ptrs:
            quietly(srt.free, p)
        quietly(s.destroy)


def _raw(n: int, repeat: int) -> dict[str, float]:
    """µs per raw cuLaunchKernel: kernelParams as a tuple ("tuple") and pre-packed ("packed")."""
    from cuda.bindings import driver

    raw = RawTiny()
    try:
        fn, stream = raw.fn, raw.stream

        def loop(k: int, kp: Any) -> None:
            launch = driver.cuLaunchKernel  # inline, as a raw user writes it: no helper call
            for _ in range(k):
                err, = launch(fn, 1, 1, 1, N_ELEMS, 1, 1, 0, stream, kp, 0)
                if err:
                    check((err,))
            raw.synchronize()

        loop(smoke_size(WARMUP, 5), raw.params)
        loop(smoke_size(WARMUP, 5), raw.packed)
        res = {"tuple": best_us(lambda k: loop(k, raw.params), n, repeat),
               "packed": best_us(lambda k: loop(k, raw.packed), n, repeat)}
        got = raw.result()
        if not np.allclose(got, 2.0):
            raise AssertionError(f"raw tiny_add computed {got[:4]}..., expected 2.0")
        return res
    finally:
        raw.close()


def _cupy(cp: Any, n: int, repeat: int) -> float:
    kern = cp.RawKernel(SRC, "tiny_add")
    st = cp.cuda.Stream(non_blocking=True)
    with st:  # filled on st: a non-blocking stream is not ordered after the legacy default stream
        a, b = cp.ones(N_ELEMS, cp.float32), cp.ones(N_ELEMS, cp.float32)
        c = cp.empty(N_ELEMS, cp.float32)
    args = (a, b, c, cp.int32(N_ELEMS))

    def loop(k: int) -> None:
        with st:
            for _ in range(k):
                kern((1,), (N_ELEMS,), args)
        st.synchronize()

    loop(smoke_size(WARMUP, 5))
    us = best_us(loop, n, repeat)
    if not bool(cp.allclose(c, 2.0)):
        raise AssertionError("cupy RawKernel computed a wrong result")
    return us


def _torch(torch: Any, n: int, repeat: int) -> float:
    a = torch.ones(N_ELEMS, dtype=torch.float32, device="cuda")
    b = torch.ones(N_ELEMS, dtype=torch.float32, device="cuda")
    c = torch.empty(N_ELEMS, dtype=torch.float32, device="cuda")
    st = torch.cuda.Stream()  # a pool stream: non-blocking, not ordered after the default stream
    torch.cuda.synchronize()  # the fills of a and b, enqueued on the default stream, are done

    def loop(k: int) -> None:
        add = torch.add
        with torch.cuda.stream(st):
            for _ in range(k):
                add(a, b, out=c)
        st.synchronize()

    loop(smoke_size(WARMUP, 5))
    us = best_us(loop, n, repeat)
    if not bool(torch.allclose(c, torch.full_like(c, 2.0))):
        raise AssertionError("torch.add computed a wrong result")
    return us


def run(n: int = 20000, repeat: int = 5, quick: bool = False) -> dict:
    """µs per launch for streamrt and each peer; ``rows`` as in the other benchmark scripts."""
    reason = gpu_skip_reason()
    if reason is not None:
        return {"rows": [], "skipped": reason}
    if quick:
        n, repeat = min(n, 3000), 3
    if smoke():
        n, repeat = min(n, 20), 1
    ours, ours_err = attempt(lambda: _ours(n, repeat))
    raw, raw_err = attempt(lambda: _raw(n, repeat))
    raw = raw or {}
    res: dict = {"n": n, "repeat": repeat, "ours_us": ours, "raw_us": raw.get("tuple"),
                 "raw_packed_us": raw.get("packed"), "notes": []}
    err = errors(("streamrt", ours_err), ("raw", raw_err))
    rows = [
        row("eager launch, tiny kernel: streamrt vs raw cuLaunchKernel", ours, raw.get("tuple"),
            "us/launch", limit=TARGET_RAW, error=err),
        row("eager launch vs raw cuLaunchKernel, pre-packed kernelParams", ours, raw.get("packed"),
            "us/launch", error=err),
    ]
    for name, fn, claim in (("cupy", _cupy, "eager launch vs CuPy RawKernel"),
                            ("torch", _torch, "eager launch vs torch.add(a, b, out=c)")):
        mod, why = optional_peer(name)
        if mod is None:
            res["notes"].append(f"{name}: {why}; peer skipped")
            continue
        peer, peer_err = attempt(lambda fn=fn, mod=mod: fn(mod, n, repeat))
        res[f"{name}_us"] = peer
        rows.append(row(claim, ours, peer, "us/launch",
                        error=errors(("streamrt", ours_err), (name, peer_err))))
    return finish(res, rows)


def main() -> None:
    """Command line: a readable report, or the result as JSON with ``--json``."""
    ap = parser(__doc__, "fewer launches and repetitions")
    ap.add_argument("-n", type=int, default=20000, help="launches per timed repetition")
    args = ap.parse_args()
    r = run(args.n, quick=args.quick)
    title = "" if "skipped" in r else (
        f"eager launch of a tiny CUDA kernel, {r['n']} launches, best of {r['repeat']}")
    report(r, args.json, title, "us")


if __name__ == "__main__":
    main()
