"""The one safe writer and the bounded reader (torch_adapter.core.safe_io) that every command uses."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.core.safe_io import (READ_LIMIT, FileProblem, OutputError, atomic_writer, check_output, read_bounded, write_text)
from torch_adapter.errors import UsageError


def test_writes_a_new_file_with_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_text(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").read_text() == "{}"
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o640


def test_replacing_keeps_the_existing_mode(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    os.chmod(out, 0o604)
    write_text(out, "new")
    assert out.read_text() == "new" and stat.S_IMODE(os.stat(out).st_mode) == 0o604


@pytest.mark.parametrize("kind, pattern", [
    ("folder", "it is a folder"),
    ("fifo", "it is a FIFO"),
    ("socket", "it is a socket"),
    ("symlink", "it is a symbolic link"),
    ("device", "it is a character device"),
    ("missing folder", "the folder does not exist"),
    ("empty", "does not name a file"),
])
def test_refuses_what_is_not_a_regular_file(tmp_path, kind, pattern):
    path = tmp_path / "out.json"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    held = None
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(str(path))
    elif kind == "symlink":
        path.symlink_to(victim)
    elif kind == "device":
        path = "/dev/null"
    elif kind == "missing folder":
        path = tmp_path / "no" / "such" / "out.json"
    elif kind == "empty":
        path = ""
    before = os.lstat(path) if kind not in ("missing folder", "empty") else None
    try:
        with pytest.raises(OutputError, match=pattern) as info:
            write_text(path, "{}", call="torch-adapter test --output")
    finally:
        if held is not None:
            held.close()
    assert isinstance(info.value, UsageError)
    assert str(info.value).startswith("torch-adapter test --output: expected a new or regular file")
    assert "Fix:" in str(info.value)
    assert victim.read_text() == "precious"
    if before is not None:  # the thing at the path is the same thing, not replaced
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert not (tmp_path / "no").exists()  # folders are never created
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_check_output_validates_without_writing(tmp_path):
    assert check_output(tmp_path / "x.json", call="c") == tmp_path / "x.json"
    assert not (tmp_path / "x.json").exists()


def test_a_failure_while_writing_leaves_the_original_whole(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("original")
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_writer(out) as fh:
            fh.write(b"partial")
            raise RuntimeError("half way")
    assert out.read_text() == "original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


_TOO_BIG = textwrap.dedent("""
    import resource, signal, sys
    from torch_adapter.core.safe_io import OutputError, write_text
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the file system is "full" past 4 KiB
    try:
        write_text(sys.argv[1], "x" * 100000)
    except OutputError as exc:
        print(exc)
        sys.exit(2)
""")


def test_a_write_that_cannot_finish_leaves_the_original_whole(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("original")
    done = subprocess.run([sys.executable, "-c", _TOO_BIG, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "File too large" in done.stdout and "Fix:" in done.stdout
    assert out.read_text() == "original" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


_WRITER = textwrap.dedent("""
    import json, sys
    from torch_adapter.core.safe_io import write_text
    me, path = sys.argv[1], sys.argv[2]
    for i in range(40):
        write_text(path, json.dumps({"writer": me, "i": i, "pad": [me] * 20000}))
""")


def test_concurrent_writers_of_one_path_leave_one_complete_file(tmp_path):
    """Documented: the last rename wins and the file is always one writer's whole output."""
    out = tmp_path / "shared.json"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(n), str(out)], stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    doc = json.loads(out.read_text())
    assert doc["i"] == 39 and doc["pad"] == [doc["writer"]] * 20000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]


def test_run_report_json_per_rank_names(tmp_path):
    """Under torchrun each rank writes its own file when the name holds {rank}."""
    script = tmp_path / "s.py"
    script.write_text("import torch\nx = torch.ones(2).cuda() + 1\n")
    base = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    procs = [subprocess.Popen([sys.executable, "-m", "torch_adapter", "run", "--report-json",
                               str(tmp_path / "routing-{rank}.json"), str(script)],
                              env={**base, "RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    for r in (0, 1):
        doc = json.loads((tmp_path / f"routing-{r}.json").read_text())
        assert doc["redirects"], doc


def test_read_bounded_reads_exact_regular_files(tmp_path):
    (tmp_path / "Good.toml").write_bytes(b"a = 1\n")
    (tmp_path / "good.toml").write_bytes(b"b = 2\n")
    assert read_bounded(tmp_path / "Good.toml") == b"a = 1\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileProblem, match="FIFO"):
        read_bounded(fifo)  # returns at once: opened without blocking
    with pytest.raises(FileProblem, match="character device"):
        read_bounded("/dev/zero")
    with pytest.raises(FileProblem, match="folder"):
        read_bounded(tmp_path)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(FileProblem, match="at most 99"):
        read_bounded(big, limit=99)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(FileProblem, match="loop of symbolic links"):
        read_bounded(loop)
    assert READ_LIMIT >= 1 << 20
