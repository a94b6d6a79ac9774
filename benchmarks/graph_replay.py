"""Graph replay and launch on the cpu backend: chains with and without a binder, fork/join, launch.

The tiny kernel is ``np.add`` over three 256-float32 ``ctx.array`` views (as in eager_launch.py).
``tiny_add`` has a binder (``@tiny_add.binder``: the three views made once, when the plan is
built, returning ``functools.partial(np.add, a, b, out=c)``); ``tiny_add_plain`` is the same body
without one, so its three views are made at every replay (the general path). Rows:

- a 1000-node chain of either kernel, ``ge.launch`` + synchronize, per node, vs the same
  ``np.add`` called in a Python loop (targets: <= 2x without a binder, <= 1.5x with one);
  reported beside them, the binder-less replay vs its body called in a loop with one context
  (what the replay itself adds: the rest is the body's three views);
- fork/join layers of width 2, 8 and 64 (``w`` independent nodes after a join node, joined by
  the next), about 1000 nodes of ``tiny_add``, per node, vs the chain of the same kernel
  (target <= 2x): the scheduler's own cost per node, where it shows most;
- a WHILE conditional node whose body is a chain of ``BODY`` (4) tiny kernels and a counter
  kernel (``count_to``: it counts the iterations in device memory and sets the handle to 0 after
  ``nodes // 5`` of them), per executed node, vs the same nodes unrolled in one chain (the
  counter kernel in each iteration, its handle ``None``: it counts and tests, setting nothing),
  kernels with and without binders (target <= 2x): what a loop on the device costs per node
  executed, where it shows most (tiny bodies);
- the fixed cost of a graph launch: a 1-node graph of a kernel that does nothing, launched
  repeatedly then synchronized, vs ``s.launch`` of the same kernel (target <= 1.5x).

Every ratio is a median over rounds that interleave ours and the peer in this process; the
claim gives the range of the ratio over the rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from _common import interleaved, smoke, smoke_size

import streamrt as srt
from streamrt.kernel import KernelContext, dim3

N_ELEMS = 256
WIDTHS = (2, 8, 64)
BODY = 4  # tiny kernels in the WHILE body (and the counter kernel after them)


@srt.kernel
def tiny_add(ctx, a, b, c):
    np.add(ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
           ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
           out=ctx.array(c, (N_ELEMS,), np.float32))


@tiny_add.binder
def _tiny_add_bound(ctx, a, b, c):
    return functools.partial(np.add, ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
                             ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
                             out=ctx.array(c, (N_ELEMS,), np.float32))


@srt.kernel
def tiny_add_plain(ctx, a, b, c):
    np.add(ctx.array(a, (N_ELEMS,), np.float32, readonly=True),
           ctx.array(b, (N_ELEMS,), np.float32, readonly=True),
           out=ctx.array(c, (N_ELEMS,), np.float32))


@srt.kernel
def nop(ctx):
    pass


@srt.kernel
def count_to(ctx, total, n, h):
    """One more iteration (``total`` an int64 in device memory); after every ``n``-th, the
    WHILE loop ends (``h`` its handle; ``None`` in the unrolled chain: it tests, sets nothing)."""
    t = ctx.array(total, (1,), np.int64)
    v = t.item() + 1  # (a Python int: a tiny node, as the others are; np.add of 1 costs 1.8 us)
    t[0] = v
    if v % n == 0 and h is not None:
        ctx.set_condition(h, 0)


@count_to.binder
def _count_to_bound(ctx, total, n, h):
    t = ctx.array(total, (1,), np.int64)

    def step() -> None:
        v = t.item() + 1
        t[0] = v
        if v % n == 0 and h is not None:
            ctx.set_condition(h, 0)
    return step


@srt.kernel
def count_to_plain(ctx, total, n, h):
    t = ctx.array(total, (1,), np.int64)
    v = t.item() + 1
    t[0] = v
    if v % n == 0 and h is not None:
        ctx.set_condition(h, 0)


def chain(k: srt.Kernel, nodes: int, ptrs: tuple) -> srt.Graph:
    """``nodes`` launches of ``k`` one after another."""
    g = srt.Graph()
    prev: tuple = ()
    for _ in range(nodes):
        prev = (g.add_kernel_node(k, *ptrs, deps=prev),)
    return g


def fork_join(k: srt.Kernel, nodes: int, width: int, ptrs: tuple, lanes: list[int]) -> srt.Graph:
    """Layers of ``width`` independent launches of ``k``, each layer joined by one more launch;
    the launches of a layer write lanes of their own (a valid program: no race)."""
    g = srt.Graph()
    join = g.add_kernel_node(k, *ptrs)
    count = 1
    while count + width + 1 <= nodes:
        layer = [g.add_kernel_node(k, ptrs[0], ptrs[1], lanes[i], deps=[join])
                 for i in range(width)]
        join = g.add_kernel_node(k, *ptrs, deps=layer)
        count += width + 1
    return g


def while_loop(k: srt.Kernel, count: srt.Kernel, iters: int, ptrs: tuple,
               total: int) -> srt.Graph:
    """A WHILE node running ``BODY`` launches of ``k`` and ``count`` ``iters`` times a launch."""
    g = srt.Graph()
    h = g.create_conditional_handle(default=1)
    body = g.add_conditional_node(h, srt.ConditionalType.WHILE).bodies[0]
    prev: tuple = ()
    for _ in range(BODY):
        prev = (body.add_kernel_node(k, *ptrs, deps=prev),)
    body.add_kernel_node(count, total, iters, h, deps=prev)
    return g


def unrolled(k: srt.Kernel, count: srt.Kernel, iters: int, ptrs: tuple, total: int) -> srt.Graph:
    """The WHILE node's body ``iters`` times in one chain (the same nodes, in the same order)."""
    g = srt.Graph()
    prev: tuple = ()
    for _ in range(iters):
        for _ in range(BODY):
            prev = (g.add_kernel_node(k, *ptrs, deps=prev),)
        prev = (g.add_kernel_node(count, total, iters, None, deps=prev),)
    return g


