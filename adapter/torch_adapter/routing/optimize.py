"""Module-level replacements: ``optimize.register(torch.nn.LayerNorm, fast_forward)``, or as a
decorator ``@optimize.register(torch.nn.LayerNorm)`` above ``def fast_forward(module, x)``
(the name is then bound to the handle).

While the adapter is installed, every instance of the class — existing and new — runs the
replacement ``forward``. The replacement is either a function ``fn(module, *args,
**kwargs)`` (called with the instance as ``module``) or an ``nn.Module`` subclass whose
``forward`` is used with the original instance as ``self`` (so it may read the instance's
parameters, e.g. a LayerNorm subclass). Subclasses of the registered class that define
their own ``forward`` are left alone.

Each call returns a handle with ``.remove()``; ``uninstall()`` removes them all;
registering a class twice is a RegistrationError. Inside ``trace()`` each replaced call
shows as ``optimize::<class>`` (route native, via ``optimize.register``); in the recorder
mode (``trace(use_observer=False)``) the ops of the replacement are listed as its pieces.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from ..errors import RegistrationError, format_error
from .registry import Handle, Registration, _session, registry_of

__all__ = ["register", "registered"]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _forward_of(replacement: Any, call: str) -> Callable[..., Any]:
    import torch

    if isinstance(replacement, type) and issubclass(replacement, torch.nn.Module):
        forward = replacement.__dict__.get("forward") or getattr(replacement, "forward")
        return forward
    if isinstance(replacement, torch.nn.Module) or not callable(replacement):
        raise RegistrationError(format_error(
            call, "a function fn(module, *args, **kwargs) or an nn.Module subclass",
            f"{replacement!r} ({type(replacement).__name__})",
            why="the replacement runs as the forward of every instance of the class",
            fix="pass a function, or the class (not an instance) whose forward to use"))
    return replacement


def _traced(cls: type, forward: Callable[..., Any], label: str) -> Callable[..., Any]:
    from .decide import Route, RouteDecision
    from .engine import state
    from .trace import _ACTIVE

    op = f"optimize::{_qualname(cls)}"
    decision = RouteDecision(op, Route.NATIVE, f"module forward replaced by {label} (optimize.register)",
                             "optimize.register")

    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:  # no trace() open: nothing to record
            return forward(self, *args, **kwargs)
        st = state
        parent, st.parent = st.parent, op  # a recorder files the replacement's ops under it
        saved, st.child_ns = st.child_ns, 0
        t0 = time.perf_counter_ns()
        try:
            return forward(self, *args, **kwargs)
        finally:
            dt = time.perf_counter_ns() - t0
            children, st.child_ns, st.parent = st.child_ns, saved + dt, parent
            for log in list(_ACTIVE):
                log.add_decision(decision, self_time_ns=dt - children, parent=parent, find_site=True)

    return wrapper


def register(module_cls: type, replacement: Any = None, *, _decorating: bool = False) -> Any:
    """Replace ``module_cls.forward`` with ``replacement`` while the adapter is installed.

    Also a decorator: ``@optimize.register(torch.nn.LayerNorm)`` above the replacement
    function (or class) registers it and leaves the name bound to the handle."""
    import torch

    if replacement is None and not _decorating:
        _session(f"torch_adapter.optimize.register({getattr(module_cls, '__name__', module_cls)!r})")
        _module_class(module_cls)

        def decorate(fn: Any) -> Handle:
            return register(module_cls, fn, _decorating=True)

        return decorate

    call = f"torch_adapter.optimize.register({getattr(module_cls, '__name__', module_cls)!r}, ...)"
    _module_class(module_cls)
    session = _session(call)
    forward = _forward_of(replacement, call)
    label = getattr(replacement, "__qualname__", repr(replacement))
    had_own = "forward" in module_cls.__dict__
    original = module_cls.__dict__.get("forward")

    def undo() -> None:
        if had_own:
            module_cls.forward = original  # type: ignore[method-assign]
        elif "forward" in module_cls.__dict__:
            delattr(module_cls, "forward")

    from .log import user_site

    traced = _traced(module_cls, forward, label)

    def apply() -> None:
        module_cls.forward = traced  # type: ignore[method-assign]

    reg = Registration("module", _qualname(module_cls), None, replacement, user_site(1))
    return registry_of(session).add(reg, undo, apply=apply)  # raises on a duplicate before patching


def _module_class(module_cls: Any) -> None:
    import torch

    if not (isinstance(module_cls, type) and issubclass(module_cls, torch.nn.Module)):
        raise RegistrationError(format_error(
            f"torch_adapter.optimize.register({module_cls!r})", "an nn.Module subclass, e.g. torch.nn.LayerNorm",
            f"{module_cls!r} ({type(module_cls).__name__})",
            fix="pass the class itself: optimize.register(torch.nn.LayerNorm, my_forward), or as a decorator "
                "@optimize.register(torch.nn.LayerNorm)"))


def registered() -> list[str]:
    """Qualified names of the module classes replaced in the installed session."""
    from .._state import current

    session = current()
    reg = registry_of(session, create=False) if session is not None else None
    if reg is None:
        return []
    return [r.op for r in reg.registrations("module")]
