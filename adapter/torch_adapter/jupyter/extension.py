"""``%load_ext torch_adapter``: install the adapter in the kernel and observe every cell.

Loading installs the adapter (target ``auto``, or what ``%adapter target`` chose) and
registers ``pre_run_cell``/``post_run_cell`` callbacks. Each cell runs inside a routing
trace; after a cell that ran aten ops the kernel publishes the cell's payload
(:mod:`.schema`) as a display bundle and as a comm message, and hands it to listeners
(the live inspector). After every cell whose end finds the target, policy, observation
or loading changed (``%adapter``, ``configure()``, ``%load_ext``), it sends the status too,
so a front end shows the kernel's state, never an older payload's; ``%unload_ext`` sends a
status saying the extension is not loaded, unregisters every callback and uninstalls.
Instrumentation never breaks the user's cell: an observer that fails prints what failed
and the cell goes on.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from typing import Any, Callable, Iterator

from . import schema

__all__ = ["CellRouter", "load_ipython_extension", "unload_ipython_extension", "router", "front_end_state"]

_ROUTER: "CellRouter | None" = None

# The cells the kernel keeps (payloads and op tables, for a reloaded page and a new inspector): the
# newest this many. Before, both grew for the life of the kernel and a Lab refresh was sent all of it.
KEEP_CELLS = 500


def router() -> "CellRouter | None":
    """The loaded extension's CellRouter (None when not loaded)."""
    return _ROUTER


def front_end_state() -> dict[str, Any]:
    """What a front end needs to rebuild its view after a reload (asked for silently by the
    Lab extension): ``{"status": <%adapter status>, "payloads": [...]}`` — each cell's latest payload
    (a cell run again is one badge, and each payload carries the session's totals), of the newest
    ``KEEP_CELLS`` kept. When the extension is not loaded the status says so (``"loaded": false``),
    with no payloads."""
    if _ROUTER is None:
        return {"status": dict(_unloaded_status()), "payloads": []}
    latest: dict[Any, dict[str, Any]] = {}
    for i, payload in enumerate(_ROUTER.payloads):
        cell = payload.get("cell_id")
        latest.pop(cell if cell is not None else ("run", i), None)
        latest[cell if cell is not None else ("run", i)] = payload  # re-inserted: in the order last run
    return {"status": dict(_ROUTER.status()), "payloads": list(latest.values())}


def _unloaded_status() -> Any:
    from ..core.state import current

    return schema.build_status(current(), observing=False, totals={}, loaded=False)


