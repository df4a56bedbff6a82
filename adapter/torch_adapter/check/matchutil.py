"""Pieces the matchers share: the :class:`Hit` record, dotted names of AST chains,
comparable texts of argument values, and the lines of a text that hold trigger words.
"""

from __future__ import annotations

import ast
import functools
import re
from bisect import bisect_right
from typing import Any, NamedTuple

from .ruleset import Rule

__all__ = ["Hit", "dotted", "value_text", "candidate_lines", "present", "children", "first_rule",
           "top_level_chunks"]

_LEAVES = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


class Hit(NamedTuple):
    """A rule matched at lines ``start``..``end`` (1-based, of the parsed source)."""

    rule: Rule
    start: int
    end: int
    col: int
    node: Any = None  # the matched AST node (rewrites read it)
    qual: str | None = None  # the resolved dotted name, when there is one


def dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        parts.reverse()
        return parts
    return None


def value_text(node: ast.AST) -> str | None:
    """A comparable text for an argument value: strings, f-strings (``{}`` for fields),
    constants, dotted names and sequences of those; None for anything else."""
    if isinstance(node, ast.Constant):
        v = node.value
        return v if isinstance(v, str) else (None if isinstance(v, bytes) else repr(v))
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        texts = [value_text(e) for e in node.elts]
        return ",".join(t for t in texts if t is not None)
    parts = dotted(node)
    return ".".join(parts) if parts else None


def candidate_lines(lowered: str, triggers: tuple[str, ...]) -> list[int]:
    """Sorted 1-based numbers of the lines of ``lowered`` that contain a trigger word
    (``triggers``: best only those present in the text, see :func:`present`)."""
    if not triggers:
        return []
    starts: list[int] | None = None
    found: list[int] = []
    for m in _line_regex(triggers).finditer(lowered):  # one match per line at most
        if starts is None:
            starts = _line_starts(lowered)
        found.append(bisect_right(starts, m.start()))
    return found


def present(lowered: str, triggers: tuple[str, ...]) -> tuple[str, ...]:
    """The triggers that occur in ``lowered``."""
    return tuple(t for t in triggers if t in lowered)


@functools.lru_cache(maxsize=512)
def _line_regex(triggers: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("(?:" + "|".join(map(re.escape, triggers)) + ")[^\n]*")


def _line_starts(text: str) -> list[int]:
    out = [0]
    pos = text.find("\n")
    while pos >= 0:
        out.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return out


def children(node: ast.AST) -> list[ast.AST]:
    out: list[ast.AST] = []
    for name in node._fields:
        v = getattr(node, name, None)
        if isinstance(v, list):
            out.extend(x for x in v if isinstance(x, ast.AST) and not isinstance(x, _LEAVES))
        elif isinstance(v, ast.AST) and not isinstance(v, _LEAVES):
            out.append(v)
    return out


def first_rule(rules: list[Rule]) -> Rule | None:
    return min(rules, key=lambda r: r.order) if rules else None


_TOP = ("def ", "async def ", "class ", "@")


def top_level_chunks(lines: list[str]) -> list[tuple[int, int]]:
    """1-based inclusive line ranges that parse on their own in ordinary code: the prelude
    (up to the first top-level ``def``/``class``/decorator) and each top-level definition
    with what follows it up to the next one. A heuristic for speed only: a caller that gets
    a SyntaxError from a chunk parses the whole file instead."""
    starts = []
    for i, line in enumerate(lines, 1):
        if line.startswith(_TOP) and not (starts and starts[-1] == i - 1 and lines[i - 2].startswith("@")):
            starts.append(i)
    if not starts:
        return [(1, len(lines))]
    bounds = [(1, starts[0] - 1)] if starts[0] > 1 else []
    return bounds + [(s, e - 1) for s, e in zip(starts, starts[1:] + [len(lines) + 1])]
