"""The "Op routing" panel shows the kernel's state — target, policy, loaded or not — after every
cell, a reload, ``%unload_ext``, "Refresh from kernel" and a kernel restart (issue 23, point 4).

A real JupyterLab in Debian's Chromium (Playwright), started as tests/test_lab_e2e.py does. The
cells run one by one, as a user steps through them; the panel is read after each.
"""

from __future__ import annotations

import pytest

from test_lab_e2e import NEEDS_CHROMIUM, click_and_await, PANEL, goto_lab, notebook_fixtures, open_notebook

NOTEBOOK = "state.ipynb"
CELLS = [
    "%load_ext torch_adapter",
    "%adapter target mps --simulate",
    "%adapter policy warn",
    "import torch\nx = torch.randn(4, 4).cuda() @ torch.randn(4, 4).cuda()",  # a payload: mps, policy warn
    "%adapter policy error",
    "print('a plain cell')",
    "%adapter target auto",
    "%unload_ext torch_adapter",
    "%load_ext torch_adapter",
    "%adapter target mps --simulate\nimport torch, torch_adapter\nemb = torch.randn(16, 4, device='cuda')\n"
    "h = torch_adapter.register_fallback('aten::_pdist_forward', lambda x, p=2.0: torch.cdist(x, x, p=p)[\n"
    "    tuple(torch.triu_indices(len(x), len(x), 1, device=x.device))])\nd = torch.pdist(emb)",
    "h.remove()\n%adapter policy error\nd = torch.pdist(emb)",
]

pytestmark = [
    pytest.mark.timeout(300),
    NEEDS_CHROMIUM,
]


lab, page = notebook_fixtures(NOTEBOOK, CELLS)


def run_cell(page, index: int) -> None:
    """Run one cell (as Ctrl+Enter does) and wait until the kernel is idle after it."""
    page.evaluate(f"""async () => {{
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = {index};
        await window.jupyterapp.commands.execute('notebook:run-cell');
    }}""")
    page.wait_for_function(f"""() => {{
        const panel = window.jupyterapp.shell.currentWidget;
        const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
        return kernel && kernel.status === 'idle' && panel.content.widgets[{index}].model.executionCount !== null
            && !panel.content.widgets[{index}].node.querySelector('.jp-InputArea-prompt').innerText.includes('*');
    }}""", timeout=120_000)


def shown(page) -> dict:
    return page.evaluate(f"""() => {{
        const panel = document.querySelector('{PANEL}');
        const target = panel.querySelector('.jp-TorchAdapter-target');
        const policy = panel.querySelector('.jp-TorchAdapter-policy');
        return {{target: target.innerText, state: target.dataset.state, policy: policy.value,
                disabled: policy.disabled, empty: [...panel.querySelectorAll('.jp-TorchAdapter-empty')].map(e => e.innerText),
                errors: document.querySelectorAll('.Toastify__toast--error').length}};
    }}""")


def settle(page, target: str, policy: str | None = None) -> dict:
    """Wait until the panel shows ``target`` (and ``policy``), then return what it shows."""
    check = f"p.querySelector('.jp-TorchAdapter-target').innerText === {target!r}"
    if policy is not None:
        check += f" && p.querySelector('.jp-TorchAdapter-policy').value === {policy!r}"
    page.wait_for_function(f"() => {{ const p = document.querySelector('{PANEL}'); return {check}; }}", timeout=30_000)
    return shown(page)


def test_after_every_cell_the_panel_shows_the_kernels_target_and_policy(page):
    run_cell(page, 0)
    assert settle(page, "cpu", "allow")["state"] == "loaded"
    run_cell(page, 1)
    settle(page, "mps (simulated)", "allow")
    run_cell(page, 2)
    run_cell(page, 3)
    settle(page, "mps (simulated)", "warn")
    run_cell(page, 4)
    settle(page, "mps (simulated)", "error")
    # A plain cell, then a new cell at the end (as Shift+Enter there adds one): the stored outputs are
    # read again, and their older payload (policy warn) must not win over the kernel's status.
    run_cell(page, 5)
    page.evaluate(f"""async () => {{
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = {len(CELLS) - 1};
        await window.jupyterapp.commands.execute('notebook:insert-cell-below');
    }}""")
    # the new cell is there and the panel has drawn since (two frames), not a fixed sleep
    page.wait_for_function(f"() => window.jupyterapp.shell.currentWidget.content.widgets.length === {len(CELLS) + 1}")
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert settle(page, "mps (simulated)", "error")["errors"] == 0


