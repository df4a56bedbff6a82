"""``torch-adapter run``: a user's script as ``__main__``, adapted.

The script runs with ``runpy.run_path(..., run_name="__main__")`` so that
``if __name__ == "__main__":``, ``multiprocessing`` spawn (which re-imports the main
module by path in each child) and relative imports behave as under ``python SCRIPT``.
``sys.argv`` is ``[SCRIPT, *ARGS]`` and ``sys.path[0]`` the script's folder. Child
processes are adapted through the autoinstall ``.pth`` hook (``propagate=True``).
Exit codes: the script's own; 1 if it raised (the traceback shows the user's frames,
not ours; a SyntaxError shows only the user's file); 2 for usage errors (a missing,
unreadable or binary script, a notebook, an unknown target, an unwritable
``--report-json``), all checked before the script starts. ``--report-json`` is written by
the one safe writer (``_safe_io``); ``{rank}`` in its name becomes ``$RANK`` (0 outside
``torchrun``), so each rank writes its own file — without it, ranks writing one path each
leave a complete file and the last one wins.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any

from ..core.callsite import PACKAGE_DIR
from ..core.command import EXIT_USAGE
from .exit_guard import exit_code

__all__ = ["run_script", "EXIT_USAGE"]

_OWN = (PACKAGE_DIR + os.sep, os.path.abspath(runpy.__file__))


def _is_own(filename: str) -> bool:
    return filename.startswith("<frozen runpy") or os.path.abspath(filename).startswith(_OWN)


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback without the frames of torch_adapter and runpy that lead to the script, nor
    the adapter's own frames under the script's lines (core/tracebacks.py)."""
    tb = exc.__traceback__
    while tb is not None and _is_own(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError):  # the script did not compile: only its file and line
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return
    from ..core.tracebacks import trim_exception

    shown = traceback.TracebackException(type(exc), exc, tb if tb is not None else exc.__traceback__)
    sys.stderr.write("".join(trim_exception(shown).format()))  # the adapter's frames left out (core/tracebacks)


def report_path(path: str) -> str:
    """``--report-json`` with ``{rank}`` replaced by this process's rank (``$RANK``, else 0)."""
    return path.replace("{rank}", os.environ.get("RANK", "0"))


