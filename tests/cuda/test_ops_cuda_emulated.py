"""The operators' CUDA C kernels themselves, run on the CPU by an emulator (opt-in, no GPU needed).

test_ops_cuda checks the cuda planners against numpy *models* of the kernels; its GPU tests, the
only ones running the CUDA C, skip without a GPU. Here ``tests/cuda/emu`` compiles each kernel's
real source with g++ and runs its launches on the CPU (see ``emu.py`` for what that does and does
not model), and test_ops_cuda's GPU test bodies run unchanged on cpu:0: its cases, its
:class:`GpuSession` and its checks against numpy, with the cuda planners and every launch routed
to the emulator through the ``monkeypatch`` fixture (undone after each test). A deliberately
broken kernel must fail, to show that the check can fail.

The emulator runs a block's threads in one interleaving per *order* (``emu.ORDERS``): the cases
run in the default ``forward`` order, and the kernels with barriers and shuffles again in every
other order, which is what catches a block barrier missing between shared-memory accesses that
warp shuffles separate (``forward`` moves the warps in lockstep, hiding it). Set
``STREAMRT_EMU_ORDER`` (e.g. ``behind`` or ``random:7``) to run the whole file in another order.

Opt-in, as it takes minutes (g++ builds are cached in ``$STREAMRT_CACHE_DIR/emu``)::

    STREAMRT_CUDA_EMU=1 python -m pytest tests/cuda/test_ops_cuda_emulated.py
"""

from __future__ import annotations

import ctypes
import os

import pytest

from streamrt.ops.cuda import KERNELS
from streamrt.ops.cuda.norm import LAYER_NORM, SOFTMAX
from streamrt.ops.cuda.reduce import RSUM
from streamrt.ops.cuda.scan import SCAN
from tests.cuda.emu import emu

from . import test_ops_cuda as T


def _skip_reason() -> str | None:
    if os.environ.get("STREAMRT_CUDA_EMU") != "1":
        return ("the CUDA emulator tests are opt-in: set STREAMRT_CUDA_EMU=1 to run them "
                "(they need g++ with C++20 and <ucontext.h>)")
    return emu.unavailable()


SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

CASES = {c[0]: c for c in T.GPU_CASES}  # e.g. "mm-splitk-float32": every op, every dtype


class EmuSession(T.GpuSession):
    """test_ops_cuda's GpuSession, on cpu:0."""

    def __init__(self) -> None:
        super().__init__("cpu:0")


@pytest.fixture(scope="module")
def built():
    """Every kernel compiled (or found in the cache) up front, on all cores."""
    emu.build_all(KERNELS.values())


@pytest.fixture
def gpu(built, monkeypatch):
    """What test_ops_cuda's ``gpu`` fixture gives, on cpu:0 with launches routed to the emulator."""
    emu.route(monkeypatch, KERNELS.values())
    g = EmuSession()
    yield g
    g.close()  # before monkeypatch's teardown: kernels still queued run on the emulator


@pytest.mark.parametrize("layout", ["c", "T", "s"])
@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_numpy(gpu, name, layout):
    T.test_gpu_op_matches_numpy(gpu, CASES[name], layout)


@pytest.mark.parametrize("name", [n for n in CASES if n.endswith("float32")])
def test_repeatable_executor_with_new_addresses(gpu, name):
    T.test_gpu_repeatable_executor_with_new_addresses(gpu, CASES[name])


def test_executor_cache_hit_reuses_the_cuda_plan(gpu):
    T.test_gpu_executor_cache_hit_reuses_the_cuda_plan(gpu)


@pytest.mark.parametrize("cap", [1, None])
@pytest.mark.parametrize("name", ["sum-rows-float64", "sum-cols-float32", "cumsum-long-float32",
                                  "softmax-stride-float64", "ln-2d-float16", "mm-batch-float32"])
def test_result_does_not_depend_on_the_grid_cap(gpu, monkeypatch, name, cap):
    """One block, and the whole grid: the grid-stride loops make the cap safe."""
    emu.route(monkeypatch, KERNELS.values(), cap)
    T.test_gpu_op_matches_numpy(gpu, CASES[name], "c")


def test_a_broken_kernel_fails(gpu, monkeypatch):
    """Split-K's reduction skipping its last partial product (an off-by-one) must be caught."""
    k = KERNELS["srt_mm_reduce_f32"]
    loop = "for (i64 p = 0; p < splits; ++p)"
    assert loop in k.cuda_source, "the mutated loop is gone: pick another mutation"
    monkeypatch.setattr(k, "cuda_source", k.cuda_source.replace(loop, loop.replace("splits", "splits - 1")))
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        T.test_gpu_op_matches_numpy(gpu, CASES["mm-splitk-float32"], "c")


# The kernels with __syncthreads or shuffles (block reductions, block scan, tiled matmul), each in
# a case with several jobs per block (grid-stride), so that a job's shared memory is reused.
SCHEDULED = ["sum-rows-float32", "softmax-float32", "ln-float64", "mm-float32", "mm-splitk-float32",
             "cumsum-long-float32", "cumsum-flat-float64"]
