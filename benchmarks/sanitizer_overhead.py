"""The same multi-stream workload with the sanitizer off and on: target <= 4x slowdown.

The workload is a small pipeline of the kind the sanitizer is for: two streams, stream-ordered
allocations, kernels over 16K-float buffers, copies and events (producer/consumer), repeated.
compute-sanitizer is commonly 10-100x on GPUs; here every kernel view, copy and memset is
checked against vector clocks and per-allocation shadow state.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import streamrt as srt

N = 16384


@srt.kernel
def produce(ctx, p, n, v):
    x = ctx.array(p, (n,), np.float32)
    x[:] = v
    np.sin(x, out=x)


@srt.kernel
def consume(ctx, src, dst, n):
    np.multiply(ctx.array(src, (n,), np.float32, readonly=True), 2.0,
                out=ctx.array(dst, (n,), np.float32))


def workload(steps: int) -> float:
    """Run the pipeline ``steps`` times; returns a checksum."""
    a = srt.Stream(non_blocking=True)
    b = srt.Stream(non_blocking=True)
    out = np.empty(N, np.float32)
    total = 0.0
    for i in range(steps):
        p = a.malloc(N * 4)
        q = a.malloc(N * 4)
        a.launch(produce, p, N, float(i))
        b.wait(a.record())
        b.launch(consume, p, q, N)
        b.memset(p, 0, N * 4)
        a.wait(b.record())
        a.memcpy(out, q, N * 4)
        total += float(out[0])
        a.free(p)
        a.free(q)
    a.synchronize()
    b.synchronize()
    a.destroy()
    b.destroy()
    return total


def run(steps: int = 400, repeat: int = 3, quick: bool = False) -> dict:
    """Seconds for the workload off and on; ``rows`` for ``streamrt bench``."""
    if quick:
        steps, repeat = 100, 2
    times = {}
    sums = {}
    for mode in ("off", "on"):
        if mode == "on":
            srt.sanitizer.clear()
            srt.sanitizer.enable("collect")
        workload(10)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            sums[mode] = workload(steps)
            best = min(best, time.perf_counter() - t0)
        times[mode] = best
        if mode == "on":
            findings = len(srt.sanitizer.report())
            srt.sanitizer.disable()
            srt.sanitizer.clear()
    slowdown = times["on"] / times["off"]
    res = {"off_s": times["off"], "on_s": times["on"], "slowdown": slowdown,
           "findings": findings, "same_result": sums["on"] == sums["off"],
           "pass": slowdown <= 4.0 and findings == 0 and sums["on"] == sums["off"]}
    res["rows"] = [{"claim": "sanitizer on vs off, 2-stream pipeline (per step)",
                    "ours": times["on"] / steps * 1e6, "peer": times["off"] / steps * 1e6,
                    "unit": "us/step", "ratio": slowdown, "target": "<= 4x",
                    "pass": res["pass"]}]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.steps)
    if args.json:
        print(json.dumps(r))
        return
    print(f"  sanitizer off {r['off_s'] * 1e3:8.1f} ms")
    print(f"  sanitizer on  {r['on_s'] * 1e3:8.1f} ms   slowdown {r['slowdown']:.2f}x (target <= 4x), "
          f"findings {r['findings']}")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
