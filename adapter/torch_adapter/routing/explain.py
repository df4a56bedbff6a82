"""``torch_adapter.explain(op, target=None)``: one op's route on a target, and why, without running
anything — the pure decision (:mod:`.decide`) for the profile, registry and policy the
named target (or the installed session) has."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError, format_error
from .choose import decide_name
from .decide import RouteDecision
from .names import op_name

__all__ = ["explain", "profile_of"]


def profile_of(target: Any) -> tuple[Any, Any, Any]:
    """(profile, registry, policy) for explain()'s ``target`` argument."""
    from ..core.state import current
    from .target import Target, _detect_one, KNOWN
    from . import profiles

    session = current()
    if target is None:
        if session is not None:
            target = session.target
        else:
            from .target import resolve

            target = resolve("auto")
    if isinstance(target, profiles.CapabilityProfile):
        profile = target
    elif isinstance(target, Target):
        profile = profiles.profile_for(target)
    elif isinstance(target, str):
        key = target.strip().lower()
        if session is not None and key == session.target.name:
            profile = profiles.profile_for(session.target)
        elif key in KNOWN and _detect_one(key).present:
            real = _detect_one(key)
            profile = profiles.live_profile(real.name, real.dispatch_key)
        else:
            profile = profiles.load_profile(target)
    else:
        raise UsageError(format_error(
            "torch_adapter.explain(op, target=...)", 'a target name ("mps"), a Target or a CapabilityProfile',
            f"{target!r} ({type(target).__name__})", fix='e.g. explain("aten::nonzero", target="mps")'))
    if session is not None and session.target.name == profile.name:
        from .policy import policy_of
        from .registry import registry_of

        reg = registry_of(session, create=False)
        return profile, (reg.snapshot() if reg is not None else None), policy_of(session)
    return profile, None, None


def explain(op: Any, target: Any = None) -> RouteDecision:
    """How ``op`` is routed on ``target``, and why — without running anything.

    ``op``: ``"aten::nonzero"``, ``"aten::add.Tensor"``, ``"nonzero"`` or an OpOverload.
    ``target``: a name (``"mps"`` previews the built-in profile unless an MPS device is
    present), a ``.toml`` profile, a Target or a CapabilityProfile; by default the
    installed target, or this machine's.

    >>> torch_adapter.explain("aten::_linalg_eigh", target="mps").route
    <Route.FALLBACK: 'fallback'>
    """
    name = op_name(op)
    profile, registry, policy = profile_of(target)
    return decide_name(name, profile, registry, policy)
