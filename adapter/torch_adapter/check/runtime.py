"""The runtime part of ``check``: run a command under the adapter, read its routing log,
and join op coverage into the static report.

``--run "python train.py --steps 1"`` becomes ``python -m torch_adapter run --target T
[--simulate] --report-json TMP -- train.py --steps 1``; TMP (a temporary directory,
removed afterwards) then holds a ``torch-adapter.routing-log`` JSON document (see
``docs/check.md``). The command runs in its own process group; past ``--run-timeout`` the
whole group is stopped and :class:`RunTimeout` carries whatever log it still wrote.
:func:`join_runtime` is pure: it takes such a document and a report and adds the runtime
section -- ops x route x user call sites, coverage shares, the top fallback ops with the
lines that caused them -- plus findings on the project's lines
(RT001: ops there fall back to the CPU; RT002: the command failed, at its last project
frame; RT003: a dtype the simulated target's real backend refuses, its own kind of finding) and, from the redirect log, what each statically found line became at run time.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

from ..errors import CheckError, format_error
from ..routing.wording import ROUTES as _ROUTES, WORST_FIRST
from .model import FallbackOp, Finding, Note, OpRow, Report, RuntimeSection, SiteRef

__all__ = ["parse_command", "run_traced", "RunTimeout", "load_routing_log", "validate_routing_log", "join_runtime",
           "LOG_SCHEMA", "LOG_VERSION", "ROUTES"]

LOG_SCHEMA = "torch-adapter.routing-log"
LOG_VERSION = 2
LOG_READS = (1, 2)  # version 1: three routes (no "yours", no "refused")
ROUTES = _ROUTES
TOP_FALLBACKS = 10
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?(\.exe)?$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def parse_command(command: str) -> list[str]:
    """``"python train.py --steps 1"`` -> the arguments for ``torch_adapter run`` after its options.

    Accepted: ``python SCRIPT [ARGS]``, ``python -m MODULE [ARGS]``, ``SCRIPT.py [ARGS]``.
    """
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        raise CheckError(format_error("torch-adapter check --run", 'a shell-like command, e.g. "python train.py"',
                                      repr(command), why=str(exc), fix="balance the quotes")) from None
    if tokens and _PYTHON.match(os.path.basename(tokens[0])):
        tokens = tokens[1:]
        if tokens[:1] == ["-m"] and len(tokens) >= 2:
            return ["-m", "--", *tokens[1:]]
        if tokens and not tokens[0].startswith("-"):
            return ["--", *tokens]
    elif tokens and tokens[0].endswith(".py"):
        return ["--", *tokens]
    raise CheckError(format_error(
        "torch-adapter check --run", '"python SCRIPT [ARGS]" or "python -m MODULE [ARGS]"', repr(command),
        why="the command is run as `torch-adapter run` so that its ops are traced",
        fix='e.g. --run "python train.py --steps 1"; for torchrun use '
            "`torchrun ... -m torch_adapter run --report-json PATH train.py` and check the log"))


class RunTimeout(CheckError):
    """The ``--run`` command outlived ``--run-timeout`` and was stopped (its whole process group).

    Raised rather than returned so that no caller mistakes a stopped run for a finished one;
    it carries what the run left: ``log`` (the routing log, when ``torch-adapter run`` wrote one
    on the interrupt, else None) and ``tail`` (the last lines of its stderr)."""

    def __init__(self, message: str, *, command: str, timeout: float, log: dict[str, Any] | None,
                 tail: list[str]) -> None:
        super().__init__(message)
        self.command, self.timeout, self.log, self.tail = command, timeout, log, tail


STOP_GRACE_S = 5.0  # between SIGINT (the run writes its routing log) and SIGKILL (for whatever is left)
_DRAIN_S = 2.0  # for the reader thread to pass on what the ended command wrote before it ended


def run_traced(command: str, *, target: str = "auto", simulate: bool = False, cwd: str | None = None,
               timeout: float | None = None) -> tuple[dict[str, Any] | None, int, list[str]]:
    """Run ``command`` under ``torch_adapter run``; return (routing log or None, exit code,
    the last lines of its stderr, which is also passed through to ours).

    The command gets its own session (process group), so that a timeout -- or our own
    interruption -- stops its children too, not only the interpreter we started. Its stderr
    is read by a thread while we wait: reading it to the end first would wait as long as any
    process holds the pipe, which made ``timeout`` meaningless. After ``timeout`` seconds the
    group gets SIGINT (``torch-adapter run`` then ends the script and still writes the routing
    log of what ran), SIGKILL :data:`STOP_GRACE_S` s later, and :class:`RunTimeout` is raised.
    """
    tail_args = parse_command(command)
    module = tail_args[0] == "-m"
    tmpdir = tempfile.mkdtemp(prefix="torch-adapter-check-")
    log_path = os.path.join(tmpdir, "routing.json")
    argv = [sys.executable, "-m", "torch_adapter", "run", "--target", "auto" if target == "any" else target]
    argv += ["--simulate", "--dtype-check", "record"] if simulate else []  # one run lists every refused dtype
    argv += ["--report-json", log_path] + (["-m"] if module else []) + tail_args[1 if module else 0:]
    tail: deque[str] = deque(maxlen=200)
    try:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stderr=subprocess.PIPE, text=True, errors="replace",
                                    start_new_session=hasattr(os, "killpg"))
        except OSError as exc:
            raise CheckError(format_error("torch-adapter check --run", "a command that can start", repr(command),
                                          why=exc.strerror or str(exc), fix="check the interpreter")) from None
        reader = threading.Thread(target=_pass_through, args=(proc.stderr, tail), daemon=True,
                                  name="torch-adapter-check-stderr")
        reader.start()
        timed_out = False
        restore = _end_on_term()
        try:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                code = _stop(proc)
        except BaseException:  # our own Ctrl-C/SIGTERM/SIGHUP (its own session no longer gets them) or an error
            _stop(proc)
            raise
        finally:
            restore()
        # a process the command left behind may hold the pipe open: the tail is not worth a hang
        reader.join(timeout=_DRAIN_S)
        if timed_out:
            assert timeout is not None
            try:  # (written atomically, so whole or absent; a stopped run's log is a bonus, never an error)
                log = load_routing_log(log_path) if os.path.exists(log_path) else None
            except CheckError:
                log = None
            raise RunTimeout(_timeout_message(command, timeout, log is not None, code),
                             command=command, timeout=timeout, log=log, tail=list(tail))
        log = load_routing_log(log_path) if os.path.exists(log_path) else None
        return log, code, list(tail)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _pass_through(stream: Any, tail: deque[str]) -> None:
    """Copy the child's stderr to ours line by line, keeping the last lines (the reader thread)."""
    try:
        for line in stream:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))
    except (OSError, ValueError):  # our stderr closed, or the pipe closed under us: the tail is best effort
        pass
    finally:
        stream.close()


