"""A runtime-only pyACL program, written as Ascend's Python samples are: a host vector goes to
the device on one stream, is patched with memset_async, and comes back on a second stream
that waits for the first through an event."""

import argparse

import acl
import numpy as np

# the program's own constants, as the samples define them
ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_HBM_MEM = 1
NPY_FLOAT32 = 11


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception(f"{message} failed ret={ret}: {acl.get_recent_err_msg()}")


class Sample:
    def __init__(self, device_id, n):
        self.device_id = device_id
        self.n = n
        self.context = None
        self.streams = []

    def init_resource(self):
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)
        for _ in range(2):
            stream, ret = acl.rt.create_stream()
            check_ret("acl.rt.create_stream", ret)
            self.streams.append(stream)

    def run(self):
        size = self.n * 4
        free_before, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
        check_ret("acl.rt.get_mem_info", ret)
        host_in = np.arange(self.n, dtype=np.float32)
        host_ptr, ret = acl.rt.malloc_host(size)
        check_ret("acl.rt.malloc_host", ret)
        pinned = acl.util.ptr_to_numpy(host_ptr, (self.n,), NPY_FLOAT32)
        pinned[:] = 0
        dev_ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
        check_ret("acl.rt.malloc", ret)
        free_after, _, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
        check_ret("acl.rt.get_mem_info", ret)
        assert free_after <= free_before - size <= total

        s1, s2 = self.streams
        in_ptr = acl.util.numpy_to_ptr(host_in)
        check_ret("memcpy_async h2d", acl.rt.memcpy_async(
            dev_ptr, size, in_ptr, size, ACL_MEMCPY_HOST_TO_DEVICE, s1))
        # zero the first 16 bytes after the copy, in the same stream
        check_ret("memset_async", acl.rt.memset_async(dev_ptr, size, 0, 16, s1))
        event, ret = acl.rt.create_event()
        check_ret("acl.rt.create_event", ret)
        check_ret("record_event", acl.rt.record_event(event, s1))
        check_ret("stream_wait_event", acl.rt.stream_wait_event(s2, event))
        check_ret("memcpy_async d2h", acl.rt.memcpy_async(
            host_ptr, size, dev_ptr, size, ACL_MEMCPY_DEVICE_TO_HOST, s2))
        for stream in self.streams:
            check_ret("synchronize_stream", acl.rt.synchronize_stream(stream))

        expect = host_in.copy()
        expect[:4] = 0
        result = acl.util.ptr_to_numpy(host_ptr, (self.n,), NPY_FLOAT32)
        if not np.array_equal(result, expect):
            raise Exception(f"wrong result: {result[:8]}")
        check_ret("destroy_event", acl.rt.destroy_event(event))
        check_ret("acl.rt.free", acl.rt.free(dev_ptr))
        check_ret("acl.rt.free_host", acl.rt.free_host(host_ptr))

    def release_resource(self):
        for stream in self.streams:
            check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
        check_ret("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check_ret("acl.rt.reset_device", acl.rt.reset_device(self.device_id))
        check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--n", type=int, default=1024)
    args = parser.parse_args()
    sample = Sample(args.device, args.n)
    sample.init_resource()
    sample.run()
    sample.release_resource()
    print(f"[INFO] vector_roundtrip device {args.device} n {args.n}: run success")
