"""Kernels: Python functions (optionally with a CUDA C body) launched on streams with a context."""

from __future__ import annotations

import dis
import inspect
import re
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import numpy as np

from .errors import (
    BackendUnavailableError,
    IllegalStateError,
    InvalidTypeError,
    InvalidValueError,
    KernelCompileError,
)
from .validate import is_int
from .views import ViewBase

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream


class Dim3(NamedTuple):
    """Launch dimensions (CUDA ``dim3``)."""

    x: int
    y: int = 1
    z: int = 1


# normalised dims by kind: the limits differ, so a grid checked must not pass as a block
_DIMS: dict[str, dict[Any, Dim3]] = {"grid": {}, "block": {}}
# what every NVIDIA GPU since compute capability 3.0 accepts (cudaDeviceProp maxGridSize,
# maxThreadsDim, maxThreadsPerBlock)
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS = 1024
# dynamic shared memory per block (cudaLaunchKernel's sharedMem): the most any NVIDIA GPU gives
# (sm_90's opt-in, cudaDevAttrMaxSharedMemoryPerBlockOptin); past 48 KiB the cuda backend opts
# the function in (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), and a smaller GPU refuses it
MAX_SHARED_MEM = 227 << 10


# int and numpy's integer scalar types (equal and hashing alike for one value), never bool/np.bool_
INT_TYPES = frozenset({int, *(np.dtype(c).type for c in np.typecodes["AllInteger"])})


def exact_ints(value: Any) -> bool:
    """Whether ``value`` is an int (Python's or numpy's, not a bool) or a tuple of them: a safe
    key for the launch caches (2.0 and True equal ints of other meaning; np.int64(2) is 2)."""
    cls = value.__class__
    return cls in INT_TYPES or (cls is tuple and all(p.__class__ in INT_TYPES for p in value))


def dim3(value: Any, what: str = "grid") -> Dim3:
    """Normalise an int or a 1-3 tuple of positive ints to a :class:`Dim3` (cached)."""
    # True == 1 and 2.0 == 2 (in tuples too) would find the int's entry: only ints may hit
    cache = _DIMS["block" if what == "block" else "grid"]
    if exact_ints(value):
        cached = cache.get(value)
        if cached is not None:
            return cached
    if is_int(value):
        parts: tuple = (value,)
    elif isinstance(value, tuple | list) and 1 <= len(value) <= 3:
        parts = tuple(value)
    else:
        raise InvalidTypeError(f"{what} must be a positive int or a tuple of 1-3 ints, not {value!r}")
    for p in parts:
        if not is_int(p):
            raise InvalidTypeError(f"{what} dimensions must be ints, not {p!r}")
        if p < 1:
            raise InvalidValueError(f"{what} dimensions must be >= 1, got {value!r}")
    d = Dim3(*(int(p) for p in parts))
    # CUDA's limits on every backend: a program the cpu backend runs must launch on a GPU too
    # (cudaErrorInvalidConfiguration)
    limits = _MAX_BLOCK if what == "block" else _MAX_GRID
    if any(n > m for n, m in zip(d, limits, strict=True)) or (
            what == "block" and d.x * d.y * d.z > _MAX_THREADS):
        raise InvalidValueError(
            f"{what} {tuple(d)} is past CUDA's limits: {what} dimensions up to {limits}"
            + (f", at most {_MAX_THREADS} threads in all" if what == "block" else ""))
    if exact_ints(value) and len(cache) < 4096:
        cache[value] = d
    return d


def shared_mem_bytes(value: Any) -> int:
    """Check a launch's dynamic shared memory in bytes (an int, 0 to :data:`MAX_SHARED_MEM`)."""
    if not is_int(value):
        raise InvalidTypeError(f"shared_mem must be an int (bytes of dynamic shared memory), "
                               f"not {value!r}")
    n = int(value)
    if n < 0 or n > MAX_SHARED_MEM:
        raise InvalidValueError(f"shared_mem={n}: dynamic shared memory is 0 to {MAX_SHARED_MEM} "
                                f"bytes per block (227 KiB, the most a GPU gives)")
    return n


