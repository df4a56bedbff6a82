"""The kernel → front-end contract: one versioned payload per cell, in one place.

The same dict travels two ways after each cell that ran aten ops (or compiled):

- a display output whose bundle holds it under :data:`MIME`
  (``application/vnd.torch-adapter.routing+json``) with ``text/html`` and ``text/plain``
  renderings, so classic Notebook, VS Code and nbconvert show something;
- a comm (target :data:`COMM_TARGET`) opened with it as data, keyed by ``cell_id``
  (the front end's cell id, or ``None`` where the front end sends none: then
  ``execution_count`` identifies the cell).

Schema ``torch-adapter.cell-routing`` version 2 (docs/jupyter.md; version 1 had three
routes and no ``top_yours``/``top_refused``)::

    {"schema": "torch-adapter.cell-routing", "version": 2,
     "cell_id": "a1b2..." | null, "execution_count": 3,
     "target": "mps", "simulated": true, "policy": "allow",
     "counts": {"native": 412, "composite": 37, "yours": 2, "fallback": 3, "refused": 0},  # op calls
     "ops": {"native": 40, "composite": 5, "yours": 1, "fallback": 1, "refused": 0},      # distinct ops
     "top_fallbacks": [{"op": "aten::nonzero", "calls": 3, "reason": "...", "code": "TA-F001",
                        "site": "train.py:12" | null}],        # route fallback: ran on the CPU
     "top_yours": [...], "top_refused": [...],                  # the same, for those routes
     "wall_ms": 12.5, "op_time_ms": 8.1, "bytes_copied": 2048,
     "session": {"cells": 3, "native": 900, "composite": 80, "yours": 2, "fallback": 5, "refused": 0},
     "session_id": "3f2a9c0d1b7e",   # one per %load_ext: totals count only the current session's cells
     "dtypes": {"judged": true, "note": "", "calls": 1,              # simulated targets only
                "findings": [{"op": "aten::empty.memory_format", "dtype": "float64", "calls": 1,
                              "message": "...", "code": "TA-D001", "site": "cell [4], line 1" | null}]},
     "compiled": {"line": "compiled: 1 graph (update, cell [5], line 1), 0 graph breaks; ...",  # when it did
                  "details": ["  graph break at ...: ..."], "graphs": 1, "graph_breaks": 0,
                  "recompiles": 0, "failures": 0}}

``compiled`` (added within version 2) says what torch.compile compiled in the cell (routing/compiled.py):
ops inside compiled code are not in ``counts``. ``code`` is the reason's stable code (docs/reasons.md; added within version 2: older front ends ignore
it). ``dtypes`` is a finding kind of its own, never a route: calls the real target refuses for their
dtype (``configure(dtype_check="record")``); ``judged`` false says the profile has no dtype data.

The status (:data:`STATUS_SCHEMA`, same version) is what ``%adapter`` shows, plus ``loaded``
(the extension is loaded in this kernel); the kernel sends it whenever target, policy,
observation or loading changed, and answers it to a front end that asks (front_end_state).

Renderings here are pure functions of the payload.
"""

from __future__ import annotations

import html
from typing import Any

from ..routing.wording import COLORS as _COLORS, LONG, ROUTES as _ROUTES, SHORT

__all__ = ["MIME", "COMM_TARGET", "SCHEMA", "VERSION", "STATUS_SCHEMA", "Status", "build_payload", "build_status",
           "render_text", "render_html", "bundle"]

MIME = "application/vnd.torch-adapter.routing+json"
COMM_TARGET = "torch_adapter"
SCHEMA = "torch-adapter.cell-routing"
VERSION = 2
ROUTES = _ROUTES


STATUS_SCHEMA = "torch-adapter.status"


def _site(site: dict[str, Any] | None) -> str | None:
    """``"cell [11], line 6"`` for a notebook cell (never the kernel's temp file), else ``"file:line"``."""
    from ..core.callsite import site_text

    return site_text(site) or None