def _end_on_term() -> Any:
    """While the command runs, SIGTERM and SIGHUP end us through SystemExit (128 + signal), so that
    run_traced still stops the command's group: in its own session it no longer gets the signal a
    CI job's timeout or a closed terminal sends to ours. Only signals left at their default are
    taken, only from the main thread; returns the function that puts them back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    taken = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            taken[sig] = signal.signal(sig, _exit_on_signal)

    def restore() -> None:
        for sig, old in taken.items():
            signal.signal(sig, old)
    return restore


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)  # the group is the child's pid (start_new_session)
        elif proc.poll() is None:
            proc.kill()
    except (ProcessLookupError, PermissionError):  # the whole group has already gone
        pass


def _stop(proc: subprocess.Popen) -> int:
    """Stop the command's process group: SIGINT, then SIGKILL after STOP_GRACE_S; its exit code."""
    _signal_group(proc, getattr(signal, "SIGINT", signal.SIGTERM))
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, getattr(signal, "SIGKILL", signal.SIGTERM))  # children that outlived the interpreter too
    return proc.wait()


def _timeout_message(command: str, timeout: float, logged: bool, code: int) -> str:
    ended = f"exit status {code}" if code >= 0 else f"ended by signal {-code}"
    covered = ("its routing log covers the ops it ran until then" if logged
               else "it wrote no routing log, so the report has no runtime section")
    return format_error(
        "torch-adapter check --run", f"a command that ends within --run-timeout {timeout:g} s",
        f"{command!r} (run as `torch-adapter run`), still running after {timeout:g} s",
        why=f"it was stopped with its child processes (SIGINT, then SIGKILL {STOP_GRACE_S:g} s later; "
            f"{ended}) so that check does not hang; {covered}",
        fix=f"raise the limit (e.g. --run-timeout {max(2 * timeout, 60):g}), leave --run-timeout out to wait "
            "for the end, or run fewer steps (e.g. --run \"python train.py --steps 1\")")


