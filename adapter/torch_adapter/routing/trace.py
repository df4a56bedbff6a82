"""``with torch_adapter.trace() as log:`` — how every aten op in the block was routed.

Where the data comes from:

- the session **enforces** (simulated target, fallback policies, registrations): a
  recorder (a TorchDispatchMode) counts every op with the engine's own decisions, and the
  engine adds what only it knows — bytes copied, decomposition pieces under their parent;
- otherwise, when :mod:`torch_adapter.routing.observe` is available, its C++ observer
  counts ops cheaply and each op is classified afterwards against the target's profile
  (CompositeImplicitAutograd ops such as ``aten::linear`` then show with their pieces);
- otherwise the same recorder mode, classifying with the target's profile.

Nested ``trace()`` blocks share one recorder; each block gets its own log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from typing import Any, Iterator

from .._torch_private import dispatch_mode_base
from .decide import decide_name, known_op_names
from .engine import state
from .log import RoutingLog

__all__ = ["trace", "Recorder"]


def _recorder_class() -> type:
    base = dispatch_mode_base()

    class Recorder(base):  # type: ignore[misc, valid-type]
        """Counts every op reaching the Python dispatch key into ``self.logs``."""

        def __init__(self, decide: Any, key: Any) -> None:
            super().__init__()
            self.decide = decide
            self.key = key
            self.logs: list[RoutingLog] = []
            self._decisions: dict[Any, Any] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            d = self._decisions.get(func)
            if d is None:
                d = self._decisions[func] = self.decide(func.name())
            st = state
            parent, prev, popped = st.parent, st.recorded, st.popped
            st.recorded, st.decided, st.popped = d.op, None, True
            saved, st.child_ns = st.child_ns, 0
            t0 = time.perf_counter_ns()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                dt = time.perf_counter_ns() - t0
                children, st.child_ns, st.recorded, st.popped = st.child_ns, saved + dt, prev, popped
                if st.decided is not None:  # the engine ran it another way this time
                    d, st.decided = st.decided, None
                for log in self.logs:
                    log.add_decision(d, self_time_ns=dt - children, parent=parent, find_site=True)

    return Recorder


_RECORDER: type | None = None


def Recorder(decide: Any, key: Any = None) -> Any:  # noqa: N802 - the base class loads lazily
    """A recorder mode classifying ops with ``decide(name) -> RouteDecision``; recorders
    with equal ``key`` (the engine, or the profile) are shared by nested traces."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = _recorder_class()
    return _RECORDER(decide, key)


def _observer_class() -> Any:
    if importlib.util.find_spec(f"{__package__}.observe") is None:
        return None
    from . import observe

    return getattr(observe, "OpObserver", None)


def _fill_from_observer(log: RoutingLog, result: Any, decide: Any) -> None:
    """Turn the observer's counts into log entries. Its ``calls`` count every depth, so an
    op's top-level entry gets its calls minus those made as a piece of another op; self time
    is shared between an op's entries in proportion to their calls."""
    known = known_op_names()
    calls = {k: n for k, n in result.calls.items() if k in known and n > 0}
    pieces: dict[str, dict[str, int]] = {}
    for parent, kids in result.children.items():
        if parent in known:
            for child, n in kids.items():
                if child in calls:
                    pieces.setdefault(child, {})[parent] = n
    for name, total in calls.items():
        d = decide(name)
        ns = int(result.self_time_ns.get(name, 0))
        under = pieces.get(name, {})
        top = max(total - sum(under.values()), 0)
        if top:
            log.add_decision(d, calls=top, self_time_ns=ns * top // total)
        for parent, n in under.items():
            log.add_decision(d, calls=n, self_time_ns=ns * n // total, parent=parent)


@contextlib.contextmanager
def trace(*, use_observer: bool | None = None) -> Iterator[RoutingLog]:
    """Record how each aten op in the block was routed; yields the :class:`RoutingLog`.

    >>> with torch_adapter.trace() as log:
    ...     model(x).sum().backward()
    >>> log.summary()            # {"native": ..., "composite": ..., "fallback": ...}
    >>> print(log.render())      # the table; log.to_json() for the versioned JSON

    ``use_observer``: None picks (the C++ observer when the session does not enforce
    routes and the observer module is present), False forces the recorder mode.
    """
    from ..session import current
    from ..target import resolve
    from .profiles import profile_for

    session = current()
    engine = getattr(session, "routing", None) if session is not None else None
    target = session.target if session is not None else resolve("auto")
    log = RoutingLog(target.name, bool(target.simulated))
    log.meta["started"] = time.time()
    if engine is not None:
        decide, key = engine.decide, engine
    else:
        profile = key = profile_for(target)

        def decide(name: str) -> Any:
            return decide_name(name, profile)

    t0 = time.perf_counter()
    observer_cls = _observer_class() if (engine is None and use_observer is not False) else None
    if observer_cls is not None:
        obs = observer_cls()
        obs.start()
        try:
            yield log
        finally:
            _fill_from_observer(log, obs.stop(), decide)
            log.meta["source"] = "observer"
            log.meta["duration_s"] = round(time.perf_counter() - t0, 6)
        return

    st = state
    outer = st.recorder
    recorder = outer if outer is not None and outer.key is key else Recorder(decide, key)
    recorder.logs = [*recorder.logs, log]
    if engine is not None:
        engine.add_log(log)
    log.meta["source"] = "engine" if engine is not None else "recorder"
    try:
        if recorder is outer:
            yield log
        else:
            st.recorder = recorder
            try:
                with recorder:
                    yield log
            finally:
                st.recorder = outer
    finally:
        recorder.logs = [x for x in recorder.logs if x is not log]
        if engine is not None:
            engine.remove_log(log)
        log.meta["duration_s"] = round(time.perf_counter() - t0, 6)
