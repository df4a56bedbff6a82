"""torch_adapter.memory: figures per device, the largest live tensors with their creation sites,
and `torch-adapter memory --pid` reading a real child process over its private socket."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.tools import memory_server as _memory_server, memory
from torch_adapter.cli.main import main as cli_main
from torch_adapter.errors import UsageError
from torch_adapter.cli.memory import fetch

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _tracking_off():
    yield
    memory.track(False)


def test_cpu_target_figures_are_the_ones_torch_cuda_reports():
    torch_adapter.install(target="cpu")
    report = memory.stats(top=0)
    (cpu,) = report.devices
    assert cpu["device"] == "cpu" and "mallinfo2" in cpu["source"]
    assert cpu["allocated"] > 0 and cpu["peak_allocated"] >= cpu["allocated"] > 0
    assert abs(cpu["reserved"] - torch.cuda.memory_reserved()) < 64 * MiB  # both the resident set, now
    assert cpu["peak_reserved"] >= cpu["reserved"] and report.largest == [] and report.target == "cpu"


def test_cpu_peak_counts_a_tensor_made_and_freed_after_the_reset():
    torch_adapter.install(target="cpu")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    x = torch.ones(256 * MiB // 4, device="cuda")  # 256 MiB, written: resident
    del x
    after = torch.cuda.memory_allocated()
    peak = torch.cuda.max_memory_allocated()
    assert peak - max(before, after) >= 250 * MiB, (before, after, peak)
    assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] >= peak  # a peak never goes down until reset
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() < peak - 200 * MiB  # the reset starts again from now


def test_cpu_peak_that_is_not_tracked_says_so(monkeypatch):
    """Where the kernel keeps no resettable high-water mark, the peak is refused, not faked."""
    from torch_adapter.errors import UnsupportedCudaFeature
    from torch_adapter.redirect import host_memory as hm

    torch_adapter.install(target="cpu")
    real_open = open

    def no_clear_refs(path, *a, **k):
        if path == "/proc/self/clear_refs":
            raise PermissionError(13, "Permission denied", path)  # as in sandboxes without it
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", no_clear_refs)
    torch.cuda.reset_peak_memory_stats()
    monkeypatch.undo()
    try:
        with pytest.raises(UnsupportedCudaFeature, match="(?s)max_memory_allocated.*not tracked|no resettable"):
            torch.cuda.max_memory_allocated()
        stats = torch.cuda.memory_stats()
        assert "allocated_bytes.all.peak" not in stats and "not tracked" in stats["torch_adapter.source"]
        assert memory.stats(top=0).devices[0]["peak_allocated"] is None
    finally:
        hm.reset_peak()
    assert hm.peak_tracked()


class Maker(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(512, 1024)  # MAKER-LINE: 2 MiB


def test_tracking_gives_largest_tensors_their_creation_site_and_module():
    memory.track(True)
    maker = Maker()
    kept = maker(torch.ones(1))
    report = memory.stats(top=50)
    mine = [t for t in report.largest if t["site"] and t["site"]["file"] == __file__]
    assert mine, report.largest
    entry = mine[0]
    line = next(i for i, text in enumerate(open(__file__), 1) if "MAKER-LINE" in text and "next(" not in text)
    assert (entry["bytes"], entry["shape"], entry["dtype"]) == (2 * MiB, [512, 1024], "float32")
    assert entry["module"] == "maker"
    assert entry["site"]["line"] == line and entry["op"] == "aten::new_zeros"
    assert report.tracking and "largest live tensors" in str(report) and "test_memory.py" in str(report)
    assert memory.MemoryReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    del kept


def test_without_tracking_tensors_are_listed_without_sites():
    big = torch.zeros(3 * MiB // 4)
    report = memory.stats(top=100)
    row = next(t for t in report.largest if t["bytes"] == 3 * MiB)
    assert row["site"] is None and not report.tracking and "memory.track(True)" in " ".join(str(report).split())
    del big


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda: memory.track("yes"), r"track\(enabled\): expected True or False, got 'yes' \(str\)"),
    (lambda: memory.track(True, min_bytes=-1), r"track\(min_bytes=...\): expected an int >= 0"),
    (lambda: memory.stats(top=-2), r"stats\(top=...\): expected an int >= 0, got -2"),
    (lambda: memory.MemoryReport.from_dict({"schema": "x"}), r"expected schema 'torch-adapter.memory' version 1"),
])
def test_bad_arguments_are_usage_errors(call, pattern):
    with pytest.raises(UsageError, match=pattern):
        call()


def test_install_memory_server_serves_this_process_until_uninstall():
    torch_adapter.install(target="cpu", memory_server=True)
    path = _memory_server.socket_path(os.getpid())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    reply = fetch(os.getpid(), top=0)
    assert reply["schema"] == "torch-adapter.memory" and reply["pid"] == os.getpid()
    torch_adapter.uninstall()
    assert not path.exists() and _memory_server.running() is None


def test_a_process_without_the_server_is_not_adapted():
    with pytest.raises(UsageError, match=r"(?s)--pid \d+: expected a process adapted with its memory server on, got "
                                         r"process \d+ \(.*\), which serves none.*Fix: start it with "
                                         r"TORCH_ADAPTER_MEMORY_SERVER=1"):
        fetch(os.getpid())


def test_another_users_process_is_not_ours():
    if os.getuid() == 0:
        proc = subprocess.Popen(["sleep", "60"], user=65534)
        pid, owner = proc.pid, 65534
    else:
        proc, pid, owner = None, 1, os.stat("/proc/1").st_uid
        if owner == os.getuid():
            pytest.skip("no process of another user to point at")
    try:
        with pytest.raises(UsageError, match=rf"(?s)expected a process of this user \(uid {os.getuid()}\), got "
                                             rf"process {pid} \(.*\), owned by uid {owner}.*Why: .*its own user.*"
                                             rf"Fix: run the command as that user"):
            fetch(pid)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


CHILD = textwrap.dedent("""
    import sys, torch, torch_adapter
    torch_adapter.install(target="cpu")
    torch_adapter.memory.track(True)

    def make_weights():
        return torch.zeros(1024, 1024)  # CHILD-LINE: 4 MiB

    weights = make_weights()
    print("ready", flush=True)
    sys.stdin.readline()
    torch_adapter.uninstall()
    print("closed", flush=True)
    sys.stdin.readline()
