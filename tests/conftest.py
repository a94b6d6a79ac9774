"""Shared fixtures: devices, gate kernels, delay injection."""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

if os.environ.get("STREAMRT_CUDA_FAKE") == "1":  # before any device: cuda runs on tests/cuda/fake
    from tests.cuda.fake import install as _install_fake_cuda

    _install_fake_cuda()

import numpy as np
import pytest

import streamrt as srt
from streamrt.backends import cpu
from streamrt.graph import capture
from streamrt.kernel import Kernel

BUF_N = 16  # float32 elements of the ``buf``/``out`` fixtures


@pytest.fixture
def san():
    """The sanitizer on in collect mode, findings cleared before and after."""
    srt.sanitizer.clear()
    srt.sanitizer.enable("collect")
    yield srt.sanitizer
    srt.sanitizer.disable()
    srt.sanitizer.clear()


@pytest.fixture(autouse=True)
def _sanitizer_as_found():
    """A test that switches the sanitizer leaves it as it found it: on for the rest of a
    STREAMRT_SANITIZE run (a test's own enable/disable once turned it off for every later test)."""
    was, mode = srt.sanitizer.enabled(), srt.sanitizer._SAN.mode
    yield
    if srt.sanitizer.enabled() != was or srt.sanitizer._SAN.mode != mode:
        if was:
            srt.sanitizer.enable(mode)
        else:
            srt.sanitizer.disable()


@pytest.fixture
def dev():
    """cpu:0, synchronized and checked clean after the test."""
    d = srt.Device("cpu:0")
    yield d
    d.synchronize()


def set_delays(us: int) -> tuple[int, int]:
    """Delay injection of the cpu backend and, when installed, the fake CUDA runtime's streams;
    returns the previous values (for :func:`restore_delays`)."""
    prev_fake = 0
    if os.environ.get("STREAMRT_CUDA_FAKE") == "1":
        from tests.cuda.fake import state

        prev_fake = state.set_delay_us(us)
    return cpu.set_delay_us(us), prev_fake


def restore_delays(prev: tuple[int, int]) -> None:
    cpu.set_delay_us(prev[0])
    if os.environ.get("STREAMRT_CUDA_FAKE") == "1":
        from tests.cuda.fake import state

        state.set_delay_us(prev[1])


@pytest.fixture
def delay():
    """Delay injection on (random 0-200 us before each worker op): missing waits show up."""
    prev = set_delays(200)
    yield 200
    restore_delays(prev)


# -- backends: contract tests run on each (cuda ones skip, saying why, where no GPU is usable) --
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


_poisoned: list[str] = []  # why the CUDA context is unusable: a test left a sticky error


def cuda_reason() -> str | None:
    """Why ``cuda:0`` cannot be used here (None: it can)."""
    if _poisoned:
        return _poisoned[0]
    try:
        srt.Device("cuda:0")
    except srt.StreamRTError as exc:
        return str(exc)
    return None


@pytest.fixture(autouse=True)
def _cuda_context_still_usable(request):
    """After a cuda test, check the context. A sticky error (a kernel fault, an illegal address)
    makes every later CUDA call in the process fail: the later cuda tests then skip naming the
    test that left it, instead of each failing on its own (gpu_check.sh reports skip reasons)."""
    yield
    if _poisoned or request.node.get_closest_marker("cuda") is None:
        return
    if "streamrt.backends.cuda" not in sys.modules or srt.device_count("cuda") == 0:
        return  # no CUDA context was made: nothing to check
    from cuda.bindings import runtime as rt

    err = rt.cudaMemGetInfo()[0]  # cheap, and any CUDA call returns a sticky error
    if err != rt.cudaError_t.cudaSuccess:
        _poisoned.append(f"the CUDA context is unusable since {request.node.nodeid} left "
                         f"{getattr(err, 'name', err)} (a sticky error); later cuda tests cannot run "
                         "in this process")


def backend_device(backend: str) -> srt.Device:
    """Device 0 of ``backend``; skips the test, with the reason, when it cannot be used."""
    if backend == "cuda":
        reason = cuda_reason()
        if reason is not None:
            pytest.skip(f"no usable CUDA device here: {reason}")
    return srt.Device(f"{backend}:0")


