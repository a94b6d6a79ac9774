"""Kernels by name, in ACL's terms: ``acl.rt.binary_load`` / ``binary_load_from_file`` /
``binary_unload``, ``binary_get_function(bin, name)`` and ``launch_kernel(func, block_dim,
args, args_size, stream)`` over ``s.launch``.

A "binary" is a Python module (or a ``.py`` file, or a dict) of ``srt.Kernel`` objects, looked
up by name. ``launch_kernel`` passes the kernel one argument struct, as
``aclrtLaunchKernelV2``: host bytes (``bytes``, a ``ctypes.Structure``, or a host pointer from
``acl.util`` / ``malloc_host``), read at the launch, or a device address (pyACL), read when
the kernel runs, in stream order. The struct is unpacked by the kernel's declared layout, its
``signature`` (``@srt.kernel(signature="ptr, ptr, ptr")``): C's field order and alignment.
``block_dim`` is the launch's grid (ACL's blocks), of one thread each."""

from __future__ import annotations

import ctypes
import importlib.util
import threading
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import InvalidHandleError, InvalidTypeError, InvalidValueError
from ..kernel import Kernel, kernel
from . import constants as C
from . import util
from .errors import AclCallError, api
from .streams import stream_of

__all__ = ["Binary", "binary_get_function", "binary_load", "binary_load_from_file",
           "binary_unload", "launch_kernel"]


class Binary:
    """An ``aclrtBinHandle``: kernels by name."""

    def __init__(self, kernels: dict[str, Kernel], origin: str) -> None:
        self.kernels = kernels
        self.origin = origin
        self.unloaded = False

    def __repr__(self) -> str:
        return f"<acl binary {self.origin}: {', '.join(sorted(self.kernels)) or 'no kernels'}>"


def _kernels_of(binary: Any) -> tuple[dict[str, Kernel], str]:
    if isinstance(binary, dict):
        items, origin = binary.items(), "dict"
    elif isinstance(binary, ModuleType):
        items, origin = vars(binary).items(), binary.__name__
    else:
        raise InvalidTypeError(f"a binary is a module or a dict of srt kernels (or a .py file "
                               f"for binary_load_from_file), not {type(binary).__name__}")
    found = {}
    for key, k in items:
        if isinstance(k, Kernel):
            found[key] = k
            found.setdefault(k.name, k)  # by its kernel name too (@srt.kernel(name=...))
    return found, origin


@api(None)
def binary_load(binary: Any) -> Binary:
    """``aclrtBinaryLoad`` -> ``(bin_handle, ret)`` of a module or dict of kernels."""
    return Binary(*_kernels_of(binary))


_loaded: dict[str, ModuleType] = {}
_lock = threading.Lock()


@api(None)
def binary_load_from_file(path: str, options: Any = None) -> Binary:
    """``aclrtBinaryLoadFromFile`` -> ``(bin_handle, ret)``: the kernels of a ``.py`` file (run
    once per path; ``options`` accepted, not read)."""
    if not isinstance(path, str) or not path.endswith(".py"):
        raise InvalidValueError(f"{path!r}: a binary file here is a .py file of srt kernels")
    with _lock:
        mod = _loaded.get(path)
        if mod is None:
            spec = importlib.util.spec_from_file_location(f"acl_binary_{len(_loaded)}", path)
            if spec is None or spec.loader is None:
                raise InvalidValueError(f"{path!r} cannot be loaded")
            mod = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(mod)
            except FileNotFoundError:
                raise AclCallError(f"{path}: no such file", C.ACL_ERROR_INVALID_PARAM) from None
            _loaded[path] = mod
    return Binary(*_kernels_of(mod))


def _binary(bin_handle: Any) -> Binary:
    if not isinstance(bin_handle, Binary) or bin_handle.unloaded:
        raise InvalidHandleError(f"{bin_handle!r} is not a loaded binary (acl.rt.binary_load)")
    return bin_handle


@api()
def binary_unload(bin_handle: Binary) -> None:
    """``aclrtBinaryUnLoad``: the handle refuses further lookups (launched work goes on)."""
    _binary(bin_handle).unloaded = True


@api(None)
def binary_get_function(bin_handle: Binary, kernel_name: str) -> Kernel:
    """``aclrtBinaryGetFunction`` -> ``(func_handle, ret)``: the kernel named ``kernel_name``."""
    b = _binary(bin_handle)
    k = b.kernels.get(kernel_name)
    if k is None:
        raise AclCallError(f"{b!r} has no kernel {kernel_name!r}", C.ACL_ERROR_RT_KERNEL_LOOKUP)
    return k


def _layout(func: Kernel) -> type[ctypes.Structure]:
    """The C struct of ``func``'s declared arguments."""
    # the project's one parser of kernel signatures (pure ctypes; no CUDA is loaded by it)
    from ..backends.cuda.nvrtc import parse_signature

    if not func.signature:
        raise InvalidValueError(f"kernel {func.name!r} declares no argument layout: make it "
                                "with @srt.kernel(signature='ptr, ptr, i32', ...)")
    tokens = ",".join(t.strip().removeprefix("const ").strip() for t in func.signature.split(","))
    fields = [(f"a{i}", t) for i, t in enumerate(parse_signature(tokens))]
    return type(f"{func.name}_args", (ctypes.Structure,), {"_fields_": fields})


def _values(struct: type[ctypes.Structure], raw: bytes) -> tuple[Any, ...]:
    s = struct.from_buffer_copy(raw[:ctypes.sizeof(struct)])
    return tuple(0 if v is None else v for v in (getattr(s, f[0]) for f in struct._fields_))


@kernel
def _from_device_struct(ctx: Any, func: Kernel, struct: type[ctypes.Structure], ptr: int,
                        nbytes: int) -> None:
    """Run ``func`` with the argument struct read from device memory now, in stream order."""
    raw = ctx.array(ptr, (nbytes,), np.uint8, readonly=True).tobytes()
    func.fn(ctx, *_values(struct, raw))


@api()
def launch_kernel(func: Kernel, block_dim: int, args: Any, args_size: int, stream: Any) -> None:
    """``aclrtLaunchKernelV2`` / pyACL's ``launch_kernel``: ``s.launch(func, *fields,
    grid=block_dim)`` with the fields of the argument struct ``args``."""
    if not isinstance(func, Kernel):
        raise InvalidHandleError(f"{func!r} is not a kernel (acl.rt.binary_get_function)")
    if type(args_size) is not int or args_size < 0:
        raise InvalidValueError(f"args_size must be an int >= 0, not {args_size!r}")
    struct = _layout(func)
    need = ctypes.sizeof(struct)
    if args_size < need:
        raise InvalidValueError(f"args_size {args_size} is less than {func.name!r}'s argument "
                                f"struct ({need} bytes: {func.signature})")
    s = stream_of(stream)
    if isinstance(args, int) and not isinstance(args, bool) and not util.is_host(args):
        s.launch(_from_device_struct, func, struct, args, need, grid=block_dim)  # pyACL: device
        return
    if isinstance(args, int):
        raw = util.ptr_to_bytes(args, args_size)  # the host struct, taken at the launch
    else:
        try:
            raw = bytes(memoryview(args).cast("B"))
        except TypeError as exc:
            raise InvalidTypeError(f"args must be a pointer or host bytes, not "
                                   f"{type(args).__name__}") from exc
    if len(raw) < args_size:
        raise InvalidValueError(f"args holds {len(raw)} bytes, args_size says {args_size}")
    s.launch(func, *_values(struct, raw), grid=block_dim)
