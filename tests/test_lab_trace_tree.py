"""Trace trees in a real JupyterLab (Chromium, Playwright): in ``%%adapter_trace``'s table every
child row sits under its own parent — a custom op's pieces under the custom op, a replaced
module's ops under ``optimize::`` — never under the op that happened to be recorded before it
(issue 23, point 3: `└ aten::gelu` once sat under `aten::bitwise_or_.Tensor`)."""

from __future__ import annotations

import nbformat
import pytest

from test_lab_e2e import NEEDS_CHROMIUM, browser_page, lab_with_notebook, run_all

pytestmark = [
    pytest.mark.timeout(600),
    NEEDS_CHROMIUM,
]

NOTEBOOK = "trace_tree.ipynb"
CELLS = [
    "%load_ext torch_adapter",
    "%adapter target mps --simulate",
    "import torch, torch_adapter\n"
    "@torch.library.custom_op('treedemo::bias_gelu', mutates_args=(), device_types='cpu')\n"
    "def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:\n"
    "    return torch.nn.functional.gelu(x + bias, approximate='tanh')\n"
    "@bias_gelu.register_fake\n"
    "def _(x, bias):\n"
    "    return torch.empty_like(x)\n"
    "def norm(self, x):\n"
    "    return torch.nn.functional.layer_norm(x * 1.0, self.normalized_shape, self.weight, self.bias, self.eps)\n"
    "handle = torch_adapter.optimize.register(torch.nn.LayerNorm, norm)\n"
    "acc = torch_adapter.register_accelerated('treedemo::bias_gelu', lambda x, bias: torch.nn.functional.gelu(\n"
    "    x + bias, approximate='tanh'), device='mps')  # runs on the device: its pieces are traced under it\n"
    "x = torch.randn(8, 16).cuda(); bias = torch.randn(16).cuda(); ln = torch.nn.LayerNorm(16).cuda()\n"
    "mask = (x > 0) | (x < -1)",
    "%%adapter_trace\nmask |= x > 1\ny = bias_gelu(x, bias)\nz = ln(y)\nd = torch.cdist(x, x + 1)",
]

ROWS = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    const table = cells[cells.length - 1].node.querySelector('.torch-adapter-trace table');
    return [...table.querySelectorAll('tbody tr')].map(tr => {
        const text = tr.querySelector('td').innerText;
        const at = text.indexOf('└');  // "  └ " per level, as shown (the sanitizer keeps no data-* attribute)
        return {depth: at < 0 ? 0 : (at - 2) / 2 + 1, op: text.slice(at < 0 ? 0 : at + 1).trim()};
    });
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_with_notebook(tmp_path_factory.mktemp("trace-tree"), NOTEBOOK, CELLS) as served:
        yield served


def _parent_of(rows: list[dict], i: int) -> str | None:
    for j in range(i - 1, -1, -1):
        if rows[j]["depth"] < rows[i]["depth"]:
            return rows[j]["op"]
    return None


def test_every_child_row_sits_under_its_own_parent(lab):
    base, root = lab
    with browser_page(base) as page:
        run_all(page, NOTEBOOK, timeout_ms=300_000)
        rows = page.evaluate(ROWS)
    saved = nbformat.read(root / NOTEBOOK, as_version=4)
    assert not [o for c in saved.cells for o in c.outputs if o.get("output_type") == "error"]
    children = {r["op"]: _parent_of(rows, i) for i, r in enumerate(rows) if r["depth"] > 0}
    gelu = [op for op in children if op.startswith("aten::gelu")]
    assert gelu and all(children[op] == "treedemo::bias_gelu" for op in gelu), rows
    norms = [op for op in children if children[op] and children[op].startswith("optimize::")]
    assert norms, rows  # the replaced module's ops, under it
    assert all(not (children[op] or "").startswith(("aten::bitwise_or", "aten::add.Scalar")) for op in children), rows
