"""RoutingLog: what ran how — per (op, route, parent): calls, self time, bytes copied, why.

Filled by the engine and ``trace()`` recorders, or by anyone through :meth:`RoutingLog.add`
and :meth:`RoutingLog.merge` (the observer on real targets adds its counts this way).
Renderings are pure functions of the data: :meth:`~RoutingLog.to_json` (schema below,
documented in docs/routing.md), :meth:`~RoutingLog.table`, and a rich table
(:meth:`~RoutingLog.render`, ``__rich__``).

Entries are listed as a tree: each top-level entry (what needs a look first: refused,
fallback, composite, yours, native; most calls first) followed by the entries run as its
pieces, depth first (:meth:`~RoutingLog.tree`), so a child is always under its own parent.

JSON schema ``torch-adapter.routing-log`` version 2 (version 1 had three routes; it is
still read)::

    {"schema": "torch-adapter.routing-log", "version": 2, "target": "mps", "simulated": true,
     "summary": {"native": 10, "composite": 2, "yours": 1, "fallback": 1, "refused": 0},  # op calls
     "ops": [{"op": "aten::add.Tensor", "route": "native", "calls": 10, "self_time_ms": 0.4,
              "bytes_copied": 0, "bytes_to_cpu": 0, "bytes_from_cpu": 0,
              "reason": "...", "via": "MPS", "parent": null,
              "site": {"file": "train.py", "line": 12, "function": "step"}}],
     "dtypes": {"judged": true, "note": "",                              # only on simulated targets
                "findings": [{"op": "aten::empty.memory_format", "dtype": "float64", "calls": 1,
                              "error": "TypeError", "message": "...", "source": "...", "site": {...}}]}}

``"compiled"`` (only when ``torch.compile`` compiled in the scope): what compiled — graphs, frames,
graph breaks with reason and site, recompiles, compiled functions (:mod:`.compiled`, :meth:`RoutingLog.compiled`).

Dtype findings are their own kind, never a route: a call the real target would refuse for its
dtype (``routing/dtype_check.py``), recorded under ``configure(dtype_check="record")``.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from ..core.codes import dtype_code, route_code
from .wording import ROUTES, SHORT, WORST_FIRST, format_bytes

__all__ = ["OpRecord", "DtypeFinding", "RoutingLog", "SCHEMA", "VERSION", "user_site", "counts_text", "tree_prefix"]

SCHEMA = "torch-adapter.routing-log"
VERSION = 2
_READS = (1, 2)
_ROUTES = ROUTES


def user_site(depth: int = 1) -> dict[str, Any] | None:
    """The innermost calling frame that is user code: file, line, function (see _callsite)."""
    from ..core.callsite import user_site as _user_site

    return _user_site(depth + 1)


@dataclass
class OpRecord:
    """The counters of one (op, route, parent)."""

    op: str
    route: str
    calls: int = 0
    self_time_ns: int = 0
    bytes_to_cpu: int = 0
    bytes_from_cpu: int = 0
    reason: str = ""
    via: str | None = None
    site: dict[str, Any] | None = None
    parent: str | None = None

    @property
    def bytes_copied(self) -> int:
        return self.bytes_to_cpu + self.bytes_from_cpu

    @property
    def code(self) -> str:
        """The reason's stable code (``TA-F001``: core/codes.py, docs/reasons.md)."""
        return route_code(self.route, self.via, self.reason)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "route": self.route, "calls": self.calls,
                "self_time_ms": round(self.self_time_ns / 1e6, 6), "bytes_copied": self.bytes_copied,
                "bytes_to_cpu": self.bytes_to_cpu, "bytes_from_cpu": self.bytes_from_cpu,
                "reason": self.reason, "code": self.code, "via": self.via, "site": self.site, "parent": self.parent}


@dataclass
class DtypeFinding:
    """Calls the real target refuses for their dtype ("dtype float64 not on mps"), per (op, dtype, site)."""

    op: str
    dtype: str
    calls: int = 0
    error: str = ""
    message: str = ""
    source: str = ""
    site: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "calls": self.calls, "error": self.error,
                "message": self.message, "source": self.source, "site": self.site, "code": dtype_code(self)}


def _site_key(site: dict[str, Any] | None) -> tuple[Any, Any]:
    return (site.get("file"), site.get("line")) if site else (None, None)


