"""What every CUDA operator shares: dtype names, the CUDA C prelude, the kernel registry, launch
shapes, strided-index arguments, the strided copy (pack/unpack) and :class:`Program`.

A plan is a :class:`Program`: launches recorded at phase 1 whose pointer arguments are
:class:`Ref` (a tensor slot or the workspace, plus a byte offset) and whose other arguments are
already final; ``Program.enqueue`` resolves the refs against the executor's addresses and the
workspace and launches, so phase 2 does no planning at all.

Every kernel's CUDA source is ``PRELUDE`` + its family's templates + one ``extern "C"`` wrapper,
so that compiling one kernel never compiles its siblings. No header is included (the backend
gives NVRTC no include path, so even ``cuda_fp16.h`` is out of reach): float16 is ``srt_half``,
raw bits converted with PTX ``cvt``, and all float16 arithmetic happens in float32.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ...emu.params import parse_tokens
from ...kernel import Kernel, _emulated_body
from ...tensor import TensorDesc
from ..common import F16, F32, F64, Layout
from ..executor import PARAM_INVALID
from ..framework import _bad

__all__ = [
    "BLOCK", "MAX_GRID", "MAXR", "SMALL", "WS", "DT", "CTYPE", "ACC", "NP", "DIMS8", "KERNELS",
    "PRELUDE", "COPY", "Ref", "Program", "cuda_kernel", "grid", "nd_args", "one_dtype",
    "contiguous_strides", "launch_copy", "packed_input", "output_target",
]

BLOCK = 256  # threads per block of every launch (the kernels assume a multiple of 32)
MAX_GRID = 65535  # blocks per launch at most; grid-stride loops cover the rest
MAXR = 8  # dims a strided kernel takes (TensorDesc allows 8)
SMALL = 32  # rows at most this long go one thread per row (a block would idle)
WS = -1  # Ref.slot of the workspace

DT = {F16: "f16", F32: "f32", F64: "f64"}
NP = {v: k for k, v in DT.items()}
CTYPE = {"f16": "srt_half", "f32": "float", "f64": "double"}
ACC = {"f16": "f32", "f32": "f32", "f64": "f64"}

PRELUDE = r"""
typedef long long i64;
#define SRT_MAXR 8
#define SRT_PARAMS8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define SRT_ARRAY8(p) {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

struct srt_half { unsigned short bits; };  // float16 storage; arithmetic happens in float
template <typename T> struct srt_acc { typedef T type; };
template <> struct srt_acc<srt_half> { typedef float type; };

__device__ __forceinline__ float srt_ld(const float* p) { return *p; }
__device__ __forceinline__ double srt_ld(const double* p) { return *p; }
__device__ __forceinline__ float srt_ld(const srt_half* p) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));
  return f;
}
__device__ __forceinline__ void srt_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void srt_st(double* p, double v) { *p = v; }
__device__ __forceinline__ void srt_st(srt_half* p, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  p->bits = h;
}

