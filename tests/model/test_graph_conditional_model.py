"""Model-based: random graphs with conditional nodes replay as a host-driven numpy model says.

Hypothesis draws a program: graph levels (the top graph and conditional bodies, nesting depth at
most 3) of plain kernel nodes (``mix``: ``dst = dst * 3 + src + c`` on int64 slots, wrapping, so
order matters) with random dependencies, and conditional nodes:

- WHILE loops counted by kernels: an ``init`` node copies the trip count of the launch (a slot the
  host writes between launches) into the loop's counter and, unless the loop's handle has a
  default, sets the condition; a ``countdown`` node in the body counts down and sets it again;
- IF (with or without else) and SWITCH (1-3 bodies, values past the last one too), the value
  from the handle's default, from a ``set`` kernel node before the node, or written by the host
  to ``h.ptr`` between launches (default None: some launches write nothing, so the value of the
  last launch stays).

Handles are made for the level holding their node or for any graph above it. Every two nodes of a
level whose accesses conflict (a body's accesses count as its conditional node's; a handle is
written by its setters and read by its node) get an edge, so a correct program is race-free and
deterministic. The model interprets the same program on the host (defaults written at each
launch's start, values read when a node runs, WHILE tested before each trip); after each of three
launches the device slots and every handle's value must equal the model's. The exec is made from
the graph itself, from a clone, or from a graph holding it as a child graph node.

Runs plain, with delay injection (the cpu backend's, plus jitter inside the kernels: graph
branches run on worker threads) and with the sanitizer collecting (no finding); and a variant with
one edge between two conflicting kernel nodes of a level that runs dropped, where the sanitizer
must find a race on that memory and nothing else.

Reproduce: a failure prints the program (``Prog.describe``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from tests.conftest import restore_delays, set_delays

T = srt.ConditionalType
LAUNCHES = 3
DATA = 5  # data slots 0..DATA-1; loop counters and trip counts after them
SLOTS = 32
MAX_CONDS = 5
MAX_DEPTH = 3
MASK = (1 << 64) - 1

_JITTER = [False]


def _jitter() -> None:
    """0-100 us inside the kernels (GIL released) in delay mode: a missing edge shows up."""
    if _JITTER[0]:
        time.sleep(random.random() * 1e-4)


# -- kernels --------------------------------------------------------------------------------------
@srt.kernel
def mix_k(ctx, dst, src, c):
    _jitter()
    d = ctx.array(dst, (1,), np.int64)
    d[:] = d * 3 + ctx.array(src, (1,), np.int64, readonly=True) + c


@srt.kernel
def set_k(ctx, h, v):
    _jitter()
    ctx.set_condition(h, v)


@srt.kernel
def init_k(ctx, h, cnt, trips):
    _jitter()
    t = int(ctx.array(trips, (1,), np.int64, readonly=True)[0])
    ctx.array(cnt, (1,), np.int64)[0] = t
    if h is not None:
        ctx.set_condition(h, int(t > 0))


@srt.kernel
def countdown_k(ctx, h, cnt):
    _jitter()
    x = ctx.array(cnt, (1,), np.int64)
    x[0] -= 1
    ctx.set_condition(h, int(x[0] > 0))


# -- programs -------------------------------------------------------------------------------------
@dataclass(eq=False)
class Item:
    kind: str  # mix, set, init, countdown, cond
    reads: frozenset = frozenset()
    writes: frozenset = frozenset()
    deps: set = field(default_factory=set)
    need: set = field(default_factory=set)  # the deps that order a conflict
    dst: int = 0
    src: int = 0
    c: int = 0
    hid: int | None = None  # the handle set / read
    sets: bool = False  # init: sets the condition
    v: int = 0
    ctype: T | None = None
    bodies: list = field(default_factory=list)


@dataclass(eq=False)
class Level:
    id: int
    items: list = field(default_factory=list)


@dataclass
class Handle:
    owner: int  # depth of the graph it is made for (0: the top graph)
    default: int | None
    init: int  # written to h.ptr before the first launch
    host: list | None = None  # per launch: a value the host writes first, or None (keep)


@dataclass
class Prog:
    top: Level
    handles: list
    loops: list  # per WHILE: (counter slot, trips slot, trips per launch)
    wrap: str
    seed: int
    nlevels: int

    def describe(self) -> str:
        out = [f"wrap={self.wrap} seed={self.seed} loops={self.loops}"]
        for i, h in enumerate(self.handles):
            out.append(f"  h{i}: {h}")

        def level(lv: Level, ind: str) -> None:
            out.append(f"{ind}level {lv.id}")
            for j, it in enumerate(lv.items):
                extra = {"mix": f"s{it.dst} <- s{it.src} c={it.c}", "set": f"h{it.hid}={it.v}",
                         "init": f"h{it.hid} sets={it.sets} cnt=s{it.dst} trips=s{it.src}",
                         "countdown": f"h{it.hid} cnt=s{it.dst}",
                         "cond": f"{it.ctype.name if it.ctype is not None else ''} h{it.hid}"
                                 f" x{len(it.bodies)}"}[it.kind]
                out.append(f"{ind}  #{j} {it.kind} {extra} deps={sorted(it.deps)}")
                for b in it.bodies:
                    level(b, ind + "    ")

        level(self.top, "")
        return "\n".join(out)


def _conflict(a: Item, b: Item) -> bool:
    return bool(a.writes & (b.reads | b.writes) or b.writes & a.reads)


def _reaches(level: Level, a: int, b: int) -> bool:
    """Whether item ``a`` is an ancestor of item ``b`` of ``level``."""
    stack, seen = [b], set()
    while stack:
        x = stack.pop()
        for d in level.items[x].deps:
            if d == a:
                return True
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return False


class _Gen:
    def __init__(self, draw) -> None:
        self.draw = draw
        self.handles: list[Handle] = []
        self.loops: list = []
        self.nconds = 0
        self.nlevels = 0
        self.next_slot = DATA

    def slot(self) -> int:
        s = self.next_slot
        self.next_slot += 1
        return s

    def add(self, level: Level, it: Item) -> None:
        n = len(level.items)
        if n:
            it.deps |= set(self.draw(st.lists(st.integers(0, n - 1), max_size=2)))
        for j, other in enumerate(level.items):
            if _conflict(other, it):
                it.deps.add(j)
                it.need.add(j)
        level.items.append(it)

    def handle(self, depth: int, default: int | None, host: bool) -> int:
        draw = self.draw
        h = Handle(owner=draw(st.integers(0, depth)), default=default,
                   init=draw(st.sampled_from([0, 1, 2, 3])))
        if host:
            h.host = draw(st.lists(st.one_of(st.none(), st.integers(0, 4), st.just(MASK)),
                                   min_size=LAUNCHES, max_size=LAUNCHES))
        self.handles.append(h)
        return len(self.handles) - 1

    def level(self, depth: int, tail: Item | None = None) -> Level:
        draw = self.draw
        lv = Level(self.nlevels)
        self.nlevels += 1
        for _ in range(draw(st.integers(1, 3 if depth else 5))):
            nest = depth < MAX_DEPTH and self.nconds < MAX_CONDS
            kind = draw(st.sampled_from(("mix", "mix", "cond") if nest else ("mix",)))
            if kind == "mix":
                dst = draw(st.integers(0, DATA - 1))
                src = draw(st.integers(0, DATA - 2))
                src += src >= dst
                self.add(lv, Item("mix", frozenset({("s", src)}), frozenset({("s", dst)}),
                                  dst=dst, src=src, c=draw(st.integers(-3, 9))))
            else:
                self.cond(lv, depth)
        if tail is not None:
            self.add(lv, tail)
        return lv

    def cond(self, lv: Level, depth: int) -> None:
        draw = self.draw
        self.nconds += 1
        ctype = draw(st.sampled_from((T.IF, T.WHILE, T.SWITCH)))
        if ctype is T.WHILE:
            cnt, trips = self.slot(), self.slot()
            per = draw(st.lists(st.integers(0, 3), min_size=LAUNCHES, max_size=LAUNCHES))
            self.loops.append((cnt, trips, per))
            by_kernel = draw(st.booleans())  # else: default 1, the body runs at least once
            hid = self.handle(depth, None if by_kernel else 1, False)
            hk = ("h", hid)
            self.add(lv, Item("init", frozenset({("s", trips)}),
                              frozenset({("s", cnt)} | ({hk} if by_kernel else set())),
                              dst=cnt, src=trips, hid=hid, sets=by_kernel))
            tail = Item("countdown", frozenset(), frozenset({("s", cnt), hk}), dst=cnt, hid=hid)
            bodies = [self.level(depth + 1, tail)]
        else:
            size = draw(st.integers(1, 2)) if ctype is T.IF else draw(st.integers(1, 3))
            source = draw(st.sampled_from(("default", "kernel", "host")))
            top = 2 if ctype is T.IF else size  # SWITCH: one past the last body too
            if source == "default":
                hid = self.handle(depth, draw(st.one_of(st.integers(0, top), st.just(MASK))),
                                  False)
            elif source == "kernel":
                hid = self.handle(depth, draw(st.sampled_from((None, 0, 1))), False)
                self.add(lv, Item("set", frozenset(), frozenset({("h", hid)}), hid=hid,
                                  v=draw(st.integers(0, top))))
            else:
                hid = self.handle(depth, None, True)
            bodies = [self.level(depth + 1) for _ in range(size)]
        reads: set = {("h", hid)}
        writes: set = set()
        for b in bodies:
            for it in b.items:
                reads |= it.reads
                writes |= it.writes
        self.add(lv, Item("cond", frozenset(reads), frozenset(writes), hid=hid, ctype=ctype,
                          bodies=bodies))


@st.composite
def programs(draw) -> Prog:
    g = _Gen(draw)
    top = g.level(0)
    return Prog(top, g.handles, g.loops, draw(st.sampled_from(("direct", "clone", "child"))),
                draw(st.integers(0, 1000)), g.nlevels)


# -- the model ------------------------------------------------------------------------------------
class Model:
    def __init__(self, prog: Prog, slots: np.ndarray) -> None:
        self.prog = prog
        self.m = slots.copy()
        self.hv = {i: h.init for i, h in enumerate(prog.handles)}
        self.ran: set[int] = set()  # levels that ran

    def launch(self, k: int) -> None:
        for _cnt, trips, per in self.prog.loops:
            self.m[trips] = per[k]
        for i, h in enumerate(self.prog.handles):
            if h.host is not None and h.host[k] is not None:
                self.hv[i] = h.host[k]
        for i, h in enumerate(self.prog.handles):  # cudaGraphCondAssignDefault
            if h.default is not None:
                self.hv[i] = h.default
        self.level(self.prog.top)

    def level(self, lv: Level) -> None:
        self.ran.add(lv.id)
        m, hv = self.m, self.hv
        for it in lv.items:  # creation order is a topological order
            if it.kind == "mix":
                m[it.dst:it.dst + 1] = m[it.dst:it.dst + 1] * 3 + m[it.src:it.src + 1] + it.c
            elif it.kind == "set":
                hv[it.hid] = it.v
            elif it.kind == "init":
                m[it.dst] = m[it.src]
                if it.sets:
                    hv[it.hid] = int(m[it.dst] > 0)
            elif it.kind == "countdown":
                m[it.dst] -= 1
                hv[it.hid] = int(m[it.dst] > 0)
            elif it.ctype is T.WHILE:
                while hv[it.hid]:
                    self.level(it.bodies[0])
            else:
                v = hv[it.hid]
                if it.ctype is T.IF:
                    pick = 0 if v else (1 if len(it.bodies) == 2 else -1)
                else:
                    pick = v if v < len(it.bodies) else -1
                if pick >= 0:
                    self.level(it.bodies[pick])


# -- the real run ---------------------------------------------------------------------------------
def _initial(seed: int) -> np.ndarray:
    return (np.arange(SLOTS, dtype=np.int64) * (seed + 3)) % 17 - 5


class Built:
    def __init__(self, prog: Prog, mem: int) -> None:
        self.prog = prog
        self.mem = mem
        self.h: dict[int, srt.ConditionalHandle] = {}
        self.top = srt.Graph()
        self._level(prog.top, self.top, [self.top])

    def slot(self, k: int) -> int:
        return self.mem + 8 * k

    def _handle(self, hid: int, stack: list) -> srt.ConditionalHandle:
        if hid not in self.h:
            spec = self.prog.handles[hid]
            self.h[hid] = stack[spec.owner].create_conditional_handle(default=spec.default)
        return self.h[hid]

    def _level(self, lv: Level, g: srt.Graph, stack: list) -> None:
        nodes: list = []
        for it in lv.items:
            deps = [nodes[j] for j in sorted(it.deps)]
            if it.kind == "mix":
                n = g.add_kernel_node(mix_k, self.slot(it.dst), self.slot(it.src), it.c, deps=deps)
            elif it.kind == "set":
                n = g.add_kernel_node(set_k, self._handle(it.hid, stack), it.v, deps=deps)
            elif it.kind == "init":
                h = self._handle(it.hid, stack)
                n = g.add_kernel_node(init_k, h if it.sets else None, self.slot(it.dst),
                                      self.slot(it.src), deps=deps)
            elif it.kind == "countdown":
                n = g.add_kernel_node(countdown_k, self._handle(it.hid, stack), self.slot(it.dst),
                                      deps=deps)
            else:
                n = g.add_conditional_node(self._handle(it.hid, stack), it.ctype,
                                           len(it.bodies), deps=deps)
                for body, graph in zip(it.bodies, n.bodies):
                    self._level(body, graph, [*stack, graph])
            nodes.append(n)

    def instantiate(self) -> srt.GraphExec:
        if self.prog.wrap == "clone":
            return self.top.clone().instantiate()
        if self.prog.wrap == "child":
            outer = srt.Graph()
            outer.add_child_graph_node(self.top)
            return outer.instantiate()
        return self.top.instantiate()


def _execute(prog: Prog, dev: srt.Device, *, compare: bool = True) -> int:
    """Build, launch and (``compare``) check the program; returns the address its slots had."""
    s = srt.Stream(dev, non_blocking=True)
    mem = srt.malloc(SLOTS * 8, dev)
    try:
        init = _initial(prog.seed)
        srt.write(mem, init)
        b = Built(prog, mem)
        for hid, h in b.h.items():
            srt.write(h.ptr, np.array([prog.handles[hid].init], np.uint64))
        ge = b.instantiate()
        model = Model(prog, init)
        for k in range(LAUNCHES):
            for _, trips, per in prog.loops:
                srt.write(b.slot(trips), np.array([per[k]], np.int64))
            for hid, h in b.h.items():
                v = prog.handles[hid].host
                if v is not None and v[k] is not None:
                    srt.write(h.ptr, np.array([v[k]], np.uint64))
            ge.launch(s)
            s.synchronize()
            model.launch(k)
            if compare:
                got = srt.read(mem, (SLOTS,), np.int64)
                assert got.tolist() == model.m.tolist(), (k, prog.describe())
                values = {hid: int(srt.read(h.ptr, (1,), np.uint64)[0]) for hid, h in b.h.items()}
                assert values == model.hv, (k, prog.describe())
        ge.destroy()
    finally:
        dev.synchronize()
        srt.free(mem)
        s.destroy()
    return mem


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.data_too_large,
                                                       HealthCheck.filter_too_much])


@settings(max_examples=60, **SETTINGS)
@given(programs())
def test_conditional_graphs_match_the_model(prog):
    _execute(prog, srt.Device("cpu:0"))


@settings(max_examples=40, **SETTINGS)
@given(programs())
def test_conditional_graphs_match_the_model_with_delay_injection(prog):
    prev = set_delays(50)
    _JITTER[0] = True
    try:
        _execute(prog, srt.Device("cpu:0"))
    finally:
        _JITTER[0] = False
        restore_delays(prev)


def _collecting():
    """The sanitizer on in collect mode, cleared; returns how to restore it as it was."""
    was, mode = srt.sanitizer.enabled(), srt.sanitizer._SAN.mode
    srt.sanitizer.clear()
    srt.sanitizer.enable("collect")

    def restore():
        srt.sanitizer.clear()
        if was:
            srt.sanitizer.enable(mode)
        else:
            srt.sanitizer.disable()

    return restore


@settings(max_examples=40, **SETTINGS)
@given(programs())
def test_conditional_graphs_under_the_sanitizer_have_no_finding(prog):
    restore = _collecting()
    try:
        _execute(prog, srt.Device("cpu:0"))
        assert srt.sanitizer.report() == [], prog.describe()
    finally:
        restore()


# -- a missing edge -------------------------------------------------------------------------------
def _levels(lv: Level):
    yield lv
    for it in lv.items:
        for b in it.bodies:
            yield from _levels(b)


@st.composite
def buggy_programs(draw):
    """A program with one edge ordering two conflicting kernel nodes of a level that runs dropped
    (no other path orders them); returns it with the slots the two share."""
    prog = draw(programs())
    init = _initial(prog.seed)
    model = Model(prog, init)
    for k in range(LAUNCHES):
        model.launch(k)
    found = []
    for lv in _levels(prog.top):
        if lv.id not in model.ran:
            continue
        for j, it in enumerate(lv.items):
            if it.kind != "mix":
                continue
            for a in sorted(it.need):
                if lv.items[a].kind == "mix":
                    found.append((lv, a, j))
    candidates = []
    for lv, a, j in found:
        it = lv.items[j]
        it.deps.discard(a)
        if not _reaches(lv, a, j):
            candidates.append((lv, a, j))
        it.deps.add(a)
    if candidates:
        lv, a, j = draw(st.sampled_from(candidates))
        lv.items[j].deps.discard(a)
    else:  # two more writers of slot 0 at the end of the top level, unordered with each other
        lv = prog.top
        gen = _Gen(draw)
        for src in (1, 2):
            gen.add(lv, Item("mix", frozenset({("s", src)}), frozenset({("s", 0)}), dst=0,
                             src=src, c=src))
        a, j = len(lv.items) - 2, len(lv.items) - 1
        lv.items[j].deps.discard(a)
        assert not _reaches(lv, a, j)
    x, y = lv.items[a], lv.items[j]
    shared = {k for kind, k in (x.writes & (y.reads | y.writes)) | (y.writes & x.reads)
              if kind == "s"}
    return prog, shared


@settings(max_examples=40, **SETTINGS)
@given(buggy_programs())
def test_conditional_graphs_missing_edge_is_found(case):
    prog, shared = case
    restore = _collecting()
    try:
        mem = _execute(prog, srt.Device("cpu:0"), compare=False)
        rep = srt.sanitizer.report()
    finally:
        restore()
    assert rep, prog.describe()
    for f in rep:
        assert f.kind == "race", (str(f), prog.describe())
        assert mem <= f.ptr < mem + SLOTS * 8
        assert (f.ptr - mem) // 8 in shared, (shared, str(f), prog.describe())
