"""``matmul``: batched matrix product, split-K with partial products in the workspace.

Operands are ``(..., M, K)`` and ``(..., K, N)`` with numpy-broadcast batch dims. When K is large
and the output small (the case where a GPU would leave most cores idle), phase 1 picks split-K:
K is cut into ``splits`` slices, one kernel writes each slice's partial product to a workspace
region ``(splits, *batch, M, N)`` in the accumulation dtype, and a second kernel sums the
partials into ``out``. Otherwise one kernel computes the product directly. float16 operands are
cast to float32 in the workspace first (numpy's float16 matmul is slow and imprecise).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import TensorDesc
from .common import F64, Layout, acc_dtype, region, two_step, view
from .cuda import plan_matmul
from .framework import Op, Plan

__all__ = ["Matmul", "matmul"]

SPLIT_K_MIN = 2048  # K from which split-K is considered
SPLIT_K_MAX_OUT = 1 << 16  # ... when M * N is at most this
SPLIT_CHUNK = 1024  # K elements per split at least
MAX_SPLITS = 8


def _operand(ctx: Any, ptr: int, d: TensorDesc, ws: int | None, off: int,
             acc: np.dtype) -> tuple:
    """The operand's view and, when it is cast first, its workspace region (else None)."""
    v = view(ctx, ptr, d, True)
    return v, (None if off < 0 else region(ctx, ws, off, d.shape, acc))


def _cast(operand: tuple) -> Any:
    """The operand to multiply: its view, or its cast into the workspace."""
    v, buf = operand
    if buf is None:
        return v
    np.copyto(buf, v, casting="unsafe")
    return buf


def _mm_direct_views(ctx: Any, ap: int, bp: int, op_: int, ws: int | None, p: tuple) -> tuple:
    ad, bd, od, acc, a_off, b_off = p[:6]
    return (_operand(ctx, ap, ad, ws, a_off, acc), _operand(ctx, bp, bd, ws, b_off, acc),
            view(ctx, op_, od, False))


@two_step(_mm_direct_views, "matmul")
def _mm_direct(a: tuple, b: tuple, o: Any) -> None:
    np.matmul(_cast(a), _cast(b), out=o, casting="unsafe")


def _mm_partials_views(ctx: Any, ap: int, bp: int, ws: int, p: tuple) -> tuple:
    ad, bd, od, acc, a_off, b_off, part_off, part_shape, bounds = p
    return (_operand(ctx, ap, ad, ws, a_off, acc), _operand(ctx, bp, bd, ws, b_off, acc),
            region(ctx, ws, part_off, part_shape, acc), bounds)


@two_step(_mm_partials_views, "matmul")
def _mm_partials(a: tuple, b: tuple, part: Any, bounds: tuple) -> None:
    x, y = _cast(a), _cast(b)
    for i, (k0, k1) in enumerate(bounds):  # one block of the grid per split
        np.matmul(x[..., k0:k1], y[..., k0:k1, :], out=part[i])


def _mm_reduce_views(ctx: Any, op_: int, ws: int, p: tuple) -> tuple:
    od, acc, part_off, part_shape = p[2], p[3], p[6], p[7]
    return region(ctx, ws, part_off, part_shape, acc), view(ctx, op_, od, False)


@two_step(_mm_reduce_views, "matmul")
def _mm_reduce(part: Any, o: Any) -> None:
    np.sum(part, axis=0, out=o)


class Matmul(Op):
    """``out = a @ b`` with broadcast batch dims (``aclnnMatmul`` / ``aclnnBatchMatMul``)."""

    name = "matmul"
    inputs = ("a", "b")
    slot_docs = {
        "a": "(..., M, K), at least 2-d; strided or not.",
        "b": "(..., K, N), at least 2-d; its batch dims broadcast with a's (numpy rules).",
        "out": "(*batch, M, N): the broadcast batch dims, then M and N.",
    }
    workspace_doc = ("a and/or b cast to float32 when float16 (or to float64 when the other "
                     "is), and, with split-K (K >= 2048 and M * N <= 65536), the partial "
                     "products of up to 8 K-slices in the accumulation dtype; else 0 bytes.")

    def _dims(self, a: TensorDesc, b: TensorDesc, o: TensorDesc) -> tuple[int, int, int, tuple]:
        """``(M, K, N, batch)``; checks ranks, inner dims, batch broadcast and ``out``'s shape."""
        if a.ndim < 2 or b.ndim < 2:
            raise self._bad(f"a {a.shape} and b {b.shape} must have at least 2 dimensions")
        m, k = a.shape[-2:]
        k2, n = b.shape[-2:]
        if k != k2:
            raise self._bad(f"a {a.shape} and b {b.shape}: inner dimensions {k} and {k2} differ")
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise self._bad(f"batch dims of a {a.shape} and b {b.shape} do not broadcast") from None
        self._check_shape("out", o, (*batch, m, n))
        return m, k, n, batch

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (a, b), (o,) = ins, outs
        return plan_matmul(a, b, o, self._dims(a, b, o)[3])

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (a, b), (o,) = ins, outs
        m, k, n, batch = self._dims(a, b, o)
        acc = F64 if F64 in (a.dtype, b.dtype) else acc_dtype(a.dtype, b.dtype)
        lay = Layout()
        # an empty operand (K = 0) is not cast: its 0-byte region would leave no workspace
        a_off = lay.add("a_cast", a.shape, acc) if a.dtype != acc and a.numel else -1
        b_off = lay.add("b_cast", b.shape, acc) if b.dtype != acc and b.numel else -1
        splits = 1
        if k >= SPLIT_K_MIN and m * n <= SPLIT_K_MAX_OUT:
            splits = min(MAX_SPLITS, k // SPLIT_CHUNK)
        cast = "+cast" if a_off >= 0 or b_off >= 0 else ""
        tiling = {"M": m, "N": n, "K": k, "batch": int(np.prod(batch, dtype=np.int64)),
                  "splits": splits}
        if o.numel == 0:
            return Plan(0, _nothing, "empty", tiling)
        if splits == 1:
            p = (a, b, o, acc, a_off, b_off)

            def enqueue(s: Any, ws: int | None, ad: list) -> None:
                s.launch(_mm_direct, ad[0], ad[1], ad[2], ws, p)

            return Plan(lay.total(), enqueue, "direct" + cast, tiling)
        step = -(-k // splits)
        bounds = tuple((i, min(i + step, k)) for i in range(0, k, step))
        part_shape = (len(bounds), *batch, m, n)
        part_off = lay.add("partials", part_shape, acc)
        p = (a, b, o, acc, a_off, b_off, part_off, part_shape, bounds)
        grid = len(bounds)

        def enqueue_split(s: Any, ws: int | None, ad: list) -> None:
            s.launch(_mm_partials, ad[0], ad[1], ws, p, grid=grid)
            s.launch(_mm_reduce, ad[2], ws, p)

        return Plan(lay.total(), enqueue_split, "split_k" + cast, tiling)


def _nothing(s: Any, ws: int | None, ad: list) -> None:
    """An empty output: nothing to enqueue."""


matmul = Matmul()
