"""The memory server: an adapted process answers ``torch-adapter memory --pid PID``.

Started by ``install(memory_server=True)`` (or ``TORCH_ADAPTER_MEMORY_SERVER=1`` in the
environment) and stopped by ``uninstall()``. A daemon thread serves a Unix socket named
by the process id in a directory only its user can enter — ``$XDG_RUNTIME_DIR/torch-adapter``
when that exists and belongs to the user, else ``/tmp/torch-adapter-<uid>`` — created with
mode 0700 and refused if it is not exactly that (owned by another user, group/world
access, a symbolic link). The socket itself is 0600, and each connection's peer
credentials (``SO_PEERCRED``, Linux) must be the same user.

Protocol: one JSON line in (``{"request": "stats", "top": 10}``), one JSON line out (the
:class:`~torch_adapter.memory.MemoryReport` dict, or ``{"error": "..."}``), then close.
Nothing else is served; the thread wakes only for connections (and once a second to see
whether it should stop).

Clients are served concurrently (a thread each, at most :data:`_MAX_CLIENTS` at once; the
rest are told the server is busy): each has :data:`_CLIENT_TIMEOUT` seconds in all to send
its request and take the reply, so an idle or slow client delays no one else. A client that
goes away early is forgotten quietly (nothing is printed on the served program's stderr).

The socket is removed at normal exit (``atexit``), on ``SIGINT`` (Python's default handler
raises ``KeyboardInterrupt``, so ``atexit`` runs) and on ``SIGTERM`` when the program has no
handler of its own (the server installs one that removes the socket, then lets the signal
end the process as before). After ``SIGKILL`` nothing can run: ``torch-adapter memory
--list`` marks such sockets ``stale``.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "socket_dirs", "socket_path", "MemoryServer", "start", "running", "request", "env_enabled"]

ENV_VAR = "TORCH_ADAPTER_MEMORY_SERVER"
_MAX_REQUEST = 65536
_MAX_CLIENTS = 8  # served at once
_CLIENT_TIMEOUT = 5.0  # seconds a client has, in all, to send its request and read the reply
_LOCK = threading.Lock()
_SERVER: "MemoryServer | None" = None
_USERS = 0  # sessions using the server
_FORK_HOOKED = False


def env_enabled() -> bool:
    """Does the environment ask for the memory server (``TORCH_ADAPTER_MEMORY_SERVER=1``)?"""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no", "off")


def socket_dirs() -> list[Path]:
    """Where this user's servers put their sockets: the preferred one first."""
    dirs = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.stat(xdg).st_uid == os.getuid():
        dirs.append(Path(xdg) / "torch-adapter")
    dirs.append(Path("/tmp") / f"torch-adapter-{os.getuid()}")
    return dirs


