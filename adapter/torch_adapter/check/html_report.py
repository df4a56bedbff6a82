"""HTML rendering of a check report: one self-contained file (CSS, JS and the SVG routing
chart inline; a Content-Security-Policy that forbids any network access).

:func:`html_context` turns the report into plain template data (pure; tested directly);
:func:`render_html` fills ``templates/report.html.j2`` with it (Jinja2, autoescaped).
"""

from __future__ import annotations

import functools
from collections import Counter
from importlib import resources
from typing import Any

from .model import SEVERITIES, SEVERITY_ICON, SEVERITY_LABEL, SEVERITY_RANK, Finding, Report

__all__ = ["render_html", "html_context", "ROUTE_COLORS"]

ROUTE_COLORS = {"native": "#2e9d4f", "composite": "#d9a21b", "yours": "#1565c0", "fallback": "#d2453b",
                "refused": "#6a1b9a"}
_MAX_OPS = 300
_CHART_W = 560


def _lines(f: Finding) -> str:
    span = f"{f.start_line}" if f.end_line == f.start_line else f"{f.start_line}–{f.end_line}"
    if f.cell is not None:
        cell_span = f"{f.cell_line}" if f.cell_end_line in (None, f.cell_line) else f"{f.cell_line}–{f.cell_end_line}"
        return f"cell {f.cell}, line {cell_span} (file line {span})"
    return f"line {span}"


def _diff_lines(diff: str | None) -> list[tuple[str, str]]:
    if not diff:
        return []
    out = []
    for line in diff.rstrip("\n").split("\n"):
        kind = "hunk" if line.startswith(("@@", "---", "+++")) else "add" if line.startswith("+") else \
            "del" if line.startswith("-") else "ctx"
        out.append((kind, line))
    return out


def _bars(parts: dict[str, float]) -> list[dict[str, Any]]:
    total = sum(parts.values())
    x = 0.0
    out = []
    for route in ROUTE_COLORS:
        w = (parts.get(route, 0) / total * _CHART_W) if total else 0.0
        out.append({"route": route, "x": round(x, 2), "w": round(w, 2), "color": ROUTE_COLORS[route],
                    "value": parts.get(route, 0), "share": (parts.get(route, 0) / total) if total else 0.0})
        x += w
    return out


def html_context(report: Report) -> dict[str, Any]:
    """Everything the template shows, as plain data."""
    files: dict[str, list[dict[str, Any]]] = {}
    for i, f in enumerate(report.findings):
        files.setdefault(f.file, []).append({
            "n": i, "rule": f.rule_id, "title": f.title, "severity": f.severity,
            "icon": SEVERITY_ICON[f.severity], "label": SEVERITY_LABEL[f.severity], "where": _lines(f),
            "line": f.start_line, "message": f.message, "alternative": f.alternative, "docs": f.docs,
            "excerpt": f.excerpt, "diff": _diff_lines(f.rewrite), "runtime": f.runtime, "language": f.language})
    file_rows = []
    for name, items in files.items():
        c = Counter(x["severity"] for x in items)
        worst = max(c, key=SEVERITY_RANK.__getitem__)
        file_rows.append({"name": name, "findings": items, "counts": {s: c.get(s, 0) for s in SEVERITIES},
                          "worst": worst, "icon": SEVERITY_ICON[worst]})
    file_rows.sort(key=lambda r: (-SEVERITY_RANK[r["worst"]], r["name"]))
    by_rule = Counter(f.rule_id for f in report.findings)
    rules = [{"id": rid, "count": by_rule[rid], **report.rules.get(rid, {}),
              "label": SEVERITY_LABEL[report.rules.get(rid, {}).get("severity", "review")]}
             for rid in sorted(by_rule, key=lambda r: (-SEVERITY_RANK[report.rules.get(r, {}).get("severity", "review")], r))]
    runtime = None
    if report.runtime is not None:
        rt = report.runtime
        top = rt.top_fallbacks
        most = max((g.calls for g in top), default=0)
        runtime = {
            "command": " ".join(rt.command), "target": rt.target, "simulated": rt.simulated,
            "exit_code": rt.exit_code, "calls": _bars({k: float(v) for k, v in rt.calls_by_route.items()}),
            "ops": _bars({k: float(v) for k, v in rt.ops_by_route.items()}),
            "top": [{"op": g.op, "calls": g.calls, "ms": g.self_time_ms, "bytes": g.bytes_copied,
                     "reason": g.reason, "w": round(g.calls / most * (_CHART_W - 220), 2) if most else 0,
                     "sites": [s.to_dict() for s in g.sites]} for g in top],
            "rows": [r.to_dict() for r in rt.ops[:_MAX_OPS]], "more_rows": max(0, len(rt.ops) - _MAX_OPS),
            "colors": ROUTE_COLORS, "chart_w": _CHART_W,
        }
    counts = report.counts()
    return {
        "root": report.root, "target": report.target, "simulated": report.simulated,
        "generated": report.generated, "version": report.tool_version, "elapsed": f"{report.elapsed_s:.2f}",
        "files_scanned": report.files_scanned, "files": file_rows, "total": len(report.findings),
        "cards": [{"severity": s, "label": SEVERITY_LABEL[s], "count": counts[s]} for s in SEVERITIES],
        "rules": rules, "notes": [n.to_dict() for n in report.notes], "runtime": runtime,
    }


@functools.lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2

    text = resources.files(__package__).joinpath("templates", "report.html.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    return env.from_string(text)


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    return _template().render(**html_context(report))
