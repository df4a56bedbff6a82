"""`torch-adapter check` on the command line: exit codes, outputs, usage errors, and that
nothing but --output is written."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torch_adapter.check.cli import build_parser, main, register
from torch_adapter.check.model import SCHEMA, VERSION
from torch_adapter.check.json_report import load_report_json
from torch_adapter.errors import CheckError

CORPUS = Path(__file__).parent / "data" / "check_corpus"


@pytest.fixture
def proj(tmp_path):
    p = tmp_path / "proj"
    p.mkdir()
    (p / "clean.py").write_text("import torch\nx = torch.zeros(3)\n")
    return p


def _listing(root: Path) -> set[str]:
    return {q.relative_to(root).as_posix() for q in root.rglob("*")}


def test_exit_codes(proj, capsys):
    assert main([str(proj), "-q"]) == 0
    assert main([str(proj), "-q", "--fail-on", "warn"]) == 0
    (proj / "gpu.py").write_text("x = t.cuda()\nif x.is_cuda:\n    pass\n")  # handled + review
    assert main([str(proj), "-q"]) == 0  # default --fail-on error
    assert main([str(proj), "-q", "--fail-on", "warn"]) == 1
    (proj / "fa.py").write_text("import flash_attn\n")  # unsupported
    assert main([str(proj), "-q"]) == 1
    assert main([str(proj), "-q", "--fail-on", "never"]) == 0


@pytest.mark.parametrize("argv, pattern", [
    (["{missing}"], r"(?s)an existing folder or file.*Why: it does not exist"),
    ([], r"a folder or file to check, got no path"),
    (["{proj}", "--output", "{proj}/report.txt"], r"--output ending in .html or .json"),
    (["{proj}", "--output", "{proj}/no/such/dir/r.json"], r"(?s)--output.*the folder does not exist"),
    (["{proj}", "--output", "{proj}"], r"(?s)--output.*it is a folder"),
    (["{proj}", "--output", "/dev/null"], r"(?s)--output.*it is a character device"),
    (["{proj}", "--format", "json"], r"--output FILE with --format"),
    (["{proj}", "--rules", "{proj}/absent.toml"], r"(?s)a readable UTF-8 TOML file.*no such file"),
    (["{proj}", "--rules", "/dev/zero"], r"(?s)--rules.*'/dev/zero'.*a character device, not a regular file"),
    (["{proj}", "--rules", "{proj}"], r"(?s)--rules.*it is a folder"),
    (["{proj}", "--path", "{proj}/other"], r"one path"),
    (["{proj}", "--run", "torchrun x.py"], r"python SCRIPT \[ARGS\]"),
    (["{proj}", "--max-file-size", "0"], r"--max-file-size > 0"),
])
def test_usage_errors_exit_2(proj, tmp_path, capsys, argv, pattern):
    argv = [a.format(proj=proj, missing=tmp_path / "missing") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("torch-adapter check")
    import re

    assert re.search(pattern, err), err


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--target", "tpu", "."])
    assert exc.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_json_output_and_nothing_else_written(tmp_path, capsys):
    work = tmp_path / "corpus"
    import shutil

    shutil.copytree(CORPUS, work, symlinks=True)
    before = _listing(work)
    out = tmp_path / "out" / "report.json"
    out.parent.mkdir()
    assert main([str(work), "--output", str(out), "--target", "npu"]) == 1  # the corpus has ❌ findings
    assert _listing(work) == before
    assert _listing(out.parent) == {"report.json"}  # no temporary file left behind
    data = load_report_json(out.read_text())
    assert data["schema"] == SCHEMA and data["version"] == VERSION and data["target"] == "npu"
    assert data["summary"]["findings"] == len(data["findings"]) > 150
    keys = {"rule_id", "severity", "file", "start_line", "end_line", "excerpt", "message", "alternative",
            "rewrite", "cell", "cell_line", "cell_end_line", "docs", "title", "col", "language", "runtime"}
    assert all(set(f) == keys for f in data["findings"])
    assert any(f["rewrite"] and f["rewrite"].startswith("--- a/") for f in data["findings"])
    assert all(f["cell"] is not None for f in data["findings"] if f["file"].endswith(".ipynb"))
    printed = capsys.readouterr().out
    assert "will not run" in printed and "report written to" in printed


def test_html_output_is_self_contained(proj, tmp_path):
    (proj / "gpu.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    out = tmp_path / "r.html"
    assert main([str(proj), "-o", str(out), "-q"]) == 0
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "gpu.py" in html and "DEV001" in html
    assert "Content-Security-Policy" in html
    for needle in ('src="http', "src='http", '<link rel="stylesheet"', "@import", "cdn."):
        assert needle not in html


def test_output_is_replaced_atomically(proj, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    assert main([str(proj), "-o", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["schema"] == SCHEMA


def test_list_rules(capsys):
    assert main(["--list-rules", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| id | severity |") and "| DEV001 |" in md and "| RT001 |" in md
    assert main(["--list-rules", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in rows} >= {"DEV001", "LIB001", "RT002"}


def test_details_and_terminal_summary(proj, capsys):
    (proj / "gpu.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    assert main([str(proj), "--details"]) == 0
    out = capsys.readouterr().out
    assert "gpu.py:2" in out and "DEV001" in out and "handled" in out


def test_register_adds_check_to_a_parser():
    parser = argparse.ArgumentParser(prog="torch-adapter")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["check", "--path", ".", "--fail-on", "warn"])
    assert args.func.__name__ == "run" and args.path_opt == "." and args.fail_on == "warn"
    assert build_parser().parse_args(["x"]).path == "x"


def test_torch_adapter_cli_and_module_entry_points(proj):
    (proj / "gpu.py").write_text("import flash_attn\n")
    for argv in (["-m", "torch_adapter", "check"], ["-m", "torch_adapter.check"]):
        done = subprocess.run([sys.executable, *argv, str(proj), "-q"], capture_output=True, text=True)
        assert done.returncode == 1, done.stderr


def test_check_error_message_has_five_parts(tmp_path):
    from torch_adapter.check.engine import scan

    with pytest.raises(CheckError, match=r"(?s)check rule 'ORG1' \(x.toml\): expected severity.*Fix: "):
        scan(tmp_path, user_rules=[("x.toml", [{"id": "ORG1", "severity": "bad", "match": {"call": ["a"]},
                                                "message": "m"}])])


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text("x = t.cuda()\n")
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stderr as a terminal
    assert main([str(tmp_path), "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    assert "checking" in captured.err
    monkeypatch.delenv("FORCE_COLOR")
    assert main([str(tmp_path), "--jobs", "1"]) == 0
    assert "checking" not in capsys.readouterr().err  # not a terminal: no bar


@pytest.mark.parametrize("text, pattern", [
    ("{", r"load_report_json\(\): expected a JSON document"),
    ('{"schema": "other", "version": 1}', r"(?s)expected schema 'torch-adapter.check-report' version 2.*Fix: regenerate"),
])
def test_load_report_json_errors(text, pattern):
    with pytest.raises(CheckError, match=pattern):
        load_report_json(text)


# -- safety: check never runs the scanned project, never hangs on what it reads -----------------
_SHADOWED = ("rich", "jinja2", "yaml", "torch", "libcst", "markupsafe", "typing_extensions")


def _hostile_project(root: Path) -> Path:
    """A project whose files are named like check's dependencies; importing one leaves a marker."""
    proj = root / "hostile"
    proj.mkdir()
    for name in _SHADOWED:
        (proj / f"{name}.py").write_text(
            f"import pathlib\npathlib.Path(__file__).with_name('IMPORTED_{name}').write_text('ran')\n"
            f"raise SystemExit('the project\\'s {name}.py ran')\n")
    (proj / "gpu.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    return proj


@pytest.mark.parametrize("entry", ["torch-adapter", "-m torch_adapter check", "-m torch_adapter.check"])
def test_check_never_imports_the_scanned_project(tmp_path, entry):
    import os
    import shutil

    proj = _hostile_project(tmp_path)
    if entry == "torch-adapter":
        exe = shutil.which("torch-adapter")
        assert exe, "the torch-adapter command is installed with the project"
        argv = [exe, "check"]
    else:
        argv = [sys.executable, *entry.split()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith(("adapter", "widgets")))}
    done = subprocess.run([*argv, ".", "--output", "report.html", "--fail-on", "never"], cwd=proj,
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    assert "DEV001" in (proj / "report.html").read_text()
    assert not sorted(p.name for p in proj.glob("IMPORTED_*")), done.stderr


def test_rules_from_a_fifo_are_refused_not_waited_on(proj, tmp_path):
    import os

    fifo = tmp_path / "rules.toml"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "torch_adapter.check", str(proj), "--rules", str(fifo)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "FIFO" in done.stderr and "not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_rules_file_over_the_size_limit_is_refused(proj, tmp_path, capsys):
    from torch_adapter.core.safe_io import READ_LIMIT

    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.truncate(READ_LIMIT + 1)
    assert main([str(proj), "--rules", str(big)]) == 2
    assert "at most" in capsys.readouterr().err


def test_output_keeps_the_mode_of_the_report_it_replaces(proj, tmp_path):
    import os
    import stat

    out = tmp_path / "r.json"
    out.write_text("old")
    os.chmod(out, 0o644)
    assert main([str(proj), "-o", str(out), "-q"]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_output_symlink_is_refused_and_its_target_untouched(proj, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "r.json"
    link.symlink_to(victim)
    assert main([str(proj), "-o", str(link), "-q"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "precious" and link.is_symlink()
