"""Eager launch of a tiny kernel vs a direct numpy loop, a SimpleQueue worker thread, a backlog.

The kernel is ``np.add`` over three 256-float32 ``ctx.array`` views. "Direct" calls the same
``np.add`` on numpy arrays in a Python loop. The floor is the strongest honest peer: a minimal
worker thread taking ``(fn, args)`` from a ``queue.SimpleQueue`` and running the same kernel body
with the same kernel context (so the same views), keeping failures and a completion count as a
stream does. Throughput is end to end: N enqueues, then one synchronize. The backlog row queues
N launches behind a gate (the worker blocked), so the queue holds all N at once, then runs them:
1M at once, or 1k at a time as often; the launches and the run are timed, not the handoffs
between the threads at a gate or a synchronize (a scheduling latency per round, not a cost per
operation). ``ThreadPoolExecutor(1)`` is information only (a Future per call: a weak peer).
Ours and each peer are timed in alternating rounds in one process; figures are medians over
the rounds, with the range of the per-round ratios. The kernel body called in a loop on this
thread (its views, no queue) is information: it splits the gap to direct numpy. Targets
(DESIGN.md §6): <= 4x direct, <= 1.2x the worker floor, flat (<= 1.15x) with a 1M-op backlog.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from _common import interleaved, smoke_size

import streamrt as srt

N_ELEMS = 256


@srt.kernel
def tiny_add(ctx, a, b, c):
    np.add(ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
           ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
           out=ctx.array(c, (N_ELEMS,), np.float32))


class QueueWorker:
    """The floor: one worker thread running ``(fn, args)`` in order from a SimpleQueue."""

    def __init__(self, ctx: srt.KernelContext) -> None:
        self.ctx = ctx
        self.done = 0
        self.errors: list[tuple[int, BaseException]] = []
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._put = self._q.put
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def launch(self, kernel: srt.Kernel, *args: Any) -> None:
        """Enqueue ``kernel`` with the worker's context (as ``s.launch``)."""
        self._put((kernel.fn, (self.ctx,) + args))

    def synchronize(self) -> None:
        """Block until everything enqueued so far ran; raise the first failure."""
        ev = threading.Event()
        self._put((ev.set, ()))
        ev.wait()
        if self.errors:
            raise self.errors.pop(0)[1]

    def close(self) -> None:
        """Stop the worker once it has run everything enqueued."""
        self._put(None)
        self._thread.join()

    def _run(self) -> None:
        get = self._q.get
        done = 0
        while (op := get()) is not None:
            fn, args = op
            try:
                fn(*args)
            except BaseException as exc:  # kept for the next synchronize, as a stream does
                self.errors.append((done + 1, exc))
            done += 1
            self.done = done


def _stamp_after(gate: threading.Event | None, stamps: list[float]) -> None:
    """Host function: wait for ``gate`` (if any), then note the time."""
    if gate is not None:
        gate.wait()
    stamps.append(time.perf_counter())


def _row(claim: str, ours: list[float], peer: list[float], target: str, limit: float | None,
         unit: str = "us/op") -> dict:
    ratios = [o / p for o, p in zip(ours, peer, strict=True)]
    ratio = statistics.median(ours) / statistics.median(peer)
    return {"claim": claim, "ours": statistics.median(ours), "peer": statistics.median(peer),
            "unit": unit, "ratio": ratio, "target": target,
            "pass": True if limit is None else ratio <= limit,
            "ratio_range": [min(ratios), max(ratios)], "rounds": len(ours)}


