"""Backend registry: ``cpu`` is built in; ``cuda`` is imported lazily on first use."""

from __future__ import annotations

from ..errors import BackendUnavailableError, InvalidDeviceError
from .base import Backend
from .cpu import CpuBackend

BACKENDS = ("cpu", "cuda")
_loaded: dict[str, Backend] = {}


def loaded_backends() -> list[Backend]:
    """The backends already in use in this process."""
    return list(_loaded.values())


def get_backend(name: str) -> Backend:
    """The backend object called ``name``; raises if it cannot be used here."""
    backend = _loaded.get(name)
    if backend is not None:
        return backend
    if name == "cpu":
        backend = CpuBackend()
    elif name == "cuda":
        backend = _load_cuda()
    else:
        raise InvalidDeviceError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    _loaded[name] = backend
    return backend


def _load_cuda() -> Backend:
    try:
        import cuda.bindings.runtime  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            "the cuda backend needs the 'cuda-bindings' package (pip install 'streamrt[cuda]', or "
            f"'streamrt[cuda12]' for a CUDA 12 driver), an NVIDIA driver and a GPU: {exc}"
        ) from exc
    from .cuda import CudaBackend

    return CudaBackend()


def device_count(name: str) -> int:
    """Devices of backend ``name`` usable here (0 when the backend is unavailable)."""
    try:
        return get_backend(name).device_count()
    except BackendUnavailableError:
        return 0
