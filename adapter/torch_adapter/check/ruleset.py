"""The compiled rule index: :class:`RuleSet` (lookup tables the matchers use, trigger
words for the fast path) and :func:`build_ruleset` (built-in table + user rules).

The rule format and its validation are in :mod:`.rulespec`.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..errors import CheckError, format_error
from .rulespec import LANGUAGES, PYTHON_KINDS, TEXT_KINDS, Rule, load_rule_file, rule_from_dict

__all__ = ["RuleSet", "build_ruleset", "Rule", "rule_from_dict", "load_rule_file"]


def _triggers(rule: Rule) -> list[str] | None:
    """Lower-case substrings, one of which a file must contain for the rule to fire."""
    m = rule.match
    if "triggers" in m:
        return list(m["triggers"])
    out: list[str] = []
    patterns = [p for kind in ("call", "attr", "decorator", "import") for p in m.get(kind, ())]
    patterns += list(m["instance"]["classes"]) if "instance" in m else []
    out.extend(_pattern_trigger(p) for p in patterns)
    for kind in ("method", "attr_name"):
        out.extend(x.lower() for x in m.get(kind, ()))
    out.extend(k.lower() for k in m.get("keyword", {}))
    if any(k in m for k in ("string", "compare", "name", "regex", "file")):
        return None  # a regex: no literal to look for
    return out


def _pattern_trigger(pattern: str) -> str:
    """The most distinctive word of a dotted pattern that any spelling of it contains:
    a third-party package's own name; in ``torch.*`` the CUDA-ish part, else the last name."""
    parts = [p.lower() for p in pattern.split(".") if p != "*"]
    if parts[0] == "nvidia" and len(parts) > 1:
        return f"nvidia.{parts[1]}"  # namespace package: nvidia.dali
    if parts[0] == "cuda" and len(parts) > 1:
        return parts[1]  # cuda-python: from cuda import cudart
    if parts[0] != "torch" or len(parts) == 1:
        return parts[0]
    cudaish = [p for p in parts if any(w in p for w in _CUDAISH)]
    return cudaish[0] if cudaish else parts[-1]


_CUDAISH = ("cuda", "cudnn", "nccl", "nvtx")


class _QualIndex:
    """Dotted-name patterns -> rules: exact names and ``prefix.*`` prefixes."""

    def __init__(self) -> None:
        self.exact: dict[str, list[Rule]] = {}
        self.prefix: dict[str, list[Rule]] = {}

    def add(self, pattern: str, rule: Rule) -> None:
        if pattern.endswith(".*"):
            self.prefix.setdefault(pattern[:-2], []).append(rule)
        else:
            self.exact.setdefault(pattern, []).append(rule)

    def lookup(self, qualname: str) -> list[Rule]:
        """Rules whose pattern matches ``qualname`` (a prefix pattern also matches itself)."""
        found = list(self.exact.get(qualname, ()))
        if self.prefix:
            parts = qualname.split(".")
            for i in range(1, len(parts) + 1):
                found.extend(self.prefix.get(".".join(parts[:i]), ()))
        return found

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefix)