def build_payload(log: Any, *, cell_id: str | None, execution_count: int | None, policy: str,
                  wall_ms: float, session_totals: dict[str, int], top: int = 5,
                  session_id: str | None = None) -> dict[str, Any]:
    """The payload for one cell from its RoutingLog (see the module docstring)."""
    records = log.records()
    distinct: dict[str, set[str]] = {r: set() for r in ROUTES}
    for rec in records:
        distinct[rec.route].add(rec.op)
    def top_of(route: str) -> list[dict[str, Any]]:
        ranked = sorted((r for r in records if r.route == route), key=lambda r: -r.calls)[:top]
        return [{"op": r.op, "calls": r.calls, "reason": r.reason, "code": r.code, "site": _site(r.site)} for r in ranked]

    return {
        "schema": SCHEMA, "version": VERSION, "cell_id": cell_id, "execution_count": execution_count,
        "target": log.target, "simulated": bool(log.simulated), "emulated": bool(getattr(log, "emulated", False)),
        "policy": policy,
        "counts": log.summary(), "ops": {r: len(distinct[r]) for r in ROUTES},
        "top_fallbacks": top_of("fallback"), "top_yours": top_of("yours"), "top_refused": top_of("refused"),
        "wall_ms": round(wall_ms, 3),
        "op_time_ms": round(sum(r.self_time_ns for r in records) / 1e6, 3),
        "bytes_copied": int(log.bytes_copied),
        "session": dict(session_totals), "session_id": session_id,
        **_dtypes(log, top),
        **_compiled(log),
    }


def _compiled(log: Any) -> dict[str, Any]:
    """The payload's ``compiled`` entry where torch.compile compiled in the cell (routing/compiled.py):
    its summary line and detail lines (graph breaks with their lines, recompiles, failures), and the
    counts the front end shows; absent when nothing compiled."""
    facts = log.compiled() if hasattr(log, "compiled") else None
    if not facts:
        return {}
    from ..routing.compiled import detail_lines, summary_line

    return {"compiled": {"line": summary_line(facts), "details": detail_lines(facts),
                         "graphs": int(facts.get("graphs", 0)), "graph_breaks": int(facts.get("graph_break_count", 0)),
                         "recompiles": int(facts.get("recompile_count", 0)), "failures": len(facts.get("failures", []))}}


def _dtypes(log: Any, top: int) -> dict[str, Any]:
    """The payload's ``dtypes`` entry (absent on real targets, which judge dtypes themselves)."""
    note = getattr(log, "dtype_note", None)
    findings = log.dtype_table() if hasattr(log, "dtype_table") else []
    if note is None and not findings:
        return {}
    return {"dtypes": {"judged": not note, "note": note or "", "calls": sum(f["calls"] for f in findings),
                       "findings": [{"op": f["op"], "dtype": f["dtype"], "calls": f["calls"], "message": f["message"],
                                     "code": f.get("code", ""), "site": _site(f["site"])} for f in findings[:top]]}}


def _dtype_text(payload: dict[str, Any]) -> str:
    d = payload.get("dtypes")
    if not d:
        return ""
    if d["calls"]:
        return f" · {d['calls']} dtype refused"
    return "" if d["judged"] else " · dtypes not judged"


def _label(payload: dict[str, Any]) -> str:
    from ..routing.log import target_label

    return target_label(payload["target"], payload["simulated"], payload.get("emulated", False))


def counts_text(counts: dict[str, int], words: dict[str, str] = SHORT) -> str:
    """``"412 native · 37 composite · 3 CPU"``, with yours and refused when there are any."""
    return " · ".join(f"{counts.get(r, 0):,} {words[r]}" for r in ROUTES
                      if r in ("native", "composite", "fallback") or counts.get(r, 0))


_TOP = (("top_refused", "refused"), ("top_fallbacks", "fallback"), ("top_yours", "yours"))


def _coded(fb: dict[str, Any]) -> str:
    """``"TA-F001 no MPS kernel and no decomposition; ..."``: the reason led by its code (docs/reasons.md)."""
    return f"{fb['code']} {fb['reason']}" if fb.get("code") else fb["reason"]


def render_text(payload: dict[str, Any]) -> str:
    line = (f"torch_adapter [{_label(payload)}]: {counts_text(payload['counts'], LONG)} op calls "
            f"({payload['ops']['fallback']} distinct ops fell back to the CPU){_dtype_text(payload)}")
    for key, route in _TOP:
        for fb in payload.get(key, []):
            where = f" at {fb['site']}" if fb["site"] else ""
            line += f"\n  {LONG[route]} {fb['op']} ×{fb['calls']}{where}: {_coded(fb)}"
    d = payload.get("dtypes") or {}
    for f in d.get("findings", []):
        where = f" at {f['site']}" if f["site"] else ""
        line += (f"\n  dtype {f['dtype']} not on {payload['target']}: {f['op']} ×{f['calls']}{where}: "
                 f"{f.get('code', 'TA-D001')} {f['message']}")
    if d and not d["judged"]:
        line += f"\n  dtypes not judged: {d['note']}"
    compiled = payload.get("compiled")
    if compiled:
        line += "".join(f"\n  {text}" for text in [compiled["line"], *compiled["details"]])
    return line


