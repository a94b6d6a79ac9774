"""Model-based stream capture: random capture programs over 2-4 streams against a model of CUDA.

Hypothesis draws programs that begin a capture on an origin stream in a random mode, fork to
other streams by event record/wait, move buffers between streams (a buffer is only touched by the
stream that owns it, and ownership moves by record/wait: every program is race-free by
construction), enqueue kernels, copies, memsets, host functions and stream-ordered malloc/free,
add capture dependencies, and join back (or, sometimes, not). A model follows each stream's
dependency set, the captured nodes and the events; after every step each stream's
``capture_info`` must match it, and the captured graph must have exactly the model's nodes and
edges (no false serialization between branches, no missing edge). ``end_capture`` must raise
``CaptureUnjoinedError`` exactly when the model has a node that is no ancestor of the origin's
final dependencies (nor of a node dropped by ``update_capture_dependencies(replace=True)``).

Legal programs are replayed (instantiate, launch twice) with delay injection and the sanitizer
in collect mode, and compared byte for byte with the same program run eagerly.

Some programs insert one illegal (or borderline) action at a random point; the model says the
error class CUDA returns, whether the capture is invalidated, and, then, that the next capture
call raises ``CaptureInvalidatedError``, ``end_capture`` too, and every stream leaves capture and
is usable again.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import streamrt as srt
from streamrt.backends import cpu
from streamrt.graph import capture
from tests.conftest import in_thread

M = srt.CaptureMode
T = srt.NodeType
S = srt.CaptureStatus
N = 16  # int32 elements per buffer
NB = N * 4


def _jitter() -> None:
    time.sleep(random.random() * 5e-5)  # graph branches run on threads delay injection misses


@srt.kernel
def mix_kernel(ctx, dst, src, n, c):
    _jitter()
    d = ctx.array(dst, (n,), np.int32)
    d[:] = d * 3 + ctx.array(src, (n,), np.int32, readonly=True) + c


@srt.kernel
def ifill_kernel(ctx, dst, n, c):
    _jitter()
    ctx.array(dst, (n,), np.int32)[:] = c


# -- program generation -------------------------------------------------------------------------
KINDS = ("xfer", "xfer", "edge", "mix", "mix", "mix", "fill", "memset", "copy", "host", "alloc",
         "free", "upd", "drop", "child")
ILLEGAL = ("sync", "query", "devsync", "legacy_launch", "legacy_query", "merge", "merge_rev",
           "captured_event", "isolation", "unsafe_other_thread", "unsafe_same_thread",
           "end_wrong_stream", "end_other_thread", "destroy", "wait_unrecorded",
           "record_other_capture_event", "double_free")


@hst.composite
def programs(draw):
    ns = draw(hst.integers(2, 4))
    nbuf = draw(hst.integers(1, 3))
    mode = draw(hst.sampled_from(list(M)))
    blocking = [draw(hst.booleans()) for _ in range(ns)]
    raw = draw(hst.lists(hst.tuples(hst.sampled_from(KINDS), *[hst.integers(0, 15)] * 4),
                         min_size=1, max_size=25))
    skip_join = [draw(hst.integers(0, 5)) == 0 for _ in range(ns)]
    owner = dict.fromkeys(range(nbuf), 0)  # buffer (or temp "t<k>") -> owning stream
    joined = {0}
    ops: list[tuple] = []
    nev = 0
    ntmp = 0

    def rec_wait(a, b):
        nonlocal nev
        ops.append(("rec", a, nev))
        ops.append(("wait", b, nev))
        nev += 1
        joined.add(b)

    for kind, a, b, c, d in raw:
        live = sorted(owner, key=str)
        if kind == "xfer":
            x = live[a % len(live)]
            o = owner[x]
            to = [t for t in range(ns) if t != o][b % (ns - 1)]
            rec_wait(o, to)
            owner[x] = to
        elif kind == "edge":
            frm = sorted(joined)[a % len(joined)]
            rec_wait(frm, b % ns)
        elif kind in ("mix", "fill", "memset", "copy"):
            x = live[a % len(live)]
            s = owner[x]
            mine = [y for y in live if owner[y] == s]
            y = mine[b % len(mine)]
            if kind == "mix":
                ops.append(("mix", s, x, y, c, d % 4 == 0))  # sometimes from another thread
            elif kind == "fill":
                ops.append(("fill", s, x, c))
            elif kind == "memset":
                ops.append(("memset", s, x, c * 16 + d))
            elif x != y:
                ops.append(("copy", s, x, y))
        elif kind == "host":
            ops.append(("host", sorted(joined)[a % len(joined)], c))
        elif kind == "child":  # an exec launched into the capture: a child graph node
            x = a % nbuf
            ops.append(("child", owner[x], x))
        elif kind == "alloc":
            s = sorted(joined)[a % len(joined)]
            t = f"t{ntmp}"
            ntmp += 1
            ops.append(("alloc", s, t, c))
            owner[t] = s
        elif kind == "free":
            tmps = [y for y in live if isinstance(y, str)]
            if tmps:
                t = tmps[a % len(tmps)]
                ops.append(("free", owner[t], t))
                del owner[t]
        elif kind == "upd":
            ops.append(("upd", sorted(joined)[a % len(joined)], (b, c, d)[: 1 + a % 3]))
        elif kind == "drop":
            idle = [s for s in sorted(joined) if all(o != s for o in owner.values())]
            if idle:  # race-free: a stream that owns nothing may forget its dependencies
                ops.append(("drop", idle[a % len(idle)], (b, c)[: b % 3]))
    for s in sorted(joined):
        if s and not skip_join[s]:
            rec_wait(s, 0)
    for t in [y for y in owner if isinstance(y, str)]:
        # freed on the origin once its stream joined back; else on its own stream: an "upd" may
        # still join that stream's nodes into the origin's (no CaptureUnjoinedError then), and a
        # free on the origin was unordered with them in the eager reference run (a real race)
        s = owner[t]
        ops.append(("free", 0 if s == 0 or not skip_join[s] else s, t))
    illegal = None
    if draw(hst.integers(0, 2)) == 0:
        illegal = (draw(hst.integers(0, len(ops))), draw(hst.sampled_from(ILLEGAL)),
                   draw(hst.integers(0, 15)))
    end_relaxed_elsewhere = mode is M.RELAXED and draw(hst.booleans())
    return dict(ns=ns, nbuf=nbuf, mode=mode, blocking=blocking, ops=ops, nev=nev,
                illegal=illegal, end_elsewhere=end_relaxed_elsewhere)


# -- execution ------------------------------------------------------------------------------------
class Model:
    """What CUDA's capture state would be: per stream dependency set, nodes, captured events."""

    def __init__(self) -> None:
        self.deps: dict[int, tuple[int, ...]] = {0: ()}
        self.nodes: list[tuple[T, tuple[int, ...]]] = []
        self.events: dict[int, tuple[int, ...]] = {}
        self.dropped: set[int] = set()

    def add(self, s: int, t: T) -> None:
        self.nodes.append((t, self.deps[s]))
        self.deps[s] = (len(self.nodes) - 1,)

    def unjoined(self) -> bool:
        seen: set[int] = set()
        stack = [*self.deps[0], *self.dropped]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(self.nodes[n][1])
        return len(seen) != len(self.nodes)


