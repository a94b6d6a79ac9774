"""The two-phase operator framework (DESIGN.md §4): ``Op``, ``Plan``, the checks of both phases.

Phase 1 (``op.get_workspace_size(*tensors, **attrs)``) validates metadata only: arity, None
tensors (161001), types, devices, dtypes, formats, self-overlapping outputs and attributes
(161002), then asks the subclass for a :class:`Plan` (output shape checks, implementation,
tiling, exact workspace) from the planner of the tensors' backend (``_plan_for``): ``_plan``
(Python kernels) or, on cuda, ``_plan_cuda`` (CUDA C kernels, ``ops/cuda``; on cpu too under
:func:`use_cuda_c`, where the emulator runs them). It never reads
tensor data. An unexpected exception inside planning is an inner error (561000) chained to its
cause. The executor is created last, so a refused phase 1 leaves nothing behind.

Phase 2 (``op(workspace, workspace_size, executor, stream)``) checks everything before the
first enqueue: the executor (type, op, owner thread, not destroyed, one-shot not yet run), the
size (exactly phase 1's), the workspace (None only when the size is 0, else a live allocation
on the executor's device of at least that size) and the stream. A refused call enqueues
nothing and does not consume a one-shot executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .. import instrument
from ..errors import ExecutorError, StreamRTError
from ..stream import Stream, current_stream
from ..tensor import Tensor, TensorDesc
from ..validate import check_bool, env_flag, is_bool, is_int
from .common import FLOATS, WS_ALIGN
from .docs import attr_type, compose
from .executor import (
    INNER,
    INNER_FIND_KERNEL,
    NULLPTR,
    PARAM_INVALID,
    Executor,
    check_room,
    live_executors,
)
from .stats import OpStats

__all__ = ["Op", "Plan", "Attr", "OPS", "CUDA_C_ENV", "use_cuda_c", "stats", "float_attr",
           "bool_attr", "int_attr", "axes_attr", "optional_int_attr"]

OPS: dict[str, Op] = {}
CUDA_C_ENV = "STREAMRT_OPS_CUDA_C"  # 1: the operators run their CUDA C on cpu too (read at import)
# whether cpu plans are the CUDA C ones (use_cuda_c); a list, so tests and threads see one value
_cuda_c = [bool(env_flag(CUDA_C_ENV))]


def use_cuda_c(enabled: bool = True) -> bool:
    """Plan the operators on cpu with their CUDA C kernels, run by the CUDA C emulator (as on
    cuda), or again with their Python kernels (``enabled=False``); returns the previous setting.
    Executors planned before keep their kernels; cached ones are not reused (every ``Op.version``
    moves on)."""
    on = check_bool(enabled, "use_cuda_c(enabled)")
    was = _cuda_c[0]
    if on:
        from ..emu import require

        require()  # g++ missing: BackendUnavailableError now, not at some later launch
    if on != was:
        _cuda_c[0] = on
        for op in OPS.values():
            type(op).version += 1  # ExecutorCache keys hold it: no hit on the other kind of plan
    return was
ND_FORMATS = ("ND", "NCHW", "NHWC", "NCDHW", "NDHWC")


class Plan(NamedTuple):
    """What an op's planner returns: exact workspace bytes and the enqueue closure."""

    workspace_size: int
    enqueue: Callable[[Stream, int | None, list], None]
    impl: str
    tiling: dict


class Attr(NamedTuple):
    """An attribute: a checker ``check(op_name, attr_name, value) -> value``, a default, and
    what it means (one sentence, for the operator's docstring and ``streamrt info --ops``)."""

    check: Callable[[str, str, Any], Any]
    default: Any
    doc: str = ""

    def __repr__(self) -> str:
        return f"Attr({attr_type(self.check)}, default={self.default!r})"


def _bad(op: str, msg: str, code: int = PARAM_INVALID) -> ExecutorError:
    return ExecutorError(f"ops.{op}: {msg}", code)


def float_attr(op: str, name: str, v: Any) -> float:
    """A real number (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise _bad(op, f"{name} must be a real number, not {v!r}")
    return float(v)


def bool_attr(op: str, name: str, v: Any) -> bool:
    """A bool."""
    if not is_bool(v):
        raise _bad(op, f"{name} must be a bool, not {v!r}")
    return bool(v)


def int_attr(op: str, name: str, v: Any) -> int:
    """An int (not a bool)."""
    if not is_int(v):
        raise _bad(op, f"{name} must be an int, not {v!r}")
    return int(v)


def optional_int_attr(op: str, name: str, v: Any) -> int | None:
    """None or an int."""
    return None if v is None else int_attr(op, name, v)


def axes_attr(op: str, name: str, v: Any) -> tuple[int, ...] | None:
    """None (every axis), an int, or a sequence of ints."""
    if v is None:
        return None
    if is_int(v):
        return (int(v),)
    if isinstance(v, tuple | list):
        return tuple(int_attr(op, name, a) for a in v)
    raise _bad(op, f"{name} must be None, an int or a tuple of ints, not {v!r}")


def normalize_axis(op: str, axis: int, ndim: int, name: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` -> ``[0, ndim)``; else a 161002 ExecutorError."""
    if not -ndim <= axis < ndim:
        raise _bad(op, f"{name} {axis} is out of range for {ndim} dimension(s)")
    return axis % ndim


