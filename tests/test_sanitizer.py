"""The stream-order sanitizer: every finding kind from a planted bug, no false positives."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import ops

from .conftest import backend_device, fill_kernel

HERE = "test_sanitizer.py:"


@pytest.fixture
def san_off():
    """The sanitizer off and its findings cleared, for a test that turns it on mid-program (the
    conftest puts it back as the run had it)."""
    srt.sanitizer.disable()
    srt.sanitizer.clear()
    yield srt.sanitizer
    srt.sanitizer.disable()
    srt.sanitizer.clear()


@srt.kernel
def write_k(ctx, p, n, v):
    ctx.array(p, (n,), np.float32)[:] = v


@srt.kernel
def read_k(ctx, p, n, out):
    out.append(float(ctx.array(p, (n,), np.float32, readonly=True).sum()))


@srt.kernel
def set_k(ctx, event):
    event.set()


def streams(dev, k=2):
    return [srt.Stream(dev, non_blocking=True) for _ in range(k)]


def kinds(report):
    return [f.kind for f in report]


def test_sanitizer_race_between_unordered_streams(dev, san):
    a, b = streams(dev)
    p = srt.malloc(1024)  # host allocation: ordered before everything
    a.launch(write_k, p, 256, 1.0)
    b.launch(write_k, p, 256, 2.0)  # BUG: no wait on a's write
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"]
    f = rep[0]
    assert f.ptr == p and len(f.streams) == 2 and a.name in str(f) and b.name in str(f)
    assert str(f).count(HERE) == 2  # both enqueue sites, file and line
    srt.free(p)


def test_sanitizer_ordered_streams_are_clean(dev, san):
    a, b = streams(dev)
    p = srt.malloc(1024)
    a.launch(write_k, p, 256, 1.0)
    b.wait(a.record())
    out = []
    b.launch(read_k, p, 256, out)
    a.wait(b.record())
    a.launch(write_k, p, 256, 3.0)
    dev.synchronize()
    assert san.report() == [] and out == [256.0]
    srt.free(p)


def test_sanitizer_read_read_is_not_a_race(dev, san):
    a, b = streams(dev)
    p = srt.malloc(1024)
    out = []
    a.launch(read_k, p, 256, out)
    b.launch(read_k, p, 256, out)
    dev.synchronize()
    assert san.report() == []
    srt.free(p)


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


def test_sanitizer_legacy_ordering_covers_stream_ordered_frees(dev, san):
    # CUDA: a legacy-stream action waits for every blocking stream, and a blocking stream's
    # action for the legacy stream; a free is such an action (pool memory and graph memory)
    leg, s = dev.default_stream, srt.Stream(dev)  # s blocking
    p = s.malloc(1024)
    s.launch(write_k, p, 256, 1.0)
    leg.free(p)  # after s's kernel
    q = leg.malloc(1024)
    leg.launch(write_k, q, 256, 2.0)
    s.free(q)  # after the legacy kernel
    g = srt.Graph()
    a = g.add_mem_alloc_node(1024)
    g.add_kernel_node(write_k, a.ptr, 256, 3.0, deps=[a])
    g.instantiate().launch(s)
    leg.launch(write_k, a.ptr, 256, 4.0)  # after the launch
    s.free(a.ptr)  # graph memory freed outside its graph: after the legacy kernel
    dev.synchronize()
    assert san.report() == []


def test_sanitizer_unordered_write_never_drops_out_of_the_history(dev, san):
    # 80 later accesses to other slices of the buffer once evicted the write (a cap of 64), and
    # its race with a read on a third stream went unseen; a query is no proof it completed
    from streamrt.sanitizer import _SAN

    a, b, c = streams(dev, 3)
    p = srt.malloc(1 << 20)
    a.launch(write_k, p, 4, 1.0)
    for i in range(1, 80):
        c.launch(write_k, p + 1024 * i, 4, 2.0)
    a._q._wait(a._pos)  # ran: the workers' counts, not a host synchronize
    c._q._wait(c._pos)
    out = []
    b.launch(read_k, p, 4, out)  # BUG: never ordered after a's write
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and rep[0].ptr == p and a.name in str(rep[0])
    for i in range(200):  # proven complete: forgotten, the history stays short
        c.launch(write_k, p + 1024 * (i % 500), 4, 3.0)
        c.synchronize()
    assert _SAN._live[p].count == 1
    srt.free(p)


def test_sanitizer_enabled_mid_program_knows_the_live_allocations(dev, san_off):
    # pool memory allocated before enable() was "pool memory that no allocation ever covered"
    # (a false invalid-address); and after an off/on cycle, operations enqueued while it was on
    # whose end it never saw stopped it forgetting any access for the rest of the process
    import streamrt.sanitizer as sanitizer

    a, b = streams(dev)
    p = a.malloc(1024)
    q = srt.malloc(256)
    a.launch(write_k, p, 256, 1.0)
    dev.synchronize()
    srt.sanitizer.enable("collect")
    a.launch(write_k, p, 256, 2.0)
    a.launch(write_k, q, 64, 2.0)
    b.launch(write_k, p, 256, 3.0)  # BUG: unordered with a's write: still found
    dev.synchronize()
    assert kinds(srt.sanitizer.report()) == ["race"]  # and no invalid address
    a.launch(write_k, p, 256, 4.0)  # enqueued while on, run after the sanitizer is off
    srt.sanitizer.disable()
    dev.synchronize()
    srt.sanitizer.enable("collect")
    assert sanitizer._SAN._oldest_inflight() == 1 << 62  # nothing left in flight
    a.free(p)
    srt.free(q)
    dev.synchronize()


def test_sanitizer_turned_back_on_does_not_judge_work_enqueued_before(dev, san_off):
    # an operation enqueued in an earlier on period that runs after enable() was checked
    # against the new history, where its memory was allocated after it: a false use-before-alloc
    (a,) = streams(dev, 1)
    p = a.malloc(1024)
    dev.synchronize()
    srt.sanitizer.enable("collect")
    gate = threading.Event()
    a.launch_host_func(gate.wait)
    a.launch(write_k, p, 256, 4.0)  # enqueued while on, runs once on again
    srt.sanitizer.disable()
    srt.sanitizer.enable("collect")
    gate.set()
    a.launch(write_k, p, 256, 5.0)  # checked: ordered after the allocation
    dev.synchronize()
    assert kinds(srt.sanitizer.report()) == []
    assert srt.read(p, (1,), np.float32)[0] == 5.0
    a.free(p)
    dev.synchronize()


def test_sanitizer_checks_an_access_only_against_unordered_ones(dev, san, monkeypatch):
    # each access once scanned every access to its buffer the host had not proven complete:
    # thousands of ordered launches on one buffer without a synchronize went quadratic
    import streamrt.sanitizer.generation as sanitizer  # the race check calls op_before_op from here

    calls = []
    real = sanitizer.op_before_op
    monkeypatch.setattr(sanitizer, "op_before_op", lambda a, x: calls.append(1) or real(a, x))
    a, b = streams(dev, 2)
    p = srt.malloc(1024)
    early = []
    b.launch(read_k, p, 4, early)  # unordered with what a does next, among many ordered reads
    for _ in range(300):
        a.launch(read_k, p, 256, [])
    a.launch(write_k, p, 256, 1.0)
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and b.name in str(rep[0]) and "writes" in str(rep[0])
    assert len(calls) < 20  # b's read and a few more, not the 300 reads a's own order covers
    srt.free(p)


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
                         text=True, timeout=120, check=True, cwd=Path(__file__).parents[1])
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


@srt.kernel
def read_halves_k(ctx, p, n):
    for half in (p, p + n * 2):
        ctx.array(half, (n // 2,), np.float32, readonly=True).sum()


def test_sanitizer_one_bug_of_one_operation_is_one_finding(dev, san, gate):
    # a kernel reading both halves of a buffer freed too early: one use-after-free, not two
    a, b = streams(dev)
    p = a.malloc(1024)
    a.memset(p, 0, 1024)
    b.wait(a.record())
    g = gate(b)
    b.launch(read_halves_k, p, 256)
    a.free(p)  # BUG: not ordered after b's kernel
    g.open()
    dev.synchronize()
    assert kinds(san.report()) == ["use-after-free"]


@srt.kernel
def inc_k(ctx, p, n):
    ctx.array(p, (n,), np.float32)[:] += 1


def test_sanitizer_names_graph_nodes_as_g_nodes_lists_them(dev, san, tmp_path):
    # "node #k" was the node's place in the replay order, not in g.nodes(): here #1 was nodes()[0]
    s, = streams(dev, 1)
    p, q = srt.malloc(1024), srt.malloc(1024)
    g = srt.Graph()
    a = g.add_kernel_node(inc_k, p, 256)
    b = g.add_kernel_node(write_k, q, 256, 1.0)
    c = g.add_kernel_node(write_k, p, 256, 2.0)  # BUG: unordered with a
    g.add_dependencies([b, b], [a, c])  # b runs first
    with srt.trace(tmp_path / "t.json"):
        g.instantiate().launch(s)
        s.synchronize()
    f, = san.report()
    assert "'inc_k' on" in f.message and "node #0" in f.message and "node #2" in f.message
    assert "node #1" not in f.message
    import json

    positions = {e["name"]: e["args"].get("position") for e in
                 json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("ph") == "X"}
    assert positions.get("inc_k") == "node #0"


@srt.kernel
def write_pieces_k(ctx, ptrs, n):
    for p in ptrs:
        ctx.array(p, (n,), np.float32)[:] = 1


def test_sanitizer_race_is_one_finding_per_allocation(dev, san):
    # two unordered kernels writing two halves of one buffer: one race; of two buffers: two
    a, b = streams(dev)
    p, q = srt.malloc(1024), srt.malloc(1024)
    a.launch(write_pieces_k, (p, p + 512, q), 128)
    b.launch(write_pieces_k, (p, p + 512, q), 128)  # BUG: no wait
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race", "race"] and {f.ptr for f in rep} == {p, q}
    srt.free(p)
    srt.free(q)


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


def test_sanitizer_raise_mode_raises_at_synchronize(dev, san):
    srt.sanitizer.enable("raise")
    a, b = streams(dev)
    p = srt.malloc(1024)
    a.launch(write_k, p, 256, 1.0)
    b.launch(write_k, p, 256, 2.0)
    with pytest.raises(srt.SanitizerError) as info:
        dev.synchronize()
    assert info.value.kind == "race" and info.value.ptr == p
    assert isinstance(info.value.finding, srt.sanitizer.Finding)
    assert len(info.value.streams) == 2 and info.value.op is not None and info.value.other
    assert {info.value.op.stream, info.value.other.stream} == {a, b}
    dev.synchronize()  # raised once
    srt.free(p)


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


def test_sanitizer_keeps_the_name_of_a_failing_operation(dev, san):
    # the sanitizer wraps each operation; a failure still names the function that raised
    s, = streams(dev, 1)

    def failing_host_fn():
        raise KeyError("x")

    s.launch_host_func(failing_host_fn)
    with pytest.raises(srt.LaunchError, match="failing_host_fn"):
        s.synchronize()


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


def test_sanitizer_enable_validation():
    with pytest.raises(srt.InvalidValueError):
        srt.sanitizer.enable("loud")


def test_sanitizer_env_switch():
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, streamrt as srt\n"
        "@srt.kernel\ndef w(ctx, p):\n    ctx.array(p, (4,), np.float32)[:] = 1\n"
        "a = srt.Stream(non_blocking=True); b = srt.Stream(non_blocking=True)\n"
        "p = srt.malloc(16); a.launch(w, p); b.launch(w, p)\n"
        "try:\n    srt.Device().synchronize()\nexcept srt.SanitizerError as e:\n    print(e.kind)\n"
    )
    env = dict(os.environ, STREAMRT_SANITIZE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "race"


# -- no false positives on correct programs --------------------------------------------------
program = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(("write", "read", "realloc", "op", "graph")),
              st.integers(0, 2)),
    min_size=1, max_size=25,
)


ACCESSES = ("write", "read", "op", "graph")  # what ``access`` enqueues


def access(s: srt.Stream, what: str, ptr: int, n: int, out: list) -> None:
    """Enqueue one use of ``n`` float32 at ``ptr`` on ``s``: a kernel that writes or reads, an
    operator (reads and writes), or a graph of a write then a read, launched twice."""
    if what == "write":
        s.launch(fill_kernel, ptr, n, float(s.id % 7))
    elif what == "read":
        s.launch(read_k, ptr, n, out)
    elif what == "op":
        t = srt.Tensor(srt.TensorDesc((n,), np.float32), ptr, device=s.device)
        ops.run(ops.add, t, t, t, stream=s)
    else:
        g = srt.Graph()
        w = g.add_kernel_node(fill_kernel, ptr, n, 1.0)
        g.add_kernel_node(read_k, ptr, n, out, deps=[w])
        ge = g.instantiate()
        ge.launch(s)
        ge.launch(s)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_sanitizer_no_false_positives_on_correct_programs(ops_list):
    """Random programs made correct by construction: each access waits on the last accesses of
    the buffer on other streams; frees wait for every use; no finding is allowed."""
    srt.sanitizer.clear()
    srt.sanitizer.enable("collect")
    try:
        dev = srt.Device("cpu:0")
        ss = streams(dev, 3)
        n = 64
        bufs = [ss[0].malloc(n * 4) for _ in range(3)]
        last: dict[int, list] = {i: [ss[0].record()] for i in range(3)}  # events after uses
        out: list = []
        for si, what, bi in ops_list:
            s = ss[si]
            for e in last[bi]:
                s.wait(e)  # ordered after every earlier use of the buffer
            if what in ACCESSES:
                access(s, what, bufs[bi], n, out)
            else:  # free and allocate again on this stream
                s.free(bufs[bi])
                bufs[bi] = s.malloc(n * 4)
            last[bi] = [s.record()]
        for s in ss:
            for bi in range(3):
                for e in last[bi]:
                    s.wait(e)
        for b in bufs:
            ss[0].free(b)
        dev.synchronize()
        assert srt.sanitizer.report() == []
    finally:
        srt.sanitizer.disable()
        srt.sanitizer.clear()


def test_sanitizer_graph_nodes(dev, san):
    s, = streams(dev, 1)
    p = srt.malloc(1024)
    g = srt.Graph()
    a = g.add_kernel_node(write_k, p, 256, 1.0)
    b = g.add_kernel_node(write_k, p, 256, 2.0)  # BUG: no edge between the two writers
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and "node #0" in str(rep[0]) and "node #1" in str(rep[0])
    srt.sanitizer.clear()
    g.add_dependencies(a, b)  # fixed: ordered by an edge, and launches are ordered too
    ge2 = g.instantiate()
    for _ in range(3):
        ge2.launch(s)
    s.synchronize()
    assert san.report() == []
    srt.free(p)


GRAPH_MEMORY_BUGS = ["parallel writers", "node not after the alloc", "node not before the free",
                     "unordered stream", "after a free outside the graph", "after srt.free"]


@pytest.mark.parametrize("bug", GRAPH_MEMORY_BUGS)
def test_sanitizer_graph_memory(dev, san, bug):
    # graph allocations (MEM_ALLOC nodes) were not tracked at all: none of these was reported
    s, t = streams(dev)
    g = srt.Graph()
    a = g.add_mem_alloc_node(1024)
    w = g.add_kernel_node(write_k, a.ptr, 256, 1.0, deps=[a])
    if bug == "parallel writers":
        w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[a])  # BUG: no edge to w
        g.add_mem_free_node(a.ptr, deps=[w, w2])
    elif bug == "node not after the alloc":
        w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0)  # BUG: a root, not after the alloc
        g.add_mem_free_node(a.ptr, deps=[w, w2])
    elif bug == "node not before the free":
        f = g.add_mem_free_node(a.ptr, deps=[w])
        g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[a])  # BUG: not before the free
        assert f.type is srt.NodeType.MEM_FREE
    ge = g.instantiate()
    ge.launch(s)
    if bug == "unordered stream":
        t.launch(write_k, a.ptr, 256, 3.0)  # BUG: no wait on the launch that allocates
    elif bug == "after a free outside the graph":
        t.wait(s.record())
        out: list[float] = []
        t.launch(read_k, a.ptr, 256, out)  # ordered: fine
        s.wait(t.record())
        s.free(a.ptr)
        t.launch(write_k, a.ptr, 256, 4.0)  # BUG: not ordered after the free
    elif bug == "after srt.free":
        s.synchronize()
        srt.free(a.ptr)
        t.launch(write_k, a.ptr, 256, 4.0)  # BUG: the allocation is gone
    dev.synchronize()
    expected = {"unordered stream": "use-before-alloc", "node not after the alloc":
                "use-before-alloc", "parallel writers": "race"}.get(bug, "use-after-free")
    rep = san.report()
    assert kinds(rep) == [expected], rep
    assert expected == "race" or "graph allocation" in str(rep[0])
    if bug == "unordered stream":
        s.free(a.ptr)  # still live: the launch did not free it
    ge.destroy()


def test_sanitizer_graph_memory_auto_free_races_an_access(dev, san):
    # auto_free_on_launch frees the previous launch's allocation as the next launch starts: a
    # read on another stream not ordered before that launch was not reported
    s, t = streams(dev)
    h = srt.Graph()
    b = h.add_mem_alloc_node(1024)
    h.add_kernel_node(write_k, b.ptr, 256, 1.0, deps=[b])
    he = h.instantiate(auto_free_on_launch=True)
    he.launch(s)
    t.wait(s.record())
    out: list[float] = []
    t.launch(read_k, b.ptr, 256, out)
    he.launch(s)  # BUG: s does not wait for t's read before the allocation is freed
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["use-after-free"], rep
    s.free(b.ptr)
    s.synchronize()
    he.destroy()


def test_sanitizer_graph_memory_correct_programs_are_clean(dev, san):
    s, t = streams(dev)
    g = srt.Graph()
    a = g.add_mem_alloc_node(1024)
    w = g.add_kernel_node(write_k, a.ptr, 256, 1.0, deps=[a])
    w2 = g.add_kernel_node(write_k, a.ptr, 256, 2.0, deps=[w])
    g.add_mem_free_node(a.ptr, deps=[w2])
    ge = g.instantiate()
    for _ in range(3):  # relaunches: each launch a new allocation of the same address
        ge.launch(s)
    h = srt.Graph()  # an allocation that escapes, used on another stream, freed by a graph
    b = h.add_mem_alloc_node(1024)
    h.add_kernel_node(write_k, b.ptr, 256, 1.0, deps=[b])
    he = h.instantiate(auto_free_on_launch=True)
    he.launch(s)
    he.launch(s)  # frees the first launch's allocation as it starts
    t.wait(s.record())
    out: list[float] = []
    t.launch(read_k, b.ptr, 256, out)
    f = srt.Graph()
    f.add_mem_free_node(b.ptr)
    fe = f.instantiate()
    s.wait(t.record())
    fe.launch(s)
    dev.synchronize()
    assert san.report() == [] and out == [256.0]
    for e in (ge, he, fe):
        e.destroy()


@pytest.mark.cuda
def test_sanitizer_refuses_cuda_streams_and_leaves_them_intact(san):
    # it sees kernel accesses as the views the cpu backend makes: on cuda it would see nothing
    dev = backend_device("cuda")
    s = srt.Stream(dev, non_blocking=True)
    p = srt.malloc(64, dev)
    pos = s._pos
    with pytest.raises(srt.NotSupportedError, match="sanitizer"):
        s.memset(p, 0, 64)
    assert s._pos == pos  # nothing half-enqueued
    san.disable()
    s.memset(p, 1, 64)
    s.synchronize()
    assert (srt.read(p, (64,), np.uint8) == 1).all()
    srt.free(p)
