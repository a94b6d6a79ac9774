"""Steady-state ``s.malloc(n)`` + ``s.free(p)`` pair vs ``np.empty(n, np.uint8)`` of the same size.

One non-blocking stream allocates from a dedicated ``srt.MemPool`` whose release threshold is
high enough that no synchronize ever hands memory back to the device, so after a warm-up the
pool never grows and every pair but the first of a repetition is served by step 1 of DESIGN.md §3
(a block freed on the same stream). The peer creates and drops ``np.empty(n, np.uint8)`` in the
same Python loop, so both sides pay the same loop overhead and both include the release. Each
figure is the best of several repetitions in one process; the stream is synchronized between
repetitions (not inside a timed run) so its pending-free bookkeeping starts each repetition empty.

Target (DESIGN.md §6): <= 10x ``np.empty``. The pass criterion is the *worst* ratio over the
sizes measured (every size must meet the target); the geometric mean is reported for
information.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
from _common import best_us, fmt_size

import streamrt as srt

SIZES = (512, 64 << 10, 1 << 20)
TARGET = 10.0
NEVER_RELEASE = 1 << 50  # release threshold: steady state never returns memory to the device


def run(n: int = 50000, repeat: int = 7, sizes: tuple[int, ...] = SIZES,
        quick: bool = False) -> dict:
    """Measure µs per pair for the pool and for ``np.empty`` at each size, with the ratios."""
    if quick:
        n, repeat = 10000, 3
    s = srt.Stream(non_blocking=True)
    pool = srt.MemPool(release_threshold=NEVER_RELEASE)
    u8 = np.uint8
    rows = []
    for size in sizes:

        def ours(k: int, size: int = size) -> None:
            malloc, free = s.malloc, s.free
            for _ in range(k):
                free(malloc(size, pool))

        def peer(k: int, size: int = size) -> None:
            empty = np.empty
            for _ in range(k):
                empty(size, u8)

        ours(1000)  # warm-up: the pool reserves its chunk, the free lists reach steady state
        peer(1000)
        s.synchronize()
        before = pool.stats()
        ours_us = best_us(ours, n, repeat, between=s.synchronize)
        after = pool.stats()
        peer_us = best_us(peer, n, repeat)
        steady = (
            after["grow_count"] == before["grow_count"]
            and after["release_count"] == before["release_count"]
            and after["reserved_mem_current"] == before["reserved_mem_current"]
        )
        rows.append({
            "size": size,
            "ours_us": ours_us,
            "np_empty_us": peer_us,
            "ratio": ours_us / peer_us,
            "steady_state": steady,
        })
    s.synchronize()
    st = pool.stats()
    assert st["used_mem_current"] == 0 and st["live_allocations"] == 0
    pool.destroy()
    ratios = [r["ratio"] for r in rows]
    worst = max(ratios)
    res = {
        "n": n,
        "repeat": repeat,
        "sizes": rows,
        "worst_ratio": worst,
        "geomean_ratio": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
        "target": TARGET,
        "reuse_same_stream": st["reuse_same_stream"],
        "reuse_after_sync": st["reuse_after_sync"],
        "grow_count": st["grow_count"],
        "release_count": st["release_count"],
    }
    res["pass"] = worst <= TARGET and all(r["steady_state"] for r in rows)
    res["rows"] = [
        {"claim": f"pool malloc+free pair, {fmt_size(r['size'])} vs np.empty",
         "ours": r["ours_us"], "peer": r["np_empty_us"], "unit": "us", "ratio": r["ratio"],
         "target": f"<= {TARGET:g}x", "pass": r["ratio"] <= TARGET and r["steady_state"]}
        for r in rows
    ]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=50000, help="pairs per timed repetition")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.n, args.repeat, tuple(args.sizes))
    if args.json:
        print(json.dumps(r))
        return
    print(f"s.malloc + s.free pair vs np.empty (uint8), {args.n} pairs, best of {args.repeat}")
    for row in r["sizes"]:
        note = "" if row["steady_state"] else "   (NOT steady: the pool grew or released)"
        print(
            f"  {fmt_size(row['size']):>8}   pool {row['ours_us']:6.2f} us/pair   "
            f"np.empty {row['np_empty_us']:5.2f} us   ratio {row['ratio']:6.2f}x{note}"
        )
    print(f"  worst ratio {r['worst_ratio']:.2f}x (target <= {TARGET:g}x, pass criterion)   "
          f"geomean {r['geomean_ratio']:.2f}x")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
