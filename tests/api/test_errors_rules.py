"""API.md §6: the error hierarchy (codes, names, bases, attributes) and the public exports."""

from __future__ import annotations

import pytest

import streamrt as srt

pytestmark = [pytest.mark.api, pytest.mark.timeout(60)]


# ---- errors (§6) ---------------------------------------------------------------------------

CAPTURE_CODES = {
    "CaptureUnsupportedError": (900, "cudaErrorStreamCaptureUnsupported"),
    "CaptureInvalidatedError": (901, "cudaErrorStreamCaptureInvalidated"),
    "CaptureMergeError": (902, "cudaErrorStreamCaptureMerge"),
    "CaptureUnmatchedError": (903, "cudaErrorStreamCaptureUnmatched"),
    "CaptureUnjoinedError": (904, "cudaErrorStreamCaptureUnjoined"),
    "CaptureIsolationError": (905, "cudaErrorStreamCaptureIsolation"),
    "CaptureImplicitError": (906, "cudaErrorStreamCaptureImplicit"),
    "CapturedEventError": (907, "cudaErrorCapturedEvent"),
    "CaptureWrongThreadError": (908, "cudaErrorStreamCaptureWrongThread"),
    "GraphExecUpdateError": (910, "cudaErrorGraphExecUpdateFailure"),
}


@pytest.mark.parametrize("cls", sorted(CAPTURE_CODES))
def test_errors_capture_codes_names(cls):
    c = getattr(srt, cls)
    code, name = CAPTURE_CODES[cls]
    assert issubclass(c, srt.StreamRTError)
    assert c.code == code and c.name == name
    if cls.startswith("Capture") and cls != "CaptureError" or cls == "CapturedEventError":
        assert issubclass(c, srt.CaptureError)


def test_errors_base_classes():
    assert issubclass(srt.OutOfMemoryError, MemoryError)
    assert issubclass(srt.InvalidValueError, ValueError)
    assert srt.OutOfMemoryError.code == 2 and srt.OutOfMemoryError.name == "cudaErrorMemoryAllocation"
    assert srt.InvalidValueError.code == 1 and srt.InvalidValueError.name == "cudaErrorInvalidValue"
    assert srt.NotReadyError.code == 600 and srt.NotReadyError.name == "cudaErrorNotReady"
    for n in ("OutOfMemoryError", "InvalidValueError", "InvalidAddressError", "NotReadyError",
              "CaptureError", "GraphExecUpdateError", "ExecutorError", "SanitizerError",
              "LaunchError", "BackendUnavailableError"):
        c = getattr(srt, n)
        assert issubclass(c, srt.StreamRTError), n
        assert isinstance(c.name, str) and c.name, n
        assert hasattr(c, "code"), n


def test_errors_attrs_on_instances():
    e = srt.CaptureUnsupportedError("x")
    assert e.code == 900 and e.name == "cudaErrorStreamCaptureUnsupported"
    assert srt.ExecutorError("x").code == srt.ExecutorError.code


def test_errors_backend_unavailable_says_what():
    try:
        d = srt.Device("cuda:0")
    except srt.BackendUnavailableError as e:
        assert str(e)
    else:
        assert d.backend == "cuda"


def test_all_exports():
    for n in ("Device", "current_device", "device_count", "Stream", "current_stream", "Event",
              "kernel", "malloc", "free", "malloc_host", "free_host", "memcpy", "memset", "read",
              "write", "MemPool", "MemPoolAttr", "TensorDesc", "Tensor", "CaptureMode",
              "CaptureStatus", "CaptureInfo", "Graph", "GraphExec", "NodeType",
              "GraphExecUpdateResult", "graph_capture", "sanitizer", "trace"):
        assert hasattr(srt, n), n
    assert set(srt.__all__) >= {"Device", "Stream", "MemPool", "Graph"}
