"""Seed 002's graph programs in ACL's spelling: foo, an async device-to-device copy and bar
captured into a model RI (aclmdlRICaptureBegin/End, as cudaStreamBeginCapture/EndCapture),
replayed with aclmdlRIExecuteAsync, updated in place from a second capture, and the seed's
first pitfall (a synchronize inside the capture invalidates it, §5.1). Checks every result.

Run: python examples/acl/graph_seed002.py   (or: python -m streamrt.acl examples/acl/graph_seed002.py)
"""

import ctypes
import os
import sys

import numpy as np

try:
    import acl  # under python -m streamrt.acl (or a real pyACL)
except ImportError:
    from streamrt import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0
ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL = 1
ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED = 507903


class KernelArgs(ctypes.Structure):  # foo's and bar's (float* data, int n)
    _fields_ = [("data", ctypes.c_void_p), ("n", ctypes.c_int32)]


def check(what, ret):
    if ret != ACL_SUCCESS:
        sys.exit(f"{what} failed: ret={ret} {acl.get_recent_err_msg()}")


def launch(func, blocks, data, n, stream):
    args = KernelArgs(data, n)
    check("aclrtLaunchKernelV2", acl.rt.launch_kernel(func, blocks, acl.util.bytes_to_ptr(args),
                                                      ctypes.sizeof(args), stream))


def read(ptr, n):
    out = np.empty(n, np.float32)
    check("aclrtMemcpy", acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, ptr, out.nbytes,
                                       ACL_MEMCPY_DEVICE_TO_HOST))
    return out


def main():
    check("aclInit", acl.init())
    check("aclrtSetDevice", acl.rt.set_device(0))
    here = os.path.dirname(os.path.abspath(__file__))
    binary, ret = acl.rt.binary_load_from_file(os.path.join(here, "kernels.py"), None)
    check("aclrtBinaryLoadFromFile", ret)
    foo, ret = acl.rt.binary_get_function(binary, "foo")
    check("aclrtBinaryGetFunction", ret)
    bar, ret = acl.rt.binary_get_function(binary, "bar")
    check("aclrtBinaryGetFunction", ret)

    n = 1 << 20
    nbytes = n * 4
    d_src, ret = acl.rt.malloc(nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
    check("aclrtMalloc", ret)
    d_dst, ret = acl.rt.malloc(nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
    check("aclrtMalloc", ret)
    ones = np.ones(n, np.float32)
    check("aclrtMemcpy", acl.rt.memcpy(d_src, nbytes, acl.util.numpy_to_ptr(ones), nbytes,
                                       ACL_MEMCPY_HOST_TO_DEVICE))
    stream, ret = acl.rt.create_stream()
    check("aclrtCreateStream", ret)

    # 2.1: capture foo, a device-to-device copy and bar
    check("aclmdlRICaptureBegin", acl.mdl.ri_capture_begin(stream,
                                                           ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL))
    launch(foo, n // 256, d_src, n, stream)
    check("aclrtMemcpyAsync", acl.rt.memcpy_async(d_dst, nbytes, d_src, nbytes,
                                                  ACL_MEMCPY_DEVICE_TO_DEVICE, stream))
    launch(bar, n // 256, d_dst, n, stream)
    model, ret = acl.mdl.ri_capture_end(stream)
    check("aclmdlRICaptureEnd", ret)
    if read(d_src, n)[0] != 1.0:
        sys.exit("the capture ran its work instead of recording it")
    for expect_src, expect_dst in ((2.0, 3.0), (4.0, 5.0)):  # two replays
        check("aclmdlRIExecuteAsync", acl.mdl.ri_execute_async(model, stream))
        check("aclrtSynchronizeStream", acl.rt.synchronize_stream(stream))
        src, dst = read(d_src, n), read(d_dst, n)
        if not (np.all(src == expect_src) and np.all(dst == expect_dst)):
            sys.exit(f"replay: src {src[0]}, dst {dst[0]}; expected {expect_src}, {expect_dst}")

    # 4.2: the same topology on other data, taken into the model in place
    d_other, ret = acl.rt.malloc(nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
    check("aclrtMalloc", ret)
    check("aclrtMemset", acl.rt.memset(d_other, nbytes, 0, nbytes))
    check("aclmdlRICaptureBegin", acl.mdl.ri_capture_begin(stream,
                                                           ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL))
    launch(foo, n // 256, d_other, n, stream)
    check("aclrtMemcpyAsync", acl.rt.memcpy_async(d_dst, nbytes, d_other, nbytes,
                                                  ACL_MEMCPY_DEVICE_TO_DEVICE, stream))
    launch(bar, n // 256, d_dst, n, stream)
    other, ret = acl.mdl.ri_capture_end(stream)
    check("aclmdlRICaptureEnd", ret)
    check("ri_update", acl.mdl.ri_update(model, other))
    check("aclmdlRIExecuteAsync", acl.mdl.ri_execute_async(model, stream))
    check("aclrtSynchronizeStream", acl.rt.synchronize_stream(stream))
    if not (np.all(read(d_dst, n) == 1.0) and np.all(read(d_src, n) == 4.0)):
        sys.exit("the updated model did not run on the new data")

    # 5.1: a synchronize inside a capture invalidates it
    check("aclmdlRICaptureBegin", acl.mdl.ri_capture_begin(stream,
                                                           ACL_MODEL_RI_CAPTURE_MODE_GLOBAL))
    launch(foo, n // 256, d_src, n, stream)
    refused = acl.rt.synchronize_device()
    message = acl.get_recent_err_msg()
    broken, ret = acl.mdl.ri_capture_end(stream)
    if refused == ACL_SUCCESS or ret != ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED:
        sys.exit(f"a synchronize in a capture: {refused}, then the end: {ret}")

    for m in (model, other):
        check("aclmdlRIDestroy", acl.mdl.ri_destroy(m))
    check("aclrtDestroyStream", acl.rt.destroy_stream(stream))
    for p in (d_src, d_dst, d_other):
        check("aclrtFree", acl.rt.free(p))
    check("aclrtResetDevice", acl.rt.reset_device(0))
    check("aclFinalize", acl.finalize())
    print(f"graph_seed002: foo -> copy -> bar captured and replayed (src 4.0, dst 5.0), updated "
          f"in place, and a synchronize in a capture refused ({refused}: {message.split(':')[0]});"
          " every other ret == ACL_SUCCESS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
