"""Chrome trace post-processing for :mod:`torch_adapter.profiler` — pure functions on the
JSON that ``torch.profiler`` exports (the Trace Event Format that Perfetto and
chrome://tracing read).

:func:`annotate` adds the adapter's picture to a trace:

- every dispatcher op event (``cat: "cpu_op"``, named ``aten::add.Tensor``) gets
  ``args.route``, ``args.reason`` and ``args.via`` from the routing decision;
- the copies of each CPU fallback become slices of their own on a track
  "torch_adapter: fallback copies" (``cat: "fallback_copy"``, ``args.direction``
  ``to_cpu``/``from_cpu``, ``args.bytes``). They are found as the copy ops
  (``aten::clone``, ``aten::to``, ``aten::_to_copy``, ``aten::copy_``) directly under a
  fallback op: those before the op's own work move inputs to the CPU, those after move
  results back. Bytes come from the recorded shapes and dtypes;
- each ``profiler.step()`` becomes a range (``cat: "step"``) on a track
  "torch_adapter: steps", whose args carry the step's op counts per route, fallback
  time and bytes copied;
- a top-level ``torch_adapter`` key holds the recording's metadata and per-step rows.

:func:`validate` lists what would stop a trace viewer from loading the file.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import Any, Callable, Iterable, Iterator

__all__ = ["STEP_PREFIX", "RECORD_PREFIX", "SCHEMA", "VERSION", "annotate", "validate", "nest", "name_cells"]

STEP_PREFIX = "torch_adapter.step::"
RECORD_PREFIX = "torch_adapter.record::"
SCHEMA = "torch-adapter.profile"
VERSION = 1
_OP = re.compile(r"^\w+::\w+(\.\w+)?$")
_COPY_OPS = {"aten::clone", "aten::to", "aten::_to_copy", "aten::copy_"}
_PHASES = set("BEXIiCbnesMPOtfNDRc()")  # the Trace Event Format's ph values
# The profiler's "Input type" strings (caffe2 TypeMeta names) -> bytes per element.
_ITEMSIZE = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::complex<c10::Half>": 4, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "unsigned short": 2, "unsigned int": 4, "unsigned long": 8,
}
_EPS = 0.002  # microseconds of rounding tolerated when deciding nesting


def _end(e: dict[str, Any]) -> float:
    return float(e["ts"]) + float(e.get("dur", 0))


def nest(events: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
    """``{id(event): its enclosing event or None}`` for complete (``ph: "X"``) events,
    nesting within each (pid, tid) track."""
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and "ts" in e:
            tracks.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    parent: dict[int, dict[str, Any] | None] = {}
    for track in tracks.values():
        track.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[dict[str, Any]] = []
        for e in track:
            while stack and float(e["ts"]) >= _end(stack[-1]) - _EPS:
                stack.pop()
            parent[id(e)] = stack[-1] if stack else None
            stack.append(e)
    return parent


def _tensor_bytes(args: dict[str, Any], index: int) -> int | None:
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or index >= min(len(dims), len(types)):
        return None
    size = _ITEMSIZE.get(types[index])
    if size is None or not isinstance(dims[index], list):
        return None
    return math.prod(int(d) for d in dims[index]) * size


def _tensor_inputs(args: dict[str, Any]) -> int:
    types, dims = args.get("Input type") or [], args.get("Input Dims") or []
    n = 0
    for i, t in enumerate(types):
        if t in _ITEMSIZE:
            n += 1
        elif t == "TensorList" and i < len(dims) and isinstance(dims[i], list):
            n += len(dims[i])
    return n


def _is_copy(name: str) -> bool:
    return name.partition(".")[0] in _COPY_OPS


def _copy_slices(op_events: list[dict[str, Any]], children: dict[int, list[dict[str, Any]]],
                 track_of: Callable[[dict[str, Any]], int]) -> list[dict[str, Any]]:
    out = []
    for ev in op_events:
        if ev["args"].get("route") != "fallback" or ev["args"].get("via") != "cpu":
            continue
        kids = children.get(id(ev), [])
        lead = 0  # inputs moved to the CPU: the clone/to calls before the op's own work
        while lead < len(kids) and _is_copy(kids[lead]["name"]) and not kids[lead]["name"].startswith("aten::copy_"):
            lead += 1
        tail = len(kids)  # results moved back (and written-back arguments): the copies after it
        while tail > lead and _is_copy(kids[tail - 1]["name"]):
            tail -= 1
        if lead == len(kids):  # no work of its own is visible: the first copies are the inputs'
            lead = tail = min(_tensor_inputs(ev["args"]), len(kids))
        total = 0
        copies = 0
        for i, kid in enumerate(kids):
            if lead <= i < tail:
                continue
            direction = "to_cpu" if i < lead else "from_cpu"
            nbytes = _tensor_bytes(kid.get("args", {}), 1 if kid["name"].startswith("aten::copy_") else 0)
            total += nbytes or 0
            copies += 1
            out.append({"ph": "X", "cat": "fallback_copy",
                        "name": f"fallback copy {'to' if direction == 'to_cpu' else 'from'} CPU: {ev['name']}",
                        "pid": ev["pid"], "tid": track_of(ev), "ts": kid["ts"], "dur": kid.get("dur", 0),
                        "args": {"op": ev["name"], "direction": direction, "bytes": nbytes, "copy_op": kid["name"]}})
        ev["args"]["fallback_copies"] = copies
        ev["args"]["bytes_copied"] = total
    return out


def _window(events: list[dict[str, Any]], starts: list[float], step: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events (sorted by start, ``starts`` their start times) that lie inside ``step``."""
    lo, hi = float(step["ts"]) - _EPS, _end(step) + _EPS
    for i in range(bisect.bisect_left(starts, lo), bisect.bisect_right(starts, hi)):
        e = events[i]
        if e.get("pid") == step.get("pid") and _end(e) <= hi:
            yield e


