"""The report model of ``torch-adapter check``: plain dataclasses, no behaviour.

The engine (:mod:`.engine`) and the runtime join (:mod:`.runtime`) fill a :class:`Report`;
the renderers (:mod:`.json_report`, :mod:`.html_report`, :mod:`.render_terminal`) only read
it. :meth:`Report.to_dict` is the versioned JSON document (``SCHEMA``/``VERSION``),
documented field by field in ``docs/check.md``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..routing.wording import ROUTES

__all__ = [
    "SCHEMA",
    "VERSION",
    "SEVERITIES",
    "SEVERITY_RANK",
    "SEVERITY_LABEL",
    "SEVERITY_ICON",
    "Finding",
    "Note",
    "FileResult",
    "SiteRef",
    "OpRow",
    "FallbackOp",
    "RuntimeSection",
    "Report",
]

SCHEMA = "torch-adapter.check-report"
VERSION = 2  # 2: the runtime summary counts five routes (yours, refused: docs/routing.md)
READS = (1, 2)

# Ordered from harmless to blocking; "--fail-on warn" means review or worse.
SEVERITIES = ("handled", "review", "unsupported")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
SEVERITY_ICON = {"handled": "✅", "review": "⚠️", "unsupported": "❌"}
SEVERITY_LABEL = {"handled": "✅ handled", "review": "⚠️ needs review", "unsupported": "❌ will not run"}


@dataclass
class Finding:
    """One CUDA-specific construct at one place in one file.

    ``start_line``/``end_line`` are 1-based lines of ``file`` (for a notebook: lines of the
    ``.ipynb`` file as an editor shows it); ``cell``/``cell_line``/``cell_end_line`` locate
    the finding inside a notebook (cell index from 0 over all cells, line from 1).
    """

    rule_id: str
    severity: str
    title: str
    file: str
    start_line: int
    end_line: int
    col: int
    excerpt: str
    message: str
    alternative: str
    docs: str
    rewrite: str | None = None
    language: str = "python"
    cell: int | None = None
    cell_line: int | None = None
    cell_end_line: int | None = None
    runtime: str | None = None  # what the line did at run time (--run), from the redirect log

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Note:
    """Something the scan could not do (a file skipped or only partly read)."""

    file: str
    kind: str  # syntax-error | binary | undecodable | too-large | symlink-loop | ...
    message: str
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FileResult:
    """What scanning one file produced."""

    file: str
    language: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    parsed: bool = False  # the file had candidate tokens and was parsed / matched


@dataclass
class SiteRef:
    """A user call site that the routing log attributes ops to."""

    file: str
    line: int
    function: str
    in_project: bool = False  # the file is under the scanned path
    excerpt: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OpRow:
    """One (op, route, site) row of the routing log."""

    op: str
    route: str
    calls: int
    self_time_ms: float
    bytes_copied: int
    reason: str
    via: str | None
    site: SiteRef | None
    parent: str | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["site"] = self.site.to_dict() if self.site else None
        return out


@dataclass
class FallbackOp:
    """An op that fell back to the CPU, with every user line that caused it."""

    op: str
    calls: int
    self_time_ms: float
    bytes_copied: int
    reason: str
    sites: list[SiteRef] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sites"] = [s.to_dict() for s in self.sites]
        return out


@dataclass
class RuntimeSection:
    """The runtime part: what the command's aten ops did on the target."""

    command: list[str]
    target: str
    simulated: bool
    exit_code: int | None
    ops_by_route: dict[str, int]  # distinct ops per route
    calls_by_route: dict[str, int]  # calls per route
    ops: list[OpRow] = field(default_factory=list)
    top_fallbacks: list[FallbackOp] = field(default_factory=list)

    @property
    def shares(self) -> dict[str, float]:
        """Share of calls per route (0..1); all zeros when nothing ran."""
        total = sum(self.calls_by_route.values())
        return {r: (self.calls_by_route.get(r, 0) / total if total else 0.0)
                for r in ROUTES}

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": list(self.command),
            "target": self.target,
            "simulated": self.simulated,
            "exit_code": self.exit_code,
            "summary": {"ops": dict(self.ops_by_route), "calls": dict(self.calls_by_route),
                        "shares": {k: round(v, 6) for k, v in self.shares.items()}},
            "ops": [row.to_dict() for row in self.ops],
            "top_fallbacks": [f.to_dict() for f in self.top_fallbacks],
        }


@dataclass(repr=False)
class Report:
    """Everything one ``check`` run found."""

    root: str
    target: str
    simulated: bool
    tool_version: str
    generated: str
    files_scanned: int = 0
    files_parsed: int = 0
    elapsed_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> metadata (fired rules)
    runtime: RuntimeSection | None = None

    def __repr__(self) -> str:  # short: a notebook shows this under the HTML report
        counts = ", ".join(f"{n} {sev}" for sev, n in self.counts().items())
        return (f"<check Report {self.root!r} target={self.target}: {self.files_scanned} files, "
                f"{len(self.findings)} findings ({counts}), {len(self.notes)} notes>")

    def counts(self) -> dict[str, int]:
        """Findings per severity, every severity present (0 when none)."""
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in SEVERITIES}

    def worst(self) -> str | None:
        """The most severe severity found, or None for a clean report."""
        present = [s for s in SEVERITIES if any(f.severity == s for f in self.findings)]
        return present[-1] if present else None

    def files_with_findings(self) -> list[str]:
        return sorted({f.file for f in self.findings})

    def summary(self) -> dict[str, Any]:
        by_rule = Counter(f.rule_id for f in self.findings)
        return {
            "files_scanned": self.files_scanned,
            "files_parsed": self.files_parsed,
            "files_with_findings": len(self.files_with_findings()),
            "findings": len(self.findings),
            "by_severity": self.counts(),
            "by_rule": dict(sorted(by_rule.items())),
            "notes": len(self.notes),
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "tool": {"name": "torch-adapter", "version": self.tool_version},
            "generated": self.generated,
            "root": self.root,
            "target": self.target,
            "simulated": self.simulated,
            "summary": self.summary(),
            "rules": self.rules,
            "findings": [f.to_dict() for f in self.findings],
            "notes": [n.to_dict() for n in self.notes],
            "runtime": self.runtime.to_dict() if self.runtime else None,
        }
