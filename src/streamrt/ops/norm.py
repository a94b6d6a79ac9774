"""Normalisations: ``softmax`` (row max and sum in the workspace) and ``layer_norm`` (mean and
rstd in the workspace).

Both run as two kernels that talk through the workspace, as their GPU versions do: a statistics
pass writes one value per row (``rows = numel / row length``, in the accumulation dtype) and an
apply pass reads them. When the output dtype is narrower than the accumulation dtype (float16),
the intermediate values also live in the workspace, in float32, and the output is written once.
Inputs and outputs may be strided; rows may lie along any axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import TensorDesc
from .common import Layout, acc_dtype, region, two_step, view
from .cuda import plan_layer_norm, plan_softmax
from .framework import Attr, Op, Plan, float_attr, int_attr, normalize_axis, optional_int_attr

__all__ = ["Softmax", "LayerNorm", "softmax", "layer_norm"]


def _scratch(ctx: Any, ws: int | None, off: int, shape: tuple, acc: np.dtype,
             out: np.ndarray) -> np.ndarray:
    return out if off < 0 else region(ctx, ws, off, shape, acc)


def _softmax_stats_views(ctx: Any, xp: int, op_: int, ws: int, p: tuple) -> tuple:
    xd, od, axis, acc, max_off, sum_off, buf_off, sshape = p
    return (view(ctx, xp, xd, True),
            _scratch(ctx, ws, buf_off, xd.shape, acc, view(ctx, op_, od, False)),
            region(ctx, ws, max_off, sshape, acc), region(ctx, ws, sum_off, sshape, acc),
            axis, acc)


@two_step(_softmax_stats_views, "softmax")
def _softmax_stats(x: Any, e: Any, m: Any, total: Any, axis: int, acc: np.dtype) -> None:
    np.max(x, axis=axis, keepdims=True, out=m)
    np.subtract(x, m, out=e, casting="unsafe")
    np.exp(e, out=e)
    np.sum(e, axis=axis, keepdims=True, dtype=acc, out=total)


def _softmax_apply_views(ctx: Any, op_: int, ws: int, p: tuple) -> tuple:
    xd, od, axis, acc, max_off, sum_off, buf_off, sshape = p
    o = view(ctx, op_, od, False)
    return o, _scratch(ctx, ws, buf_off, xd.shape, acc, o), region(ctx, ws, sum_off, sshape, acc)


@two_step(_softmax_apply_views, "softmax")
def _softmax_apply(o: Any, e: Any, total: Any) -> None:
    np.divide(e, total, out=o, casting="unsafe")


class Softmax(Op):
    """``out = exp(x - max) / sum(exp(x - max))`` along ``axis`` (``aclnnSoftmax``)."""

    name = "softmax"
    inputs = ("x",)
    attrs = {"axis": Attr(int_attr, -1, "the axis normalised (negative counts from the end).")}
    slot_docs = {"x": "at least 1-d, strided or not.",
                 "out": "x's shape; may be x itself (in place)."}
    workspace_doc = ("each row's max and sum of exponentials (one value per row, float32 for "
                     "float16 else the accumulation dtype), plus the exponentials themselves "
                     "when out is float16.")

    def _axis(self, x: TensorDesc, o: TensorDesc, attrs: dict) -> int:
        """The normalised axis; checks ``x``'s rank and ``out``'s shape."""
        if x.ndim == 0:
            raise self._bad("x must have at least one dimension")
        axis = normalize_axis(self.name, attrs["axis"], x.ndim)
        self._check_shape("out", o, x.shape)
        return axis

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        return plan_softmax(x, o, self._axis(x, o, attrs))

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x,), (o,) = ins, outs
        axis = self._axis(x, o, attrs)
        acc = acc_dtype(x.dtype, o.dtype)
        sshape = x.shape[:axis] + (1,) + x.shape[axis + 1 :]
        lay = Layout()
        max_off = lay.add("row_max", sshape, acc)
        sum_off = lay.add("row_sum", sshape, acc)
        buf_off = lay.add("exp", x.shape, acc) if o.dtype != acc else -1
        p = (x, o, axis, acc, max_off, sum_off, buf_off, sshape)
        rows = x.numel // max(x.shape[axis], 1)
        tiling = {"rows": rows, "row": x.shape[axis]}
        if x.numel == 0:
            return Plan(0, _nothing, "empty", tiling)

        def enqueue(s: Any, ws: int | None, a: list) -> None:
            s.launch(_softmax_stats, a[0], a[1], ws, p, grid=min(rows, 65535))
            s.launch(_softmax_apply, a[1], ws, p, grid=min(rows, 65535))

        return Plan(lay.total(), enqueue, "two_pass" + ("+f32" if buf_off >= 0 else ""), tiling)


def _ln_stats_views(ctx: Any, xp: int, op_: int, ws: int, p: tuple) -> tuple:
    xd, od, wd, bd, axes, acc, eps, mean_off, rstd_off, buf_off, sshape = p
    return (view(ctx, xp, xd, True),
            _scratch(ctx, ws, buf_off, xd.shape, acc, view(ctx, op_, od, False)),
            region(ctx, ws, mean_off, sshape, acc), region(ctx, ws, rstd_off, sshape, acc),
            axes, acc, eps)


@two_step(_ln_stats_views, "layer_norm")
def _ln_stats(x: Any, d: Any, mean: Any, rstd: Any, axes: tuple, acc: np.dtype,
              eps: float) -> None:
    np.mean(x, axis=axes, keepdims=True, dtype=acc, out=mean)
    np.subtract(x, mean, out=d, casting="unsafe")  # centred values, reused by the apply pass
    np.mean(np.square(d, dtype=acc), axis=axes, keepdims=True, dtype=acc, out=rstd)
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)


def _ln_apply_views(ctx: Any, op_: int, wp: int | None, bp: int | None, ws: int,
                    p: tuple) -> tuple:
    xd, od, wd, bd, axes, acc, eps, mean_off, rstd_off, buf_off, sshape = p
    o = view(ctx, op_, od, False)
    return (o, _scratch(ctx, ws, buf_off, xd.shape, acc, o),
            region(ctx, ws, rstd_off, sshape, acc),
            None if wd is None else view(ctx, wp, wd, True),
            None if bd is None else view(ctx, bp, bd, True))


@two_step(_ln_apply_views, "layer_norm")
def _ln_apply(o: Any, d: Any, rstd: Any, w: Any, b: Any) -> None:
    np.multiply(d, rstd, out=d, casting="unsafe")
    if w is not None:
        np.multiply(d, w, out=d, casting="unsafe")
    if b is not None:
        np.add(d, b, out=d, casting="unsafe")
    if d is not o:
        np.copyto(o, d, casting="unsafe")


class LayerNorm(Op):
    """``out = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axes (aclnnLayerNorm).

    The mean and (biased) variance are taken over the last ``normalized_ndim`` axes. ``weight``
    and ``bias`` are optional (None: a scale of 1, a shift of 0); when given, their shape is the
    normalised shape and fixes ``normalized_ndim``.
    """

    name = "layer_norm"
    inputs = ("x", "weight", "bias")
    optional = frozenset({"weight", "bias"})
    attrs = {
        "eps": Attr(float_attr, 1e-5, "added to the variance; finite and >= 0."),
        "normalized_ndim": Attr(optional_int_attr, None, "how many trailing axes are normalised "
                                "(1 to x.ndim); None: weight's or bias's ndim, else 1."),
    }
    slot_docs = {
        "x": "at least normalized_ndim dimensions, none of the normalised ones empty.",
        "weight": "the normalised shape (x.shape[-normalized_ndim:]).",
        "bias": "the normalised shape.",
        "out": "x's shape; may be x itself (in place).",
    }
    workspace_doc = ("each row's mean and 1/sqrt(var + eps) (one value per row, float32 for "
                     "float16 else the accumulation dtype), plus the centred values when out "
                     "is float16.")

    def _k(self, x: TensorDesc, w: TensorDesc | None, b: TensorDesc | None, o: TensorDesc,
           attrs: dict) -> int:
        """How many trailing axes are normalised; checks weight, bias, eps and ``out``."""
        k = attrs["normalized_ndim"]
        given = w if w is not None else b
        if given is not None:
            if k is not None and k != given.ndim:
                raise self._bad(f"normalized_ndim={k} disagrees with weight/bias of "
                                f"{given.ndim} dims")
            k = given.ndim
        k = 1 if k is None else k
        if not 1 <= k <= x.ndim:
            raise self._bad(f"cannot normalise over the last {k} axes of a {x.ndim}-d x")
        nshape = x.shape[x.ndim - k :]
        for slot, d in (("weight", w), ("bias", b)):
            if d is not None:
                self._check_shape(slot, d, nshape)
        if 0 in nshape:
            raise self._bad(f"the normalised shape {nshape} is empty")
        if attrs["eps"] < 0 or not np.isfinite(attrs["eps"]):
            raise self._bad(f"eps must be finite and >= 0, got {attrs['eps']}")
        self._check_shape("out", o, x.shape)
        return k

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x, w, b), (o,) = ins, outs
        return plan_layer_norm(x, w, b, o, self._k(x, w, b, o, attrs), attrs["eps"])

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        (x, w, b), (o,) = ins, outs
        k = self._k(x, w, b, o, attrs)
        nshape = x.shape[x.ndim - k :]
        acc = acc_dtype(*(d.dtype for d in (x, w, b, o) if d is not None))
        axes = tuple(range(x.ndim - k, x.ndim))
        sshape = x.shape[: x.ndim - k] + (1,) * k
        lay = Layout()
        mean_off = lay.add("mean", sshape, acc)
        rstd_off = lay.add("rstd", sshape, acc)
        buf_off = lay.add("centred", x.shape, acc) if o.dtype != acc else -1
        p = (x, o, w, b, axes, acc, acc.type(attrs["eps"]), mean_off, rstd_off, buf_off, sshape)
        rows = x.numel // int(np.prod(nshape))
        tiling = {"rows": rows, "row": int(np.prod(nshape))}
        if x.numel == 0:
            return Plan(0, _nothing, "empty", tiling)

        def enqueue(s: Any, ws: int | None, a: list) -> None:
            s.launch(_ln_stats, a[0], a[3], ws, p, grid=min(rows, 65535))
            s.launch(_ln_apply, a[3], a[1], a[2], ws, p, grid=min(rows, 65535))

        return Plan(lay.total(), enqueue, "two_pass" + ("+f32" if buf_off >= 0 else ""), tiling)


def _nothing(s: Any, ws: int | None, a: list) -> None:
    """An empty tensor: nothing to enqueue."""


softmax = Softmax()
layer_norm = LayerNorm()
