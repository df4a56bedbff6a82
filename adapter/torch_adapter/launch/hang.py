"""Hang help: when a collective times out, what every rank of the job was doing.

A job that hangs shows, on the rank that gave up, torch's error alone (gloo: ``Timed out waiting
3000ms for recv operation to complete``; the others: ``Connection closed by peer``, or nothing: the
launcher kills them). Which rank did not come, and where it was, is what the user needs. In a
reporting rank (``run --report``/``--report-json``, and every child a reporting run adapts) this
module gathers, per rank, into its record and so into the job report (launch/job.py):

- **the last collectives it entered**, from **PyTorch's flight recorder** — the ring buffer torch
  keeps per process of the collectives each process group ran (``TORCH_FR_BUFFER_SIZE``; for nccl
  and, since torch 2.7, gloo: the backends the adapter's groups use), read with
  ``torch._C._distributed_c10d._dump_fr_trace_json()`` (a few ms; the pickled dump with stack traces
  takes 1.6 s here, so the user's line comes from Python instead). The adapter turns the recorder on
  (``TORCH_FR_BUFFER_SIZE=64`` when the user has not set it) before the first group is made, and
  turns it off again at ``uninstall()``. Its cost per collective is within the run-to-run noise of a
  gloo ``all_reduce`` (about 1 ms on 2 loaded cores, with and without);
- **the error and the user's line** when a collective raised (a timeout, a peer that closed): the
  innermost frame of the program's own code in the traceback;
- **the Python stack at the user's line when the rank was killed**: a launcher ends the other ranks
  with SIGTERM once one has failed (torchrun, ``mp.spawn``, ``srun``, ``mpiexec``). When the program
  has no SIGTERM handler of its own, the adapter's reads the interrupted frame, writes the rank's
  record with it, and ends the process by SIGTERM again, as the default would have (exit status
  -15, no ``finally`` run, no ``atexit``); ``faulthandler`` also writes every thread's stack to
  ``<folder>/<pid>.stack`` at the signal, for a rank stuck inside C (a blocked collective) whose
  Python handler cannot run before the launcher's SIGKILL.

:func:`job_findings` reads those facts across ranks: the ranks that never entered the collective
the others waited in (with where they were), the ranks that timed out waiting (with their line),
and a rank that entered the same collective much later than the first. Pure data: no torch import.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from typing import Any, Callable

__all__ = ["FR_ENV", "enable_flight_recorder", "last_collectives", "is_collective_failure", "facts",
           "watch_sigterm", "read_stack_file", "job_findings", "render_lines"]

FR_ENV, FR_ENTRIES = "TORCH_FR_BUFFER_SIZE", "64"
_KEEP = 3  # collectives kept per group in a rank's record
_LATE_S = 1.0  # a rank that entered the same collective this much after the first is named as late
_FAILURE_WORDS = ("timed out", "timeout", "connection closed by peer", "connection reset by peer",
                  "broken pipe", "watchdog", "socket")


def enable_flight_recorder() -> Callable[[], None]:
    """Turn torch's flight recorder on for the groups made from now on (when the user has not
    chosen its size); returns the undo."""
    if os.environ.get(FR_ENV, "").strip():
        return lambda: None
    os.environ[FR_ENV] = FR_ENTRIES

    def undo() -> None:
        if os.environ.get(FR_ENV) == FR_ENTRIES:
            del os.environ[FR_ENV]

    return undo


def last_collectives(keep: int = _KEEP) -> list[dict[str, Any]]:
    """The last ``keep`` collectives of each process group this process ran, from the flight
    recorder (oldest first), or ``[]`` when it is off or holds nothing."""
    try:
        from torch._C import _distributed_c10d as c10d

        dump = json.loads(c10d._dump_fr_trace_json())
    except Exception:  # noqa: BLE001 - no recorder in this torch, or no group yet: nothing to say
        return []
    by_group: dict[Any, list[dict[str, Any]]] = {}
    for e in dump.get("entries") or []:
        group = e.get("process_group") or [e.get("pg_id"), ""]
        p2p = bool(e.get("is_p2p"))
        by_group.setdefault(tuple(group), []).append({
            "group": str(group[1] or group[0]), "seq": int(e.get("p2p_seq_id" if p2p else "collective_seq_id") or 0),
            "p2p": p2p, "op": str(e.get("profiling_name", "?")).split(":", 1)[-1],
            "backend": str(e.get("profiling_name", "")).split(":", 1)[0] if ":" in str(e.get("profiling_name", "")) else "",
            "sizes": e.get("input_sizes"), "dtypes": e.get("input_dtypes"),
            "entered_ns": e.get("time_created_ns"), "timeout_ms": e.get("timeout_ms")})
    out: list[dict[str, Any]] = []
    for rows in by_group.values():
        out += sorted(rows, key=lambda r: (r["p2p"], r["seq"]))[-keep:]
    return out


def is_collective_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a collective that failed for want of a peer (a timeout, a closed peer)."""
    if exc is None or not isinstance(exc, Exception):
        return False
    try:
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistError", ())):
            return True
    except Exception:  # noqa: BLE001
        pass
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _FAILURE_WORDS)


