"""Build one CUDA C kernel for the CPU: g++ after ``shim.h``, into a shared object cached on disk.

The cache folder is ``$STREAMRT_EMU_CACHE``, else ``$STREAMRT_CACHE_DIR/emu``, else
``$XDG_CACHE_HOME/streamrt/emu``, else ``~/.cache/streamrt/emu`` (read on every build). A
library is named by a hash of the C++ translation unit (shim, source, launcher), the g++
options and the compiler's version, so a changed kernel, option or compiler is rebuilt and an
unchanged one is loaded as it is; files appear atomically (``os.replace``), so concurrent
builders (threads, processes) never see half a library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import threading
from importlib import resources
from pathlib import Path

from ..errors import BackendUnavailableError, KernelCompileError

# the CUDA built-ins, then vector_types.h's and cuda_fp16.h's names (a kernel's own #include of
# those headers is dropped: _CUDA_INCLUDE)
SHIM = "".join(resources.files(__package__).joinpath(h).read_text()
               for h in ("shim.h", "intrinsics.h", "vectors.h", "fp16.h", "sanitize.h"))
_CUDA_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:cuda_fp16\.h|cuda_fp16\.hpp|'
                           r'cuda_runtime\.h|cuda\.h|vector_types\.h|device_launch_parameters\.h)'
                           r'[>"][^\n]*$', re.M)
# -fsanitize checks accesses to fixed-size (__shared__, local) arrays, by index or through a pointer
# the compiler follows; compile only (-c): the shim defines the handlers, and linking with
# -fsanitize would add libubsan
CXX = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread", "-w",
       "-fsanitize=bounds,object-size"]
LINK = ["g++", "-shared", "-pthread"]
# the sanitizer's build: g++ calls sanitize.h's handlers on every load and store (no libasan: the
# kernel-address flavour with callbacks needs only the handlers, no runtime or shadow mapping)
SANITIZE = ["-DSRT_EMU_SANITIZE", "-fsanitize=kernel-address", "--param",
            "asan-instrumentation-with-call-threshold=0", "--param", "asan-stack=0", "--param",
            "asan-globals=0"]
# srt_ld / srt_st convert float16 with PTX; the host converts with the shim's _Float16 helpers
PTX = {
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));': "f = srt_emu_h2f(p->bits);",
    'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));': "h = srt_emu_f2h(v);",
}
LAUNCH = ('extern "C" int srt_emu_launch(void** p, unsigned gx, unsigned gy, unsigned gz, '
          'unsigned bx, unsigned by, unsigned bz, int order, unsigned long long seed, '
          'unsigned long long smem) '
          '{{ return srt_emu_run(&{name}, p, gx, gy, gz, bx, by, bz, order, seed, smem); }}\n'
          'extern "C" unsigned srt_emu_param_sizes(unsigned long long* out, unsigned max) '
          '{{ return srt_emu_sizes(&{name}, out, max); }}\n'
          'extern "C" unsigned srt_emu_oob_at() {{ return srt_emu_oob_line; }}\n')
# extern __shared__ T name[]; (dynamic shared memory) -> a pointer to the launch's bytes
_DYN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w:<>\s]*?)\s+"
    r"(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_]\w*)\s*\[\s*\]\s*;")
# the NVRTC options g++ understands too (macros, include folders); others are NVRTC's alone
_GXX_OPTION = re.compile(r"(-D|-U|-I|--define-macro=|--undefine-macro=|--include-path=)(.+)")
_GXX_SPELLING = {"--define-macro=": "-D", "--undefine-macro=": "-U", "--include-path=": "-I"}
_build_lock = threading.Lock()  # guards nothing shared but the folder's creation


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring; read on every call)."""
    own = os.environ.get("STREAMRT_EMU_CACHE")
    if own:
        return Path(own)
    root = os.environ.get("STREAMRT_CACHE_DIR")
    if root:
        return Path(root) / "emu"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "streamrt" / "emu"


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """``g++ --version``'s first line (part of every cache key): a new compiler rebuilds."""
    r = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=60)
    return r.stdout.splitlines()[0] if r.stdout else r.stderr.strip()


