"""Terminal rendering of a check report with rich: a summary, the files and rules with the
most findings, the notes, the runtime coverage -- and the progress bar for large trees.

:func:`summary_renderables` is pure (report in, rich renderables out); printing is the
caller's business (``console.print(*summary_renderables(report))``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .model import SEVERITIES, SEVERITY_LABEL, SEVERITY_RANK, Report

__all__ = ["summary_renderables", "make_progress", "STYLE"]

STYLE = {"handled": "green", "review": "yellow", "unsupported": "red"}
_TOP = 12


def _worst(severities: list[str]) -> str:
    return max(severities, key=SEVERITY_RANK.__getitem__)


def summary_renderables(report: Report, *, details: bool = False) -> list[Any]:
    """The summary as rich renderables; ``details=True`` lists every finding too."""
    out: list[Any] = [_head(report)]
    if report.findings:
        out += _rankings(report)
    if details:
        out.append(_findings_table(report))
    if report.runtime is not None:
        out += _runtime(report.runtime)
    if report.notes:
        out.append(_notes(report))
    return out


def _head(report: Report) -> Any:
    from rich.panel import Panel
    from rich.text import Text

    counts = report.counts()
    head = Text()
    head.append(f"torch-adapter check  {report.root}\n", style="bold")
    head.append(f"target: {report.target}{' (simulated)' if report.simulated else ''}   "
                f"files: {report.files_scanned} scanned, {len(report.files_with_findings())} with findings   "
                f"time: {report.elapsed_s:.2f} s\n")
    for sev in SEVERITIES:
        head.append(f"{SEVERITY_LABEL[sev]}: {counts[sev]}   ", style=STYLE[sev])
    return Panel(head, expand=False)


def _rankings(report: Report) -> list[Any]:
    """The files and the rules with the most findings."""
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    per_file: dict[str, list[str]] = {}
    for f in report.findings:
        per_file.setdefault(f.file, []).append(f.severity)
    files = Table(title="Files with the most findings", title_justify="left")
    files.add_column("file", overflow="fold")
    for sev in SEVERITIES:
        files.add_column(SEVERITY_LABEL[sev].split(" ", 1)[0], justify="right")
    ranked = sorted(per_file.items(), key=lambda kv: (-SEVERITY_RANK[_worst(kv[1])], -len(kv[1]), kv[0]))
    for name, sevs in ranked[:_TOP]:
        c = Counter(sevs)
        files.add_row(name, *(str(c.get(s, 0)) for s in SEVERITIES))
    if len(ranked) > _TOP:
        files.caption = f"... and {len(ranked) - _TOP} more files"
    out.append(files)

    rules = Table(title="Rules", title_justify="left")
    for col in ("rule", "severity", "what", "findings"):
        rules.add_column(col, justify="right" if col == "findings" else "left")
    by_rule = Counter(f.rule_id for f in report.findings)
    sev_of = {f.rule_id: f.severity for f in report.findings}
    for rid, n in sorted(by_rule.items(), key=lambda kv: (-SEVERITY_RANK[sev_of[kv[0]]], -kv[1], kv[0]))[:_TOP]:
        meta = report.rules.get(rid, {})
        rules.add_row(rid, Text(SEVERITY_LABEL[sev_of[rid]], style=STYLE[sev_of[rid]]),
                      str(meta.get("title", "")), str(n))
    if len(by_rule) > _TOP:
        rules.caption = f"... and {len(by_rule) - _TOP} more rules"
    out.append(rules)
    return out


def _findings_table(report: Report) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Findings", title_justify="left", show_lines=False)
    for col in ("where", "rule", "", "message"):
        table.add_column(col, overflow="fold")
    for f in report.findings:
        where = f"{f.file}:{f.start_line}" + (f" (cell {f.cell}, line {f.cell_line})" if f.cell is not None else "")
        table.add_row(where, f.rule_id, Text(SEVERITY_LABEL[f.severity].split(" ", 1)[0]), f.message)
    return table


def _runtime(rt: Any) -> list[Any]:
    """The --run part: routes of the calls made, and the top fallbacks with their causes."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    shares = rt.shares
    t = Text()
    t.append(f"runtime: {' '.join(rt.command)}  (target {rt.target}{', simulated' if rt.simulated else ''}, "
             f"exit {rt.exit_code})\n", style="bold")
    for route, style in (("native", "green"), ("composite", "yellow"), ("yours", "blue"), ("fallback", "red"),
                         ("refused", "magenta")):
        if route in ("yours", "refused") and not rt.calls_by_route.get(route, 0):
            continue
        t.append(f"{route}: {rt.calls_by_route.get(route, 0)} calls ({shares[route]:.1%}), "
                 f"{rt.ops_by_route.get(route, 0)} ops   ", style=style)
    out.append(Panel(t, expand=False))
    if rt.top_fallbacks:
        fb = Table(title="Top fallback ops", title_justify="left")
        for col in ("op", "calls", "ms", "caused by"):
            fb.add_column(col, overflow="fold")
        for g in rt.top_fallbacks:
            where = ", ".join(f"{s.file}:{s.line}" for s in g.sites[:3]) or "-"
            fb.add_row(g.op, str(g.calls), f"{g.self_time_ms:.2f}", where)
        out.append(fb)
    return out


def _notes(report: Report) -> Any:
    from rich.table import Table

    notes = Table(title=f"Notes ({len(report.notes)})", title_justify="left")
    notes.add_column("file", overflow="fold")
    notes.add_column("kind")
    notes.add_column("note", overflow="fold")
    for n in report.notes[:_TOP]:
        notes.add_row(n.file + (f":{n.line}" if n.line else ""), n.kind, n.message)
    if len(report.notes) > _TOP:
        notes.caption = f"... and {len(report.notes) - _TOP} more (all in the HTML/JSON report)"
    return notes


def make_progress(console: Any) -> Any:
    """A transient rich progress bar for the scan (``progress.update(task, completed=n)``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=True)
