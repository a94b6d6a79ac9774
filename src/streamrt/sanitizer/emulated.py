"""The sanitizer's side of an emulated CUDA C launch (``KernelContext.emu_checker`` while it is on).

An emulating backend (the cpu backend's ``launch_cuda_c``) asks :meth:`EmulatedChecker.extent`
for the allocation each pointer argument lies in (its requested bytes, so the rounding after it
is out of bounds), runs the kernel's recording build on copies of those (``emu.checked``), then
hands what it touched to :meth:`EmulatedChecker.judge` before it writes anything back: the bytes
read and the bytes written, per allocation, are checked as a Python kernel's views are (stream
order, use after free, races), and the first access outside an allocation is an out-of-bounds
finding naming the kernel and its launch line, which stops the kernel (SanitizerError, its
writes dropped), as compute-sanitizer stops a faulting kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checker import Sanitizer

_MAX_RUNS = 4096  # byte runs declared one by one; past it, their whole span


class EmulatedChecker:
    """The checks of one sanitizer for emulated kernels (see the module docstring)."""

    def __init__(self, san: Sanitizer, current_op: Callable[[], Any],
                 check: Callable[[Any, int, int, bool, list | None], None],
                 stop: Callable[[Any, Any], None]) -> None:
        self._san = san
        self._op = current_op  # the operation running now (the launch)
        self._check = check  # (ctx, ptr, nbytes, write, runs): one declared access, judged
        self._stop = stop  # (ctx, finding): raise where the kernel must stop

    def extent(self, ptr: int) -> tuple[int, int] | None:
        """``(lo, hi)``: the requested bytes of the allocation the running launch means by
        ``ptr`` (its end included), live or freed; None when the sanitizer tracks none there."""
        op = self._op()
        if op is None:
            return None
        san = self._san
        with san._lock:
            g = san._scan(op, ptr, ptr + 1) or (san._scan(op, ptr - 1, ptr) if ptr else None)
        if g is None or not g.lo <= ptr <= g.hi:
            return None
        return g.lo, g.hi

    def unmapped(self, ctx: Any, ptr: int) -> None:
        """A pointer argument whose allocation is no longer mapped: judged as the access of one
        byte there (a use after free is found, and raised: the memory is gone)."""
        self._check(ctx, ptr, 1, False, None)

    def judge(self, ctx: Any, touched: list[tuple[int, list, list]],
              oob: tuple[int, int, int, bool] | None) -> None:
        """Check a launch's accesses: ``touched`` per allocation ``(lo, read runs, written
        runs)`` (byte offsets ``[a, b)`` from ``lo``); ``oob`` the first access outside one
        ``(lo, offset, size, write)``, reported and raised first."""
        if oob is not None:
            self._out_of_bounds(ctx, *oob)
        for lo, reads, writes in touched:
            for runs, write in ((reads, False), (writes, True)):
                if not runs:
                    continue
                a, b = runs[0][0], runs[-1][1]
                exact = None if len(runs) == 1 or len(runs) > _MAX_RUNS else [
                    (lo + x, lo + y) for x, y in runs]
                self._check(ctx, lo + a, b - a, write, exact)

    def _out_of_bounds(self, ctx: Any, lo: int, offset: int, size: int, write: bool) -> None:
        op = self._op()
        if op is None:
            return
        san = self._san
        with san._lock:
            g = san._scan(op, lo, lo + 1)
            if g is None:
                return
            n = g.hi - g.lo
            where = (f"{-offset} B before its start" if offset < 0 else
                     f"{offset - n} B past its end" if offset >= n else "across its end")
            f = san._find("out-of-bounds", lo + offset, size, op, g.alloc,
                          f"{op.describe()} {'writes' if write else 'reads'} {size} B at "
                          f"{hex(lo + offset)}, {where}: outside its {g.label} [{hex(g.lo)}, "
                          f"{hex(g.hi)}) from {g.alloc.describe()}")
        self._stop(ctx, f)