ORDERS = ["reverse", "ahead", "behind", "random:1"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", SCHEDULED)
def test_result_does_not_depend_on_the_schedule(gpu, monkeypatch, name, order):
    """Warps drifting apart (ahead, behind, random), threads and blocks in reverse: same result."""
    emu.route(monkeypatch, KERNELS.values(), order=order)
    T.test_gpu_op_matches_numpy(gpu, CASES[name], "c")


# Barriers whose removal the default order misses (mutation-tested): each separates the readers
# of shared memory from the next writers across warp shuffles, so it matters only once warps
# drift apart. (kernels, the barrier with its context, the context without it, case, order)
_SUM_LEAD = "  v = srt_warp_sum(v);\n  __syncthreads();\n"
_MAX_LEAD = "  v = srt_warp_max(v);\n  __syncthreads();\n"
_SCAN_LEAD = "    __syncthreads();  // the previous job's readers of sh are done\n"
MISSING_BARRIERS = {
    # every warp uses the row mean of the first block_sum: a warp left behind reads the next one
    "block_sum-ahead": ([LAYER_NORM["stats_rows", "f32"]], _SUM_LEAD, "  v = srt_warp_sum(v);\n",
                        "ln-float32", "ahead"),
    # only thread 0 writes a row's sum (or max): warp 0 must be the one left behind
    "block_sum-behind": ([RSUM["rows", "f32", "f32"]], _SUM_LEAD, "  v = srt_warp_sum(v);\n",
                         "sum-rows-float32", "behind"),
    "block_max-behind": ([SOFTMAX["stats_rows", "f32"]], _MAX_LEAD, "  v = srt_warp_max(v);\n",
                         "softmax-float32", "behind"),
    "scan-random": ([SCAN["rows", "f32", "f32"]], _SCAN_LEAD, "",
                    "cumsum-long-float32", "random:1"),
}


@pytest.mark.parametrize("which", list(MISSING_BARRIERS))
def test_a_missing_barrier_fails_in_another_order(gpu, monkeypatch, which):
    kernels, barrier, without, name, order = MISSING_BARRIERS[which]
    for k in kernels:
        assert barrier in k.cuda_source, "the barrier is gone: pick another mutation"
        monkeypatch.setattr(k, "cuda_source", k.cuda_source.replace(barrier, without))
    emu.route(monkeypatch, KERNELS.values(), order=order)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        T.test_gpu_op_matches_numpy(gpu, CASES[name], "c")


def test_a_shared_array_too_small_fails(gpu, monkeypatch):
    """A __shared__ array one short (8 warps, 7 slots), indexed through srt_block_sum's pointer:
    the bounds checks stop the launch, which would otherwise corrupt memory unseen or crash."""
    k = RSUM["rows", "f32", "f32"]
    decl = "__shared__ A sh[32];"
    assert decl in k.cuda_source, "the declaration is gone: pick another mutation"
    monkeypatch.setattr(k, "cuda_source", k.cuda_source.replace(decl, "__shared__ A sh[7];"))
    with pytest.raises(Exception, match="out of the bounds of a fixed-size array"):
        T.test_gpu_op_matches_numpy(gpu, CASES["sum-rows-float32"], "c")


# One block of 64 threads (two warps) logs each thread's three steps: before a shuffle, after it,
# after __syncthreads; an entry is block * 1000 + step * 100 + thread.
_PROBE = r"""
extern "C" __global__ void srt_emu_probe(int* log, int* n) {
  const int t = threadIdx.x, b = blockIdx.x * 1000;
  log[(*n)++] = b + t;
  log[(*n)++] = b + 100 + __shfl_xor_sync(0xffffffffu, t, 1) - (t ^ 1) + t;
  __syncthreads();
  log[(*n)++] = b + 200 + t;
}
"""


def _probe(order: str | None, blocks: int = 1) -> list[int]:
    lib = emu.build_source(_PROBE, "srt_emu_probe")
    log, n = (ctypes.c_int * (192 * blocks))(), ctypes.c_int(0)
    args = [ctypes.c_void_p(ctypes.addressof(log)), ctypes.c_void_p(ctypes.addressof(n))]
    params = (ctypes.c_void_p * 2)(*[ctypes.addressof(a) for a in args])
    lib.launch(params, blocks, 1, 1, 64, order=order)
    assert n.value == 192 * blocks
    return list(log)


def test_orders_interleave_as_documented(monkeypatch):
    w0, w1 = range(32), range(32, 64)
    step = lambda s, ts: [s * 100 + t for t in ts]  # noqa: E731
    lockstep = step(0, range(64)) + step(1, range(64)) + step(2, range(64))
    assert _probe("forward") == lockstep
    assert _probe("reverse") == [x for s in range(3) for x in reversed(step(s, range(64)))]
    ahead = step(0, w0) + step(1, w0) + step(0, w1) + step(1, w1) + step(2, w0) + step(2, w1)
    assert _probe("ahead") == ahead
    behind = [x for ts in (w1, w0) for s in (0, 1) for x in step(s, reversed(ts))]
    assert _probe("behind") == behind + step(2, reversed(w1)) + step(2, reversed(w0))
    rnd = _probe("random:1")
    assert rnd == _probe("random:1") != _probe("random:2")
    assert sorted(rnd) == sorted(lockstep) and rnd != lockstep
    for t in range(64):  # each thread's steps in program order, every step 0 before any step 2
        assert rnd.index(t) < rnd.index(100 + t) < rnd.index(200 + t)
    assert max(rnd.index(t) for t in range(64)) < min(rnd.index(200 + t) for t in range(64))
    # blocks: grid order, reversed, shuffled; the default comes from the environment
    firsts = lambda log: [x // 1000 for x in log[::192]]  # noqa: E731
    assert firsts(_probe("forward", 3)) == [0, 1, 2]
    assert firsts(_probe("behind", 3)) == [2, 1, 0]
    assert sorted(firsts(_probe("random:3", 3))) == [0, 1, 2]
    monkeypatch.setenv(emu.ORDER_ENV, "ahead")
    assert _probe(None) == ahead


@pytest.mark.parametrize("spec", ["sideways", "forward:1", "random:x", "random:"])
def test_an_unknown_order_is_refused(spec):
    with pytest.raises(ValueError, match="emulator order"):
        emu.parse_order(spec)
