"""API.md §9.4, name by name: every function it lists exists on the facade, and each has a test
that calls it successfully and one that makes it fail (a test calling ``failed``, which checks
the code, the message and that the runtime is still usable) — or a stated reason it has none."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from streamrt import acl, ops

from . import test_acl_nn

HERE = Path(__file__).resolve().parent
SECTION_9_4 = [
    "init", "finalize",
    "rt.set_device", "rt.reset_device", "rt.create_context", "rt.destroy_context",
    "rt.create_stream", "rt.destroy_stream", "rt.synchronize_stream", "rt.create_event",
    "rt.record_event", "rt.stream_wait_event", "rt.synchronize_event", "rt.malloc", "rt.free",
    "rt.malloc_host", "rt.free_host", "rt.memcpy", "rt.memcpy_async", "rt.memset",
    "rt.launch_kernel", "rt.binary_load", "rt.binary_get_function",
    "rt.mem_pool_create", "rt.mem_pool_destroy", "rt.mem_pool_malloc_async",
    "rt.mem_pool_free_async", "rt.mem_pool_set_attr", "rt.mem_pool_get_attr",
    "rt.mem_pool_trim_to",
    "mdl.ri_capture_begin", "mdl.ri_capture_end", "mdl.ri_capture_get_info",
    "mdl.ri_execute_async", "mdl.ri_destroy",
    "nn.destroy_executor", "nn.set_executor_repeatable",
    *[f"nn.{op}" for op in ops.OPS], *[f"nn.{op}_get_workspace_size" for op in ops.OPS],
    "util.numpy_to_ptr", "util.bytes_to_ptr", "util.ptr_to_numpy", "util.ptr_to_bytes",
    "rt.get_mem_info", "rt.memset_async", "rt.get_device_count", "rt.get_run_mode",
    "media.dvpp_malloc", "media.dvpp_free",
]
# pyACL's acl.util conversions return their value and raise (no ret): their failure tests use
# pytest.raises; get_run_mode has no failing call (test_get_run_mode_has_no_failure says why)
RAISING = {"util.numpy_to_ptr", "util.bytes_to_ptr", "util.ptr_to_numpy", "util.ptr_to_bytes"}
NO_FAILURE = {"rt.get_run_mode"}


def resolve(path: str):
    obj = acl
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _called(fn: ast.FunctionDef) -> set[str]:
    """The ``acl.<path>`` calls a test function makes (by name: ``acl.rt.malloc(...)``)."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name) and f.id == "acl" and parts:
                out.add(".".join(reversed(parts)))
    return out


def _tests() -> list[tuple[set[str], bool, bool]]:
    """Per test function: the facade calls it makes, whether it checks a failure by ``failed``,
    whether it expects a raise."""
    found = []
    for f in sorted(HERE.glob("test_acl_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names = {n.func.id for n in ast.walk(node)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                raises = any(isinstance(n, ast.Attribute) and n.attr == "raises"
                             for n in ast.walk(node))
                found.append((_called(node), "failed" in names, raises))
    return found


TESTS = _tests()


@pytest.mark.parametrize("path", SECTION_9_4)
def test_each_section_9_4_function_exists_and_has_a_success_and_a_failure_test(path):
    assert callable(resolve(path)), path
    if path.removeprefix("nn.").removesuffix("_get_workspace_size") in ops.OPS:
        # the operators' tests go through getattr(acl.nn, name): both phases succeed for every
        # operator in test_operator_in_aclnn_argument_order (CASES), phase 1 fails in
        # test_operator_refusal_is_an_aclnn_param_error and phase 2 in
        # test_phase_two_with_another_operators_executor_fails (every operator)
        assert set(test_acl_nn.CASES) == set(ops.OPS)
        return
    assert any(path in c for c, _f, _r in TESTS), f"no test calls acl.{path}"
    if path in NO_FAILURE:
        return
    want_raise = path in RAISING
    assert any(path in c and (r if want_raise else f) for c, f, r in TESTS), \
        f"no failure test of acl.{path}"
