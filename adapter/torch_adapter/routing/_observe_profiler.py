"""The pure-Python backend of :class:`~torch_adapter.routing.observe.OpObserver`.

Used when the C++ observer cannot be built (no compiler). It runs the autograd profiler
(CPU activity, all threads, overload names) and, when an observer stops, walks the
profiler's event tree into the same counts the C++ observer keeps: calls per
``aten::name.overload``, self time, direct children, top-level calls. Only FUNCTION-scope
events count, as in C++; autograd nodes and user ranges are looked through, so an op under
them is the child of the nearest op above; the range :func:`~.internal.internal` opens is
left out with everything under it, and under the range :func:`~.internal.redispatch` opens
a call of the op around it is looked through (a dispatch mode's re-dispatch of the op).

The profiler cannot nest, so one profiler run is shared: whenever an observer starts or
stops while others run, the profiler is stopped, what it saw is added to every running
observer, and it is started again for those still running.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.torch_private import op_profiler_start, op_profiler_stop, profiler_function_events
from .internal import MARKER, REDISPATCH
from .observed import ObserveResult, is_op_key

__all__ = ["ProfilerSession"]

_HUB_LOCK = threading.Lock()
_RUNNING: list["ProfilerSession"] = []


class _Counts:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.self_ns: dict[str, int] = {}
        self.children: dict[str, dict[str, int]] = {}
        self.top: dict[str, int] = {}

    def add(self, other: "_Counts") -> None:
        for mine, theirs in ((self.calls, other.calls), (self.self_ns, other.self_ns), (self.top, other.top)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        for parent, kids in other.children.items():
            under = self.children.setdefault(parent, {})
            for k, v in kids.items():
                under[k] = under.get(k, 0) + v


def _key(name: str, overload: str) -> str:
    return f"{name}.{overload}" if overload else name


def _redispatched(events: list[Any], parent: str | None, owner: str, counts: _Counts) -> int:
    """Under a mode's re-dispatch range: a call of ``owner`` (the op the mode handles) is that
    op again — not counted, its time is the op's, its pieces the op's; anything else as usual."""
    found_ns = 0
    for event in events:
        op = profiler_function_events(event)
        if op is not None and _key(op[0], op[1]) == owner:
            inner = _walk(event.children, owner, counts, owner)
            counts.self_ns[owner] = counts.self_ns.get(owner, 0) + max(op[2] - inner, 0)
            found_ns += op[2]
        else:
            found_ns += _walk([event], parent, counts, owner)
    return found_ns


def _walk(events: list[Any], parent: str | None, counts: _Counts, owner: str | None = None) -> int:
    """Count the op events among ``events`` (looking through non-op events); returns the
    total duration of the ops found at this level, which is child time for ``parent``.
    ``owner``: the nearest dispatcher op above (``parent``, or the op above a named range)."""
    found_ns = 0
    for event in events:
        op = profiler_function_events(event)
        if op is None:
            if event.name == REDISPATCH and owner is not None:  # a mode's re-dispatch of ``owner``
                found_ns += _redispatched(event.children, parent, owner, counts)
            elif event.name != MARKER:  # torch_adapter's own work (routing/internal.py) is left out
                found_ns += _walk(event.children, parent, counts, owner)
            continue
        name, overload, duration = op
        key = _key(name, overload)
        inner = _walk(event.children, key, counts, key if is_op_key(key) else owner)
        counts.calls[key] = counts.calls.get(key, 0) + 1
        counts.self_ns[key] = counts.self_ns.get(key, 0) + max(duration - inner, 0)
        if parent is None:
            counts.top[key] = counts.top.get(key, 0) + 1
        else:
            under = counts.children.setdefault(parent, {})
            under[key] = under.get(key, 0) + 1
        found_ns += duration
    return found_ns


def _collect_locked() -> None:
    """Stop the shared profiler run and add what it saw to every running session."""
    counts = _Counts()
    _walk(op_profiler_stop(), None, counts)
    for session in _RUNNING:
        session.counts.add(counts)


class ProfilerSession:
    """One observer's share of the profiler run."""

    name = "python"

    def __init__(self) -> None:
        self.counts = _Counts()

    def start(self) -> None:
        with _HUB_LOCK:
            if _RUNNING:
                _collect_locked()
            _RUNNING.append(self)
            try:
                op_profiler_start()
            except BaseException:
                _RUNNING.remove(self)
                if _RUNNING:
                    op_profiler_start()
                raise

    def stop(self) -> Any:

        with _HUB_LOCK:
            try:
                _collect_locked()
            finally:
                _RUNNING.remove(self)
                if _RUNNING:
                    op_profiler_start()
        c = self.counts
        return ObserveResult(calls=c.calls, self_time_ns=c.self_ns, children=c.children, top_level=c.top)
