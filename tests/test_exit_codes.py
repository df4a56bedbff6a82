"""`torch-adapter run SCRIPT` ends as `python SCRIPT` does, however the script ends.

Each case runs the same script under plain python and under the adapter, side by side in one
test, and compares what a caller sees: the exit status (a death by signal included), the last
line of stderr and stdout. Nothing is hard-coded that plain python can be asked: the interpreter
decides (e.g. an uncaught KeyboardInterrupt kills python with SIGINT, -2 here, not exit 130; a
KeyboardInterrupt subclass is exit 1). The runner gets each code from the SystemExit runpy hands
it, so a bound ``exit``, a builtin ``exit()`` or a SystemExit the script caught cannot fool it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import run_cli

_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # as run_cli runs the adapter

# A non-daemon thread that keeps the process alive 3 s after the script ends: plain python waits
# for it, the adapter's exit guard (TORCH_ADAPTER_EXIT_TIMEOUT=1) ends the process first — with
# the code plain python ends with.
_LINGER = "import threading, time\nthreading.Thread(target=time.sleep, args=(3,), name='lingers').start()\n"

CASES = {
    "raise SystemExit": "raise SystemExit(3)\n",
    "sys.exit(int)": "import sys\nsys.exit(3)\n",
    "sys.exit(message)": "import sys\nsys.exit('training failed: no data')\n",
    "sys.exit(None)": "import sys\nsys.exit(None)\n",
    "sys.exit()": "import sys\nprint('bye')\nsys.exit()\n",
    "builtin exit": "exit(3)\n",
    "builtin quit": "quit(3)\n",
    "exit bound by from-import": "from sys import exit as leave\n\ndef main():\n    leave(4)\n\nmain()\n",
    "exit bound at module top": "import sys\ne = sys.exit\n\ndef main():\n    e(5)\n\nmain()\n",
    "caught SystemExit leaves no code": textwrap.dedent("""\
        import sys
        try:
            sys.exit(2)
        except SystemExit:
            pass
        print('went on')
        """),
    "os._exit": "import os\nprint('flushed?', flush=True)\nos._exit(7)\n",
    "uncaught exception": "def f():\n    raise ValueError('bad value')\n\nf()\n",
    "KeyboardInterrupt": "def train():\n    raise KeyboardInterrupt\n\ntrain()\n",
    "SIGINT": "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(10)\n",
    "KeyboardInterrupt subclass": "class Stop(KeyboardInterrupt):\n    pass\n\nraise Stop('asked')\n",
    "sys.exit in a thread": textwrap.dedent("""\
        import sys, threading
        t = threading.Thread(target=sys.exit, args=(3,))
        t.start()
        t.join()
        print('main thread done')
        """),
    "atexit handler raises": textwrap.dedent("""\
        import atexit
        def handler():
            raise RuntimeError('handler failed')
        atexit.register(handler)
        print('main done')
        """),
    "multiprocessing child exits 3": textwrap.dedent("""\
        import multiprocessing as mp, sys
        if __name__ == '__main__':
            child = mp.get_context('spawn').Process(target=sys.exit, args=(3,))
            child.start()
            child.join()
            print('child', child.exitcode)
        """),
    # the exit guard ends these (the thread lingers): its code is the script's, as python's is
    "guard: caught SystemExit": _LINGER + "import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n",
    "guard: bound exit": "from sys import exit as leave\n" + _LINGER + "leave(4)\n",
    "guard: code beyond a C int": _LINGER + "import sys\nsys.exit(2**32 + 3)\n",
}


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _both(tmp_path, script_text: str, *, env: dict | None = None, module: str | None = None):
    """Plain python and the adapter on the same script (or ``-m module``), run at the same time;
    their CompletedProcesses (plain, adapted)."""
    if module is None:
        script = tmp_path / "prog.py"
        script.write_text(script_text)
        target = [str(script)]
    else:
        target = ["-m", module]
    full_env = {**os.environ, **_ENV, **(env or {})}
    full_env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    plain = subprocess.Popen([sys.executable, *target], cwd=tmp_path, env=full_env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        adapted = run_cli("run", *target, cwd=tmp_path, env=env, timeout=120)
        out, err = plain.communicate(timeout=120)
    finally:
        if plain.poll() is None:
            plain.kill()
    return subprocess.CompletedProcess(plain.args, plain.returncode, out, err), adapted


@pytest.mark.parametrize("case", list(CASES))
def test_run_exits_as_plain_python(tmp_path, case):
    guarded = case.startswith("guard:")
    plain, adapted = _both(tmp_path, CASES[case], env={"TORCH_ADAPTER_EXIT_TIMEOUT": "1"} if guarded else None)
    seen = (f"plain: rc={plain.returncode} stdout={plain.stdout!r} stderr={plain.stderr[-600:]!r}\n"
            f"adapter: rc={adapted.returncode} stdout={adapted.stdout!r} stderr={adapted.stderr[-1200:]!r}")
    assert adapted.returncode == plain.returncode, seen
    assert adapted.stdout == plain.stdout, seen
    if guarded:  # the guard says why it ended the process, with python's code, and nothing else fails
        assert f"Ending it now with exit code {plain.returncode}." in adapted.stderr, seen
        assert "Traceback" not in adapted.stderr and "Error" not in adapted.stderr, seen
        return
    assert _last(adapted.stderr) == _last(plain.stderr), seen
    if "Traceback" in plain.stderr:  # the user's frames only, as python shows them
        assert "runpy" not in adapted.stderr and "torch_adapter" not in adapted.stderr, seen
        assert 'prog.py", line' in adapted.stderr, seen


def test_run_m_of_a_missing_module_is_one_line(tmp_path):
    plain, adapted = _both(tmp_path, "", module="no_such_module")
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr  # python's own
    assert adapted.returncode == plain.returncode, adapted.stderr
    lines = adapted.stderr.strip().splitlines()
    assert len(lines) == 1, adapted.stderr
    line = lines[0]
    assert line.startswith("torch-adapter run -m no_such_module: expected an importable module, got 'no_such_module'")
    assert f"is importable from the current folder ({tmp_path}) or sys.path" in line, line
    assert "Fix: run it from the folder that holds it" in line and "PYTHONPATH" in line, line
    assert "Traceback" not in adapted.stderr and "runpy" not in adapted.stderr, adapted.stderr


@pytest.mark.parametrize("body, module", [
    ("raise ImportError('the module itself failed')\n", "pkg.broken"),  # runpy's ImportError class, the user's
    ("import not_installed_dependency\n", "pkg.broken"),  # a ModuleNotFoundError from inside the module
])
def test_run_m_of_a_module_whose_import_fails_shows_its_traceback(tmp_path, body, module):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "broken.py").write_text(body)
    plain, adapted = _both(tmp_path, "", module=module)
    assert adapted.returncode == plain.returncode == 1, adapted.stderr
    assert _last(adapted.stderr) == _last(plain.stderr), adapted.stderr
    assert 'pkg/broken.py", line 1, in <module>' in adapted.stderr, adapted.stderr
    assert "runpy" not in adapted.stderr and "expected an importable module" not in adapted.stderr, adapted.stderr


def test_run_m_of_a_package_without_main_names_the_fix(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    plain, adapted = _both(tmp_path, "", module="tools")
    assert adapted.returncode == plain.returncode == 1
    assert adapted.stderr.count("\n") == 1 and "Traceback" not in adapted.stderr, adapted.stderr
    assert "'tools' is a package and cannot be directly executed" in adapted.stderr
    assert "Fix: name a module inside it (`-m tools.train`), or give it a tools/__main__.py" in adapted.stderr


_CHILD = textwrap.dedent("""\
    import multiprocessing as mp, sys, threading, time

    def child():
        threading.Thread(target=time.sleep, args=(2,), name='lingers').start()  # the child's guard ends it
    {body}

    if __name__ == '__main__':
        p = mp.get_context('spawn').Process(target=child)
        p.start()
        p.join()
        print('child', p.exitcode)
    """)


# (the guard took its code from a sys.exit wrapper: `raise SystemExit(3)` ended the child 0, a caught
# SystemExit 2; now it reads the code multiprocessing computed: launch/exit_guard.py, _process_exitcode)
@pytest.mark.parametrize("body", [
    "    raise SystemExit(3)\n",  # plain python: child 3; the guard's code before: 0
    "    try:\n        sys.exit(2)\n    except SystemExit:\n        pass\n",  # plain python: child 0; before: 2
    "    exit(4)\n",
    "    raise ValueError('a failure')\n",
], ids=["raise SystemExit in a child", "caught SystemExit in a child", "builtin exit in a child", "an exception in a child"])
def test_an_adapted_child_ended_by_the_guard_keeps_its_code(tmp_path, body):
    plain, adapted = _both(tmp_path, _CHILD.format(body=body), env={"TORCH_ADAPTER_EXIT_TIMEOUT": "1"})
    assert "Ending it now" in adapted.stderr, adapted.stderr  # the child's guard did end it
    assert adapted.stdout == plain.stdout, (plain.stdout, adapted.stdout)


# An adapted child that is not a multiprocessing one -- a `subprocess` of the adapted script, a
# torchrun rank -- is adapted by the .pth hook and guarded from the start of its shutdown
# (exit_guard.arm_at_shutdown), with no runpy nor multiprocessing frame that knows its code. Each
# child below lingers (a non-daemon thread) so that its guard ends it. The guard guessed the code
# from a sys.exit wrapper: `raise SystemExit(3)` and the builtin `exit(4)` ended it 0, a caught
# sys.exit(2) 2 (and 2 again when an exception followed), an uncaught Ctrl-C 1 (python: SIGINT).
# Now it stops waiting for the lingering threads and lets the interpreter end with its own code.
_PARENT = textwrap.dedent("""\
    import subprocess, sys
    kids = [(name, subprocess.Popen([sys.executable, name], stdout=subprocess.DEVNULL))
            for name in sys.argv[1:]]
    for name, kid in kids:
        print(name, kid.wait(), flush=True)
    """)

SUBPROCESS_CHILDREN = {
    "normal end": "",
    "raise SystemExit": "raise SystemExit(3)\n",
    "sys.exit(int)": "import sys\nsys.exit(6)\n",
    "builtin exit": "exit(4)\n",
    "exit bound before the wrapper": None,  # `from sys import exit` above the thread: see below
    "caught SystemExit leaves no code": "import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass\n",
    "caught SystemExit, then an exception": textwrap.dedent("""\
        import sys
        try:
            sys.exit(2)
        except SystemExit:
            pass
        raise ValueError('after')
        """),
    "sys.exit(message)": "import sys\nsys.exit('child failed: no data')\n",
    "uncaught exception": "raise ValueError('bad value')\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
}


def test_an_adapted_subprocess_ended_by_the_guard_keeps_its_code(tmp_path):
    names = []
    for i, (case, body) in enumerate(SUBPROCESS_CHILDREN.items()):
        text = ("from sys import exit\n" + _LINGER + "exit(5)\n") if body is None else _LINGER + body
        (tmp_path / f"child{i}.py").write_text(text)
        names.append(f"child{i}.py")
    (tmp_path / "prog.py").write_text(_PARENT)
    env = {**os.environ, **_ENV}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    plain = subprocess.run([sys.executable, "prog.py", *names], check=False, cwd=tmp_path, env=env, text=True,
                           capture_output=True, timeout=120)
    adapted = run_cli("run", "prog.py", *names, cwd=tmp_path, env={"TORCH_ADAPTER_EXIT_TIMEOUT": "1"}, timeout=180)
    assert plain.returncode == adapted.returncode == 0, (plain.stderr, adapted.stderr)
    want = dict(line.split() for line in plain.stdout.splitlines())
    got = dict(line.split() for line in adapted.stdout.splitlines())
    cases = dict(zip(names, SUBPROCESS_CHILDREN))
    differ = {cases[n]: (want[n], got.get(n)) for n in names if got.get(n) != want[n]}
    assert not differ, f"(plain, adapted) exit codes of the children that differ: {differ}\n{adapted.stderr[-3000:]}"
    assert adapted.stderr.count("has not exited") == len(names), adapted.stderr[-3000:]  # each guard did end its child
    assert "child failed: no data" in adapted.stderr  # python's own line for sys.exit(message)
