"""RoutingInspector: how each cell's ops were routed, over the whole session.

Fed once per cell (never per op) with the cell's payload and its op rows; the chart and
the table come from the same cells, so their totals agree. The chart is inline SVG in an
``ipywidgets.HTML`` (see :mod:`._svg`): a reloaded front end gets it back from the
kernel's widget state, and the widget state a notebook stores stays a few kilobytes.
Front ends without widgets show :meth:`RoutingInspector.html` / :meth:`text`.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from torch_adapter.routing.wording import COLORS, LONG, ROUTES, format_bytes

from ._svg import stacked_bars

__all__ = ["RoutingInspector", "format_bytes"]

SORT_KEYS = {"calls": lambda r: (-r["calls"], r["op"]), "op": lambda r: (r["op"], r["target"]),
             "route": lambda r: (ROUTES.index(r["route"]), -r["calls"]),
             "time": lambda r: (-r["self_time_ms"], r["op"]), "bytes": lambda r: (-r["bytes_copied"], r["op"])}
ALL = "all"


# The per-cell trace finds the user's line only where it is cheap to: the calls the adapter itself
# routes (CPU fallbacks, decompositions, your registrations); every other op is counted by the C++
# observer without a stack walk. The column says so instead of staying blank.
NO_SITE_WHY = ("the per-cell trace records the line of the calls the adapter routes itself (CPU fallbacks, "
               "decompositions, your registrations); %%adapter_trace records every op's first call site")
NO_SITE = f"<span style='color:#999' title='{html.escape(NO_SITE_WHY, quote=True)}'>—</span>"


def _shown(counts: dict[str, int]) -> list[str]:
    """The routes a line shows: native, composite and fallback always; yours and refused when any."""
    return [r for r in ROUTES if r in ("native", "composite", "fallback") or counts.get(r, 0)]


def _label(payload: dict[str, Any]) -> str:
    return f"{payload['target']}{' (simulated)' if payload.get('simulated') else ''}"


class RoutingInspector(w.VBox):
    """Stacked bars per cell + a capped, filterable op table + the selected op's details.

    Feed it with :meth:`update` (one call per cell); :meth:`attach` feeds it every cell
    the extension has reported, then each new one.
    """

    def __init__(self, router: Any = None, max_rows: int = 20) -> None:
        self.router = router
        self.max_rows = max_rows
        self.cells: list[dict[str, Any]] = []
        self.ops: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.dtype_findings: dict[tuple[Any, ...], dict[str, Any]] = {}  # (op, dtype, target, site) -> finding
        self.handle: Any = None  # a display handle kept current after each cell (exports)
        self.header = w.HTML()
        self.chart = w.HTML()
        self.filter = w.Text(placeholder="substring of the op name", description="filter",
                             layout=w.Layout(width="230px"))
        self.route_filter = w.Dropdown(options=[ALL, *ROUTES], value=ALL, description="route",
                                       layout=w.Layout(width="170px"))
        self.target_filter = w.Dropdown(options=[ALL], value=ALL, description="target",
                                        layout=w.Layout(width="220px"))
        self.sort = w.Dropdown(options=list(SORT_KEYS), value="calls", description="sort by",
                               layout=w.Layout(width="170px"))
        self.select = w.Dropdown(options=[], value=None, description="op", layout=w.Layout(width="460px"))
        self.details = w.HTML()
        self.table = w.HTML()
        for control in (self.filter, self.route_filter, self.target_filter, self.sort):
            control.observe(self._refresh_table, names="value")
        self.select.observe(self._show_details, names="value")
        super().__init__([self.header, self.chart,
                          w.HBox([self.filter, self.route_filter, self.target_filter, self.sort]),
                          self.select, self.details, self.table])
        self.add_class("torch-adapter-inspector")
        self._refresh()

    @classmethod
    def attach(cls, router: Any, **kwargs: Any) -> "RoutingInspector":
        """An inspector with every cell ``router`` (the loaded extension) reported, fed from now on."""
        inspector = cls(router, **kwargs)
        tables = getattr(router, "tables", None) or [None] * len(router.payloads)
        for payload, rows in zip(router.payloads, tables):
            inspector.update(payload, rows=rows, refresh=False)
        inspector._refresh()
        router.listeners.append(inspector._on_cell)
        return inspector

    def detach(self) -> None:
        """Stop following cells: the router no longer calls this inspector (it keeps what it shows).
        ``%adapter_inspector`` detaches the one it opened before, ``close()`` and ``%unload_ext`` too —
        a listener left attached per inspector kept every old one updating, and alive, for good."""
        listeners = getattr(self.router, "listeners", None)
        while listeners is not None and self._on_cell in listeners:
            listeners.remove(self._on_cell)

    def close(self) -> None:
        self.detach()
        super().close()

    def _on_cell(self, payload: dict[str, Any]) -> None:
        tables = getattr(self.router, "tables", None)
        self.update(payload, rows=tables[-1] if tables else None)
        if self.handle is not None:
            self.handle.update(self)

    # -- data --------------------------------------------------------------------------------
    def update(self, payload: dict[str, Any], log: Any = None, rows: list[dict[str, Any]] | None = None,
               refresh: bool = True) -> None:
        """Add one cell: its payload (the chart) and its op rows (``rows``, or ``log.table()``)."""
        count = payload.get("execution_count")
        label = f"[{count}]" if count is not None else f"#{len(self.cells) + 1}"
        target = _label(payload)
        self.cells.append({"label": label, "target": target,
                           "counts": {r: int(payload["counts"].get(r, 0)) for r in ROUTES}})
        if rows is None and log is not None:
            rows = log.table()
        from torch_adapter.core.callsite import site_text

        for row in rows or []:
            key = (row["op"], row["route"], target)
            agg = self.ops.setdefault(key, {"op": row["op"], "route": row["route"], "target": target,
                                            "reason": row.get("reason") or "", "calls": 0, "self_time_ms": 0.0,
                                            "bytes_copied": 0, "cells": [], "sites": []})
            agg["calls"] += int(row["calls"])
            agg["self_time_ms"] += float(row.get("self_time_ms") or 0.0)
            agg["bytes_copied"] += int(row.get("bytes_copied") or 0)
            if label not in agg["cells"]:
                agg["cells"].append(label)
            site = site_text(row.get("site"))
            if site and site not in agg["sites"]:
                agg["sites"].append(site)
        for f in (payload.get("dtypes") or {}).get("findings", ()):  # their own kind: never a route
            agg = self.dtype_findings.setdefault((f["op"], f["dtype"], target, f.get("site")),
                                                 {**f, "target": target, "calls": 0})
            agg["calls"] += int(f.get("calls") or 0)
        if refresh:
            self._refresh()

    def totals(self) -> dict[str, int]:
        """Op calls per route over the cells shown (the chart's sum)."""
        return {r: sum(c["counts"][r] for c in self.cells) for r in ROUTES}

    def rows(self) -> list[dict[str, Any]]:
        """Every op row that passes the filters, sorted (the table shows the first ``max_rows``)."""
        text = self.filter.value.strip().lower()
        route, target = self.route_filter.value, self.target_filter.value
        rows = [r for r in self.ops.values()
                if (not text or text in r["op"].lower()) and route in (ALL, r["route"])
                and target in (ALL, r["target"])]
        return sorted(rows, key=SORT_KEYS[self.sort.value])

    # -- views -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        targets = [ALL, *sorted({c["target"] for c in self.cells})]
        if list(self.target_filter.options) != targets:
            value = self.target_filter.value
            self.target_filter.options = targets
            self.target_filter.value = value if value in targets else ALL
        self.header.value = self._header_html()
        self.chart.value = self._chart_svg()
        self._refresh_table()

    def _header_html(self) -> str:
        t = self.totals()
        n = len(self.cells)
        return (f"<div class='torch-adapter-inspector-head'><b>Op routing</b> · {n} {'cell' if n == 1 else 'cells'} · "
                + " · ".join(f"<span data-route='{r}'>{t[r]:,} {LONG[r]}</span>" for r in _shown(t)) + " op calls"
                f"{self._dtype_html()}</div>")

    def _dtype_html(self) -> str:
        """The calls a simulated target's real backend refuses for their dtype (own kind, not a route)."""
        found = sorted(self.dtype_findings.values(), key=lambda f: -f["calls"])
        if not found:
            return ""
        items = "".join(f"<li data-kind='dtype'>dtype {html.escape(f['dtype'])} not on {html.escape(f['target'])}: "
                        f"<code>{html.escape(f['op'])}</code> ×{f['calls']:,}"
                        f"{' at ' + html.escape(f['site']) if f.get('site') else ''}</li>" for f in found[:10])
        return f" · <span data-kind='dtype'>{sum(f['calls'] for f in found):,} dtype refused</span><ul>{items}</ul>"

    def _chart_svg(self) -> str:
        labels = [c["label"] for c in self.cells]
        routes = _shown(self.totals())
        series = {r: [c["counts"][r] for c in self.cells] for r in routes}
        return f"<div style='overflow-x:auto'>{stacked_bars(labels, series, {r: COLORS[r] for r in routes}, title='op calls per cell by route')}</div>"

    def _table_html(self, rows: list[dict[str, Any]]) -> str:
        shown = rows[:self.max_rows]
        head = "".join(f"<th style='text-align:{a};padding:1px 6px'>{h}</th>" for h, a in (
            ("op", "left"), ("target", "left"), ("route", "left"), ("calls", "right"), ("self ms", "right"),
            ("copied", "right"), ("cells", "left"), ("first call site", "left")))
        body = "".join(
            f"<tr data-route='{r['route']}'><td style='text-align:left'><code>{html.escape(r['op'])}</code></td>"
            f"<td style='text-align:left'>{html.escape(r['target'])}</td>"
            f"<td style='text-align:left;color:{COLORS[r['route']]}'>{r['route']}</td>"
            f"<td style='text-align:right'>{r['calls']:,}</td>"
            f"<td style='text-align:right'>{r['self_time_ms']:.3f}</td>"
            f"<td style='text-align:right'>{format_bytes(r['bytes_copied']) if r['bytes_copied'] else ''}</td>"
            f"<td style='text-align:left'>{html.escape(' '.join(r['cells']))}</td>"
            f"<td style='text-align:left;white-space:nowrap'>{html.escape(r['sites'][0]) if r['sites'] else NO_SITE}</td></tr>"
            for r in shown)
        calls = {route: sum(r["calls"] for r in rows if r["route"] == route) for route in ROUTES}
        more = (f"<div class='torch-adapter-more'>{len(rows) - len(shown)} more rows: filter or sort to see them "
                "(<code>inspector.rows()</code> has them all)</div>") if len(rows) > len(shown) else ""
        return (f"<div class='torch-adapter-table' style='max-height:360px;overflow:auto'>"
                f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table></div>{more}"
                f"<div class='torch-adapter-table-totals' data-rows='{len(rows)}' "
                + " ".join(f"data-{r}='{calls[r]}'" for r in ROUTES) + " style='color:#666'>"
                f"{len(rows)} rows · " + " · ".join(f"{calls[r]:,} {LONG[r]}" for r in _shown(calls)) + " op calls</div>")

    def _refresh_table(self, change: Any = None) -> None:
        rows = self.rows()
        self.table.value = self._table_html(rows)
        options = [(f"{r['op']} · {r['route']} · {r['target']}", (r["op"], r["route"], r["target"]))
                   for r in rows[:200]]
        value = self.select.value
        self.select.options = options
        self.select.value = value if any(v == value for _, v in options) else None
        self._show_details()

    def _show_details(self, change: Any = None) -> None:
        row = self.ops.get(self.select.value) if self.select.value else None
        if row is None:
            self.details.value = "<span style='color:#666'>Pick an op to read its reason and call sites.</span>"
            return
        sites = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in row["sites"]) or \
            f"<li>(none recorded: {html.escape(NO_SITE_WHY)})</li>"
        self.details.value = (f"<b>{html.escape(row['op'])}</b> — {row['route']} on {html.escape(row['target'])}"
                              f"<br>{html.escape(row['reason'])}<br>call sites:<ul>{sites}</ul>")

    def html(self) -> str:
        """A static rendering: totals, chart and table (front ends without widgets, HTML exports)."""
        return f"<div class='torch-adapter-inspector'>{self._header_html()}{self._chart_svg()}{self._table_html(self.rows())}</div>"

    def text(self) -> str:
        """A plain-text rendering: totals per cell and the top ops."""
        t = self.totals()
        lines = [f"torch_adapter RoutingInspector: {len(self.cells)} {'cell' if len(self.cells) == 1 else 'cells'} · "
                 + " · ".join(f"{t[r]:,} {LONG[r]}" for r in _shown(t)) + " op calls"]
        lines += [f"  cell {c['label']:>6} {c['target']}: "
                  + " · ".join(f"{c['counts'][r]:,} {r if r != 'fallback' else 'CPU'}" for r in _shown(c["counts"]))
                  for c in self.cells]
        lines += [f"  dtype {f['dtype']} not on {f['target']}: {f['op']} ×{f['calls']:,}"
                  + (f" at {f['site']}" if f.get("site") else "") for f in self.dtype_findings.values()]
        rows = self.rows()
        if rows:
            lines.append("top ops:")
            lines += [f"  {r['op']} [{r['route']}, {r['target']}] ×{r['calls']:,}"
                      + (f" at {r['sites'][0]}" if r["sites"] else "") for r in rows[:10]]
        return "\n".join(lines)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = self.text()
        data["text/html"] = self.html()
        return data
