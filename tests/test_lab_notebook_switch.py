"""The "Op routing" panel follows the active notebook (issue 34, point 3, "a notebook switch"): two
notebooks, each with its own kernel and its own numbers (A: three op cells on the default target; B:
one op cell on simulated MPS), and a third whose kernel never loaded the extension. After each
switch of the active tab the panel shows the active notebook's kernel — its target, policy, session
totals and one row per cell that ran ops there — and that notebook's cell badges say what its rows
say. A cell of A that finishes while B is in front changes nothing on B's panel, and A's panel has
it when A is in front again.

A real JupyterLab in Debian's Chromium (Playwright). The kernels' numbers are read from each kernel
itself (``torch_adapter.jupyter.extension.front_end_state()``, asked silently), never from the page.
"""

from __future__ import annotations

import ast
import contextlib
import json
import time

import nbformat
import pytest
from test_lab_e2e import NEEDS_CHROMIUM, PANEL, browser_page, lab_with_notebook, open_notebook
from test_lab_state import run_cell

A, B, C = "switch_a.ipynb", "switch_b.ipynb", "switch_c.ipynb"
GO = "go-a"  # A's last cell waits for this file: it finishes while B is the active notebook
CELLS = {
    A: [
        "%load_ext torch_adapter",
        "import torch\nx = torch.randn(8, 8).cuda()\ny = (x @ x).relu().sum()",
        "z = (x * 2).sum()",
        "w = (x + 1).mean().exp()",
        f"import os, time\nwhile not os.path.exists({GO!r}):\n    time.sleep(0.05)\nv = (x - 3).abs().max()",
    ],
    B: [
        "%load_ext torch_adapter",
        "%adapter target mps --simulate\n%adapter policy warn",
        "import torch\nq = torch.ones(4, 4, device='cuda')\nr = (q @ q).sum()",
    ],
    C: ["n = sum(range(10))\nprint(n)"],
}
ROUTES = ("native", "composite", "yours", "fallback", "refused")

pytestmark = [pytest.mark.timeout(420), NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_with_notebook(tmp_path_factory.mktemp("lab-switch"), A, CELLS[A]) as served:
        _, root = served
        for name in (B, C):  # the same way lab_with_notebook writes A; the server reads them from disk
            nb = nbformat.v4.new_notebook()
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
            nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS[name]]
            nbformat.write(nb, root / name)
        yield served


@pytest.fixture(scope="module")
def page(lab):
    base, _ = lab
    with browser_page(base) as page:
        yield page


FIND = """path => [...window.jupyterapp.shell.widgets('main')].find(w => w.context && w.context.path === path)"""


def activate(page, path: str) -> None:
    """Bring ``path``'s tab to the front as a click on it does (the shell's activateById)."""
    page.evaluate(f"(path) => window.jupyterapp.shell.activateById(({FIND})(path).id)", path)
    page.wait_for_function("(path) => window.jupyterapp.shell.currentWidget.context.path === path", arg=path)


def kernel_state(page, path: str) -> dict:
    """``front_end_state()`` of the kernel of notebook ``path`` (any tab, in front or not), asked
    silently: no history, no execution count, no cell callbacks."""
    expression = ("__import__('json').dumps(__import__('torch_adapter.jupyter.extension', fromlist=['_'])"
                  ".front_end_state())")
    reply = page.evaluate(f"""async ([path, expression]) => {{
        const kernel = ({FIND})(path).sessionContext.session.kernel;
        const future = kernel.requestExecute({{code: '', silent: true, store_history: false,
                                               user_expressions: {{state: expression}}}});
        const reply = await future.done;
        return reply.content.user_expressions.state;
    }}""", [path, expression])
    assert reply["status"] == "ok", reply
    return json.loads(ast.literal_eval(reply["data"]["text/plain"]))


def target_label(status_or_payload: dict) -> str:
    """The target worded as the front end words it (format.ts targetLabel)."""
    if status_or_payload["simulated"]:
        return f"{status_or_payload['target']} (simulated)"
    if status_or_payload.get("emulated"):
        return f"{status_or_payload['target']} (emulated)"
    return status_or_payload["target"]


def expected(path: str, state: dict) -> dict:
    """What the panel and the badges must show for notebook ``path`` whose kernel is in ``state``."""
    status = state["status"]
    rows = sorted(({"cell": p["cell_id"], "target": target_label(p), **{r: p["counts"][r] for r in ROUTES}}
                   for p in state["payloads"]), key=lambda row: row["cell"])
    if not status["loaded"]:
        return {"notebook": path, "target": "not loaded", "state": "not-loaded", "policy": "",
                "totals": None, "rows": rows, "badges": [{k: v for k, v in row.items() if k != "target"} for row in rows]}
    return {"notebook": path, "target": target_label(status), "state": "loaded", "policy": status["policy"],
            "totals": {"cells": status["cells"], **{r: status[r] for r in ROUTES}},
            "rows": rows, "badges": [{k: v for k, v in row.items() if k != "target"} for row in rows]}