class Kernel:
    """A kernel: a Python body ``fn(ctx, *args)`` and, optionally, CUDA C source for the cuda
    backend; a stub body (``...``, ``pass``, ``raise NotImplementedError``) with ``cuda=`` and
    ``signature=`` runs the CUDA C on every backend (the cpu backend emulates it)."""

    __slots__ = ("fn", "name", "cuda_source", "signature", "options", "bind", "_lo", "_hi",
                 "__weakref__")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        cuda: str | None = None,
        signature: str | None = None,
    ) -> None:
        if not callable(fn):
            raise InvalidTypeError(f"a kernel body must be callable, not {type(fn).__name__}")
        self.fn = fn  # (sets _lo and _hi: see __setattr__)
        self.name = name or getattr(fn, "__name__", "kernel")
        if cuda is not None:
            if not isinstance(cuda, str):
                raise InvalidTypeError(f"a kernel's cuda= body must be CUDA C source text, not "
                                       f"{type(cuda).__name__}")
            from .emu.params import check

            if _no_python_body(fn):  # ``...``/``pass``/NotImplementedError: the CUDA C is the body
                if signature is None:
                    raise InvalidValueError(
                        f"kernel {self.name!r} has only a CUDA C body: give its signature= "
                        "('ptr, i32, ...') so that it can run on every backend")
                tokens = check(cuda, str(self.name), signature, need_source=True)
                self.fn = _emulated_body(cuda, str(self.name), signature, (), len(tokens))
            elif signature is not None:  # refused here, not at a launch on some GPU later
                check(cuda, str(self.name), signature)
        self.cuda_source = cuda
        self.signature = signature
        self.options: tuple[str, ...] = ()  # NVRTC options of the CUDA body (srt.cuda_kernel)
        self.bind: Callable[..., Callable[[], Any]] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "fn":  # the arguments a launch may pass after ctx, checked where it is made
            object.__setattr__(self, "_lo", 0)
            object.__setattr__(self, "_hi", _UNBOUNDED)
            lo_hi = _arity(value)
            if lo_hi is not None:
                object.__setattr__(self, "_lo", lo_hi[0])
                object.__setattr__(self, "_hi", lo_hi[1])

    def __repr__(self) -> str:
        return f"<Kernel {self.name}>"

    def _refuse(self, n: int) -> None:
        """A launch (or kernel node) passing ``n`` arguments the body cannot take: refused where
        it is made, not at a later synchronize."""
        want = f"{self._lo}" if self._lo == self._hi else (
            f"at least {self._lo}" if self._hi == _UNBOUNDED else f"{self._lo} to {self._hi}")
        raise InvalidTypeError(f"kernel {self.name!r} takes {want} argument(s) after ctx, "
                               f"{n} given")

    def check_args(self, args: tuple) -> None:
        """Refuse an argument count the body cannot take."""
        n = len(args)
        if n < self._lo or n > self._hi:
            self._refuse(n)

    def compile(self, arch: str | None = None) -> None:
        """Compile every CUDA body now with NVRTC for ``arch`` (default "sm_80"); a failure
        raises :class:`~.errors.KernelCompileError` (``srt.CompileError``) with NVRTC's ``.log``."""
        _compile_now(self, arch)

    def binder(self, fn: Callable[..., Callable[[], Any]]) -> Callable[..., Callable[[], Any]]:
        """Decorator: ``fn(ctx, *args)`` makes the views once and returns a no-argument callable
        doing what the body does; graph replay (cpu) then calls only that, as a CUDA graph
        keeps a kernel node's arguments ready. Eager launches and checked replays (sanitizer,
        tracer) still run the body."""
        if not callable(fn):
            raise InvalidTypeError(f"a binder must be callable, not {type(fn).__name__}")
        self.bind = fn
        return fn


_UNBOUNDED = 1 << 30
# what a body that does nothing, or only raises NotImplementedError, compiles to besides these
_STUB_OPS = frozenset({"RESUME", "NOP", "CACHE", "PRECALL", "CALL", "PUSH_NULL", "KW_NAMES"})


def _no_python_body(fn: Any) -> bool:
    """Whether ``fn`` is a stub (a function whose body is ``...``, ``pass``, a docstring, or
    ``raise NotImplementedError(...)``): a kernel declared for its CUDA C alone."""
    if not isinstance(fn, FunctionType):
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(fn) if i.opname not in _STUB_OPS]
    if ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)]):
        return True
    return (len(ops) >= 2 and ops[0] == ("LOAD_GLOBAL", "NotImplementedError")
            and ops[-1][0] == "RAISE_VARARGS" and all(o == "LOAD_CONST" for o, _ in ops[1:-1]))


