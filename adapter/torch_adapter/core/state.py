"""The current adapter session, at the bottom of the package: every layer may read it.

:mod:`torch_adapter.session` creates, suspends and closes sessions and is the only writer
(``set_current`` / the stack); redirect, routing, the tools and the optimization layer read
:func:`current` from here, so nothing below ``session.py`` imports it (tests/test_layering.py
checks the import graph). This module imports nothing of the package.

The state is process-wide: one session is *active* at a time; sessions suspended by a
nested ``adapted()`` block, a magic or ``%%adapter_compare`` wait on :data:`STACK`
(outermost first) and are resumed when that block ends.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["current", "set_current", "LOCK", "STACK"]

LOCK = threading.RLock()  # held while a session is installed, suspended, resumed or closed
_SESSION: Any = None
STACK: list[Any] = []  # suspended sessions, outermost first


def current() -> Any:
    """The installed (active) :class:`~torch_adapter.session.AdapterSession`, or None."""
    return _SESSION


def set_current(session: Any) -> None:
    """Make ``session`` (or None) the active one. Only :mod:`torch_adapter.session` calls this."""
    global _SESSION
    _SESSION = session
