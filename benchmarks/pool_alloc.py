"""``s.malloc`` + ``s.free`` pairs vs ``np.empty``, and the cost of growth and of a synchronize
as the pool holds more blocks (DESIGN.md §6).

Every figure is a median over rounds that alternate ours and the peer in one process (the
machine's noise hits both alike); the range over the rounds is printed beside it.

- same size: one non-blocking stream cycles ``malloc(n)`` / ``free`` of one size: after the
  first pair, an exact-size block freed on the stream (the best case: a bin hit);
- mixed sizes, no synchronize: the stream cycles 4 KiB / 64 KiB / 1 MiB, and then a sequence of
  random sizes (log-uniform 512 B - 1 MiB): every pair splits a free block and coalesces it back
  (the general path); the peer is ``np.empty`` of the same sizes in the same loop;
- growth: a malloc that must grow (a 2 MiB request, no free block usable: the frees go to
  another stream and the pool may not reuse them before a synchronize) with 10, 10k and 100k
  live 512 B blocks; the peer is the same at 10 live blocks (target: O(log n), a small factor);
- synchronize above the release threshold: one free and a ``synchronize`` of its stream with
  50k free blocks in the pool (each between two live ones: nothing can be released) vs with 10,
  in pools of as many blocks.

Targets: pairs <= 10x ``np.empty``; growth and synchronize at 100k / 50k blocks <= 2x the
cost at 10.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import fmt_size, interleaved, smoke, smoke_size

import streamrt as srt

SIZES = (512, 64 << 10, 1 << 20)
CYCLE = (4 << 10, 64 << 10, 1 << 20)
TARGET = 10.0  # pairs vs np.empty
SCALE_TARGET = 2.0  # growth / synchronize at many blocks vs at few
NEVER_RELEASE = 1 << 50  # release threshold: a synchronize never returns memory to the device


def _timed(loop: Callable[[int], Any], n: int, before: Callable[[], Any] | None = None
           ) -> Callable[[], float]:
    def run() -> float:
        if before is not None:
            before()
        t0 = time.perf_counter()
        loop(n)
        return (time.perf_counter() - t0) / n * 1e6
    return run


def random_sizes(k: int, seed: int = 0) -> list[int]:
    """``k`` sizes log-uniform from 512 B to 1 MiB."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.exp(rng.uniform(math.log(512), math.log(1 << 20), k))]


def pairs(n: int, rounds: int) -> list[dict]:
    """The pair rows: same size per size, the 4 KiB/64 KiB/1 MiB cycle, random sizes."""
    s = srt.Stream(non_blocking=True)
    pool = srt.MemPool(release_threshold=NEVER_RELEASE)
    u8 = np.uint8
    cases: list[tuple[str, list[int], bool]] = [
        (f"same size {fmt_size(z)} (exact-size bin)", [z], True) for z in SIZES]
    cases.append(("mixed 4 KiB/64 KiB/1 MiB cycle, no synchronize (split + coalesce)",
                  list(CYCLE), False))
    cases.append(("random sizes 512 B-1 MiB, no synchronize (split + coalesce)",
                  random_sizes(64), False))
    rows = []
    for label, seq, sync_first in cases:
        k = len(seq)

        def ours(m: int, seq: list[int] = seq, k: int = k) -> None:
            malloc, free = s.malloc, s.free
            for i in range(m):
                free(malloc(seq[i % k], pool))

        def peer(m: int, seq: list[int] = seq, k: int = k) -> None:
            empty = np.empty
            for i in range(m):
                empty(seq[i % k], u8)

        ours(max(1000, 10 * k))  # warm-up: the pool reserves its chunk
        peer(1000)
        before = pool.stats()
        got = interleaved({"ours": _timed(ours, n, s.synchronize if sync_first else None),
                           "peer": _timed(peer, n)}, rounds)
        after = pool.stats()
        steady = after["grow_count"] == before["grow_count"]
        o, p = statistics.median(got["ours"]), statistics.median(got["peer"])
        ratios = [a / b for a, b in zip(got["ours"], got["peer"])]
        rows.append({"claim": f"pool malloc+free pair, {label} vs np.empty", "ours": o, "peer": p,
                     "unit": "us", "ratio": o / p, "range": (min(ratios), max(ratios)),
                     "target": f"<= {TARGET:g}x", "pass": o / p <= TARGET and steady})
    s.synchronize()
    pool.destroy()
    return rows


def _live_pool(live: int) -> tuple[Any, srt.Stream, srt.Stream, list[int]]:
    """A pool holding ``live`` 512 B blocks, whose frees on the second stream it may not reuse
    on the first before a synchronize (every reuse flag off)."""
    pool = srt.MemPool(release_threshold=NEVER_RELEASE, reuse_follow_event_dependencies=False,
                       reuse_allow_opportunistic=False, reuse_allow_internal_dependencies=False)
    s, t = srt.Stream(non_blocking=True), srt.Stream(non_blocking=True)
    return pool, s, t, [s.malloc(512, pool) for _ in range(live)]