def rounds(ours: Callable[[], float], peer: Callable[[], float], n: int) -> tuple[float, float,
                                                                                  list[float]]:
    """Median per-item times of ``ours`` and ``peer`` over ``n`` interleaved rounds, and the
    ratio of each round."""
    got = interleaved({"ours": ours, "peer": peer}, n)
    a, b = got["ours"], got["peer"]
    return statistics.median(a), statistics.median(b), [x / y for x, y in zip(a, b, strict=True)]


def timed(fn: Callable[[], None], items: int) -> Callable[[], float]:
    """A round: µs per item of one call of ``fn``."""
    def one() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) / items * 1e6
    return one


def row(claim: str, ours: float, peer: float, ratios: list[float], target: float,
        tag: str = "") -> dict:
    """A result row: the median ratio, with its range over the rounds in the claim."""
    ratio = statistics.median(ratios)
    return {"claim": f"{claim} [ratio {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} "
                     f"rounds]{tag}",
            "ours": ours, "peer": peer, "unit": "us/node" if "launch" not in claim else "us",
            "ratio": ratio, "target": f"<= {target}x", "pass": ratio <= target}


def run(nodes: int = 1000, launches: int = 10, n_rounds: int = 9, quick: bool = False) -> dict:
    """Per-node µs of replays, direct loops and launches; ``rows`` for ``streamrt bench``."""
    tag = ""
    if quick:
        launches, n_rounds = 4, 5
    nodes = smoke_size(nodes, 50)
    if smoke():
        launches, n_rounds = 1, 1
    if nodes != 1000:
        tag = f" ({nodes} nodes, not 1000: a smoke run)"
    s = srt.Stream(non_blocking=True)
    ptrs = tuple(srt.malloc(N_ELEMS * 4) for _ in range(3))
    lanes = [srt.malloc(N_ELEMS * 4) for _ in range(max(WIDTHS))]
    a, b, c = (np.ones(N_ELEMS, np.float32) for _ in range(3))
    execs: dict[str, srt.GraphExec] = {
        "bound": chain(tiny_add, nodes, ptrs).instantiate(),
        "plain": chain(tiny_add_plain, nodes, ptrs).instantiate(),
    }
    for w in WIDTHS:
        execs[f"fj{w}"] = fork_join(tiny_add, nodes, w, ptrs, lanes).instantiate()
    sizes = {k: len(e._template._nodes) for k, e in execs.items()}

    def replay(e: srt.GraphExec) -> Callable[[], None]:
        def go() -> None:
            for _ in range(launches):
                e.launch(s)
            s.synchronize()
        return go

    def direct() -> None:
        add = np.add
        for _ in range(launches * nodes):
            add(a, b, out=c)

    for e in execs.values():
        e.upload(s)
        replay(e)()  # warm: plans, views, helper threads
    rows = []
    res: dict = {}
    for key, claim, target in (
            ("plain", f"graph replay, {nodes}-node chain, kernel without binder vs direct numpy "
                      "loop", 2.0),
            ("bound", f"graph replay, {nodes}-node chain, kernel with binder vs direct numpy "
                      "loop", 1.5)):
        ours, peer, ratios = rounds(timed(replay(execs[key]), launches * sizes[key]),
                                    timed(direct, launches * nodes), n_rounds)
        res[f"{key}_us"], res["direct_us"] = ours, peer
        rows.append(row(claim, ours, peer, ratios, target, tag))
    # what the replay itself adds to a binder-less body: the same body called in a loop
    ctx = KernelContext(dim3(1), dim3(1, "block"), s.device, s)
    body = tiny_add_plain.fn

    def bodies() -> None:
        for _ in range(launches * nodes):
            body(ctx, *ptrs)

    ours, peer, ratios = rounds(timed(replay(execs["plain"]), launches * sizes["plain"]),
                                timed(bodies, launches * nodes), n_rounds)
    r = row("the same replay without binder vs its kernel body called in a loop (what the "
            "replay adds; the views are the body's own)", ours, peer, ratios, 1.0, tag)
    r.update({"target": "(reported)", "pass": True})
    rows.append(r)
    for w in WIDTHS:
        key = f"fj{w}"
        ours, peer, ratios = rounds(timed(replay(execs[key]), launches * sizes[key]),
                                    timed(replay(execs["bound"]), launches * sizes["bound"]),
                                    n_rounds)
        res[f"{key}_us"] = ours
        rows.append(row(f"graph replay, fork/join layers of width {w} ({sizes[key]} nodes) vs "
                        "the chain, per node (kernel with binder)", ours, peer, ratios, 2.0, tag))
    # a loop on the device: a WHILE body vs the same body unrolled, per node executed
    iters = max(nodes // (BODY + 1), 2)
    total = srt.malloc(8)
    srt.write(total, np.zeros(1, np.int64))
    ran = iters * (BODY + 1)  # nodes a launch of either runs
    loops: dict[str, tuple[srt.GraphExec, srt.GraphExec]] = {
        key: (while_loop(k, cnt, iters, ptrs, total).instantiate(),
              unrolled(k, cnt, iters, ptrs, total).instantiate())
        for key, k, cnt in (("bound", tiny_add, count_to), ("plain", tiny_add_plain, count_to_plain))}
    for key, (w, u) in loops.items():
        w.upload(s)
        u.upload(s)
        before = int(srt.read(total, (1,), np.int64)[0])
        w.launch(s)  # warm, and a check: the loop ran its iterations, no more
        s.synchronize()
        after = int(srt.read(total, (1,), np.int64)[0])
        assert after - before == iters, (key, after - before, iters)
        replay(u)()
    for key, what in (("bound", "with"), ("plain", "without")):
        w, u = loops[key]
        ours, peer, ratios = rounds(timed(replay(w), launches * ran),
                                    timed(replay(u), launches * ran), n_rounds)
        res[f"while_{key}_us"], res[f"unrolled_{key}_us"] = ours, peer
        rows.append(row(f"graph replay, WHILE node, body a chain of {BODY} tiny kernels and a "
                        f"counter kernel, {iters} iterations ({ran} nodes run) vs the same body "
                        f"unrolled {iters} times in one chain, per node run (kernels {what} "
                        "binder)", ours, peer, ratios, 2.0, tag))
    for w, u in loops.values():
        w.destroy()
        u.destroy()
    srt.free(total)
    # fixed cost of a launch: a 1-node graph vs s.launch of the same kernel that does nothing
    one = srt.Graph()
    one.add_kernel_node(nop)
    ge1 = one.instantiate()
    count = smoke_size(20000 if not quick else 5000, 20)

    def graph_launches() -> None:
        launch = ge1.launch
        for _ in range(count):
            launch(s)
        s.synchronize()

    def stream_launches() -> None:
        launch = s.launch
        for _ in range(count):
            launch(nop)
        s.synchronize()

    graph_launches()
    ours, peer, ratios = rounds(timed(graph_launches, count), timed(stream_launches, count),
                                n_rounds)
    res["graph_launch_us"], res["stream_launch_us"] = ours, peer
    rows.append(row("graph launch of a 1-node graph (a kernel doing nothing) vs s.launch of it",
                    ours, peer, ratios, 1.5))
    ge1.destroy()
    for e in execs.values():
        e.destroy()
    for p in (*ptrs, *lanes):
        srt.free(p)
    s.destroy()
    dask_us = None if smoke() else _dask_us(nodes, a, b, c, 3 if quick else 5)
    if dask_us is not None:
        rows.append({"claim": "the same chain on Dask's threaded scheduler (peer/ours)",
                     "ours": res["bound_us"], "peer": dask_us, "unit": "us/node",
                     "ratio": dask_us / res["bound_us"], "target": "(reported)", "pass": True})
    res["rows"] = rows
    res["pass"] = all(r["pass"] for r in rows)
    return res


def _dask_us(nodes: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, repeat: int) -> float | None:
    """Per-node µs of the same chain as a Dask task graph (None when dask is not installed)."""
    try:
        import dask.threaded
    except ImportError:
        print("dask not installed (pip install 'streamrt[bench]'): Dask peer skipped",
              file=sys.stderr)
        return None

    def add(_prev: object = None) -> np.ndarray:
        return np.add(a, b, out=c)

    dsk: dict = {0: (add,)}
    for i in range(1, nodes):
        dsk[i] = (add, i - 1)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dask.threaded.get(dsk, nodes - 1)
        best = min(best, time.perf_counter() - t0)
    return best / nodes * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.nodes, quick=args.quick)
    if args.json:
        print(json.dumps(r))
        return
    for x in r["rows"]:
        print(f"  {x['ratio']:5.2f}x ({x['target']:>7}) {'PASS' if x['pass'] else 'FAIL'}  "
              f"{x['ours']:.3f} vs {x['peer']:.3f} {x['unit']}  {x['claim']}")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
