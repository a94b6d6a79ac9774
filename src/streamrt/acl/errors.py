"""streamrt errors as ACL error codes: every facade call returns ``ret`` (or ``(value, ret)``)
instead of raising, and ``acl.get_recent_err_msg()`` gives the message of the thread's last
failure (``aclGetRecentErrMsg``)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .. import errors as E
from . import constants as C

__all__ = ["AclCallError", "api", "code_of", "recent_message"]

# each streamrt error class -> the ACL code a CANN runtime returns for that failure; a class
# missing here takes its nearest listed base's code (the MRO walk of code_of)
CODES: dict[type[BaseException], int] = {
    E.StreamRTError: C.ACL_ERROR_RT_INTERNAL_ERROR,
    E.InvalidValueError: C.ACL_ERROR_INVALID_PARAM,
    E.InvalidTypeError: C.ACL_ERROR_INVALID_PARAM,
    E.InvalidDeviceError: C.ACL_ERROR_RT_INVALID_DEVICEID,
    E.InvalidAddressError: C.ACL_ERROR_RT_PARAM_INVALID,
    E.InvalidHandleError: C.ACL_ERROR_RT_INVALID_HANDLE,
    E.IllegalStateError: C.ACL_ERROR_RT_PARAM_INVALID,
    E.OutOfMemoryError: C.ACL_ERROR_RT_MEMORY_ALLOCATION,
    E.NotReadyError: C.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
    E.NotSupportedError: C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    E.NotPermittedError: C.ACL_ERROR_RT_NO_PERMISSION,
    E.LaunchError: C.ACL_ERROR_RT_AICORE_EXCEPTION,
    E.BackendUnavailableError: C.ACL_ERROR_RT_NO_DEVICE,
    E.CaptureError: C.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT,
    E.CaptureUnsupportedError: C.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT,
    E.CaptureInvalidatedError: C.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
    E.CaptureMergeError: C.ACL_ERROR_RT_CAPTURE_DEPENDENCY,
    E.CaptureUnmatchedError: C.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
    E.CaptureUnjoinedError: C.ACL_ERROR_RT_STREAM_UNJOINED,
    E.CaptureIsolationError: C.ACL_ERROR_RT_CAPTURE_DEPENDENCY,
    E.CaptureImplicitError: C.ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT,
    E.CapturedEventError: C.ACL_ERROR_RT_EVENT_CAPTURED,
    E.CaptureWrongThreadError: C.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT,
    E.GraphExecUpdateError: C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT_UPDATE_OP,
    E.GraphInstantiateError: C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    E.SanitizerError: C.ACL_ERROR_RT_DEVICE_MEM_ERROR,
}


class AclCallError(E.StreamRTError):
    """A failure the facade itself finds (an ACL rule with no streamrt error): ``acl_code`` is
    the code the call returns."""

    name = "aclError"

    def __init__(self, message: str, acl_code: int) -> None:
        super().__init__(message)
        self.acl_code = acl_code


def code_of(exc: BaseException) -> int:
    """The ACL error code of a streamrt error (an aclnn ``ExecutorError`` keeps its own number)."""
    if isinstance(exc, AclCallError):
        return exc.acl_code
    if isinstance(exc, E.ExecutorError) and exc.code is not None:
        return int(exc.code)
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return C.ACL_ERROR_RT_INTERNAL_ERROR


_tls = threading.local()  # the calling thread's last failure message, as aclGetRecentErrMsg's


def recent_message() -> str | None:
    """The message of this thread's last failed call, then forgotten (None: none since)."""
    msg: str | None = getattr(_tls, "msg", None)
    _tls.msg = None
    return msg


F = TypeVar("F", bound=Callable[..., Any])

# the facade's modules -> the pyACL namespace their calls are offered in (for the messages)
_NAMESPACE = {"context": "rt", "streams": "rt", "memory": "rt", "pools": "rt", "kernels": "rt",
              "tensors": "acl"}


def api(*fail: Any) -> Callable[[F], F]:
    """Make a facade call: the body returns its value(s) (nothing for a plain ``ret`` call) or
    raises a streamrt error; the call returns ``ret``, ``(value, ret)`` or ``(v1, v2, ret)``,
    with ``fail`` as the values when it failed."""

    def deco(fn: F) -> F:
        module = fn.__module__.rsplit(".", 1)[-1]
        name = f"acl.{_NAMESPACE.get(module, module)}.{fn.__name__}".replace("acl.acl.", "acl.")

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = fn(*args, **kwargs)
            except E.StreamRTError as exc:
                _tls.msg = f"{name}: {exc}"
                code = code_of(exc)
                return (*fail, code) if fail else code
            if not fail:
                return C.ACL_SUCCESS
            return (*out, C.ACL_SUCCESS) if len(fail) > 1 else (out, C.ACL_SUCCESS)

        return call  # type: ignore[return-value]

    return deco


def not_offered(namespace: str, name: str, hints: dict[str, str]) -> AttributeError:
    """The ``AttributeError`` for a pyACL name the facade does not offer, saying what to use."""
    hint = hints.get(name, "the README's 'ACL facade' table lists what is offered, and the "
                           "streamrt API (import streamrt as srt) has the rest")
    return AttributeError(f"{namespace}.{name} is not offered by streamrt's ACL facade; "
                          f"use {hint}")
