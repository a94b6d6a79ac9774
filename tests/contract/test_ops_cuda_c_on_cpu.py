"""The seven operators' CUDA C on the cpu backend (``ops.use_cuda_c()``, ``$STREAMRT_OPS_CUDA_C``):
phase 1 plans with the cuda planners and phase 2 launches their CUDA C kernels, which the CUDA C
emulator runs, so ``make test`` checks the GPU code against numpy without a GPU. One case per
operator in float32, a float16 and a float64 one; ``make test-emu`` runs every case, layout and
schedule order.
"""

from __future__ import annotations

import importlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import streamrt as srt
from streamrt import emu, ops
from streamrt.backends.cpu.device import CpuDevice
from tests.conftest import _run

pytestmark = pytest.mark.skipif(emu.unavailable() is not None,
                                reason=f"the CUDA C emulator needs g++: {emu.unavailable()}")


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, w, b):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


# (id, op, input shapes, attrs, float64 reference, dtype)
CASES = [
    ("add-bcast", ops.add, [(40, 37), (37,)], {"alpha": 0.5}, lambda x, y: x + 0.5 * y, np.float32),
    ("mul", ops.mul, [(2, 3, 4, 5), (2, 3, 4, 5)], {}, lambda x, y: x * y, np.float32),
    ("sum-rows", ops.reduce_sum, [(3, 3000)], {"axis": 1}, lambda x: x.sum(axis=1), np.float32),
    ("softmax", ops.softmax, [(16, 300)], {}, lambda x: _softmax(x, -1), np.float32),
    ("layer-norm", ops.layer_norm, [(16, 200), (200,), (200,)], {}, _layer_norm, np.float32),
    ("matmul", ops.matmul, [(33, 70), (70, 45)], {}, np.matmul, np.float32),
    ("matmul-splitk", ops.matmul, [(8, 4096), (4096, 8)], {}, np.matmul, np.float32),
    ("cumsum", ops.cumsum, [(3, 1000)], {"axis": 1}, lambda x: np.cumsum(x, axis=1), np.float32),
    ("add-f16", ops.add, [(20, 30), (20, 30)], {}, lambda x, y: x + y, np.float16),
    ("softmax-f64", ops.softmax, [(4, 500)], {}, lambda x: _softmax(x, -1), np.float64),
]
TOL = {np.float16: 2e-2, np.float32: 1e-4, np.float64: 1e-10}


@pytest.fixture
def cuda_c():
    """The operators plan their CUDA C on cpu for the test (the previous setting restored)."""
    was = ops.use_cuda_c(True)
    yield
    ops.use_cuda_c(was)


@pytest.fixture
def emulated(monkeypatch):
    """The names of the CUDA C kernels launched on cpu devices during the test, in order."""
    names: list[str] = []
    real = CpuDevice.launch_cuda_c

    def counting(self, ctx, source, name, *rest):
        names.append(name)
        return real(self, ctx, source, name, *rest)

    monkeypatch.setattr(CpuDevice, "launch_cuda_c", counting)
    return names


def _inputs(case, seed=0):
    _, op, shapes, attrs, ref, dt = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(sh).astype(dt) for sh in shapes]
    return arrays, np.asarray(ref(*(a.astype(np.float64) for a in arrays)))


@pytest.fixture(scope="module")
def built():
    """Every kernel the cases plan, built up front on all cores (cached on disk after)."""
    was = ops.use_cuda_c(True)
    try:
        kernels = {}
        for case in CASES:
            arrays, want = _inputs(case)
            ts = [srt.Tensor.from_numpy(a) for a in arrays]
            out = srt.Tensor.from_numpy(np.zeros(want.shape, case[5]))
            _, ex = case[1].get_workspace_size(*ts, out, **case[3])
            kernels.update({k.name: k for k, *_ in ex._fn.__self__.steps})  # the Program's
            ex.destroy()
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(lambda k: emu.library(k.cuda_source, k.name), kernels.values()))
    finally:
        ops.use_cuda_c(was)
    return kernels


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_cuda_c_of_each_operator_matches_numpy_on_cpu(dev, built, cuda_c, emulated, case):
    arrays, want = _inputs(case)
    s = srt.Stream(dev)
    ts = [srt.Tensor.from_numpy(a, stream=s) for a in arrays]
    out = srt.Tensor.from_numpy(np.zeros(want.shape, case[5]))
    ops.run(case[1], *ts, out, stream=s, **case[3])
    got = out.numpy(s).astype(np.float64)
    tol = TOL[case[5]]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))
    assert emulated and all(n.startswith("srt_") for n in emulated)  # the CUDA C ran