__device__ __forceinline__ float srt_exp(float v) { return expf(v); }
__device__ __forceinline__ double srt_exp(double v) { return exp(v); }
__device__ __forceinline__ float srt_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double srt_sqrt(double v) { return sqrt(v); }
__device__ __forceinline__ float srt_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double srt_max(double a, double b) { return fmax(a, b); }
// products that must not be contracted into an FMA (the cpu rounds the product first)
__device__ __forceinline__ float srt_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double srt_mul_rn(double a, double b) { return __dmul_rn(a, b); }
template <typename A> __device__ __forceinline__ A srt_neg_inf();
template <> __device__ __forceinline__ float srt_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double srt_neg_inf<double>() {
  return __longlong_as_double((i64)0xfff0000000000000ULL);
}
__device__ __forceinline__ i64 srt_min(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 srt_tid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 srt_nthreads() { return (i64)gridDim.x * blockDim.x; }

template <typename A> __device__ __forceinline__ A srt_warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A> __device__ __forceinline__ A srt_warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = srt_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Inclusive scan over the lanes of a warp.
template <typename A> __device__ __forceinline__ A srt_warp_scan(A v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const A n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}
// Block-wide sum/max, returned to every thread; sh holds 32 values. The leading barrier lets a
// block call these back to back: the previous call's readers of sh are done before it is rewritten.
template <typename A> __device__ __forceinline__ A srt_block_sum(A v, A* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = srt_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : A(0);
  return srt_warp_sum(v);
}
template <typename A> __device__ __forceinline__ A srt_block_max(A v, A* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = srt_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : srt_neg_inf<A>();
  return srt_warp_max(v);
}

// Element offsets of C-order linear index i in three strided operands; dims innermost first.
// Unrolled over SRT_MAXR behind a guard so every array index is a constant (registers, not
// local memory).
__device__ __forceinline__ void srt_offsets(i64 i, int nd, const i64* sh, const i64* s0,
                                            const i64* s1, const i64* s2, i64& o0, i64& o1,
                                            i64& o2) {
  o0 = 0; o1 = 0; o2 = 0;
#pragma unroll
  for (int d = 0; d < SRT_MAXR; ++d) {
    if (d < nd) {
      const i64 q = i / sh[d], c = i - q * sh[d];
      i = q;
      o0 += c * s0[d]; o1 += c * s1[d]; o2 += c * s2[d];
    }
  }
}
"""

KERNELS: dict[str, Kernel] = {}  # name -> kernel, every CUDA kernel of every operator


def cuda_kernel(name: str, body: str, signature: str) -> Kernel:
    """The registered kernel ``name`` with source ``PRELUDE + body`` (made once): CUDA C alone,
    which the cpu backend emulates (``ops.use_cuda_c``)."""
    k = KERNELS.get(name)
    if k is None:
        assert f'extern "C" __global__ void {name}(' in body, name
        src = PRELUDE + body
        # the operators' parameter lists are macros (SRT_PARAMS8): the signature is not
        # checked against the source here, but by every NVRTC build of the tests
        run = _emulated_body(src, name, signature, (), len(parse_tokens(signature)))
        k = KERNELS[name] = Kernel(run, name=name, cuda=src, signature=signature)
    return k


DIMS8 = ", ".join(["i64"] * MAXR)  # the signature of one SRT_PARAMS8 group


def grid(items: int, per_block: int = BLOCK) -> int:
    """Blocks for ``items`` work items at ``per_block`` per block, capped (grid-stride loops)."""
    return max(1, min(-(-items // per_block), MAX_GRID))


def one_dtype(op: str, descs: list[TensorDesc | None]) -> str:
    """The single dtype name of the tensors; mixed dtypes are refused on cuda (161002)."""
    dts = sorted({d.dtype.name for d in descs if d is not None})
    if len(dts) != 1:
        raise _bad(op, f"mixed dtypes ({', '.join(dts)}) are not supported by the CUDA C "
                       "kernels (the cuda backend, cpu under ops.use_cuda_c()); "
                       "give every tensor the same dtype", PARAM_INVALID)
    return DT[np.dtype(dts[0])]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides (elements) of ``shape``."""
    out: list[int] = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def nd_args(shape: tuple[int, ...], *strides: tuple[int, ...]) -> tuple[int, list[int], list[list[int]]]:
    """``(nd, dims, [strides per operand])`` for the strided kernels: size-1 dims dropped, dims
    merged where every operand is contiguous across them, innermost first, padded to MAXR."""
    merged: list[tuple[int, list[int]]] = []  # outermost first
    for i, d in enumerate(shape):
        if d == 1:
            continue
        st = [s[i] for s in strides]
        if merged and all(ps == s * d for ps, s in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * d, st)
        else:
            merged.append((d, st))
    merged.reverse()
    nd = len(merged)
    assert nd <= MAXR, shape
    pad = MAXR - nd
    dims = [d for d, _ in merged] + [1] * pad
    return nd, dims, [[st[j] for _, st in merged] + [0] * pad for j in range(len(strides))]


class Ref(NamedTuple):
    """A pointer argument resolved at enqueue: tensor slot ``slot`` (or ``WS``) plus ``offset`` bytes."""

    slot: int
    offset: int


class Program:
    """The launches of one plan; pointers are :class:`Ref`, everything else is final."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps: list[tuple[Kernel, tuple, Any, int]] = []

    def launch(self, kernel: Kernel, *args: Any, grid: Any, block: int = BLOCK) -> None:
        """Record one launch (phase 1)."""
        self.steps.append((kernel, args, grid, block))

    def enqueue(self, s: Any, ws: int | None, addrs: list) -> None:
        """Phase 2: launch every step with its refs resolved."""
        for kernel, args, g, b in self.steps:
            s.launch(kernel, *[_resolve(a, ws, addrs) if type(a) is Ref else a for a in args],
                     grid=g, block=b)


def _resolve(r: Ref, ws: int | None, addrs: list) -> int:
    base = ws if r.slot == WS else addrs[r.slot]
    assert base is not None, r  # a planner never refers to an absent tensor or workspace
    return base + r.offset


# -- the strided copy: packs inputs into, and unpacks outputs from, the workspace -------------------
_COPY_SRC = r"""
template <typename T>
__device__ __forceinline__ void srt_copy(T* dst, const T* src, i64 n, int nd, const i64* sh,
                                         const i64* ds, const i64* ss) {
  for (i64 i = srt_tid(); i < n; i += srt_nthreads()) {
    i64 od, os, unused;
    srt_offsets(i, nd, sh, ds, ss, ss, od, os, unused);
    dst[od] = src[os];
  }
}
extern "C" __global__ void srt_copy_{t}({T}* dst, const {T}* src, i64 n, int nd, SRT_PARAMS8(sh),
                                        SRT_PARAMS8(ds), SRT_PARAMS8(ss)) {
  const i64 shape[SRT_MAXR] = SRT_ARRAY8(sh), dst_st[SRT_MAXR] = SRT_ARRAY8(ds),
            src_st[SRT_MAXR] = SRT_ARRAY8(ss);
  srt_copy(dst, src, n, nd, shape, dst_st, src_st);
}
"""
COPY = {t: cuda_kernel(f"srt_copy_{t}", _COPY_SRC.replace("{t}", t).replace("{T}", CTYPE[t]),
                       f"ptr, ptr, i64, i32, {DIMS8}, {DIMS8}, {DIMS8}") for t in CTYPE}


def launch_copy(prog: Program, t: str, dst: Ref, dst_strides: tuple, src: Ref, src_strides: tuple,
                shape: tuple) -> None:
    """Record a strided copy of ``shape`` elements from ``src`` to ``dst``."""
    n = math.prod(shape)
    nd, dims, (ds, ss) = nd_args(shape, dst_strides, src_strides)
    prog.launch(COPY[t], dst, src, n, nd, *dims, *ds, *ss, grid=grid(n))


def packed_input(prog: Program, lay: Layout, slot: int, d: TensorDesc, name: str,
                 perm: tuple[int, ...] | None = None) -> tuple[Ref, bool]:
    """A C-contiguous copy of input ``d`` with its axes in ``perm`` order: the tensor itself when
    it already is one, else a workspace region ``name`` filled by a copy. Also: whether packed."""
    perm = tuple(range(d.ndim)) if perm is None else perm
    if d.is_contiguous and perm == tuple(sorted(perm)):
        return Ref(slot, d._boff), False
    shape = tuple(d.shape[i] for i in perm)
    off = lay.add(name, (d.numel,), d.dtype)
    launch_copy(prog, DT[d.dtype], Ref(WS, off), contiguous_strides(shape), Ref(slot, d._boff),
                tuple(d.strides[i] for i in perm), shape)
    return Ref(WS, off), True


def output_target(lay: Layout, slot: int, d: TensorDesc, name: str) -> tuple[Ref, Any]:
    """Where a kernel writes output ``d`` in C order: the tensor itself when contiguous, else a
    workspace region ``name``; and a ``finish(prog)`` that copies the region out (or None)."""
    if d.is_contiguous:
        return Ref(slot, d._boff), None
    off = lay.add(name, (d.numel,), d.dtype)

    def finish(prog: Program) -> None:
        launch_copy(prog, DT[d.dtype], Ref(slot, d._boff), d.strides, Ref(WS, off),
                    contiguous_strides(d.shape), d.shape)

    return Ref(WS, off), finish
