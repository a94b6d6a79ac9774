"""Executors: the opaque plan that phase 1 returns and phase 2 enqueues (``aclOpExecutor``).

State of one executor (DESIGN.md §4):
- ``_state``: READY (may run); CONSUMED (a one-shot executor that ran: its release is queued on
  the stream behind its kernels); RELEASED (destroyed, evicted from a cache, or released once
  its work completed). RELEASED is final; ``_ran`` tells "already ran" from "destroyed" in errors.
- ``_repeatable``: set by ``set_repeatable()`` before the first run. A repeatable executor stays
  READY after a run, and only its addresses can change (``set_input_addr``/``set_output_addr``);
  its shapes, dtypes, implementation, tiling and workspace size are fixed at phase 1.
- ``_addrs``: one device pointer per tensor slot, inputs then outputs (None for an absent
  optional input). ``_enqueue`` passes them to the kernels as launch arguments, so work already
  enqueued keeps the addresses it was enqueued with: a later ``set_*_addr`` (or a cache hit with
  new tensors) never changes it.
- ``_owner``: the creating thread. Every public call from another thread raises ExecutorError
  (the seed's rule: two-phase resources belong to the calling thread, like aclnn's cache).
- ``_site``: where phase 1 was called (``(file, line)``, "" inside ``ops.run``), for the leak
  warning.
Module state: ``_live`` counts executors created and not yet RELEASED (``live_executors`` in
``ops.stats()``), guarded by ``_lock``. ``_release`` is idempotent, so the owner's ``destroy`` and
the queued release may race harmlessly.

Lifetime (aclnn's rules): a one-shot executor is released after its one run; a repeatable one,
or one that never ran, must be destroyed by its user (``destroy()``, or ``with ex:``). One
garbage-collected while still READY is a leak of the program: ``__del__`` warns
(``ResourceWarning``, naming the op and the phase-1 call site) and releases it, so that
``live_executors`` does not grow forever. Executors that an ``ExecutorCache`` holds, a graph
keeps, or ``ops.run`` releases are never collected while READY, so they never warn; nor does a
CONSUMED one collected before its queued release ran (its work was discarded).

Release choice: a one-shot executor is released by a host function enqueued right after its
kernels (``stream.launch_host_func``): "when its work completes" in stream order, with no
bookkeeping at synchronize points. The enqueued kernels hold their own arguments (addresses,
tiling, workspace pointer), never the executor, so ``destroy`` can release at once whatever is
still queued.

Capture (issue 5): ``_enqueue(stream, workspace)`` is the whole phase-2 enqueue and calls only
stream methods (``launch``), so capturing it records plain kernel nodes. A graph that captures an
executor must keep a reference to it (DESIGN.md §4) and must not capture the one-shot release
that ``_launch`` queues after ``_enqueue``; ``_launch`` is the place to branch on capture.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ExecutorError
from ..instrument import format_site
from ..labels import labelled
from ..pool import device_of, usable_bytes
from ..validate import is_int

if TYPE_CHECKING:
    from ..device import Device
    from ..stream import Stream
    from ..tensor import TensorDesc
    from .framework import Op, Plan

__all__ = ["Executor", "live_executors", "NULLPTR", "PARAM_INVALID", "INNER"]

# ACLNN status codes (aclnn_base.h)
NULLPTR = 161001
PARAM_INVALID = 161002
INNER = 561000
INNER_INFERSHAPE = 561001
INNER_TILING = 561002
INNER_FIND_KERNEL = 561003

READY, CONSUMED, RELEASED = 0, 1, 2

_lock = threading.Lock()
_live = 0


def live_executors() -> int:
    """Executors created and not yet released (destroyed, evicted, or one-shot and done)."""
    return _live


def check_room(what: str, ptr: int, need: int, device: Any, align: int = 1) -> int:
    """``ptr`` must be in live memory of ``device`` with ``need`` bytes from it (pointer
    arithmetic inside an allocation is fine) and a multiple of ``align``; returns the bytes
    there."""

    have = usable_bytes(ptr)
    if have is None:
        raise ExecutorError(f"{what}: {hex(ptr)} is not in a live device allocation (freed, or "
                            "never allocated)", PARAM_INVALID)
    if device_of(ptr) is not device:
        raise ExecutorError(f"{what}: {hex(ptr)} is not memory of {device.name}", PARAM_INVALID)
    if have < need:
        raise ExecutorError(f"{what}: {hex(ptr)} holds {have} bytes, {need} are needed",
                            PARAM_INVALID)
    if ptr % align:  # the cpu backend would not care; a GPU kernel faults, and the context dies
        raise ExecutorError(f"{what}: {hex(ptr)} is not aligned to {align} bytes "
                            "(cudaErrorMisalignedAddress on a GPU)", PARAM_INVALID)
    return have


class Executor:
    """Phase 1's product: the validated plan of one operator call (``aclOpExecutor``).

    Lifetime, as in aclnn: a non-repeatable executor runs once and is released when that run's
    work completes (nothing to do). A repeatable one (``set_repeatable()``), or one that was
    never run, must be destroyed: ``ex.destroy()`` (``aclDestroyAclOpExecutor``), or use it as
    a context manager, ``with ex: ...``, which destroys it on leaving (work already enqueued
    keeps its own arguments and completes). One dropped undestroyed is released when collected,
    with a ``ResourceWarning`` naming the operator and where it was planned. Executors owned by
    an ``ops.ExecutorCache`` or made by ``ops.run`` are released by them.
    """

    __slots__ = (
        "op", "op_name", "device", "impl", "tiling", "descs", "n_inputs", "_ws", "_fn",
        "_addrs", "_repeatable", "_state", "_ran", "_owner", "_runs", "_ins", "_outs", "_checked", "_counts",
        "_site", "__weakref__",
    )

    def __init__(
        self, op: Op, plan: Plan, addrs: list[int | None], descs: list[TensorDesc | None],
        device: Device, n_inputs: int,
    ) -> None:
        global _live
        self.op = op
        self.op_name = op.name
        self.device = device
        self.impl = plan.impl
        self.tiling = plan.tiling
        self.descs = tuple(descs)
        self.n_inputs = n_inputs
        self._ws = plan.workspace_size
        self._fn: Callable[[Stream, int | None, list], None] | None = plan.enqueue
        self._addrs = addrs
        self._repeatable = False
        self._ran = False
        self._site: Any = ""
        self._owner = threading.current_thread()
        self._runs = 0
        # the owner thread's counters of the op: only the owner runs an executor (phase 2 checks
        # it; ops.run's cache is per thread), so they are added to without a lock (see OpStats)
        self._counts = op._stats.counters()
        self._checked: list | None = None  # the addresses the overlap check last accepted
        # (slot, first byte, end byte, metadata) of each input and output holding elements
        spans = [(i, d._boff, d._boff + d._extent * d.itemsize, d.key)
                 for i, d in enumerate(descs) if d is not None and d.numel]
        self._ins = tuple(sp for sp in spans if sp[0] < n_inputs)
        self._outs = tuple(sp for sp in spans if sp[0] >= n_inputs)
        with _lock:
            _live += 1
        self._state = READY  # last: ``__del__`` releases only an executor that was counted

    def __repr__(self) -> str:
        state = ("ready", "ran, release queued", "released")[self._state]
        rep = " repeatable" if self._repeatable else ""
        return (f"<Executor {self.op_name} impl={self.impl} workspace={self._ws}B{rep} {state}>")

    # -- cheap reads ----------------------------------------------------------------------------
    @property
    def workspace_size(self) -> int:
        """The exact workspace bytes phase 2 needs (what ``get_workspace_size`` returned)."""
        return self._ws

    @property
    def repeatable(self) -> bool:
        """Whether the executor may run more than once."""
        return self._repeatable

    # -- public calls (owner thread only) --------------------------------------------------------
    def _check_owner(self, what: str) -> None:
        if threading.current_thread() is not self._owner:
            raise ExecutorError(
                f"{what}: executor of ops.{self.op_name} belongs to thread {self._owner.name!r}, "
                f"not {threading.current_thread().name!r}; executors are per thread",
                PARAM_INVALID,
            )

    def _check_runnable(self, what: str) -> None:
        if self._state != READY:
            if self._ran and not self._repeatable:
                raise ExecutorError(
                    f"{what}: this ops.{self.op_name} executor already ran once; call "
                    "set_repeatable() before its first run, or plan again", PARAM_INVALID)
            raise ExecutorError(f"{what}: this ops.{self.op_name} executor was destroyed",
                                PARAM_INVALID)

    def set_repeatable(self) -> None:
        """Allow repeated runs (``aclSetAclOpExecutorRepeatable``); only before the first run."""
        self._check_owner("set_repeatable")
        self._check_runnable("set_repeatable")
        if self._ran:
            raise ExecutorError("set_repeatable must come before the first run", PARAM_INVALID)
        self._repeatable = True

    def set_input_addr(self, index: int, ptr: int) -> None:
        """Point input ``index`` at ``ptr`` for later runs (``aclSetInputTensorAddr``)."""
        self._set_addr("set_input_addr", index, ptr, 0, self.n_inputs)

    def set_output_addr(self, index: int, ptr: int) -> None:
        """Point output ``index`` at ``ptr`` for later runs (``aclSetOutputTensorAddr``)."""
        self._set_addr("set_output_addr", index, ptr, self.n_inputs, len(self._addrs))

    def _set_addr(self, what: str, index: Any, ptr: Any, lo: int, hi: int) -> None:
        self._check_owner(what)
        self._check_runnable(what)
        if not self._repeatable:
            raise ExecutorError(f"{what}: only a repeatable executor changes addresses; call "
                                "set_repeatable() first", PARAM_INVALID)
        if not is_int(index):
            raise ExecutorError(f"{what}: index must be an int, not {type(index).__name__}",
                                PARAM_INVALID)
        if not 0 <= index < hi - lo:
            raise ExecutorError(f"{what}: index {index} out of range: ops.{self.op_name} has "
                                f"{hi - lo}", PARAM_INVALID)
        slot = lo + int(index)
        if self._addrs[slot] is None:
            raise ExecutorError(f"{what}: slot {index} was planned without a tensor (None); "
                                "plan again to use one", PARAM_INVALID)
        if ptr is None or (isinstance(ptr, int | np.integer) and ptr == 0):
            raise ExecutorError(f"{what}: null pointer", NULLPTR)
        if not is_int(ptr) or ptr < 0:
            raise ExecutorError(f"{what}: ptr must be a device pointer int, not {ptr!r}",
                                PARAM_INVALID)
        # the memory is checked as phase 2 checks a workspace: live, on this device, with room
        ptr = int(ptr)
        desc = self.descs[slot]
        check_room(what, ptr, desc.storage_nbytes, self.device, desc.itemsize)
        self._addrs[slot] = ptr

    def destroy(self) -> None:
        """Release the executor (``aclDestroyAclOpExecutor``); a no-op once it was released."""
        self._check_owner("destroy")
        self._release()

    def __enter__(self) -> Executor:
        """``with ex:``: the executor, destroyed when the block ends (even by an exception)."""
        self._check_owner("with")
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __del__(self) -> None:
        try:
            state = self._state
        except AttributeError:  # __init__ failed before counting it
            return
        if state == RELEASED:
            return
        try:
            self._release()  # first: counted right even if the warning is turned into an error
            if state == READY:  # nobody destroyed it: the program's leak (see the module doc)
                site = self._site
                where = f" planned at {format_site(site)}" if site else ""
                what = (f"ran {self._runs} time(s)" if self._ran else "never ran")
                warnings.warn(
                    f"ops.{self.op_name} executor{where} was garbage-collected undestroyed "
                    f"({'repeatable, ' if self._repeatable else ''}{what}); call "
                    "ex.destroy() or use `with ex:` (released now)", ResourceWarning,
                    stacklevel=2)
        except Warning:  # -W error: raised, so that it shows (as an unraisable exception)
            raise
        except Exception:  # noqa: S110 - interpreter shutdown: module globals may be gone
            pass

    # -- phase 2 internals ---------------------------------------------------------------------
    def _enqueue(self, stream: Stream, workspace: int | None) -> None:
        """The whole phase-2 enqueue: only stream methods, addresses passed by value (the
        cache-hit path of ``ops.run`` calls ``_fn`` as this does, without the extra call)."""
        self._fn(stream, workspace, self._addrs)

    def _check_overlap(self) -> None:
        """Refuse an output sharing memory with an input unless it is that very view (in place):
        kernels that read an input after writing part of the output (a scan's blocks, a norm's
        weights) gave silently wrong results. Conservative on byte ranges, as PyTorch's
        partial-overlap check; addresses change per run (cache hits, set_*_addr): callers check
        again only when they differ from ``_checked``, the last addresses that passed (the spans
        are fixed at phase 1)."""
        addrs, ins = self._addrs, self._ins
        for o, lo, hi, key in self._outs:
            a = addrs[o]
            lo += a
            hi += a
            for i, ilo, ihi, ikey in ins:
                b = addrs[i]
                if lo < b + ihi and b + ilo < hi and (a != b or key != ikey):
                    raise ExecutorError(
                        f"ops.{self.op_name}: output {o - self.n_inputs} overlaps input {i} "
                        "without being the same view; only an exact in-place alias is allowed",
                        PARAM_INVALID)
        self._checked = addrs[:]  # a copy: set_*_addr changes ``_addrs`` in place

    def _launch(self, stream: Stream, workspace: int | None, hit: bool = False) -> None:
        """Enqueue, count (``hit``: a cache hit), and queue a one-shot executor's release."""
        if self._addrs != self._checked:  # else the check passed for these very addresses
            self._check_overlap()
        try:
            self._enqueue(stream, workspace)
        except BaseException:
            if not self._repeatable:  # partly enqueued: it can never run cleanly again
                self._ran = True
                self._release()
            raise
        self._ran = True
        self._runs += 1
        c = self._counts  # calls, reuses, cache hits (see OpStats)
        c[0] += 1
        if self._runs > 1:
            c[1] += 1
        if hit:
            c[2] += 1
        if not self._repeatable:
            self._state = CONSUMED
            # captured: the graph (and every clone and exec of it) owns the executor; it is
            # released when the last of them is gone, not by a host node at each replay
            stream._target.release_after(stream, self._release)

    @labelled("executor release")  # the host function a one-shot run enqueues after its kernels
    def _release(self) -> None:
        global _live
        with _lock:
            if self._state == RELEASED:
                return
            self._state = RELEASED
            _live -= 1
        self._fn = None  # drop the plan (closures, tiling) now, whatever still references us
