"""The static scan: files in, a :class:`~.model.Report` out.

:func:`scan` discovers the files (:mod:`.discover`), checks each one -- Python through
the AST matcher (:mod:`.pyscan`), notebooks cell by cell (:mod:`.notebook`), C/C++/CUDA,
shell and config files line by line (:mod:`.textscan`) -- and turns rule hits into
findings with the message for ``target``, a code excerpt and a rewrite diff. Large trees
are checked in worker processes. User code is read, never imported or executed.

Fast path: a Python file that contains none of the rules' trigger words is not parsed.
"""

from __future__ import annotations

import ast
import os
import sys
import textwrap
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable

from .discover import DEFAULT_EXCLUDES, DEFAULT_MAX_SIZE, Source, discover, read_text
from .limits import TARGET_NAMES
from .model import FileResult, Finding, Note, Report
from .notebook import read_cells, split_cell
from .matchutil import Hit, candidate_lines, present, top_level_chunks
from .pyscan import PythonMatcher
from .rewrite import rewrite_text, unified_diff
from .ruleset import Rule, RuleSet, build_ruleset
from .textscan import scan_lines

__all__ = ["scan", "Checker", "target_facts", "TARGET_NAMES", "PARALLEL_THRESHOLD"]

PARALLEL_THRESHOLD = 200  # files; below this one process is faster than starting workers
_BATCH = 24
_EXCERPT_LINES = 6
_EXCERPT_WIDTH = 240
_CHUNK_MIN_LINES = 150  # shorter files are parsed whole


def target_facts(target: str) -> dict[str, str]:
    """The values of message placeholders for ``target`` (``any``: generic wording)."""
    from ..routing.target import KNOWN
    from .rules import TARGET_AMP

    if target == "any" or target not in KNOWN:
        return {"target": "the target", "device": "<target>:0", "device_type": "<target>",
                "backend": "the target's backend (gloo on cpu, hccl on npu, xccl on xpu, nccl on cuda)",
                "amp": TARGET_AMP["any"], "dispatch_key": "the target's dispatch key"}
    device_type, key, backend = KNOWN[target]
    return {"target": target, "device": "cpu" if device_type == "cpu" else f"{device_type}:0",
            "device_type": device_type, "backend": backend,
            "amp": TARGET_AMP.get(target, "float16, the dtype the code asks for (the AMP policy 'auto'; set with "
                                          "torch_adapter.configure(amp_dtype=...))"),
            "dispatch_key": key}


def _excerpt(lines: list[str], start: int, end: int) -> str:
    chunk = lines[start - 1:min(end, start + _EXCERPT_LINES - 1)]
    text = textwrap.dedent("\n".join(chunk)).rstrip()
    out = [(ln[:_EXCERPT_WIDTH] + " …") if len(ln) > _EXCERPT_WIDTH else ln for ln in text.split("\n")]
    if end - start + 1 > _EXCERPT_LINES:
        out.append(f"… ({end - start + 1 - _EXCERPT_LINES} more lines)")
    return "\n".join(out)


def _parse(text: str, filename: str) -> ast.AST:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings about user code are not ours
        return ast.parse(text, filename=filename)


def _settle(hits: Iterable[Hit]) -> list[Hit]:
    """One hit per (rule, line); secondary (catch-all) hits only on lines no primary hit has."""
    hits = list(hits)
    primary_lines = {h.start for h in hits if not h.rule.secondary}
    seen: set[tuple[str, int]] = set()
    out = []
    for h in sorted(hits, key=lambda h: (h.start, h.col, h.rule.order)):
        key = (h.rule.id, h.start)
        if key in seen or (h.rule.secondary and h.start in primary_lines):
            continue
        seen.add(key)
        out.append(h)
    return out