def no_sanitizer(why: str) -> None:
    """Skip a test while the sanitizer is on (a STREAMRT_SANITIZE run), saying why it cannot hold."""
    if srt.sanitizer.enabled():
        pytest.skip(f"not with the sanitizer on: {why}")


BAD_ACCESS = "it makes a bad access on purpose, which the sanitizer reports as a finding first"


def cpu_only(dev: srt.Device, why: str) -> None:
    """Skip a contract test on backends other than cpu, saying why it cannot hold there."""
    if dev.backend != "cpu":
        pytest.skip(f"cpu backend only: {why}")


PY_KERNELS = "Python kernel bodies with host-side effects (a GPU runs only CUDA C)"
HOST_CONCURRENCY = ("CUDA may serialize host functions without a mandated order (cudaLaunchHostFunc), "
                    "so host nodes waiting for each other deadlock there")


@pytest.fixture(params=BACKENDS)
def any_dev(request):
    """Device 0 of each backend, current for the test (a module of contract tests makes its
    ``dev`` fixture return this one)."""
    d = backend_device(request.param)
    with d:
        yield d
        d.synchronize()


@srt.kernel
def gate_kernel(ctx, event):
    """Blocks its stream until ``event`` is set: makes "not yet complete" certain."""
    if not event.wait(timeout=60):
        raise TimeoutError("gate never opened")



def fail_second_launch(monkeypatch) -> list:
    """Make the second ``Stream.launch`` from now on raise (an enqueue failing midway, until
    ``monkeypatch.undo()``); returns the kernels launched, for counting."""
    real = srt.Stream.launch
    launches: list = []

    def launch(self, kernel, *args, **kwargs):
        launches.append(kernel)
        if len(launches) == 2:
            raise RuntimeError("injected enqueue failure")
        return real(self, kernel, *args, **kwargs)

    monkeypatch.setattr(srt.Stream, "launch", launch)
    return launches

FLAG_GATE = r"""extern "C" __global__ void flag_gate_kernel(const volatile int* flag) {
  long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < 40000000000LL) { }
}"""


@srt.kernel(cuda=FLAG_GATE, signature="ptr")
def flag_gate_kernel(ctx, flag):
    """The gate of any backend: spins on an int32 in pinned host memory until the host sets it."""
    f = ctx.array(flag, (1,), np.int32, readonly=True)
    deadline = time.monotonic() + 30
    while f[0] == 0 and time.monotonic() < deadline:  # a spin, as the CUDA body does
        time.sleep(0.0002)


class HostFlag:
    """An int32 in pinned host memory that kernels can read while the host writes it."""

    def __init__(self, dev: srt.Device) -> None:
        with dev:
            self.ptr = srt.malloc_host(4)
        if dev.backend == "cpu":
            self.view = cpu.SPACE.array(self.ptr, (1,), np.int32, False)
        else:
            self.view = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(self.ptr))
        self.view[0] = 0

    def set(self) -> None:
        self.view[0] = 1


class Gate:
    """A host-controlled gate enqueued on a stream (a pinned-memory flag on non-cpu backends)."""

    def __init__(self, stream: srt.Stream) -> None:
        self.event = threading.Event()
        self.flag: HostFlag | None = None
        if stream.device.backend == "cpu":
            stream.launch(gate_kernel, self.event)
        else:
            _install_gate_guard()
            self.flag = HostFlag(stream.device)
            self.device = stream.device
            stream.launch(flag_gate_kernel, self.flag.ptr)
            _closed_gates[self] = stream.device.index

    def open(self) -> None:
        self.event.set()
        if self.flag is not None:
            self.flag.set()
        _closed_gates.pop(self, None)


# -- what the host must not do while a GPU gate is closed ---------------------------------------
# The gate is opened by the test's own thread, later: a CUDA call that waits for the device in
# between waits for the gate, and the host hangs until the gate kernel gives up (about 20 s),
# after which "not yet complete" no longer holds. The fake CUDA runtime never blocks in these
# calls; a GPU may: the CUDA Programming Guide (stream-ordered allocator) says cudaMalloc and
# cudaFree "cause the GPU to synchronize across all executing CUDA streams", its Implicit
# Synchronization section lists page-locked and device memory allocations, and under lazy loading
# (the default since CUDA 12.2) "loading kernels might require context synchronization", with a
# spinning kernel as its deadlock example. So while a cuda gate is closed, those calls fail the
# test at once, on the fake too, and the ``gate`` fixture loads the test module's kernels first.
_closed_gates: dict[Gate, int] = {}  # closed cuda gates -> their device index
_guard_installed = False

