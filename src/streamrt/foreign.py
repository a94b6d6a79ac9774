"""Foreign CUDA streams: the ``__cuda_stream__`` protocol, ``Stream.from_external`` and the
ordering of a consumer's stream after a device's pending work (the DLPack and CUDA Array
Interface handshakes, interop.py).

``__cuda_stream__`` (cuda.core's protocol, version 0) answers ``(0, handle)``, the
``cudaStream_t`` as an int. A wrapped foreign stream is a :class:`~streamrt.stream.Stream`
whose queue does not own the CUDA stream: ``destroy`` (or collection) forgets it and leaves it
alive; the foreign stream must outlive the wrapper. The legacy handles 0 and 1
(``cudaStreamLegacy``) are the device's own default stream, and a handle of a live streamrt
stream is that stream: one CUDA stream is never two frontend streams with clocks of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .device import Device, current_device
from .errors import InvalidTypeError, InvalidValueError, NotSupportedError
from .validate import is_int
from .weak import members

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["LEGACY_HANDLES", "cuda_stream", "from_external", "handle_of", "order_after_pending"]

LEGACY_HANDLES = (0, 1)  # the legacy default stream: CUDA's 0 (no per-thread build) and 1


def handle_of(obj: Any) -> int:
    """The ``cudaStream_t`` int of ``obj``: an object with ``__cuda_stream__`` (version 0), or
    an int >= 0."""
    if hasattr(obj, "__cuda_stream__"):
        got = obj.__cuda_stream__()
        if (not isinstance(got, tuple) or len(got) != 2 or not all(is_int(v) for v in got)):
            raise InvalidTypeError(f"{type(obj).__name__}.__cuda_stream__() must return a tuple "
                                   f"(version, handle) of two ints, not {got!r}")
        version, handle = int(got[0]), int(got[1])
        if version != 0:
            raise InvalidValueError(f"{type(obj).__name__}.__cuda_stream__() speaks version "
                                    f"{version} of the protocol; streamrt knows version 0")
    elif is_int(obj):
        handle = int(obj)
    else:
        raise InvalidTypeError(f"Stream.from_external needs an object with __cuda_stream__ or a "
                               f"cudaStream_t int, not {type(obj).__name__}")
    if handle < 0:
        raise InvalidValueError(f"a cudaStream_t is an address >= 0, not {handle}")
    return handle


def cuda_stream(s: Stream) -> Callable[[], tuple[int, int]]:
    """The CUDA stream protocol (version 0): ``s.__cuda_stream__()`` is ``(0, cudaStream_t as an
    int)``, 1 for the legacy default stream. Only cuda streams have it (AttributeError elsewhere,
    so ``hasattr`` is False); a destroyed stream's call is InvalidHandleError."""
    handle = s._q.handle()
    if handle is None:
        raise AttributeError(f"{s.device.name} streams are not CUDA streams: no __cuda_stream__")

    def protocol() -> tuple[int, int]:
        s._check_alive()
        return (0, handle)

    return protocol


def from_external(cls: type[Stream], obj: Any, device: Any = None) -> Stream:
    """Wrap a foreign CUDA stream (an object with ``__cuda_stream__``, or a ``cudaStream_t`` int)
    without owning it: ``destroy`` leaves the CUDA stream alive, and it must outlive the
    wrapper. ``device``: the stream's (default: its own, ``cudaStreamGetDevice``)."""
    handle = handle_of(obj)
    if device is not None:
        dev = Device(device)
        if dev.backend == "cpu":
            raise NotSupportedError(f"{dev.name} has no CUDA streams: a foreign stream belongs to "
                                    "a cuda device")
    elif handle in LEGACY_HANDLES and current_device().backend == "cuda":
        dev = current_device()  # the legacy handles name the current device's stream
    else:
        dev = Device(f"cuda:{_device_of(handle)}")
    if handle in LEGACY_HANDLES:
        return dev.default_stream
    owner = _device_of(handle, dev.backend)  # an invalid handle raises here
    if owner != dev.index:
        raise InvalidValueError(f"stream {handle:#x} belongs to {dev.backend}:{owner}, not "
                                f"{dev.name}")
    mine = _own(dev, handle)
    if mine is not None:
        return mine
    s = object.__new__(cls)
    s._setup(dev, 0, False, legacy=False, wrap=handle)
    return s


def _device_of(handle: int, backend: str = "cuda") -> int:
    from .backends import get_backend

    return get_backend(backend).stream_device(handle)


def _own(dev: Device, handle: int) -> Stream | None:
    """The live streamrt stream of ``dev`` over the CUDA stream ``handle``, if any."""
    for s in dev.streams():
        if not s._destroyed and s._q.handle() == handle:
            return s
    return None


def order_after_pending(dev: Device, consumer: Stream | int) -> None:
    """Make ``consumer`` (a streamrt stream, or a foreign ``cudaStream_t`` int, validated) wait
    with event waits for the work pending on every stream of ``dev``, destroyed ones too, so
    that its work sees what any of them wrote. Streams with nothing pending and capturing
    streams (their work is a graph's) are skipped, and a capturing consumer is left alone: its
    work runs when its graph is launched, and a wait on work outside the capture would
    invalidate the capture. A foreign handle that is a streamrt stream's is ordered as that
    stream, so that its clock knows."""
    if isinstance(consumer, int):
        if consumer in LEGACY_HANDLES:
            consumer = dev.default_stream
        else:
            index = _device_of(consumer, dev.backend)  # an invalid handle raises here
            consumer = _own(Device(f"{dev.backend}:{index}"), consumer) or consumer
    if not isinstance(consumer, int) and consumer._capture is not None:
        return
    for p in dev.streams():
        if p is consumer or p._destroyed or p._capture is not None or p._q.done >= p._pos:
            continue
        if isinstance(consumer, int):
            p._q.order_foreign(consumer, p._pos)
        else:
            consumer.wait(p.record())
    for p in members(dev._dead):  # destroyed streams: their work still completes
        if p._q.done >= p._pos:
            continue
        if isinstance(consumer, int):
            p._q.order_foreign(consumer, p._pos)
        else:
            snap = p._snapshot()
            if consumer._clock.get(p.id, 0) < snap[p.id]:
                consumer._order_after(p, snap[p.id], snap)
