"""The error hierarchy of API.md §6: classes, codes, names, Python bases."""

from __future__ import annotations

import enum

import pytest

import streamrt as srt

CAPTURE = [
    (srt.CaptureUnsupportedError, 900, "cudaErrorStreamCaptureUnsupported"),
    (srt.CaptureInvalidatedError, 901, "cudaErrorStreamCaptureInvalidated"),
    (srt.CaptureMergeError, 902, "cudaErrorStreamCaptureMerge"),
    (srt.CaptureUnmatchedError, 903, "cudaErrorStreamCaptureUnmatched"),
    (srt.CaptureUnjoinedError, 904, "cudaErrorStreamCaptureUnjoined"),
    (srt.CaptureIsolationError, 905, "cudaErrorStreamCaptureIsolation"),
    (srt.CaptureImplicitError, 906, "cudaErrorStreamCaptureImplicit"),
    (srt.CapturedEventError, 907, "cudaErrorCapturedEvent"),
    (srt.CaptureWrongThreadError, 908, "cudaErrorStreamCaptureWrongThread"),
]


@pytest.mark.parametrize(("cls", "code", "name"), CAPTURE)
def test_errors_capture_codes(cls, code, name):
    assert issubclass(cls, srt.CaptureError)
    assert issubclass(cls, srt.StreamRTError)
    assert (cls.code, cls.name) == (code, name)
    e = cls("boom")
    assert (e.code, e.name) == (code, name)  # readable on instances too
    assert "boom" in str(e) and name in str(e)


def test_errors_python_bases():
    assert issubclass(srt.OutOfMemoryError, MemoryError)
    assert issubclass(srt.InvalidValueError, ValueError)
    assert issubclass(srt.InvalidTypeError, TypeError)
    assert issubclass(srt.InvalidAddressError, ValueError)
    for cls in (srt.NotReadyError, srt.LaunchError, srt.SanitizerError, srt.ExecutorError,
                srt.GraphExecUpdateError, srt.BackendUnavailableError):
        assert issubclass(cls, srt.StreamRTError)


def test_errors_codes_and_names():
    assert (srt.OutOfMemoryError.code, srt.OutOfMemoryError.name) == (
        2, "cudaErrorMemoryAllocation")
    assert srt.InvalidValueError.code == 1
    assert srt.NotReadyError.code == 600
    assert srt.GraphExecUpdateError.code == 910
    assert srt.LaunchError.name == "cudaErrorLaunchFailure"


def test_errors_every_class_documents_when_raised():
    for name in srt.errors.__all__:
        cls = getattr(srt.errors, name)
        assert cls.__doc__ and cls.__doc__.strip(), name


def test_errors_executor_carries_aclnn_code():
    e = srt.ExecutorError("null workspace", code=161001)
    assert e.code == 161001 and e.name == "ACLNN_ERR_PARAM_NULLPTR"
    assert srt.ExecutorError("x").code == 161002
    assert srt.ExecutorError("inner", code=561002).name == "ACLNN_ERR_INNER_TILING_ERROR"


def test_errors_executor_error_copies_keep_their_class():
    # ExecutorError(msg) picks ExecutorParamError (a ValueError) for a missing code: a pickled or
    # copied inner error, rebuilt from its message alone, became one
    import copy
    import pickle

    for e in (srt.ExecutorError("inner", code=561000), srt.ExecutorError("bad", code=161001)):
        for c in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
            assert type(c) is type(e) and c.code == e.code and str(c) == str(e)
            assert isinstance(c, ValueError) is (e.code == 161001)


def test_errors_graph_update_carries_result_and_node():
    e = srt.GraphExecUpdateError("no", result="TOPOLOGY_CHANGED", node="n")
    assert (e.result, e.node) == ("TOPOLOGY_CHANGED", "n")


# the result enums of the public API: Python 3.11's IntEnum printed them as bare ints
# (GraphExecUpdateError.result printed as "2")
INT_ENUMS = sorted((v for v in vars(srt).values()
                    if isinstance(v, type) and issubclass(v, enum.IntEnum)), key=lambda c: c.__name__)


def test_errors_public_int_enums_are_found():
    names = {c.__name__ for c in INT_ENUMS}
    assert {"GraphExecUpdateResult", "GraphInstantiateResult", "MemPoolAttr",
            "ConditionalType"} <= names


@pytest.mark.parametrize("cls", INT_ENUMS, ids=lambda c: c.__name__)
def test_errors_int_enums_print_their_names_and_stay_ints(cls):
    for m in cls:
        label = f"{cls.__name__}.{m.name}"
        assert str(m) == label and f"{m}" == label and format(m) == label
        assert f"{m:>60}".strip() == label  # a text spec pads the name
        assert f"{m:d}" == str(m.value) and f"{m:03d}" == f"{m.value:03d}"  # a numeric spec: the int
        assert m == m.value and isinstance(m, int) and cls(m.value) is m
        assert repr(m) == f"<{label}: {m.value}>"


def test_errors_graph_update_error_result_prints_its_name():
    g = srt.Graph()
    ge = g.instantiate()
    more = srt.Graph()
    more.add_empty_node()
    with pytest.raises(srt.GraphExecUpdateError) as ei:
        ge.update(more)
    assert f"result={ei.value.result}" == "result=GraphExecUpdateResult.TOPOLOGY_CHANGED"
    assert ei.value.result == 2
