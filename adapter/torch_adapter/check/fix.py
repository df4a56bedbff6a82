"""Patches from what ran: each CPU fallback and dtype refusal a run recorded, as a source edit at its line.

``torch-adapter fix`` (``cli/fix.py``) and ``%adapter fix`` (``jupyter/fixing.py``) read a run's records
— a routing log's ``ops`` with route ``fallback`` or ``refused`` and its ``dtypes.findings``, each with the
user's line — and :func:`plan` turns those at a line of a project file into an edit of that line, made
with LibCST (the rest of the file keeps its exact text). Nothing here runs a program or writes a file:
``check/fix_run.py`` verifies each edit by re-running the changed copy, and writes only on request.

What becomes an edit (one table, :data:`REWRITES`, keyed by the aten op that fell back or the composite
op it was a piece of; each entry is tested in tests/test_fix.py):

- ``aten::einsum``: ``torch.einsum(eq, a, b)`` → the explicit matmul/transpose/sum expression of
  ``check/rewrite.einsum_expression`` (None for forms without one: no edit rather than a wrong one);
- ``aten::hypot``: ``torch.hypot(a, b)`` / ``a.hypot(b)`` → ``torch.sqrt(a * a + b * b)`` (npu lists
  mul, add and sqrt; not hypot);
- ``aten::_pdist_forward``: ``torch.pdist(x)`` / ``F.pdist(x)`` (p = 2) → the upper triangle of
  ``torch.cdist(x, x)`` (mps has cdist's kernel, not pdist's);
- a dtype finding for ``float64`` (a target without fp64: mps, xpu-arc): ``torch.float64`` /
  ``torch.double`` at that line → ``torch.float32``, ``.double()`` → ``.float()``.

A record at a line with none of these (an op without a source-level equivalent, a float64 that comes
from elsewhere), in a file outside the project, or in no file at all, is a :class:`Skipped` with why.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import UsageError, format_error

__all__ = ["Record", "Change", "FileEdit", "Skipped", "records_of", "plan", "plan_source", "REWRITES",
           "DTYPE_REWRITES", "line_map"]


@dataclass(frozen=True)
class Record:
    """One fallback, refusal or dtype finding at the user's line, as a run recorded it."""

    kind: str  # "fallback" | "refused" | "dtype"
    op: str
    file: str  # as recorded: relative to the run's working directory, absolute, or a cell's name
    line: int
    code: str = ""
    reason: str = ""
    parent: str | None = None
    dtype: str | None = None
    calls: int = 0

    @property
    def what(self) -> str:
        if self.kind == "dtype":
            return f"{self.op} with dtype {self.dtype} (refused)"
        return f"{self.op} ({self.kind}{', under ' + self.parent if self.parent else ''})"


@dataclass(frozen=True)
class Change:
    """One edited span of a file: the records it answers, the old and new text, the rule used."""

    line: int  # first line of the edited span in the original file (1-based)
    end_line: int
    rule: str
    before: str
    after: str
    records: tuple[Record, ...]


@dataclass
class FileEdit:
    """Every change to one file: its text before and after, and the digest of the text read."""

    path: Path  # absolute
    label: str  # the file relative to the project root (the diff's a/ and b/ names)
    old: str
    new: str
    digest: str
    changes: list[Change] = field(default_factory=list)

    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.old.splitlines(keepends=True), self.new.splitlines(keepends=True),
                                            f"a/{self.label}", f"b/{self.label}"))


@dataclass(frozen=True)
class Skipped:
    """A record that got no edit, and why (a sentence naming what would be needed)."""

    record: Record
    why: str

    def text(self) -> str:
        return f"{self.record.file}:{self.record.line}: {self.record.what}: {self.why}"


def records_of(data: dict[str, Any]) -> list[Record]:
    """The fallbacks, refusals and dtype findings with a user site in a routing-log document
    (``run --report-json``'s, or ``RoutingLog.to_dict()``), one per (kind, op, file, line, parent)."""
    out: dict[tuple[Any, ...], Record] = {}
    for row in data.get("ops") or []:
        site = row.get("site") or {}
        if row.get("route") not in ("fallback", "refused") or not site.get("file") or not site.get("line"):
            continue
        rec = Record(row["route"], row["op"], str(site["file"]), int(site["line"]), str(row.get("code") or ""),
                     str(row.get("reason") or ""), row.get("parent"), None, int(row.get("calls") or 0))
        out.setdefault((rec.kind, rec.op, rec.file, rec.line, rec.parent), rec)
    for row in (data.get("dtypes") or {}).get("findings") or []:
        site = row.get("site") or {}
        if not site.get("file") or not site.get("line"):
            continue
        rec = Record("dtype", row["op"], str(site["file"]), int(site["line"]), str(row.get("code") or ""),
                     str(row.get("message") or ""), None, str(row.get("dtype")), int(row.get("calls") or 0))
        out.setdefault((rec.kind, rec.op, rec.file, rec.line, rec.dtype), rec)
    return list(out.values())


