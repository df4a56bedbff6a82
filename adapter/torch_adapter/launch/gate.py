"""The CI gate of ``torch-adapter run``: fail a run that exceeds what a team allows (issue 36, item 4).

    torch-adapter run --max-fallbacks 0 train.py                 # the acceptance test: no CPU fallback
    torch-adapter run --deny TA-F001 --deny aten::nonzero train.py
    torch-adapter run --baseline routing.json train.py           # only what is new since the baseline fails

Judged on the run's routing log (what ``--report-json`` writes; a baseline is such a file, from an
earlier run): a **fallback** is an op that ran on the CPU (route ``fallback``) or was refused there
(``refused``), counted once per op however often it was called. ``--max-fallbacks N`` allows N of
them; ``--deny`` names ops or reason codes (docs/reasons.md) that may not fall back at all; with
``--baseline`` a run fails only on what the baseline did not have: a new fallback or refused op, or
an op whose route got slower (native → composite → yours → fallback → refused), while everything
the baseline already had passes (``--max-fallbacks`` then counts the new ones only).

A failing gate prints one line per violation and the run exits with :data:`EXIT_GATE` (3) when the
script itself succeeded; a script that failed keeps its own exit code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Gate", "Violation", "EXIT_GATE", "load_baseline"]

EXIT_GATE = 3
# slowest last: a route moving right is slower (wording.ROUTES' order, "yours" before a copy)
_SPEED = {"native": 0, "composite": 1, "yours": 2, "fallback": 3, "refused": 4}
_CODE = re.compile(r"^TA-[A-Z]\d{3}$")
_FELL = ("fallback", "refused")


@dataclass(frozen=True)
class Violation:
    kind: str  # "max-fallbacks" | "denied" | "new fallback" | "new refused" | "slower route"
    op: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class Gate:
    max_fallbacks: int | None = None
    deny: tuple[str, ...] = ()
    baseline: dict[str, Any] | None = None
    baseline_path: str = ""
    checked: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.max_fallbacks is not None or bool(self.deny) or self.baseline is not None

    def violations(self, report: dict[str, Any]) -> list[Violation]:
        """What ``report`` (a routing log as ``--report-json`` writes it) breaks, most serious first."""
        rows = _by_op(report)
        before = _by_op(self.baseline) if self.baseline is not None else None
        out: list[Violation] = []
        fell = {op: r for op, r in rows.items() if r["route"] in _FELL}
        for op, r in sorted(fell.items()):
            named = op if op in self.deny else r.get("code") if r.get("code") in self.deny else None
            if named:
                out.append(Violation("denied", op, f"denied: {op} {_ran(r)} ({r.get('code') or '?'}: "
                                                   f"{_short(r.get('reason'))}){_at(r)} — --deny {named}"))
        new = fell
        if before is not None:
            new = {}
            for op, r in sorted(rows.items()):
                was = before.get(op)
                if r["route"] in _FELL and (was is None or was["route"] not in _FELL):
                    new[op] = r
                    kind = f"new {r['route']}"
                    then = f"was {was['route']}" if was else "not in the baseline"
                    out.append(Violation(kind, op, f"{kind}: {op} {_ran(r)} ({r.get('code') or '?'}){_at(r)} — "
                                                   f"{then} ({self.baseline_path or 'baseline'})"))
                elif was is not None and _SPEED.get(r["route"], 0) > _SPEED.get(was["route"], 0):
                    out.append(Violation("slower route", op, f"slower route: {op} is {r['route']} "
                                                              f"({r.get('code') or '?'}), was {was['route']} "
                                                              f"({was.get('code') or '?'}){_at(r)}"))
        if self.max_fallbacks is not None and len(new) > self.max_fallbacks:
            what = "new fallbacks" if before is not None else "fallbacks"
            listed = ", ".join(f"{op} ({r.get('code') or '?'})" for op, r in sorted(new.items())[:8])
            more = f" and {len(new) - 8} more" if len(new) > 8 else ""
            out.insert(0, Violation("max-fallbacks", "", f"{len(new)} {what}, --max-fallbacks allows "
                                                         f"{self.max_fallbacks}: {listed}{more}"))
        return out

    def report(self, violations: list[Violation]) -> str:
        """The gate's lines for stderr."""
        if not violations:
            return f"torch_adapter gate: passed ({self.describe()})"
        lines = [f"torch_adapter gate: FAILED — {len(violations)} "
                 f"{'violation' if len(violations) == 1 else 'violations'} ({self.describe()})"]
        lines += [f"  {v}" for v in violations]
        lines.append("  (codes: docs/reasons.md; a new baseline: --report-json routing.json on a run you accept)")
        return "\n".join(lines)

    def describe(self) -> str:
        parts = []
        if self.max_fallbacks is not None:
            parts.append(f"--max-fallbacks {self.max_fallbacks}")
        parts += [f"--deny {d}" for d in self.deny]
        if self.baseline is not None:
            parts.append(f"--baseline {self.baseline_path}")
        return " ".join(parts)

    def as_dict(self, violations: list[Violation]) -> dict[str, Any]:
        return {"passed": not violations, "max_fallbacks": self.max_fallbacks, "deny": list(self.deny),
                "baseline": self.baseline_path or None,
                "violations": [{"kind": v.kind, "op": v.op, "text": v.text} for v in violations]}