def _route(route: Any) -> str:
    value = getattr(route, "value", route)
    if value not in _ROUTES:
        from ..errors import UsageError, format_error

        raise UsageError(format_error("RoutingLog.add(route=...)", f"one of {_ROUTES} or a Route",
                                      repr(route), fix='e.g. log.add("aten::add.Tensor", "native")'))
    return value


class RoutingLog:
    """Routing events of one scope (a ``trace()`` block, a notebook cell, a whole run)."""

    def __init__(self, target: str = "", simulated: bool = False, emulated: bool = False) -> None:
        self.target = target
        self.simulated = simulated
        self.emulated = emulated  # the target is the project's emulated device (torch_adapter/emulated)
        self.entries: dict[tuple[str, str, str | None], OpRecord] = {}
        self.meta: dict[str, Any] = {}
        self.dtype_findings: dict[tuple[Any, ...], DtypeFinding] = {}
        self.dtype_note: str | None = None  # None: not judged (real target); "": judged; else why not
        # what torch.compile compiled in the scope (routing/compiled.py), None when nothing did
        self.compile_facts: dict[str, Any] | None = None
        self._lock = threading.Lock()

    # -- filling -------------------------------------------------------------------------
    def add(self, op: str, route: Any, *, calls: int = 1, self_time_ns: int = 0, bytes_to_cpu: int = 0,
            bytes_from_cpu: int = 0, reason: str = "", via: str | None = None,
            site: dict[str, Any] | None = None, parent: str | None = None, find_site: bool = False) -> OpRecord:
        """Add counts to the (op, route, parent) entry, creating it (with ``site``) if new.

        ``find_site=True`` looks up the first user call site when the entry is new.
        """
        key = (op, _route(route), parent)
        with self._lock:
            rec = self.entries.get(key)
            if rec is None:
                if site is None and find_site:
                    site = user_site(2)
                rec = self.entries[key] = OpRecord(op, key[1], reason=reason, via=via, site=site, parent=parent)
            rec.calls += calls
            rec.self_time_ns += self_time_ns
            rec.bytes_to_cpu += bytes_to_cpu
            rec.bytes_from_cpu += bytes_from_cpu
        return rec

    def add_decision(self, decision: Any, **counts: Any) -> OpRecord:
        """:meth:`add` with op, route, reason and via taken from a RouteDecision."""
        return self.add(decision.op, decision.route, reason=decision.reason, via=decision.via, **counts)

    def add_dtype(self, op: str, dtype: str, *, calls: int = 1, error: str = "", message: str = "",
                  source: str = "", site: dict[str, Any] | None = None) -> DtypeFinding:
        """Count a call the target refuses for its dtype (one entry per op, dtype and site)."""
        key = (op, dtype, *_site_key(site))
        with self._lock:
            rec = self.dtype_findings.get(key)
            if rec is None:
                rec = self.dtype_findings[key] = DtypeFinding(op, dtype, error=error, message=message,
                                                              source=source, site=site)
            rec.calls += calls
        return rec

    def dtype_table(self) -> list[dict[str, Any]]:
        """The dtype findings, most calls first."""
        rows = sorted(self.dtype_findings.values(), key=lambda r: (-r.calls, r.dtype, r.op))
        return [r.as_dict() for r in rows]

    def merge_dtypes(self, other: "RoutingLog") -> "RoutingLog":
        """Add ``other``'s dtype findings (and its judged/not-judged note, if this log has none)."""
        for f in list(other.dtype_findings.values()):
            self.add_dtype(f.op, f.dtype, calls=f.calls, error=f.error, message=f.message, source=f.source,
                           site=f.site)
        if self.dtype_note is None:
            self.dtype_note = other.dtype_note
        return self

    def merge(self, other: "RoutingLog") -> "RoutingLog":
        """Add every entry of ``other`` to this log (sites: the first one seen wins). Returns self."""
        self.merge_dtypes(other)
        if getattr(other, "compile_facts", None) is not None:
            from .compiled import merge as merge_compiled

            self.compile_facts = merge_compiled(self.compile_facts, other.compile_facts)
        for rec in list(other.entries.values()):
            self.add(rec.op, rec.route, calls=rec.calls, self_time_ns=rec.self_time_ns,
                     bytes_to_cpu=rec.bytes_to_cpu, bytes_from_cpu=rec.bytes_from_cpu, reason=rec.reason,
                     via=rec.via, site=rec.site, parent=rec.parent)
        return self

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self.dtype_findings.clear()

    # -- reading ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def compiled(self) -> dict[str, Any] | None:
        """What ``torch.compile`` compiled in the scope — graphs, frames, graph breaks (reason, site),
        recompiles, the compiled functions and their sites (routing/compiled.py) — or None when
        nothing compiled. Ops inside compiled code are not in the op counts."""
        return self.compile_facts

    def summary(self) -> dict[str, int]:
        """Op call counts per route: ``{"native": n, "composite": n, "yours": n, "fallback": n, "refused": n}``."""
        out = dict.fromkeys(_ROUTES, 0)
        for rec in list(self.entries.values()):
            out[rec.route] += rec.calls
        return out

    @property
    def bytes_copied(self) -> int:
        return sum(rec.bytes_copied for rec in list(self.entries.values()))

    def routes(self, parent: Any = ...) -> dict[str, str]:
        """``{op: route}`` (the last route seen per op); ``parent=None`` keeps top-level calls only."""
        return {r.op: r.route for r in self.records() if parent is ... or r.parent == parent}

    def records(self) -> list[OpRecord]:
        """Entries in tree order (:meth:`tree`): each parent followed by its pieces."""
        return [rec for _, rec in self.tree()]

    def tree(self) -> list[tuple[int, OpRecord]]:
        """``(depth, entry)`` depth first: top-level entries (refused, fallback, composite, yours,
        native; most calls first), each followed by the entries whose parent is its op, in the
        same order. Entries of a parent op are listed once, under that op's first entry; those
        whose parent has no entry of its own (or sits in a cycle) come at depth 1 under a
        top-level stand-in: the first of them, at its place among the top-level entries."""
        def key(r: OpRecord) -> tuple[Any, ...]:
            return (WORST_FIRST[r.route], -r.calls, r.op, r.parent or "")

        entries = sorted(self.entries.values(), key=key)
        children: dict[str, list[OpRecord]] = {}
        for rec in entries:
            if rec.parent is not None:
                children.setdefault(rec.parent, []).append(rec)
        out: list[tuple[int, OpRecord]] = []
        placed: set[str] = set()  # parents whose pieces are listed

        def walk(rec: OpRecord, depth: int) -> None:
            out.append((depth, rec))
            if rec.op in placed:
                return
            placed.add(rec.op)
            for child in children.get(rec.op, ()):
                walk(child, depth + 1)

        for rec in entries:
            if rec.parent is None:
                walk(rec, 0)
        for rec in entries:  # pieces of a parent with no entry reached from the top
            if rec.parent is not None and rec.parent not in placed:
                placed.add(rec.parent)
                for child in children[rec.parent]:
                    walk(child, 1)
        return out

    def table(self) -> list[dict[str, Any]]:
        """One JSON-able row per entry (the ``ops`` list of :meth:`to_dict`)."""
        return [rec.as_dict() for rec in self.records()]

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": SCHEMA, "version": VERSION, "target": self.target, "simulated": self.simulated,
               "emulated": self.emulated,
               "summary": self.summary(), "ops": self.table()}
        if self.meta:
            out["meta"] = dict(self.meta)
        if self.dtype_note is not None or self.dtype_findings:
            out["dtypes"] = {"judged": not self.dtype_note, "note": self.dtype_note or "",
                             "findings": self.dtype_table()}
        if self.compile_facts is not None:
            out["compiled"] = self.compile_facts
        return out

    def to_json(self, indent: int | None = None) -> str:
        """The log as JSON (schema ``torch-adapter.routing-log``, version 2)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RoutingLog":
        from ..errors import UsageError, format_error

        if data.get("schema") != SCHEMA or data.get("version") not in _READS:
            raise UsageError(format_error(
                "RoutingLog.from_dict()", f"schema {SCHEMA!r} version {' or '.join(map(str, _READS))}",
                f"schema {data.get('schema')!r} version {data.get('version')!r}",
                fix="pass the output of RoutingLog.to_dict()/to_json()"))
        log = cls(data.get("target", ""), bool(data.get("simulated", False)), bool(data.get("emulated", False)))
        log.meta = dict(data.get("meta") or {})
        if isinstance(data.get("compiled"), dict):
            log.compile_facts = dict(data["compiled"])
        dtypes = data.get("dtypes")
        if dtypes:
            log.dtype_note = dtypes.get("note", "")
            for f in dtypes.get("findings", []):
                log.add_dtype(f["op"], f["dtype"], calls=f.get("calls", 1), error=f.get("error", ""),
                              message=f.get("message", ""), source=f.get("source", ""), site=f.get("site"))
        for row in data.get("ops", []):
            log.add(row["op"], row["route"], calls=row["calls"], self_time_ns=round(row["self_time_ms"] * 1e6),
                    bytes_to_cpu=row.get("bytes_to_cpu", row["bytes_copied"]),
                    bytes_from_cpu=row.get("bytes_from_cpu", 0), reason=row.get("reason", ""),
                    via=row.get("via"), site=row.get("site"), parent=row.get("parent"))
        return log

    @classmethod
    def from_json(cls, text: str) -> "RoutingLog":
        return cls.from_dict(json.loads(text))

    # -- rendering ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        s = self.summary()
        return (f"<RoutingLog {target_label(self.target or '?', self.simulated, self.emulated)}: "
                f"{counts_text(s, sep=', ')} calls, {_fmt_bytes(self.bytes_copied)} copied>")

    def __rich__(self) -> Any:
        return rich_table(self)

    def render(self, width: int = 120, limit: int | None = 40) -> str:
        """The rich table as plain text (what ``torch-adapter run --report`` prints)."""
        from rich.console import Console

        console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None, force_jupyter=False)
        console.print(rich_table(self, limit=limit))
        console.file.close()
        return console.export_text()


def target_label(name: str, simulated: bool = False, emulated: bool = False) -> str:
    """How every view words a target: "mps (simulated)", "npu (emulated)", "cpu"."""
    return f"{name} (simulated)" if simulated else f"{name} (emulated)" if emulated else name


def _fmt_bytes(n: int) -> str:
    return format_bytes(n)


def counts_text(summary: dict[str, int], sep: str = " · ") -> str:
    """``"10 native · 2 composite · 1 CPU fallback"``, with yours and refused when there are any."""
    words = {**SHORT, "fallback": "CPU fallback"}
    return sep.join(f"{summary.get(r, 0):,} {words[r]}" for r in ROUTES
                    if r in ("native", "composite", "fallback") or summary.get(r, 0))


def tree_prefix(depth: int) -> str:
    """The indent of an entry at ``depth`` in a trace table ("  └ " per level)."""
    return "  " * (depth - 1) + "  └ " if depth else ""


def rich_table(log: RoutingLog, limit: int | None = 40) -> Any:
    """A ``rich.table.Table`` of the log (fallbacks first)."""
    from rich.table import Table

    from ..core.callsite import site_text

    s = log.summary()
    title = (f"Routing on {target_label(log.target or '?', log.simulated, getattr(log, 'emulated', False))}: "
             f"{counts_text(s)} calls · {_fmt_bytes(log.bytes_copied)} copied")
    if log.dtype_findings:
        title += f" · {sum(f.calls for f in log.dtype_findings.values())} calls with a dtype {log.target} refuses"
    elif log.dtype_note:
        title += " · dtypes not judged"
    table = Table(title=title, show_lines=False)
    for col, justify in (("op", "left"), ("route", "left"), ("code", "left"), ("calls", "right"), ("self ms", "right"),
                         ("copied", "right"), ("reason", "left"), ("first call site", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    style = {"native": "green", "composite": "yellow", "yours": "blue", "fallback": "red", "refused": "magenta"}
    records = log.tree()
    for depth, rec in records[:limit] if limit else records:
        site = site_text(rec.site, short=True)
        op = tree_prefix(depth) + rec.op
        table.add_row(op, f"[{style[rec.route]}]{rec.route}[/]", rec.code, str(rec.calls), f"{rec.self_time_ns / 1e6:.2f}",
                      _fmt_bytes(rec.bytes_copied) if rec.bytes_copied else "", rec.reason, site)
    for f in log.dtype_findings.values():  # their own kind: never a route
        table.add_row(f.op, f"[magenta]dtype {f.dtype}[/]", dtype_code(f), str(f.calls), "", "",
                      f"dtype {f.dtype} not on {log.target}: {f.message}", site_text(f.site, short=True))
    if limit and len(records) > limit:
        table.caption = f"{len(records) - limit} more entries: log.table() has them all"
    return table

