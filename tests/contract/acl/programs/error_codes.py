"""A pyACL program that checks the codes of failing calls, as a careful sample does, and goes
on working after each."""

import argparse

import acl
import numpy as np

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_MEMCPY_HOST_TO_DEVICE = 1


def expect(name, ret, code):
    if ret != code:
        raise SystemExit(f"{name}: ret {ret}, expected {code}")
    if code != ACL_SUCCESS and not acl.get_recent_err_msg():
        raise SystemExit(f"{name}: no error message")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad_device", type=int, default=63)
    args = parser.parse_args()
    expect("init", acl.init(), ACL_SUCCESS)
    expect("set_device bad", acl.rt.set_device(args.bad_device), ACL_ERROR_RT_INVALID_DEVICEID)
    expect("set_device", acl.rt.set_device(0), ACL_SUCCESS)
    ptr, ret = acl.rt.malloc(0, 0)
    expect("malloc 0", ret, ACL_ERROR_INVALID_PARAM)
    ptr, ret = acl.rt.malloc(64, 0)
    expect("malloc", ret, ACL_SUCCESS)
    data = np.ones(32, np.float32)
    expect("memcpy over destMax", acl.rt.memcpy(ptr, 64, acl.util.numpy_to_ptr(data), 128,
                                                 ACL_MEMCPY_HOST_TO_DEVICE),
           ACL_ERROR_INVALID_PARAM)
    expect("free", acl.rt.free(ptr), ACL_SUCCESS)
    expect("free twice", acl.rt.free(ptr), ACL_ERROR_RT_PARAM_INVALID)
    expect("finalize", acl.finalize(), ACL_SUCCESS)
    print("[INFO] error_codes: run success")
