"""The Lab extension in a real JupyterLab, driven in Debian's Chromium with Playwright.

A notebook of CUDA-written cells runs in a real kernel; every cell that ran ops shows a
badge (the ones that ran none do not), the badge and the in-cell output agree with the
kernel's payload, and the "Op routing" panel's session totals equal the kernel's.
The screenshot lands in test-artifacts/lab.png.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT

MIME = "application/vnd.torch-adapter.routing+json"
CHROMIUM = "/usr/bin/chromium"
TOKEN = "torch-adapter-e2e"
NOTEBOOK = "cuda_cells.ipynb"
ARTIFACT = ROOT / "test-artifacts" / "lab.png"

# The notebook a user would write for a CUDA machine, run unchanged.
CELLS = [
    "%load_ext torch_adapter",
    "import torch\n"
    "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "x, y = torch.randn(8, 16).cuda(), torch.randn(8, 4, device='cuda')\n"
    "loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "loss.backward()\n"
    "opt.step()\n"
    "torch.cuda.synchronize()",
    "note = 'this cell does no tensor work'\nprint(note)",
    "%adapter target mps --simulate",
    "z = torch.special.zeta(x.abs() + 2, x.abs() + 1).sum().cuda()\n"
    "values, indices = torch.mode((x * 4).round(), dim=1)\n"
    "print(float(z) > 0, values.device)",
    *[f"Notes, part {i}: a long notebook, so that a windowed notebook detaches cells." for i in range(30)],
    "loss = model(x).sum()\nloss.backward()",
]
MARKDOWN = range(5, len(CELLS) - 1)
RAN_OPS = {1, 4, len(CELLS) - 1}

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="Debian's Chromium is not installed (apt-get install -y chromium; .ci/run does it)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"jupyter lab did not answer {url} within {timeout} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server in a temp dir holding the notebook; yields (base URL, root dir)."""
    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(source) if i in MARKDOWN else nbformat.v4.new_code_cell(source)
                for i, source in enumerate(CELLS)]
    nbformat.write(nb, root / NOTEBOOK)

    settings = root / ".settings"
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # The hardest notebook layout for badges: only the cells in view are in the DOM.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "full"}))
    ours = settings / "torch-adapter-labextension" / "plugin.jupyterlab-settings"
    ours.parent.mkdir(parents=True)
    ours.write_text(json.dumps({"keepInMetadata": True}))
    env = {**os.environ,
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces"),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
           "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    port = _free_port()
    log = root / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", f"--port={port}",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={TOKEN}", proc, log)
        yield base, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def page(lab):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed (the dev extra has it)")
    sync_playwright = sync_api.sync_playwright

    base, _ = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{base}/lab?token={TOKEN}")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=90_000)
            # Before opening a notebook: the app must be restored and the kernelspecs known,
            # or a "Select Kernel" dialog waits for a click.
            page.evaluate("""async () => {
                const app = window.jupyterapp;
                await app.restored;
                await app.serviceManager.kernelspecs.ready;
            }""")
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def ran(page, lab):
    """Open the notebook, run all cells, wait until every cell has run; save it."""
    _, root = lab
    assert page.evaluate("() => window.jupyterapp.hasPlugin('torch-adapter-labextension:plugin')"), (
        "the Lab extension is not installed in this environment: `pip install -e \".[dev]\"` builds and installs it")
    page.evaluate(f"""async () => {{
        const app = window.jupyterapp;
        const panel = await app.commands.execute('docmanager:open', {{path: '{NOTEBOOK}'}});
        await panel.context.ready;
        await panel.sessionContext.ready;
        await app.commands.execute('notebook:run-all-cells');
    }}""")
    page.wait_for_function("""() => {
        const panel = window.jupyterapp.shell.currentWidget;
        const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
        if (!kernel || kernel.status !== 'idle') return false;
        return panel.content.widgets.every(cell => cell.model.type !== 'code' || cell.model.executionCount !== null);
    }""", timeout=120_000, polling=250)
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    saved = nbformat.read(root / NOTEBOOK, as_version=4)
    return saved


