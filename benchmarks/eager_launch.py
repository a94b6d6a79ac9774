"""Eager launch throughput of a tiny kernel vs a direct numpy loop and ThreadPoolExecutor(1).

The kernel is ``np.add`` over three 256-float32 ``ctx.array`` views. "Direct" calls the same
``np.add`` on numpy arrays in a Python loop; the thread pool submits the same call to one worker.
End-to-end throughput: N enqueues, then one synchronize. Target (DESIGN.md §6): <= 5x direct and
>= 3x faster than the thread pool.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _common import best_us

import streamrt as srt

N_ELEMS = 256


@srt.kernel
def tiny_add(ctx, a, b, c):
    np.add(ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
           ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
           out=ctx.array(c, (N_ELEMS,), np.float32))


def run(n: int = 20000, repeat: int = 5, quick: bool = False) -> dict:
    """Measure µs/op for ours, direct and the thread pool; ``rows`` for ``streamrt bench``."""
    if quick:
        n, repeat = 5000, 3
    nbytes = N_ELEMS * 4
    s = srt.Stream(non_blocking=True)
    pa, pb, pc = (srt.malloc(nbytes) for _ in range(3))
    srt.write(pa, np.ones(N_ELEMS, np.float32))
    srt.write(pb, np.ones(N_ELEMS, np.float32))
    a = np.ones(N_ELEMS, np.float32)
    b = np.ones(N_ELEMS, np.float32)
    c = np.empty(N_ELEMS, np.float32)

    def ours(k: int) -> None:
        launch = s.launch
        for _ in range(k):
            launch(tiny_add, pa, pb, pc)
        s.synchronize()

    def direct(k: int) -> None:
        add = np.add
        for _ in range(k):
            add(a, b, out=c)

    pool = ThreadPoolExecutor(1)

    def threadpool(k: int) -> None:
        submit = pool.submit
        add = np.add
        futs = [submit(add, a, b, out=c) for _ in range(k)]
        futs[-1].result()

    ours(1000)
    res = {
        "ours_us": best_us(ours, n, repeat),
        "direct_us": best_us(direct, n, repeat),
        "threadpool_us": best_us(threadpool, n, repeat),
    }
    pool.shutdown()
    assert np.allclose(srt.read(pc, (N_ELEMS,), np.float32), 2.0)
    for p in (pa, pb, pc):
        srt.free(p)
    s.destroy()
    res["ratio_vs_direct"] = res["ours_us"] / res["direct_us"]
    res["speedup_vs_threadpool"] = res["threadpool_us"] / res["ours_us"]
    res["pass"] = res["ratio_vs_direct"] <= 5.0 and res["speedup_vs_threadpool"] >= 3.0
    res["rows"] = [
        {"claim": "eager launch, tiny kernel vs direct numpy loop", "ours": res["ours_us"],
         "peer": res["direct_us"], "unit": "us/op", "ratio": res["ratio_vs_direct"],
         "target": "<= 5x", "pass": res["ratio_vs_direct"] <= 5.0},
        {"claim": "eager launch vs ThreadPoolExecutor(1) (peer/ours)", "ours": res["ours_us"],
         "peer": res["threadpool_us"], "unit": "us/op", "ratio": res["speedup_vs_threadpool"],
         "target": ">= 3x faster", "pass": res["speedup_vs_threadpool"] >= 3.0},
    ]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.n)
    if args.json:
        print(json.dumps(r))
        return
    print(f"eager launch (tiny np.add kernel), {args.n} ops")
    print(f"  streamrt stream     {r['ours_us']:7.2f} us/op")
    print(f"  direct numpy loop   {r['direct_us']:7.2f} us/op   "
          f"ratio {r['ratio_vs_direct']:.2f}x (target <= 5x)")
    print(f"  ThreadPoolExecutor  {r['threadpool_us']:7.2f} us/op   "
          f"we are {r['speedup_vs_threadpool']:.2f}x faster (target >= 3x)")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
