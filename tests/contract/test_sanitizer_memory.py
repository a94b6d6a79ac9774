"""The sanitizer's memory findings: use after free, use before alloc, out of bounds, invalid addresses,
workspaces freed too early, leaks."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from tests.contract.sanitizer_helpers import kinds, read_k, set_k, streams, write_k

HERE = f"{Path(__file__).name}:"  # where the sanitizer says this file enqueued an access


def test_sanitizer_use_after_free(dev, san, gate):
    a, b = streams(dev)
    p = a.malloc(1024)
    a.launch(write_k, p, 256, 1.0)
    b.wait(a.record())
    g = gate(b)
    out = []
    b.launch(read_k, p, 256, out)  # still pending behind the gate
    a.free(p)  # BUG: the free is not ordered after b's read
    g.open()
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["use-after-free"]
    assert "free of" in rep[0].message and rep[0].message.count(HERE) == 2


def test_sanitizer_use_after_free_of_an_access_that_already_ran(dev, san):
    # the read has run when the free is enqueued, and no synchronize proved it: still a bug
    # (on a GPU it could have run after the free), found whatever the schedule
    a, b = streams(dev)
    p = a.malloc(1024)
    a.launch(write_k, p, 256, 1.0)
    b.wait(a.record())
    ran = threading.Event()
    b.launch(read_k, p, 256, [])
    b.launch(set_k, ran)
    assert ran.wait(30)  # a host signal the sanitizer does not see as ordering
    a.free(p)  # BUG: not ordered after b's read
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["use-after-free"]
    assert b.name in rep[0].message and "free of" in rep[0].message


_REUSED_ADDRESS = """
import sys, threading
import numpy as np
import streamrt as srt
from tests.conftest import gate_kernel

@srt.kernel
def write_k(ctx, p, n, v):
    ctx.array(p, (n,), np.float32)[:] = v

srt.sanitizer.enable("collect")
dev = srt.Device("cpu:0")
a, b = (srt.Stream(dev, non_blocking=True) for _ in range(2))
for _ in range(int(sys.argv[1])):  # earlier generations at the same address
    p = a.malloc(256); a.launch(write_k, p, 64, 0.0); a.free(p); a.synchronize()
