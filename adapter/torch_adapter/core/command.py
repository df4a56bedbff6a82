"""The one error path of every command — ``torch-adapter …``, ``python -m torch_adapter.check``,
``python -m torch_adapter.coverage``: a torch_adapter error (bad input, an output that cannot be
written), a closed or full standard output and a broken pipe all end as one message on stderr
and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Any

__all__ = ["EXIT_USAGE", "guarded"]

EXIT_USAGE = 2
_OUTPUT_ERRNOS = (errno.EPIPE, errno.ENOSPC, errno.EBADF, errno.EIO, errno.EFBIG)


def _say(message: str) -> None:
    try:
        print(message if message.startswith("torch-adapter") else f"torch-adapter: {message}", file=sys.stderr)
    except (OSError, ValueError, AttributeError):  # stderr closed too: the exit code is all that is left
        pass


def _stdout_failed(exc: OSError) -> int:
    """Standard output was closed, is full, or its reader went away: say so once, exit 2."""
    why = "its reader closed the pipe" if isinstance(exc, BrokenPipeError) else (exc.strerror or str(exc))
    _say(f"torch-adapter: cannot write to standard output ({why}).\n"
         f"Fix: write to a file or a pipe that reads everything (e.g. `| less`), or use --output/--json FILE")
    try:  # Python flushes stdout again at exit; point it at /dev/null so that this stays the only message
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_USAGE


def guarded(func: Any, args: argparse.Namespace) -> int:
    """``func(args)`` through the one error path; its exit code (used by every entry point)."""
    from ..errors import AdapterError

    command = getattr(args, "command", None) or "command"
    if sys.stdout is None and command != "run":
        _say(f"torch-adapter {command}: standard output is closed.\n"
             f"Fix: run it with an open standard output (e.g. `> out.txt` rather than `>&-`)")
        return EXIT_USAGE
    try:
        code = int(func(args) or 0)
        if sys.stdout is not None:
            sys.stdout.flush()
    except AdapterError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        # a failed write to stdout has no file name; an error about a named file is not ours to hide
        if (exc.errno in _OUTPUT_ERRNOS or isinstance(exc, BrokenPipeError)) and exc.filename is None:
            return _stdout_failed(exc)
        raise
    return code
