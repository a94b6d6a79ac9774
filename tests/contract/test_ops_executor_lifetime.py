"""Executor lifetime: ``with ex:`` destroys it, a dropped undestroyed executor warns
(ResourceWarning) and is released, and executors that caches and ``ops.run`` own never warn."""

from __future__ import annotations

import gc
import inspect
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from streamrt import ops
from streamrt.errors import ExecutorError
from tests.contract.ops_fixtures import T, live, ops_stream  # noqa: F401 (the fixture s)

F32 = np.float32
HERE = Path(__file__).name






def setup(s):
    x = np.arange(4 * 600, dtype=F32).reshape(4, 600)
    return T(s, x), T(s, np.zeros(4)), x.sum(1)


def run_phase2(s, ex):
    ws = s.malloc(ex.workspace_size) if ex.workspace_size else None
    ops.reduce_sum(ws, ex.workspace_size, ex, s)
    if ws is not None:
        s.free(ws)


def test_executor_with_block_destroys_it(s):
    x, o, want = setup(s)
    base = live()
    size, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
    with ex as inside:
        assert inside is ex and live() == base + 1
        ex.set_repeatable()
        run_phase2(s, ex)
        run_phase2(s, ex)
    assert live() == base and "released" in repr(ex)
    np.testing.assert_allclose(o.numpy(s), want)  # enqueued work completes after the destroy
    with pytest.raises(ExecutorError, match="destroyed"):
        run_phase2(s, ex)


def test_executor_with_block_destroys_it_on_an_exception(s):
    x, o, _ = setup(s)
    base = live()
    _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
    with pytest.raises(RuntimeError), ex:
        raise RuntimeError("boom")
    assert live() == base


def test_executor_with_block_after_its_one_run_is_fine(s):
    x, o, want = setup(s)
    base = live()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
        with ex:
            run_phase2(s, ex)  # one-shot: its release is queued; the exit releases it at once
        del ex
        gc.collect()
    s.synchronize()
    assert live() == base
    np.testing.assert_allclose(o.numpy(s), want)


def test_executor_dropped_without_destroy_warns_and_is_released(s):
    x, o, _ = setup(s)
    base = live()
    _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)  # planned here: the warning says so
    line = inspect.currentframe().f_lineno - 1
    assert live() == base + 1
    with pytest.warns(ResourceWarning) as rec:
        del ex
        gc.collect()
    msg = str(rec[0].message)
    assert "ops.reduce_sum" in msg and f"{HERE}:{line}" in msg and "never ran" in msg
    assert "destroy()" in msg
    assert live() == base  # the count does not leak


def test_repeatable_executor_dropped_after_runs_warns(s):
    x, o, want = setup(s)
    base = live()
    _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
    ex.set_repeatable()
    run_phase2(s, ex)
    run_phase2(s, ex)
    s.synchronize()
    with pytest.warns(ResourceWarning, match=r"ops\.reduce_sum .*repeatable, ran 2 time"):
        del ex
        gc.collect()
    assert live() == base
    np.testing.assert_allclose(o.numpy(s), want)


def _no_resource_warnings(fn) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        fn()
        gc.collect()


def test_destroyed_or_one_shot_executors_never_warn(s):
    x, o, _ = setup(s)
    base = live()

    def work():
        _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
        ex.destroy()  # never run, but destroyed
        _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
        run_phase2(s, ex)  # one-shot: released after its run
        del ex
        s.synchronize()

    _no_resource_warnings(work)
    assert live() == base


def test_executors_of_ops_run_and_of_caches_never_warn(s):
    x, o, want = setup(s)
    base = live()

    def work():
        ops.run(ops.reduce_sum, x, o, stream=s, axis=1)  # released by ops.run
        c = ops.ExecutorCache(max_entries=1)
        for axis in (1, 0, 1):  # misses, one eviction per new key
            out = o if axis == 1 else T(s, np.zeros(600))
            ops.run(ops.reduce_sum, x, out, stream=s, cache=c, axis=axis)
        s.synchronize()
        assert live() == base + 1  # the one cached executor: owned by the cache, not leaked
        del c  # a dropped cache releases what it holds, silently
        gc.collect()

    _no_resource_warnings(work)
    assert live() == base
    np.testing.assert_allclose(o.numpy(s), want)


def test_executor_with_block_belongs_to_its_thread(s):
    x, o, _ = setup(s)
    _, ex = ops.reduce_sum.get_workspace_size(x, o, axis=1)
    errors = []

    def other():
        try:
            with ex:
                pass
        except ExecutorError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "belongs to thread" in str(errors[0])
    ex.destroy()