# --- the rewrites: a call's LibCST node -> the replacement expression's text ---------------------------
def _cst() -> Any:
    try:
        import libcst
    except ImportError as exc:  # a dev dependency here; `fix` names it
        raise UsageError(format_error("torch-adapter fix", "libcst installed (it edits the source)",
                                      f"no libcst ({exc})", fix="pip install libcst")) from None
    return libcst


_SIMPLE = ("Name", "Attribute", "Subscript", "Call", "Integer", "Float", "SimpleString")


def _operand(module: Any, node: Any) -> str:
    text = module.code_for_node(node)
    return text if type(node).__name__ in _SIMPLE else f"({text})"


def _positional(call: Any) -> list[Any] | None:
    """The call's positional argument nodes, or None when it has keywords or ``*args``."""
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    return [a.value for a in call.args]


def _einsum(module: Any, call: Any, names: set[str]) -> str | None:
    if not names & {"torch.einsum", "torch.functional.einsum"}:
        return None
    args = _positional(call)
    cst = _cst()
    if not args or not isinstance(args[0], cst.SimpleString):
        return None
    ops = args[1:]
    if len(ops) == 1 and isinstance(ops[0], (cst.List, cst.Tuple)):
        if any(isinstance(e, cst.StarredElement) for e in ops[0].elements):
            return None
        ops = [e.value for e in ops[0].elements]
    from .rewrite import einsum_expression

    return einsum_expression(args[0].evaluated_value, [_operand(module, o) for o in ops])


def _hypot(module: Any, call: Any, names: set[str]) -> str | None:
    args = _positional(call)
    if args is None:
        return None
    if "torch.hypot" in names and len(args) == 2:
        a, b = args
    elif not names and type(call.func).__name__ == "Attribute" and call.func.attr.value == "hypot" and len(args) == 1:
        a, b = call.func.value, args[0]
    else:
        return None
    ta, tb = module.code_for_node(a), module.code_for_node(b)
    if ta.isidentifier() and tb.isidentifier():
        return f"torch.sqrt({ta} * {ta} + {tb} * {tb})"
    return f"torch.sqrt(torch.square({ta}) + torch.square({tb}))"  # each operand evaluated once


def _pdist(module: Any, call: Any, names: set[str]) -> str | None:
    if not names & {"torch.pdist", "torch.nn.functional.pdist"}:
        return None
    args = [a for a in call.args]
    if len(args) != 1 or args[0].keyword is not None or args[0].star:  # p = 2 only (p=... changes the norm)
        return None
    x = _operand(module, args[0].value)
    if not x.isidentifier():
        return None  # x is used three times: only a plain name is evaluated once
    return (f"torch.cdist({x}, {x})[tuple(torch.triu_indices({x}.shape[0], {x}.shape[0], 1, "
            f"device={x}.device))]")


Rewriter = Callable[[Any, Any, "set[str]"], "str | None"]

# aten op (the one that fell back, or the composite op it was a piece of) -> (rule name, rewriter)
REWRITES: dict[str, tuple[str, Rewriter]] = {
    "aten::einsum": ("einsum as matmul/transpose/sum", _einsum),
    "aten::hypot": ("hypot as sqrt(a*a + b*b)", _hypot),
    "aten::_pdist_forward": ("pdist as the upper triangle of cdist", _pdist),
}
# a refused dtype -> what replaces it at the line (attribute spelled torch.X, and the Tensor method)
DTYPE_REWRITES: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "float64": (("torch.float64", "torch.double"), "float32", "double", "float"),
}


def _rule_for(rec: Record) -> tuple[str, Rewriter] | None:
    for op in (rec.op, rec.parent):
        if not op:
            continue
        base = op.split(".")[0] if op.count("::") == 1 else op
        if base in REWRITES:
            return REWRITES[base]
    return None


