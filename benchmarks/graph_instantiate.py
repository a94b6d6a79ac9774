"""Instantiate time for 1k..100k-node graphs: linear in the node count; 100k nodes < 2 s.

Each graph is a chain of the tiny kernel with a fan-out/fan-in every 10 nodes; the time covers
``g.instantiate()`` plus ``ge.upload(stream)`` (the replay plan is compiled there).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import streamrt as srt


@srt.kernel
def tiny(ctx, a, n):
    ctx.array(a, (n,), np.float32)[0] += 1


def build(nodes: int, ptr: int) -> srt.Graph:
    """A chain with a small diamond every 10 nodes."""
    g = srt.Graph()
    prev: list = []
    while len(g._nodes) < nodes:
        if len(g._nodes) % 10 == 0 and prev:
            fan = [g.add_kernel_node(tiny, ptr, 1, deps=prev) for _ in range(3)]
            prev = [g.add_empty_node(deps=fan)]
        else:
            prev = [g.add_kernel_node(tiny, ptr, 1, deps=prev)]
    return g


def run(sizes: tuple = (1000, 10000, 100000), quick: bool = False) -> dict:
    """Seconds per instantiate for each size; ``rows`` for ``streamrt bench``."""
    if quick:
        sizes = (1000, 10000, 30000)
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(512)
    times = {}
    for n in sizes:
        g = build(n, p)
        t0 = time.perf_counter()
        ge = g.instantiate()
        ge.upload(s)
        times[n] = time.perf_counter() - t0
        ge.destroy()
    srt.free(p)
    s.destroy()
    small, big = sizes[0], sizes[-1]
    per_node_small = times[small] / small
    per_node_big = times[big] / big
    linear = per_node_big <= 2.0 * per_node_small
    extrapolated_100k = per_node_big * 100000
    res = {"seconds": times, "linear": linear, "s_100k": extrapolated_100k,
           "pass": linear and extrapolated_100k < 2.0}
    res["rows"] = [
        {"claim": f"instantiate {big} nodes (per-node vs {small} nodes)", "ours": per_node_big * 1e6,
         "peer": per_node_small * 1e6, "unit": "us/node", "ratio": per_node_big / per_node_small,
         "target": "linear (<= 2x)", "pass": linear},
        {"claim": "instantiate 100k nodes", "ours": extrapolated_100k, "peer": 2.0, "unit": "s",
         "ratio": extrapolated_100k / 2.0, "target": "< 2 s", "pass": extrapolated_100k < 2.0},
    ]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run()
    if args.json:
        print(json.dumps(r, default=str))
        return
    for n, t in r["seconds"].items():
        print(f"  {n:7d} nodes  {t:7.3f} s   {t / n * 1e6:6.2f} us/node")
    print(f"  linear: {r['linear']}; 100k nodes: {r['s_100k']:.2f} s (target < 2 s)")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
