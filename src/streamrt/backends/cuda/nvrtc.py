"""Compile CUDA C kernels with NVRTC (cached in memory and on disk) and pack launch arguments.

A device gets a CUBIN for its own architecture when this NVRTC knows it, else PTX for the newest
architecture NVRTC knows below it, which the driver compiles at load (as CuPy does).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import math
import operator
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import InvalidTypeError, InvalidValueError, NotSupportedError
from .errors import KernelCompileError, check

__all__ = [
    "KernelCompileError",
    "cache_dir",
    "compile_cubin",
    "compile_module",
    "nvrtc_available",
    "pack_args",
    "packer",
    "parse_signature",
    "target_for",
]

# Bump when the key recipe or the file layout changes, so old cache files are simply never hit.
_FORMAT = "streamrt-nvrtc-cubin-1"
_MAGIC = b"SRTCUBIN1\n"
_DIGEST_LEN = 32  # sha256 of the payload, stored after the magic so truncated/corrupt files are caught

_memory_cache: dict[str, bytes] = {}  # key -> cubin; tests clear it to exercise the disk cache
_lock = threading.Lock()  # guards _memory_cache writes and _key_locks
_key_locks: dict[str, threading.Lock] = {}  # one per key: concurrent requests compile once

_ARCH_RE = re.compile(r"sm_\d+[a-z]?")  # a CUBIN needs a real SM target (sm_90, sm_90a, sm_100f)
_TARGET_RE = re.compile(r"(sm|compute)_\d+[a-z]?")  # compute_XY: PTX


def cache_dir() -> Path:
    """The NVRTC disk cache folder: ``$STREAMRT_CACHE_DIR/nvrtc`` or ``~/.cache/streamrt/nvrtc``."""
    # Read on every call (not at import) so tests and users can redirect it at run time.
    root = os.environ.get("STREAMRT_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "streamrt"
    return base / "nvrtc"


@functools.lru_cache(maxsize=1)
def toolkit_include() -> str | None:
    """The CUDA headers' folder (``cuda_fp16.h``...) NVRTC searches, as CuPy finds it:
    ``$CUDA_PATH``, ``$CUDA_HOME``, ``/usr/local/cuda``, the newest ``/usr/local/cuda-*``, then
    the NVIDIA wheels' headers; None when there is none (found once per process)."""
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    roots += sorted(Path("/usr/local").glob("cuda-*"), key=lambda p: _version_of(p.name),
                    reverse=True)
    try:
        import nvidia  # the namespace of the nvidia-* wheels (cuda-bindings' NVRTC, runtime)

        roots += [p for base in nvidia.__path__ for p in sorted(Path(base).glob("cu*"))]
    except ImportError:
        pass
    for root in roots:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return str(Path(root) / "include")
    return None


def _version_of(name: str) -> tuple[int, ...]:
    """(13, 0) of "cuda-13.0"; () when the name has no version."""
    return tuple(int(p) for p in re.findall(r"\d+", name))


def _nvrtc() -> Any:
    """cuda-bindings' NVRTC module, imported on first use: this module (and the kernels' CUDA
    C checks) must import without the optional cuda-bindings."""
    from cuda.bindings import nvrtc

    return nvrtc


