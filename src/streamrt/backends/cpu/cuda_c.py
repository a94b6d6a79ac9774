"""A CUDA C kernel launched on a cpu stream: its source run by the emulator (``streamrt.emu``).

It runs as the kernel's body, so as one operation on the stream's queue, in stream order, in
graphs as any kernel node. Pointer arguments are device addresses of this backend; each must
lie in a live allocation this device may reach (its own, pinned host memory, a peer's with
access enabled: the device's ``view`` decides, as for a Python kernel) and is passed as the
host address of its backing bytes; NULL stays NULL. Scalars are checked and packed as the
cuda backend packs them (``nvrtc.packer``), so a launch refused here is refused there too.

While the sanitizer is on (``ctx.emu_checker``), the kernel's recording build runs on copies of
the allocations its pointers lie in (``emu.launch_checked``); the checker judges what it read
and wrote, then the written bytes are copied back (none when it stops the kernel).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ... import emu
from ...errors import InvalidAddressError
from ..cuda.nvrtc import packer, parse_signature

_U8 = np.dtype(np.uint8)


def launch(ctx: Any, source: str, name: str, signature: str, options: tuple[str, ...],
           args: tuple) -> None:
    """Run kernel ``name`` of CUDA C ``source`` now, over ``ctx``'s grid and block."""
    types = parse_signature(signature)
    values, _ = packer(types)(args)
    checker = ctx.emu_checker
    if checker is not None:
        return _launch_checked(ctx, checker, source, name, options, types, values)
    lib = emu.library(source, name, options)
    view = ctx._view  # the device's own view: the bounds and reach checks of a Python kernel
    host = list(values)
    for i, (t, v) in enumerate(zip(types, values, strict=True)):
        if t is ctypes.c_void_p and v:
            host[i] = _host(view, name, i, v)
    emu.launch(lib, host, types, ctx.grid, ctx.block, shared_mem=ctx.shared_mem)
    return None


def _host(view: Any, name: str, i: int, ptr: int) -> Any:
    """The host address of argument ``i``'s device pointer, checked as a one-byte view."""
    try:
        return view(ptr, (1,), _U8, False).ctypes.data
    except InvalidAddressError as exc:
        raise InvalidAddressError(f"kernel {name!r} argument {i}: {exc}") from exc


def _launch_checked(ctx: Any, checker: Any, source: str, name: str, options: tuple[str, ...],
                    types: list, values: list) -> None:
    lib = emu.library(source, name, options, sanitize=True)
    view = ctx._view
    host = list(values)
    bases: dict[int, int] = {}  # allocation lo -> its index in bufs
    los: list[int] = []
    bufs: list[np.ndarray] = []
    owners = [-1] * len(values)  # the buffer each pointer argument lies in
    for i, (t, v) in enumerate(zip(types, values, strict=True)):
        if t is not ctypes.c_void_p or not v:
            continue
        ext = checker.extent(v)
        if ext is None or ext[1] == ext[0]:  # memory the sanitizer does not track (pinned)
            host[i] = _host(view, name, i, v)
            continue
        lo, hi = ext
        k = bases.get(lo)
        if k is None:
            try:
                buf = view(lo, (hi - lo,), _U8, False)
            except InvalidAddressError:
                checker.unmapped(ctx, v)  # a use after free is found (and raised) here
                raise
            k = bases[lo] = len(bufs)
            los.append(lo)
            bufs.append(buf)
        host[i] = bufs[k].ctypes.data + (v - lo)
        owners[i] = k
    run = emu.launch_checked(lib, host, types, ctx.grid, ctx.block, bufs, owners,
                             shared_mem=ctx.shared_mem)
    oob = run.oob
    checker.judge(ctx, [(lo, run.runs(k, 1), run.runs(k, 2)) for k, lo in enumerate(los)],
                  None if oob is None else (los[oob.buffer], oob.offset, oob.size, oob.write))
    run.commit()
