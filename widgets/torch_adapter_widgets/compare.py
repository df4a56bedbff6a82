"""ThroughputComparison: throughput kept per configuration as a measurement: the median of the runs,
its 95 % interval, absolute times and run counts, and a verdict only where the runs resolve one."""

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
        names = list(ok)
        kept = [ok[k]["kept"] * 100 for k in names]
        # whisker: the 95 % bootstrap interval of throughput kept (jupyter/compare.py), not min..max
        lows = [(ok[k].get("kept_low") or ok[k]["kept"]) * 100 for k in names]
        highs = [(ok[k].get("kept_high") or ok[k]["kept"]) * 100 for k in names]
        return names, kept, lows, highs

    def chart_svg(self) -> str:
        names, kept, lows, highs = self._bars()
        colors = [("#607d8b" if self.result[k].get("baseline") else
                   "#9e9e9e" if str(self.result[k].get("verdict", "")).startswith("not resolved") else "#1976d2")
                  for k in names]
        return bars_with_spread(names, kept, lows, highs, colors, title="throughput kept vs the baseline",
                                subtitle="bar: median of the runs · whisker: 95 % interval · grey: not resolved")

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
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(_ms(v))}</td><td>{v['n']}</td>"
            f"<td>{html.escape(_kept(v))}</td><td>{html.escape(v['verdict'])}</td>"
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

    def html(self) -> str:
        return f"<div class='torch-adapter-compare'>{self.chart_svg()}{self.notes_html()}</div>"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = self.text()
        data["text/html"] = self.html()
        return data


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
