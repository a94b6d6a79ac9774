"""Graph replay of a 1000-node chain of a tiny CUDA kernel: streamrt vs raw CUDA graphs and eager launches.

The kernel adds two 256-float32 vectors (grid 1, block 256). Ours: the chain captured through
streamrt (``s.begin_capture()``, 1000 ``s.launch``, ``s.end_capture()``, ``g.instantiate()``),
then timed as L replays ``ge.launch(s)`` and one synchronize; µs per node, best of several
repetitions after a warm-up. Peers:

* raw cuda-bindings: the same chain captured with ``cudaStreamBeginCapture`` (thread-local mode)
  around 1000 ``cuLaunchKernel``, ``cudaStreamEndCapture``, ``cudaGraphInstantiate``, replayed
  with ``cudaGraphLaunch``. Target: streamrt <= 1.2x of it.
* streamrt eager: the same 1000 kernels launched one by one with ``s.launch`` (reported).

Per-step update: the first kernel node's arguments are changed before every replay (swapping a and
b, which keeps c = 2): ``ge.set_kernel_node_params`` + ``ge.launch`` vs raw
``cuGraphExecKernelNodeSetParams`` + ``cudaGraphLaunch`` of an explicitly built graph of the same
chain, in µs per replay (reported: it shows the update reaching the instantiated graph in place,
not instantiating it again).

Needs a cuda device: without one, ``run`` returns ``{"rows": [], "skipped": reason}``.
``STREAMRT_BENCH_SMOKE=1``: a smoke run (a 10-node chain, one replay, one repetition) that only
checks that the script works, e.g. on ``tests/cuda/fake``; its figures mean nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from _common import best_us, smoke
from _gpu import (
    N_ELEMS,
    PTR3_I32,
    RawTiny,
    attempt,
    check,
    errors,
    gpu_skip_reason,
    parser,
    quietly,
    report,
    row,
    tiny_add,
)

import streamrt as srt

TARGET_RAW = 1.2


class _Ours:
    """A cuda:0 stream and the three tiny_add buffers (a = b = 1, c)."""

    def __init__(self) -> None:
        self.dev = srt.Device("cuda:0")
        self.s = srt.Stream(self.dev, non_blocking=True)
        self.ptrs: list[int] = []
        try:
            for _ in range(3):
                self.ptrs.append(srt.malloc(N_ELEMS * 4, device=self.dev))
            srt.write(self.ptrs[0], np.ones(N_ELEMS, np.float32))
            srt.write(self.ptrs[1], np.ones(N_ELEMS, np.float32))
        except BaseException:
            self.close()
            raise

    def reset_c(self) -> None:
        """Zero c, so that a result of 2.0 proves the timed work ran."""
        srt.write(self.ptrs[2], np.zeros(N_ELEMS, np.float32))

    def check_c(self, what: str) -> None:
        """Raise when c is not a + b."""
        got = srt.read(self.ptrs[2], (N_ELEMS,), np.float32)
        if not np.allclose(got, 2.0):
            raise AssertionError(f"{what}: tiny_add computed {got[:4]}..., expected 2.0")

    def close(self) -> None:
        """Free the buffers and destroy the stream."""
        for p in self.ptrs:
            quietly(srt.free, p)
        self.ptrs = []
        quietly(self.s.destroy)


def _replay(o: _Ours, nodes: int, launches: int, repeat: int) -> float:
    s = o.s
    pa, pb, pc = o.ptrs
    s.begin_capture()
    try:
        for _ in range(nodes):
            s.launch(tiny_add, pa, pb, pc, N_ELEMS, grid=1, block=N_ELEMS)
    except BaseException:
        quietly(s.end_capture)  # never leave the stream capturing
        raise
    g = s.end_capture()
    ge = g.instantiate()
    try:
        try:
            ge.upload(s)
        except srt.NotSupportedError:
            pass  # optional: the first launch uploads

        def loop(k: int) -> None:
            launch = ge.launch
            for _ in range(k):
                launch(s)
            s.synchronize()

        o.reset_c()
        loop(2)  # warm-up
        o.check_c("streamrt graph replay")
        return best_us(lambda _: loop(launches), launches * nodes, repeat)
    finally:
        quietly(ge.destroy)


def _eager(o: _Ours, nodes: int, launches: int, repeat: int) -> float:
    s = o.s
    pa, pb, pc = o.ptrs

    def loop(k: int) -> None:
        launch = s.launch
        for _ in range(k):
            launch(tiny_add, pa, pb, pc, N_ELEMS, grid=1, block=N_ELEMS)
        s.synchronize()

    o.reset_c()
    loop(nodes)  # warm-up
    o.check_c("streamrt eager")
    return best_us(loop, launches * nodes, repeat)


def _update_replay(o: _Ours, nodes: int, launches: int, repeat: int) -> float:
    s = o.s
    pa, pb, pc = o.ptrs
    g = srt.Graph()
    with o.dev:  # kernel nodes are of the current device (a cuda:0 stream launches them)
        first = node = g.add_kernel_node(tiny_add, pa, pb, pc, N_ELEMS, grid=1, block=N_ELEMS)
        for _ in range(nodes - 1):
            node = g.add_kernel_node(tiny_add, pa, pb, pc, N_ELEMS, grid=1, block=N_ELEMS,
                                     deps=node)
    ge = g.instantiate()
    swaps = ((pa, pb, pc, N_ELEMS), (pb, pa, pc, N_ELEMS))  # a + b either way
    try:
        def loop(k: int) -> None:
            update, launch = ge.set_kernel_node_params, ge.launch
            for i in range(k):
                update(first, *swaps[i & 1])
                launch(s)
            s.synchronize()

        o.reset_c()
        loop(2)  # warm-up (instantiates on the first launch)
        o.check_c("streamrt update + replay")
        return best_us(loop, launches, repeat)
    finally:
        quietly(ge.destroy)


def _raw_update_replay(nodes: int, launches: int, repeat: int) -> float:
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt

    raw = RawTiny()
    graph = gexec = None
    try:
        def params(ptrs: tuple) -> Any:
            kp = drv.CUDA_KERNEL_NODE_PARAMS()
            kp.func = raw.fn
            kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
            kp.blockDimX, kp.blockDimY, kp.blockDimZ = N_ELEMS, 1, 1
            kp.sharedMemBytes = 0
            # packed once, here: the struct's setter keeps the void*[] (no packing per update call)
            kp.kernelParams = ((*ptrs, N_ELEMS), PTR3_I32)
            return kp

        a, b, c = raw.ptrs
        swaps = (params((a, b, c)), params((b, a, c)))
        graph = check(rt.cudaGraphCreate(0))
        cugraph = drv.CUgraph(int(graph))
        first = node = check(drv.cuGraphAddKernelNode(cugraph, [], 0, swaps[0]))
        for _ in range(nodes - 1):
            node = check(drv.cuGraphAddKernelNode(cugraph, [node], 1, swaps[0]))
        gexec = check(rt.cudaGraphInstantiate(graph, 0))
        cuexec = drv.CUgraphExec(int(gexec))
        stream = raw.stream

        def loop(k: int) -> None:
            update, launch = drv.cuGraphExecKernelNodeSetParams, rt.cudaGraphLaunch
            for i in range(k):
                err, = update(cuexec, first, swaps[i & 1])
                if not err:
                    err, = launch(gexec, stream)
                if err:
                    check((err,))
            raw.synchronize()

        loop(2)
        _check_raw(raw, "raw update + replay")
        return best_us(loop, launches, repeat)
    finally:
        _close_raw(raw, graph, gexec)


def _raw_replay(nodes: int, launches: int, repeat: int) -> float:
    from cuda.bindings import runtime as rt

    raw = RawTiny()
    graph = gexec = None
    try:
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(raw.stream, mode))
        try:
            for _ in range(nodes):
                raw.launch(raw.params)  # captured, not run: the helper call is not timed
        except BaseException:
            quietly(rt.cudaStreamEndCapture, raw.stream)
            raise
        graph = check(rt.cudaStreamEndCapture(raw.stream))
        gexec = check(rt.cudaGraphInstantiate(graph, 0))
        check(rt.cudaGraphUpload(gexec, raw.stream))
        stream = raw.stream

        def loop(k: int) -> None:
            launch = rt.cudaGraphLaunch
            for _ in range(k):
                err, = launch(gexec, stream)
                if err:
                    check((err,))
            raw.synchronize()

        loop(2)
        _check_raw(raw, "raw graph")
        return best_us(lambda _: loop(launches), launches * nodes, repeat)
    finally:
        _close_raw(raw, graph, gexec)


def _check_raw(raw: RawTiny, what: str) -> None:
    """Raise when the raw c is not a + b."""
    got = raw.result()
    if not np.allclose(got, 2.0):
        raise AssertionError(f"{what}: tiny_add computed {got[:4]}..., expected 2.0")


def _close_raw(raw: RawTiny, graph: Any, gexec: Any) -> None:
    """Destroy a raw exec and graph (either may be None), then the raw buffers and stream."""
    from cuda.bindings import runtime as rt

    if gexec is not None:
        quietly(rt.cudaGraphExecDestroy, gexec)
    if graph is not None:
        quietly(rt.cudaGraphDestroy, graph)
    raw.close()


def run(nodes: int = 1000, launches: int = 20, repeat: int = 5, quick: bool = False) -> dict:
    """µs per node of streamrt replay, raw CUDA graph replay and eager launches; ``rows``."""
    reason = gpu_skip_reason()
    if reason is not None:
        return {"rows": [], "skipped": reason}
    if quick:
        launches, repeat = 5, 3
    if smoke():
        nodes, launches, repeat = min(nodes, 10), 1, 1
    ours, setup_err = attempt(_Ours)
    replay_us = eager_us = update_us = None
    replay_err = eager_err = update_err = setup_err
    updates = launches * 10  # replays with an update before each
    if ours is not None:
        try:
            replay_us, replay_err = attempt(lambda: _replay(ours, nodes, launches, repeat))
            eager_us, eager_err = attempt(lambda: _eager(ours, nodes, launches, repeat))
            update_us, update_err = attempt(lambda: _update_replay(ours, nodes, updates, repeat))
        finally:
            ours.close()
    raw_us, raw_err = attempt(lambda: _raw_replay(nodes, launches, repeat))
    raw_update_us, raw_update_err = attempt(lambda: _raw_update_replay(nodes, updates, repeat))
    res: dict = {"nodes": nodes, "launches": launches, "repeat": repeat, "replay_us": replay_us,
                 "raw_replay_us": raw_us, "eager_us": eager_us, "update_replay_us": update_us,
                 "raw_update_replay_us": raw_update_us, "notes": []}
    res["rows"] = [
        row(f"graph replay, {nodes}-node chain: streamrt vs raw cudaGraphLaunch", replay_us, raw_us,
            "us/node", limit=TARGET_RAW, error=errors(("streamrt", replay_err), ("raw", raw_err))),
        row(f"graph replay vs streamrt eager launches of the same {nodes} kernels", replay_us,
            eager_us, "us/node", error=errors(("replay", replay_err), ("eager", eager_err))),
        row(f"set one kernel node's arguments + replay, {nodes}-node chain: streamrt vs raw "
            "cuGraphExecKernelNodeSetParams + cudaGraphLaunch", update_us, raw_update_us,
            "us/replay", error=errors(("streamrt", update_err), ("raw", raw_update_err))),
    ]
    res["pass"] = all(r["pass"] for r in res["rows"])
    return res


def main() -> None:
    """Command line: a readable report, or the result as JSON with ``--json``."""
    ap = parser(__doc__, "fewer replays and repetitions")
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    r = run(args.nodes, quick=args.quick)
    title = "" if "skipped" in r else (
        f"graph replay of a {r['nodes']}-node chain of a tiny CUDA kernel, {r['launches']} replays, "
        f"best of {r['repeat']}")
    report(r, args.json, title, "us/node")


if __name__ == "__main__":
    main()