def plan_source(source: str, records: list[Record]) -> tuple[str, list[Change], list[Skipped]]:
    """Edit ``source`` (a module's text) at the lines of ``records``: the new text, the changes, and
    the records that got none (with why)."""
    cst = _cst()
    from libcst.helpers import get_full_name_for_node
    from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        why = f"LibCST cannot parse it ({str(exc).splitlines()[0]})"
        return source, [], [Skipped(r, why) for r in records]
    module = wrapper.module
    pos = wrapper.resolve(PositionProvider)
    qnames = wrapper.resolve(QualifiedNameProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    by_line: dict[int, list[Record]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    replace: dict[Any, tuple[Any, str, list[Record]]] = {}  # original node -> (new node, rule, records)
    skipped: list[Skipped] = []

    def nodes_at(line: int, kind: type) -> list[Any]:
        found = [n for n, p in pos.items() if isinstance(n, kind) and p.start.line <= line <= p.end.line]
        return sorted(found, key=lambda n: (pos[n].start.line, pos[n].start.column))

    def qualified(node: Any) -> set[str]:
        found = qnames.get(node, ())
        found = found() if callable(found) else found  # newer LibCST resolves lazily
        names = {q.name for q in found}
        if not names:  # a name this source does not bind (a cell using an earlier cell's `import torch`)
            dotted = get_full_name_for_node(node)
            if dotted and "(" not in dotted and dotted.split(".")[0] in ("torch", "F"):
                names = {dotted if not dotted.startswith("F.") else "torch.nn.functional." + dotted[2:]}
        return names

    def names_of(node: Any) -> set[str]:
        return qualified(node.func) if isinstance(node, cst.Call) else set()

    for line, recs in sorted(by_line.items()):
        for rec in recs:
            if rec.kind == "dtype":
                if rec.dtype not in DTYPE_REWRITES:
                    skipped.append(Skipped(rec, f"no source rewrite is known for dtype {rec.dtype}"))
                    continue
                spellings, to_attr, method, to_method = DTYPE_REWRITES[rec.dtype]
                hits = 0
                for node in nodes_at(line, cst.Attribute):
                    if pos[node].start.line != line:
                        continue
                    if qualified(node) & set(spellings):
                        replace.setdefault(node, (lambda u, a=to_attr: u.with_changes(attr=cst.Name(a)),
                                                  f"{rec.dtype} -> {to_attr}", []))[2].append(rec)
                        hits += 1
                for node in nodes_at(line, cst.Call):
                    f = node.func
                    if (pos[node].end.line == line and isinstance(f, cst.Attribute) and f.attr.value == method
                            and not node.args):
                        def swap(u: Any, m: str = to_method) -> Any:
                            return u.with_changes(func=u.func.with_changes(attr=cst.Name(m)))

                        replace.setdefault(node, (swap, f".{method}() -> .{to_method}()", []))[2].append(rec)
                        hits += 1
                if not hits:
                    skipped.append(Skipped(rec, f"no {' / '.join(spellings)} or .{method}() is written at this "
                                                f"line: the {rec.dtype} comes from elsewhere (a NumPy array, a "
                                                "loaded tensor, a library); convert it where it is made"))
                continue
            rule = _rule_for(rec)
            if rule is None:
                skipped.append(Skipped(rec, "no source-level expression native on the target is known for this op "
                                            "(the rewrite table: check/fix.py REWRITES)"))
                continue
            name, fn = rule
            hits = 0
            for node in nodes_at(line, cst.Call):
                if node in replace and replace[node][1] == name:  # another record of the same call
                    replace[node][2].append(rec)
                    hits += 1
                    continue
                text = fn(module, node, names_of(node))
                if text is None or node in replace:
                    continue
                try:
                    cst.parse_expression(text)  # the rewriter's text is an expression (else no edit)
                except cst.ParserSyntaxError:
                    continue

                def build(u: Any, node: Any = node, fn: Rewriter = fn, names: set[str] = names_of(node)) -> Any:
                    text = fn(module, u, names)  # on the updated node: edits inside it are kept
                    expr = cst.parse_expression(text) if text is not None else u
                    return _parenthesized(expr, node, parents.get(node))

                replace[node] = (build, name, [rec])
                hits += 1
            if not hits:
                skipped.append(Skipped(rec, f"no call at this line has a rewrite ({name}): the call's form "
                                            "(keywords, *args, an unusual einsum equation) has no exact equivalent"))

    if not replace:
        return source, [], skipped

    built: dict[Any, Any] = {}

    class _Swap(cst.CSTTransformer):
        def on_leave(self, original: Any, updated: Any) -> Any:
            hit = replace.get(original)
            if hit is None:
                return updated
            built[original] = hit[0](updated)
            return built[original]

    new_module = wrapper.module.visit(_Swap())
    changes = []
    outer = [n for n in replace if not any(m is not n and _inside(pos, n, m) for m in replace)]
    for node in sorted(outer, key=lambda n: (pos[n].start.line, pos[n].start.column)):
        _, rule, recs = replace[node]
        inner = [r for m in replace if m is not node and _inside(pos, m, node) for r in replace[m][2]]
        changes.append(Change(pos[node].start.line, pos[node].end.line, rule, module.code_for_node(node),
                              new_module.code_for_node(built[node]), tuple(recs) + tuple(inner)))
    return new_module.code, changes, skipped


def _parenthesized(new: Any, old: Any, parent: Any) -> Any:
    """``new`` in place of the call ``old``: an operator expression (``q @ k.transpose(-2, -1)``) is put in
    parentheses unless it stands alone (an assignment's value, an argument, a return value, a list item),
    so that ``a / torch.einsum(...)`` never becomes ``a / q @ k``."""
    cst = _cst()
    if old.lpar:  # the call was parenthesized already: keep those
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    alone = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Arg, cst.Expr, cst.Element,
             cst.DictElement, cst.IndexedElement if hasattr(cst, "IndexedElement") else cst.Element)
    operator = isinstance(new, (cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation, cst.Comparison))
    if operator and not isinstance(parent, alone):
        return new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return new


def _inside(pos: Any, inner: Any, outer: Any) -> bool:
    a, b = pos[inner], pos[outer]
    return (b.start.line, b.start.column) <= (a.start.line, a.start.column) and \
        (a.end.line, a.end.column) <= (b.end.line, b.end.column)


def line_map(old: str, new: str) -> Callable[[int], int]:
    """The line of ``new`` that line ``n`` of ``old`` became (an edited block's lines map into the new block)."""
    ops = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).get_opcodes()

    def to_new(n: int) -> int:
        i = n - 1
        for tag, i1, i2, j1, j2 in ops:
            if i1 <= i < i2 or (tag == "insert" and i == i1):
                if tag == "equal":
                    return j1 + (i - i1) + 1
                return j1 + min(i - i1, max(j2 - j1 - 1, 0)) + 1
        return n
    return to_new


