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


# -- two-phase operators (seed 001) ------------------------------------------------------------
def _ws_rows(stream: Stream) -> list[tuple]:
    from . import ops
    from .tensor import Tensor, TensorDesc

    rows = []
    for name, shapes, attrs in [
        ("reduce_sum", [(100,), ()], {}), ("reduce_sum", [(100_000,), ()], {}),
        ("softmax", [(8, 64), (8, 64)], {}), ("softmax", [(1024, 64), (1024, 64)], {}),
        ("matmul", [(4, 64), (64, 4), (4, 4)], {}), ("matmul", [(4, 8192), (8192, 4), (4, 4)], {}),
        ("cumsum", [(1000,), (1000,)], {}), ("cumsum", [(100_000,), (100_000,)], {}),
    ]:
        # phase 1 reads metadata only: a pointer that holds no data is enough
        tensors = [Tensor(TensorDesc(sh, np.float32), 4096, device=stream.device) for sh in shapes]
        size, ex = ops.OPS[name].get_workspace_size(*tensors, **attrs)
        rows.append((name, " x ".join(str(sh) for sh in shapes[:-1]), ex.impl, size))
        ex.destroy()
    return rows


def demo_ops(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 001: phase 1 (workspace size printed), phase 2, then 1000 ``ops.run`` with a cache."""
    import time

    from . import ops
    from .tensor import Tensor

    out("== two-phase operators (seed 001): GetWorkspaceSize, workspace, execute ==")
    failures: list[str] = []
    live0 = ops.stats()["live_executors"]
    s = Stream(dev, non_blocking=True)
    x = Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    total = Tensor.empty((3,), np.float32, stream=s)
    ws_size, ex = ops.reduce_sum.get_workspace_size(x, total, axis=1)  # phase 1: metadata only
    out(f"  phase 1: reduce_sum (3, 4) axis=1 -> workspace_size {ws_size} bytes, {ex!r}")
    ws = s.malloc(max(ws_size, 1))  # size 0: a minimum unit anyway, as the seed advises
    ops.reduce_sum(ws, ws_size, ex, s)  # phase 2: enqueue only
    s.free(ws)  # stream-ordered: after the kernels
    got = total.numpy(s)
    out(f"  phase 2: enqueued on {s.name}; out = {got.tolist()}")
    _check(got.tolist() == [6.0, 22.0, 38.0], "phase 2 computed the row sums", failures, out)
    out("  the workspace size depends on the shape (phase 1 picks the implementation):")
    rows = _ws_rows(s)
    _table(rows, ("op", "input", "implementation", "workspace bytes"), out)
    _check(all(a[3] < b[3] for a, b in zip(rows[::2], rows[1::2])),
           "a larger shape asks for a larger workspace", failures, out)
    rng = np.random.default_rng(0)
    a = Tensor.from_numpy(rng.standard_normal((16, 64)).astype(np.float32), stream=s)
    y = Tensor.empty((16, 64), np.float32, stream=s)
    s.synchronize()
    results = []
    for label, cache in (("no cache (phase 1 every call)", None),
                         ("ExecutorCache", ops.ExecutorCache())):
        before = ops.stats()["softmax"]
        t0 = time.perf_counter()
        for _ in range(1000):
            ops.run(ops.softmax, a, y, stream=s, cache=cache)
        host = time.perf_counter() - t0
        s.synchronize()
        after = ops.stats()["softmax"]
        results.append((label, 1000, after["plans"] - before["plans"],
                        after["cache_hits"] - before["cache_hits"], host * 1e3))
        if cache is not None:
            cache.clear()
    _table([(*r[:4], f"{r[4]:.1f}") for r in results],
           ("ops.run softmax (16, 64)", "calls", "plans", "cache hits", "host ms"), out)
    plain, hit = results[0][4], results[1][4]
    out(f"  host time saved by the cache: {plain - hit:.1f} ms over 1000 calls "
        f"({plain / max(hit, 1e-9):.1f}x less)")  # reported, never checked: timings vary
    ref = a.numpy(s)
    e = np.exp(ref - ref.max(1, keepdims=True))
    _check(bool(np.allclose(y.numpy(s), e / e.sum(1, keepdims=True), rtol=1e-5)),
           "the cached executor computed softmax right", failures, out)
    _check(results[1][2] == 1 and results[1][3] == 999,
           "with the cache: one plan, 999 hits", failures, out)
    _check(ops.stats()["live_executors"] == live0,
           "no executor leaked (one-shot ones released after their work, cache cleared)",
           failures, out)
    for t in (x, total, a, y):
        t.free()
    s.synchronize()
    s.destroy()
    return failures


SECTIONS: dict[str, Section] = {"streams": demo_streams, "pools": demo_pools, "ops": demo_ops}


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
