"""The one TorchDispatchMode the opt-in tools share, and the current-module tracker.

:mod:`torch_adapter.debug` (NaN/Inf check, CPU compare) and :mod:`torch_adapter.memory`
(tracking creation sites) each add a *feature* — an object with ``before(func, args,
kwargs) -> state`` and ``after(func, args, kwargs, out, state)`` — with :func:`enable`.
The mode is entered when the first feature is added and taken off the dispatch-mode stack
(wherever it sits on it) when the last is removed, so it stays on across notebook cells
and whole scripts in between. It sees every aten op below autograd on the thread that
enabled it — backward ops included, which autograd runs on that thread for CPU tensors —
but not CompositeImplicitAutograd ops, only their pieces.

A feature's ``before``/``after`` run under :func:`torch_adapter.routing.internal.internal`:
the ops a tool runs itself are in no routing report. A feature that raises anything but :class:`~torch_adapter.errors.NumericsError` is
switched off with a :class:`ToolWarning` naming it and the op: the user's op still runs.

The module tracker (global ``nn.Module`` forward pre/post hooks, installed while a feature
needs it) keeps the stack of modules whose ``forward`` is running; :func:`module_path`
names the innermost one as ``unet.down_blocks.0.attentions.0`` — the root's variable name
(found in the calling frames when first asked) and the dotted path from ``named_modules()``,
built lazily once per root.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from typing import Any

from ..core import torch_private as tp
from ..errors import NumericsError

__all__ = ["ToolWarning", "enable", "disable", "enabled", "module_path", "phase"]

_LOCK = threading.RLock()
_FEATURES: dict[str, Any] = {}
_MODE: Any = None
_STALE: list[Any] = []  # modes switched off from another thread: passing through until their thread takes them off
_HOOKS: list[Any] = []
_local = threading.local()
_NAMES: "weakref.WeakKeyDictionary[Any, dict[int, str]]" = weakref.WeakKeyDictionary()
_LABELS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


class ToolWarning(UserWarning):
    """A torch_adapter tool failed and switched itself off; the program runs on."""


def _mode_class() -> type:
    from ..routing.internal import redispatch

    base = tp.dispatch_mode_base()

    class ToolMode(base):  # type: ignore[misc, valid-type]
        """Runs each op, with the enabled features' before/after around it."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if _STALE and any(self is m for m in _STALE):  # switched off from another thread: pass ops through
                with redispatch():
                    return func(*args, **kwargs)
            features = list(_FEATURES.items())
            states = [_call(name, f.before, func, args, kwargs) for name, f in features]
            with redispatch():  # the user's op once more, one level down: observers counted it already
                out = func(*args, **kwargs)
            for (name, f), state in zip(features, states):
                _call(name, f.after, func, args, kwargs, out, state)
            return out

    return ToolMode


def _call(name: str, fn: Any, func: Any, *args: Any) -> Any:
    from ..routing.internal import internal

    try:
        with internal():  # a tool's own ops (NaN counts, CPU re-runs) are not the user's: reports leave them out
            return fn(func, *args)
    except NumericsError:
        raise
    except Exception as exc:  # a failing observer reports itself and steps aside
        with _LOCK:
            _FEATURES.pop(name, None)
        from ..core.callsite import user_site

        site = user_site() or {"file": "<torch_adapter>", "line": 0}
        op = func.name() if hasattr(func, "name") else str(func)
        warnings.warn_explicit(f"torch_adapter: the {name} tool failed on {op} ({type(exc).__name__}: {exc}) and is "
                               f"now off; your program continues without it", ToolWarning, site["file"], site["line"])
        return None


def enable(name: str, feature: Any, *, track_modules: bool = True) -> None:
    """Add (or replace) ``feature`` under ``name``; enter the mode if it is not on."""
    global _MODE
    with _LOCK:
        _drop_stale()
        _FEATURES[name] = feature
        if track_modules:
            _start_tracking()
        if _MODE is None or not any(m is _MODE for m in tp.dispatch_mode_stack()):
            _MODE = _mode_class()()
            _MODE.__enter__()


def disable(name: str) -> None:
    """Remove the feature ``name`` (no-op if absent); leave the mode when none is left."""
    global _MODE
    with _LOCK:
        _drop_stale()
        _FEATURES.pop(name, None)
        if _FEATURES:
            return
        _stop_tracking()
        if _MODE is not None:
            mode, _MODE = _MODE, None
            if not tp.remove_dispatch_mode(mode):  # entered on another thread: it passes ops through
                _STALE.append(mode)  # and comes off when that thread next enables or disables a tool


def _drop_stale() -> None:
    """Take the stale modes entered on this thread off its stack."""
    _STALE[:] = [m for m in _STALE if not tp.remove_dispatch_mode(m)]


def enabled(name: str) -> bool:
    return name in _FEATURES


# -- the current module -----------------------------------------------------------------------
def _stack() -> list[Any]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _pre(module: Any, args: Any) -> None:
    _stack().append(module)


def _post(module: Any, args: Any, output: Any) -> None:
    stack = _stack()
    while stack:
        if stack.pop() is module:
            break


def _start_tracking() -> None:
    if _HOOKS:
        return
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    _HOOKS.append(register_module_forward_pre_hook(_pre))
    _HOOKS.append(register_module_forward_hook(_post, always_call=True))


def _stop_tracking() -> None:
    while _HOOKS:
        _HOOKS.pop().remove()
    _local.stack = []


def _names(root: Any) -> dict[int, str]:
    names = _NAMES.get(root)
    if names is None:
        names = _NAMES[root] = {id(m): name for name, m in root.named_modules()}
    return names


def _label(root: Any) -> str:
    """The variable that holds ``root`` in the innermost user frame that has one (``unet``),
    an attribute of ``self`` there (``self.unet`` -> ``unet``), else the class name."""
    label = _LABELS.get(root)
    if label is not None:
        return label
    from ..core.callsite import _is_user

    frame = sys._getframe(1)
    while frame is not None and label is None:
        if _is_user(frame.f_code.co_filename):
            for key, value in list(frame.f_locals.items()):
                if value is root and key != "self":
                    label = key
                    break
                if key == "self" and value is not root and hasattr(value, "__dict__"):
                    label = next((k for k, v in vars(value).items() if v is root), None)
                    if label is not None:
                        break
            if label is None:
                label = next((k for k, v in list(frame.f_globals.items()) if v is root), None)
        frame = frame.f_back
    label = label or type(root).__name__
    _LABELS[root] = label
    return label


def module_path() -> str | None:
    """``unet.down_blocks.0.attentions.0`` for the innermost module running on this thread, or
    None outside any. A module that is not a submodule of the one around it starts a new
    segment after ``/`` named by its class."""
    stack = list(_stack())
    path: str | None = None
    names: dict[int, str] = {}
    base = ""
    for module in stack:
        name = names.get(id(module))
        if name is not None:
            path = f"{base}.{name}" if name else base
            continue
        base = _label(module) if path is None else f"{path}/{type(module).__name__}"
        names = _names(module)
        path = base
    return path


def phase() -> tuple[str, str | None]:
    """``("backward", "LogBackward0")`` inside autograd's backward, else ``("forward", None)``."""
    node = tp.current_autograd_node()
    if node is not None:
        return "backward", node.name()
    return "forward", None
