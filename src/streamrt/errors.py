"""The streamrt error hierarchy (API.md §6): one class per CUDA/ACL error, with its code and name.

Every deliberate error derives from :class:`StreamRTError`. ``code`` is the CUDA error number
where one exists (``None`` otherwise) and ``name`` the CUDA/ACL name; both are class attributes,
readable on instances too. Bad arguments raise the subclasses that are also ``ValueError`` or
``TypeError`` so that ordinary Python handlers catch them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

__all__ = [
    "StreamRTError",
    "InvalidValueError",
    "InvalidTypeError",
    "InvalidDeviceError",
    "InvalidAddressError",
    "InvalidHandleError",
    "OutOfMemoryError",
    "NotReadyError",
    "KernelCompileError",
    "NotSupportedError",
    "NotPermittedError",
    "IllegalStateError",
    "PeerAccessAlreadyEnabledError",
    "PeerAccessNotEnabledError",
    "LaunchError",
    "BackendUnavailableError",
    "CaptureError",
    "CaptureUnsupportedError",
    "CaptureInvalidatedError",
    "CaptureMergeError",
    "CaptureUnmatchedError",
    "CaptureUnjoinedError",
    "CaptureIsolationError",
    "CaptureImplicitError",
    "CapturedEventError",
    "CaptureWrongThreadError",
    "GraphExecUpdateError",
    "GraphInstantiateError",
    "ExecutorError",
    "ExecutorParamError",
    "SanitizerError",
]


class NamedIntEnum(IntEnum):
    """An ``IntEnum`` (equal to its int) that prints as ``Class.NAME``, as results in messages
    should: Python 3.11's ``IntEnum`` prints as the bare int (``str(result) == "2"``)."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        # a numeric spec (f"{r:d}", f"{r:#x}") formats the int; any other (f"{r}", f"{r:>30}") the name
        if spec and spec[-1] in "bcdoxXn%eEfFgG":
            return int.__format__(self, spec)
        return format(str(self), spec)


class StreamRTError(Exception):
    """Base of every deliberate streamrt error; ``code`` and ``name`` identify the CUDA/ACL error."""

    code: int | None = None
    name: str = "streamrtError"

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg} [{self.name}]" if self.name else msg


class InvalidValueError(StreamRTError, ValueError):
    """Raised when an argument has a bad value: negative size, out-of-range byte, bad flag."""

    code = 1
    name = "cudaErrorInvalidValue"


class InvalidTypeError(StreamRTError, TypeError):
    """Raised when an argument has the wrong type (a float where a pointer int is needed)."""

    code = 1
    name = "cudaErrorInvalidValue"


class OutOfMemoryError(StreamRTError, MemoryError):
    """Raised when a device, pool or pinned allocation cannot be satisfied."""

    code = 2
    name = "cudaErrorMemoryAllocation"


class InvalidDeviceError(StreamRTError, ValueError):
    """Raised for an unknown device spec or an index past the backend's device count."""

    code = 101
    name = "cudaErrorInvalidDevice"


class InvalidAddressError(StreamRTError, ValueError):
    """Raised when a pointer or range is not inside one live allocation (unknown, freed, overrun)."""

    code = 17
    name = "cudaErrorInvalidDevicePointer"


class InvalidHandleError(StreamRTError, ValueError):
    """Raised on a destroyed stream/event/pool/exec, or an event that cannot answer (no timing)."""

    code = 400
    name = "cudaErrorInvalidResourceHandle"


class IllegalStateError(StreamRTError):
    """Raised when an operation is not legal in the object's current state."""

    code = 401
    name = "cudaErrorIllegalState"


class PeerAccessAlreadyEnabledError(IllegalStateError):
    """Raised by ``dev.enable_peer_access(peer)`` when that access is already enabled."""

    code = 704
    name = "cudaErrorPeerAccessAlreadyEnabled"


class PeerAccessNotEnabledError(IllegalStateError):
    """Raised by ``dev.disable_peer_access(peer)`` when that access is not enabled."""

    code = 705
    name = "cudaErrorPeerAccessNotEnabled"


class NotReadyError(StreamRTError):
    """Raised when a result is asked for before the work producing it has completed."""

    code = 600
    name = "cudaErrorNotReady"


class LaunchError(StreamRTError):
    """Raised at the next synchronize after a kernel or host function raised; the cause is chained."""

    code = 719
    name = "cudaErrorLaunchFailure"


class KernelCompileError(LaunchError):
    """Raised when NVRTC (cuda), or g++ for the cpu backend's CUDA C emulator, cannot compile a
    kernel's CUDA source; ``.log`` is the compiler's log, its lines named ``kernel(LINE)``."""

    code = 6
    name = "NVRTC_ERROR_COMPILATION"

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class NotSupportedError(StreamRTError):
    """Raised for an operation the backend or object does not support."""

    code = 801
    name = "cudaErrorNotSupported"


class NotPermittedError(StreamRTError):
    """Raised for a call a kernel or host function may not make: waiting, from its stream's
    thread, for work queued behind it (it would wait forever; CUDA forbids API calls in host
    functions, ``cudaErrorNotPermitted``)."""

    code = 800
    name = "cudaErrorNotPermitted"


