"""``acl.mdl``: ``aclmdlRI`` capture (``ri_capture_begin`` / ``ri_capture_end`` /
``ri_capture_get_info``, ``ri_execute_async``, ``ri_execute``, ``ri_update``,
``ri_destroy``) over streamrt's capture and graph execs.

A model RI is the handle ``ri_capture_begin`` makes for the stream's capture:
``ri_capture_get_info`` returns it while the capture is on, and ``ri_capture_end`` instantiates
the captured graph into it (``g.instantiate()``), as an ``aclmdlRI`` is executable at once."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import IllegalStateError, InvalidHandleError, InvalidValueError
from ..graph import CaptureMode, CaptureStatus, Graph
from ..graph.exec import GraphExec
from ..stream import Stream
from . import constants as C
from .errors import AclCallError, api, not_offered
from .streams import stream_of

__all__ = ["ModelRI", "ri_capture_begin", "ri_capture_end", "ri_capture_get_info", "ri_destroy",
           "ri_execute", "ri_execute_async", "ri_update"]


class ModelRI:
    """An ``aclmdlRI``: a captured graph and, once the capture ended, its exec."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream  # the stream that captures it
        self.graph: Graph | None = None
        self.exec: GraphExec | None = None
        self.destroyed = False

    def __repr__(self) -> str:
        state = ("destroyed" if self.destroyed else "capturing" if self.exec is None
                 else f"{len(self.graph.nodes()) if self.graph else 0} nodes")
        return f"<aclmdlRI {state}>"


_lock = threading.Lock()
_capturing: dict[Stream, ModelRI] = {}  # each capturing stream's model RI


def _ri(model_ri: Any) -> ModelRI:
    if not isinstance(model_ri, ModelRI) or model_ri.destroyed:
        raise InvalidHandleError(f"{model_ri!r} is not a live model RI (acl.mdl.ri_capture_end)")
    if model_ri.exec is None:
        raise IllegalStateError(f"{model_ri!r} is still being captured (acl.mdl.ri_capture_end)")
    return model_ri


@api()
def ri_capture_begin(stream: Any, mode: int) -> None:
    """``aclmdlRICaptureBegin``: ``s.begin_capture(srt.CaptureMode(mode))``."""
    s = stream_of(stream)
    try:
        m = CaptureMode(mode)
    except ValueError:
        raise InvalidValueError(f"mode {mode!r} is not an aclmdlRICaptureMode") from None
    if s.is_capturing():
        raise AclCallError(f"{s!r} is already capturing", C.ACL_ERROR_RT_STREAM_CAPTURED)
    s.begin_capture(m)
    with _lock:
        _capturing[s] = ModelRI(s)


@api(None)
def ri_capture_end(stream: Any) -> ModelRI:
    """``aclmdlRICaptureEnd`` -> ``(model_ri, ret)``: ``s.end_capture()``, instantiated."""
    s = stream_of(stream)
    with _lock:
        ri = _capturing.get(s)
    if ri is None and not s.is_capturing():
        raise AclCallError(f"{s!r} is not capturing", C.ACL_ERROR_RT_STREAM_NOT_CAPTURED)
    try:
        graph = s.end_capture()
    finally:
        if not s.is_capturing():  # ended, or refused for good (invalidated): the handle goes
            with _lock:
                _capturing.pop(s, None)
    ri = ri or ModelRI(s)  # a capture begun with s.begin_capture directly
    ri.graph, ri.exec = graph, graph.instantiate()
    return ri


@api(None, None)
def ri_capture_get_info(stream: Any) -> tuple[int, ModelRI | None]:
    """``aclmdlRICaptureGetInfo`` -> ``(status, model_ri, ret)``: ``s.capture_info()``."""
    s = stream_of(stream)
    info = s.capture_info()
    with _lock:
        ri = _capturing.get(s) if info.status is not CaptureStatus.NONE else None
    return int(info.status.value), ri


@api()
def ri_execute_async(model_ri: ModelRI, stream: Any) -> None:
    """``aclmdlRIExecuteAsync``: ``ge.launch(s)``."""
    _ri(model_ri).exec.launch(stream_of(stream))  # type: ignore[union-attr]


@api()
def ri_execute(model_ri: ModelRI, timeout: int) -> None:
    """``aclmdlRIExecute``: ``ge.launch`` on the capturing stream, then its synchronize
    (``timeout`` is accepted; the wait is not bounded)."""
    ri = _ri(model_ri)
    ri.exec.launch(ri.stream)  # type: ignore[union-attr]
    ri.stream.synchronize()


@api()
def ri_update(model_ri: ModelRI, graph_ri: ModelRI) -> None:
    """``ge.update``: ``model_ri`` runs ``graph_ri``'s captured graph from its next launch."""
    _ri(model_ri).exec.update(_ri(graph_ri).graph)  # type: ignore[union-attr, arg-type]


@api()
def ri_destroy(model_ri: ModelRI) -> None:
    """``aclmdlRIDestroy``: ``ge.destroy()`` and ``g.destroy()``."""
    ri = _ri(model_ri)
    ri.destroyed = True
    ri.exec.destroy()  # type: ignore[union-attr]
    ri.graph.destroy()  # type: ignore[union-attr]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise not_offered("acl.mdl", name, {
        "load_from_file": "a graph built or captured with streamrt (models are not loaded)",
        "execute": "acl.mdl.ri_execute(model_ri, timeout) for a captured model RI",
    })
