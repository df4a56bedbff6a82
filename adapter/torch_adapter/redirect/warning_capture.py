"""A call's warnings recorded, as ``catch_warnings(record=True)`` + ``simplefilter("always")``
record them, without their per-call overhead (``devices._as_caller`` re-attributes a redirected
factory's warnings to the caller's line on every redirected call: ~2 µs of its ~3 went to the
context manager; measured with ``benchmarks/bench_decode.py``'s workload). The same module state
is swapped and put back (so the same known limit: it is process-wide, issue 21)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

__all__ = ["LEAN", "call_recording"]

# the warnings module's own hooks that catch_warnings swaps (CPython 3.11); elsewhere callers use catch_warnings
LEAN = all(hasattr(warnings, n) for n in ("_filters_mutated", "_showwarnmsg_impl", "_showwarning_orig"))
_ALWAYS = ("always", None, Warning, None, 0)


def call_recording(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, list[Any]]:
    """``(fn(*args, **kwargs), [warnings.WarningMessage, ...])`` — every warning it raised, none shown."""
    mod = warnings
    caught: list[Any] = []
    saved = mod.filters, mod.showwarning, mod._showwarnmsg_impl  # type: ignore[attr-defined]
    mod.filters = [_ALWAYS]  # type: ignore[attr-defined]
    mod._filters_mutated()  # type: ignore[attr-defined]
    mod.showwarning, mod._showwarnmsg_impl = mod._showwarning_orig, caught.append  # type: ignore[attr-defined]
    try:
        result = fn(*args, **kwargs)
    finally:
        mod.filters, mod.showwarning, mod._showwarnmsg_impl = saved  # type: ignore[attr-defined]
        mod._filters_mutated()  # type: ignore[attr-defined]
    return result, caught
