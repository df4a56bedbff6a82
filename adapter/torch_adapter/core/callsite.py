"""The user's call site: the innermost frame that is the user's code.

Skipped: torch, torch_adapter, the standard library, IPython/ipykernel internals, and
synthetic ``<frozen ...>``/``<string>`` code. Notebook cells are user code: their
filenames are ``<ipython-input-N-...>`` (terminal IPython) or a file under the kernel's
temp folder (ipykernel), and both are kept. A site (:func:`user_site`) is the user's own
line — the script or cell, not an installed package — with the installed library's line it
went through beside it (``"library"``), and is shown as ``cell [N], line L``, an installed
package's file relative to site-packages, or a file under the working directory relative to it
(:func:`site_text`; a site keeps the file as Python names it, and :func:`relative_sites` gives a
report's JSON the same relative names). Only called when something is recorded for the first time
at a site, never per op; each file is classified once.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any

__all__ = ["user_frame", "user_site", "site_frames", "cell_of", "site_text", "short_path", "library_text", "user_call", "front",
           "running_as", "relative_sites"]

_SKIP: tuple[str, ...] | None = None


# the package's folder (this module sits one below it): frames inside it are the adapter's own
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _skip_dirs() -> tuple[str, ...]:
    global _SKIP
    if _SKIP is None:
        import importlib.util

        import torch

        dirs = [os.path.dirname(os.path.abspath(torch.__file__)),
                PACKAGE_DIR,
                sysconfig.get_paths()["stdlib"]]
        for name in ("IPython", "ipykernel", "traitlets", "comm"):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin:
                dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
        _SKIP = tuple(d + os.sep for d in dirs)
    return _SKIP


def _is_user(path: str) -> bool:
    if path.startswith("<"):
        return path.startswith("<ipython-input") or path.startswith("<adapter-")
    return not os.path.abspath(path).startswith(_skip_dirs())


def _frame(depth: int) -> Any:
    """``sys._getframe(depth)``, or the outermost frame when the stack is shallower."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        pass
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame.f_back is None:
            break
        frame = frame.f_back
    return frame


def user_frame(depth: int = 1) -> Any:
    """The innermost user frame above the caller (or the outermost frame if none is)."""
    frame = _frame(depth + 1)
    last = frame
    while frame is not None:
        if _is_user(frame.f_code.co_filename):
            return frame
        last = frame
        frame = frame.f_back
    return last


