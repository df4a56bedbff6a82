"""The routes the engine takes: the pure decision (:func:`.decide.decide`) completed with what
the self-decomposition probe (:mod:`.self_decomp`) finds, cached per (op, profile, registry,
policy). Every reader of routes — the engine, ``trace()``, ``explain()``, the listings — asks here,
so what is explained is what runs. Without a registry or ``force_cpu`` the routes come from the
on-disk start-up cache when it has them (:mod:`.route_cache`); :func:`remember` writes them."""

from __future__ import annotations

import functools
from typing import Any

from . import names, route_cache, self_decomp
from .decide import RouteDecision, decide

__all__ = ["decide_name", "choose_route", "clear_caches", "remember"]


def _neutral(registry: Any, policy: Any) -> bool:
    """Do ``registry`` and ``policy`` leave every route as it is without them? (decide() reads
    only the registry's two sets and the policy's force_cpu, deny and fallback="error".)"""
    return (registry is None or not (registry.accelerated or registry.fallback)) and \
        (policy is None or not (policy.force_cpu or policy.deny or policy.deny_codes or policy.fallback == "error"))


@functools.lru_cache(maxsize=1 << 16)
def decide_name(name: str, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The route of the op called ``name`` on ``profile`` (see :func:`.self_decomp.decided`)."""
    if _neutral(registry, policy):
        stored = route_cache.route(name, profile)
        if stored is not None:
            return stored
    return self_decomp.decided(name, profile, registry, policy)


def remember(profile: Any, ops: Any, registry: Any = None, policy: Any = None) -> None:
    """Store the routes of ``ops`` (the whole op table) on ``profile`` in the start-up cache, and
    the probe's answers, once they are decided; nothing when stored already or not neutral."""
    if not _neutral(registry, policy) or route_cache.has_routes(profile):
        return
    routes = {n: decide_name(n, profile, registry, policy) for n in ops}  # decided already: cache hits
    probes = {n: self_decomp.calls_itself(n, profile) for n in ops
              if decide(n, profile, registry, policy).via == "torch._decomp"}  # decided and probed already
    route_cache.save(profile, routes, probes)


def choose_route(op: Any, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The RouteDecision of ``op`` (OpOverload or name) on ``profile``. Cached.

    ``registry`` may be a live :class:`~torch_adapter.routing.registry.Registry` (its
    current snapshot is used) or a snapshot.
    """
    name = op.name() if hasattr(op, "_schema") else names.op_name(op, call="choose_route()")
    snapshot = registry.snapshot() if hasattr(registry, "snapshot") else registry
    return decide_name(name, profile, snapshot, policy)


def clear_caches() -> None:
    """Forget cached decisions and op names (after registering new custom ops)."""
    decide_name.cache_clear()
    decide.cache_clear()
    names.forget()
