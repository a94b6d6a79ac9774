"""Helpers of the graph memory tests: an add kernel, chains of alloc/free pairs, fill-use-free
steps, and the two ways to free graph memory outside its graph."""

from __future__ import annotations

import numpy as np

import streamrt as srt
from tests.conftest import _grid_stride, fill_kernel

N = 16  # as in the graph memory tests


@srt.kernel(cuda=_grid_stride("add_kernel", "float* dst, const float* src, int n", "dst[i] += src[i]"),
            signature="ptr, ptr, i32")
def add_kernel(ctx, dst, src, n):
    ctx.array(dst, (n,), np.float32)[:] += ctx.array(src, (n,), np.float32, readonly=True)


def _pairs_chain(count, nbytes, *, free=True):
    """alloc -> fill -> free, ``count`` times in one chain; returns (graph, alloc nodes)."""
    g = srt.Graph()
    prev = ()
    allocs = []
    for i in range(count):
        a = g.add_mem_alloc_node(nbytes, deps=prev)
        k = g.add_kernel_node(fill_kernel, a.ptr, nbytes // 4, float(i), deps=a)
        prev = g.add_mem_free_node(a.ptr, deps=k) if free else k
        allocs.append(a)
    return g, allocs


def _fill_use_free(use, out, value):
    """alloc -> fill with ``value`` -> ``use(out, alloc, N)`` -> free, as one graph."""
    g = srt.Graph()
    a = g.add_mem_alloc_node(N * 4)
    k = g.add_kernel_node(fill_kernel, a.ptr, N, value, deps=a)
    c = g.add_kernel_node(use, out, a.ptr, N, deps=k)
    g.add_mem_free_node(a.ptr, deps=c)
    return g


FREES = ["s.free", "srt.free"]  # cudaFreeAsync, or cudaFree (synchronous), outside the graph


def _free_outside(how: str, s: srt.Stream, ptr: int) -> None:
    s.free(ptr) if how == "s.free" else srt.free(ptr)
