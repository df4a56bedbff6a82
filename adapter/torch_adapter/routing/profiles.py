"""Capability profiles: which aten ops a target runs natively.

Three sources, one type (:class:`CapabilityProfile`):

- **built-in simulated** profiles (``cuda``, ``mps``, ``mtia``, ``cpu``) from the op table in
  torch's own ``native_functions.yaml`` (:mod:`.ops_table`); ``npu`` and ``xpu`` add the
  vendors' own op tables (:mod:`.vendor_tables`: Ascend op-plugin + torch_npu, Intel
  torch-xpu-ops), the entries that apply to the running torch; ``mtia`` is marked incomplete
  because its kernels live outside that file. A vendor table that cannot be read leaves the
  profile *incomplete* with the reason in its notes (never "everything native");
- **live** profiles of real targets, read from the dispatcher
  (``_dispatch_has_kernel_for_dispatch_key``) and snapshotted before the adapter registers
  anything, so its own kernels never count as the target's;
- **user** profiles: a TOML file::

      name = "my-npu"                 # required
      base = "cuda"                   # optional: a built-in profile to start from
      dispatch_key = "PrivateUse1"    # optional: defaults to the base's
      description = "..."             # optional
      native = ["aten::add.*"]        # ops added as native (fnmatch globs)
      not_native = ["aten::_fused_*"] # ops removed from native
      fallback = ["aten::nonzero"]    # ops forced to the CPU
      [dtypes]                        # optional: dtype capability (routing/dtype_profile.py)
      fp64 = false

Each profile also carries its dtype capability (:mod:`.dtypes`, ``profile.dtypes``; None:
the preview cannot judge dtypes, ``profile.dtype_note`` says why). Device variants of the
built-ins are profiles of their own: ``mps-macos13``, ``xpu-arc`` (:data:`VARIANTS`).

Invalid files raise :class:`~torch_adapter.errors.ProfileError` naming the file, the key
and the value.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..core.torch_private import all_op_names, has_kernel_for_key
from ..errors import ProfileError, UsageError, format_error
from . import ops_table

__all__ = ["CapabilityProfile", "BUILTIN", "load_profile", "live_profile", "profile_for",
           "simulated_rows", "match_ops", "builtin_names", "VARIANTS"]

# built-in simulated profile -> (dispatch key, complete?, note)
BUILTIN: dict[str, tuple[str, bool, str]] = {
    "cuda": ("CUDA", True, ""),
    "mps": ("MPS", True, ""),
    "mtia": ("MTIA", False, "incomplete: most MTIA kernels live outside native_functions.yaml (189 listed; not even aten::empty)"),
    "npu": ("PrivateUse1", True, ""),
    "xpu": ("XPU", True, ""),
    "cpu": ("CPU", True, ""),
}
# built-in profiles whose native ops come from a vendor table (routing/vendor_ops.json)
VENDOR = ("npu", "xpu")
_TOML_KEYS = {"name", "base", "dispatch_key", "description", "native", "not_native", "fallback", "dtypes"}
# device variants: a built-in profile's ops with another dtype capability (routing/dtypes.py)
VARIANTS: dict[str, tuple[str, str]] = {"mps-macos13": ("mps", "macos13"), "xpu-arc": ("xpu", "arc")}


@dataclass(frozen=True, eq=False)
class CapabilityProfile:
    """What a target runs natively. Compared and hashed by identity (profiles are cached)."""

    name: str
    dispatch_key: str
    native: frozenset[str]
    source: str
    forced_fallback: frozenset[str] = frozenset()
    complete: bool = True
    base: str | None = None
    description: str = ""
    live: bool = False  # read from this process's dispatcher
    known: frozenset[str] = field(default=frozenset(), repr=False)  # op names when snapshotted
    why_native: dict[str, str] = field(default_factory=dict, repr=False)  # op -> where its kernel comes from
    notes: tuple[str, ...] = ()  # the table's limits and version notes (shown by `targets`)
    listed: int = 0  # overloads the vendor table lists for this torch (0: no vendor table)
    vendor: str = ""
    dtypes: Any = field(default=None, repr=False)  # routing.dtypes.DtypeCaps; None: no dtype data
    dtype_note: str = ""  # why there is no dtype data

    @property
    def native_count(self) -> int:
        return len(self.native)

    def is_native(self, op: str) -> bool:
        """Has the target a kernel of its own for ``op`` (``"aten::add.Tensor"``)?"""
        if op in self.native:
            return True
        if op in self.known or (not self.live and op.startswith("aten::")):
            return False
        # an op this profile has not seen (a custom op registered later): ask the dispatcher
        return has_kernel_for_key(op, self.dispatch_key)

    def __repr__(self) -> str:
        flag = "" if self.complete else ", incomplete"
        return f"<CapabilityProfile {self.name!r} key={self.dispatch_key} native={self.native_count}{flag}>"


def builtin_names() -> list[str]:
    return list(BUILTIN)


@functools.lru_cache(maxsize=None)
def _builtin(name: str) -> CapabilityProfile:
    from dataclasses import replace

    from . import dtypes

    if name in VARIANTS:
        base, variant = VARIANTS[name]
        return replace(_builtin(base), name=name, dtypes=dtypes.caps_for(base, variant))
    profile = _builtin_ops(name)
    return replace(profile, dtypes=dtypes.caps_for(name), dtype_note=dtypes.NO_DATA.get(name, ""))


def _builtin_ops(name: str) -> CapabilityProfile:
    """The op part of a built-in profile: pure data, read from the start-up cache when there."""
    from .route_cache import cached_profile

    return cached_profile(name, _build_builtin, CapabilityProfile)


def _build_builtin(name: str) -> CapabilityProfile:
    import torch

    key, complete, note = BUILTIN[name]
    table = ops_table.load_table()
    native = frozenset(n for n, e in table.items() if key in e.keys)
    if name in VENDOR:
        return _vendor_profile(name, key, native, str(torch.__version__))
    return CapabilityProfile(name=name, dispatch_key=key, native=native,
                             source=f"native_functions.yaml (torch {torch.__version__})",
                             complete=complete, description=note)


_VENDOR_LIMIT = ("a vendor list names kernels: an op absent from it may still run through a Composite* kernel "
                 "or a decomposition (routed composite), fallback only when nothing else applies")


def _vendor_profile(name: str, key: str, own: frozenset[str], version: str,
                    path: str | None = None) -> CapabilityProfile:
    """``own`` (torch's own kernels for ``key``) plus the vendor table's entries for ``version``.
    A missing or unreadable table gives an incomplete profile saying so."""
    from . import vendor_tables

    path = path or vendor_tables.DATA_FILE
    known = frozenset(ops_table.load_table()) | frozenset(all_op_names())
    try:
        sel = vendor_tables.select(name, version, known, path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        note = (f"incomplete: the vendor op table {path} cannot be read ({why}); only the {len(own)} {key} "
                "kernels in torch's own native_functions.yaml count as native; reinstall torch-adapter or rebuild "
                "the table (python -m torch_adapter.routing.vendor_tables build ../shared/target-data)")
        return CapabilityProfile(name=name, dispatch_key=key, native=own, source=f"{path} (unreadable)",
                                 complete=False, description=note, notes=(note,))
    from .kernel_families import DEVICE_REGISTERED

    why = dict(sel.native)
    for op, where in DEVICE_REGISTERED.get(name, {}).items():
        if op in known:
            why.setdefault(op, where)
    for op in own:
        why.setdefault(op, f"torch's own {key} kernel (native_functions.yaml)")
    origin = ", ".join(sorted({f"{s.get('repo')}@{str(s.get('commit', ''))[:10]} ({s.get('license')})"
                               for s in sel.sources}))
    summary = (f"complete: {sel.vendor} lists {sel.listed} aten overloads for torch {version} "
               f"({len(why)} native here, with {len(own)} of torch's own {key} kernels)")
    notes = (summary, *sel.notes, _VENDOR_LIMIT)
    return CapabilityProfile(name=name, dispatch_key=key, native=frozenset(why),
                             source=f"vendor_ops.json from {origin}", complete=True,
                             description=summary, why_native=why, notes=notes, listed=sel.listed, vendor=sel.vendor)


@functools.lru_cache(maxsize=None)
def live_profile(name: str, dispatch_key: str) -> CapabilityProfile:
    """The profile of a real target, snapshotted from the dispatcher (cached per process);
    its dtype capability where torch can tell (:func:`.dtypes.live_caps`)."""
    from . import dtypes

    names = all_op_names()
    native = frozenset(n for n in names if has_kernel_for_key(n, dispatch_key))
    caps = dtypes.live_caps(name)
    return CapabilityProfile(name=name, dispatch_key=dispatch_key, native=native,
                             source=f"live dispatcher ({dispatch_key})", live=True,
                             known=frozenset(names), dtypes=caps,
                             dtype_note="" if caps else f"no dtype data for {name}: the real backend raises its own errors")


def profile_for(target: Any) -> CapabilityProfile:
    """The profile of an installed :class:`~torch_adapter.routing.target.Target`."""
    if not target.simulated:
        return live_profile(target.name, target.dispatch_key)
    source = str(target.details.get("profile", ""))
    return load_profile(source if source.endswith(".toml") else target.name)


def load_profile(name_or_path: str | os.PathLike[str]) -> CapabilityProfile:
    """A built-in profile by name (``"mps"``) or a user profile from a ``.toml`` file."""
    text = os.fspath(name_or_path)
    key = text.strip().lower()
    if key in BUILTIN or key in VARIANTS:
        return _builtin(key)
    if text.endswith(".toml") or os.path.sep in text:
        return _load_toml(os.path.abspath(text), ())
    raise UsageError(format_error(
        f"torch_adapter.routing.load_profile({text!r})",
        f"a built-in profile ({', '.join([*BUILTIN, *VARIANTS])}) or a path to a .toml profile", repr(text),
        why="simulated targets need a capability profile to say which ops are native",
        fix='e.g. install(target="mps", simulate=True) or install(target="my_npu.toml", simulate=True)'))


# -- user profiles ---------------------------------------------------------------------------
def match_ops(patterns: Iterable[str], names: Iterable[str]) -> dict[str, set[str]]:
    """``{pattern: matching op names}``; ``"aten::add"`` also matches its overloads."""
    names = list(names)
    result: dict[str, set[str]] = {}
    for pattern in patterns:
        pats = [pattern] if any(c in pattern for c in "*?[") or "." in pattern.partition("::")[2] \
            else [pattern, pattern + ".*"]
        result[pattern] = {n for n in names for p in pats if fnmatch.fnmatchcase(n, p)}
    return result


def _fail(path: str, key: str, value: Any, expected: str, why: str = "", fix: str = "") -> ProfileError:
    return ProfileError(format_error(f"capability profile {path!r}, key {key!r}", expected,
                                     f"{value!r} ({type(value).__name__})", why=why,
                                     fix=fix or f"edit {key!r} in {path}"))


def _str_list(path: str, data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, value, 'a list of op names or globs, e.g. ["aten::add.*"]')
    return value


@functools.lru_cache(maxsize=64)
def _load_toml_cached(path: str, mtime: float) -> CapabilityProfile:
    return _parse_toml(path, ())


def _load_toml(path: str, chain: tuple[str, ...]) -> CapabilityProfile:
    try:
        mtime = os.stat(path).st_mtime
    except OSError as exc:
        raise ProfileError(format_error(
            "torch_adapter.routing.load_profile()", "an existing .toml profile file",
            f"{path!r} ({exc.strerror})", fix="check the path (relative paths start at the working directory)")) from exc
    if chain:
        return _parse_toml(path, chain)
    return _load_toml_cached(path, mtime)


def _read_toml(path: str) -> dict[str, Any]:
    """The TOML table in ``path``: exact path, regular files only, bounded read; ProfileError otherwise."""
    import tomllib

    from ..core.safe_io import FileProblem, decode_utf8, read_bounded

    try:
        text = decode_utf8(path, read_bounded(path))
    except FileProblem as exc:
        raise ProfileError(format_error(
            f"capability profile {path!r}", "a readable UTF-8 .toml file (a regular file, at most 8 MiB)",
            repr(path), why=exc.why, fix=exc.fix)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(format_error(
            f"capability profile {path!r}", "valid TOML", f"a syntax error: {exc}",
            fix="fix the TOML syntax (strings need quotes; lists use [ ... ])")) from exc


def _parse_toml(path: str, chain: tuple[str, ...]) -> CapabilityProfile:
    data = _read_toml(path)
    unknown = sorted(set(data) - _TOML_KEYS)
    if unknown:
        raise _fail(path, unknown[0], data[unknown[0]], f"only the keys {sorted(_TOML_KEYS)}",
                    fix=f"remove or rename {unknown[0]!r} in {path}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _fail(path, "name", name, 'a non-empty string, e.g. name = "my-npu"')
    base_name = data.get("base")
    base: CapabilityProfile | None = None
    if base_name is not None:
        if not isinstance(base_name, str):
            raise _fail(path, "base", base_name, f"one of {list(BUILTIN)} or a .toml path")
        if base_name.lower() in BUILTIN or base_name.lower() in VARIANTS:
            base = _builtin(base_name.lower())
        elif base_name.endswith(".toml"):
            base_path = os.path.join(os.path.dirname(path), base_name)
            if base_path in chain or base_path == path:
                raise _fail(path, "base", base_name, "a profile that does not include itself",
                            why="the base chain is a cycle: " + " -> ".join((*chain, path, base_path)))
            base = _load_toml(os.path.abspath(base_path), (*chain, path))
        else:
            raise _fail(path, "base", base_name, f"one of {list(BUILTIN)} or a .toml path")
    key = data.get("dispatch_key", base.dispatch_key if base else "PrivateUse1")
    if not isinstance(key, str) or not key:
        raise _fail(path, "dispatch_key", key, 'a dispatch key name, e.g. "PrivateUse1"')
    _check_dispatch_key(path, key)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description", description, "a string")

    names = sorted(set(ops_table.load_table()) | set(all_op_names()))
    resolved: dict[str, set[str]] = {}
    for list_key in ("native", "not_native", "fallback"):
        patterns = _str_list(path, data, list_key)
        matches = match_ops(patterns, names)
        for pattern, found in matches.items():
            if not found:
                raise _fail(path, list_key, pattern, "op names or globs that match aten ops",
                            why="no op of this torch matches it",
                            fix='write names as "aten::name.overload" or "aten::name" (all overloads)')
        resolved[list_key] = set().union(*matches.values()) if matches else set()
    native = (set(base.native) if base else set()) | resolved["native"]
    native -= resolved["not_native"]
    forced = (set(base.forced_fallback) if base else set()) | resolved["fallback"]
    from .dtype_profile import parse_dtypes

    caps, dtype_note = parse_dtypes(path, data, name.strip(), base,
                                    lambda k, v, e, fix="": _fail(path, k, v, e, fix=fix),
                                    lambda pattern: match_ops([pattern], names)[pattern])
    return CapabilityProfile(name=name.strip(), dispatch_key=key, native=frozenset(native), source=path,
                             forced_fallback=frozenset(forced), complete=base.complete if base else True,
                             base=base.name if base else None, description=description,
                             dtypes=caps, dtype_note=dtype_note)


def _check_dispatch_key(path: str, key: str) -> None:
    """An unknown ``dispatch_key`` is an error (it would silently match no kernel)."""
    import difflib

    from ..core.torch_private import backend_dispatch_keys

    keys = backend_dispatch_keys()
    if key not in keys:
        close = [k for k in keys if k.lower() == key.lower()] or difflib.get_close_matches(key, keys, n=1)
        raise _fail(path, "dispatch_key", key, f"a backend dispatch key of this torch ({', '.join(keys)})",
                    why="the key says whose kernels count as the target's native ones",
                    fix=f"use {close[0]!r}" if close else 'e.g. dispatch_key = "PrivateUse1"')


# -- listing ---------------------------------------------------------------------------------
def simulated_rows(host: Any) -> list[dict[str, Any]]:
    """One ``targets()`` row per built-in simulated profile, with route counts over its table;
    ``host`` is the real target that executes them."""
    from .choose import decide_name, remember
    from .decide import Route

    names = list(ops_table.load_table())
    rows = []
    for name, (key, complete, note) in BUILTIN.items():
        profile = _builtin(name)
        counts = {r: 0 for r in Route}
        for op in names:
            counts[decide_name(op, profile).route] += 1
        remember(profile, names)  # the routes of the whole table: into the start-up cache
        complete = profile.complete
        details: dict[str, Any] = {"profile": profile.source, "dispatch_key": key, "complete": complete}
        note = "; ".join(profile.notes) if profile.notes else note
        if note:
            details["note"] = note
        if profile.listed:
            details["vendor"] = profile.vendor
            details["vendor_listed"] = profile.listed
        details["dtypes"] = profile.dtypes.summary() if profile.dtypes else f"cannot judge: {profile.dtype_note}"
        variants = [v for v, (b, _) in VARIANTS.items() if b == name]
        if variants:
            details["variants"] = {v: _builtin(v).dtypes.summary() for v in variants}
        rows.append({"name": name, "present": True, "simulated": True, "device": host.device_type,
                     "devices": 1, "dist_backend": host.dist_backend, "details": details,  # runs on the host
                     "native_ops": profile.native_count, "composite_ops": counts[Route.COMPOSITE],
                     "fallback_ops": counts[Route.FALLBACK],
                     "view_ops": counts[Route.NATIVE] - profile.native_count, "complete": complete})
    return rows
