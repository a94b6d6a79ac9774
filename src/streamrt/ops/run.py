"""``ops.run``: the seed's ``InvokeAclnnTwoPhase`` template as one call, leak-free on every path.

Steps: plan (phase 1) or take the calling thread's cached executor and re-point it at the new
tensors; allocate the workspace from the stream's device pool in stream order (none when the
size is 0: the kernels never touch it then, so phase 2 accepts None); enqueue (phase 2); free the
workspace in stream order right after the kernels; release a one-shot executor (a host function
queued behind its kernels, see ``executor.py``). ``s.free`` is a stream-ordered free: the pool
tags the block with the stream position after the kernels, so only work ordered after them can
reuse it (DESIGN.md §3) and no synchronize is needed. ``sync=True`` synchronizes the stream at
the end. On any error, the executor (unless the cache owns it) and the workspace are released
before the error propagates.

The hit path is kept lean: the key is a tuple of precomputed per-tensor ids (see
``TensorDesc._kid``), and the checks that phase 2 makes on a caller's arguments are not needed
for a workspace this function allocated itself. The hit of the usual call (a stream, tensors
without None) is inlined in ``run``: one key, one lookup in the thread's store, the enqueue, the
counters (per thread, no lock: see ``OpStats``); the overlap check runs whenever the addresses
differ from those it last accepted. Everything else takes ``_run``, the general path.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from ..errors import ExecutorError
from ..stream import Stream, current_stream
from ..validate import is_bool
from .cache import ExecutorCache
from .executor import PARAM_INVALID, Executor
from .framework import OPS, Op

__all__ = ["run"]


def _resolve(op: Any) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, str) and op in OPS:
        return OPS[op]
    raise ExecutorError(f"ops.run: {op!r} is not an operator (known: {', '.join(OPS)})",
                        PARAM_INVALID)


def _typed(v: tuple) -> tuple:
    """A tuple attribute with the type of each element (recursively): ``(0, True)`` equals
    ``(0, 1)``, so without the types it would hit an executor that phase 1 would refuse."""
    return tuple([(e.__class__, _exact(e)) for e in v])


_FLOATS = (float, np.floating)


def _exact(v: Any) -> Any:
    """An attribute value as a key part that only an identical value equals: ``-0.0 == 0.0``
    (a cache hit gave +0.0 where the plan gives -0.0), and a nan never equalled itself (every
    call planned again); a float keys by its exact digits."""
    cls = v.__class__
    if cls is float:  # the usual attribute: no isinstance walk
        return v.hex()
    if cls is int or cls is bool or cls is str:
        return v
    if isinstance(v, _FLOATS):
        return float(v).hex()
    return _typed(v) if cls is tuple else v


_tkey = attrgetter("_key")  # a Tensor's cache-key part (AttributeError for None or a non-Tensor)
_tptr = attrgetter("_ptr")


def _attrs_key(attrs: dict) -> tuple:
    """The attributes as a key part: each name with its value's class and exact value."""
    parts = []
    for k, v in attrs.items():
        cls = v.__class__
        if cls is float:  # the usual attribute: equal keys only for identical values, as
            # _exact; a float equal to itself and nonzero is that already (-0.0 == 0.0, nan !=
            # nan: those two cases key by their digits)
            parts.append((k, cls, v if v == v and v != 0.0 else v.hex()))
        elif cls is int or cls is bool or cls is str:
            parts.append((k, cls, v))
        else:
            parts.append((k, cls, _exact(v)))
    return tuple(parts)


def _key(op: Op, tensors: tuple, attrs: dict) -> tuple | None:
    """The cache key, or None when the call cannot be cached (a bad tensor). An unhashable
    attribute makes a key that the lookup refuses (TypeError): not cached either."""
    try:
        tk = tuple(map(_tkey, tensors))
    except AttributeError:  # None (optional input) or not a Tensor
        try:
            tk = tuple([None if t is None else t._key for t in tensors])
        except AttributeError:
            return None  # phase 1 will say what is wrong
    if not attrs:
        return (op, op.version, tk)
    return (op, op.version, tk, _attrs_key(attrs))


