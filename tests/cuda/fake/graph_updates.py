"""Updates of an instantiated graph (``cudaGraphExec*NodeSetParams``, ``cudaGraphNodeSetEnabled``):
an exec's node parameters and enabled flags change in place, for later launches only (a launch
takes a snapshot of them). Those calls name the node by the graph's, so they fail once the graph
was destroyed; the nodes of conditional bodies are not the exec's own steps, so they are refused.
"""

from __future__ import annotations

from typing import Any

from . import state
from .binding import driver, runtime
from .graphs import EXECS, _kernel_run, _memcpy_run, _memset_run
from .state import DRV_SUCCESS, LOCK, SUCCESS, E, R


# -- updates of an instantiated graph, for later launches --------------------------------------
def _exec_node(exec_: Any, node: Any, *kinds: str) -> list | None:
    x = EXECS.get(state.as_int(exec_))
    return None if x is None else x.node(node, *kinds)


def _set_run(exec_: Any, node: Any, kind: str, run: Any, bad: Any, ok: Any) -> tuple:
    """Give an exec's ``kind`` node the work ``run`` (None: invalid parameters, ``bad``)."""
    with LOCK:
        step = _exec_node(exec_, node, kind)
        if step is None or run is None:
            return (bad,)
        step[1] = run
    return (ok,)


@driver("cuGraphExecKernelNodeSetParams", 0)
def cuGraphExecKernelNodeSetParams(exec_: Any, node: Any, kp: Any) -> tuple:
    return _set_run(exec_, node, "kernel", _kernel_run(kp), R.CUDA_ERROR_INVALID_VALUE, DRV_SUCCESS)


@runtime("cudaGraphExecMemcpyNodeSetParams1D")
def cudaGraphExecMemcpyNodeSetParams1D(exec_: Any, node: Any, dst: Any, src: Any, count: int,
                                       kind: Any) -> tuple:
    if int(count) == 0:  # zero-length operations are not supported
        return (E.cudaErrorInvalidValue,)
    run, err = _memcpy_run(dst, src, count, kind)
    return _set_run(exec_, node, "memcpy", run, err or E.cudaErrorInvalidValue, SUCCESS)


@runtime("cudaGraphExecMemsetNodeSetParams")
def cudaGraphExecMemsetNodeSetParams(exec_: Any, node: Any, ms: Any) -> tuple:
    run = _memset_run(ms) if ms is not None and int(ms.width) else None  # not zero-length
    return _set_run(exec_, node, "memset", run, E.cudaErrorInvalidValue, SUCCESS)


def _set_event(exec_: Any, node: Any, event: Any, kind: str) -> tuple:
    from .events import EVENTS

    with LOCK:
        ev = EVENTS.get(state.as_int(event))
        return _set_run(exec_, node, kind, None if ev is None else ev.handle,
                        R.CUDA_ERROR_INVALID_VALUE, DRV_SUCCESS)


@driver("cuGraphExecEventRecordNodeSetEvent", 0)
def cuGraphExecEventRecordNodeSetEvent(exec_: Any, node: Any, event: Any) -> tuple:
    return _set_event(exec_, node, event, "event_record")


@driver("cuGraphExecEventWaitNodeSetEvent", 0)
def cuGraphExecEventWaitNodeSetEvent(exec_: Any, node: Any, event: Any) -> tuple:
    return _set_event(exec_, node, event, "event_wait")


@runtime("cudaGraphNodeSetEnabled")
def cudaGraphNodeSetEnabled(exec_: Any, node: Any, enabled: int) -> tuple:
    with LOCK:
        step = _exec_node(exec_, node, "kernel", "memcpy", "memset")  # the kinds CUDA supports
        if step is None:
            return (E.cudaErrorInvalidValue,)
        step[2] = bool(int(enabled))
    return (SUCCESS,)
