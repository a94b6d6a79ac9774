"""``reduce_sum``: a multi-level tree reduction with its partial sums in the workspace.

The input is seen as ``(A, K, B)``: K the product of the reduced axes, A and B of the kept axes
before and after them. That is a free reshape of a contiguous input whose reduced axes are
adjacent (all axes, trailing, leading or a middle run); any other input (strided, or reduced
axes that are not adjacent) is first packed, transposed, into a workspace region ``(A, K)``.
Each level sums blocks of ``BLOCK`` elements along K into a partials region ``(A, ceil(K/BLOCK),
B)``; levels repeat until one block is left, which the last kernel sums into ``out``. Partials
use the accumulation dtype (float32 for float16), so the workspace grows with ``A * K * B``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import TensorDesc
from .common import Layout, acc_dtype, two_step, view
from .cuda import plan_reduce_sum
from .framework import Attr, Op, Plan, axes_attr, bool_attr, normalize_axis

__all__ = ["ReduceSum", "reduce_sum"]

BLOCK = 256  # elements each tree node sums


def _pack_views(ctx: Any, xp: int, dst: int, p: tuple) -> tuple:
    xd, perm, packed_shape, acc = p
    return ctx.array(dst, packed_shape, acc), view(ctx, xp, xd, True).transpose(perm)


@two_step(_pack_views, "reduce_sum")
def _pack(dst: Any, x: Any) -> None:
    np.copyto(dst, x, casting="unsafe")


def _sum_level_views(ctx: Any, src: int, dst: int, p: tuple) -> tuple:
    a, k, b, sdt, acc = p
    x = ctx.array(src, (a, k, b), sdt, readonly=True)
    nb = (k + BLOCK - 1) // BLOCK
    part = ctx.array(dst, (a, nb, b), acc)
    full = k // BLOCK
    # splitting axis 1 of a contiguous array is always a view
    blocks = (x[:, : full * BLOCK].reshape(a, full, BLOCK, b), part[:, :full]) if full else None
    rest = (x[:, full * BLOCK :], part[:, full]) if full < nb else None
    return blocks, rest, acc


@two_step(_sum_level_views, "reduce_sum")
def _sum_level(blocks: tuple | None, rest: tuple | None, acc: np.dtype) -> None:
    if blocks is not None:
        np.sum(blocks[0], axis=2, dtype=acc, out=blocks[1])
    if rest is not None:
        np.sum(rest[0], axis=1, dtype=acc, out=rest[1])


def _sum_final_views(ctx: Any, src: int, op_: int, p: tuple) -> tuple:
    a, k, b, sdt, acc, od = p
    x = ctx.array(src, (a, k, b), sdt, readonly=True)
    o = view(ctx, op_, od, False)
    return x, (o.reshape(a, b) if od.is_contiguous else o), od.is_contiguous, acc


@two_step(_sum_final_views, "reduce_sum")
def _sum_final(x: Any, o: Any, contiguous: bool, acc: np.dtype) -> None:
    if contiguous:
        np.sum(x, axis=1, dtype=acc, out=o)
    else:
        np.copyto(o, np.sum(x, axis=1, dtype=acc).reshape(o.shape), casting="unsafe")


def _zero_views(ctx: Any, op_: int, od: TensorDesc) -> tuple:
    return (view(ctx, op_, od, False),)


@two_step(_zero_views, "reduce_sum")
def _zero(o: Any) -> None:
    o[...] = 0


class ReduceSum(Op):
    """``out = x.sum(axis, keepdims=keepdims)``: a tree reduction (``aclnnReduceSum``)."""

    name = "reduce_sum"
    inputs = ("x",)
    attrs = {
        "axis": Attr(axes_attr, None, "the axes summed: None for all, an int, or a tuple of "
                                      "distinct ints (negative counts from the end)."),
        "keepdims": Attr(bool_attr, False, "keep each summed axis as a size-1 dimension."),
    }
    slot_docs = {
        "x": "any shape (0-d too), strided or not.",
        "out": "x's shape without the summed axes (with them as 1 if keepdims); an empty sum "
               "is 0.",
    }
    workspace_doc = ("the partial sums of each tree level (in float32 for float16, else the "
                     "accumulation dtype), plus x packed when it is strided or its summed axes "
                     "are not adjacent; 0 bytes when one level suffices (at most 256 summed "
                     "elements of a contiguous x).")

    def _axes(self, x: TensorDesc, o: TensorDesc, attrs: dict) -> tuple[int, ...]:
        """The reduced axes, normalised and sorted; checks ``out``'s shape."""
        nd = x.ndim
        axis = attrs["axis"]
        axes = tuple(range(nd)) if axis is None else tuple(
            normalize_axis(self.name, a, max(nd, 1)) for a in axis)
        if len(set(axes)) != len(axes):
            raise self._bad(f"axis {axis} repeats an axis")
        if nd == 0:
            axes = ()
        axes = tuple(sorted(axes))
        kept = [i for i in range(nd) if i not in axes]
        if attrs["keepdims"]:
            want = tuple(1 if i in axes else x.shape[i] for i in range(nd))
        else:
            want = tuple(x.shape[i] for i in kept)
        self._check_shape("out", o, want)
        return axes

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        return plan_reduce_sum(x, o, self._axes(x, o, attrs))

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        nd = x.ndim
        axes = self._axes(x, o, attrs)
        kept = [i for i in range(nd) if i not in axes]
        acc = acc_dtype(x.dtype, o.dtype)
        k = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
        tiling: dict[str, Any] = {"block": BLOCK, "levels": 0}
        if o.numel == 0:
            return Plan(0, _nothing, "empty", tiling)
        if k == 0:
            def enqueue_zero(s: Any, ws: int | None, ad: list) -> None:
                s.launch(_zero, ad[1], o)

            return Plan(0, enqueue_zero, "zero", tiling)
        lay = Layout()
        adjacent = not axes or axes == tuple(range(axes[0], axes[-1] + 1))
        if x.is_contiguous and adjacent:
            first = axes[0] if axes else nd
            last = axes[-1] if axes else nd - 1
            a = int(np.prod(x.shape[:first], dtype=np.int64))
            b = int(np.prod(x.shape[last + 1 :], dtype=np.int64))
            pack, pack_off = None, 0
            src_off, sdt, impl = x._boff, x.dtype, "tree"
        else:
            a, b = int(np.prod([x.shape[i] for i in kept], dtype=np.int64)), 1
            perm = tuple(kept) + axes
            packed = tuple(x.shape[i] for i in perm) or (1,)
            src_off = pack_off = lay.add("packed", (a, k), acc)
            pack = (x, perm, packed, acc)
            sdt, impl = acc, "tree+pack"
        # level l reads (a, k_l, b) at src and writes (a, ceil(k_l / BLOCK), b) partials
        levels: list[tuple[int, int, tuple]] = []
        src_in_ws = pack is not None
        kl = k
        while kl > BLOCK:
            nb = (kl + BLOCK - 1) // BLOCK
            off = lay.add(f"partials{len(levels)}", (a, nb, b), acc)
            levels.append((src_off if src_in_ws else -1, off, (a, kl, b, sdt, acc)))
            src_off, sdt, kl, src_in_ws = off, acc, nb, True
        final = (src_off if src_in_ws else -1, (a, kl, b, sdt, acc, o))
        tiling.update(levels=len(levels) + 1, A=a, K=k, B=b)
        x_off = x._boff
        grids = [min((p[1] + BLOCK - 1) // BLOCK, 65535) for _, _, p in levels]

        def enqueue(s: Any, ws: int | None, ad: list) -> None:
            xp = ad[0]
            if pack is not None:
                s.launch(_pack, xp, ws + pack_off, pack)
            for (src, dst, p), grid in zip(levels, grids):
                s.launch(_sum_level, xp + x_off if src < 0 else ws + src, ws + dst, p,
                         grid=grid, block=BLOCK)
            src, p = final
            s.launch(_sum_final, xp + x_off if src < 0 else ws + src, ad[1], p)

        return Plan(lay.total(), enqueue, impl, tiling)


def _nothing(s: Any, ws: int | None, ad: list) -> None:
    """An empty output: nothing to enqueue."""


reduce_sum = ReduceSum()
