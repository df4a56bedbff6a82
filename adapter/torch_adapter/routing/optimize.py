"""Module-level replacements: ``optimize.register(torch.nn.LayerNorm, fast_forward)``, or as a
decorator ``@optimize.register(torch.nn.LayerNorm)`` above ``def fast_forward(module, x)``
(the name is then bound to the handle).

While the adapter is installed, every instance of the class — existing and new — runs the
replacement ``forward``. The replacement is one of, decided from its signature at registration:

- the forward form ``fn(module, x, ...)``: called as the class's ``forward`` with the instance
  as ``module`` (its parameters bind the instance and ``forward``'s inputs);
- the functional form ``fn(input, normalized_shape, weight=None, bias=None, eps=1e-5)``: the
  first parameter is the input and every other one is named after an attribute of the module
  (those ``forward`` reads as ``self.<name>``, and ``__constants__``), filled from the instance
  at each call — as ``torch.nn.functional.layer_norm`` is written;
- an ``nn.Module`` subclass whose ``forward`` is used with the original instance as ``self``.

A function that fits neither form is a ``RegistrationError`` (a ``UsageError``) before anything
is patched. Subclasses of the registered class that define their own ``forward`` are left alone.

Each call returns a handle with ``.remove()``; ``uninstall()`` removes them all;
registering a class twice is a RegistrationError. Inside ``trace()`` each replaced call
shows as ``optimize::<class>`` (route native, via ``optimize.register``); in the recorder
mode (``trace(use_observer=False)``) the ops of the replacement are listed as its pieces.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import time
from typing import Any, Callable

from ..errors import RegistrationError, format_error
from .registry import Handle, Registration, _session, registry_of

__all__ = ["register", "registered"]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _forward_of(replacement: Any, call: str, module_cls: type) -> Callable[..., Any]:
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
    return _by_signature(replacement, call, module_cls)


def _attributes(module_cls: type) -> list[str]:
    """The attributes a functional form may name: ``self.<name>`` read in the class's
    ``forward`` (as ``F.layer_norm(input, self.normalized_shape, self.weight, ...)``) and the
    class's ``__constants__``."""
    names = [n for c in module_cls.__mro__ for n in getattr(c, "__constants__", ())]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(module_cls.forward)))
    except (OSError, TypeError, SyntaxError):  # no Python source: the constants alone
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.append(node.attr)
    return list(dict.fromkeys(n for n in names if not n.startswith("_")))


def _by_signature(fn: Callable[..., Any], call: str, module_cls: type) -> Callable[..., Any]:
    """``fn`` as a forward ``(self, *args, **kwargs)``: the forward form as it is, the functional
    form with its attribute parameters filled from the instance; neither: RegistrationError."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a C function: called as fn(module, *args)
        return fn
    params = list(sig.parameters.values())
    attrs = _attributes(module_cls)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) > 1 and params[0].kind in positional and all(
            p.kind is not p.VAR_POSITIONAL and p.kind is not p.VAR_KEYWORD and p.name in attrs for p in params[1:]):
        return _functional(fn, [p.name for p in params[1:]])
    inputs = [p for p in list(inspect.signature(module_cls.forward).parameters.values())[1:]
              if p.default is p.empty and p.kind in positional]
    try:
        sig.bind(module_cls, *inputs)
    except TypeError as exc:
        shown = ", ".join(p.name for p in params)
        foreign = [p.name for p in params[1:] if p.name not in attrs] or ["no attribute after the input"]
        raise RegistrationError(format_error(
            call, f"the forward form fn(module, {', '.join(p.name for p in inputs) or '...'}) or the functional "
                  f"form fn(input, <attributes of {module_cls.__name__}>) with attributes among {attrs}",
            f"{getattr(fn, '__name__', fn)}({shown}) (as the functional form: {', '.join(foreign)} not among the "
            f"attributes; as the forward form: {exc})",
            why=f"the replacement runs as {module_cls.__name__}.forward: its parameters must take the instance "
                "and forward's inputs, or the input and the module's attributes by name",
            fix=f"name the parameters after {module_cls.__name__}'s attributes ({', '.join(attrs[:4])}), or take "
                "the module first: def fn(module, x)")) from None
    return fn


def _functional(fn: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def forward(self: Any, input: Any) -> Any:
        return fn(input, **{n: getattr(self, n) for n in names if hasattr(self, n)})

    return forward


def _traced(cls: type, forward: Callable[..., Any], label: str) -> Callable[..., Any]:
    from .decide import Route, RouteDecision
    from .dispatch_state import state
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
    forward = _forward_of(replacement, call, module_cls)
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
    from ..core.state import current

    session = current()
    reg = registry_of(session, create=False) if session is not None else None
    if reg is None:
        return []
    return [r.op for r in reg.registrations("module")]
