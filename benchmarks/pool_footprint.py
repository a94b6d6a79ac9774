"""Pool footprint: reserved_mem_high over the peak live bytes when replaying allocation traces.

Three traces, generated deterministically (seeded numpy RNG) and replayed with ``s.malloc`` /
``s.free`` against a fresh default-configured ``srt.MemPool`` (release threshold 0):

- ``mixed``: a synthetic mixed-size trace on one non-blocking stream. Sizes are log-uniform from
  512 B to 4 MiB; the live set random-walks around a target count; 80% of frees release the most
  recent live allocation (LIFO), the rest a uniformly random live one, so long-lived blocks pin
  holes in the chunks.
- ``streams``: the same kind of trace over 4 non-blocking streams (each with its own live set,
  the streams drawn at random step by step), 20% of the frees made on another stream than the
  owner's (after an event wait, as a correct program must), and a host synchronize of every
  stream every 400 operations.
- ``transformer``: a decoder-only inference run (prefill, then decode steps). Per layer: layer
  norm, fused QKV, attention scores and probabilities (batch*heads*seq*ctx*4 bytes), attention
  output and projection, residual adds, an MLP with a 4*hidden intermediate; a key and a value
  cache per layer that grow every step by allocate-new-then-free-old (``torch.cat``-style); the
  logits of the last position; a host synchronize after every step (the sampled token is read).

The limit is the trace's true peak live bytes (the largest sum of requested sizes live at once,
computed from the trace itself). Targets (DESIGN.md §6): reserved_high <= 1.15x peak live on one
stream, <= 1.25x on 4 streams, seed 0. Also reported, for information: the same traces drawn
with seeds 1-4 (the figure depends on the draw), and reserved_high / used_high.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import numpy as np

import streamrt as srt

OTHER_SEEDS = range(5)  # reported beside the benchmark's seed, not judged
ALLOC, FREE, SYNC = 0, 1, 2
MiB = 1 << 20


def mixed_trace(
    n_allocs: int = 20000,
    *,
    seed: int = 0,
    lo: int = 512,
    hi: int = 4 * MiB,
    target_live: int = 48,
    lifo: float = 0.8,
) -> list[tuple]:
    """The synthetic mixed-size, mostly-LIFO trace."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(math.log(lo), math.log(hi), n_allocs)).astype(np.int64)
    coins = rng.random(4 * n_allocs)
    picks = rng.random(4 * n_allocs)
    ops: list[tuple] = []
    live: list[int] = []
    nxt = 0
    k = 0
    while nxt < n_allocs or live:
        p_alloc = 0.6 if len(live) < target_live else 0.4
        if nxt < n_allocs and (not live or coins[k] < p_alloc):
            ops.append((ALLOC, nxt, int(sizes[nxt])))
            live.append(nxt)
            nxt += 1
        else:
            r = picks[k]  # below lifo: the newest; else uniform over the live set
            i = len(live) - 1 if r < lifo else min(int((r - lifo) / (1 - lifo) * len(live)),
                                                   len(live) - 1)
            ops.append((FREE, live.pop(i)))
        k = (k + 1) % len(coins)
    return ops


