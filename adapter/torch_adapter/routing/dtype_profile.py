"""The ``[dtypes]`` table of a user capability profile (TOML), checked::

    [dtypes]
    variant = "arc"                  # a device variant of the base (xpu: fp64, arc; mps: macos14, macos13)
    fp64 = false                     # shorthand: float64 and complex128 refused
    refuse = ["bfloat16"]            # more dtypes no op takes
    [dtypes.ops]                     # per op: the only dtypes it takes
    "aten::mm" = ["float32", "float16"]

A profile with a ``base`` starts from the base's dtype data; one without ``base`` and without
``[dtypes]`` has none (its preview says it cannot judge dtypes). Every wrong key, variant or
dtype name is a :class:`~torch_adapter.errors.ProfileError` naming the file, the key and the
allowed values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from . import dtypes as dt

__all__ = ["parse_dtypes", "KEYS"]

KEYS = ("variant", "fp64", "refuse", "ops")


def _names(fail: Callable[..., Exception], key: str, value: Any) -> list[str]:
    allowed = dt.dtype_names()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(key, value, 'a list of dtype names, e.g. ["float64", "bfloat16"]')
    for v in value:
        if v not in allowed:
            raise fail(key, v, f"a dtype name of this torch ({', '.join(allowed)})",
                       fix=f'write torch\'s name without "torch.", e.g. "float64" for torch.float64 (in {key!r})')
    return value


def _generic(name: str, dtype: str, path: str) -> dt.Refusal:
    return dt.Refusal(dtype, "TypeError", f"{name} does not support {dtype}", f"capability profile {path}")


def parse_dtypes(path: str, data: dict[str, Any], name: str, base: Any,
                 fail: Callable[..., Exception], match: Callable[[str], set[str]]) -> tuple[Any, str]:
    """``(DtypeCaps or None, note)`` for the profile in ``path``. ``fail(key, value, expected, fix=)``
    makes the ProfileError; ``match(pattern)`` the op names a pattern matches."""
    base_caps = getattr(base, "dtypes", None)
    table = data.get("dtypes")
    if table is None:
        if base_caps is not None:
            return base_caps, ""
        why = getattr(base, "dtype_note", "") or "the profile states no dtypes (no base, no [dtypes] table)"
        return None, why
    if not isinstance(table, dict):
        raise fail("dtypes", table, f"a table with the keys {list(KEYS)}, e.g. [dtypes] fp64 = false")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise fail(f"dtypes.{unknown[0]}", table[unknown[0]], f"only the keys {list(KEYS)}",
                   fix=f"remove or rename {unknown[0]!r} in [dtypes] of {path}")
    caps = base_caps or dt.DtypeCaps(name, "default", f"profile {name}", source=f"capability profile {path}")
    variant = table.get("variant")
    if variant is not None:
        owner = base_caps.target if base_caps is not None else None
        allowed = list(dt.VARIANTS.get(owner, {}))
        if not isinstance(variant, str) or variant not in allowed:
            expected = (f"a device variant of {owner!r} ({', '.join(allowed)})" if allowed else
                        "no variant: only a profile whose base is one of "
                        f"{', '.join(t for t, v in dt.VARIANTS.items() if len(v) > 1)} has variants")
            raise fail("dtypes.variant", variant, expected, fix=f"set base and variant together in {path}, "
                       'e.g. base = "xpu" with [dtypes] variant = "arc"')
        caps = dt.caps_for(owner, variant)
    refused = dict(caps.refused)
    fp64 = table.get("fp64")
    if fp64 is not None:
        if not isinstance(fp64, bool):
            raise fail("dtypes.fp64", fp64, "true or false")
        for d in ("float64", "complex128"):
            if fp64:
                refused.pop(d, None)
            else:
                refused.setdefault(d, dt._xpu_fp64()[d] if caps.target.startswith("xpu") else _generic(name, d, path))
    for d in _names(lambda k, v, e, fix="": fail(f"dtypes.{k}", v, e, fix=fix), "refuse", table.get("refuse", [])):
        refused.setdefault(d, _generic(name, d, path))
    ops = dict(caps.ops)
    op_sources = dict(caps.op_sources)
    op_table = table.get("ops", {})
    if not isinstance(op_table, dict):
        raise fail("dtypes.ops", op_table, 'a table of op -> dtype list, e.g. "aten::mm" = ["float32"]')
    for pattern, value in op_table.items():
        names = _names(lambda k, v, e, fix="": fail(f"dtypes.ops.{pattern}", v, e, fix=fix), "ops", value)
        found = match(pattern)
        if not found:
            raise fail(f"dtypes.ops.{pattern}", pattern, "an op name or glob that matches aten ops",
                       fix='write names as "aten::name.overload" or "aten::name" (all overloads)')
        for op in found:
            ops[op] = frozenset(names)
            op_sources[op] = f"capability profile {path} ([dtypes.ops] {pattern!r})"
    return replace(caps, refused=refused, ops=ops, op_sources=op_sources,
                   source=f"{caps.source}; capability profile {path}" if base_caps else caps.source), ""
