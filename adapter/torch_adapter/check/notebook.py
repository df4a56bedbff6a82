"""Notebooks: code cells read with nbformat, IPython magics separated from Python, and
each cell line mapped to its line in the ``.ipynb`` file.

A finding in a notebook carries the cell index (from 0, over all cells), the line inside
the cell (from 1), and the line of the ``.ipynb`` file where that source line is stored --
the line an editor or ``grep -n`` shows. Shell escapes and line magics (``!nvidia-smi``,
``%env CUDA_VISIBLE_DEVICES=0``, ``%pip install flash-attn``) are matched as shell lines;
``%%bash`` cells as shell; ``%%writefile x.cu`` cells as the language of the file written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .textscan import language_of

__all__ = ["Cell", "CellParts", "read_cells", "split_cell"]

_SHELL_CELLS = {"bash", "sh", "script", "system", "!"}
_PY_CELLS = {"time", "timeit", "capture", "prun", "debug", "python", "python3", "pypy", "px",
             "memit", "lprun", "torch_adapter", "trace"}
_ASSIGN_MAGIC = re.compile(r"^\s*[\w.,\s]+=\s*[!%]")


@dataclass
class Cell:
    """One code cell: its index among all cells, its source, and the ``.ipynb`` line of
    each of its lines (1-based; the ``"source"`` key line when not found exactly)."""

    index: int
    source: str
    json_lines: list[int] = field(default_factory=list)

    def file_line(self, cell_line: int) -> int:
        if not self.json_lines:
            return cell_line
        return self.json_lines[min(max(cell_line, 1), len(self.json_lines)) - 1]


@dataclass
class CellParts:
    """A cell taken apart: Python (magic lines replaced by ``pass``, same numbering), shell
    lines ``(cell line, text)``, and an embedded file ``(language, text, suffix)`` whose
    first line is cell line 2 (``%%writefile``)."""

    python: str | None
    shell: list[tuple[int, str]] = field(default_factory=list)
    embedded: tuple[str, str, str] | None = None


def read_cells(text: str) -> tuple[list[Cell], list[str]]:
    """The code cells of a notebook and a list of problems. A notebook nbformat rejects
    but whose JSON has a ``cells`` list is still read (with a problem noted); text that is
    not a notebook at all raises ValueError."""
    problems: list[str] = []
    captured: dict = {}
    try:
        import nbformat
    except ImportError:  # nbformat is an optional dependency of the core package
        return _cells(_json_cells(text, "nbformat is not installed"), text), ["nbformat is not installed: "
                                                                              "cells read from the JSON"]
    try:
        nb = nbformat.reads(text, as_version=4, capture_validation_error=captured)
        raw_cells = [dict(c) for c in nb.get("cells", [])]
    except nbformat.ValidationError as exc:  # structurally broken for nbformat: read the JSON
        raw_cells = _json_cells(text, str(exc))
        problems.append(f"nbformat cannot read it ({str(exc).splitlines()[0]}): cells read from the JSON")
    if captured.get("ValidationError") is not None:
        err = captured["ValidationError"]
        problems.append(f"the notebook does not validate against nbformat's schema: "
                        f"{str(getattr(err, 'message', err)).splitlines()[0]}")
    return _cells(raw_cells, text), problems


def _json_cells(text: str, why: str) -> list[dict]:
    data = json.loads(text)  # ValueError when it is not JSON
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"no list of cells ({why})")
    return [c for c in data["cells"] if isinstance(c, dict)]


def _cells(raw_cells: list[dict], text: str) -> list[Cell]:
    sources = []
    for c in raw_cells:
        src = c.get("source", "")
        sources.append("".join(src) if isinstance(src, list) else str(src))
    mapping = _json_lines(text.split("\n"), sources)
    return [Cell(i, sources[i], mapping[i] if i < len(mapping) else [])
            for i, c in enumerate(raw_cells) if c.get("cell_type") == "code"]


def _json_lines(raw: list[str], sources: list[str]) -> list[list[int]]:
    """For each cell, the 1-based ``.ipynb`` line of each source line."""
    keys = [i for i, line in enumerate(raw) if line.lstrip().startswith('"source":')]
    out: list[list[int]] = []
    for k, src in zip(keys, sources):
        lines = src.split("\n")
        if raw[k].rstrip().endswith("["):  # one JSON string per line, as Jupyter writes it
            mapped = []
            for j, line in enumerate(lines):
                expected = line + ("\n" if j < len(lines) - 1 else "")
                idx = k + 1 + j
                try:
                    ok = idx < len(raw) and json.loads(raw[idx].strip().rstrip(",")) == expected
                except ValueError:
                    ok = False
                if not ok:
                    break
                mapped.append(idx + 1)
            out.append(mapped if len(mapped) == len(lines) else [k + 1] * len(lines))
        else:
            out.append([k + 1] * len(lines))
    if len(keys) != len(sources):  # unusual layout: keep what lined up, the rest unmapped
        out = out[:min(len(keys), len(sources))]
    return out


def split_cell(source: str) -> CellParts:
    """Separate Python from IPython syntax without changing line numbers."""
    lines = source.split("\n")
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        name, _, rest = first[2:].partition(" ")
        if name in _SHELL_CELLS:
            return CellParts(None, [(i + 1, line) for i, line in enumerate(lines) if i > 0])
        if name == "writefile":
            target = rest.split()[-1] if rest.split() else ""
            lang = language_of(PurePosixPath(target).name) or "config"
            body = "\n".join(lines[1:])
            if lang == "python":
                return CellParts("\n".join(["", *lines[1:]]))
            return CellParts(None, [], (lang, body, PurePosixPath(target).suffix))
        if name not in _PY_CELLS:
            return CellParts(None)  # %%html, %%javascript, ...: not Python
        lines = ["", *lines[1:]]
    shell: list[tuple[int, str]] = []
    py: list[str] = []
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(("!", "%")) or _ASSIGN_MAGIC.match(line):
            shell.append((i + 1, stripped.split("=", 1)[1].strip() if _ASSIGN_MAGIC.match(line) else stripped))
            py.append(indent + "pass")
        elif stripped.endswith("?") and not stripped.startswith("#"):
            py.append(indent + "pass")  # object? help syntax
        else:
            py.append(line)
    shell = [(n, t.lstrip("!%")) for n, t in shell]
    return CellParts("\n".join(py), shell)
