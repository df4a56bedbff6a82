"""Compiled code under observation (issue 35, item 4): the same graphs and results as without it, and
the report says what compiled (routing/compiled.py, routing/trace.py, launch/summary.py).

One CUDA-written program with four compiled parts — a ``fullgraph=True`` in-place optimizer step, a
small ``nn.Module`` under ``torch.compile`` (inductor), a function with deliberate graph breaks (a
``print``; a ``.item()``) and one that recompiles on a new shape — runs

  (a) under plain python (CPU, no adapter: the baseline),
  (b) ``torch-adapter run``, (c) ``torch-adapter run --report --report-json``,
  (d) inside ``torch_adapter.trace()`` in-process, (e) as a cell of a real IPython shell with
  ``%load_ext torch_adapter`` (per-cell observation on),

each in its own interpreter (dynamo's state is per process). dynamo's counters (frames total/ok,
unique graphs, ops captured, graph-break reasons) and its recompiles must be those of (a), the
results equal to (a)'s; the report's "compiled" facts must say the same numbers, with the graph
breaks' lines. Compiling is not the program's work: the op observer of ``trace()`` and of a cell
does not count the ops dynamo runs on fake tensors while compiling (a call that compiles counts the
ops of one that does not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

PROGRAM = '''\
import json, sys, torch

dev = "cuda" if torch.cuda.is_available() else "cpu"  # CUDA-written: under the adapter, "cuda"


@torch.compile(fullgraph=True)
def update(p, g, buf):  # an optimizer's in-place step (SGD with momentum)
    buf.mul_(0.9).add_(g)
    p.add_(buf, alpha=-0.1)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def with_break(x):
    y = x.sin()
    print("between graphs")  # PRINT_BREAK
    return y.cos() + 1


def scalar_break(x):
    y = x.sum()
    return x * y.item()  # ITEM_BREAK


def shapes(x):  # SHAPES_DEF
    return x * 2 + 1


def main():
    torch.manual_seed(0)
    out = {}
    p, g, buf = (torch.full((4,), v, device=dev) for v in (1.0, 0.5, 0.0))
    for _ in range(2):
        update(p, g, buf)
    out["update"] = p
    out["module"] = torch.compile(Small().to(dev))(torch.ones(2, 4, device=dev))
    out["break"] = torch.compile(with_break)(torch.ones(3, device=dev))
    out["item"] = torch.compile(scalar_break, backend="eager")(torch.ones(3, device=dev))
    s = torch.compile(shapes, backend="eager")
    out["shape3"], out["shape5"] = s(torch.ones(3, device=dev)), s(torch.ones(5, device=dev))
    return out


def facts():
    from torch._dynamo.utils import counters, get_compilation_metrics
    return {"frames": dict(counters["frames"]), "unique_graphs": counters["stats"]["unique_graphs"],
            "calls_captured": counters["stats"]["calls_captured"], "graph_breaks": dict(counters["graph_break"]),
            "recompiles": [[m.co_name, m.recompile_reason] for m in get_compilation_metrics() if m.recompile_reason]}


def dump(out, **more):
    print("RESULT " + json.dumps({"facts": facts(), "device": dev, **more,
                                  "results": {k: v.detach().cpu().tolist() for k, v in out.items()}}), flush=True)


if __name__ == "__main__":
    dump(main())
'''


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if f"# {marker}" in text)


# (d): the program's main() in a trace() block; then, dynamo warm, a compiled function's first call
# (it compiles) and its second (it does not) each in a block of their own, and a block that compiles nothing
TRACE_DRIVER = '''\
import json, runpy, sys, torch, torch_adapter
torch_adapter.install("cpu")
ns = runpy.run_path("prog.py", run_name="observed")
with torch_adapter.trace() as log:
    out = ns["main"]()
ns["dump"](out, compiled=log.compiled(), source=log.meta.get("source"))
f = torch.compile(lambda x: (x.sin() + 1).sum(), backend="eager")
x = torch.ones(3, device="cuda")
with torch_adapter.trace() as first:
    f(x)
with torch_adapter.trace() as second:
    f(x)
with torch_adapter.trace() as idle:
    torch.ones(2, device="cuda") + 1
print("MORE " + json.dumps({"first": first.summary(), "second": second.summary(), "compiled_first": first.compiled(),
                           "idle": idle.compiled(), "idle_ops": len(idle)}))
'''

# (e): the program as one cell of a real IPython shell with the extension loaded, then a compiled
# function's first call and its second call, each a cell of its own
IPYTHON_DRIVER = '''\
import os, sys
from IPython.testing import globalipapp
ip = globalipapp.start_ipython() or globalipapp.get_ipython()
ip.run_line_magic("load_ext", "torch_adapter")
from torch_adapter.jupyter import extension
source = open("prog.py").read().replace('if __name__ == "__main__":', "if False:")
result = ip.run_cell(source + "\\nout = main()\\n")
assert result.success, result.error_in_exec
ip.user_ns["dump"](ip.user_ns["out"], compiled=extension.router().last_log.compiled())
cells = []
for code in ("f = torch.compile(lambda x: (x.sin() + 1).sum(), backend='eager')\\nx = torch.ones(3, device='cuda')\\n",
             "f(x)\\n", "f(x)\\n"):
    assert ip.run_cell(code).success
    cells.append(extension.router().last_log.summary())
import json
print("MORE " + json.dumps({"first": cells[1], "second": cells[2]}))
sys.stdout.flush()
os._exit(0)  # (IPython and dynamo at interpreter exit: torch's own ignored KeyError, also without the adapter)
'''


def _run(tmp_path: Path, argv: list[str], driver: str | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    if driver is not None:
        (tmp_path / "driver.py").write_text(driver)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    got = json.loads(next(ln for ln in lines if ln.startswith("RESULT ")).removeprefix("RESULT "))
    for ln in lines:  # what a driver measured after the program
        if ln.startswith("MORE "):
            got.update(json.loads(ln.removeprefix("MORE ")))
    return got, out


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    """(a) the program under plain python: no adapter, CPU tensors."""
    got, _ = _run(tmp_path_factory.mktemp("plain"), ["prog.py"])
    assert got["device"] == "cpu"
    return got


def _same_as_plain(got: dict, plain: dict, mode: str) -> None:
    assert got["device"] == "cuda", f"{mode}: the program did not run adapted"
    assert got["facts"] == plain["facts"], (f"{mode}: dynamo compiled differently than under plain python:\n"
                                            f"  {mode}: {got['facts']}\n  plain: {plain['facts']}")
    assert got["results"].keys() == plain["results"].keys()
    for name, want in plain["results"].items():
        torch.testing.assert_close(torch.tensor(got["results"][name]), torch.tensor(want),
                                   msg=lambda m: f"{mode}: {name} differs from plain python's: {m}")


def _facts_say_what_compiled(compiled: dict | None, plain: dict, where: str) -> None:
    """The report's compile facts give plain python's numbers, the breaks' lines and the recompile."""
    p = plain["facts"]
    assert compiled is not None, "the report says nothing of what compiled"
    assert compiled["errors"] == []
    assert compiled["graphs"] == p["unique_graphs"] == 8
    assert compiled["frames"] == {"total": p["frames"]["total"], "ok": p["frames"]["ok"]}
    assert compiled["graph_break_count"] == sum(p["graph_breaks"].values()) == 2
    assert compiled["recompile_count"] == len(p["recompiles"]) == 1
    assert [r["function"] for r in compiled["recompiles"]] == ["shapes"]
    assert compiled["recompiles"][0]["reason"] == p["recompiles"][0][1]
    functions = {f["function"]: f for f in compiled["functions"]}
    assert set(functions) == {"update", "forward", "with_break", "scalar_break", "shapes"}
    assert sum(f["graphs"] for f in compiled["functions"]) == p["unique_graphs"]
    assert functions["update"]["graphs"] == 1 and functions["with_break"]["graphs"] == 2
    breaks = {b["function"]: b for b in compiled["graph_breaks"]}
    assert set(breaks) == {"with_break", "scalar_break"}
    assert {b["reason"] for b in compiled["graph_breaks"]} == set(p["graph_breaks"])
    for function, marker in (("with_break", "PRINT_BREAK"), ("scalar_break", "ITEM_BREAK")):
        site = breaks[function]["site"]
        assert (Path(site["file"]).name, site["line"]) == ("prog.py", _line(marker)) or (
            where == "cell" and site["line"] == _line(marker)), site
    assert "print" in breaks["with_break"]["summary"] and "item()" in breaks["scalar_break"]["summary"]