class Checker:
    """Checks single files for one target; one per process."""

    def __init__(self, ruleset: RuleSet, target: str = "any", max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.rs = RuleSet([r for r in ruleset.rules if r.applies_to(target)])
        self.target = target
        self.max_size = max_size
        facts = target_facts(target)
        self.render = {r.id: (r.severity_for(target), r.message.format_map(facts),
                              r.alternative.format_map(facts)) for r in self.rs.rules}

    # --- one file ------------------------------------------------------------------------
    def check(self, src: Source) -> FileResult:
        result = FileResult(src.rel, src.language)
        text, notes = read_text(src, self.max_size)
        result.notes.extend(notes)
        if text is None:
            return result
        if src.language == "python":
            hits, notes, parsed = self._python(text, src.rel)
            result.notes.extend(notes)
            result.parsed = parsed
            lines = text.split("\n")
            result.findings = [self._finding(h, lines, src.rel, "python") for h in _settle(hits)]
        elif src.language == "notebook":
            self._notebook(text, src.rel, result)
        else:
            suffix = Path(src.rel).suffix
            hits = scan_lines(text, src.language, self.rs, suffix=suffix)
            result.parsed = True
            lines = text.split("\n")
            result.findings = [self._finding(h, lines, src.rel, src.language) for h in _settle(hits)]
        return result

    def _python(self, text: str, rel: str, matcher: PythonMatcher | None = None,
                first_line: int = 1) -> tuple[list[Hit], list[Note], bool]:
        lowered = text.lower()
        gated = matcher is None and not self.rs.python_always
        found = present(lowered, self.rs.python_triggers) if gated else ()
        if gated and not found and not self.rs.text["python"]:
            return [], [], False
        lines = text.split("\n")
        # gated: only statements on lines with a trigger word (plus imports) are walked
        candidates = candidate_lines(lowered, found) if gated else None
        extra = scan_lines(text, "python", self.rs) if self.rs.text["python"] else []
        if candidates is not None and len(lines) > _CHUNK_MIN_LINES:
            hits = self._match_chunks(PythonMatcher(self.rs), lines, candidates)
            if hits is not None:
                return hits + extra, [], True
        try:
            tree = _parse(text, rel)
        except SyntaxError as exc:
            line = (exc.lineno or 1) + first_line - 1
            return scan_lines(text, "python-text", self.rs), [Note(
                rel, "syntax-error", f"Python cannot parse it ({exc.msg}, line {line}): "
                                     "CUDA mentions were matched as text", line)], True
        except (RecursionError, MemoryError, ValueError) as exc:
            return scan_lines(text, "python-text", self.rs), [Note(
                rel, "syntax-error", f"Python cannot parse it ({type(exc).__name__}): "
                                     "CUDA mentions were matched as text")], True
        hits = (matcher or PythonMatcher(self.rs)).match(tree, candidates, lines)
        return hits + extra, [], True

    @staticmethod
    def _match_chunks(m: PythonMatcher, lines: list[str], candidates: list[int]) -> list[Hit] | None:
        """Parse and match only the top-level chunks that matter -- in order, so imports and
        tracked names carry forward; None when a chunk does not parse on its own."""
        hits: list[Hit] = []
        for lo, hi in top_level_chunks(lines):
            if lo > 1 and not m.relevant_span(lo, hi, candidates, lines):
                continue
            try:
                tree = _parse("\n" * (lo - 1) + "\n".join(lines[lo - 1:hi]), "")
            except (SyntaxError, RecursionError, MemoryError, ValueError):
                return None
            hits += m.match(tree, candidates, lines)
        return hits

    def _notebook(self, text: str, rel: str, result: FileResult) -> None:
        try:
            cells, problems = read_cells(text)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            result.notes.append(Note(rel, "notebook-invalid", f"not a readable notebook: {exc}"))
            return
        result.notes.extend(Note(rel, "notebook-invalid", p) for p in problems)
        result.parsed = True
        matcher = PythonMatcher(self.rs)  # one per notebook: imports carry over between cells
        for cell in cells:
            parts = split_cell(cell.source)
            lines = cell.source.split("\n")
            hits: list[tuple[Hit, str]] = []
            if parts.python is not None and parts.python.strip():
                py_hits, notes, _ = self._python(parts.python, rel, matcher)
                for n in notes:
                    n.message = f"cell {cell.index}: {n.message}"
                    n.line = cell.file_line(n.line) if n.line else None
                result.notes.extend(notes)
                hits += [(h, "python") for h in py_hits]
            for line_no, shell_text in parts.shell:
                hits += [(h, "shell") for h in scan_lines(shell_text, "shell", self.rs, first_line=line_no)]
            if parts.embedded is not None:
                lang, body, suffix = parts.embedded
                hits += [(h, lang) for h in scan_lines(body, lang, self.rs, suffix=suffix, first_line=2)]
            language = dict((id(h), lang) for h, lang in hits)
            for h in _settle(h for h, _ in hits):
                f = self._finding(h, lines, rel, "python" if language[id(h)] == "python" else language[id(h)],
                                  label=f"{rel} (cell {cell.index})")
                f.cell, f.cell_line, f.cell_end_line = cell.index, h.start, h.end
                f.start_line, f.end_line = cell.file_line(h.start), cell.file_line(h.end)
                result.findings.append(f)

    def _finding(self, hit: Hit, lines: list[str], rel: str, language: str, label: str | None = None) -> Finding:
        rule: Rule = hit.rule
        severity, message, alternative = self.render[rule.id]
        diff = None
        if rule.rewrite and hit.node is not None:
            try:
                new = rewrite_text(rule.rewrite, hit.node, lines, hit.qual)
            except (IndexError, UnicodeDecodeError, ValueError, KeyError):
                new = None  # positions that do not fit the text: no rewrite rather than a wrong one
            if new is not None:
                first, last, new_lines = new
                diff = unified_diff(label or rel, first, lines[first - 1:last], new_lines)
        return Finding(rule_id=rule.id, severity=severity, title=rule.title, file=rel,
                       start_line=hit.start, end_line=hit.end, col=hit.col,
                       excerpt=_excerpt(lines, hit.start, hit.end), message=message,
                       alternative=alternative, docs=rule.docs, rewrite=diff, language=language)


# --- worker processes ---------------------------------------------------------------------
_WORKER: Checker | None = None


def _init_worker(user_tables: list, builtin: bool, target: str, max_size: int) -> None:
    global _WORKER
    _WORKER = Checker(build_ruleset(user_tables, builtin=builtin), target, max_size)


def _work(batch: list[Source]) -> list[FileResult]:
    assert _WORKER is not None, "worker not initialised"
    return [_WORKER.check(s) for s in batch]


def _mp_context() -> Any:
    """fork where it is safe (Linux, no other Python thread; workers never touch torch): fast,
    and scripts without an ``if __name__ == "__main__"`` guard work; spawn elsewhere."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return get_context("fork")
    return get_context("spawn")


def _default_jobs() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def scan(path: str | os.PathLike[str], *, user_rules: Iterable[tuple[str, list[dict[str, Any]]]] = (),
         builtin: bool = True, target: str = "any", simulate: bool = False, jobs: int = 1,
         max_file_size: int = DEFAULT_MAX_SIZE, excludes: tuple[str, ...] = DEFAULT_EXCLUDES,
         progress: Callable[[int, int], None] | None = None) -> Report:
    """Check ``path`` (a directory or a file) statically; ``jobs=0`` picks a worker count.

    ``user_rules``: ``(source name, [rule dicts])`` pairs (see :func:`.ruleset.load_rule_file`).
    Raises :class:`~torch_adapter.errors.CheckError` for invalid rules.
    """
    from .._version import __version__

    t0 = time.perf_counter()
    user_tables = [(src, list(items)) for src, items in user_rules]
    ruleset = build_ruleset(user_tables, builtin=builtin)
    root = Path(path).absolute()
    sources, notes = discover(root, excludes=excludes, max_size=max_file_size)
    jobs = _default_jobs() if jobs <= 0 else jobs
    results: list[FileResult] = []
    total = len(sources)
    if jobs == 1 or total < PARALLEL_THRESHOLD:
        checker = Checker(ruleset, target, max_file_size)
        for i, src in enumerate(sources, 1):
            results.append(checker.check(src))
            if progress is not None and (i % 25 == 0 or i == total):
                progress(i, total)
    else:
        batches = [sources[i:i + _BATCH] for i in range(0, total, _BATCH)]
        done = 0
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=_init_worker,
                                 initargs=(user_tables, builtin, target, max_file_size)) as pool:
            futures = [pool.submit(_work, b) for b in batches]
            for fut in as_completed(futures):
                batch_results = fut.result()
                results.extend(batch_results)
                done += len(batch_results)
                if progress is not None:
                    progress(done, total)
    findings = sorted((f for r in results for f in r.findings),
                      key=lambda f: (f.file, f.start_line, f.col, f.rule_id))
    notes = sorted(notes + [n for r in results for n in r.notes], key=lambda n: (n.file, n.line or 0, n.kind))
    fired = {f.rule_id for f in findings}
    report = Report(root=str(root), target=target, simulated=simulate, tool_version=__version__,
                    generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    files_scanned=total, files_parsed=sum(r.parsed for r in results),
                    findings=findings, notes=notes,
                    rules={r.id: r.metadata(target) for r in ruleset.rules if r.id in fired})
    report.elapsed_s = time.perf_counter() - t0
    return report