def run(n: int = 20000, rounds: int = 15, quick: bool = False) -> dict:
    """µs/op for ours and every peer, interleaved; ``rows`` for ``streamrt bench``."""
    backlog = 1_000_000
    if quick:
        n, rounds, backlog = 5000, 7, 200_000
    n, rounds, backlog = smoke_size(n, 50), smoke_size(rounds, 1), smoke_size(backlog, 2000)
    nbytes = N_ELEMS * 4
    s = srt.Stream(non_blocking=True)
    pa, pb, pc, pd = (srt.malloc(nbytes) for _ in range(4))
    srt.write(pa, np.ones(N_ELEMS, np.float32))
    srt.write(pb, np.ones(N_ELEMS, np.float32))
    a, b = np.ones(N_ELEMS, np.float32), np.ones(N_ELEMS, np.float32)
    c = np.empty(N_ELEMS, np.float32)
    worker = QueueWorker(srt.KernelContext(srt.Dim3(1), srt.Dim3(1), s.device, s))
    pool = ThreadPoolExecutor(1)

    def timed(body: Callable[[int], Any], k: int) -> Callable[[], float]:
        def go() -> float:
            t0 = time.perf_counter()
            body(k)
            return (time.perf_counter() - t0) / k * 1e6
        return go

    def ours(k: int) -> None:
        launch = s.launch
        for _ in range(k):
            launch(tiny_add, pa, pb, pc)
        s.synchronize()

    def floor(k: int) -> None:
        launch = worker.launch
        for _ in range(k):
            launch(tiny_add, pa, pb, pd)
        worker.synchronize()

    body, bctx = tiny_add.fn, worker.ctx

    def inline(k: int) -> None:  # the kernel body called here: its views, no queue, no thread
        for _ in range(k):
            body(bctx, pa, pb, pd)

    def direct(k: int) -> None:
        add = np.add
        for _ in range(k):
            add(a, b, out=c)

    def threadpool(k: int) -> None:
        submit, add = pool.submit, np.add
        futs = [submit(add, a, b, out=c) for _ in range(k)]
        futs[-1].result()

    def behind_gate(k: int, batches: int) -> float:
        """µs/op of ``batches`` rounds of ``k`` launches queued behind a gate, then run: the
        launches timed on this thread, the run on the worker (from the gate's opening to the
        last launch's end), so a round's thread handoffs count in neither case."""
        t = 0.0
        for _ in range(batches):
            gate, stamps = threading.Event(), []
            s.launch_host_func(_stamp_after, gate, stamps)
            launch = s.launch
            t0 = time.perf_counter()
            for _ in range(k):
                launch(tiny_add, pa, pb, pc)
            t += time.perf_counter() - t0
            s.launch_host_func(_stamp_after, None, stamps)
            gate.set()
            s.synchronize()
            t += stamps[1] - stamps[0]
        return t / (k * batches) * 1e6

    ours(1000), floor(1000), inline(1000), direct(1000), threadpool(1000)  # warm up
    eager = interleaved({"ours": timed(ours, n), "floor": timed(floor, n),
                         "inline": timed(inline, n), "direct": timed(direct, n),
                         "threadpool": timed(threadpool, n)}, rounds, collect=True)
    small = min(1000, backlog)
    # the same number of launches either way: one backlog of ``backlog``, or many of ``small``
    back = interleaved({"big": lambda: behind_gate(backlog, 1),
                        "small": lambda: behind_gate(small, backlog // small)},
                       3 if quick else 5, collect=True)
    pool.shutdown()
    worker.close()
    assert np.allclose(srt.read(pc, (N_ELEMS,), np.float32), 2.0)
    assert np.allclose(srt.read(pd, (N_ELEMS,), np.float32), 2.0)
    for p in (pa, pb, pc, pd):
        srt.free(p)
    s.destroy()
    big = f"{backlog // 1000}k" if backlog < 1_000_000 else f"{backlog // 1_000_000}M"
    rows = [
        _row("eager launch, tiny kernel vs direct numpy loop", eager["ours"], eager["direct"],
             "<= 4x", 4.0),
        _row("eager launch vs a SimpleQueue worker thread (same kernel body and views)",
             eager["ours"], eager["floor"], "<= 1.2x", 1.2),
        _row(f"eager launch with a {big}-op backlog vs a {small // 1000}k-op backlog"
             + (" (quick: 1M in a full run)" if backlog < 1_000_000 else ""),
             back["big"], back["small"], "<= 1.15x", 1.15),
        _row("eager launch vs its kernel body called in a loop (information: the views are "
             "the body's; the rest is the launch and the worker)", eager["ours"], eager["inline"],
             "info", None),
        _row("eager launch vs ThreadPoolExecutor(1) (information: a Future per call)",
             eager["ours"], eager["threadpool"], "info", None),
    ]
    return {"rows": rows, "n": n, "rounds": rounds, "backlog": backlog,
            "us_per_op": {k: statistics.median(v) for k, v in {**eager, **back}.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.n, quick=args.quick)
    if args.json:
        print(json.dumps(r))
        return
    print(f"eager launch (tiny np.add kernel), {r['n']} ops, {r['rounds']} interleaved rounds")
    for row in r["rows"]:
        lo, hi = row["ratio_range"]
        print(f"  {row['claim']}\n    ours {row['ours']:.3f} peer {row['peer']:.3f} {row['unit']}"
              f"  ratio {row['ratio']:.2f}x (rounds {lo:.2f}-{hi:.2f}), target {row['target']}:"
              f" {'PASS' if row['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
