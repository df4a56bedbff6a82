"""``torch-adapter run``: a user's script as ``__main__``, adapted.

The script runs with ``runpy.run_path(..., run_name="__main__")`` so that
``if __name__ == "__main__":``, ``multiprocessing`` spawn (which re-imports the main
module by path in each child) and relative imports behave as under ``python SCRIPT``.
``sys.argv`` is ``[SCRIPT, *ARGS]`` and ``sys.path[0]`` the script's folder. Child
processes are adapted through the autoinstall ``.pth`` hook (``propagate=True``).
Exit codes: what ``python SCRIPT`` gives, however the script ends — its own
(``sys.exit``/``SystemExit``/``exit()``, by whatever name it was bound: runpy hands us the
SystemExit itself, so no wrapper of ``sys.exit`` can miss one or keep a stale one); 1 if it
raised (the traceback shows the user's frames, not ours; a SyntaxError shows only the user's
file); a Ctrl-C (an uncaught ``KeyboardInterrupt``) ends the process by SIGINT as python does
(:func:`_end_interrupted`); 1 for ``-m NAME`` that is not importable (one line, as ``python -m``:
:func:`_module_problem`); 2 for usage errors (a missing, unreadable or binary script, a
notebook, an unknown target, an unwritable ``--report-json``), all checked before the script
starts (tests/test_exit_codes.py runs each way of ending under both and compares).
``--report-json`` is written by the one safe writer (``_safe_io``); ``{rank}`` in its name
becomes ``$RANK`` (0 outside ``torchrun``), so each rank writes its own file — without it,
ranks writing one path each leave a complete file and the last one wins.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, NoReturn

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
    """``--report-json`` with ``{rank}`` replaced by this process's rank (``$RANK``, or another launcher's:
    ``OMPI_COMM_WORLD_RANK``, …; else 0) and ``{node}`` by its node's name (``TORCH_ADAPTER_NODE``, else
    the host name)."""
    from ..core.launcher_env import ranks

    where = ranks()
    rank = os.environ.get("RANK") or (str(where["rank"]) if where["rank"] is not None else "0")
    return path.replace("{rank}", rank).replace("{node}", where["node"])


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
               exit_guard: bool = False, gate: Any = None, **options: Any) -> int:
    """Run ``script`` (a path, or a module name with ``module=True``) adapted; return its exit code.

    ``script`` may also be a launcher command (``accelerate``, ``torchrun``, …; see _launchers).
    ``exit_guard=True`` (the CLI) bounds the process's exit once the script has ended (_exit_guard),
    and an uncaught Ctrl-C is raised on out of this function, for the interpreter to end the process
    by SIGINT as it does under ``python SCRIPT`` (_end_interrupted); without it, 130 is returned.
    """
    from ..errors import AdapterError
    from ..session import install

    if not module and not os.path.isfile(script) and not script.endswith(".py"):
        from .launchers import find

        how = find(script)
        if how is not None:
            if gate is None or not gate.active:  # no gate: no temporary routing log, no ops recorded for one
                return _run_launcher([script, *args], how, target, simulate, report, report_json, options)
            with _gated(gate, report_json) as (json_path, judge):
                return judge(_run_launcher([script, *args], how, target, simulate, report, json_path, options))
    problem = None if module else _script_problem(script)
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    if gate is not None and gate.active:
        with _gated(gate, report_json) as (json_path, judge):
            return judge(run_script(script, args, module=module, target=target, simulate=simulate, report=report,
                                    report_json=json_path, exit_guard=exit_guard, judge=judge, **options))
    judge = options.pop("judge", None)
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

    from .ray_train import patch_on_import

    patch_on_import(session.patcher)  # an unchanged Ray driver: ray.init / TorchTrainer, once it imports Ray
    tracer = children = None
    if report or report_json:
        from ..routing.trace import trace

        children = _announce_children(session)

        # the recorder (not the sampling-free C++ observer) so that every op has its call site
        tracer = trace(use_observer=False, threads=True)  # the script's threads are counted too
        log = tracer.__enter__()
    import time

    started = time.monotonic()
    hang_facts: dict[str, Any] = {}
    if report or report_json:  # a rank's last collectives and stack, when a collective hangs (launch/hang.py)
        from . import hang

        session.closers.append(hang.enable_flight_recorder())

        def killed(found: dict[str, Any]) -> None:  # the launcher ends this rank: its report says where it was
            if tracer is not None:
                tracer.__exit__(None, None, None)
            _report(session, log if tracer is not None else None, report, report_json, children,
                    seconds=time.monotonic() - started, hang=found)

        session.closers.append(hang.watch_sigterm(killed))
    old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(script))  # as `python [-m]` does
    code = 0
    interrupted: KeyboardInterrupt | None = None
    from ..core.callsite import front

    front.append("cli")  # fixes in messages are worded as run's flags
    try:
        if module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException as exc:  # the user's exception: show it, exit 1 like python does
        if module and isinstance(exc, ImportError) and _raised_by_runpy(exc):
            print(_module_problem(script, exc), file=sys.stderr)  # no such module: not the user's traceback
            code = 1
        elif type(exc) is KeyboardInterrupt and exit_guard:  # python's test is the exact class, so is ours
            interrupted, code = exc, 130  # raised again below, once the report is written
            if sys.excepthook is sys.__excepthook__:  # else the script's own hook gets it, as under python
                _print_user_traceback(exc)
        else:
            _print_user_traceback(exc)
            code = 130 if type(exc) is KeyboardInterrupt else 1
            if report or report_json:
                from .hang import facts

                hang_facts = facts(exc=exc) or {}
    finally:
        front.pop()
        sys.argv = old_argv
        if old_path0 is not None:
            sys.path[0] = old_path0
        if tracer is not None:
            tracer.__exit__(None, None, None)
        if report or report_json:
            _report(session, log if tracer is not None else None, report, report_json, children,
                    seconds=time.monotonic() - started, hang=hang_facts or None)
        if judge is not None:  # the gate decides the code before the exit guard is armed with it
            code = judge(code)
        if exit_guard:
            from .exit_guard import arm

            arm(_exit_status(code), f"the script {script}")
    if interrupted is not None:
        _end_interrupted(interrupted)
    return code


def _exit_status(code: int) -> int:
    """The status the process ends with when Python exits with ``code``, for the exit guard's
    ``os._exit`` (which takes a C int only: ``sys.exit(2**40)`` made its timer thread raise
    OverflowError and the process wait for the faulthandler backstop). CPython reads the code as
    a C long (-1 when it does not fit) and truncates it to a C int."""
    import struct

    bits = 8 * struct.calcsize("l")
    if not -(1 << (bits - 1)) <= code < 1 << (bits - 1):
        return -1
    return (code + (1 << 31)) % (1 << 32) - (1 << 31)


def _end_interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """End the process as ``python SCRIPT`` does after a Ctrl-C the script did not catch: by
    SIGINT (a parent sees -2 from subprocess, 130 in a shell; torchrun and ``timeout`` tell a
    signal from an exit code), after the script's traceback ending in ``KeyboardInterrupt``.

    Only the interpreter can do that: when a KeyboardInterrupt leaves the main module, CPython
    shuts down (joins threads, runs ``atexit``) and then kills itself with SIGINT — no Python
    code runs after ``atexit`` to do it, and ``exit(130)`` is not a signal. So the exception is
    raised on out of ``python -m torch_adapter``. run_script printed its traceback already (the
    user's frames, before the report, as for any failure), so a one-shot ``sys.excepthook``
    keeps the interpreter from printing it again with ours; a hook the script installed itself
    is left to get it, as under python."""
    previous = sys.excepthook
    if previous is sys.__excepthook__:
        def hook(etype: Any, value: BaseException, tb: Any) -> None:
            if value is not exc:
                previous(etype, value, tb)
                return
            sys.excepthook = previous

        sys.excepthook = hook
    raise exc


def _raised_by_runpy(exc: ImportError) -> bool:
    """Whether runpy raised ``exc`` while looking for the ``-m`` module (its innermost frame is
    runpy's), rather than the module's own code or its package's ``__init__`` while importing —
    those are the user's errors, shown with their traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    name = tb.tb_frame.f_code.co_filename
    return name.startswith("<frozen runpy") or os.path.abspath(name) == _OWN[1]


def _module_problem(name: str, exc: ImportError) -> str:
    """One line for ``-m NAME`` that runpy cannot find or run (``python -m`` prints one line too):
    what was asked, runpy's reason, where it looked, the fix."""
    why = str(exc).rstrip(".")
    if "cannot be directly executed" in why:  # a package without __main__.py
        fix = f"name a module inside it (`-m {name}.train`), or give it a {name.replace('.', '/')}/__main__.py"
    elif why == f"No module named {name}" or "ModuleNotFoundError" in why:
        where = f"the current folder ({os.getcwd()}) or sys.path"
        why = (f"no module of that name is importable from {where}" if why.startswith("No module named")
               else f"{why}; not importable from {where}")
        fix = ("run it from the folder that holds it (or its top package), install its project "
               "(`pip install -e .`), or add that folder to PYTHONPATH; for a file, give its path without -m")
    else:  # a namespace package, no code object, a relative name
        fix = "check the module name, or give the script's path without -m"
    return f"torch-adapter run -m {name}: expected an importable module, got {name!r}: {why}. Fix: {fix}"


def _announce_children(session: Any) -> str | None:
    """With --report, adapted child processes (mp.spawn ranks, …) write their own reports to a folder."""
    if not session.config.propagate:
        return None
    from ..core.config import CHILD_SETTINGS_ENV, encode_child_settings
    from .child_report import new_folder

    folder = new_folder()
    session.patcher.set_env(CHILD_SETTINGS_ENV, encode_child_settings({**session.settings(), "announce": folder, "report": True}))
    return folder


@contextlib.contextmanager
def _gated(gate: Any, report_json: str | None) -> Iterator[tuple[str | None, Any]]:
    """The run's routing log path (a temporary one when the user asked for none) and a ``judge(code)``
    that applies the gate once, to the log the run wrote: the script's own failure keeps its code,
    a success that breaks the gate ends with EXIT_GATE (launch/gate.py)."""
    import json
    import tempfile

    from .gate import EXIT_GATE

    tmp = None
    if report_json is None:
        fd, tmp = tempfile.mkstemp(prefix="torch-adapter-gate-", suffix=".json")
        os.close(fd)
        os.unlink(tmp)  # the report writes it: a missing file afterwards says the run wrote none
    done: list[int] = []

    def judge(code: int) -> int:
        if done:
            return done[0]
        path = report_json or tmp
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            if code == 0:  # nothing to judge: the gate cannot pass a run it did not see
                print(f"torch_adapter gate: FAILED — no routing log to judge ({path}: {exc})", file=sys.stderr)
                code = EXIT_GATE
            done.append(code)
            return code
        found = gate.violations(data)
        print(gate.report(found), file=sys.stderr, flush=True)
        if found and code == 0:
            code = EXIT_GATE
        done.append(code)
        return code

    try:
        yield (report_json or tmp), judge
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _run_launcher(argv: list[str], how: Any, target: str, simulate: bool, report: bool, report_json: str | None,
                  options: dict[str, Any]) -> int:
    """The launcher runs unadapted here; the settings its Python children install with are validated first."""
    from .launchers import run_launcher
    from ..errors import AdapterError
    from ..session import install, uninstall

    try:
        if report_json:  # checked before anything runs, as for a script
            from ..core.safe_io import check_output

            report_json = str(check_output(report_path(report_json), call="torch-adapter run --report-json"))
        settings = install(target, simulate=simulate, propagate=True, **options).settings()
    except AdapterError as exc:
        print(f"torch-adapter run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        uninstall()
    return run_launcher(argv, how, settings, report=report, report_json=report_json)


def _report(session: Any, log: Any, to_terminal: bool, json_path: str | None, children: str | None = None,
            seconds: float | None = None, hang: dict[str, Any] | None = None) -> None:
    import shutil

    from . import child_report as _child_report
    from .report import write

    records = _child_report.collect(children) if children else []
    if children:
        shutil.rmtree(children, ignore_errors=True)
    write(records, to_terminal, json_path, session=session, log=log, seconds=seconds, hang=hang)