"""Probe (seconds, raw cuda-bindings): which CUDA calls from *another* thread stall while a host
function (cudaLaunchHostFunc) is in flight. streamrt's trampoline keeps the driver's callback
thread blocked while its Python worker runs the callable, and that worker (and the main thread)
keep calling CUDA meanwhile. Run:  python scripts/probe_hostfn.py   (gpu_check.sh runs it first;
STREAMRT_CUDA_FAKE=1: on the fake)
Each line: the call, then its result and time, or STALLED when it had not returned after 2 s
(it is then reported again once the host function was released)."""
import ctypes
import os
import sys
import threading
import time

if os.environ.get("STREAMRT_CUDA_FAKE") == "1":
    sys.path.insert(0, os.getcwd())
    from tests.cuda.fake import install
    install()
from cuda.bindings import runtime as rt


def ok(res):
    err, *vals = res if isinstance(res, tuple) else (res,)
    assert int(err) == 0, err
    return vals[0] if len(vals) == 1 else vals


ok(rt.cudaSetDevice(0))
ok(rt.cudaFree(0))
flags = rt.cudaStreamNonBlocking
s, other = ok(rt.cudaStreamCreateWithFlags(flags)), ok(rt.cudaStreamCreateWithFlags(flags))
pool = ok(rt.cudaDeviceGetDefaultMemPool(0))
buf = ok(rt.cudaMalloc(1 << 20))
gate, entered = threading.Event(), threading.Event()
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
blocker = HOSTFN(lambda _: (entered.set(), gate.wait(20)))
noop = HOSTFN(lambda _: None)
fn = lambda c: rt.cudaHostFn_t(ctypes.cast(c, ctypes.c_void_p).value)  # noqa: E731
ok(rt.cudaLaunchHostFunc(s, fn(blocker), 0))
assert entered.wait(5), "the host function never started"
ev = ok(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
calls = [
    ("cudaStreamQuery(its stream)", lambda: rt.cudaStreamQuery(s)),
    ("cudaStreamQuery(other stream)", lambda: rt.cudaStreamQuery(other)),
    ("cudaSetDevice(0)", lambda: rt.cudaSetDevice(0)),
    ("cudaEventCreateWithFlags", lambda: rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming)),
    ("cudaEventRecord(its stream)", lambda: rt.cudaEventRecord(ev, s)),
    ("cudaEventQuery(that event)", lambda: rt.cudaEventQuery(ev)),
    ("cudaMemsetAsync(other stream)", lambda: rt.cudaMemsetAsync(buf, 0, 1 << 20, other)),
    ("cudaMemsetAsync(its stream)", lambda: rt.cudaMemsetAsync(buf, 0, 1 << 20, s)),
    ("cudaMallocFromPoolAsync(its stream)", lambda: rt.cudaMallocFromPoolAsync(4096, pool, s)),
    ("cudaLaunchHostFunc(other stream)", lambda: rt.cudaLaunchHostFunc(other, fn(noop), 0)),
    ("cudaLaunchHostFunc(its stream)", lambda: rt.cudaLaunchHostFunc(s, fn(noop), 0)),
    ("cudaStreamSynchronize(other stream)", lambda: rt.cudaStreamSynchronize(other)),
]
stalled = []
for name, call in calls:
    box, t0 = {}, time.perf_counter()
    t = threading.Thread(target=lambda call=call, box=box: box.setdefault("r", call()), daemon=True)
    t.start()
    t.join(2)
    if t.is_alive():
        print(f"{name:40s} STALLED (> 2 s while the host function runs)", flush=True)
        stalled.append((name, t, box, t0))
    else:
        print(f"{name:40s} {box['r'][0]!r} in {1e3 * (time.perf_counter() - t0):.3f} ms", flush=True)
gate.set()
for name, t, box, t0 in stalled:
    t.join(25)
    print(f"{name:40s} after release: {box.get('r', ('still stalled',))[0]!r}, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
ok(rt.cudaStreamSynchronize(s))
ok(rt.cudaStreamSynchronize(other))
print("probe done:", "some calls stall behind a running host function" if stalled else
      "no call stalled behind a running host function")