GATED_CALL = ("while a gate holds cuda:{dev}: on a GPU it may wait for the whole device, so for the "
              "gate, which this thread opens only later (do it before closing the gate)")


def _install_gate_guard() -> None:
    """Wrap the cuda backend's kernel loading, ``cudaMalloc``, ``cudaMallocHost`` and graph-memory
    mapping (``cuMemCreate``) to refuse them while a gate of their device is closed (once)."""
    global _guard_installed
    if _guard_installed:
        return
    from streamrt.backends import cuda

    def guard(cls: type, name: str, what: str, applies=lambda impl, *args: True) -> None:
        real = getattr(cls, name)

        @functools.wraps(real)
        def call(self, *args, **kwargs):
            index = getattr(self, "index", None)  # None: the backend (pinned memory), any device
            held = [d for d in _closed_gates.values() if index is None or d == index]
            if held and applies(self, *args):
                raise AssertionError(f"{what} {GATED_CALL.format(dev=held[0])}")
            return real(self, *args, **kwargs)

        setattr(cls, name, call)

    guard(cuda.CudaDevice, "function", "a first launch of a kernel (it loads its module)",
          lambda impl, kernel: kernel not in impl._functions)
    guard(cuda.CudaDevice, "malloc", "srt.malloc (cudaMalloc)")
    guard(cuda.CudaDevice, "graph_map", "mapping graph memory (cuMemCreate)")
    guard(cuda.CudaBackend, "malloc_host", "srt.malloc_host (cudaMallocHost)")
    _guard_installed = True


def _load_kernels(dev: srt.Device, *modules) -> None:
    """Load every module-level kernel with a CUDA body of ``modules`` on ``dev`` (a cuda device)."""
    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, Kernel) and value.cuda_source and value.signature is not None:
                dev._impl.function(value)


@pytest.fixture
def gate(request):
    """``gate(stream)`` blocks ``stream`` until the returned gate is opened (auto-opened at teardown).
    On cuda, the kernels of the test's module and of this file are loaded before the first gate
    closes, and calls that may wait for the device fail while it is closed (see GATED_CALL)."""
    gates: list[Gate] = []
    loaded: set[srt.Device] = set()

    def make(stream: srt.Stream) -> Gate:
        if stream.device.backend != "cpu" and stream.device not in loaded and not _closed_gates:
            _load_kernels(stream.device, sys.modules[__name__], request.module)
            loaded.add(stream.device)
        g = Gate(stream)
        gates.append(g)
        return g

    yield make
    for g in gates:
        g.open()
    for g in gates:
        if g.flag is not None:  # the kernel may still read it: free once its device is idle
            g.device.synchronize()
            with g.device:
                srt.free_host(g.flag.ptr)


def _grid_stride(name: str, params: str, body: str) -> str:
    """CUDA C of a float32 elementwise kernel correct for any launch shape (default: 1 thread)."""
    return (f'extern "C" __global__ void {name}({params}) {{\n'
            "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)"
            f" {body};\n}}")


@srt.kernel(cuda=_grid_stride("fill_kernel", "float* ptr, int n, float value", "ptr[i] = value"),
            signature="ptr, i32, f32")
def fill_kernel(ctx, ptr, n, value):
    ctx.array(ptr, (n,), np.float32)[:] = value


@srt.kernel(cuda=_grid_stride("add_one_kernel", "float* ptr, int n", "ptr[i] += 1.0f"),
            signature="ptr, i32")
def add_one_kernel(ctx, ptr, n):
    x = ctx.array(ptr, (n,), np.float32)
    x += 1


@srt.kernel(cuda=_grid_stride("copy_kernel", "float* dst, const float* src, int n", "dst[i] = src[i]"),
            signature="ptr, ptr, i32")
def copy_kernel(ctx, dst, src, n):
    ctx.array(dst, (n,), np.float32)[:] = ctx.array(src, (n,), np.float32, readonly=True)


