"""The on-disk cache of pure data torch_adapter computes at start-up (docs/routing.md#start-up-cache).

What is stored is plain data that a fresh interpreter would otherwise recompute: the parsed op
table of ``native_functions.yaml``, the built-in capability profiles and each profile's routes
(the self-decomposition probe's answers included). Each entry is one JSON file named by its
``kind`` and the SHA-256 of its key — a dict the caller builds from everything the data depends
on (torch's version and build, the yaml's hash, the adapter's version and code, the profile's
content) — and the key is stored beside the data and compared on read, so a changed torch or
adapter is a miss, never a wrong answer. JSON, not pickle: a cache file is read, never run.

Where: ``$TORCH_ADAPTER_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_adapter``, else
``~/.cache/torch_adapter``; ``TORCH_ADAPTER_CACHE=off`` (or ``0``, ``false``, ``no``) turns it
off. A missing folder is created; a corrupt entry is ignored (and rewritten by the next store);
a folder that is a file, unwritable, read-only or full gives one one-line :class:`CacheWarning`
per process and the run goes on, recomputing. Entries are written by the one safe writer
(:mod:`.safe_io`: a temporary file renamed into place), so concurrent writers (launcher ranks)
each leave one complete file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["CacheWarning", "folder", "load", "store", "encode", "decode", "file_digest", "code_digest",
           "ENV_DIR", "ENV_SWITCH"]

ENV_DIR = "TORCH_ADAPTER_CACHE_DIR"
ENV_SWITCH = "TORCH_ADAPTER_CACHE"
_OFF = ("0", "off", "false", "no", "none", "disabled")
SCHEMA = "torch-adapter.cache"
VERSION = 1
_READ_LIMIT = 64 * 1024 * 1024
_warned: set[str] = set()  # folders already warned about (one warning per folder per process)


class CacheWarning(UserWarning):
    """The start-up cache cannot be used; the run goes on and recomputes."""


def folder() -> Path | None:
    """The cache folder, or None when the cache is turned off."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF:
        return None
    chosen = os.environ.get(ENV_DIR, "").strip()
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch_adapter"


def _warn(where: Path, why: str) -> None:
    if str(where) in _warned:
        return
    _warned.add(str(where))
    warnings.warn_explicit(
        f"the start-up cache folder {where} cannot be used ({why}); start-up data is "
        f"recomputed in every run — set {ENV_DIR} to a writable folder, or {ENV_SWITCH}=off",
        CacheWarning, "torch_adapter", 0)


def _entry(kind: str, key: dict[str, Any]) -> tuple[Path, str] | None:
    where = folder()
    if where is None:
        return None
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return where / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}.json", text


def load(kind: str, key: dict[str, Any]) -> Any | None:
    """The data stored for ``key``, or None (cache off, missing folder or entry, corrupt entry,
    an entry for another key)."""
    from .safe_io import FileProblem, read_bounded

    found = _entry(kind, key)
    if found is None:
        return None
    path, text = found
    try:
        raw = read_bounded(path, limit=_READ_LIMIT)
    except FileProblem:
        return None  # absent (or not a file): a miss; a store reports a folder that cannot be written
    try:
        doc = json.loads(raw)
        if doc.get("schema") != SCHEMA or doc.get("version") != VERSION or \
                json.dumps(doc.get("key"), sort_keys=True, separators=(",", ":")) != text:
            return None
        return doc["data"] if doc.get("plain") is True else decode(doc["data"])
    except (ValueError, TypeError, KeyError, AttributeError):  # corrupt: ignored, rewritten by the next store
        return None


def store(kind: str, key: dict[str, Any], data: Any, *, plain: bool = False) -> bool:
    """Write ``data`` for ``key``; False (after one warning per folder) when it cannot be written.
    ``data`` must be :func:`encode`-able (TypeError otherwise: a caller's bug, not the disk's);
    ``plain``: it is JSON's own lists, dicts, strings and numbers, stored and read back as they are
    (no tags to decode: the large entries load without a second pass)."""
    from .safe_io import write_bytes

    found = _entry(kind, key)
    if found is None:
        return False
    path, _ = found
    doc = {"schema": SCHEMA, "version": VERSION, "key": key, "data": data if plain else encode(data)}
    if plain:
        doc["plain"] = True
    body = json.dumps(doc, separators=(",", ":")).encode()
    where = path.parent
    try:
        if where.exists() and not where.is_dir():
            _warn(where, "it is not a folder")
            return False
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_bytes(path, body, call="torch_adapter start-up cache")
    except (OSError, ValueError) as exc:  # OutputError is a UsageError (a ValueError)
        _warn(where, _why(exc))
        return False
    return True


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    lines = str(exc).splitlines()  # the safe writer's five-part message: its "Why:" line
    why = next((ln[len("Why: "):] for ln in lines if ln.startswith("Why: ")), lines[0] if lines else "")
    return why.rstrip(".") or type(exc).__name__


# -- plain data <-> JSON -----------------------------------------------------------------------
def encode(value: Any) -> Any:
    """``value`` as JSON data: sets, frozensets, tuples, dicts and torch dtypes tagged so that
    :func:`decode` gives back equal objects. TypeError for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (frozenset, set)):
        items = [encode(v) for v in value]
        return {"$fs": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
    if isinstance(value, tuple):
        return {"$t": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"$d": {k: encode(v) for k, v in value.items()}}
        return {"$dl": [[encode(k), encode(v)] for k, v in value.items()]}
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return {"$dtype": str(value).removeprefix("torch.")}
    raise TypeError(f"torch_adapter cache: cannot store a {type(value).__name__}")


def decode(data: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v) if isinstance(v, (list, dict)) else v for v in data]
    if not isinstance(data, dict):
        return data
    (tag, inner), = data.items()
    if tag == "$fs":
        return frozenset(decode(v) for v in inner)
    if tag == "$t":
        return tuple(decode(v) for v in inner)
    if tag == "$d":
        return {k: decode(v) if isinstance(v, (list, dict)) else v for k, v in inner.items()}
    if tag == "$dl":
        return {decode(k): decode(v) for k, v in inner}
    if tag == "$dtype":
        import torch

        return getattr(torch, inner)
    raise ValueError(f"unknown tag {tag!r}")


# -- what keys are made of -----------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (read once per process and file version)."""
    st = os.stat(path)
    return _digest(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=None)
def code_digest(*folders: str) -> str:
    """SHA-256 over the adapter's own files that decide the cached data (``*.py`` and ``*.json``
    directly in each of ``folders``, relative to the package): an edited rule is a miss."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in folders:
        for path in sorted((package / sub).glob("*")):
            if path.suffix in (".py", ".json") and path.is_file():
                h.update(path.name.encode())
                h.update(path.read_bytes())
    return h.hexdigest()
