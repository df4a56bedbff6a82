"""A bounded exit: once the user's script has ended, the process ends within a timeout.

Armed by ``torch-adapter run`` after the script returned and its report is written, and
in adapted child processes when their interpreter starts shutting down. If the process
is still alive ``TORCH_ADAPTER_EXIT_TIMEOUT`` seconds later (default 60; ``0`` waits
forever) — a non-daemon thread that never ends, an ``atexit`` handler blocked on a lock,
DataLoader workers that do not join — a message names what is still alive (threads,
child processes), the child processes are terminated, and the process exits with the
script's own exit code. Where that code is only guessed -- an adapted child that is a plain
``python SCRIPT`` (a ``subprocess``, a torchrun rank), whose code CPython keeps on its C stack --
the guard instead stops the interpreter's wait for the threads still alive and lets it end
with its own code (``_stop_waiting``), ending the process itself only if that fails. A C-level backstop (:func:`faulthandler.dump_traceback_later`)
ends it 15 s later even when the hang holds the GIL, after dumping every thread's stack.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from typing import Any

__all__ = ["DEFAULT_TIMEOUT_S", "ENV_VAR", "arm", "arm_at_shutdown", "exit_code", "shutdown_code", "timeout_s"]

ENV_VAR = "TORCH_ADAPTER_EXIT_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_ARMED: list[Any] = []


def exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def timeout_s() -> float:
    """The exit timeout in seconds from ``TORCH_ADAPTER_EXIT_TIMEOUT`` (0: no bound)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        print(f"torch_adapter: {ENV_VAR}={raw!r} is not a number of seconds; using {DEFAULT_TIMEOUT_S:g}. "
              f"Fix: e.g. {ENV_VAR}=120, or 0 to wait for the process forever.", file=sys.stderr)
        return DEFAULT_TIMEOUT_S
    return max(value, 0.0)


def _alive() -> str:
    threads = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()
               and not t.daemon]
    children = []
    try:
        import multiprocessing

        children = [f"{p.name} (pid {p.pid})" for p in multiprocessing.active_children()]
    except Exception:  # noqa: BLE001, S110 - a diagnosis must not fail
        pass
    parts = []
    if threads:
        parts.append("threads: " + ", ".join(threads))
    if children:
        parts.append("child processes: " + ", ".join(children))
    return "; ".join(parts) or "no non-daemon thread or child process (a blocked exit handler)"


def _fire(what: str, code: int, seconds: float, let_python_end: bool = False) -> None:
    try:
        alive = _alive()
        import multiprocessing

        for child in multiprocessing.active_children():
            child.terminate()
        if let_python_end and _stop_waiting():
            print(f"torch_adapter: {what} ended {seconds:g} s ago but the process has not exited; still alive: "
                  f"{alive}. Ending it now without waiting for them, with the exit code Python gives it. "
                  f"Set {ENV_VAR}=0 to wait forever, or a larger number of seconds.", file=sys.stderr, flush=True)
            import time

            time.sleep(_GRACE_S)  # the interpreter ends the process meanwhile (this daemon thread with it)
            alive = "an exit handler that blocks"
        print(f"torch_adapter: {what} ended {seconds:g} s ago (exit code {code}) but the process has not exited; "
              f"still alive: {alive}. Ending it now with exit code {code}. "
              f"Set {ENV_VAR}=0 to wait forever, or a larger number of seconds.", file=sys.stderr, flush=True)
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001, S110 - we are ending the process either way
        pass
    os._exit(code)


_GRACE_S = 5.0  # after _stop_waiting: for the interpreter to finish its exit before the guard ends it itself