def test_plain_torch_compiles_what_the_matrix_expects(plain):
    p = plain["facts"]
    assert p["unique_graphs"] == 8 and sum(p["graph_breaks"].values()) == 2 and len(p["recompiles"]) == 1


def test_run_without_report_compiles_as_plain_python(tmp_path, plain):
    got, _ = _run(tmp_path, ["-m", "torch_adapter", "run", "prog.py"])
    _same_as_plain(got, plain, "torch-adapter run")


def test_run_report_compiles_as_plain_python_and_says_what_compiled(tmp_path, plain):
    got, out = _run(tmp_path, ["-m", "torch_adapter", "run", "--report", "--report-json", "report.json", "prog.py"])
    _same_as_plain(got, plain, "torch-adapter run --report")
    report = json.loads((tmp_path / "report.json").read_text())
    _facts_say_what_compiled(report.get("compiled"), plain, "run")
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(("compiled:", "  graph break", "  recompiled"))]
    assert lines[0].startswith("compiled: 8 graphs in 5 functions (update, prog.py:"), lines
    assert lines[0].endswith(", 2 graph breaks, 1 recompile") and len(lines[0]) <= 100, lines[0]
    assert "  (ops inside compiled code are not counted per op)" in out.stderr.splitlines()
    assert f"  graph break at prog.py:{_line('PRINT_BREAK')} in with_break: " in lines[1]
    assert f"  graph break at prog.py:{_line('ITEM_BREAK')} in scalar_break: " in lines[2]
    assert lines[3].startswith(f"  recompiled shapes (prog.py:{_line('SHAPES_DEF')}): tensor 'x' size mismatch")