def nvrtc_available() -> str | None:
    """None when NVRTC can compile here, else a short reason why not; never raises."""
    try:
        nvrtc = _nvrtc()
    except Exception as e:  # ImportError, or a broken install failing in its own way
        return f"cuda-bindings is not installed (pip install 'streamrt[cuda]'): {e}"
    try:
        res = nvrtc.nvrtcVersion()
    except Exception as e:  # cuda.pathfinder cannot find libnvrtc (pip install nvidia-cuda-nvrtc)
        return f"the NVRTC library cannot be loaded: {e}"
    if res[0] != 0:
        return f"nvrtcVersion failed: {getattr(res[0], 'name', res[0])}"
    return None


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC: part of the cache key, since a new NVRTC may emit new code."""
    nvrtc = _nvrtc()
    major, minor = check(nvrtc.nvrtcVersion())
    return int(major), int(minor)


@functools.lru_cache(maxsize=1)
def supported_archs() -> tuple[int, ...]:
    """The SM versions this NVRTC builds CUBINs for, e.g. (75, 80, 86, 89, 90, 100, 120)."""
    nvrtc = _nvrtc()
    return tuple(sorted(int(a) for a in check(nvrtc.nvrtcGetSupportedArchs())))


def target_for(major: int, minor: int) -> str:
    """What to build for a device of compute capability ``major.minor``: ``sm_XY`` when NVRTC
    knows that architecture, else ``compute_XY`` of the newest one it knows below it (PTX runs on
    every later GPU; the driver, as new as the GPU, compiles it)."""
    cc = 10 * int(major) + int(minor)
    archs = supported_archs()
    if cc in archs:
        return f"sm_{cc}"
    older = [a for a in archs if a < cc]
    if not older:
        v = ".".join(map(str, _nvrtc_version()))
        raise NotSupportedError(
            f"NVRTC {v} cannot build kernels for sm_{cc}: it knows sm_{archs[0]} to sm_{archs[-1]} "
            "(an older cuda-bindings and NVRTC still target this GPU)")
    return f"compute_{older[-1]}"


def _cache_key(source: str, name: str, arch: str, options: tuple[str, ...]) -> str:
    """sha256 over everything that determines the CUBIN; options keep their order (it can matter)."""
    blob = json.dumps([_FORMAT, source, name, arch, list(options), list(_nvrtc_version())])
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_cached(path: Path) -> bytes | None:
    """The CUBIN stored at ``path``, or None when it is missing, unreadable or fails its checksum."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + _DIGEST_LEN
    if len(data) <= head or not data.startswith(_MAGIC):
        return None
    payload = data[head:]
    if hashlib.sha256(payload).digest() != data[len(_MAGIC) : head]:
        return None
    return payload


def _write_cached(path: Path, cubin: bytes) -> None:
    """Store ``cubin`` atomically; any OS failure is ignored because the cache is only an optimisation."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(cubin).digest() + cubin)
        # os.replace is atomic on POSIX and Windows: readers see the old file or the whole new one.
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _program_log(nvrtc: Any, prog: Any) -> str:
    """NVRTC's log for ``prog`` as text, without the trailing NUL."""
    size = check(nvrtc.nvrtcGetProgramLogSize(prog))
    buf = bytearray(size)
    check(nvrtc.nvrtcGetProgramLog(prog, buf))
    return bytes(buf).rstrip(b"\x00").decode(errors="replace").strip()


