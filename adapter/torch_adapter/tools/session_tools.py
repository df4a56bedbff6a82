"""What a session's tool options switch on and off: the memory server and ``debug_mode``.

Called by the session at ``install()`` (``old`` is None) and after each ``configure()``.
Whatever it starts is stopped by the session's closers at ``uninstall()``. A tool that
cannot start (no private directory for the memory socket, say) warns with a
:class:`~torch_adapter.tools.tool_mode.ToolWarning` and the session installs without it: a
diagnostic must not keep the user's program from running.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["apply"]


def _state(session: Any) -> dict[str, Any]:
    state = getattr(session, "tools", None)
    if state is None:
        state = session.tools = {"memory_server": None}
        session.closers.append(lambda: _stop_server(state))
        # a suspended session's debug checks come off (the inner session has its own); the
        # memory server keeps serving: it reports the process, whichever session is active
        session.suspenders.append((lambda: _debug(session, False, session.config.debug_mode),
                                   lambda: _debug(session, session.config.debug_mode, False)))
    return state


def _stop_server(state: dict[str, Any]) -> None:
    stop, state["memory_server"] = state.get("memory_server"), None
    if stop is not None:
        stop()


def _debug(session: Any, new: Any, old: Any) -> None:
    from . import debug

    if old not in (False, None):
        debug.disable_nan_check()
        debug.disable_cpu_compare()
    if new in (False, None):
        return
    debug.enable_nan_check("warn" if new == "warn" else "raise")
    if new == "compare":
        debug.enable_cpu_compare()
    debug._close_with_session(session)


def apply(session: Any, old: Any) -> None:
    """Bring the tools in line with ``session.config`` (``old``: the config before, or None)."""
    from .tool_mode import ToolWarning

    cfg = session.config
    state = _state(session)
    if cfg.memory_server and state["memory_server"] is None:
        from . import memory_server as _memory_server

        try:
            state["memory_server"] = _memory_server.start()
        except OSError as exc:
            warnings.warn(f"torch_adapter: the memory server could not start ({exc}); `torch-adapter memory --pid` "
                          f"will not reach this process", ToolWarning, stacklevel=4)
    elif not cfg.memory_server:
        _stop_server(state)
    before = old.debug_mode if old is not None else False
    if cfg.debug_mode != before or type(cfg.debug_mode) is not type(before):
        _debug(session, cfg.debug_mode, before)
