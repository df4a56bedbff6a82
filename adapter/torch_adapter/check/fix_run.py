"""``torch-adapter fix``'s runs: the program before and after each edit, compared; the write on request.

Every run is of a fresh copy of the project (in a temporary folder, the project itself never runs nor
is written to until ``--apply``): ``python -m torch_adapter run --target T [--simulate --dtype-check
record | --emulate] --report-json … SCRIPT ARGS`` in the copy's working directory, ``PYTHONHASHSEED``
fixed. An edit (``check/fix.py``) is **verified** when the changed copy's run

1. ends with the same exit code as the unchanged copy's,
2. records no fallback, refusal or dtype finding at the changed line (the line the edit became), and
   no new (op, file) fallback anywhere else,
3. gives the **same results within tolerance**: its standard output, line by line, with the same text
   and every number within ``atol + rtol·|before|`` (``--match REGEX`` compares only the lines that
   match, ``--ignore REGEX`` leaves lines out — timings, memory figures); and each ``--compare-file``
   the program writes (``torch.load``-ed with ``weights_only=True``: tensors, numbers, dicts, lists
   compared the same way, values as float64 so that a float64 → float32 edit compares its values).

All edits are run together first; when that run fails and there are several, each is run alone to name
the ones at fault, and the rest together again. :func:`apply` writes only files under the project root,
regular files (no symbolic link), owned by this user and writable, whose text is still what fix read
(its SHA-256), each atomically (``core/safe_io``); one failing check writes nothing at all.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError, format_error
from .fix import Change, FileEdit, Record, Skipped, digest, line_map, plan, records_of

__all__ = ["Options", "Run", "FixResult", "fix", "apply", "relabel", "compare_output", "compare_values", "FixError"]

_COPY_IGNORE = (".git", "__pycache__", ".ipynb_checkpoints", ".mypy_cache", ".pytest_cache", ".ruff_cache")
_COPY_LIMIT = 512 * 1024 * 1024  # bytes a project copy may hold


class FixError(UsageError):
    """A fix that cannot go on (exit 2): the program failed before any change, a file cannot be written."""


@dataclass
class Options:
    script: str
    args: list[str]
    root: Path
    target: str = "auto"
    simulate: bool = False
    emulate: bool = False
    rtol: float = 1e-4
    atol: float = 1e-6
    match: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    compare_files: list[str] = field(default_factory=list)
    timeout: float = 600.0
    call: str = "torch-adapter fix"


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    records: list[Record]
    folder: Path  # the temporary folder (the copy is under it)
    cwd: Path  # the run's working directory inside the copy


@dataclass
class FixResult:
    records: list[Record]
    verified: list[FileEdit]  # the edits that passed (built from the verified changes only)
    refused: list[tuple[Change, str, str]]  # (change, file label, why)
    skipped: list[Skipped]
    baseline: Run | None = None
    resolved: list[Skipped] = field(default_factory=list)  # no edit of their own, gone with the verified ones

    @property
    def complete(self) -> bool:
        return not self.refused and not self.skipped


# --- running a copy ------------------------------------------------------------------------------------
def _copy_project(root: Path, into: Path) -> Path:
    size = 0

    def ignore(folder: str, names: list[str]) -> set[str]:
        nonlocal size
        out = {n for n in names if n in _COPY_IGNORE}
        for n in names:
            if n not in out:
                try:
                    st = os.lstat(os.path.join(folder, n))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
        if size > _COPY_LIMIT:
            raise FixError(format_error("torch-adapter fix", f"a project of at most {_COPY_LIMIT >> 20} MiB to copy "
                                        "for each verifying run", f"{root} (more than that)",
                                        why="every edit is verified on a fresh copy of the project",
                                        fix="point --path at the folder that holds the program and its modules"))
        return out

    dest = into / (root.name or "project")
    shutil.copytree(root, dest, symlinks=True, ignore=ignore)
    return dest


def relabel(records: list[Record], cwd: Path, root: Path) -> list[Record]:
    """Sites named relative to ``root`` (the project, or its copy), as the edits name files."""
    out = []
    for r in records:
        if r.file.startswith("<") or r.file.startswith("cell ["):
            out.append(r)
            continue
        path = Path(os.path.normpath(Path(r.file) if os.path.isabs(r.file) else cwd / r.file))
        try:
            label = path.relative_to(root).as_posix()
        except ValueError:
            label = str(path)
        out.append(Record(r.kind, r.op, label, r.line, r.code, r.reason, r.parent, r.dtype, r.calls))
    return out


def run_copy(opts: Options, files: dict[str, str] | None = None) -> Run:
    """The program run once on a fresh copy of the project, ``files`` (label → text) written into it."""
    folder = Path(tempfile.mkdtemp(prefix="torch-adapter-fix-"))
    try:
        copy = _copy_project(opts.root, folder)
        for label, text in (files or {}).items():
            (copy / label).write_text(text, encoding="utf-8")
        cwd = Path.cwd().resolve()
        rel = cwd.relative_to(opts.root) if cwd == opts.root or opts.root in cwd.parents else Path(".")
        run_cwd = copy / rel
        script = Path(opts.script).resolve()
        script_in_copy = copy / script.relative_to(opts.root)
        report = folder / "routing.json"
        cmd = [sys.executable, "-m", "torch_adapter", "run", "--target", opts.target]
        if opts.simulate:
            cmd += ["--simulate", "--dtype-check", "record"]  # every refusal recorded, the program goes on
        if opts.emulate:
            cmd += ["--emulate"]
        cmd += ["--report-json", str(report), str(script_in_copy), *opts.args]
        env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
        try:
            done = subprocess.run(cmd, cwd=run_cwd, env=env, capture_output=True, text=True, timeout=opts.timeout)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code = 124
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = f"(stopped after --timeout {opts.timeout:g} s)"
        out, err = out.replace(str(copy), str(opts.root)), err.replace(str(copy), str(opts.root))
        records: list[Record] = []
        if report.is_file():
            records = relabel(records_of(json.loads(report.read_text())), run_cwd, copy)
        return Run(code, out, err, records, folder, run_cwd)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


# --- comparing results -----------------------------------------------------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?\b(?:nan|inf)\b", re.IGNORECASE)


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(a)


def compare_output(before: str, after: str, rtol: float, atol: float, match: list[str] = (),
                   ignore: list[str] = ()) -> str | None:
    """None when ``after`` prints what ``before`` printed (text equal, numbers within tolerance), else why."""
    def lines(text: str) -> list[tuple[int, str]]:
        keep = []
        for i, line in enumerate(text.splitlines(), 1):
            if match and not any(re.search(m, line) for m in match):
                continue
            if any(re.search(x, line) for x in ignore):
                continue
            keep.append((i, line))
        return keep

    a, b = lines(before), lines(after)
    for (i, la), (_, lb) in zip(a, b):
        if _NUMBER.sub("#", la) != _NUMBER.sub("#", lb):
            return f"output line {i} changed: {la.strip()!r} became {lb.strip()!r}"
        for x, y in zip(_NUMBER.findall(la), _NUMBER.findall(lb)):
            fx, fy = float(x), float(y)
            if not _close(fx, fy, rtol, atol):
                return (f"output line {i}: {x} became {y} (|difference| {abs(fx - fy):.3g} > tolerance "
                        f"{atol + rtol * abs(fx):.3g}: --rtol {rtol:g} --atol {atol:g})")
    if len(a) != len(b):
        return f"the output has {len(b)} compared lines, before {len(a)}"
    if not a and match:
        return f"no output line matches --match {' '.join(map(repr, match))}: nothing to compare"
    return None


def compare_values(a: Any, b: Any, rtol: float, atol: float, where: str = "") -> str | None:
    """None when ``b`` equals ``a`` within tolerance (tensors, numbers, dicts, lists, tuples), else why."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where or 'the value'}: a tensor on one side only"
        if a.shape != b.shape:
            return f"{where or 'the tensor'}: shape {tuple(a.shape)} became {tuple(b.shape)}"
        if a.is_complex() or b.is_complex() or a.is_floating_point() or b.is_floating_point():
            x, y = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64), \
                b.detach().cpu().to(torch.complex128 if b.is_complex() else torch.float64)
            if not torch.allclose(y, x, rtol=rtol, atol=atol, equal_nan=True):
                diff = (y - x).abs().nan_to_num(float("inf")).max().item()
                return f"{where or 'the tensor'}: largest |difference| {diff:.3g} (--rtol {rtol:g} --atol {atol:g})"
            return None
        return None if torch.equal(a.cpu(), b.cpu()) else f"{where or 'the tensor'}: its values changed"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where or 'the dict'}: keys {sorted(map(str, set(a) ^ set(b)))[:5]} on one side only"
        for k in a:
            why = compare_values(a[k], b[k], rtol, atol, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where or 'the sequence'}: length {len(a)} became {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            why = compare_values(x, y, rtol, atol, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return None if _close(float(a), float(b), rtol, atol) else f"{where or 'the number'}: {a} became {b}"
    return None if a == b else f"{where or 'the value'}: {a!r} became {b!r}"


def _compare_files(opts: Options, before: Run, after: Run) -> str | None:
    import torch

    for name in opts.compare_files:
        loaded = []
        for run in (before, after):
            path = run.cwd / name
            if not path.is_file():
                return f"--compare-file {name}: the program wrote no such file{' after the change' if run is after else ''}"
            try:
                loaded.append(torch.load(path, map_location="cpu", weights_only=True))
            except Exception as exc:
                return f"--compare-file {name}: torch.load(weights_only=True) cannot read it ({type(exc).__name__}: {exc})"
        why = compare_values(loaded[0], loaded[1], opts.rtol, opts.atol, name)
        if why:
            return why
    return None


# --- verifying edits -------------------------------------------------------------------------------------
def _tail(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n    ".join(lines[-n:])


def _verify(opts: Options, edits: list[FileEdit], base: Run, runs: list[Run], texts: dict[str, str]
            ) -> tuple[str | None, Run]:
    """(None, the run) when the program with ``edits`` (on top of ``texts``, the changes verified before)
    passes every check, else (why, the run): why names the file and line."""
    run = run_copy(opts, {**texts, **{e.label: e.new for e in edits}})
    runs.append(run)
    if run.code != base.code:
        return f"the changed program exited with {run.code} (before: {base.code}):\n    {_tail(run.stderr)}", run
    changed: dict[str, set[int]] = {}
    for e in edits:
        to_new = line_map(e.old, e.new)
        for c in e.changes:
            changed.setdefault(e.label, set()).update(range(to_new(c.line), to_new(c.end_line) + 1))
    left = [r for r in run.records if r.line in changed.get(r.file, ())]
    if left:
        return "still recorded at the changed line: " + "; ".join(f"{r.file}:{r.line} {r.what}" for r in left), run
    before = {(r.kind, r.op, r.file) for r in base.records}
    new = [r for r in run.records if (r.kind, r.op, r.file) not in before]
    if new:
        return "the change makes other ops fall back: " + "; ".join(f"{r.file}:{r.line} {r.what}" for r in new), run
    why = compare_output(base.stdout, run.stdout, opts.rtol, opts.atol, opts.match, opts.ignore)
    return why or _compare_files(opts, base, run), run


Unit = tuple[FileEdit, Change]


def _search(opts: Options, edits: list[FileEdit], base: Run, runs: list[Run], texts: dict[str, str]
            ) -> tuple[list[FileEdit], list[tuple[Unit, str]], Run | None]:
    """The largest set of changes found to pass together (all; else all but one, the one whose removal
    makes the rest pass; else those that pass alone, if they pass together), the refused ones with why,
    and the passing run."""
    def replan(units: list[Unit]) -> list[FileEdit]:
        return plan([r for _, c in units for r in c.records], opts.root, opts.root, texts)[0]

    units = [(e, c) for e in edits for c in e.changes]
    why, run = _verify(opts, edits, base, runs, texts)
    if why is None:
        return edits, [], run
    if len(units) == 1:
        return [], [(units[0], why)], None
    for u in units:  # one change at fault (its effect reaches the results), the rest depending on each other
        rest = replan([x for x in units if x is not u])
        w, r = _verify(opts, rest, base, runs, texts)
        if w is None:
            return rest, [(u, why)], r
    refused, good = [], []
    for u in units:
        w, _ = _verify(opts, replan([u]), base, runs, texts)
        (refused.append((u, w)) if w else good.append(u))
    if not good:
        return [], refused, None
    together = replan(good)
    w, r = _verify(opts, together, base, runs, texts)
    if w is not None:
        return [], refused + [(u, f"each passes alone, not together: {w}") for u in good], None
    return together, refused, r


MAX_ROUNDS = 8  # a log keeps the first site of each op: fixing it shows the next one in the next run


def _key(r: Record) -> tuple[Any, ...]:
    return (r.kind, r.op, r.file, r.line, r.parent, r.dtype)


def fix(opts: Options, records: list[Record] | None = None) -> FixResult:
    """Run the program, plan edits for ``records`` (default: what this run recorded; sites relative to
    the project root), verify them, and return what passed and what did not — nothing is written.

    In rounds: a routing log names the first site of each op only, so once the edits of a round are
    verified, the records of that verified run (the next sites of the same ops) are planned on top of them,
    until a round finds nothing new. A record without an edit of its own that the last verified run no
    longer has (a float64 made from one the edits changed) is ``resolved``, not skipped."""
    opts.root = opts.root.resolve()
    runs: list[Run] = []
    try:
        base = run_copy(opts)
        runs.append(base)
        if base.code != 0:
            raise FixError(format_error(
                f"{opts.call} {opts.script}", "a program that runs to the end on the target before any change",
                f"exit code {base.code}", why=f"its results are what every edit is compared with:\n    {_tail(base.stderr)}",
                fix="make it run under `torch-adapter run` first (the same --target flags)"))
        pending = list(base.records if records is None else records)
        result = FixResult(list(pending), [], [], [], base)
        texts: dict[str, str] = {}  # label -> verified text
        originals: dict[str, FileEdit] = {}  # label -> the file as read (old, digest, path)
        changes: dict[str, list[Change]] = {}
        tried: set[tuple[Any, ...]] = set()
        skipped: list[tuple[Skipped, str]] = []  # with the text its line refers to
        last = base
        for _ in range(MAX_ROUNDS):
            pending = [r for r in pending if _key(r) not in tried]
            tried.update(_key(r) for r in pending)
            if not pending:
                break
            edits, skip = plan(pending, opts.root, opts.root, texts)
            skipped.extend((s, texts.get(s.record.file, "")) for s in skip)
            if not edits:
                break
            for e in edits:
                originals.setdefault(e.label, e)
            verified, refused, run = _search(opts, edits, base, runs, texts)
            for (e, c), why in refused:
                back = line_map(e.old, originals[e.label].old)
                result.refused.append((_moved(c, back), e.label, why))
            if not verified or run is None:
                break
            for e in verified:
                back = line_map(e.old, originals[e.label].old)
                changes.setdefault(e.label, []).extend(_moved(c, back) for c in e.changes)
                texts[e.label] = e.new
            last = run
            pending = list(run.records)
        for label, text in texts.items():
            o = originals[label]
            result.verified.append(FileEdit(o.path, label, o.old, text, o.digest,
                                            sorted(changes[label], key=lambda c: c.line)))
        still = {_key(r) for r in last.records}
        for s, text in skipped:
            r = s.record
            if r.file in texts and text != texts[r.file]:  # its line: in the text it was read in
                now = line_map(text or originals[r.file].old, texts[r.file])(r.line)
                r = Record(r.kind, r.op, r.file, now, r.code, r.reason, r.parent, r.dtype, r.calls)
            (result.skipped if _key(r) in still or last is base else result.resolved).append(s)
        return result
    finally:
        for run in runs:
            shutil.rmtree(run.folder, ignore_errors=True)


def _moved(c: Change, back: Any) -> Change:
    """``c`` with its lines in the original file's numbering."""
    return Change(back(c.line), back(c.end_line), c.rule, c.before, c.after, c.records)


# --- writing ---------------------------------------------------------------------------------------------
def _write_problem(edit: FileEdit, root: Path) -> str | None:
    path = root / edit.label
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"it cannot be read any more ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"it is now a symbolic link (to {os.path.realpath(path)})"
    real = path.resolve()
    if root != real and root not in real.parents:
        return f"it lies outside the project {root}"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); fix edits only your own files"
    if not os.access(path, os.W_OK) or not (st.st_mode & stat.S_IWUSR):
        return "it is not writable (its mode is read-only)"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"it cannot be read ({exc})"
    if digest(text) != edit.digest:
        return "it changed since fix read it (its SHA-256 differs): run fix again on the current text"
    return None


def apply(edits: list[FileEdit], root: Path, call: str = "torch-adapter fix --apply") -> list[Path]:
    """Write ``edits`` to the files under ``root``: every file checked first (one problem: nothing is
    written, one FixError naming each file and why), then each replaced atomically."""
    from ..core.safe_io import write_text

    root = root.resolve()
    problems = [(e, p) for e in edits if (p := _write_problem(e, root)) is not None]
    if problems:
        got = "; ".join(f"{e.label} (line {e.changes[0].line}): {p}" for e, p in problems)
        raise FixError(format_error(call, "files under the project that are yours, writable and as fix read them",
                                    got, why="a patch is written only to the text it was made and verified for; "
                                             "nothing was written",
                                    fix="correct what is named (chown/chmod, or run fix again after an edit)"))
    written = []
    for e in edits:
        written.append(write_text(root / e.label, e.new, call=call))
    return written
