"""Call sites as the user reads them. In notebook cells by execution count and line (`cell [11],
line 6`), never by the kernel's temp file: the lookup, the text, the profiler export, and every
op's line — a custom op's fallback too (issue 34). A file under the working directory by its path
relative to it (`helpers.py:5`, not a temporary copy's full path; issue 34, tutorial 02): in the
kernel's reports and in `torch-adapter run --report-json`."""

from __future__ import annotations

import json
import re

import pytest
import torch
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output

from conftest import run_cli
from torch_adapter.core import callsite as _callsite
from torch_adapter.jupyter import schema
from torch_adapter.tools import chrome_trace as _chrome_trace


@pytest.fixture(scope="module")
def ip():
    return globalipapp.start_ipython() or globalipapp.get_ipython()


@pytest.fixture
def adapted(ip):
    """The shell with `%load_ext torch_adapter` (unloaded after the test)."""
    ip.run_line_magic("load_ext", "torch_adapter")
    yield ip
    ip.run_line_magic("unload_ext", "torch_adapter")


def _run(ip, code):
    """Run a cell as the user does; its routing bundle (the cell's report) and the captured output."""
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec or result.error_before_exec
    found = [o.data for o in cap.outputs if schema.MIME in o.data]
    return (found[0] if found else None), cap


def _trace_html(ip, body):
    """``%%adapter_trace`` of ``body``: the table's HTML as the notebook shows it."""
    with capture_output() as cap:
        ip.run_cell_magic("adapter_trace", "", body)
    (html,) = [o.data["text/html"] for o in cap.outputs if "torch-adapter-trace" in o.data.get("text/html", "")]
    return html


def _row(html, op):
    (row,) = [r for r in re.findall(r"<tr data-route='\w+' data-depth='0'>.*?</tr>", html) if f"{op}</code>" in r]
    return row


def test_a_cell_file_is_named_by_its_execution_count(ip):
    name = ip.compile.cache("x = 1\n", 11)
    assert _callsite.cell_of(name) == 11
    assert _callsite.cell_of(__file__) is None
    assert _callsite.site_text({"file": name, "line": 6}) == "cell [11], line 6"
    assert _callsite.site_text({"file": "/src/train.py", "line": 3}) == "/src/train.py:3"
    assert _callsite.site_text({"file": "/src/train.py", "line": 3}, short=True) == "train.py:3"
    assert _callsite.site_text(None) == ""


def test_a_site_recorded_in_a_cell_carries_the_cell(ip):
    ip.user_ns["_callsite"] = _callsite
    with capture_output():
        ip.run_cell("site = _callsite.user_site(0)", store_history=True)
    site = ip.user_ns["site"]
    assert site["cell"] == ip.execution_count - 1 and site["line"] == 1


def test_the_profile_export_names_cells(ip):
    name = ip.compile.cache("def step():\n    pass\n", 7)
    trace = {"traceEvents": [{"ph": "X", "cat": "python_function", "name": f"{name}(2): step", "ts": 0, "dur": 1},
                             {"ph": "X", "cat": "python_function", "name": "/src/train.py(4): main", "ts": 0, "dur": 1}],
             "torch_adapter": {"routing": {"ops": [{"op": "aten::mode", "site": {"file": name, "line": 2}},
                                                   {"op": "aten::mm", "site": None}]}}}
    _chrome_trace.name_cells(trace, _callsite.cell_of)
    assert [e["name"] for e in trace["traceEvents"]] == ["cell [7], line 2: step", "/src/train.py(4): main"]
    assert trace["torch_adapter"]["routing"]["ops"][0]["site"]["text"] == "cell [7], line 2"


def test_a_recorded_profile_in_a_cell_exports_cell_sites(ip, tmp_path):
    import torch_adapter

    ip.user_ns.update(torch=torch, torch_adapter=torch_adapter)
    with capture_output():
        ip.run_cell("with torch_adapter.profiler.record('cells', with_stack=True):\n"
                    "    y = torch.ones(4).sum()\n", store_history=True)
    count = ip.execution_count - 1
    assert count in ip.compile._filename_map.values()
    trace = torch_adapter.profiler.last().trace()
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "python_function"]
    assert not any("ipython-input" in n for n in names)
    assert f"cell [{count}], line 1: <module>" in names, [n for n in names if "cell" in n]


