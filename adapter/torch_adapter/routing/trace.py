"""``with torch_adapter.trace() as log:`` — how every aten op in the block was routed.

Where the data comes from:

- when :mod:`torch_adapter.routing.observe` is available, its observer (a C++
  RecordFunction callback) counts every op cheaply and each op is classified afterwards
  with the session's decisions; CompositeImplicitAutograd ops such as ``aten::linear``
  show as composite with their pieces under them. When the session **enforces** routes
  (simulated target, policies, registrations), the engine's own records replace the
  observer's for the ops it executed: their real route (a declined decomposition is a
  fallback), bytes copied and first call site; the copies a fallback makes are not listed
  as its pieces;
- otherwise (or with ``use_observer=False``) a recorder — a TorchDispatchMode — counts
  every op below autograd with the same decisions, with call sites for every op.

Nested ``trace()`` blocks each get their own log (recorders are shared between them).

What ``torch.compile`` compiled in the block — graphs, graph breaks with their lines, recompiles,
the compiled functions — is ``log.compiled()`` (from dynamo's own counters and records, read as the
block opens and closes: :mod:`.compiled`); ops inside compiled code are not counted per op, and the
ops dynamo runs while compiling (on fake tensors) are not counted at all.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import warnings
from typing import Any, Callable, Iterator

from ..core.torch_private import dispatch_mode_base, op_classes
from .choose import decide_name
from .compiled import close_span as close_compile_span, open_span as open_compile_span
from .dispatch_state import state
from .names import is_known_op
from .internal import active as internal_active
from .log import RoutingLog

__all__ = ["trace", "Recorder", "active_logs"]


def _recorder_class() -> type:
    base = dispatch_mode_base()
    op_overload, higher_order = op_classes()

    class Recorder(base):  # type: ignore[misc, valid-type]
        """Counts every op reaching the Python dispatch key into ``self.logs``."""

        def __init__(self, decide: Any, key: Any) -> None:
            super().__init__()
            self.decide = decide
            self.key = key
            self.logs: list[RoutingLog] = []
            self._decisions: dict[Any, Any] = {}
            self.retired = False  # a followed thread's, after its trace() ended: leaves the thread's stack

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # torch.compile compiles under it (the mode is off while compiling, on for the compiled code's
            # run): without this dynamo skipped every frame under `torch-adapter run --report` ("non-infra
            # torch dispatch mode present"), so torch.compile(fullgraph=True) raised (gpt-fast --compile,
            # extension-cpp's compile test) and a plain torch.compile ran eager: the report changed the run
            return True

        # Higher-order operators (flex_attention, cond, while_loop...) reach __torch_dispatch__ too: without
        # this torch refused them under observation ("no rule registered for HigherOrderOperator
        # flex_attention and mode Recorder") — `run --report` broke a program that runs without it. One
        # runs as it would unobserved (the mode is off while it runs, so its inner ops are not counted).
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if type(func) is not op_overload and isinstance(func, higher_order):
                return func(*args, **(kwargs or {}))
            if not self.logs or internal_active():  # no block listening (a followed thread that outlived
                if self.retired:                      # its trace()), or torch_adapter's own work: not recorded
                    self._leave_soon()
                return func(*args, **(kwargs or {}))
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

        def _leave_soon(self) -> None:
            """Off this thread's mode stack at its next Python event where the recorder is on top (inside
            its own dispatch torch holds it off the stack). A mode stack is the thread's own: the block that
            followed the thread cannot pop it there, so a pool thread kept a recorder — every op through
            Python — for the rest of its life."""
            import sys

            from torch.utils._python_dispatch import _get_current_dispatch_mode

            self.retired = False  # once: the profile function below does it
            previous = sys.getprofile()

            def leave(frame: Any, event: str, arg: Any) -> None:
                if _get_current_dispatch_mode() is self:
                    sys.setprofile(previous)
                    try:
                        self.__exit__(None, None, None)
                    except Exception as exc:  # never the user's thread's error: the recorder only passes ops on
                        print(f"torch_adapter: a finished trace()'s recorder could not leave its thread "
                              f"({type(exc).__name__}: {exc}); it passes the thread's ops through", file=sys.stderr)
                    if getattr(state, "recorder", None) is self:
                        state.recorder = None

            sys.setprofile(leave)

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


_ACTIVE: list[RoutingLog] = []  # logs of the trace() blocks now open (optimize.register adds to them)
# told len(_ACTIVE) each time a trace() block opens or closes: the C++ float16 gate notes its rewritten
# calls only while one is open (routing/low_precision.py)
LISTENERS: list[Callable[[int], Any]] = []


def _announce() -> None:
    for listener in list(LISTENERS):
        try:
            listener(len(_ACTIVE))
        except Exception as exc:  # an observer's failure reports itself; the block goes on
            warnings.warn(f"torch_adapter.trace: a listener failed: {type(exc).__name__}: {exc}", RuntimeWarning,
                          stacklevel=3)


def active_logs() -> list[RoutingLog]:
    """The logs of the ``trace()`` blocks now open (a copy)."""
    return list(_ACTIVE)


class _KnownOps:
    """``in`` answers :func:`~.decide.is_known_op`, memoised for one fill (names repeat)."""

    def __init__(self) -> None:
        self._memo: dict[str, bool] = {}

    def __contains__(self, name: str) -> bool:
        hit = self._memo.get(name)
        if hit is None:
            hit = self._memo[name] = is_known_op(name)
        return hit


def _fill_from_observer(log: RoutingLog, result: Any, decide: Any, engine_log: RoutingLog | None) -> None:
    """Turn the observer's counts into log entries. Its ``calls`` count every depth, so an
    op's top-level entry gets its calls minus those made as a piece of another op; self time
    is shared between an op's entries in proportion to their calls. Ops the engine executed
    come from ``engine_log`` instead (placed under the parents the observer saw)."""
    from .rules import ENGINE_OPS

    known = _KnownOps()
    engine_recs = list(engine_log.entries.values()) if engine_log is not None else []
    executed = {r.op for r in engine_recs}
    copies_of = {r.op for r in engine_recs if r.route == "fallback" and r.via == "cpu"}
    calls = {k: n for k, n in result.calls.items() if k in known and n > 0}
    pieces: dict[str, dict[str, int]] = {}
    for parent, kids in result.children.items():
        if parent in known:
            for child, n in kids.items():
                if child in calls and not (parent in copies_of and child in ENGINE_OPS):
                    pieces.setdefault(child, {})[parent] = n  # (a fallback's copies are its bytes)
    rewritten: dict[str, int] = {}  # calls routing/low_precision.py logged itself: not native as well
    for rec in list(log.entries.values()):
        if rec.via == "low_precision":
            rewritten[rec.op] = rewritten.get(rec.op, 0) + rec.calls
    for name, total in calls.items():
        if name in executed:
            continue
        d = decide(name)
        ns = int(result.self_time_ns.get(name, 0))
        under = dict(pieces.get(name, {}))
        top = max(total - sum(under.values()), 0)
        left = rewritten.get(name, 0)
        top, left = top - min(top, left), left - min(top, left)
        for parent in sorted(under):
            n = min(under[parent], left)
            under[parent], left = under[parent] - n, left - n
        if top:
            log.add_decision(d, calls=top, self_time_ns=ns * top // total)
        for parent, n in under.items():
            if n:
                log.add_decision(d, calls=n, self_time_ns=ns * n // total, parent=parent)
    for rec in sorted(engine_recs, key=lambda r: r.parent is None):  # known parents first
        _add_engine_record(log, rec, pieces.get(rec.op, {}))


def _add_engine_record(log: RoutingLog, rec: Any, observed: dict[str, int]) -> None:
    """Add an engine record; the calls it made at top level (as far as the engine knew) go
    under the parents the observer saw them called from (CompositeImplicit ops), if any."""
    if rec.parent is not None:
        observed[rec.parent] = max(observed.get(rec.parent, 0) - rec.calls, 0)
        shares = [(rec.parent, rec.calls)]
    else:
        shares, left = [], rec.calls
        for parent in sorted(observed):
            n = min(observed[parent], left)
            if n > 0:
                observed[parent] -= n
                left -= n
                shares.append((parent, n))
        if left or not shares:
            shares.append((None, left))
    done = 0
    for parent, n in shares:  # split time and bytes exactly, in proportion to calls
        lo, hi = done, done + n
        done = hi

        def part(total: int) -> int:
            return total * hi // rec.calls - total * lo // rec.calls if rec.calls else total

        log.add(rec.op, rec.route, calls=n, self_time_ns=part(rec.self_time_ns), bytes_to_cpu=part(rec.bytes_to_cpu),
                bytes_from_cpu=part(rec.bytes_from_cpu), reason=rec.reason, via=rec.via, site=rec.site, parent=parent)


@contextlib.contextmanager
def trace(*, use_observer: bool | None = None, threads: bool | None = None) -> Iterator[RoutingLog]:
    """Record how each aten op in the block was routed; yields the :class:`RoutingLog`.

    >>> with torch_adapter.trace() as log:
    ...     model(x).sum().backward()
    >>> log.summary()            # {"native": ..., "composite": ..., "fallback": ...}
    >>> print(log.render())      # the table; log.to_json() for the versioned JSON
    >>> log.compiled()           # what torch.compile compiled in the block, or None

    ``use_observer``: None uses the observer when it is available, False forces the
    recorder mode (slower; call sites for every op, not only for the engine's).
    ``threads`` (recorder mode; default: on) also records the threads started inside the block
    (the recorder is a per-thread dispatch mode; ``torch-adapter run --report`` uses it); a thread
    that outlives the block records nothing more. The observer sees every thread anyway.
    """
    from ..core.state import current
    from .target import resolve
    from .profiles import profile_for

    session = current()
    engine = getattr(session, "routing", None) if session is not None else None
    target = session.target if session is not None else resolve("auto")
    log = RoutingLog(target.name, bool(target.simulated), bool(getattr(target, "emulated", False)))
    log.meta["started"] = time.time()
    if engine is not None:
        decide, key = engine.decide, engine
    else:
        profile = key = profile_for(target)

        def decide(name: str) -> Any:
            return decide_name(name, profile)

    t0 = time.perf_counter()
    meter = device_meter(target)
    metered = meter() if meter is not None else None
    _ACTIVE.append(log)
    _announce()
    compiles = open_compile_span()  # what torch.compile compiles in the block (routing/compiled.py)
    try:
        obs = _start_observer() if use_observer is not False else None
        if obs is not None:
            engine_log = RoutingLog(log.target, log.simulated, log.emulated) if engine is not None else None
            if engine is not None:
                engine.add_log(engine_log)
            try:
                yield log
            finally:
                result = obs.stop()
                if engine is not None:
                    engine.remove_log(engine_log)
                _fill_from_observer(log, result, decide, engine_log)
                if engine_log is not None:
                    log.merge_dtypes(engine_log)
                log.meta.update(source=f"observer:{result.backend}" + ("+engine" if engine is not None else ""),
                                duration_s=round(time.perf_counter() - t0, 6))
        else:
            with _recording(log, engine, decide, key), (_following_threads(log, engine, decide, key)
                                                        if threads is not False else contextlib.nullcontext()):
                yield log
    finally:
        log.compile_facts = close_compile_span(compiles)
        _ACTIVE[:] = [x for x in _ACTIVE if x is not log]
        _announce()
        if meter is not None and metered is not None:
            add_device_fallbacks(log, metered, meter(), decide)
        log.meta.setdefault("duration_s", round(time.perf_counter() - t0, 6))


def device_meter(target: Any) -> Any:
    """The target device's own fallback counters, where its backend keeps them: a callable returning
    ``{op: (calls, ns, bytes to the host, bytes back)}`` (the emulated device), else None."""
    if getattr(target, "emulated", False):
        from .. import emulated

        return emulated.fallback_counts
    return None


def add_device_fallbacks(log: RoutingLog, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]],
                         decide: Any) -> None:
    """The device's own fallbacks in the block, measured by the device: each op's fallback record (as the
    observer counted its calls) gets the copies' bytes and the time, or is added if nothing counted it."""
    for op, now in after.items():
        was = before.get(op, (0, 0, 0, 0))
        calls, ns, to_host, back = (a - b for a, b in zip(now, was))
        if calls <= 0:
            continue
        # (an op the engine runs never reaches the device's fallback: no call is counted twice)
        recs = [r for r in log.entries.values() if r.op == op and r.route == "fallback"]
        if not recs:
            d = decide(op)
            log.add(op, "fallback", calls=calls, self_time_ns=ns, bytes_to_cpu=to_host, bytes_from_cpu=back,
                    reason=d.reason if getattr(d, "route", None) is not None and d.route.value == "fallback"
                    else "the device's own fallback ran it on the CPU (inputs copied there, results back)",
                    via="device")
            continue
        total = sum(r.calls for r in recs) or 1
        with log._lock:
            done = 0
            for r in recs:  # split in proportion to the calls each record holds
                lo, hi = done, done + r.calls
                done = hi
                r.bytes_to_cpu += to_host * hi // total - to_host * lo // total
                r.bytes_from_cpu += back * hi // total - back * lo // total
                r.self_time_ns = max(r.self_time_ns, ns * hi // total - ns * lo // total)


def _start_observer() -> Any:
    """A started OpObserver, or None when the module or every backend is unavailable."""
    observer_cls = _observer_class()
    if observer_cls is None:
        return None
    obs = observer_cls()
    obs.start()
    if obs.backend in (None, "none"):  # e.g. another profiler holds the profiler backend
        obs.stop()
        return None
    return obs


@contextlib.contextmanager
def _following_threads(log: RoutingLog, engine: Any, decide: Any, key: Any) -> Iterator[None]:
    """Threads started in the block enter a recorder for ``log`` first thing (a profile function,
    ``threading.setprofile``, runs in each new thread before its target and removes itself)."""
    import sys
    import threading

    previous = threading.getprofile()
    open_ = [True]
    followed: list[Any] = []

    def start(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(previous)
        if not open_[0]:
            return
        try:
            recorder = Recorder(decide, key)
            recorder.logs = [log]
            state.recorder = recorder
            recorder.__enter__()  # the thread's dispatch-mode stack ends with the thread
            followed.append(recorder)
        except Exception as exc:  # instrumentation never breaks the user's thread: it reports itself
            print(f"torch_adapter: trace() could not follow thread {threading.current_thread().name!r} "
                  f"({type(exc).__name__}: {exc}); its ops are not in this report", file=sys.stderr)

    threading.setprofile(start)
    try:
        yield
    finally:
        open_[0] = False
        threading.setprofile(previous)
        for recorder in followed:  # a thread that outlives the block (a pool) records no more into it,
            recorder.logs = []     # and its recorder leaves that thread's stack at its next op
            recorder.retired = True


@contextlib.contextmanager
def _recording(log: RoutingLog, engine: Any, decide: Any, key: Any) -> Iterator[None]:
    st = state
    outer = st.recorder
    recorder = outer if outer is not None and outer.key is key else Recorder(decide, key)
    recorder.logs = [*recorder.logs, log]
    if engine is not None:
        engine.add_log(log)
    log.meta["source"] = "recorder+engine" if engine is not None else "recorder"
    try:
        if recorder is outer:
            yield
        else:
            st.recorder = recorder
            try:
                with recorder:
                    yield
            finally:
                st.recorder = outer
    finally:
        recorder.logs = [x for x in recorder.logs if x is not log]
        if engine is not None:
            engine.remove_log(log)
