"""The routes the engine takes: the pure decision (:func:`.decide.decide`) completed with what
the self-decomposition probe (:mod:`.self_decomp`) finds, cached per (op, profile, registry,
policy). Every reader of routes — the engine, ``trace()``, ``explain()``, the listings — asks here,
so what is explained is what runs."""

from __future__ import annotations

import functools
from typing import Any

from . import names, self_decomp
from .decide import RouteDecision, decide

__all__ = ["decide_name", "choose_route", "clear_caches"]


@functools.lru_cache(maxsize=1 << 16)
def decide_name(name: str, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The route of the op called ``name`` on ``profile`` (see :func:`.self_decomp.decided`)."""
    return self_decomp.decided(name, profile, registry, policy)


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
