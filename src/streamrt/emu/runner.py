"""Load built kernels (ctypes) and launch them: grid, block, dynamic shared memory, arguments."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidValueError, LaunchError
from .build import build

ORDERS = {"forward": 0, "reverse": 1, "ahead": 2, "behind": 3, "random": 4}  # shim.h's srt_emu_order
ORDER_ENV = "STREAMRT_EMU_ORDER"  # the default order, e.g. "reverse" or "random:7"
MAX_PARAMS = 64

_libs: dict[tuple[str, str, tuple[str, ...], bool], Library] = {}  # (source, name, options, sanitize)
_libs_lock = threading.Lock()  # guards _libs


class Library:
    """One kernel built by g++: its launcher and the sizes of its C parameters."""

    def __init__(self, lib: ctypes.CDLL, name: str, cpp: Path | None = None,
                 sanitize: bool = False) -> None:
        lib.srt_emu_launch.argtypes = ([ctypes.c_void_p] + [ctypes.c_uint] * 6
                                       + [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong])
        lib.srt_emu_launch.restype = ctypes.c_int
        lib.srt_emu_param_sizes.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.srt_emu_param_sizes.restype = ctypes.c_uint
        lib.srt_emu_oob_at.restype = ctypes.c_uint
        self.lib = lib
        self.name = name
        self.sanitize = sanitize  # built to record its accesses (sanitize.h; see checked.py)
        if sanitize:
            lib.srt_emu_san_set.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong]
            lib.srt_emu_san_set.restype = None
            lib.srt_emu_san_get.argtypes = [ctypes.c_void_p]
            lib.srt_emu_san_get.restype = None
        self.cpp = cpp  # the C++ source kept next to the library
        sizes = (ctypes.c_ulonglong * MAX_PARAMS)()
        n = lib.srt_emu_param_sizes(sizes, MAX_PARAMS)
        if n > MAX_PARAMS:
            raise NotImplementedError(f"{name}: {n} parameters (the emulator takes {MAX_PARAMS})")
        self.param_sizes = tuple(sizes[:n])

    def launch(self, params: Any, gx: int, gy: int, gz: int, bx: int, by: int = 1,
               bz: int = 1, order: str | None = None, shared_mem: int = 0) -> None:
        """Run a (gx, gy, gz) grid of (bx, by, bz) blocks in ``order`` (see :func:`parse_order`)
        with ``shared_mem`` bytes of dynamic shared memory; ``params`` is a ``void**``. Launches
        on different OS threads run at once (each has its own coordinates and ``__shared__``
        arrays). A deadlock or an out-of-bounds index raises RuntimeError."""
        code, seed = parse_order(order)
        rc = self.lib.srt_emu_launch(params, gx, gy, gz, bx, by, bz, code, seed, shared_mem)
        if rc == 1:
            raise RuntimeError(f"{self.name}: the threads of a block deadlocked (a barrier that "
                               "some threads never reach)")
        if rc == 2:
            raise RuntimeError(f"{self.name}: an index out of the bounds of a fixed-size array "
                               f"(__shared__ or local) at line {self.lib.srt_emu_oob_at()} of "
                               f"{self.cpp}")


def parse_order(order: str | None = None) -> tuple[int, int]:
    """``(shim order code, seed)`` of ``order`` (an ``ORDERS`` name, or "random:SEED");
    None: ``$STREAMRT_EMU_ORDER``, else "forward" (read on every call)."""
    spec = order or os.environ.get(ORDER_ENV) or "forward"
    name, colon, seed = spec.partition(":")
    if name not in ORDERS or (colon and (name != "random" or not seed.isdigit())):
        raise InvalidValueError(f"emulator order {spec!r} (${ORDER_ENV}): one of "
                                f"{', '.join(ORDERS)}, or random:SEED")
    return ORDERS[name], int(seed or 0)


def library(source: str, name: str, options: Sequence[str] = (), sanitize: bool = False) -> Library:
    """The loaded library of kernel ``name`` of ``source`` (``sanitize``: its build that records
    its accesses), built unless cached (in this process, then on disk)."""
    key = (source, name, tuple(options), sanitize)
    lib = _libs.get(key)
    if lib is None:
        so = build(source, name, key[2], sanitize)
        made = Library(ctypes.CDLL(str(so)), name, so.with_suffix(".cpp"), sanitize)
        with _libs_lock:
            lib = _libs.setdefault(key, made)
    return lib


def launch(lib: Library, values: Sequence[Any], types: Sequence[type], grid: Sequence[int],
           block: Sequence[int], *, shared_mem: int = 0, order: str | None = None) -> None:
    """Run one launch of ``lib``: argument ``values[i]`` stored as C type ``types[i]`` (pointers
    are host addresses), every block of ``grid`` with ``block`` threads. A kernel failure (a
    deadlock, an out-of-bounds index) raises :class:`LaunchError`."""
    params, keep = _params(lib, values, types)
    gx, gy, gz = grid
    bx, by, bz = block
    try:
        lib.launch(params, gx, gy, gz, bx, by, bz, order, shared_mem)
    except RuntimeError as exc:
        raise LaunchError(str(exc)) from exc
    del keep


def _params(lib: Library, values: Sequence[Any], types: Sequence[type]) -> tuple[Any, list]:
    """The ``void**`` of a launch's arguments, and the slots it points at (keep them alive)."""
    if len(values) != len(lib.param_sizes):
        raise InvalidValueError(f"kernel {lib.name!r} takes {len(lib.param_sizes)} C parameters, "
                                f"{len(values)} arguments given")
    slots = [t(v) for t, v in zip(types, values, strict=True)]
    for i, (s, size) in enumerate(zip(slots, lib.param_sizes, strict=True)):
        if ctypes.sizeof(s) != size:
            raise InvalidValueError(f"kernel {lib.name!r}: argument {i} is {ctypes.sizeof(s)} "
                                    f"bytes, its C parameter {size}")
    return (ctypes.c_void_p * max(len(slots), 1))(*[ctypes.addressof(s) for s in slots]), slots
