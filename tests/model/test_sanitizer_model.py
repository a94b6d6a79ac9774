"""Strengthened sanitizer property test: a reference happens-before model predicts every finding.

Programs are correct by construction unless a step is drawn with a bug: ``drop`` (its waits, or a
free's waits, are left out), ``early`` (the event later uses wait on is recorded before the step's
work, or before the malloc: one position short) or ``pending`` (waits on work behind the gate are
left out); reads wait only on the last write (concurrent reads are legal); ``sync``
host-synchronizes a stream, after which waits the host already proved are left out; ``oob`` reads
one byte past the end; ``hold`` moves a gate to a stream (its later work runs when the gate opens:
after a free, or after work enqueued later), or opens it.

The host lets each step's work run before the next step (waiting without a synchronize: the
sanitizer sees no ordering), so the order accesses are checked in, and so which finding each
reports, follows from the program. The model applies the sanitizer's rules (sanitizer.access,
on_free, generation): an access reports at most one finding, the first of use-before-alloc,
out-of-bounds, use-after-free and race, a race against the remembered conflicting access enqueued
first; a write supersedes every access ordered before it, a read the reads ordered before it,
and nothing unordered is forgotten; a free reports the remembered access enqueued first of those
not ordered before it. Findings must match as a multiset of (kind, operation, the other
operation or the alloc/free event, pointer), operations named by (stream, position), a graph
node by its launch.
"""
from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.conftest import Gate
from tests.contract.sanitizer_helpers import access, streams


@srt.kernel
def read_bytes_k(ctx, p, nbytes, out):
    out.append(int(ctx.array(p, (nbytes,), np.uint8, readonly=True).sum()))


step = st.tuples(st.integers(0, 2),
                 st.sampled_from(("write", "write", "read", "read", "realloc", "realloc", "op", "graph",
                                  "sync", "oob", "hold", "hold")),
                 st.integers(0, 2),
                 st.sampled_from((None,) * 4 + ("drop", "early", "pending")))
program = st.lists(step, min_size=10, max_size=30)
WRITES = {"write", "op", "graph"}
# what a step enqueues, one string per stream position: the op's accesses to the buffer in the
# order it makes them (w: write, r: read, o: read one byte past the end); a space separates the
# nodes of a graph launch, each an operation of its own
OPS = {"write": ("w",), "read": ("r",),
       "op": ("rrw", ""),  # ops.add(t, t, t): a kernel, then the executor's release
       "graph": ("w r", "w r"),  # a write node, then a read node after it; launched twice
       "oob": ("o",)}


_arrival = itertools.count()
_enqueued = itertools.count()


def _seq(op):
    return op.seq


class Op(NamedTuple):
    """An operation or an event: stream, position, what is ordered before it, enqueue order."""

    si: int
    pos: int
    clock: dict
    seq: int = 0


@dataclass(eq=False)
class Gen:
    """One allocation of a buffer."""

    ptr: int
    alloc: Op
    lw: tuple  # (model event, stream event) after the last write: later uses wait on it
    rs: list = field(default_factory=list)  # the same after each read since
    acc: list = field(default_factory=list)  # what the sanitizer remembers: (arrival, op, write)
    free: Op | None = None


class Model:
    """Stream positions and clocks as the runtime keeps them, and the findings the sanitizer's
    rules give."""

    def __init__(self):
        self.pos = [0, 0, 0]
        self.clock = [dict(), dict(), dict()]
        self.host = {}  # what host synchronizes proved
        self.found: Counter = Counter()
        self.recorded = [-1, -1, -1]  # each stream's position at its latest event record

    def covered(self, si):  # what work enqueued on stream si now is ordered after
        c = dict(self.host)
        for k, v in [*self.clock[si].items(), (si, self.pos[si])]:
            c[k] = max(c.get(k, 0), v)
        return c

    def event(self, si):  # an event recorded (or a free enqueued) on stream si now
        return Op(si, self.pos[si], self.covered(si))

    def new_op(self, si):
        c = self.covered(si)
        self.pos[si] += 1
        return Op(si, self.pos[si], c, next(_enqueued))

    @staticmethod
    def ordered(a, x_clock):  # event/op a happens before clock
        return x_clock.get(a.si, 0) >= a.pos

    def wait(self, si, ev):
        self.pos[si] += 1  # a wait takes a position
        for k, v in ev.clock.items():
            if v > self.clock[si].get(k, 0):
                self.clock[si][k] = v

    def sync(self, si):
        for k, v in list(self.clock[si].items()) + [(si, self.pos[si])]:
            self.host[k] = max(self.host.get(k, 0), v)

    # -- the sanitizer's rules -------------------------------------------------------------------
    def find(self, kind, x, other, g, seen=None):
        key = kind, x[:2], other[:2], g.ptr
        if seen is not None:  # an op touching the range again (ops.add(t, t, t)) adds nothing
            if key in seen:
                return
            seen.add(key)
        self.found[key] += 1

    def run(self, x, g, accesses):
        """Op ``x`` runs: each access to ``g`` reports at most one finding, and each node of the
        op reports each (kind, other operation) once."""
        for node in accesses.split():
            self.run_node(x, g, node)

    def run_node(self, x, g, accesses):
        find = functools.partial(self.find, seen=set())
        for a in accesses:
            if not self.ordered(g.alloc, x.clock):
                find("use-before-alloc", x, g.alloc, g)
                continue
            if a == "o":
                find("out-of-bounds", x, g.alloc, g)
                continue
            if g.free is not None and not self.ordered(x, g.free.clock):
                find("use-after-free", x, g.free, g)
                continue
            w = a == "w"
            race = min((b for _, b, bw in g.acc
                        if b is not x and (bw or w) and not self.ordered(b, x.clock)),
                       key=_seq, default=None)
            if race is not None:
                find("race", x, race, g)
            own = any(b is x and (bw or not w) for _, b, bw in g.acc)  # x's earlier view covers it
            g.acc[:] = [(n, b, bw) for n, b, bw in g.acc
                        if ((bw or not w) if b is x else
                            (not self.ordered(b, x.clock) or (bw and not w)))]
            if not own:
                g.acc.append((next(_arrival), x, w))

    def free(self, g, si):
        """``g`` freed on stream ``si``: the first access that ran and is not ordered before the
        free is reported now (accesses that run later report themselves). A free right after an
        event record takes a position of its own: the record does not cover it."""
        if self.recorded[si] == self.pos[si]:
            self.pos[si] += 1
        g.free = self.event(si)
        late = min((b for _, b, _ in g.acc if not self.ordered(b, g.free.clock)), key=_seq,
                   default=None)
        if late is not None:
            self.find("use-after-free", late, g.free, g)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program, st.booleans(), st.sampled_from((None, 0, 1, 2)))
