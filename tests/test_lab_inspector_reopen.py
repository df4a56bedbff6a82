"""The routing inspector's chart lasts (issue 34, point 2): drawn by JupyterLab from the output itself
while the kernel runs, after ``%unload_ext``, saved, the kernel shut down and the notebook reopened with
a fresh kernel that ran nothing, in an untrusted copy, and in ``jupyter nbconvert --to html``; the
closed controls leave no "Error displaying widget: model not found" behind.

A real JupyterLab in Debian's Chromium (Playwright), started as tests/test_lab_e2e.py does; the cells
run one by one, as a user steps through them. The numbers the chart must show are read from the kernel
itself (the router's payloads, one per cell that ran ops), never from the page.
"""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from test_lab_e2e import NEEDS_CHROMIUM, SCROLL_TO, goto_lab, kernel_value, notebook_fixtures, open_notebook
from test_lab_state import run_cell

NOTEBOOK = "inspector.ipynb"
CELLS = [
    "%load_ext torch_adapter",
    "import torch\nx = torch.randn(8, 8).cuda()\ny = (x @ x).relu().sum()",
    "%adapter target mps --simulate\nvalues, indices = torch.mode((x * 4).round(), dim=1)",
    "%adapter_inspector",
    "z = torch.special.zeta(x.abs() + 2, x.abs() + 1).sum()",
    "print('a cell without tensor work')",
    "w = (x + 1).mean()",
    "import ipywidgets\nipywidgets.IntSlider(value=3)",  # a plain widget: "model not found" once reopened
    "%unload_ext torch_adapter",
]
INSPECTOR, SLIDER, UNLOAD = 3, 7, 8
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
CONTROLS_GONE = "routing inspector controls: run %adapter_inspector again for them"
NOT_FOUND = "model not found"

pytestmark = [pytest.mark.timeout(300), NEEDS_CHROMIUM]


lab, page = notebook_fixtures(NOTEBOOK, CELLS, panel=False)


# What the inspector's cell shows: plotly's renderer, the stored image it shows until the pointer is over
# it, the chart's traces once drawn (plotly keeps them on its div) and its bars, the live controls, the
# outputs' text, the cell's trust.
SHOWN = """index => {
    const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
    const renderer = cell.node.querySelector('.jp-OutputArea .jp-RenderedPlotly');
    const img = renderer && renderer.querySelector('img.plot-img');
    const plot = cell.node.querySelector('.jp-OutputArea .js-plotly-plot');  // (the renderer's node, once drawn)
    const outputs = cell.node.querySelector('.jp-Cell-outputWrapper');
    return {renderer: renderer !== null,
            image: !!img && img.style.display !== 'none' && img.src.startsWith('data:image/png;base64,')
                   && img.complete && img.naturalWidth > 400,
            traces: plot && plot.data ? plot.data.map(t => ({route: t.legendgroup, x: [...t.x], y: [...t.y]})) : null,
            drawn: plot ? plot.querySelectorAll('.bars .point path').length : 0,
            controls: cell.node.querySelector('.jp-OutputArea .torch-adapter-inspector') !== null,
            text: outputs ? outputs.innerText : '',
            trusted: cell.model.trusted};
}"""
IMAGE = "index => window.jupyterapp.shell.currentWidget.content.widgets[index].node.querySelector('.jp-OutputArea .jp-RenderedPlotly img.plot-img')"


def shown(page, index: int = INSPECTOR) -> dict:
    page.evaluate(SCROLL_TO, index)
    return page.evaluate(SHOWN, index)


def wait_for_chart(page, cells: int, index: int = INSPECTOR) -> dict:
    """Wait until the chart of cell ``index`` is on screen — the renderer's stored image, then, with the
    pointer over it, the interactive chart — with ``cells`` bars per route; what it shows (and whether
    the image came first)."""
    page.evaluate(SCROLL_TO, index)
    try:
        page.wait_for_function(f"() => ({SHOWN})({index}).renderer", timeout=60_000)
        first = page.evaluate(SHOWN, index)
        if first["image"]:  # the pointer enters the image: plotly draws the chart over it
            box = page.evaluate_handle(IMAGE, index).as_element().bounding_box()
            page.mouse.move(1, 1)
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function(f"""() => {{
            const s = ({SHOWN})({index});
            return s.traces !== null && s.drawn > 0 && s.traces.every(t => t.x.length === {cells});
        }}""", timeout=60_000)
    except Exception as exc:  # what it showed instead
        raise AssertionError(f"no chart of {cells} cells drawn in cell {index}: {shown(page, index)}") from exc
    finally:
        page.mouse.move(1, 1)  # away: a chart drawn next under a resting pointer would be entered at once
    return {**shown(page, index), "image_first": first["image"] and first["traces"] is None}


