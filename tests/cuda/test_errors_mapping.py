"""CUDA result codes map onto the streamrt error hierarchy (no GPU or driver needed)."""

from __future__ import annotations

import pytest

from streamrt import errors
from streamrt.backends.cuda.errors import KernelCompileError, check, error_for

_WHY = "cuda-bindings is not installed (pip install 'streamrt[cuda]')"
runtime = pytest.importorskip("cuda.bindings.runtime", reason=_WHY)
driver = pytest.importorskip("cuda.bindings.driver", reason=_WHY)  # importable without libcuda
nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason=_WHY)

E = runtime.cudaError_t


def test_out_of_memory_carries_cuda_code_and_name():
    exc = error_for(E.cudaErrorMemoryAllocation)
    assert isinstance(exc, errors.OutOfMemoryError)
    assert isinstance(exc, MemoryError)
    assert exc.code == 2
    assert exc.name == "cudaErrorMemoryAllocation"
    text = str(exc)
    assert "cudaErrorMemoryAllocation" in text and "2" in text and "out of memory" in text


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (900, errors.CaptureUnsupportedError),
        (901, errors.CaptureInvalidatedError),
        (902, errors.CaptureMergeError),
        (903, errors.CaptureUnmatchedError),
        (904, errors.CaptureUnjoinedError),
        (905, errors.CaptureIsolationError),
        (906, errors.CaptureImplicitError),
        (907, errors.CapturedEventError),
        (908, errors.CaptureWrongThreadError),
    ],
)
def test_capture_errors(code, cls):
    exc = error_for(E(code))
    assert type(exc) is cls
    assert isinstance(exc, errors.CaptureError)
    assert exc.code == code
    assert exc.name == E(code).name


@pytest.mark.parametrize(
    ("member", "cls"),
    [
        (E.cudaErrorInvalidValue, errors.InvalidValueError),
        (E.cudaErrorNotReady, errors.NotReadyError),
        (E.cudaErrorInvalidDevice, errors.InvalidDeviceError),
        (E.cudaErrorNoDevice, errors.BackendUnavailableError),
        (E.cudaErrorInsufficientDriver, errors.BackendUnavailableError),
        (E.cudaErrorInvalidDevicePointer, errors.InvalidAddressError),
        (E.cudaErrorInvalidResourceHandle, errors.InvalidHandleError),
        (E.cudaErrorIllegalState, errors.IllegalStateError),
        (E.cudaErrorIllegalAddress, errors.LaunchError),
        (E.cudaErrorLaunchFailure, errors.LaunchError),
        (E.cudaErrorNoKernelImageForDevice, errors.LaunchError),
        (E.cudaErrorNotSupported, errors.NotSupportedError),
        (E.cudaErrorNotPermitted, errors.NotPermittedError),
        (E.cudaErrorGraphExecUpdateFailure, errors.GraphExecUpdateError),
    ],
)
def test_runtime_classes(member, cls):
    exc = error_for(member)
    assert type(exc) is cls
    assert (exc.code, exc.name) == (int(member), member.name)


def test_instance_code_does_not_touch_the_class():
    exc = error_for(E.cudaErrorIllegalAddress)
    assert (exc.code, exc.name) == (700, "cudaErrorIllegalAddress")
    assert (errors.LaunchError.code, errors.LaunchError.name) == (719, "cudaErrorLaunchFailure")


def test_unmapped_code_is_plain_streamrt_error():
    exc = error_for(E.cudaErrorUnknown)
    assert type(exc) is errors.StreamRTError
    assert (exc.code, exc.name) == (999, "cudaErrorUnknown")


def test_every_runtime_member_maps():
    for member in E:
        if member == E.cudaSuccess:
            continue
        exc = error_for(member)
        assert isinstance(exc, errors.StreamRTError), member
        assert exc.code == int(member), member
        assert exc.name == member.name, member


def test_every_driver_member_maps():
    for member in driver.CUresult:
        if member == driver.CUresult.CUDA_SUCCESS:
            continue
        exc = error_for(member)
        assert isinstance(exc, errors.StreamRTError), member
        assert (exc.code, exc.name) == (int(member), member.name), member


