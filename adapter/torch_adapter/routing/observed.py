"""What an observation returns (:class:`ObserveResult`, plain data) and how its keys read
(:func:`is_op_key`): shared by both observer backends — the C++ RecordFunction counter
(:mod:`.observe`) and the profiler-backed one (:mod:`._observe_profiler`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ObserveResult", "is_op_key"]

_OP_KEY = re.compile(r"^\w+::\w+(\.\w+)?$")


def is_op_key(key: str) -> bool:
    """Is ``key`` a dispatcher op ("aten::add.Tensor") rather than a named range?"""
    return bool(_OP_KEY.match(key))


@dataclass
class ObserveResult:
    """What ran between ``start()`` and ``stop()``. Plain data; JSON-able via :meth:`as_dict`."""

    calls: dict[str, int] = field(default_factory=dict)
    self_time_ns: dict[str, int] = field(default_factory=dict)
    children: dict[str, dict[str, int]] = field(default_factory=dict)
    top_level: dict[str, int] = field(default_factory=dict)
    backend: str = "none"
    wall_ns: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total_calls(self) -> int:
        return sum(n for k, n in self.calls.items() if is_op_key(k))

    def ops(self) -> dict[str, int]:
        """``calls`` restricted to dispatcher ops (named ranges left out)."""
        return {k: n for k, n in self.calls.items() if is_op_key(k)}

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "self_time_ns": self.self_time_ns, "children": self.children,
                "top_level": self.top_level, "backend": self.backend, "wall_ns": self.wall_ns,
                "errors": self.errors}