def test_sanitizer_matches_a_happens_before_model(ops_list, ordered_start, held_start):
    srt.sanitizer.clear()
    srt.sanitizer.enable("collect")
    dev = srt.Device("cpu:0")
    ss = streams(dev, 3)
    m = Model()
    held = None  # (stream, its gate, [(op, gen, accesses)] enqueued behind the gate)

    def record(si):  # an event recorded on stream si now
        m.recorded[si] = m.pos[si]
        return ss[si].record()

    def settle(si):  # wait for the stream's work to run; no synchronize: the host proves nothing
        ss[si]._q.wait_done(m.pos[si])

    def hold(si):  # a gate on stream si: later work there waits for release()
        nonlocal held
        held = (si, Gate(ss[si]), [])
        m.new_op(si)

    def release():  # open the gate: the held ops run now, alone, in order
        nonlocal held
        hs, gate, pending = held
        held = None
        gate.open()
        settle(hs)
        for x, g, accesses in pending:
            m.run(x, g, accesses)
        return hs

    try:
        n = 64
        cur = []
        for _ in range(3):
            m.new_op(0)  # the malloc's marker
            ptr = ss[0].malloc(n * 4)
            alloc = m.event(0)
            cur.append(Gen(ptr, alloc, (alloc, record(0))))
        start = (m.event(0), record(0))
        # in half the programs every stream starts ordered after the allocations (dropped waits show as
        # races); else first uses on streams 1 and 2 are uses before the allocation
        for k in (1, 2) if ordered_start else ():
            ss[k].wait(start[1])
            m.wait(k, start[0])
        if held_start is not None:
            hold(held_start)
        out: list = []
        for si, what, bi, bug in ops_list:
            s, g = ss[si], cur[bi]
            if what == "hold":  # move the gate to si, or open it if it is there
                if (release() if held else None) != si:
                    hold(si)
                continue
            if what == "sync":
                regate = held and held[0] == si
                if regate:
                    release()
                s.synchronize()
                m.sync(si)
                if regate:
                    hold(si)
                continue
            need = [] if bug == "drop" and what != "oob" else \
                [g.lw] + ([] if what in ("read", "oob") else g.rs)
            if bug == "pending" and held:  # forget the work behind the gate
                need = [(mev, ev) for mev, ev in need if mev.si != held[0]]
            if held and held[0] != si and any(mev.si == held[0] for mev, _ in need):
                hold(release())  # the wait would block on the gate: open it, gate again
            for mev, ev in need:
                if not m.ordered(mev, m.covered(si)):
                    s.wait(ev)
                    m.wait(si, mev)
            if what == "realloc":
                s.free(g.ptr)
                m.free(g, si)
                early = (m.event(si), record(si))
                m.new_op(si)  # the malloc's marker
                ptr = s.malloc(n * 4)
                alloc = m.event(si)
                cur[bi] = Gen(ptr, alloc, early if bug == "early" else (alloc, record(si)))
                continue
            early = (m.event(si), record(si))
            if what == "oob":  # a planted bug: read one byte past the end
                s.launch(read_bytes_k, g.ptr, n * 4 + 1, out)
            else:
                access(s, what, g.ptr, n, out)
            ops = [(m.new_op(si), g, accesses) for accesses in OPS[what]]
            if held and held[0] == si:
                held[2].extend(ops)
            else:
                settle(si)
                for x, _, accesses in ops:
                    m.run(x, g, accesses)
            ev = early if bug == "early" else (m.event(si), record(si))
            if what in WRITES:
                g.lw, g.rs = ev, []
            elif what == "read":
                g.rs.append(ev)
            assert m.pos == [x._pos for x in ss]  # the model names operations as the streams do
        if held:
            release()
        dev.synchronize()  # everything done: the final frees are ordered by the host
        for k in range(3):
            m.sync(k)
        for g in cur:
            ss[0].free(g.ptr)
            m.free(g, 0)
        dev.synchronize()
        sid = {s.id: i for i, s in enumerate(ss)}

        def name(x):  # an operation (a graph node: its launch) or an alloc/free event
            x = getattr(x, "parent", None) or x
            return sid[x.stream.id], x.pos

        rep = srt.sanitizer.report()
        got = Counter((f.kind, name(f.op), name(f.other), f.ptr) for f in rep)
        assert got == m.found, ("missed", sorted((m.found - got).elements()),
                                "extra", sorted((got - m.found).elements()), [str(f) for f in rep][:3])
    finally:
        if held:
            held[1].open()
        srt.sanitizer.disable()
        srt.sanitizer.clear()
        for s in ss:
            s.destroy()
