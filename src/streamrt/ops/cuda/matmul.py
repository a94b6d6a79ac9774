"""CUDA ``matmul``: a shared-memory tiled GEMM, split-K with partial products in the workspace.

One block of 16 x 16 threads computes a 16 x 16 output tile, stepping over K in 16-wide tiles
of ``a`` and ``b`` staged in shared memory (padded against bank conflicts). Any strides work:
every operand is addressed as ``base + batch offset + row * stride + col * stride``, the batch
offset decomposed over the (merged, broadcast) batch dims, so transposed or sliced operands need
no copy. grid.x walks the tiles, grid.y the K splits, grid.z the batch (each a grid-stride loop).

When the output has too few tiles to fill the GPU and K is long, phase 1 splits K: each split
writes its partial product to a workspace region ``(splits, batch, M, N)`` in the accumulation
dtype, and a reduce kernel sums the splits into ``out``. Otherwise one kernel writes ``out``.
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
    DIMS8,
    MAX_GRID,
    NP,
    WS,
    Program,
    Ref,
    cuda_kernel,
    grid,
    nd_args,
    one_dtype,
)

__all__ = ["plan_matmul", "MATMUL", "TILE", "SPLIT_K_MIN", "SPLIT_CHUNK", "SPLIT_BLOCKS",
           "MAX_SPLITS"]

TILE = 16  # output tile edge (BLOCK = TILE * TILE threads)
SPLIT_K_MIN = 1024  # K from which split-K is considered
SPLIT_CHUNK = 256  # K elements per split at least
SPLIT_BLOCKS = 256  # split until about this many blocks run (an H100/H200 has 132 SMs)
MAX_SPLITS = 16

_SRC = r"""
#define SRT_TILE 16
template <bool PARTIAL, typename T, typename A, typename TO>
__device__ __forceinline__ void srt_mm(TO* dst, const T* a, const T* b, i64 m, i64 n, i64 k, i64 ksplit,
                                       i64 nbatch, i64 am, i64 ak, i64 bk, i64 bn, i64 om, i64 on,
                                       int bnd, const i64* bsh, const i64* bas, const i64* bbs,
                                       const i64* bos) {
  __shared__ A ta[SRT_TILE][SRT_TILE + 1];
  __shared__ A tb[SRT_TILE][SRT_TILE + 1];
  const int tx = threadIdx.x % SRT_TILE, ty = threadIdx.x / SRT_TILE;
  const i64 tn = (n + SRT_TILE - 1) / SRT_TILE, tiles = ((m + SRT_TILE - 1) / SRT_TILE) * tn;
  const i64 split = blockIdx.y, k0 = split * ksplit, k1 = srt_min(k, k0 + ksplit);
  // every loop bound below is uniform per block, so the barriers inside are safe
  for (i64 z = blockIdx.z; z < nbatch; z += gridDim.z) {
    i64 ao, bo, oo;
    srt_offsets(z, bnd, bsh, bas, bbs, bos, ao, bo, oo);
    for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) {
      const i64 row = (t / tn) * SRT_TILE + ty, col = (t % tn) * SRT_TILE + tx;
      A acc = A(0);
      for (i64 kk = k0; kk < k1; kk += SRT_TILE) {
        const i64 ka = kk + tx, kb = kk + ty;
        ta[ty][tx] = row < m && ka < k1 ? (A)srt_ld(a + ao + row * am + ka * ak) : A(0);
        tb[ty][tx] = kb < k1 && col < n ? (A)srt_ld(b + bo + kb * bk + col * bn) : A(0);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < SRT_TILE; ++q) acc += ta[ty][q] * tb[q][tx];
        __syncthreads();
      }
      if (row < m && col < n) {
        if (PARTIAL) srt_st(dst + ((split * nbatch + z) * m + row) * n + col, acc);
        else srt_st(dst + oo + row * om + col * on, acc);
      }
    }
  }
}
template <typename T, typename A>
__device__ __forceinline__ void srt_mm_reduce(T* out, const A* part, i64 splits, i64 nbatch, i64 m, i64 n,
                                              i64 om, i64 on, int bnd, const i64* bsh, const i64* bos) {
  const i64 mn = m * n, total = nbatch * mn;
  for (i64 i = srt_tid(); i < total; i += srt_nthreads()) {
    const i64 z = i / mn, rem = i - z * mn, row = rem / n, col = rem - row * n;
    A s = A(0);
    for (i64 p = 0; p < splits; ++p) s += part[p * total + i];
    i64 oo, u1, u2;
    srt_offsets(z, bnd, bsh, bos, bos, bos, oo, u1, u2);
    srt_st(out + oo + row * om + col * on, s);
  }
}
"""
_GEMM = r"""
extern "C" __global__ void {name}({TO}* dst, const {T}* a, const {T}* b, i64 m, i64 n, i64 k, i64 ksplit,
                                  i64 nbatch, i64 am, i64 ak, i64 bk, i64 bn, i64 om, i64 on, int bnd,
                                  SRT_PARAMS8(bsh), SRT_PARAMS8(bas), SRT_PARAMS8(bbs), SRT_PARAMS8(bos)) {
  const i64 sh[SRT_MAXR] = SRT_ARRAY8(bsh), as_[SRT_MAXR] = SRT_ARRAY8(bas),
            bs_[SRT_MAXR] = SRT_ARRAY8(bbs), os_[SRT_MAXR] = SRT_ARRAY8(bos);
  srt_mm<{partial}, {T}, {A}, {TO}>(dst, a, b, m, n, k, ksplit, nbatch, am, ak, bk, bn, om, on, bnd,
                                    sh, as_, bs_, os_);
}
"""
_REDUCE = r"""
extern "C" __global__ void {name}({T}* out, const {A}* part, i64 splits, i64 nbatch, i64 m, i64 n,
                                  i64 om, i64 on, int bnd, SRT_PARAMS8(bsh), SRT_PARAMS8(bos)) {
  const i64 sh[SRT_MAXR] = SRT_ARRAY8(bsh), os_[SRT_MAXR] = SRT_ARRAY8(bos);
  srt_mm_reduce<{T}, {A}>(out, part, splits, nbatch, m, n, om, on, bnd, sh, os_);
}
"""
_GEMM_SIG = f"ptr, ptr, ptr, {', '.join(['i64'] * 11)}, i32, {DIMS8}, {DIMS8}, {DIMS8}, {DIMS8}"
_REDUCE_SIG = f"ptr, ptr, {', '.join(['i64'] * 6)}, i32, {DIMS8}, {DIMS8}"

MATMUL = {}  # ("direct" | "partial" | "reduce", dtype) -> kernel
for _t, _ct in CTYPE.items():
    _a = CTYPE[ACC[_t]]
    for _kind, _tpl, _to, _sig in (("direct", _GEMM, _ct, _GEMM_SIG), ("partial", _GEMM, _a, _GEMM_SIG),
                                   ("reduce", _REDUCE, _ct, _REDUCE_SIG)):
        _name = f"srt_mm_{_kind}_{_t}"
        _body = (_tpl.replace("{name}", _name).replace("{TO}", _to).replace("{T}", _ct)
                 .replace("{A}", _a).replace("{partial}", "true" if _kind == "partial" else "false"))
        MATMUL[_kind, _t] = cuda_kernel(_name, _SRC + _body, _sig)


def _batch_strides(d: TensorDesc, batch: tuple[int, ...]) -> tuple[int, ...]:
    """``d``'s batch strides against the broadcast ``batch`` shape: 0 on new and stretched dims."""
    own = d.shape[:-2]
    lead = len(batch) - len(own)
    return (0,) * lead + tuple(0 if s == 1 else st for s, st in zip(own, d.strides[:-2]))