class Run:
    def __init__(self, prog: dict, dev: srt.Device, streams: list, bufs: list, log: list,
                 capturing: bool) -> None:
        self.p, self.dev, self.st, self.bufs, self.log = prog, dev, streams, bufs, log
        self.capturing = capturing
        self.events = [srt.Event(dev) for _ in range(prog["nev"])]
        self.tmps: dict[str, int] = {}
        self.model = Model()
        self.execs = []
        for b in bufs:  # built before the capture: mix the buffer into itself, then fill it
            g = srt.Graph()
            k = g.add_kernel_node(mix_kernel, b, b, N, 5)
            g.add_kernel_node(mix_kernel, b, b, N, 9, deps=[k])
            self.execs.append(g.instantiate())

    def ptr(self, x):
        return self.tmps[x] if isinstance(x, str) else self.bufs[x]

    def step(self, op: tuple) -> None:
        kind, s = op[0], op[1]
        st, m = self.st[s], self.model
        if kind == "rec":
            st.record(self.events[op[2]])
            if self.capturing:
                m.events[op[2]] = m.deps[s]
        elif kind == "wait":
            st.wait(self.events[op[2]])
            if self.capturing:
                m.deps[s] = tuple(dict.fromkeys((*m.deps.get(s, ()), *m.events[op[2]])))
        elif kind == "mix":
            args = (self.ptr(op[2]), self.ptr(op[3]), N, op[4])
            if op[5]:  # enqueued by another thread: captured all the same (any mode)
                in_thread(lambda: st.launch(mix_kernel, *args))
            else:
                st.launch(mix_kernel, *args)
            self._node(s, T.KERNEL)
        elif kind == "child":
            self.execs[op[2]].launch(st)
            self._node(s, T.GRAPH)
        elif kind == "fill":
            st.launch(ifill_kernel, self.ptr(op[2]), N, op[3])
            self._node(s, T.KERNEL)
        elif kind == "memset":
            st.memset(self.ptr(op[2]), op[3], NB)
            self._node(s, T.MEMSET)
        elif kind == "copy":
            st.memcpy(self.ptr(op[2]), self.ptr(op[3]), NB)
            self._node(s, T.MEMCPY)
        elif kind == "host":
            st.launch_host_func(self.log.append, op[2])
            self._node(s, T.HOST)
        elif kind == "alloc":
            self.tmps[op[2]] = st.malloc(NB)
            self._node(s, T.MEM_ALLOC)
            st.memset(self.tmps[op[2]], op[3], NB)
            self._node(s, T.MEMSET)
        elif kind == "free":
            st.free(self.tmps.pop(op[2]))
            self._node(s, T.MEM_FREE)
        elif kind in ("upd", "drop") and self.capturing:
            g = st.capture_info().graph
            nodes = g.nodes()
            if kind == "upd" and not nodes:
                return
            picks = tuple(dict.fromkeys(i % len(nodes) for i in op[2])) if nodes else ()
            st.update_capture_dependencies([nodes[i] for i in picks], replace=kind == "drop")
            if kind == "drop":
                m.dropped.update(n for n in m.deps[s] if n not in picks)
                m.deps[s] = picks
            else:
                m.deps[s] = tuple(dict.fromkeys((*m.deps[s], *picks)))

    def _node(self, s: int, t: T) -> None:
        if self.capturing:
            self.model.add(s, t)

    def check_info(self, cap_id: int, graph) -> None:
        """Every stream's capture_info against the model; the graph's nodes and edges exactly."""
        m = self.model
        nodes = graph.nodes()
        index = {id(n): i for i, n in enumerate(nodes)}
        for i, st in enumerate(self.st):
            info = st.capture_info()
            if i in m.deps:
                assert info.status is S.ACTIVE and info.capture_id == cap_id
                assert info.graph is graph
                got = [index[id(n)] for n in info.dependencies]
                assert len(got) == len(set(got)) and set(got) == set(m.deps[i]), (i, got, m.deps)
                assert st.is_capturing()
            else:
                assert info.status is S.NONE and info.graph is None and not st.is_capturing()
        assert len(nodes) == len(m.nodes)
        for n, (t, deps) in zip(nodes, m.nodes, strict=True):
            assert n.type is t
            got = [index[id(d)] for d in n.dependencies]
            assert len(got) == len(set(got)) and set(got) == set(deps), (n, got, deps)
        want_edges = {(d, i) for i, (_t, deps) in enumerate(m.nodes) for d in deps}
        assert {(index[id(a)], index[id(b)]) for a, b in graph.edges()} == want_edges


