"""Random stream-ordered programs for the sanitizer (issue 22): correct programs give no finding and
no leak; one planted bug of each kind is found, with its kind, and nothing else is reported.

The generator, :class:`Program`, draws a whole program from ``random.Random(seed)`` alone (never
from addresses or timing), over two or three non-blocking cpu streams and the public API only:
stream-ordered ``s.malloc``/``s.free``, ``srt.malloc``/``srt.free``, kernels writing and reading
float32 ranges (sub-ranges too) through ``ctx.array``, ``s.memcpy`` (host and device endpoints)
and ``s.memset``, operators through both phases (``op.get_workspace_size``, a workspace from
``s.malloc`` on the same or another stream, ``op(ws, size, ex, stream)``, repeatable executors,
``ex.destroy``) and through ``ops.run``, events recorded (into new or given ``srt.Event``) and
waited on, gates (a kernel that holds its stream on a ``threading.Event`` the host sets later:
work runs late with no sleep anywhere) and graphs, captured (each capture mode) and explicit, with
graph memory (escaping MEM_ALLOC allocations freed by ``s.free`` or by another graph's MEM_FREE
node, and graphs that allocate and free inside).

Correct by construction: a happens-before model (vector clocks, DESIGN.md §2, over the program's
own operation counts) tracks every access range of every allocation. An access first waits on the
allocation's event and on the events recorded after each earlier overlapping, conflicting access
the model does not already order before it; a free waits on every use; everything is freed, every
executor destroyed, every graph exec destroyed. The waits never rely on host proofs (``srt.free``
synchronizes the device and a copy into pageable host memory waits for its stream, orderings too,
but the model emits waits without counting them); planted bugs are checked against the model
*with* host proofs, so a planted bug is a real one. A host call that waits for the device opens the
gate first (the host would otherwise wait for itself).

Planted bugs (``CASES``, one per program, between a random correct prefix and suffix): a missing
wait ("race"), a free on another stream not ordered after a use, or a use after ``srt.free``
("use-after-free"), a use not ordered after a stream-ordered allocation ("use-before-alloc"), a
view one element past a size that is not a multiple of 512 bytes, so the element lies in the
rounding slack ("out-of-bounds" or "invalid-address"), a workspace short by less than the rounding
(phase 2 refuses it, or "workspace", "out-of-bounds" or "invalid-address"), one workspace used by
two executors on two unordered streams ("race" or "workspace"), and a leak (``check_leaks`` names
it, ``report`` stays empty). Every finding must be of the planted kinds and inside the planted
bug's memory. On 223a8b4 eight cases failed: the tails in the rounding slack (srt.malloc, graph
and captured memory: no finding; s.malloc: a use-after-free of an older block) and the four
short workspaces (phase 2 checked the rounded block).

Reproduce: a failure names the seed and the case; ``Program(seed, (bug, variant)).run()`` replays
the same program, and ``.log`` lists its steps (the message prints it).

Budget: ``CORRECT_EXAMPLES`` and ``BUG_EXAMPLES`` programs per test (the whole file a few seconds
in normal CI); with ``STREAMRT_SANITIZE`` set (``make test-sanitize``) ``SCALE`` (4) times more;
``STREAMRT_PROGRAMS_SCALE=k`` sets the factor explicitly. Hypothesis draws the seeds derandomized
(the same seeds every run), without a database and without shrinking (a seed is the whole example).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import ops
from tests.conftest import add_one_kernel, copy_kernel, fill_kernel, gate_kernel
from tests.contract.sanitizer_helpers import read_k


def _scale() -> int:
    explicit = os.environ.get("STREAMRT_PROGRAMS_SCALE")
    if explicit:
        return max(1, int(explicit))
    # 4x under make test-sanitize: 400 correct programs stay well inside the suite's 120 s
    # per-test timeout on a loaded 2-core machine (8x went past it with two suites running)
    return 4 if os.environ.get("STREAMRT_SANITIZE", "") not in ("", "0") else 1


SCALE = _scale()
CORRECT_EXAMPLES = 100 * SCALE
BUG_EXAMPLES = 10 * SCALE
F32 = 4
GRAIN = 512  # pool and device sizes round up to it: an element past the request lies in the slack
SIZES = (1, 3, 7, 31, 100, 127, 129, 200, 255, 300, 383, 1000, 1201)  # elements; none a multiple of 128
MEMSET = (0, 0x3F, 0x40)  # bytes whose float32 patterns are small (0, 0.75, 3.0)
MODES = (srt.CaptureMode.GLOBAL, srt.CaptureMode.THREAD_LOCAL, srt.CaptureMode.RELAXED)
READS = ("kernel", "memcpy", "graph")
WRITES = ("kernel", "inc", "memset", "memcpy", "op", "graph")

Point = tuple[int, int]  # (stream index, the program's count of operations on it)


# -- the happens-before model ----------------------------------------------------------------------
@dataclass(eq=False)
class Mark:
    """An operation and the event recorded right after it, with the model's clocks then:
    ``strict`` (waits only) and ``full`` (waits and host proofs). ``pt`` None: a host allocation,
    ordered before everything enqueued after it."""

    pt: Point | None
    event: Any = None
    strict: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)


HOST = Mark(None)


@dataclass(eq=False)
class Access:
    mark: Mark
    lo: int  # elements
    hi: int
    write: bool


@dataclass(eq=False)
class Buf:
    """One allocation: ``kind`` "pool" (s.malloc), "host" (srt.malloc) or "graph" (graph memory
    escaping its launch), ``n`` float32 requested, the accesses to it so far."""

    name: str
    ptr: int
    n: int
    kind: str
    alloc: Mark
    acc: list[Access] = field(default_factory=list)


class Model:
    """Per stream: operations counted, and the positions of other streams known to be ordered
    before its next operation (from waits; and host proofs, kept apart)."""

    def __init__(self, k: int) -> None:
        self.pos = [0] * k
        self.strict: list[dict] = [{} for _ in range(k)]
        self.full: list[dict] = [{} for _ in range(k)]
        self.host: dict = {}

    def clock(self, si: int, full: bool) -> dict:
        c = dict(self.host) if full else {}
        for k, v in (self.full if full else self.strict)[si].items():
            c[k] = max(c.get(k, 0), v)
        c[si] = self.pos[si]
        return c

    def step(self, si: int) -> Point:
        self.pos[si] += 1
        return si, self.pos[si]

    def before(self, pt: Point | None, si: int, full: bool = False) -> bool:
        """Whether operation ``pt`` is ordered before the next operation of stream ``si``."""
        return pt is None or self.clock(si, full).get(pt[0], 0) >= pt[1]

    def wait(self, si: int, mark: Mark) -> None:
        for mine, theirs in ((self.strict[si], mark.strict), (self.full[si], mark.full)):
            for k, v in theirs.items():
                mine[k] = max(mine.get(k, 0), v)

    def barrier(self) -> None:  # a device synchronize (srt.free): the host proved everything
        self.host = {i: p for i, p in enumerate(self.pos)}

    def prove(self, si: int) -> None:  # the host saw stream si's last operation complete
        for k, v in self.clock(si, True).items():
            self.host[k] = max(self.host.get(k, 0), v)


@dataclass
class Planted:
    """What a planted bug must produce: findings of ``kinds`` only, each inside ``ranges`` (byte
    ranges); or, for a leak, no finding and a leak of ``leak``."""

    kinds: set[str]
    ranges: list[tuple[int, int]]
    what: str
    leak: Any = None
    raised: BaseException | None = None  # phase 2 refused the bad workspace (a legal outcome)

    def covers(self, ptr: int) -> bool:
        return any(lo <= ptr < hi for lo, hi in self.ranges)


def _round(nbytes: int) -> int:
    return GRAIN * max(1, math.ceil(nbytes / GRAIN))


def _tensor(dev: srt.Device, ptr: int, shape: tuple) -> srt.Tensor:
    return srt.Tensor(srt.TensorDesc(shape, np.float32), ptr, device=dev)


def _leak_key(f: srt.sanitizer.Finding) -> tuple:
    return f.kind, f.ptr, f.nbytes, f.message


# -- the generator ---------------------------------------------------------------------------------
class Program:
    """One random program (``seed``), correct, or with the bug of ``case`` = (bug, variant)."""

    def __init__(self, seed: int, case: tuple[str, str] | None = None) -> None:
        self.seed, self.case = seed, case
        self.rnd = random.Random(seed)
        self.log: list[str] = []
        self.live: list[Buf] = []
        self.execs: list = []  # graph execs, destroyed after the final synchronize
        self.keep: list = []  # host arrays, tensors and outputs the enqueued work still uses
        self.sink: list = []  # what read kernels return
        self.gate: threading.Event | None = None
        self.pinned: list[int] = []  # pinned host buffers, freed after the final synchronize
        self.proved = False  # the operation being enqueued made the host wait for it
        self.planting = False  # no host proof while a bug is planted: it could order the bug away
        self.names = itertools.count()
        self.planted: Planted | None = None
        self.findings: list = []
        self.leaks: list = []
        self.leaks_after: list = []

    # -- running -----------------------------------------------------------------------------------
    def run(self) -> Program:
        """Build and run the program under the sanitizer (collect mode), then clean up."""
        srt.sanitizer.disable()  # a fresh history: enable() restarts it only when it was off
        srt.sanitizer.clear()
        srt.sanitizer.enable("collect")
        self.dev = dev = srt.Device("cpu:0")
        prev_pool = dev.mem_pool
        self.pool = srt.MemPool(dev)
        dev.set_mem_pool(self.pool)
        self.ss: list[srt.Stream] = []
        try:
            baseline = {_leak_key(f) for f in srt.sanitizer.check_leaks()}  # other tests' memory
            self.build()
            self.findings = srt.sanitizer.report()
            self.leaks = [f for f in srt.sanitizer.check_leaks() if _leak_key(f) not in baseline]
            if self.planted is not None and self.planted.leak is not None:
                self.fix_leak()
                self.leaks_after = [f for f in srt.sanitizer.check_leaks()
                                    if _leak_key(f) not in baseline]
        finally:
            self.open_gate()
            with contextlib.suppress(srt.StreamRTError):
                dev.synchronize()
            srt.sanitizer.disable()
            self.cleanup()
            srt.sanitizer.clear()
            dev.set_mem_pool(prev_pool)
            self.pool.destroy()
        return self

    def build(self) -> None:
        rnd = self.rnd
        k = rnd.choice((2, 3))
        self.ss = [srt.Stream(self.dev, non_blocking=True) for _ in range(k)]
        self.cs = srt.Stream(self.dev, non_blocking=True)  # captures only: never runs eager work
        self.m = Model(k)
        self.say(f"seed {self.seed}: {k} streams, case {self.case}")
        for _ in range(rnd.randint(4, 16)):
            self.random_step()
        if self.case is not None:
            bug, variant = self.case
            self.planting = True
            self.planted = getattr(self, "plant_" + bug.replace("-", "_"))(variant)
            self.planting = False
            self.say(f"PLANTED {bug} ({variant}): {self.planted.what}")
        for _ in range(rnd.randint(0, 10)):
            self.random_step()
        self.finish()

    def finish(self) -> None:
        """Free every live allocation (after its uses), synchronize, destroy the graph execs."""
        while self.live:
            self.free(self.rnd.choice(self.live))
        self.open_gate()
        self.dev.synchronize()
        self.say("synchronize")
        for ge in self.execs:
            ge.destroy()
        self.execs.clear()
        while self.pinned:
            srt.free_host(self.pinned.pop())

    def fix_leak(self) -> None:
        """Release what the leak case left (everything is done: the final synchronize proved it)."""
        leak = self.planted.leak
        if isinstance(leak, Buf):
            if leak.kind == "host":
                srt.free(leak.ptr)
            else:
                self.ss[0].free(leak.ptr)
        else:
            leak.destroy()
        self.dev.synchronize()

    def cleanup(self) -> None:
        """After a failure midway (the sanitizer off): free what is left, so later tests start clean."""
        for b in self.live:
            with contextlib.suppress(srt.StreamRTError):
                srt.free(b.ptr)
        self.live.clear()
        for ge in self.execs:
            with contextlib.suppress(srt.StreamRTError):
                ge.destroy()
        while self.pinned:
            srt.free_host(self.pinned.pop())
        for s in self.ss:
            s.destroy()
        if self.ss:
            self.cs.destroy()

    def say(self, line: str) -> None:
        self.log.append(line)

    def explain(self) -> str:
        found = "\n".join(f"  {f}"[:400] for f in self.findings) or "  (none)"
        leaks = "\n".join(f"  {f}"[:300] for f in self.leaks) or "  (none)"
        return (f"reproduce: Program({self.seed}, {self.case}).run()\nprogram:\n  "
                + "\n  ".join(self.log) + f"\nfindings:\n{found}\nleaks:\n{leaks}")

    # -- ordering helpers ----------------------------------------------------------------------------
    def pick(self, *exclude: int) -> int:
        return self.rnd.choice([i for i in range(len(self.ss)) if i not in exclude])

    def span(self, n: int) -> tuple[int, int]:
        """A range of ``n`` elements: the whole, or a random sub-range."""
        if self.rnd.random() < 0.4:
            return 0, n
        lo = self.rnd.randrange(n)
        return lo, self.rnd.randint(lo + 1, n)

    def needs(self, si: int, b: Buf, lo: int, hi: int, write: bool, *, full: bool = False,
              alloc: bool = True, uses: bool = True) -> list[Mark]:
        """What an access of ``b[lo:hi]`` on stream ``si`` must be ordered after and is not yet."""
        out = []
        if alloc and not self.m.before(b.alloc.pt, si, full):
            out.append(b.alloc)
        for a in b.acc if uses else ():
            if (a.write or write) and a.lo < hi and lo < a.hi and not self.m.before(a.mark.pt, si, full):
                out.append(a.mark)
        return out

    def order(self, si: int, b: Buf, lo: int, hi: int, write: bool, **which: bool) -> None:
        """Make stream ``si`` wait for what ``needs`` names (one wait may cover the next)."""
        for mk in self.needs(si, b, lo, hi, write, **which):
            if not self.m.before(mk.pt, si):
                self.ss[si].wait(mk.event)
                self.m.wait(si, mk)
                self.say(f"s{si}: wait s{mk.pt[0]}@{mk.pt[1]}")

    def done(self, si: int, accesses: list[tuple[Buf, int, int, bool]]) -> Mark:
        """The operation just enqueued on ``si`` counts in the model; an event is recorded after it."""
        pt = self.m.step(si)
        if self.proved:
            self.m.prove(si)
            self.proved = False
        ev = srt.Event(self.dev) if self.rnd.random() < 0.3 else None
        ev = self.ss[si].record(ev)
        strict, full = self.m.clock(si, False), self.m.clock(si, True)
        mark = Mark(pt, ev, strict, full)
        for b, lo, hi, w in accesses:
            b.acc.append(Access(mark, lo, hi, w))
        return mark

    def hold(self, si: int) -> None:
        """A gate on stream ``si``: its later work runs once ``open_gate`` sets the event."""
        self.open_gate()
        self.gate = threading.Event()
        self.ss[si].launch(gate_kernel, self.gate)
        self.say(f"s{si}: gate")

    def open_gate(self) -> None:
        if self.gate is not None:
            self.gate.set()
            self.gate = None
            self.say("open gate")

    # -- steps ---------------------------------------------------------------------------------------
    def random_step(self) -> None:
        live = len(self.live)
        steps = {"alloc": 3 if live < 5 else 0, "access": 6 * bool(live), "copy": 2 * (live >= 2),
                 "op": 2 * bool(live), "graph": 2 * bool(live), "memgraph": 1, "free": 2 * bool(live),
                 "hold": 1, "open": self.gate is not None}
        step = self.rnd.choices(list(steps), list(steps.values()))[0]
        if step == "alloc":
            self.alloc()
        elif step == "access":
            b = self.rnd.choice(self.live)
            lo, hi = self.span(b.n)
            write = self.rnd.random() < 0.5
            self.access(b, self.pick(), lo, hi, write)
        elif step == "copy":
            self.copy()
        elif step == "op":
            self.op_step()
        elif step == "graph":
            self.graph_step()
        elif step == "memgraph":
            self.memgraph_step()
        elif step == "free":
            self.free(self.rnd.choice(self.live))
        elif step == "hold":
            self.hold(self.pick())
        else:
            self.open_gate()

    def alloc(self, kind: str | None = None, n: int | None = None, si: int | None = None,
              init: bool = True) -> Buf:
        """A new allocation, initialized by a write unless ``init`` is False."""
        rnd = self.rnd
        kind = kind or rnd.choices(("pool", "host", "graph", "captured"), (5, 2, 2, 1))[0]
        n = n or rnd.choice(SIZES)
        si = self.pick() if si is None else si
        name = f"b{next(self.names)}"
        if kind == "pool":
            ptr = self.ss[si].malloc(n * F32)
            b = Buf(name, ptr, n, "pool", self.done(si, []))
            self.say(f"s{si}: {name} = s.malloc({n * F32})")
        elif kind == "host":
            b = Buf(name, srt.malloc(n * F32), n, "host", HOST)
            self.say(f"{name} = srt.malloc({n * F32})")
        else:  # graph memory that outlives its launch
            if kind == "graph":
                g = srt.Graph()
                a = g.add_mem_alloc_node(n * F32)
                ptr = a.ptr
                if init:
                    g.add_kernel_node(fill_kernel, ptr, n, 0.5, deps=[a])
            else:
                self.cs.begin_capture(rnd.choice(MODES))
                ptr = self.cs.malloc(n * F32)
                if init:
                    self.cs.launch(fill_kernel, ptr, n, 0.5)
                g = self.cs.end_capture()
            ge = g.instantiate()
            self.execs.append(ge)
            ge.launch(self.ss[si])
            b = Buf(name, ptr, n, "graph", self.done(si, []))
            if init:
                b.acc.append(Access(b.alloc, 0, n, True))
            self.say(f"s{si}: {name} = {kind} graph MEM_ALLOC({n * F32}){' + fill' if init else ''}")
            init = False
        self.live.append(b)
        if init:
            self.access(b, si if kind == "pool" else self.pick(), 0, n, True, "memset")
        return b

    def enqueue(self, s: srt.Stream, b: Buf, lo: int, hi: int, write: bool, method: str) -> None:
        """One use of ``b[lo:hi]`` on ``s`` by ``method``."""
        p, m = b.ptr + lo * F32, hi - lo
        if method == "kernel":
            s.launch(fill_kernel, p, m, 1.5) if write else s.launch(read_k, p, m, self.sink)
        elif method == "inc":
            s.launch(add_one_kernel, p, m)
        elif method == "memset":
            s.memset(p, self.rnd.choice(MEMSET), m * F32)
        elif method == "memcpy" and write:  # a pageable source: staged, asynchronous
            s.memcpy(p, np.full(m, 0.25, np.float32), m * F32)
        elif method == "memcpy" and (self.planting or self.rnd.random() < 0.5):  # pinned: asynchronous
            with self.dev:
                pinned = srt.malloc_host(m * F32)
            self.pinned.append(pinned)
            s.memcpy(pinned, p, m * F32)
        elif method == "memcpy":  # into pageable memory: the host waits for it (a host proof)
            self.open_gate()
            host = np.empty(m, np.float32)
            s.memcpy(host, p, m * F32)
            if s is not self.cs:
                self.proved = True
        elif method == "op":  # in place: ops.add(t, t, t)
            t = _tensor(self.dev, p, (m,))
            self.keep.append(t)
            ops.run(ops.add, t, t, t, stream=s)
        else:  # a one-node graph, explicit or captured
            if self.rnd.random() < 0.5:
                g = srt.Graph()
                if write:
                    g.add_kernel_node(fill_kernel, p, m, 2.0)
                else:
                    g.add_kernel_node(read_k, p, m, self.sink)
            else:
                self.cs.begin_capture(self.rnd.choice(MODES))
                self.enqueue(self.cs, b, lo, hi, write, "kernel")
                g = self.cs.end_capture()
            ge = g.instantiate()
            self.execs.append(ge)
            ge.launch(s)

    def access(self, b: Buf, si: int, lo: int, hi: int, write: bool, method: str | None = None,
               drop: str | None = None) -> Mark:
        """Enqueue a use of ``b[lo:hi]`` on stream ``si``, ordered as it must be; ``drop``: the
        waits left out (a planted bug): "uses" (the earlier accesses) or "all"."""
        method = method or self.rnd.choice(WRITES if write else READS)
        if drop is None:
            self.order(si, b, lo, hi, write)
        elif drop == "uses":
            self.order(si, b, lo, hi, write, uses=False)
        self.enqueue(self.ss[si], b, lo, hi, write, method)
        self.say(f"s{si}: {'write' if write else 'read'} {b.name}[{lo}:{hi}] by {method}"
                 + (f" (waits dropped: {drop})" if drop else ""))
        return self.done(si, [(b, lo, hi, write)])

    def copy(self) -> None:
        src, dst = self.rnd.sample(self.live, 2)
        m = self.rnd.randint(1, min(src.n, dst.n))
        so, do = self.rnd.randint(0, src.n - m), self.rnd.randint(0, dst.n - m)
        si = self.pick()
        self.order(si, src, so, so + m, False)
        self.order(si, dst, do, do + m, True)
        if self.rnd.random() < 0.5:
            self.ss[si].memcpy(dst.ptr + do * F32, src.ptr + so * F32, m * F32)
        else:
            self.ss[si].launch(copy_kernel, dst.ptr + do * F32, src.ptr + so * F32, m)
        self.say(f"s{si}: copy {src.name}[{so}:{so + m}] -> {dst.name}[{do}:{do + m}]")
        self.done(si, [(src, so, so + m, False), (dst, do, do + m, True)])

    def free(self, b: Buf, sf: int | None = None, early: bool = False) -> None:
        """Free ``b`` after every use (``early``: after its allocation only, a planted bug)."""
        if b in self.live:
            self.live.remove(b)
        if b.kind == "host":
            self.open_gate()  # srt.free synchronizes the device: a closed gate would never open
            srt.free(b.ptr)
            self.m.barrier()
            self.say(f"srt.free({b.name})")
            return
        sf = self.pick() if sf is None else sf
        self.order(sf, b, 0, b.n, True, uses=not early)
        if b.kind == "graph" and self.rnd.random() < 0.3:  # by another graph's MEM_FREE node
            g = srt.Graph()
            g.add_mem_free_node(b.ptr)
            fe = g.instantiate()
            self.execs.append(fe)
            fe.launch(self.ss[sf])
            how = "graph MEM_FREE"
        else:
            self.ss[sf].free(b.ptr)
            how = "s.free"
        self.m.step(sf)
        self.say(f"s{sf}: {how}({b.name})" + (" WITHOUT waiting on its uses" if early else ""))

    # -- operators -----------------------------------------------------------------------------------
    def buffer(self, need: int, exclude: tuple = (), si: int | None = None, fresh: bool = False) -> Buf:
        """A live buffer of at least ``need`` elements (not in ``exclude``), else a new one."""
        fits = [b for b in self.live if b.n >= need and b not in exclude]
        if fits and not fresh:
            return self.rnd.choice(fits)
        return self.alloc("pool" if fresh else None, need + self.rnd.randint(0, 40), si)

    def operands(self, si: int, want_ws: bool = False, fresh: bool = False,
                 names: tuple[str, ...] = ("softmax", "reduce_sum", "cumsum")) -> tuple:
        """An operator (one of ``names`` when ``want_ws``: with a workspace), its tensors over
        program buffers, their accesses and attributes."""
        rnd = self.rnd
        name = rnd.choice(names if want_ws else ("add", "mul", "softmax", "cumsum", "reduce_sum", "add"))
        big = want_ws and name != "softmax"  # reduce_sum and cumsum need a workspace from 1000 on
        m = rnd.randint(1000, 1200) if big else rnd.randint(1, 200)
        if name == "softmax":
            r = rnd.randint(1, 4)
            shape = (r, max(1, m // r))
            m = r * shape[1]
        else:
            shape = (m,)
        x = self.buffer(m, si=si, fresh=fresh)
        xo = rnd.randint(0, x.n - m)
        if name in ("add", "mul") and rnd.random() < 0.3:  # in place: x, y and out one view
            t = _tensor(self.dev, x.ptr + xo * F32, shape)
            return name, (t, t, t), [(x, xo, xo + m, True)], {}
        out_m = 1 if name == "reduce_sum" else m
        out = self.buffer(out_m, exclude=(x,), si=si, fresh=fresh)
        oo = rnd.randint(0, out.n - out_m)
        xt = _tensor(self.dev, x.ptr + xo * F32, shape)
        ot = _tensor(self.dev, out.ptr + oo * F32, () if name == "reduce_sum" else shape)
        acc = [(x, xo, xo + m, False), (out, oo, oo + out_m, True)]
        if name in ("add", "mul"):
            y = rnd.choice([b for b in self.live if b.n >= m and b is not out])
            yo = rnd.randint(0, y.n - m)
            acc.insert(1, (y, yo, yo + m, False))
            return name, (xt, _tensor(self.dev, y.ptr + yo * F32, shape), ot), acc, {}
        return name, (xt, ot), acc, {}

    def workspace(self, size: int, si: int, nbytes: int | None = None, kind: str = "pool") -> Buf:
        """A workspace allocation (s.malloc on a random stream, or srt.malloc), ``si`` after it."""
        nbytes = max(size, 1) if nbytes is None else nbytes
        name = f"ws{next(self.names)}"
        if kind == "host":
            b = Buf(name, srt.malloc(nbytes), math.ceil(nbytes / F32), "host", HOST)
            self.say(f"{name} = srt.malloc({nbytes})")
            return b
        sw = self.pick()
        ptr = self.ss[sw].malloc(nbytes)
        b = Buf(name, ptr, math.ceil(nbytes / F32), "pool", self.done(sw, []))
        self.say(f"s{sw}: {name} = s.malloc({nbytes})")
        self.order(si, b, 0, b.n, True)
        return b

    def op_step(self) -> None:
        rnd = self.rnd
        si = self.pick()
        name, ts, acc, attrs = self.operands(si)
        for b, lo, hi, w in acc:
            self.order(si, b, lo, hi, w)
        op, s = ops.OPS[name], self.ss[si]
        self.keep.extend(ts)
        path = rnd.choice(("ops.run", "two-phase", "repeatable"))
        if path == "ops.run":
            ops.run(op, *ts, stream=s, **attrs)
            self.say(f"s{si}: ops.run({name}) on {[b.name for b, *_ in acc]}")
            self.done(si, acc)
            return
        size, ex = op.get_workspace_size(*ts, **attrs)
        wsb = None if size == 0 and rnd.random() < 0.5 else self.workspace(size, si)
        if path == "repeatable":
            ex.set_repeatable()
        for _ in range(2 if path == "repeatable" else 1):
            op(None if wsb is None else wsb.ptr, size, ex, s)
        self.say(f"s{si}: {name} {path} on {[b.name for b, *_ in acc]}, workspace {size} B "
                 f"in {wsb and wsb.name}")
        self.done(si, acc + ([(wsb, 0, wsb.n, True)] if wsb else []))
        ex.destroy()
        if wsb is not None:
            self.free(wsb)

    # -- graphs --------------------------------------------------------------------------------------
    def graph_step(self) -> None:
        """A graph of 1-3 nodes over 1-2 buffers (explicit: edges between conflicting nodes;
        captured: in capture order), launched once or twice."""
        rnd = self.rnd
        si = self.pick()
        bufs = rnd.sample(self.live, min(len(self.live), rnd.randint(1, 2)))
        plan = []
        for _ in range(rnd.randint(1, 3)):
            b = rnd.choice(bufs)
            lo, hi = self.span(b.n)
            w = rnd.random() < 0.5
            plan.append((b, lo, hi, w, "memset" if w and rnd.random() < 0.3 else "kernel"))
        for b, lo, hi, w, _ in plan:
            self.order(si, b, lo, hi, w)
        captured = rnd.random() < 0.5
        if captured:
            self.cs.begin_capture(rnd.choice(MODES))
            for b, lo, hi, w, how in plan:
                self.enqueue(self.cs, b, lo, hi, w, how)
            g = self.cs.end_capture()
        else:
            g = srt.Graph()
            nodes: list = []
            for b, lo, hi, w, how in plan:
                deps = [nd for nd, b2, l2, h2, w2 in nodes if b2 is b and l2 < hi and lo < h2 and (w or w2)]
                p, m = b.ptr + lo * F32, hi - lo
                if how == "memset":
                    nd = g.add_memset_node(p, 0, m * F32, deps=deps)
                elif w:
                    nd = g.add_kernel_node(fill_kernel, p, m, 3.0, deps=deps)
                else:
                    nd = g.add_kernel_node(read_k, p, m, self.sink, deps=deps)
                nodes.append((nd, b, lo, hi, w))
        ge = g.instantiate()
        self.execs.append(ge)
        launches = rnd.randint(1, 2)
        for _ in range(launches):
            ge.launch(self.ss[si])
        self.say(f"s{si}: {'captured' if captured else 'explicit'} graph x{launches}: "
                 + ", ".join(f"{'w' if w else 'r'} {b.name}[{lo}:{hi}]" for b, lo, hi, w, _ in plan))
        self.done(si, [(b, lo, hi, w) for b, lo, hi, w, _ in plan])

    def memgraph_step(self) -> None:
        """A graph that allocates, writes, reads and frees its own memory, launched 1-2 times."""
        rnd = self.rnd
        si, n = self.pick(), rnd.choice(SIZES)
        lo, hi = self.span(n)
        if rnd.random() < 0.5:
            g = srt.Graph()
            a = g.add_mem_alloc_node(n * F32)
            w = g.add_kernel_node(fill_kernel, a.ptr, n, 1.0, deps=[a])
            r = g.add_kernel_node(read_k, a.ptr + lo * F32, hi - lo, self.sink, deps=[w])
            g.add_mem_free_node(a.ptr, deps=[r])
        else:
            cs = self.cs
            cs.begin_capture(rnd.choice(MODES))
            p = cs.malloc(n * F32)
            cs.launch(fill_kernel, p, n, 1.0)
            cs.launch(read_k, p + lo * F32, hi - lo, self.sink)
            cs.free(p)
            g = cs.end_capture()
        ge = g.instantiate()
        self.execs.append(ge)
        launches = rnd.randint(1, 2)
        for _ in range(launches):
            ge.launch(self.ss[si])
        self.say(f"s{si}: graph with its own memory ({n * F32} B) x{launches}")
        self.done(si, [])

    # -- planted bugs --------------------------------------------------------------------------------
    def bug_range(self, b: Buf) -> list[tuple[int, int]]:
        return [(b.ptr, b.ptr + b.n * F32)]

    def plant_race(self, variant: str) -> Planted:
        """A missing wait: stream B uses a range stream A just wrote, ordered after the allocation
        only. ``gated``: a gate holds one of the two streams until both are enqueued."""
        rnd = self.rnd
        sa = self.pick()
        sb = self.pick(sa)
        b = self.alloc(rnd.choice(("pool", "host", "graph", "captured")))
        self.order(sb, b, 0, b.n, True, uses=False)  # B after the allocation: not the bug
        if variant == "gated":
            self.hold(rnd.choice((sa, sb)))
        lo, hi = self.span(b.n)
        self.access(b, sa, lo, hi, True)
        blo = rnd.randrange(lo, hi)
        bhi = rnd.randint(blo + 1, b.n)
        w = rnd.random() < 0.5
        assert self.needs(sb, b, blo, bhi, w, full=True, alloc=False), "the planted race is ordered"
        self.access(b, sb, blo, bhi, w, drop="uses")
        self.open_gate()
        return Planted({"race"}, self.bug_range(b), f"s{sb} uses {b.name}[{blo}:{bhi}] unordered "
                       f"with s{sa}'s write of [{lo}:{hi}]")

    def plant_use_after_free(self, variant: str) -> Planted:
        """A free not ordered after a use on another stream (``s.malloc``, ``graph`` memory), or a
        use after ``srt.free``; a gate may hold the using stream until the free is enqueued."""
        rnd = self.rnd
        gated = rnd.random() < 0.5
        if variant == "srt.malloc":
            b = self.alloc("host")
            self.free(b)
            si = self.pick()
            if gated:
                self.hold(si)
            lo, hi = self.span(b.n)
            self.access(b, si, lo, hi, rnd.random() < 0.5, "kernel", drop="all")
            self.open_gate()
            return Planted({"use-after-free"}, self.bug_range(b), f"s{si} uses {b.name} after srt.free")
        b = self.alloc("pool" if variant == "s.malloc" else rnd.choice(("graph", "captured")))
        sx = self.pick()
        sf = self.pick(sx)
        if gated:
            self.hold(sx)
        lo, hi = self.span(b.n)
        self.access(b, sx, lo, hi, rnd.random() < 0.5)
        self.order(sf, b, 0, b.n, True, uses=False)
        assert self.needs(sf, b, 0, b.n, True, full=True, alloc=False), "the planted free is ordered"
        self.free(b, sf, early=True)
        self.open_gate()
        return Planted({"use-after-free"}, self.bug_range(b), f"s{sf} frees {b.name} while s{sx} "
                       f"may still use [{lo}:{hi}]")

    def plant_use_before_alloc(self, variant: str) -> Planted:
        """A use on stream B not ordered after a stream-ordered allocation on stream A (s.malloc,
        an explicit graph's MEM_ALLOC, a captured s.malloc)."""
        rnd = self.rnd
        sa = self.pick()
        sb = self.pick(sa)
        if rnd.random() < 0.5:
            self.hold(sa)
        kind = {"s.malloc": "pool"}.get(variant, variant)
        b = self.alloc(kind, si=sa, init=False)
        lo, hi = self.span(b.n)
        assert self.needs(sb, b, lo, hi, True, full=True, uses=False), "the planted use is ordered"
        self.access(b, sb, lo, hi, True, drop="all")
        self.open_gate()
        self.access(b, sb, 0, b.n, True, "memset")  # then initialized, correctly ordered
        return Planted({"use-before-alloc"}, self.bug_range(b),
                       f"s{sb} writes {b.name}[{lo}:{hi}] before s{sa}'s allocation")

    def plant_off_by_one(self, variant: str) -> Planted:
        """A kernel view one element past the requested size (not a multiple of 512 bytes, so
        the element lies in the allocation's rounding slack): ``straddle`` from inside, ``tail``
        the one element past the end; the memory from srt.malloc, s.malloc, an explicit graph's
        MEM_ALLOC or a captured s.malloc (graph kernels)."""
        rnd = self.rnd
        source, form = variant.split("/")
        n = rnd.choice(SIZES)
        k = n if form == "tail" else rnd.randrange(n)
        write = rnd.random() < 0.5
        kern, arg = (fill_kernel, 4.0) if write else (read_k, self.sink)
        si = self.pick()
        what = f"{'write' if write else 'read'} [{k}:{n + 1}] of {n} float32 from {source}"
        if source in ("srt.malloc", "s.malloc"):
            b = self.alloc("host" if source == "srt.malloc" else "pool", n=n)
            self.order(si, b, k, n + 1, write)
            self.ss[si].launch(kern, b.ptr + k * F32, n + 1 - k, arg)
            self.done(si, [(b, k, n + 1, write)])
            ptr = b.ptr
        else:
            if source == "graph":
                g = srt.Graph()
                a = g.add_mem_alloc_node(n * F32)
                ptr = a.ptr
                init = g.add_kernel_node(fill_kernel, ptr, n, 0.5, deps=[a])
                bad = g.add_kernel_node(kern, ptr + k * F32, n + 1 - k, arg, deps=[init])
                g.add_mem_free_node(ptr, deps=[bad])
            else:
                cs = self.cs
                cs.begin_capture(rnd.choice(MODES))
                ptr = cs.malloc(n * F32)
                cs.launch(fill_kernel, ptr, n, 0.5)
                cs.launch(kern, ptr + k * F32, n + 1 - k, arg)
                cs.free(ptr)
                g = cs.end_capture()
            ge = g.instantiate()
            self.execs.append(ge)
            ge.launch(self.ss[si])
            self.done(si, [])
        self.say(f"s{si}: {what}")
        return Planted({"out-of-bounds", "invalid-address"}, [(ptr, ptr + _round(n * F32) + F32)], what)

    def plant_workspace_too_small(self, variant: str) -> Planted:
        """A workspace smaller than phase 1 asked by less than the rounding (same 512-byte block),
        from s.malloc or srt.malloc: phase 2 refuses it, or its use is a finding. ``softmax``:
        short by any amount; ``reduce``: reduce_sum or cumsum of 1000-1200 float32, short by
        1-4 bytes (their workspaces are laid out in aligned regions: the last bytes may be
        padding no kernel touches, so only phase 2 can see the shortfall)."""
        rnd = self.rnd
        source, family = variant.split("/")
        si = self.pick()
        names = ("softmax",) if family == "softmax" else ("reduce_sum", "cumsum")
        name, ts, acc, attrs = self.operands(si, want_ws=True, names=names)
        for b, lo, hi, w in acc:
            self.order(si, b, lo, hi, w)
        op, s = ops.OPS[name], self.ss[si]
        self.keep.extend(ts)
        size, ex = op.get_workspace_size(*ts, **attrs)
        assert size > 1
        slack = size - GRAIN * ((size - 1) // GRAIN) - 1  # bytes short that stay in the same block
        short = size - rnd.randint(1, slack if family == "softmax" else min(slack, 4))
        wsb = self.workspace(size, si, short, "host" if source == "srt.malloc" else "pool")
        raised = None
        try:
            op(wsb.ptr, size, ex, s)
        except srt.StreamRTError as e:
            raised = e
        self.say(f"s{si}: {name} with a workspace of {short} B, {size} B asked"
                 + (f": refused ({type(raised).__name__})" if raised else ""))
        self.done(si, acc + [(wsb, 0, math.ceil(size / F32), True)])
        ex.destroy()
        self.free(wsb)
        # a kernel touching a region wholly past the short allocation: invalid-address, as a view
        # wholly past the end is (the off-by-one case)
        return Planted({"workspace", "out-of-bounds", "invalid-address"}, [(wsb.ptr, wsb.ptr + _round(size))],
                       f"{name}: workspace {short} B < {size} B", raised=raised)

    def plant_workspace_shared(self, variant: str) -> Planted:
        """Two executors on two streams with one workspace and no order between them (``gated``:
        the second stream held until both are enqueued)."""
        sa = self.pick()
        sb = self.pick(sa)
        plans = []
        for si in (sa, sb):
            name, ts, acc, attrs = self.operands(si, want_ws=True, fresh=True)
            for b, lo, hi, w in acc:
                self.order(si, b, lo, hi, w)
            self.keep.extend(ts)
            size, ex = ops.OPS[name].get_workspace_size(*ts, **attrs)
            plans.append((si, name, ts, acc, size, ex))
        big = max(p[4] for p in plans)
        wsb = self.workspace(big, sa)
        self.order(sb, wsb, 0, wsb.n, True, uses=False)  # B after the allocation: not the bug
        if variant == "gated":
            self.hold(sb)
        for si, name, _ts, acc, size, ex in plans:
            if si == sb:
                assert self.needs(sb, wsb, 0, wsb.n, True, full=True, alloc=False), "not shared"
            ops.OPS[name](wsb.ptr, size, ex, self.ss[si])
            self.say(f"s{si}: {name} with the shared workspace {wsb.name} ({size} B)")
            self.done(si, acc + [(wsb, 0, math.ceil(size / F32), True)])
        self.open_gate()
        for *_, ex in plans:
            ex.destroy()
        self.free(wsb)
        return Planted({"race", "workspace"}, [(wsb.ptr, wsb.ptr + _round(big))],
                       f"{plans[0][1]} on s{sa} and {plans[1][1]} on s{sb} share {wsb.name}")

    def plant_leak(self, variant: str) -> Planted:
        """An allocation never freed (s.malloc, srt.malloc, graph memory) or an executor never
        destroyed (phase 1 only, or a repeatable one after running)."""
        rnd = self.rnd
        if variant == "executor":
            si = self.pick()
            name, ts, acc, attrs = self.operands(si)
            self.keep.extend(ts)
            size, ex = ops.OPS[name].get_workspace_size(*ts, **attrs)
            if rnd.random() < 0.5:
                for b, lo, hi, w in acc:
                    self.order(si, b, lo, hi, w)
                ex.set_repeatable()
                wsb = self.workspace(size, si)
                ops.OPS[name](wsb.ptr, size, ex, self.ss[si])
                self.done(si, acc + [(wsb, 0, wsb.n, True)])
                self.free(wsb)
                what = f"repeatable {name} executor run, never destroyed"
            else:
                what = f"{name} executor from phase 1, never run nor destroyed"
            return Planted(set(), [], what, leak=ex)
        b = self.alloc({"s.malloc": "pool", "srt.malloc": "host"}.get(variant, variant))
        for _ in range(rnd.randint(0, 2)):
            lo, hi = self.span(b.n)
            self.access(b, self.pick(), lo, hi, rnd.random() < 0.5)
        self.live.remove(b)
        return Planted(set(), [], f"{b.name} ({b.kind}) never freed", leak=b)


# -- the tests -------------------------------------------------------------------------------------
SEEDS = st.integers(0, 2**32 - 1)


def _settings(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow])


@_settings(CORRECT_EXAMPLES)
@given(seed=SEEDS)
def test_sanitizer_no_false_positives_on_random_programs(seed):
    """A correct random program gives no finding and, once everything is freed, no leak."""
    p = Program(seed).run()
    assert p.findings == [], p.explain()
    assert p.leaks == [], p.explain()


CASES = [
    ("race", "plain"), ("race", "gated"),
    ("use-after-free", "s.malloc"), ("use-after-free", "graph"), ("use-after-free", "srt.malloc"),
    ("use-before-alloc", "s.malloc"), ("use-before-alloc", "graph"), ("use-before-alloc", "captured"),
    *[("off-by-one", f"{src}/{form}") for src in ("srt.malloc", "s.malloc", "graph", "captured")
      for form in ("straddle", "tail")],
    *[("workspace-too-small", f"{src}/{op}") for src in ("s.malloc", "srt.malloc")
      for op in ("softmax", "reduce")],
    ("workspace-shared", "plain"), ("workspace-shared", "gated"),
    ("leak", "s.malloc"), ("leak", "srt.malloc"), ("leak", "graph"), ("leak", "executor"),
]
PARAMS = [pytest.param(c, id="/".join(c)) for c in CASES]


def check_planted(p: Program) -> None:
    """The planted bug's findings: of its kinds, inside its memory; no other finding, no leak."""
    planted, why = p.planted, p.explain()
    if planted.leak is not None:
        assert p.findings == [], why
        if isinstance(planted.leak, Buf):
            assert [f.ptr for f in p.leaks] == [planted.leak.ptr], why
        else:
            assert len(p.leaks) == 1 and "executor" in p.leaks[0].message, why
        assert p.leaks_after == [], why
        return
    assert p.leaks == [], why
    if planted.raised is not None:  # a too-small workspace refused by phase 2: an API error only
        assert isinstance(planted.raised, srt.StreamRTError) and p.findings == [], why
        return
    assert p.findings, f"the planted bug was not found\n{why}"
    assert {f.kind for f in p.findings} <= planted.kinds, why
    assert all(planted.covers(f.ptr) for f in p.findings), f"a finding outside the planted bug\n{why}"


@pytest.mark.parametrize("case", PARAMS)
@_settings(BUG_EXAMPLES)
@given(seed=SEEDS)
def test_sanitizer_finds_each_planted_bug(case, seed):
    """A random program with one planted bug reports it with its kind, and nothing else."""
    check_planted(Program(seed, case).run())


@pytest.mark.parametrize("case", [None, ("race", "gated"), ("workspace-shared", "plain")])
def test_sanitizer_program_seed_reproduces_the_program(case):
    """The same seed builds the same program, step for step (a printed seed replays a failure)."""
    logs = [Program(12345, case).run().log for _ in range(2)]
    assert logs[0] == logs[1] and len(logs[0]) > 3