def _site_of(frame: Any) -> dict[str, Any]:
    site = {"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}
    cell = cell_of(site["file"])
    if cell is not None:
        site["cell"] = cell
    return site


def user_site(depth: int = 1, *, call: bool = False) -> dict[str, Any] | None:
    """``{"file", "line", "function"}`` of the user's own line above the caller (the script or
    notebook cell: see :func:`site_frames`), or None; a notebook cell's site also has
    ``"cell"``: its execution count (see :func:`cell_of`). When the call went through an
    installed library (transformers calling torch), ``"library"`` holds that library's line
    (``{"file", "line", "function"}``). ``call=True`` adds ``"call"``: the expression the user's
    line is running (``torch.pdist(emb)``, see :func:`user_call`), when the source says."""
    frame, library = site_frames(depth + 1)
    if library is None and _frame_kind(frame.f_code.co_filename) == "skip":  # no user or library frame
        return None
    site = _site_of(frame)
    if library is not None:
        site["library"] = {"file": library.f_code.co_filename, "line": library.f_lineno,
                           "function": library.f_code.co_name}
    if call:
        text = user_call(frame)
        if text:
            site["call"] = text
    return site


def user_call(frame: Any) -> str | None:
    """The source of the expression ``frame`` is executing — the call or operator the user
    wrote (``torch.pdist(emb)``, ``z / z.norm(dim=-1)``), from the code's positions table
    (Python 3.11+) and the line cache; None when either is missing or it spans lines badly."""
    import linecache

    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None or frame.f_lasti < 0:
        return None
    try:
        start, end, col, end_col = list(positions())[frame.f_lasti // 2]
    except (IndexError, ValueError):
        return None
    if start is None or end is None or col is None or end_col is None or end - start > 5:
        return None
    lines = [linecache.getline(frame.f_code.co_filename, n).encode() for n in range(start, end + 1)]
    if not all(lines):
        return None
    lines[-1] = lines[-1][:end_col]  # the offsets count UTF-8 bytes
    lines[0] = lines[0][col:]
    text = " ".join(line.decode(errors="replace").strip() for line in lines).strip()
    return text if 0 < len(text) <= 120 else (text[:117] + "..." if text else None)


_LIBS: tuple[str, ...] | None = None


def _library_dirs() -> tuple[str, ...]:
    """Where installed packages live (site-packages): code there is a library, not the user's."""
    global _LIBS
    if _LIBS is None:
        import site

        dirs = set(getattr(site, "getsitepackages", lambda: [])())
        dirs.add(site.getusersitepackages())
        paths = sysconfig.get_paths()
        dirs |= {paths["purelib"], paths["platlib"]}
        _LIBS = tuple(os.path.abspath(d) + os.sep for d in dirs if d)
    return _LIBS


_KINDS: dict[str, str] = {}  # absolute path or "<...>" name -> its kind (the folders above never change)


def _frame_kind(path: str) -> str:
    """"user", "library" (an installed package other than torch, torch_adapter, IPython...) or "skip".
    Remembered per file (a relative path, which depends on the working directory, is not)."""
    kind = _KINDS.get(path)
    if kind is None:
        kind = _classify(path)
        if path.startswith(("<", os.sep)) and len(_KINDS) < 65536:
            _KINDS[path] = kind
    return kind


def _classify(path: str) -> str:
    if path.startswith("<"):
        return "user" if _is_user(path) else "skip"
    full = os.path.abspath(path)
    if full.startswith(_library_dirs()):
        stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
        tools = tuple(d for d in _skip_dirs() if d != stdlib)
        return "skip" if full.startswith(tools) else "library"
    return "user" if _is_user(path) else "skip"


def frame_kind(path: str) -> str:
    """``user`` | ``library`` | ``skip`` (torch, the adapter, the standard library) for a code file."""
    return _KINDS.get(path) or _frame_kind(path)


def site_frames(depth: int = 1) -> tuple[Any, Any]:
    """``(site, library)`` above the caller: ``site`` is the innermost frame of the user's own
    code (the script or notebook cell, not an installed package); ``library`` is the innermost
    installed-package frame when the call came through one (transformers calling ``.to``), else
    None. With no user frame on the stack the library frame is the site (library None)."""
    frame = _frame(depth + 1)
    last, library, kinds = frame, None, _KINDS
    while frame is not None:  # per call that redirects: the lookups inlined (a dict hit per frame)
        path = frame.f_code.co_filename
        kind = kinds.get(path) or _frame_kind(path)
        if kind == "user":
            return frame, library
        if kind == "library" and library is None:
            library = frame
        last = frame
        frame = frame.f_back
    return (library, None) if library is not None else (last, None)


def cell_of(filename: str) -> int | None:
    """The execution count of the IPython cell compiled under ``filename`` (a kernel temp
    file or ``<ipython-input-...>``), or None: not a cell, or no IPython shell running.
    IPython's compiler keeps that map (``compile._filename_map``); IPython is never
    imported here."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = names.get(filename) if isinstance(names, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def short_path(path: str, short: bool = False) -> str:
    """A file as a reader wants it: an installed package's file relative to its site-packages
    (``transformers/models/clip/modeling_clip.py``); a file under the working directory relative
    to it (``models.py``, ``src/train.py``: see :func:`_under_cwd`); else the path. ``short``: a
    file that is not a package's by its base name."""
    full = os.path.abspath(path) if not path.startswith("<") else path
    for root in _library_dirs():
        if full.startswith(root):
            return full[len(root):]
    return os.path.basename(path) if short else (_under_cwd(path) or path)


def _under_cwd(path: str) -> str | None:
    """The absolute ``path`` relative to the working directory, when it names a file under it
    (symbolic links resolved when the plain paths do not say); None otherwise, and when the working
    directory is a file system's root (every path is under it: nothing is gained). A relative path
    is left as Python names it (the script run as ``train.py``)."""
    if not os.path.isabs(path):
        return None
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed
        return None
    if os.path.dirname(cwd) == cwd:
        return None
    full = os.path.abspath(path)
    if not full.startswith(cwd + os.sep):
        cwd, full = os.path.realpath(cwd), os.path.realpath(path)
        if not full.startswith(cwd + os.sep):
            return None
    return full[len(cwd) + 1:]


def relative_sites(data: Any) -> Any:
    """``data`` — a report's JSON document (``torch-adapter run --report-json``: the routing log, its
    redirects, its child processes') — with the file of every site in it (a dict with ``"file"`` and
    ``"line"``, the library line's too) that lies under the working directory named relative to it,
    as the script's own file already is (``train.py`` beside ``models.py``, not
    ``/tmp/.../models.py``); other files keep their full path. A new document; ``data`` is unchanged."""
    if isinstance(data, dict):
        out = {k: relative_sites(v) for k, v in data.items()}
        if isinstance(out.get("file"), str) and "line" in out:
            out["file"] = _under_cwd(out["file"]) or out["file"]
        return out
    if isinstance(data, list):
        return [relative_sites(v) for v in data]
    return data


def site_text(site: dict[str, Any] | None, short: bool = False, library: bool = True) -> str:
    """How a site is shown: ``"cell [11], line 6"`` for a notebook cell, else ``"file:line"``
    (an installed package's file relative to site-packages, a file under the working directory
    relative to it; ``short``: other files by base name); the library line the call went through
    follows the user's:
    ``"cell [11], line 6 via transformers/models/clip/modeling_clip.py:568"`` (``library=False``:
    the user's line alone; :func:`library_text` is the rest)."""
    if not site:
        return ""
    cell = site.get("cell")
    if cell is None and isinstance(site.get("file"), str):
        cell = cell_of(site["file"])
    if cell is not None:
        text = f"cell [{cell}], line {site.get('line')}"
    else:
        text = f"{short_path(str(site.get('file')), short)}:{site.get('line')}"
    via = library_text(site) if library else ""
    return f"{text} via {via}" if via else text


def library_text(site: dict[str, Any] | None) -> str:
    """The installed library's line a site's call went through (``transformers/.../x.py:568``), or ``""``."""
    library = site.get("library") if site else None
    if isinstance(library, dict) and isinstance(library.get("file"), str):
        return f"{short_path(library['file'])}:{library.get('line')}"
    return ""


# Where the user drives the adapter from, innermost last: "cli" while `torch-adapter run` runs a
# script (the runner), "notebook" while the Jupyter extension — and so its magics — is loaded
# (jupyter/user_view.py); nothing: plain Python.
front: list[str] = []


def running_as() -> str:
    """``"notebook"``, ``"cli"`` or ``"python"``: where the user is, so that a fix can be worded
    for it (:func:`torch_adapter.errors.setting`)."""
    return front[-1] if front else "python"
