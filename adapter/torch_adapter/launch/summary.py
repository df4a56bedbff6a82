"""The terminal report of ``torch-adapter run --report``: what a user reads at the end of a run, in at
most :data:`MAX_LINES` lines of :data:`WIDTH` columns — the routing totals, the CPU fallbacks and
refusals with their sites, the decomposed ops, what torch.compile compiled (graphs, graph breaks
with their lines, recompiles: routing/compiled.py), what was redirected (grouped), and what to do next.
``--report full`` prints the whole tables instead (launch/report.py); ``--report-json`` keeps the data.

Pure functions of a routing log and the redirect entries (dicts, as ``RedirectEntry.as_dict`` and the
JSON report give them), so a parent and its adapted children are summarized alike.
"""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["summary_lines", "MAX_LINES", "WIDTH"]

MAX_LINES = 40
WIDTH = 100
_SHOWN = {"fallback": 6, "refused": 4, "dtype": 3, "redirect": 6}
# How each redirect kind is named in one line (redirect/log.py's kinds; others by their own name).
_KIND_WORDS = {"device": "device strings and .cuda()", "namespace": "torch.cuda.* calls", "host_limit": "ops torch refuses on the CPU", "amp": "autocast / GradScaler",
               "distributed": "process groups (nccl)", "env": "CUDA environment variables",
               "dataloader": "DataLoader pin_memory", "probe": "library probes (flash-attn, xformers, ...)",
               "low_precision": "float16 computed in another dtype"}


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns (its indent kept, the end shortened at a word)."""
    if len(text) <= width:
        return text
    body = text.lstrip(" ")
    indent = text[:len(text) - len(body)]
    return indent + textwrap.shorten(" ".join(body.split()), width=width - len(indent), placeholder=" …")


def _site(site: dict[str, Any] | None) -> str:
    from ..core.callsite import site_text

    return site_text(site, short=True) if site else "(no user line)"


def summary_lines(log: Any, redirects: list[dict[str, Any]], *, target: str, width: int = WIDTH,
                  full_hint: str = "--report full") -> list[str]:
    """The report's lines (each at most ``width`` columns, at most :data:`MAX_LINES` of them)."""
    from ..routing.wording import format_bytes
    from ..core.codes import dtype_code
    from ..routing.log import counts_text

    lines: list[str] = []
    add = lines.append
    if log is not None and len(log):
        s = log.summary()
        copied = log.bytes_copied
        add(_cut(f"torch_adapter on {target}: {counts_text(s)} op calls"
                 + (f", {format_bytes(copied)} copied" if copied else ""), width))
        tops = [r for d, r in log.tree() if d == 0]
        for route, title in (("fallback", "CPU fallbacks (ops the target lacks: copied to the CPU and back)"),
                             ("refused", "refused by the fallback policy")):
            rows = sorted((r for r in tops if r.route == route), key=lambda r: -r.calls)
            if not rows:
                continue
            add(f"{title}: {len(rows)} op{'s' if len(rows) != 1 else ''}")
            for r in rows[:_SHOWN[route]]:
                add(_cut(f"  {_site(r.site)}: {r.op} ×{r.calls:,}", width))
                if r.reason:
                    # the code and the reason in at most two lines (the rest is behind --report full)
                    first, *rest = textwrap.wrap(f"{r.code} {r.reason}", width=width - 6)
                    add(f"      {first}")
                    if rest:
                        add(_cut("      " + " ".join(rest), width))
            if len(rows) > _SHOWN[route]:
                add(f"  … {len(rows) - _SHOWN[route]} more ({full_hint})")
        composite = sorted((r for r in tops if r.route == "composite"), key=lambda r: -r.calls)
        if composite:
            names = ", ".join(f"{r.op.removeprefix('aten::')} ×{r.calls:,}" for r in composite[:6])
            more = f", … {len(composite) - 6} more" if len(composite) > 6 else ""
            add(_cut(f"decomposed into the target's ops ({len(composite)}): {names}{more}", width))
        findings = list(log.dtype_findings.values())
        if findings:
            add(f"dtypes {target} refuses: {len(findings)}")
            for f in findings[:_SHOWN["dtype"]]:
                add(_cut(f"  {f.op} ({f.dtype}) ×{f.calls} at {_site(f.site)}: {dtype_code(f)} {f.message}", width))
    elif log is not None:
        add(f"torch_adapter on {target}: no op ran under observation")
    for line in _compiled_lines(log, width):
        add(_cut(line, width))
    if redirects:
        by_kind: dict[str, int] = {}
        for e in redirects:
            by_kind[e["kind"]] = by_kind.get(e["kind"], 0) + int(e.get("count", 1))
        total = sum(by_kind.values())
        kinds = ", ".join(f"{_KIND_WORDS.get(k, k)} {n:,}" for k, n in sorted(by_kind.items(), key=lambda kv: -kv[1]))
        lines.extend(textwrap.wrap(f"redirected: {total:,} CUDA requests at {len(redirects)} sites — {kinds}",
                                   width=width, subsequent_indent="    ")[:3])
        # the rows a user acts on first: what changed numerics or behaviour, then the most frequent
        order = {"low_precision": 0, "amp": 1, "distributed": 2, "device": 3, "namespace": 4}
        shown = sorted((e for e in redirects if e["kind"] != "probe"),
                       key=lambda e: (order.get(e["kind"], 5), -int(e.get("count", 1))))
        for e in shown[:_SHOWN["redirect"]]:
            where = _site({"file": e.get("file"), "line": e.get("line"), "library": e.get("library")})
            code = f" [{e['code']} {e['class']}]" if e.get("code") else ""
            add(_cut(f"  {where}: {e['asked']} ×{e.get('count', 1)} → {e['became']}{code}", width))
        if len(shown) > _SHOWN["redirect"]:
            add(f"  … {len(shown) - _SHOWN['redirect']} more ({full_hint})")
    for step in _next_steps(log, full_hint):
        add(_cut(step, width))
    if len(lines) > MAX_LINES:  # never longer than a screen: the rest is behind --report full
        lines = lines[:MAX_LINES - 1] + [f"… ({full_hint} has the rest)"]
    return lines


def _compiled_lines(log: Any, width: int | None = None) -> list[str]:
    """What torch.compile compiled in the run (routing/compiled.py): nothing when nothing did."""
    from ..routing.compiled import report_lines

    return report_lines(log.compiled() if log is not None and hasattr(log, "compiled") else None, width)


def _next_steps(log: Any, full_hint: str) -> list[str]:
    s = log.summary() if log is not None and len(log) else {}
    steps = []
    if s.get("fallback"):
        steps.append("next: `torch-adapter run --fallback error ...` stops at the first fallback, with its line")
    steps.append(f"{'next' if not steps else '     '}: `{full_hint}` shows every op and redirect; "
                 "`--report-json FILE` keeps them")
    return steps
