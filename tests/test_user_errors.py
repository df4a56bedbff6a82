"""Errors, warnings and reports at the user's line (issue 23, points 5 and 7).

In a real kernel (nbclient) and at the command line (`torch-adapter run`): a traceback starts at
the user's cell or script and shows none of the adapter's frames (nor torch's dispatch wrappers
that led into them); warnings and the memory report name `cell [N], line L`; a fix is worded for
where the user is (a magic in a notebook, a flag at the CLI, an option in Python) and names the
call the user wrote; a misspelt name gets "did you mean". Call sites that went through an
installed library lead with the user's line and name the library's file relative to
site-packages; the trace table fits a notebook's width.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import torch_adapter
from conftest import run_cli
from torch_adapter.core import callsite, tracebacks
from torch_adapter.errors import TargetError, UsageError

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PACKAGE = os.path.dirname(torch_adapter.__file__)
TORCH = os.path.dirname(torch.__file__)

CELLS = {
    "load": "%load_ext torch_adapter",
    "model": textwrap.dedent("""\
        import warnings
        import torch, torch_adapter
        from torch import nn
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4, bias=False)
            def forward(self, x):
                z = self.proj(x)
                return z / z.norm(dim=-1, keepdim=True)
        head = Head().cuda()
        x = torch.randn(3, 4).cuda()
        x[1] = 0"""),
    "nan": "torch_adapter.debug.enable_nan_check()\ntry:\n    y = head(x)\nfinally:\n    torch_adapter.debug.disable_nan_check()",
    "mps": "%adapter target mps --simulate\n%adapter policy error",
    "strict": "emb = torch.randn(8, 4, device='cuda')\nd = torch.pdist(emb)",
    "own-fallback": textwrap.dedent("""\
        def broken(x, p=2.0):
            raise ValueError("my implementation is broken")
        handle = torch_adapter.register_fallback("aten::_pdist_forward", broken)
        try:
            torch.pdist(emb)
        finally:
            handle.remove()"""),
    "compare": textwrap.dedent("""\
        handle = torch_adapter.register_fallback("aten::_pdist_forward", lambda x, p=2.0: torch.cdist(x, x)[
            tuple(torch.triu_indices(len(x), len(x), offset=1))])
        torch_adapter.debug.enable_cpu_compare(routes=("yours",))
        try:
            a = torch.pdist(emb)
            b = torch.pdist(emb, p=1)
        finally:
            torch_adapter.debug.disable_cpu_compare()
            handle.remove()"""),
    "warn": "%adapter policy warn\nd = torch.pdist(emb)",
    "memory": textwrap.dedent("""\
        %adapter target auto
        torch_adapter.memory.track(True)
        big = torch.zeros(1024, 1024, device='cuda')
        print(torch_adapter.memory.stats(top=1))
        torch_adapter.memory.track(False)"""),
    "typo": "%adapter policy wrn",
    "unload": "%unload_ext torch_adapter\nip = get_ipython()\n"
              "print('formatter restored:', 'structured_traceback' not in vars(ip.InteractiveTB))\n"
              "print('formatwarning restored:', warnings.formatwarning is warnings._formatwarning_orig)\n"
              "from torch_adapter.core.callsite import running_as\nprint('fixes worded for:', running_as())",
}
RAISES = ("nan", "strict", "own-fallback", "compare")


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    env["OMP_NUM_THREADS"] = "1"
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("errs"))}}).execute(env=env)
    return {name: c for name, c in zip(CELLS, nb.cells)}


def _error(cell) -> tuple[str, str]:
    (err,) = [o for o in cell.outputs if o.output_type == "error"]
    return err.ename, ANSI.sub("", "\n".join(err.traceback))


def _frames(tb_text: str) -> list[str]:
    """The frame headers of an IPython traceback: ``Cell In[4], line 3`` / ``File ...:12, in f``."""
    return re.findall(r"^(Cell In\[\d+\], line \d+.*|File .*)$", tb_text, re.M)


def _stderr(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")


@pytest.mark.slow
def test_an_adapter_error_shows_the_users_cell_and_no_adapter_frame(cells):
    for name in RAISES:
        ename, tb = _error(cells[name])
        frames = _frames(tb)
        assert frames and frames[0].startswith(f"Cell In[{cells[name].execution_count}]"), (name, frames)
        assert not any(PACKAGE in f or "torch_adapter" in f for f in frames), (name, frames)
        assert not any("_compile.py" in f or "eval_frame.py" in f for f in frames), (name, frames)  # torch's wrappers
        assert "skipping hidden" not in tb


@pytest.mark.slow
def test_the_nan_error_ends_at_the_users_line(cells):
    ename, tb = _error(cells["nan"])
    frames = _frames(tb)
    assert ename == "NumericsError"
    assert frames[-1].startswith("Cell In[2], line 10, in Head.forward"), frames  # the division, in the model's cell
    assert re.search(r"^---> 10\s+return z / z\.norm\(dim=-1, keepdim=True\)$", tb, re.M), tb
    assert "from `z / z.norm(dim=-1, keepdim=True)` at cell [2], line 10" in tb


@pytest.mark.slow
def test_the_fallback_error_names_the_call_and_the_magic(cells):
    ename, tb = _error(cells["strict"])
    assert ename == "FallbackError" and len(_frames(tb)) == 1
    count = cells["strict"].execution_count
    assert f"aten::_pdist_forward on mps (simulated on cpu), from `torch.pdist(emb)` at cell [{count}], line 2" in tb
    assert "to let `torch.pdist(emb)` run aten::_pdist_forward on the CPU, `%adapter policy warn` in a cell" in tb
    assert "configure(" not in tb.partition("Fix:")[2]  # the notebook user has the magic


@pytest.mark.slow
def test_a_users_fallback_function_is_shown_without_the_engine(cells):
    ename, tb = _error(cells["own-fallback"])
    frames = _frames(tb)
    assert ename == "ValueError" and len(frames) == 2, frames
    assert frames[1].startswith(f"Cell In[{cells['own-fallback'].execution_count}], line 2, in broken")


@pytest.mark.slow
def test_the_cpu_compare_arrow_points_at_the_op(cells):
    ename, tb = _error(cells["compare"])
    assert ename == "NumericsError"
    assert re.search(r"^----> 6\s+b = torch\.pdist\(emb, p=1\)$", tb, re.M), tb
    assert f"from `torch.pdist(emb, p=1)` at cell [{cells['compare'].execution_count}], line 6" in tb


@pytest.mark.slow
def test_warnings_and_the_memory_report_name_the_cell(cells):
    count = cells["warn"].execution_count
    text = _stderr(cells["warn"])
    assert text.startswith(f"cell [{count}], line 2: FallbackWarning: aten::_pdist_forward (from `torch.pdist(emb)`)")
    assert "  d = torch.pdist(emb)\n" in text  # the cell's line, as Python shows a file's
    assert "silence with `%adapter policy allow` in a cell" in text
    assert "ipykernel" not in text and "/tmp/" not in text
    report = "".join(o.text for o in cells["memory"].outputs if o.output_type == "stream")
    assert f"cell [{cells['memory'].execution_count}], line 3" in report and "ipykernel" not in report


@pytest.mark.slow
def test_a_misspelt_magic_value_is_answered_and_unload_restores(cells):
    # a magic's UsageError: IPython prints its message alone, no traceback
    assert _stderr(cells["typo"]) == "UsageError: %adapter policy: expected allow, warn or error; got 'wrn' " \
                                     "(did you mean 'warn'?)\n"
    out = "".join(o.text for o in cells["unload"].outputs if o.output_type == "stream")
    assert "formatter restored: True" in out and "formatwarning restored: True" in out
    assert "fixes worded for: python" in out  # no magics any more: the option is named again


# -- the command line ----------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""\
    import torch


    def distances(emb):
        return torch.pdist(emb)


    emb = torch.randn(8, 4, device="cuda")
    distances(emb)
""")


