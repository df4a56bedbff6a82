"""Finding and reading the files to check, robustly.

:func:`discover` walks a directory (or takes one file) and returns the files ``check``
reads plus :class:`Note` records for what it could not: unreadable directories, broken
symlinks, symlink loops, files that are not regular files, files over the size limit.
:func:`read_text` reads one file and decodes it (PEP 263 coding cookies for Python;
undecodable bytes replaced, with a note; binary files skipped with a note). Nothing is
written, nothing is executed.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path

from .limits import DEFAULT_MAX_SIZE
from .model import Note
from .textscan import language_of

__all__ = ["Source", "discover", "read_text", "DEFAULT_EXCLUDES", "DEFAULT_MAX_SIZE"]

DEFAULT_EXCLUDES = ("__pycache__", "node_modules", "site-packages", "dist-packages", ".*")
_BINARY_PROBE = 8192


@dataclass(frozen=True)
class Source:
    """A file to check: where it is, its name in the report, how to read it."""

    path: str  # absolute, as found (symlinks not resolved)
    rel: str  # POSIX path relative to the scanned root
    language: str
    size: int


def _excluded(name: str, rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(rel, p) for p in patterns)


def discover(root: Path, *, excludes: tuple[str, ...] = DEFAULT_EXCLUDES,
             max_size: int = DEFAULT_MAX_SIZE) -> tuple[list[Source], list[Note]]:
    """The files under ``root`` (a directory or a single file) and notes on what was skipped.

    ``root`` must exist (the caller checks). Directory symlinks are followed once; a link
    back to a directory on the current path is a ``symlink-loop`` note, a second way to an
    already scanned directory a ``symlink-duplicate`` note.
    """
    notes: list[Note] = []
    sources: list[Source] = []
    if not root.is_dir():
        lang = language_of(root.name)
        if lang is None:
            notes.append(Note(root.name, "unknown-kind",
                              "not a file kind check reads (.py, .ipynb, .cu/.cpp/.h, shell, "
                              "requirements or config files)"))
            return sources, notes
        _add_file(str(root), root.name, lang, notes, sources, max_size)
        return sources, notes
    try:
        st = os.stat(root)
    except OSError as exc:
        return sources, [Note(".", "unreadable", f"cannot read the directory: {exc.strerror or exc}")]
    seen = {(st.st_dev, st.st_ino): ""}
    # stack of (directory path, relative path, real paths of the directories above it)
    stack: list[tuple[str, str, tuple[str, ...]]] = [(str(root), "", (os.path.realpath(root),))]
    while stack:
        dirpath, drel, ancestors = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                # real folders before symlinks to them, so a folder is reported under its own name
                entries = sorted(it, key=lambda e: (e.is_symlink(), e.name))
        except OSError as exc:
            notes.append(Note(drel or ".", "unreadable", f"cannot list the directory: {exc.strerror or exc}"))
            continue
        subdirs = []
        for entry in entries:
            rel = f"{drel}/{entry.name}" if drel else entry.name
            try:
                is_link = entry.is_symlink()
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError as exc:
                notes.append(Note(rel, "unreadable", f"cannot stat: {exc.strerror or exc}"))
                continue
            if is_dir:
                if _excluded(entry.name, rel, excludes):
                    continue
                try:
                    dst = os.stat(entry.path)
                except OSError as exc:
                    notes.append(Note(rel, "unreadable", f"cannot stat the directory: {exc.strerror or exc}"))
                    continue
                key = (dst.st_dev, dst.st_ino)
                real = os.path.realpath(entry.path)
                if key in seen:
                    if is_link and (real in ancestors):
                        notes.append(Note(rel, "symlink-loop",
                                          f"symlink to {real}, a directory above it: not followed"))
                    else:
                        notes.append(Note(rel, "symlink-duplicate",
                                          f"already scanned as {seen[key] or '.'}: not scanned twice"))
                    continue
                seen[key] = rel
                subdirs.append((entry.path, rel, ancestors + (real,)))
                continue
            lang = language_of(entry.name)
            if lang is None or _excluded(entry.name, rel, excludes):
                continue
            if is_link and not os.path.exists(entry.path):
                notes.append(Note(rel, "broken-symlink", f"symlink to {os.readlink(entry.path)!r}, which does not exist"))
                continue
            _add_file(entry.path, rel, lang, notes, sources, max_size)
        stack.extend(reversed(subdirs))
    return sources, notes


def _add_file(path: str, rel: str, lang: str, notes: list[Note], sources: list[Source], max_size: int) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        notes.append(Note(rel, "unreadable", f"cannot stat: {exc.strerror or exc}"))
        return
    if not stat.S_ISREG(st.st_mode):
        notes.append(Note(rel, "not-regular", "not a regular file (a FIFO, socket or device): not read"))
        return
    if st.st_size > max_size:
        notes.append(Note(rel, "too-large", f"{st.st_size / 1e6:.1f} MB, over the {max_size / 1e6:.1f} MB "
                                            "limit (--max-file-size): not scanned"))
        return
    sources.append(Source(path, rel, lang, st.st_size))


def read_text(src: Source, max_size: int = DEFAULT_MAX_SIZE) -> tuple[str | None, list[Note]]:
    """The decoded text of ``src`` (None when it cannot be used) and notes."""
    try:
        with open(src.path, "rb") as fh:
            data = fh.read(max_size + 1)
    except OSError as exc:
        return None, [Note(src.rel, "unreadable", f"cannot read: {exc.strerror or exc}")]
    if len(data) > max_size:
        return None, [Note(src.rel, "too-large", f"over the {max_size / 1e6:.1f} MB limit: not scanned")]
    if b"\x00" in data[:_BINARY_PROBE] or (src.language != "notebook" and b"\x00" in data):
        return None, [Note(src.rel, "binary", "contains NUL bytes (a binary file): not scanned")]
    try:
        return data.decode("utf-8-sig"), []
    except UnicodeDecodeError as exc:
        first_error = exc
    if src.language == "python":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
            if encoding not in ("utf-8", "utf-8-sig"):
                return data.decode(encoding), []
        except (SyntaxError, LookupError, UnicodeDecodeError):
            pass
    return data.decode("utf-8", errors="replace"), [Note(
        src.rel, "undecodable",
        f"not valid UTF-8 (byte {first_error.start}): scanned with undecodable bytes replaced")]
