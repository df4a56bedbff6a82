"""Pure renderings of a :class:`~torch_adapter.coverage.data.CoverageReport`: a rich table
(:func:`rich_table`, :func:`render_text`), JSON (:func:`render_json`) and Markdown
(:func:`render_markdown`, used for docs/coverage.md). The HTML page is in :mod:`.html_page`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .data import ROUTES, CoverageReport, CoverageRow, FallbackOp

__all__ = ["rich_table", "render_text", "render_json", "render_markdown", "fallback_text", "fallback_lines", "pct",
           "pivot_lines"]


def pct(value: float) -> str:
    """``97.8 %``-style text (one decimal; ``<0.1`` for small non-zero shares)."""
    if 0 < value < 0.05:
        return "<0.1"
    return f"{value:.1f}"


def fallback_text(f: FallbackOp, *, reason: bool = False) -> str:
    """``aten::op ×3`` (+ where it was a piece, + why, when asked)."""
    text = f"{f.op} ×{f.calls}"
    if f.inside:
        text += f" (in {', '.join(f.inside)})"
    if f.host_selected:
        text += " (host-selected)"
    if reason:
        text += f": {f.reason}"
    return text


def _shares(row: CoverageRow, kind: str) -> str:
    p = row.calls_pct if kind == "calls" else row.ops_pct
    return f"{pct(p['native'])} {pct(p['composite'])} {pct(p['fallback'])}"


def rich_table(report: CoverageReport, *, reasons: bool = False, fallbacks: bool = True) -> Any:
    """A ``rich.table.Table``: one line per model × target, shares as native / composite /
    fallback percentages by calls and by distinct ops, and (``fallbacks``) the top fallback ops."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="Op coverage of one training step (N native, C composite, F fallback)",
                  caption=f"{report.scope}\n{report.counting}", caption_justify="left")
    cols = [("model", "left"), ("target", "left"), ("calls", "right"), ("by calls %\nN C F", "right"),
            ("ops", "right"), ("by ops %\nN C F", "right")]
    if fallbacks:
        cols.append(("F in\ncomp.", "right"))
    for col, justify in cols:
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    if fallbacks:
        table.add_column("top fallback ops (calls)", overflow="fold", min_width=24)
    previous = None
    for row in report.rows:
        model = row.model if row.model != previous else ""
        previous = row.model
        if row.error:
            table.add_row(model, row.target, "", "", "", "", *(("", f"[red]step failed: {escape(row.error)}[/]")
                                                              if fallbacks else ()))
            continue
        fb = row.calls_pct["fallback"]
        style = "green" if fb == 0 else ("yellow" if fb < 1 else "red")
        cells = [model, row.target, str(row.total_calls), f"[{style}]{_shares(row, 'calls')}[/]",
                 str(row.total_ops), _shares(row, "ops")]
        if fallbacks:
            cells.append(str(row.nested_calls["fallback"] or ""))
            cells.append("\n".join(escape(fallback_text(f, reason=reasons)) for f in row.top_fallbacks) or "—")
        table.add_row(*cells)
    return table


def fallback_lines(report: CoverageReport, *, reasons: bool = True) -> list[str]:
    """Each row's fallback ops as text lines (top level, then inside composite ops)."""
    lines = []
    for row in report.rows:
        if row.error:
            lines.append(f"{row.model} on {row.target}: step failed: {row.error}")
        elif row.top_fallbacks or row.nested_fallbacks:
            lines.append(f"{row.model} on {row.target}:")
            lines += [f"  {fallback_text(f, reason=reasons)}" for f in (*row.top_fallbacks, *row.nested_fallbacks)]
        for f in row.dtypes.get("findings", ()):  # their own kind: never a route
            lines.append(f"{row.model} on {row.target}: dtype {f['dtype']} not on {row.target}: "
                         f"{f['op']} ×{f['calls']}" + (f" — {f['message']}" if reasons else ""))
    return lines


def render_text(report: CoverageReport, *, width: int = 160, reasons: bool = False) -> str:
    """The rich table as plain text (no colour codes). Narrower than 130 columns, the fallback
    ops are listed under the table instead of in it."""
    from rich.console import Console

    wide = width >= 130
    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, file=sink, color_system=None, force_jupyter=False)
        console.print(rich_table(report, reasons=reasons, fallbacks=wide))
        if not wide:
            from rich.text import Text

            for line in fallback_lines(report, reasons=reasons):
                console.print(Text(line))
        return console.export_text()


def render_json(report: CoverageReport, *, indent: int | None = 1) -> str:
    """The report as JSON, schema ``torch-adapter.coverage`` version 1 (see :mod:`.data`)."""
    return json.dumps(report.to_dict(), indent=indent) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(calls: dict[str, int]) -> str:
    total = sum(calls[r] for r in ROUTES)
    if not total:
        return ""
    return " / ".join(pct(100.0 * calls[r] / total) for r in ROUTES)


