"""The CUDA operator implementations (issue 8): compile, plan and (on a GPU) run.

Three layers, the first two need no GPU:

1. every CUDA kernel of every operator compiles with NVRTC for sm_90 and sm_80;
2. the cuda planners, pure functions of metadata, are run against a *recording stream* and
   *fake memory*: the recorded launches are checked against their CUDA signatures and the launch
   limits, every workspace pointer must start a region of the plan's layout inside the exact
   workspace, and then the launches are executed by numpy models of the kernels (written from
   the kernels' C parameter lists) to check that the plumbing (levels, offsets, strides, packing,
   dtypes) computes the operator. These doubles test our planner; they do not pretend to be a
   GPU, and they cannot find a bug inside the CUDA C itself (``test_ops_cuda_emulated.py``
   can: with ``STREAMRT_CUDA_EMU=1`` it runs the real CUDA C, built with g++, on the CPU);
3. ``@pytest.mark.cuda`` tests run the operators on a real device against numpy (they skip, with
   the reason, where no GPU is usable).
"""

from __future__ import annotations

import ctypes
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import ops
from streamrt.backends.cuda import nvrtc as srt_nvrtc
from streamrt.errors import ExecutorError
from streamrt.kernel import dim3
from streamrt.ops.cuda import KERNELS
from streamrt.ops.cuda import matmul as cu_matmul
from streamrt.ops.cuda import reduce as cu_reduce
from streamrt.ops.cuda import scan as cu_scan
from streamrt.ops.cuda.common import SMALL, contiguous_strides
from streamrt.tensor import TensorDesc
from tests.conftest import cuda_reason

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = (F16, F32, F64)
ACC = {F16: F32, F32: F32, F64: F64}
TOL = {F16: 1e-2, F32: 1e-4, F64: 1e-10}
TOKEN = {"f16": F16, "f32": F32, "f64": F64}


# -- 1. compilation -------------------------------------------------------------------------------
def _nvrtc_reason() -> str | None:
    try:
        import cuda.bindings  # noqa: F401
    except ImportError as exc:
        return f"cuda-bindings is not installed: {exc}"
    return srt_nvrtc.nvrtc_available()


@pytest.fixture(scope="module")
def nvrtc_cache(tmp_path_factory):
    """A private NVRTC disk cache for the module (the user's cache is left alone)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STREAMRT_CACHE_DIR", str(tmp_path_factory.mktemp("nvrtc")))
        yield


def test_every_operator_has_cuda_kernels():
    families = {name.split("_")[1] for name in KERNELS}
    assert families == {"copy", "add", "mul", "rsum", "softmax", "ln", "mm", "scan"}
    for name, k in KERNELS.items():
        assert k.name == name and k.signature is not None
        assert f'extern "C" __global__ void {name}(' in k.cuda_source
        srt_nvrtc.parse_signature(k.signature)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_cuda_kernel_compiles(arch, nvrtc_cache):
    reason = _nvrtc_reason()
    if reason is not None:
        pytest.skip(f"NVRTC is not usable here: {reason}")

    def build(k):
        try:
            cubin = srt_nvrtc.compile_cubin(k.cuda_source, k.name, arch)
        except srt.StreamRTError as exc:
            return f"{k.name}: {exc}"
        if not cubin.startswith(b"\x7fELF") or k.name.encode() not in cubin:
            return f"{k.name}: the CUBIN does not hold the function"
        return None

    with ThreadPoolExecutor(8) as pool:  # NVRTC releases the GIL: about 2x faster
        failures = [f for f in pool.map(build, KERNELS.values()) if f]
    assert not failures, "\n".join(failures)


# -- 2. planning with a recording stream and fake memory ------------------------------------------
class RecordingStream:
    """Records ``launch`` calls. A test double for the planner's enqueue: it runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def launch(self, kernel, *args, grid=1, block=1):
        self.calls.append((kernel, args, grid, block))


