"""Kernels by name: binary_load / binary_load_from_file / binary_unload, binary_get_function,
launch_kernel with the argument struct as host bytes (aclrtLaunchKernelV2) or a device
address (pyACL)."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import streamrt as srt

from .conftest import failed


@srt.kernel(signature="const ptr, ptr, i32, f32")
def axpy(ctx, x_ptr, y_ptr, n, a):
    x = ctx.array(x_ptr, (n,), np.float32, readonly=True)
    y = ctx.array(y_ptr, (n,), np.float32)
    y += a * x


@srt.kernel
def no_layout(ctx, ptr):
    pass


class AxpyArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("n", ctypes.c_int32),
                ("a", ctypes.c_float)]


MODULE = types.ModuleType("my_kernels")
MODULE.axpy = axpy
MODULE.no_layout = no_layout


@pytest.fixture
def vectors(acl):
    x, _ = acl.rt.malloc(16, 0)
    y, _ = acl.rt.malloc(16, 0)
    srt.write(x, np.arange(4, dtype=np.float32))
    srt.write(y, np.ones(4, np.float32))
    yield x, y
    acl.rt.free(x)
    acl.rt.free(y)


def test_binary_load_of_a_module_finds_kernels_by_name(acl):
    b, ret = acl.rt.binary_load(MODULE)
    assert ret == 0
    assert acl.rt.binary_get_function(b, "axpy") == (axpy, 0)
    assert acl.rt.binary_load({"k": no_layout})[1] == 0


def test_binary_load_of_something_else_fails(acl):
    b, ret = acl.rt.binary_load(42)
    assert b is None
    failed(acl, ret, acl.ACL_ERROR_INVALID_PARAM, "module or a dict")


def test_binary_load_from_file_runs_the_file_once(acl, tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text("import streamrt as srt\nLOADS = []\nLOADS.append(1)\n"
                    "@srt.kernel(name='k1', signature='ptr')\ndef kernel_one(ctx, p):\n"
                    "    pass\n")
    b1, ret = acl.rt.binary_load_from_file(str(path), None)
    assert ret == 0
    k, ret = acl.rt.binary_get_function(b1, "k1")  # by its kernel name
    assert ret == 0 and k.name == "k1"
    b2, _ = acl.rt.binary_load_from_file(str(path), None)
    assert acl.rt.binary_get_function(b2, "kernel_one")[0] is k


def test_binary_load_from_file_of_no_file_fails(acl, tmp_path):
    failed(acl, acl.rt.binary_load_from_file(str(tmp_path / "none.py"))[1],
           acl.ACL_ERROR_INVALID_PARAM, "no such file")
    failed(acl, acl.rt.binary_load_from_file("kernel.o")[1], acl.ACL_ERROR_INVALID_PARAM, ".py")


def test_binary_get_function_of_no_kernel_is_kernel_lookup(acl):
    b, _ = acl.rt.binary_load(MODULE)
    k, ret = acl.rt.binary_get_function(b, "add_custom")
    assert k is None
    failed(acl, ret, acl.ACL_ERROR_RT_KERNEL_LOOKUP, "add_custom")


def test_binary_unload_then_lookups_fail(acl):
    b, _ = acl.rt.binary_load(MODULE)
    assert acl.rt.binary_unload(b) == 0
    failed(acl, acl.rt.binary_get_function(b, "axpy")[1], acl.ACL_ERROR_RT_INVALID_HANDLE)
    failed(acl, acl.rt.binary_unload(b), acl.ACL_ERROR_RT_INVALID_HANDLE, "not a loaded")


@pytest.mark.parametrize("form", ["struct", "bytes", "host_ptr", "device_ptr"])
def test_launch_kernel_unpacks_the_argument_struct(acl, vectors, form):
    x, y = vectors
    args = AxpyArgs(x, y, 4, 2.0)
    s, _ = acl.rt.create_stream()
    size = ctypes.sizeof(AxpyArgs)
    if form == "struct":
        a = args
    elif form == "bytes":
        a = bytes(args)
    elif form == "host_ptr":
        a = acl.util.bytes_to_ptr(args)
    else:  # the struct in device memory, copied there in stream order before the launch
        a, _ = acl.rt.mem_pool_malloc_async(size, srt.Device("cpu:0").default_mem_pool, s)
        acl.rt.memcpy_async(a, size, acl.util.bytes_to_ptr(args), size,
                            acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    assert acl.rt.launch_kernel(axpy, 8, a, size, s) == 0
    if form == "device_ptr":
        acl.rt.mem_pool_free_async(a, s)
    assert acl.rt.synchronize_stream(s) == 0
    np.testing.assert_array_equal(srt.read(y, (4,), np.float32), [1, 3, 5, 7])
    acl.rt.destroy_stream(s)


def test_launch_kernel_takes_the_host_struct_at_the_launch(acl, vectors):
    x, y = vectors
    args = AxpyArgs(x, y, 4, 1.0)
    s, _ = acl.rt.create_stream()
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel(axpy, 1, ptr, ctypes.sizeof(args), s) == 0
    args.a = 100.0  # changed after the launch: the launch already has its copy
    acl.rt.synchronize_stream(s)
    np.testing.assert_array_equal(srt.read(y, (4,), np.float32), [1, 2, 3, 4])
    acl.rt.destroy_stream(s)


@pytest.mark.parametrize(("case", "code", "words"), [
    ("no_layout", 100000, "declares no argument layout"),
    ("short_size", 100000, "less than"),
    ("short_bytes", 100000, "holds 8 bytes"),
    ("not_kernel", 107017, "not a kernel"),
    ("bad_args", 100000, "pointer or host bytes"),
])
def test_launch_kernel_refusals(acl, vectors, case, code, words):
    x, y = vectors
    raw = bytes(AxpyArgs(x, y, 4, 2.0))
    func, args, size = {
        "no_layout": (no_layout, raw, 24), "short_size": (axpy, raw, 8),
        "short_bytes": (axpy, raw[:8], 24), "not_kernel": ("axpy", raw, 24),
        "bad_args": (axpy, 2.5, 24)}[case]
    failed(acl, acl.rt.launch_kernel(func, 1, args, size, None), code, words)
    np.testing.assert_array_equal(srt.read(y, (4,), np.float32), 1.0)  # nothing ran