def _compile(source: str, name: str, arch: str, options: tuple[str, ...]) -> bytes:
    """Run NVRTC once (a CUBIN for ``sm_*``, PTX for ``compute_*``); the program is destroyed
    whatever happens."""
    nvrtc = _nvrtc()
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *(o.encode() for o in options)]
    prog = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []))
    try:
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if res != 0:
            # Any compile failure (syntax, bad option, bad arch) leaves its explanation in the log.
            log = _program_log(nvrtc, prog)
            if "could not open source file" in log and not any("include-path" in o or
                                                                  o.startswith("-I") for o in options):
                log += ("\n(no CUDA headers found: set CUDA_PATH to a CUDA toolkit, whose include/ "
                        "holds cuda_fp16.h, or pass --include-path=DIR in the kernel's options)")
            exc = KernelCompileError(
                f"NVRTC could not compile {name!r} for {arch} ({res.name}):\n{log}", log=log
            )
            exc.code, exc.name = int(res), res.name
            raise exc
        if arch.startswith("compute_"):  # NUL-terminated PTX text, as cuModuleLoadData takes it
            size = check(nvrtc.nvrtcGetPTXSize(prog))
            buf = bytearray(size)
            check(nvrtc.nvrtcGetPTX(prog, buf))
            return bytes(buf)
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        buf = bytearray(size)  # writable char* for NVRTC to fill
        check(nvrtc.nvrtcGetCUBIN(prog, buf))
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cubin(source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """Compile CUDA C ``source`` (program ``name``, e.g. "saxpy.cu") for ``arch`` ("sm_90") to a CUBIN."""
    if not isinstance(source, str) or not isinstance(name, str) or not isinstance(arch, str):
        raise InvalidTypeError("compile_cubin needs str source, name and arch")
    if not _ARCH_RE.fullmatch(arch):
        raise InvalidValueError(f"arch must look like 'sm_90' (a real SM target for a CUBIN), not {arch!r}")
    return compile_module(source, name, arch, options)


def compile_module(source: str, name: str, target: str, options: tuple[str, ...] = ()) -> bytes:
    """The image of CUDA C ``source`` that ``cuModuleLoadData`` loads: a CUBIN for ``target``
    "sm_90", PTX for "compute_90" (see :func:`target_for`)."""
    if not isinstance(source, str) or not isinstance(name, str) or not isinstance(target, str):
        raise InvalidTypeError("compile_module needs str source, name and target")
    if not _TARGET_RE.fullmatch(target):
        raise InvalidValueError(f"target must look like 'sm_90' or 'compute_90', not {target!r}")
    options = tuple(options)
    if not all(isinstance(o, str) for o in options):
        raise InvalidTypeError(f"NVRTC options must be strings, got {options!r}")
    if "#include" in source:  # <cuda_fp16.h> and the like: the toolkit's headers, as nvcc's
        inc = toolkit_include()
        if inc is not None:
            options += (f"--include-path={inc}",)
    key = _cache_key(source, name, target, options)
    image = _memory_cache.get(key)  # lock-free fast path: dict reads are atomic
    if image is not None:
        return image
    with _lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        image = _memory_cache.get(key)  # another thread may have finished while we waited
        if image is None:
            path = cache_dir() / f"{key}.cubin"  # the name the cache has always used
            image = _read_cached(path)
            if image is None:
                image = _compile(source, name, target, options)
                _write_cached(path, image)
            with _lock:
                _memory_cache[key] = image
    return image


# --- kernel signatures and launch arguments -------------------------------------------------------

_SIG_TYPES: dict[str, type] = {
    "ptr": ctypes.c_void_p,
    "i8": ctypes.c_int8,
    "u8": ctypes.c_uint8,
    "i16": ctypes.c_int16,
    "u16": ctypes.c_uint16,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}
_TOKEN_OF: dict[type, str] = {t: tok for tok, t in _SIG_TYPES.items()}
_FLOATS = (ctypes.c_float, ctypes.c_double)


def _int_range(ctype: type) -> tuple[int, int]:
    """Inclusive (lo, hi) of a ctypes integer type."""
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype(-1).value < 0
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


_INT_RANGES: dict[type, tuple[int, int]] = {
    t: _int_range(t) for t in _SIG_TYPES.values() if t not in _FLOATS and t is not ctypes.c_void_p
}
_PTR_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1


@functools.lru_cache(maxsize=256)
def _parse_signature(sig: str) -> tuple[type, ...]:
    """Cached body of :func:`parse_signature`."""
    if not sig.strip():
        return ()
    out = []
    for raw in sig.split(","):
        token = " ".join(raw.split())
        t = ctypes.c_void_p if token == "const ptr" else _SIG_TYPES.get(token)  # (read only)
        if t is None:
            raise InvalidValueError(
                f"unknown kernel signature type {token!r} in {sig!r}; allowed: {', '.join(_SIG_TYPES)}"
            )
        out.append(t)
    return tuple(out)


def parse_signature(sig: str) -> tuple[type, ...]:
    """Parse a kernel signature like "ptr, i32, f32" into the ctypes type of each parameter."""
    if not isinstance(sig, str):
        raise InvalidTypeError(f"a kernel signature must be a str like 'ptr, i32, f32', not {sig!r}")
    return _parse_signature(sig)


def _pack_one(i: int, ctype: type, value: Any) -> Any:
    """Check one launch argument against its parameter type; the plain Python value to pass."""
    token = _TOKEN_OF.get(ctype)
    if token is None:
        raise InvalidValueError(f"argument {i}: unsupported parameter type {ctype!r}")
    if ctype in _FLOATS:
        # numbers like numpy.float32/int64 convert; strings, complex and None do not.
        if isinstance(value, bool | str | bytes | complex) or value is None:
            raise InvalidTypeError(f"argument {i} ({token}) must be a real number, not {value!r}")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise InvalidTypeError(f"argument {i} ({token}) must be a real number, not {value!r}") from None
        if ctype is ctypes.c_float and math.isfinite(x) and math.isinf(ctypes.c_float(x).value):
            raise InvalidValueError(f"argument {i} (f32) = {value!r} overflows float32")
        return x
    if isinstance(value, bool) and ctype is ctypes.c_void_p:
        raise InvalidTypeError(f"argument {i} (ptr) must be an int address, not {value!r}")
    try:
        n = operator.index(value)  # int and numpy integers; floats are refused, not truncated
    except TypeError:
        kind = "an int address" if ctype is ctypes.c_void_p else "an int"
        raise InvalidTypeError(f"argument {i} ({token}) must be {kind}, not {value!r}") from None
    lo, hi = (0, _PTR_MAX) if ctype is ctypes.c_void_p else _INT_RANGES[ctype]
    if not lo <= n <= hi:
        raise InvalidValueError(f"argument {i} ({token}) = {n} is out of range [{lo}, {hi}]")
    return n


def pack_args(types: Sequence[type], args: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[type, ...]]:
    """Check launch ``args`` against parameter ``types``; the ``kernelParams`` for ``cuLaunchKernel``."""
    types = tuple(types)
    args = tuple(args)
    if len(args) != len(types):
        sig = ", ".join(_TOKEN_OF.get(t, repr(t)) for t in types)
        raise InvalidValueError(f"kernel takes {len(types)} arguments ({sig}), got {len(args)}")
    values = tuple(_pack_one(i, t, v) for i, (t, v) in enumerate(zip(types, args)))
    # cuda-bindings' kernelParams accepts (values, types): it allocates one slot per argument,
    # stores values[i] there as the C type types[i] (c_void_p takes a Python int address; a None
    # type would instead point the parameter at a cuda-bindings object's own storage, e.g. a
    # CUdeviceptr's getPtr()), and passes the resulting void** to cuLaunchKernel. The slots live
    # only for that call, which is enough: the driver copies parameters at launch. An empty
    # signature gives ((), ()), which cuda-bindings passes as NULL.
    return values, types


_F32_MAX = float.fromhex("0x1.fffffep+127")


def _plain(ctype: type, v: str) -> str:
    """A Python test that argument ``v`` is already what :func:`_pack_one` would return for it."""
    if ctype is ctypes.c_double:
        return f"type({v}) is float"
    if ctype is ctypes.c_float:  # in range: no overflow to check (NaN and inf take the slow path)
        return f"type({v}) is float and {-_F32_MAX!r} <= {v} <= {_F32_MAX!r}"
    lo, hi = (0, _PTR_MAX) if ctype is ctypes.c_void_p else _INT_RANGES[ctype]
    return f"type({v}) is int and {lo} <= {v} <= {hi}"  # bool is not int here: the slow path


@functools.lru_cache(maxsize=256)
def packer(types: tuple[type, ...]) -> Callable[[tuple], tuple[tuple[Any, ...], tuple[type, ...]]]:
    """:func:`pack_args` for one signature, as a function of the argument tuple.

    Eager launches are the hot path: arguments that are plain ints and floats in range are
    passed on as they are after one generated test (a chain of ``type(a[i]) is int and ...``,
    built once per signature from the table above, never from user text); anything else goes
    through :func:`pack_args`, which converts or raises exactly as before.
    """
    types = tuple(types)
    for t in types:
        if t not in _TOKEN_OF:
            return functools.partial(pack_args, types)  # raises its clear error at launch
    test = " and ".join(_plain(t, f"a[{i}]") for i, t in enumerate(types)) or "True"
    src = f"lambda a: (a, types) if len(a) == {len(types)} and {test} else pack_args(types, a)"
    return eval(src, {"types": types, "pack_args": pack_args})  # our own text, see above
