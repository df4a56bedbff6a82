"""Bar charts as inline SVG strings: pure functions of the data.

The widgets show their charts as HTML (an ``ipywidgets.HTML`` value, and the same markup
as their ``text/html`` rendering), so a chart is a few kilobytes of data in the output
and in the widget state — no JavaScript bundle stored with the notebook, nothing to
re-run when a front end reloads, and the same picture in an nbconvert HTML export.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

__all__ = ["stacked_bars", "nice_max"]

_FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:11px"


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale  # pragma: no cover


def _tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"


def _axis(height: int, top: int, left: int, width: int, ymax: float, unit: str = "") -> list[str]:
    parts = []
    for i in range(5):
        value = ymax * i / 4
        y = top + height - height * i / 4
        parts.append(f'<line x1="{left}" x2="{left + width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end" fill="#666">{_tick(value)}{unit}</text>')
    return parts


def stacked_bars(labels: Sequence[str], series: dict[str, Sequence[int]], colors: dict[str, str], *,
                 title: str, height: int = 200, bar_width: int = 28) -> str:
    """One stacked bar per label; ``series`` maps a legend name to one value per label."""
    n = len(labels)
    left, top, bottom = 56, 40, 34
    width = max(240, n * (bar_width + 8) + 16, len(title) * 6 - left + 8)
    totals = [sum(int(values[i]) for values in series.values()) for i in range(n)]
    ymax = nice_max(max(totals, default=0))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="torch-adapter-chart" role="img" '
             f'width="{left + width + 8}" height="{top + height + bottom}" style="{_FONT}">',
             f"<title>{html.escape(title)}</title>",
             f'<text x="{left}" y="14" font-weight="600">{html.escape(title)}</text>']
    parts += _axis(height, top, left, width, ymax)
    legend_x = left
    for name, color in colors.items():  # the legend: a row of its own under the title
        parts.append(f'<rect x="{legend_x}" y="20" width="9" height="9" fill="{color}"/>'
                     f'<text x="{legend_x + 12}" y="28">{html.escape(name)}</text>')
        legend_x += 20 + len(name) * 6
    for i, label in enumerate(labels):
        x = left + 8 + i * (bar_width + 8)
        base = 0
        tip = [f"cell {label}: {totals[i]:,} op calls"]
        for name, values in series.items():
            value = int(values[i])
            if value <= 0:
                continue
            h = height * value / ymax
            y = top + height - height * (base + value) / ymax
            tip.append(f"{name} {value:,}")
            parts.append(f'<rect class="torch-adapter-bar" data-cell="{html.escape(label)}" data-route="{name}" '
                         f'data-value="{value}" x="{x}" y="{y:.2f}" width="{bar_width}" height="{h:.2f}" '
                         f'fill="{colors.get(name, "#999")}"><title>{html.escape(label)} {name}: {value:,}</title></rect>')
            base += value
        parts.append(f'<text x="{x + bar_width / 2}" y="{top + height + 14}" text-anchor="middle">'
                     f"{html.escape(label)}<title>{html.escape(' · '.join(tip))}</title></text>")
    if not n:
        parts.append(f'<text x="{left + width / 2}" y="{top + height / 2}" text-anchor="middle" fill="#888">'
                     "no cell has run ops yet</text>")
    parts.append(f'<text x="{left + width / 2}" y="{top + height + 30}" text-anchor="middle" fill="#666">'
                 "cell (execution count)</text></svg>")
    return "".join(parts)


_BOLD_EM = 7.2  # px per character of 11px bold text, wide fonts included (a title is never clipped)
_EM = 6.6