def _left_capture_and_usable(dev, streams, scratch) -> None:
    for st in streams:
        assert not st.is_capturing()
        assert st.capture_info().status is S.NONE
        st.launch(ifill_kernel, scratch, N, 7)
        st.synchronize()
        assert st.query()
    dev.default_stream.launch(ifill_kernel, scratch, N, 8)
    dev.synchronize()
    assert srt.read(scratch, (N,), np.int32)[0] == 8


def _illegal(run: Run, kind: str, pick: int, scratch: int, others: list) -> tuple[type | None, bool]:
    """Do the illegal action; return (the error it raised or None, whether it invalidated)."""
    p, m, dev = run.p, run.model, run.dev
    joined = sorted(m.deps)
    j = joined[pick % len(joined)]
    any_j = pick % p["ns"]
    blocking_joined = any(p["blocking"][i] for i in joined)

    def expect(err, invalidates, fn):
        if err is None:
            fn()
        else:
            with pytest.raises(err) as ei:
                fn()
            assert type(ei.value) is err, ei.value
        return err, invalidates

    if kind in ("sync", "query"):
        st = run.st[any_j]
        call = st.synchronize if kind == "sync" else st.query
        if any_j in m.deps:
            return expect(srt.CaptureUnsupportedError, True, call)
        # a stream outside the capture (blocking or not: it does not touch the legacy stream)
        return expect(None, False, call)
    if kind == "devsync":
        return expect(srt.CaptureUnsupportedError, True, dev.synchronize)
    if kind == "legacy_launch":
        err = srt.CaptureImplicitError if blocking_joined else None

        def use():
            dev.default_stream.launch(ifill_kernel, scratch, N, 1)
            dev.default_stream.synchronize()

        return expect(err, blocking_joined, use)
    if kind == "legacy_query":
        err = srt.CaptureImplicitError if blocking_joined else None
        return expect(err, False, dev.default_stream.is_capturing)
    if kind in ("merge", "merge_rev", "record_other_capture_event"):
        x = srt.Stream(dev, non_blocking=True)
        others.append(x)
        x.begin_capture(M.RELAXED)
        if kind == "merge":
            x.launch(ifill_kernel, scratch, N, 1)
            e = x.record()
            res = expect(srt.CaptureMergeError, True, lambda: run.st[j].wait(e))
        elif kind == "merge_rev":
            e = run.st[j].record()
            res = expect(srt.CaptureMergeError, True, lambda: x.wait(e))
        else:  # an event captured here re-recorded by the other capture: no longer ours
            e = run.st[j].record()
            x.record(e)
            x.launch(ifill_kernel, scratch, N, 1)
            res = expect(None, False, lambda: x.wait(e))
            x.end_capture()
            return res
        with pytest.raises(srt.CaptureInvalidatedError):
            x.end_capture()
        return res
    if kind == "captured_event":
        e = run.st[j].record()
        return expect(srt.CapturedEventError, True, e.query)
    if kind == "isolation":
        x = srt.Stream(dev, non_blocking=True)
        others.append(x)
        x.launch(ifill_kernel, scratch, N, 2)
        e = x.record()
        x.synchronize()  # done or not, it is uncaptured work
        return expect(srt.CaptureIsolationError, True, lambda: run.st[j].wait(e))
    if kind in ("unsafe_other_thread", "unsafe_same_thread"):
        refused = p["mode"] is M.GLOBAL or (kind == "unsafe_same_thread" and
                                            p["mode"] is not M.RELAXED)
        # allowed by the mode, cudaMemset still runs on the legacy stream: implicit if blocking
        err = (srt.CaptureUnsupportedError if refused else
               srt.CaptureImplicitError if blocking_joined else None)

        def call():
            srt.memset(scratch, 3, NB)

        return expect(err, err is not None,
                      (lambda: in_thread(call)) if kind == "unsafe_other_thread" else call)
    if kind == "end_wrong_stream":
        if any_j == 0:
            return None, False
        if any_j in m.deps:
            return expect(srt.CaptureUnmatchedError, True, run.st[any_j].end_capture)
        with pytest.raises(srt.IllegalStateError):
            run.st[any_j].end_capture()
        return None, False
    if kind == "end_other_thread":
        if p["mode"] is M.RELAXED:
            return None, False
        return expect(srt.CaptureWrongThreadError, False, lambda: in_thread(run.st[0].end_capture))
    if kind == "destroy":
        return expect(srt.CaptureUnsupportedError, True, run.st[j].destroy)
    if kind == "double_free":  # cudaGraphAddMemFreeNode: an allocation freed twice in a graph
        st = run.st[j]
        t = st.malloc(NB)
        m.add(j, T.MEM_ALLOC)
        st.free(t)
        m.add(j, T.MEM_FREE)
        return expect(srt.InvalidValueError, False, lambda: st.free(t))
    if kind == "wait_unrecorded":
        return expect(None, False, lambda: run.st[j].wait(srt.Event(dev)))
    raise AssertionError(kind)


