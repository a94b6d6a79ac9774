"""Instantiate (+ upload) cost, building included: linear in the node count; memory nodes add little.

Each graph is a chain of the tiny kernel with a fan-out/fan-in every 10 nodes. A sample builds
the graph with the collector on (as a user's program runs), then ``g.instantiate()`` and
``ge.upload(stream)`` (the replay plan is compiled there). Targets (DESIGN.md §6): the per-node
cost at 200k nodes is <= 1.3x the cost at 1k; a graph with one MEM_ALLOC/MEM_FREE pair costs
<= 1.3x the same graph without (instantiate + upload: the graph-memory lifetime analysis), and
its instantiate memory (traced peak) <= 1.3x too. Sizes alternate within each round (a slow
spell of the machine hits both sides); each figure is the median over the rounds, the range of
the ratios in the claim. ``--quick`` measures smaller graphs and says so in the claims.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc

import numpy as np
from _common import SMOKE_HELP, smoke_size

import streamrt as srt


@srt.kernel
def tiny(ctx, a, n):
    ctx.array(a, (n,), np.float32)[0] += 1


def build(nodes: int, ptr: int, memory: bool = False) -> srt.Graph:
    """A chain with a small diamond every 10 nodes; ``memory``: inside one MEM_ALLOC/MEM_FREE."""
    g = srt.Graph()
    prev: list = []
    alloc = None
    if memory:
        alloc = g.add_mem_alloc_node(4096)
        prev = [alloc]
    while len(g._nodes) < nodes - (1 if memory else 0):
        if len(g._nodes) % 10 == 0 and prev:
            fan = [g.add_kernel_node(tiny, ptr, 1, deps=prev) for _ in range(3)]
            prev = [g.add_empty_node(deps=fan)]
        else:
            prev = [g.add_kernel_node(tiny, ptr, 1, deps=prev)]
    if alloc is not None:
        g.add_mem_free_node(alloc.ptr, deps=prev)
    return g


def _sample(s: srt.Stream, ptr: int, nodes: int, copies: int, memory: bool = False,
            building: bool = True, phases: list | None = None) -> float:
    """Microseconds per node: build (timed if ``building``), instantiate and upload ``copies``
    graphs of ``nodes`` nodes; ``phases`` gets [build, instantiate, upload] per node."""
    gc.collect()
    spent = [0.0, 0.0, 0.0]
    for _ in range(copies):
        t0 = time.perf_counter()
        g = build(nodes, ptr, memory)
        t1 = time.perf_counter()
        ge = g.instantiate()
        t2 = time.perf_counter()
        ge.upload(s)
        t3 = time.perf_counter()
        for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
            spent[i] += dt
        ge.destroy()
        del g, ge
    per = [x / (nodes * copies) * 1e6 for x in spent]
    if phases is not None:
        phases.append(per)
    return sum(per) if building else per[1] + per[2]


def _traced(s: srt.Stream, ptr: int, nodes: int, memory: bool) -> float:
    """MiB traced at the peak of instantiate + upload (the graph itself excluded)."""
    g = build(nodes, ptr, memory)
    gc.collect()
    tracemalloc.start()
    ge = g.instantiate()
    ge.upload(s)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    ge.destroy()
    return peak / (1 << 20)


def _k(n: int) -> str:
    """``200k``, ``1000``."""
    return f"{n // 1000}k" if n >= 10_000 and n % 1000 == 0 else str(n)


def run(quick: bool = False) -> dict:
    """Per-node costs and ratios; ``rows`` for ``streamrt bench``."""
    small, big, mem_n, rounds = 1000, 200_000, 80_000, 5
    if quick:
        big, mem_n, rounds = 30_000, 20_000, 3
    big, mem_n = smoke_size(big, 200), smoke_size(mem_n, 200)
    small, rounds = smoke_size(small, 100), smoke_size(rounds, 1)
    copies = max(big // small // 2, 2)  # small graphs enough to weigh as much as the big one
    s = srt.Stream(non_blocking=True)
    p = srt.malloc(512)
    t: dict[str, list[float]] = {"small": [], "big": [], "plain": [], "mem": []}
    phases: dict[str, list] = {"small": [], "big": []}
    _sample(s, p, small, 2)  # warm: kernels, contexts, first allocations
    for _ in range(rounds):
        t["small"].append(_sample(s, p, small, copies, phases=phases["small"]))
        t["big"].append(_sample(s, p, big, 1, phases=phases["big"]))
        t["plain"].append(_sample(s, p, mem_n, 1, building=False))
        t["mem"].append(_sample(s, p, mem_n, 1, memory=True, building=False))
    traced = smoke_size(20_000, 200)
    mib = {m: _traced(s, p, traced, m) for m in (False, True)}
    srt.free(p)
    s.destroy()
    med = {k: statistics.median(v) for k, v in t.items()}
    lin = [b / a for a, b in zip(t["small"], t["big"])]
    mem = [b / a for a, b in zip(t["plain"], t["mem"])]
    lin_r, mem_r = statistics.median(lin), statistics.median(mem)
    mib_r = mib[True] / mib[False]
    extra = f" (extrapolated: {_k(big)}, not 200k)" if big != 200_000 else ""
    extra_m = f" (extrapolated: {_k(mem_n)}, not 80k)" if mem_n != 80_000 else ""
    # per phase (build, instantiate, upload), medians: where a size costs more per node
    split = {k: [statistics.median(ph[i] for ph in v) for i in range(3)] for k, v in phases.items()}
    res = {"us_per_node": med, "phases_us_per_node": split, "linear_ratio": lin_r,
           "memory_ratio": mem_r,
           "traced_mib": mib, "pass": lin_r <= 1.3 and mem_r <= 1.3 and mib_r <= 1.3}
    res["rows"] = [
        {"claim": f"build + instantiate + upload, per node: {_k(big)} nodes vs {_k(small)} "
                  f"nodes{extra}, median of {rounds} (range {min(lin):.2f}-{max(lin):.2f}x)",
         "ours": med["big"], "peer": med["small"], "unit": "us/node", "ratio": lin_r,
         "target": "<= 1.3x (linear)", "pass": lin_r <= 1.3},
        {"claim": f"instantiate + upload, {_k(mem_n)} nodes with one MEM_ALLOC/MEM_FREE pair "
                  f"vs without{extra_m}, median of {rounds} (range {min(mem):.2f}-{max(mem):.2f}x)",
         "ours": med["mem"], "peer": med["plain"], "unit": "us/node", "ratio": mem_r,
         "target": "<= 1.3x", "pass": mem_r <= 1.3},
        {"claim": f"instantiate + upload memory (traced peak), {_k(traced)} nodes with one memory "
                  "pair vs without", "ours": mib[True], "peer": mib[False], "unit": "MiB",
         "ratio": mib_r, "target": "<= 1.3x", "pass": mib_r <= 1.3},
    ]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=SMOKE_HELP)
    ap.add_argument("--quick", action="store_true", help="smaller graphs (extrapolated rows)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(quick=args.quick)
    if args.json:
        print(json.dumps(r, default=str))
        return
    for k, (b, i, u) in r["phases_us_per_node"].items():
        print(f"  {k:5s} graphs, us/node: build {b:.2f}, instantiate {i:.2f}, upload {u:.2f}")
    for row in r["rows"]:
        print(f"  {row['claim']}\n    {row['ours']:.3g} vs {row['peer']:.3g} {row['unit']}: "
              f"{row['ratio']:.2f}x (target {row['target']}) {'PASS' if row['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
