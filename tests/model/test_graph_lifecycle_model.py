"""Stateful: the whole graph/exec lifecycle against a pure-Python reference model.

A hypothesis ``RuleBasedStateMachine`` builds a graph (kernel, memcpy, memset, host, empty,
child-graph, event record/wait and graph-memory alloc/free nodes with random dependencies),
adds and removes edges, clones it (mutating the clone, sometimes carrying on with it),
instantiates it (with and without ``auto_free_on_launch``), launches execs on random streams
(legacy, blocking, non-blocking), changes node parameters and enabled states on execs, updates
execs from rebuilt graphs (same topology with new parameters, or incompatible ones refused with
the documented ``GraphExecUpdateResult``), uploads, destroys, frees graph memory in stream order
and synchronizes. The model keeps the expected buffer contents (every launch applied in a
topological order of its enabled nodes), vector clocks of the streams (to make every launch
ordered after all earlier work, by events or host synchronizes where the runtime does not order
it already) and the expected error class of each refused call. Every node's conflicting
accesses are ordered by the DAG, so any valid schedule gives the model's bytes.

Checked: buffers equal the model after each synchronize; refused calls raise the documented
errors and leave graph and exec usable; nothing leaks once everything is destroyed; with the
sanitizer collecting, a correct program has no finding. It runs plain, with delay injection
(a missing edge shows as a wrong result) and with the sanitizer on.
"""

from __future__ import annotations

import copy
import gc
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import streamrt as srt
from streamrt.graph import memory as gmem
from tests.conftest import restore_delays, set_delays

N = 16  # int32 elements per buffer
NB = N * 4
NBUF = 4
R = srt.GraphExecUpdateResult
MAX_NODES = 14
MAX_EXECS = 3


@srt.kernel
def mix_kernel(ctx, dst, src, n, c):
    """dst = dst * 3 + src + c + grid.x (int32, wraps): exact in any valid order."""
    s = ctx.array(src, (n,), np.int32, readonly=True).copy()
    d = ctx.array(dst, (n,), np.int32)
    d[:] = d * np.int32(3) + s + np.int32(c + ctx.grid[0])


@srt.kernel
def fill_kernel(ctx, dst, n, c):
    ctx.array(dst, (n,), np.int32)[:] = c + ctx.grid[0]


# -- the reference model ------------------------------------------------------------------------
class Spec:
    """One node's recipe: kind, parameters, dependencies (indices) and declared accesses."""

    def __init__(self, kind: str, p: dict, deps: list[int], reads=(), writes=(), fixed=False):
        self.kind = kind
        self.p = p
        self.deps = list(deps)
        self.reads = frozenset(reads)
        self.writes = frozenset(writes)
        self.fixed = fixed  # a graph-memory block's memset: never disabled nor moved

    def type(self) -> srt.NodeType:
        return {"mix": srt.NodeType.KERNEL, "fill": srt.NodeType.KERNEL,
                "memcpy": srt.NodeType.MEMCPY, "memset": srt.NodeType.MEMSET,
                "host": srt.NodeType.HOST, "empty": srt.NodeType.EMPTY,
                "child": srt.NodeType.GRAPH, "record": srt.NodeType.EVENT_RECORD,
                "wait": srt.NodeType.WAIT_EVENT, "alloc": srt.NodeType.MEM_ALLOC,
                "free": srt.NodeType.MEM_FREE}[self.kind]


def accesses(kind: str, p: dict) -> tuple[set, set]:
    if kind == "mix":
        return {p["src"]}, {p["dst"]}
    if kind == "fill":
        return set(), {p["dst"]}
    if kind == "memcpy":
        return {p["src"]}, {p["dst"]}
    if kind == "memset":
        return set(), {p["dst"]}
    if kind == "child":
        r, w = set(), set()
        for c in p["children"]:
            cr, cw = accesses(c.kind, c.p)
            r |= cr
            w |= cw
        return r, w
    if kind in ("alloc", "free"):
        return set(), {p["res"]}
    return set(), set()


def conflict(a: Spec, b: Spec) -> bool:
    return bool(a.writes & (b.reads | b.writes) or b.writes & a.reads)


def ancestors(specs: list[Spec]) -> list[set[int]]:
    """Every node's ancestors (the model's reachability)."""
    out: list[set[int] | None] = [None] * len(specs)

    def anc(i: int) -> set[int]:
        if out[i] is None:
            acc: set[int] = set()
            for d in specs[i].deps:
                acc |= anc(d) | {d}
            out[i] = acc
        return out[i]

    return [anc(i) for i in range(len(specs))]


def race_free(specs: list[Spec]) -> bool:
    anc = ancestors(specs)
    for i, j in itertools.combinations(range(len(specs)), 2):
        if conflict(specs[i], specs[j]) and i not in anc[j] and j not in anc[i]:
            return False
    return True


