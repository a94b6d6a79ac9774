"""Executors and the checks of both phases (DESIGN.md §4): codes, one-shot, repeatable, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt
from streamrt import ops
from streamrt.backends.cpu import SPACE
from tests.conftest import fail_second_launch
from tests.contract.ops_fixtures import T, live, ops_stream  # noqa: F401 (the fixture s)

F32 = np.float32
NULLPTR, INVALID, INNER = 161001, 161002, 561000






def softmax_setup(s, rows=4, cols=8):
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(F32)
    tx, out = T(s, x), T(s, np.zeros((rows, cols)))
    e = np.exp(x - x.max(1, keepdims=True))
    return tx, out, e / e.sum(1, keepdims=True)


def raises(code, fn, *args, **kwargs):
    with pytest.raises(srt.ExecutorError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    # a bad parameter is also a ValueError (DESIGN §7); an inner or runtime error is not
    assert isinstance(info.value, ValueError) is (code in (NULLPTR, INVALID)), info.value
    return info.value


# -- phase 1 ---------------------------------------------------------------------------------------
def test_executor_phase1_returns_size_and_a_ready_executor(s):
    x, out, _ = softmax_setup(s)
    size, ex = ops.softmax.get_workspace_size(x, out, axis=1)
    assert isinstance(ex, ops.Executor)
    assert size == ex.workspace_size > 0
    assert ex.op_name == "softmax" and not ex.repeatable
    ex.destroy()


def test_executor_phase1_never_reads_memory(s, monkeypatch):
    x, out, _ = softmax_setup(s)
    calls = [
        (ops.softmax, (x, out), {}), (ops.add, (x, x, out), {"alpha": 2.0}),
        (ops.reduce_sum, (x, T(s, np.zeros(4))), {"axis": 1}),
        (ops.layer_norm, (x, None, None, out), {}), (ops.cumsum, (x, out), {"axis": 1}),
        (ops.matmul, (x, T(s, np.zeros((8, 2))), T(s, np.zeros((4, 2)))), {}),
        (ops.mul, (x, x, out), {}),
    ]
    s.synchronize()

    def no_access(*args, **kwargs):
        raise AssertionError("phase 1 touched device memory")

    executors = []
    with monkeypatch.context() as m:  # every view of device memory goes through these two
        m.setattr(SPACE, "span", no_access)
        m.setattr(SPACE, "array", no_access)
        for op, tensors, attrs in calls:
            executors.append(op.get_workspace_size(*tensors, **attrs)[1])
    for ex in executors:
        ex.destroy()


def test_executor_data_written_after_phase1_is_used(s, gate):
    x = srt.Tensor.empty((4, 8), F32, stream=s)
    out = srt.Tensor.empty((4, 8), F32, stream=s)
    g = gate(s)
    size, ex = ops.softmax.get_workspace_size(x, out)  # x holds no data yet (not even written)
    data = np.random.default_rng(1).standard_normal((4, 8)).astype(F32)
    s.memcpy(x.ptr, data, data.nbytes)  # written after phase 1, ordered before phase 2
    ws = s.malloc(size)
    ops.softmax(ws, size, ex, s)
    s.free(ws)
    g.open()
    e = np.exp(data - data.max(1, keepdims=True))
    np.testing.assert_allclose(out.numpy(s), e / e.sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("make, code", [
    (lambda s, x, o: ops.softmax.get_workspace_size(x), INVALID),  # arity
    (lambda s, x, o: ops.softmax.get_workspace_size(None, o), NULLPTR),
    (lambda s, x, o: ops.softmax.get_workspace_size(np.zeros((4, 8)), o), INVALID),
    (lambda s, x, o: ops.softmax.get_workspace_size(x, o, axis=2), INVALID),
    (lambda s, x, o: ops.softmax.get_workspace_size(x, o, axis=1.0), INVALID),
    (lambda s, x, o: ops.softmax.get_workspace_size(x, o, dim=1), INVALID),  # unknown attr
    (lambda s, x, o: ops.softmax.get_workspace_size(x, T(s, np.zeros((8, 4)))), INVALID),
    (lambda s, x, o: ops.add.get_workspace_size(x, T(s, np.zeros(3)), o), INVALID),  # broadcast
    (lambda s, x, o: ops.add.get_workspace_size(x, x, o, alpha="2"), INVALID),
    (lambda s, x, o: ops.add.get_workspace_size(x, x, o, alpha=True), INVALID),
    (lambda s, x, o: ops.reduce_sum.get_workspace_size(x, T(s, np.zeros(4)), axis=(1, -1)),
     INVALID),
    (lambda s, x, o: ops.reduce_sum.get_workspace_size(x, T(s, np.zeros(4)), keepdims=1),
     INVALID),
    (lambda s, x, o: ops.reduce_sum.get_workspace_size(x, T(s, np.zeros(8)), axis=1), INVALID),
    (lambda s, x, o: ops.matmul.get_workspace_size(x, x, o), INVALID),  # inner dims differ
    (lambda s, x, o: ops.matmul.get_workspace_size(T(s, np.zeros(8)), x, o), INVALID),
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, T(s, np.ones(4)), None, o), INVALID),
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, None, None, o, eps=-1.0), INVALID),
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, T(s, np.ones(8)), None, o,
                                                       normalized_ndim=2), INVALID),
    (lambda s, x, o: ops.cumsum.get_workspace_size(x, o), INVALID),  # axis None: out is flat
    (lambda s, x, o: ops.softmax.get_workspace_size(
        x, srt.Tensor.empty((4, 8), np.int32, stream=s)), INVALID),  # dtype
    (lambda s, x, o: ops.softmax.get_workspace_size(
        x, o.as_strided((4, 8), (0, 1))), INVALID),  # an output writing elements twice
    # boundaries the cases above leave open: each one was accepted by a plausible mutant
    (lambda s, x, o: ops.softmax.get_workspace_size(x, o, axis=True), INVALID),  # bool, not int
    (lambda s, x, o: ops.softmax.get_workspace_size(
        srt.Tensor.empty((4, 8), np.int32, stream=s), o), INVALID),  # an input's dtype
    (lambda s, x, o: ops.add.get_workspace_size(x, x, T(s, np.zeros((8, 4)))), INVALID),
    (lambda s, x, o: ops.mul.get_workspace_size(x, T(s, np.zeros(8)), T(s, np.zeros(32))),
     INVALID),  # out has the broadcast numel, not its shape
    (lambda s, x, o: ops.matmul.get_workspace_size(
        T(s, np.zeros((2, 4, 8))), T(s, np.zeros((3, 8, 2))), T(s, np.zeros((2, 4, 2)))),
     INVALID),  # batch dims 2 and 3 do not broadcast (out takes a's: only that check refuses)
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, None, None, o, eps=float("nan")),
     INVALID),
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, None, None, o, eps=float("inf")),
     INVALID),
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, None, None, o, normalized_ndim=3),
     INVALID),  # more axes than x has
    (lambda s, x, o: ops.layer_norm.get_workspace_size(
        srt.Tensor.empty((4, 0), F32, stream=s), None, None,
        srt.Tensor.empty((4, 0), F32, stream=s)), INVALID),  # an empty normalised shape
    (lambda s, x, o: ops.layer_norm.get_workspace_size(x, T(s, np.ones(8)), T(s, np.ones(4)), o),
     INVALID),  # bias checked as well as weight
    (lambda s, x, o: ops.softmax.get_workspace_size(x, o, o), INVALID),  # one tensor too many
    (lambda s, x, o: ops.reduce_sum.get_workspace_size(x, T(s, np.zeros(4)), axis=2), INVALID),
    (lambda s, x, o: ops.cumsum.get_workspace_size(x, o, axis=-3), INVALID),
    (lambda s, x, o: ops.softmax.get_workspace_size(
        T(s, np.zeros((2, 8))), srt.Tensor.empty((2, 8), F32, stream=s).as_strided((2, 8), (0, 1))),
     INVALID),  # a size-2 dim with stride 0 overlaps too
])
def test_executor_phase1_rejects_bad_metadata_and_creates_nothing(s, make, code):
    x, out, _ = softmax_setup(s)
    before = live()
    raises(code, make, s, x, out)
    assert live() == before


def test_executor_phase1_rejects_freed_tensors_formats_and_devices(s):
    x, out, _ = softmax_setup(s)
    before = live()
    gone = T(s, np.zeros((4, 8)))
    gone.free()
    raises(NULLPTR, ops.softmax.get_workspace_size, gone, out)
    fmt = srt.Tensor.empty((1, 2, 2, 2, 16), F32, stream=s)
    nz = fmt.as_strided((1, 2, 2, 2, 16), fmt.strides, format="NC1HWC0")
    raises(INVALID, ops.softmax.get_workspace_size, nz, nz)
    s1 = srt.Stream("cpu:1", non_blocking=True)
    other = srt.Tensor.from_numpy(np.zeros((4, 8), F32), stream=s1)
    err = raises(INVALID, ops.add.get_workspace_size, x, other, out)
    assert "cpu:1" in str(err)
    assert live() == before
    s1.synchronize()
    s1.destroy()


def test_executor_planner_bug_is_an_inner_error(s, monkeypatch):
    x, out, _ = softmax_setup(s)
    before = live()
    monkeypatch.setattr(type(ops.softmax), "_plan", lambda self, i, o, a: 1 // 0)
    err = raises(INNER, ops.softmax.get_workspace_size, x, out)
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert err.name == "ACLNN_ERR_INNER"
    assert live() == before


# -- phase 2 checks --------------------------------------------------------------------------------
def _bad_calls(s, size, ex):
    """(description, call, code) for every phase-2 refusal."""
    ws = s.malloc(size)
    small = s.malloc(size // 2) if size > 1024 else None
    freed = s.malloc(size)
    s.free(freed)
    other = srt.Stream("cpu:1", non_blocking=True)
    far = other.malloc(size)
    calls = [
        ("workspace missing", lambda: ops.softmax(None, size, ex, s), NULLPTR),
        ("null workspace", lambda: ops.softmax(0, size, ex, s), NULLPTR),
        ("size mismatch", lambda: ops.softmax(ws, size + 1, ex, s), INVALID),
        ("size not an int", lambda: ops.softmax(ws, float(size), ex, s), INVALID),
        ("freed workspace", lambda: ops.softmax(freed, size, ex, s), INVALID),
        ("interior pointer, too few bytes left", lambda: ops.softmax(ws + 64, size, ex, s),
         INVALID),
        ("interior pointer of a freed block", lambda: ops.softmax(freed + 64, size, ex, s),
         INVALID),
        ("workspace on another device", lambda: ops.softmax(far, size, ex, s), INVALID),
        ("workspace not a pointer", lambda: ops.softmax("ws", size, ex, s), INVALID),
        ("no executor", lambda: ops.softmax(ws, size, None, s), NULLPTR),
        ("not an executor", lambda: ops.softmax(ws, size, object(), s), INVALID),
        ("executor of another op", lambda: ops.add(ws, size, ex, s), INVALID),
        ("stream of another device", lambda: ops.softmax(ws, size, ex, other), INVALID),
        ("not a stream", lambda: ops.softmax(ws, size, ex, "s"), INVALID),
    ]
    if small is not None:
        calls.append(("workspace too small", lambda: ops.softmax(small, size, ex, s), INVALID))
    return ws, other, calls


def test_executor_phase2_refusals_enqueue_nothing(s):
    x, out, ref = softmax_setup(s, rows=256, cols=8)  # a 2 KiB workspace: "small" is real
    size, ex = ops.softmax.get_workspace_size(x, out)
    assert size > 1024
    ws, other, calls = _bad_calls(s, size, ex)
    for what, call, code in calls:
        with pytest.raises(srt.ExecutorError) as info:
            call()
        assert info.value.code == code, what
    s.synchronize()
    assert np.all(out.numpy(s) == 0), "a refused call enqueued work"
    ops.softmax(ws, size, ex, s)  # the one-shot executor was not consumed by the refusals
    s.free(ws)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)
    other.synchronize()
    other.destroy()


def test_executor_workspace_may_be_none_only_when_size_is_zero(s):
    x, y = T(s, np.ones(4)), T(s, np.full(4, 2.0))
    out = T(s, np.zeros(4))
    size, ex = ops.add.get_workspace_size(x, y, out)
    assert size == 0  # alpha == 1, same dtypes: the seed's size-0 case
    ops.add(None, 0, ex, s)
    np.testing.assert_array_equal(out.numpy(s), np.full(4, 3.0))
    size, ex = ops.add.get_workspace_size(x, y, out)
    ws = s.malloc(1)  # the seed's advice (allocate a minimum unit anyway) is accepted too
    ops.add(ws, 0, ex, s)
    s.free(ws)
    s.synchronize()


def test_executor_accepts_an_srt_malloc_workspace(s):
    x, out, ref = softmax_setup(s)
    size, ex = ops.softmax.get_workspace_size(x, out)
    ws = srt.malloc(size)
    ops.softmax(ws, size, ex, s)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)
    srt.free(ws)


@pytest.mark.parametrize("alloc", ["srt.malloc", "s.malloc"])
def test_executor_workspace_one_byte_short_is_refused(s, alloc):
    # allocations round to 512 bytes; an interior pointer (legal pointer arithmetic, e.g. one
    # buffer carved into workspaces), placed from the end, shows an off-by-one; a pool block's
    # interior pointer was refused outright
    x, out, ref = softmax_setup(s)
    size, ex = ops.softmax.get_workspace_size(x, out)
    r = (size + 511) // 512 * 512 + 1024
    base = srt.malloc(r) if alloc == "srt.malloc" else s.malloc(r)
    err = raises(INVALID, ops.softmax, base + r - size + 1, size, ex, s)  # size - 1 bytes left
    assert str(size - 1) in str(err)
    ops.softmax(base + r - size, size, ex, s)  # exactly size bytes: accepted
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)
    srt.free(base) if alloc == "srt.malloc" else s.free(base)


def test_executor_workspace_overlapping_its_tensors_is_refused(s):
    # the op writes partial results there: a workspace carved out of its own input corrupted it
    xa = np.random.default_rng(0).standard_normal((4, 64)).astype(F32)
    base = s.malloc(4 * 64 * 4 + 4096)
    x = srt.Tensor(srt.TensorDesc((4, 64), F32), base)
    s.memcpy(base, xa, xa.nbytes)  # in s's order, after the malloc
    out = T(s, np.zeros((4, 64)))
    size, ex = ops.softmax.get_workspace_size(x, out)
    assert size
    raises(INVALID, ops.softmax, base + 128, size, ex, s)  # inside x
    raises(INVALID, ops.softmax, out.ptr, size, ex, s)  # the output
    ops.softmax(base + 4 * 64 * 4, size, ex, s)  # just past x: fine
    s.synchronize()
    assert (srt.read(base, (4, 64), F32) == xa).all()
    s.free(base)


def test_executor_zero_size_workspace_may_point_anywhere_live(s):
    # the op touches no byte of a 0-byte workspace: a pointer inside its own tensor is no overlap
    x = T(s, np.ones((4, 8)))
    out = T(s, np.zeros((4, 8)))
    size, ex = ops.add.get_workspace_size(x, x, out)
    assert size == 0
    ops.add(x.ptr + 4, 0, ex, s)
    assert (out.numpy(s) == 2).all()


# -- one-shot and repeatable -----------------------------------------------------------------------
def test_executor_one_shot_is_refused_on_a_second_run(s):
    x, out, _ = softmax_setup(s)
    size, ex = ops.softmax.get_workspace_size(x, out)
    ws = s.malloc(size)
    ops.softmax(ws, size, ex, s)
    err = raises(INVALID, ops.softmax, ws, size, ex, s)
    assert "already ran" in str(err)
    s.free(ws)
    ex.destroy()  # safe after it ran
    ex.destroy()


def test_executor_one_shot_is_released_when_its_work_completes(s, gate):
    x, out, ref = softmax_setup(s)
    base = live()
    g = gate(s)
    size, ex = ops.softmax.get_workspace_size(x, out)
    ws = s.malloc(size)
    ops.softmax(ws, size, ex, s)
    s.free(ws)
    assert live() == base + 1  # its kernels have not run: it must stay alive
    g.open()
    s.synchronize()
    assert live() == base
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)


def test_executor_destroy_while_in_flight(s, gate):
    # the kernels hold their own arguments: destroying a one-shot executor whose work is still
    # queued neither breaks that work nor lets its queued release count it a second time
    x, out, ref = softmax_setup(s)
    s.synchronize()
    base = live()
    size, ex = ops.softmax.get_workspace_size(x, out)
    g = gate(s)
    ws = s.malloc(size)
    ops.softmax(ws, size, ex, s)
    s.free(ws)
    ex.destroy()
    assert live() == base
    g.open()
    s.synchronize()  # runs the queued release of the already released executor
    assert live() == base
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)


def test_executor_one_shot_failed_enqueue_is_released_and_refused(s, monkeypatch):
    # phase 2 that fails after enqueueing part of the op: the one-shot executor can never run
    # cleanly again, so it is released and a retry is refused instead of enqueueing twice
    x, out, _ = softmax_setup(s)
    s.synchronize()
    base = live()
    size, ex = ops.softmax.get_workspace_size(x, out)
    ws = s.malloc(size)
    launches = fail_second_launch(monkeypatch)  # softmax's second kernel
    with pytest.raises(RuntimeError, match="injected"):
        ops.softmax(ws, size, ex, s)
    monkeypatch.undo()
    assert live() == base
    err = raises(INVALID, ops.softmax, ws, size, ex, s)
    assert "already ran" in str(err)
    assert len(launches) == 2  # the refused retry enqueued nothing
    s.free(ws)
    ex.destroy()


def test_executor_destroyed_is_refused(s):
    x, out, _ = softmax_setup(s)
    before = live()
    size, ex = ops.softmax.get_workspace_size(x, out)
    ex.destroy()
    assert live() == before
    ws = s.malloc(size)
    err = raises(INVALID, ops.softmax, ws, size, ex, s)
    assert "destroyed" in str(err)
    raises(INVALID, ex.set_repeatable)
    s.free(ws)


def test_executor_repeatable_runs_with_new_addresses(s, gate):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 5)).astype(F32) for _ in range(3)]
    ys = [rng.standard_normal((5,)).astype(F32) for _ in range(3)]
    tx = [T(s, a) for a in xs]
    ty = [T(s, a) for a in ys]
    outs = [T(s, np.zeros((3, 5))) for _ in range(3)]
    size, ex = ops.add.get_workspace_size(tx[0], ty[0], outs[0], alpha=2.0)
    ex.set_repeatable()
    assert ex.repeatable
    g = gate(s)  # nothing runs until all three are enqueued: addresses must be taken by value
    for i in range(3):
        ex.set_input_addr(0, tx[i].ptr)
        ex.set_input_addr(1, ty[i].ptr)
        ex.set_output_addr(0, outs[i].ptr)
        ws = s.malloc(size)
        ops.add(ws, size, ex, s)
        s.free(ws)
    g.open()
    for i in range(3):
        np.testing.assert_allclose(outs[i].numpy(s), xs[i] + 2 * ys[i], rtol=1e-6)
    assert ops.stats()["add"]["reuses"] >= 2
    ex.destroy()


def test_executor_address_setters_validate(s):
    """set_input_addr/set_output_addr refuse bad indices and pointers, and check the memory.

    The story: the setters once checked only that the pointer was a non-null int, so a freed
    pointer, another device's or one too close to its block's end was taken, and the next run
    read or wrote that memory silently; they now check it as phase 2 checks a workspace.
    """
    x, out, _ = softmax_setup(s)
    _, one_shot = ops.softmax.get_workspace_size(x, out)
    raises(INVALID, one_shot.set_input_addr, 0, x.ptr)  # not repeatable
    one_shot.destroy()
    _, ex = ops.layer_norm.get_workspace_size(x, None, None, out)
    ex.set_repeatable()
    raises(INVALID, ex.set_input_addr, 3, x.ptr)
    raises(INVALID, ex.set_input_addr, -1, x.ptr)
    raises(INVALID, ex.set_output_addr, 1, x.ptr)
    raises(INVALID, ex.set_input_addr, 1, x.ptr)  # planned without a weight
    raises(INVALID, ex.set_input_addr, "0", x.ptr)
    raises(NULLPTR, ex.set_input_addr, 0, None)
    raises(NULLPTR, ex.set_output_addr, 0, 0)
    raises(INVALID, ex.set_output_addr, 0, 2.5)
    # the memory itself, as phase 2 checks a workspace
    freed = srt.malloc(x.nbytes)
    srt.free(freed)
    other = srt.malloc(x.nbytes, "cpu:1")
    block = s.malloc(512)  # (sizes round to 512 bytes)
    raises(INVALID, ex.set_input_addr, 0, freed)
    raises(INVALID, ex.set_input_addr, 0, other)
    raises(INVALID, ex.set_input_addr, 0, block + 512 - 16)  # 16 bytes left, 128 needed
    raises(INVALID, ex.set_output_addr, 0, srt.malloc_host(x.nbytes))  # pinned host memory
    roomy = s.malloc(2 * x.nbytes)
    ex.set_input_addr(0, roomy + x.nbytes)  # pointer arithmetic inside an allocation is fine
    assert ex._addrs[0] == roomy + x.nbytes
    ex.destroy()
    srt.free(other)
    s.free(block)
    s.free(roomy)


def test_executor_set_repeatable_only_before_the_first_run(s):
    x = T(s, np.ones(4))
    size, ex = ops.mul.get_workspace_size(x, x, x)
    ops.mul(None, size, ex, s)
    raises(INVALID, ex.set_repeatable)
    s.synchronize()


# -- threads ---------------------------------------------------------------------------------------
def test_executor_from_another_thread_is_refused(s):
    x, out, ref = softmax_setup(s)
    size, ex = ops.softmax.get_workspace_size(x, out)
    ws = s.malloc(size)
    codes = {}

    def other_thread():
        for what, fn in [("run", lambda: ops.softmax(ws, size, ex, s)),
                         ("set_repeatable", ex.set_repeatable),
                         ("set_input_addr", lambda: ex.set_input_addr(0, x.ptr)),
                         ("destroy", ex.destroy)]:
            try:
                fn()
                codes[what] = None
            except srt.ExecutorError as exc:
                codes[what] = exc.code

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert codes == dict.fromkeys(("run", "set_repeatable", "set_input_addr", "destroy"), INVALID)
    s.synchronize()
    assert np.all(out.numpy(s) == 0)
    ops.softmax(ws, size, ex, s)  # the owner still can
    s.free(ws)
    np.testing.assert_allclose(out.numpy(s), ref, rtol=1e-5)


def test_executor_error_names_and_repr(s):
    x, out, _ = softmax_setup(s)
    err = raises(NULLPTR, ops.softmax.get_workspace_size, None, out)
    assert err.name == "ACLNN_ERR_PARAM_NULLPTR" and isinstance(err, srt.StreamRTError)
    _, ex = ops.softmax.get_workspace_size(x, out)
    assert "softmax" in repr(ex) and "ready" in repr(ex)
    ex.destroy()
    assert "released" in repr(ex)
