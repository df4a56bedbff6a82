"""The coverage report as one self-contained HTML page: a plotly chart (plotly.js inlined
from the installed plotly package — no CDN, no network) and the table with every row's
fallback ops and reasons. A pure function of the report; plotly is imported when called.
"""

from __future__ import annotations

import html
from typing import Any

from .data import ROUTES, CoverageReport, CoverageRow
from .render import fallback_text, pct

__all__ = ["render_html", "figure"]

_COLORS = {"native": "#2e7d32", "composite": "#f9a825", "fallback": "#c62828"}
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem 2rem; color: #212121; }
h1 { font-size: 1.4rem; margin-bottom: .3rem; } h2 { font-size: 1.1rem; margin: 1rem 0 0; }
.scope { background: #f5f5f5; border-left: 4px solid #607d8b; padding: .6rem 1rem; margin: 1rem 0; }
table { border-collapse: collapse; font-size: .85rem; margin-top: 1rem; }
th, td { border: 1px solid #ddd; padding: .3rem .5rem; vertical-align: top; text-align: left; }
th { background: #eceff1; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.err { color: #c62828; } .native { color: #2e7d32; } .composite { color: #8d6e00; } .fallback { color: #c62828; }
ul { margin: 0; padding-left: 1.1rem; } small { color: #616161; }
"""


def figure(report: CoverageReport) -> Any:
    """A plotly Figure: stacked shares per model × target, by calls (shown) or by distinct ops
    (the buttons switch)."""
    import plotly.graph_objects as go

    rows = [r for r in report.rows if not r.error]
    x = [[r.model for r in rows], [r.target for r in rows]]
    fig = go.Figure()
    for kind in ("calls", "ops"):
        for route in ROUTES:
            shares = [(r.calls_pct if kind == "calls" else r.ops_pct)[route] for r in rows]
            counts = [(r.calls if kind == "calls" else r.ops)[route] for r in rows]
            unit = "calls" if kind == "calls" else "distinct ops"
            fig.add_trace(go.Bar(
                x=x, y=shares, name=route, marker_color=_COLORS[route], visible=kind == "calls",
                legendgroup=route, customdata=counts,
                hovertemplate=f"%{{x}}<br>{route}: %{{y:.2f}} %% (%{{customdata}} {unit})<extra></extra>"))
    n = len(ROUTES)
    buttons = [dict(label=label, method="update",
                    args=[{"visible": [i // n == k for i in range(2 * n)]},
                          {"yaxis.title.text": f"share of {label} (%)"}])
               for k, label in enumerate(("op calls", "distinct ops"))]
    fig.update_layout(
        barmode="stack", height=480, margin=dict(l=60, r=20, t=50, b=90),
        yaxis=dict(title="share of op calls (%)", range=[0, 100]),
        updatemenus=[dict(type="buttons", direction="right", buttons=buttons, x=0, y=1.02, xanchor="left",
                          yanchor="bottom")],
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _fallbacks(row: CoverageRow) -> str:
    items = [f"<li><code>{html.escape(fallback_text(f))}</code><br><small>{html.escape(f.reason)}"
             + (f"<br>host-selected: {html.escape(f.host_selected)}" if f.host_selected else "") + "</small></li>"
             for f in (*row.top_fallbacks, *row.nested_fallbacks)]
    return f"<ul>{''.join(items)}</ul>" if items else "—"


def _row(row: CoverageRow) -> str:
    head = (f"<td>{html.escape(row.model)}</td><td>{html.escape(row.target)}"
            f"{' <small>(simulated)</small>' if row.simulated else ''}</td>")
    if row.error:
        return f"<tr>{head}<td colspan='5' class='err'>step failed: {html.escape(row.error)}</td></tr>"

    def shares(p: dict[str, float]) -> str:
        return " / ".join(f"<span class='{r}'>{pct(p[r])}</span>" for r in ROUTES)

    return (f"<tr>{head}<td class='num'>{row.total_calls}</td><td class='num'>{shares(row.calls_pct)}</td>"
            f"<td class='num'>{row.total_ops}</td><td class='num'>{shares(row.ops_pct)}</td>"
            f"<td>{_fallbacks(row)}</td></tr>")


def render_html(report: CoverageReport) -> str:
    """The whole page as a string (write it with any file API; the CLI writes atomically)."""
    import plotly.io as pio

    chart = pio.to_html(figure(report), include_plotlyjs=True, full_html=False,
                        config={"displaylogo": False, "responsive": True})
    rows = "\n".join(_row(r) for r in report.rows)
    sub = f"torch {html.escape(report.torch_version)} · targets: {html.escape(', '.join(report.targets))}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="torch-adapter coverage (schema torch-adapter.coverage v1)">
<title>torch-adapter coverage</title><style>{_CSS}</style></head>
<body>
<h1>Op coverage by model family × target</h1>
<div><small>{sub}</small></div>
<h2>Where the ops of one training step would run</h2>
<div class="scope"><b>Scope.</b> {html.escape(report.scope)}<br><b>Counting.</b> {html.escape(report.counting)}</div>
{chart}
<table>
<thead><tr><th>model</th><th>target</th><th>calls</th><th>by calls: native / composite / fallback %</th>
<th>ops</th><th>by distinct ops %</th><th>fallback ops (top level, then inside composite ops)</th></tr></thead>
<tbody>
{rows}
</tbody></table>
</body></html>
"""
