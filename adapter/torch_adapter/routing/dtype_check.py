"""The dtype check of a simulated target: a preview behaves as the real backend would.

A real Apple GPU refuses a float64 tensor when it is *created* (``empty_mps``); an Arc GPU
refuses the first kernel that touches one. On a simulated target every tensor is a host
tensor, so the check sits where tensors come into being: the allocation ops
``aten::empty.memory_format`` and ``aten::empty_strided``, which factories (``dtype=``),
``.to(dtype)`` / ``.double()``, ``torch.tensor``, ``*_like`` and ``dtype=`` reductions all
dispatch to (measured: routing docs). A tensor of a refused dtype that arrives without an
allocation (``torch.from_numpy(...).cuda()``: no op runs on a CPU host) is checked where the
redirect layer moves it (:func:`check_moved`). Ops a profile lists per-op dtypes for
(``[dtypes.ops]``) get a check of their own. Only those few ops pay a Python call, and only on
simulated targets whose profile refuses something; every other op stays in C++.

``configure(dtype_check=...)``: ``"raise"`` (default) raises the real backend's error class
(``TypeError`` on MPS, ``RuntimeError`` on XPU) with its message first, at the user's line;
``"record"`` records every such call (op, dtype, site) in the routing logs and goes on;
``"off"`` checks nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..core import torch_private as tp
from ..errors import UnsupportedDtypeRuntimeError, UnsupportedDtypeTypeError, format_error
from .dispatch_state import state
from .dtypes import DEVICE_AWARE
from .internal import active as internal_active

__all__ = ["DtypeCheck", "CREATION_OPS", "MODES", "check_moved"]

CREATION_OPS = ("aten::empty.memory_format", "aten::empty_strided")
MODES = ("raise", "record", "off")
_ERRORS = {"TypeError": UnsupportedDtypeTypeError, "RuntimeError": UnsupportedDtypeRuntimeError}


def _device_aware(target: str) -> str:
    """Why the calling code would pick another dtype on the real ``target``, or "" (only on a refusal)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        for suffix, spares, why in DEVICE_AWARE:
            if target in spares and name.endswith(suffix):
                return why
        frame = frame.f_back
    return ""


class DtypeCheck:
    """The dtype kernels of one engine (simulated targets only). ``detach()`` removes them."""

    def __init__(self, engine: Any) -> None:
        import torch

        self.engine = engine
        self.caps = engine.profile.dtypes
        self.mode = "raise"
        self._libs: list[Any] = []
        self._guard: Any = None  # the C++ guard (routing/dtype_guard.py) while it holds the allocation ops
        self._refused = frozenset(getattr(torch, d) for d in (self.caps.refused if self.caps else ()))
        self._default = torch.get_default_dtype

    @property
    def active(self) -> bool:
        caps = self.caps
        return bool(self.engine.simulated and caps is not None and self.mode != "off" and (caps.refused or caps.ops))

    @property
    def backend(self) -> str:
        """``"cpp"`` (the C++ guard holds the allocation ops), ``"python"`` or ``""`` (nothing registered)."""
        return "cpp" if self._guard is not None else "python" if self._libs and self._refused else ""

    def install(self, mode: str) -> None:
        """(Re)register the kernels on top of whatever runs below them now (the engine's overrides
        included): the old ones come off first, so that each new kernel wraps what lies beneath."""
        self.detach()
        self.mode = mode
        if self.active:
            self._register()

    def detach(self) -> None:
        if self._guard is not None:
            self._guard.uninstall()
            self._guard = None
        for lib in self._libs:
            lib._destroy()
        self._libs = []

    def _register(self) -> None:
        import torch

        key = self.engine.key
        lib = tp.kernel_library("aten")
        self._libs.append(lib)
        if self._refused and not self._register_guard(key):
            for name in CREATION_OPS:
                original = tp.host_kernel(name, key)
                if original is not None:
                    tp.register_python_kernel(lib, name, self._creation_kernel(name, original), key)
        for name, allowed in sorted(self.caps.ops.items()):
            if name in CREATION_OPS:
                continue
            original = tp.host_kernel(name, key)
            if original is None:
                continue
            ns = name.partition("::")[0]
            target_lib = lib if ns == "aten" else tp.kernel_library(ns)
            if target_lib is not lib:
                self._libs.append(target_lib)
            ok = frozenset(getattr(torch, d) for d in allowed)
            tp.register_python_kernel(target_lib, name, self._op_kernel(name, original, ok), key)

    def _register_guard(self, key: str) -> bool:
        """The allocation ops checked in C++ (no Python call for supported dtypes); False when
        the guard cannot be built here or holds another session's ops."""
        from . import dtype_guard

        guard = dtype_guard.load()
        if guard is None or guard.installed():
            return False
        guard.install(list(CREATION_OPS), key, sorted(self._refused, key=str), self.refuse)
        self._guard = guard
        return True

    def _creation_kernel(self, name: str, original: Any) -> Callable[..., Any]:
        refused, default = self._refused, self._default

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            dtype = kwargs.get("dtype")
            if (dtype if dtype is not None else default()) in refused:
                self.refuse(name, dtype if dtype is not None else default())
            return original.call_boxed(keyset, *args, **kwargs)

        kernel.__name__ = f"torch_adapter_dtype_check_{name}"
        return kernel

    def _op_kernel(self, name: str, original: Any, ok: frozenset[Any]) -> Callable[..., Any]:
        import torch

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            for a in args:
                if isinstance(a, torch.Tensor) and a.dtype not in ok:
                    self.refuse(name, a.dtype)
                    break
            return original.call_boxed(keyset, *args, **kwargs)

        kernel.__name__ = f"torch_adapter_dtype_check_{name}"
        return kernel

    def refuse(self, op: str, dtype: Any) -> None:
        """A call the real target refuses: raise its error, or record it (``"record"``)."""
        if state.bypass or internal_active() or _device_aware(self.caps.target):
            return
        name = str(dtype).removeprefix("torch.")
        refusal = self.caps.refusal(name, op)
        if refusal is None:
            return
        engine = self.engine
        if self.mode == "record":
            from .log import user_site

            site = user_site(1)  # walks out from our caller (the kernel, or the user when the C++ guard calls)
            for log in engine.logs:
                log.add_dtype(op, name, error=refusal.error, message=refusal.message, source=refusal.source,
                              site=site)
            return
        target = engine.profile.name
        detail = format_error(
            f"{op} with dtype={name} on the simulated {target}", f"a dtype {target} has",
            name, why=f"the real {target} refuses it ({self.caps.label}; source: {refusal.source})",
            fix=(f"use float32 (e.g. .float(), dtype=torch.float32) for what runs on {target}; or "
                 'configure(dtype_check="record") (%adapter dtypes record) to list every such call and go on'))
        raise _ERRORS.get(refusal.error, UnsupportedDtypeTypeError)(f"{refusal.message}\n\ntorch_adapter: {detail}")


def check_moved(obj: Any) -> Any:
    """The redirect layer moved ``obj`` (a tensor or a module) to a simulated target. On the
    host that may run no op at all (``.cuda()`` of a host tensor is the tensor itself), so its
    dtypes are checked here as the real backend's copy would; returns ``obj``."""
    from ..core.state import current

    check = getattr(getattr(current(), "routing", None), "dtype_check", None)
    if check is None or not check.active or not check._refused:
        return obj
    tensors = (obj,) if hasattr(obj, "dtype") else (*obj.parameters(), *obj.buffers()) if hasattr(obj, "buffers") else ()
    for t in tensors:
        if t.dtype in check._refused:
            check.refuse("aten::_to_copy", t.dtype)
            break
    return obj