def transformer_trace(
    *,
    layers: int = 12,
    batch: int = 4,
    hidden: int = 1024,
    heads: int = 16,
    prompt: int = 128,
    steps: int = 32,
    vocab: int = 32000,
    seed: int = 0,
) -> list[tuple]:
    """The transformer-inference-like trace: one prefill of ``prompt`` tokens, ``steps`` decodes.

    ``seed`` jitters the prompt length by up to 1/8 so that different seeds give different sizes.
    """
    rng = np.random.default_rng(seed)
    prompt = int(prompt + rng.integers(0, max(1, prompt // 8)))
    f4 = 4
    ops: list[tuple] = []
    ids = itertools.count()

    def alloc(nbytes: int) -> int:
        i = next(ids)
        ops.append((ALLOC, i, nbytes))
        return i

    def free(*handles: int) -> None:
        for h in handles:
            ops.append((FREE, h))

    kcache: list[int | None] = [None] * layers
    vcache: list[int | None] = [None] * layers
    ctx = 0
    for step in range(steps + 1):
        seq = prompt if step == 0 else 1
        ctx += seq
        act = batch * seq * hidden * f4
        x = alloc(act)  # embedding lookup
        for layer in range(layers):
            ln = alloc(act)
            qkv = alloc(3 * act)
            free(ln)
            for cache in (kcache, vcache):  # torch.cat((past, new)): new buffer, then drop old
                new = alloc(batch * ctx * hidden * f4)
                if cache[layer] is not None:
                    free(cache[layer])
                cache[layer] = new
            scores = alloc(batch * heads * seq * ctx * f4)
            probs = alloc(batch * heads * seq * ctx * f4)
            free(scores)
            attn = alloc(act)
            free(probs, qkv)
            proj = alloc(act)
            free(attn)
            h = alloc(act)  # residual add
            free(proj, x)
            ln2 = alloc(act)
            up = alloc(4 * act)
            free(ln2)
            gelu = alloc(4 * act)
            free(up)
            down = alloc(act)
            free(gelu)
            x = alloc(act)  # residual add
            free(down, h)
        lnf = alloc(batch * hidden * f4)  # final norm of the last position only
        logits = alloc(batch * vocab * f4)
        free(lnf, x)
        ops.append((SYNC,))  # the host reads the sampled token
        free(logits)
    free(*kcache, *vcache)
    return ops


def streams_trace(
    n_allocs: int = 20000,
    *,
    seed: int = 0,
    streams: int = 4,
    lo: int = 512,
    hi: int = 4 * MiB,
    target_live: int = 48,
    lifo: float = 0.8,
    cross: float = 0.2,
    sync_every: int = 400,
) -> list[tuple]:
    """The mixed-size trace over ``streams`` streams: each step one stream, drawn at random,
    allocates or frees (its live set random-walks around ``target_live / streams``; 80% of its
    frees release its newest block, the rest a random one of its own); ``cross`` of the frees
    are made on another stream (``(FREE, id, stream)``: the replay orders that stream after the
    owner with an event first, as a correct program must); every ``sync_every`` operations the
    host synchronizes every stream (it reads results)."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(math.log(lo), math.log(hi), n_allocs)).astype(np.int64)
    per = max(1, target_live // streams)
    ops: list[tuple] = []
    live: list[list[int]] = [[] for _ in range(streams)]
    nxt = 0
    while nxt < n_allocs or any(live):
        i = int(rng.integers(streams))
        mine = live[i]
        p_alloc = 0.6 if len(mine) < per else 0.4
        if nxt < n_allocs and (not mine or rng.random() < p_alloc):
            ops.append((ALLOC, nxt, int(sizes[nxt]), i))
            mine.append(nxt)
            nxt += 1
        elif mine:
            r = rng.random()
            k = len(mine) - 1 if r < lifo else int(rng.integers(len(mine)))
            via = i if rng.random() >= cross else int((i + 1 + rng.integers(streams - 1)) % streams)
            ops.append((FREE, mine.pop(k), via))
        if sync_every and len(ops) % (sync_every + 1) == sync_every:
            ops.append((SYNC,))
    return ops


TRACES = {"mixed": mixed_trace, "streams": streams_trace, "transformer": transformer_trace}
TARGETS = {"mixed": 1.15, "streams": 1.25, "transformer": 1.15}  # DESIGN.md §6
WHAT = {"mixed": "1 stream", "streams": "4 streams, 20% cross-stream frees",
        "transformer": "1 stream"}


def peak_live(ops: list[tuple], align: int = 1) -> int:
    """The largest sum of (optionally rounded) requested sizes live at once."""
    live: dict[int, int] = {}
    cur = peak = 0
    for op in ops:
        if op[0] == ALLOC:
            n = (op[2] + align - 1) // align * align
            live[op[1]] = n
            cur += n
            peak = max(peak, cur)
        elif op[0] == FREE:
            cur -= live.pop(op[1])
    return peak


def replay(ops: list[tuple], *, release_threshold: int = 0) -> dict:
    """Replay ``ops`` against a fresh pool, on one non-blocking stream or on as many as the ops
    name (an op's last field); return its figures."""
    n = 1 + max([op[3] for op in ops if op[0] == ALLOC and len(op) > 3]
                + [op[2] for op in ops if op[0] == FREE and len(op) > 2], default=0)
    ss = [srt.Stream(non_blocking=True) for _ in range(n)]
    pool = srt.MemPool(release_threshold=release_threshold)
    ptrs: dict[int, int] = {}
    owner: dict[int, int] = {}
    t0 = time.perf_counter()
    for op in ops:
        kind = op[0]
        if kind == ALLOC:
            i = op[3] if len(op) > 3 else 0
            ptrs[op[1]] = ss[i].malloc(op[2], pool)
            owner[op[1]] = i
        elif kind == FREE:
            i = owner.pop(op[1])
            via = op[2] if len(op) > 2 else i
            if via != i:  # the freeing stream follows the owner's work
                ss[via].wait(ss[i].record())
            ss[via].free(ptrs.pop(op[1]))
        else:
            for s in ss:
                s.synchronize()
    for s in ss:
        s.synchronize()
    elapsed = time.perf_counter() - t0
    assert not ptrs
    st = pool.stats()
    pool.destroy()
    n_alloc = sum(1 for op in ops if op[0] == ALLOC)
    true_peak = peak_live(ops)
    return {
        "ops": len(ops),
        "allocs": n_alloc,
        "seconds": elapsed,
        "reserved_high": st["reserved_mem_high"],
        "used_high": st["used_mem_high"],
        "peak_live": true_peak,
        "peak_live_rounded": peak_live(ops, 512),
        "ratio": st["reserved_mem_high"] / st["used_mem_high"],
        "ratio_vs_peak_live": st["reserved_mem_high"] / true_peak,
        "grow_count": st["grow_count"],
        "release_count": st["release_count"],
        "reuse_same_stream": st["reuse_same_stream"],
        "reuse_after_sync": st["reuse_after_sync"],
    }


def run(seed: int = 0, release_threshold: int = 0, quick: bool = False) -> dict:
    """Replay every trace; ``pass`` when each reserved_high / peak live is within its target."""
    res: dict = {"seed": seed, "release_threshold": release_threshold, "targets": TARGETS}
    for name, make in TRACES.items():
        res[name] = replay(make(seed=seed), release_threshold=release_threshold)
    res["rows"] = [
        {"claim": f"pool footprint, {name} trace ({WHAT[name]}, seed {seed}): reserved_high vs "
                  "peak live bytes",
         "ours": res[name]["reserved_high"] / MiB, "peer": res[name]["peak_live"] / MiB,
         "unit": "MiB", "ratio": res[name]["ratio_vs_peak_live"],
         "target": f"<= {TARGETS[name]}x", "pass": res[name]["ratio_vs_peak_live"] <= TARGETS[name]}
        for name in TRACES
    ]
    res["pass"] = all(r["pass"] for r in res["rows"])
    if not quick:  # the same traces drawn with other seeds: how much the figure depends on it
        for name, make in TRACES.items():
            others = {s: replay(make(seed=s), release_threshold=release_threshold)
                      for s in OTHER_SEEDS if s != seed}
            worst = max(others, key=lambda s: others[s]["ratio_vs_peak_live"])
            res[name]["other_seeds"] = {s: r["ratio_vs_peak_live"] for s, r in others.items()}
            res["rows"].append(
                {"claim": f"the {name} trace, worst of seeds "
                          f"{min(others)}-{max(others)} (seed {worst})",
                 "ours": others[worst]["reserved_high"] / MiB,
                 "peer": others[worst]["peak_live"] / MiB, "unit": "MiB",
                 "ratio": others[worst]["ratio_vs_peak_live"], "target": "(reported)",
                 "pass": True})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--release-threshold", type=int, default=0, help="bytes (pool default: 0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.seed, args.release_threshold)
    if args.json:
        print(json.dumps(r))
        return
    print(f"pool footprint, seed {args.seed}, release threshold {args.release_threshold} B")
    for name in TRACES:
        t = r[name]
        print(f"  {name:<12} {t['ops']:6d} ops ({t['allocs']} allocs) in {t['seconds']:.2f} s")
        print(f"    reserved_high {t['reserved_high'] / MiB:9.2f} MiB   "
              f"used_high {t['used_high'] / MiB:9.2f} MiB   "
              f"ratio {t['ratio']:.3f}x")
        if "other_seeds" in t:
            print("    other seeds: " + ", ".join(f"{k}: {v:.3f}x" for k, v in t["other_seeds"].items()))
        print(f"    true peak live {t['peak_live'] / MiB:8.2f} MiB   "
              f"reserved_high / peak live {t['ratio_vs_peak_live']:.3f}x "
              f"(target <= {TARGETS[name]}x)   "
              f"grown {t['grow_count']} times, granules released {t['release_count']}")
    print(f"  {'PASS' if r['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