def splits_for(m: int, n: int, k: int, nbatch: int) -> tuple[int, int]:
    """``(splits, ksplit)``: how many K slices of ``ksplit`` elements (a multiple of TILE)."""
    work = nbatch * -(-m // TILE) * -(-n // TILE)
    if k < SPLIT_K_MIN or not 0 < work < SPLIT_BLOCKS:  # (work 0: an empty output)
        return 1, k
    splits = min(MAX_SPLITS, k // SPLIT_CHUNK, max(1, SPLIT_BLOCKS // work))
    if splits < 2:
        return 1, k
    per = -(-k // splits)
    ksplit = -(-per // TILE) * TILE
    return -(-k // ksplit), ksplit  # recounted, so that no split is empty


def plan_matmul(a: TensorDesc, b: TensorDesc, o: TensorDesc, batch: tuple[int, ...]) -> Plan:
    """The cuda plan of ``o = a @ b`` with the validated broadcast ``batch`` shape."""
    t = one_dtype("matmul", [a, b, o])
    prog, lay = Program(), Layout()
    m, k = a.shape[-2:]
    n = b.shape[-1]
    nbatch = math.prod(batch)
    splits, ksplit = splits_for(m, n, k, nbatch)
    tiles = -(-m // TILE) * -(-n // TILE)
    tiling: dict = {"M": m, "N": n, "K": k, "batch": nbatch, "splits": splits, "tile": TILE,
                    "workspace": lay.regions}
    if o.numel == 0:
        return Plan(0, prog.enqueue, "empty", tiling)
    bnd, bsh, (bas, bbs, bos) = nd_args(batch, _batch_strides(a, batch), _batch_strides(b, batch),
                                        o.strides[:-2])
    strides = (a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1], o.strides[-2],
               o.strides[-1])
    g = (min(tiles, MAX_GRID), splits, min(nbatch, MAX_GRID))
    ins = (Ref(0, a._boff), Ref(1, b._boff))
    out = Ref(2, o._boff)
    if splits == 1:
        prog.launch(MATMUL["direct", t], out, *ins, m, n, k, k, nbatch, *strides, bnd, *bsh, *bas, *bbs,
                    *bos, grid=g, block=BLOCK)
        return Plan(0, prog.enqueue, "tiled", tiling)
    part = Ref(WS, lay.add("partials", (splits, nbatch, m, n), NP[ACC[t]]))
    prog.launch(MATMUL["partial", t], part, *ins, m, n, k, ksplit, nbatch, *strides, bnd, *bsh, *bas,
                *bbs, *bos, grid=g, block=BLOCK)
    prog.launch(MATMUL["reduce", t], out, part, splits, nbatch, m, n, strides[4], strides[5], bnd, *bsh,
                *bos, grid=grid(nbatch * m * n))
    return Plan(lay.total(), prog.enqueue, "split_k", tiling)