def pivot_lines(report: CoverageReport) -> list[str]:
    """Markdown: native / composite / fallback shares of op calls per model × target (one column
    per target), then per model kind (calls summed over the kind's models)."""
    targets = list(report.targets)
    head = "| {} | " + " | ".join(targets) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in targets) + " |"
    by_model: dict[str, dict[str, str]] = {}
    kinds: dict[str, dict[str, dict[str, int]]] = {}
    for row in report.rows:
        by_model.setdefault(row.model, {})[row.target] = "step failed" if row.error else _cell(row.calls)
        if not row.error:
            acc = kinds.setdefault(row.kind, {}).setdefault(row.target, dict.fromkeys(ROUTES, 0))
            for r in ROUTES:
                acc[r] += row.calls[r]
    lines = ["### By model and target", "",
             "Share of the op calls of one training step, native / composite / fallback, in %.", "",
             head.format("model"), rule]
    lines += ["| " + model + " | " + " | ".join(cells.get(t, "") for t in targets) + " |"
              for model, cells in by_model.items()]
    lines += ["", "### By model kind", "",
              "The same, with the calls of every model of a kind added up. *On the device* = native + "
              "composite (what a vendor's \"operator coverage\" counts as supported).", "",
              head.format("kind"), rule]
    for kind, per in kinds.items():
        cells = []
        for t in targets:
            c = per.get(t)
            total = sum(c.values()) if c else 0
            cells.append(f"{_cell(c)} (on the device {pct(100.0 * (c['native'] + c['composite']) / total)})"
                         if total else "")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return lines + [""]


def render_markdown(report: CoverageReport, *, title: str = "Op coverage by model family × target",
                    preamble: str = "", appendix: str = "") -> str:
    """A Markdown page: the summary table by calls and by distinct ops, then every row's
    fallback ops with reasons. ``preamble``/``appendix`` are inserted as they are."""
    lines = [f"# {title}", ""]
    if preamble:
        lines += [preamble.strip(), "", "## Measured coverage", ""]
    lines += [f"> **Scope.** {report.scope}", ">", f"> **Counting.** {report.counting}", ""]
    if report.torch_version:
        lines.append(f"Measured with torch {report.torch_version}; targets: {', '.join(report.targets)}.")
        lines.append("")
    lines += pivot_lines(report)
    lines += ["### Every row", "",
              "Shares in %: by op calls, then by distinct ops. The last column counts fallback calls made "
              "inside composite ops (not in the shares).", "",
              "| model | target | calls | native | composite | fallback | ops | native | composite | fallback "
              "| fallback calls in composites |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in report.rows:
        if row.error:
            lines.append(f"| {row.model} | {row.target} | | | | | | | | | step failed: {_md(row.error)} |")
            continue
        c, o = row.calls_pct, row.ops_pct
        lines.append(f"| {row.model} | {row.target} | {row.total_calls} | "
                     + " | ".join(pct(c[r]) for r in ROUTES) + f" | {row.total_ops} | "
                     + " | ".join(pct(o[r]) for r in ROUTES) + f" | {row.nested_calls['fallback']} |")
    lines += ["", "## Fallback ops per model and target", "",
              "Called by the program (top level), then pieces of composite ops that ran on the CPU. "
              "A kernel the CPU host selects inside another op (oneDNN, slow convolutions, the CPU's "
              "attention) is routed as the target's own member of its family, so it is not listed here; "
              "*host-selected* marks one that still is (a real target, or a profile with the CPU's key).", ""]
    for row in report.rows:
        if not (row.top_fallbacks or row.nested_fallbacks):
            continue
        lines.append(f"**{row.model} on {row.target}**")
        lines.append("")
        for f in row.top_fallbacks:
            lines.append(f"- `{f.op}` ×{f.calls}: {_md(f.reason)}" + (" *(host-selected)*" if f.host_selected else ""))
        for f in row.nested_fallbacks:
            lines.append(f"- `{f.op}` ×{f.calls} inside {', '.join(f'`{p}`' for p in f.inside)}: {_md(f.reason)}"
                         + (" *(host-selected)*" if f.host_selected else ""))
        lines.append("")
    clean = [f"{r.model} on {r.target}" for r in report.rows if not (r.top_fallbacks or r.nested_fallbacks or r.error)]
    if clean:
        lines += ["No fallback at all: " + ", ".join(clean) + ".", ""]
    if appendix:
        lines += [appendix.strip(), ""]
    return "\n".join(lines)