# What the panel shows, and the badges in the active notebook's cell outputs, in the shape of expected().
SHOWN = f"""() => {{
    const routes = {json.dumps(ROUTES)};
    const counts = node => Object.fromEntries(routes.map(r => [r, Number(node.dataset[r])]));
    const byCell = (a, b) => a.cell < b.cell ? -1 : a.cell > b.cell ? 1 : 0;
    const panel = document.querySelector('{PANEL}');
    const target = panel.querySelector('.jp-TorchAdapter-target');
    const totals = panel.querySelector('.jp-TorchAdapter-totals');
    const notebook = window.jupyterapp.shell.currentWidget;
    return {{
        notebook: panel.querySelector('.jp-TorchAdapter-notebook').innerText,
        target: target ? target.innerText : null,
        state: target ? target.dataset.state : null,
        policy: panel.querySelector('.jp-TorchAdapter-policy') ? panel.querySelector('.jp-TorchAdapter-policy').value : null,
        totals: totals ? {{cells: Number(totals.dataset.cells), ...counts(totals)}} : null,
        rows: [...panel.querySelectorAll('.jp-TorchAdapter-cellRow')].map(row => ({{
            cell: row.dataset.cellId, target: row.querySelector('.jp-TorchAdapter-rowTarget').innerText,
            ...counts(row.querySelector('.jp-TorchAdapter-badge'))}})).sort(byCell),
        badges: notebook.content.widgets.flatMap(cell => [...cell.node.querySelectorAll('.jp-TorchAdapter-badge')]
            .filter(b => !b.closest('.lm-mod-hidden')).map(b => ({{cell: cell.model.id, ...counts(b)}}))).sort(byCell),
    }};
}}"""


def panel_shows(page, path: str) -> dict:
    """Wait until the panel (and the active notebook's badges) show what ``path``'s kernel says, then
    assert it; returns the kernel's state. The kernel is read once, before waiting (nothing runs)."""
    assert page.evaluate("() => window.jupyterapp.shell.currentWidget.context.path") == path
    state = kernel_state(page, path)
    want = expected(path, state)
    # imported here: a page exists, so playwright does
    from playwright.sync_api import TimeoutError as WaitTimeout

    with contextlib.suppress(WaitTimeout):  # on a timeout the assertion below says what differs
        page.wait_for_function(f"(want) => JSON.stringify(({SHOWN})()) === JSON.stringify(want)", arg=want,
                               timeout=30_000)
    assert page.evaluate(SHOWN) == want
    return state


def test_each_notebook_in_front_shows_its_own_kernel(page):
    open_notebook(page, A)
    for i in range(4):
        run_cell(page, i)
    a = panel_shows(page, A)
    assert a["status"]["cells"] == 3 and len(a["payloads"]) == 3 and a["status"]["target"] == "cpu"

    open_notebook(page, B)  # a second tab, its own kernel
    for i in range(3):
        run_cell(page, i)
    b = panel_shows(page, B)
    assert b["status"]["cells"] == 1 and len(b["payloads"]) == 1
    assert (target_label(b["status"]), b["status"]["policy"]) == ("mps (simulated)", "warn")
    assert b["status"]["session_id"] != a["status"]["session_id"]

    # A → B → A, by the tab (activateById) and by opening the file again (docmanager:open)
    activate(page, A)
    assert panel_shows(page, A) == a
    open_notebook(page, B)
    assert panel_shows(page, B) == b
    activate(page, A)
    assert panel_shows(page, A) == a


def test_a_cell_that_ends_behind_another_notebook_shows_when_its_notebook_is_in_front(page, lab):
    _, root = lab
    activate(page, A)
    page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = 4;
        void window.jupyterapp.commands.execute('notebook:run-cell');  // settles when the cell ends
    }""")
    page.wait_for_function(f"() => ({FIND})('{A}').sessionContext.session.kernel.status === 'busy'")
    try:
        activate(page, B)
        b = panel_shows(page, B)
    finally:
        (root / GO).write_text("go")  # A's cell finishes now, behind B (and never blocks A's kernel)
    page.wait_for_function(f"""() => {{
        const a = ({FIND})('{A}');
        const cell = a.content.widgets[4];
        return a.sessionContext.session.kernel.status === 'idle' && cell.model.executionCount !== null
            && cell.node.querySelector('.jp-OutputArea .jp-TorchAdapter-badge') !== null;
    }}""", timeout=60_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert panel_shows(page, B) == b  # A's report did not land on B's panel
    activate(page, A)
    a = panel_shows(page, A)
    assert a["status"]["cells"] == 4 and len(a["payloads"]) == 4


def test_a_kernel_without_the_extension_says_not_loaded_and_a_switch_back_restores(page):
    started = time.perf_counter()
    open_notebook(page, C)
    run_cell(page, 0)
    c = panel_shows(page, C)
    assert not c["status"]["loaded"] and c["payloads"] == []
    empty = page.evaluate(f"() => [...document.querySelectorAll('{PANEL} .jp-TorchAdapter-empty')].map(e => e.innerText)")
    assert any("not loaded in this kernel" in e for e in empty), empty
    assert page.evaluate(f"() => document.querySelector('{PANEL} .jp-TorchAdapter-policy').disabled")
    a = kernel_state(page, A)
    activate(page, A)
    assert panel_shows(page, A) == a
    activate(page, C)
    panel_shows(page, C)
    open_notebook(page, B)
    panel_shows(page, B)
    activate(page, A)
    panel_shows(page, A)
    print(f"\nC and the switches: {time.perf_counter() - started:.1f} s")