def _payloads(cell) -> list[dict]:
    return [o["data"][MIME] for o in cell.get("outputs", [])
            if o.get("output_type") == "display_data" and MIME in o.get("data", {})]


BADGES = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell => {
    const badge = cell.node.querySelector('.jp-TorchAdapter-cellBadge:not(.lm-mod-hidden) .jp-TorchAdapter-badge');
    return badge ? {text: badge.textContent, title: badge.title, ...badge.dataset} : null;
})"""


def test_a_badge_on_each_cell_that_ran_ops_and_none_elsewhere(ran, page):
    for index, cell in enumerate(ran.cells):
        assert bool(_payloads(cell)) == (index in RAN_OPS), (index, cell.outputs)
    page.wait_for_function(f"() => ({BADGES})().filter(b => b !== null).length >= {len(RAN_OPS)}", timeout=30_000)
    badges = page.evaluate(BADGES)
    assert {i for i, b in enumerate(badges) if b is not None} == RAN_OPS, badges
    for index in RAN_OPS:
        (payload,) = _payloads(ran.cells[index])
        badge = badges[index]
        assert [int(badge[r]) for r in ("native", "composite", "fallback")] == [
            payload["counts"][r] for r in ("native", "composite", "fallback")]
        assert f"{payload['counts']['native']} native" in badge["text"]
        assert badge["level"] == ("fallback" if payload["counts"]["fallback"] else
                                  "composite" if payload["counts"]["composite"] else "native")
        assert badge["title"].startswith("torch_adapter · target ")
    # On simulated MPS, aten::mode has no kernel and no decomposition: the badge is coloured
    # and its tooltip names the op.
    assert badges[4]["level"] == "fallback" and "aten::mode" in badges[4]["title"]


def test_the_output_renders_as_a_compact_badge(ran, page):
    shown = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets.map(
        cell => cell.node.querySelectorAll('.jp-OutputArea .jp-TorchAdapter-output .jp-TorchAdapter-badge').length)""")
    assert [i for i, n in enumerate(shown) if n] == sorted(RAN_OPS), shown


def test_the_panel_totals_equal_the_kernels(ran, page):
    kernel = max((p["session"] for cell in ran.cells for p in _payloads(cell)), key=lambda s: s["cells"])
    page.evaluate("() => window.jupyterapp.commands.execute('torch-adapter:open-panel')")
    totals = page.locator("#torch-adapter-routing-panel .jp-TorchAdapter-totals")
    totals.wait_for()
    shown = {key: int(totals.get_attribute(f"data-{key}")) for key in ("cells", "native", "composite", "fallback")}
    assert shown == kernel
    assert totals.inner_text().startswith(f"{kernel['cells']} cells · ")
    # Each cell ran once, so the per-cell rows add up to the same totals.
    rows = page.locator("#torch-adapter-routing-panel .jp-TorchAdapter-cellRow")
    assert rows.count() == len(RAN_OPS)
    target = page.locator("#torch-adapter-routing-panel .jp-TorchAdapter-target").inner_text()
    assert target == "mps (simulated)"


def test_the_panel_switches_the_policy_and_scrolls_to_cells(ran, page):
    panel = page.locator("#torch-adapter-routing-panel")
    page.evaluate("() => window.jupyterapp.commands.execute('torch-adapter:open-panel')")
    panel.locator(".jp-TorchAdapter-policy").select_option("warn")
    # The switch runs `%adapter policy warn` silently and reads `%adapter` status back.
    page.wait_for_function("() => window.jupyterapp.commands.isToggled('torch-adapter:set-policy', {policy: 'warn'})")
    assert panel.locator(".jp-TorchAdapter-target").inner_text() == "mps (simulated on cpu)"  # the kernel's words
    assert panel.locator(".jp-TorchAdapter-policy").input_value() == "warn"
    kernel = max((p["session"] for cell in ran.cells for p in _payloads(cell)), key=lambda s: s["cells"])
    assert int(panel.locator(".jp-TorchAdapter-totals").get_attribute("data-native")) == kernel["native"]
    assert page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length") == len(CELLS)
    # A click on a row selects its cell and scrolls to it, even one the windowed notebook detached.
    panel.locator(".jp-TorchAdapter-cellRow").last.click()
    page.wait_for_function(f"""() => {{
        const notebook = window.jupyterapp.shell.currentWidget.content;
        return notebook.activeCellIndex === {len(CELLS) - 1} && notebook.activeCell.node.isConnected;
    }}""")
    page.wait_for_function(f"() => ({BADGES})()[{len(CELLS) - 1}] !== null")
    panel.locator(".jp-TorchAdapter-cellRow").first.click()
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex === 1")


