"""A CUDA C kernel launched on a cpu stream: its source run by the emulator (``streamrt.emu``).

It runs as the kernel's body, so as one operation on the stream's queue, in stream order, in
graphs as any kernel node. Pointer arguments are device addresses of this backend; each must
lie in a live allocation this device may reach (its own, pinned host memory, a peer's with
access enabled: the device's ``view`` decides, as for a Python kernel) and is passed as the
host address of its backing bytes; NULL stays NULL. Scalars are checked and packed as the
cuda backend packs them (``nvrtc.packer``), so a launch refused here is refused there too.
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
    lib = emu.library(source, name, options)
    view = ctx._view  # the device's own view: the bounds and reach checks of a Python kernel
    host = list(values)
    for i, (t, v) in enumerate(zip(types, values, strict=True)):
        if t is ctypes.c_void_p and v:
            try:
                host[i] = view(v, (1,), _U8, False).ctypes.data
            except InvalidAddressError as exc:
                raise InvalidAddressError(f"kernel {name!r} argument {i}: {exc}") from exc
    emu.launch(lib, host, types, ctx.grid, ctx.block, shared_mem=ctx.shared_mem)
