"""Python matching: one pass over a module's AST, rules looked up in a :class:`RuleSet`.

Dotted names are resolved through the module's imports (``from torch.cuda import amp``
makes ``amp.autocast`` mean ``torch.cuda.amp.autocast``); names bound to instances of
tracked classes (``scaler = GradScaler()``) make their method calls matchable; Triton
kernels decorated in the file make their ``kernel[grid](...)`` launches matchable.

Each node produces at most one :class:`Hit` -- the first matching rule in table order --
and a matched dotted chain is not searched again piece by piece. The walk uses an
explicit stack (deeply nested expressions cannot overflow Python's recursion limit).
Docstrings and bare string statements are skipped. Nothing is executed.
"""

from __future__ import annotations

import ast
from typing import Any

from .matchutil import Hit, children, dotted, first_rule, value_text
from .pyscope import Scope
from .ruleset import Rule, RuleSet

__all__ = ["PythonMatcher"]

_MAX_STRING_LINES = 400


class _EndScope:
    """Pushed after a function or class body: puts the enclosing scope's names back."""

    __slots__ = ("aliases",)

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases


class PythonMatcher(Scope):
    """Matches one module -- or, for a notebook, its cells in order (state is kept, so
    imports in one cell resolve names in the next)."""

    def __init__(self, ruleset: RuleSet) -> None:
        super().__init__(ruleset)
        self.hits: list[Hit] = []
        self._lines: list[str] | None = None
        self._handlers = {
            ast.Import: self._import, ast.ImportFrom: self._import_from, ast.Call: self._call,
            ast.Attribute: self._attribute, ast.Name: self._name, ast.Constant: self._constant,
            ast.JoinedStr: self._joined, ast.Compare: self._compare, ast.keyword: self._keyword,
            ast.Dict: self._dict, ast.FunctionDef: self._def, ast.AsyncFunctionDef: self._def,
            ast.ClassDef: self._class, ast.arg: self._arg, ast.Assign: self._assign,
            ast.AnnAssign: self._ann_assign, ast.Expr: self._expr, _EndScope: self._end_scope,
            ast.Global: self._global, ast.Nonlocal: self._global,
        }

    # --- driver -----------------------------------------------------------------------
    def match(self, tree: ast.AST, candidates: list[int] | None = None,
              source_lines: list[str] | None = None) -> list[Hit]:
        """Every hit in ``tree``, in source order of the walk.

        ``candidates``: sorted line numbers that contain a trigger word; statements
        spanning none of them are skipped (imports are always read, and statements that
        mention a tracked instance or a Triton kernel are read when ``source_lines`` is
        given). None reads everything.
        """
        self.hits = []
        self.skip = set()
        self._lines = source_lines
        handlers = self._handlers
        stack: list[ast.AST] = [tree]
        while stack:
            node = stack.pop()
            if candidates is not None and isinstance(node, ast.stmt) and not isinstance(
                    node, (ast.Import, ast.ImportFrom)) and not self._relevant(node, candidates, source_lines):
                continue
            handler = handlers.get(node.__class__)
            kids = handler(node) if handler is not None else children(node)
            if kids:
                stack.extend(reversed(kids))
        return self.hits

    def _relevant(self, node: ast.stmt, candidates: list[int], source_lines: list[str] | None) -> bool:
        start = node.lineno
        for d in getattr(node, "decorator_list", ()):
            start = min(start, d.lineno)
        return self.relevant_span(start, node.end_lineno or start, candidates, source_lines)

    def _hit(self, rule: Rule, node: ast.AST, start: int | None = None, end: int | None = None,
             qual: str | None = None) -> None:
        s = start if start is not None else node.lineno
        e = end if end is not None else (getattr(node, "end_lineno", None) or s)
        self.hits.append(Hit(rule, s, max(e, s), getattr(node, "col_offset", 0) + 1, node, qual))

    # --- lookups ----------------------------------------------------------------------
    def _names(self, parts: list[str], node: ast.AST, attrs: list[str] | None = None) -> bool:
        """attr_name and name rules over the identifiers of a chain (one hit at most)."""
        cands = [r for a in (parts[1:] if attrs is None else attrs) for r in self.rs.attr_names.get(a, ())]
        for rule, rx in self.rs.names:
            if any(rx.search(p) for p in parts):
                cands.append(rule)
                break
        rule = first_rule(cands)
        if rule is not None:
            self._hit(rule, node)
        return rule is not None

    def _name_rule(self, ident: str) -> Rule | None:
        for rule, rx in self.rs.names:
            if rx.search(ident):
                return rule
        return None

    # --- handlers ---------------------------------------------------------------------
    def _import(self, node: ast.Import) -> list[ast.AST]:
        for a in node.names:
            if a.asname:
                self._bind(a.asname, a.name)
            else:
                top = a.name.split(".")[0]
                self._bind(top, top)
        self._import_hit(node, [a.name for a in node.names])
        return []

    def _import_from(self, node: ast.ImportFrom) -> list[ast.AST]:
        mod = node.module or ""
        names = [a for a in node.names if a.name != "*"]
        if node.level == 0 and mod:
            for a in names:
                self._bind(a.asname or a.name, f"{mod}.{a.name}")
            self._import_hit(node, [mod] + [f"{mod}.{a.name}" for a in names])
        else:  # relative: shadows earlier bindings of these names
            for a in names:
                self.aliases.pop(a.asname or a.name, None)
            self._import_hit(node, [], [mod] + [a.name for a in names])
        return []

    def _import_hit(self, node: ast.AST, modules: list[str], idents: list[str] | None = None) -> None:
        # an import rule, or the rule for the imported name itself (`from torch.cuda import Event`)
        rule = first_rule([r for m in modules for r in self.rs.imports.lookup(m)] +
                          [r for m in modules for r in self.rs.qual.lookup(m) if r.id not in self.rs.where])
        if rule is None:
            words = [w for m in (idents if idents is not None else modules) for w in m.split(".") if w]
            rule = next((r for w in words if (r := self._name_rule(w)) is not None), None)
        if rule is not None:
            self._hit(rule, node)

    def _call(self, node: ast.Call) -> list[ast.AST]:
        func = node.func
        parts = dotted(func)
        qual = self._resolve(parts) if parts is not None else None
        cands: list[tuple[Rule, bool]] = []  # (rule, located at the method name)
        if qual is not None:
            r = self._qual_rule(qual, node)
            if r is not None:
                cands.append((r, False))
        if isinstance(func, ast.Attribute):
            for r in self.rs.methods.get(func.attr, ()):
                if self._where_ok(r, node, True):
                    cands.append((r, True))
                    break
            if self.tracked:
                recv = func.value
                while isinstance(recv, ast.Subscript):
                    recv = recv.value
                rp = dotted(recv)
                if rp is not None:
                    for r, methods in self.tracked.get(".".join(rp), ()):
                        if func.attr in methods:
                            cands.append((r, True))
        elif isinstance(func, ast.Subscript) and self.launches:
            lp = dotted(func.value)
            if lp is not None and ".".join(lp) in self.launches:
                cands.append((self.launches[".".join(lp)], False))
        if cands:
            rule, at_method = min(cands, key=lambda c: c.__getitem__(0).order)
            start = func.end_lineno if at_method and isinstance(func, ast.Attribute) else node.lineno
            self._hit(rule, node, start=start, qual=qual)
        elif parts is not None:
            self._names(parts, node, attrs=parts[1:])
        elif isinstance(func, ast.Attribute):
            self._names([func.attr], func, attrs=[func.attr])
        kids: list[ast.AST] = []
        if parts is None:
            kids.append(func.value if isinstance(func, ast.Attribute) else func)
        kids.extend(node.args)
        kids.extend(node.keywords)
        return kids

    def _attribute(self, node: ast.Attribute) -> list[ast.AST]:
        parts = dotted(node)
        if parts is not None:
            qual = self._resolve(parts)
            rule = self._qual_rule(qual, None)
            if rule is not None:
                self._hit(rule, node, qual=qual)
            else:
                self._names(parts, node)
            return []
        self._names([node.attr], node, attrs=[node.attr])
        return [node.value]

    def _name(self, node: ast.Name) -> list[ast.AST]:
        qual = self._resolve([node.id])
        rule = None if isinstance(node.ctx, ast.Store) else self._qual_rule(qual, None)
        if rule is not None:
            self._hit(rule, node, qual=qual)
        else:
            self._names([node.id], node, attrs=[])
        return []

    def _constant(self, node: ast.Constant) -> list[ast.AST]:
        if isinstance(node.value, str) and node.value and id(node) not in self.skip:
            self._strings(node.value, node)
        return []

    def _joined(self, node: ast.JoinedStr) -> list[ast.AST]:
        if id(node) not in self.skip:
            text = value_text(node)
            if text:
                self._strings(text, node)
        return [v.value for v in node.values if isinstance(v, ast.FormattedValue)]

    def _strings(self, text: str, node: ast.AST) -> None:
        start, end = node.lineno, node.end_lineno or node.lineno
        if end > start and self._lines is not None and end <= len(self._lines):
            # a multi-line literal: match its physical lines (escapes and backslash
            # continuations make the value's own lines drift from the file's)
            for ln in range(start, min(end, start + _MAX_STRING_LINES) + 1):
                line = self._lines[ln - 1]
                rule = next((r for r, rx in self.rs.strings if rx.search(line)), None)
                if rule is not None:
                    self._hit(rule, node, start=ln, end=ln)
            return
        if end > start and "\n" in text:
            for i, line in enumerate(text.split("\n")[:_MAX_STRING_LINES]):
                rule = next((r for r, rx in self.rs.strings if rx.search(line)), None)
                if rule is not None:
                    ln = min(start + i, end)
                    self._hit(rule, node, start=ln, end=ln)
            return
        rule = next((r for r, rx in self.rs.strings if rx.search(text)), None)
        if rule is not None:
            self._hit(rule, node)

    def _compare(self, node: ast.Compare) -> list[ast.AST]:
        operands = [node.left, *node.comparators]
        if self.rs.compares:
            cands: list[Rule] = []
            for op in operands:
                strs = [op] if isinstance(op, ast.Constant) else list(getattr(op, "elts", ()))
                for s in strs:
                    if isinstance(s, ast.Constant) and isinstance(s.value, str):
                        for rule, rx in self.rs.compares:
                            if rx.search(s.value):
                                cands.append(rule)
                                self.skip.add(id(s))
                                break
            rule = first_rule(cands)
            if rule is not None:
                self._hit(rule, node)
        return operands

    def _keyword(self, node: ast.keyword) -> list[ast.AST]:
        if node.arg:
            text = value_text(node.value)
            rule = next((r for r, rx in self.rs.keywords.get(node.arg, ())
                         if rx is None or (text is not None and rx.search(text))), None)
            if rule is not None:
                self._hit(rule, node)
                if isinstance(node.value, (ast.Constant, ast.JoinedStr)):
                    self.skip.add(id(node.value))
            else:
                rule = self._name_rule(node.arg)
                if rule is not None:
                    self._hit(rule, node)
        return [node.value]

    def _dict(self, node: ast.Dict) -> list[ast.AST]:
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in self.rs.keywords:
                text = value_text(value)
                rule = next((r for r, rx in self.rs.keywords[key.value]
                             if rx is None or (text is not None and rx.search(text))), None)
                if rule is not None:
                    self._hit(rule, key)
                    self.skip.add(id(key))
        return [n for n in (*node.keys, *node.values) if n is not None]

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
        kids = self._decorators(node)
        rule = self._name_rule(node.name)
        if rule is not None:
            self._hit(rule, node, end=node.lineno)
        kids.append(node.args)
        if node.returns is not None:
            kids.append(node.returns)
        kids.extend(node.body)
        kids.append(_EndScope(dict(self.aliases)))  # type: ignore[arg-type]
        return kids

    def _class(self, node: ast.ClassDef) -> list[ast.AST]:
        kids = self._decorators(node)
        rule = self._name_rule(node.name)
        if rule is not None:
            self._hit(rule, node, end=node.lineno)
        return kids + node.bases + node.keywords + node.body + [_EndScope(dict(self.aliases))]  # type: ignore[list-item]

    def _decorators(self, node: Any) -> list[ast.AST]:
        kids: list[ast.AST] = []
        for d in node.decorator_list:
            parts = dotted(d.func if isinstance(d, ast.Call) else d)
            rule = first_rule(self.rs.decorators.lookup(self._resolve(parts))) if parts else None
            if rule is None:
                kids.append(d)
                continue
            self._hit(rule, d, start=d.lineno, end=node.end_lineno, qual=self._resolve(parts))
            if rule.match.get("launch"):
                self.launches[node.name] = rule
            if isinstance(d, ast.Call):
                kids.extend(d.args)
                kids.extend(d.keywords)
        return kids

    def _end_scope(self, marker: _EndScope) -> list[ast.AST]:
        self.aliases = marker.aliases
        return []

    def _global(self, node: ast.Global | ast.Nonlocal) -> list[ast.AST]:
        rule = next((r for n in node.names if (r := self._name_rule(n)) is not None), None)
        if rule is not None:
            self._hit(rule, node)
        return []

    def _arg(self, node: ast.arg) -> list[ast.AST]:
        rule = self._name_rule(node.arg)
        if rule is not None:
            self._hit(rule, node)
        return [node.annotation] if node.annotation is not None else []

    def _assign(self, node: ast.Assign) -> list[ast.AST]:
        if self.rs.instances:
            for t in node.targets:
                self._track(t, node.value)
        for t in node.targets:
            self._rebind(t, node.value)
        return [*node.targets, node.value]

    def _ann_assign(self, node: ast.AnnAssign) -> list[ast.AST]:
        if self.rs.instances and node.value is not None:
            self._track(node.target, node.value)
        return [n for n in (node.target, node.annotation, node.value) if n is not None]

    def _expr(self, node: ast.Expr) -> list[ast.AST]:
        v = node.value
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            return []  # a docstring or a bare string used as a comment
        return [v]
