"""``acl.rt``: pyACL's runtime namespace (devices, contexts, streams, events, memory, pools),
gathered from the facade's modules; a name it does not offer fails with an ``AttributeError``
saying what to use instead."""

from __future__ import annotations

from typing import Any

from .context import (
    create_context,
    destroy_context,
    get_current_context,
    get_device,
    get_device_count,
    get_run_mode,
    reset_device,
    set_current_context,
    set_device,
    synchronize_device,
)
from .errors import not_offered
from .kernels import (
    binary_get_function,
    binary_load,
    binary_load_from_file,
    binary_unload,
    launch_kernel,
)
from .memory import (
    free,
    free_host,
    get_mem_info,
    malloc,
    malloc_host,
    memcpy,
    memcpy_async,
    memset,
    memset_async,
)
from .pools import (
    MemLocation,
    MemPoolProps,
    mem_pool_create,
    mem_pool_destroy,
    mem_pool_free_async,
    mem_pool_get_attr,
    mem_pool_malloc_async,
    mem_pool_set_attr,
    mem_pool_trim_to,
)
from .streams import (
    create_event,
    create_event_with_flag,
    create_stream,
    destroy_event,
    destroy_stream,
    event_elapsed_time,
    query_event_status,
    query_stream,
    record_event,
    stream_wait_event,
    synchronize_event,
    synchronize_stream,
)

__all__ = [
    "MemLocation", "MemPoolProps",
    "create_context", "destroy_context", "get_current_context", "set_current_context",
    "get_device", "get_device_count", "get_run_mode", "reset_device", "set_device",
    "synchronize_device",
    "create_stream", "destroy_stream", "synchronize_stream", "query_stream",
    "create_event", "create_event_with_flag", "destroy_event", "record_event",
    "stream_wait_event", "synchronize_event", "query_event_status", "event_elapsed_time",
    "malloc", "free", "malloc_host", "free_host", "memcpy", "memcpy_async", "memset",
    "memset_async", "get_mem_info",
    "mem_pool_create", "mem_pool_destroy", "mem_pool_malloc_async", "mem_pool_free_async",
    "mem_pool_set_attr", "mem_pool_get_attr", "mem_pool_trim_to",
    "binary_load", "binary_load_from_file", "binary_unload", "binary_get_function",
    "launch_kernel",
]

_HINTS = {
    "launch_callback": "s.launch_host_func(fn, *args) on the srt.Stream",
    "malloc_cached": "acl.rt.malloc(size, policy)",
    "create_stream_with_config": "acl.rt.create_stream()",
    "synchronize_stream_with_timeout": "acl.rt.synchronize_stream(stream)",
    "synchronize_device_with_timeout": "acl.rt.synchronize_device()",
    "reset_event": "acl.rt.record_event(event, stream) (a new record replaces the last)",
    "query_event": "acl.rt.query_event_status(event)",
    "device_can_access_peer": "srt.Device(i).can_access_peer(srt.Device(j))",
    "device_enable_peer_access": "srt.Device(i).enable_peer_access(srt.Device(j))",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise not_offered("acl.rt", name, _HINTS)
