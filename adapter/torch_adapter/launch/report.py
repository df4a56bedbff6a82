"""The one report writer of ``torch-adapter run --report / --report-json``: this process's own
redirects and routes (when it ran the script) merged with what its adapted child processes
reported, as JSON (the one safe writer) and on the terminal (stderr)."""

from __future__ import annotations

import json
import sys
from typing import Any

from . import child_report as _child_report

__all__ = ["write"]


def write(records: list[dict[str, Any]], to_terminal: bool | str, json_path: str | None, *,
          session: Any = None, log: Any = None, job: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
          seconds: float | None = None, hang: dict[str, Any] | None = None) -> None:
    """``records``: the children's reports; ``session``/``log``: this process's own, when it ran
    the script (``run SCRIPT``), None when it only launched others (``run torchrun ...``).
    ``to_terminal``: False, ``"summary"`` (True too: launch/summary.py, one screen) or ``"full"``
    (every table). ``job``/``node``: a launcher run's ranks on this node (launch/job.py) and the node
    itself; ``seconds``: how long this process's script ran (a rank's own report under a launcher);
    ``hang``: where this rank was when a collective hung (launch/hang.py)."""
    reported = _child_report.reported(records)
    if json_path:
        _write_json(records, reported, json_path, session, log, job=job, node=node, seconds=seconds, hang=hang)
    if to_terminal == "full":
        _render(records, reported, session, log)
    elif to_terminal:
        _render_summary(records, reported, session, log)
    if to_terminal and job is not None:
        _render_job(job, full=to_terminal == "full")


def _render_job(job: dict[str, Any], *, full: bool) -> None:
    """A launcher run's ranks: the table (``--report full``, or a rank that differs or did not run
    adapted), else nothing more than the lines above (each rank's counts)."""
    from rich.console import Console

    from .job import render

    if full or job["stragglers"] or job["unadapted"] or job.get("hang"):
        render(job, Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140),
               title="torch_adapter, this node's ranks")


def _render_summary(records: list[dict[str, Any]], reported: list[dict[str, Any]], session: Any, log: Any) -> None:
    from ..routing.log import RoutingLog, target_label
    from .summary import summary_lines

    if session is not None and (log is not None and (len(log) or log.compiled()) or not reported):
        t = session.target
        who = _child_report.this_process()
        lines = summary_lines(log, [e.as_dict() for e in session.redirect_log.entries()],
                              target=target_label(t.name, t.simulated, getattr(t, "emulated", False)))
        if who:
            lines[0] = lines[0].replace("torch_adapter on", f"torch_adapter, {who}, on", 1)
        print("\n".join(lines), file=sys.stderr)
        return
    if session is not None:
        print(f"torch_adapter: this process ran no ops itself; {len(reported)} adapted child process(es) did:",
              file=sys.stderr)
    from ..routing.log import counts_text

    total, redirects = RoutingLog(), []
    for r in reported:  # a line each, then the children together (--report full has each one's tables)
        log_r = RoutingLog.from_dict(r["routing"])
        print(f"torch_adapter, {_child_report.label(r)}: {counts_text(log_r.summary())} op calls", file=sys.stderr)
        total.merge(log_r)
        redirects += r.get("redirects", [])
    targets = sorted({str(r.get("target", "?")) for r in reported})
    lines = summary_lines(total, redirects, target=", ".join(targets) or "?")
    if len(reported) > 1:
        lines[0] = lines[0].replace("torch_adapter on", f"torch_adapter, all {len(reported)} processes together, on", 1)
    print("\n".join(lines), file=sys.stderr)


def _write_json(records: list[dict[str, Any]], reported: list[dict[str, Any]], json_path: str,
                session: Any, log: Any, *, job: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
                seconds: float | None = None, hang: dict[str, Any] | None = None) -> None:
    from ..core.callsite import relative_sites
    from ..core.safe_io import OutputError, write_text

    if session is None:
        payload = _child_report.merged_payload(records)
    else:
        payload = log.to_dict() if log is not None else {}
        payload["redirects"] = session.redirect_log.to_json()["entries"]
        if reported:
            payload = _child_report.merged_payload(records, payload)
        own = _own_rank(session, log, seconds, hang)
        if own is not None:
            payload["process"] = own
    if node is not None:
        payload["node"] = node
    if job is not None:
        payload["job"] = job
    try:
        write_text(json_path, json.dumps(relative_sites(payload), indent=1), call="torch-adapter run --report-json")
    except OutputError as exc:  # the path changed while the script ran: say so, keep its exit code
        print(exc, file=sys.stderr)


def _own_rank(session: Any, log: Any, seconds: float | None, hang: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """This process as one rank of a job (``torchrun … -m torch_adapter run``): the entry ``report
    merge`` reads (launch/job.py); None outside a launcher."""
    import os

    from ..core.launcher_env import ranks
    from .job import rank_entry

    where = ranks()
    if where["rank"] is None:
        return None
    record = {"rank": where["rank"], "world_size": where["world_size"], "pid": os.getpid(),
              "state": "killed (SIGTERM)" if hang and hang.get("why", "").startswith("killed") else "finished",
              "target": session.target.label, "seconds": None if seconds is None else round(seconds, 3),
              "launch": where, "routing": log.to_dict() if log is not None else {}, "hang": hang}
    return {**rank_entry(record), "label": _child_report.label(record)}


def _render(records: list[dict[str, Any]], reported: list[dict[str, Any]], session: Any, log: Any) -> None:
    from rich.console import Console

    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    if session is not None:
        parent_ran_ops = log is not None and len(log) > 0
        if not reported or parent_ran_ops or len(session.redirect_log):
            who = _child_report.this_process()
            console.print(session.redirect_log.render(
                f"torch_adapter{f', {who}' if who else ''}: redirected to {session.target.label}"))
        if log is not None and (parent_ran_ops or not reported):
            console.print(log)
        elif reported:
            console.print(f"torch_adapter: this process ran no ops itself; {len(reported)} adapted child "
                          f"process(es) did:")
        if log is not None:
            from .summary import _compiled_lines

            for line in _compiled_lines(log):  # what torch.compile compiled (routing/compiled.py)
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    _child_report.render(records, console)