def test_trace_compiles_as_plain_python_says_what_compiled_and_counts_no_compile_work(tmp_path, plain):
    got, _ = _run(tmp_path, ["driver.py"], TRACE_DRIVER)
    _same_as_plain(got, plain, "trace()")
    assert got["source"].startswith("observer"), got["source"]  # the cheap observer, as by default
    _facts_say_what_compiled(got["compiled"], plain, "trace")
    # a compiled function's first call (it compiles, on fake tensors) counts the ops of its second
    assert sum(got["second"].values()) > 0 and got["first"] == got["second"], (got["first"], got["second"])
    assert got["compiled_first"]["graphs"] == 1 and got["compiled_first"]["functions"][0]["function"] == "<lambda>"
    assert got["idle"] is None and got["idle_ops"] > 0  # nothing compiled: nothing said


def test_notebook_cell_compiles_as_plain_python_says_what_compiled_and_counts_no_compile_work(tmp_path, plain):
    got, _ = _run(tmp_path, ["driver.py"], IPYTHON_DRIVER)
    _same_as_plain(got, plain, "IPython cell")
    _facts_say_what_compiled(got["compiled"], plain, "cell")
    assert sum(got["second"].values()) > 0 and got["first"] == got["second"], (got["first"], got["second"])


def test_report_says_nothing_of_compiling_when_nothing_compiled(tmp_path):
    (tmp_path / "plain_ops.py").write_text("import torch\nprint((torch.ones(3, device='cuda') * 2).sum().item())\n")
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--report", "--report-json", "r.json",
                          "plain_ops.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch_adapter on cpu:" in out.stderr and "compiled" not in out.stderr
    assert "compiled" not in json.loads((tmp_path / "r.json").read_text())


def test_a_failing_compile_facts_reader_reports_itself_and_the_program_goes_on(tmp_path):
    """dynamo's counters made unreadable after a compile: the report says what failed, the script's
    output and exit code are its own."""
    (tmp_path / "broken.py").write_text(textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: x * 2, backend="eager")
        print(f(torch.ones(2, device="cuda")).tolist())
        import torch._dynamo.utils
        torch._dynamo.utils.counters["stats"] = "not a Counter"
        print("the script went on")
    """))
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--report", "--report-json", "r.json",
                          "broken.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-2:] == ["[2.0, 2.0]", "the script went on"]
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("compiled:"))
    assert line.startswith("compiled: not known, the program was not affected: reading what compiled failed "
                           "(ValueError"), line
    assert json.loads((tmp_path / "r.json").read_text())["compiled"]["errors"]


def test_the_fullgraph_step_of_the_issue_is_one_line_of_run_report_and_of_report_full(tmp_path):
    (tmp_path / "fg.py").write_text(textwrap.dedent("""\
        import torch

        @torch.compile(fullgraph=True)
        def update(p, g):
            p.add_(g, alpha=-0.1)

        p, g = torch.ones(4, device="cuda"), torch.ones(4, device="cuda")
        update(p, g)
        print(p.tolist())
    """))
    want = "compiled: 1 graph (update, fg.py:3), 0 graph breaks; ops inside compiled code are not counted per op"
    for report in ("--report", "--report=full"):
        out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", report, "fg.py"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.splitlines()[-1]) == pytest.approx([0.9] * 4)
        assert [ln for ln in out.stderr.splitlines() if ln.startswith("compiled:")] == [want], (report, out.stderr)
