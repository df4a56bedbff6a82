"""Warnings at the user's line, and the adapter's own warnings silenced — per thread.

A C++ warning (``TORCH_WARN``) names the innermost Python frame; inside a redirected call
that is the adapter's wrapper, not the line the user wrote. ``warnings.catch_warnings`` could
re-issue them, but it swaps the warnings module's process-wide state (filters, the show
function) for the length of each call: another thread's warnings in that window are captured
and re-issued from the wrong place, and two threads leaving such blocks out of order leave
the filters as neither found them.

Instead, while a session is installed, two things stand on its Patcher (undone with it):

- one filter at the front of ``warnings.filters``, ``always`` for warnings attributed to this
  module — :func:`as_caller` makes the call, so its frame is the innermost Python frame a C++
  warning names (and the one a torch function's ``stacklevel=2`` names) — so that none is
  swallowed as "already shown" at that line, and
- ``warnings._showwarnmsg`` — the function CPython's warning machinery calls to show a
  warning, which ``catch_warnings`` (pytest's, the user's) leaves in place — wrapped: a warning
  attributed to this module, raised on a thread inside :func:`as_caller`, is issued again
  at the caller's line (the user's filters then apply there); one raised on a thread inside
  :func:`silenced` is dropped (and forgotten by the registry that marked it shown). Every other
  warning passes through unchanged.

Both decisions read this thread's state only. Without a session (no hook installed),
:func:`silenced` falls back to ``catch_warnings`` and :func:`as_caller` just calls.

**Calls the adapter passes through.** A stand-in that is not redirecting (``torch.arange(0, 3,
out=out)``, ``torch.empty(5)``, ``x.to(torch.int32)``: plain CPU code) calls torch's function from
its own frame without :func:`as_caller` — that costs nothing per call — so a C++ warning names the
stand-in's line (redirect/devices.py), where plain torch names the program's (PyTorch's
``test_cpp_warnings_have_python_context`` checks it; a program's filters by module or line miss it).
Stand-ins registered with :func:`pass_through` are found on the stack only when such a warning is
shown: the filter above covers their modules too, and the show hook issues the warning again at
the line that called the outermost stand-in.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import warnings
from typing import Any, Callable, Iterator

__all__ = ["install", "as_caller", "silenced", "pass_through"]

_FILTER = ("always", None, Warning, re.compile(re.escape(__name__) + r"\Z"), 0)


class _Local(threading.local):
    def __init__(self) -> None:
        self.callers: list[Any] = []  # the user's frames of the redirected calls running on this thread
        self.silent = 0


_LOCAL = _Local()
_INSTALLED: list[Any] = []  # the patcher whose hook is in place (one at a time: the active session's)
_PASS_THROUGH: set[Any] = set()  # code objects of the stand-ins registered with pass_through()
_PASS_FILES: set[str] = set()
_PASS_MODULES: set[str] = set()


def pass_through(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn``, a stand-in that calls torch's function from its own frame (every closure
    made from the same code at once): a warning torch raises in that call is issued again at the
    line that called it (module docstring). Returns ``fn``."""
    code = fn.__code__
    _PASS_THROUGH.add(code)
    _PASS_FILES.add(code.co_filename)
    _PASS_MODULES.add(fn.__globals__["__name__"])  # where it is defined (functools.wraps copies __module__)
    return fn


def install(patcher: Any) -> None:
    """Put the filter and the show hook on ``patcher`` (idempotent per patcher)."""
    if _INSTALLED and _INSTALLED[0] is patcher:
        return
    original = warnings._showwarnmsg

    def _showwarnmsg(msg: Any) -> None:
        local = _LOCAL
        if local.silent:
            _forget(msg)
            return
        if local.callers and msg.filename == __file__:
            _reissue(msg, local.callers[-1])
            return
        if msg.filename in _PASS_FILES:
            caller = _pass_through_caller(msg, sys._getframe(1))
            if caller is not None:
                _forget(msg)  # a program's "default"/"once" filter before ours marked the stand-in's line
                _reissue(msg, caller)
                return
        original(msg)

    patcher.set(warnings, "_showwarnmsg", _showwarnmsg)
    filters = [_FILTER]
    if _PASS_MODULES:  # a stand-in's line is not the place a warning is shown once for
        modules = "|".join(re.escape(m) for m in sorted(_PASS_MODULES))
        filters.append(("always", None, Warning, re.compile(rf"({modules})\Z"), 0))
    for f in reversed(filters):
        warnings.filters.insert(0, f)
    warnings._filters_mutated()
    _INSTALLED[:] = [patcher]

    def remove() -> None:
        for f in filters:
            with contextlib.suppress(ValueError):  # a catch_warnings block may have put the old list back
                warnings.filters.remove(f)
        warnings._filters_mutated()
        if _INSTALLED and _INSTALLED[0] is patcher:
            _INSTALLED.clear()

    patcher.after_restore(remove)


def _pass_through_caller(msg: Any, frame: Any) -> Any:
    """The frame that called the registered stand-in ``msg`` names (its file and line), past any
    registered stand-in calling it; None when no such frame is on this thread's stack (the
    warning was raised elsewhere in that file)."""
    while frame is not None:
        code = frame.f_code
        if code in _PASS_THROUGH and frame.f_lineno == msg.lineno and code.co_filename == msg.filename:
            frame = frame.f_back
            while frame is not None and frame.f_code in _PASS_THROUGH:
                frame = frame.f_back
            return frame
        frame = frame.f_back
    return None


def _reissue(msg: Any, frame: Any) -> None:
    """``msg`` issued again at ``frame``'s line, under that module's filters and registry."""
    g = frame.f_globals
    where = dict(module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}), source=msg.source)
    try:
        warnings.warn_explicit(msg.message, msg.category, frame.f_code.co_filename, frame.f_lineno,
                               module_globals=g, **where)
    except ImportError:  # `python -c`: __main__'s loader has no source to show the line from
        warnings.warn_explicit(msg.message, msg.category, frame.f_code.co_filename, frame.f_lineno, **where)


def as_caller(orig: Callable[..., Any], args: tuple, kwargs: dict, depth: int = 2) -> Any:
    """``orig(*args, **kwargs)``; its warnings attributed to the frame ``depth`` levels up
    (default: the caller of the function that called this)."""
    if not _INSTALLED:
        return orig(*args, **kwargs)
    callers = _LOCAL.callers
    callers.append(sys._getframe(depth))
    try:
        return orig(*args, **kwargs)
    finally:
        callers.pop()


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """No warning raised on this thread inside the block is shown (the adapter's own work)."""
    if not _INSTALLED:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        return
    _LOCAL.silent += 1
    try:
        yield
    finally:
        _LOCAL.silent -= 1


def _forget(msg: Any) -> None:
    """A dropped warning was marked as shown in its module's registry (``default``/``once``
    actions): unmark it, so that the user's own first such warning is still shown."""
    text = str(msg.message)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == msg.filename and frame.f_lineno == msg.lineno:
            registry = frame.f_globals.get("__warningregistry__")
            if isinstance(registry, dict):
                for key in ((text, msg.category, msg.lineno), (text, msg.category, 0)):
                    registry.pop(key, None)
            break
        frame = frame.f_back
    warnings.onceregistry.pop((text, msg.category), None)