def load_routing_log(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a routing log JSON file (CheckError says what is wrong)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckError(format_error("torch-adapter check (routing log)", "a readable JSON file", str(path),
                                      why=exc.strerror or str(exc), fix="check the path")) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckError(format_error("torch-adapter check (routing log)", "valid JSON", str(path),
                                      why=str(exc), fix="pass the file written by `torch-adapter run --report-json`")) from None
    return validate_routing_log(data, str(path))


def _bad(where: str, expected: str, got: Any) -> CheckError:
    return CheckError(format_error(f"torch-adapter check (routing log {where})", expected,
                                   f"{got!r} ({type(got).__name__})",
                                   why=f"the runtime join reads schema {LOG_SCHEMA!r} version {LOG_VERSION}",
                                   fix="pass the file written by `torch-adapter run --report-json PATH`"))


def validate_routing_log(data: Any, where: str = "<data>") -> dict[str, Any]:
    """``data`` if it is a routing log of the supported schema, else CheckError."""
    if not isinstance(data, dict) or data.get("schema") != LOG_SCHEMA or data.get("version") not in LOG_READS:
        got = {k: data.get(k) for k in ("schema", "version")} if isinstance(data, dict) else data
        raise _bad(where, f'{{"schema": "{LOG_SCHEMA}", "version": {LOG_VERSION}, ...}}', got)
    ops = data.get("ops")
    if not isinstance(ops, list):
        raise _bad(where, '"ops": a list', ops)
    for i, row in enumerate(ops):
        if not isinstance(row, dict) or not isinstance(row.get("op"), str) or row.get("route") not in ROUTES:
            raise _bad(f"{where}, ops[{i}]", f'{{"op": str, "route": one of {ROUTES}, ...}}', row)
        if not isinstance(row.get("calls", 0), int) or not isinstance(row.get("self_time_ms", 0.0), (int, float)):
            raise _bad(f"{where}, ops[{i}]", '"calls": int and "self_time_ms": number', row)
        site = row.get("site")
        if site is not None and not (isinstance(site, dict) and isinstance(site.get("file"), str)
                                     and isinstance(site.get("line"), int)):
            raise _bad(f"{where}, ops[{i}].site", '{"file": str, "line": int, "function": str} or null', site)
    return data


class _Sites:
    """Turns a log's file paths into report paths and reads excerpts (cached)."""

    def __init__(self, root: Path, cwd: Path) -> None:
        self.root = root if root.is_dir() else root.parent
        self.cwd = cwd
        self._lines: dict[str, list[str] | None] = {}

    def ref(self, file: str, line: int, function: str = "", cell: int | None = None) -> SiteRef:
        if cell is not None:  # a notebook cell: named by its execution count, never its temp file
            return SiteRef(f"cell [{cell}]", line, function, in_project=False)
        p = Path(file)
        p = p if p.is_absolute() else self.cwd / p
        try:
            rel = p.resolve().relative_to(self.root.resolve()).as_posix()
        except (ValueError, OSError):
            return SiteRef(file, line, function, in_project=False)
        return SiteRef(rel, line, function, in_project=True, excerpt=self.line(rel, line))

    def line(self, rel: str, line: int) -> str | None:
        if rel not in self._lines:
            try:
                self._lines[rel] = (self.root / rel).read_text(encoding="utf-8", errors="replace").split("\n")
            except OSError:
                self._lines[rel] = None
        lines = self._lines[rel]
        return lines[line - 1].strip() if lines and 0 < line <= len(lines) else None


def join_runtime(report: Report, log: dict[str, Any], *, command: list[str] | None = None,
                 exit_code: int | None = 0, stderr_tail: list[str] | None = None,
                 cwd: str | os.PathLike[str] | None = None) -> Report:
    """Add ``log`` (a validated routing log) to ``report``: the runtime section, RT001/RT002
    findings on project lines, and run-time notes on static findings. Returns ``report``."""
    from .engine import target_facts
    from .rules import RUNTIME_RULES

    log = validate_routing_log(log)
    sites = _Sites(Path(report.root), Path(cwd) if cwd else Path.cwd())
    target = str(log.get("target") or report.target)
    facts = target_facts(target if report.target == "any" else report.target)
    rows = [OpRow(op=r["op"], route=r["route"], calls=int(r.get("calls", 0)),
                  self_time_ms=float(r.get("self_time_ms", 0.0)), bytes_copied=int(r.get("bytes_copied", 0)),
                  reason=str(r.get("reason") or ""), via=r.get("via"), parent=r.get("parent"),
                  site=sites.ref(r["site"]["file"], r["site"]["line"], r["site"].get("function", ""),
                                 r["site"].get("cell"))
                  if r.get("site") else None)
             for r in log["ops"]]
    rows.sort(key=lambda r: (WORST_FIRST[r.route], -r.calls, r.op))
    section = RuntimeSection(
        command=list(command or []), target=target, simulated=bool(log.get("simulated", False)),
        exit_code=exit_code,
        ops_by_route={route: len({r.op for r in rows if r.route == route}) for route in ROUTES},
        calls_by_route={route: sum(r.calls for r in rows if r.route == route) for route in ROUTES},
        ops=rows)
    grouped: dict[str, FallbackOp] = {}
    for r in rows:
        if r.route != "fallback":
            continue
        g = grouped.setdefault(r.op, FallbackOp(r.op, 0, 0.0, 0, r.reason))
        g.calls += r.calls
        g.self_time_ms += r.self_time_ms
        g.bytes_copied += r.bytes_copied
        if r.site is not None and all((s.file, s.line) != (r.site.file, r.site.line) for s in g.sites):
            g.sites.append(r.site)
    section.top_fallbacks = sorted(grouped.values(), key=lambda g: (-g.calls, -g.self_time_ms, g.op))[:TOP_FALLBACKS]
    report.runtime = section
    meta = {r["id"]: r for r in RUNTIME_RULES}
    _fallback_findings(report, rows, meta["RT001"], facts)
    _dtype_findings(report, log.get("dtypes") or {}, sites, meta["RT003"], facts, target)
    if exit_code not in (0, None):
        _failure_finding(report, stderr_tail or [], sites, meta["RT002"], facts, exit_code)
    _redirect_notes(report, log.get("redirects") or [], sites)
    report.findings.sort(key=lambda f: (f.file, f.start_line, f.col, f.rule_id))
    return report


def _fallback_findings(report: Report, rows: list[OpRow], rule: dict[str, Any], facts: dict[str, str]) -> None:
    by_line: dict[tuple[str, int], list[OpRow]] = {}
    for r in rows:
        if r.route == "fallback" and r.site is not None and r.site.in_project:
            by_line.setdefault((r.site.file, r.site.line), []).append(r)
    for (file, line), ops in sorted(by_line.items()):
        detail = "; ".join(f"{o.op} ({o.calls} calls, {o.self_time_ms:.2f} ms, {o.bytes_copied} bytes copied"
                           f"{', ' + o.reason if o.reason else ''})" for o in ops)
        _add(report, rule, facts, file, line, ops[0].site.excerpt if ops[0].site else None, f" Ops: {detail}.")


def _dtype_findings(report: Report, dtypes: dict[str, Any], sites: "_Sites", rule: dict[str, Any],
                    facts: dict[str, str], target: str) -> None:
    """RT003 on each project line a refused dtype came from; a note when the profile cannot judge dtypes."""
    if dtypes and not dtypes.get("judged", True):
        report.notes.append(Note("", "dtypes-not-judged", f"dtypes not judged on {target}: {dtypes.get('note', '')}"))
    by_line: dict[tuple[str, int], tuple[Any, list[dict[str, Any]]]] = {}
    for f in dtypes.get("findings") or ():
        site = f.get("site") or {}
        if not isinstance(site.get("file"), str) or not isinstance(site.get("line"), int):
            continue
        ref = sites.ref(site["file"], site["line"], site.get("function", ""), site.get("cell"))
        if ref.in_project:
            by_line.setdefault((ref.file, ref.line), (ref, []))[1].append(f)
    for (file, line), (ref, found) in sorted(by_line.items(), key=lambda kv: kv[0]):
        detail = "; ".join(f"dtype {f.get('dtype')} not on {target}: {f.get('op')} ({f.get('calls', 1)} calls)"
                           for f in found)
        _add(report, rule, facts, file, line, ref.excerpt, f" {detail}. {found[0].get('message', '')}")


def _failure_finding(report: Report, tail: list[str], sites: _Sites, rule: dict[str, Any],
                     facts: dict[str, str], code: int) -> None:
    last, last_frame = None, -1
    for i, line in enumerate(tail):
        m = _FRAME.match(line)
        if m:
            last_frame = i
            ref = sites.ref(m.group("file"), int(m.group("line")))
            if ref.in_project:
                last = ref
    # the exception line: the first unindented line after the last frame (else the last line)
    after = [ln.strip() for ln in tail[last_frame + 1:] if ln.strip() and not ln.startswith((" ", "\t"))]
    error = after[0] if after else next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
    if last is None:
        report.notes.append(Note("", "run-failed", f"the command exited with status {code}: {error}"))
        return
    _add(report, rule, facts, last.file, last.line, last.excerpt, f" Exit status {code}: {error}")


def _add(report: Report, rule: dict[str, Any], facts: dict[str, str], file: str, line: int,
         excerpt: str | None, extra: str) -> None:
    report.findings.append(Finding(
        rule_id=rule["id"], severity=rule["severity"], title=rule["title"], file=file, start_line=line,
        end_line=line, col=1, excerpt=excerpt or "", message=rule["message"].format_map(facts) + extra,
        alternative=rule["alternative"].format_map(facts), docs="", language="python"))
    report.rules.setdefault(rule["id"], {"id": rule["id"], "title": rule["title"], "severity": rule["severity"],
                                         "docs": "", "source": "runtime"})


def _redirect_notes(report: Report, redirects: list[Any], sites: _Sites) -> None:
    seen: dict[tuple[str, int], list[str]] = {}
    for e in redirects:
        if not isinstance(e, dict) or not isinstance(e.get("file"), str) or not isinstance(e.get("line"), int):
            continue
        ref = sites.ref(e["file"], e["line"])
        if ref.in_project:
            seen.setdefault((ref.file, ref.line), []).append(
                f"{e.get('asked', '?')} -> {e.get('became', '?')} ({e.get('count', 1)}x)")
    for f in report.findings:
        notes = seen.get((f.file, f.start_line))
        if notes and f.cell is None:
            f.runtime = "ran: " + "; ".join(notes)
