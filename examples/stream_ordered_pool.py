"""Seed 000, ported line by line: stream-ordered allocation from a memory pool.

The C original allocates four buffers with aclrtMemPoolMallocAsync, copies an argument struct
of their pointers to the device, launches add_custom, frees the four buffers with
aclrtMemPoolFreeAsync without synchronizing first, then synchronizes and destroys everything.
"""

import numpy as np

import streamrt as srt

# typedef struct { void *input_x; void *input_y; void *output_z; } ArgsInfo;
ArgsInfo = np.dtype([("input_x", np.uint64), ("input_y", np.uint64), ("output_z", np.uint64)])


@srt.kernel
def add_custom(ctx, args_ptr):
    """z = x + y, reading the three pointers from the argument struct in device memory."""
    args = ctx.array(args_ptr, (1,), ArgsInfo, readonly=True)[0]
    x = ctx.array(int(args["input_x"]), (1,), np.uint64, readonly=True)
    y = ctx.array(int(args["input_y"]), (1,), np.uint64, readonly=True)
    np.add(x, y, out=ctx.array(int(args["output_z"]), (1,), np.uint64))


def main() -> int:
    devid = 0
    dev = srt.Device(f"cpu:{devid}")                       # aclrtSetDevice(devid)
    dev.set_current()
    stream1 = srt.Stream(dev)                              # aclrtCreateStream(&stream1)
    test_reuse_pool = srt.MemPool(dev, max_size=14 << 30)  # aclrtMemPoolCreate, maxSize = 14GB
    # aclrtMemPoolMallocAsync(&ptrN, size, testReusePool, stream1)
    ptr1 = stream1.malloc(np.dtype(np.uint64).itemsize, test_reuse_pool)
    ptr2 = stream1.malloc(np.dtype(np.uint64).itemsize, test_reuse_pool)
    ptr3 = stream1.malloc(np.dtype(np.uint64).itemsize, test_reuse_pool)
    ptr0 = stream1.malloc(ArgsInfo.itemsize, test_reuse_pool)
    stream1.memcpy(ptr1, np.array([40], np.uint64), 8)    # inputs, so the result can be checked
    stream1.memcpy(ptr2, np.array([2], np.uint64), 8)
    usr_args = np.array([(ptr1, ptr2, ptr3)], ArgsInfo)   # usrArgs.input_x = ptr1; ...
    # aclrtMemcpyAsync(ptr0, ..., &usrArgs, ..., ACL_MEMCPY_HOST_TO_DEVICE, stream1)
    stream1.memcpy(ptr0, usr_args, ArgsInfo.itemsize)
    block_dim = 32
    stream1.launch(add_custom, ptr0, grid=block_dim)      # aclrtLaunchKernelV2(..., stream1)
    result = srt.malloc_host(8)
    stream1.memcpy(result, ptr3, 8)                       # (to check the result afterwards)
    # aclrtMemPoolFreeAsync(ptrN, stream1): no stream synchronize needed before these
    stream1.free(ptr0)
    stream1.free(ptr1)
    stream1.free(ptr2)
    stream1.free(ptr3)
    print("before synchronize:", {k: v for k, v in test_reuse_pool.stats().items()
                                  if k in ("reserved_mem_current", "used_mem_current")})
    stream1.synchronize()                                 # aclrtSynchronizeStream(stream1)
    z = int(srt.read(result, (1,), np.uint64)[0])
    print("after synchronize: ", {k: v for k, v in test_reuse_pool.stats().items()
                                  if k in ("reserved_mem_current", "used_mem_current")})
    print("z = x + y =", z)
    srt.free_host(result)
    test_reuse_pool.destroy()                             # aclrtMemPoolDestroy(testReusePool)
    stream1.destroy()                                     # aclrtDestroyStream(stream1)
    dev.reset()                                           # aclrtResetDevice(devid)
    return 0 if z == 42 else 1


if __name__ == "__main__":
    raise SystemExit(main())
