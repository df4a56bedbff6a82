"""The HTML report in a real browser (Debian Chromium through Playwright): it renders with
no console errors and no network requests, and its filters work."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path


from torch_adapter.check.engine import scan
from torch_adapter.check.html_report import html_context, render_html
from torch_adapter.check.runtime import join_runtime

CORPUS = Path(__file__).parent / "data" / "check_corpus"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().split("\n"), 1) if text in line)


def _report():
    report = scan(CORPUS, target="mps", simulate=True)
    train = CORPUS / "train_ddp.py"
    loss, step = _line(train, "mse_loss(model(x), y)"), _line(train, "scaler.step(opt)")
    log = {"schema": "torch-adapter.routing-log", "version": 1, "target": "mps", "simulated": True,
           "summary": {"native": 40, "composite": 6, "fallback": 5},
           "ops": [{"op": "aten::addmm", "route": "native", "calls": 40, "self_time_ms": 3.0, "bytes_copied": 0,
                    "reason": "", "via": "MPS", "parent": None,
                    "site": {"file": str(train), "line": loss, "function": "main"}},
                   {"op": "aten::mse_loss", "route": "composite", "calls": 6, "self_time_ms": 1.0,
                    "bytes_copied": 0, "reason": "decomposed", "via": None, "parent": None,
                    "site": {"file": str(train), "line": loss, "function": "main"}},
                   {"op": "aten::_amp_foreach_non_finite_check_and_unscale_", "route": "fallback", "calls": 5,
                    "self_time_ms": 2.5, "bytes_copied": 4096, "reason": "no MPS kernel", "via": None,
                    "parent": None, "site": {"file": str(train), "line": step, "function": "main"}}]}
    return join_runtime(report, log, command=["python train_ddp.py"], exit_code=0)


def test_html_context_is_plain_data():
    ctx = html_context(_report())
    step = _line(CORPUS / "train_ddp.py", "scaler.step(opt)")
    assert ctx["target"] == "mps" and ctx["runtime"]["top"][0]["sites"][0]["line"] == step
    assert sum(len(f["findings"]) for f in ctx["files"]) == ctx["total"]
    assert ctx["files"][0]["worst"] == "unsupported"  # worst files first
    widths = [b["w"] for b in ctx["runtime"]["calls"]]
    assert abs(sum(widths) - ctx["runtime"]["chart_w"]) < 0.1


def test_clean_report_renders(tmp_path):
    (tmp_path / "ok.py").write_text("import torch\n")
    html = render_html(scan(tmp_path))
    assert "No CUDA-specific code found." in html and "Every file was read completely." in html


def test_report_in_chromium(tmp_path, chromium):
    from playwright.sync_api import sync_playwright

    report = _report()
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(report), encoding="utf-8")
    severities = Counter(f.severity for f in report.findings)
    files = Counter(f.file for f in report.findings)
    total = len(report.findings)
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri())
            visible = "article.finding:not(.hidden)"
            assert page.locator("article.finding").count() == total
            assert page.locator(visible).count() == total
            assert page.text_content("#shown") == f"{total} of {total} findings"

            page.uncheck("input.f-sev[value=handled]")
            assert page.locator(visible).count() == total - severities["handled"]
            assert page.text_content("#shown") == f"{total - severities['handled']} of {total} findings"
            page.check("input.f-sev[value=handled]")

            page.select_option("#f-file", "bench.py")
            assert page.locator(visible).count() == files["bench.py"]
            assert page.locator("section.file:not(.hidden)").count() == 1
            page.select_option("#f-file", "")

            page.select_option("#f-rule", "DEV001")
            assert page.locator(visible).count() == sum(f.rule_id == "DEV001" for f in report.findings)
            page.select_option("#f-rule", "")

            page.fill("#f-text", "flash_attn_func")
            assert 1 <= page.locator(visible).count() < total
            page.fill("#f-text", "")

            page.click("[data-card=unsupported]")
            assert page.locator(visible).count() == severities["unsupported"]
            assert page.locator("input.f-sev[value=handled]").is_checked() is False

            bars = page.locator("#routing-chart rect.bar")
            assert bars.count() == 10  # two charts, five routes each
            fallback = page.locator('#routing-chart rect.bar[data-route="fallback"]').first
            assert float(fallback.get_attribute("width")) > 0
            assert f"train_ddp.py:{_line(CORPUS / 'train_ddp.py', 'scaler.step(opt)')}" in page.text_content("#fallbacks")
            assert page.locator("pre.diff .add").count() >= 1
        finally:
            browser.close()
    assert not problems, problems
    assert all(url.startswith("file://") for url in requests), requests


def test_a_browser_test_fails_in_ci_when_chromium_is_missing():
    """CI must not stay green with every browser test skipped: the ``chromium`` fixture (conftest)
    skips on a developer's machine without it and fails where ``CI`` is set."""
    import subprocess
    import sys

    from conftest import ROOT

    test = f"{Path(__file__).name}::test_report_in_chromium"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env["TORCH_ADAPTER_TEST_CHROMIUM"] = "/nonexistent/chromium"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", test]
    here = subprocess.run(cmd, cwd=ROOT / "tests", env=env, capture_output=True, text=True, timeout=120)
    assert here.returncode == 0 and "1 skipped" in here.stdout, here.stdout[-2000:]
    assert "/nonexistent/chromium is missing" in here.stdout
    ci = subprocess.run(cmd, cwd=ROOT / "tests", env={**env, "CI": "true"}, capture_output=True, text=True, timeout=120)
    assert ci.returncode == 1 and "CI has no browser for this test" in ci.stdout, ci.stdout[-2000:]