def _user_stack(frames: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """The program's own frames (outermost first) of a stack given as (file, line, function)."""
    import linecache

    from ..core.callsite import _is_user

    out = []
    for file, line, function in frames:
        try:
            mine = _is_user(file)
        except Exception:  # noqa: BLE001 - torch half torn down at exit: keep the frame
            mine = True
        if mine:
            out.append({"file": file, "line": line, "function": function,
                        "code": _without_comment(linecache.getline(file, line).strip())})
    return out


def _without_comment(code: str) -> str:
    """A source line without its trailing ``# comment`` (read by Python's tokenizer: a ``#`` in a string
    stays); the line as it is when it does not tokenize alone (a bracket opened on an earlier line)."""
    if "#" not in code:
        return code
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return code[:tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return code


def _frames_of_traceback(tb: Any) -> list[tuple[str, int, str]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


def _frames_of_frame(frame: Any) -> list[tuple[str, int, str]]:
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out[::-1]


def facts(*, exc: BaseException | None = None, frame: Any = None, why: str | None = None) -> dict[str, Any] | None:
    """This rank's hang facts: the collective failure ``exc`` (with its user stack), or the stack at
    ``frame`` (a signal), with the flight recorder's last collectives; None when there is nothing to
    tell (no failure, no signal)."""
    if exc is not None and not is_collective_failure(exc):
        return None
    if exc is None and frame is None:
        return None
    stack = _user_stack(_frames_of_traceback(exc.__traceback__) if exc is not None else _frames_of_frame(frame))
    out: dict[str, Any] = {"why": why or ("collective failed" if exc is not None else "signal"),
                           "at_ns": time.time_ns(), "stack": stack, "site": stack[-1] if stack else None,
                           "collectives": last_collectives()}
    if exc is not None:
        first = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", (str(exc).strip().splitlines() or [""])[0])
        out["error"] = f"{type(exc).__name__}: {first[:300]}"
        out["timeout"] = "timed out" in first.lower() or "timeout" in first.lower()
    return out


def watch_sigterm(on_signal: Callable[[dict[str, Any]], None], stack_file: str | None = None) -> Callable[[], None]:
    """Until the returned undo: at SIGTERM, hand this rank's :func:`facts` (the interrupted frame's
    stack) to ``on_signal``, then end by SIGTERM as the default would. Nothing when the program has
    a SIGTERM handler of its own, or off the main thread. ``stack_file``: ``faulthandler`` writes every
    thread's stack there at the signal too (a rank stuck in C, whose Python handler never runs)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return lambda: None
    except (ValueError, OSError):
        return lambda: None
    handled = [False]

    def handler(signum: int, frame: Any) -> None:
        if not handled[0]:
            handled[0] = True
            try:
                found = facts(frame=frame, why="killed by SIGTERM")
                if found is not None:
                    on_signal(found)
            except Exception as exc:  # noqa: BLE001 - a failing observer reports itself; the kill goes on
                print(f"torch_adapter: could not note where this rank was at SIGTERM ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
        _stop_faulthandler()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # dies as it would have without the adapter

    signal.signal(signal.SIGTERM, handler)
    stack_fh = _start_faulthandler(stack_file)

    def undo() -> None:
        if stack_fh is not None:
            _stop_faulthandler()
            stack_fh.close()
        try:
            if signal.getsignal(signal.SIGTERM) is handler:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    return undo


_FAULT: list[Any] = []


def _start_faulthandler(path: str | None) -> Any:
    if not path:
        return None
    import faulthandler

    try:
        fh = open(path, "w")  # noqa: SIM115 - kept open: the C handler writes to its descriptor
        faulthandler.register(signal.SIGTERM, file=fh, all_threads=True, chain=True)
    except (OSError, ValueError, RuntimeError):
        return None
    _FAULT.append(fh)
    return fh


def _stop_faulthandler() -> None:
    if _FAULT:
        import faulthandler

        try:
            faulthandler.unregister(signal.SIGTERM)
        except (ValueError, RuntimeError):
            pass
        _FAULT.clear()


def read_stack_file(path: str) -> dict[str, Any] | None:
    """The ``faulthandler`` dump of a rank killed at SIGTERM, as hang facts (the signalled thread's
    user frames), or None when the file is empty or missing."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    if not text.strip():
        return None
    threads: list[tuple[bool, list[tuple[str, int, str]]]] = []
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append((line.startswith("Current thread"), []))
            continue
        m = re.match(r'\s+File "(.*)", line (\d+) in (.*)$', line)
        if m and threads:
            threads[-1][1].append((m.group(1), int(m.group(2)), m.group(3)))
    if not threads:
        return None
    chosen = next((frames for current, frames in threads if current), threads[0][1])
    stack = _user_stack(chosen[::-1])  # faulthandler lists the innermost frame first
    return {"why": "killed by SIGTERM (inside C: faulthandler's stack)", "stack": stack,
            "site": stack[-1] if stack else None, "collectives": []}


# ---- the job's view (pure data) -------------------------------------------------------------------


def _where(site: dict[str, Any] | None) -> str:
    if not site:
        return "outside the program's own code"
    from ..core.callsite import site_text  # a file under the working directory relative to it

    code = f" `{site['code']}`" if site.get("code") else ""
    try:
        where = site_text(site) or "?"
    except Exception:  # noqa: BLE001 - a site from another version's report: its own words
        where = f"{site.get('file', '?')}:{site.get('line', '?')}"
    return f"{where}{code}"


def job_findings(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the ranks' hang facts say together, or None when no rank has any: per group, the last
    collective any rank entered; who never entered it (and where they were), who timed out in it,
    who came late."""
    with_facts = [r for r in ranks if r.get("hang")]
    if not with_facts:
        return None
    last: dict[str, dict[str, Any]] = {}  # group -> the furthest collective any rank entered
    entered: dict[tuple[Any, str], dict[str, Any]] = {}  # (rank, group) -> its furthest entry
    for r in with_facts:
        for c in r["hang"].get("collectives") or []:
            if c.get("p2p"):
                continue
            key = (r.get("rank"), c["group"])
            if key not in entered or c["seq"] > entered[key]["seq"]:
                entered[key] = c
            if c["group"] not in last or c["seq"] > last[c["group"]]["seq"]:
                last[c["group"]] = c
    findings: list[dict[str, Any]] = []
    for group, furthest in last.items():
        waiting = [r for r in with_facts if entered.get((r.get("rank"), group), {}).get("seq") == furthest["seq"]]
        behind = [r for r in ranks if r not in waiting]
        what = f"{furthest['op']} #{furthest['seq']}" + (f" (group {group})" if group != "default_pg" else "")
        for r in behind:
            mine = entered.get((r.get("rank"), group))
            hang = r.get("hang") or {}
            findings.append({
                "rank": r.get("rank"), "kind": "never entered", "collective": what, "group": group,
                "last_entered": f"{mine['op']} #{mine['seq']}" if mine else None, "site": hang.get("site"),
                "why": hang.get("why"),
                "text": (f"rank {r.get('rank')} never entered {what}, which rank(s) "
                         f"{', '.join(str(w.get('rank')) for w in waiting)} waited in"
                         + (f"; its last was {mine['op']} #{mine['seq']}" if mine else "")
                         + (f"; it was at {_where(hang.get('site'))} ({hang.get('why')})" if hang else
                            "; it left no facts (killed before it could write them, or not adapted)"))})
        shapes = {(e["op"], json.dumps(e.get("sizes"))) for w in waiting if (e := entered.get((w.get("rank"), group)))}
        if len(shapes) > 1:  # the same collective number, different collectives: the ranks' programs diverged
            calls = "; ".join(f"rank {w.get('rank')}: {e['op']} of {e.get('sizes')}" for w in waiting
                              if (e := entered.get((w.get("rank"), group))))
            findings.append({"rank": None, "kind": "mismatch", "collective": f"#{furthest['seq']}", "group": group,
                             "text": f"the ranks ran different collectives as #{furthest['seq']}"
                                     + (f" of group {group}" if group != "default_pg" else "")
                                     + f" ({calls}): their programs took different paths"})
        starts = [e for w in waiting if (e := entered.get((w.get("rank"), group))) and e.get("entered_ns")]
        first = min((e["entered_ns"] for e in starts), default=None)
        for w in waiting:
            hang, mine = w["hang"], entered[(w.get("rank"), group)]
            late = (mine.get("entered_ns") - first) / 1e9 if first and mine.get("entered_ns") else 0.0
            if hang.get("error"):
                findings.append({
                    "rank": w.get("rank"), "kind": "timed out" if hang.get("timeout") else "failed",
                    "collective": what, "group": group, "site": hang.get("site"), "error": hang.get("error"),
                    "text": (f"rank {w.get('rank')} {'timed out' if hang.get('timeout') else 'failed'} in {what} "
                             f"at {_where(hang.get('site'))}: {hang['error']}")})
            if late >= _LATE_S:
                findings.append({
                    "rank": w.get("rank"), "kind": "late", "collective": what, "group": group, "late_s": round(late, 3),
                    "site": hang.get("site"),
                    "text": f"rank {w.get('rank')} entered {what} {late:.1f} s after the first rank did"})
    for r in with_facts:  # a failure with no recorded collective (the recorder off, a failed rendezvous)
        hang = r["hang"]
        if hang.get("error") and not any(f["rank"] == r.get("rank") for f in findings):
            findings.append({"rank": r.get("rank"), "kind": "failed", "site": hang.get("site"),
                             "error": hang["error"],
                             "text": f"rank {r.get('rank')} failed at {_where(hang.get('site'))}: {hang['error']}"})
    order = {"mismatch": 0, "never entered": 1, "late": 2, "timed out": 3, "failed": 4}
    findings.sort(key=lambda f: (order.get(f["kind"], 9), f["rank"] if f["rank"] is not None else -1))
    return {"source": "torch flight recorder (TORCH_FR_BUFFER_SIZE) + the program's stack", "findings": findings,
            "last": {g: f"{c['op']} #{c['seq']}" for g, c in last.items()}}


def render_lines(hang: dict[str, Any] | None) -> list[str]:
    """The job report's "collective hang" lines."""
    if not hang or not hang.get("findings"):
        return []
    return ["collective hang (from torch's flight recorder and each rank's stack):",
            *(f"  {f['text']}" for f in hang["findings"])]
