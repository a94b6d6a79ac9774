"""Helpers shared by the operator kernels: tensor views, workspace regions, accumulation dtypes.

Kernels touch device memory only through ``ctx.array`` and ``ctx.strided`` (the sanitizer
relies on it): a strided tensor is ``ctx.strided``, one view over the elements it spans
re-strided on the host with ``np.ndarray(buffer=...)`` (which checks that the strides stay
inside that span); with the sanitizer on, it declares only the elements the strides reach.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernel import Kernel
from ..tensor import TensorDesc

__all__ = ["F16", "F32", "F64", "FLOATS", "WS_ALIGN", "acc_dtype", "view", "region",
           "Layout", "two_step", "for_op", "kernel_name"]

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLOATS = (F16, F32, F64)
ALIGN = 64  # each workspace region starts on a cache line
# a workspace's address and size: the widest element a region holds (float64 partials); phase 2
# refuses a workspace address off it, where a GPU kernel would fault
WS_ALIGN = 8


def acc_dtype(*dtypes: np.dtype) -> np.dtype:
    """Accumulation dtype: float64 if any operand is float64, else float32 (float16 widens)."""
    return F64 if F64 in dtypes else F32


def view(ctx: Any, ptr: int, d: TensorDesc, readonly: bool) -> np.ndarray:
    """A numpy view of the tensor ``d`` at ``ptr`` (strides and offset honoured)."""
    if d.is_contiguous:
        return ctx.array(ptr + d._boff, d.shape, d.dtype, readonly=readonly)
    return ctx.strided(ptr + d._boff, d.shape, d.dtype, d._bstrides, d._extent,  # type: ignore[no-any-return]
                       readonly)


def region(ctx: Any, ws: int, off: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A view of one workspace region (writable: the kernels own the workspace while they run)."""
    return ctx.array(ws + off, shape, dtype)


def kernel_name(op: str, fn: str) -> str:
    """What the sanitizer, traces and failures call a kernel of ``ops.<op>``: the public
    operator first, its inner kernel after (``ops.reduce_sum (_sum_level)``)."""
    return f"ops.{op} ({fn})"


def two_step(views: Callable[..., tuple], op: str | None = None
             ) -> Callable[[Callable[..., None]], Kernel]:
    """Decorator: the kernel ``fn(*views(ctx, *args))``, with a binder making the views once.

    ``views`` makes views only (no computing, no reading): graph replay calls it when the plan
    is built and then only ``fn`` (``Kernel.binder``), while eager launches and checked replays
    (sanitizer, tracer) run both every time. The kernel is named ``kernel_name(op, fn)`` (a
    kernel that several operators share is named after ``fn``; each operator launches its own
    copy, :func:`for_op`)."""

    def make(fn: Callable[..., None]) -> Kernel:
        def body(ctx: Any, *args: Any) -> None:
            fn(*views(ctx, *args))

        body.__name__, body.__qualname__, body.__module__ = fn.__name__, fn.__qualname__, \
            fn.__module__
        k = Kernel(body, name=fn.__name__ if op is None else kernel_name(op, fn.__name__))
        k.binder(lambda ctx, *args: functools.partial(fn, *views(ctx, *args)))
        return k

    return make


def for_op(k: Kernel, op: str) -> Kernel:
    """The shared kernel ``k`` as ``ops.<op>`` launches it: the same body and binder (launch
    caches key on the body, so nothing is duplicated), named for the operator."""
    named = Kernel(k.fn, name=kernel_name(op, k.fn.__name__))
    named.bind = k.bind
    return named


class Layout:
    """Workspace layout built at phase 1: named regions, each aligned to 64 bytes."""

    __slots__ = ("size", "end", "regions")

    def __init__(self) -> None:
        self.size = 0  # where the next region starts
        self.end = 0  # one past the last byte any region uses
        self.regions: dict[str, tuple[int, int]] = {}

    def add(self, name: str, shape: tuple, dtype: np.dtype) -> int:
        """Reserve a region for an array of ``shape``/``dtype``; returns its byte offset."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
        off = self.size
        self.regions[name] = (off, nbytes)
        if nbytes:
            self.size = off + (nbytes + ALIGN - 1) // ALIGN * ALIGN
            self.end = off + nbytes
        return off

    def total(self) -> int:
        """The workspace size: the last region's end, rounded to ``WS_ALIGN`` (so that a
        workspace placed exactly at the end of a buffer stays aligned); 0 when no region was
        reserved."""
        return -(-self.end // WS_ALIGN) * WS_ALIGN