def _init(bufs) -> None:
    for i, b in enumerate(bufs):
        srt.write(b, np.arange(N, dtype=np.int32) * (i + 2) + 1)


def _state(bufs) -> list[bytes]:
    return [srt.read(b, (N,), np.int32).tobytes() for b in bufs]


def _check_program(prog: dict, dev: srt.Device) -> None:
    streams = [srt.Stream(dev, non_blocking=not b) for b in prog["blocking"]]
    bufs = [srt.malloc(NB, dev) for _ in range(prog["nbuf"])]
    scratch = srt.malloc(NB, dev)
    others: list = []
    log: list = []
    runs: list[Run] = []
    try:
        _init(bufs)
        run = Run(prog, dev, streams, bufs, log, capturing=True)
        runs.append(run)
        o = streams[0]
        o.begin_capture(prog["mode"])
        cap_id = o.capture_info().capture_id
        graph = o.capture_info().graph
        assert cap_id > 0 and graph is not None
        ill = prog["illegal"]
        invalidated = False
        for k, op in enumerate([*prog["ops"], None]):
            if ill is not None and ill[0] == k:
                _err, invalidated = _illegal(run, ill[1], ill[2], scratch, others)
                if invalidated:
                    break
                run.check_info(cap_id, graph)
            if op is None:
                break
            run.step(op)
            run.check_info(cap_id, graph)
        if invalidated:
            joined = [streams[i] for i in run.model.deps if not streams[i]._destroyed]
            for st in joined:
                assert st.is_capturing() and st.capture_info().status is S.INVALIDATED
            with pytest.raises(srt.CaptureInvalidatedError):  # an invalidated capture refuses work
                joined[-1].launch(ifill_kernel, bufs[0], N, 1)
            with pytest.raises(srt.CaptureInvalidatedError):
                o.end_capture()
            _left_capture_and_usable(dev, [st for st in streams if not st._destroyed], scratch)
            return
        unjoined = run.model.unjoined()
        end = (lambda: in_thread(o.end_capture)) if prog["end_elsewhere"] else o.end_capture
        if unjoined:
            with pytest.raises(srt.CaptureUnjoinedError):
                end()
            _left_capture_and_usable(dev, streams, scratch)
            return
        g = end()
        assert g is graph
        _left_capture_and_usable(dev, streams, scratch)

        # eager reference: the same program twice
        _init(bufs)
        dev.synchronize()
        eager_log: list = []
        for _ in range(2):
            er = Run(prog, dev, streams, bufs, eager_log, capturing=False)
            runs.append(er)
            for op in prog["ops"]:
                er.step(op)
            for st in streams:
                st.synchronize()
        want = _state(bufs)
        # replay twice, on the origin then on another stream
        _init(bufs)
        dev.synchronize()
        log.clear()
        ge = g.instantiate()
        try:
            ge.launch(streams[0])
            ge.launch(streams[1])
            streams[1].synchronize()
        finally:
            dev.synchronize()
            ge.destroy()
        assert _state(bufs) == want
        assert Counter(log) == Counter(eager_log)
    finally:
        for cap in list(capture._active):
            cap.finish()
        dev.synchronize()
        for r in runs:
            for ge in r.execs:
                ge.destroy()
        for p in (*bufs, scratch):
            srt.free(p)
        for st in (*streams, *others):
            if not st._destroyed:
                st.destroy()


