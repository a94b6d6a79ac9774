"""Map CUDA runtime, driver and NVRTC result codes onto the streamrt error hierarchy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ...errors import (
    BackendUnavailableError,
    CapturedEventError,
    CaptureImplicitError,
    CaptureInvalidatedError,
    CaptureIsolationError,
    CaptureMergeError,
    CaptureUnjoinedError,
    CaptureUnmatchedError,
    CaptureUnsupportedError,
    CaptureWrongThreadError,
    GraphExecUpdateError,
    IllegalStateError,
    InvalidAddressError,
    InvalidDeviceError,
    InvalidHandleError,
    InvalidValueError,
    KernelCompileError,
    LaunchError,
    NotPermittedError,
    NotReadyError,
    NotSupportedError,
    OutOfMemoryError,
    PeerAccessAlreadyEnabledError,
    PeerAccessNotEnabledError,
    StreamRTError,
)

__all__ = ["KernelCompileError", "check", "error_for"]


# Runtime (cudaError_t) and driver (CUresult) codes share one numbering: every value present in
# both enums of cuda-bindings 13.5 means the same thing (e.g. 2 = cudaErrorMemoryAllocation =
# CUDA_ERROR_OUT_OF_MEMORY), so one table serves both. Codes not listed map to StreamRTError.
_CUDA_TABLE: dict[int, type[StreamRTError]] = {
    # bad arguments
    1: InvalidValueError,  # InvalidValue
    9: InvalidValueError,  # cudaErrorInvalidConfiguration (launch dims/shared memory out of range)
    12: InvalidValueError,  # cudaErrorInvalidPitchValue
    13: InvalidValueError,  # cudaErrorInvalidSymbol
    21: InvalidValueError,  # cudaErrorInvalidMemcpyDirection
    32: InvalidValueError,  # cudaErrorMemoryValueTooLarge
    # memory
    2: OutOfMemoryError,  # cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
    # no usable CUDA here: the backend as a whole cannot run
    3: BackendUnavailableError,  # InitializationError / NOT_INITIALIZED
    4: BackendUnavailableError,  # CudartUnloading / DEINITIALIZED
    34: BackendUnavailableError,  # StubLibrary (a stub libcuda was loaded)
    35: BackendUnavailableError,  # cudaErrorInsufficientDriver
    36: BackendUnavailableError,  # CallRequiresNewerDriver
    46: BackendUnavailableError,  # DevicesUnavailable (exclusive-process device busy)
    100: BackendUnavailableError,  # NoDevice
    102: BackendUnavailableError,  # DeviceNotLicensed
    127: BackendUnavailableError,  # cudaErrorStartupFailure
    227: BackendUnavailableError,  # InsufficientLoaderVersion
    802: BackendUnavailableError,  # SystemNotReady (fabric manager)
    803: BackendUnavailableError,  # SystemDriverMismatch
    804: BackendUnavailableError,  # CompatNotSupportedOnDevice
    # a specific device/pointer/handle is wrong
    101: InvalidDeviceError,  # InvalidDevice (bad ordinal)
    16: InvalidAddressError,  # cudaErrorInvalidHostPointer
    17: InvalidAddressError,  # cudaErrorInvalidDevicePointer
    713: InvalidAddressError,  # HostMemoryNotRegistered
    201: InvalidHandleError,  # cudaErrorDeviceUninitialized / CUDA_ERROR_INVALID_CONTEXT
    400: InvalidHandleError,  # InvalidResourceHandle / INVALID_HANDLE
    709: InvalidHandleError,  # ContextIsDestroyed
    401: IllegalStateError,  # IllegalState
    704: PeerAccessAlreadyEnabledError,  # PeerAccessAlreadyEnabled
    705: PeerAccessNotEnabledError,  # PeerAccessNotEnabled
    600: NotReadyError,  # NotReady
    500: InvalidValueError,  # SymbolNotFound / NOT_FOUND (cuModuleGetFunction: no kernel of that name)
    # kernel images and kernel execution: both surface at launch or the next synchronize
    52: LaunchError,  # cudaErrorMissingConfiguration
    53: LaunchError,  # cudaErrorPriorLaunchFailure
    98: LaunchError,  # cudaErrorInvalidDeviceFunction
    200: LaunchError,  # InvalidKernelImage / INVALID_IMAGE
    209: LaunchError,  # NoKernelImageForDevice / NO_BINARY_FOR_GPU
    218: LaunchError,  # InvalidPtx
    221: LaunchError,  # JitCompilerNotFound
    222: LaunchError,  # UnsupportedPtxVersion
    223: LaunchError,  # JitCompilationDisabled
    700: LaunchError,  # IllegalAddress (sticky: the context is unusable afterwards)
    701: LaunchError,  # LaunchOutOfResources
    702: LaunchError,  # LaunchTimeout
    703: LaunchError,  # LaunchIncompatibleTexturing
    710: LaunchError,  # Assert (device-side assert)
    714: LaunchError,  # HardwareStackError
    715: LaunchError,  # IllegalInstruction
    716: LaunchError,  # MisalignedAddress
    717: LaunchError,  # InvalidAddressSpace
    718: LaunchError,  # InvalidPc
    719: LaunchError,  # LaunchFailure
    720: LaunchError,  # CooperativeLaunchTooLarge
    912: LaunchError,  # InvalidClusterSize
    913: LaunchError,  # FunctionNotLoaded
    # unsupported operations
    31: NotSupportedError,  # cudaErrorNotYetImplemented
    215: NotSupportedError,  # UnsupportedLimit
    217: NotSupportedError,  # PeerAccessUnsupported
    224: NotSupportedError,  # UnsupportedExecAffinity
    225: NotSupportedError,  # UnsupportedDevSideSync
    801: NotSupportedError,  # NotSupported
    811: NotSupportedError,  # CdpNotSupported
    800: NotPermittedError,  # NotPermitted (e.g. a CUDA call from a host function)
    # stream capture and graphs
    900: CaptureUnsupportedError,
    901: CaptureInvalidatedError,
    902: CaptureMergeError,
    903: CaptureUnmatchedError,
    904: CaptureUnjoinedError,
    905: CaptureIsolationError,
    906: CaptureImplicitError,
    907: CapturedEventError,
    908: CaptureWrongThreadError,
    910: GraphExecUpdateError,  # constructible from a message alone (result/node default to None)
}

# NVRTC numbers its results independently (1 is out of memory there), so it gets its own table.
_NVRTC_TABLE: dict[int, type[StreamRTError]] = {
    1: OutOfMemoryError,  # NVRTC_ERROR_OUT_OF_MEMORY
    3: InvalidValueError,  # NVRTC_ERROR_INVALID_INPUT
    4: InvalidHandleError,  # NVRTC_ERROR_INVALID_PROGRAM
    5: InvalidValueError,  # NVRTC_ERROR_INVALID_OPTION
    6: KernelCompileError,  # NVRTC_ERROR_COMPILATION
    8: IllegalStateError,  # NO_NAME_EXPRESSIONS_AFTER_COMPILATION (calls in the wrong order)
    9: IllegalStateError,  # NO_LOWERED_NAMES_BEFORE_COMPILATION
    10: InvalidValueError,  # NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID
}

# Enum classes are told apart by name rather than by isinstance so that this hot-path module needs
# no cuda.bindings import (the names are the same in the 12.x IntEnum and 13.x FastEnum bindings).
_RUNTIME, _DRIVER, _NVRTC = "cudaError_t", "CUresult", "nvrtcResult"


def _decode(text: Any) -> str:
    """Bytes from a cuda-bindings string getter → str."""
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def _bindings() -> Any:
    """cuda-bindings' runtime, driver and NVRTC modules, imported on first use: this module
    must import without the optional cuda-bindings (errors are mapped before it is asked for)."""
    from cuda.bindings import driver, nvrtc, runtime

    return SimpleNamespace(driver=driver, nvrtc=nvrtc, runtime=runtime)


def _runtime_description(code: int) -> tuple[str, str] | None:
    """(name, description) of a runtime code via cudart, which answers without a driver."""
    runtime = _bindings().runtime
    try:
        member = runtime.cudaError_t(code)
    except ValueError:
        return None
    err, name = runtime.cudaGetErrorName(member)
    err2, desc = runtime.cudaGetErrorString(member)
    if err != 0 or err2 != 0:
        return member.name, member.name
    return _decode(name), _decode(desc)


def _describe(err: Any) -> tuple[str, str, str]:
    """(kind, name, description) for a result enum member or a bare int (taken as a runtime code)."""
    code = int(err)
    kind = type(err).__name__
    if kind == _DRIVER:
        # cuGetErrorName/String need libcuda, which is exactly what is missing in the failures we
        # most want to report, so the name comes from the enum and the description is best-effort.
        name = err.name
        desc = None
        try:
            res, text = _bindings().driver.cuGetErrorString(err)
            if res == 0 and text:
                desc = _decode(text)
        except Exception:  # no driver library (DynamicLibNotFoundError): fall back below
            desc = None
        if desc is None:
            rt = _runtime_description(code)  # same numbering, so cudart's wording applies
            desc = rt[1] if rt is not None else name
        return kind, name, desc
    if kind == _NVRTC:
        res, text = _bindings().nvrtc.nvrtcGetErrorString(err)
        desc = _decode(text) if res == 0 and text else err.name
        return kind, err.name, desc
    rt = _runtime_description(code)
    if rt is None:
        return _RUNTIME, f"cudaError{code}", f"unknown CUDA error {code}"
    return _RUNTIME, rt[0], rt[1]


def error_for(err: Any, context: str | None = None) -> StreamRTError:
    """The streamrt exception for a failed CUDA/NVRTC result, carrying its exact code and name."""
    kind, name, desc = _describe(err)
    code = int(err)
    table = _NVRTC_TABLE if kind == _NVRTC else _CUDA_TABLE
    cls = table.get(code, StreamRTError)
    # StreamRTError.__str__ appends "[name]", so the message itself carries code and description.
    message = f"{desc} (CUDA error {code})" if kind != _NVRTC else f"{desc} (NVRTC error {code})"
    if context:
        message = f"{context}: {message}"
    exc = cls(message)
    # Instance attributes shadow the class defaults, so e.g. a LaunchError for 700 reads
    # code=700/name=cudaErrorIllegalAddress while LaunchError.code stays 719.
    exc.code = code
    exc.name = name
    return exc


def check(result: Any) -> Any:
    """Raise for a failed ``(err, *values)`` cuda-bindings result; else None, the value, or the values."""
    if not isinstance(result, tuple):
        err, values = result, ()  # a bare result enum
    else:
        err, values = result[0], result[1:]
    if err != 0:  # success is 0 in cudaError_t, CUresult and nvrtcResult alike
        raise error_for(err)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values
