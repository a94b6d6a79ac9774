"""CUDA ``softmax`` and ``layer_norm``: a statistics kernel writes one value pair per row to the
workspace, an elementwise apply kernel reads them.

softmax sees x as ``(A, K, B)`` along ``axis`` (rows = A * B, elements of a row B apart) and keeps
row max and row sum of ``exp(x - max)`` (accumulation dtype) in the workspace; layer_norm sees
``(rows, N)`` and keeps mean and rstd (``1 / sqrt(var + eps)``, variance of the centred values).
The statistics kernel is chosen at phase 1:

- ``rows``: one block per row (grid-stride over rows), threads stride along the row, block
  reductions by warp shuffles and shared memory (coalesced when the row is contiguous);
- ``cols``: one thread per row, for short rows (K <= ``SMALL``) or, in softmax, for many rows
  along a strided axis (B > 1), where neighbouring threads read neighbouring addresses.

The apply kernel is a grid-stride loop over the output in C order. Strided inputs (x, weight,
bias) are packed into the workspace first and a strided out is written through a workspace
region, so any strides work.
"""

from __future__ import annotations

import math

from ...tensor import TensorDesc
from ..common import Layout
from ..framework import Plan
from .common import (
    ACC,
    CTYPE,
    NP,
    SMALL,
    WS,
    Program,
    Ref,
    cuda_kernel,
    grid,
    one_dtype,
    output_target,
    packed_input,
)

__all__ = ["plan_softmax", "plan_layer_norm", "SOFTMAX", "LAYER_NORM", "COLS_MIN_ROWS"]

COLS_MIN_ROWS = 2048  # softmax along a strided axis: thread-per-row once this many rows

_SOFTMAX = r"""
template <typename T, typename A>
__device__ __forceinline__ void srt_softmax_stats_rows(A* mx, A* sm, const T* x, i64 a_, i64 k, i64 b_) {
  __shared__ A sh[32];
  const i64 rows = a_ * b_;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block: barriers are safe
    const i64 a = r / b_, b = r - a * b_;
    const T* p = x + a * k * b_ + b;
    A m = srt_neg_inf<A>();
    for (i64 j = threadIdx.x; j < k; j += blockDim.x) m = srt_max(m, (A)srt_ld(p + j * b_));
    m = srt_block_max(m, sh);
    A s = A(0);
    for (i64 j = threadIdx.x; j < k; j += blockDim.x) s += srt_exp((A)srt_ld(p + j * b_) - m);
    s = srt_block_sum(s, sh);
    if (threadIdx.x == 0) { mx[r] = m; sm[r] = s; }
  }
}
template <typename T, typename A>
__device__ __forceinline__ void srt_softmax_stats_cols(A* mx, A* sm, const T* x, i64 a_, i64 k, i64 b_) {
  const i64 rows = a_ * b_;
  for (i64 r = srt_tid(); r < rows; r += srt_nthreads()) {
    const i64 a = r / b_, b = r - a * b_;
    const T* p = x + a * k * b_ + b;
    A m = srt_neg_inf<A>();
    for (i64 j = 0; j < k; ++j) m = srt_max(m, (A)srt_ld(p + j * b_));
    A s = A(0);
    for (i64 j = 0; j < k; ++j) s += srt_exp((A)srt_ld(p + j * b_) - m);
    mx[r] = m; sm[r] = s;
  }
}
template <typename T, typename A>
__device__ __forceinline__ void srt_softmax_apply(T* out, const T* x, const A* mx, const A* sm, i64 n,
                                                  i64 k, i64 b_) {
  const i64 kb = k * b_;
  for (i64 i = srt_tid(); i < n; i += srt_nthreads()) {
    const i64 r = (i / kb) * b_ + i % b_;
    srt_st(out + i, srt_exp((A)srt_ld(x + i) - mx[r]) / sm[r]);
  }
}
"""
_SOFTMAX_STATS = r"""
extern "C" __global__ void {name}({A}* mx, {A}* sm, const {T}* x, i64 a, i64 k, i64 b) {
  srt_softmax_stats_{kind}<{T}, {A}>(mx, sm, x, a, k, b);
}
"""
_SOFTMAX_APPLY = r"""
extern "C" __global__ void {name}({T}* out, const {T}* x, const {A}* mx, const {A}* sm, i64 n, i64 k,
                                  i64 b) {
  srt_softmax_apply<{T}, {A}>(out, x, mx, sm, n, k, b);
}
"""