def _by_op(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """op -> its slowest row (a log may hold one op under several routes or parents)."""
    out: dict[str, dict[str, Any]] = {}
    for row in (report or {}).get("ops", []):
        op, route = row.get("op"), row.get("route")
        if not isinstance(op, str) or route not in _SPEED:
            continue
        kept = out.get(op)
        if kept is None or _SPEED[route] > _SPEED[kept["route"]]:
            out[op] = row
    return out


def _ran(row: dict[str, Any]) -> str:
    calls = int(row.get("calls") or 0)
    verb = "refused" if row["route"] == "refused" else "ran on the CPU"
    return f"{verb} ×{calls:,}"


def _at(row: dict[str, Any]) -> str:
    site = row.get("site")
    if isinstance(site, dict) and site.get("file"):
        return f" at {site['file']}:{site.get('line')}"
    return ""


def _short(reason: Any, n: int = 70) -> str:
    text = str(reason or "")
    return text if len(text) <= n else text[:n - 1] + "…"


def check_deny(values: list[str] | None) -> tuple[str, ...]:
    """``--deny`` values: aten op names or reason codes of the table (a bad code is a usage error)."""
    from ..core.codes import CODES
    from ..errors import UsageError, format_error

    out = []
    for v in values or ():
        if _CODE.match(v) and v not in CODES:
            raise UsageError(format_error(f"torch-adapter run --deny {v}", "an op name (aten::nonzero) or a "
                                          "reason code of docs/reasons.md (TA-F001)", repr(v),
                                          why="a code the table does not have would never match",
                                          fix="--deny TA-F001, or an op name"))
        out.append(v)
    return tuple(out)


def load_baseline(path: str) -> dict[str, Any]:
    """A ``--report-json`` file of an earlier run (a usage error names what is wrong with it)."""
    from ..errors import UsageError, format_error

    where = f"torch-adapter run --baseline {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(format_error(where, "the routing log of an earlier run", "no such file",
                                      fix=f"write one with `torch-adapter run --report-json {path} SCRIPT` "
                                          "on a run you accept")) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(format_error(where, "a JSON routing log (--report-json)", f"{type(exc).__name__}: {exc}",
                                      fix="point --baseline at a file --report-json wrote")) from None
    if not isinstance(data, dict) or data.get("schema") != "torch-adapter.routing-log" or \
            not isinstance(data.get("ops"), list):
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UsageError(format_error(where, "a torch-adapter.routing-log file (--report-json)", repr(got),
                                      fix="point --baseline at a file --report-json wrote"))
    return data
