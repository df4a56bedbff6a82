"""The rule format: the :class:`Rule` record, its validation, and user rule files
(the compiled lookup index is :mod:`.ruleset`).

A rule is data (a dict in :mod:`.rules`, or a ``[[rule]]`` table in a user TOML file)::

    {"id": "DEV001", "title": "`.cuda()`", "severity": "handled",
     "match": {"method": ["cuda"]},
     "message": "...", "alternative": "...", "docs": "https://...",
     "rewrite": None, "secondary": False, "targets": None, "severity_by_target": {}}

``match`` holds one or more matcher kinds (OR-ed):

============  =====================================================================
kind          matches (Python unless noted)
============  =====================================================================
call          dotted names, resolved through imports (``torch.cuda.*`` = a prefix),
              called or referenced; ``where`` adds argument conditions
attr          same as ``call``, for values (``torch.version.cuda``)
method        a method call by name on any object (``.cuda()``), ``where`` allowed
attr_name     an attribute by name on any object (``x.is_cuda``)
import        ``import M`` / ``from M import n`` (module patterns)
keyword       ``name=value`` keyword arguments and ``{"name": value}`` dict keys
string        string constants (f-strings too, docstrings excluded) by regex
compare       a comparison with a string operand matching the regex
name          identifiers (variables, attributes, parameters, defs) by regex
decorator     decorators by dotted name; the finding spans the whole definition;
              ``launch: true`` also reports ``kernel[grid](...)`` launches
instance      ``x = Cls(...)`` then ``x.method(...)``: ``{"classes": [...], "methods": [...]}``
regex         any language: a line regex; ``languages`` says where it applies
file          any language: the file itself, by extension (``[".cu"]``)
============  =====================================================================

Python rules are only evaluated in files that contain one of their ``triggers``
(lower-case substrings; derived from the names when not given) -- the fast path that
lets ``check`` skip parsing files with nothing CUDA-related in them.
"""

from __future__ import annotations

import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import CheckError, format_error
from .model import SEVERITIES

__all__ = ["Rule", "rule_from_dict", "load_rule_file", "PYTHON_KINDS", "TEXT_KINDS", "LANGUAGES",
           "PLACEHOLDERS"]

PYTHON_KINDS = ("call", "attr", "method", "attr_name", "import", "keyword", "string",
                "compare", "name", "decorator", "instance")
TEXT_KINDS = ("regex", "file")
LANGUAGES = ("python", "python-text", "cuda", "cxx", "shell", "config")
PLACEHOLDERS = ("target", "device", "device_type", "backend", "amp", "dispatch_key")
_RULE_KEYS = {"id", "title", "severity", "match", "message", "alternative", "docs", "rewrite",
              "secondary", "targets", "severity_by_target"}
_MATCH_EXTRA = {"where", "languages", "triggers", "launch"}
_ID = re.compile(r"^[A-Z][A-Z0-9_-]{1,31}$")
_QUAL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\.\*)?$")


@dataclass(frozen=True)
class Rule:
    """One validated rule (see the module docstring for the fields)."""

    id: str
    title: str
    severity: str
    match: Mapping[str, Any]
    message: str
    alternative: str = ""
    docs: str = ""
    rewrite: Mapping[str, Any] | None = None
    secondary: bool = False
    targets: tuple[str, ...] | None = None
    severity_by_target: Mapping[str, str] = field(default_factory=dict)
    source: str = "built-in"
    order: int = 0

    @property
    def where(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.match.get("where", ()))

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.match.get("languages", ("python",)))

    def applies_to(self, target: str) -> bool:
        return target == "any" or self.targets is None or target in self.targets

    def severity_for(self, target: str) -> str:
        return self.severity_by_target.get(target, self.severity)

    def metadata(self, target: str) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "severity": self.severity_for(target),
                "docs": self.docs, "source": self.source}


def _bad(rule_id: str, source: str, expected: str, got: Any, fix: str, why: str = "") -> CheckError:
    return CheckError(format_error(f"check rule {rule_id!r} ({source})", expected,
                                   f"{got!r} ({type(got).__name__})", why=why, fix=fix))