def test_driver_out_of_memory_without_a_driver():
    # cuGetErrorString needs libcuda; the mapping must still work (this machine may have none).
    exc = error_for(driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    assert isinstance(exc, errors.OutOfMemoryError)
    assert (exc.code, exc.name) == (2, "CUDA_ERROR_OUT_OF_MEMORY")
    assert "out of memory" in str(exc)


def test_driver_capture_and_not_ready():
    assert type(error_for(driver.CUresult.CUDA_ERROR_NOT_READY)) is errors.NotReadyError
    exc = error_for(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_MERGE)
    assert type(exc) is errors.CaptureMergeError
    assert exc.name == "CUDA_ERROR_STREAM_CAPTURE_MERGE"


def test_nvrtc_results_have_their_own_numbering():
    exc = error_for(nvrtc.nvrtcResult.NVRTC_ERROR_OUT_OF_MEMORY)
    assert isinstance(exc, errors.OutOfMemoryError)
    assert (exc.code, exc.name) == (1, "NVRTC_ERROR_OUT_OF_MEMORY")
    comp = error_for(nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION)
    assert isinstance(comp, KernelCompileError) and isinstance(comp, errors.LaunchError)
    assert (comp.code, comp.name) == (6, "NVRTC_ERROR_COMPILATION")
    assert comp.log == ""


def test_context_prefixes_the_message():
    exc = error_for(E.cudaErrorInvalidValue, "cudaMemcpyAsync")
    assert str(exc).startswith("cudaMemcpyAsync: ")


def test_check_returns_values():
    assert check((E.cudaSuccess,)) is None
    assert check((E.cudaSuccess, 7)) == 7
    assert check((E.cudaSuccess, 7, "x")) == (7, "x")
    assert check((driver.CUresult.CUDA_SUCCESS, None)) is None
    assert check((nvrtc.nvrtcResult.NVRTC_SUCCESS, 13, 5)) == (13, 5)


def test_check_raises():
    with pytest.raises(errors.NotReadyError) as info:
        check((E.cudaErrorNotReady,))
    assert info.value.code == 600
    with pytest.raises(errors.OutOfMemoryError):
        check((driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None))
    with pytest.raises(errors.InvalidValueError):
        check((nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION,))


def test_check_on_a_real_failing_call():
    # Without a driver cudart answers cudaErrorInsufficientDriver; with one, the call succeeds.
    result = runtime.cudaGetDeviceCount()
    if result[0] == E.cudaSuccess:
        assert isinstance(check(result), int)
    else:
        with pytest.raises(errors.StreamRTError) as info:
            check(result)
        assert info.value.code == int(result[0])


@pytest.mark.parametrize(("err", "driver", "says"), [
    ("cudaErrorInsufficientDriver", 0, "an NVIDIA driver and a GPU are also needed"),
    ("cudaErrorInsufficientDriver", 12080, "supports CUDA 12.8, older than the CUDA 13.0"),
    ("cudaErrorNoDevice", 0, "cudaErrorNoDevice"),
    ("cudaSuccess", 0, "found no GPU"),
])
def test_unavailable_says_what_is_missing(err, driver, says):
    from streamrt.backends.cuda import why_unusable

    why = why_unusable(getattr(E, err), driver, 13000)
    assert says in why
    if driver:  # a driver too old for these bindings: the bindings that fit it
        assert "streamrt[cuda12]" in why


def test_unavailable_backend_carries_the_cuda_error(monkeypatch):
    from streamrt.backends import cuda

    monkeypatch.setattr(cuda.rt, "cudaGetDeviceCount", lambda: (E.cudaErrorInsufficientDriver, None))
    with pytest.raises(errors.BackendUnavailableError) as info:
        cuda.CudaBackend()
    assert (info.value.code, info.value.name) == (35, "cudaErrorInsufficientDriver")
    assert errors.BackendUnavailableError.name == "cudaErrorNoDevice"  # the class is untouched