def topo(specs: list[Spec]) -> list[int]:
    left = {i: len(set(s.deps)) for i, s in enumerate(specs)}
    dependents: dict[int, list[int]] = {i: [] for i in range(len(specs))}
    for i, s in enumerate(specs):
        for d in set(s.deps):
            dependents[d].append(i)
    ready = sorted(i for i, n in left.items() if n == 0)
    out = []
    while ready:
        i = ready.pop(0)
        out.append(i)
        for j in dependents[i]:
            left[j] -= 1
            if left[j] == 0:
                ready.append(j)
    assert len(out) == len(specs)
    return out


def apply_spec(s: Spec, mem: dict, hits: dict) -> None:
    p = s.p
    for key in ("dst", "src", "res"):
        if isinstance(p.get(key), tuple):  # graph memory: contents undefined until written
            mem.setdefault(p[key], np.zeros(NB, np.uint8))
    if s.kind == "mix":
        src = mem[p["src"]].view(np.int32).copy()
        d = mem[p["dst"]].view(np.int32)
        d[:] = d * np.int32(3) + src + np.int32(p["c"] + p["grid"])
    elif s.kind == "fill":
        mem[p["dst"]].view(np.int32)[:] = p["c"] + p["grid"]
    elif s.kind == "memcpy":
        k = p["nbytes"]
        mem[p["dst"]][:k] = mem[p["src"]][:k]
    elif s.kind == "memset":
        mem[p["dst"]][:p["nbytes"]] = p["value"]
    elif s.kind == "host":
        hits[p["key"]] = hits.get(p["key"], 0) + 1
    elif s.kind == "child":
        for c in p["children"]:
            apply_spec(c, mem, hits)


def update_result(old: list[Spec], new: list[Spec]) -> R | None:
    """What ``ge.update`` must answer (DESIGN.md §5 order: topology, then node by node)."""
    if len(old) != len(new):
        return R.TOPOLOGY_CHANGED
    for o, n in zip(old, new):
        if sorted(set(o.deps)) != sorted(set(n.deps)):
            return R.TOPOLOGY_CHANGED
    for o, n in zip(old, new):
        if o.type() is not n.type():
            return R.NODE_TYPE_CHANGED
        if o.kind == "memcpy" and (o.p["dst"] == "h", o.p["src"] == "h") != (
                n.p["dst"] == "h", n.p["src"] == "h"):
            return R.PARAMETERS_CHANGED
        if o.kind in ("alloc", "free") and o.p["res"] != n.p["res"]:
            return R.NOT_SUPPORTED
        if o.kind == "child":
            sub = update_result(o.p["children"], n.p["children"])
            if sub is not None:
                return sub
    return None


class GState:
    """A graph under construction with its node handles and the model's recipes."""

    def __init__(self, graph: srt.Graph, nodes: list, specs: list[Spec]):
        self.graph, self.nodes, self.specs = graph, nodes, specs

    def edges(self) -> list[tuple[int, int]]:
        return sorted((d, i) for i, s in enumerate(self.specs) for d in set(s.deps))


class ExecState:
    def __init__(self, ge, nodes, specs, auto_free, allocs):
        self.ge = ge
        self.nodes = nodes  # node handles of the instantiated graph
        self.specs = specs  # the exec's own copy of the recipes (set-params edit these)
        self.disabled: set[int] = set()
        self.auto_free = auto_free
        self.allocs = allocs  # the model's allocation ids this exec maps
        self.destroyed = False
        self.held = False  # destroyed with graph memory that may still be mapped
        self.last = None  # (stream index, pos, clock) of its previous launch


ERR = (srt.StreamRTError,)


