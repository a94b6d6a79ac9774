"""Demo section, seed 000: the stream-ordered pool and the cross-stream reuse rules."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..device import Device
from ..kernel import kernel
from ..memory import MemPool
from ..stream import Stream
from . import check, table

# -- stream-ordered memory pool (seed 000) -----------------------------------------------------
ARGS_INFO = np.dtype([("input_x", np.uint64), ("input_y", np.uint64), ("output_z", np.uint64)])


@kernel
def add_custom(ctx, args_ptr):
    """Seed 000's kernel: reads the argument struct from device memory, then z = x + y."""
    args = ctx.array(args_ptr, (1,), ARGS_INFO, readonly=True)[0]
    x = ctx.array(int(args["input_x"]), (1,), np.uint64, readonly=True)
    y = ctx.array(int(args["input_y"]), (1,), np.uint64, readonly=True)
    np.add(x, y, out=ctx.array(int(args["output_z"]), (1,), np.uint64))


@kernel
def _gate(ctx, event):
    event.wait()


def _pool_row(label: str, pool: MemPool) -> tuple:
    st = pool.stats()
    return (label, st["reserved_mem_current"], st["used_mem_current"], st["reserved_mem_high"],
            st["used_mem_high"], st["alloc_count"], st["free_count"])


def demo_pools(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 000: malloc/free ordered by the stream, then each cross-stream reuse mode."""
    out("== stream-ordered memory pool (seed 000) ==")
    failures: list[str] = []
    pool = MemPool(dev, max_size=14 << 30)
    s = Stream(dev)
    gate = threading.Event()
    s.launch(_gate, gate)  # holds the stream so that "not yet complete" is real
    p1 = s.malloc(8, pool)
    p2 = s.malloc(8, pool)
    p3 = s.malloc(8, pool)
    p0 = s.malloc(ARGS_INFO.itemsize, pool)
    usr_args = np.array([(p1, p2, p3)], ARGS_INFO)
    s.memcpy(p0, usr_args, ARGS_INFO.itemsize)  # taken at call time, as cudaMemcpyAsync does
    s.memcpy(p1, np.array([40], np.uint64), 8)
    s.memcpy(p2, np.array([2], np.uint64), 8)
    s.launch(add_custom, p0, grid=32)
    z = np.zeros(1, np.uint64)
    pinned = None
    for p in (p0, p1, p2):
        s.free(p)  # no synchronize needed: the free is ordered after the kernel
    rows = [_pool_row("after 4 mallocs, 3 frees (stream still busy)", pool)]
    from ..blocking import free_host, malloc_host, read

    pinned = malloc_host(8)
    s.memcpy(pinned, p3, 8)
    s.free(p3)
    rows.append(_pool_row("after the 4th free, before synchronize", pool))
    gate.set()
    s.synchronize()
    z[:] = read(pinned, (1,), np.uint64)
    free_host(pinned)
    rows.append(_pool_row("after synchronize (threshold 0 releases)", pool))
    table(rows, ("moment", "reserved", "used", "reserved_high", "used_high", "mallocs", "frees"),
           out)
    st = pool.stats()
    check(int(z[0]) == 42, "the kernel read the pointer struct and computed 40 + 2 = 42", failures,
           out)
    check(rows[1][2] == 0 and rows[1][1] > 0,
           "frees returned the blocks without a synchronize; memory stays reserved", failures, out)
    check(st["reserved_mem_current"] == 0,
           "the synchronize released the free chunk (release threshold 0)", failures, out)
    pool.destroy()
    s.destroy()
    failures += _demo_reuse_modes(dev, out)
    return failures


BLOCK = 2 << 20  # a whole chunk: no fresh remainder competes with the block under test


def _demo_reuse_modes(dev: Device, out: Callable[[str], None]) -> list[str]:
    out("  cross-stream reuse: which rule served each allocation (DESIGN.md §3 steps 1-6)")
    failures: list[str] = []
    rules = ("reuse_same_stream", "reuse_after_sync", "reuse_event_dependency",
             "reuse_opportunistic", "grow_count", "reuse_internal_dependency")
    rows = []

    def served(pool: MemPool, before: dict) -> str:
        after = pool.stats()
        return ",".join(r for r in rules if after[r] > before[r]) or "?"

    def scenario(name: str, expect: str, body: Callable[[MemPool, Stream, Stream], int], *,
                 state: str = "busy", **pool_args: int) -> None:
        """b uses a block and frees it; then ``body`` allocates. ``state`` says where b is then:
        "busy" (held by a gate), "passed" (it ran the free, nothing synchronized), "synced"."""
        pool = MemPool(dev, **{"release_threshold": 1 << 30, **pool_args})
        a, b = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)  # no shared history
        gate = threading.Event()
        b.launch(_gate, gate)
        p = b.malloc(BLOCK, pool)
        b.memset(p, 0, BLOCK)
        b.free(p)
        if state != "busy":
            gate.set()
            passed = threading.Event()
            b.launch_host_func(passed.set)  # runs once b has executed the free
            passed.wait()  # a host-side wait for a callback: not a streamrt synchronize
            if state == "synced":
                b.synchronize()
        before = pool.stats()
        q = body(pool, a, b)
        got = served(pool, before)
        gate.set()
        a.synchronize()
        b.synchronize()
        rows.append((name, "same block" if q == p else "new block", got))
        check(got == expect, f"{name}: served by {expect}", failures, out)
        a.free(q)
        a.synchronize()
        pool.destroy()
        a.destroy()
        b.destroy()

    def same_stream(pool: MemPool, a: Stream, b: Stream) -> int:
        return b.malloc(BLOCK, pool)

    def event_dep(pool: MemPool, a: Stream, b: Stream) -> int:
        a.wait(b.record())
        return a.malloc(BLOCK, pool)

    def unrelated(pool: MemPool, a: Stream, b: Stream) -> int:
        return a.malloc(BLOCK, pool)

    def no_internal(pool: MemPool, a: Stream, b: Stream) -> int:
        pool.reuse_allow_internal_dependencies = False
        return a.malloc(BLOCK, pool)

    scenario("same stream", "reuse_same_stream", same_stream)
    scenario("event dependency (a waits on b's event)", "reuse_event_dependency", event_dep)
    scenario("no dependency, b still busy: grow", "grow_count", unrelated)
    scenario("internal dependencies off: grow", "grow_count", no_internal)
    # one chunk: growing is impossible, so a waits for b's free (a real dependency is inserted)
    scenario("pool full, b busy: a waits on b", "reuse_internal_dependency", unrelated,
             max_size=BLOCK)
    scenario("b already past its free, no sync", "reuse_opportunistic", unrelated,
             state="passed")
    scenario("b synchronized before a asks", "reuse_after_sync", unrelated, state="synced")
    table(rows, ("scenario", "block", "rule"), out)
    return failures
