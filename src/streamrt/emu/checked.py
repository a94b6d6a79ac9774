"""A launch that records what it touches: the sanitizer's way to run an emulated kernel.

The kernel (its ``sanitize`` build: ``sanitize.h``) runs on copies of the memory its pointer
arguments reach, each between two zeroed redzones of :data:`REDZONE` bytes, so that a stray
access near an allocation lands in our memory, not the program's (a farther one is not seen).
After the launch, :class:`Checked` holds per buffer a shadow byte per byte (1 read, 2 written)
and the first out-of-bounds access, if any. g++ checks one access per address in a stretch of
code, so a store after a load of the same place (``x[i] += 1``) is seen as the load only: a byte
whose value changed is marked written too (a store of the value already there stays unseen), and
a changed redzone byte is an out-of-bounds write. :meth:`Checked.commit` copies back only the
bytes the kernel wrote, so that launches on other streams writing other parts of one buffer
at the same time keep what they wrote. Pointers outside every buffer are passed as they are.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import LaunchError
from .runner import Library, _params

REDZONE = 16 << 10  # bytes either side of each copy


class _Range(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_ulonglong), ("hi", ctypes.c_ulonglong),
                ("shadow", ctypes.c_void_p)]


class _Oob(ctypes.Structure):
    _fields_ = [("range", ctypes.c_longlong), ("offset", ctypes.c_longlong),
                ("size", ctypes.c_ulonglong), ("count", ctypes.c_ulonglong),
                ("write", ctypes.c_int)]


class OutOfBounds(NamedTuple):
    """The first access of a launch that left its buffer: buffer index, first byte from the
    buffer's start (negative: before it), size, whether it wrote, how many such accesses."""

    buffer: int
    offset: int
    size: int
    write: bool
    count: int


class Checked:
    """What one checked launch touched (see the module docstring)."""

    __slots__ = ("buffers", "copies", "shadows", "oob")

    def __init__(self, buffers: list[np.ndarray], copies: list[np.ndarray],
                 shadows: list[np.ndarray], oob: OutOfBounds | None) -> None:
        self.buffers, self.copies, self.shadows, self.oob = buffers, copies, shadows, oob

    def runs(self, i: int, bit: int) -> list[tuple[int, int]]:
        """The byte runs ``[a, b)`` of buffer ``i`` whose shadow has ``bit`` (1 read, 2 write)."""
        m = (self.shadows[i] & bit).astype(bool).view(np.int8)
        d = np.diff(m, prepend=np.int8(0), append=np.int8(0))
        return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(),
                        strict=True))

    def commit(self) -> None:
        """Copy the bytes the kernel wrote back into the buffers."""
        for buf, copy, shadow in zip(self.buffers, self.copies, self.shadows, strict=True):
            np.copyto(buf, copy[REDZONE:REDZONE + buf.size], where=(shadow & 2).astype(bool))


def launch_checked(lib: Library, values: Sequence[Any], types: Sequence[type],
                   grid: Sequence[int], block: Sequence[int], buffers: list[np.ndarray],
                   owners: Sequence[int], *, shared_mem: int = 0,
                   order: str | None = None) -> Checked:
    """Run one launch of ``lib`` (a ``sanitize`` build) on copies of ``buffers`` (contiguous
    ``uint8`` arrays): value ``j`` with ``owners[j] = k >= 0`` is a host address inside buffer
    ``k`` (its end included: buffers may touch), moved into its copy; the others are passed as
    they are. Nothing is written back until :meth:`Checked.commit`."""
    if not lib.sanitize:
        raise ValueError(f"{lib.name}: not the sanitize build")
    copies, shadows, snaps = [], [], []
    table = (_Range * max(len(buffers), 1))()
    moved = list(values)
    for i, buf in enumerate(buffers):
        n = buf.size
        copy = np.zeros(n + 2 * REDZONE, np.uint8)
        copy[REDZONE:REDZONE + n] = buf
        snaps.append(copy[REDZONE:REDZONE + n].copy())  # what the kernel saw: its changes show
        shadow = np.zeros(n, np.uint8)
        at, lo = buf.ctypes.data, copy.ctypes.data + REDZONE
        for j, k in enumerate(owners):
            if k == i:
                moved[j] = lo + (values[j] - at)
        table[i] = _Range(lo, lo + n, shadow.ctypes.data)
        copies.append(copy)
        shadows.append(shadow)
    params, keep = _params(lib, moved, types)
    gx, gy, gz = grid
    bx, by, bz = block
    c = lib.lib
    c.srt_emu_san_set(ctypes.addressof(table), len(buffers), REDZONE)
    try:
        lib.launch(params, gx, gy, gz, bx, by, bz, order, shared_mem)
    except RuntimeError as exc:
        raise LaunchError(str(exc)) from exc
    finally:
        first = _Oob()
        c.srt_emu_san_get(ctypes.addressof(first))
        c.srt_emu_san_set(None, 0, 0)
    del keep
    oob = None if not first.count else OutOfBounds(
        first.range, first.offset, first.size, bool(first.write), first.count)
    for i, (snap, copy, shadow) in enumerate(zip(snaps, copies, shadows, strict=True)):
        n = snap.size
        shadow[copy[REDZONE:REDZONE + n] != snap] |= 2  # stores g++ did not check (see above)
        if oob is None:
            below = np.flatnonzero(copy[:REDZONE])
            above = np.flatnonzero(copy[REDZONE + n:])
            if below.size or above.size:  # written, unseen, in a redzone
                off = int(below[0]) - REDZONE if below.size else n + int(above[0])
                oob = OutOfBounds(i, off, 1, True, int(below.size + above.size))
    return Checked(buffers, copies, shadows, oob)
