"""RoutingInspector: how each cell's ops were routed, over the whole session.

Fed once per cell (never per op) with the cell's payload and its op rows; the chart and
the table come from the same cells, so their totals agree. Two outputs:

- **the chart**, an output of its own (a display handle, updated after every cell): stacked bars
  of op calls per cell by route as a plotly figure's JSON mime bundle, which JupyterLab draws
  offline, in an untrusted notebook and after a reopen with no kernel; a static PNG of it
  (kaleido, :mod:`._static`) as ``image/png`` (what JupyterLab's plotly renderer shows until the
  pointer is over the chart) and, with the totals and the op table, in its ``text/html``, which
  ``nbconvert --to html`` and GitHub show; a line of text. At most ~32 kB as saved. No widget
  state: a saved notebook keeps the chart's last state.
- **the controls**, an ipywidget (totals, filters, sort, the op picker and its details, the
  table), live while the kernel that opened it runs. Closed — ``%unload_ext torch_adapter``,
  a newer ``%adapter_inspector``, :meth:`RoutingInspector.close` — its output is replaced (same
  display handle) by a line saying what it was, with no widget view: a notebook saved after
  that shows no "model not found".
"""

from __future__ import annotations

import base64
import html
from typing import Any

import ipywidgets as w
from torch_adapter.routing.wording import COLORS, LONG, ROUTES, format_bytes

from ._static import PLOTLY_MIME, image_html, plotly_json, static_png

__all__ = ["RoutingInspector", "format_bytes", "figure", "CONTROLS_GONE"]

SORT_KEYS = {"calls": lambda r: (-r["calls"], r["op"]), "op": lambda r: (r["op"], r["target"]),
             "route": lambda r: (ROUTES.index(r["route"]), -r["calls"]),
             "time": lambda r: (-r["self_time_ms"], r["op"]), "bytes": lambda r: (-r["bytes_copied"], r["op"])}
ALL = "all"
TITLE = "op calls per cell by route"
MAX_BARS = 60  # the chart shows the newest this many cells (the totals and the table cover them all)
STATIC_ROWS = (12, 5, 0)  # the op rows the chart's static html holds: the most that keeps it under LIMIT
LIMIT = 32_000  # bytes: the chart's output as a saved notebook stores it (JSON, indent 1), well under 50 kB
HEIGHT = 300  # px, the chart's
# What the controls' output says where they are not live: a front end without widgets, an export,
# and (replacing the widget view, same display handle) once they are closed.
CONTROLS_GONE = "routing inspector controls: run %adapter_inspector again for them"


# The per-cell trace finds the user's line only where it is cheap to: the calls the adapter itself
# routes (CPU fallbacks, decompositions, your registrations); every other op is counted by the C++
# observer without a stack walk. The column says so instead of staying blank.
NO_SITE_WHY = ("the per-cell trace records the line of the calls the adapter routes itself (CPU fallbacks, "
               "decompositions, your registrations); %%adapter_trace records every op's first call site")
NO_SITE = "<span style='color:#999' title='not recorded: see the note under the table'>—</span>"
SHOWN_CELLS = 6  # a row's cells column names this many at most (first and last), then how many


def _cells_text(cells: list[str]) -> str:
    """``[2] [3] [4]``; a long list: ``[2] [3] [4] … [70] [71] [72] (71 cells)``."""
    if len(cells) <= SHOWN_CELLS:
        return " ".join(cells)
    half = SHOWN_CELLS // 2
    return f"{' '.join(cells[:half])} … {' '.join(cells[-half:])} ({len(cells)} cells)"


def _code_html(code: str | None) -> str:
    """A reason code, titled with where its page is (docs/reasons.md, one section per code)."""
    if not code:
        return ""
    from torch_adapter.core.codes import page

    return (f"<code class='torch-adapter-code' title='{html.escape(page(code), quote=True)}'>"
            f"{html.escape(code)}</code>")


def _shown(counts: dict[str, int]) -> list[str]:
    """The routes a line shows: native, composite and fallback always; yours and refused when any."""
    return [r for r in ROUTES if r in ("native", "composite", "fallback") or counts.get(r, 0)]


def _label(payload: dict[str, Any]) -> str:
    return f"{payload['target']}{' (simulated)' if payload.get('simulated') else ''}"


