"""Seed 002, ported line by line: capture foo/memcpy/bar into a graph, then build it explicitly,
then update a kernel node's parameters without re-instantiating."""

import numpy as np

import streamrt as srt


@srt.kernel
def foo(ctx, data, n):
    """__global__ void foo(float* data, int n) { data[idx] = data[idx] * 2.0f; }"""
    x = ctx.array(data, (n,), np.float32)
    x *= 2.0


@srt.kernel
def bar(ctx, data, n):
    """__global__ void bar(float* data, int n) { data[idx] = data[idx] + 1.0f; }"""
    x = ctx.array(data, (n,), np.float32)
    x += 1.0


def main() -> int:
    n = 1 << 20
    d_src = srt.malloc(n * 4)                              # cudaMalloc(&d_src, n * sizeof(float))
    d_dst = srt.malloc(n * 4)
    srt.write(d_src, np.ones(n, np.float32))
    stream = srt.Stream(non_blocking=True)                # cudaStreamCreate(&stream)
    # 1. stream capture
    stream.begin_capture(srt.CaptureMode.THREAD_LOCAL)    # cudaStreamBeginCapture(..., ThreadLocal)
    stream.launch(foo, d_src, n, grid=n // 256, block=256)  # foo<<<n/256, 256, 0, stream>>>
    stream.memcpy(d_dst, d_src, n * 4)                    # cudaMemcpyAsync(..., DeviceToDevice)
    stream.launch(bar, d_dst, n, grid=n // 256, block=256)
    graph = stream.end_capture()                          # cudaStreamEndCapture(stream, &graph)
    graph_exec = graph.instantiate()                      # cudaGraphInstantiate(&graphExec, graph)
    graph_exec.launch(stream)                             # cudaGraphLaunch(graphExec, stream)
    stream.synchronize()                                  # cudaStreamSynchronize(stream)
    captured = srt.read(d_dst, (4,), np.float32)
    print("captured graph:", len(graph.nodes()), "nodes; dst[:4] =", captured)
    graph_exec.destroy()                                  # cudaGraphExecDestroy(graphExec)

    # 2. explicit construction: two kernel nodes, then the dependency A -> B
    d_data = srt.malloc(n * 4)
    srt.write(d_data, np.ones(n, np.float32))
    g = srt.Graph()                                       # cudaGraphCreate(&graph, 0)
    node_a = g.add_kernel_node(foo, d_data, n, grid=n // 256, block=256)  # cudaGraphAddKernelNode
    node_b = g.add_kernel_node(bar, d_data, n, grid=n // 256, block=256)
    g.add_dependencies(node_a, node_b)                    # cudaGraphAddDependencies(g, &A, &B, 1)
    exec_ = g.instantiate()
    s2 = srt.Stream(non_blocking=True)                    # cudaStreamCreateWithFlags(NonBlocking)
    exec_.launch(s2)
    s2.synchronize()
    explicit = srt.read(d_data, (4,), np.float32)
    print("explicit graph: dst[:4] =", explicit)

    # 3. node parameter update: change node A's input pointer, no re-instantiation
    d_other = srt.malloc(n * 4)
    srt.write(d_other, np.full(n, 10.0, np.float32))
    exec_.set_kernel_node_params(node_a, d_other, n)      # cudaGraphExecKernelNodeSetParams
    exec_.launch(s2)
    s2.synchronize()
    updated = srt.read(d_other, (4,), np.float32)
    print("after the update, node A doubled the other buffer:", updated)
    exec_.destroy()
    for p in (d_src, d_dst, d_data, d_other):
        srt.free(p)                                       # cudaFree
    ok = (captured == 3.0).all() and (explicit == 3.0).all() and (updated == 20.0).all()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
