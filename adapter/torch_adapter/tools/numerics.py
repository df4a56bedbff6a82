"""What the debug checks share: the :class:`Finding` they report, the list of findings, and
helpers that look at an op's schema and tensors (:mod:`torch_adapter.debug` is the API;
:mod:`torch_adapter.memory` uses :func:`tensors` too).

A finding is reported by :func:`report`: it is classified (the op's route on the session's
target, the module running, forward or backward, the user's line) and either raised as
:class:`~torch_adapter.errors.NumericsError` or warned as :class:`NumericsWarning` — once
per (check, kind, op, module) since the check was last enabled.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from . import tool_mode as _tool_mode
from ..errors import NumericsError, format_error

__all__ = ["NumericsWarning", "Finding", "findings", "tensors", "checkable", "plan", "count", "arg_values", "report",
           "forget_warned", "LABEL"]

LABEL = {"nan": "NaN", "inf": "Inf", "mismatch": "mismatch"}
_MAX_FINDINGS = 1000
_FINDINGS: list["Finding"] = []
_WARNED: set[tuple[str, str, str, str | None]] = set()  # (check, kind, op, module) warned about
_PLANS: dict[Any, tuple[bool, tuple[int, ...], bool]] = {}


class NumericsWarning(UserWarning):
    """A debug check found a NaN/Inf or a CPU mismatch (``mode="warn"``)."""


@dataclass(frozen=True)
class Finding:
    """What a check found: the op, how it was routed, where it ran, and what was wrong."""

    check: str  # "nan_check" | "cpu_compare"
    kind: str  # "nan" | "inf" | "mismatch"
    op: str
    route: str
    reason: str
    module: str | None
    phase: str  # "forward" | "backward"
    autograd_node: str | None
    site: dict[str, Any] | None
    detail: str

    def where(self) -> str:
        inside = f" in {self.module}" if self.module else ""
        node = f" of {self.autograd_node}" if self.autograd_node else ""
        from ..core.callsite import site_text

        call = f" from `{self.site['call']}`" if self.site and self.site.get("call") else ""
        at = f" at {site_text(self.site)}" if self.site else ""
        return f"{self.op} ({self.phase}{node}{inside}){call}{at}"

    def message(self) -> str:
        route = f"route {self.route} ({self.reason})"
        if self.kind == "mismatch":
            return format_error(self.where(), "the same result as the CPU's plain aten kernel", self.detail,
                                why=f"on the target it ran by {route}; this is the first op that disagrees",
                                fix="if the difference is within what the dtype allows, raise atol/rtol; else "
                                    f"register a fixed implementation with torch_adapter.register_fallback({self.op!r}) "
                                    f"or run it on the CPU: torch_adapter.configure(force_cpu=[{self.op!r}]); "
                                    "torch_adapter.debug.disable_cpu_compare() turns this off")
        what = LABEL[self.kind]
        return format_error(self.where(), f"finite values from inputs without {what}", self.detail,
                            why=f"it ran by {route}; it is the first op that produced {'an' if what == 'Inf' else 'a'} "
                                f"{what}",
                            fix="look at this op's inputs at that line (log/sqrt/div of zero or negative values, "
                                "overflow in float16 — try bfloat16, a missing eps); "
                                "torch_adapter.debug.disable_nan_check() turns this off")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def findings() -> list[Finding]:
    """What the checks found so far in this process (oldest first; at most 1000)."""
    return list(_FINDINGS)


# -- shared helpers ---------------------------------------------------------------------------
def tensors(obj: Any) -> Iterator[tuple[int, Any]]:
    import torch

    flat: list[Any] = []

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            flat.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(obj)
    return enumerate(flat)


def checkable(t: Any) -> bool:
    import torch

    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and t.device.type != "meta" and (t.is_floating_point() or t.is_complex()) and t.numel() > 0)


def plan(func: Any) -> tuple[bool, tuple[int, ...], bool]:
    """(skip: moves/views values or is uninitialised, indices of written arguments, random)."""
    found = _PLANS.get(func)
    if found is None:
        import torch

        from ..routing.rules import ENGINE_OPS

        name = func.name()
        base = name.partition("::")[2].partition(".")[0]
        views = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        skip = (views or name in ENGINE_OPS or base.startswith(("empty", "new_empty", "_empty"))
                or name in ("aten::resize_", "aten::_local_scalar_dense", "aten::set_.source_Tensor"))
        written = tuple(i for i, a in enumerate(func._schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write)
        random = torch.Tag.nondeterministic_seeded in func.tags
        found = _PLANS[func] = (skip, written, random)
    return found


def count(t: Any, kind: str) -> int:
    import torch

    return int((torch.isnan(t) if kind == "nan" else torch.isinf(t)).sum())


def arg_values(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    schema = func._schema.arguments
    return [*args, *[kwargs.get(a.name) for a in schema[len(args):]]]


def report(check: str, kind: str, func: Any, detail: str, mode: str) -> None:
    from ..core.callsite import user_site
    from ..routing.route_of import decider

    name = func.name()
    d = decider()[0](name)
    phase, node = _tool_mode.phase()
    finding = Finding(check, kind, name, d.route.value if d else "unknown", d.reason if d else "",
                      _tool_mode.module_path(), phase, node, user_site(call=True), detail)
    key = (check, kind, name, finding.module)
    if mode == "warn":
        if key in _WARNED:
            return
        _WARNED.add(key)
    if len(_FINDINGS) < _MAX_FINDINGS:
        _FINDINGS.append(finding)
    if mode == "raise":
        raise NumericsError(finding.message(), finding)
    site = finding.site or {"file": "<torch_adapter>", "line": 0}
    warnings.warn_explicit(finding.message(), NumericsWarning, site["file"], site["line"])


def forget_warned(check: str) -> None:
    """Each enable_*() warns afresh about every producer (in "warn" mode: once per op and module)."""
    for key in [k for k in _WARNED if k[0] == check]:
        _WARNED.discard(key)
