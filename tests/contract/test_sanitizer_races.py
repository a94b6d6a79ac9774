"""The sanitizer's races: between unordered streams, none between ordered ones or two reads, legacy
ordering, the access history, one finding per bug and allocation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import streamrt as srt
from tests.contract.sanitizer_helpers import kinds, read_k, streams, write_k

HERE = f"{Path(__file__).name}:"  # where the sanitizer says this file enqueued an access


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
    assert len(_SAN._live[p].starts) < 40  # the slices' entries go once proven: few segments
    srt.free(p)


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
    # each access is judged against the entries no later access superseded (b's read), not
    # against the 300 reads a's own order covers
    assert len(calls) <= 302
    srt.free(p)


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


# A stream's run of whole-buffer accesses takes a shortcut (generation.py's ``streak``): the
# entries are replaced without a check. Whatever another stream does must leave it.
@pytest.mark.parametrize("held", ["a", "b"])
def test_an_unordered_access_after_a_streak_of_one_stream_races(dev, san, gate, held):
    a, b = streams(dev)
    p = srt.malloc(1024)
    g = gate(a if held == "a" else b)
    for _ in range(3):
        a.launch(write_k, p, 256, 1.0)
        a.launch(read_k, p, 256, [])
    b.launch(read_k, p, 256, [])  # BUG: unordered with a's writes
    first = b if held == "a" else a
    first._q._wait(first._pos)  # (no host proof)
    g.open()
    dev.synchronize()
    rep = san.report()
    # b's read first: each of a's writes races with it; last: it races with a's last write
    assert kinds(rep) == ["race"] * (3 if held == "a" else 1)
    assert all(a.name in str(f) and b.name in str(f) for f in rep)
    srt.free(p)


def test_a_streak_ends_at_another_streams_access(dev, san, gate):
    a, b = streams(dev)
    p = srt.malloc(1024)
    for _ in range(3):
        a.launch(write_k, p, 256, 1.0)
    b.wait(a.record())
    b.launch(read_k, p, 256, [])  # ordered after a's writes: clean
    b._q._wait(b._pos)  # b's read ran (no host proof)
    a.launch(write_k, p, 256, 2.0)  # BUG: not ordered after b's read
    dev.synchronize()
    rep = san.report()
    assert kinds(rep) == ["race"] and "read" in str(rep[0])
    srt.free(p)


def test_a_streak_ends_at_the_free(dev, san):
    a = streams(dev, 1)[0]
    p = a.malloc(1024)
    for _ in range(3):
        a.launch(write_k, p, 256, 1.0)
    a.free(p)
    a.launch(write_k, p, 256, 2.0)  # BUG: after the free
    dev.synchronize()
    assert kinds(san.report()) == ["use-after-free"]


@srt.kernel
def write_twice_k(ctx, p, n):
    ctx.array(p, (n,), np.float32, readonly=True).sum()
    ctx.array(p, (n,), np.float32)[:] = 3.0


def test_a_streak_holds_an_operation_touching_one_buffer_twice(dev, san):
    a, b = streams(dev)
    p = srt.malloc(1024)
    for _ in range(3):
        a.launch(write_twice_k, p, 256)
    b.wait(a.record())
    b.launch(write_k, p, 256, 1.0)
    a.wait(b.record())
    a.launch(write_twice_k, p, 256)
    dev.synchronize()
    assert san.report() == [] and srt.read(p, (256,), np.float32)[0] == 3.0
    srt.free(p)
