"""Tracebacks as the user reads them: the adapter's own frames left out.

An error the adapter raises (a FallbackError from the routing engine, a NumericsError from
a debug check, a UsageError from ``configure``) is about the user's line, not about the
adapter's code under it. So, as pytest and IPython hide their own frames, the frames shown
are cut at the user's last frame when the adapter's frames follow it — the adapter's and
torch's under it (the dispatch-mode wrappers that led into the adapter) — and the adapter's
frames anywhere else are left out too (a ``register_fallback`` function the engine called
is shown, the engine is not). The error then reads like one from torch's own C++ kernels:
the user's line, then the message. Exceptions raised by torch or the user's code with no
adapter frame on the traceback are shown untouched.

Used by the notebook extension (the traceback IPython shows; ``%debug`` still gets every
frame) and by ``torch-adapter run`` (the traceback it prints). ``TORCH_ADAPTER_TRACEBACKS=full``
shows every frame (for a report of an adapter bug).
"""

from __future__ import annotations

import os
import types
from typing import Any, Sequence

from .callsite import PACKAGE_DIR, _is_user

__all__ = ["hidden", "user_traceback", "trim_exception", "FULL"]

FULL = "TORCH_ADAPTER_TRACEBACKS"  # "full": hide nothing
_OWN = PACKAGE_DIR + os.sep


def _own(filename: str) -> bool:
    return not filename.startswith("<") and os.path.abspath(filename).startswith(_OWN)


def hidden(filenames: Sequence[str]) -> set[int]:
    """Which frames of a traceback (outermost first, by file name) are not shown."""
    own = [_own(f) for f in filenames]
    if not any(own) or os.environ.get(FULL) == "full":
        return set()
    users = [i for i, f in enumerate(filenames) if not own[i] and _is_user(f)]
    drop = {i for i, o in enumerate(own) if o}
    if users and any(own[users[-1] + 1:]):  # the adapter's frames under the user's last line
        drop |= set(range(users[-1] + 1, len(filenames)))
    return drop


def user_traceback(tb: Any) -> Any:
    """A traceback chain without the hidden frames (``tb`` itself when none is hidden, or when
    nothing would be left)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    drop = hidden([e.tb_frame.f_code.co_filename for e in entries])
    kept = [e for i, e in enumerate(entries) if i not in drop]
    if not drop or not kept:
        return entries[0] if entries else None
    out = None
    for e in reversed(kept):
        out = types.TracebackType(out, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return out


def trim_exception(te: Any) -> Any:
    """A :class:`traceback.TracebackException` with the hidden frames left out of it and of
    the exceptions chained to it (its cause and context); returns ``te``."""
    import traceback

    seen: set[int] = set()
    todo = [te]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        drop = hidden([f.filename for f in e.stack])
        if drop and len(drop) < len(e.stack):
            e.stack = traceback.StackSummary.from_list([f for i, f in enumerate(e.stack) if i not in drop])
        todo += [getattr(e, "__cause__", None), getattr(e, "__context__", None)]
    return te