_LN = r"""
template <typename T, typename A>
__device__ __forceinline__ void srt_ln_stats_rows(A* mean, A* rstd, const T* x, i64 rows, i64 n, double eps) {
  __shared__ A sh[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block: barriers are safe
    const T* p = x + r * n;
    A s = A(0);
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += (A)srt_ld(p + j);
    const A mu = srt_block_sum(s, sh) / (A)n;
    A q = A(0);  // the variance of the centred values: no cancellation, as on cpu
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) { const A d = (A)srt_ld(p + j) - mu; q += d * d; }
    q = srt_block_sum(q, sh);
    if (threadIdx.x == 0) { mean[r] = mu; rstd[r] = A(1) / srt_sqrt(q / (A)n + (A)eps); }
  }
}
template <typename T, typename A>
__device__ __forceinline__ void srt_ln_stats_cols(A* mean, A* rstd, const T* x, i64 rows, i64 n, double eps) {
  for (i64 r = srt_tid(); r < rows; r += srt_nthreads()) {
    const T* p = x + r * n;
    A s = A(0);
    for (i64 j = 0; j < n; ++j) s += (A)srt_ld(p + j);
    const A mu = s / (A)n;
    A q = A(0);
    for (i64 j = 0; j < n; ++j) { const A d = (A)srt_ld(p + j) - mu; q += d * d; }
    mean[r] = mu; rstd[r] = A(1) / srt_sqrt(q / (A)n + (A)eps);
  }
}
template <typename T, typename A>
__device__ __forceinline__ void srt_ln_apply(T* out, const T* x, const T* w, const T* b, const A* mean,
                                             const A* rstd, i64 total, i64 n) {
  for (i64 i = srt_tid(); i < total; i += srt_nthreads()) {
    const i64 r = i / n, j = i - r * n;
    A v = ((A)srt_ld(x + i) - mean[r]) * rstd[r];
    if (w != nullptr) v = v * (A)srt_ld(w + j);
    if (b != nullptr) v = v + (A)srt_ld(b + j);
    srt_st(out + i, v);
  }
}
"""
_LN_STATS = r"""
extern "C" __global__ void {name}({A}* mean, {A}* rstd, const {T}* x, i64 rows, i64 n, double eps) {
  srt_ln_stats_{kind}<{T}, {A}>(mean, rstd, x, rows, n, eps);
}
"""
_LN_APPLY = r"""
extern "C" __global__ void {name}({T}* out, const {T}* x, const {T}* w, const {T}* b, const {A}* mean,
                                  const {A}* rstd, i64 total, i64 n) {
  srt_ln_apply<{T}, {A}>(out, x, w, b, mean, rstd, total, n);
}
"""


def _make(prefix: str, src: str, parts: tuple) -> dict:
    out = {}
    for t, ct in CTYPE.items():
        for kind, tpl, sig in parts:
            name = f"{prefix}_{kind}_{t}"
            body = tpl.replace("{name}", name).replace("{kind}", kind).replace("{T}", ct)
            out[kind, t] = cuda_kernel(name, src + body.replace("{A}", CTYPE[ACC[t]]), sig)
    return out


# ("stats_rows" | "stats_cols" | "apply", dtype) -> kernel; the rows/cols stats share a template
SOFTMAX = _make("srt_softmax", _SOFTMAX, (
    ("stats_rows", _SOFTMAX_STATS.replace("{kind}", "rows"), "ptr, ptr, ptr, i64, i64, i64"),
    ("stats_cols", _SOFTMAX_STATS.replace("{kind}", "cols"), "ptr, ptr, ptr, i64, i64, i64"),
    ("apply", _SOFTMAX_APPLY, "ptr, ptr, ptr, ptr, i64, i64, i64"),
))
LAYER_NORM = _make("srt_ln", _LN, (
    ("stats_rows", _LN_STATS.replace("{kind}", "rows"), "ptr, ptr, ptr, i64, i64, f64"),
    ("stats_cols", _LN_STATS.replace("{kind}", "cols"), "ptr, ptr, ptr, i64, i64, f64"),
    ("apply", _LN_APPLY, "ptr, ptr, ptr, ptr, ptr, ptr, i64, i64"),
))