def test_a_custom_ops_fallback_names_the_cell_and_line(adapted):
    """Issue 34: notebook 03's custom op, with a CPU kernel only, on a simulated MPS. Its fallback line
    in the cell's report had no site (`CPU fallback demo::bias_gelu ×1: ...`) where an aten op's has
    one: the engine did not run custom ops, so nothing recorded where they were called from."""
    ip = adapted
    ip.run_line_magic("adapter", "target mps --simulate")
    _run(ip, "import torch\n"
             "@torch.library.custom_op('cell_sites::bias_gelu', mutates_args=(), device_types='cpu')\n"
             "def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:\n"
             "    return torch.nn.functional.gelu(x + bias, approximate='tanh')\n")
    bundle, _ = _run(ip, "x = torch.randn(16, 8).cuda()\nbias = torch.randn(8).cuda()\ny = bias_gelu(x, bias)\n")
    cell = ip.execution_count - 1
    where = f"cell [{cell}], line 3"
    (line,) = [t for t in bundle["text/plain"].splitlines() if "cell_sites::bias_gelu" in t]
    assert line.startswith("  CPU fallback cell_sites::bias_gelu ×1 at ") and f" at {where}: " in line, line
    assert where in bundle["text/html"]
    (fallback,) = [f for f in bundle[schema.MIME]["top_fallbacks"] if f["op"] == "cell_sites::bias_gelu"]
    assert fallback["site"] == where
    # the trace's row: the cell's line 2 (line 1 is %%adapter_trace), and the copies the fallback made
    row = _row(_trace_html(ip, "y = bias_gelu(x, bias)\n"), "cell_sites::bias_gelu")
    assert "fallback" in row and f"cell [{ip.execution_count}], line 2" in row and "KiB" in row, row


def test_a_file_under_the_working_directory_is_named_relative_to_it(adapted, tmp_path, monkeypatch):
    """Tutorial 02 imports its working copy's modules by path (importlib.util.spec_from_file_location)
    and works in that copy: the cell's report and the trace name `helpers.py:5`, not the copy's full
    temporary path. A file outside the working directory keeps its full path."""
    ip = adapted
    copy = tmp_path / "sd15-port-abc" / "project"
    copy.mkdir(parents=True)
    (copy / "helpers.py").write_text("import torch\n\n\ndef distances(x):\n    return torch.pdist(x)\n")
    monkeypatch.chdir(copy)
    ip.run_line_magic("adapter", "target mps --simulate")
    ip.user_ns["helpers_path"] = str(copy / "helpers.py")
    _run(ip, "import importlib.util, torch\n"
             "spec = importlib.util.spec_from_file_location('cell_sites_helpers', helpers_path)\n"
             "helpers = importlib.util.module_from_spec(spec)\n"
             "spec.loader.exec_module(helpers)\n"
             "emb = torch.randn(6, 3, device='cuda')\n")
    bundle, _ = _run(ip, "d = helpers.distances(emb)\n")
    (fallback,) = [f for f in bundle[schema.MIME]["top_fallbacks"] if f["op"] == "aten::_pdist_forward"]
    assert fallback["site"] == "helpers.py:5"
    assert "aten::_pdist_forward ×1 at helpers.py:5: " in bundle["text/plain"]
    html = _trace_html(ip, "d = helpers.distances(emb)\n")
    assert ">helpers.py:5<" in _row(html, "aten::_pdist_forward")
    assert str(tmp_path) not in html + bundle["text/html"] + bundle["text/plain"]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the copy is no longer under the working directory
    assert _callsite.site_text({"file": str(copy / "helpers.py"), "line": 5}) == f"{copy / 'helpers.py'}:5"


def test_run_report_json_names_the_projects_files_relative_to_where_it_ran(tmp_path):
    """`cd project && torch-adapter run --report-json routing.json train.py`: the script is `train.py`
    (as Python names it), and so is the module it imports from its folder — `helpers.py`, not the
    folder's full path — in the op sites and the redirects alike (tutorial 02 cells 13 and 15)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "helpers.py").write_text("import torch\n\n\ndef on_gpu(x):\n    return x.cuda()\n\n\n"
                                        "def distances(x):\n    return torch.pdist(x)\n")
    (project / "train.py").write_text("import torch\n\nimport helpers\n\n"
                                      "emb = helpers.on_gpu(torch.randn(6, 3))\nd = helpers.distances(emb)\n"
                                      "z = torch.zeros(2).cuda()\n")
    done = run_cli("run", "--target", "mps", "--simulate", "--report-json", "routing.json", "train.py", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (project / "routing.json").read_text()
    data = json.loads(text)
    redirects = {(r["file"], r["line"]) for r in data["redirects"] if r["asked"] == "Tensor.cuda()"}
    assert redirects == {("helpers.py", 5), ("train.py", 7)}, data["redirects"]
    (pdist,) = [r for r in data["ops"] if r["op"] == "aten::_pdist_forward"]
    assert (pdist["site"]["file"], pdist["site"]["line"]) == ("helpers.py", 9)
    assert str(project) not in text