class RuleSet:
    """Rules compiled into lookup tables; rule order (table order) breaks ties."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.by_id = {r.id: r for r in self.rules}
        self.qual = _QualIndex()
        self.imports = _QualIndex()
        self.decorators = _QualIndex()
        self.methods: dict[str, list[Rule]] = {}
        self.attr_names: dict[str, list[Rule]] = {}
        self.keywords: dict[str, list[tuple[Rule, re.Pattern[str] | None]]] = {}
        self.strings: list[tuple[Rule, re.Pattern[str]]] = []
        self.compares: list[tuple[Rule, re.Pattern[str]]] = []
        self.names: list[tuple[Rule, re.Pattern[str]]] = []
        self.instances: list[tuple[Rule, _QualIndex, frozenset[str]]] = []
        self.text: dict[str, list[tuple[Rule, re.Pattern[str]]]] = {lang: [] for lang in LANGUAGES}
        self.files: dict[str, list[Rule]] = {}
        # rule id -> [(positional index, keyword name, compiled regex or None)]
        self.where: dict[str, list[tuple[int | None, str | None, re.Pattern[str] | None]]] = {}
        python_triggers: set[str] = set()
        self.python_always = False
        self.text_triggers: dict[str, set[str] | None] = {lang: set() for lang in LANGUAGES}
        for r in self.rules:
            m = r.match
            for p in [*m.get("call", ()), *m.get("attr", ())]:
                self.qual.add(p, r)
            for p in m.get("import", ()):
                self.imports.add(p, r)
            for p in m.get("decorator", ()):
                self.decorators.add(p, r)
            for n in m.get("method", ()):
                self.methods.setdefault(n, []).append(r)
            for n in m.get("attr_name", ()):
                self.attr_names.setdefault(n, []).append(r)
            for k, rx in m.get("keyword", {}).items():
                self.keywords.setdefault(k, []).append((r, re.compile(rx) if rx else None))
            if "string" in m:
                self.strings.append((r, re.compile(m["string"])))
            if "compare" in m:
                self.compares.append((r, re.compile(m["compare"])))
            if "name" in m:
                self.names.append((r, re.compile(m["name"])))
            if "instance" in m:
                idx = _QualIndex()
                for p in m["instance"]["classes"]:
                    idx.add(p, r)
                self.instances.append((r, idx, frozenset(m["instance"]["methods"])))
            if "where" in m:
                self.where[r.id] = [(w["arg"], w["kw"], re.compile(w["regex"]) if w["regex"] else None)
                                    for w in m["where"]]
            trig = _triggers(r)
            if any(k in m for k in PYTHON_KINDS):
                if trig is None:
                    self.python_always = True
                else:
                    python_triggers.update(trig)
            if any(k in m for k in TEXT_KINDS):
                for lang in r.languages:
                    if "regex" in m:
                        self.text[lang].append((r, re.compile(m["regex"])))
                    for ext in m.get("file", ()):
                        self.files.setdefault(ext, []).append(r)
                    current = self.text_triggers[lang]
                    if current is not None and "regex" in m:
                        self.text_triggers[lang] = None if trig is None else current | set(trig)
                    if lang == "python":
                        if trig is None:
                            self.python_always = True
                        else:
                            python_triggers.update(trig)
        # a trigger that contains another one adds nothing: "cuda" finds "use_cuda" too
        self.python_triggers = tuple(sorted(t for t in python_triggers
                                            if not any(o != t and o in t for o in python_triggers)))

    def wants_python(self, lowered: str) -> bool:
        """Does Python source (lower-cased) contain anything a Python rule looks for?"""
        return self.python_always or any(t in lowered for t in self.python_triggers)

    def __len__(self) -> int:
        return len(self.rules)


def build_ruleset(user_rules: Iterable[tuple[str, list[dict[str, Any]]]] = (),
                  *, builtin: bool = True) -> RuleSet:
    """The built-in table (from :mod:`.rules`) plus user rules (``(source, [rule dicts])``).

    User rules come first, so a user rule wins over a built-in one on the same code.
    Two rules with one id are an error naming both sources.
    """
    from .rules import RULES

    rules: list[Rule] = []
    seen: dict[str, str] = {}
    tables = [(src, list(items)) for src, items in user_rules]
    if builtin:
        tables.append(("built-in", list(RULES)))
    for src, items in tables:
        for data in items:
            rule = rule_from_dict(data, source=src, order=len(rules))
            if rule.id in seen:
                culprit, other = (src, seen[rule.id]) if src != "built-in" else (seen[rule.id], src)
                raise CheckError(format_error(
                    f"check rule {rule.id!r} ({culprit})", "a rule id used once",
                    f"{rule.id!r}, also defined in {other}",
                    why="ids name rules in reports and --fail-on decisions",
                    fix="give the user rule its own id (e.g. a prefix for your organisation)"))
            seen[rule.id] = src
            rules.append(rule)
    return RuleSet(rules)
