"""Line matching for files that are not parsed: C/C++/CUDA sources, shell scripts,
requirements and config files, notebook shell magics, and Python that does not parse.

Comments are removed before matching (``//`` and ``/* */`` in C-like sources, ``#`` in
shell/config/Python), so a comment that mentions CUDA is not a finding. Every regex rule
of the language is tried on every line; ``file`` rules report the whole file once.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from .matchutil import Hit
from .ruleset import RuleSet

__all__ = ["language_of", "scan_lines", "strip_comments", "C_LIKE", "HASH_COMMENTS"]

C_LIKE = ("cuda", "cxx")
HASH_COMMENTS = ("shell", "config", "python", "python-text")
_EXT = {
    ".py": "python", ".pyw": "python", ".ipynb": "notebook",
    ".cu": "cuda", ".cuh": "cuda",
    ".c": "cxx", ".cc": "cxx", ".cpp": "cxx", ".cxx": "cxx", ".h": "cxx", ".hh": "cxx",
    ".hpp": "cxx", ".hxx": "cxx", ".inl": "cxx", ".mm": "cxx",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell",
    ".yaml": "config", ".yml": "config", ".toml": "config", ".cfg": "config", ".ini": "config",
    ".env": "config", ".cmake": "config",
}
_NAMES = {"dockerfile": "config", "makefile": "config", "cmakelists.txt": "config",
          "setup.cfg": "config", "environment.yml": "config"}
_REQ = re.compile(r"^(requirements|constraints)[\w.-]*\.(txt|in)$", re.I)
_BLOCK = re.compile(r"/\*.*?\*/", re.S)
_HASH = re.compile(r"(^|\s)#.*$")


def language_of(name: str) -> str | None:
    """The language ``check`` reads a file as, from its name; None: not a file it reads."""
    lower = name.lower()
    if lower in _NAMES or lower.startswith("dockerfile"):
        return _NAMES.get(lower, "config")
    if _REQ.match(lower):
        return "config"
    return _EXT.get(PurePosixPath(lower).suffix)


def strip_comments(lines: list[str], language: str) -> list[str]:
    """The lines with comments blanked out (line count and numbering unchanged)."""
    if language in C_LIKE:
        text = "\n".join(lines)
        if "/*" in text:  # keep newlines of block comments so line numbers hold
            text = _BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        out = []
        for line in text.split("\n"):
            cut = line.find("//")
            out.append(line[:cut] if cut >= 0 else line)
        return out
    if language in HASH_COMMENTS:
        return [("" if line.lstrip().startswith("#") else _HASH.sub("", line)) if "#" in line else line
                for line in lines]
    return lines


def scan_lines(text: str, language: str, ruleset: RuleSet, *, suffix: str = "",
               first_line: int = 1) -> list[Hit]:
    """Regex and file rules of ``language`` over ``text``; line numbers from ``first_line``."""
    rules = ruleset.text.get(language, [])
    file_rules = ruleset.files.get(suffix.lower(), []) if suffix else []
    hits: list[Hit] = []
    lines = text.split("\n")
    if file_rules:
        end = first_line + max(len(lines) - (1 if lines and lines[-1] == "" else 0), 1) - 1
        hits.extend(Hit(r, first_line, end, 1) for r in file_rules if language in r.languages)
    if not rules:
        return hits
    triggers = ruleset.text_triggers.get(language)
    if triggers is not None:
        lowered = text.lower()
        if not any(t in lowered for t in triggers):
            return hits
    for i, line in enumerate(strip_comments(lines, language)):
        if not line.strip():
            continue
        for rule, rx in rules:
            m = rx.search(line)
            if m:
                hits.append(Hit(rule, first_line + i, first_line + i, m.start() + 1))
    return hits