class CellRouter:
    """Per-cell tracing, publishing and the session totals for one IPython shell."""

    def __init__(self, shell: Any, target: str = "auto", simulate: bool = False) -> None:
        from ..routing.log import RoutingLog

        self.shell = shell
        self.target = target
        self.simulate = simulate
        self.emulate = False
        self.session_log = RoutingLog()
        self.cells = 0
        # One id per %load_ext: the front end counts only this session's payloads in its totals (after
        # %unload_ext + %load_ext in one kernel, the old session's outputs are still on screen).
        import uuid

        self.session_id = uuid.uuid4().hex[:12]
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.on_unload: list[Callable[[], None]] = []  # called by %unload_ext (the inspector closes its controls)
        from collections import deque

        self.payloads: deque[dict[str, Any]] = deque(maxlen=KEEP_CELLS)
        self.tables: deque[list[dict[str, Any]]] = deque(maxlen=KEEP_CELLS)  # each kept cell's op rows (the inspector's)
        self.observing = True
        self.publish_display = True
        self.publish_comm = True
        self.last_log: Any = None
        self._tracer: Any = None
        self._log: Any = None
        self._t0 = 0.0
        self.failures = 0
        self._sent: tuple[Any, ...] | None = None  # the state the last status message told
        from .forked_ranks import ForkedRanks

        self.forked = ForkedRanks(self)  # the ranks a cell forks (notebook_launcher): one job report under it

    # -- lifecycle --------------------------------------------------------------------
    def install(self) -> Any:
        from ..session import install

        with self.unobserved():  # the ops installing runs (target probes) are not the cell's
            session = install(self.target, simulate=self.simulate, emulate=self.emulate)
        from ..launch.ray_train import patch_on_import

        patch_on_import(session.patcher)  # a Ray client cell: ray.init / TorchTrainer, once it imports Ray
        self.session_log.target = session.target.name
        self.session_log.simulated = session.target.simulated
        self.session_log.emulated = session.target.emulated
        return session

    @contextlib.contextmanager
    def unobserved(self) -> Iterator[None]:
        """Pause the running cell's trace (if any); afterwards a new trace, on the session
        then current, goes on with what the cell had recorded before."""
        if self._tracer is None:
            yield
            return
        before = self._stop()
        try:
            yield
        finally:
            try:
                from ..routing.trace import trace

                self._tracer = trace()
                self._log = self._tracer.__enter__()
                if before is not None:
                    self._log.merge(before)
            except Exception as exc:
                self._tracer = None
                self._report("restarting the per-cell routing trace", exc)

    def register(self) -> None:
        events = self.shell.events
        events.register("pre_run_cell", self.pre_run_cell)
        events.register("post_run_cell", self.post_run_cell)

    def unregister(self) -> None:
        events = self.shell.events
        for name, cb in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                events.unregister(name, cb)
            except ValueError:
                pass
        self._stop()
        self.forked.close()

    # -- the observer ------------------------------------------------------------------
    def _report(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        print(f"torch_adapter: {what} failed; the cell itself is unaffected "
              f"({type(exc).__name__}: {exc}). Details:\n"
              + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
              file=sys.stderr)

    def _stop(self) -> Any:
        tracer, self._tracer = self._tracer, None
        if tracer is not None:
            tracer.__exit__(None, None, None)
        return self._log

    def pre_run_cell(self, info: Any = None) -> None:
        try:
            self._stop()
            self._log = None
            if not self.observing:
                return
            from ..routing.trace import trace

            self._tracer = trace()
            self._log = self._tracer.__enter__()
            self._t0 = time.perf_counter()
            self.forked.cell_started()
        except Exception as exc:
            self._tracer = None
            self._report("starting the per-cell routing trace", exc)

    def post_run_cell(self, result: Any = None) -> None:
        try:
            self._summarise(result)
            self._show_forked_ranks()
        finally:
            self.status_if_changed()

    def _show_forked_ranks(self) -> None:
        try:
            job = self.forked.cell_ended()
            if job is not None and self.publish_display:
                from .forked_ranks import show

                show(job)
        except Exception as exc:
            self._report("reporting the ranks the cell launched", exc)

    def _summarise(self, result: Any) -> None:
        try:
            wall_ms = (time.perf_counter() - self._t0) * 1e3
            log = self._stop()
            if log is None or (sum(log.summary().values()) == 0 and not log.compiled()):
                return  # a cell that ran no aten op and compiled nothing publishes nothing
            self.last_log = log
            self.cells += 1
            self.session_log.merge(log)
            info = getattr(result, "info", None)
            cell_id = getattr(info, "cell_id", None)
            count = getattr(result, "execution_count", None)
            from ..session import current

            session = current()
            policy = session.config.fallback if session is not None else "allow"
            payload = schema.build_payload(log, cell_id=cell_id, execution_count=count, policy=policy,
                                           wall_ms=wall_ms, session_totals=self.totals(),
                                           session_id=self.session_id)
            self.payloads.append(payload)
            self.tables.append(log.table())
        except Exception as exc:
            self._report("summarising the cell's routing", exc)
            return
        self.publish(payload)

    def totals(self) -> dict[str, int]:
        return {"cells": self.cells, **self.session_log.summary()}

    def status(self) -> dict[str, Any]:
        """``%adapter`` status as data (see :func:`.schema.build_status`)."""
        from ..session import current

        return schema.build_status(current(), observing=self.observing, totals=self.totals(),
                                   session_id=self.session_id)

    def publish_status(self) -> None:
        """Tell the front end that the target, policy or observation changed (a comm message
        with the status; no display): its panel follows the session's current target."""
        if not self.publish_comm:
            return
        try:
            status = self.status()
            self._sent = _state_key(status)
            send_status(status)
        except Exception as exc:
            self._report("sending the status comm message", exc)

    def status_if_changed(self) -> None:
        """:meth:`publish_status` when the state differs from what the last status said (after
        every cell: a ``configure()`` call in the code changes the policy too)."""
        try:
            changed = _state_key(self.status()) != self._sent
        except Exception as exc:
            self._report("reading the adapter's status", exc)
            return
        if changed:
            self.publish_status()

    def publish(self, payload: dict[str, Any]) -> None:
        if self.publish_display:
            try:
                from IPython.display import display

                display(schema.bundle(payload), raw=True)
            except Exception as exc:
                self._report("publishing the routing display", exc)
        if self.publish_comm:
            try:
                from comm import create_comm

                c = create_comm(target_name=schema.COMM_TARGET, data=payload)
                c.close()
            except Exception as exc:
                self._report("sending the routing comm message", exc)
        for listener in list(self.listeners):
            try:
                listener(payload)
            except Exception as exc:
                self._report(f"the listener {getattr(listener, '__qualname__', listener)!r}", exc)


def _state_key(status: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(status.get(k) for k in ("target", "simulated", "emulated", "policy", "observing", "loaded"))


def send_status(status: dict[str, Any]) -> None:
    """One comm message with ``status`` (opened with it as data, then closed)."""
    from comm import create_comm

    create_comm(target_name=schema.COMM_TARGET, data=dict(status)).close()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext torch_adapter``: install the adapter and observe every cell (loading twice is safe)."""
    global _ROUTER
    from . import user_view
    from .magics import AdapterMagics

    if _ROUTER is not None and _ROUTER.shell is ipython:
        return
    if _ROUTER is not None:
        unload_ipython_extension(_ROUTER.shell)
    cell_router = CellRouter(ipython)
    cell_router.install()
    cell_router.register()
    ipython.register_magics(AdapterMagics(ipython, cell_router))
    user_view.install(ipython)  # tracebacks without the adapter's frames; warnings name cells
    _ROUTER = cell_router


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext torch_adapter``: unregister every callback and magic; restore torch."""
    global _ROUTER
    from . import user_view
    from ..session import uninstall

    cell_router, _ROUTER = _ROUTER, None
    if cell_router is not None:
        cell_router.unregister()
        for hook in list(cell_router.on_unload):  # the inspector's controls say they are gone (no widget view)
            try:
                hook()
            except Exception as exc:
                cell_router._report(f"the unload hook {getattr(hook, '__qualname__', hook)!r}", exc)
        cell_router.on_unload.clear()
        cell_router.listeners.clear()  # the inspectors it fed keep what they show and follow nothing
        magics = ipython.magics_manager.registry.pop("AdapterMagics", None)
        if magics is not None:
            for kind in ("line", "cell"):
                for name in magics.magics.get(kind, {}):
                    ipython.magics_manager.magics[kind].pop(name, None)
        user_view.uninstall()
    uninstall()
    if cell_router is not None and cell_router.publish_comm:
        try:  # the front end's panel says "not loaded" from now on
            send_status(_unloaded_status())
        except Exception as exc:
            cell_router._report("sending the status comm message", exc)