def chart_counts(traces: list[dict]) -> dict[str, dict[str, int]]:
    """``{"[3]": {"native": 24, ...}, ...}``: the chart's bars, per cell label and route."""
    counts: dict[str, dict[str, int]] = {}
    for trace in traces:
        for label, value in zip(trace["x"], trace["y"]):
            counts.setdefault(label, {})[trace["route"]] = value
    return counts


def kernel_counts(page) -> dict[str, dict[str, int]]:
    """The kernel's own per-cell counts: the router's payload of each cell that ran ops."""
    payloads = kernel_value(page, "import json as _j\nfrom torch_adapter.jupyter.extension import router as _r\n"
                                  "print(_RESULT + _j.dumps([[p['execution_count'], p['counts']] for p in _r().payloads]))")
    return {f"[{count}]": counts for count, counts in payloads}


def same_numbers(chart: dict[str, dict[str, int]], kernel: dict[str, dict[str, int]]) -> None:
    """The chart's bars are the kernel's counts: the same cells, each route drawn the same, every route
    it leaves out zero there."""
    assert list(chart) == list(kernel), (chart, kernel)
    for label, counts in kernel.items():
        assert {r: counts[r] for r in chart[label]} == chart[label], (label, chart[label], counts)
        assert not any(v for r, v in counts.items() if r not in chart[label]), (label, counts)


@pytest.fixture(scope="module")
def opened(page, lab):
    """Run the cells up to ``%adapter_inspector``; the kernel's per-cell counts then."""
    for index in range(INSPECTOR + 1):
        run_cell(page, index)
    return kernel_counts(page)


@pytest.fixture(scope="module")
def live(page, opened):
    """Run the cells after it but the last (the extension stays loaded); the kernel's per-cell counts."""
    for index in range(INSPECTOR + 1, UNLOAD):
        run_cell(page, index)
    return kernel_counts(page)


def test_the_chart_is_drawn_from_its_output_with_the_kernels_counts(page, opened):
    assert len(opened) == 2 and any(c["fallback"] for c in opened.values())  # the cells before it opened
    s = wait_for_chart(page, len(opened))
    same_numbers(chart_counts(s["traces"]), opened)
    # The live controls are the widget under the chart; the chart is not inside it.
    assert s["controls"] and NOT_FOUND not in s["text"].lower(), s["text"]


def test_the_chart_follows_every_cell(page, live):
    """Each later cell updates the chart's output (its display handle) and the chart on screen with it —
    before, plotly's renderer kept drawing the first numbers while the notebook's model moved on."""
    assert len(live) == 4  # two cells before it opened, two after
    s = wait_for_chart(page, len(live))
    same_numbers(chart_counts(s["traces"]), live)
    assert s["image_first"], s  # the static image first (the same chart: no full-width image stored)


@pytest.fixture(scope="module")
def saved(page, lab, live):
    """``%unload_ext torch_adapter``, save, shut the kernel down; (what the chart showed, the saved notebook)."""
    _, root = lab
    run_cell(page, UNLOAD)
    page.evaluate(SCROLL_TO, INSPECTOR)
    page.wait_for_function(f"() => ({SHOWN})({INSPECTOR}).text.includes({json.dumps(CONTROLS_GONE)})")
    before = chart_counts(wait_for_chart(page, len(live))["traces"])
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session === null")
    return before, nbformat.read(root / NOTEBOOK, as_version=4)


