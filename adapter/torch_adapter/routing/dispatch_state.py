"""The routing engine's per-thread state, read by the engine, ``trace()``'s recorder, the
self-decomposition probe and the debug tools: a module of its own so that each can import it
without importing the engine."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["state"]


class _State(threading.local):
    """Per-thread engine state (autograd's CPU backward runs on the calling thread)."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # ops being decomposed (recursion guard)
        self.bypass = 0  # > 0 inside a CPU fallback: ops run as the host runs them
        self.recorded: str | None = None  # op a trace recorder is counting (it records after the call)
        self.decided: Any = None  # the decision that op really took (a declined decomposition: fallback)
        self.parent: str | None = None  # the composite op whose pieces are running
        self.child_ns = 0  # time of recorded children, for self time
        self.recorder: Any = None  # the active trace recorder mode, re-entered for pieces
        self.popped = False  # the recorder is handling an op (so it is off the mode stack)


state = _State()
