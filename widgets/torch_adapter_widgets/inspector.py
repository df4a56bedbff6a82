"""RoutingInspector: a live view of how each cell's ops were routed."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

__all__ = ["RoutingInspector"]

ROUTES = ("native", "composite", "fallback")
COLORS = {"native": "#2e7d32", "composite": "#f9a825", "fallback": "#c62828"}
SORT_KEYS = {"calls": lambda r: -r["calls"], "op": lambda r: r["op"], "route": lambda r: r["route"],
             "time": lambda r: -r["self_time_ms"], "bytes": lambda r: -r["bytes_copied"]}


class RoutingInspector(w.VBox):
    """Stacked bars per cell + op table + details. Feed it with :meth:`update` (one call per cell)."""

    def __init__(self, router: Any = None) -> None:
        self.router = router
        self.cells: list[str] = []
        self.counts: dict[str, list[int]] = {r: [] for r in ROUTES}
        self.ops: dict[tuple[str, str], dict[str, Any]] = {}
        self.figure = go.FigureWidget(
            data=[go.Bar(name=r, x=[], y=[], marker_color=COLORS[r]) for r in ROUTES],
            layout=go.Layout(barmode="stack", height=260, margin=dict(l=40, r=10, t=30, b=30),
                             title="op calls per cell by route", xaxis_title="cell", yaxis_title="calls"))
        self.filter = w.Text(placeholder="filter ops (substring)", description="filter")
        self.route_filter = w.Dropdown(options=["all", *ROUTES], value="all", description="route")
        self.sort = w.Dropdown(options=list(SORT_KEYS), value="calls", description="sort by")
        self.table = w.HTML()
        self.select = w.Select(options=[], rows=8, description="op")
        self.details = w.HTML()
        for control in (self.filter, self.route_filter, self.sort):
            control.observe(self._refresh_table, names="value")
        self.select.observe(self._show_details, names="value")
        super().__init__([self.figure, w.HBox([self.filter, self.route_filter, self.sort]), self.table,
                          w.HBox([self.select, self.details])])

    @classmethod
    def attach(cls, router: Any) -> "RoutingInspector":
        """An inspector fed by ``router`` (the loaded extension) from now on, with past cells."""
        inspector = cls(router)
        for payload in router.payloads:
            inspector.update(payload, log=None)
        router.listeners.append(inspector._on_cell)
        return inspector

    def _on_cell(self, payload: dict[str, Any]) -> None:
        self.update(payload, log=getattr(self.router, "last_log", None))

    def update(self, payload: dict[str, Any], log: Any = None) -> None:
        """Add one cell: its payload (counts) and, when given, its RoutingLog (op rows)."""
        label = f"[{payload.get('execution_count') or len(self.cells) + 1}]"
        self.cells.append(label)
        for r in ROUTES:
            self.counts[r].append(int(payload["counts"].get(r, 0)))
        with self.figure.batch_update():
            for trace, r in zip(self.figure.data, ROUTES):
                trace.x = list(self.cells)
                trace.y = list(self.counts[r])
        if log is not None:
            for row in log.table():
                key = (row["op"], row["route"])
                agg = self.ops.setdefault(key, {**row, "calls": 0, "self_time_ms": 0.0, "bytes_copied": 0,
                                                "sites": []})
                agg["calls"] += row["calls"]
                agg["self_time_ms"] += row["self_time_ms"]
                agg["bytes_copied"] += row["bytes_copied"]
                site = row.get("site")
                if site and f"{site['file']}:{site['line']}" not in agg["sites"]:
                    agg["sites"].append(f"{site['file']}:{site['line']}")
        self._refresh_table()

    def rows(self) -> list[dict[str, Any]]:
        """The op rows as the table shows them (filtered and sorted)."""
        text = self.filter.value.strip().lower()
        route = self.route_filter.value
        rows = [r for r in self.ops.values()
                if (not text or text in r["op"].lower()) and (route == "all" or r["route"] == route)]
        return sorted(rows, key=SORT_KEYS[self.sort.value])

    def _refresh_table(self, change: Any = None) -> None:
        rows = self.rows()
        body = "".join(
            f"<tr><td><code>{html.escape(r['op'])}</code></td>"
            f"<td style='color:{COLORS[r['route']]}'>{r['route']}</td><td>{r['calls']}</td>"
            f"<td>{r['self_time_ms']:.3f}</td><td>{r['bytes_copied']}</td></tr>" for r in rows[:200])
        self.table.value = ("<table><thead><tr><th>op</th><th>route</th><th>calls</th><th>self ms</th>"
                            f"<th>bytes copied</th></tr></thead><tbody>{body}</tbody></table>")
        self.select.options = [f"{r['op']} ({r['route']})" for r in rows[:200]]

    def _show_details(self, change: Any = None) -> None:
        value = self.select.value
        if not value:
            self.details.value = ""
            return
        op, route = value.rsplit(" (", 1)
        row = self.ops.get((op, route.rstrip(")")))
        if row is None:
            return
        sites = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in row["sites"]) or "<li>(none recorded)</li>"
        self.details.value = (f"<b>{html.escape(op)}</b> — {row['route']}<br>{html.escape(row.get('reason') or '')}"
                              f"<br>call sites:<ul>{sites}</ul>")
