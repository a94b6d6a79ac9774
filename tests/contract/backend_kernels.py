"""Kernels with a Python body (cpu) and a CUDA C body (cuda), as the contract tests over every backend
use them, and device memory filled with float32 values."""

from __future__ import annotations

import numpy as np

import streamrt as srt

ADD_ONE = r"""extern "C" __global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}"""


SCALE = r"""extern "C" __global__ void scale(float* x, int n, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}"""


@srt.kernel(cuda=ADD_ONE, signature="ptr, i32")
def add_one(ctx, x, n):
    ctx.array(x, (n,), np.float32)[:] += 1


@srt.kernel(cuda=SCALE, signature="ptr, i32, f32")
def scale(ctx, x, n, factor):
    ctx.array(x, (n,), np.float32)[:] *= factor


COORDS = r"""extern "C" __global__ void coords(int* out, int* lane) {
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned i = b * blockDim.x * blockDim.y * blockDim.z + t;
  out[i] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z
         + 1000 * blockIdx.x + 10000 * blockIdx.y + 100000 * blockIdx.z;
  lane[i] = __shfl_xor_sync(0xffffffffu, (int)t, 1);  // a warp: 32 consecutive linear ids
}"""


@srt.kernel(cuda=COORDS, signature="ptr, ptr")
def coords(ctx, out, lane):
    g, b = ctx.grid, ctx.block
    shape = (g.z, g.y, g.x, b.z, b.y, b.x)
    kz, ky, kx, tz, ty, tx = np.indices(shape)
    ctx.array(out, shape, np.int32)[...] = tx + 10 * ty + 100 * tz + 1000 * kx + 10000 * ky + 100000 * kz
    ctx.array(lane, shape, np.int32)[...] = (tx + b.x * (ty + b.y * tz)) ^ 1


EVERY_TYPE = r"""extern "C" __global__ void every_type(signed char i8, unsigned char u8, short i16,
    unsigned short u16, int i32, unsigned int u32, long long i64, unsigned long long u64, float f32,
    double f64, double* out) {
  out[0] = i8; out[1] = u8; out[2] = i16; out[3] = u16; out[4] = i32; out[5] = u32;
  out[6] = (double)i64; out[7] = (double)u64; out[8] = f32; out[9] = f64;
}"""


@srt.kernel(cuda=EVERY_TYPE, signature="i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, ptr")
def every_type(ctx, *args):
    ctx.array(args[-1], (10,), np.float64)[:] = args[:-1]


@srt.kernel
def python_only(ctx, x):
    pass


def _dev_f32(bdev, values) -> int:
    a = np.asarray(values, np.float32)
    p = srt.malloc(a.nbytes, bdev)
    srt.write(p, a)
    return p
