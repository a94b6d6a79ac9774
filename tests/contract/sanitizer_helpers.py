"""Helpers of the sanitizer tests: kernels that write, read and set, streams, finding kinds."""

from __future__ import annotations

import numpy as np

import streamrt as srt
from streamrt import ops
from tests.conftest import fill_kernel


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