def test_unloading_closes_the_controls_and_keeps_the_chart(page, live, saved):
    before, nb = saved
    s = shown(page)
    assert not s["controls"] and NOT_FOUND not in s["text"].lower(), s["text"]
    assert f"{CONTROLS_GONE} (the extension was unloaded)" in s["text"], s["text"]
    assert chart_counts(s["traces"]) == before
    same_numbers(before, live)
    # As saved: the chart (plotly's JSON, its static image or table in html, a line of text), under 50 kB
    # as the notebook stores it, with the numbers the page showed; the closed controls leave no widget
    # view a reopened notebook could look for (none, or the one the widget manager emptied: model_id "").
    outputs = nb.cells[INSPECTOR].outputs
    (chart,) = [o for o in outputs if PLOTLY in o.get("data", {})]
    assert WIDGET not in chart["data"]
    assert len(json.dumps(chart, indent=1)) <= 50_000, len(json.dumps(chart, indent=1))
    assert chart_counts([{"route": t["legendgroup"], "x": t["x"], "y": t["y"]} for t in chart["data"][PLOTLY]["data"]]) \
        == before
    (controls,) = [o for o in outputs if o is not chart]
    assert WIDGET not in controls["data"] and controls["data"]["text/plain"].startswith(CONTROLS_GONE), controls


def test_reopened_with_a_fresh_kernel_the_chart_has_the_same_numbers(page, lab, saved):
    base, _ = lab
    before, _ = saved
    goto_lab(page, base)  # the page reloads and the notebook opens with a new kernel that ran nothing
    open_notebook(page, NOTEBOOK, panel=False)
    # The plain widget's output says "model not found" once the widget manager has asked the new kernel:
    # from then on, a widget view left in the inspector's outputs would say it too.
    page.evaluate(SCROLL_TO, SLIDER)
    page.wait_for_function(f"() => ({SHOWN})({SLIDER}).text.includes({json.dumps(NOT_FOUND)})", timeout=60_000)
    s = wait_for_chart(page, len(before))
    assert s["trusted"] and s["image_first"], s  # (the notebook Lab saved is trusted)
    assert chart_counts(s["traces"]) == before
    assert NOT_FOUND not in s["text"].lower() and CONTROLS_GONE in s["text"], s["text"]


def test_an_untrusted_copy_draws_the_chart_too(page, lab, saved):
    _, root = lab
    before, _ = saved
    copy = nbformat.read(root / NOTEBOOK, as_version=4)
    copy.cells.append(nbformat.v4.new_markdown_cell("a copy: its signature is not the trusted one"))
    nbformat.write(copy, root / "untrusted.ipynb")
    open_notebook(page, "untrusted.ipynb", panel=False)
    s = wait_for_chart(page, len(before))
    assert s["trusted"] is False and s["image_first"], s
    assert chart_counts(s["traces"]) == before
    assert NOT_FOUND not in s["text"].lower() and CONTROLS_GONE in s["text"], s["text"]
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }")


def test_the_html_export_shows_the_chart_as_an_image_or_its_table(page, lab, saved):
    _, root = lab
    before, _ = saved
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", str(root / NOTEBOOK), "--output", "export"],
                   check=True, capture_output=True, cwd=root, timeout=120)
    text = (root / "export.html").read_text()
    assert NOT_FOUND not in text and CONTROLS_GONE.replace("%adapter_inspector", "<code>%adapter_inspector</code>") in text
    context = page.context.browser.new_context()
    export = context.new_page()
    try:
        export.goto((root / "export.html").as_uri())
        export.locator(".torch-adapter-inspector-chart").wait_for()
        chart = export.evaluate("""() => {
            const root = document.querySelector('.torch-adapter-inspector-chart');
            const img = root.querySelector('img');
            const totals = root.querySelector('.torch-adapter-table-totals');
            return {img: img ? [img.src.slice(0, 22), img.complete, img.naturalWidth, img.naturalHeight] : null,
                    why: (root.querySelector('.torch-adapter-no-image') || {}).innerText || null,
                    rows: root.querySelectorAll('.torch-adapter-table tbody tr').length,
                    totals: totals ? Object.fromEntries(['native', 'composite', 'fallback'].map(r => [r, Number(totals.dataset[r])])) : null};
        }""")
    finally:
        context.close()
    if chart["img"] is not None:  # kaleido drew the chart: the export shows it as the image
        src, complete, width, height = chart["img"]
        assert src == "data:image/png;base64," and complete and width > 400 and height > 200, chart
    else:  # no Chrome for kaleido: the export says why, and the numbers are the table
        assert chart["why"] and chart["rows"] > 0, chart
    drawn = {r: sum(c[r] for c in before.values()) for r in ("native", "composite", "fallback")}
    assert chart["totals"] == drawn, (chart, drawn)  # the table's totals: the chart's over its cells
