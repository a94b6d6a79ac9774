"""Putting the fakes in place of the functions of ``cuda.bindings.runtime`` / ``.driver``.

Each fake first calls the *real* function with the same arguments. Without a driver it does no
work, but it converts and type-checks the arguments exactly as on a GPU: a runtime call then
returns ``cudaErrorInsufficientDriver`` and a driver call raises ``DynamicLibNotFoundError``
(cuda-bindings 13.0: a RuntimeError that libcuda could not be loaded or a function was not
found; all expected and dropped), while a wrong argument type raises TypeError/AttributeError, which
propagates as it would on a GPU. Then, unless the calling thread is running a host function
(CUDA calls are not permitted there: ``cudaErrorNotPermitted``, recorded in
``state.refused``), the fake does the work and returns what the real binding returns.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as drv
from cuda.bindings import runtime as rt
from cuda.pathfinder import DynamicLibNotFoundError

from . import state

# (module, name, fake, number of output values of a driver call)
REGISTRY: list[tuple[Any, str, Callable[..., Any], int]] = []
ORIGINALS: dict[tuple[str, str], Callable[..., Any]] = {}


def runtime(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the fake of ``cuda.bindings.runtime.<name>``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.append((rt, name, fn, -1))
        return fn

    return deco


def driver(name: str, nout: int = 0) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the fake of ``cuda.bindings.driver.<name>``, which
    returns ``(CUresult, *nout values)``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.append((drv, name, fn, nout))
        return fn

    return deco


class RealDriverPresent(RuntimeError):
    """The real driver answered: the fake must never run beside one (it calls the real API)."""


def _wrap_runtime(name: str, real: Callable[..., Any], fake: Callable[..., Any]) -> Callable:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        res = real(*args, **kwargs)  # argument conversion exactly as on a GPU
        err = res[0] if isinstance(res, tuple) else res
        if err != rt.cudaError_t.cudaErrorInsufficientDriver:
            raise RealDriverPresent(f"the real {name} returned {err!r}: the fake refuses to run")
        if state.in_host_function():
            state.refused.append((name, _thread_name()))
            return (rt.cudaError_t.cudaErrorNotPermitted, *res[1:]) if isinstance(res, tuple) \
                else rt.cudaError_t.cudaErrorNotPermitted
        return fake(*args, **kwargs)

    call.__fake__ = fake  # type: ignore[attr-defined]
    return call


_NO_LIBCUDA = re.compile(r'Failed to dlopen libcuda|Function "\w+" not found')
_nested = threading.local()  # inside a real driver call on this thread


def _wrap_driver(name: str, real: Callable[..., Any], fake: Callable[..., Any], nout: int) -> Callable:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        # Without a driver, every real driver call searches for libcuda again, under the
        # loader's lock; a garbage-collector finalizer making a driver call from inside that
        # search would deadlock on it, so a nested call skips the real one (the outer call's
        # arguments were already checked; a real driver loads its library once)
        if not getattr(_nested, "on", False):
            _nested.on = True
            try:
                real(*args, **kwargs)  # argument conversion exactly as on a GPU
            except DynamicLibNotFoundError:
                pass
            except RuntimeError as exc:  # cuda-bindings 13.0 without libcuda
                if not _NO_LIBCUDA.search(str(exc)):
                    raise
            else:
                raise RealDriverPresent(f"the real {name} answered: the fake refuses to run")
            finally:
                _nested.on = False
        if state.in_host_function():
            state.refused.append((name, _thread_name()))
            return (drv.CUresult.CUDA_ERROR_NOT_PERMITTED, *([None] * nout))
        return fake(*args, **kwargs)

    call.__fake__ = fake  # type: ignore[attr-defined]
    return call


# driver calls streamrt makes to the real cuda-bindings, unfaked (the description of an error):
# without a driver they search for libcuda under the loader's lock too, so they count as a real
# driver call in progress for the nested-call rule of _wrap_driver (a garbage-collector finalizer
# making a faked driver call from inside that search, e.g. a graph's memory released while
# error_for describes a CUresult, would otherwise deadlock on the loader's lock)
PASSTHROUGH = ("cuGetErrorString", "cuGetErrorName")


def _guard_real(real: Callable[..., Any]) -> Callable:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_nested, "on", False):
            return real(*args, **kwargs)
        _nested.on = True
        try:
            return real(*args, **kwargs)
        finally:
            _nested.on = False

    return call


def _thread_name() -> str:
    import threading

    return threading.current_thread().name


def patch() -> None:
    """Replace every registered function (once; a second call changes nothing)."""
    for mod, name, fake, nout in REGISTRY:
        key = (mod.__name__, name)
        if key in ORIGINALS:
            continue
        real = getattr(mod, name)
        ORIGINALS[key] = real
        wrapped = _wrap_runtime(name, real, fake) if nout < 0 else _wrap_driver(name, real, fake, nout)
        setattr(mod, name, wrapped)
    for name in PASSTHROUGH:
        key = (drv.__name__, name)
        if key not in ORIGINALS:
            ORIGINALS[key] = getattr(drv, name)
            setattr(drv, name, _guard_real(ORIGINALS[key]))


def unpatch() -> None:
    """Put the real functions back."""
    for (modname, name), real in ORIGINALS.items():
        setattr(rt if modname == rt.__name__ else drv, name, real)
    ORIGINALS.clear()
