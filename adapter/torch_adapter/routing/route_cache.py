"""Routing's start-up data on disk (:mod:`..core.disk_cache`): built-in profiles and routes.

A fresh interpreter that installs a simulated target would otherwise rebuild the profile from
``native_functions.yaml`` (and the vendor table), decide every op of the table and run the
self-decomposition probe (which imports ``torch._dynamo`` through the decompositions it runs)
— about 2 s on every ``run --simulate``, ``%adapter target … --simulate`` and launcher rank.
All of it is pure data of (torch's version and build, the yaml, the adapter's version and code,
the profile's content), so it is stored once and read back:

- ``profile-*``: a built-in profile's fields (:func:`cached_profile`, the hook of
  ``profiles._builtin``);
- ``routes-*``: for one profile's content, the route of every op of the table with no registry
  and no ``force_cpu`` (what :func:`.choose.decide_name` answers then) and the probe's answer for
  every op it probed (what :func:`.self_decomp.calls_itself` answers) — written once the engine
  or a listing has decided them all (:func:`save`), read at the first route asked (:func:`route`).

A route with a registry or ``force_cpu`` is still decided live (from the cached probe answers).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import threading
import weakref
from typing import Any, Callable

from ..core import disk_cache
from .decide import Route, RouteDecision

__all__ = ["UNKNOWN", "base_key", "cached_profile", "content_digest", "route", "probe", "save", "has_routes"]

UNKNOWN = object()  # probe(): the cache has no answer
_lock = threading.RLock()
_entries: "weakref.WeakKeyDictionary[Any, _Entry]" = weakref.WeakKeyDictionary()
_digests: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class _Entry:
    routes: dict[str, list[Any]] | None  # op -> [decided op or None, route, reason, via]
    probes: dict[str, bool | None]
    saved: bool  # on disk (read from it, or written) — or the cache is off: nothing more to write
    made: dict[str, RouteDecision] = dataclasses.field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def base_key() -> dict[str, Any]:
    """What every routing entry depends on besides its own content."""
    import torch

    from .._version import __version__
    from . import ops_table

    return {"torch": str(torch.__version__), "git": str(getattr(torch.version, "git_version", "")),
            "yaml": disk_cache.file_digest(ops_table.yaml_path()), "adapter": __version__,
            "code": disk_cache.code_digest("routing", "core")}


def _fields(profile: Any) -> dict[str, Any]:
    """A profile's fields as data (a field that is itself a dataclass — the dtype capabilities —
    as its fields, so that it takes part in the digest)."""
    return {f.name: _data(getattr(profile, f.name)) for f in dataclasses.fields(profile)}


def _data(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _data(v) for k, v in value.items()}
    return value


def content_digest(profile: Any) -> str | None:
    """SHA-256 of a profile's fields (None when a field cannot be stored as data)."""
    with _lock:
        known = _digests.get(profile)
        if known is not None:
            return known
    try:
        data = disk_cache.encode(_fields(profile))
    except TypeError:
        return None
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with _lock:
        _digests[profile] = digest
    return digest


def cached_profile(name: str, build: Callable[[str], Any], cls: type) -> Any:
    """The built-in profile ``name``: read from the cache, else ``build(name)`` and stored."""
    if disk_cache.folder() is None:
        return build(name)
    key = {**base_key(), "profile": name}
    data = disk_cache.load("profile", key)
    if isinstance(data, dict):
        try:
            return cls(**data)
        except TypeError:  # fields changed without a code change the digest saw: rebuild
            pass
    profile = build(name)
    try:
        disk_cache.store("profile", key, _fields(profile))
    except TypeError:  # a field that is no plain data: this profile is rebuilt each run
        pass
    return profile


def _routes_key(profile: Any) -> dict[str, Any] | None:
    digest = content_digest(profile)
    return None if digest is None else {**base_key(), "profile": digest}


def _entry(profile: Any) -> _Entry:
    with _lock:
        entry = _entries.get(profile)
        if entry is not None:
            return entry
        entry = _Entry(None, {}, True)
        if disk_cache.folder() is not None:
            key = _routes_key(profile)
            data = disk_cache.load("routes", key) if key is not None else None
            if isinstance(data, dict) and isinstance(data.get("routes"), dict) and isinstance(data.get("probes"), dict):
                entry = _Entry(data["routes"], data["probes"], True)
            else:
                entry = _Entry(None, {}, key is None)
        _entries[profile] = entry
        return entry


def route(name: str, profile: Any) -> RouteDecision | None:
    """The stored route of ``name`` on ``profile`` (no registry, no force_cpu), or None."""
    entry = _entry(profile)
    if entry.routes is None:
        return None
    made = entry.made.get(name)
    if made is not None:
        return made
    row = entry.routes.get(name)
    if row is None:
        return None
    try:
        op, how, reason, via = row
        d = RouteDecision(op or name, Route(how), reason, via)
    except (TypeError, ValueError):
        return None
    entry.made[name] = d
    return d


def probe(name: str, profile: Any) -> Any:
    """The stored answer of the self-decomposition probe for ``name`` on ``profile``, or UNKNOWN."""
    entry = _entry(profile)
    if entry.routes is None or name not in entry.probes:
        return UNKNOWN
    return entry.probes[name]


def has_routes(profile: Any) -> bool:
    """Are ``profile``'s routes on disk (or is there nothing to write)?"""
    return _entry(profile).saved


def save(profile: Any, decisions: dict[str, RouteDecision], probes: dict[str, bool | None]) -> bool:
    """Store ``profile``'s routes (once per profile and process); True when written."""
    entry = _entry(profile)
    if entry.saved:
        return False
    entry.saved = True
    key = _routes_key(profile)
    if key is None:
        return False
    rows = {n: [None if d.op == n else d.op, d.route.value, d.reason, d.via] for n, d in decisions.items()}
    return disk_cache.store("routes", key, {"routes": rows, "probes": dict(probes)}, plain=True)
