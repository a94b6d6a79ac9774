"""Demo section, seed 000: the stream-ordered pool and the cross-stream reuse rules."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..device import Device
from ..host_memory import free_host, malloc_host, read
from ..kernel import kernel
from ..pool import MemPool
from ..stream import Stream
from ._gate import HostGate
from .report import check, guarded, not_available, table

# -- stream-ordered memory pool (seed 000) -----------------------------------------------------
ARGS_INFO = np.dtype([("input_x", np.uint64), ("input_y", np.uint64), ("output_z", np.uint64)])

# The struct mirrors ARGS_INFO (three 64-bit addresses). The Python body does its one addition
# once whatever the grid, so here only the first thread does it (the seed launches 32 blocks).
ADD_CUSTOM_CUDA = r"""struct ArgsInfo { unsigned long long input_x, input_y, output_z; };

extern "C" __global__ void add_custom(const ArgsInfo* args) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long* x = (const unsigned long long*)args->input_x;
  const unsigned long long* y = (const unsigned long long*)args->input_y;
  unsigned long long* z = (unsigned long long*)args->output_z;
  *z = *x + *y;
}"""


@kernel(cuda=ADD_CUSTOM_CUDA, signature="ptr")
def add_custom(ctx, args_ptr):
    """Seed 000's kernel: reads the argument struct from device memory, then z = x + y."""
    args = ctx.array(args_ptr, (1,), ARGS_INFO, readonly=True)[0]
    x = ctx.array(int(args["input_x"]), (1,), np.uint64, readonly=True)
    y = ctx.array(int(args["input_y"]), (1,), np.uint64, readonly=True)
    np.add(x, y, out=ctx.array(int(args["output_z"]), (1,), np.uint64))


def _pool_row(label: str, pool: MemPool) -> tuple:
    st = pool.stats()
    return (label, st["reserved_mem_current"], st["used_mem_current"], st["reserved_mem_high"],
            st["used_mem_high"], st["alloc_count"], st["free_count"])


def demo_pools(dev: Device, out: Callable[[str], None]) -> list[str]:
    """Seed 000: malloc/free ordered by the stream, then each cross-stream reuse mode."""
    out("== stream-ordered memory pool (seed 000) ==")
    failures: list[str] = []
    with guarded("seed 000", failures, out):
        _demo_seed(dev, out, failures)
    failures += _demo_reuse_modes(dev, out)
    with guarded("release threshold and trim", failures, out):
        _demo_threshold_and_trim(dev, out, failures)
    return failures


def _demo_threshold_and_trim(dev: Device, out: Callable[[str], None], failures: list[str]) -> None:
    """Seed 000: a release threshold keeps idle memory at synchronize; trim_to overrides it."""
    pool = MemPool(dev, release_threshold=64 << 20)
    s = Stream(dev, non_blocking=True)
    s.free(s.malloc(4 << 20, pool))
    s.synchronize()
    kept = pool.reserved_mem_current
    pool.trim_to(0)  # an explicit trim wins over the threshold
    trimmed = pool.reserved_mem_current
    rows = [("threshold 64 MiB, after free + synchronize", kept),
            ("then trim_to(0)", trimmed)]
    table(rows, ("moment", "reserved"), out)
    check(kept >= 4 << 20 and trimmed == 0, "release threshold 64 MiB: the idle 4 MiB stays "
          "reserved at synchronize; trim_to(0) releases it all (trim wins over the threshold)",
          failures, out)
    s.destroy()
    pool.destroy()


def _demo_seed(dev: Device, out: Callable[[str], None], failures: list[str]) -> None:
    pool = MemPool(dev, max_size=14 << 30)
    s = Stream(dev)
    gate = HostGate(dev)
    with dev:  # before the gate holds s: on cuda a pinned allocation may wait for busy streams
        pinned = malloc_host(8)
    try:
        p1 = s.malloc(8, pool)
        p2 = s.malloc(8, pool)
        p3 = s.malloc(8, pool)
        p0 = s.malloc(ARGS_INFO.itemsize, pool)
        usr_args = np.array([(p1, p2, p3)], ARGS_INFO)
        s.memcpy(p0, usr_args, ARGS_INFO.itemsize)  # taken at call time, as cudaMemcpyAsync does
        s.memcpy(p1, np.array([40], np.uint64), 8)
        s.memcpy(p2, np.array([2], np.uint64), 8)
        # hold the stream so that "not yet complete" is real; only after the pageable copies,
        # since CUDA may make a copy from pageable memory wait for its stream (and so the gate)
        gate.hold(s, add_custom)
        s.launch(add_custom, p0, grid=32)
        for p in (p0, p1, p2):
            s.free(p)  # no synchronize needed: the free is ordered after the kernel
        rows = [_pool_row("after 4 mallocs, 3 frees (stream still busy)", pool)]
        s.memcpy(pinned, p3, 8)
        s.free(p3)
        rows.append(_pool_row("after the 4th free, before synchronize", pool))
        gate.open()
        s.synchronize()
    finally:
        gate.open()  # whatever happened, never leave the stream spinning
    with dev:
        z = read(pinned, (1,), np.uint64)
        free_host(pinned)
    gate.free()
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


