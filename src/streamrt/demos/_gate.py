"""A host-controlled gate that holds a stream, on every backend (the demos' "stream still busy").

A gate kernel spins on an int32 flag in pinned host memory until the host sets it. A
``threading.Event`` would do on cpu, but a GPU kernel cannot wait on a Python object: a flag in
pinned memory is readable by the cpu backend's Python body and by a CUDA kernel alike, so one
gate serves both (the pattern of tests/test_backends.py).
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from ..backends import cpu
from ..device import Device
from ..host_memory import free_host, malloc_host
from ..kernel import Kernel, kernel
from ..stream import Stream

# 40e9 clock cycles is about 20 s on a 2 GHz GPU: long enough for any demo step, and a demo that
# dies before opening its gate does not leave the GPU spinning forever.
GATE_CUDA = r"""extern "C" __global__ void demo_gate(const volatile int* flag) {
  long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < 40000000000LL) { }
}"""


@kernel(name="demo_gate", cuda=GATE_CUDA, signature="ptr")
def gate_kernel(ctx, flag):
    """Spin until the host sets ``flag`` (bounded, as the CUDA body is)."""
    f = ctx.array(flag, (1,), np.int32, readonly=True)
    deadline = time.monotonic() + 20
    while f[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.0002)


class HostGate:
    """A closed gate: :meth:`hold` enqueues the spin on a stream, :meth:`open` lets it finish."""

    def __init__(self, dev: Device) -> None:
        self.device = dev
        with dev:  # malloc_host serves the current device's backend
            self.ptr = malloc_host(4)
        if dev.backend == "cpu":  # cpu addresses are the backend's own, not process addresses
            self._flag = cpu.SPACE.array(self.ptr, (1,), np.int32, False)
        else:
            self._flag = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(self.ptr))
        self._flag[0] = 0

    def hold(self, stream: Stream, *then: Kernel) -> None:
        """Hold ``stream`` until :meth:`open`: its later work is certainly not complete before.
        ``then``: kernels launched while it is held, loaded first. On cuda a kernel's first launch
        loads its module, and loading "might require context synchronization" (CUDA's lazy
        loading), which would wait for this gate, that only the caller opens."""
        load = getattr(stream.device._impl, "function", None)  # the cuda backend's loader
        for k in then if load is not None else ():
            load(k)
        stream.launch(gate_kernel, self.ptr)

    def open(self) -> None:
        """Let every held stream go on (idempotent)."""
        self._flag[0] = 1

    def free(self) -> None:
        """Open, then release the flag; the streams it held must have been synchronized."""
        self.open()
        with self.device:
            free_host(self.ptr)