class BackendUnavailableError(StreamRTError):
    """Raised when a backend cannot be used here; the message says what is missing."""

    code = 100
    name = "cudaErrorNoDevice"


class CaptureError(StreamRTError):
    """Base of the stream-capture errors (CUDA 900-908)."""

    code = 900
    name = "cudaErrorStreamCaptureUnsupported"


class CaptureUnsupportedError(CaptureError):
    """Raised for an operation not permitted while a stream is capturing; invalidates the capture."""

    code = 900
    name = "cudaErrorStreamCaptureUnsupported"


class CaptureInvalidatedError(CaptureError):
    """Raised by ``end_capture`` (or enqueue) on a capture that an earlier error invalidated."""

    code = 901
    name = "cudaErrorStreamCaptureInvalidated"


class CaptureMergeError(CaptureError):
    """Raised when a capture would merge two independent captures (wait on another's event)."""

    code = 902
    name = "cudaErrorStreamCaptureMerge"


class CaptureUnmatchedError(CaptureError):
    """Raised when ``end_capture`` is called on a stream that did not begin the capture."""

    code = 903
    name = "cudaErrorStreamCaptureUnmatched"


class CaptureUnjoinedError(CaptureError):
    """Raised when a forked stream was not joined back to the origin before ``end_capture``."""

    code = 904
    name = "cudaErrorStreamCaptureUnjoined"


class CaptureIsolationError(CaptureError):
    """Raised when a capturing stream would depend on uncaptured work."""

    code = 905
    name = "cudaErrorStreamCaptureIsolation"


class CaptureImplicitError(CaptureError):
    """Raised when the legacy default stream is used while a blocking stream captures."""

    code = 906
    name = "cudaErrorStreamCaptureImplicit"


class CapturedEventError(CaptureError):
    """Raised when an event recorded during capture is synchronized or queried."""

    code = 907
    name = "cudaErrorCapturedEvent"


class CaptureWrongThreadError(CaptureError):
    """Raised when a non-relaxed capture is ended from a thread other than the one that began it."""

    code = 908
    name = "cudaErrorStreamCaptureWrongThread"


class GraphExecUpdateError(StreamRTError):
    """Raised when ``GraphExec.update`` refuses a graph; ``.result`` says why, ``.node`` where."""

    code = 910
    name = "cudaErrorGraphExecUpdateFailure"

    def __init__(self, message: str, result: Any = None, node: Any = None) -> None:
        super().__init__(message)
        self.result = result
        self.node = node


class GraphInstantiateError(GraphExecUpdateError, InvalidValueError):
    """Raised when ``Graph.instantiate`` (or a backend instantiating at the first launch) refuses
    a graph; ``.result`` is a ``GraphInstantiateResult`` saying why, ``.node`` the node (or None).

    ``cudaGraphInstantiate`` returns ``cudaErrorInvalidValue`` with the reason in
    ``cudaGraphInstantiateParams.result_out``: so it is an :class:`InvalidValueError` too, and
    clauses catching what instantiate raised before it existed still catch it."""

    code = 1
    name = "cudaErrorInvalidValue"


class ExecutorError(StreamRTError):
    """Raised for aclnn executor misuse; ``.code`` is the ACLNN number (161002 PARAM_INVALID)."""

    code = 161002
    name = "ACLNN_ERR_PARAM_INVALID"

    _NAMES = {
        161001: "ACLNN_ERR_PARAM_NULLPTR",
        161002: "ACLNN_ERR_PARAM_INVALID",
        361001: "ACLNN_ERR_RUNTIME_ERROR",
        561000: "ACLNN_ERR_INNER",
        561001: "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
        561002: "ACLNN_ERR_INNER_TILING_ERROR",
        561003: "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
    }

    def __new__(cls, message: str = "", code: int | None = None) -> ExecutorError:
        # a bad parameter (PARAM_NULLPTR, PARAM_INVALID) is also a ValueError, as DESIGN §7 asks
        # of bad arguments; runtime and inner errors are not
        if cls is ExecutorError and code in (None, 161001, 161002):
            cls = ExecutorParamError
        return super().__new__(cls, message, code)

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
            self.name = self._NAMES.get(code, f"ACLNN_ERR_{code}")

    def __reduce__(self) -> tuple:
        # with the code: rebuilt from the message alone, __new__ would make any copy (pickle,
        # copy.copy) an ExecutorParamError
        return type(self), (self.args[0] if self.args else "", self.code), self.__dict__


class ExecutorParamError(ExecutorError, ValueError):
    """An :class:`ExecutorError` for a bad parameter (161001 PARAM_NULLPTR, 161002
    PARAM_INVALID); ``ExecutorError(msg, code)`` makes one for those codes."""


class SanitizerError(StreamRTError):
    """Raised at synchronize when the sanitizer (raise mode) found a stream-ordering bug."""

    code = None
    name = "streamrtSanitizerFinding"

    def __init__(self, message: str, finding: Any = None) -> None:
        super().__init__(message)
        self.finding = finding
        self.kind = getattr(finding, "kind", None)
        self.ptr = getattr(finding, "ptr", None)
        self.streams = getattr(finding, "streams", ())  # where the two operations ran
        self.op = getattr(finding, "op", None)  # the operation that made the access
        self.other = getattr(finding, "other", None)  # the operation or alloc/free it conflicts with