class FakeMemory:
    """Host bytes at made-up, well separated addresses; every access is bounds checked."""

    GAP = 1 << 24

    def __init__(self) -> None:
        self.blocks: list[tuple[int, np.ndarray]] = []
        self.next = 1 << 36

    def alloc(self, nbytes: int) -> int:
        base = self.next
        # an empty tensor still has an address inside its block (the workspace is never empty)
        self.blocks.append((base, np.zeros(max(nbytes, 1), np.uint8)))
        self.next += (nbytes // self.GAP + 2) * self.GAP
        return base

    def block_of(self, ptr: int) -> tuple[int, np.ndarray]:
        for base, buf in self.blocks:
            if base <= ptr < base + len(buf):
                return base, buf
        raise AssertionError(f"{hex(ptr)} is not inside any allocation")

    def array(self, ptr: int, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if count == 0:
            return np.empty(0, dtype)
        base, buf = self.block_of(ptr)
        off = ptr - base
        assert off % dtype.itemsize == 0, f"{hex(ptr)} is misaligned for {dtype}"
        end = off + count * dtype.itemsize
        assert end <= len(buf), f"{count} x {dtype} at {hex(ptr)} runs {end - len(buf)} B past its block"
        return buf[off:end].view(dtype)


def _offsets(n: int, nd: int, dims, *strides) -> list[np.ndarray]:
    """Element offsets of C-order indices 0..n-1 (dims innermost first), as srt_offsets computes."""
    idx = np.arange(n, dtype=np.int64)
    outs = [np.zeros(n, np.int64) for _ in strides]
    for d in range(nd):
        c = idx % dims[d]
        idx //= dims[d]
        for o, s in zip(outs, strides):
            o += c * s[d]
    return outs


def _gather(mem: FakeMemory, ptr: int, offs: np.ndarray, dt) -> tuple[np.ndarray, np.ndarray]:
    arr = mem.array(ptr, int(offs.max()) + 1 if offs.size else 0, dt)
    return arr, offs


def _acc_of(*toks: str) -> np.dtype:
    return F64 if "f64" in toks else F32


def run_model(mem: FakeMemory, kernel, args: tuple, grid, block) -> None:
    """Execute one recorded launch with a numpy model of its CUDA kernel."""
    parts = kernel.name.split("_")
    fam = parts[1]
    toks = [p for p in parts if p in TOKEN]
    T = TOKEN[toks[0]]
    a = list(args)

    def dims8(i):
        return a[i : i + 8]

    if fam == "copy":
        dst, src, n, nd = a[:4]
        od, os_ = _offsets(n, nd, dims8(4), dims8(12), dims8(20))
        d, _ = _gather(mem, dst, od, T)
        s, _ = _gather(mem, src, os_, T)
        d[od] = s[os_]
    elif fam in ("add", "mul"):
        out, x, y, n, alpha = a[:5]
        A = ACC[T]
        if parts[2] == "contig":
            oo = xo = yo = np.arange(n)
        else:
            oo, xo, yo = _offsets(n, a[5], dims8(6), dims8(14), dims8(22), dims8(30))
        xv = _gather(mem, x, xo, T)[0][xo].astype(A)
        yv = _gather(mem, y, yo, T)[0][yo].astype(A)
        r = xv + A.type(alpha) * yv if fam == "add" else xv * yv
        _gather(mem, out, oo, T)[0][oo] = r.astype(T)
    elif fam == "rsum":
        ti, to = TOKEN[toks[0]], TOKEN[toks[1]]
        A = _acc_of(*toks)
        if parts[2] == "rows":
            dst, src, rows, k, chunk, nc = a
            a_, b_ = rows, 1
        else:
            dst, src, a_, k, b_, chunk, nc = a
        x = mem.array(src, a_ * k * b_, ti).reshape(a_, k, b_).astype(A)
        d = mem.array(dst, a_ * nc * b_, to).reshape(a_, nc, b_)
        for c in range(nc):
            d[:, c] = x[:, c * chunk : min(k, (c + 1) * chunk)].sum(axis=1, dtype=A).astype(to)
    elif fam == "softmax":
        A = ACC[T]
        if parts[2] == "stats":
            mx, sm, x, a_, k, b_ = a
            xv = mem.array(x, a_ * k * b_, T).reshape(a_, k, b_).astype(A)
            m = xv.max(axis=1)
            mem.array(mx, a_ * b_, A)[:] = m.reshape(-1)
            mem.array(sm, a_ * b_, A)[:] = np.exp(xv - m[:, None]).sum(axis=1).reshape(-1)
        else:
            out, x, mx, sm, n, k, b_ = a
            a_ = n // (k * b_)
            xv = mem.array(x, n, T).reshape(a_, k, b_).astype(A)
            m = mem.array(mx, a_ * b_, A).reshape(a_, 1, b_)
            s = mem.array(sm, a_ * b_, A).reshape(a_, 1, b_)
            mem.array(out, n, T)[:] = (np.exp(xv - m) / s).astype(T).reshape(-1)
    elif fam == "ln":
        A = ACC[T]
        if parts[2] == "stats":
            mean, rstd, x, rows, n, eps = a
            xv = mem.array(x, rows * n, T).reshape(rows, n).astype(A)
            mu = xv.sum(axis=1, dtype=A) / A.type(n)
            q = ((xv - mu[:, None]) ** 2).sum(axis=1, dtype=A)
            mem.array(mean, rows, A)[:] = mu
            mem.array(rstd, rows, A)[:] = 1 / np.sqrt(q / A.type(n) + A.type(eps))
        else:
            out, x, w, b, mean, rstd, total, n = a
            rows = total // n
            v = mem.array(x, total, T).reshape(rows, n).astype(A)
            v = (v - mem.array(mean, rows, A)[:, None]) * mem.array(rstd, rows, A)[:, None]
            if w:
                v = v * mem.array(w, n, T).astype(A)
            if b:
                v = v + mem.array(b, n, T).astype(A)
            mem.array(out, total, T)[:] = v.astype(T).reshape(-1)
    elif fam == "mm":
        A = ACC[T]
        if parts[2] == "reduce":
            out, part, splits, nbatch, m, n, om, on, bnd = a[:9]
            total = nbatch * m * n
            p = mem.array(part, splits * total, A).reshape(splits, nbatch, m, n).sum(axis=0, dtype=A)
            (oz,) = _offsets(nbatch, bnd, dims8(9), dims8(17))
            oi = oz[:, None, None] + np.arange(m)[:, None] * om + np.arange(n) * on
            _gather(mem, out, oi.reshape(-1), T)[0][oi] = p.astype(T)
            return
        dst, ap, bp, m, n, k, ksplit, nbatch, am, ak, bk, bn, om, on, bnd = a[:15]
        az, bz, oz = _offsets(nbatch, bnd, dims8(15), dims8(23), dims8(31), dims8(39))
        ai = az[:, None, None] + np.arange(m)[:, None] * am + np.arange(k) * ak
        bi = bz[:, None, None] + np.arange(k)[:, None] * bk + np.arange(n) * bn
        av = _gather(mem, ap, ai.reshape(-1), T)[0][ai].astype(A)
        bv = _gather(mem, bp, bi.reshape(-1), T)[0][bi].astype(A)
        splits = dim3(grid).y
        if parts[2] == "direct":
            assert splits == 1 and ksplit >= k
            oi = oz[:, None, None] + np.arange(m)[:, None] * om + np.arange(n) * on
            _gather(mem, dst, oi.reshape(-1), T)[0][oi] = np.matmul(av, bv).astype(T)
        else:
            d = mem.array(dst, splits * nbatch * m * n, A).reshape(splits, nbatch, m, n)
            for s in range(splits):
                k0, k1 = s * ksplit, min(k, (s + 1) * ksplit)
                d[s] = np.matmul(av[:, :, k0:k1], bv[:, k0:k1, :])
    elif fam == "scan":
        ti, to = TOKEN[toks[0]], TOKEN[toks[1]]
        A = _acc_of(*toks)
        if parts[2] == "add":
            dst, src, sums, total, ln, b_, chunk, nc = a
            a_ = total // (ln * b_)
            v = mem.array(src, total, ti).reshape(a_, ln, b_).astype(A)
            s = mem.array(sums, a_ * nc * b_, A).reshape(a_, nc, b_)
            for c in range(1, nc):
                v[:, c * chunk : (c + 1) * chunk] += s[:, c - 1 : c]
            mem.array(dst, total, to)[:] = v.astype(to).reshape(-1)
            return
        if parts[2] == "rows":
            dst, sums, src, rows, ln, nc = a
            a_, b_, chunk = rows, 1, dim3(block, "block").x * cu_scan.ITEMS
        else:
            dst, sums, src, a_, ln, b_, chunk, nc = a
        x = mem.array(src, a_ * ln * b_, ti).reshape(a_, ln, b_).astype(A)  # read before writing
        d = mem.array(dst, a_ * ln * b_, to).reshape(a_, ln, b_)
        tot = mem.array(sums, a_ * nc * b_, A).reshape(a_, nc, b_) if sums else None
        for c in range(nc):
            seg = np.cumsum(x[:, c * chunk : min(ln, (c + 1) * chunk)], axis=1, dtype=A)
            d[:, c * chunk : min(ln, (c + 1) * chunk)] = seg.astype(to)
            if tot is not None:
                tot[:, c] = seg[:, -1]
    else:  # pragma: no cover - a new family needs a model here
        raise AssertionError(f"no model for {kernel.name}")


def check_launches(calls: list, mem: FakeMemory, ws: int | None, size: int, regions: dict) -> None:
    """Signatures, launch limits, and workspace pointers at the start of a region inside it."""
    starts = {off for off, nbytes in regions.values() if nbytes}
    for kernel, args, grid, block in calls:
        assert KERNELS.get(kernel.name) is kernel, f"{kernel.name} is not a registered kernel"
        assert kernel.cuda_source and f'void {kernel.name}(' in kernel.cuda_source
        types = srt_nvrtc.parse_signature(kernel.signature)
        srt_nvrtc.pack_args(types, args)  # raises on a count, type or range mismatch
        g, b = dim3(grid), dim3(block, "block")
        threads = b.x * b.y * b.z
        assert threads <= 1024 and threads % 32 == 0, (kernel.name, block)
        assert g.x < 2**31 and g.y < 65536 and g.z < 65536, (kernel.name, grid)
        for t, v in zip(types, args):
            if t is not ctypes.c_void_p or v == 0:
                continue
            base, _ = mem.block_of(v)
            if base == ws:
                assert ws <= v < ws + size, (kernel.name, v - ws, size)
                assert v - ws in starts, f"{kernel.name}: {v - ws} starts no region of {regions}"


class Fake:
    """A tensor in fake memory: a desc, its pointer, and host access through its strides."""

    def __init__(self, mem: FakeMemory, desc: TensorDesc, fill: str, rng) -> None:
        self.desc = desc
        # an empty tensor's pointer (plus offset) is passed, never read: keep it inside the block
        self.ptr = mem.alloc(max(desc.storage_nbytes, desc._boff + desc.itemsize))
        self.mem = mem
        store = mem.array(self.ptr, desc.storage_nbytes // desc.itemsize, desc.dtype)
        store[:] = rng.uniform(-1, 1, store.size) if fill == "rand" else np.nan

    def get(self) -> np.ndarray:
        d = self.desc
        store = self.mem.array(self.ptr, d.storage_nbytes // d.itemsize, d.dtype)
        if d.numel == 0:
            return np.empty(d.shape, d.dtype)
        return np.lib.stride_tricks.as_strided(store[d.offset :], d.shape,
                                               tuple(s * d.itemsize for s in d.strides)).copy()


def desc_of(shape: tuple, dtype, layout: str = "c") -> TensorDesc:
    """``shape`` stored contiguously ("c"), transposed ("T"), every other element of the last
    axis after 3 ("s"), or broadcast along the first axis with a zero stride ("b", inputs only)."""
    shape = tuple(shape)
    if layout == "c" or not shape:
        return TensorDesc(shape, dtype)
    if layout == "T":
        return TensorDesc(shape, dtype, tuple(reversed(contiguous_strides(tuple(reversed(shape))))))
    if layout == "s":
        base = shape[:-1] + (2 * shape[-1] + 3,)
        st_ = contiguous_strides(base)
        return TensorDesc(shape, dtype, st_[:-1] + (2,), offset=3)
    assert layout == "b"
    st_ = contiguous_strides(shape)
    return TensorDesc(shape, dtype, (0,) + st_[1:])


def attrs_of(op, attrs: dict) -> dict:
    values = dict(op._defaults)
    for k, v in attrs.items():
        values[k] = op.attrs[k].check(op.name, k, v)
    return values


def plan_cuda(op, descs: list, **attrs):
    """The cuda plan of ``op`` for these descs, as phase 1 would make it on a cuda device."""
    n_in = len(op.inputs)
    return op._plan_for("cuda", descs[:n_in], descs[n_in:], attrs_of(op, attrs))


def simulate(op, descs: list, seed: int = 0, **attrs) -> tuple[list[np.ndarray], list[np.ndarray], object]:
    """Plan, record, check and run the launches on fake memory: (inputs, outputs, plan)."""
    rng = np.random.default_rng(seed)
    mem = FakeMemory()
    n_in = len(op.inputs)
    fakes = [None if d is None else Fake(mem, d, "rand" if i < n_in else "nan", rng)
             for i, d in enumerate(descs)]
    plan = plan_cuda(op, descs, **attrs)
    size = plan.workspace_size
    ws = mem.alloc(size) if size else None  # exactly the size: an overrun fails a bounds check
    rec = RecordingStream()
    plan.enqueue(rec, ws, [None if f is None else f.ptr for f in fakes])
    check_launches(rec.calls, mem, ws, size, plan.tiling.get("workspace", {}))
    for call in rec.calls:
        run_model(mem, *call)
    ins = [None if f is None else f.get() for f in fakes[:n_in]]
    return ins, [f.get() for f in fakes[n_in:]], plan


def close(got: np.ndarray, want: np.ndarray, dtype) -> None:
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL[np.dtype(dtype)],
                               atol=TOL[np.dtype(dtype)] * scale)


def f64(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else a.astype(np.float64)


# numpy references in float64 -----------------------------------------------------------------------
def ref_softmax(x, axis):
    if x.size == 0:
        return x.copy()
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_layer_norm(x, w, b, k, eps):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    r = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)
    if w is not None:
        r = r * w
    if b is not None:
        r = r + b
    return r


def ref_cumsum(x, axis):
    return np.cumsum(x.reshape(-1) if axis is None else x, axis=0 if axis is None else axis)


# simulated cases --------------------------------------------------------------------------------------
LAYOUTS = st.sampled_from(["c", "c", "T", "s"])
SHAPES = st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple)
NONEMPTY = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
DTYPE = st.sampled_from(DTYPES)
SIM = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SIM
@given(shape=SHAPES, drop=st.integers(0, 3), dt=DTYPE, lx=st.sampled_from(["c", "T", "s", "b"]),
       ly=st.sampled_from(["c", "T", "s", "b"]), lo=LAYOUTS, alpha=st.sampled_from([1.0, -0.5, 2.0]),
       name=st.sampled_from(["add", "mul"]))
def test_plan_binary_simulated(shape, drop, dt, lx, ly, lo, alpha, name):
    yshape = tuple(1 if i % 2 else d for i, d in enumerate(shape))[drop:]  # broadcast dims
    op = ops.OPS[name]
    attrs = {"alpha": alpha} if name == "add" else {}
    (x, y), (o,), plan = simulate(op, [desc_of(shape, dt, lx), desc_of(yshape, dt, ly),
                                       desc_of(shape, dt, lo)], **attrs)
    want = f64(x) + alpha * f64(y) if name == "add" else f64(x) * f64(y)
    close(o, want, dt)
    assert plan.workspace_size == 0


@SIM
@given(shape=SHAPES, data=st.data(), dt=DTYPE, lx=LAYOUTS, lo=LAYOUTS, keep=st.booleans())
def test_plan_reduce_sum_simulated(shape, data, dt, lx, lo, keep):
    axes = data.draw(st.none() | st.lists(st.integers(0, len(shape) - 1), unique=True).map(tuple))
    want = np.sum(np.zeros(shape), axis=axes, keepdims=keep).shape
    (x,), (o,), _ = simulate(ops.reduce_sum, [desc_of(shape, dt, lx), desc_of(want, dt, lo)],
                             axis=axes, keepdims=keep)
    close(o, np.sum(f64(x), axis=axes, keepdims=keep), dt)


@SIM
@given(shape=SHAPES, data=st.data(), dt=DTYPE, lx=LAYOUTS, lo=LAYOUTS)
def test_plan_softmax_simulated(shape, data, dt, lx, lo):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    (x,), (o,), _ = simulate(ops.softmax, [desc_of(shape, dt, lx), desc_of(shape, dt, lo)], axis=axis)
    close(o, ref_softmax(f64(x), axis), dt)


@SIM
@given(shape=NONEMPTY, data=st.data(), dt=DTYPE, lx=LAYOUTS, lo=LAYOUTS, lw=LAYOUTS,
       affine=st.sampled_from(["wb", "w", "b", ""]))
def test_plan_layer_norm_simulated(shape, data, dt, lx, lo, lw, affine):
    k = data.draw(st.integers(1, len(shape)))
    nshape = shape[len(shape) - k :]
    w = desc_of(nshape, dt, lw) if "w" in affine else None
    b = desc_of(nshape, dt, "c") if "b" in affine else None
    (x, wv, bv), (o,), _ = simulate(ops.layer_norm, [desc_of(shape, dt, lx), w, b, desc_of(shape, dt, lo)],
                                    normalized_ndim=k, eps=1e-5)
    close(o, ref_layer_norm(f64(x), f64(wv), f64(bv), k, 1e-5), dt)


@SIM
@given(m=st.integers(0, 20), n=st.integers(0, 20), k=st.integers(0, 40), dt=DTYPE,
       ba=st.sampled_from([(), (2,), (3, 1), (1, 2)]), bb=st.sampled_from([(), (2,), (1,), (3, 2)]),
       la=LAYOUTS, lb=LAYOUTS, lo=LAYOUTS)
def test_plan_matmul_simulated(m, n, k, dt, ba, bb, la, lb, lo):
    try:
        batch = np.broadcast_shapes(ba, bb)
    except ValueError:
        return
    (a, b), (o,), _ = simulate(ops.matmul, [desc_of(ba + (m, k), dt, la), desc_of(bb + (k, n), dt, lb),
                                            desc_of(batch + (m, n), dt, lo)])
    close(o, np.matmul(f64(a), f64(b)), dt)


@SIM
@given(shape=SHAPES, data=st.data(), dt=DTYPE, lx=LAYOUTS, lo=LAYOUTS)
def test_plan_cumsum_simulated(shape, data, dt, lx, lo):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    oshape = (math.prod(shape),) if axis is None else shape
    (x,), (o,), _ = simulate(ops.cumsum, [desc_of(shape, dt, lx), desc_of(oshape, dt, lo)], axis=axis)
    close(o, ref_cumsum(f64(x), axis), dt)


# the multi-level cases, too big for random shapes
@pytest.mark.parametrize(("shape", "axis", "dt", "levels"), [
    ((5000,), None, F32, 2),  # rows, then one rows chunk
    ((3, 70000), 1, F32, 2),  # 35 partials: still a rows level
    ((2, 5000, 3), 1, F64, 3),  # cols: 157 -> 5 -> 1
    ((2, 3000), 1, F16, 2),  # float16 through float32 partials
    ((4, 0, 3), 1, F32, 1),  # K == 0: zeros
    ((6, 7), (0, 1), F32, 1),  # all axes of a small tensor: one rows chunk (42 > SMALL)
    ((6, 20), 0, F32, 1),  # B > 1: one cols chunk
    ((3, 40, 5), (0, 2), F64, 1),  # packed (axes not adjacent), then one rows chunk
])
def test_plan_reduce_sum_levels(shape, axis, dt, levels):
    want = np.sum(np.zeros(shape), axis=axis).shape
    (x,), (o,), plan = simulate(ops.reduce_sum, [desc_of(shape, dt), desc_of(want, dt)], axis=axis)
    close(o, np.sum(f64(x), axis=axis), dt)
    assert plan.tiling["levels"] == levels


@pytest.mark.parametrize(("shape", "axis", "dt", "levels"), [
    ((3000,), None, F32, 2),
    ((40000,), 0, F64, 2),
    ((1_100_000,), None, F32, 3),  # rows: 1075 chunks -> 2 -> 1
    ((2, 50, 3), 1, F32, 2),  # cols
    ((5, 2000, 2), 1, F64, 3),  # cols: 63 -> 2 -> 1
    ((3, 2500), 1, F16, 2),  # float16 via the float32 buffer
    ((7, 1024), 1, F32, 1),  # exactly one rows chunk
])
def test_plan_cumsum_levels(shape, axis, dt, levels):
    oshape = (math.prod(shape),) if axis is None else shape
    (x,), (o,), plan = simulate(ops.cumsum, [desc_of(shape, dt), desc_of(oshape, dt)], axis=axis)
    close(o, ref_cumsum(f64(x), axis), dt)
    assert plan.tiling["levels"] == levels


@pytest.mark.parametrize(("ashape", "bshape", "dt", "splits"), [
    ((64, 4096), (4096, 32), F32, 16),
    ((2, 40, 3000), (3000, 8), F64, 11),
    ((3, 1500), (1500, 5), F16, 5),
    ((300, 2048), (2048, 300), F32, 1),  # enough tiles: no split
])
def test_plan_matmul_split_k(ashape, bshape, dt, splits):
    oshape = np.matmul(np.zeros(ashape), np.zeros(bshape)).shape
    (a, b), (o,), plan = simulate(ops.matmul, [desc_of(ashape, dt), desc_of(bshape, dt),
                                               desc_of(oshape, dt)])
    close(o, np.matmul(f64(a), f64(b)), dt)
    assert plan.tiling["splits"] == splits
    assert (plan.impl == "split_k") == (splits > 1)


@pytest.mark.parametrize(("shape", "axis", "stats"), [
    ((4, 1000), -1, "rows"),
    ((3, 7, 5), 1, "cols"),  # short rows
    ((2, 100, 3000), 1, "cols"),  # many rows along a strided axis
    ((2, 100, 3), 1, "rows"),  # few rows along a strided axis: a block per row
])
def test_plan_softmax_kinds(shape, axis, stats):
    (x,), (o,), plan = simulate(ops.softmax, [desc_of(shape, F32), desc_of(shape, F32)], axis=axis)
    close(o, ref_softmax(f64(x), axis), F32)
    assert plan.tiling["stats"] == stats


# exact workspace sizes: independent formulas for contiguous tensors ----------------------------------
def _total(sizes: list[int]) -> int:
    """Bytes of regions laid out in order, each starting on 64 bytes, the end rounded to the
    workspace alignment (8 bytes)."""
    off = end = 0
    for s in sizes:
        if s:
            end = off + s
            off += -(-s // 64) * 64
    return -(-end // 8) * 8


def ws_reduce(shape, axis, dt) -> int:
    """reduce_sum of a contiguous x over one axis or all: one (A, chunks, B) region per level
    but the last."""
    axes = tuple(range(len(shape))) if axis is None else (axis,)
    a_ = math.prod(shape[: axes[0]]) if shape else 1
    b_ = math.prod(shape[axes[-1] + 1 :]) if shape else 1
    k = math.prod(shape[i] for i in axes) if shape else 1
    if math.prod(shape) == 0 and k != 0:
        return 0
    sizes = []
    while True:
        chunk = cu_reduce.ROWS_CHUNK if b_ == 1 and k > SMALL else cu_reduce.COLS_CHUNK
        if k <= chunk:
            return _total(sizes)
        k = -(-k // chunk)
        sizes.append(a_ * k * b_ * ACC[dt].itemsize)


def ws_cumsum(shape, axis, dt) -> int:
    """cumsum of a contiguous x: nothing for one chunk, else (float16: a float32 copy of x, then)
    one (A, chunks, B) block-sums region per level but the top one."""
    n = math.prod(shape)
    if n == 0:
        return 0
    a_, ln, b_ = (1, n, 1) if axis is None else (
        math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))
    sizes = [n * 4] if dt == F16 else []
    first = True
    while True:
        chunk = cu_scan.level_kind(b_, ln)[1]
        nc = -(-ln // chunk)
        if nc == 1:
            return _total(sizes) if not first else 0
        sizes.append(a_ * nc * b_ * ACC[dt].itemsize)
        ln, first = nc, False


def ws_rows(shape, rows, dt) -> int:
    """softmax / layer_norm of contiguous tensors: two statistics per row."""
    return 0 if math.prod(shape) == 0 else _total([rows * ACC[dt].itemsize] * 2)


def ws_matmul(m, n, k, nbatch, dt) -> int:
    """matmul: the split-K partial products, when K is split."""
    splits, _ = cu_matmul.splits_for(m, n, k, nbatch)
    return 0 if splits == 1 or m * n * nbatch == 0 else _total(
        [splits * nbatch * m * n * ACC[dt].itemsize])


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 3000), min_size=1, max_size=3).map(tuple), dt=DTYPE,
       data=st.data())
def test_workspace_size_is_exact(shape, dt, data):
    if math.prod(shape) > 10**8:
        return
    axis = data.draw(st.none() | st.integers(0, len(shape) - 1))
    c = desc_of
    rshape = () if axis is None else shape[:axis] + shape[axis + 1 :]
    assert plan_cuda(ops.reduce_sum, [c(shape, dt), c(rshape, dt)], axis=axis).workspace_size == \
        ws_reduce(shape, axis, dt)
    oshape = (math.prod(shape),) if axis is None else shape
    assert plan_cuda(ops.cumsum, [c(shape, dt), c(oshape, dt)], axis=axis).workspace_size == \
        ws_cumsum(shape, axis, dt)
    ax = -1 if axis is None else axis
    rows = math.prod(shape) // max(shape[ax], 1)
    assert plan_cuda(ops.softmax, [c(shape, dt), c(shape, dt)], axis=ax).workspace_size == \
        ws_rows(shape, rows, dt)
    if shape[-1]:
        rows = math.prod(shape[:-1])
        ln = plan_cuda(ops.layer_norm, [c(shape, dt), c(shape[-1:], dt), None, c(shape, dt)])
        assert ln.workspace_size == ws_rows(shape, rows, dt)
    assert plan_cuda(ops.add, [c(shape, dt)] * 3, alpha=3.0).workspace_size == 0
    if len(shape) >= 2:
        m, k = shape[-2:]
        n = data.draw(st.integers(0, 300))
        batch = shape[:-2]
        mm = plan_cuda(ops.matmul, [c(shape, dt), c((k, n), dt), c(batch + (m, n), dt)])
        assert mm.workspace_size == ws_matmul(m, n, k, math.prod(batch), dt)


def test_workspace_grows_with_shape():
    def size(op, shape, oshape, **attrs):
        return plan_cuda(op, [desc_of(shape, F32), desc_of(oshape, F32)], **attrs).workspace_size

    assert size(ops.reduce_sum, (4, 2048), (4,), axis=1) == 0  # one chunk per row
    assert size(ops.reduce_sum, (4, 2049), (4,), axis=1) == 4 * 2 * 4
    assert size(ops.reduce_sum, (8, 4097), (8,), axis=1) == 8 * 3 * 4
    assert size(ops.softmax, (10, 3), (10, 3)) == 64 + 40
    assert size(ops.softmax, (20, 3), (20, 3)) == 128 + 80
    assert size(ops.cumsum, (1024,), (1024,), axis=0) == 0
    assert size(ops.cumsum, (1025,), (1025,), axis=0) == 8
    # strided tensors add their packed copies: x packed (f32 numel) before the statistics
    t = TensorDesc((10, 3), F32, (1, 10))
    assert plan_cuda(ops.softmax, [t, desc_of((10, 3), F32)]).workspace_size == 128 + 64 + 40


def test_mixed_dtypes_are_refused_on_cuda():
    with pytest.raises(ExecutorError) as info:
        plan_cuda(ops.add, [desc_of((3,), F32), desc_of((3,), F64), desc_of((3,), F64)])
    assert info.value.code == 161002 and "cuda" in str(info.value)
    # the cpu planner still takes them (it casts in the workspace)
    ops.add._plan_for("cpu", [desc_of((3,), F32), desc_of((3,), F64)], [desc_of((3,), F64)],
                      attrs_of(ops.add, {}))


def test_cuda_planner_validates_like_cpu():
    with pytest.raises(ExecutorError, match="do not broadcast"):
        plan_cuda(ops.mul, [desc_of((3,), F32), desc_of((4,), F32), desc_of((3,), F32)])
    with pytest.raises(ExecutorError, match="inner dimensions"):
        plan_cuda(ops.matmul, [desc_of((3, 4), F32), desc_of((5, 2), F32), desc_of((3, 2), F32)])
    with pytest.raises(ExecutorError, match="out has shape"):
        plan_cuda(ops.softmax, [desc_of((3, 4), F32), desc_of((4, 3), F32)])


def test_empty_outputs_launch_nothing():
    for op, descs, attrs in [
        (ops.add, [desc_of((0, 3), F32)] * 3, {}),
        (ops.reduce_sum, [desc_of((0, 3), F32), desc_of((0,), F32)], {"axis": 1}),
        (ops.softmax, [desc_of((2, 0), F32)] * 2, {}),
        (ops.layer_norm, [desc_of((0, 3), F32), None, None, desc_of((0, 3), F32)], {}),
        (ops.matmul, [desc_of((0, 3), F32), desc_of((3, 2), F32), desc_of((0, 2), F32)], {}),
        (ops.cumsum, [desc_of((0,), F32), desc_of((0,), F32)], {}),
    ]:
        plan = plan_cuda(op, descs, **attrs)
        rec = RecordingStream()
        plan.enqueue(rec, None, [1 << 40] * len(descs))
        assert plan.workspace_size == 0 and rec.calls == [], op.name


# -- 3. on a GPU -------------------------------------------------------------------------------------
class GpuSession:
    """A non-blocking stream on ``device`` and the tensors a test made on it (freed at teardown)."""

    def __init__(self, device: str = "cuda:0") -> None:
        self.s = srt.Stream(srt.Device(device), non_blocking=True)
        self.owned: list[srt.Tensor] = []

    def put(self, a: np.ndarray, layout: str = "c") -> srt.Tensor:
        """``a`` on the device: contiguous ("c"), stored transposed ("T"), or every other element
        of the last axis after 3 ("s", a view into a bigger tensor)."""
        if layout == "c" or a.ndim == 0:
            t = srt.Tensor.from_numpy(a, stream=self.s)
            self.owned.append(t)
            return t
        d = desc_of(a.shape, a.dtype, layout)
        store = np.zeros(max(d.storage_nbytes // a.itemsize, 1), a.dtype)
        np.lib.stride_tricks.as_strided(store[d.offset :], a.shape,
                                        tuple(x * a.itemsize for x in d.strides))[...] = a
        base = srt.Tensor.from_numpy(store, stream=self.s)
        self.owned.append(base)
        return base.as_strided(a.shape, d.strides, d.offset)

    def empty(self, shape, dtype, layout: str = "c") -> srt.Tensor:
        """An output filled with NaN, so that an element never written shows."""
        return self.put(np.full(shape, np.nan, dtype), layout)

    def close(self) -> None:
        self.s.synchronize()
        for t in self.owned:
            t.free(self.s)
        self.s.synchronize()
        self.s.destroy()


@pytest.fixture
def gpu():
    """A :class:`GpuSession` on cuda:0; skips with the reason when there is no usable GPU."""
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable CUDA device here: {reason}")
    g = GpuSession()
    yield g
    g.close()


def rand(shape, dtype, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def gpu_cases():
    """(id ending in the dtype, op, input shapes (None: an absent optional input), attrs,
    float64 reference of the inputs)."""
    cases = []
    for dt in (F32, F64, F16):
        n = dt.name
        cases += [
            (f"add-{n}", ops.add, [(1000, 37), (37,)], {"alpha": 0.5}, lambda x, y: x + 0.5 * y),
            (f"add-bcast-{n}", ops.add, [(3, 1, 5), (4, 1)], {}, lambda x, y: x + y),
            (f"mul-{n}", ops.mul, [(2, 3, 4, 5), (2, 3, 4, 5)], {}, lambda x, y: x * y),
            (f"sum-rows-{n}", ops.reduce_sum, [(3, 70000)], {"axis": 1}, lambda x: x.sum(axis=1)),
            (f"sum-cols-{n}", ops.reduce_sum, [(2, 5000, 3)], {"axis": 1}, lambda x: x.sum(axis=1)),
            (f"sum-all-{n}", ops.reduce_sum, [(7, 9, 11)], {}, lambda x: np.asarray(x.sum())),
            (f"sum-mixed-{n}", ops.reduce_sum, [(4, 5, 6)], {"axis": (0, 2)},
             lambda x: x.sum(axis=(0, 2))),
            (f"softmax-{n}", ops.softmax, [(64, 1000)], {}, lambda x: ref_softmax(x, -1)),
            (f"softmax-short-{n}", ops.softmax, [(3, 7, 5)], {"axis": 1}, lambda x: ref_softmax(x, 1)),
            (f"softmax-cols-{n}", ops.softmax, [(2, 100, 3000)], {"axis": 1},
             lambda x: ref_softmax(x, 1)),
            (f"softmax-stride-{n}", ops.softmax, [(2, 100, 3)], {"axis": 1},
             lambda x: ref_softmax(x, 1)),
            (f"ln-{n}", ops.layer_norm, [(64, 1000), (1000,), (1000,)], {},
             lambda x, w, b: ref_layer_norm(x, w, b, 1, 1e-5)),
            (f"ln-short-{n}", ops.layer_norm, [(50, 8), None, None], {},
             lambda x, w, b: ref_layer_norm(x, None, None, 1, 1e-5)),
            (f"ln-2d-{n}", ops.layer_norm, [(2, 3, 40, 5), (40, 5), None], {},
             lambda x, w, b: ref_layer_norm(x, w, None, 2, 1e-5)),
            (f"mm-{n}", ops.matmul, [(33, 70), (70, 45)], {}, np.matmul),
            (f"mm-batch-{n}", ops.matmul, [(2, 1, 5, 6), (3, 6, 4)], {}, np.matmul),
            (f"mm-splitk-{n}", ops.matmul, [(64, 4096), (4096, 32)], {}, np.matmul),
            (f"cumsum-flat-{n}", ops.cumsum, [(3, 1000)], {}, lambda x: ref_cumsum(x, None)),
            (f"cumsum-long-{n}", ops.cumsum, [(40000,)], {"axis": 0}, lambda x: ref_cumsum(x, 0)),
            (f"cumsum-cols-{n}", ops.cumsum, [(5, 2000, 2)], {"axis": 1}, lambda x: ref_cumsum(x, 1)),
            (f"cumsum-short-{n}", ops.cumsum, [(9, 20)], {"axis": 1}, lambda x: ref_cumsum(x, 1)),
        ]
    return cases


GPU_CASES = gpu_cases()


def _gpu_tol(dt, want: np.ndarray) -> dict:
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    tol = {F16: 2e-2, F32: 1e-4, F64: 1e-10}[dt]
    return {"rtol": tol, "atol": tol * scale}


def _inputs(case, layout: str, seed: int):
    _, op, shapes, attrs, ref = case
    dt = np.dtype(case[0].rsplit("-", 1)[1])
    arrays = [None if sh is None else rand(sh, dt, seed + i) for i, sh in enumerate(shapes)]
    want = np.asarray(ref(*(None if a is None else a.astype(np.float64) for a in arrays)))
    return dt, arrays, want


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["c", "T", "s"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_op_matches_numpy(gpu, case, layout):
    _, op, shapes, attrs, _ = case
    dt, arrays, want = _inputs(case, layout, 0)
    tensors = [None if a is None else gpu.put(a, layout) for a in arrays]
    out = gpu.empty(want.shape, dt, layout)
    ops.run(op, *tensors, out, stream=gpu.s, **attrs)
    got = out.numpy(gpu.s).astype(np.float64)
    np.testing.assert_allclose(got, want, **_gpu_tol(dt, want))
    # phase 1 on the device gives exactly the planner's size
    size, ex = op.get_workspace_size(*tensors, out, **attrs)
    descs = [None if t is None else t.desc for t in (*tensors, out)]
    assert size == plan_cuda(op, descs, **attrs).workspace_size
    ex.destroy()


@pytest.mark.cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_repeatable_executor_with_new_addresses(gpu, case):
    _, op, shapes, attrs, _ = case
    cs = gpu.s
    dt, arrays, want = _inputs(case, "c", 0)
    tensors = [None if a is None else gpu.put(a) for a in arrays]
    out = gpu.empty(want.shape, dt)
    size, ex = op.get_workspace_size(*tensors, out, **attrs)
    ex.set_repeatable()
    ws = cs.malloc(size) if size else None
    try:
        op(ws, size, ex, cs)
        np.testing.assert_allclose(out.numpy(cs).astype(np.float64), want, **_gpu_tol(dt, want))
        _, arrays2, want2 = _inputs(case, "c", 100)
        for i, a in enumerate(arrays2):
            if a is not None:
                ex.set_input_addr(i, gpu.put(a).ptr)
        out2 = gpu.empty(want.shape, dt)
        ex.set_output_addr(0, out2.ptr)
        op(ws, size, ex, cs)
        np.testing.assert_allclose(out2.numpy(cs).astype(np.float64), want2, **_gpu_tol(dt, want2))
        # the first output kept its result: the re-run went to the new address only
        np.testing.assert_allclose(out.numpy(cs).astype(np.float64), want, **_gpu_tol(dt, want))
    finally:
        if ws is not None:
            cs.free(ws)
        cs.synchronize()
        ex.destroy()


@pytest.mark.cuda
def test_gpu_executor_cache_hit_reuses_the_cuda_plan(gpu):
    cache = ops.ExecutorCache()
    for seed in range(3):
        a = rand((8, 3000), F32, seed)
        out = gpu.empty((8,), F32)
        ops.run(ops.reduce_sum, gpu.put(a), out, stream=gpu.s, cache=cache, axis=1)
        np.testing.assert_allclose(out.numpy(gpu.s), a.sum(axis=1), rtol=1e-5, atol=1e-4)
    assert cache.stats()["hits"] == 2
    cache.clear()