def render_html(payload: dict[str, Any]) -> str:
    c = payload["counts"]
    total = max(1, sum(c.values()))
    bar = "".join(
        f'<span title="{r}: {c[r]}" style="display:inline-block;height:8px;width:{100 * c[r] / total:.2f}%;'
        f'background:{_COLORS[r]}"></span>' for r in ROUTES if c[r])
    tips = "".join(
        f"<li>{LONG[route]} <code>{html.escape(fb['op'])}</code> ×{fb['calls']}"
        f"{' at <code>' + html.escape(fb['site']) + '</code>' if fb['site'] else ''}: {html.escape(_coded(fb))}</li>"
        for key, route in _TOP for fb in payload.get(key, []))
    worst = next((r for r in ("refused", "fallback") if c.get(r)), "native")
    colour = _COLORS[worst]
    return (
        f'<div class="torch-adapter-routing" style="font-family:sans-serif;font-size:12px;'
        f'border-left:3px solid {colour};padding:2px 6px">'
        f"<b>torch_adapter</b> [{html.escape(_label(payload))}] "
        f"{html.escape(counts_text(c))}{html.escape(_dtype_text(payload))}"
        f'<div style="width:240px;background:#eee">{bar}</div>'
        f"{'<ul style=margin:2px>' + tips + '</ul>' if tips else ''}{_compiled_html(payload)}</div>")


def _compiled_html(payload: dict[str, Any]) -> str:
    compiled = payload.get("compiled")
    if not compiled:
        return ""
    details = "".join(f"<li>{html.escape(t.strip())}</li>" for t in compiled["details"])
    return (f"<div class='torch-adapter-compiled'>{html.escape(compiled['line'])}"
            f"{'<ul style=margin:2px>' + details + '</ul>' if details else ''}</div>")


def bundle(payload: dict[str, Any]) -> dict[str, Any]:
    """The display bundle: the vendor MIME type plus HTML and text fallbacks."""
    return {MIME: payload, "text/html": render_html(payload), "text/plain": render_text(payload)}


class Status(dict):
    """``%adapter`` status: a dict (schema :data:`STATUS_SCHEMA`, what the Lab extension
    reads) that shows as a few aligned lines rather than as a dict."""

    def text(self) -> str:
        if self.get("target") is None:
            return "torch_adapter: not installed" + ("" if self.get("loaded") else " (the extension is not loaded)")
        from ..routing.log import target_label

        label = target_label(self["target"], self["simulated"], self.get("emulated", False))
        return "\n".join([
            f"torch_adapter  target {label}",
            f"  fallback policy  {self['policy']}",
            f"  AMP dtype        {self['amp']}",
            f"  observing        {'on' if self['observing'] else 'off'} (per-cell routing reports)",
            f"  session          {self['cells']} {'cell' if self['cells'] == 1 else 'cells'} · "
            f"{counts_text(self, LONG)} op calls"])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def build_status(session: Any, *, observing: bool, totals: dict[str, int], loaded: bool = True,
                 session_id: str | None = None) -> Status:
    """The status of ``session`` (None: not installed) with the router's totals; ``loaded``:
    the extension is loaded in this kernel."""
    amp = None
    if session is not None:
        import torch

        from ..redirect.amp import effective_dtype

        policy = session.config.amp_dtype
        dtype = str(effective_dtype(policy, session.target.device_type, torch.float16)).removeprefix("torch.")
        amp = (f"{dtype} (policy {policy}: autocast('cuda', float16) computes in {dtype} on "
               f"{session.target.device_type})")
        rewrite = getattr(session, "low_precision", None)
        heavy = getattr(rewrite, "dtype", None)
        if dtype == "float16" and heavy is not None and heavy is not torch.float16:
            # what %%adapter_trace shows: the float16 matmuls, convolutions and attention are computed in
            # another dtype on this CPU (routing/low_precision.py), float16 in and out
            heavy_name = str(heavy).removeprefix("torch.")
            amp += (f"; its matmuls, convolutions and attention compute in {heavy_name} on this CPU, float16 in "
                    f"and out (float16_compute={session.config.float16_compute!r})")
    return Status({
        "schema": STATUS_SCHEMA, "version": VERSION,
        "target": session.target.name if session is not None else None,
        "simulated": bool(session.target.simulated) if session is not None else False,
        "emulated": bool(session.target.emulated) if session is not None else False,
        "policy": session.config.fallback if session is not None else None,
        "amp_dtype": session.config.amp_dtype if session is not None else None, "amp": amp,
        "observing": bool(observing), "loaded": bool(loaded), "session_id": session_id if loaded else None,
        **{"cells": 0, **dict.fromkeys(ROUTES, 0), **{k: int(v) for k, v in totals.items()}}})