def run(op: Any, *tensors: Any, stream: Stream | None = None, sync: bool = False,
        cache: ExecutorCache | None = None, **attrs: Any) -> None:
    """Plan (or hit ``cache``), allocate the workspace, execute, free it, release the executor."""
    if cache is not None and sync is False and cache.__class__ is ExecutorCache:
        s = current_stream() if stream is None else stream
        try:  # the key as _key makes it
            st = cache._local.store
            key = (op, op.version, tuple(map(_tkey, tensors)), _attrs_key(attrs)) if attrs \
                else (op, op.version, tuple(map(_tkey, tensors)))
            ex = st.entries.get(key)
        except (AttributeError, TypeError):  # no store yet, an op name, a None or non-Tensor,
            pass  # an unhashable attribute: the general path
        else:
            if ex is not None and s.__class__ is Stream and ex.device is s.device:
                entries = st.entries
                # the hit of the usual call (a stream, no None tensor): what the general path
                # does for it, inlined, without what it cannot need. A cached
                # executor is repeatable and this thread's (the cache is per thread), and is
                # never released here; a failure frees the workspace (stream-ordered)
                entries.move_to_end(key)
                st.c[0] += 1
                ex._addrs = addrs = list(map(_tptr, tensors))  # same metadata: no None slot
                size = ex._ws
                ws = s.malloc(size) if size else None
                try:
                    if addrs != ex._checked:  # else the check passed for these very addresses
                        ex._check_overlap()
                    ex._fn(s, ws, addrs)  # type: ignore[misc] # the whole enqueue (_enqueue)
                except BaseException:
                    if ws is not None:
                        s.free(ws)
                    raise
                ex._ran = True
                ex._runs = runs = ex._runs + 1
                c = ex._counts  # counted as Executor._launch counts a run
                c[0] += 1
                if runs > 1:
                    c[1] += 1
                c[2] += 1
                if ws is not None:
                    s.free(ws)
                return
    _run(op, tensors, stream, sync, cache, attrs)


def _run(op: Any, tensors: tuple, stream: Stream | None, sync: bool,
         cache: ExecutorCache | None, attrs: dict) -> None:
    """``run``'s general path."""
    if not isinstance(op, Op):
        op = _resolve(op)
    s = current_stream() if stream is None else stream
    if sync is not False and not is_bool(sync):  # refused before anything is enqueued
        raise ExecutorError(f"ops.run: sync must be a bool, not {type(sync).__name__}",
                            PARAM_INVALID)
    if not isinstance(s, Stream):
        raise ExecutorError(f"ops.run: stream must be a Stream, not {type(s).__name__}",
                            PARAM_INVALID)
    ex: Executor | None = None
    cached = hit = False  # cached: the cache owns ``ex`` (never release it here)
    key = None
    if cache is not None:
        if not isinstance(cache, ExecutorCache):
            raise ExecutorError(f"ops.run: cache must be an ExecutorCache, not "
                                f"{type(cache).__name__}", PARAM_INVALID)
        key = _key(op, tensors, attrs)
        if key is not None:
            try:
                ex = cache._get(key)
            except TypeError:  # an unhashable attribute: this call is not cached
                key = None
            if ex is not None:  # same metadata, so the same slots are None; a freed tensor's
                # key (-1) never matches, so every other address is a live tensor's
                try:
                    ex._addrs = list(map(_tptr, tensors))
                except AttributeError:
                    ex._addrs = [None if t is None else t._ptr for t in tensors]
                cached = hit = True
    if ex is None:
        ex = op._make(tensors, attrs)  # phase 1; raises before creating anything
        if key is not None:
            cached = cache._put(key, ex)  # type: ignore[union-attr]
    ws = None
    try:
        if ex.device is not s.device:
            raise ExecutorError(f"ops.run: stream is on {s.device.name}, the tensors on "
                                f"{ex.device.name}", PARAM_INVALID)
        size = ex._ws
        if size:
            ws = s.malloc(size)
        ex._launch(s, ws, hit)
    except BaseException:
        if not cached:
            ex._release()
        if ws is not None:
            s.free(ws)  # stream-ordered: after whatever was enqueued before the failure
        raise
    if ws is not None:
        s.free(ws)
    if sync:
        s.synchronize()