class Op:
    """Base of the two-phase operators: declares tensor slots and attributes; plans in ``_plan``.

    A subclass with a ``name`` gets its docstring composed from its declarations (``ops.docs``):
    its own docstring (what it computes), ``slot_docs``, each ``Attr``'s doc, ``dtype_doc`` and
    ``workspace_doc``; ``help(ops.<name>)`` shows it.
    """

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1  # part of every cache key: bump it when a plan changes
    inputs: ClassVar[tuple[str, ...]] = ()
    optional: ClassVar[frozenset[str]] = frozenset()
    outputs: ClassVar[tuple[str, ...]] = ("out",)
    attrs: ClassVar[dict[str, Attr]] = {}
    dtypes: ClassVar[tuple[np.dtype, ...]] = FLOATS
    formats: ClassVar[tuple[str, ...]] = ND_FORMATS
    slot_docs: ClassVar[dict[str, str]] = {}  # one line per tensor slot
    dtype_doc: ClassVar[str] = ("Mixed dtypes are accepted on cpu (computed in float32, or "
                                "float64 if any tensor is); cuda needs one dtype for every tensor.")
    workspace_doc: ClassVar[str] = "0 bytes."  # what phase 1's workspace holds, and when
    _written_doc: ClassVar[str] = ""  # the subclass's own docstring, before composing

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name"):  # an operator (not an abstract family like _Binary)
            cls._written_doc = cls.__dict__.get("__doc__") or ""
            cls.__doc__ = compose(cls)

    def __init__(self) -> None:
        self._stats = OpStats()
        self._slots = self.inputs + self.outputs
        self._defaults = {k: a.default for k, a in self.attrs.items()}
        OPS[self.name] = self

    def __repr__(self) -> str:
        return f"<op {self.name}({', '.join(self._slots)})>"

    # -- phase 1 ---------------------------------------------------------------------------------
    def get_workspace_size(self, *tensors: Any, **attrs: Any) -> tuple[int, Executor]:
        """Phase 1 (``aclnnXxxGetWorkspaceSize``): validate metadata, plan; never reads data."""
        ex = self._make(tensors, attrs)
        ex._site = instrument._raw_site()  # where it was planned, named if it leaks (cheap)
        return ex._ws, ex

    def _make(self, tensors: tuple, attrs: dict[str, Any]) -> Executor:
        name = self.name
        if len(tensors) != len(self._slots):
            raise _bad(name, f"takes {len(self._slots)} tensors ({', '.join(self._slots)}), "
                             f"got {len(tensors)}")
        descs: list[TensorDesc | None] = []
        addrs: list[int | None] = []
        device = None
        for slot, t in zip(self._slots, tensors):
            if t is None:
                if slot in self.optional:
                    descs.append(None)
                    addrs.append(None)
                    continue
                raise _bad(name, f"{slot} is None (a null tensor)", NULLPTR)
            if not isinstance(t, Tensor):
                raise _bad(name, f"{slot} must be a srt.Tensor, not {type(t).__name__}")
            if t._ptr is None:
                raise _bad(name, f"{slot} was freed (its pointer is null)", NULLPTR)
            d = t.desc
            if d.dtype not in self.dtypes:
                raise _bad(name, f"{slot} has dtype {d.dtype}; supported: "
                                 f"{', '.join(dt.name for dt in self.dtypes)}")
            if d.format not in self.formats:
                raise _bad(name, f"{slot} has format {d.format}; supported: "
                                 f"{', '.join(self.formats)}")
            if device is None:
                device = t.device
            elif t.device is not device:
                raise _bad(name, f"{slot} is on {t.device.name}, the other tensors on "
                                 f"{device.name}")
            descs.append(d)
            addrs.append(t._ptr)
        n_in = len(self.inputs)
        for slot, d in zip(self.outputs, descs[n_in:]):
            if d.overlaps_itself():
                raise _bad(name, f"{slot} {d!r} has overlapping elements (a zero stride); an "
                                 "output must not write one element twice")
        values = dict(self._defaults)
        for k, v in attrs.items():
            spec = self.attrs.get(k)
            if spec is None:
                known = ", ".join(self.attrs) or "no attributes"
                raise _bad(name, f"unknown attribute {k!r} (it takes {known})")
            values[k] = spec.check(name, k, v)
        backend = device.backend if device is not None else "cpu"
        try:
            plan = self._plan_for(backend, descs[:n_in], descs[n_in:], values)
        except StreamRTError:
            raise
        except Exception as exc:  # a planner bug: an inner error, never a bare Python exception
            raise _bad(name, f"internal error while planning: {exc!r}", INNER) from exc
        ex = Executor(self, plan, addrs, descs, device, n_in)
        self._stats.planned(ex)
        return ex

    def _plan_for(self, backend: str, ins: list[TensorDesc | None], outs: list[TensorDesc],
                  attrs: dict) -> Plan:
        """The planner of ``backend``: ``_plan_cuda`` on cuda (and on cpu under :func:`use_cuda_c`),
        ``_plan`` (Python kernels) elsewhere."""
        if backend == "cuda":
            return self._plan_cuda(ins, outs, attrs)
        if _cuda_c[0] and backend == "cpu":
            from ..emu import require

            require()  # (the setting came from the environment: g++ checked at the first plan)
            return self._plan_cuda(ins, outs, attrs)
        return self._plan(ins, outs, attrs)

    def _plan(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        """Subclass hook: check shapes/attrs, infer outputs, choose impl/tiling, size workspace."""
        raise NotImplementedError

    def _plan_cuda(self, ins: list[TensorDesc | None], outs: list[TensorDesc], attrs: dict) -> Plan:
        """Subclass hook: the same checks as ``_plan``, then a plan of CUDA C kernels (metadata only)."""
        raise self._bad("has no CUDA implementation", INNER_FIND_KERNEL)

    def _bad(self, msg: str, code: int = PARAM_INVALID) -> ExecutorError:
        return _bad(self.name, msg, code)

    def _check_shape(self, slot: str, d: TensorDesc, want: tuple[int, ...]) -> None:
        if d.shape != want:
            raise self._bad(f"{slot} has shape {d.shape}, expected {want}")

    # -- phase 2 ---------------------------------------------------------------------------------
    def __call__(self, workspace: int | None, workspace_size: int, executor: Executor,
                 stream: Stream | None = None) -> None:
        """Phase 2 (``aclnnXxx``): check the workspace and executor, then enqueue only.

        A non-repeatable executor is released once this run's work completes; a repeatable one
        stays until ``executor.destroy()`` (or the end of ``with executor:``)."""
        name = self.name
        if executor is None:
            raise _bad(name, "executor is None", NULLPTR)
        if type(executor) is not Executor:
            raise _bad(name, f"executor must be an Executor, not {type(executor).__name__}")
        if executor.op is not self:
            raise _bad(name, f"this executor was planned by ops.{executor.op_name}")
        executor._check_owner(f"ops.{name}")
        executor._check_runnable(f"ops.{name}")
        size = executor._ws
        if not is_int(workspace_size):
            raise _bad(name, f"workspace_size must be an int, not {workspace_size!r}")
        if workspace_size != size:
            raise _bad(name, f"workspace_size {workspace_size} differs from the {size} bytes "
                             "phase 1 returned; pass exactly that number")
        if stream is None:
            stream = current_stream()
        elif not isinstance(stream, Stream):
            raise _bad(name, f"stream must be a Stream, not {type(stream).__name__}")
        if stream.device is not executor.device:
            raise _bad(name, f"stream is on {stream.device.name}, the executor's tensors on "
                             f"{executor.device.name}")
        stream._check_alive()
        if workspace is None:
            if size:
                raise _bad(name, f"workspace is None but the executor needs {size} bytes", NULLPTR)
        else:
            _check_workspace(name, workspace, size, executor)
        executor._launch(stream, None if workspace is None else int(workspace))


def _check_workspace(name: str, ws: Any, size: int, ex: Executor) -> None:
    if not is_int(ws):
        raise _bad(name, f"workspace must be a device pointer int or None, not {type(ws).__name__}")
    ws = int(ws)
    if ws == 0:
        if size:
            raise _bad(name, f"workspace is a null pointer but the executor needs {size} bytes",
                       NULLPTR)
        return
    check_room(f"ops.{name}: workspace", ws, size, ex.device, WS_ALIGN if size else 1)
    for slot, lo, hi, _key in ex._ins + ex._outs if size else ():  # scratch: not its tensors
        a = ex._addrs[slot]
        if ws < a + hi and a + lo < ws + size:
            raise _bad(name, f"workspace {hex(ws)}+{size} overlaps tensor {slot} of the executor")
    # a workspace refused above is an error, not a sanitizer finding too: nothing was enqueued,
    # and a finding would raise again at the next synchronize an error the caller handled
    if instrument.listeners:
        instrument.notify("tag", ws, f"workspace of ops.{name}")  # names it in later findings


def stats(*, reset: bool = False) -> dict[str, Any]:
    """Per op: calls, plans, cache hits, reuses, workspace histogram; plus ``live_executors``."""
    out: dict[str, Any] = {}
    reset = check_bool(reset, "ops.stats reset")
    for name, op in OPS.items():
        out[name] = op._stats.snapshot(reset=reset)
    out["live_executors"] = live_executors()
    return out
