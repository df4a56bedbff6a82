"""The registry of user extensions: ``register_fallback``, ``register_accelerated`` and
``optimize.register`` entries of one adapter session.

A :class:`Registry` belongs to one session and owns what it registered: every call
returns a :class:`Handle` with ``.remove()``; the session's ``uninstall()`` removes them
all (a closer in ``session.closers``). Registering an op twice is a
:class:`~torch_adapter.errors.RegistrationError` naming the op. Route decisions read an
immutable :class:`RegistrySnapshot`, so they stay pure and cacheable.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ..core.state import current
from ..errors import RegistrationError, UsageError, format_error

__all__ = ["Registry", "RegistrySnapshot", "Registration", "Handle", "registry_of",
           "register_fallback", "register_accelerated"]


@dataclass(frozen=True)
class RegistrySnapshot:
    """What decisions need: ``(op, device)`` pairs with accelerated kernels, ops with fallbacks."""

    accelerated: frozenset[tuple[str, str]] = frozenset()
    fallback: frozenset[str] = frozenset()


@dataclass
class Registration:
    kind: str  # "fallback" | "accelerated" | "module"
    op: str  # "aten::nonzero", or the module class's qualified name
    device: str | None
    fn: Callable[..., Any]
    site: dict[str, Any] | None = None


class Handle:
    """What a register call returns: callable like the registered function, ``.remove()``-able."""

    def __init__(self, registry: "Registry", reg: Registration, undo: Callable[[], None] | None = None,
                 apply: Callable[[], None] | None = None) -> None:
        self._registry = registry
        self.registration = reg
        self._undo = undo
        self._apply = apply  # re-applies the patch when a suspended session resumes
        self.removed = False
        self.__doc__ = getattr(reg.fn, "__doc__", None)
        self.__wrapped__ = reg.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.registration.fn(*args, **kwargs)

    def remove(self) -> None:
        """Unregister (idempotent)."""
        if not self.removed:
            self.removed = True
            self._registry._remove(self)

    def __repr__(self) -> str:
        r = self.registration
        where = f" device={r.device!r}" if r.device else ""
        return f"<{r.kind} registration {r.op!r}{where}{' removed' if self.removed else ''}>"


class Registry:
    """User extensions of one session. Obtain it with :func:`registry_of`."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._handles: dict[tuple[str, str, str | None], Handle] = {}
        self._lock = threading.RLock()
        self._snapshot: RegistrySnapshot | None = None
        self.suspended = False  # the session is suspended: patches are off, entries kept

    def __len__(self) -> int:
        return len(self._handles)

    def snapshot(self) -> RegistrySnapshot:
        with self._lock:
            if self._snapshot is None:
                regs = [h.registration for h in self._handles.values()]
                self._snapshot = RegistrySnapshot(
                    frozenset((r.op, r.device) for r in regs if r.kind == "accelerated" and r.device),
                    frozenset(r.op for r in regs if r.kind == "fallback"))
            return self._snapshot

    def registrations(self, kind: str | None = None) -> list[Registration]:
        """What is registered (of one ``kind``: "fallback", "accelerated", "module")."""
        with self._lock:
            return [h.registration for h in self._handles.values() if kind is None or h.registration.kind == kind]

    def function(self, kind: str, op: str, device: str | None = None) -> Callable[..., Any] | None:
        handle = self._handles.get((kind, op, device))
        return handle.registration.fn if handle is not None else None

    def add(self, reg: Registration, undo: Callable[[], None] | None = None, *, sync: bool = True,
            apply: Callable[[], None] | None = None) -> Handle:
        """Add ``reg`` (a duplicate raises before anything changes); ``apply`` patches now
        and again on resume, ``undo`` reverts it on remove, suspend and close."""
        key = (reg.kind, reg.op, reg.device)
        with self._lock:
            if key in self._handles:
                old = self._handles[key].registration
                from ..core.callsite import site_text

                where = f" at {site_text(old.site)}" if old.site else ""
                raise RegistrationError(format_error(
                    f"register_{reg.kind}({reg.op!r}{f', device={reg.device!r}' if reg.device else ''})",
                    "one registration per op", f"a second one (the first is {old.fn!r}{where})",
                    why="two implementations of one op would make its route ambiguous",
                    fix="call .remove() on the first handle, then register again"))
            handle = Handle(self, reg, undo, apply)
            self._handles[key] = handle
            self._snapshot = None
        if apply is not None:
            apply()
        if sync:
            self._sync()
        return handle

    def _remove(self, handle: Handle) -> None:
        reg = handle.registration
        with self._lock:
            if self._handles.get((reg.kind, reg.op, reg.device)) is handle:
                del self._handles[(reg.kind, reg.op, reg.device)]
                self._snapshot = None
        if handle._undo is not None and not self.suspended:
            handle._undo()
        self._sync()

    def _sync(self) -> None:
        """Let the session's routing engine pick up the change (attaching one if needed)."""
        session = self.session
        if not session.active and session.routing is None:
            return
        if any(h.registration.kind != "module" for h in self._handles.values()) and session.routing is None:
            session._attach_routing()
        elif session.routing is not None:
            session.routing.refresh()

    def suspend(self) -> None:
        """Take the patches off (the session is suspended); entries and handles stay."""
        with self._lock:
            handles = list(self._handles.values())
            self.suspended = True
        for handle in reversed(handles):
            if handle._undo is not None:
                handle._undo()

    def resume(self) -> None:
        """Put the patches back as they were (the session resumes)."""
        with self._lock:
            handles = list(self._handles.values())
            self.suspended = False
        for handle in handles:
            if handle._apply is not None:
                handle._apply()

    def close(self) -> None:
        """Remove everything (run by the session on uninstall)."""
        with self._lock:
            handles = list(self._handles.values())
        for handle in reversed(handles):
            handle.removed = True
            with self._lock:
                self._handles.pop((handle.registration.kind, handle.registration.op, handle.registration.device), None)
                self._snapshot = None
            if handle._undo is not None and not self.suspended:
                handle._undo()