def test_the_summary_is_kept_in_cell_metadata_when_asked(ran):
    # The e2e settings turn keepInMetadata on (it is off by default).
    for index, cell in enumerate(ran.cells):
        kept = cell.metadata.get("torch_adapter")
        if index in RAN_OPS:
            (payload,) = _payloads(cell)
            assert kept["counts"] == payload["counts"] and kept["cell_id"] == cell.id
            assert kept["session"] is None
        else:
            assert kept is None, index


def test_badges_follow_windowing_moves_and_reopening(ran, page):
    count = len(CELLS)
    connected = f"""() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell => {{
        const badge = cell.node.querySelector('.jp-TorchAdapter-cellBadge:not(.lm-mod-hidden)');
        return badge !== null && cell.node.isConnected;
    }})"""
    scroll = "index => window.jupyterapp.shell.currentWidget.content.scrollToItem(index, index ? 'end' : 'start')"
    # Scrolling a windowed notebook takes cells out of the DOM and puts them back; the
    # badges live in the cells' layouts, so they come back with them.
    page.evaluate(scroll, count - 1)
    page.wait_for_function(f"() => ({connected})()[{count - 1}]")
    page.evaluate(scroll, 0)
    page.wait_for_function(f"() => ({connected})()[1] && ({connected})()[4]")

    # Move the fallback cell up: its badge goes with it (it is keyed by the cell model id).
    before = page.evaluate(BADGES)[4]
    page.evaluate("""async () => {
        const app = window.jupyterapp;
        app.shell.currentWidget.content.activeCellIndex = 4;
        await app.commands.execute('notebook:move-cell-up');
    }""")
    page.wait_for_function(f"() => ({BADGES})()[3] !== null && ({BADGES})()[4] === null")
    assert page.evaluate(BADGES)[3]["native"] == before["native"]
    rows = page.locator("#torch-adapter-routing-panel .jp-TorchAdapter-cellRow .jp-TorchAdapter-source")
    assert rows.nth(1).inner_text().startswith("z = torch.special.zeta")

    ARTIFACT.parent.mkdir(exist_ok=True)
    page.locator("#torch-adapter-routing-panel .jp-TorchAdapter-cellRow").nth(1).hover()
    page.screenshot(path=str(ARTIFACT))
    assert ARTIFACT.stat().st_size > 10_000

    # Reopened, the notebook shows the badges kept in its metadata (marked as saved); the
    # last cell, never rendered yet in the windowed notebook, gets its badge when it is.
    page.evaluate(f"""async () => {{
        const app = window.jupyterapp;
        await app.commands.execute('docmanager:save');
        await app.commands.execute('application:close-all');
        const panel = await app.commands.execute('docmanager:open', {{path: '{NOTEBOOK}'}});
        await panel.context.ready;
    }}""")
    saved = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell =>
        cell.node.querySelector('.jp-TorchAdapter-badge.jp-mod-saved') !== null)"""
    page.wait_for_function(f"() => ({saved})()[1] && ({saved})()[3]")
    assert page.evaluate(f"() => window.jupyterapp.shell.currentWidget.content.widgets[{count - 1}].isPlaceholder()")
    page.evaluate(scroll, count - 1)
    page.wait_for_function(f"() => ({saved})()[{count - 1}]")
    page.evaluate(scroll, 0)  # a detached cell's parts are out of its node: look at the top again
    page.wait_for_function(f"() => ({saved})()[1] && ({saved})()[3]")
    shown = page.evaluate(saved)
    assert {i for i, s in enumerate(shown) if s and i < count - 1} == {1, 3}