def growth(counts: tuple[int, ...], k: int, rounds: int) -> dict[int, list[float]]:
    """µs per malloc that must grow, per live-block count (interleaved)."""
    pools = {n: _live_pool(n) for n in counts}

    def grow(n: int) -> Callable[[], float]:
        pool, s, t, _ = pools[n]

        def run() -> float:
            t0 = time.perf_counter()
            ptrs = [s.malloc(2 << 20, pool) for _ in range(k)]
            dt = (time.perf_counter() - t0) / k * 1e6
            t.wait(s.record())
            for p in ptrs:
                t.free(p)  # pending on t: the next mallocs on s may not take them
            return dt
        return run

    grown = {n: pools[n][0].stats()["grow_count"] for n in counts}
    got = interleaved({n: grow(n) for n in counts}, rounds)
    for n, (pool, s, t, keep) in pools.items():
        assert pool.stats()["grow_count"] == grown[n] + rounds * k, "a measured malloc did not grow"
        for p in keep:
            s.free(p)
        s.synchronize()
        t.synchronize()
        pool.destroy()
    return got


def sync_cost(counts: tuple[int, ...], k: int, rounds: int) -> dict[int, list[float]]:
    """µs per free + synchronize above the release threshold, per count of free blocks, in pools
    of as many blocks (only how many are free differs); each round builds its pool afresh (a
    synchronize reaches every pool of the process: the pool of the other count must not be
    there)."""
    total = max(counts)

    def one(n: int) -> Callable[[], float]:
        def run() -> float:
            pool = srt.MemPool(release_threshold=0)  # every synchronize checks what to release
            s = srt.Stream(non_blocking=True)
            ptrs = [s.malloc(512, pool) for _ in range(2 * total + 2 * k + 2)]
            for p in ptrs[1:2 * n:2]:
                s.free(p)  # n free blocks, each between two live ones
            s.synchronize()
            spare = ptrs[2 * total + 1::2]
            t0 = time.perf_counter()
            for _ in range(k):
                s.free(spare.pop())
                s.synchronize()
            dt = (time.perf_counter() - t0) / k * 1e6
            assert pool.stats()["release_count"] == 0
            for p in ptrs[0:2 * n:2] + ptrs[2 * n:2 * total + 1] + ptrs[2 * total + 2::2] + spare:
                s.free(p)
            s.synchronize()
            pool.destroy()
            return dt
        return run

    return interleaved({n: one(n) for n in counts}, rounds)


def _scale_row(claim: str, got: dict[int, list[float]], many: int, few: int) -> dict:
    o, p = statistics.median(got[many]), statistics.median(got[few])
    ratios = [a / b for a, b in zip(got[many], got[few])]
    return {"claim": claim, "ours": o, "peer": p, "unit": "us", "ratio": o / p,
            "range": (min(ratios), max(ratios)), "target": f"<= {SCALE_TARGET:g}x",
            "pass": o / p <= SCALE_TARGET}


def run(quick: bool = False, n: int = 20000, rounds: int = 7) -> dict:
    """Every row (see the module docstring)."""
    if quick:
        n, rounds = 5000, 5
    if smoke():
        n, rounds = 50, 1
    big, mid = smoke_size(100_000, 200), smoke_size(10_000, 100)
    rows = pairs(n, rounds)
    g = growth((10, mid, big), smoke_size(20, 2), rounds)
    rows.append(_scale_row(f"pool malloc that must grow, {mid} live blocks vs 10", g, mid, 10))
    rows.append(_scale_row(f"pool malloc that must grow, {big} live blocks vs 10", g, big, 10))
    free_many = smoke_size(50_000, 100)
    sc = sync_cost((10, free_many), smoke_size(20, 2), rounds)
    rows.append(_scale_row(f"free + synchronize above the release threshold, {free_many} free "
                           "blocks vs 10", sc, free_many, 10))
    return {"n": n, "rounds": rounds, "rows": rows, "pass": all(r["pass"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20000, help="pairs per timed round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.quick, args.n, args.rounds)
    if args.json:
        print(json.dumps(r))
        return
    print(f"pool allocation, medians of {r['rounds']} interleaved rounds (ratio range in brackets)")
    for row in r["rows"]:
        lo, hi = row["range"]
        print(f"  {row['claim']}\n    ours {row['ours']:9.2f} us   peer {row['peer']:9.2f} us   "
              f"ratio {row['ratio']:6.2f}x [{lo:.2f}-{hi:.2f}]  target {row['target']}  "
              f"{'ok' if row['pass'] else 'FAIL'}")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