# -- the state machine --------------------------------------------------------------------------
class GraphLifecycle(RuleBasedStateMachine):
    """The machine; subclasses set delay injection or the sanitizer."""

    delay_us = 0
    sanitize = False

    @initialize()
    def setup(self):
        self.dev = srt.Device("cpu:0")
        # earlier tests' garbage (a conditional handle's memory, say) is released by finalizers
        # through the device's reclaim: collected here, not during the run, where it would make
        # the address space smaller at teardown than at setup
        gc.collect()
        self.dev.synchronize()
        self.prev_delay = set_delays(self.delay_us)
        if self.sanitize:
            srt.sanitizer.enable("collect")
            srt.sanitizer.clear()
        self.base_allocs = len(gmem._allocs)
        self.base_held = set(gmem.held)  # other tests' graph memory still held by live allocations
        self.base_info = dict(self.dev.graph_mem_info())
        self.base_space = len(srt.backends.cpu.SPACE.allocations())
        self.bufs = [srt.malloc(NB, self.dev) for _ in range(NBUF)]
        self.host = np.zeros(N, np.int32)
        self.mem = {i: np.zeros(NB, np.uint8) for i in range(NBUF)}
        self.mem["h"] = np.zeros(NB, np.uint8)
        for p in self.bufs:
            srt.memset(p, 0, NB)
        self.streams = [self.dev.default_stream, srt.Stream(self.dev), srt.Stream(self.dev),
                        srt.Stream(self.dev, non_blocking=True),
                        srt.Stream(self.dev, non_blocking=True)]
        self.kind = ["legacy", "blocking", "blocking", "nb", "nb"]
        ns = len(self.streams)
        self.pos = [0] * ns
        self.clock = [dict() for _ in range(ns)]
        self.proven = [0] * ns
        self.events = [srt.Event(self.dev), srt.Event(self.dev)]
        self.ev_clock = [dict(), dict()]
        self.hits: dict[int, int] = {}
        self.real_hits: dict[int, int] = {}
        self.keys = itertools.count()
        self.allocs: dict[int, dict] = {}  # model alloc id -> ptr, live, owner (ExecState)
        self.g = GState(srt.Graph(), [], [])
        self.execs: list[ExecState] = []
        self.readers: dict[tuple[int, int], srt.GraphExec] = {}
        self.done = False

    # -- helpers ------------------------------------------------------------------------------
    def ptr(self, res):
        if isinstance(res, int):
            return self.bufs[res]
        if res == "h":
            return self.host
        return self.allocs[res[1]]["ptr"]

    def _host_fn(self, key):
        def fn():
            self.real_hits[key] = self.real_hits.get(key, 0) + 1
        return fn

    def make(self, g: srt.Graph, s: Spec, deps: list):
        p = s.p
        if s.kind == "mix":
            return g.add_kernel_node(mix_kernel, self.ptr(p["dst"]), self.ptr(p["src"]), N, p["c"],
                                     grid=p["grid"], deps=deps)
        if s.kind == "fill":
            return g.add_kernel_node(fill_kernel, self.ptr(p["dst"]), N, p["c"], grid=p["grid"],
                                     deps=deps)
        if s.kind == "memcpy":
            return g.add_memcpy_node(self.ptr(p["dst"]), self.ptr(p["src"]), p["nbytes"], deps=deps)
        if s.kind == "memset":
            return g.add_memset_node(self.ptr(p["dst"]), p["value"], p["nbytes"], deps=deps)
        if s.kind == "host":
            return g.add_host_node(self._host_fn(p["key"]), deps=deps)
        if s.kind == "empty":
            return g.add_empty_node(deps=deps)
        if s.kind == "record":
            return g.add_event_record_node(self.events[p["ev"]], deps=deps)
        if s.kind == "wait":
            return g.add_event_wait_node(self.events[p["ev"]], deps=deps)
        if s.kind == "child":
            child = srt.Graph()
            prev = []
            for c in p["children"]:
                prev = [self.make(child, c, prev)]
            return g.add_child_graph_node(child, deps=deps)
        if s.kind == "alloc":
            n = g.add_mem_alloc_node(NB, deps=deps)
            entry = self.allocs.setdefault(p["res"][1], {"ptr": None, "live": False,
                                                          "owner": None})
            if entry["ptr"] is None:
                entry["ptr"] = n.ptr
            return n
        if s.kind == "free":
            return g.add_mem_free_node(self.ptr(p["res"]), deps=deps)
        raise AssertionError(s.kind)

    def add(self, gs: GState, kind: str, p: dict, extra: list[int], fixed=False) -> int:
        r, w = accesses(kind, p)
        s = Spec(kind, p, [], r, w, fixed)
        need = [i for i, o in enumerate(gs.specs) if conflict(o, s)]
        deps = sorted(set(need) | {i for i in extra if i < len(gs.specs)})
        s.deps = deps
        node = self.make(gs.graph, s, [gs.nodes[i] for i in deps])
        gs.specs.append(s)
        gs.nodes.append(node)
        return len(gs.specs) - 1

    def check_structure(self, gs: GState) -> None:
        g = gs.graph
        assert g.nodes() == gs.nodes
        assert sorted((d.index, n.index) for d, n in g.edges()) == gs.edges()
        for n, s in zip(gs.nodes, gs.specs):
            assert n.type is s.type()
            assert sorted(d.index for d in n.dependencies) == sorted(set(s.deps))

    def expect(self, errors, fn, *args, **kw):
        """Call; ``errors`` None: must succeed; else a tuple of acceptable error classes."""
        if errors is None:
            return fn(*args, **kw)
        with pytest.raises(errors):
            fn(*args, **kw)
        return None

    # -- ordering model -------------------------------------------------------------------------
    def snapshot(self, i):
        snap = dict(self.clock[i])
        snap[i] = self.pos[i]
        return snap

    def merge(self, i, snap):
        for k, v in snap.items():
            if v > self.clock[i].get(k, 0):
                self.clock[i][k] = v

    def implicit(self, i):
        """Legacy default stream semantics, applied when work is enqueued on stream i."""
        if self.kind[i] == "legacy":
            for j, k in enumerate(self.kind):
                if k == "blocking":
                    self.merge(i, self.snapshot(j))
        elif self.kind[i] == "blocking":
            self.merge(i, self.snapshot(0))

    def order_before_work(self, i, how, es: ExecState | None):
        """Make stream i's next op ordered after every earlier op (events or host syncs)."""
        trial = dict(self.clock[i])
        saved = self.clock[i]
        self.clock[i] = trial
        self.implicit(i)
        if es is not None and es.last is not None:
            _, _, snap = es.last
            self.merge(i, snap)
        # (a wait node of the exec orders only its dependents, not the whole launch: it is no
        # part of what the launch is ordered after)
        self.clock[i] = saved
        for j in range(len(self.streams)):
            if j == i:
                continue
            need = self.pos[j]
            if trial.get(j, 0) >= need or self.proven[j] >= need:
                continue
            if how == "sync":
                self.streams[j].synchronize()
                self.prove(j)
            else:
                e = self.streams[j].record()
                self.streams[i].wait(e)
                self.merge(i, self.snapshot(j))

    def prove(self, j):
        for k, v in self.snapshot(j).items():
            self.proven[k] = max(self.proven[k], v)

    # -- building -------------------------------------------------------------------------------
    def extra_deps(self, data):
        n = len(self.g.specs)
        if n == 0:
            return []
        return data.draw(st.lists(st.integers(0, n - 1), max_size=2))

    @precondition(lambda self: len(self.g.specs) < MAX_NODES)
    @rule(data=st.data(), kind=st.sampled_from(
        ["mix", "mix", "fill", "memcpy", "memset", "host", "empty", "child", "record", "wait",
         "d2h"]))
    def add_node(self, data, kind):
        buf = st.integers(0, NBUF - 1)
        c = st.integers(-5, 5)
        if kind == "mix":
            p = {"dst": data.draw(buf), "src": data.draw(buf), "c": data.draw(c),
                 "grid": data.draw(st.integers(1, 3))}
        elif kind == "fill":
            p = {"dst": data.draw(buf), "c": data.draw(c), "grid": data.draw(st.integers(1, 3))}
        elif kind in ("memcpy", "d2h"):
            dst = "h" if kind == "d2h" else data.draw(buf)
            kind = "memcpy"
            p = {"dst": dst, "src": data.draw(buf.filter(lambda b: b != dst)),
                 "nbytes": data.draw(st.sampled_from([4, 16, NB]))}
        elif kind == "memset":
            p = {"dst": data.draw(buf), "value": data.draw(st.integers(0, 255)),
                 "nbytes": data.draw(st.sampled_from([4, 16, NB]))}
        elif kind == "host":
            p = {"key": next(self.keys)}
        elif kind == "child":
            children = []
            for _ in range(data.draw(st.integers(1, 2))):
                if data.draw(st.booleans()):
                    cp = {"dst": data.draw(buf), "src": data.draw(buf), "c": data.draw(c),
                          "grid": 1}
                    children.append(Spec("mix", cp, [], *accesses("mix", cp)))
                else:
                    cp = {"dst": data.draw(buf), "value": data.draw(st.integers(0, 255)),
                          "nbytes": 16}
                    children.append(Spec("memset", cp, [], *accesses("memset", cp)))
            p = {"children": children}
        elif kind in ("record", "wait"):
            p = {"ev": data.draw(st.integers(0, 1))}
        else:
            p = {}
        self.add(self.g, kind, p, self.extra_deps(data))
        self.check_structure(self.g)

    @precondition(lambda self: len(self.g.specs) < MAX_NODES - 4)
    @rule(data=st.data(), with_free=st.booleans())
    def add_memory_block(self, data, with_free):
        """alloc -> memset(graph memory) -> mix(buffer <- graph memory) [-> free]."""
        k = len(self.allocs)
        res = ("g", k)
        a = self.add(self.g, "alloc", {"res": res}, self.extra_deps(data))
        m = self.add(self.g, "memset", {"dst": res, "value": data.draw(st.integers(0, 255)),
                                        "nbytes": NB}, [a], fixed=True)
        x = self.add(self.g, "mix", {"dst": data.draw(st.integers(0, NBUF - 1)), "src": res,
                                     "c": 1, "grid": 1}, [m])
        if with_free:
            self.add(self.g, "free", {"res": res}, [x])
        self.check_structure(self.g)

    @precondition(lambda self: len(self.g.specs) >= 2)
    @rule(data=st.data())
    def add_dependency(self, data):
        gs = self.g
        n = len(gs.specs)
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(0, n - 1))
        anc = ancestors(gs.specs)
        bad = a == b or a in gs.specs[b].deps or b in anc[a]
        self.expect((srt.InvalidValueError,) if bad else None, gs.graph.add_dependencies,
                    gs.nodes[a], gs.nodes[b])
        if not bad:
            gs.specs[b].deps.append(a)
        self.check_structure(gs)

    @precondition(lambda self: any(s.deps for s in self.g.specs))
    @rule(data=st.data())
    def remove_dependency(self, data):
        gs = self.g
        a, b = data.draw(st.sampled_from(gs.edges()))
        trial = copy.copy(gs.specs)
        trial[b] = copy.copy(trial[b])
        trial[b].deps = [d for d in trial[b].deps if d != a]
        if not race_free(trial):  # an edge that orders a conflict stays (the program is correct)
            return
        gs.graph.remove_dependencies(gs.nodes[a], gs.nodes[b])
        gs.specs[b].deps = trial[b].deps
        # the reverse edge does not exist
        self.expect((srt.InvalidValueError,), gs.graph.remove_dependencies, gs.nodes[a],
                    gs.nodes[b])
        self.check_structure(gs)

    @rule(data=st.data(), adopt=st.booleans())
    def clone_and_mutate(self, data, adopt):
        gs = self.g
        before = (gs.edges(), len(gs.specs))
        c = gs.graph.clone()
        cnodes = [c.find_in_clone(n) for n in gs.nodes]
        assert cnodes == c.nodes()
        for n, cn in zip(gs.nodes, cnodes):
            assert cn.type is n.type and cn.index == n.index
            if n.type is not srt.NodeType.GRAPH:
                assert dict(cn.params) == dict(n.params)
        if cnodes:
            self.expect((srt.InvalidValueError,), c.find_in_clone, cnodes[0])
            self.expect((srt.InvalidValueError,), gs.graph.add_dependencies, gs.nodes[0],
                        cnodes[-1])
        cs = GState(c, cnodes, [copy.copy(s) for s in gs.specs])
        for s in cs.specs:
            s.deps = list(s.deps)
        # mutate the clone: a new node, an edge removed if that stays correct
        if len(cs.specs) < MAX_NODES:
            self.add(cs, "empty", {}, self.extra_deps(data))
        edges = cs.edges()
        if edges:
            a, b = data.draw(st.sampled_from(edges))
            trial = list(cs.specs)
            trial[b] = copy.copy(trial[b])
            trial[b].deps = [d for d in trial[b].deps if d != a]
            if race_free(trial):
                c.remove_dependencies(cnodes[a], cnodes[b])
                cs.specs[b] = trial[b]
        self.check_structure(cs)
        assert (gs.edges(), len(gs.specs)) == before
        self.check_structure(gs)
        if adopt:
            self.g = cs

    # -- execs ----------------------------------------------------------------------------------
    def live_execs(self):
        return [e for e in self.execs if not e.destroyed]

    @precondition(lambda self: len([e for e in self.execs if not e.destroyed]) < MAX_EXECS)
    @rule(auto_free=st.booleans())
    def instantiate(self, auto_free):
        gs = self.g
        ids = sorted({s.p["res"][1] for s in gs.specs if s.kind in ("alloc", "free")})
        maybe = set()
        must = set()
        for k in ids:
            owner = self.allocs[k]["owner"]
            if owner is None:
                continue
            if not owner.destroyed:
                must.add(srt.NotSupportedError)
            elif owner.held:
                if any(self.allocs[j]["live"] for j in owner.allocs):
                    must.add(srt.InvalidValueError)
                else:
                    maybe.add(srt.InvalidValueError)
        if must:
            self.expect(tuple(must | maybe), gs.graph.instantiate, auto_free_on_launch=auto_free)
            return
        if maybe:  # a destroyed exec's last launch may still run: a synchronize proves it
            self.dev.synchronize()
            for j in range(len(self.streams)):
                self.prove(j)
        ge = gs.graph.instantiate(auto_free_on_launch=auto_free)
        es = ExecState(ge, list(gs.nodes), [copy.deepcopy(s) for s in gs.specs], auto_free, ids)
        for k in ids:
            old = self.allocs[k]["owner"]
            if old is not None:
                old.held = False
            self.allocs[k]["owner"] = es
        self.execs.append(es)

    def _pick_exec(self, data, alive=True):
        pool = self.live_execs() if alive else self.execs
        return data.draw(st.sampled_from(pool))

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), stream=st.integers(0, 4), how=st.sampled_from(["event", "sync"]))
    def launch(self, data, stream, how):
        es = self._pick_exec(data, alive=False)
        s = self.streams[stream]
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.launch, s)
            return
        allocs = [sp.p["res"][1] for sp in es.specs if sp.kind == "alloc"]
        if not es.auto_free and any(self.allocs[k]["live"] for k in allocs):
            self.expect((srt.InvalidValueError,), es.ge.launch, s)
            return
        self.order_before_work(stream, how, es)
        es.ge.launch(s)
        # model: ordering the runtime gives the launch, then its effects
        self.implicit(stream)
        if es.last is not None:
            self.merge(stream, es.last[2])
        # a record node publishes what was ordered before the launch (and what the wait nodes
        # among its ancestors waited for, and its own node: not modelled, so the model orders
        # no less than the runtime), not the launch itself
        recorded = self.snapshot(stream)
        self.pos[stream] += 1
        # the launch's later work is ordered after what its wait nodes waited for, bound to the
        # records current at the launch (before this launch's records)
        for sp in es.specs:
            if sp.kind == "wait":
                self.merge(stream, self.ev_clock[sp.p["ev"]])
        for i in topo(es.specs):
            if i not in es.disabled:
                apply_spec(es.specs[i], self.mem, self.hits)
        for sp in es.specs:
            if sp.kind == "alloc":
                self.allocs[sp.p["res"][1]]["live"] = True
        for sp in es.specs:
            if sp.kind == "free":
                self.allocs[sp.p["res"][1]]["live"] = False
        for sp in es.specs:
            if sp.kind == "record":
                self.ev_clock[sp.p["ev"]] = dict(recorded)
        es.last = (stream, self.pos[stream], self.snapshot(stream))

    @precondition(lambda self: any(a["live"] for a in self.allocs.values()))
    @rule(data=st.data(), how=st.sampled_from(["event", "sync"]))
    def free_outside(self, data, how):
        """s.free of a live graph allocation, on the stream of the launch that made it."""
        k = data.draw(st.sampled_from(sorted(k for k, a in self.allocs.items() if a["live"])))
        owner = self.allocs[k]["owner"]
        stream = owner.last[0]
        self.order_before_work(stream, how, None)
        self.streams[stream].free(self.allocs[k]["ptr"])
        self.implicit(stream)
        self.pos[stream] += 1
        self.allocs[k]["live"] = False
        self.expect((srt.InvalidAddressError,), self.streams[stream].free, self.allocs[k]["ptr"])

    @precondition(lambda self: any(a["live"] for a in self.allocs.values()))
    @rule(data=st.data(), stream=st.integers(0, 4), how=st.sampled_from(["event", "sync"]),
          dst=st.integers(0, NBUF - 1))
    def read_graph_memory(self, data, stream, how, dst):
        """Another graph's copy of a live graph allocation (graph memory escapes its graph); its
        exec is kept and launched again whenever that allocation is live again."""
        live = sorted(k for k, a in self.allocs.items() if a["live"])
        k = data.draw(st.sampled_from(live))
        ge = self.readers.get((k, dst))
        if ge is None:
            if len(self.readers) >= 3:
                return
            g = srt.Graph()
            g.add_memcpy_node(self.bufs[dst], self.allocs[k]["ptr"], NB)
            ge = self.readers[(k, dst)] = g.instantiate()
        self.order_before_work(stream, how, None)
        ge.launch(self.streams[stream])
        self.implicit(stream)
        self.pos[stream] += 1
        self.mem[dst][:] = self.mem[("g", k)]

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), stream=st.integers(0, 4))
    def upload(self, data, stream):
        es = self._pick_exec(data, alive=False)
        self.expect((srt.InvalidHandleError,) if es.destroyed else None, es.ge.upload,
                    self.streams[stream])

    @precondition(lambda self: self.execs)
    @rule(data=st.data())
    def destroy(self, data):
        es = self._pick_exec(data, alive=False)
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.destroy)
            return
        es.ge.destroy()
        es.destroyed = True
        es.held = bool(es.allocs)

    def _exec_node(self, data, es, kinds):
        idx = [i for i, s in enumerate(es.specs) if s.kind in kinds and not s.fixed]
        if not idx:
            return None
        return data.draw(st.sampled_from(idx))

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), c=st.integers(-5, 5), grid=st.none() | st.integers(1, 3))
    def set_kernel_params(self, data, c, grid):
        es = self._pick_exec(data, alive=False)
        i = self._exec_node(data, es, ("mix", "fill"))
        if i is None:
            j = self._exec_node(data, es, ("memset", "memcpy", "host", "empty"))
            if j is not None:  # not a kernel node
                self.expect((srt.InvalidValueError, srt.InvalidHandleError),
                            es.ge.set_kernel_node_params, es.nodes[j], self.bufs[0], N, c)
            return
        s = es.specs[i]
        args = ((self.ptr(s.p["dst"]), self.ptr(s.p["src"]), N, c) if s.kind == "mix"
                else (self.ptr(s.p["dst"]), N, c))
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.set_kernel_node_params, es.nodes[i],
                        *args, grid=grid)
            return
        es.ge.set_kernel_node_params(es.nodes[i], *args, grid=grid)
        s.p = dict(s.p, c=c)
        if grid is not None:
            s.p["grid"] = grid

    @precondition(lambda self: self.execs)
    @rule(data=st.data())
    def set_memcpy_params(self, data):
        es = self._pick_exec(data, alive=False)
        i = self._exec_node(data, es, ("memcpy",))
        if i is None:
            return
        s = es.specs[i]
        to_host = s.p["dst"] == "h"
        dst = "h" if to_host else data.draw(st.integers(0, NBUF - 1))
        src = data.draw(st.integers(0, NBUF - 1).filter(lambda b: b != dst))
        nbytes = data.draw(st.sampled_from([4, 16, NB]))
        flip = data.draw(st.booleans())
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.set_memcpy_node_params, es.nodes[i],
                        self.ptr(dst), self.ptr(src), nbytes)
            return
        if flip:  # direction change: refused, exec unchanged
            bad_dst = self.bufs[0] if to_host else self.host
            self.expect((srt.InvalidValueError,), es.ge.set_memcpy_node_params, es.nodes[i],
                        bad_dst, self.ptr(src), nbytes)
            return
        new = Spec("memcpy", {"dst": dst, "src": src, "nbytes": nbytes}, s.deps,
                   *accesses("memcpy", {"dst": dst, "src": src}))
        trial = list(es.specs)
        trial[i] = new
        if not race_free(trial):
            return
        es.ge.set_memcpy_node_params(es.nodes[i], self.ptr(dst), self.ptr(src), nbytes)
        es.specs[i] = new

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), value=st.integers(0, 255), nbytes=st.sampled_from([4, 16, NB]))
    def set_memset_params(self, data, value, nbytes):
        es = self._pick_exec(data, alive=False)
        i = self._exec_node(data, es, ("memset",))
        if i is None:
            return
        dst = data.draw(st.integers(0, NBUF - 1))
        new = Spec("memset", {"dst": dst, "value": value, "nbytes": nbytes}, es.specs[i].deps,
                   *accesses("memset", {"dst": dst}))
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.set_memset_node_params, es.nodes[i],
                        self.bufs[dst], value, nbytes)
            return
        trial = list(es.specs)
        trial[i] = new
        if not race_free(trial):
            return
        es.ge.set_memset_node_params(es.nodes[i], self.bufs[dst], value, nbytes)
        es.specs[i] = new

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), enabled=st.booleans())
    def set_enabled(self, data, enabled):
        es = self._pick_exec(data, alive=False)
        if not es.specs:
            return
        i = data.draw(st.integers(0, len(es.specs) - 1))
        s = es.specs[i]
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.set_node_enabled, es.nodes[i], enabled)
            return
        if s.kind not in ("mix", "fill", "memcpy", "memset"):
            self.expect((srt.InvalidValueError,), es.ge.set_node_enabled, es.nodes[i], enabled)
            return
        if s.fixed:
            return
        es.ge.set_node_enabled(es.nodes[i], enabled)
        (es.disabled.discard if enabled else es.disabled.add)(i)
        assert es.ge.node_enabled(es.nodes[i]) is enabled

    def rebuild(self, specs: list[Spec]) -> srt.Graph:
        g = srt.Graph()
        nodes = []
        for s in specs:
            nodes.append(self.make(g, s, []))
        for i, s in enumerate(specs):
            for d in dict.fromkeys(s.deps):
                g.add_dependencies(nodes[d], nodes[i])
        return g

    @precondition(lambda self: self.execs)
    @rule(data=st.data(), how=st.sampled_from(
        ["clone", "params", "params", "type", "direction", "edge", "node"]))
    def exec_update(self, data, how):
        es = self._pick_exec(data, alive=False)
        if how == "clone":  # the current builder graph as it is
            new = [copy.deepcopy(s) for s in self.g.specs]
            graph = self.g.graph.clone()
        else:
            new = [copy.deepcopy(s) for s in es.specs]
            for s in new:
                if s.kind == "alloc":  # a rebuilt graph has allocations of its own
                    k = len(self.allocs)
                    res = ("g", k)
                    old = s.p["res"]
                    for t in new:
                        for key in ("res", "dst", "src"):
                            if t.p.get(key) == old:
                                t.p[key] = res
                    self.allocs[k] = {"ptr": None, "live": False, "owner": None}
                    s.p["res"] = res
            for s in new:
                if s.kind in ("mix", "fill"):
                    s.p["c"] = data.draw(st.integers(-5, 5))
                    if s.kind == "mix" and s.p["dst"] == s.p["src"] and data.draw(st.booleans()):
                        s.kind = "fill"  # another function: allowed
                elif s.kind == "memset" and not s.fixed:
                    s.p["value"] = data.draw(st.integers(0, 255))
                elif s.kind == "child":
                    for c in s.p["children"]:
                        if c.kind == "mix":
                            c.p["c"] = data.draw(st.integers(-5, 5))
            if how == "type":
                idx = [i for i, s in enumerate(new) if s.kind in ("mix", "fill", "memset", "host")
                       and not s.fixed]
                if not idx:
                    return
                i = data.draw(st.sampled_from(idx))
                new[i] = Spec("empty", {}, new[i].deps)
            elif how == "direction":
                idx = [i for i, s in enumerate(new) if s.kind == "memcpy"]
                if not idx:
                    return
                i = data.draw(st.sampled_from(idx))
                s = new[i]
                s.p["dst"] = 0 if s.p["dst"] == "h" else "h"
                if s.p["src"] == s.p["dst"]:
                    s.p["src"] = 1
            elif how == "edge":
                if len(new) < 2:
                    return
                a, b = sorted(data.draw(st.lists(st.integers(0, len(new) - 1), min_size=2,
                                                 max_size=2, unique=True)))
                if a in new[b].deps:
                    new[b].deps = [d for d in new[b].deps if d != a]
                else:
                    anc = ancestors(new)
                    if b in anc[a]:
                        return
                    new[b].deps.append(a)
            elif how == "node":
                new.append(Spec("empty", {}, []))
            graph = self.rebuild(new)
        expected = update_result(es.specs, new)
        if es.destroyed:
            self.expect((srt.InvalidHandleError,), es.ge.update, graph)
            return
        if expected is not None:
            with pytest.raises(srt.GraphExecUpdateError) as info:
                es.ge.update(graph)
            assert info.value.result == expected, (info.value.result, expected)
            return
        for i, s in enumerate(new):  # the accepted graph keeps the exec's dependencies
            s.deps = es.specs[i].deps
        assert race_free(new)
        es.ge.update(graph)
        es.specs = new

    # -- synchronize and check ---------------------------------------------------------------
    @rule(how=st.sampled_from(["device", "stream", "event"]), stream=st.integers(0, 4))
    def synchronize(self, how, stream):
        if how == "stream":
            self.streams[stream].synchronize()
            self.prove(stream)
            return
        if how == "event":
            e = self.streams[stream].record()
            e.synchronize()
            self.prove(stream)
            return
        self.dev.synchronize()
        for j in range(len(self.streams)):
            self.prove(j)
        self.check_memory()

    def check_memory(self):
        for i in range(NBUF):
            got = srt.read(self.bufs[i], (NB,), np.uint8)
            assert np.array_equal(got, self.mem[i]), (i, got.view(np.int32),
                                                      self.mem[i].view(np.int32))
        assert np.array_equal(self.host.view(np.uint8), self.mem["h"])
        assert self.real_hits == self.hits
        if self.sanitize:
            assert srt.sanitizer.report() == []

    @invariant()
    def graph_consistent(self):
        if hasattr(self, "g"):
            self.check_structure(self.g)

    def teardown(self):
        if not hasattr(self, "dev"):
            return
        try:
            self.dev.synchronize()
            for j in range(len(self.streams)):
                self.prove(j)
            self.check_memory()
            for es in self.live_execs():
                es.ge.destroy()
                es.destroyed = True
            for ge in self.readers.values():
                ge.destroy()
            for a in self.allocs.values():
                if a["live"]:
                    self.streams[0].free(a["ptr"])
                    a["live"] = False
            self.dev.synchronize()
            assert not set(gmem.held) - self.base_held
            assert self.dev.graph_mem_info() == self.base_info
            for p in self.bufs:
                srt.free(p)
            for s in self.streams[1:]:
                s.destroy()
            for e in self.events:
                e.destroy()
            self.dev.synchronize()
            assert len(srt.backends.cpu.SPACE.allocations()) == self.base_space
            if self.sanitize:
                assert srt.sanitizer.report() == []
        finally:
            restore_delays(self.prev_delay)
            if self.sanitize:
                srt.sanitizer.clear()
                srt.sanitizer.disable()


