"""The rule table rendered for people: Markdown (``docs/check.md``), JSON, rich.

``torch-adapter check --list-rules md`` prints the table that ``docs/check.md`` embeds;
a test keeps the two in sync.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from .model import SEVERITY_LABEL
from .ruleset import Rule

__all__ = ["rule_rows", "rules_markdown", "rules_json", "rules_renderable"]


def _match_summary(rule: Rule) -> str:
    m = rule.match
    parts = []
    for kind in ("call", "attr", "method", "attr_name", "import", "decorator"):
        if kind in m:
            names = list(m[kind])
            shown = ", ".join(names[:4]) + (f", … (+{len(names) - 4})" if len(names) > 4 else "")
            parts.append(f"{kind}: {shown}")
    if "keyword" in m:
        parts.append("keyword: " + ", ".join(f"{k}=" for k in m["keyword"]))
    if "instance" in m:
        parts.append("instance: " + ", ".join(m["instance"]["methods"][:4]))
    for kind in ("string", "compare", "name", "regex"):
        if kind in m:
            parts.append(f"{kind}: /{m[kind][:60]}{'…' if len(m[kind]) > 60 else ''}/")
    if "file" in m:
        parts.append("file: " + ", ".join(m["file"]))
    langs = [lang for lang in m.get("languages", ["python"]) if lang != "python"]
    if langs:
        parts.append("in " + ", ".join(langs))
    return "; ".join(parts)


def rule_rows(rules: Iterable[Rule], runtime: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """One plain row per rule (static rules, then runtime rules), worded for any target."""
    from .engine import target_facts

    facts = target_facts("any")
    rows = [{"id": r.id, "title": r.title, "severity": r.severity,
             "severity_by_target": dict(r.severity_by_target), "targets": list(r.targets or []),
             "matches": _match_summary(r), "message": r.message.format_map(facts),
             "alternative": r.alternative.format_map(facts), "docs": r.docs, "rewrite": bool(r.rewrite),
             "source": r.source} for r in rules]
    rows += [{"id": r["id"], "title": r["title"], "severity": r["severity"], "severity_by_target": {},
              "targets": [], "matches": "runtime (--run)", "message": r["message"].format_map(facts),
              "alternative": r["alternative"].format_map(facts), "docs": "", "rewrite": False,
              "source": "runtime"} for r in runtime]
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rules_markdown(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``rows`` (as in docs/check.md)."""
    out = ["| id | severity | what | matches | on the target | instead | rewrite |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        sev = SEVERITY_LABEL[r["severity"]]
        if r["severity_by_target"]:
            sev += " (" + ", ".join(f"{t}: {s}" for t, s in sorted(r["severity_by_target"].items())) + ")"
        if r["targets"]:
            sev += " — only for " + ", ".join(r["targets"])
        out.append(f"| {r['id']} | {_cell(sev)} | {_cell(r['title'])} | {_cell(r['matches'])} | "
                   f"{_cell(r['message'])} | {_cell(r['alternative'])} | {'diff' if r['rewrite'] else ''} |")
    return "\n".join(out) + "\n"


def rules_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1, ensure_ascii=False) + "\n"


def rules_renderable(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title=f"torch-adapter check rules ({len(rows)})", title_justify="left")
    for col in ("id", "severity", "what", "instead"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["id"], SEVERITY_LABEL[r["severity"]], r["title"], r["alternative"])
    return table
