"""``%adapter redirects``: the session's migration log in a notebook (docs/redirect.md).

Every rewritten call once per site: where (``cell [N], line M`` for a cell, ``file:line`` under the
working directory relative to it), the user's source line, what was asked and what it became, the
class (same / changed / dummy) and the reason code (docs/reasons.md), how often. Shown as an HTML
table (Jinja2, autoescaped) with a plain-text rendering for front ends without HTML; the rows are
:meth:`MigrationView.rows` (the JSON ``run --report-json`` writes under ``redirects``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MigrationView"]

_TEMPLATE = """\
<div class="torch-adapter-migration" style="font-size:12px">
<b>torch_adapter</b>: {{ rows|length }} rewritten call site{{ '' if rows|length == 1 else 's' }} on {{ target }}
{%- if classes %} ({% for name, n in classes %}{{ n }} {{ name }}{{ ', ' if not loop.last }}{% endfor %}){% endif %}
{%- if rows %}
<table style="border-collapse:collapse;margin-top:4px">
<thead><tr>{% for h in heads %}<th style="text-align:left;padding:1px 6px">{{ h }}</th>{% endfor %}</tr></thead>
<tbody>
{%- for r in rows %}
<tr data-class="{{ r['class'] }}"><td style="white-space:nowrap">{{ r.site }}</td><td><code>{{ r.source or '' }}</code></td>
<td><code>{{ r.asked }}</code></td><td>{{ r.became }}</td><td>{{ r['class'] }}</td>
<td><code title="docs/reasons.md#{{ r.code|lower }}">{{ r.code }}</code></td><td style="text-align:right">{{ r.count }}</td></tr>
{%- endfor %}
</tbody></table>
{%- endif %}
</div>"""
HEADS = ("site", "source line", "asked", "became", "class", "code", "count")


class MigrationView:
    """The rows of a redirect log, each with its site worded for the notebook, shown as a table."""

    def __init__(self, log: Any, target: str) -> None:
        from ..core.callsite import site_text

        self.target = target
        self._rows: list[dict[str, Any]] = []
        for entry in log.entries():
            row = entry.as_dict()
            row["site"] = ("(install)" if entry.file == "<install>" else
                           site_text({"file": entry.file, "line": entry.line, "library": entry.library})
                           or f"{entry.file}:{entry.line}")
            self._rows.append(row)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per call site: ``site``, ``source``, ``asked``, ``became``, ``class``, ``code``, ``count``."""
        return [dict(r) for r in self._rows]

    def _classes(self) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for r in self._rows:
            counts[r["class"]] = counts.get(r["class"], 0) + 1
        return [(name, counts[name]) for name in ("changed", "same", "dummy") if name in counts]

    def _repr_html_(self) -> str:
        import jinja2

        env = jinja2.Environment(autoescape=True)
        return env.from_string(_TEMPLATE).render(rows=self._rows, heads=HEADS, target=self.target,
                                                 classes=self._classes())

    def text(self) -> str:
        head = f"torch_adapter: {len(self._rows)} rewritten call site{'' if len(self._rows) == 1 else 's'} on {self.target}"
        if self._classes():
            head += " (" + ", ".join(f"{n} {name}" for name, n in self._classes()) + ")"
        lines = [head]
        for r in self._rows:
            source = f"  | {r['source']}" if r.get("source") else ""
            lines.append(f"  {r['site']}: {r['asked']} ×{r['count']} → {r['became']} [{r['code']} {r['class']}]{source}")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())
