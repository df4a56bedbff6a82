"""``with internal():`` — torch_adapter's own work, which no routing report counts.

Some of the adapter's computations run aten ops of their own: the self-decomposition probe
(:mod:`.self_decomp`, run on sample tensors the first time a route is decided — by
``targets()``, ``install()``, ``explain()``), the debug tools' checks (NaN/Inf counts, CPU
re-runs and comparisons, see :mod:`torch_adapter._tool_mode`) and ``torch_adapter.export``'s
tracing and decompositions (on fake tensors). Those ops are not the user's. Inside the
block, on the thread that runs it, every observer of the adapter leaves them out:

- the C++ op observer (:mod:`.observe`) skips them (a per-thread depth in the extension,
  checked first thing in its RecordFunction callback);
- the profiler-backed observer skips the range the block opens (named :data:`MARKER`) with
  everything under it — the range is opened only while such an observer runs;
- ``trace()``'s recorder mode passes them through unrecorded, and the routing engine still
  routes them (they must run) but writes them to no log.

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

__all__ = ["internal", "active", "MARKER"]

MARKER = "torch_adapter::internal"  # the profiler range the block opens for the profiler backend
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
def internal() -> Iterator[None]:
    """Run the block as torch_adapter's own work: no observer of the adapter counts its ops."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    ext = _cpp_extension() if depth == 0 else None
    handle = None
    try:
        if ext is not None:
            ext.enter_internal()  # type: ignore[attr-defined]
        if depth == 0 and _profiler_observing():
            from .._torch_private import record_range_enter

            handle = record_range_enter(MARKER)
        yield
    finally:
        try:
            if handle is not None:
                from .._torch_private import record_range_exit

                record_range_exit(handle)
        finally:
            if ext is not None:
                ext.exit_internal()  # type: ignore[attr-defined]
            _local.depth = depth
