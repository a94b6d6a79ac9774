"""A kernel context's view path: ``ctx.array``'s lookup of the views a device made last.

:class:`PyViews` is the behaviour; :data:`ViewBase` is what :class:`~streamrt.kernel.KernelContext`
derives from: the C version (``_viewcache.ViewCache``, built by pip where a compiler is there)
when it imports and the flag ``STREAMRT_PURE_PYTHON`` is off (unset, 0, false, off, no), else
:class:`PyViews`. The C version
answers a hit itself (a Python method call costs about as much as a tiny kernel's ``np.add``)
and hands everything else to :meth:`PyViews.array`, so the two behave alike. Fields (either
version): ``_last``, the device's ``DeviceImpl.last_views`` (ptr -> (shape, dtype, writable
view, read-only view)), and ``_view``, the device's view function (the miss path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .validate import env_flag

__all__ = ["PyViews", "ViewBase", "compiled"]


class PyViews:
    """The view path in Python (see the module docstring)."""

    __slots__ = ("_view", "_last")
    _view: Any
    _last: dict[int, tuple[Any, Any, Any, Any]]

    def array(self, ptr: int, shape: Any, dtype: Any, *, readonly: bool = False) -> np.ndarray:
        """A numpy view of device memory; read-only views declare a read, writable ones a write."""
        try:  # hot path: the view last made at this address by this device, if it matches
            e = self._last[ptr]
        except (KeyError, TypeError):  # none there, or an unhashable pointer (refused below)
            return self._view(ptr, shape, dtype, readonly)  # type: ignore[no-any-return]
        if e[0] == shape and e[1] is dtype:
            view = e[3] if readonly else e[2]  # a read-only and a writable view kept side by side
            if view is not None:
                return view  # type: ignore[no-any-return]
        return self._view(ptr, shape, dtype, readonly)  # type: ignore[no-any-return]


def _compiled() -> type | None:
    if env_flag("STREAMRT_PURE_PYTHON"):  # (a value it cannot read is refused, at import)
        return None
    try:
        from . import _viewcache  # type: ignore[attr-defined]
    except ImportError:  # not built (no compiler when it was installed)
        return None
    _viewcache.set_fallback(PyViews.array)
    return _viewcache.ViewCache  # type: ignore[no-any-return]


compiled: type | None = _compiled()  # the C base, if it is the one in use
if TYPE_CHECKING:
    ViewBase = PyViews
else:
    ViewBase = compiled or PyViews