def _check_dir(path: Path) -> str | None:
    """Why ``path`` is not a private directory of this user, or None when it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "it is not a directory (a symbolic link or a file)"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):o}, not 700"
    return None


def _private_dir() -> Path:
    last = ""
    for path in socket_dirs():
        try:
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            last = f"{path}: {exc.strerror}"
            continue
        why = _check_dir(path)
        if why is None and len(str(path)) < 90:  # Unix socket paths are limited to ~107 bytes
            return path
        last = f"{path}: {why or 'path too long for a socket'}"
    raise OSError(f"no private directory for the memory server socket ({last})")


def socket_path(pid: int, directory: Path | None = None) -> Path:
    return (directory or socket_dirs()[0]) / f"{pid}.sock"


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply, default=str).encode() + b"\n")


def _peer_uid(conn: socket.socket) -> int | None:
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class MemoryServer:
    """A listening socket and the daemon thread that answers on it."""

    def __init__(self) -> None:
        directory = _private_dir()
        self.pid = os.getpid()
        self.path = socket_path(self.pid, directory)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # left by an earlier process that had this pid
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._sock.listen(8)
        self._sock.settimeout(1.0)
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(_MAX_CLIENTS)
        self.served = 0
        self._thread = threading.Thread(target=self._serve, name=f"torch-adapter-memory-server-{self.pid}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed by stop()
            if not self._slots.acquire(blocking=False):
                self._reply_quietly(conn, {"error": f"busy: {_MAX_CLIENTS} clients are being served; retry"})
                continue
            threading.Thread(target=self._client, args=(conn,), daemon=True,
                             name=f"torch-adapter-memory-client-{self.pid}").start()

    def _client(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer(conn, time.monotonic() + _CLIENT_TIMEOUT)
        except (OSError, TimeoutError):
            pass  # the client went away or was too slow: its loss, nobody else's
        except Exception as exc:  # never take the process down; say what happened
            print(f"torch_adapter memory server (pid {self.pid}): a request failed: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            self._slots.release()

    @staticmethod
    def _reply_quietly(conn: socket.socket, reply: dict[str, Any]) -> None:
        with conn:
            try:
                conn.settimeout(0.5)
                _send(conn, reply)
            except OSError:
                pass

    def _answer(self, conn: socket.socket, deadline: float) -> None:
        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("client too slow")
            return remaining

        conn.settimeout(left())
        uid = _peer_uid(conn)
        if uid is not None and uid != os.getuid():
            _send(conn, {"error": f"uid {uid} may not read this process (uid {os.getuid()})"})
            return
        data = b""
        while not data.endswith(b"\n") and len(data) < _MAX_REQUEST:
            conn.settimeout(left())
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        try:
            req = json.loads(data or b"{}")
            top = int(req.get("top", 10))
        except (ValueError, TypeError, AttributeError) as exc:
            _send(conn, {"error": f"bad request: {exc}"})
            return
        if req.get("request", "stats") != "stats":
            _send(conn, {"error": f"unknown request {req.get('request')!r}; only 'stats'"})
            return
        from .memory import stats

        reply = stats(top=max(0, min(top, 1000))).to_dict()
        conn.settimeout(left())
        _send(conn, reply)
        self.served += 1

    def stop(self) -> None:
        """Stop serving and remove the socket (only the process that made it removes it)."""
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # a listening socket that is not connected: close() below is what counts
        self._sock.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self.remove_socket()

    def remove_socket(self) -> None:
        """Remove the socket file (only in the process that made it); safe to call twice."""
        if os.getpid() == self.pid:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _forget_in_child(self) -> None:
        """After fork: the child does not serve, and must not remove the parent's socket."""
        self._stop.set()
        self._sock.close()


_PREVIOUS_SIGTERM: Any = None


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM with no handler of the program's: remove the socket, then die of the signal as before."""
    server = _SERVER
    if server is not None:
        server.remove_socket()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _hook_sigterm() -> None:
    global _PREVIOUS_SIGTERM
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still covers normal exit
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            _PREVIOUS_SIGTERM = signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        pass


def _unhook_sigterm() -> None:
    global _PREVIOUS_SIGTERM
    if _PREVIOUS_SIGTERM is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # still ours: put the program's back
            signal.signal(signal.SIGTERM, _PREVIOUS_SIGTERM)
    except (ValueError, OSError):
        pass
    _PREVIOUS_SIGTERM = None


def _after_fork() -> None:
    global _SERVER, _USERS
    if _SERVER is not None:
        _SERVER._forget_in_child()
    _SERVER, _USERS = None, 0


def start() -> Any:
    """Start this process's server (shared by sessions); returns a ``stop()`` callable."""
    global _SERVER, _USERS, _FORK_HOOKED
    with _LOCK:
        if _SERVER is None:
            _SERVER = MemoryServer()
            atexit.register(_SERVER.stop)
            _hook_sigterm()
            if hasattr(os, "register_at_fork") and not _FORK_HOOKED:
                os.register_at_fork(after_in_child=_after_fork)
                _FORK_HOOKED = True
        _USERS += 1
        server = _SERVER
    stopped = False

    def stop() -> None:
        global _SERVER, _USERS
        nonlocal stopped
        with _LOCK:
            if stopped or _SERVER is not server:
                return
            stopped = True
            _USERS -= 1
            if _USERS > 0:
                return
            _SERVER = None
        atexit.unregister(server.stop)
        _unhook_sigterm()
        server.stop()

    return stop


def running() -> "MemoryServer | None":
    return _SERVER


def request(path: Path, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send one request to the server at ``path``; its JSON reply (OSError/ValueError on failure)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return json.loads(data)