class RoutingInspector(w.VBox):
    """The controls (a widget: totals, a capped, filterable op table, the selected op's details) and
    the chart (stacked bars per cell, an output of its own: :meth:`chart_bundle`).

    Feed it with :meth:`update` (one call per cell); :meth:`attach` feeds it every cell
    the extension has reported, then each new one; :meth:`show` displays the chart and the
    controls, each with a display handle. ``variable``: the name the user reaches it by
    (``%adapter_inspector`` keeps it as ``_adapter_inspector``), as the table's footer says.
    """

    def __init__(self, router: Any = None, max_rows: int = 20, variable: str = "_adapter_inspector") -> None:
        self.router = router
        self.max_rows = max_rows
        self.variable = variable
        self.cells: list[dict[str, Any]] = []
        self.ops: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.dtype_findings: dict[tuple[Any, ...], dict[str, Any]] = {}  # (op, dtype, target, site) -> finding
        self.handle: Any = None  # the controls' display handle (replaced by CONTROLS_GONE when closed)
        self.chart_handle: Any = None  # the chart's display handle, updated after each cell
        self.closed_why: str | None = None
        self.header = w.HTML()
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
        super().__init__([self.header,
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
        hooks = getattr(router, "on_unload", None)
        if hooks is not None:  # %unload_ext closes it: its output says so, no widget view stays behind
            hooks.append(inspector._unloaded)
        return inspector

    def show(self) -> None:
        """Display the chart, then the controls, each as an output with a display handle: the chart's
        is updated after every cell, the controls' replaced by :data:`CONTROLS_GONE` when closed."""
        from IPython.display import display

        self.chart_handle = display(self.chart_bundle(), raw=True, display_id=True)
        self.handle = display(self, display_id=True)

    def detach(self) -> None:
        """Stop following cells: the router no longer calls this inspector (it keeps what it shows).
        ``%adapter_inspector`` closes the one it opened before, ``close()`` and ``%unload_ext`` too —
        a listener left attached per inspector kept every old one updating, and alive, for good."""
        listeners = getattr(self.router, "listeners", None)
        while listeners is not None and self._on_cell in listeners:
            listeners.remove(self._on_cell)
        hooks = getattr(self.router, "on_unload", None)
        while hooks is not None and self._unloaded in hooks:
            hooks.remove(self._unloaded)

    def close(self, why: str = "closed") -> None:
        """Stop following cells and close the controls: their output (when shown) becomes a line saying
        what they were, with no widget view; the chart's output keeps its last state. The data stays
        (:meth:`rows`, :meth:`totals`, :meth:`text`)."""
        self.detach()
        if self.closed_why is None:
            self.closed_why = why
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                handle.update(self.controls_gone_bundle(), raw=True)
            except Exception:  # a kernel shutting down (close() from __del__): nothing to tell
                pass
        for child in self._controls():
            child.close()
        super().close()

    def _unloaded(self) -> None:
        self.close("the extension was unloaded")

    def _controls(self) -> list[Any]:
        """The widgets inside (each has a comm of its own)."""
        return [self.header, self.filter, self.route_filter, self.target_filter, self.sort, self.select,
                self.details, self.table, *(c for c in self.children if isinstance(c, w.HBox))]

    def controls_gone_bundle(self) -> dict[str, str]:
        """What the controls' output says where the widget is not live: no widget view in it."""
        why = f" ({self.closed_why})" if self.closed_why else ""
        return {"text/plain": f"{CONTROLS_GONE}{why}",
                "text/html": "<div class='torch-adapter-inspector-controls-gone' style='color:#666'>routing "
                             "inspector controls: run <code>%adapter_inspector</code> again for them"
                             f"{html.escape(why)}</div>"}

    def _on_cell(self, payload: dict[str, Any]) -> None:
        tables = getattr(self.router, "tables", None)
        self.update(payload, rows=tables[-1] if tables else None)

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
                                            "reason": row.get("reason") or "", "code": row.get("code") or "", "calls": 0, "self_time_ms": 0.0,
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
            self.publish_chart()

    def publish_chart(self) -> None:
        """Update the chart's output (when shown) to what the inspector holds now.

        Two updates: JupyterLab keeps an output's renderer when an update has the same preferred mime
        type, and plotly's renderer ignores a new model once it has drawn a graph (plotly/plotly.py#3053)
        — the chart on screen stayed at the cells it first showed while the notebook's model (and a
        saved file) moved on. The first update, html only (the static image at the chart's height),
        gives the output a new renderer; the second is the chart. Every front end ends at the chart."""
        if self.chart_handle is None:
            return
        data, png = self._chart()
        self.chart_handle.update({"text/plain": data["text/plain"], "text/html":
                                  f"<div style='min-height:{HEIGHT}px'>{image_html(png, TITLE, TITLE)}</div>"}, raw=True)
        self.chart_handle.update(data, raw=True)

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
                        f"<code>{html.escape(f['op'])}</code> ×{f['calls']:,} {_code_html(f.get('code'))}"
                        f"{' at ' + html.escape(f['site']) if f.get('site') else ''}</li>" for f in found[:10])
        return f" · <span data-kind='dtype'>{sum(f['calls'] for f in found):,} dtype refused</span><ul>{items}</ul>"

    def figure(self) -> Any:
        """The chart: a ``plotly.graph_objects.Figure`` (:func:`figure`)."""
        return figure(self.cells, self.totals())

    def chart_bundle(self) -> dict[str, Any]:
        """The chart's output: plotly's JSON (JupyterLab draws it, untrusted or reopened); the static
        image as ``image/png`` — JupyterLab's plotly renderer shows a stored image until the pointer is
        over it, then the interactive chart, and stores no full-width image of its own (~40 kB) while
        it has one — and again inside ``text/html`` with the totals and the table (``nbconvert --to
        html`` and GitHub show text/html, never image/png beside it); a line of text. A chart that
        cannot be drawn leaves the text and the table (the cell never fails for it)."""
        return self._chart()[0]

    def _chart(self) -> tuple[dict[str, Any], bytes | None]:
        data: dict[str, Any] = {"text/plain": self.text().splitlines()[0]}
        png = None
        try:
            fig = self.figure()
            data[PLOTLY_MIME] = plotly_json(fig)
            png = static_png(fig) if self.cells else None
        except Exception as exc:  # the view never fails the cell: the table and the text still show
            data["text/plain"] += f" (chart not drawn: {type(exc).__name__}: {exc})"
        if png:
            data["image/png"] = base64.b64encode(png).decode("ascii")
        for rows in STATIC_ROWS:  # the first that fits: a long op name or many dtype findings cost rows
            data["text/html"] = self.html(png, rows)
            if _stored_size(data) <= LIMIT:
                return data, png
        data.pop("image/png", None)
        data["text/html"] = self.html(None, 0, note="no static image: it would make the output over 50 kB")
        return data, None

    def _table_html(self, rows: list[dict[str, Any]], max_rows: int | None = None) -> str:
        shown = rows[:self.max_rows if max_rows is None else max_rows]
        head = "".join(f"<th style='text-align:{a};padding:1px 6px'>{h}</th>" for h, a in (
            ("op", "left"), ("target", "left"), ("route", "left"), ("code", "left"), ("calls", "right"), ("self ms", "right"),
            ("copied", "right"), ("cells", "left"), ("first call site", "left")))
        body = "".join(
            f"<tr data-route='{r['route']}'><td style='text-align:left'><code>{html.escape(r['op'])}</code></td>"
            f"<td style='text-align:left'>{html.escape(r['target'])}</td>"
            f"<td style='text-align:left;color:{COLORS[r['route']]}'>{r['route']}</td>"
            f"<td style='text-align:left'>{_code_html(r.get('code'))}</td>"
            f"<td style='text-align:right'>{r['calls']:,}</td>"
            f"<td style='text-align:right'>{r['self_time_ms']:.3f}</td>"
            f"<td style='text-align:right'>{format_bytes(r['bytes_copied']) if r['bytes_copied'] else ''}</td>"
            f"<td style='text-align:left'>{html.escape(_cells_text(r['cells']))}</td>"
            f"<td style='text-align:left;white-space:nowrap'>{html.escape(r['sites'][0]) if r['sites'] else NO_SITE}</td></tr>"
            for r in shown)
        calls = {route: sum(r["calls"] for r in rows if r["route"] == route) for route in ROUTES}
        more = (f"<div class='torch-adapter-more'>{len(rows) - len(shown)} more rows: filter or sort to see them "
                f"(<code>{html.escape(self.variable)}.rows()</code> has them all)</div>") if len(rows) > len(shown) else ""
        no_site = (f"<div class='torch-adapter-no-site' style='color:#999'>— {html.escape(NO_SITE_WHY)}</div>"
                   if any(not r["sites"] for r in shown) else "")
        return (f"<div class='torch-adapter-table' style='max-height:360px;overflow:auto'>"
                f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table></div>{no_site}{more}"
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
                              f"<br>{_code_html(row.get('code'))} {html.escape(row['reason'])}"
                              f"<br>call sites:<ul>{sites}</ul>")

    def html(self, png: bytes | None = None, rows: int = STATIC_ROWS[0], note: str = "") -> str:
        """A static rendering: the chart's image (``png``; without one, the title and why not), the
        totals and the table's first ``rows`` rows (the chart output's text/html: exports, front ends
        without plotly)."""
        img = image_html(png, TITLE, TITLE) + (f" <i class='torch-adapter-no-image'>({html.escape(note)})</i>"
                                               if note else "")
        return (f"<div class='torch-adapter-inspector-chart'>{img}{self._header_html()}"
                f"{self._table_html(self.rows(), rows)}</div>")

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
        """The widget view; where it is not drawn (no widgets, an export), what the controls are."""
        data = super()._repr_mimebundle_(**kwargs) or {}
        data.update(self.controls_gone_bundle())
        return data


def _stored_size(data: dict[str, Any]) -> int:
    """The bytes ``data`` takes in a saved notebook: nbformat writes JSON with indent 1, an output four
    levels down (cells, a cell, outputs, the output)."""
    import json

    nested = {"cells": [{"outputs": [{"data": data, "metadata": {}, "output_type": "display_data"}]}]}
    return len(json.dumps(nested, indent=1, ensure_ascii=False).encode()) - 80  # (the wrapper's own bytes)


def _unique(labels: list[str]) -> list[str]:
    """The labels as plotly categories: a label seen before gets `` (2)``, `` (3)``... (one bar each)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def figure(cells: list[dict[str, Any]], totals: dict[str, int]) -> Any:
    """Stacked bars of op calls per cell by route (the newest :data:`MAX_BARS` cells), in the routes'
    colours; the title's second line: the totals over every cell. Each trace's ``legendgroup`` is its
    route (``native``, ``composite``, ``yours``, ``fallback``, ``refused``)."""
    import plotly.graph_objects as go

    shown = cells[-MAX_BARS:]
    x = _unique([c["label"] for c in shown])
    routes = _shown(totals)
    fig = go.Figure([go.Bar(x=x, y=[c["counts"][r] for c in shown], name=LONG[r], legendgroup=r,
                            marker_color=COLORS[r], hovertemplate=f"cell %{{x}}: %{{y:,}} {LONG[r]}<extra></extra>")
                     for r in routes])
    n = len(cells)
    scope = f"the newest {len(shown)} of {n} cells" if n > len(shown) else f"{n} {'cell' if n == 1 else 'cells'}"
    fig.update_layout(
        template="none", barmode="stack", height=HEIGHT, width=min(1000, max(480, 18 * len(shown) + 220)),
        bargap=0.3, margin=dict(l=60, r=20, t=64, b=44),
        title=dict(text=TITLE, font=dict(size=13), x=0.01, xanchor="left",
                   subtitle=dict(text=f"{scope} · " + " · ".join(f"{totals[r]:,} {LONG[r]}" for r in routes),
                                 font=dict(size=10, color="#546e7a"))),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom", font=dict(size=10)),
        xaxis=dict(type="category", title=dict(text="cell (execution count)", font=dict(size=11)),
                   tickangle=0, nticks=20),
        yaxis=dict(title=dict(text="op calls", font=dict(size=11)), gridcolor="#e0e0e0", rangemode="tozero"))
    if not shown:
        fig.add_annotation(text="no cell has run ops yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font=dict(color="#888"))
    return fig
