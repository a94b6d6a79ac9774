"""Dynamic shared memory (``shared_mem=``, ``cudaLaunchKernel``'s sharedMem): a kernel's
``extern __shared__`` array sized by the launch, eagerly, in captured graphs and in kernel nodes
and their updates, on cpu (the emulator) and cuda (NVRTC; past 48 KiB the function is opted in
with ``cuFuncSetAttribute``, as a CUDA program must)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt
from streamrt import emu
from streamrt.kernel import MAX_SHARED_MEM

needs_gxx = pytest.mark.skipif(emu.unavailable() is not None,
                               reason=f"the CUDA C emulator needs g++: {emu.unavailable()}")

# each block reverses its part of x through a dynamic shared tile of blockDim.x ints; the tile
# starts at word ``skip`` of the dynamic shared memory, so a launch may ask for more than it uses
REVERSE = r"""
extern "C" __global__ void reverse_tiles(int* x, int skip) {
  extern __shared__ int smem[];
  int* tile = smem + skip;
  const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  tile[t] = x[i];
  __syncthreads();
  x[i] = tile[blockDim.x - 1 - t];
}
"""
reverse = srt.cuda_kernel(REVERSE, "reverse_tiles", signature="ptr, i32")


def _reversed_tiles(x: np.ndarray, block: int) -> np.ndarray:
    return x.reshape(-1, block)[:, ::-1].reshape(-1)


def _device(a: np.ndarray) -> int:
    p = srt.malloc(a.nbytes)
    srt.memcpy(p, a, a.nbytes)
    return p


def _host(p: int, n: int) -> np.ndarray:
    out = np.empty(n, np.int32)
    srt.memcpy(out, p, out.nbytes)
    return out


@needs_gxx
@pytest.mark.parametrize("order", ["forward", "behind"])
def test_a_launch_sizes_the_extern_shared_array(any_dev, monkeypatch, order):
    monkeypatch.setenv(emu.ORDER_ENV, order)
    x = np.arange(512, dtype=np.int32)
    p, s = _device(x), srt.Stream(any_dev)
    s.launch(reverse, p, 0, grid=4, block=128, shared_mem=128 * 4)
    assert np.array_equal(_host(p, x.size), _reversed_tiles(x, 128))
    # past 48 KiB: the tile at the end of 64 KiB (cuda opts the function in first)
    skip = (64 << 10) // 4 - 128
    s.launch(reverse, p, skip, grid=4, block=128, shared_mem=64 << 10)
    assert np.array_equal(_host(p, x.size), x)
    srt.free(p)


@needs_gxx
def test_captured_and_explicit_nodes_keep_their_shared_memory(any_dev):
    x = np.arange(256, dtype=np.int32)
    p, s = _device(x), srt.Stream(any_dev)
    s.begin_capture()
    s.launch(reverse, p, 0, grid=2, block=128, shared_mem=512)
    g = s.end_capture()
    (node,) = g.nodes()
    assert node.params["shared_mem"] == 512 and "shared_mem=512" in repr(node)
    ge = g.instantiate()
    ge.launch(s)
    assert np.array_equal(_host(p, x.size), _reversed_tiles(x, 128))
    # an explicit node, then new parameters: another block size and tile offset, more memory
    g2 = srt.Graph()
    n2 = g2.add_kernel_node(reverse, p, 0, grid=2, block=128, shared_mem=512)
    ge2 = g2.instantiate()
    ge2.launch(s)
    assert np.array_equal(_host(p, x.size), x)
    ge2.set_kernel_node_params(n2, p, 64, grid=4, block=64, shared_mem=(64 + 64) * 4)
    ge2.launch(s)
    assert np.array_equal(_host(p, x.size), _reversed_tiles(x, 64))
    s.synchronize()
    srt.free(p)


@srt.kernel
def note_shared(ctx, out):
    """out[0] = the launch's dynamic shared memory (a Python kernel sees it as ctx.shared_mem)."""
    ctx.array(out, (1,), np.int64)[0] = ctx.shared_mem


def test_a_python_kernel_sees_the_launch_shared_mem(dev):
    p, s = srt.malloc(8), srt.Stream(dev)
    for n in (0, 1000, 0):
        s.launch(note_shared, p, shared_mem=n)
        out = np.empty(1, np.int64)
        srt.memcpy(out, p, 8)
        assert out[0] == n
    srt.free(p)


@pytest.mark.parametrize("bad, err", [
    (-1, srt.InvalidValueError), (MAX_SHARED_MEM + 1, srt.InvalidValueError),
    (1.5, srt.InvalidTypeError), ("64", srt.InvalidTypeError), (True, srt.InvalidTypeError),
])
def test_a_bad_shared_mem_is_refused_where_it_is_given(dev, bad, err):
    s, p = srt.Stream(dev), srt.malloc(8)
    with pytest.raises(err, match="shared_mem"):
        s.launch(note_shared, p, shared_mem=bad)
    g = srt.Graph()
    with pytest.raises(err, match="shared_mem"):
        g.add_kernel_node(note_shared, p, shared_mem=bad)
    node = g.add_kernel_node(note_shared, p)
    ge = g.instantiate()
    with pytest.raises(err, match="shared_mem"):
        ge.set_kernel_node_params(node, p, shared_mem=bad)
    ge.launch(s)  # nothing changed by the refusals
    out = np.full(1, -1, np.int64)
    srt.memcpy(out, p, 8)
    assert out[0] == 0
    srt.free(p)
