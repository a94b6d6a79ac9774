"""Seed 000 end to end: four stream-ordered mallocs, an argument struct of device pointers copied
to the device, a kernel that reads the struct and follows the pointers, four frees without a
synchronize, then the pool's stats before and after the synchronize."""

from __future__ import annotations

import numpy as np

import streamrt as srt

SMALL_CHUNK = 2 << 20  # requests of at most 1 MiB share a 2 MiB chunk (DESIGN.md §3)

# typedef struct { void *input_x; void *input_y; void *output_z; } ArgsInfo;
ARGS_INFO = np.dtype([("input_x", np.uint64), ("input_y", np.uint64), ("output_z", np.uint64)])


@srt.kernel
def add_custom(ctx, args_ptr):
    """The seed's kernel: reads ArgsInfo from device memory, then *output_z = *input_x + *input_y."""
    args = ctx.array(args_ptr, (1,), ARGS_INFO, readonly=True)[0]
    x = ctx.array(int(args["input_x"]), (1,), np.uint64, readonly=True)
    y = ctx.array(int(args["input_y"]), (1,), np.uint64, readonly=True)
    np.add(x, y, out=ctx.array(int(args["output_z"]), (1,), np.uint64))


def test_pool_seed_scenario_end_to_end(dev, gate):
    pool = srt.MemPool(dev, max_size=14 << 30)  # maxSize = 14 GB, as in the seed
    s = srt.Stream(dev)
    g = gate(s)  # everything below stays pending until the gate opens: no hidden synchronize
    p1 = s.malloc(8, pool)  # sizeof(uint64_t)
    p2 = s.malloc(8, pool)
    p3 = s.malloc(8, pool)
    p0 = s.malloc(ARGS_INFO.itemsize, pool)
    ptrs = [p1, p2, p3, p0]
    assert len(set(ptrs)) == 4
    assert all(p % 512 == 0 for p in ptrs)
    ordered = sorted(ptrs)
    assert all(b - a >= 512 for a, b in zip(ordered, ordered[1:]))  # no two overlap
    st = pool.stats()
    assert st["alloc_count"] == 4 and st["live_allocations"] == 4
    assert st["used_mem_current"] == 4 * 512
    assert st["reserved_mem_current"] == SMALL_CHUNK  # one shared small-block chunk

    usr_args = np.zeros(1, ARGS_INFO)
    usr_args[0] = (p1, p2, p3)
    s.memcpy(p0, usr_args, ARGS_INFO.itemsize)  # aclrtMemcpyAsync of the struct
    s.memcpy(p1, np.array([40], np.uint64), 8)
    s.memcpy(p2, np.array([2], np.uint64), 8)
    s.memset(p3, 0xFF, 8)
    s.launch(add_custom, p0, grid=32)
    result = srt.malloc_host(8)  # pinned: the copy out stays asynchronous
    try:
        s.memcpy(result, p3, 8)
        for p in (p0, p1, p2, p3):
            s.free(p)  # aclrtMemPoolFreeAsync: no synchronize before it
        assert not s.query()  # the kernel really is still pending behind the gate
        before = pool.stats()
        assert before["free_count"] == 4 and before["live_allocations"] == 0
        assert before["used_mem_current"] == 0  # back in the pool...
        assert before["reserved_mem_current"] == SMALL_CHUNK  # ...but nothing released yet
        assert before["release_count"] == 0
        assert before["used_mem_high"] == 4 * 512

        g.open()
        s.synchronize()  # threshold 0: the synchronize releases the entirely free chunk
        after = pool.stats()
        assert after["reserved_mem_current"] == 0
        assert after["release_count"] == 1
        assert after["reserved_mem_high"] == SMALL_CHUNK and after["used_mem_high"] == 4 * 512
        assert after["alloc_count"] == 4 and after["free_count"] == 4
        assert int(srt.read(result, (1,), np.uint64)[0]) == 42  # the kernel followed the pointers
    finally:
        srt.free_host(result)
    pool.destroy()
    s.destroy()
