"""The redirect log: what was redirected, where in the user's code, and what it became.

One row per (call site, what was asked): ``file:line``, the request (``Tensor.cuda()``,
``device='cuda:1'``, ``init_process_group('nccl')``), what it became (``cpu``, ``gloo``),
and how often. The site is the line in the user's own code (script or notebook); when the
request came from inside an installed library (transformers calling ``.to("cuda")``), the
library's line is kept beside it (``library``). Finding the call site walks the stack only
when a redirection really happens; a row is created once per distinct site and counted
afterwards. JSON schema ``torch-adapter.redirect-log`` version 2 (docs/redirect.md).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from ..core.callsite import site_frames
from ..core.codes import redirect_class, redirect_code

from torch.compiler import is_compiling as _compiling  # dynamo folds it to a constant while tracing

__all__ = ["RedirectLog", "RedirectEntry", "redirect_log"]


@dataclass
class RedirectEntry:
    file: str
    line: int
    function: str
    kind: str  # device | namespace | amp | distributed | env | dataloader | ...
    asked: str
    became: str
    count: int = 1
    library: dict[str, Any] | None = None  # {"file", "line", "function"} of the library frame

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def code(self) -> str:
        """The rewrite's stable code (``TA-X001``: core/codes.py, docs/reasons.md)."""
        return redirect_code(self.kind, self.asked, self.became)

    @property
    def cls(self) -> str:
        """``same`` | ``changed`` | ``dummy``: what the rewrite does to the call (the code's class)."""
        return redirect_class(self.code)

    @property
    def library_site(self) -> str | None:
        return f"{self.library['file']}:{self.library['line']}" if self.library else None

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "kind": self.kind,
                "asked": self.asked, "became": self.became, "count": self.count, "library": self.library,
                "code": self.code, "class": self.cls, "source": source_line(self.file, self.line)}


class RedirectLog:
    """Rows of redirections, first occurrence of each (site, request), with counts."""

    def __init__(self) -> None:
        self._rows: dict[tuple[Any, ...], RedirectEntry] = {}
        self._lock = threading.Lock()
        self.enabled = True
        # (id(code), instruction, asked) -> (code, its row or None: not the user's call): calls counted per
        # site at a dict lookup (the torch.cuda functions: redirect/cuda_ns.py)
        self.calls: dict[tuple[int, int, str], tuple[Any, RedirectEntry | None]] = {}

    def record(self, kind: str, asked: str, became: str, depth: int = 3) -> None:
        # Inside compiled code (dynamo tracing) the redirection happens once, at trace time, and
        # frame inspection cannot be traced (a graph break per call): not logged there.
        if not self.enabled or _compiling():
            return
        try:
            frame, lib = site_frames(depth - 1)  # depth counts from record()'s caller
            self._count(frame, kind, asked, became, lib)
        except Exception:  # the log must never break user code
            return

    def _count(self, frame: Any, kind: str, asked: str, became: str, lib: Any = None) -> RedirectEntry:
        """One more call of ``asked`` at ``frame``'s line (through library frame ``lib``): its row."""
        code = frame.f_code
        lib_at = (lib.f_code.co_filename, lib.f_lineno) if lib is not None else None
        key = (code.co_filename, frame.f_lineno, asked, lib_at)
        with self._lock:  # threads redirect too: counts must not lose increments
            row = self._rows.get(key)
            if row is None:
                library = None if lib is None else {"file": lib_at[0], "line": lib_at[1], "function": lib.f_code.co_name}
                row = self._rows[key] = RedirectEntry(code.co_filename, frame.f_lineno, code.co_name, kind, asked,
                                                      became, 0, library)
            row.count += 1
        return row

    def note(self, kind: str, asked: str, became: str) -> None:
        """A redirection with no call site (environment variables, install-time choices)."""
        key = ("<install>", 0, asked, None)
        with self._lock:
            self._rows.setdefault(key, RedirectEntry("<install>", 0, "", kind, asked, became, 0)).count += 1

    def _snapshot(self) -> list[RedirectEntry]:
        with self._lock:  # other threads record meanwhile: never iterate the live dict
            return list(self._rows.values())

    def entries(self) -> list[RedirectEntry]:
        return sorted(self._snapshot(), key=lambda e: (e.file, e.line, e.asked))

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self.calls.clear()

    def first_call(self, kind: str, asked: str, became: str, frame: Any) -> RedirectEntry | None:
        """The row of a call made from ``frame`` (a function's direct caller), counted once; None where
        ``frame`` is not the user's own code (torch or a library asking for itself: not the program's
        call to port). :attr:`calls` keeps later calls from the same instruction at a dict lookup."""
        from ..core.callsite import frame_kind

        code = frame.f_code
        user = self.enabled and frame_kind(code.co_filename) == "user"
        row = self._count(frame, kind, asked, became) if user else None
        self.calls[(id(code), frame.f_lasti, asked)] = (code, row)
        return row

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self._snapshot():
            out[e.kind] = out.get(e.kind, 0) + e.count
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema": "torch-adapter.redirect-log", "version": 2,
                "entries": [e.as_dict() for e in self.entries()]}

    def render(self, title: str = "torch_adapter: redirected") -> Any:
        """A rich Table (print it with rich.console.Console().print)."""
        from rich.table import Table

        table = Table(title=title, show_lines=False)
        for col in ("site", "asked", "became", "class", "code", "count"):
            table.add_column(col, overflow="fold", justify="right" if col == "count" else "left")
        from ..core.callsite import cell_of

        for e in self.entries():
            cell = cell_of(e.file)  # a notebook cell by its number, never the kernel's temp file
            site = (f"cell [{cell}], line {e.line}" if cell is not None
                    else _short(e.site) if e.file != "<install>" else "(install)")
            if e.library_site:
                site += f" (via {_short_library(e.library['file'])}:{e.library['line']})"
            table.add_row(site, e.asked, e.became, e.cls, e.code, str(e.count))
        return table

    def __rich__(self) -> Any:
        return self.render()


def source_line(file: str, line: int) -> str | None:
    """The user's source line of a row (stripped), read when the log is written, never while recording;
    a notebook cell's from IPython's cache of its source."""
    if not file or file.startswith("<install>") or line <= 0:
        return None
    import linecache

    text = linecache.getline(file, line)
    return text.strip() or None


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _short_library(path: str) -> str:
    """``transformers/modeling_utils.py`` for a file under site-packages."""
    from ..core.callsite import _library_dirs

    for root in _library_dirs():
        if path.startswith(root):
            return path[len(root):]
    return _short(path)


_last_log: list[RedirectLog] = []


def redirect_log() -> RedirectLog:
    """The installed session's redirect log (or the last session's, after uninstall)."""
    from ..core.state import current

    session = current()
    if session is not None:
        return session.redirect_log
    if _last_log:
        return _last_log[-1]
    return RedirectLog()


def remember(log: RedirectLog) -> None:
    _last_log[:] = [log]
