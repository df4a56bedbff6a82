"""The runtime part of check: the routing log joined into the report (from JSON files
written here), its validation, and one end-to-end --run through `torch_adapter run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torch_adapter.check.cli import main as check_main
from torch_adapter.check.engine import scan
from torch_adapter.check.runtime import join_runtime, load_routing_log, parse_command, validate_routing_log
from torch_adapter.errors import CheckError

TRAIN = """import torch
x = torch.randn(8, 8).cuda()
idx = torch.nonzero(x > 0)
m = torch.median(x)
y = (x @ x).sum()
"""


def _op(op, route, calls, file, line, ms=0.5, copied=0, reason="", via=None, parent=None):
    return {"op": op, "route": route, "calls": calls, "self_time_ms": ms, "bytes_copied": copied,
            "reason": reason, "via": via, "parent": parent,
            "site": {"file": str(file), "line": line, "function": "<module>"} if file else None}


@pytest.fixture
def project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    return proj


def routing_log(proj: Path) -> dict:
    train = proj / "train.py"
    return {
        "schema": "torch-adapter.routing-log", "version": 1, "target": "mps", "simulated": True,
        "summary": {"native": 30, "composite": 5, "fallback": 7},
        "ops": [
            _op("aten::mm", "native", 20, train, 5),
            _op("aten::gt.Scalar", "native", 10, "train.py", 3),  # relative to the run's cwd
            _op("aten::randn", "composite", 5, train, 2, via="CompositeImplicitAutograd"),
            _op("aten::nonzero", "fallback", 4, train, 3, ms=2.0, copied=256, reason="no MPS kernel"),
            _op("aten::median", "fallback", 2, train, 4, ms=1.0, copied=128, reason="no MPS kernel"),
            _op("aten::nonzero", "fallback", 1, "/usr/lib/python3/somelib.py", 10, reason="no MPS kernel",
                parent="aten::where"),
            _op("aten::sort", "fallback", 1, None, 0),
        ],
        "redirects": [{"file": str(train), "line": 2, "function": "<module>", "kind": "device",
                       "asked": "Tensor.cuda()", "became": "cpu", "count": 1}],
    }


def test_join_runtime(project):
    report = scan(project, target="mps")
    join_runtime(report, routing_log(project), command=["python train.py"], exit_code=0, cwd=project)
    rt = report.runtime
    assert rt.target == "mps" and rt.simulated
    assert rt.calls_by_route == {"native": 30, "composite": 5, "yours": 0, "fallback": 8, "refused": 0}
    assert rt.ops_by_route == {"native": 2, "composite": 1, "yours": 0, "fallback": 3, "refused": 0}  # a version-1 log: three routes
    assert abs(sum(rt.shares.values()) - 1) < 1e-9 and rt.shares["fallback"] == pytest.approx(8 / 43)
    assert [r.route for r in rt.ops][:4] == ["fallback"] * 4  # fallbacks first
    top = rt.top_fallbacks
    assert [g.op for g in top] == ["aten::nonzero", "aten::median", "aten::sort"]
    assert top[0].calls == 5 and top[0].bytes_copied == 256
    assert [(s.file, s.line, s.in_project) for s in top[0].sites] == [
        ("train.py", 3, True), ("/usr/lib/python3/somelib.py", 10, False)]
    assert top[0].sites[0].excerpt == "idx = torch.nonzero(x > 0)"
    gt = next(r for r in rt.ops if r.op == "aten::gt.Scalar")
    assert gt.site.file == "train.py" and gt.site.in_project
    rt_findings = [(f.rule_id, f.start_line) for f in report.findings if f.rule_id.startswith("RT")]
    assert rt_findings == [("RT001", 3), ("RT001", 4)]
    (nz,) = [f for f in report.findings if f.rule_id == "RT001" and f.start_line == 3]
    assert "aten::nonzero (4 calls" in nz.message and "mps" in nz.message and nz.severity == "review"
    (cuda,) = [f for f in report.findings if f.rule_id == "DEV001"]
    assert cuda.runtime == "ran: Tensor.cuda() -> cpu (1x)"
    assert report.rules["RT001"]["source"] == "runtime"
    data = report.to_dict()["runtime"]
    assert data["summary"]["calls"]["fallback"] == 8 and data["top_fallbacks"][0]["sites"][0]["line"] == 3


def test_failed_command_points_at_the_project_line(project):
    report = scan(project)
    tail = ["Traceback (most recent call last):",
            f'  File "{project / "train.py"}", line 4, in <module>',
            "    m = torch.median(x)",
            '  File "/usr/lib/python3/site-packages/torch/x.py", line 9, in median',
            "RuntimeError: boom"]
    join_runtime(report, routing_log(project), exit_code=1, stderr_tail=tail, cwd=project)
    (f,) = [f for f in report.findings if f.rule_id == "RT002"]
    assert f.start_line == 4 and f.severity == "unsupported" and "RuntimeError: boom" in f.message
    report2 = scan(project)
    join_runtime(report2, routing_log(project), exit_code=3, stderr_tail=["Killed"], cwd=project)
    assert ("run-failed", "the command exited with status 3: Killed") in {(n.kind, n.message) for n in report2.notes}


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.update(schema="other"), r"expected \{\"schema\": \"torch-adapter.routing-log\""),
    (lambda d: d.update(version=3), r"'version': 3"),
    (lambda d: d.update(ops={}), r'"ops": a list'),
    (lambda d: d["ops"][0].update(route="gpu"), r"ops\[0\]"),
    (lambda d: d["ops"][0].update(calls="many"), r'"calls": int'),
    (lambda d: d["ops"][0].update(site={"file": 3}), r"ops\[0\].site"),
])
def test_routing_log_validation(project, mutate, pattern):
    data = routing_log(project)
    mutate(data)
    with pytest.raises(CheckError, match=pattern):
        validate_routing_log(data, "log.json")


def test_load_routing_log_errors(tmp_path):
    with pytest.raises(CheckError, match=r"(?s)a readable JSON file.*Why: No such file"):
        load_routing_log(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CheckError, match=r"expected valid JSON"):
        load_routing_log(bad)


@pytest.mark.parametrize("command, expected", [
    ("python train.py --steps 1", ["--", "train.py", "--steps", "1"]),
    ("python3.11 'my script.py'", ["--", "my script.py"]),
    ("python -m pkg.train --lr 0.1", ["-m", "--", "pkg.train", "--lr", "0.1"]),
    ("train.py -x", ["--", "train.py", "-x"]),
])
def test_parse_command(command, expected):
    assert parse_command(command) == expected


@pytest.mark.parametrize("command, pattern", [
    ("torchrun --nproc-per-node 2 train.py", r"\"python SCRIPT \[ARGS\]\""),
    ("python -u train.py", r"\"python SCRIPT \[ARGS\]\""),
    ("python 'unbalanced", r"(?s)shell-like command.*Fix: balance the quotes"),
])
def test_parse_command_errors(command, pattern):
    with pytest.raises(CheckError, match=pattern):
        parse_command(command)


def test_run_end_to_end(project, monkeypatch, capsys):
    monkeypatch.chdir(project)  # (needs `torch-adapter run --report-json`: part of the project, never skipped)
    out = project.parent / "report.json"
    code = check_main(["--path", ".", "--target", "mps", "--simulate", "--run", "python train.py --steps 1",
                       "--output", str(out), "--quiet"])
    assert code == 0
    data = json.loads(out.read_text())
    rt = data["runtime"]
    assert rt["target"] == "mps" and rt["simulated"] and rt["exit_code"] == 0
    assert sum(rt["summary"]["calls"].values()) > 0
    assert {r["site"]["file"] for r in rt["ops"] if r["site"]} == {"train.py"}
    (cuda,) = [f for f in data["findings"] if f["rule_id"] == "DEV001"]
    assert cuda["runtime"] and "Tensor.cuda()" in cuda["runtime"]


def test_run_without_log_is_an_error(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    code = check_main(["--path", ".", "--run", "python missing.py", "--quiet"])
    assert code == 2
    assert "wrote no routing log" in capsys.readouterr().err


def test_run_traced_reports_an_interpreter_that_cannot_start(project, monkeypatch):
    from torch_adapter.check.runtime import run_traced

    monkeypatch.setattr(sys, "executable", str(project / "no-python"))
    with pytest.raises(CheckError, match=r"(?s)expected a command that can start.*Why: No such file"):
        run_traced("python train.py", cwd=str(project))
