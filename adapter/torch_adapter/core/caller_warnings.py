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
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import warnings
from typing import Any, Callable, Iterator

__all__ = ["install", "as_caller", "silenced"]

_FILTER = ("always", None, Warning, re.compile(re.escape(__name__) + r"\Z"), 0)


class _Local(threading.local):
    def __init__(self) -> None:
        self.callers: list[Any] = []  # the user's frames of the redirected calls running on this thread
        self.silent = 0


_LOCAL = _Local()
_INSTALLED: list[Any] = []  # the patcher whose hook is in place (one at a time: the active session's)


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
        original(msg)

    patcher.set(warnings, "_showwarnmsg", _showwarnmsg)
    warnings.filters.insert(0, _FILTER)
    warnings._filters_mutated()
    _INSTALLED[:] = [patcher]

    def remove() -> None:
        with contextlib.suppress(ValueError):  # a catch_warnings block may have put the old list back
            warnings.filters.remove(_FILTER)
        warnings._filters_mutated()
        if _INSTALLED and _INSTALLED[0] is patcher:
            _INSTALLED.clear()

    patcher.after_restore(remove)


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
