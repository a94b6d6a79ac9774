"""Differential: random multi-stream programs give identical bytes run eagerly and as a graph.

Hypothesis draws programs of kernels over several buffers, device copies, memsets, host<->device
copies, host functions, pool allocations and frees, and explicit event record/wait pairs over
two or three streams. A small vector-clock model inserts the record/wait pairs that make every
conflicting access ordered (so both runs are race-free and deterministic), forks every side
stream from the origin at its first use and joins it back at the end. The program then runs three
times eagerly, and once under capture whose graph is launched three times (on rotating streams);
buffers, host outputs and the host-function log must match byte for byte. Programs without pool
allocations also check ``GraphExec.update`` with a variant of the same program. It runs on every
backend: on cuda the graph is a native ``cudaGraph_t``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt.graph import capture
from tests.conftest import BACKENDS, _grid_stride, backend_device, restore_delays, set_delays

N = 32  # int32 elements per buffer
NB = N * 4

KINDS = ("mix", "mix", "fill", "copy", "memset", "h2d", "d2h", "host", "alloc", "alloc", "free",
         "tmix", "tmix", "tmix", "sync")


def _jitter() -> None:
    """Delay injection inside the test kernels (0-100 us, GIL released): graph branches run on
    worker threads that the cpu backend's own delay injection does not reach, and a missing
    edge must show up as a wrong result rather than hide behind tiny, serial kernels."""
    time.sleep(random.random() * 1e-4)


# int32 arithmetic that wraps, as numpy's does (unsigned in C: signed overflow is undefined)
@srt.kernel(cuda=_grid_stride("mix_kernel", "int* dst, const int* src, int n, int c",
                              "dst[i] = (int)((unsigned)dst[i] * 3u + (unsigned)src[i] + (unsigned)c)"),
            signature="ptr, ptr, i32, i32")
def mix_kernel(ctx, dst, src, n, c):
    _jitter()
    d = ctx.array(dst, (n,), np.int32)
    d[:] = d * 3 + ctx.array(src, (n,), np.int32, readonly=True) + c  # wraps: exact in any order


@srt.kernel(cuda=_grid_stride("ifill_kernel", "int* dst, int n, int c", "dst[i] = c"),
            signature="ptr, i32, i32")
def ifill_kernel(ctx, dst, n, c):
    _jitter()
    ctx.array(dst, (n,), np.int32)[:] = c


@dataclass
class Program:
    blocking: list[bool]  # per side stream
    nbuf: int
    nhost: int  # host output arrays (targets of device->host copies)
    ops: list[tuple] = field(default_factory=list)
    has_alloc: bool = False


class _Model:
    """Vector clocks and per-resource access history; emits ops with the waits they need."""

    def __init__(self, nstreams: int) -> None:
        self.pos = [0] * nstreams
        self.clock = [dict() for _ in range(nstreams)]
        self.last_write: dict = {}
        self.reads: dict = {}
        self.ops: list[tuple] = []
        self.nevents = 0

    def _snapshot(self, s: int) -> dict:
        snap = dict(self.clock[s])
        snap[s] = self.pos[s]
        return snap

    def sync(self, frm: int, to: int) -> None:
        """record on ``frm``, wait on ``to``."""
        ev = self.nevents
        self.nevents += 1
        self.ops.append(("record", frm, ev))
        self.ops.append(("wait", to, ev))
        if frm != to:
            for k, v in self._snapshot(frm).items():
                if v > self.clock[to].get(k, 0):
                    self.clock[to][k] = v

    def emit(self, s: int, op: tuple, reads=(), writes=()) -> None:
        need: list[tuple[int, int]] = []
        for r in reads:
            if r in self.last_write:
                need.append(self.last_write[r])
        for w in writes:
            if w in self.last_write:
                need.append(self.last_write[w])
            need.extend(self.reads.get(w, ()))
        for t, p in need:
            if t != s and self.clock[s].get(t, 0) < p:
                self.sync(t, s)
        self.pos[s] += 1
        here = (s, self.pos[s])
        for r in reads:
            self.reads.setdefault(r, []).append(here)
        for w in writes:
            self.last_write[w] = here
            self.reads[w] = []
        self.ops.append(op)


@st.composite
def programs(draw) -> Program:
    nstreams = draw(st.integers(2, 3))
    prog = Program(
        blocking=[draw(st.booleans()) for _ in range(nstreams - 1)],
        nbuf=draw(st.integers(2, 4)),
        nhost=draw(st.integers(1, 2)),
    )
    raw = draw(st.lists(
        st.tuples(st.sampled_from(KINDS), st.integers(0, nstreams - 1), st.integers(0, 15),
                  st.integers(0, 15), st.integers(0, 255)),
        min_size=6, max_size=60,
    ))
    m = _Model(nstreams)
    forked: set[int] = set()

    def fork(*ss: int) -> None:
        # each side stream forks from the origin at its first use, after the origin's work so
        # far: a dropped fork edge then lets the side stream race that work
        for side in ss:
            if side and side not in forked:
                forked.add(side)
                m.sync(0, side)

    live: list[tuple] = []  # live temporaries
    ntmp = 0
    nb, nh = prog.nbuf, prog.nhost
    sink = ("buf", nb)  # one more buffer, written only by _fold_and_free
    for kind, s, a, b, c in raw:
        fork(s)
        buf = ("buf", a % nb)
        src = ("buf", b % nb)
        if kind == "mix":
            m.emit(s, ("mix", s, buf, src, c), reads=(buf, src), writes=(buf,))
        elif kind == "fill":
            m.emit(s, ("fill", s, buf, c), writes=(buf,))
        elif kind == "copy" and buf != src:
            nbytes = 4 * (1 + c % N)
            m.emit(s, ("copy", s, buf, src, nbytes), reads=(src,), writes=(buf,))
        elif kind == "memset":
            m.emit(s, ("memset", s, buf, c, 1 + b % NB), writes=(buf,))
        elif kind == "h2d":
            m.emit(s, ("h2d", s, buf, c % 3), writes=(buf,))
        elif kind == "d2h":
            out = ("hout", b % nh)
            m.emit(s, ("d2h", s, out, buf), reads=(buf,), writes=(out,))
        elif kind == "host":
            out = ("hout", b % nh)
            m.emit(s, ("host", s, out, c), reads=(out,))
        elif kind == "alloc" and len(live) < 3:
            t = ("tmp", ntmp)
            ntmp += 1
            live.append(t)
            prog.has_alloc = True
            m.emit(s, ("alloc", s, t), writes=(t,))
            m.emit(s, ("fill", s, t, c), writes=(t,))  # graph memory starts undefined
        elif kind == "tmix" and live:
            t = live[a % len(live)]
            if c % 2:  # temp <- buffer, or buffer <- temp
                m.emit(s, ("mix", s, t, src, c), reads=(t, src), writes=(t,))
            else:
                m.emit(s, ("mix", s, buf, t, c), reads=(buf, t), writes=(buf,))
        elif kind == "free" and live:
            t = live.pop(a % len(live))
            _fold_and_free(m, s, t, sink)
        elif kind == "sync":
            fork(a % nstreams)
            m.sync(s, a % nstreams)
    for side in sorted(forked):  # join every forked side stream back
        m.sync(side, 0)
    for t in live:
        _fold_and_free(m, 0, t, sink)
    prog.ops = m.ops
    return prog


def _fold_and_free(m: _Model, s: int, t: tuple, sink: tuple) -> None:
    """Fold a temporary's final bytes into the sink buffer, then free it: makes every temporary
    observable (two temporaries wrongly sharing memory change the sink)."""
    m.emit(s, ("mix", s, sink, t, 1), reads=(sink, t), writes=(sink,))
    m.emit(s, ("free", s, t), writes=(t,))


class _Run:
    """Program state of one mode: streams, buffers, host arrays, log."""

    def __init__(self, dev, prog: Program, streams, bufs) -> None:
        self.dev = dev
        self.streams = streams
        self.bufs = bufs
        self.hout = [np.zeros(N, np.int32) for _ in range(prog.nhost)]
        self.hin = [np.arange(N, dtype=np.int32) * (k + 2) - 7 for k in range(3)]
        self.log: list = []

    def reset(self, seed: int) -> None:
        for i, p in enumerate(self.bufs):
            srt.write(p, (np.arange(N, dtype=np.int32) * (i + 1) + seed) ^ 0x5A5A)
        for h in self.hout:
            h[:] = 0
        self.log.clear()

    def host_fn(self, tag, arr):
        _jitter()
        self.log.append((tag, arr.tobytes()))

    def execute(self, prog: Program, bump: int = 0) -> None:
        """Enqueue the program once (eagerly, or into a capture); ``bump`` varies constants."""
        ss = self.streams
        events: dict[int, srt.Event] = {}
        tmps: dict = {}

        def ptr(res):
            return self.bufs[res[1]] if res[0] == "buf" else tmps[res]

        for op in prog.ops:
            kind, si = op[0], op[1]
            s = ss[si]
            if kind == "record":
                events[op[2]] = s.record()
            elif kind == "wait":
                s.wait(events[op[2]])
            elif kind == "mix":
                s.launch(mix_kernel, ptr(op[2]), ptr(op[3]), N, op[4] + bump)
            elif kind == "fill":
                s.launch(ifill_kernel, ptr(op[2]), N, op[3] + bump)
            elif kind == "copy":
                s.memcpy(ptr(op[2]), ptr(op[3]), op[4])
            elif kind == "memset":
                s.memset(ptr(op[2]), (op[3] + bump) % 256, op[4])
            elif kind == "h2d":
                s.memcpy(ptr(op[2]), self.hin[op[3]], NB)
            elif kind == "d2h":
                s.memcpy(self.hout[op[2][1]], ptr(op[3]), NB)
            elif kind == "host":
                s.launch_host_func(self.host_fn, op[3] + bump, self.hout[op[2][1]])
            elif kind == "alloc":
                tmps[op[2]] = s.malloc(NB)
            elif kind == "free":
                s.free(tmps.pop(op[2]))
            else:  # pragma: no cover - the generator emits nothing else
                raise AssertionError(op)

    def snapshot(self):
        self.dev.synchronize()
        return ([srt.read(p, (N,), np.int32).tobytes() for p in self.bufs],
                [h.tobytes() for h in self.hout], sorted(self.log))


def _check(prog: Program, seed: int, dev: srt.Device) -> None:
    origin = srt.Stream(dev, non_blocking=True)
    streams = [origin] + [srt.Stream(dev, non_blocking=not b) for b in prog.blocking]
    bufs = [srt.malloc(NB, dev) for _ in range(prog.nbuf + 1)]  # + the sink
    run = _Run(dev, prog, streams, bufs)
    execs = []
    try:
        # eager, three times
        run.reset(seed)
        for _ in range(3):
            run.execute(prog)
        eager = run.snapshot()

        # captured once, launched three times on rotating streams
        run.reset(seed)
        origin.begin_capture()
        try:
            run.execute(prog)
        finally:
            graph = origin.end_capture()
        ge = graph.instantiate()
        execs.append(ge)
        for i in range(3):
            ge.launch(streams[i % len(streams)])
        replay = run.snapshot()
        assert replay == eager

        if not prog.has_alloc:
            # the same program with other constants: eager vs the exec updated in place
            run.reset(seed)
            for _ in range(3):
                run.execute(prog, bump=1)
            eager2 = run.snapshot()
            run.reset(seed)
            origin.begin_capture()
            try:
                run.execute(prog, bump=1)
            finally:
                variant = origin.end_capture()
            ge.update(variant)
            for i in range(3):
                ge.launch(streams[(i + 1) % len(streams)])
            assert run.snapshot() == eager2
    finally:
        for cap in list(capture._active):  # never leak a capture into later examples
            cap.finish()
        dev.synchronize()
        for ge in execs:
            ge.destroy()
        for p in bufs:
            srt.free(p)
        for s in streams:
            s.destroy()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(), st.integers(0, 1000), st.booleans())
def test_graph_differential_replay_matches_eager(backend, prog, seed, slabs):
    # on cuda: the captured graph is a native cudaGraph_t (kernel, memcpy with pageable host
    # memory, memset, host and graph-memory nodes), launched and updated by CUDA
    dev = backend_device(backend)
    prev = set_delays(50)  # shakes out any ordering the model or the runtime missed
    if slabs and backend == "cpu":
        # slabs of two graph allocations each (NB rounds to 512 B), as cuda's 2 MiB granules
        # hold many: packing must keep the slabs of overlapping allocations apart
        dev._impl.graph_granule = 1024
    try:
        _check(prog, seed, dev)
    finally:
        restore_delays(prev)
        dev._impl.__dict__.pop("graph_granule", None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_differential_fixed_program_with_everything(backend):
    # a hand-written program touching every op kind, so the differential path always runs them
    prog = Program(blocking=[False, True], nbuf=3, nhost=2)
    m = _Model(3)
    m.sync(0, 1)
    m.sync(0, 2)
    b0, b1, b2 = ("buf", 0), ("buf", 1), ("buf", 2)
    t = ("tmp", 0)
    m.emit(1, ("alloc", 1, t), writes=(t,))
    m.emit(1, ("fill", 1, t, 4), writes=(t,))
    m.emit(0, ("mix", 0, b0, b1, 3), reads=(b0, b1), writes=(b0,))
    m.emit(2, ("h2d", 2, b2, 1), writes=(b2,))
    m.emit(1, ("mix", 1, t, b2, 9), reads=(t, b2), writes=(t,))
    m.emit(2, ("copy", 2, b1, b0, NB), reads=(b0,), writes=(b1,))
    m.emit(0, ("memset", 0, b0, 17, 10), writes=(b0,))
    m.emit(0, ("mix", 0, b0, t, 1), reads=(b0, t), writes=(b0,))
    _fold_and_free(m, 2, t, ("buf", 3))
    m.emit(1, ("d2h", 1, ("hout", 0), b0), reads=(b0,), writes=(("hout", 0),))
    m.emit(2, ("host", 2, ("hout", 0), 5), reads=(("hout", 0),))
    m.emit(0, ("d2h", 0, ("hout", 1), b1), reads=(b1,), writes=(("hout", 1),))
    m.sync(1, 0)
    m.sync(2, 0)
    prog.ops = m.ops
    prog.has_alloc = True
    kinds = {op[0] for op in prog.ops}
    assert kinds >= {"alloc", "fill", "mix", "h2d", "copy", "memset", "free", "d2h", "host",
                     "record", "wait"}
    _check(prog, 3, backend_device(backend))
