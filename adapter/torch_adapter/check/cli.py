"""``torch-adapter check``: the command line of the compatibility report.

``register(subparsers)`` adds the ``check`` sub-command to ``torch-adapter``;
``python -m torch_adapter.check`` runs it on its own (:func:`main`). Exit codes:

* 0 -- no finding at or above ``--fail-on`` (default ``error``: ❌ will not run);
* 1 -- findings at or above ``--fail-on`` (``warn``: ⚠️ needs review or worse);
* 2 -- usage or I/O errors (bad path or option -- a symlink loop is named as one --,
  unreadable rule file, report not writable, ``--run`` produced no routing log);
* 124 -- the ``--run`` command outlived ``--run-timeout`` and was stopped with its child
  processes (as coreutils ``timeout`` exits 124); the report is still written, with the
  runtime part of what ran until then.

Only ``--output`` is written, through the one safe writer (``_safe_io``: validated before
the scan, a fresh temporary file in the same folder, renamed; devices, FIFOs, folders and
symbolic links are refused; the folder must exist). ``check`` never imports or runs the
scanned project (``--run`` runs the command given, in a child process).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import CheckError, format_error

__all__ = ["register", "run", "main", "build_parser", "write_atomic", "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_ERROR",
           "EXIT_TIMEOUT"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
EXIT_TIMEOUT = 124  # --run outlived --run-timeout (coreutils `timeout` exits 124 too)
_EPILOG = ("exit codes: 0 clean, 1 findings at or above --fail-on, 2 usage or I/O errors, "
           "124 the --run command outlived --run-timeout and was stopped")
_FAIL_RANK = {"warn": 1, "error": 2, "never": 99}
_FORMATS = {".html": "html", ".htm": "html", ".json": "json"}
_HELP = "report what in a project is CUDA-specific and how it runs on a target (static + runtime)"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from .limits import DEFAULT_MAX_SIZE, TARGET_NAMES

    p.add_argument("path", nargs="?", metavar="PATH", help="the folder or file to check (or --path)")
    p.add_argument("--path", dest="path_opt", metavar="PATH", help="the folder or file to check")
    p.add_argument("--target", default="any", choices=TARGET_NAMES,
                   help="the target to report for (default any: generic wording, every rule)")
    p.add_argument("--simulate", action="store_true", help="with --run: simulate TARGET on this machine")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE (.html or .json)")
    p.add_argument("--format", choices=("html", "json"), help="report format (default: from --output's suffix)")
    p.add_argument("--run", metavar="CMD", help='also run CMD under the adapter and join op coverage, '
                                                'e.g. --run "python train.py --steps 1"')
    p.add_argument("--run-timeout", type=float, metavar="S",
                   help="stop the --run command (and its child processes) after S seconds; exit 124")
    p.add_argument("--fail-on", choices=tuple(_FAIL_RANK), default="error",
                   help="exit 1 for findings at or above: warn (review or worse), error (will not run; "
                        "default), never")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="add rules from a TOML file (repeatable); see docs/check.md")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="skip files/folders matching GLOB (repeatable; hidden folders, __pycache__, "
                        "node_modules and site-packages are always skipped)")
    p.add_argument("--max-file-size", type=float, default=DEFAULT_MAX_SIZE / 1e6, metavar="MB",
                   help=f"skip larger files with a note (default {DEFAULT_MAX_SIZE / 1e6:g})")
    p.add_argument("--jobs", "-j", type=int, default=0, metavar="N", help="worker processes (default: CPUs)")
    p.add_argument("--quiet", "-q", action="store_true", help="no terminal summary")
    p.add_argument("--details", action="store_true", help="list every finding in the terminal summary")
    p.add_argument("--list-rules", nargs="?", const="text", choices=("text", "md", "json"),
                   help="print the rule table (text, md or json) and exit")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check`` to a ``torch-adapter`` sub-parsers object."""
    p = subparsers.add_parser("check", help=_HELP, description=_HELP + ".",
                              epilog=_EPILOG)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-adapter check", description=_HELP + ".",
                                epilog=_EPILOG)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_adapter.check ...``"""
    from ..core.command import guarded

    args = build_parser().parse_args(argv)
    args.command = "check"
    return guarded(run, args)


def _usage(expected: str, got: str, fix: str, why: str = "") -> CheckError:
    return CheckError(format_error("torch-adapter check", expected, got, why=why, fix=fix))


def _format_for(args: argparse.Namespace) -> str | None:
    if args.output is None:
        if args.format:
            raise _usage("--output FILE with --format", f"--format {args.format} without --output",
                         "add --output report." + args.format)
        return None
    from ..core.safe_io import OutputError, check_output

    try:
        check_output(args.output, call="torch-adapter check --output")
    except OutputError as exc:
        raise CheckError(str(exc)) from None
    fmt = args.format or _FORMATS.get(Path(args.output).suffix.lower())
    if fmt is None:
        raise _usage("--output ending in .html or .json (or --format)", repr(args.output),
                     "e.g. --output report.html")
    return fmt


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with the one safe writer (:mod:`torch_adapter.core.safe_io`)."""
    from ..core.safe_io import OutputError, write_text

    try:
        write_text(path, text, call="torch-adapter check --output")
    except OutputError as exc:
        raise CheckError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Run ``check`` for parsed ``args``; returns the exit code."""
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    err = Console(stderr=True, highlight=False)
    try:
        if args.list_rules:
            return _list_rules(args, console)
        return _check(args, console, err)
    except CheckError as exc:
        msg = str(exc)
        print(msg if msg.startswith("torch-adapter check") else f"torch-adapter check: {msg}", file=sys.stderr)
        return EXIT_ERROR


def _list_rules(args: argparse.Namespace, console: Any) -> int:
    from .render_rules import rule_rows, rules_json, rules_markdown, rules_renderable
    from .ruleset import build_ruleset, load_rule_file
    from .rules import RUNTIME_RULES

    rs = build_ruleset([(f, load_rule_file(f)) for f in args.rules])
    rows = rule_rows(rs.rules, RUNTIME_RULES)
    if args.list_rules == "md":
        sys.stdout.write(rules_markdown(rows))
    elif args.list_rules == "json":
        sys.stdout.write(rules_json(rows))
    else:
        console.print(rules_renderable(rows))
    return EXIT_CLEAN


def _check(args: argparse.Namespace, console: Any, err: Any) -> int:
    from .discover import DEFAULT_EXCLUDES
    from .engine import scan
    from .model import SEVERITY_RANK
    from .ruleset import load_rule_file

    if args.path and args.path_opt and Path(args.path) != Path(args.path_opt):
        raise _usage("one path", f"{args.path!r} and --path {args.path_opt!r}", "give the path once")
    path = args.path or args.path_opt
    if not path:
        raise _usage("a folder or file to check", "no path", "e.g. torch-adapter check --path ./project")
    problem = _path_problem(path)
    if problem is not None:
        raise problem
    if args.max_file_size <= 0 or args.jobs < 0:
        raise _usage("--max-file-size > 0 and --jobs >= 0", f"{args.max_file_size}, {args.jobs}", "fix the value")
    if args.run_timeout is not None and not args.run_timeout > 0:  # (not >: NaN too)
        raise _usage("--run-timeout S with S > 0 seconds", f"--run-timeout {args.run_timeout:g}",
                     "give the seconds the command may run, or leave --run-timeout out to wait for its end")
    fmt = _format_for(args)
    user_rules = [(f, load_rule_file(f)) for f in args.rules]
    show_progress = not args.quiet and err.is_terminal
    progress = None
    if show_progress:
        from .render_terminal import make_progress

        bar = make_progress(err)
        task = bar.add_task("check", total=None)
        bar.start()

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
    try:
        report = scan(path, user_rules=user_rules, target=args.target, simulate=args.simulate, jobs=args.jobs,
                      max_file_size=int(args.max_file_size * 1e6),
                      excludes=DEFAULT_EXCLUDES + tuple(args.exclude), progress=progress)
    finally:
        if show_progress:
            bar.stop()
    failed_run = None
    if args.run:
        failed_run = _runtime(args, report)
    if fmt is not None:
        if fmt == "html":
            from .html_report import render_html as render
        else:
            from .json_report import render_json as render
        write_atomic(args.output, render(report))
    if not args.quiet:
        from .render_terminal import summary_renderables

        console.print(*summary_renderables(report, details=args.details))
        if fmt is not None:
            console.print(f"report written to {args.output}")
        elif report.findings and not args.details:
            console.print("every finding, with excerpts and alternatives: --output report.html "
                          "(or --details here)")
    if failed_run is not None:
        code, message = failed_run
        print(message, file=sys.stderr)
        return code
    worst = report.worst()
    if worst is not None and SEVERITY_RANK[worst] >= _FAIL_RANK[args.fail_on]:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _path_problem(path: str) -> CheckError | None:
    """Why ``path`` cannot be checked (the usage error), or None.

    ``os.path.exists`` is False for a symlink loop as for a missing path, and "it does not
    exist" sent users looking for a file that is there: the errno of ``os.stat`` tells them
    apart (ELOOP, worded as ``torch-adapter run`` words it for a script: "a loop of symbolic
    links"), and a loop is named by its links, e.g. ``'loop' -> 'loop'``.
    """
    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            where, chain = _loop(path)
            inside = "" if where == path else f" (at {where!r}, a part of its path)"
            return _usage("an existing folder or file", f"{path!r}{inside}",
                          f"point the link at the folder or file to check (ln -sfn TARGET {where!r}), "
                          "or give that folder or file itself",
                          why=f"a loop of symbolic links: {chain} resolves to itself, never to a file")
        if os.path.islink(path):
            return _usage("an existing folder or file", f"{path!r} (a symbolic link)", "check the link's target",
                          why=f"it is a symbolic link to {os.readlink(path)!r}, which does not exist")
        if exc.errno == errno.ENOENT:
            return _usage("an existing folder or file", repr(path), "check the path", why="it does not exist")
        return _usage("a folder or file that can be read", repr(path), "check the path and its permissions",
                      why=exc.strerror or str(exc))


def _loop(path: str) -> tuple[str, str]:
    """(the first part of ``path`` that loops, its links as ``'a' -> 'b' -> 'a'``) for an ELOOP path."""
    parts = Path(path).parts
    where = path
    for i in range(1, len(parts) + 1):
        prefix = str(Path(*parts[:i]))
        try:
            os.stat(prefix)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                where = prefix
            break
    hops, seen, current = [repr(where)], set(), where
    while len(hops) < 10 and current not in seen:
        seen.add(current)
        try:
            target = os.readlink(current)
        except OSError:
            break
        hops.append(repr(target))
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
    return where, " -> ".join(hops) + (" -> ..." if current not in seen and len(hops) >= 10 else "")


def _runtime(args: argparse.Namespace, report: Any) -> tuple[int, str] | None:
    """Run ``--run`` and join its log; (exit code, message) when it failed or timed out.

    A timed-out run still joins the routing log it wrote when stopped (what ran until then),
    so the report written afterwards has as much runtime data as there is.
    """
    from .model import Note
    from .runtime import RunTimeout, join_runtime, parse_command, run_traced

    parse_command(args.run)  # usage errors before anything runs
    try:
        log, code, tail = run_traced(args.run, target=args.target, simulate=args.simulate,
                                     timeout=args.run_timeout)
    except RunTimeout as exc:
        if exc.log is not None:  # exit_code None: the stop is ours, not a failure of the project's lines
            join_runtime(report, exc.log, command=[args.run], exit_code=None, stderr_tail=exc.tail)
        report.notes.append(Note("", "run-timeout", f"the command was stopped after --run-timeout {exc.timeout:g} s"
                                                    + ("; the runtime part covers what ran until then"
                                                       if exc.log is not None else " and wrote no routing log")))
        return EXIT_TIMEOUT, str(exc)
    if log is None:
        last = next((ln for ln in reversed(tail) if ln.strip()), "")
        note = Note("", "run-failed", f"the command exited with status {code} and wrote no "
                                      f"routing log{': ' + last if last else ''}")
        report.notes.append(note)
        return EXIT_ERROR, f"torch-adapter check: --run: {note.message}"
    join_runtime(report, log, command=[args.run], exit_code=code, stderr_tail=tail)
    return None