def plan_softmax(x: TensorDesc, o: TensorDesc, axis: int) -> Plan:
    """The cuda plan of a softmax of ``x`` along the validated ``axis`` into ``o``."""
    t = one_dtype("softmax", [x, o])
    prog, lay = Program(), Layout()
    a_, k, b_ = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    rows = a_ * b_
    cols = k <= SMALL or (b_ > 1 and rows >= COLS_MIN_ROWS)
    tiling: dict = {"rows": rows, "row": k, "stats": "cols" if cols else "rows",
                    "workspace": lay.regions}
    if x.numel == 0:
        return Plan(0, prog.enqueue, "empty", tiling)
    src, packed = packed_input(prog, lay, 0, x, "packed")
    acc = NP[ACC[t]]
    mx = Ref(WS, lay.add("row_max", (rows,), acc))
    sm = Ref(WS, lay.add("row_sum", (rows,), acc))
    dst, finish = output_target(lay, 1, o, "out")
    if cols:
        prog.launch(SOFTMAX["stats_cols", t], mx, sm, src, a_, k, b_, grid=grid(rows))
    else:
        prog.launch(SOFTMAX["stats_rows", t], mx, sm, src, a_, k, b_, grid=grid(rows, 1))
    prog.launch(SOFTMAX["apply", t], dst, src, mx, sm, x.numel, k, b_, grid=grid(x.numel))
    if finish is not None:
        finish(prog)
    impl = "two_pass" + ("+pack" if packed else "") + ("+unpack" if finish else "")
    return Plan(lay.total(), prog.enqueue, impl, tiling)


def plan_layer_norm(x: TensorDesc, w: TensorDesc | None, b: TensorDesc | None, o: TensorDesc,
                    k: int, eps: float) -> Plan:
    """The cuda plan of a layer norm over the last ``k`` (validated) axes of ``x`` into ``o``."""
    t = one_dtype("layer_norm", [x, w, b, o])
    prog, lay = Program(), Layout()
    n = math.prod(x.shape[x.ndim - k :])
    rows = x.numel // n
    cols = n <= SMALL
    tiling: dict = {"rows": rows, "row": n, "stats": "cols" if cols else "rows",
                    "workspace": lay.regions}
    if x.numel == 0:
        return Plan(0, prog.enqueue, "empty", tiling)
    src, packed = packed_input(prog, lay, 0, x, "packed")
    wref: Ref | int = 0  # a null pointer: the apply kernel skips the factor
    bref: Ref | int = 0
    if w is not None:
        wref, pw = packed_input(prog, lay, 1, w, "weight")
        packed |= pw
    if b is not None:
        bref, pb = packed_input(prog, lay, 2, b, "bias")
        packed |= pb
    acc = NP[ACC[t]]
    mean = Ref(WS, lay.add("mean", (rows,), acc))
    rstd = Ref(WS, lay.add("rstd", (rows,), acc))
    dst, finish = output_target(lay, 3, o, "out")
    # eps in the accumulation dtype, as the cpu kernel adds it
    eps = float(acc.type(eps))
    if cols:
        prog.launch(LAYER_NORM["stats_cols", t], mean, rstd, src, rows, n, eps, grid=grid(rows))
    else:
        prog.launch(LAYER_NORM["stats_rows", t], mean, rstd, src, rows, n, eps, grid=grid(rows, 1))
    prog.launch(LAYER_NORM["apply", t], dst, src, wref, bref, mean, rstd, x.numel, n,
                grid=grid(x.numel))
    if finish is not None:
        finish(prog)
    impl = "two_pass" + ("+pack" if packed else "") + ("+unpack" if finish else "")
    return Plan(lay.total(), prog.enqueue, impl, tiling)
