"""Call sites in notebook cells are named by execution count and line (`cell [11], line 6`),
never by the kernel's temp file: the lookup, the text, and the profiler export."""

from __future__ import annotations

import pytest
import torch
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output

from torch_adapter.core import callsite as _callsite
from torch_adapter.tools import chrome_trace as _chrome_trace


@pytest.fixture(scope="module")
def ip():
    return globalipapp.start_ipython() or globalipapp.get_ipython()


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
