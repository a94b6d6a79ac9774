"""The sanitizer's cost: tiny-kernel launches on vs off, flat in live allocations and history.

DESIGN.md §6: sanitizer on <= 5x off for tiny-kernel launches with no host round trip; the
per-launch cost flat (+-30 %) in live allocations and history length. The kernel is the eager
benchmark's (``np.add`` over three 256-float32 ``ctx.array`` views); a batch is N launches on
one non-blocking stream and one synchronize, timed; figures are µs per launch, medians over
rounds in which the contenders take turns (``_common.interleaved``), with the range of the
per-round ratios. Every row counts the sanitizer's findings (a correct program has none): a
finding fails the row whatever its ratio.

- on vs off: the batch with the sanitizer off, and on (``enable("collect")``, a few launches
  to warm up, the batch, ``disable()``). Target <= 5x.
- live allocations: the batch (sanitizer on) with 10 other live ``srt.malloc`` allocations vs
  10,000, one of them 64 MiB. The cpu backend hands out addresses in increasing order: the
  9,999 small ones are made just before the kernel's buffers, so they lie within 64 MiB below
  them (a checker that scans every allocation within the largest one's size below an address
  meets them all); the 64 MiB one is made first (below everything) in one row, last (above the
  kernel's buffers) in the other. Each batch makes its set and the kernel's buffers with the
  sanitizer off, turns it on (it starts from the live allocations: no history of earlier
  rounds), launches, turns it off and frees the set, so the 10-allocation figure carries no
  leftover of the 10,000 (freed generations, the largest size seen). Target 0.7-1.3x.
- history: 16,384 reads of a buffer X (tiny read-only kernels) on a second stream b that the
  host never synchronizes, queries or waits on with the runtime, so the checker can prove none
  of them complete; a host function at the end of b sets a ``threading.Event`` the host waits
  for, so b's work (and its own checks) is not running during the timed batch, and the checker
  does not count that as a proof. Then the batch on stream a, whose kernel also reads X (reads
  do not race with reads: no finding), vs the same batch reading a buffer with no history.
  Before each batch over X, b reads X again as many times as the batch and its warm-up launch
  (a checker that caps what it remembers drops the oldest accesses as a's arrive); the row's
  ``remembered`` is the fewest accesses of X the checker held before a batch, where its
  internals tell (information). Target 0.7-1.3x.
- the 2-stream pipeline: stream-ordered allocations, kernels over 16K floats, copies and
  events, repeated: information (DESIGN.md §6 sets its target on the tiny-kernel launches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import interleaved, smoke_size

import streamrt as srt

san = srt.sanitizer
N = 16384  # floats per buffer of the pipeline
N_ELEMS = 256  # floats per buffer of the tiny kernels
NBYTES = N_ELEMS * 4
BIG = 64 << 20  # the large live allocation
SMALL = 256  # bytes of each other live allocation
HISTORY = 16384  # unordered reads in the history row
WARM = 20  # launches before a timed batch (untimed)


@srt.kernel
def produce(ctx, p, n, v):
    x = ctx.array(p, (n,), np.float32)
    x[:] = v
    np.sin(x, out=x)


@srt.kernel
def consume(ctx, src, dst, n):
    np.multiply(ctx.array(src, (n,), np.float32, readonly=True), 2.0,
                out=ctx.array(dst, (n,), np.float32))


@srt.kernel
def tiny_add(ctx, a, b, c):  # eager_launch.py's kernel
    np.add(ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
           ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
           out=ctx.array(c, (N_ELEMS,), np.float32))


@srt.kernel
def read_x(ctx, x):
    """A tiny kernel that only reads ``x`` (a read access, remembered by the checker)."""
    ctx.array(x, (N_ELEMS,), np.float32, readonly=True)


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


def batch(s: srt.Stream, args: tuple, n: int) -> float:
    """µs per launch of ``n`` launches of ``tiny_add(*args)`` on ``s`` and one synchronize."""
    launch = s.launch
    t0 = time.perf_counter()
    for _ in range(n):
        launch(tiny_add, *args)
    s.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


class Findings:
    """Findings the sanitizer made while a contender ran, per contender."""

    def __init__(self) -> None:
        self.by: dict[str, int] = {}

    def on(self, name: str, body: Callable[[], float]) -> float:
        """``body()`` with the sanitizer on (collect mode), its new findings counted."""
        before = len(san.report())
        san.enable("collect")
        try:
            return body()
        finally:
            san.disable()
            self.by[name] = self.by.get(name, 0) + len(san.report()) - before

    def total(self, *names: str) -> int:
        return sum(self.by.get(k, 0) for k in names)


def _row(claim: str, ours: list[float], peer: list[float], target: str,
         ok: Callable[[float], bool] | None, findings: int, unit: str = "us/launch",
         **extra: Any) -> dict:
    ratios = [o / p for o, p in zip(ours, peer, strict=True)]
    ratio = statistics.median(ours) / statistics.median(peer)
    return {"claim": claim, "ours": statistics.median(ours), "peer": statistics.median(peer),
            "unit": unit, "ratio": ratio, "target": target,
            "pass": findings == 0 and (ok is None or ok(ratio)),
            "ratio_range": [min(ratios), max(ratios)], "rounds": len(ours),
            "findings": findings, **extra}


def _flat(ratio: float) -> bool:
    return 0.7 <= ratio <= 1.3


def _count(n: int) -> str:
    return f"{n:,}"


def on_vs_off(n: int, rounds: int, found: Findings) -> list[dict]:
    """Row 1: the tiny-kernel batch with the sanitizer on vs off."""
    s = srt.Stream(non_blocking=True)
    bufs = [srt.malloc(NBYTES) for _ in range(3)]
    for p in bufs[:2]:
        srt.write(p, np.ones(N_ELEMS, np.float32))
    args = tuple(bufs)

    def off() -> float:
        batch(s, args, WARM)
        return batch(s, args, n)

    def on() -> float:
        return found.on("launch on", lambda: (batch(s, args, WARM), batch(s, args, n))[1])

    off(), on()  # warm up
    t = interleaved({"on": on, "off": off}, rounds, collect=True)
    assert np.allclose(srt.read(bufs[2], (N_ELEMS,), np.float32), 2.0)
    for p in bufs:
        srt.free(p)
    s.destroy()
    return [_row("sanitizer on vs off, tiny-kernel launches (no host round trip)",
                 t["on"], t["off"], "<= 5x", lambda r: r <= 5.0, found.total("launch on"),
                 n=n)]


def live_allocations(n: int, rounds: int, small: int, found: Findings) -> list[dict]:
    """Rows 2: the batch (sanitizer on) with 10 other live allocations vs ``small`` + 1 (one
    of them 64 MiB, made first or last)."""
    s = srt.Stream(non_blocking=True)
    ones = np.ones(N_ELEMS, np.float32)
    done: list[int] = []

    def with_live(name: str, nsmall: int, big: str | None) -> Callable[[], float]:
        def go() -> float:
            held = [srt.malloc(BIG)] if big == "below" else []
            held += [srt.malloc(SMALL) for _ in range(nsmall)]
            bufs = [srt.malloc(NBYTES) for _ in range(3)]  # above the small ones
            if big == "above":
                held.append(srt.malloc(BIG))
            srt.write(bufs[0], ones)
            srt.write(bufs[1], ones)
            args = tuple(bufs)
            t = found.on(name, lambda: (batch(s, args, WARM), batch(s, args, n))[1])
            done.append(int(np.allclose(srt.read(bufs[2], (N_ELEMS,), np.float32), 2.0)))
            for p in bufs + held:
                srt.free(p)
            return t
        return go

    few = with_live("few", 10, None)
    below = with_live("below", small, "below")
    above = with_live("above", small, "above")
    few()  # warm up
    t = interleaved({"few": few, "below": below, "above": above}, rounds, collect=True)
    assert all(done), "the kernel's result is wrong"
    s.destroy()
    many = _count(small + 1)
    return [
        _row(f"sanitizer per-launch cost, {many} vs 10 live allocations (one of 64 MiB, made "
             "first: below the kernel's buffers)", t["below"], t["few"],
             "0.7-1.3x (flat +-30 %)", _flat, found.total("below", "few"), n=n,
             live=small + 1),
        _row(f"sanitizer per-launch cost, {many} vs 10 live allocations (one of 64 MiB, made "
             "last: above the kernel's buffers)", t["above"], t["few"],
             "0.7-1.3x (flat +-30 %)", _flat, found.total("above", "few"), n=n,
             live=small + 1),
    ]


def _remembered(ptr: int) -> int | None:
    """Accesses of the allocation at ``ptr`` the checker remembers, where it says (information;
    the checker's internals, so None where they differ)."""
    try:
        return len(san._SAN._live[ptr].entries())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a rewritten checker keeps its history otherwise
        return None


def history(n: int, rounds: int, reads: int, found: Findings) -> list[dict]:
    """Row 3: the batch on stream a reading X with ``reads`` unproven reads of X on stream b in
    the history, vs reading a buffer with none. The sanitizer stays on throughout: turning it on
    starts the history afresh, and b must never be synchronized (``srt.free`` synchronizes the
    device, so nothing is freed until the end)."""
    before = len(san.report())
    san.enable("collect")
    a = srt.Stream(non_blocking=True)
    b = srt.Stream(non_blocking=True)
    x_hist, x_none, pb, pc = (srt.malloc(NBYTES) for _ in range(4))
    for p in (x_hist, x_none, pb):
        srt.write(p, np.ones(N_ELEMS, np.float32))
    remembered: list[int | None] = []

    def read_on_b(k: int) -> None:
        """``k`` reads of X on b; then wait for b outside the runtime (no proof)."""
        launch = b.launch
        for _ in range(k):
            launch(read_x, x_hist)
        ran = threading.Event()
        b.launch_host_func(ran.set)
        ran.wait()

    def with_history() -> float:
        read_on_b(n + WARM)
        remembered.append(_remembered(x_hist))
        batch(a, (x_hist, pb, pc), WARM)
        return batch(a, (x_hist, pb, pc), n)

    def without() -> float:
        batch(a, (x_none, pb, pc), WARM)
        return batch(a, (x_none, pb, pc), n)

    try:
        read_on_b(reads)
        without()  # warm up
        t = interleaved({"history": with_history, "none": without}, rounds, collect=True)
        b.synchronize()  # the end: b's reads are proven only now
        assert np.allclose(srt.read(pc, (N_ELEMS,), np.float32), 2.0)
    finally:
        san.disable()
    findings = len(san.report()) - before
    for p in (x_hist, x_none, pb, pc):
        srt.free(p)
    a.destroy()
    b.destroy()
    kept = [r for r in remembered if r is not None]
    return [_row(f"sanitizer per-launch cost, {_count(reads)} unordered reads in history vs "
                 "none", t["history"], t["none"], "0.7-1.3x (flat +-30 %)", _flat, findings,
                 n=n, reads=reads, remembered=min(kept) if kept else None)]


def pipeline(steps: int, rounds: int, found: Findings) -> list[dict]:
    """The 2-stream pipeline off and on (information)."""
    sums: dict[str, float] = {}

    def off() -> float:
        workload(10)
        t0 = time.perf_counter()
        sums["off"] = workload(steps)
        return (time.perf_counter() - t0) / steps * 1e6

    def on() -> float:
        def body() -> float:
            workload(10)
            t0 = time.perf_counter()
            sums["on"] = workload(steps)
            return (time.perf_counter() - t0) / steps * 1e6
        return found.on("pipeline", body)

    t = interleaved({"on": on, "off": off}, rounds, collect=True)
    same = sums["on"] == sums["off"]
    row = _row("sanitizer on vs off, 2-stream pipeline (per step; information: §6's target is "
               "the tiny-kernel launches)", t["on"], t["off"], "info", None,
               found.total("pipeline"), unit="us/step", steps=steps, same_result=same)
    row["pass"] = row["pass"] and same
    return [row]


def run(quick: bool = False) -> dict:
    """µs per launch (per step) off and on in every configuration; ``rows`` for ``streamrt
    bench``."""
    n1, r1, n2, r2, n3, r3, steps, r4 = 5000, 9, 1000, 9, 500, 9, 300, 3
    if quick:
        n1, r1, n2, r2, n3, r3, steps, r4 = 2000, 5, 150, 3, 300, 5, 100, 2
    n1, n2, n3, steps = (smoke_size(k, 20) for k in (n1, n2, n3, steps))
    r1, r2, r3, r4 = (smoke_size(k, 1) for k in (r1, r2, r3, r4))
    small, reads = smoke_size(9999, 20), smoke_size(HISTORY, 50)
    was_on = san.enabled()
    mode = getattr(getattr(san, "_SAN", None), "mode", "raise")
    san.disable()  # findings are counted per contender: earlier ones stay, and count in none
    found = Findings()
    t0 = time.perf_counter()
    try:
        rows = on_vs_off(n1, r1, found)
        rows += live_allocations(n2, r2, small, found)
        rows += history(n3, r3, reads, found)
        rows += pipeline(steps, r4, found)
    finally:
        san.disable()
        if was_on:
            san.enable(mode)
    return {"rows": rows, "seconds": time.perf_counter() - t0,
            "findings": sum(r["findings"] for r in rows),
            "pass": all(r["pass"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(quick=args.quick)
    if args.json:
        print(json.dumps(r))
        return
    for row in r["rows"]:
        lo, hi = row["ratio_range"]
        print(f"  {row['claim']}\n    ours {row['ours']:.2f} peer {row['peer']:.2f} {row['unit']}"
              f"  ratio {row['ratio']:.2f}x (rounds {lo:.2f}-{hi:.2f}), target {row['target']},"
              f" findings {row['findings']}: {'PASS' if row['pass'] else 'FAIL'}")
    print(f"  {r['seconds']:.1f} s")


if __name__ == "__main__":
    main()