def _arity(fn: Any) -> tuple[int, int] | None:
    """The positional arguments ``fn(ctx, *args)`` takes after ``ctx``: (fewest, most), or None
    when its signature cannot be read or it takes keywords only past ctx (anything goes)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    lo = hi = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            hi += 1
            if p.default is p.empty:
                lo += 1
        elif p.kind is p.VAR_POSITIONAL:
            hi = _UNBOUNDED
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return None  # a required keyword no launch can pass: the call fails as it would
    if hi == 0:
        return None  # not even ctx: the call fails where it runs, as it would
    return max(lo - 1, 0), hi - 1 if hi != _UNBOUNDED else _UNBOUNDED


@overload
def kernel(fn: Callable[..., Any], *, name: str | None = None, cuda: str | None = None,
           signature: str | None = None) -> Kernel: ...


@overload
def kernel(fn: None = None, *, name: str | None = None, cuda: str | None = None,
           signature: str | None = None) -> Callable[[Callable[..., Any]], Kernel]: ...


def kernel(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    cuda: str | None = None,
    signature: str | None = None,
) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Decorator making a kernel: ``@srt.kernel`` or ``@srt.kernel(cuda=SRC, signature=...)`` (a
    stub body then means the CUDA C alone, as :func:`cuda_kernel`)."""
    if fn is None:
        return lambda f: Kernel(f, name=name, cuda=cuda, signature=signature)
    return Kernel(fn, name=name, cuda=cuda, signature=signature)


def cuda_kernel(source: str, name: str, *, signature: str, options: Any = ()) -> Kernel:
    """A kernel made only of CUDA C (API.md 9.3): NVRTC builds it on cuda, the CUDA C emulator
    runs it on cpu; ``signature`` must match the source's parameters of ``name``."""
    if not isinstance(source, str) or not isinstance(name, str):
        raise InvalidTypeError("cuda_kernel needs the CUDA C source and the kernel's name as str")
    if isinstance(options, str) or not isinstance(options, tuple | list) or not all(
            isinstance(o, str) for o in options):
        raise InvalidTypeError(f"cuda_kernel options must be a tuple or list of str (NVRTC "
                               f"options such as '-DN=4'), not {options!r}")
    from .emu.params import check

    tokens = check(source, name, signature, need_source=True)
    k = Kernel(_emulated_body(source, name, signature, tuple(options), len(tokens)), name=name,
               cuda=source, signature=signature)
    k.options = tuple(options)
    return k


def _emulated_body(source: str, name: str, signature: str, options: tuple[str, ...],
                   n: int) -> Callable[..., Any]:
    """The body of a CUDA-C-only kernel: its CUDA C run by the device's emulated launch
    (``DeviceImpl.launch_cuda_c``: the cpu backend's; a GPU backend launches the CUDA C itself)."""

    def body(ctx: KernelContext, *args: Any) -> None:
        ctx.device._impl.launch_cuda_c(ctx, source, name, signature, options, args)

    body.__name__ = body.__qualname__ = name
    # the launch refuses another argument count at its line, as for a Python body
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY)]
    params += [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)]
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return body


_DEFAULT_ARCH = "sm_80"  # what compile() checks against when no arch is named


def _compile_now(k: Kernel, arch: str | None) -> None:
    """Body of :meth:`Kernel.compile`."""
    if k.cuda_source is None:
        return  # no CUDA body: nothing to compile
    from .backends.cuda import nvrtc

    why = nvrtc.nvrtc_available()
    if why is not None:
        raise BackendUnavailableError(f"kernel {k.name!r}: compile() needs NVRTC: {why}")
    target = _DEFAULT_ARCH if arch is None else arch
    try:
        nvrtc.compile_module(k.cuda_source, str(k.name), target, k.options)
    except KernelCompileError as exc:
        lines = _error_lines(k.cuda_source, str(k.name), exc.log)
        err = KernelCompileError(f"{exc.args[0]}{lines}", log=exc.log)
        err.code, err.name = exc.code, exc.name
        raise err from exc


def _error_lines(source: str, name: str, log: str) -> str:
    """The source lines NVRTC's ``log`` names ("name(12): error: ..."), quoted."""
    lines = source.splitlines()
    out: list[str] = []
    for m in re.finditer(re.escape(name) + r"\((\d+)\): (?:catastrophic )?error", log):
        n = int(m[1])
        if 1 <= n <= len(lines) and len(out) < 5:
            out.append(f"\n  line {n}: {lines[n - 1].strip()}")
    return "".join(out)