@pytest.fixture(autouse=True)
def _no_fake_cuda_fault():
    """With the fake CUDA runtime on, a failure inside its worker threads fails the test."""
    if os.environ.get("STREAMRT_CUDA_FAKE") != "1":
        yield
        return
    from tests.cuda.fake import state

    before = len(state.faults)
    yield
    assert len(state.faults) == before, "fake CUDA runtime fault:\n" + "\n".join(state.faults[before:])


@pytest.fixture(autouse=True)
def _no_capture_leak():
    """A failed test must not leave a capture active (it would break every later test)."""
    yield
    srt.exchange_capture_mode(srt.CaptureMode.GLOBAL)
    leaked = list(capture._active)
    for cap in leaked:
        cap.finish()
    assert not leaked, f"captures left active: {leaked}"


@pytest.fixture
def s(dev):
    """A non-blocking stream on cpu:0."""
    return srt.Stream(dev, non_blocking=True)


@pytest.fixture
def s2(dev):
    """A second non-blocking stream on cpu:0."""
    return srt.Stream(dev, non_blocking=True)


@pytest.fixture
def buf(dev):
    """``BUF_N`` zeroed float32 of device memory."""
    p = srt.malloc(BUF_N * 4, dev)
    srt.memset(p, 0, BUF_N * 4)
    yield p
    srt.free(p)


@pytest.fixture
def out(buf):
    """The same as ``buf``, under another name."""
    return buf


def read_f32(p, n=BUF_N):
    """A synchronous copy of ``n`` float32 at ``p``."""
    return srt.read(p, (n,), np.float32)


class ReentryLock:
    """Stands in for a lock that finalizers' releases take (:class:`streamrt.reclaim.Reclaim`):
    taking it again on the thread that holds it, which would wait forever, is recorded in
    ``reentered`` and raises instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self.reentered: list[str] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._owner == threading.get_ident():
            self.reentered.append(threading.current_thread().name)
            raise RuntimeError("this thread already holds the lock: a real one would deadlock")
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            self._owner = threading.get_ident()
        return ok

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def reentry_lock(monkeypatch, guarded, reclaim=None) -> ReentryLock:
    """Put a :class:`ReentryLock` in place of ``guarded._lock`` and of the lock of ``reclaim``
    (default ``guarded.reclaim``), which finalizers' releases use."""
    lock = ReentryLock()
    monkeypatch.setattr(guarded, "_lock", lock)
    monkeypatch.setattr(reclaim or guarded.reclaim, "lock", lock)
    return lock


def in_thread(fn):
    """Run ``fn`` on a new thread; return its result or raise its exception here."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "helper thread hung"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@contextmanager
def delayed(us: int):
    """Delay injection of ``us`` microseconds on (see :func:`set_delays`) for the ``with`` block."""
    prev = set_delays(us)  # the cpu backend's and the fake CUDA runtime's
    try:
        yield
    finally:
        restore_delays(prev)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` (dedented) run by this Python in a subprocess, with ``env`` added to the environment."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=20, env=dict(os.environ, **env))


# -- the run's own report: what it is (under make) and why tests skipped ---------------------------
def pytest_report_collectionfinish(config, start_path, items):
    """Under ``make test``, one line saying what this run is: ``STREAMRT_MAKE_STEP`` is its label,
    ``{n}`` in it the number of tests collected."""
    label = os.environ.get("STREAMRT_MAKE_STEP")
    return f"make: {label.replace('{n}', str(len(items)))}" if label else []


def _skip_reason(rep) -> str:
    longrepr = rep.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ").strip().splitlines()[0] if reason.strip() else "?"


SKIP_REASONS_SHOWN = 20


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The skipped tests grouped by reason, most first: a short table instead of one line each."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped or set(config.getoption("reportchars", "") or "") & set("saA"):
        return  # (-rs, -ra list each one themselves)
    counts: dict[str, int] = {}
    for rep in skipped:
        reason = _skip_reason(rep)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="-")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    width = len(str(ranked[0][1]))
    for reason, n in ranked[:SKIP_REASONS_SHOWN]:
        terminalreporter.line(f"{n:>{width}} skipped: {reason}")
    rest = ranked[SKIP_REASONS_SHOWN:]
    if rest:
        terminalreporter.line(f"{sum(n for _, n in rest):>{width}} skipped: {len(rest)} other "
                              "reasons (pytest -rs lists each)")
