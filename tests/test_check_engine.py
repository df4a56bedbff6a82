"""The static scan: the annotated corpus (every CUDA-specific line found, nothing else),
notebooks (cell and line mapping), and robustness (bad files become notes, the scan goes on,
nothing is written)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from torch_adapter.check import engine
from torch_adapter.check.engine import scan
from torch_adapter.check.textscan import language_of

CORPUS = Path(__file__).parent / "data" / "check_corpus"
EXPECT = re.compile(r"expect: ([A-Z0-9,]+)")


def corpus_expectations(root: Path) -> dict[tuple[str, int | None, int], set[str]]:
    """(file, cell or None, line) -> rule ids, from the ``expect: ID[,ID]`` annotations."""
    out: dict[tuple[str, int | None, int], set[str]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_dir() or language_of(p.name) is None:  # a file check does not read (README.md)
            continue
        rel = p.relative_to(root).as_posix()
        if p.suffix == ".ipynb":
            nb = nbformat.read(p, as_version=4)
            for ci, cell in enumerate(nb.cells):
                if cell.cell_type == "code":
                    for li, line in enumerate(cell.source.split("\n"), 1):
                        if m := EXPECT.search(line):
                            out[(rel, ci, li)] = set(m.group(1).split(","))
            continue
        for li, line in enumerate(p.read_text(encoding="utf-8").split("\n"), 1):
            if m := EXPECT.search(line):
                out[(rel, None, li)] = set(m.group(1).split(","))
    return out


@pytest.fixture(scope="module")
def corpus_report():
    return scan(CORPUS)


def test_corpus_every_cuda_line_and_nothing_else(corpus_report):
    expected = corpus_expectations(CORPUS)
    found: dict[tuple[str, int | None, int], set[str]] = {}
    for f in corpus_report.findings:
        key = (f.file, f.cell, f.cell_line if f.cell is not None else f.start_line)
        found.setdefault(key, set()).add(f.rule_id)
    missing = {k: v - found.get(k, set()) for k, v in expected.items() if v - found.get(k, set())}
    extra = {k: v - expected.get(k, set()) for k, v in found.items() if v - expected.get(k, set())}
    assert not missing, f"CUDA-specific lines not reported: {missing}"
    assert not extra, f"findings on lines not annotated: {extra}"
    assert len(expected) > 150  # the corpus is substantial


def test_corpus_findings_are_complete_records(corpus_report):
    for f in corpus_report.findings:
        assert f.severity in ("handled", "review", "unsupported")
        assert f.start_line >= 1 and f.end_line >= f.start_line
        assert f.message and "{" not in f.message.replace("{}", "")
        assert f.excerpt or f.rule_id == "SRC001"
    assert {n.kind for n in corpus_report.notes} == {"syntax-error"}  # broken.py only
    (note,) = corpus_report.notes
    assert note.file == "broken.py" and note.line == 1


def test_notebook_cells_map_to_ipynb_lines(corpus_report):
    raw = (CORPUS / "notebook.ipynb").read_text().split("\n")
    nb = nbformat.read(CORPUS / "notebook.ipynb", as_version=4)
    nb_findings = [f for f in corpus_report.findings if f.file == "notebook.ipynb"]
    assert {f.cell for f in nb_findings} == {1, 2, 3, 4, 5}
    for f in nb_findings:
        source_line = nb.cells[f.cell].source.split("\n")[f.cell_line - 1]
        stored = json.loads(raw[f.start_line - 1].strip().rstrip(","))
        assert stored.rstrip("\n") == source_line, (f.rule_id, f.cell, f.cell_line)
    magic = [f for f in nb_findings if f.language == "shell"]
    assert {f.rule_id for f in magic} >= {"ENV005", "TXT001"}


def _write_nb(path: Path, sources: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i}"
    nbformat.write(nb, path)


def test_notebook_robustness(tmp_path):
    _write_nb(tmp_path / "ok.ipynb", ["import torch", "def broken(:\n    x.cuda()", "y = torch.zeros(1).cuda()"])
    (tmp_path / "garbage.ipynb").write_text("{not json")
    (tmp_path / "odd.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": "x.cuda()"}],
                                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    report = scan(tmp_path)
    kinds = {(n.file, n.kind) for n in report.notes}
    assert ("garbage.ipynb", "notebook-invalid") in kinds
    assert ("ok.ipynb", "syntax-error") in kinds
    cells = {(f.file, f.cell, f.rule_id) for f in report.findings}
    assert ("ok.ipynb", 1, "ANY005") in cells and ("ok.ipynb", 2, "DEV001") in cells
    assert ("odd.ipynb", 0, "DEV001") in cells  # no outputs/ids: still read, with a note
    assert ("odd.ipynb", "notebook-invalid") in kinds


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_robust_to_bad_files(tmp_path):
    (tmp_path / "good.py").write_text("x = t.cuda()\n")
    (tmp_path / "binary.py").write_bytes(b"\x00\x01\x02cuda\x00")
    (tmp_path / "latin.py").write_bytes("# caf\xe9\nx = t.cuda()\n".encode("latin-1"))
    (tmp_path / "cookie.py").write_bytes("# -*- coding: latin-1 -*-\ns = 'caf\xe9'\nx = t.cuda()\n".encode("latin-1"))
    (tmp_path / "huge.py").write_text("x = 1\n" * 200_000 + "y = t.cuda()\n")
    (tmp_path / "syntax.py").write_text("def f(:\n    return t.cuda()\n")
    (tmp_path / "deep.py").write_text("x = " + "(" * 300 + "t.cuda()" + ")" * 300 + "\n")
    (tmp_path / "long_chain.py").write_text("y = t.cuda()" + " + a" * 20000 + "\n")
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "back").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "alias").symlink_to(tmp_path / "loop", target_is_directory=True)
    (tmp_path / "dangling.py").symlink_to(tmp_path / "missing.py")
    os.mkfifo(tmp_path / "pipe.py")
    before = _tree(tmp_path)
    report = scan(tmp_path, max_file_size=1_000_000)
    assert _tree(tmp_path) == before, "check wrote something into the scanned tree"
    notes = {(n.file, n.kind) for n in report.notes}
    assert {("binary.py", "binary"), ("latin.py", "undecodable"), ("huge.py", "too-large"),
            ("syntax.py", "syntax-error"), ("deep.py", "syntax-error"), ("loop/back", "symlink-loop"),
            ("dangling.py", "broken-symlink"), ("pipe.py", "not-regular")} <= notes
    assert ("alias", "symlink-duplicate") in notes
    by_file = {(f.file, f.rule_id) for f in report.findings}
    assert {("good.py", "DEV001"), ("latin.py", "DEV001"), ("cookie.py", "DEV001"),
            ("syntax.py", "ANY005"), ("deep.py", "ANY005")} <= by_file
    # too deep for Python's compiler or not: the line is reported either way
    assert ("long_chain.py", "DEV001") in by_file or ("long_chain.py", "ANY005") in by_file
    assert not any(n[0] == "cookie.py" for n in notes), "a PEP 263 cookie is honoured"


def test_unreadable_file_is_a_note(tmp_path):
    (tmp_path / "ok.py").write_text("x.cuda()\n")
    # reading /proc/self/mem at offset 0 fails with EIO, even for root
    (tmp_path / "io_error.py").symlink_to("/proc/self/mem")
    report = scan(tmp_path)
    (note,) = [n for n in report.notes if n.file == "io_error.py"]
    assert note.kind == "unreadable" and "Input/output error" in note.message
    assert [f.file for f in report.findings] == ["ok.py"]
    if os.geteuid() != 0:  # a mode-000 file is unreadable for everyone but root
        (tmp_path / "secret.py").write_text("x.cuda()\n")
        (tmp_path / "secret.py").chmod(0)
        try:
            assert ("secret.py", "unreadable") in {(n.file, n.kind) for n in scan(tmp_path).notes}
        finally:
            (tmp_path / "secret.py").chmod(0o644)


def test_single_file_and_excludes(tmp_path):
    (tmp_path / "a.py").write_text("x.cuda()\n")
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "b.py").write_text("x.cuda()\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "c.py").write_text("x.cuda()\n")
    assert [f.file for f in scan(tmp_path / "a.py").findings] == ["a.py"]
    assert {f.file for f in scan(tmp_path).findings} == {"a.py", "vendor/b.py"}
    excludes = engine.DEFAULT_EXCLUDES + ("vendor",)
    assert {f.file for f in scan(tmp_path, excludes=excludes).findings} == {"a.py"}
    assert scan(tmp_path / "notes.txt").notes[0].kind == "unknown-kind"


def test_files_without_trigger_words_are_not_parsed(tmp_path):
    (tmp_path / "plain.py").write_text("def f(:\n    pass\n")  # even a syntax error goes unnoticed
    (tmp_path / "gpu.py").write_text("x = t.cuda()\n")
    report = scan(tmp_path)
    assert report.files_scanned == 2 and report.files_parsed == 1 and not report.notes


def test_worker_processes_give_the_same_report(tmp_path, monkeypatch):
    for i in range(40):
        (tmp_path / f"m{i:02d}.py").write_text(f"import torch\nx{i} = torch.zeros({i}).cuda()\n"
                                               f"torch.cuda.synchronize()\n")
    (tmp_path / "bad.py").write_bytes(b"\x00")
    monkeypatch.setattr(engine, "PARALLEL_THRESHOLD", 10)
    seen = []
    parallel = scan(tmp_path, jobs=2, progress=lambda done, total: seen.append((done, total)))
    serial = scan(tmp_path, jobs=1)
    assert [f.to_dict() for f in parallel.findings] == [f.to_dict() for f in serial.findings]
    assert [n.to_dict() for n in parallel.notes] == [n.to_dict() for n in serial.notes]
    assert seen[-1] == (41, 41)


def test_import_torch_adapter_does_not_load_check():
    code = "import sys, torch_adapter; print([m for m in sys.modules if m.startswith('torch_adapter.check')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_notebooks_without_nbformat(corpus_report):
    """nbformat is optional for the core package: without it cells are read from the JSON."""
    code = ("import sys, json; sys.modules['nbformat'] = None\n"
            "from torch_adapter.check.engine import scan\n"
            f"r = scan({str(CORPUS / 'notebook.ipynb')!r})\n"
            "print(json.dumps([[f.cell, f.cell_line, f.start_line, f.rule_id] for f in r.findings]"
            " + [[n.kind, n.message] for n in r.notes]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    expected = [[f.cell, f.cell_line, f.start_line, f.rule_id] for f in corpus_report.findings
                if f.file == "notebook.ipynb"]
    assert rows[:-1] == expected
    assert rows[-1] == ["notebook-invalid", "nbformat is not installed: cells read from the JSON"]
