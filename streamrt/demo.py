"""``streamrt demo``: the seed scenarios, run end to end with what happened printed as tables.

Each section returns a list of failed checks; the command exits non-zero if any failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from .device import Device
from .kernel import kernel
from .memory import MemPool
from .stream import Event, Stream

Section = Callable[[Device, Callable[[str], None]], list[str]]


def _table(rows: list[tuple], header: tuple, out: Callable[[str], None]) -> None:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, r in enumerate(cells):
        out("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if n == 0:
            out("  " + "  ".join("-" * w for w in widths))


def _check(cond: bool, what: str, failures: list[str], out: Callable[[str], None]) -> None:
    out(f"  [{'ok' if cond else 'FAILED'}] {what}")
    if not cond:
        failures.append(what)


# -- streams and events -----------------------------------------------------------------------
@kernel
def _fill(ctx, ptr, n, value, log):
    ctx.array(ptr, (n,), np.float32)[:] = value
    log.append((ctx.stream.name, "fill", threading.current_thread().name))


@kernel
def _square(ctx, src, dst, n, log):
    x = ctx.array(src, (n,), np.float32, readonly=True)
    np.multiply(x, x, out=ctx.array(dst, (n,), np.float32))
    log.append((ctx.stream.name, "square", threading.current_thread().name))


@kernel
def _accumulate(ctx, src, dst, n, log):
    dst_view = ctx.array(dst, (n,), np.float32)
    dst_view += ctx.array(src, (n,), np.float32, readonly=True)
    log.append((ctx.stream.name, "accumulate", threading.current_thread().name))


def demo_streams(dev: Device, out: Callable[[str], None]) -> list[str]:
    """A two-stream pipeline joined by events."""
    out("== streams and events: a pipeline across two streams joined by events ==")
    failures: list[str] = []
    n = 1 << 16
    s1, s2 = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)
    a, b = s1.malloc(n * 4), s1.malloc(n * 4)
    log: list[tuple] = []
    start, stop = Event(dev, timing=True), Event(dev, timing=True)
    s1.record(start)
    for step in range(3):
        s1.launch(_fill, a, n, float(step + 1), log, grid=n // 256, block=256)
        filled = s1.record()
        s2.wait(filled)  # s2's square must see s1's fill
        s2.launch(_square, a, b, n, log, grid=n // 256, block=256)
        squared = s2.record()
        s1.wait(squared)  # s1 must not refill a before s2 has read it
    s1.launch(_accumulate, b, b, n, log)
    s1.record(stop)
    result = np.empty(n, np.float32)
    s1.memcpy(result, b, n * 4)  # into a pageable buffer: returns when the data is there
    s1.synchronize()
    _table([(i, *row) for i, row in enumerate(log)], ("#", "stream", "kernel", "worker thread"), out)
    out(f"  elapsed between timing events: {start.elapsed_time(stop):.3f} ms")
    _check(bool(np.all(result == 18.0)), "result is 2 * 3**2 everywhere (events ordered the streams)",
           failures, out)
    _check([r[1] for r in log] == ["fill", "square"] * 3 + ["accumulate"],
           "kernels ran in the order the events impose", failures, out)
    s1.free(a)
    s1.free(b)
    s1.synchronize()
    s1.destroy()
    s2.destroy()
    return failures


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
    from .blocking import free_host, malloc_host, read

    pinned = malloc_host(8)
    s.memcpy(pinned, p3, 8)
    s.free(p3)
    rows.append(_pool_row("after the 4th free, before synchronize", pool))
    gate.set()
    s.synchronize()
    z[:] = read(pinned, (1,), np.uint64)
    free_host(pinned)
    rows.append(_pool_row("after synchronize (threshold 0 releases)", pool))
    _table(rows, ("moment", "reserved", "used", "reserved_high", "used_high", "mallocs", "frees"),
           out)
    st = pool.stats()
    _check(int(z[0]) == 42, "the kernel read the pointer struct and computed 40 + 2 = 42", failures,
           out)
    _check(rows[1][2] == 0 and rows[1][1] > 0,
           "frees returned the blocks without a synchronize; memory stays reserved", failures, out)
    _check(st["reserved_mem_current"] == 0,
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

    def scenario(name: str, expect: str, body: Callable[[MemPool, Stream, Stream], int]) -> None:
        pool = MemPool(dev, release_threshold=1 << 30)
        a, b = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)
        gate = threading.Event()
        b.launch(_gate, gate)
        p = b.malloc(BLOCK, pool)
        b.free(p)
        before = pool.stats()
        q = body(pool, a, b)
        got = served(pool, before)
        gate.set()
        a.synchronize()
        b.synchronize()
        rows.append((name, "same block" if q == p else "new block", got))
        _check(got == expect, f"{name}: served by {expect}", failures, out)
        a.free(q)
        a.synchronize()
        pool.destroy()

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

    pool = MemPool(dev, max_size=BLOCK)  # one chunk: growing is impossible
    a, b = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)
    gate = threading.Event()
    b.launch(_gate, gate)
    p = b.malloc(BLOCK, pool)
    b.free(p)
    before = pool.stats()
    q = a.malloc(BLOCK, pool)  # a now waits for b's free: a real dependency was inserted
    got = served(pool, before)
    gate.set()
    a.synchronize()
    rows.append(("pool full, b busy: a waits on b", "same block" if q == p else "new block", got))
    _check(got == "reuse_internal_dependency", "full pool: served by an internal dependency",
           failures, out)
    a.free(q)
    a.synchronize()
    b.synchronize()
    pool.destroy()
    a.destroy()
    b.destroy()
    a, b = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)  # no shared history
    pool = MemPool(dev, release_threshold=1 << 30)
    p = b.malloc(BLOCK, pool)
    b.memset(p, 0, BLOCK)  # b uses the block, then frees it
    b.free(p)
    passed = threading.Event()
    b.launch_host_func(passed.set)  # runs once b has executed the free; not a synchronize
    passed.wait()
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    rows.append(("b already past its free, no sync", "same block" if q == p else "new block",
                 served(pool, before)))
    _check(served(pool, before) == "reuse_opportunistic", "a completed free: opportunistic reuse",
           failures, out)
    a.free(q)
    a.synchronize()
    b.synchronize()
    pool.destroy()
    pool = MemPool(dev)
    p = b.malloc(BLOCK, pool)
    b.free(p)
    b.synchronize()  # proves the free: threshold 0 releases the chunk, so grow again
    pool.release_threshold = 1 << 30
    p = b.malloc(BLOCK, pool)
    b.free(p)
    b.synchronize()
    before = pool.stats()
    q = a.malloc(BLOCK, pool)
    rows.append(("b synchronized before a asks", "same block" if q == p else "new block",
                 served(pool, before)))
    _check(served(pool, before) == "reuse_after_sync", "after a host synchronize: any stream reuses",
           failures, out)
    a.free(q)
    a.synchronize()
    pool.destroy()
    _table(rows, ("scenario", "block", "rule"), out)
    a.destroy()
    b.destroy()
    return failures


SECTIONS: dict[str, Section] = {"streams": demo_streams, "pools": demo_pools}


def run(device: str | None = None, only: str | None = None,
        out: Callable[[str], None] = print) -> int:
    """Run the demo sections; returns the number of failed checks."""
    dev = Device(device)
    out(f"streamrt demo on {dev.name}")
    failures: list[str] = []
    for name, section in SECTIONS.items():
        if only and name != only:
            continue
        failures += section(dev, out)
        out("")
    out("all checks passed" if not failures else f"{len(failures)} check(s) FAILED: {failures}")
    return len(failures)
