"""CUDA ``cumsum``: a multi-level block scan with the block sums in the workspace.

x is seen as ``(A, L, B)`` along the scanned axis (``axis=None``: the flattened input, ``A = B =
1``); a strided x is packed into the workspace first. Level 0 cuts L into chunks, scans each
chunk locally and stores each chunk's total in a workspace region ``(A, nc, B)`` (accumulation
dtype). Level 1 scans those totals in place the same way, and so on until one chunk is left;
then, from the top level down, an add kernel adds to every chunk the scanned total of the chunks
before it. Two scan kernels, chosen per level:

- ``rows`` (``B == 1`` and L > ``SMALL``): one block per (row, chunk of ``ROWS_CHUNK``); each
  thread scans 4 consecutive elements, warp-shuffle scans and a shared-memory pass over the warp
  totals give each thread its prefix;
- ``cols`` (otherwise): one thread per (a, chunk of ``COLS_CHUNK``, b) scanning down its chunk,
  neighbouring threads on neighbouring b (coalesced).

float16 scans of more than one chunk keep level 0 in a float32 workspace buffer, so that the
add pass rounds to float16 once. A strided out is written through a workspace region.
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

__all__ = ["plan_cumsum", "SCAN", "ROWS_CHUNK", "COLS_CHUNK", "level_kind"]

ITEMS = 4  # elements per thread of the rows kernel
ROWS_CHUNK = BLOCK * ITEMS
COLS_CHUNK = 32

_SRC = r"""
#define SRT_SCAN_ITEMS 4
// sums may be null (the level's last chunk needs no total); dst may equal src (in place).
template <typename TI, typename TO, typename A>
__device__ __forceinline__ void srt_scan_rows(TO* dst, A* sums, const TI* src, i64 rows, i64 len, i64 nc) {
  __shared__ A sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const i64 chunk = (i64)blockDim.x * SRT_SCAN_ITEMS;
  for (i64 job = blockIdx.x; job < rows * nc; job += gridDim.x) {  // uniform: barriers are safe
    const i64 r = job / nc, c = job - r * nc;
    const i64 first = r * len + c * chunk + (i64)threadIdx.x * SRT_SCAN_ITEMS;
    const i64 end = r * len + srt_min(len, (c + 1) * chunk);
    A v[SRT_SCAN_ITEMS];
    A t = A(0);
#pragma unroll
    for (int q = 0; q < SRT_SCAN_ITEMS; ++q) {  // every read happens before any write below
      t += first + q < end ? (A)srt_ld(src + first + q) : A(0);
      v[q] = t;
    }
    const A incl = srt_warp_scan(t);
    A excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = A(0);
    __syncthreads();  // the previous job's readers of sh are done
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      A s = lane < nw ? sh[lane] : A(0);
      s = srt_warp_scan(s);
      if (lane < nw) sh[lane] = s;
    }
    __syncthreads();
    const A before = (warp > 0 ? sh[warp - 1] : A(0)) + excl;
#pragma unroll
    for (int q = 0; q < SRT_SCAN_ITEMS; ++q)
      if (first + q < end) srt_st(dst + first + q, before + v[q]);
    if (sums != nullptr && threadIdx.x == 0) sums[job] = sh[nw - 1];
  }
}
template <typename TI, typename TO, typename A>
__device__ __forceinline__ void srt_scan_cols(TO* dst, A* sums, const TI* src, i64 a_, i64 len, i64 b_,
                                              i64 chunk, i64 nc) {
  const i64 total = a_ * nc * b_;
  for (i64 i = srt_tid(); i < total; i += srt_nthreads()) {
    const i64 b = i % b_, t = i / b_, c = t % nc, a = t / nc;
    const i64 base = a * len * b_ + b, end = srt_min(len, (c + 1) * chunk);
    A run = A(0);
    for (i64 j = c * chunk; j < end; ++j) {
      run += (A)srt_ld(src + base + j * b_);
      srt_st(dst + base + j * b_, run);
    }
    if (sums != nullptr) sums[i] = run;  // (a, c, b) of the (A, nc, B) totals
  }
}
template <typename TI, typename TO, typename A>
__device__ __forceinline__ void srt_scan_add(TO* dst, const TI* src, const A* sums, i64 total, i64 len,
                                             i64 b_, i64 chunk, i64 nc) {
  for (i64 i = srt_tid(); i < total; i += srt_nthreads()) {
    const i64 b = i % b_, t = i / b_, j = t % len, a = t / len, c = j / chunk;
    A v = (A)srt_ld(src + i);
    if (c > 0) v += sums[(a * nc + c - 1) * b_ + b];
    srt_st(dst + i, v);
  }
}
"""
_ROWS = r"""
extern "C" __global__ void {name}({TO}* dst, {A}* sums, const {TI}* src, i64 rows, i64 len, i64 nc) {
  srt_scan_rows<{TI}, {TO}, {A}>(dst, sums, src, rows, len, nc);
}
"""
_COLS = r"""
extern "C" __global__ void {name}({TO}* dst, {A}* sums, const {TI}* src, i64 a, i64 len, i64 b, i64 chunk,
                                  i64 nc) {
  srt_scan_cols<{TI}, {TO}, {A}>(dst, sums, src, a, len, b, chunk, nc);
}
"""
_ADD = r"""
extern "C" __global__ void {name}({TO}* dst, const {TI}* src, const {A}* sums, i64 total, i64 len, i64 b,
                                  i64 chunk, i64 nc) {
  srt_scan_add<{TI}, {TO}, {A}>(dst, src, sums, total, len, b, chunk, nc);
}
"""
_I64 = ", ".join(["i64"] * 5)
# (kind, input dtype, output dtype): scans T -> T (out), T -> acc (float16's buffer), acc -> acc
# (block sums); adds acc -> T (float16 buffer to out) and T -> T (in place)
_VARIANTS = (
    [(kind, ti, to) for kind in ("rows", "cols")
     for ti, to in (("f16", "f16"), ("f32", "f32"), ("f64", "f64"), ("f16", "f32"))]
    + [("add", ti, to) for ti, to in (("f32", "f32"), ("f64", "f64"), ("f32", "f16"))]
)
_TEMPLATES = {"rows": (_ROWS, "ptr, ptr, ptr, i64, i64, i64"),
              "cols": (_COLS, f"ptr, ptr, ptr, {_I64}"),
              "add": (_ADD, f"ptr, ptr, ptr, {_I64}")}

SCAN = {}  # (kind, input dtype, output dtype) -> kernel
for _kind, _ti, _to in _VARIANTS:
    _tpl, _sig = _TEMPLATES[_kind]
    _name = f"srt_scan_{_kind}_{_ti}_{_to}"
    _a = "double" if "f64" in (_ti, _to) else "float"
    _body = _tpl.replace("{name}", _name).replace("{TI}", CTYPE[_ti]).replace("{TO}", CTYPE[_to])
    SCAN[_kind, _ti, _to] = cuda_kernel(_name, _SRC + _body.replace("{A}", _a), _sig)


def level_kind(b_: int, length: int) -> tuple[str, int]:
    """The scan kernel of a level of ``length`` along a stride of ``b_`` and its chunk."""
    if b_ == 1 and length > SMALL:
        return "rows", ROWS_CHUNK
    return "cols", COLS_CHUNK


def _scan(prog: Program, kind: str, ti: str, to: str, dst: Ref, sums: Ref | int, src: Ref, a_: int,
          length: int, b_: int, chunk: int, nc: int) -> None:
    k = SCAN[kind, ti, to]
    if kind == "rows":
        prog.launch(k, dst, sums, src, a_, length, nc, grid=grid(a_ * nc, 1))
    else:
        prog.launch(k, dst, sums, src, a_, length, b_, chunk, nc, grid=grid(a_ * nc * b_))


def plan_cumsum(x: TensorDesc, o: TensorDesc, axis: int | None) -> Plan:
    """The cuda plan of an inclusive scan of ``x`` along ``axis`` (None: flattened) into ``o``."""
    t = one_dtype("cumsum", [x, o])
    acc = ACC[t]
    prog, lay = Program(), Layout()
    if axis is None:
        a_, length, b_ = 1, x.numel, 1
    else:
        a_, length, b_ = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    kind, chunk = level_kind(b_, length)
    nc = -(-length // chunk) if length else 1
    tiling: dict = {"block": chunk, "blocks": nc, "rows": a_ * b_, "levels": 0,
                    "workspace": lay.regions}
    if o.numel == 0:
        return Plan(0, prog.enqueue, "empty", tiling)
    src, packed = packed_input(prog, lay, 0, x, "packed")  # C order: also the flat order
    out, finish = output_target(lay, 1, o, "out")
    if nc == 1:
        _scan(prog, kind, t, t, out, 0, src, a_, length, b_, chunk, 1)
        levels = 1
    else:
        # level 0 writes ``data0`` (out itself, or float16's float32 buffer); each level's chunk
        # totals are the next level's data, scanned in place
        data0, d0t = (out, t) if t == acc else (Ref(WS, lay.add("acc", (o.numel,), NP[acc])), acc)
        stack = []  # (data, its dtype, length, chunk, nc, sums) of each level that has totals
        data, dt, ln, kd, ch, n_c, src_l, src_t = data0, d0t, length, kind, chunk, nc, src, t
        while n_c > 1:
            sums = Ref(WS, lay.add(f"block_sums{len(stack)}", (a_, n_c, b_), NP[acc]))
            _scan(prog, kd, src_t, dt, data, sums, src_l, a_, ln, b_, ch, n_c)
            stack.append((data, dt, ln, ch, n_c, sums))
            data = src_l = sums
            dt = src_t = acc
            ln = n_c
            kd, ch = level_kind(b_, ln)
            n_c = -(-ln // ch)
        _scan(prog, kd, acc, acc, data, 0, data, a_, ln, b_, ch, 1)  # the top level: one chunk
        levels = len(stack) + 1
        for i, (d, dtl, ln, ch, n_c, sums) in reversed(list(enumerate(stack))):
            dst, dst_t = (out, t) if i == 0 else (d, dtl)  # level 0 lands in out
            prog.launch(SCAN["add", dtl, dst_t], dst, d, sums, a_ * ln * b_, ln, b_, ch, n_c,
                        grid=grid(a_ * ln * b_))
    if finish is not None:
        finish(prog)
    tiling["levels"] = levels
    impl = ("block_scan" if nc > 1 else "single_block") + ("+pack" if packed else "") + (
        "+unpack" if finish else "")
    return Plan(lay.total(), prog.enqueue, impl, tiling)