class DelayedLifecycle(GraphLifecycle):
    delay_us = 50


class SanitizedLifecycle(GraphLifecycle):
    sanitize = True


# bounded (a few seconds); no shrinking: a failing run stops at once with its steps printed
_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                     phases=[Phase.explicit, Phase.reuse, Phase.generate],
                     report_multiple_bugs=False, suppress_health_check=list(HealthCheck))

TestGraphLifecycle = GraphLifecycle.TestCase
TestGraphLifecycle.settings = _SETTINGS
TestGraphLifecycleDelayed = DelayedLifecycle.TestCase
TestGraphLifecycleDelayed.settings = settings(_SETTINGS, max_examples=30)
# delay injection draws from the global ``random`` on worker threads while hypothesis draws
TestGraphLifecycleDelayed.pytestmark = [
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")]
TestGraphLifecycleSanitized = SanitizedLifecycle.TestCase
TestGraphLifecycleSanitized.settings = settings(_SETTINGS, max_examples=30)


# -- regressions ----------------------------------------------------------------------------------
def test_graph_stateful_copy_of_graph_memory_follows_its_new_mapping():
    """A copy node of another graph reading graph memory: once the memory's exec is destroyed
    and the graph instantiated again (the same fixed addresses, a new backing), the copy reads
    the new mapping (its precompiled view of the old backing read stale bytes)."""
    dev = srt.Device("cpu:0")
    s = srt.Stream(dev, non_blocking=True)
    buf = srt.malloc(NB, dev)
    srt.memset(buf, 0, NB)
    g = srt.Graph()
    a = g.add_mem_alloc_node(NB)
    m = g.add_memset_node(a.ptr, 7, NB, deps=a)
    h = srt.Graph()
    h.add_memcpy_node(buf, a.ptr, NB)
    x, y = g.instantiate(), h.instantiate()
    x.launch(s)
    y.launch(s)
    s.synchronize()
    assert (srt.read(buf, (NB,), np.uint8) == 7).all()
    s.free(a.ptr)
    x.destroy()
    dev.synchronize()
    x2 = g.instantiate()
    x2.set_memset_node_params(m, a.ptr, 9, NB)
    x2.launch(s)
    y.launch(s)
    s.synchronize()
    assert (srt.read(buf, (NB,), np.uint8) == 9).all()
    s.free(a.ptr)
    for e in (x2, y):
        e.destroy()
    dev.synchronize()
    srt.free(buf)
    s.destroy()


def test_graph_stateful_memset_node_of_freed_memory_is_an_invalid_address():
    """Relaunching a memset node whose memory was freed fails as the eager memset (and a kernel
    node) would, instead of writing into the freed buffer through its precompiled view."""
    dev = srt.Device("cpu:0")
    s = srt.Stream(dev, non_blocking=True)
    p = srt.malloc(NB, dev)
    g = srt.Graph()
    g.add_memset_node(p, 7, NB)
    ge = g.instantiate()
    ge.launch(s)
    s.synchronize()
    srt.free(p)
    with pytest.raises(srt.InvalidAddressError):
        srt.memset(p, 7, NB)
    with pytest.raises((srt.InvalidAddressError, srt.LaunchError)):
        ge.launch(s)
        s.synchronize()
    ge.destroy()
    s.destroy()
