"""Graph replay of a 1000-node chain of the tiny kernel vs the direct numpy loop and eager launches.

The tiny kernel is ``np.add`` over three 256-float32 ``ctx.array`` views (as in eager_launch.py).
Its binder (``@tiny_add.binder``) makes the three views once, when the graph's plan is built, and
returns ``functools.partial(np.add, a, b, out=c)``: what DESIGN.md §6 allows ("instantiate may
precompute views and arguments"), and what a CUDA graph does with a kernel node's arguments.
Replay: ``ge.launch`` of the 1000-node chain, then a synchronize; per-node µs. Peers: the same
``np.add`` called 1000 times in a Python loop (target: replay <= 2x of it) and the same 1000
kernels launched eagerly on a stream. Also reported: the same replay of a kernel without a
binder, whose body (three ``ctx.array`` calls and ``np.add``) runs at every replay.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
from _common import best_us

import streamrt as srt

N_ELEMS = 256


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


def run(nodes: int = 1000, launches: int = 10, repeat: int = 5, quick: bool = False) -> dict:
    """Per-node µs of replay, direct loop and eager launches; ``rows`` for ``streamrt bench``."""
    if quick:
        launches, repeat = 4, 3
    s = srt.Stream(non_blocking=True)
    pa, pb, pc = (srt.malloc(N_ELEMS * 4) for _ in range(3))
    execs = []
    for k in (tiny_add, tiny_add_plain):
        g = srt.Graph()
        prev: tuple = ()
        for _ in range(nodes):
            prev = g.add_kernel_node(k, pa, pb, pc, deps=prev)
        execs.append(g.instantiate())
        execs[-1].upload(s)
    ge, ge_plain = execs
    a, b, c = (np.ones(N_ELEMS, np.float32) for _ in range(3))

    def replay(e: srt.GraphExec = ge) -> None:
        for _ in range(launches):
            e.launch(s)
        s.synchronize()

    def direct() -> None:
        add = np.add
        for _ in range(launches * nodes):
            add(a, b, out=c)

    def eager() -> None:
        launch = s.launch
        for _ in range(launches * nodes):
            launch(tiny_add, pa, pb, pc)
        s.synchronize()

    replay()
    replay(ge_plain)
    total = launches * nodes
    res = {
        "replay_us": best_us(lambda _: replay(), total, repeat),
        "replay_plain_us": best_us(lambda _: replay(ge_plain), total, repeat),
        "direct_us": best_us(lambda _: direct(), total, repeat),
        "eager_us": best_us(lambda _: eager(), total, repeat),
    }
    for e in execs:
        e.destroy()
    for p in (pa, pb, pc):
        srt.free(p)
    s.destroy()
    res["dask_us"] = _dask_us(nodes, a, b, c, repeat)
    res["ratio_vs_direct"] = res["replay_us"] / res["direct_us"]
    res["speedup_vs_eager"] = res["eager_us"] / res["replay_us"]
    res["pass"] = res["ratio_vs_direct"] <= 2.0
    res["rows"] = [
        {"claim": f"graph replay, {nodes}-node chain (kernel with binder) vs direct numpy loop",
         "ours": res["replay_us"], "peer": res["direct_us"], "unit": "us/node",
         "ratio": res["ratio_vs_direct"], "target": "<= 2x", "pass": res["pass"]},
        {"claim": "the same replay, kernel without binder (body runs every replay) vs direct",
         "ours": res["replay_plain_us"], "peer": res["direct_us"], "unit": "us/node",
         "ratio": res["replay_plain_us"] / res["direct_us"], "target": "(reported)", "pass": True},
        {"claim": "graph replay vs eager launches (peer/ours)", "ours": res["replay_us"],
         "peer": res["eager_us"], "unit": "us/node", "ratio": res["speedup_vs_eager"],
         "target": "(reported)", "pass": True},
    ]
    if res["dask_us"] is not None:
        res["rows"].append(
            {"claim": "the same chain on Dask's threaded scheduler (peer/ours)",
             "ours": res["replay_us"], "peer": res["dask_us"], "unit": "us/node",
             "ratio": res["dask_us"] / res["replay_us"], "target": "(reported)", "pass": True})
    return res


def _dask_us(nodes: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, repeat: int) -> float | None:
    """Per-node µs of the same chain as a Dask task graph (None when dask is not installed)."""
    try:
        import dask.threaded
    except ImportError:
        print("dask not installed (pip install 'streamrt[bench]'): Dask peer skipped")
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.nodes)
    if args.json:
        print(json.dumps(r))
        return
    print(f"graph replay of a {args.nodes}-node chain of the tiny kernel")
    print(f"  replay            {r['replay_us']:7.3f} us/node (kernel with binder)")
    print(f"  replay, no binder {r['replay_plain_us']:7.3f} us/node")
    print(f"  direct numpy loop {r['direct_us']:7.3f} us/node   ratio {r['ratio_vs_direct']:.2f}x "
          "(target <= 2x)")
    print(f"  eager launches    {r['eager_us']:7.3f} us/node   replay is {r['speedup_vs_eager']:.2f}x "
          "faster")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