def _step_rows(steps: list[dict[str, Any]], op_events: list[dict[str, Any]], parent: dict[int, Any],
               copies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    outer = {id(e) for e in op_events if parent.get(id(e)) is None or not _OP.match(str(parent[id(e)].get("name")))}
    ops = sorted(op_events, key=lambda e: float(e["ts"]))
    op_starts = [float(e["ts"]) for e in ops]
    copies = sorted(copies, key=lambda e: float(e["ts"]))
    copy_starts = [float(e["ts"]) for e in copies]
    rows = []
    for s in steps:
        routes = {"native": 0, "composite": 0, "fallback": 0, "unknown": 0}
        route_us = dict.fromkeys(routes, 0.0)
        fallback_calls, fallback_us = 0, 0.0
        for e in _window(ops, op_starts, s):
            route = e["args"].get("route", "unknown")
            if id(e) in outer:
                routes[route] = routes.get(route, 0) + 1
                route_us[route] = route_us.get(route, 0.0) + float(e.get("dur", 0))
            if route == "fallback":
                fallback_calls += 1
                fallback_us += float(e.get("dur", 0))
        mine = list(_window(copies, copy_starts, s))
        rows.append({"name": s["args"]["step"], "index": s["args"]["index"], "ts": s["ts"],
                     "wall_ms": round(float(s.get("dur", 0)) / 1e3, 6), "ops": sum(routes.values()),
                     "calls": routes, "time_ms": {k: round(v / 1e3, 6) for k, v in route_us.items()},
                     "fallback_calls": fallback_calls, "fallback_ms": round(fallback_us / 1e3, 6),
                     "copies": len(mine), "bytes_copied": sum(c["args"]["bytes"] or 0 for c in mine),
                     "copy_ms": round(sum(float(c["dur"]) for c in mine) / 1e3, 6)})
        s["args"].update({k: rows[-1][k] for k in ("ops", "fallback_calls", "fallback_ms", "bytes_copied")})
        s["args"].update({f"{k}_calls": v for k, v in routes.items() if k != "unknown"})
    return rows


def annotate(trace: dict[str, Any], decide: Callable[[str], Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Add routes, fallback-copy slices, step ranges and metadata to ``trace`` (in place;
    returned). ``decide(op_name)`` returns a RouteDecision, or None for names it does not know."""
    events: list[dict[str, Any]] = trace.setdefault("traceEvents", [])
    decisions: dict[str, Any] = {}
    op_events = []
    for e in events:
        name = e.get("name")
        if e.get("ph") != "X" or e.get("cat") != "cpu_op" or not isinstance(name, str) or not _OP.match(name):
            continue
        if name not in decisions:
            decisions[name] = decide(name)
        d = decisions[name]
        args = e.setdefault("args", {})
        if d is None:
            args.update(route="unknown", reason="not an operator this torch's dispatcher knows", via=None)
        else:
            args.update(route=d.route.value, reason=d.reason, via=d.via)
        op_events.append(e)
    parent = nest(events)
    children: dict[int, list[dict[str, Any]]] = {}
    for e in op_events:
        p = parent.get(id(e))
        if p is not None:
            children.setdefault(id(p), []).append(e)

    next_tid = max([t for t in (e.get("tid") for e in events) if isinstance(t, int)] + [0]) + 1
    tracks: dict[tuple[Any, Any, str], int] = {}
    extra: list[dict[str, Any]] = []

    def track(kind: str, sort: int) -> Callable[[dict[str, Any]], int]:
        def of(ev: dict[str, Any]) -> int:
            nonlocal next_tid
            key = (ev.get("pid"), ev.get("tid"), kind)
            if key not in tracks:
                tracks[key] = tid = next_tid
                next_tid += 1
                label = f"torch_adapter: {kind} (thread {ev.get('tid')})"
                extra.append({"ph": "M", "name": "thread_name", "pid": ev.get("pid"), "tid": tid,
                              "args": {"name": label}})
                extra.append({"ph": "M", "name": "thread_sort_index", "pid": ev.get("pid"), "tid": tid,
                              "args": {"sort_index": sort + len(tracks)}})
            return tracks[key]
        return of

    steps_track = track("steps", -1000)
    ranges = []
    counts: dict[str, int] = {}
    for e in list(events):
        name = e.get("name")
        if e.get("ph") != "X" or not isinstance(name, str):
            continue
        if name.startswith(STEP_PREFIX):
            step_name, _, index = name[len(STEP_PREFIX):].rpartition("#")
            counts[step_name] = counts.get(step_name, 0) + 1
            number = int(index) if index.isdigit() else counts[step_name] - 1
            ranges.append({"ph": "X", "cat": "step", "name": step_name, "pid": e["pid"], "tid": steps_track(e),
                           "ts": e["ts"], "dur": e.get("dur", 0),
                           "args": {"step": step_name, "index": number}})
        elif name.startswith(RECORD_PREFIX):
            ranges.append({"ph": "X", "cat": "record", "name": name[len(RECORD_PREFIX):], "pid": e["pid"],
                           "tid": steps_track(e), "ts": e["ts"], "dur": e.get("dur", 0), "args": {"recording": True}})
    copies = _copy_slices(op_events, children, track("fallback copies", 1000))
    steps = [r for r in ranges if r["cat"] == "step"] or [r for r in ranges if r["cat"] == "record"]
    for r in steps:  # no step() marked: the whole recording is the one row
        r["args"].setdefault("step", r["name"])
        r["args"].setdefault("index", 0)
    rows = _step_rows(sorted(steps, key=lambda s: float(s["ts"])), op_events, parent, copies)
    events.extend(extra)
    events.extend(ranges)
    events.extend(copies)
    trace["torch_adapter"] = {"schema": SCHEMA, "version": VERSION, **meta, "steps": rows,
                              "ops_annotated": len(op_events), "fallback_copies": len(copies)}
    return trace


def validate(trace: Any) -> list[str]:
    """Problems that would stop Perfetto or chrome://tracing from loading ``trace`` (a dict
    in the JSON object format, or a bare event list); an empty list when it is valid."""
    import json

    problems: list[str] = []
    if isinstance(trace, dict):
        events = trace.get("traceEvents")
        if not isinstance(events, list):
            return ["the top-level object has no 'traceEvents' list"]
    elif isinstance(trace, list):
        events = trace
    else:
        return [f"a trace is a JSON object or array, not {type(trace).__name__}"]
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not strict JSON: {exc}")
    for i, e in enumerate(events):
        where = f"traceEvents[{i}] ({e.get('name')!r})" if isinstance(e, dict) else f"traceEvents[{i}]"
        if not isinstance(e, dict):
            problems.append(f"{where} is not an object")
            continue
        ph = e.get("ph")
        if ph not in _PHASES:
            problems.append(f"{where}: 'ph' is {ph!r}, not a Trace Event Format phase")
            continue
        if not isinstance(e.get("name", ""), str):
            problems.append(f"{where}: 'name' is not a string")
        for key in ("pid", "tid"):
            if key in e and not isinstance(e[key], (int, str)):
                problems.append(f"{where}: {key!r} is {e[key]!r}, not a number or string")
        if ph == "M":
            continue
        if not isinstance(e.get("ts"), (int, float)) or isinstance(e.get("ts"), bool):
            problems.append(f"{where}: 'ts' is missing or not a number")
        if ph == "X":
            for key in ("name", "pid", "tid"):
                if key not in e:
                    problems.append(f"{where}: a complete event without {key!r}")
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"{where}: 'dur' is {dur!r}, not a number >= 0")
    if not problems:
        problems.extend(_overlaps(events))
    return problems


def _overlaps(events: list[dict[str, Any]]) -> list[str]:
    """Complete events on one track must nest (Perfetto drops partially overlapping slices)."""
    out = []
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X":
            tracks.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for key, track in tracks.items():
        track.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[dict[str, Any]] = []
        for e in track:
            while stack and float(e["ts"]) >= _end(stack[-1]) - _EPS:
                stack.pop()
            if stack and _end(e) > _end(stack[-1]) + _EPS:
                out.append(f"track {key}: {e['name']!r} at {e['ts']} overlaps {stack[-1]['name']!r} "
                           f"without nesting in it")
                if len(out) >= 10:
                    return out
            stack.append(e)
    return out


_FRAME_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.*)$")


def name_cells(trace: dict[str, Any], cell_of: Callable[[str], int | None]) -> dict[str, Any]:
    """Name notebook cells by execution count, never by the kernel's temp file (in place;
    returned): Python-stack events ``FILE(LINE): func`` of a cell become ``cell [N], line
    LINE: func``, and each routing-log site of a cell gets ``"text": "cell [N], line L"``.
    ``cell_of(filename)`` answers the cell's execution count or None."""
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "python_function" and isinstance(e.get("name"), str):
            m = _FRAME_NAME.match(e["name"])
            n = cell_of(m["file"]) if m else None
            if n is not None:
                e["name"] = f"cell [{n}], line {m['line']}: {m['func']}"
    routing = (trace.get("torch_adapter") or {}).get("routing") or {}
    for row in routing.get("ops", []):
        site = row.get("site")
        if isinstance(site, dict):
            n = site.get("cell", cell_of(str(site.get("file"))))
            if n is not None:
                site["cell"] = n
                site["text"] = f"cell [{n}], line {site.get('line')}"
    return trace