def test_refresh_from_kernel_reads_the_same_state_without_an_error(page):
    click_and_await(page, page.locator(f"{PANEL} .jp-TorchAdapter-button", has_text="Refresh from kernel"),
                    "torch-adapter:refresh-status")
    assert settle(page, "mps (simulated)", "error")["errors"] == 0


def test_unload_says_not_loaded_and_refresh_keeps_it(page):
    run_cell(page, 6)
    settle(page, "cpu")
    run_cell(page, 7)
    after = settle(page, "not loaded")
    assert after["state"] == "not-loaded" and after["disabled"] and after["policy"] == ""
    assert any("not loaded in this kernel" in e for e in after["empty"]), after
    click_and_await(page, page.locator(f"{PANEL} .jp-TorchAdapter-button", has_text="Refresh from kernel"),
                    "torch-adapter:refresh-status")
    assert settle(page, "not loaded")["errors"] == 0  # no red toast: "not loaded" is an answer


def test_a_reload_shows_not_loaded_not_the_outputs_target(page, lab):
    # The stored outputs were made on simulated MPS; the kernel lives on, the extension unloaded.
    base, _ = lab
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    goto_lab(page, base)
    open_notebook(page, NOTEBOOK)
    after = settle(page, "not loaded")
    assert after["state"] == "not-loaded" and after["errors"] == 0
    rows = page.locator(f"{PANEL} .jp-TorchAdapter-cellRow .jp-TorchAdapter-rowTarget").all_inner_texts()
    assert rows == ["mps (simulated)"]  # the cell's row still says where that cell ran


def test_a_kernel_restart_says_not_loaded_until_loaded_again(page):
    run_cell(page, 8)
    settle(page, "cpu", "allow")
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart(); }")
    after = settle(page, "not loaded")
    assert after["state"] == "not-loaded" and after["errors"] == 0
    run_cell(page, 0)
    settle(page, "cpu", "allow")


BADGE = """index => {
    const badge = window.jupyterapp.shell.currentWidget.content.widgets[index].node
        .querySelector('.jp-OutputArea .jp-TorchAdapter-badge');
    if (!badge) return null;
    const lines = [...badge.parentElement.querySelectorAll('li')].map(li => ({cls: li.className, text: li.textContent}));
    return {text: badge.textContent, title: badge.title, level: badge.dataset.level, lines, ...badge.dataset};
}"""


def test_yours_and_refused_in_the_pill_the_tooltip_and_the_panel(page):
    # (issue 23, point 2) A register_fallback implementation is its own route, on the device;
    # a call the policy refused is "refused", not "fell back".
    run_cell(page, 9)
    page.wait_for_function(f"() => ({BADGE})(9) !== null")
    yours = page.evaluate(BADGE, 9)
    assert (yours["yours"], yours["fallback"]) == ("1", "0") and "1 yours" in yours["text"], yours
    assert "Ran your register_fallback implementation, on the device" in yours["title"]
    assert "Fell back to the CPU (most" not in yours["title"] and yours["level"] != "fallback"
    run_cell(page, 10)
    page.wait_for_function(f"() => ({BADGE})(10) !== null")
    refused = page.evaluate(BADGE, 10)
    assert (refused["refused"], refused["fallback"], refused["level"]) == ("1", "0", "refused"), refused
    assert "1 refused" in refused["text"] and "Refused by the fallback policy (error)" in refused["title"]
    assert "Fell back to the CPU (most" not in refused["title"]
    assert [l["text"].split(" at ")[0] for l in refused["lines"] if "refused" in l["cls"]] == [
        "refused: aten::_pdist_forward ×1"], refused["lines"]
    # the refused line is cut with an ellipsis inside the output, never a sideways scrollbar (issue 34)
    sideways = page.evaluate("""(i) => {
        const cell = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
        return [...cell.querySelectorAll('*')].filter(e => {
            const x = getComputedStyle(e).overflowX;
            return (x === 'auto' || x === 'scroll') && e.scrollWidth > e.clientWidth + 1;
        }).map(e => `${e.className} ${e.scrollWidth}>${e.clientWidth}`);
    }""", 10)
    assert sideways == [], sideways
    totals = page.evaluate(f"() => ({{...document.querySelector('{PANEL} .jp-TorchAdapter-totals').dataset}})")
    assert (totals["yours"], totals["refused"], totals["fallback"]) == ("1", "1", "0"), totals
    text = page.locator(f"{PANEL} .jp-TorchAdapter-totals").inner_text()
    assert "1 yours" in text and "1 refused" in text and "0 CPU" in text
