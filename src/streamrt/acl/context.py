"""Devices and contexts in ACL's terms: ``acl.rt.set_device`` / ``reset_device`` /
``get_device`` / ``get_device_count`` / ``get_run_mode`` / ``synchronize_device``, and a
context per device and thread (``create_context``, ``set_current_context``, ...).

A context is a device bound to the calling thread: streamrt has no contexts, so one is a small
handle over ``srt.Device`` whose ``set_current_context`` makes its device the thread's current
device (``dev.set_current()``). ``set_device`` makes the device's default context current, as
``aclrtSetDevice`` creates and binds it implicitly."""

from __future__ import annotations

import threading
from typing import Any

from ..device import Device, current_device, device_count
from ..errors import InvalidHandleError, InvalidTypeError
from . import constants as C
from . import util
from .errors import AclCallError, api

__all__ = ["Context", "create_context", "current_context", "destroy_context", "thread_context",
           "get_current_context", "get_device", "get_device_count", "get_run_mode",
           "reset_device", "set_current_context", "set_device", "synchronize_device"]

_tls = threading.local()  # .context: the calling thread's current context
_defaults: dict[Device, Context] = {}  # each device's default context (set_device's)
_lock = threading.Lock()


class Context:
    """An ACL context (``aclrtContext``): a device, current in the threads that set it."""

    def __init__(self, device: Device, *, default: bool = False) -> None:
        self.device = device
        self.default = default
        self.destroyed = False

    def __repr__(self) -> str:
        state = " destroyed" if self.destroyed else ""
        return f"<acl context of {self.device.name}{' (default)' if self.default else ''}{state}>"


def _device(device_id: Any) -> Device:
    """The device ``device_id`` of the current backend (an int, as ACL's ``deviceId``)."""
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise InvalidTypeError(f"deviceId must be an int, not {type(device_id).__name__}")
    return Device(f"{current_device().backend}:{device_id}")


def _default_context(dev: Device) -> Context:
    with _lock:
        ctx = _defaults.get(dev)
        if ctx is None:
            ctx = _defaults[dev] = Context(dev, default=True)
        return ctx


def _make_current(ctx: Context) -> None:
    ctx.device.set_current()
    _tls.context = ctx
    _tls.bound = True  # the thread chose a device or context (get_device answers from now on)


def _bound() -> None:
    """What ``aclrtGetDevice`` / ``aclrtGetCurrentContext`` refuse: a thread that set neither a
    device nor a context (the other calls use the current device's default context)."""
    if not getattr(_tls, "bound", False):
        raise AclCallError("this thread has set no device or context (acl.rt.set_device)",
                           C.ACL_ERROR_RT_CONTEXT_NULL)


def thread_context() -> Context:
    """The calling thread's context, for the calls ACL refuses with ``ACL_ERROR_RT_CONTEXT_NULL``
    in a thread that set no device or context (``aclrtCreateStream``, ``aclrtCreateEvent``)."""
    _bound()
    return current_context()


def current_context() -> Context:
    """The calling thread's context: the one it set, else its current device's default one."""
    ctx: Context | None = getattr(_tls, "context", None)
    dev = current_device()
    if ctx is None or ctx.destroyed or ctx.device is not dev:
        ctx = _default_context(dev)
    return ctx


@api()
def set_device(device_id: int) -> None:
    """``aclrtSetDevice``: the device becomes current, with its default context."""
    _make_current(_default_context(_device(device_id)))


@api()
def reset_device(device_id: int) -> None:
    """``aclrtResetDevice``: ``dev.reset()`` (every stream, event, pool and allocation goes)."""
    dev = _device(device_id)
    dev.synchronize()  # (as the reset does first) no pending copy still reads util's mappings
    util.forget_device(dev)  # buffers util mapped into it: their owners' memory, not the device's
    dev.reset()


@api(None)
def get_device() -> int:
    """``aclrtGetDevice`` -> ``(device_id, ret)``."""
    _bound()
    return current_device().index


@api(0)
def get_device_count() -> int:
    """``aclrtGetDeviceCount`` -> ``(count, ret)``: ``srt.device_count`` of the backend."""
    return device_count(current_device().backend)


@api(None)
def get_run_mode() -> int:
    """``aclrtGetRunMode`` -> ``(ACL_HOST, ret)``: the program runs on the host, beside its devices."""
    return C.ACL_HOST


@api()
def synchronize_device() -> None:
    """``aclrtSynchronizeDevice``: ``dev.synchronize()`` of the current device."""
    current_device().synchronize()


@api(None)
def create_context(device_id: int) -> Context:
    """``aclrtCreateContext`` -> ``(context, ret)``: a new context, current in this thread."""
    ctx = Context(_device(device_id))
    _make_current(ctx)
    return ctx


def _check(ctx: Any) -> Context:
    if not isinstance(ctx, Context):
        raise InvalidHandleError(f"{ctx!r} is not an ACL context (acl.rt.create_context)")
    if ctx.destroyed:
        raise InvalidHandleError(f"{ctx!r} was destroyed")
    return ctx


@api()
def destroy_context(context: Context) -> None:
    """``aclrtDestroyContext``: the context refuses further use; its device's work goes on."""
    ctx = _check(context)
    if ctx.default:
        raise InvalidHandleError(f"{ctx!r} is a device's default context: acl.rt.reset_device "
                                 "releases it")
    ctx.destroyed = True
    if getattr(_tls, "context", None) is ctx:
        _tls.context = None  # the thread falls back to its device's default context


@api()
def set_current_context(context: Context) -> None:
    """``aclrtSetCurrentContext``: the context (and its device) become the thread's current."""
    _make_current(_check(context))


@api(None)
def get_current_context() -> Context:
    """``aclrtGetCurrentContext`` -> ``(context, ret)``."""
    _bound()
    return current_context()
