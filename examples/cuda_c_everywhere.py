"""One program, CUDA C kernels, every device: a vector add, a shared-memory reduction with
atomics and a 1-D stencil, written once in CUDA C and run unchanged on ``cpu:0`` (the CUDA C
emulator: g++, threads as fibers, barriers, atomics) and on ``cuda:0`` (NVRTC) when there is one;
each result is checked against numpy.

    python examples/cuda_c_everywhere.py            # cpu:0, then cuda:0 if this machine has one
    python examples/cuda_c_everywhere.py cuda:0     # only the devices named
"""

import sys

import numpy as np

import streamrt as srt

VADD = r"""
extern "C" __global__ void vadd(float* out, const float* a, const float* b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}
"""

# each block sums its slice in shared memory (a tree, a barrier per level), then one atomicAdd
SUM = r"""
#define BLOCK 256
extern "C" __global__ void block_sum(float* total, const float* x, int n) {
  __shared__ float part[BLOCK];
  const int t = threadIdx.x;
  float v = 0.0f;
  for (int i = blockIdx.x * BLOCK + t; i < n; i += gridDim.x * BLOCK) v += x[i];
  part[t] = v;
  __syncthreads();
  for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
    if (t < stride) part[t] += part[t + stride];
    __syncthreads();
  }
  if (t == 0) atomicAdd(total, part[0]);
}
"""

# y[i] = (x[i-1] + 2 x[i] + x[i+1]) / 4 with the ends held: a tile and its halo in shared memory
STENCIL = r"""
#define TILE 128
extern "C" __global__ void smooth(float* y, const float* x, int n) {
  __shared__ float s[TILE + 2];
  const int t = threadIdx.x, i = blockIdx.x * TILE + t;
  s[t + 1] = i < n ? x[i] : 0.0f;
  if (t == 0) s[0] = i > 0 ? x[i - 1] : 0.0f;
  if (t == TILE - 1 || i == n - 1) s[t + 2] = i + 1 < n ? x[i + 1] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = (i == 0 || i == n - 1) ? x[i] : 0.25f * (s[t] + 2.0f * s[t + 1] + s[t + 2]);
}
"""

vadd = srt.cuda_kernel(VADD, "vadd", signature="ptr, const ptr, const ptr, i32")
block_sum = srt.cuda_kernel(SUM, "block_sum", signature="ptr, const ptr, i32")
smooth = srt.cuda_kernel(STENCIL, "smooth", signature="ptr, const ptr, i32")


def run(device: srt.Device, n: int = 10_000) -> None:
    """The three kernels on ``device``, checked against numpy."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    s = srt.Stream(device)
    pa, pb, pc, pt = (s.malloc(size) for size in (a.nbytes, b.nbytes, a.nbytes, 4))
    s.memcpy(pa, a, a.nbytes)
    s.memcpy(pb, b, b.nbytes)
    s.memset(pt, 0, 4)
    got_c, got_sum, got_y = np.empty_like(a), np.zeros(1, np.float32), np.empty_like(a)

    s.launch(vadd, pc, pa, pb, n, grid=16, block=128)           # c = a + b (grid-stride)
    s.memcpy(got_c, pc, a.nbytes)
    s.launch(block_sum, pt, pc, n, grid=8, block=256)           # total = sum(c)
    s.memcpy(got_sum, pt, 4)
    s.launch(smooth, pa, pc, n, grid=(n + 127) // 128, block=128)  # a = smooth(c)
    s.memcpy(got_y, pa, a.nbytes)
    for p in (pa, pb, pc, pt):
        s.free(p)
    s.synchronize()

    c = a + b
    y = c.copy()
    y[1:-1] = 0.25 * (c[:-2] + 2 * c[1:-1] + c[2:])
    assert np.array_equal(got_c, c), "vector add"
    assert np.isclose(got_sum[0], c.sum(dtype=np.float64), rtol=1e-4), (got_sum[0], c.sum())
    assert np.allclose(got_y, y, rtol=1e-6, atol=1e-6), "stencil"
    print(f"{device.name}: vector add, block sum ({got_sum[0]:.3f}) and stencil match numpy "
          f"over {n} elements")


def devices(names: list[str]) -> list[srt.Device]:
    """The devices named, else cpu:0 and cuda:0 when this machine has one."""
    if names:
        return [srt.Device(name) for name in names]
    found = [srt.Device("cpu:0")]
    try:
        if srt.device_count("cuda") > 0:
            found.append(srt.Device("cuda:0"))
    except srt.StreamRTError as exc:  # no cuda-bindings, no driver, no GPU
        print(f"cuda:0 skipped: {exc}")
    return found


if __name__ == "__main__":
    for dev in devices(sys.argv[1:]):
        run(dev)