BLOCK = 2 << 20  # a whole chunk: no fresh remainder competes with the block under test
NOT_EXPOSED = "n/a (not exposed by CUDA)"


def _demo_reuse_modes(dev: Device, out: Callable[[str], None]) -> list[str]:
    out("  cross-stream reuse: which rule served each allocation (DESIGN.md §3 steps 1-6)")
    failures: list[str] = []
    rules = ("reuse_same_stream", "reuse_after_sync", "reuse_event_dependency",
             "reuse_opportunistic", "grow_count", "reuse_internal_dependency")
    rows = []
    hidden = [False]  # set when the pool keeps no per-step counters (a native cuda pool)

    def served(pool: MemPool, before: dict) -> str:
        after = pool.stats()
        if after[rules[0]] is None:  # CUDA decides reuse inside the driver and reports no rule
            hidden[0] = True
            return NOT_EXPOSED
        return ",".join(r for r in rules if after[r] > before[r]) or "?"

    def scenario(name: str, expect: str, body: Callable[[MemPool, Stream, Stream], int], *,
                 state: str = "busy", **pool_args: int) -> None:
        """b uses a block and frees it; then ``body`` allocates. ``state`` says where b is then:
        "busy" (held by a gate), "passed" (it ran the free, nothing synchronized), "synced"."""
        pool = MemPool(dev, **{"release_threshold": 1 << 30, **pool_args})
        a, b = Stream(dev, non_blocking=True), Stream(dev, non_blocking=True)  # no shared history
        gate = HostGate(dev)
        try:
            gate.hold(b)
            p = b.malloc(BLOCK, pool)
            b.memset(p, 0, BLOCK)
            b.free(p)
            if state != "busy":
                gate.open()
                passed = threading.Event()

                def free_reached() -> None:  # (named: a trace of the demo shows this name)
                    passed.set()

                b.launch_host_func(free_reached)  # runs once b has executed the free
                if not passed.wait(timeout=60):  # a host-side wait for a callback, not a synchronize
                    raise TimeoutError(f"{b.name} did not reach its host function in 60 s")
                if state == "synced":
                    b.synchronize()
            before = pool.stats()
            q = body(pool, a, b)
            got = served(pool, before)
        finally:
            gate.open()  # whatever happened, never leave b spinning
        a.synchronize()
        b.synchronize()
        gate.free()
        rows.append((name, "same block" if q == p else "new block", got))
        if got != NOT_EXPOSED:
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

    for name, expect, body, kwargs in (
        ("same stream", "reuse_same_stream", same_stream, {}),
        ("event dependency (a waits on b's event)", "reuse_event_dependency", event_dep, {}),
        ("no dependency, b still busy: grow", "grow_count", unrelated, {}),
        ("internal dependencies off: grow", "grow_count", no_internal, {}),
        # one chunk: growing is impossible, so a waits for b's free (a real dependency is inserted)
        ("pool full, b busy: a waits on b", "reuse_internal_dependency", unrelated,
         {"max_size": BLOCK}),
        ("b already past its free, no sync", "reuse_opportunistic", unrelated, {"state": "passed"}),
        ("b synchronized before a asks", "reuse_after_sync", unrelated, {"state": "synced"}),
    ):
        with guarded(name, failures, out):  # one scenario's error does not hide the others
            scenario(name, expect, body, **kwargs)
    if hidden[0]:
        not_available("which rule served each allocation",
                      "CUDA does not expose its per-step reuse counters; the block column is the "
                      "driver's own choice, shown but not checked", out)
    table(rows, ("scenario", "block", "rule"), out)
    return failures