@pytest.mark.slow
def test_run_prints_the_scripts_frames_only_and_its_flag(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = run_cli("run", "--target", "mps", "--simulate", "--fallback", "error", str(script),
                   env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr
    frames = re.findall(r'^  File "([^"]+)", line (\d+)', done.stderr, re.M)
    assert frames == [(str(script), "9"), (str(script), "5")], done.stderr
    assert "FallbackError: aten::_pdist_forward on mps (simulated on cpu), from `torch.pdist(emb)` at " \
           f"{script}:5" in done.stderr
    assert "`torch-adapter run --fallback warn ...`" in done.stderr


# -- the rule, names, sites -------------------------------------------------------------------
def test_hidden_frames_rule(monkeypatch):
    user, lib = "/home/me/train.py", os.path.join(TORCH, "nn", "modules", "module.py")
    wrap, own = os.path.join(TORCH, "_compile.py"), os.path.join(PACKAGE, "tools", "debug.py")
    # raised by the adapter under torch's wrappers: cut at the user's last line
    assert tracebacks.hidden([user, lib, user, wrap, own, own]) == {3, 4, 5}
    # the adapter in the middle (it called the user's function): only its frames go
    assert tracebacks.hidden([user, own, own, user]) == {1, 2}
    # no adapter frame: nothing hidden, torch's own error is torch's
    assert tracebacks.hidden([user, lib, wrap]) == set()
    monkeypatch.setenv("TORCH_ADAPTER_TRACEBACKS", "full")  # for a report of an adapter bug: every frame
    assert tracebacks.hidden([user, lib, user, wrap, own, own]) == set()


def test_did_you_mean_for_options_targets_and_ops():
    with pytest.raises(UsageError, match=r"got 'fallbak' \(did you mean 'fallback'"):
        torch_adapter.install(fallbak="warn")
    with pytest.raises(TargetError, match=r"got 'mpss' \(did you mean 'mps'\?\)"):
        torch_adapter.install(target="mpss")
    with pytest.raises(UsageError, match=r"did you mean aten::nonzero"):
        torch_adapter.install(target="cpu", deny=["aten::nonzer"])


def test_a_site_through_a_library_leads_with_the_users_line():
    activations = pytest.importorskip("transformers.activations")
    from torch_adapter.routing.trace import trace

    gelu = activations.NewGELUActivation()
    with trace(use_observer=False) as log:
        gelu(torch.randn(4))  # SITE-LINE
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# SITE-LINE" in text
                and "next(" not in text)
    tanh = next(r for r in log.records() if r.op.startswith("aten::tanh"))
    assert tanh.site["file"] == __file__ and tanh.site["line"] == line
    assert tanh.site["library"]["file"].endswith(os.path.join("transformers", "activations.py"))
    text = callsite.site_text(tanh.site, short=True)
    assert re.fullmatch(rf"test_user_errors\.py:{line} via transformers/activations\.py:\d+", text), text


def test_the_trace_table_fits_a_notebook_output(tmp_path, chromium):
    """Rendered in Chromium at a notebook output's width (~900 px) with Lab's table rules."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from torch_adapter.jupyter.magics import _log_html
    from torch_adapter.routing.log import RoutingLog

    log = RoutingLog(target="mps", simulated=True)
    lib = "/usr/lib/python3/site-packages/transformers/models/clip/modeling_clip.py"
    reason = ("no MPS kernel; CompositeImplicitAutograd: decomposes into other aten ops above autograd. "
              "Device-selected kernel: aten::_fused_sdp_choice picks aten::_scaled_dot_product_attention_math")
    for i, op in enumerate(["aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::convolution"]):
        log.add(op, "composite", reason=reason, site={"file": f"/home/me/notebooks/a_long_folder_name/train_{i}.py",
                                                      "line": 12, "library": {"file": lib, "line": 568}})
    page_html = ("<style>table{border-collapse:collapse;table-layout:fixed;font:13px sans-serif}"
                 "td,th{padding:.5em;white-space:normal;max-width:none}</style>"
                 f"<div id='out' style='width:900px'>{_log_html(log, None)}</div>")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.set_content(page_html)
            width = page.evaluate("() => document.querySelector('#out table').getBoundingClientRect().width")
            header = page.evaluate("() => [...document.querySelectorAll('#out th')].map(th => th.innerText)")
        finally:
            browser.close()
    assert width <= 900, width
    assert header.index("first call site") < header.index("reason")  # the user's line is not pushed off-screen
