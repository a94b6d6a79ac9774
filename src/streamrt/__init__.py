"""streamrt: stream-ordered accelerator programming in Python (CUDA/ACL semantics, cpu and cuda)."""

from __future__ import annotations

from . import (
    errors,
    ops,
    sanitizer,  # noqa: E402,I001  (last: may switch itself on from STREAMRT_SANITIZE)
)
from .device import Device, current_device, device_count
from .errors import (
    BackendUnavailableError,
    CapturedEventError,
    CaptureError,
    CaptureImplicitError,
    CaptureInvalidatedError,
    CaptureIsolationError,
    CaptureMergeError,
    CaptureUnjoinedError,
    CaptureUnmatchedError,
    CaptureUnsupportedError,
    CaptureWrongThreadError,
    ExecutorError,
    ExecutorParamError,
    GraphExecUpdateError,
    GraphInstantiateError,
    IllegalStateError,
    InvalidAddressError,
    InvalidDeviceError,
    InvalidHandleError,
    InvalidTypeError,
    InvalidValueError,
    KernelCompileError,
    LaunchError,
    NotPermittedError,
    NotReadyError,
    NotSupportedError,
    OutOfMemoryError,
    PeerAccessAlreadyEnabledError,
    PeerAccessNotEnabledError,
    SanitizerError,
    StreamRTError,
)
from .graph import (
    CaptureInfo,
    CaptureMode,
    CaptureStatus,
    Graph,
    Node,
    NodeType,
    exchange_capture_mode,
)
from .graph.conditional import ConditionalHandle, ConditionalType
from .graph.exec import GraphExec
from .graph.instantiate import GraphInstantiateResult
from .graph.scope import graph_capture
from .graph.update import GraphExecUpdateResult
from .host_memory import free, free_host, malloc, malloc_host, memcpy, memset, read, write
from .interop import from_dlpack, host_array
from .kernel import Dim3, Kernel, KernelContext, cuda_kernel, kernel
from .pool import MemPool, MemPoolAttr
from .ranges import Range as range  # noqa: F401 - srt.range (NVTX-like); not in __all__, below
from .stream import Event, Stream, current_stream
from .tensor import Tensor, TensorDesc
from .trace import trace  # noqa: E402

CompileError = KernelCompileError  # API.md 9.3's name for it (Kernel.compile raises it)

__version__ = "0.1.0"

# ``range`` (user trace ranges) is left out of __all__: ``from streamrt import *`` must not
# shadow the builtin in the importing module

__all__ = [
    "__version__",
    "errors",
    # devices
    "Device", "current_device", "device_count",
    # streams, events, kernels
    "Stream", "Event", "current_stream", "kernel", "cuda_kernel", "Kernel", "KernelContext", "Dim3",
    # memory
    "malloc", "free", "malloc_host", "free_host", "memcpy", "memset", "read", "write",
    "MemPool", "MemPoolAttr",
    # tensors and two-phase operators
    "Tensor", "TensorDesc", "ops", "from_dlpack", "host_array",
    # tools
    "sanitizer", "trace",
    # graphs
    "Graph", "Node", "NodeType", "GraphExec", "GraphExecUpdateResult", "GraphInstantiateResult",
    "ConditionalType", "ConditionalHandle",
    "CaptureMode",
    "CaptureStatus", "CaptureInfo", "graph_capture", "exchange_capture_mode",
    # errors
    "StreamRTError", "InvalidValueError", "InvalidTypeError", "InvalidDeviceError",
    "InvalidAddressError", "InvalidHandleError", "OutOfMemoryError", "NotReadyError",
    "NotSupportedError", "NotPermittedError", "IllegalStateError",
    "PeerAccessAlreadyEnabledError", "PeerAccessNotEnabledError", "LaunchError",
    "KernelCompileError", "CompileError", "BackendUnavailableError",
    "CaptureError", "CaptureUnsupportedError", "CaptureInvalidatedError", "CaptureMergeError",
    "CaptureUnmatchedError", "CaptureUnjoinedError", "CaptureIsolationError",
    "CaptureImplicitError", "CapturedEventError", "CaptureWrongThreadError",
    "GraphExecUpdateError", "GraphInstantiateError", "ExecutorError", "ExecutorParamError",
    "SanitizerError",
]
