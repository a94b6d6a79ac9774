"""``cumsum``: a block scan with the block sums in the workspace.

The scanned axis (length N) is cut into ``nb`` blocks of ``block`` elements (at least
``MIN_BLOCK``, and at most ``MAX_BLOCKS`` blocks: the tiling phase 1 chooses). Three kernels, as
on a GPU: scan each block locally and store its total in a workspace region ``(*rows, nb)``; scan
the block totals in place; add to each block the total of the blocks before it. A single block
needs one kernel and no workspace. With ``axis=None`` the input is scanned flattened (C order);
a non-contiguous input is first packed into the workspace. float16 scans accumulate in a
float32 workspace buffer, written to ``out`` at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import TensorDesc
from .common import Layout, acc_dtype, region, two_step, view
from .cuda import plan_cumsum
from .framework import Attr, Op, Plan, normalize_axis, optional_int_attr

__all__ = ["Cumsum", "cumsum"]

MIN_BLOCK = 512
MAX_BLOCKS = 64


def _input(ctx: Any, xp: int, ws: int | None, p: tuple) -> np.ndarray:
    xd, od, axis, acc, bounds, pack_off, buf_off, sums_off, sums_shape = p
    if pack_off >= 0:
        return region(ctx, ws, pack_off, od.shape, acc)
    return np.moveaxis(view(ctx, xp, xd, True), axis, -1)


def _target(ctx: Any, op_: int, ws: int | None, p: tuple) -> np.ndarray:
    xd, od, axis, acc, bounds, pack_off, buf_off, sums_off, sums_shape = p
    t = region(ctx, ws, buf_off, od.shape, acc) if buf_off >= 0 else view(ctx, op_, od, False)
    return np.moveaxis(t, axis, -1)


def _finish_views(ctx: Any, op_: int, ws: int | None, p: tuple) -> tuple | None:
    """The float32 buffer to copy into ``out`` at the end, and ``out``; None: no buffer."""
    od, acc, buf_off = p[1], p[3], p[6]
    if buf_off < 0:
        return None
    return view(ctx, op_, od, False), region(ctx, ws, buf_off, od.shape, acc)


def _finish(fin: tuple | None) -> None:
    if fin is not None:
        np.copyto(fin[0], fin[1], casting="unsafe")


def _pack_views(ctx: Any, xp: int, ws: int, p: tuple) -> tuple:
    xd, od, acc, pack_off = p[0], p[1], p[3], p[5]
    return region(ctx, ws, pack_off, od.shape, acc), view(ctx, xp, xd, True).reshape(-1)


@two_step(_pack_views, "cumsum")
def _pack(dst: Any, x: Any) -> None:
    np.copyto(dst, x, casting="unsafe")


def _scan_blocks_views(ctx: Any, xp: int, op_: int, ws: int | None, p: tuple) -> tuple:
    acc, bounds, sums_off, sums_shape = p[3], p[4], p[7], p[8]
    sums = region(ctx, ws, sums_off, sums_shape, acc) if sums_off >= 0 else None
    return (_input(ctx, xp, ws, p), _target(ctx, op_, ws, p), sums,
            None if sums_off >= 0 else _finish_views(ctx, op_, ws, p), bounds, acc)


@two_step(_scan_blocks_views, "cumsum")
def _scan_blocks(x: Any, t: Any, sums: Any, fin: tuple | None, bounds: tuple,
                 acc: np.dtype) -> None:
    for s, e in bounds:
        np.cumsum(x[..., s:e], axis=-1, dtype=acc, out=t[..., s:e])
    if sums is not None:  # each block's total: the last element of its local scan
        sums[...] = t[..., [e - 1 for _, e in bounds]]
    else:
        _finish(fin)


def _scan_sums_views(ctx: Any, ws: int, p: tuple) -> tuple:
    return (region(ctx, ws, p[7], p[8], p[3]),)


@two_step(_scan_sums_views, "cumsum")
def _scan_sums(sums: Any) -> None:
    np.cumsum(sums, axis=-1, out=sums)


def _scan_offsets_views(ctx: Any, op_: int, ws: int, p: tuple) -> tuple:
    acc, bounds, sums_off, sums_shape = p[3], p[4], p[7], p[8]
    return (_target(ctx, op_, ws, p), region(ctx, ws, sums_off, sums_shape, acc),
            _finish_views(ctx, op_, ws, p), bounds)


@two_step(_scan_offsets_views, "cumsum")
def _scan_offsets(t: Any, sums: Any, fin: tuple | None, bounds: tuple) -> None:
    for i, (s, e) in enumerate(bounds[1:]):  # block i + 1 follows blocks 0..i
        np.add(t[..., s:e], sums[..., i : i + 1], out=t[..., s:e], casting="unsafe")
    _finish(fin)


class Cumsum(Op):
    """Inclusive prefix sum along ``axis`` (None: over the flattened input) (``aclnnCumsum``)."""

    name = "cumsum"
    inputs = ("x",)
    attrs = {"axis": Attr(optional_int_attr, None, "the axis scanned (negative counts from the "
                                                   "end); None scans x flattened in C order.")}
    slot_docs = {"x": "any shape (0-d only with axis=None), strided or not.",
                 "out": "x's shape, or (x.size,) with axis=None."}
    workspace_doc = ("the block totals of the scan (when the axis spans more than one block of "
                     "512+ elements), a float32 buffer when out is float16, and x packed when "
                     "axis=None and x is strided; 0 bytes for a one-block float32/64 scan.")

    def _axis(self, x: TensorDesc, o: TensorDesc, attrs: dict) -> int | None:
        """The normalised axis (None: flattened); checks ``out``'s shape."""
        if attrs["axis"] is None:
            self._check_shape("out", o, (x.numel,))
            return None
        if x.ndim == 0:
            raise self._bad("cannot scan along an axis of a 0-d x; use axis=None")
        axis = normalize_axis(self.name, attrs["axis"], x.ndim)
        self._check_shape("out", o, x.shape)
        return axis

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        return plan_cumsum(x, o, self._axis(x, o, attrs))

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        scanned = self._axis(x, o, attrs)  # None: the flattened input
        acc = acc_dtype(x.dtype, o.dtype)
        lay = Layout()
        pack_off = -1
        axis = -1 if scanned is None else scanned
        if scanned is None:
            if x.is_contiguous:  # the flat view of a contiguous tensor is free
                x = TensorDesc((x.numel,), x.dtype, offset=x.offset)
            else:
                pack_off = lay.add("packed", (x.numel,), acc)
        length = o.shape[axis] if o.ndim else 1
        rows = o.numel // max(length, 1)
        block = max(MIN_BLOCK, -(-length // MAX_BLOCKS))
        bounds = tuple((s, min(s + block, length)) for s in range(0, length, block))
        nb = len(bounds)
        buf_off = lay.add("acc", o.shape, acc) if o.dtype != acc else -1
        sums_shape = o.shape[:axis] + o.shape[axis + 1 :] + (nb,) if axis >= 0 else (
            o.shape[:-1] + (nb,))
        sums_off = lay.add("block_sums", sums_shape, acc) if nb > 1 else -1
        p = (x, o, axis, acc, bounds, pack_off, buf_off, sums_off, sums_shape)
        tiling = {"block": block, "blocks": nb, "rows": rows}
        if o.numel == 0:
            return Plan(0, _nothing, "empty", tiling)

        def enqueue(s: Any, ws: int | None, a: list) -> None:
            if pack_off >= 0:
                s.launch(_pack, a[0], ws, p)
            s.launch(_scan_blocks, a[0], a[1], ws, p, grid=nb)
            if sums_off >= 0:
                s.launch(_scan_sums, ws, p)
                s.launch(_scan_offsets, a[1], ws, p, grid=nb)

        impl = ("block_scan" if nb > 1 else "single_block") + ("+pack" if pack_off >= 0 else "")
        return Plan(lay.total(), enqueue, impl, tiling)


def _nothing(s: Any, ws: int | None, a: list) -> None:
    """An empty output: nothing to enqueue."""


cumsum = Cumsum()
