"""What the Python matcher knows about names while it walks a module: imports and aliases
(``from torch.cuda import amp``; ``cudnn = torch.backends.cudnn``), instances of watched
classes (``scaler = GradScaler()``), Triton kernels, and the module names to watch for
(``bnb`` for bitsandbytes) -- plus the rule lookups that depend on them.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from typing import Any

from .matchutil import dotted, value_text
from .ruleset import Rule, RuleSet

__all__ = ["Scope"]


class Scope:
    """Name-resolution state of one module (or one notebook, cell after cell)."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.rs = ruleset
        self.aliases: dict[str, str] = {}
        self.tracked: dict[str, list[tuple[Rule, frozenset[str]]]] = {}
        self.launches: dict[str, Rule] = {}
        self.watch: set[str] = set()  # local names of modules that rules match by prefix
        self._triggers = frozenset(ruleset.python_triggers)
        self.skip: set[int] = set()  # ids of nodes already matched as a rule's argument

    def relevant_span(self, start: int, end: int, candidates: list[int], source_lines: list[str] | None) -> bool:
        """Do lines ``start``..``end`` hold a candidate line, or a name the matcher watches
        (a tracked instance, a Triton kernel, a module alias such as ``bnb``)?"""
        i = bisect_left(candidates, start)
        if i < len(candidates) and candidates[i] <= end:
            return True
        if source_lines is None or not (self.tracked or self.launches or self.watch):
            return False
        words = {k.rsplit(".", 1)[-1] for k in self.tracked} | set(self.launches) | self.watch
        chunk = "\n".join(source_lines[start - 1:end])
        return any(w in chunk for w in words)

    def _resolve(self, parts: list[str]) -> str:
        head = self.aliases.get(parts[0])
        if head is None:
            return ".".join(parts)
        return head if len(parts) == 1 else head + "." + ".".join(parts[1:])

    def _qual_rule(self, qual: str, call: ast.Call | None) -> Rule | None:
        """The first rule whose call/attr pattern matches ``qual`` or one of its prefixes."""
        best: Rule | None = None
        idx = self.rs.qual
        parts = qual.split(".")
        n = len(parts)
        for length in range(n, 0, -1):
            prefix = ".".join(parts[:length]) if length < n else qual
            for r in idx.exact.get(prefix, ()):
                if (best is None or r.order < best.order) and self._where_ok(r, call, length == n):
                    best = r
            for r in idx.prefix.get(prefix, ()):
                if (best is None or r.order < best.order) and self._where_ok(r, call, True):
                    best = r
        return best

    def _where_ok(self, rule: Rule, call: ast.Call | None, full: bool) -> bool:
        conds = self.rs.where.get(rule.id)
        if not conds:
            return True
        if call is None or not full:
            return False
        return all(self._cond(call, pos, kw, rx) for pos, kw, rx in conds)

    def _cond(self, call: ast.Call, pos: int | None, kw: str | None, rx: Any) -> bool:
        values: list[ast.AST] = []
        if pos is not None and pos < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
            values.append(call.args[pos])
        if kw:
            values.extend(k.value for k in call.keywords if k.arg == kw)
        for v in values:
            if rx is None:
                return True
            text = value_text(v)
            if text is not None and rx.search(text):
                self.skip.add(id(v))
                for e in getattr(v, "elts", ()):
                    self.skip.add(id(e))
                return True
        return False

    def _bind(self, name: str, qual: str) -> None:
        self.aliases[name] = qual
        if name.lower() not in self._triggers and self.rs.qual.lookup(qual):
            self.watch.add(name)  # e.g. bnb -> bitsandbytes: lines using `bnb.` matter

    def _rebind(self, target: ast.AST, value: ast.AST) -> None:
        """``name = a.b`` makes ``name`` an alias of ``a.b``; any other value unbinds it."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._rebind(t, value if isinstance(t, ast.Starred) else ast.Constant(None))
        elif isinstance(target, ast.Name):
            parts = dotted(value)
            if parts is not None and parts[0] in self.aliases:
                self.aliases[target.id] = self._resolve(parts)
            else:
                self.aliases.pop(target.id, None)

    def _track(self, target: ast.AST, value: ast.AST) -> None:
        """Remember names bound to instances of classes that instance rules watch."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts):
                self._track(t, v)
            return
        if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            value = value.elt
        elif isinstance(value, (ast.List, ast.Tuple)) and value.elts:
            value = value.elts[0]
        if not isinstance(value, ast.Call):
            return
        parts = dotted(value.func)
        if parts is None:
            return
        qual = self._resolve(parts)
        while isinstance(target, ast.Subscript):
            target = target.value
        tparts = dotted(target)
        if tparts is None:
            return
        for rule, idx, methods in self.rs.instances:
            if idx.lookup(qual):
                self.tracked.setdefault(".".join(tparts), []).append((rule, methods))
