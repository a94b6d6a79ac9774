"""CUDA ``reduce_sum``: a multi-level tree reduction with its partial sums in the workspace.

The input is seen as ``(A, K, B)`` (K the reduced elements), free for a contiguous input whose
reduced axes are adjacent; any other input is first packed, kept axes first, into a workspace
region (``B = 1`` then). Each level cuts K into chunks and writes one partial sum per chunk to a
workspace region ``(A, ceil(K / chunk), B)`` in the accumulation dtype; levels repeat until one
chunk is left, whose kernel writes ``out``. Two kernels, chosen per level:

- ``rows`` (``B == 1`` and K > ``SMALL``): one block per (row, chunk of ``ROWS_CHUNK``): each
  thread sums a strided slice (coalesced), then a warp-shuffle + shared-memory block reduction;
- ``cols`` (otherwise): one thread per (a, chunk of ``COLS_CHUNK``, b), summing down the chunk;
  neighbouring threads read neighbouring b, so the loads coalesce.

K == 0 runs the last level alone with an empty chunk: it writes zeros. A strided ``out`` is
written to a workspace region and copied out.
"""

from __future__ import annotations

import math

from ...tensor import TensorDesc
from ..common import Layout
from ..framework import Plan
from .common import (
    ACC,
    BLOCK,
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

__all__ = ["plan_reduce_sum", "RSUM", "ROWS_CHUNK", "COLS_CHUNK"]

ROWS_CHUNK = 2048  # elements one block sums (8 per thread)
COLS_CHUNK = 32  # elements one thread sums

_SRC = r"""
template <typename TI, typename TO, typename A>
__device__ __forceinline__ void srt_rsum_rows(TO* dst, const TI* src, i64 rows, i64 k, i64 chunk, i64 nc) {
  __shared__ A sh[32];
  const i64 jobs = rows * nc;
  for (i64 job = blockIdx.x; job < jobs; job += gridDim.x) {  // uniform per block: barriers are safe
    const i64 r = job / nc, c = job - r * nc;
    const TI* p = src + r * k;
    const i64 end = srt_min(k, (c + 1) * chunk);
    A acc = A(0);
    for (i64 j = c * chunk + threadIdx.x; j < end; j += blockDim.x) acc += (A)srt_ld(p + j);
    acc = srt_block_sum(acc, sh);
    if (threadIdx.x == 0) srt_st(dst + job, acc);
  }
}
template <typename TI, typename TO, typename A>
__device__ __forceinline__ void srt_rsum_cols(TO* dst, const TI* src, i64 a_, i64 k, i64 b_, i64 chunk,
                                              i64 nc) {
  const i64 total = a_ * nc * b_;
  for (i64 i = srt_tid(); i < total; i += srt_nthreads()) {
    const i64 b = i % b_, t = i / b_, c = t % nc, a = t / nc;
    const TI* p = src + a * k * b_ + b;
    const i64 end = srt_min(k, (c + 1) * chunk);
    A acc = A(0);
    for (i64 j = c * chunk; j < end; ++j) acc += (A)srt_ld(p + j * b_);
    srt_st(dst + i, acc);  // (a, c, b) of the (A, nc, B) partials
  }
}
"""
_ROWS = r"""
extern "C" __global__ void {name}({TO}* dst, const {TI}* src, i64 rows, i64 k, i64 chunk, i64 nc) {
  srt_rsum_rows<{TI}, {TO}, {A}>(dst, src, rows, k, chunk, nc);
}
"""
_COLS = r"""
extern "C" __global__ void {name}({TO}* dst, const {TI}* src, i64 a, i64 k, i64 b, i64 chunk, i64 nc) {
  srt_rsum_cols<{TI}, {TO}, {A}>(dst, src, a, k, b, chunk, nc);
}
"""
# (input, output) dtypes a level can have: T -> T (one level), T -> acc, acc -> acc, acc -> T
PAIRS = (("f32", "f32"), ("f64", "f64"), ("f16", "f16"), ("f16", "f32"), ("f32", "f16"))

RSUM = {}  # ("rows" | "cols", input dtype, output dtype) -> kernel
for _ti, _to in PAIRS:
    _a = "double" if "f64" in (_ti, _to) else "float"
    for _kind, _tpl, _sig in (("rows", _ROWS, "ptr, ptr, i64, i64, i64, i64"),
                              ("cols", _COLS, "ptr, ptr, i64, i64, i64, i64, i64")):
        _name = f"srt_rsum_{_kind}_{_ti}_{_to}"
        _body = _tpl.replace("{name}", _name).replace("{TI}", CTYPE[_ti]).replace("{TO}", CTYPE[_to])
        RSUM[_kind, _ti, _to] = cuda_kernel(_name, _SRC + _body.replace("{A}", _a), _sig)


def plan_reduce_sum(x: TensorDesc, o: TensorDesc, axes: tuple[int, ...]) -> Plan:
    """The cuda plan of a sum over the sorted, validated ``axes`` of ``x`` into ``o``."""
    t = one_dtype("reduce_sum", [x, o])
    acc = ACC[t]
    prog, lay = Program(), Layout()
    tiling: dict = {"block": BLOCK, "levels": 0, "workspace": lay.regions}
    if o.numel == 0:
        return Plan(0, prog.enqueue, "empty", tiling)
    nd = x.ndim
    kept = tuple(i for i in range(nd) if i not in axes)
    k = math.prod(x.shape[i] for i in axes)
    adjacent = not axes or axes == tuple(range(axes[0], axes[-1] + 1))
    impl = "tree"
    if k == 0:  # nothing to read: the one level writes zeros
        a_, b_, src = math.prod(x.shape[i] for i in kept), 1, Ref(0, x._boff)
    elif x.is_contiguous and adjacent:
        first = axes[0] if axes else nd
        last = axes[-1] if axes else nd - 1
        a_, b_ = math.prod(x.shape[:first]), math.prod(x.shape[last + 1 :])
        src = Ref(0, x._boff)
    else:
        a_, b_ = math.prod(x.shape[i] for i in kept), 1
        src, _ = packed_input(prog, lay, 0, x, "packed", kept + axes)
        impl = "tree+pack"
    dst_final, finish = output_target(lay, 1, o, "out")
    src_t, kl, level = t, k, 0
    while True:
        rows = b_ == 1 and kl > SMALL
        chunk = ROWS_CHUNK if rows else COLS_CHUNK
        if kl <= chunk:  # the last level: one chunk per output
            dst, dst_t, chunk, nc = dst_final, t, max(kl, 1), 1
        else:
            nc = -(-kl // chunk)
            dst, dst_t = Ref(WS, lay.add(f"partials{level}", (a_, nc, b_), NP[acc])), acc
        if rows:
            prog.launch(RSUM["rows", src_t, dst_t], dst, src, a_, kl, chunk, nc, grid=grid(a_ * nc, 1))
        else:
            prog.launch(RSUM["cols", src_t, dst_t], dst, src, a_, kl, b_, chunk, nc,
                        grid=grid(a_ * nc * b_))
        level += 1
        if nc == 1:
            break
        src, src_t, kl = dst, acc, nc
    if finish is not None:
        finish(prog)
        impl += "+unpack"
    tiling.update(levels=level, A=a_, K=k, B=b_)
    return Plan(lay.total(), prog.enqueue, impl, tiling)
