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
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "socket_dirs", "socket_path", "MemoryServer", "start", "running", "request", "env_enabled"]

ENV_VAR = "TORCH_ADAPTER_MEMORY_SERVER"
_MAX_REQUEST = 65536
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
            with conn:
                try:
                    self._answer(conn)
                except Exception as exc:  # never take the process down; say what happened
                    print(f"torch_adapter memory server (pid {self.pid}): a request failed: "
                          f"{type(exc).__name__}: {exc}", file=sys.stderr)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        uid = _peer_uid(conn)
        if uid is not None and uid != os.getuid():
            _send(conn, {"error": f"uid {uid} may not read this process (uid {os.getuid()})"})
            return
        data = b""
        while not data.endswith(b"\n") and len(data) < _MAX_REQUEST:
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

        _send(conn, stats(top=max(0, min(top, 1000))).to_dict())
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
        if os.getpid() == self.pid:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _forget_in_child(self) -> None:
        """After fork: the child does not serve, and must not remove the parent's socket."""
        self._stop.set()
        self._sock.close()


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
