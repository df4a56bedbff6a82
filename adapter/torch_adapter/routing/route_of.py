"""The route of an op on the installed target, for the tools (profiler, debug, export).

One place decides how the tools classify an op, so that a profile, a NaN report and an
export agree with ``trace()``: the session's routing engine when it enforces routes (its
registry and policy included), else the target's capability profile; with no session,
this machine's target.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["decider"]


def decider() -> tuple[Callable[[str], Any], Any, dict[str, Any]]:
    """``(decide, engine, meta)``: ``decide("aten::log")`` -> RouteDecision, or None for a name
    the dispatcher does not know; the session's engine or None; target metadata (JSON-able)."""
    from .choose import decide_name
    from .names import is_known_op
    from .profiles import profile_for
    from ..core.state import current
    from .target import resolve

    session = current()
    engine = getattr(session, "routing", None) if session is not None else None
    target = session.target if session is not None else resolve("auto")
    cache: dict[str, Any] = {}
    if engine is not None:
        base: Callable[[str], Any] = engine.decide
    else:
        profile = profile_for(target)

        def base(name: str) -> Any:
            return decide_name(name, profile)

    def decide(name: str) -> Any:
        if name not in cache:
            cache[name] = base(name) if is_known_op(name) else None
        return cache[name]

    meta = {"target": target.name, "simulated": bool(target.simulated), "device": target.device_type,
            "routing_source": "engine" if engine is not None else "profile"}
    return decide, engine, meta
