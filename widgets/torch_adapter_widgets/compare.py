"""ThroughputComparison: bars of throughput kept per configuration, with spread."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

__all__ = ["ThroughputComparison"]


class ThroughputComparison(w.VBox):
    """Shows the result of ``%%adapter_compare`` (or ``jupyter.compare.compare``)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        ok = {k: v for k, v in result.items() if v.get("median_s")}
        names = list(ok)
        kept = [ok[k]["kept"] * 100 for k in names]
        baseline = next(iter(ok.values()))["median_s"] if ok else None
        # spread of throughput kept over the runs: baseline/min .. baseline/max
        lo = [(k - baseline / max(ok[n]["runs_s"]) * 100) for n, k in zip(names, kept)] if ok else []
        hi = [(baseline / min(ok[n]["runs_s"]) * 100 - k) for n, k in zip(names, kept)] if ok else []
        self.figure = go.FigureWidget(
            data=[go.Bar(x=names, y=kept, text=[f"{k:.1f} %" for k in kept], textposition="outside",
                         error_y=dict(type="data", array=hi, arrayminus=lo, visible=True),
                         marker_color=["#607d8b"] + ["#1976d2"] * max(0, len(names) - 1))],
            layout=go.Layout(title="throughput kept vs the first configuration", yaxis_title="% of baseline",
                             height=300, margin=dict(l=40, r=10, t=40, b=30)))
        failed = {k: v["error"] for k, v in result.items() if v.get("error")}
        notes = w.HTML("".join(f"<div>⚠ <b>{k}</b> could not run: <code>{v}</code></div>" for k, v in failed.items()))
        super().__init__([self.figure, notes])
