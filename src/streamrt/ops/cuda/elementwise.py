"""CUDA ``add`` / ``mul``: one grid-stride kernel, no workspace.

Inputs broadcast through zero strides and may have any strides; the output may be strided too.
Phase 1 drops size-1 dims and merges dims that are contiguous in all three operands, so the
common cases reach the kernel with one dim; when that dim has unit strides everywhere the
``contig`` kernel runs (no index arithmetic), else the ``strided`` one (up to 8 dims). ``alpha``
is fused (``x + alpha * y``, the product rounded first, as on cpu), so unlike the cpu kernels
nothing is staged in the workspace: the cuda backend needs none for these two operators.
"""

from __future__ import annotations

from ...tensor import TensorDesc
from ..framework import Plan
from .common import BLOCK, CTYPE, DIMS8, NP, Program, Ref, cuda_kernel, grid, nd_args, one_dtype

__all__ = ["plan_binary", "BINARY"]

_SRC = r"""
template <int OP, typename A> __device__ __forceinline__ A srt_binop(A a, A b, A alpha) {
  return OP == 0 ? a + srt_mul_rn(alpha, b) : a * b;
}
template <int OP, typename T>
__device__ __forceinline__ void srt_binary_contig(T* out, const T* x, const T* y, i64 n, double alpha_) {
  typedef typename srt_acc<T>::type A;
  const A alpha = (A)alpha_;
  for (i64 i = srt_tid(); i < n; i += srt_nthreads())
    srt_st(out + i, srt_binop<OP, A>(srt_ld(x + i), srt_ld(y + i), alpha));
}
template <int OP, typename T>
__device__ __forceinline__ void srt_binary_strided(T* out, const T* x, const T* y, i64 n, double alpha_,
                                                   int nd, const i64* sh, const i64* os,
                                                   const i64* xs, const i64* ys) {
  typedef typename srt_acc<T>::type A;
  const A alpha = (A)alpha_;
  for (i64 i = srt_tid(); i < n; i += srt_nthreads()) {
    i64 oo, xo, yo;
    srt_offsets(i, nd, sh, os, xs, ys, oo, xo, yo);
    srt_st(out + oo, srt_binop<OP, A>(srt_ld(x + xo), srt_ld(y + yo), alpha));
  }
}
"""
_CONTIG = r"""
extern "C" __global__ void {name}({T}* out, const {T}* x, const {T}* y, i64 n, double alpha) {
  srt_binary_contig<{op}>(out, x, y, n, alpha);
}
"""
_STRIDED = r"""
extern "C" __global__ void {name}({T}* out, const {T}* x, const {T}* y, i64 n, double alpha, int nd,
                                  SRT_PARAMS8(sh), SRT_PARAMS8(os), SRT_PARAMS8(xs), SRT_PARAMS8(ys)) {
  const i64 shape[SRT_MAXR] = SRT_ARRAY8(sh), o_st[SRT_MAXR] = SRT_ARRAY8(os),
            x_st[SRT_MAXR] = SRT_ARRAY8(xs), y_st[SRT_MAXR] = SRT_ARRAY8(ys);
  srt_binary_strided<{op}>(out, x, y, n, alpha, nd, shape, o_st, x_st, y_st);
}
"""
_OPS = {"add": 0, "mul": 1}

# (op, "contig" | "strided", dtype) -> kernel
BINARY = {}
for _op, _code in _OPS.items():
    for _t, _ct in CTYPE.items():
        for _kind, _tpl, _sig in (("contig", _CONTIG, "ptr, ptr, ptr, i64, f64"),
                                  ("strided", _STRIDED, f"ptr, ptr, ptr, i64, f64, i32, {DIMS8}, "
                                                        f"{DIMS8}, {DIMS8}, {DIMS8}")):
            _name = f"srt_{_op}_{_kind}_{_t}"
            BINARY[_op, _kind, _t] = cuda_kernel(
                _name, _SRC + _tpl.replace("{name}", _name).replace("{T}", _ct).replace("{op}", str(_code)),
                _sig)


def _bstrides(d: TensorDesc, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``d``'s strides against the broadcast ``shape``: 0 on new and on stretched dims."""
    lead = len(shape) - d.ndim
    return (0,) * lead + tuple(0 if n == 1 else s for n, s in zip(d.shape, d.strides))


def plan_binary(op: str, x: TensorDesc, y: TensorDesc, o: TensorDesc, alpha: float) -> Plan:
    """The cuda plan of ``out = x + alpha * y`` (op "add") or ``out = x * y`` (op "mul")."""
    t = one_dtype(op, [x, y, o])
    prog = Program()
    n = o.numel
    shape = o.shape
    nd, dims, (os_, xs, ys) = nd_args(shape, o.strides, _bstrides(x, shape), _bstrides(y, shape))
    # alpha in the compute dtype, as the cpu kernel scales y (float16 alpha is rounded to float16)
    alpha = float(NP[t].type(alpha)) if op == "add" else 1.0
    contig = nd == 0 or (nd == 1 and os_[0] == xs[0] == ys[0] == 1)
    impl = "contig" if contig else "strided"
    if n:
        refs = (Ref(2, o._boff), Ref(0, x._boff), Ref(1, y._boff))
        if contig:
            prog.launch(BINARY[op, "contig", t], *refs, n, alpha, grid=grid(n))
        else:
            prog.launch(BINARY[op, "strided", t], *refs, n, alpha, nd, *dims, *os_, *xs, *ys,
                        grid=grid(n))
    tiling = {"blocks": grid(n), "block": BLOCK, "dims": nd, "workspace": {}}
    return Plan(0, prog.enqueue, impl, tiling)