def _str_list(rule_id: str, source: str, what: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise _bad(rule_id, source, f"{what}: a non-empty list of strings", value,
                   f'write e.g. {what} = ["torch.cuda.synchronize"]')
    return list(value)


def _regex(rule_id: str, source: str, what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _bad(rule_id, source, f"{what}: a regular expression string", value, 'e.g. "^cuda"')
    try:
        re.compile(value)
    except re.error as exc:
        raise _bad(rule_id, source, f"{what}: a valid regular expression", value,
                   "fix the pattern (Python `re` syntax)", why=str(exc)) from None
    return value


def _check_template(rule_id: str, source: str, what: str, text: Any) -> str:
    if not isinstance(text, str):
        raise _bad(rule_id, source, f"{what}: a string", text, f"give the rule a {what}")
    try:
        names = [n for _, n, _, _ in string.Formatter().parse(text) if n is not None]
    except ValueError as exc:
        raise _bad(rule_id, source, f"{what}: a template with balanced braces", text,
                   "write literal braces as {{ and }}", why=str(exc)) from None
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown:
        raise _bad(rule_id, source, f"{what}: placeholders among {{{'}, {'.join(PLACEHOLDERS)}}}",
                   text, "remove or rename the placeholder; write literal braces as {{ }}",
                   why=f"unknown placeholder {{{unknown[0]}}}")
    return text


def _check_match(rule_id: str, source: str, match: Any) -> dict[str, Any]:
    if not isinstance(match, Mapping):
        raise _bad(rule_id, source, "match: a table of matcher kinds", match,
                   'e.g. match = { call = ["torch.cuda.synchronize"] }')
    kinds = [k for k in match if k in PYTHON_KINDS or k in TEXT_KINDS]
    unknown = [k for k in match if k not in PYTHON_KINDS and k not in TEXT_KINDS and k not in _MATCH_EXTRA]
    if unknown or not kinds:
        raise _bad(rule_id, source, f"match keys among {', '.join(PYTHON_KINDS + TEXT_KINDS)}",
                   dict(match), "use one or more of the documented matcher kinds (docs/check.md)",
                   why=f"unknown key {unknown[0]!r}" if unknown else "no matcher kind given")
    out: dict[str, Any] = {}
    for kind in kinds:
        value = match[kind]
        if kind in ("call", "attr", "import", "decorator"):
            pats = _str_list(rule_id, source, kind, value)
            for p in pats:
                if not _QUAL.match(p):
                    raise _bad(rule_id, source, f"{kind}: dotted names, optionally ending in .*", p,
                               'e.g. "torch.cuda.synchronize" or "torch.cuda.*"')
            out[kind] = pats
        elif kind in ("method", "attr_name"):
            out[kind] = _str_list(rule_id, source, kind, value)
        elif kind in ("string", "compare", "name", "regex"):
            out[kind] = _regex(rule_id, source, kind, value)
        elif kind == "keyword":
            if not isinstance(value, Mapping) or not value:
                raise _bad(rule_id, source, "keyword: a table name -> value regex (or \"\" for any)",
                           value, 'e.g. keyword = { pin_memory = "^True$" }')
            out[kind] = {k: (_regex(rule_id, source, f"keyword.{k}", v) if v else None)
                         for k, v in value.items()}
        elif kind == "instance":
            if not isinstance(value, Mapping) or set(value) != {"classes", "methods"}:
                raise _bad(rule_id, source, "instance: a table with classes and methods", value,
                           'e.g. instance = { classes = ["torch.cuda.Event"], methods = ["record"] }')
            out[kind] = {"classes": _str_list(rule_id, source, "instance.classes", value["classes"]),
                         "methods": _str_list(rule_id, source, "instance.methods", value["methods"])}
        elif kind == "file":
            exts = _str_list(rule_id, source, "file", value)
            if not all(e.startswith(".") for e in exts):
                raise _bad(rule_id, source, "file: extensions starting with a dot", exts, 'e.g. [".cu"]')
            out[kind] = [e.lower() for e in exts]
    where = match.get("where", [])
    if not isinstance(where, (list, tuple)) or not all(
            isinstance(w, Mapping) and ("arg" in w or "kw" in w) for w in where):
        raise _bad(rule_id, source, "where: a list of {arg = N, kw = NAME, regex = ...} tables", where,
                   'e.g. where = [{ arg = 0, kw = "device", regex = "^cuda" }]')
    if where:
        out["where"] = [{"arg": w.get("arg"), "kw": w.get("kw"),
                         "regex": _regex(rule_id, source, "where.regex", w["regex"]) if w.get("regex") else None}
                        for w in where]
    if any(k in TEXT_KINDS for k in kinds):
        langs = _str_list(rule_id, source, "languages", match.get("languages", ["python"]))
    else:
        langs = ["python"]
    bad_langs = [lang for lang in langs if lang not in LANGUAGES]
    if bad_langs:
        raise _bad(rule_id, source, f"languages among {', '.join(LANGUAGES)}", bad_langs[0],
                   "name the file kinds the rule applies to")
    out["languages"] = langs
    if "triggers" in match:
        out["triggers"] = [t.lower() for t in _str_list(rule_id, source, "triggers", match["triggers"])]
    if match.get("launch"):
        out["launch"] = True
    return out


def rule_from_dict(data: Any, *, source: str = "built-in", order: int = 0) -> Rule:
    """Validate one rule table and build the :class:`Rule` (CheckError says what is wrong)."""
    if not isinstance(data, Mapping):
        raise _bad("?", source, "a rule table", data, "write each rule as a [[rule]] table")
    rule_id = data.get("id")
    if not isinstance(rule_id, str) or not _ID.match(rule_id):
        raise _bad(str(rule_id), source, "id: upper-case letters/digits, 2-32 chars", rule_id, 'e.g. id = "ORG001"')
    unknown = sorted(set(data) - _RULE_KEYS)
    if unknown:
        raise _bad(rule_id, source, f"keys among {', '.join(sorted(_RULE_KEYS))}", unknown[0],
                   "remove or rename the key", why="unknown rule key")
    severity = data.get("severity")
    if severity not in SEVERITIES:
        raise _bad(rule_id, source, f"severity: one of {', '.join(SEVERITIES)}", severity,
                   'e.g. severity = "review"')
    by_target = dict(data.get("severity_by_target") or {})
    for t, s in by_target.items():
        if s not in SEVERITIES:
            raise _bad(rule_id, source, f"severity_by_target.{t}: one of {', '.join(SEVERITIES)}", s,
                       'e.g. severity_by_target = { cuda = "handled" }')
    targets = data.get("targets")
    if targets is not None:
        targets = tuple(_str_list(rule_id, source, "targets", targets))
    rewrite = data.get("rewrite")
    if rewrite is not None and not (isinstance(rewrite, Mapping) and ("builtin" in rewrite or "sub" in rewrite)):
        raise _bad(rule_id, source, "rewrite: a table with builtin = NAME or sub = [PATTERN, REPLACEMENT]",
                   rewrite, 'e.g. rewrite = { sub = ["cuda", "cpu"] }')
    if rewrite is not None and "sub" in rewrite:
        sub = rewrite["sub"]
        if not (isinstance(sub, (list, tuple)) and len(sub) == 2 and all(isinstance(s, str) for s in sub)):
            raise _bad(rule_id, source, "rewrite.sub: [PATTERN, REPLACEMENT]", sub,
                       'e.g. sub = ["\\\\.cuda\\\\(\\\\)", ".to(device)"]')
        _regex(rule_id, source, "rewrite.sub[0]", sub[0])
    return Rule(
        id=rule_id, title=str(data.get("title") or rule_id), severity=severity,
        match=_check_match(rule_id, source, data.get("match")),
        message=_check_template(rule_id, source, "message", data.get("message")),
        alternative=_check_template(rule_id, source, "alternative", data.get("alternative", "")),
        docs=str(data.get("docs", "")), rewrite=dict(rewrite) if rewrite else None,
        secondary=bool(data.get("secondary", False)), targets=targets,
        severity_by_target=by_target, source=source, order=order)


def load_rule_file(path: str | Path) -> list[dict[str, Any]]:
    """The ``[[rule]]`` tables of a user TOML file (validated later by :func:`build_ruleset`)."""
    from ..core.safe_io import FileProblem, decode_utf8, read_bounded

    p = Path(path)
    try:  # the exact path; regular files only (a FIFO is refused, not waited on); at most 8 MiB
        text = decode_utf8(str(path), read_bounded(path))
    except FileProblem as exc:
        raise CheckError(format_error("torch-adapter check --rules", "a readable UTF-8 TOML file "
                                      "(a regular file, at most 8 MiB)", repr(str(path)),
                                      why=exc.why, fix=exc.fix)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CheckError(format_error("torch-adapter check --rules", "valid UTF-8 TOML", str(p),
                                      why=str(exc), fix="fix the TOML syntax at the place named")) from None
    rules = data.get("rule")
    if not isinstance(rules, list) or not rules:
        raise CheckError(format_error("torch-adapter check --rules", "one or more [[rule]] tables",
                                      f"{p} with keys {sorted(data)}",
                                      fix='start each rule with [[rule]] and give id, severity, match, message'))
    return rules
