"""`torch-adapter check` probed with real processes: `--run-timeout` stops the command and every
process it started (exit 124), a command that ends in time still passes, and a symlink loop is
named as one -- given as `--path`, or met inside the scanned tree. No mocks: each test runs
`python -m torch_adapter check` in a fresh interpreter (conftest.run_cli)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and symlinks are POSIX here")

# The script `check --run` runs: it starts a child process (the same process group, holding the
# stderr pipe check reads; its stdout to /dev/null, or run_cli would wait on check's stdout for it),
# writes both pids to pids.txt, and then sleeps (or ends at once with --leave).
SLEEPER = textwrap.dedent("""\
    import os, subprocess, sys, time
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    with open("pids.txt", "w") as fh:
        fh.write(f"{os.getpid()} {kid.pid}\\n")
    if "--leave" not in sys.argv:
        time.sleep(60)
""")


@pytest.fixture
def proj(tmp_path):
    p = tmp_path / "proj"
    p.mkdir()
    (p / "tiny.py").write_text("import torch\nx = torch.zeros(3)\n")
    (p / "sleeper.py").write_text(SLEEPER)
    (p / "quick.py").write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    yield p
    for pid in _pids(p):  # never leave a sleeper behind, whatever the code under test did
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _pids(proj: Path) -> list[int]:
    f = proj / "pids.txt"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def _gone(pid: int, within: float = 10.0) -> bool:
    """True once ``pid`` has ended: no such process, or a zombie its new parent has not reaped yet."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return True
        except (OSError, IndexError):
            return True  # gone between the two looks
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def test_run_timeout_stops_the_command_and_exits_124(proj):
    t0 = time.monotonic()
    done = run_cli("check", "--path", str(proj), "--run", "python sleeper.py", "--run-timeout", "1", "-q",
                   cwd=proj, timeout=60)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, f"check took {elapsed:.1f} s with --run-timeout 1"
    assert done.returncode == 124, done.stderr
    err = done.stderr
    assert "--run-timeout 1 s" in err and "'python sleeper.py'" in err, err
    assert "still running after 1 s" in err and "Fix: raise the limit" in err, err
    assert all(_gone(pid) for pid in _pids(proj)), "a process of the timed-out command survived"


def test_run_timeout_kills_the_process_group_and_keeps_the_partial_report(proj, tmp_path):
    out = tmp_path / "report.json"
    t0 = time.monotonic()  # 10 s: time for `torch-adapter run` to import torch and start the script
    done = run_cli("check", "--path", str(proj), "--run", "python sleeper.py", "--run-timeout", "10", "-q",
                   "--output", str(out), cwd=proj, timeout=90)
    elapsed = time.monotonic() - t0
    assert done.returncode == 124, done.stderr
    assert elapsed < 40, f"check took {elapsed:.1f} s with --run-timeout 10"
    pids = _pids(proj)
    assert len(pids) == 2, f"the script never started within 10 s: {done.stderr[-2000:]}"
    survivors = [pid for pid in pids if not _gone(pid)]
    assert not survivors, f"processes {survivors} of the timed-out command (script, its child) survived"
    data = json.loads(out.read_text())  # the report is still written, with what ran until the stop
    notes = {n["kind"]: n["message"] for n in data["notes"]}
    assert "run-timeout" in notes and "10 s" in notes["run-timeout"], data["notes"]
    assert data["runtime"] is not None and data["runtime"]["exit_code"] is None
    assert "run-failed" not in notes and not any(f["rule_id"] == "RT002" for f in data["findings"])


def test_run_within_the_timeout_still_succeeds(proj, tmp_path):
    out = tmp_path / "report.json"
    done = run_cli("check", "--path", str(proj), "--run", "python quick.py", "--run-timeout", "120", "-q",
                   "--output", str(out), cwd=proj, timeout=180)
    assert done.returncode == 0, done.stderr
    rt = json.loads(out.read_text())["runtime"]
    assert rt["exit_code"] == 0 and sum(rt["summary"]["calls"].values()) > 0


def test_run_that_leaves_a_child_holding_stderr_returns_when_it_ends(proj):
    # the script ends at once; its child sleeps 60 s holding the stderr pipe: reading the pipe to
    # its end before waiting made check wait for that child too
    t0 = time.monotonic()
    done = run_cli("check", "--path", str(proj), "--run", "python sleeper.py --leave", "--run-timeout", "120",
                   "-q", cwd=proj, timeout=45)
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    assert elapsed < 30, f"check waited {elapsed:.1f} s for a child the command left behind"


def test_sigterm_to_check_stops_the_command_too(proj):
    # the command runs in its own session, so a SIGTERM (a CI job's timeout) or SIGHUP sent to check
    # no longer reaches it: check has to stop it on the way out
    import subprocess

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    check = subprocess.Popen([sys.executable, "-m", "torch_adapter", "check", "--path", str(proj), "--run",
                              "python sleeper.py", "-q"], cwd=proj, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_pids(proj)) < 2 and time.monotonic() < deadline and check.poll() is None:
            time.sleep(0.2)
        assert len(_pids(proj)) == 2, "the script never started"
        check.send_signal(signal.SIGTERM)
        _, err = check.communicate(timeout=30)
    finally:
        if check.poll() is None:
            check.kill()
            check.wait()
    assert check.returncode == 128 + signal.SIGTERM, err
    survivors = [pid for pid in _pids(proj) if not _gone(pid)]
    assert not survivors, f"processes {survivors} of the command outlived check's SIGTERM"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_run_timeout_must_be_positive(proj, value):
    done = run_cli("check", "--path", str(proj), "--run", "python sleeper.py", "--run-timeout", value, "-q",
                   cwd=proj, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--run-timeout S with S > 0" in done.stderr, done.stderr
    assert not (proj / "pids.txt").exists(), "the command ran despite the bad --run-timeout"


def test_path_symlink_loop_is_named(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    done = run_cli("check", "--path", "loop", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert "does not exist" not in err, err
    assert "a loop of symbolic links: 'loop' -> 'loop' resolves to itself" in err, err
    assert "Fix: point the link at the folder or file to check" in err, err


def test_path_two_link_loop_and_loop_in_the_path(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    done = run_cli("check", "--path", "a", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "'a' -> 'b' -> 'a' resolves to itself" in done.stderr, done.stderr
    done = run_cli("check", "--path", "a/inner.py", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "(at 'a', a part of its path)" in done.stderr, done.stderr


def test_symlink_loop_inside_the_tree_is_a_note(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "gpu.py").write_text("x = t.cuda()\n")
    (tree / "self.py").symlink_to("self.py")
    (tree / "sub" / "again").symlink_to("again")
    (tree / "sub" / "up").symlink_to("..", target_is_directory=True)
    out = tmp_path / "report.json"
    done = run_cli("check", "--path", str(tree), "-q", "--output", str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert {f["file"] for f in data["findings"]} == {"gpu.py"}
    notes = {n["file"]: n for n in data["notes"]}
    assert {"self.py", "sub/again", "sub/up"} <= set(notes), data["notes"]
    assert notes["sub/up"]["kind"] == "symlink-loop"
    for name in ("self.py", "sub/again"):
        assert "symbolic links" in notes[name]["message"], notes[name]
