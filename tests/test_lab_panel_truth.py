"""The "Op routing" panel says what the kernel says, after the sequences that made it lie (issue 34,
point 3): ``%unload_ext`` + ``%load_ext`` in one kernel (the old session's totals stayed), "Refresh
from kernel", a page reload, and a kernel restart (the rows vanished beside badges still on screen).

A real JupyterLab in Debian's Chromium (Playwright); the cells run one by one, as a user steps
through them. The kernel's numbers are read from the kernel itself (``%adapter``'s status, through
``torch_adapter.jupyter.extension.front_end_state()``), never from what the page shows.
"""

from __future__ import annotations

import json

import pytest

from test_lab_e2e import NEEDS_CHROMIUM, click_and_await, PANEL, _panel, goto_lab, kernel_value, notebook_fixtures, open_notebook
from test_lab_state import run_cell

NOTEBOOK = "truth.ipynb"
CELLS = [
    "%load_ext torch_adapter",
    "import torch\nx = torch.randn(8, 8).cuda()\ny = (x @ x).relu().sum()",
    "z = (x * 2).sum()",
    "w = (x + 1).mean()",
    "%unload_ext torch_adapter",
    "%load_ext torch_adapter",
    "v = (x @ x).sum()",
]
ROUTES = ("native", "composite", "yours", "fallback", "refused")

pytestmark = [pytest.mark.timeout(300), NEEDS_CHROMIUM]


lab, page = notebook_fixtures(NOTEBOOK, CELLS)


def kernel_totals(page) -> dict | None:
    """The kernel's own session totals (None: the extension is not loaded there)."""
    status = kernel_value(page, "import json as _j\nfrom torch_adapter.jupyter.extension import front_end_state as _fes\n"
                                "print(_RESULT + _j.dumps(_fes()['status']))")
    if not status["loaded"]:
        return None
    return {"cells": status["cells"], **{r: status[r] for r in ROUTES}}


def panel_settles_on(page, totals: dict | None) -> dict:
    want = "null" if totals is None else json.dumps(totals)
    page.wait_for_function(f"""() => {{
        const t = document.querySelector('{PANEL} .jp-TorchAdapter-totals');
        const shown = t ? Object.fromEntries(['cells', {', '.join(repr(r) for r in ROUTES)}].map(k => [k, Number(t.dataset[k])])) : null;
        return JSON.stringify(shown) === JSON.stringify({want});
    }}""", timeout=30_000)
    return _panel(page)


def test_after_unload_and_load_the_panel_counts_the_new_session_only(page):
    for i in range(4):
        run_cell(page, i)
    first = kernel_totals(page)
    assert first["cells"] == 3
    panel_settles_on(page, first)
    for i in (4, 5, 6):
        run_cell(page, i)
    second = kernel_totals(page)
    assert second["cells"] == 1 and second["native"] < first["native"]
    shown = panel_settles_on(page, second)
    assert shown["totalsText"].startswith("1 cell · "), shown
    assert shown["rows"] == 4  # every cell that ran ops keeps its row: the old session's three, the new one's


def test_refresh_and_reload_keep_the_kernels_numbers(page, lab):
    totals = kernel_totals(page)
    click_and_await(page, page.locator(f"{PANEL} .jp-TorchAdapter-button", has_text="Refresh from kernel"),
                    "torch-adapter:refresh-status")
    panel_settles_on(page, totals)
    base, _ = lab
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    goto_lab(page, base)  # the page reloads; the kernel lives on with the second session
    open_notebook(page, NOTEBOOK)
    shown = panel_settles_on(page, totals)
    assert shown["rows"] == 4 and not shown["empty"], shown


def test_a_kernel_restart_keeps_the_rows_beside_the_badges(page):
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart(); }")
    page.wait_for_function(f"() => document.querySelector('{PANEL} .jp-TorchAdapter-target').innerText === 'not loaded'",
                           timeout=60_000)
    assert kernel_totals(page) is None
    shown = _panel(page)
    badges = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets.filter(cell =>
        cell.node.querySelector('.jp-OutputArea .jp-TorchAdapter-badge')).length""")
    assert shown["totals"] is None and shown["rows"] == badges == 4, shown
    assert not any("has reported ops yet" in e for e in shown["empty"]), shown
