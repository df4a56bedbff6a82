"""The memory server (_memory_server.py): concurrent clients, quiet disconnects, the socket's
life across exits and signals, and the server-side same-user check (peer credentials)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.tools import memory_server as ms
from torch_adapter.cli.main import main as cli_main


@pytest.fixture
def server():
    stop = ms.start()
    yield ms.running()
    stop()


def _connect(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(path))
    return sock


def test_an_idle_client_does_not_block_the_others(server):
    idle = _connect(server.path)  # connects and says nothing
    try:
        reply = ms.request(server.path, {"request": "stats", "top": 0}, timeout=30)
        assert reply["pid"] == os.getpid()
        idle.setblocking(False)
        with pytest.raises(BlockingIOError):  # still open and unanswered: it was served beside the other
            idle.recv(1)
    finally:
        idle.close()


def test_a_slow_client_is_cut_off_at_its_deadline(server, monkeypatch):
    monkeypatch.setattr(ms, "_CLIENT_TIMEOUT", 0.5)
    slow = _connect(server.path)
    try:
        slow.sendall(b'{"request": ')  # never finishes its line
        assert slow.recv(1) == b""  # the server closed it without an answer
    finally:
        slow.close()
    assert ms.request(server.path, {"top": 0})["pid"] == os.getpid()


def test_a_client_that_leaves_early_is_forgotten_quietly(server, capfd):
    for _ in range(5):
        sock = _connect(server.path)
        sock.sendall(json.dumps({"request": "stats", "top": 1000}).encode() + b"\n")
        sock.close()  # gone before the reply: the server's write fails with EPIPE
    assert ms.request(server.path, {"top": 0})["pid"] == os.getpid()
    err = capfd.readouterr().err
    assert "BrokenPipe" not in err and "request failed" not in err


def test_another_uid_is_refused_by_the_server(server):
    """A client with another effective uid (peer credentials) gets an error, not figures.

    The child keeps root's file-system uid (setfsuid) so that it can reach the 0700 folder:
    only the server-side SO_PEERCRED check stands between it and the figures."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid (CI runs as root)")
    libc = ctypes.CDLL(None, use_errno=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: euid nobody, fsuid root
        try:
            os.close(read_end)
            os.setresuid(65534, 65534, 0)
            libc.setfsuid(0)
            reply = ms.request(server.path, {"request": "stats", "top": 0}, timeout=20)
            os.write(write_end, json.dumps(reply).encode())
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            os.write(write_end, json.dumps({"child_failed": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    reply = json.loads(data)
    assert reply == {"error": f"uid 65534 may not read this process (uid {os.getuid()})"}


_SERVED = textwrap.dedent("""
    import sys, time, torch_adapter
    from torch_adapter.tools import memory_server as ms
    torch_adapter.install(target="cpu", memory_server=True)
    print(ms.running().path, flush=True)
    time.sleep(120)
""")


def _served_child():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    child = subprocess.Popen([sys.executable, "-c", _SERVED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    path = child.stdout.readline().strip()
    assert path and os.path.exists(path), child.stderr.read()
    return child, path


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, None)])
def test_the_socket_is_removed_when_a_signal_ends_the_process(sig, code):
    child, path = _served_child()
    try:
        child.send_signal(sig)
        child.wait(timeout=60)
    finally:
        child.kill()
        child.wait()
    if code is not None:
        assert child.returncode == code  # the signal still ends the process as it would have
    assert not os.path.exists(path)


def test_after_sigkill_list_marks_the_socket_stale(capsys):
    child, path = _served_child()
    child.kill()
    child.wait()
    try:
        assert os.path.exists(path)  # nothing can run on SIGKILL
        assert cli_main(["memory", "--list"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[0] == str(child.pid))
        assert "stale" in row
    finally:
        os.unlink(path)


def test_the_programs_own_sigterm_handler_is_kept():
    script = textwrap.dedent("""
        import signal, sys, torch_adapter
        from torch_adapter.tools import memory_server as ms
        mine = lambda s, f: sys.exit(3)
        signal.signal(signal.SIGTERM, mine)
        torch_adapter.install(target="cpu", memory_server=True)
        assert signal.getsignal(signal.SIGTERM) is mine
        torch_adapter.uninstall()
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        torch_adapter.install(target="cpu", memory_server=True)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        torch_adapter.uninstall()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back as it was
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip() == "ok", done.stderr