def registry_of(session: Any, *, create: bool = True) -> Registry | None:
    """The session's registry (created on first use, closed when the session closes)."""
    reg = getattr(session, "registry", None)
    if reg is None and create:
        reg = Registry(session)
        session.registry = reg
        session.closers.append(reg.close)
        session.suspenders.append((reg.suspend, reg.resume))
    return reg


def _session(call: str) -> Any:
    session = current()
    if session is None:
        raise UsageError(format_error(
            call, "an installed adapter", "none installed",
            why="registrations belong to a session and are removed by uninstall()",
            fix="call torch_adapter.install(...) first (or register inside `with torch_adapter.adapted(...)`)"))
    return session


def _register(kind: str, op: Any, fn: Callable[..., Any] | None, device: str | None) -> Any:
    from .names import op_name
    from .log import user_site

    call = f"torch_adapter.register_{kind}({op!r}{f', device={device!r}' if device else ''})"
    session = _session(call)
    name = op_name(op, call=call)

    def attach(func: Callable[..., Any]) -> Handle:
        if not callable(func):
            raise RegistrationError(format_error(call, "a function implementing the op",
                                                 f"{func!r} ({type(func).__name__})",
                                                 fix=f"use it as a decorator: @register_{kind}({name!r})"))
        if kind == "fallback":
            _warn_if_native(session, name)
        reg = Registration(kind, name, device, func, user_site(3))
        return registry_of(session).add(reg)

    return attach if fn is None else attach(fn)


def _warn_if_native(session: Any, name: str) -> None:
    from .profiles import profile_for

    profile = profile_for(session.target)
    if profile.is_native(name):
        from .policy import PolicyWarning

        warnings.warn(f"register_fallback({name!r}): {profile.name} has its own {profile.dispatch_key} kernel "
                      f"for it, so the fallback is not used there", PolicyWarning, stacklevel=4)


def register_fallback(op: Any, fn: Callable[..., Any] | None = None) -> Any:
    """Register a Python implementation of ``op`` for targets that lack it.

    Use as ``register_fallback("aten::nonzero", impl)`` or as a decorator
    ``@register_fallback("aten::nonzero")``. The function receives the op's arguments
    (tensors on the target's device) and returns its result. Returns a :class:`Handle`
    (``.remove()``); ``uninstall()`` removes it. Its calls route as ``fallback`` with the
    reason "Python implementation from register_fallback".
    """
    return _register("fallback", op, fn, None)


def register_accelerated(op: Any, fn: Callable[..., Any] | None = None, *, device: str) -> Any:
    """Register a kernel of ``op`` for one target (``device="npu"``): its calls route as
    ``native`` there. Decorator or call, like :func:`register_fallback`. ``device`` must name
    a target torch_adapter knows (a typo is an error); one that is not the installed target
    warns, since the registration then changes no route."""
    known = _device_names()
    call = f"torch_adapter.register_accelerated({op!r}, device=...)"
    name = device.strip().lower() if isinstance(device, str) else None
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name or "", sorted(known), n=1)
        raise UsageError(format_error(call, f"a target name: {', '.join(sorted(known))}",
                                      f"{device!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                                      why="the kernel is used when the session's target is that device",
                                      fix=f'e.g. register_accelerated({op!r}, device="{close[0] if close else "npu"}")'))
    session = current()
    if session is not None and name != session.target.name:
        from .policy import PolicyWarning

        warnings.warn(f"register_accelerated({op!r}, device={name!r}): the installed target is "
                      f"{session.target.label}, so this kernel changes no route in this session; install "
                      f"target={name!r} (or simulate it) for it to apply", PolicyWarning, stacklevel=2)
    return _register("accelerated", op, fn, name)


def _device_names() -> set[str]:
    from .target import KNOWN
    from .profiles import BUILTIN

    names = set(KNOWN) | set(BUILTIN)
    session = current()
    if session is not None:
        names.add(session.target.name)  # a .toml profile's own name
    return names