""")


def test_cli_reads_a_live_child_process(tmp_path, capsys, cli):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "TORCH_ADAPTER_MEMORY_SERVER": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    child = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        path = _memory_server.socket_path(child.pid)
        assert path.exists()
        assert cli_main(["memory", "--pid", str(child.pid), "--json", "--top", "3"]) == 0
        reply = json.loads(capsys.readouterr().out)
        assert reply["pid"] == child.pid and reply["devices"][0]["device"] == "cpu" and reply["tracking"]
        top = reply["largest"][0]
        line = CHILD.splitlines().index(next(x for x in CHILD.splitlines() if "CHILD-LINE" in x)) + 1
        assert (top["bytes"], top["site"]["file"], top["site"]["line"]) == (4 * MiB, str(script), line)
        assert cli_main(["memory", "--pid", str(child.pid)]) == 0
        text = capsys.readouterr().out
        assert f"pid {child.pid}" in text and "child.py" in text and "4.0 MiB" in text
        assert cli_main(["memory", "--list"]) == 0 and str(child.pid) in capsys.readouterr().out
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "closed"
        assert not path.exists()  # uninstall stopped the server
        assert cli_main(["memory", "--pid", str(child.pid)]) == 2
        assert "which serves none" in capsys.readouterr().err
    finally:
        child.kill()
        child.wait()
    gone = child.pid
    result = cli("memory", "--pid", str(gone))  # the real command, in a fresh interpreter
    assert result.returncode == 2
    assert f"expected the id of a running process, got {gone}, which no process has" in result.stderr
    assert "Fix: find it with `ps`" in result.stderr


def test_the_report_fits_a_notebook_output_beside_a_side_panel():
    torch_adapter.install()
    torch_adapter.memory.track(True)
    try:
        weight = torch.nn.Linear(256, 1024).cuda().weight
        report = torch_adapter.memory.stats(top=3)
    finally:
        torch_adapter.memory.track(False)
    text = str(report)
    assert max(len(line) for line in text.splitlines()) <= 88, text  # was ~140 (the source column)
    assert "mallinfo2" in text and "1.0 MiB" in text and tuple(weight.shape) == (1024, 256)