p = a.malloc(256)
opened = threading.Event()
a.launch(gate_kernel, opened)
a.launch(write_k, p, 64, 1.0)  # still pending behind the gate
b.free(p)  # BUG: not ordered after a's write
q = b.malloc(256)
assert q == p  # the same address, a new generation
opened.set()
dev.synchronize()
print(*[f.kind for f in srt.sanitizer.report()])
"""


@pytest.mark.parametrize("earlier", [0, 3, 5])
def test_sanitizer_use_after_free_named_so_after_many_reuses_of_the_address(earlier):
    # the address served ``earlier`` allocations before: forgetting an old generation once the
    # host saw its free blamed a pending unordered access on the newer one (use-before-alloc).
    # A fresh process: the generations remembered per address are the sanitizer's whole history
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", _REUSED_ADDRESS, str(earlier)], capture_output=True,
                         text=True, timeout=120, check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["use-after-free"]


def test_sanitizer_use_before_alloc(dev, san):
    a, b = streams(dev)
    p = a.malloc(1024)
    out = []
    b.launch(read_k, p, 256, out)  # BUG: b is not ordered after a's stream-ordered malloc
    dev.synchronize()
    assert kinds(san.report()) == ["use-before-alloc"]
    a.free(p)


def test_sanitizer_alloc_then_event_is_clean(dev, san):
    a, b = streams(dev)
    p = a.malloc(1024)
    b.wait(a.record())  # recorded after the malloc: b is ordered after it
    b.launch(write_k, p, 256, 1.0)
    a.wait(b.record())
    a.free(p)
    dev.synchronize()
    assert san.report() == []


@pytest.mark.parametrize("mode", ["raise", "collect"])
def test_sanitizer_out_of_bounds_stops_the_kernel(dev, san, mode):
    # in collect mode too (it wrote the neighbour block): compute-sanitizer aborts the kernel
    srt.sanitizer.enable(mode)
    s, = streams(dev, 1)
    a, b = s.malloc(1024), s.malloc(1024)
    p, q = min(a, b), max(a, b)  # q: the neighbour above p in the same pool chunk
    assert q == p + 1024
    s.memset(q, 7, 1024)
    s.launch(write_k, p, 512, 1.0)  # BUG: 2048 bytes from a 1024-byte block
    if mode == "raise":
        with pytest.raises(srt.SanitizerError) as info:
            s.synchronize()
        found = info.value
    else:
        s.synchronize()  # collected: no error, the kernel's own failure not raised either
        found, = san.report()
    assert found.kind == "out-of-bounds" and found.ptr == p
    s.synchronize()  # reported once; the kernel's own failure is not raised again
    out = np.empty(1024, np.uint8)
    s.memcpy(out, q, 1024)
    assert (out == 7).all()  # stopped before writing
    s.free(p)
    s.free(q)


def test_sanitizer_invalid_address(dev, san):
    s, = streams(dev, 1)
    pool = srt.MemPool(dev)  # its own: other tests' blocks of the default pool may live there
    p = s.malloc(512, pool)
    s.launch(write_k, p + 8192, 4, 1.0)  # inside the pool chunk, never allocated
    s.synchronize()
    assert kinds(san.report()) == ["invalid-address"]
    s.free(p)
    s.synchronize()
    pool.destroy()


@pytest.mark.parametrize("mode", ["raise", "collect"])
def test_sanitizer_invalid_address_in_a_pool_chunk_stops_the_kernel(dev, san, mode):
    # mapped pool memory no allocation covers: the write was stopped in raise mode before, and
    # must be in both modes now (it was let through once only unmapped memory stopped a kernel)
    from streamrt.backends.cpu import SPACE

    srt.sanitizer.enable(mode)
    s, = streams(dev, 1)
    pool = srt.MemPool(dev)
    p = s.malloc(512, pool)
    s.synchronize()
    before = SPACE.array(p + 8192, (4,), np.float32, True).copy()
    s.launch(write_k, p + 8192, 4, 1.0)  # BUG: inside the pool chunk, never allocated
    if mode == "raise":
        with pytest.raises(srt.SanitizerError):
            s.synchronize()
    s.synchronize()
    assert kinds(san.report()) == ["invalid-address"]
    assert (SPACE.array(p + 8192, (4,), np.float32, True) == before).all()  # never written
    s.free(p)
    s.synchronize()
    pool.destroy()


def test_sanitizer_access_after_srt_free_is_use_after_free(dev, san):
    # it was "invalid-address" (inside no allocation), which lost where the memory was freed
    s, = streams(dev, 1)
    p = srt.malloc(1024)
    srt.free(p)
    s.launch(write_k, p, 4, 1.0)  # BUG: freed; the kernel is stopped, its failure not raised
    s.synchronize()
    found, = san.report()
    assert found.kind == "use-after-free" and found.ptr == p
    assert "free of" in found.message and HERE in found.message


def test_sanitizer_workspace_freed_too_early(dev, san, gate):
    a, b = streams(dev)
    x = srt.Tensor.from_numpy(np.ones((64, 64), np.float32), stream=a)
    y = srt.Tensor.empty((64, 64), np.float32, stream=a)
    size, ex = ops.softmax.get_workspace_size(x, y)
    assert size > 0  # softmax keeps its row max and sum in the workspace
    ws = a.malloc(size)
    g = gate(a)
    ops.softmax(ws, size, ex, a)
    b.wait(srt.Event(dev))  # (never recorded: no ordering)
    b.free(ws)  # BUG: freed on another stream, not ordered after the executor's kernels
    g.open()
    dev.synchronize()
    rep = san.report()
    assert rep and rep[0].kind == "workspace" and "softmax" in rep[0].message
    x.free(a)
    y.free(a)


def test_sanitizer_refused_workspace_is_an_error_not_a_finding(dev, san):
    # phase 2 refuses it before anything is enqueued: a finding too would raise it again, as a
    # SanitizerError, at the next synchronize of a program that handled the ExecutorError
    s, = streams(dev, 1)
    x = srt.Tensor.from_numpy(np.ones((256, 8), np.float32), stream=s)
    y = srt.Tensor.empty((256, 8), np.float32, stream=s)
    size, ex = ops.softmax.get_workspace_size(x, y)
    assert size >= 2048  # half of it is a smaller block: pool blocks are 512-byte multiples
    small = s.malloc(size // 2)
    with pytest.raises(srt.ExecutorError, match="holds"):
        ops.softmax(small, size, ex, s)
    s.synchronize()
    assert san.report() == []
    ex.destroy()
    s.free(small)
    x.free(s)
    y.free(s)


def test_sanitizer_leaks(dev, san):
    s, = streams(dev, 1)
    p = s.malloc(4096)
    ts = [srt.Tensor.empty((4,), np.float32, stream=s) for _ in range(3)]
    size, ex = ops.add.get_workspace_size(*ts)
    found = srt.sanitizer.check_leaks()
    assert any(f.kind == "leak" and f.ptr == p for f in found)
    assert any("executor" in f.message for f in found)
    assert not srt.sanitizer.report()  # only returned: a leak check raises nothing later
    ex.destroy()
    s.free(p)
    ptrs = [p, *(t.ptr for t in ts)]
    for t in ts:
        t.free(s)
    s.synchronize()
    assert not [f for f in srt.sanitizer.check_leaks() if f.ptr in ptrs]
