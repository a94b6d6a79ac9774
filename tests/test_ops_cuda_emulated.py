"""The operators' CUDA C kernels themselves, run on the CPU by an emulator (opt-in, no GPU needed).

test_ops_cuda checks the cuda planners against numpy *models* of the kernels; its GPU tests, the
only ones running the CUDA C, skip without a GPU. Here ``tests/cuda_emu`` compiles each kernel's
real source with g++ and runs its launches on the CPU (see ``emu.py`` for what that does and does
not model), and test_ops_cuda's GPU test bodies run unchanged on cpu:0: its cases, its
:class:`GpuSession` and its checks against numpy, with the cuda planners and every launch routed
to the emulator through the ``monkeypatch`` fixture (undone after each test). A deliberately
broken kernel must fail, to show that the check can fail.

Opt-in, as it takes minutes (g++ builds are cached in ``$STREAMRT_CACHE_DIR/emu``)::

    STREAMRT_CUDA_EMU=1 python -m pytest tests/test_ops_cuda_emulated.py
"""

from __future__ import annotations

import os

import pytest

from streamrt.ops.cuda import KERNELS

from . import test_ops_cuda as T
from .cuda_emu import emu


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
