"""NVRTC compilation, its caches, and kernel argument packing (needs NVRTC, not a GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt import errors
from streamrt.backends.cuda import nvrtc as srt_nvrtc
from streamrt.backends.cuda.errors import KernelCompileError

nvrtc = pytest.importorskip(
    "cuda.bindings.nvrtc", reason="cuda-bindings is not installed (pip install 'streamrt[cuda]')"
)
_why = srt_nvrtc.nvrtc_available()
if _why is not None:
    pytest.skip(f"NVRTC is not usable here: {_why}", allow_module_level=True)

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private disk cache folder and an empty in-process cache for each test."""
    monkeypatch.setenv("STREAMRT_CACHE_DIR", str(tmp_path))
    srt_nvrtc._memory_cache.clear()
    yield tmp_path / "nvrtc"
    srt_nvrtc._memory_cache.clear()


def _forbid_compiling(monkeypatch):
    """Make any NVRTC program creation fail, proving a result came from a cache."""

    def boom(*args, **kwargs):
        raise AssertionError("nvrtcCreateProgram called: the cache was not used")

    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", boom)


def test_saxpy_compiles_to_elf(cache):
    cubin = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    assert isinstance(cubin, bytes)
    assert cubin.startswith(b"\x7fELF")
    assert len(list(cache.glob("*.cubin"))) == 1
    assert not list(cache.glob("*.tmp"))  # the atomic write left no temporary behind


def test_second_call_uses_memory_cache(monkeypatch):
    first = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    _forbid_compiling(monkeypatch)
    assert srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90") is first


def test_disk_cache_serves_a_fresh_process(monkeypatch):
    first = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    srt_nvrtc._memory_cache.clear()  # what a new process would see
    _forbid_compiling(monkeypatch)
    assert srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90") == first


def test_arch_and_options_are_part_of_the_key(cache):
    a = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    b = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_80")
    c = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90", ("-DUNUSED=1",))
    assert a.startswith(b"\x7fELF") and b.startswith(b"\x7fELF") and c.startswith(b"\x7fELF")
    assert a != b
    assert len(srt_nvrtc._memory_cache) == 3
    assert len(list(cache.glob("*.cubin"))) == 3


def test_syntax_error_raises_with_log():
    bad = 'extern "C" __global__ void broken(int* p) { *p = ; }'
    with pytest.raises(KernelCompileError) as info:
        srt_nvrtc.compile_cubin(bad, "broken.cu", "sm_90")
    exc = info.value
    assert isinstance(exc, errors.LaunchError)
    assert "broken.cu" in str(exc)
    assert "error" in exc.log and "broken.cu" in exc.log
    assert exc.log in str(exc)
    assert "\x00" not in exc.log
    assert (exc.code, exc.name) == (6, "NVRTC_ERROR_COMPILATION")
    assert not srt_nvrtc._memory_cache  # failures are not cached


def test_bad_option_raises_compile_error_with_nvrtc_code():
    with pytest.raises(KernelCompileError) as info:
        srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90", ("--no-such-option",))
    assert info.value.name == "NVRTC_ERROR_INVALID_OPTION"
    assert "--no-such-option" in info.value.log


def test_program_is_destroyed_on_failure(monkeypatch):
    destroyed = []
    real = nvrtc.nvrtcDestroyProgram

    def spy(prog):
        destroyed.append(prog)
        return real(prog)

    monkeypatch.setattr(nvrtc, "nvrtcDestroyProgram", spy)
    with pytest.raises(KernelCompileError):
        srt_nvrtc.compile_cubin("this is not C", "junk.cu", "sm_90")
    srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    assert len(destroyed) == 2


@pytest.mark.parametrize("arch", ["90", "compute_90", "sm90", ""])
def test_bad_arch_is_rejected_early(arch):
    with pytest.raises(errors.InvalidValueError, match="sm_90"):
        srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", arch)


def test_corrupt_cache_file_is_recompiled(cache):
    first = srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90")
    (path,) = cache.glob("*.cubin")
    data = path.read_bytes()
    path.write_bytes(data[:-10] + b"0123456789")  # same size, wrong bytes: only the checksum notices
    srt_nvrtc._memory_cache.clear()
    assert srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90") == first
    assert path.read_bytes() == data  # rewritten good
    path.write_bytes(b"")
    srt_nvrtc._memory_cache.clear()
    assert srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90") == first