def _stop_waiting() -> bool:
    """Let the main thread's ``threading._shutdown`` stop waiting for the non-daemon threads still
    alive (it waits on each one's ``_tstate_lock``, which any thread may release; the thread's own
    end then finds it released), so that the interpreter finishes its exit as for daemon threads and
    ends the process with the code it computed itself -- the only exact one for a plain
    ``python SCRIPT``: ``raise SystemExit(3)``, a caught SystemExit, an uncaught Ctrl-C (SIGINT)
    leave their code on the C stack only. False when there was nothing to release (an exit handler
    blocks instead) or this Python joins threads in C (3.13+: no ``_tstate_lock``)."""
    released = False
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        lock = getattr(thread, "_tstate_lock", None)
        if lock is not None and lock.locked():
            try:
                lock.release()
                released = True
            except RuntimeError:  # it ended meanwhile
                pass
    return released


def arm(code: int, what: str = "the script", *, let_python_end: bool = False) -> bool:
    """Bound the rest of this process's life; returns False when disabled (timeout 0) or armed already.

    ``let_python_end``: ``code`` is a guess (see :func:`arm_at_shutdown`), so the guard first lets
    the interpreter end without waiting for the threads still alive (:func:`_stop_waiting`), and
    ends the process with ``code`` only if it still has not exited :data:`_GRACE_S` s later."""
    seconds = timeout_s()
    if seconds <= 0 or _ARMED:
        return False
    timer = threading.Timer(seconds, _fire, args=(what, code, seconds, let_python_end))
    timer.daemon = True
    timer.name = "torch-adapter-exit-guard"
    timer.start()
    faulthandler.dump_traceback_later(seconds + 15.0, exit=True)
    _ARMED.append(timer)
    return True


_EXIT_CODE: list[int] = []  # what the child's own sys.exit() asked for (mp.spawn workers: sys.exit(1))


def _code_of(arg: Any) -> int:
    """The process exit code ``sys.exit(arg)`` gives (None → 0, an int → itself, else 1)."""
    if arg is None:
        return 0
    return arg if isinstance(arg, int) else 1


def _record_exit_calls() -> None:
    """Wrap ``sys.exit`` in this (child) process so the guard knows the code the script asked for.
    The interpreter keeps the code of a handled SystemExit on its C stack only."""
    original = sys.exit
    if getattr(original, "_torch_adapter_exit", False):
        return

    def exit(arg: Any = None) -> None:  # (sys's name)
        _EXIT_CODE[:] = [_code_of(arg)]
        original(arg)

    exit._torch_adapter_exit = True  # type: ignore[attr-defined]
    exit.__doc__ = original.__doc__
    sys.exit = exit


def _process_exitcode() -> int | None:
    """In a multiprocessing child: the exit code ``BaseProcess._bootstrap`` computed for it (its local
    ``exitcode``, still on the main thread's stack while threading shuts down inside ``_bootstrap``) —
    exact, however the target ended (``raise SystemExit(3)``, ``exit(3)``, an exception, a SystemExit
    it caught). None elsewhere."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_bootstrap" and code.co_filename.endswith(os.path.join("multiprocessing", "process.py")):
            value = frame.f_locals.get("exitcode")
            return value if isinstance(value, int) else None
        frame = frame.f_back
    return None


def shutdown_code() -> int:
    """The exit code the process is ending with, as far as Python can know at shutdown: a
    multiprocessing child's own (:func:`_process_exitcode`), else the script's ``sys.exit(N)``,
    else 1 after an uncaught exception was printed, else 0."""
    code = _process_exitcode()
    if code is not None:
        return code
    if _EXIT_CODE:
        return _EXIT_CODE[-1]
    return 1 if getattr(sys, "last_value", None) is not None else 0


def arm_at_shutdown(what: str) -> None:
    """In an adapted child: arm when the interpreter starts shutting down (before non-daemon threads are joined)."""
    _record_exit_calls()

    def at_shutdown() -> None:
        code = _process_exitcode()
        if code is not None:  # exact: multiprocessing computed it
            arm(code, what)
        else:  # a guess (a plain `python SCRIPT`): the interpreter's own code wins where it can end
            arm(shutdown_code(), what, let_python_end=True)

    register = getattr(threading, "_register_atexit", None)  # runs before threading joins its threads
    try:
        if register is not None:
            register(at_shutdown)
            return
    except RuntimeError:  # already shutting down
        pass
    import atexit

    atexit.register(at_shutdown)
