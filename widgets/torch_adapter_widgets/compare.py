"""ThroughputComparison: bars of throughput kept per configuration, with the spread over runs."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from ._svg import bars_with_spread

__all__ = ["ThroughputComparison", "baseline_of"]


def baseline_of(result: dict[str, Any]) -> str | None:
    """The configuration the others are relative to: the first that ran."""
    return next((k for k, v in result.items() if v.get("median_s")), None)


class ThroughputComparison(w.VBox):
    """Shows the result of ``%%adapter_compare`` (or ``jupyter.compare.compare``)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.chart = w.HTML(self.chart_svg())
        self.notes = w.HTML(self.notes_html())
        super().__init__([self.chart, self.notes])
        self.add_class("torch-adapter-compare")

    def _bars(self) -> tuple[list[str], list[float], list[float], list[float]]:
        ok = {k: v for k, v in self.result.items() if v.get("median_s")}
        base = ok[baseline_of(self.result)]["median_s"] if ok else None
        names = list(ok)
        kept = [ok[k]["kept"] * 100 for k in names]
        # the spread of throughput kept over the runs: baseline/slowest .. baseline/fastest
        lows = [base / max(ok[k]["runs_s"]) * 100 for k in names]
        highs = [base / min(ok[k]["runs_s"]) * 100 for k in names]
        return names, kept, lows, highs

    def chart_svg(self) -> str:
        names, kept, lows, highs = self._bars()
        colors = ["#607d8b"] + ["#1976d2"] * max(0, len(names) - 1)
        return bars_with_spread(names, kept, lows, highs, colors, title="throughput kept vs the baseline",
                                subtitle="bar: median of the runs · whisker: spread over the runs")

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
        for k, err in failed.items():
            parts.append(f"<div>⚠ <b>{html.escape(k)}</b> could not run: <code>{html.escape(err)}</code></div>")
        return "".join(parts)

    def text(self) -> str:
        base = baseline_of(self.result)
        lines = [f"throughput kept vs {base or '(nothing ran)'} (median of runs)"]
        for k, v in self.result.items():
            if v.get("error"):
                lines.append(f"{k:>12}: could not run: {v['error']}")
            elif v.get("median_s"):
                lines.append(f"{k:>12}: {v['kept'] * 100:6.1f} %  ({v['median_s'] * 1e3:.1f} ms per run)")
        return "\n".join(lines)

    def html(self) -> str:
        return f"<div class='torch-adapter-compare'>{self.chart_svg()}{self.notes_html()}</div>"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = self.text()
        data["text/html"] = self.html()
        return data
