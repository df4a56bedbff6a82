"""One safe writer and one bounded reader for every file torch_adapter's tools touch.

**Writing** (``run --report-json``, ``check --output``, ``coverage --json/--html/--markdown``,
``export --output``, ``profiler`` exports): :func:`check_output` validates a path *before*
any work starts; :func:`write_text` / :func:`write_bytes` / :func:`atomic_writer` then

- create a temporary file with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and a random name in the
  target's own folder (a name planted in advance, or a symbolic link, cannot be followed);
- keep the mode of the file being replaced (else the umask decides, as for any new file);
- ``fsync`` it and rename it over the target (``os.replace``: atomic on one file system),
  so the target is either the old file or the complete new one, never a torn one;
- remove the temporary file on any failure: the original stays as it was.

The policy, the same for every command: the folder must exist (it is never created: a
typo should not grow a tree of folders); the target must be absent or a regular file —
a folder, a device (``/dev/null``), a FIFO, a socket or a symbolic link is refused with a
message saying so. Concurrent writers of one path each write their own temporary file, and
the last rename wins: the file is always one writer's complete output. Writers that need
one file each (``torchrun`` ranks) put ``{rank}`` in the name (``runner.py``).

**Reading** (capability profiles, ``check --rules``): :func:`read_bounded` opens without
blocking (a FIFO cannot hang it), accepts regular files only and reads at most ``limit``
bytes (``/dev/zero`` cannot exhaust memory). Both raise :class:`FileProblem`, which callers
turn into their own error type (``ProfileError``, ``CheckError``, ``UsageError``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator

from ..errors import UsageError, format_error

__all__ = ["FileProblem", "OutputError", "check_output", "write_text", "write_bytes", "atomic_writer",
           "read_bounded", "describe_mode"]

READ_LIMIT = 8 * 1024 * 1024  # profiles and rule files are a few KiB


class FileProblem(Exception):
    """Why a path cannot be read or written (``why``) and what to do (``fix``)."""

    def __init__(self, path: str, why: str, fix: str) -> None:
        super().__init__(f"{path!r}: {why}")
        self.path, self.why, self.fix = path, why, fix


class OutputError(UsageError):
    """An output path a command cannot write (exit 2 on the command line)."""


def describe_mode(mode: int) -> str:
    """'a folder', 'a FIFO', ... for a non-regular ``st_mode``."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _problem(path: str | os.PathLike[str]) -> FileProblem | None:
    """Why ``path`` may not be written, or None."""
    text = os.fspath(path)
    if not text or text.endswith(os.sep):
        return FileProblem(text, "it does not name a file", "give a file name, e.g. report.json")
    target = Path(text).absolute()
    folder = target.parent
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return FileProblem(text, exc.strerror or str(exc), "choose another path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = describe_mode(st.st_mode)
        fix = (f"write to the file it points to ({os.path.realpath(target)}) or another name"
               if stat.S_ISLNK(st.st_mode) else "give the path of a regular file (it is replaced whole)")
        return FileProblem(text, f"it is {what}; only a regular file (or a new name) is written", fix)
    try:
        fst = os.stat(folder)
    except OSError as exc:
        why = "the folder does not exist" if exc.errno == errno.ENOENT else f"its folder: {exc.strerror}"
        return FileProblem(text, f"{why} ({folder})", f"create {folder} first (folders are never created)")
    if not stat.S_ISDIR(fst.st_mode):
        return FileProblem(text, f"{folder} is not a folder", "choose a path inside a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        return FileProblem(text, f"the folder {folder} is not writable", "choose a folder you can write to")
    return None


def check_output(path: str | os.PathLike[str], *, call: str) -> Path:
    """Validate an output path before any work starts; its absolute :class:`Path`.

    Raises :class:`OutputError` (a ``UsageError``) naming ``call``, the path and the reason.
    """
    problem = _problem(path)
    if problem is not None:
        raise _output_error(call, problem)
    return Path(os.fspath(path)).absolute()


def _output_error(call: str, problem: FileProblem) -> OutputError:
    return OutputError(format_error(call, "a new or regular file in an existing, writable folder",
                                    repr(problem.path), why=problem.why, fix=problem.fix))


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], *, call: str = "torch_adapter: writing a file") -> Iterator[IO[bytes]]:
    """``with atomic_writer(path) as fh: fh.write(b"...")`` — the target appears whole, or not at all."""
    target = check_output(path, call=call)
    try:
        existing = os.lstat(target)
    except FileNotFoundError:
        existing = None
    tmp = target.parent / f".{target.name[:200]}.{secrets.token_hex(8)}.tmp"  # (names are <= 255 bytes)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
    except OSError as exc:
        raise _output_error(call, FileProblem(os.fspath(path), f"cannot create a file in {target.parent}: "
                                              f"{exc.strerror}", "choose a folder you can write to")) from None
    try:
        if existing is not None:
            os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            if os.geteuid() == 0 and hasattr(os, "fchown"):
                with contextlib.suppress(OSError):
                    os.fchown(fd, existing.st_uid, existing.st_gid)
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        problem = _problem(target)  # replaced by something else while we wrote?
        if problem is not None:
            raise _output_error(call, problem)
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, call: str = "torch_adapter: writing a file") -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); the absolute path."""
    try:
        with atomic_writer(path, call=call) as fh:
            fh.write(data)
    except OSError as exc:
        raise _output_error(call, FileProblem(os.fspath(path), exc.strerror or str(exc),
                                              "free some space or choose another path")) from None
    return Path(os.fspath(path)).absolute()


def write_text(path: str | os.PathLike[str], text: str, *, call: str = "torch_adapter: writing a file") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; the absolute path."""
    return write_bytes(path, text.encode("utf-8"), call=call)


def read_bounded(path: str | os.PathLike[str], *, limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path`` (exactly as spelled), at most ``limit`` of them.

    Raises :class:`FileProblem` for a missing, unreadable or non-regular file (opened
    without blocking, so a FIFO is refused rather than waited on) or one over ``limit``.
    """
    text = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(text, flags)
    except OSError as exc:
        why = {errno.ENOENT: "no such file", errno.ELOOP: "a loop of symbolic links",
               errno.EACCES: "permission denied", errno.EISDIR: "it is a folder"}.get(exc.errno, exc.strerror)
        raise FileProblem(text, str(why), "check the path and its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(text, f"it is {describe_mode(st.st_mode)}, not a regular file",
                              "give the path of a regular file")
        if st.st_size > limit:
            raise FileProblem(text, f"it is {st.st_size} bytes; at most {limit} are read",
                              "give the right file (these files are a few KiB)")
        chunks, size = [], 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as exc:
                raise FileProblem(text, exc.strerror or str(exc), "check the file") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileProblem(text, f"it holds more than {limit} bytes", "give the right file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode_utf8(path: str, data: bytes) -> str:
    """``data`` as UTF-8 text, or :class:`FileProblem` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise FileProblem(path, f"it is not UTF-8 text (byte {exc.start}, line {line})",
                          "save it as UTF-8") from None
