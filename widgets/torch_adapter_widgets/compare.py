"""ThroughputComparison: throughput kept per configuration as a measurement — the median of the runs,
its 95 % interval, absolute times and run counts, and a verdict only where the runs resolve one.

A chart that lasts: a plotly figure as its JSON mime bundle (``application/vnd.plotly.v1+json``,
which JupyterLab renders with the extension the plotly wheel installs: offline, in an untrusted
notebook, after reopening it with no kernel), the same numbers as an HTML table (what ``nbconvert
--to html`` and front ends without plotly show), text for a terminal, and a static PNG of the chart
(plotly's kaleido, where it and a Chrome are installed: nbconvert and GitHub show it). No widget
state: nothing is lost when the notebook is saved, closed and opened again.
"""

from __future__ import annotations

import html
from typing import Any

from ._static import _CHARTS, PLOTLY_MIME, image_html, plotly_json, static_png, static_png_why  # noqa: F401  (_CHARTS: one per kernel)

__all__ = ["ThroughputComparison", "baseline_of", "figure", "static_png", "static_png_why"]


def baseline_of(result: dict[str, Any]) -> str | None:
    """The configuration the others are relative to: the first that ran."""
    return next((k for k, v in result.items() if v.get("median_s")), None)


class ThroughputComparison:
    """Shows the result of ``%%adapter_compare`` (or ``jupyter.compare.compare``)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result

    def figure(self) -> Any:
        """The plotly figure (``plotly.graph_objects.Figure``)."""
        return figure(self.result)

    def notes_html(self) -> str:
        base = baseline_of(self.result)
        failed = {k: v["error"] for k, v in self.result.items() if v.get("error")}
        first = next(iter(self.result), None)
        parts = []
        if base is not None:
            why = ""
            if base != first and first in failed:
                why = f" — <b>{html.escape(first)}</b>, listed first, could not run here"
            parts.append(f"<div>Baseline (100 %): <b>{html.escape(base)}</b>{why}.</div>")
        rows = "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td class='torch-adapter-value'>{html.escape(_ms(v))}</td>"
            f"<td>{v['n']}</td><td>{html.escape(_kept(v))}</td><td>{html.escape(v['verdict'])}</td>"
            f"<td>{html.escape(_stalls(v))}</td></tr>"
            for k, v in self.result.items() if v.get("median_s"))
        if rows:
            parts.append("<table class='torch-adapter-compare-table'><tr><th>config</th><th>median (IQR)</th>"
                         f"<th>runs</th><th>kept (95 % interval)</th><th>verdict</th><th>stalls</th></tr>{rows}</table>")
        for k, err in failed.items():
            parts.append(f"<div>⚠ <b>{html.escape(k)}</b> could not run: <code>{html.escape(err)}</code></div>")
        return "".join(parts)

    def text(self) -> str:
        base = baseline_of(self.result)
        lines = [f"throughput kept vs {base or '(nothing ran)'}: median of interleaved runs, 95 % interval"]
        for k, v in self.result.items():
            if v.get("error"):
                lines.append(f"{k:>12}: could not run: {v['error']}")
            elif v.get("median_s"):
                stalls = _stalls(v)
                lines.append(f"{k:>12}: {_kept(v):<22} {_ms(v):<24} {v['n']:>3} runs  {v['verdict']}"
                             + (f"  [{stalls}]" if stalls else ""))
        return "\n".join(lines)

    def html(self, png: bytes | None = None, *, table: bool = True) -> str:
        """The chart's static image when there is one (``nbconvert --to html`` shows text/html before
        image/png: the image lives here, once, not in both) and the numbers as a table."""
        img = image_html(png, "throughput kept per configuration", "throughput kept vs the baseline")
        return f"<div class='torch-adapter-compare'>{img}{self.notes_html() if table else ''}</div>"

    def chart_bundle(self, *, table: bool = False) -> dict[str, Any]:
        """The chart's output: plotly's JSON (JupyterLab draws it, untrusted or reopened), its static
        image inside text/html (export), a line of text; ``table``: the numbers in the html too."""
        data: dict[str, Any] = {"text/plain": self.text().splitlines()[0]}
        png = None
        if any(v.get("median_s") for v in self.result.values()):
            try:
                fig = self.figure()
                data[PLOTLY_MIME] = plotly_json(fig)
                png = static_png(fig)
            except Exception as exc:  # the view never fails the cell: the table and the text still show
                data["text/plain"] += f" (chart not drawn: {type(exc).__name__}: {exc})"
        data["text/html"] = self.html(png, table=table)
        return data

    def table_bundle(self) -> dict[str, Any]:
        """The numbers' output: the baseline note, per configuration the median (IQR), runs, kept with
        its interval, verdict and stalls; text for a terminal."""
        return {"text/plain": "\n".join(self.text().splitlines()[1:]),
                "text/html": f"<div class='torch-adapter-compare-notes'>{self.notes_html()}</div>"}

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """One output with everything (``%%adapter_compare`` shows :meth:`chart_bundle` and
        :meth:`table_bundle` as two: JupyterLab draws only the chart of a bundle that has one)."""
        data = self.chart_bundle(table=True)
        data["text/plain"] = self.text()
        return data


def figure(result: dict[str, Any]) -> Any:
    """Bars of throughput kept (the medians) with the 95 % intervals as error bars; an unresolved
    configuration is grey, the baseline slate; hovering shows the absolute times, runs and verdict."""
    import plotly.graph_objects as go

    ok = {k: v for k, v in result.items() if v.get("median_s")}
    names = list(ok)
    kept = [ok[k]["kept"] * 100 for k in names]
    low = [(ok[k].get("kept_low") or ok[k]["kept"]) * 100 for k in names]
    high = [(ok[k].get("kept_high") or ok[k]["kept"]) * 100 for k in names]
    colors = ["#607d8b" if ok[k].get("baseline") else
              "#9e9e9e" if str(ok[k].get("verdict", "")).startswith("not resolved") else "#1976d2" for k in names]
    hover = [f"{k}: {_kept(ok[k])}<br>median {_ms(ok[k])}<br>{ok[k]['n']} runs<br>{ok[k]['verdict']}"
             + (f"<br>{_stalls(ok[k])}" if ok[k].get("outliers") else "") for k in names]
    labels = [f"{v:.0f} %" + ("" if ok[k].get("baseline") or not str(ok[k]["verdict"]).startswith("not resolved")
                              else " (not resolved)") for k, v in zip(names, kept)]
    fig = go.Figure(go.Bar(
        x=names, y=[round(v, 2) for v in kept], marker_color=colors, text=labels, textposition="outside",
        hovertext=hover, hoverinfo="text",
        error_y=dict(type="data", symmetric=False, array=[round(h - v, 2) for h, v in zip(high, kept)],
                     arrayminus=[round(v - lo, 2) for v, lo in zip(kept, low)], color="#37474f", thickness=1.2)))
    base = baseline_of(result)
    top = max([*high, 100.0]) * 1.15
    fig.update_layout(
        template="none", height=330, width=max(420, 110 * len(names) + 160), bargap=0.35,
        margin=dict(l=60, r=20, t=64, b=40), showlegend=False,
        title=dict(text=f"throughput kept vs {base}", font=dict(size=13),
                   subtitle=dict(text="median of the runs · whisker: 95 % interval · grey: not resolved",
                                 font=dict(size=10, color="#546e7a"))),
        yaxis=dict(title="% of the baseline's throughput", range=[0, top], ticksuffix=" %", gridcolor="#e0e0e0"),
        shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=100, y1=100, line=dict(color="#90a4ae", dash="dot"))])
    return fig


def _ms(v: dict[str, Any]) -> str:
    """``1.23 ms (1.20-1.31)``: the median run and its quartiles."""
    def f(x: float) -> str:
        return f"{x * 1e3:.3g}"
    q1, q3 = v.get("q1_s"), v.get("q3_s")
    return f"{f(v['median_s'])} ms" + (f" ({f(q1)}-{f(q3)})" if q1 is not None and v.get("n", 0) > 1 else "")


def _kept(v: dict[str, Any]) -> str:
    if v.get("baseline"):
        return "100 % (baseline)"
    lo, hi = v.get("kept_low"), v.get("kept_high")
    rng = f" ({lo * 100:.0f}-{hi * 100:.0f})" if lo is not None and hi is not None else ""
    return f"{v['kept'] * 100:.0f} %{rng}"


def _stalls(v: dict[str, Any]) -> str:
    out = v.get("outliers") or []
    return f"{len(out)} stalled run{'s' if len(out) != 1 else ''} (up to {max(out) * 1e3:.3g} ms)" if out else ""