def test_unwritable_cache_dir_does_not_fail(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("STREAMRT_CACHE_DIR", str(blocker))  # mkdir under a file fails
    assert srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90").startswith(b"\x7fELF")


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("STREAMRT_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert srt_nvrtc.cache_dir() == tmp_path / ".cache" / "streamrt" / "nvrtc"


# --- signatures and argument packing -----------------------------------------------------------


def test_parse_signature():
    assert srt_nvrtc.parse_signature("ptr, i32, f32") == (ctypes.c_void_p, ctypes.c_int32, ctypes.c_float)
    ptr, u64 = ctypes.c_void_p, ctypes.c_uint64
    assert srt_nvrtc.parse_signature(" ptr,ptr ,\tu64 ") == (ptr, ptr, u64)
    assert srt_nvrtc.parse_signature("i8,u8,i16,u16,u32,i64,f64") == (
        ctypes.c_int8,
        ctypes.c_uint8,
        ctypes.c_int16,
        ctypes.c_uint16,
        ctypes.c_uint32,
        ctypes.c_int64,
        ctypes.c_double,
    )
    assert srt_nvrtc.parse_signature("") == ()
    assert srt_nvrtc.parse_signature("   ") == ()


@pytest.mark.parametrize("sig", ["ptr, int", "float", "ptr,,i32", "ptr,", "I32"])
def test_parse_signature_rejects_unknown_tokens(sig):
    with pytest.raises(errors.InvalidValueError) as info:
        srt_nvrtc.parse_signature(sig)
    assert "allowed: ptr, i8" in str(info.value)


def test_parse_signature_names_the_token():
    with pytest.raises(errors.InvalidValueError, match="'float'"):
        srt_nvrtc.parse_signature("ptr, float")
    with pytest.raises(errors.InvalidTypeError):
        srt_nvrtc.parse_signature(["ptr"])


def test_pack_args_structure():
    types = srt_nvrtc.parse_signature("ptr, i32, f32, u64, f64")
    packed = srt_nvrtc.pack_args(types, (np.uint64(0x7F0000001000), np.int32(-3), 2, 5, np.float32(0.5)))
    values, out_types = packed
    assert out_types == types
    assert values == (0x7F0000001000, -3, 2.0, 5, 0.5)
    assert [type(v) for v in values] == [int, int, float, int, float]
    assert srt_nvrtc.pack_args((), ()) == ((), ())


def test_pack_args_is_accepted_by_cuda_bindings():
    # The driver's own kernelParams helper packs the structure without needing a GPU.
    driver = pytest.importorskip("cuda.bindings.driver")
    helper = getattr(driver, "_HelperKernelParams", None)
    if helper is None:
        pytest.skip("this cuda-bindings has no _HelperKernelParams to check against")
    types = srt_nvrtc.parse_signature("ptr, i8, u8, i16, u16, i32, u32, i64, u64, f32, f64")
    helper(srt_nvrtc.pack_args(types, (1, -1, 255, -2, 65535, -3, 2**32 - 1, -(2**63), 2**64 - 1, 1.5, 2.5)))
    helper(srt_nvrtc.pack_args((), ()))


def test_pack_args_count():
    types = srt_nvrtc.parse_signature("ptr, i32")
    with pytest.raises(errors.InvalidValueError, match=r"takes 2 arguments \(ptr, i32\), got 3"):
        srt_nvrtc.pack_args(types, (1, 2, 3))
    with pytest.raises(errors.InvalidValueError, match="got 0"):
        srt_nvrtc.pack_args(types, ())


@pytest.mark.parametrize(
    ("sig", "value"),
    [
        ("ptr", 1.0),
        ("ptr", True),
        ("ptr", "0x10"),
        ("ptr", None),
        ("i32", 1.5),
        ("i32", "1"),
        ("f32", "1.0"),
        ("f64", None),
        ("f32", 1j),
    ],
)
def test_pack_args_type_errors(sig, value):
    with pytest.raises(errors.InvalidTypeError, match=f"argument 0 \\({sig}\\)"):
        srt_nvrtc.pack_args(srt_nvrtc.parse_signature(sig), (value,))


@pytest.mark.parametrize(
    ("sig", "value"),
    [
        ("ptr", -1),
        ("ptr", 2**64),
        ("i8", 128),
        ("i8", -129),
        ("u8", 256),
        ("u8", -1),
        ("i16", 2**15),
        ("u16", 2**16),
        ("i32", 2**31),
        ("i32", -(2**31) - 1),
        ("u32", 2**32),
        ("i64", 2**63),
        ("u64", -1),
        ("u64", 2**64),
        ("f32", 1e39),
    ],
)
def test_pack_args_range_errors(sig, value):
    with pytest.raises(errors.InvalidValueError, match="argument 0"):
        srt_nvrtc.pack_args(srt_nvrtc.parse_signature(sig), (value,))


def test_pack_args_range_limits_are_inclusive():
    types = srt_nvrtc.parse_signature("i8, i8, u8, i32, i32, u32, i64, u64, f32")
    args = (-128, 127, 255, -(2**31), 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, float("inf"))
    assert srt_nvrtc.pack_args(types, args)[0][:-1] == args[:-1]


def test_nvrtc_available_reports_missing_package(monkeypatch):
    import sys

    import cuda.bindings

    # Both are needed: "from cuda.bindings import nvrtc" first looks for the package attribute.
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    monkeypatch.delattr(cuda.bindings, "nvrtc", raising=False)
    reason = srt_nvrtc.nvrtc_available()
    assert reason is not None and "cuda-bindings" in reason


def test_nvrtc_available_reports_missing_library(monkeypatch):
    def missing():
        raise RuntimeError("libnvrtc.so not found")

    monkeypatch.setattr(nvrtc, "nvrtcVersion", missing)
    reason = srt_nvrtc.nvrtc_available()
    assert reason is not None and "libnvrtc.so not found" in reason


def test_concurrent_requests_compile_once(monkeypatch):
    import threading

    calls = []
    real = nvrtc.nvrtcCreateProgram

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", counting)
    results: list[bytes] = []
    start = threading.Barrier(8)

    def worker():
        start.wait()
        results.append(srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", "sm_90"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 8 and all(r is results[0] for r in results)


# -- what a device gets: a CUBIN for an architecture NVRTC knows, else PTX --------------------------
def test_target_is_a_cubin_for_a_known_architecture_else_ptx_for_the_newest_below():
    archs = srt_nvrtc.supported_archs()
    assert archs == tuple(sorted(archs)) and len(archs) > 1
    newest, oldest = archs[-1], archs[0]
    assert srt_nvrtc.target_for(newest // 10, newest % 10) == f"sm_{newest}"
    # a GPU newer than this NVRTC: PTX of the newest it knows, compiled by the (newer) driver
    assert srt_nvrtc.target_for(newest // 10 + 1, 0) == f"compute_{newest}"
    gap = next((a + 1 for a in archs[:-1] if a + 1 not in archs), None)
    if gap is not None:
        below = max(a for a in archs if a < gap)
        assert srt_nvrtc.target_for(gap // 10, gap % 10) == f"compute_{below}"
    with pytest.raises(srt.NotSupportedError, match=f"cannot build kernels for sm_{oldest - 1}"):
        srt_nvrtc.target_for((oldest - 1) // 10, (oldest - 1) % 10)


def test_compile_module_gives_ptx_for_a_compute_target():
    newest = srt_nvrtc.supported_archs()[-1]
    ptx = srt_nvrtc.compile_module(SAXPY, "saxpy.cu", f"compute_{newest}")
    assert ptx.endswith(b"\0") and b".entry saxpy" in ptx  # NUL-terminated, as cuModuleLoadData takes it
    assert f".target sm_{newest}".encode() in ptx
    assert srt_nvrtc.compile_module(SAXPY, "saxpy.cu", f"sm_{newest}").startswith(b"\x7fELF")
    with pytest.raises(srt.InvalidValueError, match="compute_90"):
        srt_nvrtc.compile_module(SAXPY, "saxpy.cu", "ptx_90")
    with pytest.raises(srt.InvalidValueError, match="sm_90"):
        srt_nvrtc.compile_cubin(SAXPY, "saxpy.cu", f"compute_{newest}")  # a CUBIN needs a real SM



_EDGE = [True, False, None, "1", 1.0, 0.5, -0.0, float("nan"), float("inf"), -float("inf"), 1e300,
         np.int32(7), np.uint64(2**64 - 1), np.float32(1.5), np.float64(2.5)]
_F32_MAX = float(np.finfo(np.float32).max)


def _edges(tok):
    """Arguments at and just past the edges of ``tok``'s C type."""
    t = srt_nvrtc._SIG_TYPES[tok]
    if t in srt_nvrtc._FLOATS:
        return [_F32_MAX, -_F32_MAX, float(np.nextafter(_F32_MAX, np.inf)), -3.4028235677973366e38,
                3.5e38, 0, -7]
    lo, hi = (0, srt_nvrtc._PTR_MAX) if t is ctypes.c_void_p else srt_nvrtc._INT_RANGES[t]
    return [lo - 1, lo, hi, hi + 1]


def _value_for(tok):
    """An argument for a ``tok`` parameter: mostly near its edges, else anything."""
    edges = st.sampled_from(_edges(tok) + _EDGE)
    return st.one_of(edges, edges, edges, st.integers(), st.floats())


def _outcome(fn, *args):
    try:
        values, types = fn(*args)
    except errors.StreamRTError as exc:
        return type(exc), str(exc)
    return tuple((type(v), repr(v)) for v in values), types  # repr: NaN equals itself


@pytest.mark.parametrize("tok", sorted(srt_nvrtc._SIG_TYPES))
def test_packer_packs_each_edge_as_pack_args(tok):
    types = srt_nvrtc.parse_signature(tok)
    for v in _edges(tok) + _EDGE:
        assert _outcome(srt_nvrtc.packer(types), (v,)) == _outcome(srt_nvrtc.pack_args, types, (v,)), v


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(srt_nvrtc._SIG_TYPES)), max_size=5).flatmap(
    lambda toks: st.tuples(st.just(toks), st.tuples(*map(_value_for, toks)),
                           st.sampled_from([0, 0, 0, -1, 1]))))
def test_packer_packs_exactly_as_pack_args(case):
    # the launch hot path's generated test must never accept what pack_args converts or refuses
    toks, args, extra = case
    args = args[:len(args) - 1] if extra < 0 else args + (1,) * extra
    types = srt_nvrtc.parse_signature(", ".join(toks))
    assert _outcome(srt_nvrtc.packer(types), args) == _outcome(srt_nvrtc.pack_args, types, args)
