"""Seed 001's two-phase aclnn calls in ACL's spelling: its InvokeAclnnTwoPhase helper (query,
workspace from aclrtMalloc when the size is not 0, execute, synchronize, free, destroy the
executor; every error path releasing what it took) running acl.nn operators, a repeatable
executor reused without planning again (§1.3), and a shape mismatch refused in phase 1 with
its ACLNN code. Checks every result against numpy.

Run: python examples/acl/two_phase_seed001.py   (or: python -m streamrt.acl examples/acl/two_phase_seed001.py)
"""

import sys

import numpy as np

try:
    import acl  # under python -m streamrt.acl (or a real pyACL)
except ImportError:
    from streamrt import acl

ACL_SUCCESS = 0
ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_INVALID = 161002
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_FLOAT = 0
ACL_FORMAT_ND = 2


def check(what, ret):
    if ret != ACL_SUCCESS:
        sys.exit(f"{what} failed: ret={ret} {acl.get_recent_err_msg()}")


def invoke_aclnn_two_phase(get_size, execute, stream, need_sync=True):
    """The seed's InvokeAclnnTwoPhase: two lambdas, everything else in one place."""
    workspace_size, executor, ret = get_size()
    if ret != ACLNN_SUCCESS:
        return ret
    workspace_addr = None
    if workspace_size > 0:
        workspace_addr, ret = acl.rt.malloc(workspace_size, ACL_MEM_MALLOC_HUGE_FIRST)
        if ret != ACL_SUCCESS:
            acl.nn.destroy_executor(executor)
            return ret
    ret = execute(executor, workspace_addr, workspace_size, stream)
    if ret != ACLNN_SUCCESS:
        if workspace_addr:
            acl.rt.free(workspace_addr)
        acl.nn.destroy_executor(executor)
        return ret
    if need_sync:
        ret = acl.rt.synchronize_stream(stream)
    if workspace_addr:
        acl.rt.free(workspace_addr)
    acl.nn.destroy_executor(executor)
    return ret


def device_tensor(array):
    """aclrtMalloc + aclrtMemcpy + aclCreateTensor of a float32 host array."""
    a = np.ascontiguousarray(array, np.float32)
    ptr, ret = acl.rt.malloc(a.nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
    check("aclrtMalloc", ret)
    check("aclrtMemcpy", acl.rt.memcpy(ptr, a.nbytes, acl.util.numpy_to_ptr(a), a.nbytes,
                                       ACL_MEMCPY_HOST_TO_DEVICE))
    strides = [int(np.prod(a.shape[i + 1:])) for i in range(a.ndim)]
    tensor, ret = acl.create_tensor(list(a.shape), ACL_FLOAT, strides, 0, ACL_FORMAT_ND,
                                    list(a.shape), ptr)
    check("aclCreateTensor", ret)
    return tensor, ptr


def host(tensor, ptr):
    out = np.empty(tensor.shape, np.float32)
    check("aclrtMemcpy", acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, ptr, out.nbytes,
                                       ACL_MEMCPY_DEVICE_TO_HOST))
    return out


def main():
    check("aclInit", acl.init())
    check("aclrtSetDevice", acl.rt.set_device(0))
    stream, ret = acl.rt.create_stream()
    check("aclrtCreateStream", ret)
    rng = np.random.default_rng(1)
    a_host = rng.standard_normal((64, 128)).astype(np.float32)
    b_host = rng.standard_normal((64, 128)).astype(np.float32)
    a, a_ptr = device_tensor(a_host)
    b, b_ptr = device_tensor(b_host)
    c, c_ptr = device_tensor(np.zeros((64, 128)))
    s, s_ptr = device_tensor(np.zeros((64,)))

    # c = a + 0.5 * b (aclnnAdd: self, other, alpha, out), then s = c.sum(1) (aclnnReduceSum:
    # self, dims, keepDim, dtype, out), each through the helper
    check("aclnnAdd", invoke_aclnn_two_phase(
        lambda: acl.nn.add_get_workspace_size(a, b, 0.5, c),
        lambda ex, ws, size, st: acl.nn.add(ws, size, ex, st), stream))
    check("aclnnReduceSum", invoke_aclnn_two_phase(
        lambda: acl.nn.reduce_sum_get_workspace_size(c, [1], False, ACL_FLOAT, s),
        lambda ex, ws, size, st: acl.nn.reduce_sum(ws, size, ex, st), stream))
    np.testing.assert_allclose(host(c, c_ptr), a_host + 0.5 * b_host, rtol=1e-6)
    np.testing.assert_allclose(host(s, s_ptr), (a_host + 0.5 * b_host).sum(1), rtol=1e-4,
                               atol=1e-4)

    # 1.3: plan once, execute many times: a repeatable executor
    size, ex, ret = acl.nn.mul_get_workspace_size(c, c, c)  # c = c * c, in place
    check("aclnnMulGetWorkspaceSize", ret)
    check("aclSetAclOpExecutorRepeatable", acl.nn.set_executor_repeatable(ex))
    for _ in range(2):
        check("aclnnMul", acl.nn.mul(None, size, ex, stream))
    check("aclrtSynchronizeStream", acl.rt.synchronize_stream(stream))
    check("aclnnDestroyExecutor", acl.nn.destroy_executor(ex))
    np.testing.assert_allclose(host(c, c_ptr), (a_host + 0.5 * b_host) ** 4, rtol=1e-5)

    # 2.1: phase 1 reads metadata only, and refuses a shape that cannot broadcast
    wrong, w_ptr = device_tensor(np.zeros((3, 5)))
    ret = invoke_aclnn_two_phase(lambda: acl.nn.add_get_workspace_size(a, wrong, 1.0, c),
                                 lambda ex, ws, size, st: acl.nn.add(ws, size, ex, st), stream)
    if ret != ACLNN_ERR_PARAM_INVALID:
        sys.exit(f"a (64, 128) + (3, 5) add gave ret {ret}, not ACLNN_ERR_PARAM_INVALID")
    message = acl.get_recent_err_msg()

    for t in (a, b, c, s, wrong):
        check("aclDestroyTensor", acl.destroy_tensor(t))
    for p in (a_ptr, b_ptr, c_ptr, s_ptr, w_ptr):
        check("aclrtFree", acl.rt.free(p))
    check("aclrtDestroyStream", acl.rt.destroy_stream(stream))
    check("aclrtResetDevice", acl.rt.reset_device(0))
    check("aclFinalize", acl.finalize())
    print("two_phase_seed001: add, reduce_sum and a repeatable mul through the two-phase helper "
          f"match numpy; a bad shape is refused in phase 1 ({ret}: {message.split(':')[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
