"""``torch-adapter memory --pid PID``: the memory of a live adapted process.

The process must serve its figures — ``install(memory_server=True)``, or
``TORCH_ADAPTER_MEMORY_SERVER=1`` in its environment (``torch-adapter run`` included) — and
belong to the same user (see :mod:`torch_adapter.tools.memory_server`). ``--list`` shows this
user's serving processes. Exit codes: 0 printed; 2 a PID that is gone, not adapted, not
ours, or did not answer (a five-part message on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from ..errors import UsageError, format_error

__all__ = ["register", "run", "fetch"]


def register(sub: Any) -> None:
    p = sub.add_parser("memory", help="memory of a live adapted process: per device, and its largest tensors",
                       description=__doc__.split("\n\n")[0] + " Start the process with TORCH_ADAPTER_MEMORY_SERVER=1 "
                                   "or install(memory_server=True).")
    p.add_argument("--pid", type=int, help="the process to read")
    p.add_argument("--list", action="store_true", help="list this user's processes that serve memory figures")
    p.add_argument("--top", type=int, default=10, help="largest live tensors to show (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the JSON reply (schema torch-adapter.memory)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer (default: %(default)s)")
    p.set_defaults(func=run)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            text = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= 80 else text[:77] + "..."


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _call(pid: int) -> str:
    return f"torch-adapter memory --pid {pid}"


def _hint() -> str:
    return ("start it with TORCH_ADAPTER_MEMORY_SERVER=1 (e.g. TORCH_ADAPTER_MEMORY_SERVER=1 torch-adapter run "
            "train.py) or torch_adapter.install(memory_server=True); `torch-adapter memory --list` shows those serving")


def fetch(pid: int, *, top: int = 10, timeout: float = 10.0) -> dict[str, Any]:
    """The MemoryReport dict that process ``pid`` serves; UsageError saying why not."""
    from ..tools import memory_server as ms

    call = _call(pid)
    if pid <= 0:
        raise UsageError(format_error(call, "a process id > 0", repr(pid), fix="e.g. --pid 12345 (see `ps`)"))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise UsageError(format_error(call, "the id of a running process", f"{pid}, which no process has",
                                      why="the process has exited, or the number is mistyped",
                                      fix="find it with `ps` or `torch-adapter memory --list`")) from None
    except PermissionError:
        pass  # exists, but another user's: said below
    owner = _owner(pid)
    if owner is not None and owner != os.getuid():
        raise UsageError(format_error(
            call, f"a process of this user (uid {os.getuid()})",
            f"process {pid} ({_cmdline(pid) or '?'}), owned by uid {owner}",
            why="a process serves its memory figures only to its own user (a 0700 directory and peer checks)",
            fix=f"run the command as that user, e.g. `sudo -u '#{owner}' torch-adapter memory --pid {pid}`"))
    path = None
    for directory in ms.socket_dirs():
        candidate = ms.socket_path(pid, directory)
        if candidate.exists() and ms._check_dir(directory) is None:
            path = candidate
            break
    if path is None:
        raise UsageError(format_error(
            call, "a process adapted with its memory server on",
            f"process {pid} ({_cmdline(pid) or '?'}), which serves none (no {ms.socket_path(pid)})",
            why="only processes that installed torch_adapter with memory_server=True serve memory figures",
            fix=_hint()))
    try:
        reply = ms.request(path, {"request": "stats", "top": top}, timeout=timeout)
    except (OSError, ValueError) as exc:
        reason = "did not answer in time" if isinstance(exc, socket.timeout) else f"{type(exc).__name__}: {exc}"
        raise UsageError(format_error(
            call, "an answer from the process's memory server", f"none from {path} ({reason})",
            why="the socket is left from an earlier process with this id, or the process is stopped or busy "
                "holding the interpreter lock",
            fix=f"check the process is running (not stopped), retry with a longer --timeout; {_hint()}")) from None
    if "error" in reply:
        raise UsageError(format_error(call, "memory figures", f"an error from process {pid}: {reply['error']}",
                                      fix="run the command as the process's user"))
    return reply


def _list() -> int:
    from ..tools import memory_server as ms

    rows = []
    for directory in ms.socket_dirs():
        if not directory.is_dir() or ms._check_dir(directory) is not None:
            continue
        for sock in sorted(directory.glob("*.sock")):
            if sock.stem.isdigit():
                pid = int(sock.stem)
                alive = os.path.exists(f"/proc/{pid}") if os.path.isdir("/proc") else True
                rows.append(f"{pid:>8}  {'serving' if alive else 'stale  '}  {_cmdline(pid)}")
    print("\n".join(rows) if rows else "no process of this user serves memory figures")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "list", False):
        return _list()
    if args.pid is None:
        print(format_error("torch-adapter memory", "--pid PID (or --list)", "neither",
                           fix="torch-adapter memory --pid 12345"), file=sys.stderr)
        return 2
    try:
        data = fetch(args.pid, top=max(args.top, 0), timeout=args.timeout)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    from ..tools.memory import MemoryReport

    import shutil

    print(MemoryReport.from_dict(data).render(width=shutil.get_terminal_size((140, 24)).columns))  # the terminal's
    return 0
