"""Jacobi iteration until converged, as ONE graph launch: a WHILE conditional node whose body is
a sweep and a convergence test, the test a kernel that stops the loop (``ctx.set_condition``).

The problem: -lap(u) = 1 on the unit square, u = 0 on the boundary, a 16x16 interior grid. A sweep
computes the residual r = f + lap(u) of the current iterate (its max norm into device memory)
and takes the Jacobi step u += h^2/4 r. The graph's loop runs on the device with no host
synchronize per iteration: the iterations are counted in device memory and read once, at the
end. The same computation driven from the host (launch a sweep, synchronize, read the residual,
stop when small) must give the same iterate, bit for bit, after the same number of sweeps.
"""

import time

import numpy as np

import streamrt as srt

N = 16                  # interior points per side
H2 = (1.0 / (N + 1)) ** 2
TOL = 1e-6              # stop once max |residual| < TOL
MAX_ITERS = 5000        # a guard: the loop stops here even if it never converges
SHAPE = (N + 2, N + 2)  # with the boundary


@srt.kernel
def sweep(ctx, u, f, res):
    """One Jacobi sweep over the interior; res[0] = max |f + lap(u)| before the step."""
    x = ctx.array(u, SHAPE, np.float64)
    rhs = ctx.array(f, SHAPE, np.float64, readonly=True)
    r = rhs[1:-1, 1:-1] + (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:]
                           - 4.0 * x[1:-1, 1:-1]) / H2
    ctx.array(res, (1,), np.float64)[0] = np.abs(r).max()
    x[1:-1, 1:-1] += 0.25 * H2 * r  # every new value from the old iterate: Jacobi, not Gauss-Seidel


@srt.kernel
def converged(ctx, res, iters, handle):
    """Count the sweep; end the WHILE loop once the residual is small (or at MAX_ITERS)."""
    n = ctx.array(iters, (1,), np.int64)
    n += 1
    if ctx.array(res, (1,), np.float64, readonly=True)[0] < TOL or n[0] >= MAX_ITERS:
        ctx.set_condition(handle, 0)                    # cudaGraphSetConditional(handle, 0)


def start(u, f, iters) -> None:
    """u = 0 (with its boundary), f = 1, no sweeps yet."""
    srt.write(u, np.zeros(SHAPE))
    srt.write(f, np.ones(SHAPE))
    srt.write(iters, np.zeros(1, np.int64))


def main() -> int:
    grid = SHAPE[0] * SHAPE[1] * 8
    u, f, res, iters = srt.malloc(grid), srt.malloc(grid), srt.malloc(8), srt.malloc(8)
    s = srt.Stream(non_blocking=True)

    # 1. on the device: while (handle) { sweep; converged }, in one graph, one launch
    g = srt.Graph()
    handle = g.create_conditional_handle(default=1)   # cudaGraphConditionalHandleCreate(.., 1, Default)
    loop = g.add_conditional_node(handle, srt.ConditionalType.WHILE)  # cudaGraphAddNode(.., WHILE)
    body = loop.bodies[0]
    step = body.add_kernel_node(sweep, u, f, res)
    body.add_kernel_node(converged, res, iters, handle, deps=[step])
    ge = g.instantiate()
    start(u, f, iters)
    t0 = time.perf_counter()
    ge.launch(s)                                      # cudaGraphLaunch: the whole solve
    s.synchronize()                                   # the only synchronize
    graph_s = time.perf_counter() - t0
    graph_iters = int(srt.read(iters, (1,), np.int64)[0])
    graph_res = float(srt.read(res, (1,), np.float64)[0])
    graph_u = srt.read(u, SHAPE, np.float64)
    ge.destroy()
    g.destroy()

    # 2. on the host: launch a sweep, read its residual back, decide there
    start(u, f, iters)
    host_iters, syncs = 0, 0
    t0 = time.perf_counter()
    while True:
        s.launch(sweep, u, f, res)
        host_iters += 1
        s.synchronize()                               # a round trip per sweep
        syncs += 1
        host_res = float(srt.read(res, (1,), np.float64)[0])
        if host_res < TOL or host_iters >= MAX_ITERS:
            break
    host_s = time.perf_counter() - t0
    host_u = srt.read(u, SHAPE, np.float64)
    for p in (u, f, res, iters):
        srt.free(p)
    s.destroy()

    print(f"Jacobi, -lap(u) = 1 on a {N}x{N} grid, until max |residual| < {TOL:g}")
    print(f"  one graph launch (WHILE node):  {graph_iters} sweeps, residual {graph_res:.3e}, "
          f"1 synchronize, {graph_s * 1e3:.1f} ms")
    print(f"  host-driven loop:               {host_iters} sweeps, residual {host_res:.3e}, "
          f"{syncs} synchronizes, {host_s * 1e3:.1f} ms")
    print(f"  u at the centre {graph_u[N // 2 + 1, N // 2 + 1]:.6f}; the two iterates are "
          f"{'identical' if np.array_equal(graph_u, host_u) else 'DIFFERENT'}")
    ok = (graph_iters == host_iters < MAX_ITERS and graph_res == host_res < TOL
          and np.array_equal(graph_u, host_u))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