@functools.lru_cache(maxsize=1)
def _unavailable() -> str | None:
    if shutil.which("g++") is None:
        return "g++ is not on PATH"
    try:
        r = subprocess.run([*CXX, "-fsyntax-only", "-x", "c++", "-"], input=SHIM,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"g++ did not run: {exc}"
    if r.returncode:
        return f"g++ cannot compile the C++20 shim (ucontext, _Float16): {r.stderr.strip()[-600:]}"
    return None


def unavailable() -> str | None:
    """None when g++ compiles the shim here (C++20, ``<ucontext.h>``, ``_Float16``), else why not
    (found once per process)."""
    return _unavailable()


def require() -> None:
    """Raise :class:`BackendUnavailableError` saying what to install when kernels cannot be built."""
    why = unavailable()
    if why is not None:
        raise BackendUnavailableError(
            f"CUDA C kernels run on the cpu backend through g++, which cannot be used here: {why}. "
            "Install GCC 11 or newer with C++20 (Debian/Ubuntu: apt-get install g++; Fedora: "
            "dnf install gcc-c++; macOS has no <ucontext.h> fibers: use Linux)")


def gxx_options(options: tuple[str, ...]) -> list[str]:
    """The g++ spelling of the NVRTC ``options`` that g++ understands (macros, include paths)."""
    out = []
    for o in options:
        m = _GXX_OPTION.fullmatch(o)
        if m:
            out.append(_GXX_SPELLING.get(m[1], m[1]) + m[2])
    return out


def cpp_source_of(source: str, name: str) -> str:
    """The C++ translation unit of kernel ``name`` in CUDA C ``source``: shim, the source, and
    ``extern "C"`` launcher and parameter-size functions."""
    src = source
    for ptx, host in PTX.items():
        src = src.replace(ptx, host)
    if "asm(" in src or "asm volatile" in src:
        raise NotImplementedError(f"{name}: inline PTX the emulator does not know")
    src = _CUDA_INCLUDE.sub(r"// (emulator) \g<0>", src)
    src = _DYN_SHARED.sub(r"\1* const \2 = reinterpret_cast<\1*>(srt_emu_dyn_smem);", src)
    return SHIM + src + LAUNCH.format(name=name)


def build(source: str, name: str, options: tuple[str, ...] = (), sanitize: bool = False) -> Path:
    """The shared object of kernel ``name`` of CUDA C ``source`` (g++ options from the NVRTC
    ``options``; ``sanitize``: the build whose accesses sanitize.h records), compiled unless
    cached. A compile failure raises
    :class:`~..errors.KernelCompileError` (``srt.CompileError``) with g++'s log; g++ missing
    raises :class:`BackendUnavailableError`."""
    require()
    src = cpp_source_of(source, name)
    flags = gxx_options(tuple(options)) + (SANITIZE if sanitize else [])
    key = hashlib.sha256("\0".join([*CXX, *flags, *LINK, compiler_version(), src]).encode())
    so = cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not so.exists():
        try:
            _compile(src, so, flags)
        except _GxxFailed as exc:
            raise _compile_error(source, name, str(exc)) from None
    return so


class _GxxFailed(RuntimeError):
    """g++'s compile step failed; the message is its stderr."""


# g++'s "FILE.cpp:LINE:COL: error: ..." (and notes/warnings): LINE of the translation unit
_GXX_LINE = re.compile(r"^[^\n:]*\.cpp:(\d+):(?:\d+:)? ", re.M)


def _compile_error(source: str, name: str, stderr: str) -> KernelCompileError:
    """A KernelCompileError for g++'s ``stderr``: its lines renamed ``name(LINE)`` in ``source``'s
    numbering (as NVRTC's log names them), the first error lines quoted."""
    shim_lines = SHIM.count("\n")
    lines = source.splitlines()

    def rename(m: re.Match) -> str:
        n = int(m[1]) - shim_lines
        return f"{name}({n}): " if 1 <= n <= len(lines) else f"{name}(emulator {m[1]}): "

    log = _GXX_LINE.sub(rename, stderr)
    quoted: list[str] = []
    for m in re.finditer(re.escape(name) + r"\((\d+)\): error", log):
        n = int(m[1])
        if len(quoted) < 5 and f"\n  line {n}: {lines[n - 1].strip()}" not in quoted:
            quoted.append(f"\n  line {n}: {lines[n - 1].strip()}")
    return KernelCompileError(f"g++ could not compile kernel {name!r} for the cpu backend's CUDA C "
                              f"emulator{''.join(quoted)}\n{log[-3000:]}", log=log)


def _compile(src: str, so: Path, flags: list[str]) -> None:
    with _build_lock:
        so.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{threading.get_ident()}"  # concurrent builders never share a file
    cpp, obj = so.with_suffix(f".{tag}.cpp"), so.with_suffix(f".{tag}.o")
    tmp = so.with_suffix(f".{tag}.tmp")
    cpp.write_text(src)
    try:
        r = subprocess.run([*CXX, *flags, "-c", "-o", str(obj), str(cpp)], capture_output=True,
                           text=True)
        if r.returncode:  # the kernel's source (or an option): the user's to fix
            raise _GxxFailed(r.stderr)
        r = subprocess.run([*LINK, "-o", str(tmp), str(obj)], capture_output=True, text=True)
        if r.returncode:  # the toolchain's: no source line to name
            raise RuntimeError(f"g++ could not link {so.stem}:\n{r.stderr[-4000:]}")
        os.replace(tmp, so)
        os.replace(cpp, so.with_suffix(".cpp"))  # kept next to the library, for debugging
    finally:
        for f in (cpp, obj, tmp):
            f.unlink(missing_ok=True)
