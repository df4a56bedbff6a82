"""What ``torch.compile`` compiled during a routing trace (a ``trace()`` block, ``torch-adapter run
--report``, a notebook cell), and its compiles kept out of the trace's op counts.

Ops run inside compiled code (inductor's generated kernels) never reach the dispatcher one by one,
so no routing report can count them per op. What the report says instead is what compiled, from
torch._dynamo's own records, read when the span opens and when it closes:

- its counters (``torch._dynamo.utils.counters``): frames tried and compiled, graphs, graph breaks by
  reason — the span's share is the difference;
- its compile records (``CompilationMetrics``, one per compiled frame; dynamo keeps the last 64): each
  frame's function, file and first line, its graph's op count, the graph-break reasons that made
  dynamo restart it, a recompile's reason, a failure. A graph break's line is the line dynamo resumes
  at: it compiles the rest of the function as ``torch_dynamo_resume_in_<function>_at_<line>``.

:func:`open_span` / :func:`close_span` do that; :func:`close_span` returns the facts as a JSON-able
dict (:func:`empty` lists its keys), or None when nothing compiled (torch._dynamo not even imported:
nothing is read, and nothing imports it). Nothing runs per op. A failure to read reports itself in
the facts (``"errors"``) and never reaches the program.

**Compiling is not the program's work.** While dynamo compiles, it runs the function's ops on fake
tensors (and inductor may run kernels to benchmark them): the C++ op observer of ``trace()`` saw
them as the program's — a notebook cell that compiled a two-op update reported ~1,700 op calls.
While a span is open, dynamo's compile start/end callbacks (its own facility) put the compiling
thread's ops out of the op observers' sight, as routing/internal.py's blocks are; nothing else
changes (dtype checks and the routing engine see the compile as before; the recorder mode is off
while dynamo compiles anyway: ``Recorder.ignore_compile_internals``). The callbacks are registered
only while a span is open (at its start if torch._dynamo is imported, else as it is imported).
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core import torch_private as tp

__all__ = ["open_span", "close_span", "merge", "empty", "summary_line", "report_lines", "detail_lines",
           "NOT_COUNTED"]

NOT_COUNTED = "ops inside compiled code are not counted per op"
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)$")


def empty() -> dict[str, Any]:
    """The facts of a span in which nothing compiled: every key :func:`close_span` gives."""
    return {"graphs": 0, "frames": {"total": 0, "ok": 0}, "graph_break_count": 0, "graph_breaks": [],
            "recompile_count": 0, "recompiles": [], "failures": [], "functions": [], "complete": True,
            "note": NOT_COUNTED, "errors": []}


# -- a span ------------------------------------------------------------------------------------
@dataclass
class Span:
    counters: dict[str, dict[str, int]] | None = None  # dynamo's counters at the start (None: not imported)
    newest: Any = None  # dynamo's newest compile record at the start (compared by identity)
    errors: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)


def open_span() -> Span:
    """Note dynamo's counters and newest record now, and keep compiles out of the op counts until
    :func:`close_span`. Never raises."""
    span = Span()
    try:
        span.counters = tp.dynamo_counters()
        records = tp.dynamo_compile_records()
        span.newest = records[0][-1] if records and records[0] else None
    except Exception as exc:
        span.errors.append(f"reading torch._dynamo's counters failed ({type(exc).__name__}: {exc})")
    try:
        _watch(span)
    except Exception as exc:
        span.errors.append(f"watching torch.compile's compiles failed ({type(exc).__name__}: {exc}); "
                           "ops run while compiling may be counted")
    return span


def close_span(span: Span) -> dict[str, Any] | None:
    """What compiled since :func:`open_span` (a dict with :func:`empty`'s keys), or None when nothing
    did. Never raises: a failure is in the dict's ``"errors"``."""
    facts: dict[str, Any] | None
    try:
        facts = _facts(span)
    except Exception as exc:
        facts = {**empty(), "errors": [f"reading what compiled failed ({type(exc).__name__}: {exc})"]}
    finally:
        for close in span.closers:
            try:
                close()
            except Exception as exc:
                span.errors.append(f"unwatching torch.compile's compiles failed ({type(exc).__name__}: {exc})")
    if span.errors:
        facts = facts if facts is not None else empty()
        facts["errors"] = [*span.errors, *facts["errors"]]
    return facts


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Counts since ``before`` (a count that went down was reset meanwhile: all of it is new)."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0)
        d = v if d < 0 else d
        if d:
            out[k] = d
    return out


def _new_records(newest: Any) -> tuple[list[Any], bool]:
    """dynamo's compile records since ``newest`` (forward compiles only), and whether that is all of them."""
    got = tp.dynamo_compile_records()
    if not got:
        return [], True
    records, kept = got
    at = next((i for i in range(len(records) - 1, -1, -1) if records[i] is newest), None) if newest is not None else None
    if at is not None:
        new, complete = records[at + 1:], True
    else:  # the start's newest fell out of dynamo's window: some were dropped if the window is full
        new, complete = records, newest is None and len(records) < kept
    new = [r for r in new if getattr(r, "is_forward", True) is not False and not getattr(r, "is_runtime", False)]
    return new, complete


def _base(name: str) -> tuple[str, int | None]:
    """The user's function a (resume) frame belongs to, and the line it resumes at (None: not a resume)."""
    m = _RESUME.match(name)
    if m is None:
        return name, None
    line = int(m.group("line"))
    while m is not None:  # a resume of a resume: torch_dynamo_resume_in_torch_dynamo_resume_in_f_at_3_at_9
        name = m.group("function")
        m = _RESUME.match(name)
    return name, line


def _site(file: Any, line: Any, function: str) -> dict[str, Any] | None:
    return {"file": str(file), "line": int(line) if line is not None else None, "function": function} if file else None


def _first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _facts(span: Span) -> dict[str, Any] | None:
    after = tp.dynamo_counters()
    if after is None:  # torch._dynamo was never imported: nothing compiled
        return None
    before = span.counters or {}
    frames = _diff(after.get("frames", {}), before.get("frames", {}))
    stats = _diff(after.get("stats", {}), before.get("stats", {}))
    breaks = _diff(after.get("graph_break", {}), before.get("graph_break", {}))
    records, complete = _new_records(span.newest)
    if not (frames or stats.get("unique_graphs") or breaks or records):
        return None
    facts = empty()
    facts.update(graphs=int(stats.get("unique_graphs", 0)),
                 frames={"total": int(frames.get("total", 0)), "ok": int(frames.get("ok", 0))},
                 graph_break_count=int(sum(breaks.values())), complete=complete)

    functions: dict[tuple[Any, ...], dict[str, Any]] = {}
    sites: dict[tuple[str, Any], dict[str, Any] | None] = {}  # (function, file) -> its site
    for r in records:
        name, resumed_at = _base(str(getattr(r, "co_name", None) or "?"))
        file = getattr(r, "co_filename", None)
        if resumed_at is None:
            sites.setdefault((name, file), _site(file, getattr(r, "co_firstlineno", None), name))
    for r in records:
        name, resumed_at = _base(str(getattr(r, "co_name", None) or "?"))
        file = getattr(r, "co_filename", None)
        site = sites.get((name, file)) or _site(file, resumed_at, name)
        ops = int(getattr(r, "graph_op_count", None) or 0)
        row = functions.setdefault((name, file), {"function": name, "site": site, "frames": 0, "graphs": 0,
                                                  "graph_ops": 0})
        row["frames"] += 1
        row["graphs"] += ops > 0
        row["graph_ops"] += ops
        if getattr(r, "recompile_reason", None) or int(getattr(r, "cache_size", None) or 0) > 0:
            facts["recompiles"].append({"function": name, "site": site,
                                        "reason": str(getattr(r, "recompile_reason", None) or "")})
        if getattr(r, "fail_type", None):
            facts["failures"].append({"function": name, "site": site, "error": str(r.fail_type),
                                      "reason": _first_line(getattr(r, "fail_reason", None))})
    facts["functions"] = [row for row in functions.values() if row["graphs"] or row["frames"]]
    facts["recompile_count"] = len(facts["recompiles"])
    facts["graph_breaks"] = _breaks(breaks, records)
    return facts


def _breaks(breaks: dict[str, int], records: list[Any]) -> list[dict[str, Any]]:
    """One row per graph break reason and place: the frame whose compile it restarted, and the line
    dynamo resumed at (its next resume frame of that function, when it compiled in the span)."""
    rows = []
    for reason, count in breaks.items():
        places = []
        for i, r in enumerate(records):
            if reason not in (getattr(r, "restart_reasons", None) or ()):
                continue
            code_name, file = str(getattr(r, "co_name", None) or "?"), getattr(r, "co_filename", None)
            name, _ = _base(code_name)
            line = None
            for later in records[i + 1:]:  # the frame dynamo resumed the function in, after the break
                m = _RESUME.match(str(getattr(later, "co_name", None) or ""))
                if m is not None and m.group("function") == code_name and getattr(later, "co_filename", None) == file:
                    line = int(m.group("line"))
                    break
            # no resume frame compiled in the span: the function's own line
            places.append(_site(file, line if line is not None else getattr(r, "co_firstlineno", None), name))
        places = places or [None]
        share = [count // len(places) + (i < count % len(places)) for i in range(len(places))]
        for site, n in zip(places, share):
            if n:
                rows.append({"reason": reason, "summary": _break_summary(reason), "count": n,
                             "function": site["function"] if site else None, "site": site})
    return rows


def _break_summary(reason: str) -> str:
    """A graph break reason in one line: its first line, with dynamo's explanation when it has one."""
    lines = [ln.strip() for ln in str(reason).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    why = next((ln.removeprefix("Explanation:").strip() for ln in lines[1:] if ln.startswith("Explanation:")), "")
    return f"{head}: {why}" if why and why != head else head


# -- merging (processes, notebook cells) --------------------------------------------------------
def merge(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The facts of two spans together (a new dict; None and None is None)."""
    if a is None or b is None:
        return {**empty(), **(a or b)} if (a or b) is not None else None
    out = empty()
    out["graphs"] = a.get("graphs", 0) + b.get("graphs", 0)
    out["frames"] = {k: a.get("frames", {}).get(k, 0) + b.get("frames", {}).get(k, 0) for k in ("total", "ok")}
    for k in ("graph_break_count", "recompile_count"):
        out[k] = a.get(k, 0) + b.get(k, 0)
    for k in ("graph_breaks", "recompiles", "failures", "errors"):
        out[k] = [*a.get(k, []), *b.get(k, [])]
    functions: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in [*a.get("functions", []), *b.get("functions", [])]:
        site = row.get("site") or {}
        key = (row.get("function"), site.get("file"), site.get("line"))
        if key in functions:
            for k in ("frames", "graphs", "graph_ops"):
                functions[key][k] = functions[key].get(k, 0) + row.get(k, 0)
        else:
            functions[key] = dict(row)
    out["functions"] = list(functions.values())
    out["complete"] = bool(a.get("complete", True) and b.get("complete", True))
    return out


# -- wording ----------------------------------------------------------------------------------
def _where(site: dict[str, Any] | None) -> str:
    from ..core.callsite import site_text

    return site_text(site, short=True) if site and site.get("line") is not None else str((site or {}).get("file") or "?")


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def summary_line(facts: dict[str, Any] | None, width: int | None = None) -> str | None:
    """``"compiled: 1 graph (update, fg.py:4), 0 graph breaks; ops inside compiled code are not counted
    per op"``; None when nothing compiled. ``width``: as many function names as fit in that many
    columns (at least one; the note then goes to :func:`report_lines`' next line if need be)."""
    got = _head(facts, width)
    return None if got is None else got[0] if got[1] else f"{got[0]}; {_note(facts)}"


def _note(facts: dict[str, Any] | None) -> str:
    return str((facts or {}).get("note") or NOT_COUNTED)


def _head(facts: dict[str, Any] | None, width: int | None) -> tuple[str, bool] | None:
    """The first line, and whether the note is in it."""
    if not facts:
        return None
    if facts.get("errors") and not (facts.get("graphs") or facts.get("functions") or facts.get("frames", {}).get("total")):
        return f"compiled: not known, the program was not affected: {facts['errors'][0]}", True
    functions = facts.get("functions", [])
    graphs = _n(int(facts.get("graphs", 0)), "graph")
    if len(functions) > 1:
        graphs += f" in {len(functions)} functions"
    rest = [_n(int(facts.get("graph_break_count", 0)), "graph break")]
    if facts.get("recompile_count"):
        rest.append(_n(int(facts["recompile_count"]), "recompile"))
    if facts.get("failures"):
        rest.append(f"{len(facts['failures'])} failed")
    frames = facts.get("frames", {})
    if frames.get("total", 0) != frames.get("ok", 0):
        rest.append(f"{frames.get('ok', 0)} of {frames.get('total', 0)} frames compiled")

    def line(shown: int, note: bool) -> str:
        names = "; ".join(f"{f['function']}, {_where(f.get('site'))}" for f in functions[:shown])
        if len(functions) > shown:
            names += f"; … {len(functions) - shown} more"
        return f"compiled: {graphs} ({names}), {', '.join(rest)}" + (f"; {_note(facts)}" if note else "")

    most = min(len(functions), 3)
    if not most:
        return f"compiled: {graphs}, {', '.join(rest)}; {_note(facts)}", True
    for note in (True, False):  # the most names that fit, with the note if it fits too
        for shown in range(most, 0, -1):
            text = line(shown, note)
            if width is None or len(text) <= width:
                return text, note
    return line(1, False), False


def report_lines(facts: dict[str, Any] | None, width: int | None = None) -> list[str]:
    """The terminal report's lines: :func:`summary_line` (the note on a line of its own when the
    line has no room for it) and :func:`detail_lines`; none when nothing compiled."""
    got = _head(facts, width)
    if got is None:
        return []
    head, noted = got
    return [head, *([] if noted else [f"  ({_note(facts)})"]), *detail_lines(facts)]


def detail_lines(facts: dict[str, Any] | None, *, breaks: int = 3, recompiles: int = 2) -> list[str]:
    """The lines under :func:`summary_line`: graph breaks (site, reason), recompiles, failures, gaps."""
    if not facts:
        return []
    out = []
    rows = facts.get("graph_breaks", [])
    for b in rows[:breaks]:
        at = f"at {_where(b['site'])}" if b.get("site") else "(no line from dynamo)"
        fn = f" in {b['function']}" if b.get("function") else ""
        times = f" ×{b['count']}" if b.get("count", 1) != 1 else ""
        out.append(f"  graph break {at}{fn}{times}: {b.get('summary') or _first_line(b.get('reason'))}")
    if len(rows) > breaks:
        out.append(f"  … {len(rows) - breaks} more graph breaks")
    rows = facts.get("recompiles", [])
    for r in rows[:recompiles]:
        why = re.sub(r"^\d+/\d+: ", "", _first_line(r.get("reason")))  # less dynamo's compile id ("6/0: ")
        out.append(f"  recompiled {r['function']} ({_where(r.get('site'))}): {why or 'its guards failed'}")
    if len(rows) > recompiles:
        out.append(f"  … {len(rows) - recompiles} more recompiles")
    for f in facts.get("failures", [])[:2]:
        out.append(f"  compile failed: {f['function']} ({_where(f.get('site'))}): {f['error']}: {f.get('reason', '')}")
    if not facts.get("complete", True):
        out.append("  (dynamo keeps its last compile records only: some compiled functions are not listed)")
    if facts.get("errors") and (facts.get("graphs") or facts.get("functions")):
        out.append(f"  (not all is known: {facts['errors'][0]})")
    return out


# -- compiles out of the op observers' sight ------------------------------------------------------
_LOCK = threading.RLock()
_SPANS = [0]  # spans open now
_HIDDEN: dict[int, contextlib.ExitStack] = {}  # thread -> its compile's ops hidden from the observers
_HOOKED: list[Any] = []  # the callback handler our callbacks are registered in, if any


def _on_compile_start(args: Any = None) -> None:
    try:
        ident = threading.get_ident()
        with _LOCK:
            if not _SPANS[0] or ident in _HIDDEN:
                return
            from .internal import MARKER, _unobserved  # the op observers' own off switch (routing/internal.py)

            stack = contextlib.ExitStack()
            stack.enter_context(_unobserved(MARKER, "enter_internal", "exit_internal"))
            _HIDDEN[ident] = stack
    except Exception:  # never the compile's failure: its ops are then counted
        pass


def _on_compile_end(args: Any = None) -> None:
    try:
        with _LOCK:
            stack = _HIDDEN.pop(threading.get_ident(), None)
        if stack is not None:
            stack.close()
    except Exception:
        pass


def _hook() -> None:
    """Our callbacks in dynamo's handler (again, after a ``torch._dynamo.reset()`` cleared them)."""
    handler = tp.dynamo_compile_callbacks()
    if handler is None:
        return
    with _LOCK:
        if _HOOKED and _HOOKED[0] is not handler:
            _HOOKED.clear()
        if _on_compile_start not in getattr(handler, "start_callbacks", ()):
            handler.register_start_callback(_on_compile_start)
        if _on_compile_end not in getattr(handler, "end_callbacks", ()):
            handler.register_end_callback(_on_compile_end)
        if not _HOOKED:
            _HOOKED.append(handler)


def _unhook() -> None:
    """Our callbacks out of dynamo's handler once no span is open and no compile is hidden."""
    with _LOCK:
        if _SPANS[0] or _HIDDEN or not _HOOKED:
            return
        handler = _HOOKED.pop()
        for callbacks, fn, remove in ((getattr(handler, "start_callbacks", []), _on_compile_start,
                                       handler.remove_start_callback),
                                      (getattr(handler, "end_callbacks", []), _on_compile_end,
                                       handler.remove_end_callback)):
            if fn in callbacks:
                remove(fn)


class _Closers:
    """What :func:`~torch_adapter.core.after_import.after_import` needs of a patcher: the finder's remover."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def after_restore(self, fn: Callable[[], None]) -> None:
        self.span.closers.insert(0, fn)


def _watch(span: Span) -> None:
    with _LOCK:
        _SPANS[0] += 1
    span.closers.append(_unwatch)
    from ..core.after_import import after_import

    # now if torch._dynamo is imported, else right after it is (a finder removed when the span closes)
    after_import(_Closers(span), "torch._dynamo", lambda _module: _hook())


def _unwatch() -> None:
    with _LOCK:
        _SPANS[0] = max(_SPANS[0] - 1, 0)
    _unhook()