# --- which files may be edited ---------------------------------------------------------------------------
def resolve(rec_file: str, root: Path, run_cwd: Path) -> tuple[Path | None, str]:
    """A recorded site's file as an absolute path inside ``root`` (its real path), or None and why."""
    if rec_file.startswith("<") or rec_file.startswith("cell ["):
        return None, "the line is in a notebook cell or generated code, not a file (use `%adapter fix` in the notebook)"
    path = Path(rec_file) if os.path.isabs(rec_file) else run_cwd / rec_file
    try:
        real = path.resolve(strict=True)
    except OSError as exc:
        return None, f"the file {path} cannot be found ({exc.strerror or exc}); was it moved since the run?"
    root_real = root.resolve()
    if root_real != real and root_real not in real.parents:
        how = " (a symbolic link out of it)" if path.absolute() != real and (root_real in path.absolute().parents) else ""
        return None, (f"the file {real} is outside the project {root_real}{how}; fix edits only files under the "
                      "project (--path sets it)")
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return None, f"{path} is a symbolic link (to {real}); edit the file it points to, or run fix there"
    if not stat.S_ISREG(st.st_mode):
        return None, f"{path} is not a regular file"
    return real, ""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan(records: Iterable[Record], root: Path, run_cwd: Path, texts: dict[str, str] | None = None
         ) -> tuple[list[FileEdit], list[Skipped]]:
    """The edits of the project files under ``root`` answering ``records`` (sites relative to
    ``run_cwd``, the recorded run's working directory), and the records without one. ``texts``: the
    current text of files already edited (by their label), which the records' lines refer to."""
    by_file: dict[Path, list[Record]] = {}
    skipped: list[Skipped] = []
    for rec in records:
        path, why = resolve(rec.file, root, run_cwd)
        if path is None:
            skipped.append(Skipped(rec, why))
            continue
        by_file.setdefault(path, []).append(rec)
    edits = []
    root_real = root.resolve()
    for path, recs in sorted(by_file.items()):
        label = path.relative_to(root_real).as_posix()
        try:
            text = (texts or {}).get(label)
            if text is None:
                text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            skipped.extend(Skipped(r, f"the file cannot be read ({exc})") for r in recs)
            continue
        new, changes, skip = plan_source(text, recs)
        skipped.extend(skip)
        if changes:
            edits.append(FileEdit(path, label, text, new, digest(text), changes))
    return edits, skipped
