"""Seed 000's stream-ordered pool program (aclrtMemPoolCreate, aclrtMemPoolMallocAsync,
aclrtLaunchKernelV2 with a host ArgsInfo struct, aclrtMemPoolFreeAsync without a synchronize),
line by line in pyACL's spelling, on streamrt's ACL facade. It fills the seed's "......" with
inputs and a read-back, and checks the kernel's sum.

Run: python examples/acl/pool_seed000.py   (or: python -m streamrt.acl examples/acl/pool_seed000.py)
"""

import ctypes
import os
import sys

import numpy as np

try:
    import acl  # under python -m streamrt.acl (or a real pyACL)
except ImportError:
    from streamrt import acl

ACL_SUCCESS = acl.ACL_SUCCESS
ACL_MEM_LOCATION_TYPE_DEVICE = acl.ACL_MEM_LOCATION_TYPE_DEVICE
ACL_MEM_ALLOCATION_TYPE_PINNED = acl.ACL_MEM_ALLOCATION_TYPE_PINNED
ACL_MEM_HANDLE_TYPE_NONE = acl.ACL_MEM_HANDLE_TYPE_NONE
ACL_MEMCPY_HOST_TO_DEVICE = acl.ACL_MEMCPY_HOST_TO_DEVICE
ACL_MEMCPY_DEVICE_TO_HOST = acl.ACL_MEMCPY_DEVICE_TO_HOST
uint64_t = ctypes.c_uint64


def check(what, ret):
    if ret != ACL_SUCCESS:
        sys.exit(f"{what} failed: ret={ret} {acl.get_recent_err_msg()}")


def main():
    devid = 0
    check("aclInit", acl.init(None))
    check("aclrtSetDevice", acl.rt.set_device(devid))
    # 创建Context和Stream
    context, ret = acl.rt.create_context(0)
    check("aclrtCreateContext", ret)
    stream1, ret = acl.rt.create_stream()
    check("aclrtCreateStream", ret)
    # 设置内存池属性
    testLoc = {"id": 0, "type": ACL_MEM_LOCATION_TYPE_DEVICE}
    testProp = {
        "allocType": ACL_MEM_ALLOCATION_TYPE_PINNED,
        "handleType": ACL_MEM_HANDLE_TYPE_NONE,
        "location": testLoc,
        "maxSize": 14 << 30,  # maxSize = 14GB， 内存池大小为14G
        "reserved": [0],
    }
    # 创建内存池
    testReusePool, ret = acl.rt.mem_pool_create(testProp)
    if ret != ACL_SUCCESS:
        print("Failed to create memory pool", file=sys.stderr)
        return -1
    GB_TO_B = 1024 * 1024 * 1024  # noqa: F841  (the seed's, unused there too)

    # 定义算子信息结构体
    class ArgsInfo(ctypes.Structure):
        _fields_ = [("input_x", ctypes.c_void_p), ("input_y", ctypes.c_void_p),
                    ("output_z", ctypes.c_void_p)]

    binHandle, ret = acl.rt.binary_load_from_file(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.py"), None)
    check("aclrtBinaryLoadFromFile", ret)
    funcHandle, ret = acl.rt.binary_get_function(binHandle, "add_custom")
    check("aclrtBinaryGetFunction", ret)
    # 异步申请内存
    ptr1, ret = acl.rt.mem_pool_malloc_async(ctypes.sizeof(uint64_t), testReusePool, stream1)
    check("aclrtMemPoolMallocAsync", ret)
    ptr2, ret = acl.rt.mem_pool_malloc_async(ctypes.sizeof(uint64_t), testReusePool, stream1)
    check("aclrtMemPoolMallocAsync", ret)
    ptr3, ret = acl.rt.mem_pool_malloc_async(ctypes.sizeof(uint64_t), testReusePool, stream1)
    check("aclrtMemPoolMallocAsync", ret)
    ptr0, ret = acl.rt.mem_pool_malloc_async(ctypes.sizeof(ArgsInfo), testReusePool, stream1)
    check("aclrtMemPoolMallocAsync", ret)
    # ......: the inputs
    x, y = np.array([40], np.uint64), np.array([2], np.uint64)
    for dst, src in ((ptr1, x), (ptr2, y)):
        check("aclrtMemcpyAsync", acl.rt.memcpy_async(
            dst, 8, acl.util.numpy_to_ptr(src), 8, ACL_MEMCPY_HOST_TO_DEVICE, stream1))
    # 配置任务下发
    usrArgs = ArgsInfo()
    usrArgs.input_x = ptr1
    usrArgs.input_y = ptr2
    usrArgs.output_z = ptr3
    error = acl.rt.memcpy_async(ptr0, ctypes.sizeof(ArgsInfo), acl.util.bytes_to_ptr(usrArgs),
                                ctypes.sizeof(ArgsInfo), ACL_MEMCPY_HOST_TO_DEVICE, stream1)
    check("aclrtMemcpyAsync", error)
    # 下发任务
    blockDim = 32
    check("aclrtLaunchKernelV2", acl.rt.launch_kernel(
        funcHandle, blockDim, acl.util.bytes_to_ptr(usrArgs), ctypes.sizeof(ArgsInfo), stream1))
    # ......: the result, read back before its memory returns to the pool
    z = np.zeros(1, np.uint64)
    check("aclrtMemcpyAsync", acl.rt.memcpy_async(
        acl.util.numpy_to_ptr(z), 8, ptr3, 8, ACL_MEMCPY_DEVICE_TO_HOST, stream1))
    # 异步释放内存，此前无需进行流同步
    check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr0, stream1))
    check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr1, stream1))
    check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr2, stream1))
    check("aclrtMemPoolFreeAsync", acl.rt.mem_pool_free_async(ptr3, stream1))
    # 流同步
    check("aclrtSynchronizeStream", acl.rt.synchronize_stream(stream1))
    if int(z[0]) != 42:
        sys.exit(f"add_custom: {x[0]} + {y[0]} gave {z[0]}")
    # 销毁内存池、Stream和Context
    check("aclrtMemPoolDestroy", acl.rt.mem_pool_destroy(testReusePool))
    check("aclrtDestroyStream", acl.rt.destroy_stream(stream1))
    check("aclrtDestroyContext", acl.rt.destroy_context(context))
    check("aclrtResetDevice", acl.rt.reset_device(devid))
    check("aclFinalize", acl.finalize())
    print(f"pool_seed000: add_custom {x[0]} + {y[0]} = {z[0]} through a 14 GB stream-ordered "
          "pool; every ret == ACL_SUCCESS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