class KernelContext(ViewBase):
    """What a kernel body sees: launch dimensions, device, stream, and bounds-checked memory views."""

    # (``_view`` and ``_last``, what ``array`` reads, are ViewBase's: see views.py)
    __slots__ = ("grid", "block", "shared_mem", "device", "stream", "_runs", "_info", "_conds")

    def __init__(self, grid: Dim3, block: Dim3, device: Device, stream: Stream,
                 shared_mem: int = 0) -> None:
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem  # bytes of dynamic shared memory (extern __shared__ arrays)
        self.device = device
        self.stream = stream
        self._view = device._impl.view
        # the views this device's kernels made last (DeviceImpl.last_views): never another
        # device's, whose memory may be out of this device's reach (peer access)
        self._last = device._impl.last_views
        # what traces show of a launch with this context (shared by its launches, never changed)
        self._info: dict[str, Any] = {"grid": tuple(grid), "block": tuple(block)}
        if shared_mem:
            self._info["shared_mem"] = shared_mem
        # kernel body -> the body bound to this context (``run(*args)`` is ``body(ctx, *args)``):
        # an eager launch queues that and its own argument tuple, and makes no tuple holding the
        # context per launch (see backends/cpu/queues.py); keyed by the body, not the Kernel, so
        # a Kernel whose ``fn`` was replaced runs the new one
        self._runs: dict[Any, Callable[..., Any]] = {}
        # the conditional handles this kernel may set: those of the graph levels it is in
        # (a kernel node's context in a compiled graph; none for an eager launch)
        self._conds: frozenset = _NO_CONDS

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        """What a copy (or a pickle) carries: every field, ViewBase's too (the C base's fields
        are not slots, which copy would otherwise refuse)."""
        names = ("_view", "_last", *KernelContext.__slots__)
        return None, {n: getattr(self, n) for n in names if hasattr(self, n)}

    def set_condition(self, handle: Any, value: int) -> None:
        """Set a conditional handle's value (``cudaGraphSetConditional``): only in a kernel of
        the graph that owns the handle (or of a body inside it)."""
        from .graph.conditional import ConditionalHandle, check_value

        if not isinstance(handle, ConditionalHandle):
            raise InvalidTypeError(f"set_condition needs a ConditionalHandle, not "
                                   f"{type(handle).__name__}")
        v = check_value(value, "a condition value")
        if handle not in self._conds:
            raise IllegalStateError(f"set_condition({handle!r}): only a kernel of the graph that "
                                    f"owns it, or of a body inside that graph, may set it")
        # through the context's view: the sanitizer sees the write as the kernel's
        self.array(handle.ptr, (1,), _U64)[0] = v

    def _runner(self, fn: Any) -> Callable[..., Any]:
        """``fn`` bound to this context (made once per body; at most 256 kept)."""
        runs = self._runs
        try:
            return runs[fn]
        except KeyError:
            pass
        except TypeError:  # an unhashable callable: bound, not kept
            return self._bind(fn)
        if len(runs) >= 256:  # kernels made on the fly do not pile up
            runs.clear()
        run = runs[fn] = self._bind(fn)
        return run

    def _bind(self, fn: Any) -> Callable[..., Any]:
        # a bound method calls ``fn(self, *args)`` without making a tuple; something not
        # callable fails where the body runs, as its call there would
        return MethodType(fn, self) if callable(fn) else (lambda *args: fn(self, *args))

    # a numpy view of device memory (views.py: in C where it was built)
    _fast_array = ViewBase.array

    def _fast_strided(self, ptr: int, shape: tuple, dtype: Any, bstrides: tuple, extent: int,
                      readonly: bool) -> np.ndarray:
        """A strided view: ``shape`` with byte strides ``bstrides`` over the ``extent`` elements
        from ``ptr`` (an operator's non-contiguous tensor). The sanitizer's version declares
        the elements it touches, not the whole span."""
        span = self.array(ptr, (extent,), dtype, readonly=readonly)
        return np.ndarray(shape, dtype, span, 0, bstrides)

    # the sanitizer swaps in checking versions while it is on (zero cost when off)
    array = _fast_array
    strided = _fast_strided
    # while the sanitizer is on, what an emulated CUDA C launch reports its accesses to
    # (sanitizer.emulated.EmulatedChecker; see DeviceImpl.launch_cuda_c), else None
    emu_checker: Any = None


_NO_CONDS: frozenset = frozenset()
_U64 = np.dtype(np.uint64)


def launch_context(stream: Any, grid: Any, block: Any, shared_mem: Any = 0) -> KernelContext:
    """The context of a launch of ``grid`` x ``block`` on ``stream`` (validated here), kept in
    ``stream._ctxs`` by its shape when that is a safe key, so a repeated shape is not validated
    again."""
    keep = exact_ints(grid) and exact_ints(block)  # a safe key (see exact_ints)
    if shared_mem.__class__ is int and shared_mem == 0:
        key: tuple = (grid, block)
        smem = 0
    else:  # kept by (grid, block, bytes)
        keep = keep and shared_mem.__class__ is int
        key = (grid, block, shared_mem)
        hit = stream._ctxs.get(key) if keep else None
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        smem = shared_mem_bytes(shared_mem)
    ctx = KernelContext(dim3(grid, "grid"), dim3(block, "block"), stream.device, stream, smem)
    if keep and len(stream._ctxs) < 256:
        stream._ctxs[key] = ctx
    return ctx
