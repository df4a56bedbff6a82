"""The one error path of the command line (cli.guarded, runner): user errors are one message and
exit 2, never a traceback; a failing script shows only its own frames and keeps its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import run_cli


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("make, pattern", [
    (lambda d: d / "missing.py", r"(?s)expected a Python script, got '.*missing.py'.*Why: no such file"),
    (lambda d: d, r"(?s)\(a folder\).*Fix: name the script, or use `torch-adapter run -m"),
    ("loop", r"(?s)Why: a loop of symbolic links"),
    ("binary", r"(?s)\(binary data\).*Why: it holds NUL bytes"),
    ("notebook", r"(?s)Why: a notebook is not a script.*%load_ext torch_adapter.*nbconvert --to script"),
])
def test_run_refuses_what_is_not_a_script(tmp_path, make, pattern):
    import re

    if make == "loop":
        path = tmp_path / "loop.py"
        path.symlink_to(path)
    elif make == "binary":
        path = tmp_path / "blob.py"
        path.write_bytes(b"\x7fELF\x00\x00\x01")
    elif make == "notebook":
        path = tmp_path / "nb.ipynb"
        path.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    else:
        path = make(tmp_path)
    done = run_cli("run", str(path))
    assert done.returncode == 2
    assert done.stderr.startswith("torch-adapter run: expected a Python script"), done.stderr
    assert re.search(pattern, done.stderr), done.stderr
    _no_traceback(done)


@pytest.mark.parametrize("folder_mode, why", [(0o755, "it cannot be read (Permission denied)"),
                                              (0o700, "permission denied on a folder in its path")])
def test_an_unreadable_script_is_a_message(folder_mode, why):
    """As another user (the script is 0600 root's): the check that `run` does before anything else."""
    import shutil
    import tempfile
    from pathlib import Path

    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid (CI runs as root)")
    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # (pytest's tmp_path is in a 0700 folder)
    try:
        text = _problem_as_nobody(folder, folder_mode)
    finally:
        shutil.rmtree(folder)
    assert why in text and "Fix: check" in text, text


def _problem_as_nobody(folder, folder_mode: int) -> str:
    from torch_adapter.launch.runner import _script_problem

    script = folder / "private.py"
    script.write_text("print('hi')\n")
    os.chmod(script, 0o600)
    os.chmod(folder, folder_mode)

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setresuid(65534, 65534, 65534)
            os.write(write_end, (_script_problem(str(script)) or "None").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    text = os.read(read_end, 65536).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    return text


def test_a_syntax_error_shows_only_the_users_file(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("x = (\n")
    done = run_cli("run", str(script))
    assert done.returncode == 1
    assert f'File "{script}", line 1' in done.stderr and "SyntaxError" in done.stderr
    assert "runpy" not in done.stderr and "torch_adapter" not in done.stderr and "Traceback" not in done.stderr


def test_a_failing_script_shows_its_own_traceback_and_exit_code(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    done = run_cli("run", str(script))
    assert done.returncode == 1
    frames = [line for line in done.stderr.splitlines() if line.strip().startswith("File ")]
    assert frames and all(str(script) in f for f in frames), done.stderr
    assert done.stderr.rstrip().endswith("ValueError: boom")
    script.write_text("import sys\nsys.exit(7)\n")
    assert run_cli("run", str(script)).returncode == 7


def test_report_json_is_checked_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    for bad, why in (("/dev/null", "it is a character device"), (str(tmp_path / "no" / "r.json"),
                                                                   "the folder does not exist")):
        done = run_cli("run", "--report-json", bad, str(script))
        assert done.returncode == 2 and why in done.stderr, done.stderr
        assert done.stderr.startswith("torch-adapter run --report-json: expected a new or regular file")
        _no_traceback(done)
    assert not marker.exists()


def test_a_full_standard_output_is_a_message():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "torch_adapter", "targets"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=240)
    assert done.returncode == 2
    assert done.stderr.startswith("torch-adapter: cannot write to standard output (No space left on device)")
    assert done.stderr.count("torch-adapter:") == 1, done.stderr
    _no_traceback(done)


def test_a_closed_pipe_is_a_message():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        done = subprocess.run([sys.executable, "-m", "torch_adapter", "targets", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        os.close(write_end)
    assert done.returncode == 2
    assert "cannot write to standard output (its reader closed the pipe)" in done.stderr, done.stderr
    _no_traceback(done)


def test_a_closed_standard_output_is_a_message():
    done = subprocess.run([sys.executable, "-m", "torch_adapter", "targets"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=240,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 2
    assert "standard output is closed" in done.stderr, done.stderr
    _no_traceback(done)


@pytest.mark.parametrize("argv", [["run"], ["--bogus"], ["check", "--fail-on", "sometimes", "."],
                                  ["targets", "--json", "extra"]])
def test_bad_flags_exit_2_with_usage(argv):
    done = run_cli(*argv)
    assert done.returncode == 2 and "usage: torch-adapter" in done.stderr
    _no_traceback(done)


def test_the_check_entry_point_shares_the_error_path(tmp_path):
    (tmp_path / "a.py").write_text("import torch\n")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "torch_adapter.check", str(tmp_path)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=240)
    assert done.returncode == 2 and "cannot write to standard output" in done.stderr
    _no_traceback(done)


def test_a_profile_that_is_not_a_file_is_a_message(tmp_path):
    fifo = tmp_path / "Npu.toml"
    os.mkfifo(fifo)
    (tmp_path / "npu.toml").write_text('name = "lower"\n')  # must not be read instead
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    done = run_cli("run", "--target", str(fifo), "--simulate", str(script), timeout=120)
    assert done.returncode == 2 and "ran" not in done.stdout
    assert f"capability profile '{fifo}'" in done.stderr and "FIFO" in done.stderr, done.stderr
    _no_traceback(done)
