"""The kernel → front-end contract: one versioned payload per cell, in one place.

The same dict travels two ways after each cell that ran aten ops:

- a display output whose bundle holds it under :data:`MIME`
  (``application/vnd.torch-adapter.routing+json``) with ``text/html`` and ``text/plain``
  renderings, so classic Notebook, VS Code and nbconvert show something;
- a comm (target :data:`COMM_TARGET`) opened with it as data, keyed by ``cell_id``
  (the front end's cell id, or ``None`` where the front end sends none: then
  ``execution_count`` identifies the cell).

Schema ``torch-adapter.cell-routing`` version 1 (docs/jupyter.md)::

    {"schema": "torch-adapter.cell-routing", "version": 1,
     "cell_id": "a1b2..." | null, "execution_count": 3,
     "target": "mps", "simulated": true, "policy": "allow",
     "counts": {"native": 412, "composite": 37, "fallback": 3},   # op calls this cell
     "ops": {"native": 40, "composite": 5, "fallback": 1},         # distinct ops this cell
     "top_fallbacks": [{"op": "aten::nonzero", "calls": 3, "reason": "...",
                        "site": "train.py:12" | null}],
     "wall_ms": 12.5, "op_time_ms": 8.1, "bytes_copied": 2048,
     "session": {"cells": 3, "native": 900, "composite": 80, "fallback": 5},
     "dtypes": {"judged": true, "note": "", "calls": 1,              # simulated targets only
                "findings": [{"op": "aten::empty.memory_format", "dtype": "float64", "calls": 1,
                              "message": "...", "site": "cell [4], line 1" | null}]}}

``dtypes`` is a finding kind of its own, never a route: calls the real target refuses for their
dtype (``configure(dtype_check="record")``); ``judged`` false says the profile has no dtype data.

Renderings here are pure functions of the payload.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["MIME", "COMM_TARGET", "SCHEMA", "VERSION", "STATUS_SCHEMA", "Status", "build_payload", "build_status",
           "render_text", "render_html", "bundle"]

MIME = "application/vnd.torch-adapter.routing+json"
COMM_TARGET = "torch_adapter"
SCHEMA = "torch-adapter.cell-routing"
VERSION = 1
ROUTES = ("native", "composite", "fallback")


STATUS_SCHEMA = "torch-adapter.status"


def _site(site: dict[str, Any] | None) -> str | None:
    """``"cell [11], line 6"`` for a notebook cell (never the kernel's temp file), else ``"file:line"``."""
    from ..core.callsite import site_text

    return site_text(site) or None


def build_payload(log: Any, *, cell_id: str | None, execution_count: int | None, policy: str,
                  wall_ms: float, session_totals: dict[str, int], top: int = 5) -> dict[str, Any]:
    """The payload for one cell from its RoutingLog (see the module docstring)."""
    records = log.records()
    distinct: dict[str, set[str]] = {r: set() for r in ROUTES}
    for rec in records:
        distinct[rec.route].add(rec.op)
    fallbacks = sorted((r for r in records if r.route == "fallback"), key=lambda r: -r.calls)[:top]
    return {
        "schema": SCHEMA, "version": VERSION, "cell_id": cell_id, "execution_count": execution_count,
        "target": log.target, "simulated": bool(log.simulated), "policy": policy,
        "counts": log.summary(), "ops": {r: len(distinct[r]) for r in ROUTES},
        "top_fallbacks": [{"op": r.op, "calls": r.calls, "reason": r.reason, "site": _site(r.site)}
                          for r in fallbacks],
        "wall_ms": round(wall_ms, 3),
        "op_time_ms": round(sum(r.self_time_ns for r in records) / 1e6, 3),
        "bytes_copied": int(log.bytes_copied),
        "session": dict(session_totals),
        **_dtypes(log, top),
    }


def _dtypes(log: Any, top: int) -> dict[str, Any]:
    """The payload's ``dtypes`` entry (absent on real targets, which judge dtypes themselves)."""
    note = getattr(log, "dtype_note", None)
    findings = log.dtype_table() if hasattr(log, "dtype_table") else []
    if note is None and not findings:
        return {}
    return {"dtypes": {"judged": not note, "note": note or "", "calls": sum(f["calls"] for f in findings),
                       "findings": [{"op": f["op"], "dtype": f["dtype"], "calls": f["calls"], "message": f["message"],
                                     "site": _site(f["site"])} for f in findings[:top]]}}


def _dtype_text(payload: dict[str, Any]) -> str:
    d = payload.get("dtypes")
    if not d:
        return ""
    if d["calls"]:
        return f" · {d['calls']} dtype refused"
    return "" if d["judged"] else " · dtypes not judged"


def _label(payload: dict[str, Any]) -> str:
    return f"{payload['target']}{' (simulated)' if payload['simulated'] else ''}"


def render_text(payload: dict[str, Any]) -> str:
    c = payload["counts"]
    line = (f"torch_adapter [{_label(payload)}]: {c['native']} native · {c['composite']} composite · "
            f"{c['fallback']} CPU fallback op calls ({payload['ops']['fallback']} distinct ops fell back)"
            f"{_dtype_text(payload)}")
    for fb in payload["top_fallbacks"]:
        where = f" at {fb['site']}" if fb["site"] else ""
        line += f"\n  fallback {fb['op']} ×{fb['calls']}{where}: {fb['reason']}"
    d = payload.get("dtypes") or {}
    for f in d.get("findings", []):
        where = f" at {f['site']}" if f["site"] else ""
        line += f"\n  dtype {f['dtype']} not on {payload['target']}: {f['op']} ×{f['calls']}{where}: {f['message']}"
    if d and not d["judged"]:
        line += f"\n  dtypes not judged: {d['note']}"
    return line


_COLORS = {"native": "#2e7d32", "composite": "#f9a825", "fallback": "#c62828"}


def render_html(payload: dict[str, Any]) -> str:
    c = payload["counts"]
    total = max(1, sum(c.values()))
    bar = "".join(
        f'<span title="{r}: {c[r]}" style="display:inline-block;height:8px;width:{100 * c[r] / total:.2f}%;'
        f'background:{_COLORS[r]}"></span>' for r in ROUTES if c[r])
    tips = "".join(
        f"<li><code>{html.escape(fb['op'])}</code> ×{fb['calls']}"
        f"{' at <code>' + html.escape(fb['site']) + '</code>' if fb['site'] else ''}: {html.escape(fb['reason'])}</li>"
        for fb in payload["top_fallbacks"])
    colour = _COLORS["fallback"] if c["fallback"] else _COLORS["native"]
    return (
        f'<div class="torch-adapter-routing" style="font-family:sans-serif;font-size:12px;'
        f'border-left:3px solid {colour};padding:2px 6px">'
        f"<b>torch_adapter</b> [{html.escape(_label(payload))}] "
        f"{c['native']} native · {c['composite']} composite · {c['fallback']} CPU{html.escape(_dtype_text(payload))}"
        f'<div style="width:240px;background:#eee">{bar}</div>'
        f"{'<ul style=margin:2px>' + tips + '</ul>' if tips else ''}</div>")


def bundle(payload: dict[str, Any]) -> dict[str, Any]:
    """The display bundle: the vendor MIME type plus HTML and text fallbacks."""
    return {MIME: payload, "text/html": render_html(payload), "text/plain": render_text(payload)}


class Status(dict):
    """``%adapter`` status: a dict (schema :data:`STATUS_SCHEMA`, what the Lab extension
    reads) that shows as a few aligned lines rather than as a dict."""

    def text(self) -> str:
        if self.get("target") is None:
            return "torch_adapter: not installed"
        label = f"{self['target']}{' (simulated)' if self['simulated'] else ''}"
        return "\n".join([
            f"torch_adapter  target {label}",
            f"  fallback policy  {self['policy']}",
            f"  AMP dtype        {self['amp']}",
            f"  observing        {'on' if self['observing'] else 'off'} (per-cell routing reports)",
            f"  session          {self['cells']} cells · {self['native']:,} native · {self['composite']:,} composite · "
            f"{self['fallback']:,} CPU fallback op calls"])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def build_status(session: Any, *, observing: bool, totals: dict[str, int]) -> Status:
    """The status of ``session`` (None: not installed) with the router's totals."""
    amp = None
    if session is not None:
        import torch

        from ..redirect.amp import effective_dtype

        policy = session.config.amp_dtype
        dtype = str(effective_dtype(policy, session.target.device_type, torch.float16)).removeprefix("torch.")
        amp = (f"{dtype} (policy {policy}: autocast('cuda', float16) computes in {dtype} on "
               f"{session.target.device_type})")
    return Status({
        "schema": STATUS_SCHEMA, "version": VERSION,
        "target": session.target.name if session is not None else None,
        "simulated": bool(session.target.simulated) if session is not None else False,
        "policy": session.config.fallback if session is not None else None,
        "amp_dtype": session.config.amp_dtype if session is not None else None, "amp": amp,
        "observing": bool(observing), **{k: int(v) for k, v in totals.items()}})