@pytest.fixture
def dev():
    d = srt.Device("cpu:0")
    yield d
    d.synchronize()


@pytest.fixture
def checked():
    """Delay injection on and the sanitizer collecting: a missing edge, or a false race between
    branches of the replay, shows up."""
    prev = cpu.set_delay_us(50)
    was = srt.sanitizer.enabled()
    srt.sanitizer.enable("collect")
    srt.sanitizer.clear()
    try:
        yield
    finally:
        if not was:
            srt.sanitizer.disable()
        srt.sanitizer.clear()
        cpu.set_delay_us(prev)


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(prog=programs())
def test_capture_model_random_programs(dev, checked, prog):
    srt.sanitizer.clear()
    _check_program(prog, dev)
    found = srt.sanitizer.report()
    assert found == [], "\n".join(map(str, found))


# -- regressions ------------------------------------------------------------------------------------
def test_capture_model_double_free_in_capture_refused_at_the_free(dev):
    """cudaFreeAsync in capture makes a free node, and cudaGraphAddMemFreeNode refuses an
    allocation freed twice in one graph: the second free raises there (it was accepted, and only
    instantiate refused the graph); the capture stays usable."""
    s = srt.Stream(dev, non_blocking=True)
    s.begin_capture(M.THREAD_LOCAL)
    p = s.malloc(NB)
    s.launch(ifill_kernel, p, N, 4)
    s.free(p)
    with pytest.raises(srt.InvalidValueError):
        s.free(p)
    assert s.capture_info().status is S.ACTIVE
    g = s.end_capture()
    assert [n.type for n in g.nodes()] == [T.MEM_ALLOC, T.KERNEL, T.MEM_FREE]
    ge = g.instantiate()
    for _ in range(2):  # the graph is whole: freed once per launch, relaunchable
        ge.launch(s)
    s.synchronize()
    ge.destroy()
    s.destroy()


def test_capture_model_double_free_node_refused_when_added():
    g = srt.Graph()
    a = g.add_mem_alloc_node(NB)
    f = g.add_mem_free_node(a.ptr, deps=[a])
    with pytest.raises(srt.InvalidValueError):
        g.add_mem_free_node(a.ptr, deps=[f])
    assert len(g.nodes()) == 2
    c = g.clone()  # a clone frees it already too
    with pytest.raises(srt.InvalidValueError):
        c.add_mem_free_node(a.ptr)
    other = srt.Graph()  # another graph may free it (once)
    other.add_mem_free_node(a.ptr)
    g.instantiate().destroy()
