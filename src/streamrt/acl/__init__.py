"""streamrt's ACL facade: pyACL's conventions over the same runtime (API.md §9.4).

``from streamrt import acl`` (or ``import acl`` under ``python -m streamrt.acl program.py``):
``acl.init()`` / ``acl.finalize()``, ``acl.rt.*``, ``acl.mdl.ri_*``, ``acl.nn.<op>``,
``acl.create_tensor``, ``acl.util.*``, ``acl.media.dvpp_*`` and the ACL constants under their
ACL names. Every call returns ``ret`` (``acl.ACL_SUCCESS == 0``) or ``(value, ret)`` and never
raises for a runtime error: the error becomes its ACL code (``acl.errors.CODES``) and
``acl.get_recent_err_msg()`` gives its message. Each call is a few lines over the public
streamrt API it names; none has semantics of its own.
"""

from __future__ import annotations

import threading
from typing import Any

from . import constants, errors, mdl, media, nn, rt, util
from .constants import *  # noqa: F403  (the ACL_* names, as pyACL programs spell them)
from .constants import ACL_ERROR_REPEAT_FINALIZE, ACL_ERROR_REPEAT_INITIALIZE
from .errors import AclCallError, api, not_offered, recent_message
from .tensors import create_tensor, destroy_tensor

__all__ = ["constants", "create_tensor", "destroy_tensor", "errors", "finalize",
           "get_recent_err_msg", "init", "mdl", "media", "nn", "rt", "util", *constants.__all__]

_lock = threading.Lock()
_initialized = False


@api()
def init(config_path: str | None = None) -> None:
    """``aclInit``: once per process (the configuration file is accepted, not read)."""
    global _initialized
    with _lock:
        if _initialized:
            raise AclCallError("acl.init was already called", ACL_ERROR_REPEAT_INITIALIZE)
        _initialized = True


@api()
def finalize() -> None:
    """``aclFinalize``: releases the buffers ``acl.util`` registered, after their work."""
    global _initialized
    with _lock:
        if not _initialized:
            raise AclCallError("acl.finalize without acl.init (or a second time)",
                               ACL_ERROR_REPEAT_FINALIZE)
        _initialized = False
    util.release_all()


def get_recent_err_msg() -> str | None:
    """``aclGetRecentErrMsg``: the message of this thread's last failed call (then cleared)."""
    return recent_message()


_HINTS = {
    "op": "acl.nn (aclnn's two-phase calls) or streamrt.ops (acl.op is not offered)",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise not_offered("acl", name, _HINTS)
