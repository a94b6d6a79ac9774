"""A runtime-only pyACL program: a vector is scaled by a kernel on the device, read back and
checked; the device buffer is then wiped by a second kernel before it is freed. aclrtFree does
not wait for the stream's work, so the stream is synchronized before the free (the line the
sanitizer test removes)."""

import argparse
import ctypes
import os

import acl
import numpy as np

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2


class KernelArgs(ctypes.Structure):  # scale's and scrub's (float* data, int n)
    _fields_ = [("data", ctypes.c_void_p), ("n", ctypes.c_int32)]


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception(f"{message} failed ret={ret}: {acl.get_recent_err_msg()}")


def launch(func, data, n, stream):
    args = KernelArgs(data, n)
    check_ret("acl.rt.launch_kernel", acl.rt.launch_kernel(
        func, 1, acl.util.bytes_to_ptr(args), ctypes.sizeof(args), stream))


def main(n):
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    here = os.path.dirname(os.path.abspath(__file__))
    binary, ret = acl.rt.binary_load_from_file(os.path.join(here, "scrub_kernels.py"), None)
    check_ret("acl.rt.binary_load_from_file", ret)
    scale, ret = acl.rt.binary_get_function(binary, "scale")
    check_ret("acl.rt.binary_get_function", ret)
    scrub, ret = acl.rt.binary_get_function(binary, "scrub")
    check_ret("acl.rt.binary_get_function", ret)
    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)

    host = np.arange(n, dtype=np.float32)
    out = np.zeros(n, np.float32)
    dev, ret = acl.rt.malloc(host.nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    check_ret("memcpy_async h2d", acl.rt.memcpy_async(
        dev, host.nbytes, acl.util.numpy_to_ptr(host), host.nbytes, ACL_MEMCPY_HOST_TO_DEVICE,
        stream))
    launch(scale, dev, n, stream)
    check_ret("memcpy_async d2h", acl.rt.memcpy_async(
        acl.util.numpy_to_ptr(out), out.nbytes, dev, out.nbytes, ACL_MEMCPY_DEVICE_TO_HOST,
        stream))
    check_ret("synchronize_stream", acl.rt.synchronize_stream(stream))
    if not np.array_equal(out, host * 3):
        raise Exception(f"wrong result: {out[:8]}")

    launch(scrub, dev, n, stream)  # wiped before it is given back
    check_ret("synchronize_stream", acl.rt.synchronize_stream(stream))  # before aclrtFree
    check_ret("acl.rt.free", acl.rt.free(dev))
    check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.binary_unload", acl.rt.binary_unload(binary))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4096)
    args = parser.parse_args()
    main(args.n)
    print(f"[INFO] scrub_and_free n {args.n}: run success")