def _script_problem(script: str) -> str | None:
    """Why ``script`` cannot be run as a Python script (a message with the fix), or None."""
    from ..errors import format_error

    def bad(got: str, why: str, fix: str = "check the path") -> str:
        return format_error("torch-adapter run", "a Python script", got, why=why, fix=fix)

    if script.endswith(".ipynb"):
        return bad(repr(script), "a notebook is not a script",
                   "run it in Jupyter with `%load_ext torch_adapter` in its first cell (or execute it with "
                   "`jupyter nbconvert --to notebook --execute` after adding that line), or convert it with "
                   "`jupyter nbconvert --to script` and run the .py file")
    try:
        st = os.stat(script)
    except OSError as exc:
        import errno

        why = {errno.ENOENT: "no such file", errno.ELOOP: "a loop of symbolic links",
               errno.EACCES: "permission denied on a folder in its path"}.get(exc.errno or 0, exc.strerror)
        return bad(repr(script), str(why), "check the path, or use `torch-adapter run -m package.module`")
    import stat

    if stat.S_ISDIR(st.st_mode):
        return bad(f"{script!r} (a folder)", "torch-adapter run takes one file",
                   "name the script, or use `torch-adapter run -m package.module` for a package")
    if not stat.S_ISREG(st.st_mode):
        return bad(f"{script!r} (not a regular file)", "scripts are read from regular files", "save it to a file")
    try:
        with open(script, "rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        return bad(repr(script), f"it cannot be read ({exc.strerror})", "check its permissions (chmod u+r)")
    import zipfile

    if b"\0" in head and not script.endswith((".pyc", ".pyz")) and not zipfile.is_zipfile(script):
        return bad(f"{script!r} (binary data)", "it holds NUL bytes, so it is not Python source",
                   "give the .py file (compiled .pyc files and zip apps are run too)")
    return None


def run_script(script: str, args: list[str], *, module: bool = False, target: str = "auto",
               simulate: bool = False, report: bool = False, report_json: str | None = None,
               exit_guard: bool = False, **options: Any) -> int:
    """Run ``script`` (a path, or a module name with ``module=True``) adapted; return its exit code.

    ``script`` may also be a launcher command (``accelerate``, ``torchrun``, …; see _launchers).
    ``exit_guard=True`` (the CLI) bounds the process's exit once the script has ended (_exit_guard).
    """
    from ..errors import AdapterError
    from ..session import install

    if not module and not os.path.isfile(script) and not script.endswith(".py"):
        from .launchers import find

        how = find(script)
        if how is not None:
            return _run_launcher([script, *args], how, target, simulate, report, report_json, options)
    problem = None if module else _script_problem(script)
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    try:
        if report_json:
            from ..core.safe_io import check_output

            report_json = str(check_output(report_path(report_json), call="torch-adapter run --report-json"))
        from ..core.callsite import front

        front.append("cli")  # a target error's fix in run's flags
        try:
            session = install(target, simulate=simulate, propagate=True, **options)
        finally:
            front.pop()
    except AdapterError as exc:
        msg = str(exc)
        print(msg if msg.startswith("torch-adapter") else f"torch-adapter run: {msg}", file=sys.stderr)
        return EXIT_USAGE

    tracer = children = None
    if report or report_json:
        from ..routing.trace import trace

        children = _announce_children(session)

        # the recorder (not the sampling-free C++ observer) so that every op has its call site
        tracer = trace(use_observer=False, threads=True)  # the script's threads are counted too
        log = tracer.__enter__()
    old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(script))  # as `python [-m]` does
    code = 0
    from ..core.callsite import front

    front.append("cli")  # fixes in messages are worded as run's flags
    try:
        if module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exit_code(exc.code)
    except KeyboardInterrupt:
        code = 130
        print("torch-adapter run: interrupted", file=sys.stderr)
    except BaseException as exc:  # the user's exception: show it, exit 1 like python does
        _print_user_traceback(exc)
        code = 1
    finally:
        front.pop()
        sys.argv = old_argv
        if old_path0 is not None:
            sys.path[0] = old_path0
        if tracer is not None:
            tracer.__exit__(None, None, None)
        if report or report_json:
            _report(session, log if tracer is not None else None, report, report_json, children)
        if exit_guard:
            from .exit_guard import arm

            arm(code, f"the script {script}")
    return code


def _announce_children(session: Any) -> str | None:
    """With --report, adapted child processes (mp.spawn ranks, …) write their own reports to a folder."""
    if not session.config.propagate:
        return None
    from ..core.config import CHILD_SETTINGS_ENV, encode_child_settings
    from .child_report import new_folder

    folder = new_folder()
    session.patcher.set_env(CHILD_SETTINGS_ENV, encode_child_settings({**session.settings(), "announce": folder, "report": True}))
    return folder


def _run_launcher(argv: list[str], how: Any, target: str, simulate: bool, report: bool, report_json: str | None,
                  options: dict[str, Any]) -> int:
    """The launcher runs unadapted here; the settings its Python children install with are validated first."""
    from .launchers import run_launcher
    from ..errors import AdapterError
    from ..session import install, uninstall

    try:
        if report_json:  # checked before anything runs, as for a script
            from ..core.safe_io import check_output

            report_json = str(check_output(report_json, call="torch-adapter run --report-json"))
        settings = install(target, simulate=simulate, propagate=True, **options).settings()
    except AdapterError as exc:
        print(f"torch-adapter run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        uninstall()
    return run_launcher(argv, how, settings, report=report, report_json=report_json)


def _report(session: Any, log: Any, to_terminal: bool, json_path: str | None, children: str | None = None) -> None:
    import shutil

    from . import child_report as _child_report
    from .report import write

    records = _child_report.collect(children) if children else []
    if children:
        shutil.rmtree(children, ignore_errors=True)
    write(records, to_terminal, json_path, session=session, log=log)