"""``with internal():`` — torch_adapter's own work, which no routing report counts.

Some of the adapter's computations run aten ops of their own: the self-decomposition probe
(:mod:`.self_decomp`, run on sample tensors the first time a route is decided — by
``targets()``, ``install()``, ``explain()``), the debug tools' checks (NaN/Inf counts, CPU
re-runs and comparisons, see :mod:`torch_adapter.tools.tool_mode`) and ``torch_adapter.export``'s
tracing and decompositions (on fake tensors). Those ops are not the user's. Inside the
block, on the thread that runs it, every observer of the adapter leaves them out:

- the C++ op observer (:mod:`.observe`) skips them (a per-thread depth in the extension,
  checked first thing in its RecordFunction callback);
- the profiler-backed observer skips the range the block opens (named :data:`MARKER`) with
  everything under it — the range is opened only while such an observer runs;
- ``trace()``'s recorder mode passes them through unrecorded, and the routing engine still
  routes them (they must run) but writes them to no log.

:func:`redispatch` is the other half: a dispatch mode of the adapter (the debug and memory
tools' mode) re-dispatches the user's op it handles, which both observers would count a
second time, as a piece of itself; around that call the re-dispatch is not counted (its
pieces are the op's own).

Nothing else changes: a user's own ``torch.profiler`` still sees the ops (their time is
real). The guard nests, and it is per thread: an op that a kernel's worker thread
dispatches itself is not covered, nor is an observer whose backend first loads inside the
block (the adapter starts none there).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

__all__ = ["internal", "redispatch", "active", "MARKER", "REDISPATCH"]

MARKER = "torch_adapter::internal"  # the profiler range the block opens for the profiler backend
REDISPATCH = "torch_adapter::redispatch"  # the profiler range around a mode's re-dispatch
_local = threading.local()


def active() -> bool:
    """Is this thread inside :func:`internal`?"""
    return getattr(_local, "depth", 0) > 0


def _cpp_extension() -> object | None:
    """The loaded C++ observer, if any (never loads it: none loaded means none counts)."""
    observe = sys.modules.get(f"{__package__}.observe")
    return getattr(observe, "_EXT", None) if observe is not None else None


def _profiler_observing() -> bool:
    backend = sys.modules.get(f"{__package__}._observe_profiler")
    return bool(backend is not None and backend._RUNNING)


@contextlib.contextmanager
def _unobserved(marker: str, enter: str, leave: str) -> Iterator[None]:
    """The block as both observers must see it: the C++ extension told through its ``enter`` /
    ``leave`` calls, the profiler backend through a range named ``marker`` (opened only while
    that backend runs)."""
    ext = _cpp_extension()
    handle = None
    try:
        if ext is not None:
            getattr(ext, enter)()
        if _profiler_observing():
            from ..core.torch_private import record_range_enter

            handle = record_range_enter(marker)
        yield
    finally:
        try:
            if handle is not None:
                from ..core.torch_private import record_range_exit

                record_range_exit(handle)
        finally:
            if ext is not None:
                getattr(ext, leave)()


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """Run the block as torch_adapter's own work: no observer of the adapter counts its ops."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        if depth:  # nested: the outermost block already told the observers
            yield
        else:
            with _unobserved(MARKER, "enter_internal", "exit_internal"):
                yield
    finally:
        _local.depth = depth


def redispatch() -> contextlib.AbstractContextManager[None]:
    """The block's first op call is a dispatch mode's re-dispatch of the op it handles
    (``func(*args)`` in ``__torch_dispatch__``): observers do not count it again."""
    return _unobserved(REDISPATCH, "expect_redispatch", "clear_redispatch")
