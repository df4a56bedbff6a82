"""The notebook workflow the session stack must survive, in a real JupyterLab (Chromium,
Playwright): load the extension, switch to a simulated target, compare, nest — and only then
import transformers, diffusers and accelerate for the first time (the RecursionError of issue 21
came from exactly this order: every suspend/resume added a probe finder). Afterwards the kernel
holds one import hook per module awaited, the library's model runs on the target, and switching
back works."""

from __future__ import annotations

import json

import nbformat
import pytest

from test_lab_e2e import NEEDS_CHROMIUM, browser_page, lab_with_notebook, run_all, shot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    NEEDS_CHROMIUM,
]

NOTEBOOK = "switch_then_import.ipynb"
CELLS = [
    "%load_ext torch_adapter",
    "import torch\nx = torch.ones(4, device='cuda')",
    "%adapter target mps --simulate",
    "%%adapter_compare --configs plain,redirect,adapted -n 1 --warmup 0\n(x * 2).sum()",
    "import torch_adapter\nwith torch_adapter.adapted('cpu'):\n    y = torch.zeros(2, device='cuda')\nprint('nested ok', y.device)",
    "%adapter target cpu",
    "%adapter target mps --simulate",
    "import transformers, diffusers, accelerate\nprint('imported ok')",
    "from diffusers import UNet2DModel\n"
    "unet = UNet2DModel(sample_size=8, block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=4,\n"
    "                   down_block_types=('DownBlock2D', 'DownBlock2D'), up_block_types=('UpBlock2D', 'UpBlock2D')).cuda()\n"
    "out = unet(torch.randn(1, 3, 8, 8, device='cuda'), 1).sample\n"
    "print('unet ok', out.shape, next(unet.parameters()).device, torch.cuda.is_available())",
    "import json, sys\nfrom torch_adapter.core.after_import import finders\n"
    "names = [f.name for f in finders()]\n"
    "print(json.dumps({'finders': names, 'target': torch_adapter.current().target.label}))",
    "%adapter target auto",
    "print('back', torch_adapter.current().target.label)",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_with_notebook(tmp_path_factory.mktemp("switch"), NOTEBOOK, CELLS) as served:
        yield served


def _text(cell) -> str:
    return "".join(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)


def test_switch_compare_nest_then_first_library_import(lab):
    base, root = lab
    with browser_page(base) as page:
        run_all(page, NOTEBOOK, timeout_ms=600_000)
        shot(page, "lab-switch-then-import.png")
    saved = nbformat.read(root / NOTEBOOK, as_version=4)
    errors = [(i, o.get("ename"), o.get("evalue", "")[:200]) for i, c in enumerate(saved.cells)
              for o in c.outputs if o.get("output_type") == "error"]
    assert errors == []
    assert all(c.execution_count is not None for c in saved.cells), "Run All stopped early"
    texts = [_text(c) for c in saved.cells]
    assert "nested ok cpu" in texts[4]
    assert "imported ok" in texts[7]
    assert "unet ok torch.Size([1, 3, 8, 8]) cpu True" in texts[8]
    state = json.loads(texts[9].strip().splitlines()[-1])
    assert len(state["finders"]) == len(set(state["finders"])) and "mps" in state["target"], state  # one per module
    assert "back cpu" in texts[11]