def test_a_missing_barrier_in_an_operator_kernel_shows_in_some_order(dev, built, cuda_c,
                                                                     monkeypatch):
    # softmax's block reductions without the barrier between the warps' partial results and
    # their reading: right while the warps move in lockstep, wrong where one runs ahead
    k = built["srt_softmax_stats_rows_f32"]
    barrier = "if (lane == 0) sh[warp] = v;\n  __syncthreads();"
    assert k.cuda_source.count(barrier) == 2
    broken = srt.cuda_kernel(k.cuda_source.replace(barrier, "if (lane == 0) sh[warp] = v;"),
                             k.name, signature=k.signature)
    monkeypatch.setattr(k, "fn", broken.fn)
    x = np.random.default_rng(3).standard_normal((16, 300)).astype(np.float32)
    want = _softmax(x.astype(np.float64), -1)
    wrong = {}
    for order in ("forward", "ahead", "behind"):
        monkeypatch.setenv(emu.ORDER_ENV, order)
        s = srt.Stream(dev)
        out = srt.Tensor.from_numpy(np.zeros(x.shape, np.float32))
        ops.run(ops.softmax, srt.Tensor.from_numpy(x, stream=s), out, stream=s)
        wrong[order] = not np.allclose(out.numpy(s), want, rtol=1e-4, atol=1e-4)
    assert any(wrong.values()), wrong


def test_the_setting_switches_plans_and_cached_executors(dev, built, emulated):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = srt.Stream(dev)
    cache = ops.ExecutorCache()
    x, y = srt.Tensor.from_numpy(a, stream=s), srt.Tensor.from_numpy(a, stream=s)
    out = srt.Tensor.from_numpy(np.zeros_like(a))
    was = ops.use_cuda_c(False)
    try:
        ops.run(ops.add, x, y, out, stream=s, cache=cache)
        s.synchronize()
        assert emulated == []  # the Python kernels
        assert ops.use_cuda_c(True) is False
        ops.run(ops.add, x, y, out, stream=s, cache=cache)  # not the cached Python plan
        s.synchronize()
        assert emulated == ["srt_add_contig_f32"]
        np.testing.assert_array_equal(out.numpy(s), 2 * a)
        assert ops.use_cuda_c(False) is True
        ops.run(ops.add, x, y, out, stream=s, cache=cache)
        s.synchronize()
        assert emulated == ["srt_add_contig_f32"]
    finally:
        ops.use_cuda_c(was)
    with pytest.raises(srt.InvalidTypeError, match="use_cuda_c"):
        ops.use_cuda_c("yes")


def test_mixed_dtypes_are_refused_by_the_cuda_c_plans(dev, cuda_c):
    x = srt.Tensor.from_numpy(np.ones(4, np.float32))
    y = srt.Tensor.from_numpy(np.ones(4, np.float64))
    with pytest.raises(srt.ExecutorError, match="use_cuda_c"):
        ops.add.get_workspace_size(x, y, srt.Tensor.from_numpy(np.zeros(4, np.float64)))


def test_the_environment_turns_it_on(built):
    r = _run("""
        import numpy as np, streamrt as srt
        from streamrt import ops
        from streamrt.backends.cpu.device import CpuDevice
        seen = []
        real = CpuDevice.launch_cuda_c
        CpuDevice.launch_cuda_c = lambda self, ctx, src, name, *r: (seen.append(name),
                                                                    real(self, ctx, src, name, *r))
        a = srt.Tensor.from_numpy(np.arange(5.0, dtype=np.float32))
        o = srt.Tensor.from_numpy(np.zeros(5, np.float32))
        ops.run(ops.mul, a, a, o)
        assert o.numpy().tolist() == [0, 1, 4, 9, 16], o.numpy()
        print(seen)
        """, STREAMRT_OPS_CUDA_C="1")
    assert r.returncode == 0, r.stderr
    assert "srt_mul_contig_f32" in r.stdout


def test_without_gxx_turning_it_on_says_what_to_install(monkeypatch):
    build = importlib.import_module("streamrt.emu.build")
    monkeypatch.setenv("PATH", "/nonexistent")
    build._unavailable.cache_clear()
    try:
        was = ops.use_cuda_c(False)
        with pytest.raises(srt.BackendUnavailableError, match="g\\+\\+"):
            ops.use_cuda_c(True)
        assert ops.use_cuda_c(was) is False  # the refusal changed nothing
    finally:
        monkeypatch.undo()
        build._unavailable.cache_clear()
