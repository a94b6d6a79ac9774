"""A runtime-only pyACL program: a stream-ordered memory pool feeds two streams; bytes go in
through bytes_to_ptr, host buffers are copied HOST_TO_HOST, and the copy kind follows the run
mode as Ascend's samples choose it."""

import argparse
import sys

import acl
import numpy as np

ACL_SUCCESS = 0
ACL_DEVICE = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEM_ALLOCATION_TYPE_PINNED = 0
ACL_MEM_HANDLE_TYPE_NONE = 0
ACL_MEM_LOCATION_TYPE_DEVICE = 1
ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD = 4
ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT = 7
NPY_BYTE = 1


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        print(f"[ERROR] {message} failed ret={ret}: {acl.get_recent_err_msg()}")
        sys.exit(1)


def main(device_id, blocks, block_size):
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(device_id))
    context, ret = acl.rt.create_context(device_id)
    check_ret("acl.rt.create_context", ret)
    run_mode, ret = acl.rt.get_run_mode()
    check_ret("acl.rt.get_run_mode", ret)
    to_device = ACL_MEMCPY_DEVICE_TO_DEVICE if run_mode == ACL_DEVICE else ACL_MEMCPY_HOST_TO_DEVICE
    to_host = ACL_MEMCPY_DEVICE_TO_DEVICE if run_mode == ACL_DEVICE else ACL_MEMCPY_DEVICE_TO_HOST

    props = {"allocType": ACL_MEM_ALLOCATION_TYPE_PINNED, "handleType": ACL_MEM_HANDLE_TYPE_NONE,
             "location": {"id": device_id, "type": ACL_MEM_LOCATION_TYPE_DEVICE},
             "maxSize": 64 << 20}
    pool, ret = acl.rt.mem_pool_create(props)
    check_ret("acl.rt.mem_pool_create", ret)
    check_ret("mem_pool_set_attr", acl.rt.mem_pool_set_attr(
        pool, ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, 1 << 20))
    producer, ret = acl.rt.create_stream()
    check_ret("create_stream", ret)
    consumer, ret = acl.rt.create_stream()
    check_ret("create_stream", ret)

    results = []
    for i in range(blocks):
        payload = bytes([i % 256]) * block_size
        dev, ret = acl.rt.mem_pool_malloc_async(block_size, pool, producer)
        check_ret("mem_pool_malloc_async", ret)
        check_ret("memcpy_async in", acl.rt.memcpy_async(
            dev, block_size, acl.util.bytes_to_ptr(payload), block_size, to_device, producer))
        done, ret = acl.rt.create_event()
        check_ret("create_event", ret)
        check_ret("record_event", acl.rt.record_event(done, producer))
        check_ret("stream_wait_event", acl.rt.stream_wait_event(consumer, done))
        out = bytearray(block_size)
        check_ret("memcpy_async out", acl.rt.memcpy_async(
            acl.util.bytes_to_ptr(out), block_size, dev, block_size, to_host, consumer))
        # freed in the consumer's order: the next block may reuse it after the copy out
        check_ret("mem_pool_free_async", acl.rt.mem_pool_free_async(dev, consumer))
        results.append((payload, out, done))

    check_ret("synchronize consumer", acl.rt.synchronize_stream(consumer))
    check_ret("synchronize producer", acl.rt.synchronize_stream(producer))
    for payload, out, done in results:
        if bytes(out) != payload:
            print(f"[ERROR] block {payload[0]} came back wrong")
            sys.exit(1)
        check_ret("destroy_event", acl.rt.destroy_event(done))
    used, ret = acl.rt.mem_pool_get_attr(pool, ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT)
    check_ret("mem_pool_get_attr", ret)
    if used != 0:
        print(f"[ERROR] pool still uses {used} bytes")
        sys.exit(1)

    # host to host between two host pointers
    src = np.arange(16, dtype=np.uint8)
    dst = np.zeros(16, np.uint8)
    check_ret("memcpy h2h", acl.rt.memcpy(acl.util.numpy_to_ptr(dst), 16,
                                          acl.util.numpy_to_ptr(src), 16,
                                          ACL_MEMCPY_HOST_TO_HOST))
    if acl.util.ptr_to_bytes(acl.util.numpy_to_ptr(dst), 16) != src.tobytes():
        print("[ERROR] host to host copy")
        sys.exit(1)
    view = acl.util.ptr_to_numpy(acl.util.numpy_to_ptr(dst), (16,), NPY_BYTE)
    assert view.sum() == src.sum()

    check_ret("mem_pool_trim_to", acl.rt.mem_pool_trim_to(pool, 0))
    check_ret("mem_pool_destroy", acl.rt.mem_pool_destroy(pool))
    for s in (producer, consumer):
        check_ret("destroy_stream", acl.rt.destroy_stream(s))
    check_ret("destroy_context", acl.rt.destroy_context(context))
    check_ret("reset_device", acl.rt.reset_device(device_id))
    check_ret("acl.finalize", acl.finalize())
    print(f"[INFO] pool_pipeline: {blocks} blocks of {block_size} bytes, run success")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="stream-ordered pool pipeline")
    parser.add_argument("--device_id", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block_size", type=int, default=4096)
    args = parser.parse_args()
    main(args.device_id, args.blocks, args.block_size)
