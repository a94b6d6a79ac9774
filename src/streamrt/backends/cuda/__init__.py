"""The cuda backend: the CUDA runtime through NVIDIA's ``cuda-bindings``, one call per primitive.

Modules: :mod:`.backend` (the backend: devices, pinned host memory), :mod:`.device` (memory,
graph memory, address ranges, kernels), :mod:`.queue` (streams and their completion),
:mod:`.pools` (``cudaMemPool_t``), :mod:`.graph` (``cudaGraphExec_t``), :mod:`.mark` (a graph
record node's completions), :mod:`.hostfn` (host functions), :mod:`.runtime` (the bindings and
the device current on each thread), :mod:`.errors` (CUDA results as streamrt errors),
:mod:`.nvrtc` (compiling kernels).

Nothing here imports ``cuda-bindings`` until the backend is asked for: :mod:`.errors` and
:mod:`.nvrtc` import it only when called (NVRTC says why it is unusable when it is missing), and a
package's ``__init__`` runs before any of its modules, so this one names the backend's classes
lazily (PEP 562) instead of importing them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import CudaBackend, why_unusable
    from .device import CudaDevice
    from .errors import check
    from .queue import CudaQueue
    from .runtime import drv, rt

__all__ = ["CudaBackend", "CudaDevice", "CudaQueue", "check", "drv", "rt", "why_unusable"]

# name -> the module defining it; rt, drv and check: the CUDA modules the backend calls (tests
# patch their functions) and the result check
_LAZY = {"CudaBackend": "backend", "why_unusable": "backend", "CudaDevice": "device",
         "CudaQueue": "queue", "rt": "runtime", "drv": "runtime", "check": "errors"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value
