"""%load_ext torch_adapter in a real in-process IPython: cells, magics, errors, observers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output

from torch_adapter.jupyter import extension, schema
from torch_adapter_widgets.inspector import format_bytes

CUDA_CELL = "import torch\nx = torch.randn(8, 8).cuda()\ny = torch.nn.functional.linear(x, x).relu().sum()\n"


_SHELL = []


@pytest.fixture
def ip():
    if not _SHELL:  # one real in-process shell for the module (IPython keeps a singleton)
        _SHELL.append(globalipapp.start_ipython() or globalipapp.get_ipython())
    shell = _SHELL[0]
    shell.run_line_magic("load_ext", "torch_adapter")
    yield shell
    shell.run_line_magic("unload_ext", "torch_adapter")


def run(ip, code):
    with capture_output() as cap:
        result = ip.run_cell(code)
    bundles = [o.data for o in cap.outputs if schema.MIME in o.data]
    return result, bundles, cap


def test_a_cell_that_ran_ops_publishes_one_bundle(ip):
    result, bundles, _ = run(ip, CUDA_CELL)
    assert result.success
    assert len(bundles) == 1
    payload = bundles[0][schema.MIME]
    assert payload["schema"] == schema.SCHEMA and payload["version"] == schema.VERSION
    assert sum(payload["counts"].values()) > 0 and payload["counts"]["native"] > 0
    assert payload["target"] == "cpu" and payload["session"]["cells"] == 1
    assert "torch_adapter [cpu]" in bundles[0]["text/plain"]
    assert "torch-adapter-routing" in bundles[0]["text/html"]


def test_a_cell_without_ops_publishes_nothing(ip):
    run(ip, CUDA_CELL)
    _, bundles, _ = run(ip, "a = 1 + 1\nprint(a)")
    assert bundles == []
    assert len(extension.router().payloads) == 1


def test_simulated_target_reports_fallbacks_with_reasons(ip):
    ip.run_line_magic("adapter", "target mps --simulate")
    # aten::_weight_norm_interface has no MPS kernel in the op table: it must not be native
    _, bundles, _ = run(ip, CUDA_CELL + "z = torch.special.zeta(x.abs() + 1.5, x.abs() + 1.0)\n")
    payload = bundles[0][schema.MIME]
    assert payload["simulated"] and payload["target"] == "mps"
    assert payload["counts"]["composite"] + payload["counts"]["fallback"] > 0


def test_unload_restores_torch_and_unregisters_every_callback(ip):
    ip.run_cell(CUDA_CELL)
    router = extension.router()
    ip.run_line_magic("unload_ext", "torch_adapter")
    assert not torch.cuda.is_available() or torch.version.cuda
    for event in ("pre_run_cell", "post_run_cell"):
        assert all(getattr(cb, "__self__", None) is not router for cb in ip.events.callbacks[event])
    assert "adapter" not in ip.magics_manager.magics["line"]
    _, bundles, _ = run(ip, "import torch\ntorch.ones(2) + 1")
    assert bundles == []
    ip.run_line_magic("load_ext", "torch_adapter")  # the fixture unloads again


def test_reload_and_double_load_are_safe(ip):
    ip.run_line_magic("load_ext", "torch_adapter")  # already loaded: no second set of callbacks
    _, bundles, _ = run(ip, CUDA_CELL)
    assert len(bundles) == 1
    ip.run_line_magic("reload_ext", "torch_adapter")
    _, bundles, _ = run(ip, CUDA_CELL)
    assert len(bundles) == 1 and bundles[0][schema.MIME]["session"]["cells"] == 1


def test_an_exception_in_a_cell_leaves_the_adapter_consistent(ip):
    result, bundles, _ = run(ip, CUDA_CELL + "raise ValueError('user error')\n")
    assert not result.success and isinstance(result.error_in_exec, ValueError)
    assert len(bundles) == 1  # the ops it ran before failing are still reported
    result, bundles, _ = run(ip, CUDA_CELL)
    assert result.success and len(bundles) == 1


def test_a_failing_observer_reports_itself_and_the_cell_goes_on(ip):
    def broken(payload):
        raise RuntimeError("observer bug")

    extension.router().listeners.append(broken)
    result, bundles, cap = run(ip, CUDA_CELL + "ok = 42\n")
    assert result.success and ip.user_ns["ok"] == 42
    assert len(bundles) == 1
    assert "torch_adapter: the listener" in cap.stderr and "observer bug" in cap.stderr


@pytest.mark.cpu_kind
def test_adapter_magic_status_target_policy(ip):
    run(ip, CUDA_CELL)
    status = ip.run_line_magic("adapter", "")
    assert status["target"] == "cpu" and status["policy"] == "allow" and status["cells"] == 1
    assert status["schema"] == schema.STATUS_SCHEMA and status["amp_dtype"] == "auto"
    # Shown as lines, not as a dict, with the AMP dtype the policy resolves to on this target.
    shown = ip.display_formatter.format(status)[0]["text/plain"]
    assert "{" not in shown and "target cpu" in shown and "float16 (policy auto" in shown
    # ... and what the trace shows of float16 matmuls: the dtype the CPU computes them in (issue 34)
    from torch_adapter.session import current

    heavy = getattr(getattr(current(), "low_precision", None), "dtype", None)
    clause = "its matmuls, convolutions and attention compute in"
    if heavy is None or heavy is torch.float16:
        assert clause not in shown
    else:
        assert f"{clause} {str(heavy).removeprefix('torch.')} on this CPU, float16 in and out" in shown, shown
    with capture_output() as cap:
        assert ip.run_line_magic("adapter", "policy warn") is None  # no quoted string repr
    assert cap.stdout == "torch_adapter: fallback policy warn\n"
    assert ip.run_line_magic("adapter", "")["policy"] == "warn"
    with capture_output() as cap:
        ip.run_line_magic("adapter", "observe off")
    assert "off" in cap.stdout
    _, bundles, _ = run(ip, CUDA_CELL)
    assert bundles == []
    ip.run_line_magic("adapter", "observe on")


def test_a_target_switch_tells_the_front_end(ip):
    sent = []
    router = extension.router()
    router.publish_status = lambda: sent.append(router.status())  # the comm needs a kernel; see test_jupyter_kernel
    with capture_output() as cap:
        ip.run_line_magic("adapter", "target mps --simulate")
    assert cap.stdout == "torch_adapter: target mps (simulated on cpu)\n"
    assert [(s["target"], s["simulated"]) for s in sent] == [("mps", True)]
    state = extension.front_end_state()
    assert state["status"]["target"] == "mps" and state["payloads"] == list(router.payloads)


@pytest.mark.parametrize("line,match", [
    ("polcy warn", "unknown action 'polcy'"),
    ("policy sometimes", "expected allow, warn or error"),
    ("target", "expected a target name"),
    ("target tpu", r"(?s)%adapter target tpu: expected a target name \(auto, cuda, .*not a backend torch_adapter "
                   r"knows.*Fix: did you mean `%adapter target (xpu|npu)`\? This machine has no (xpu|npu): "
                   r"`%adapter target (xpu|npu) --simulate` previews it here"),
    ("target nup", r"(?s)Fix: did you mean `%adapter target npu`\? This machine has no npu: `%adapter target npu "
                   r"--simulate`"),
    ("target zzzz", r"(?s)Fix: name one of auto, cuda.*`%adapter target NAME --simulate` previews"),
    ("target npu", r"(?s)%adapter target npu: expected a target present on this machine \(this machine has cpu\), "
                   r"got 'npu', which is absent.*Fix: preview npu on this machine: `%adapter target npu --simulate`"),
    ("observe maybe", "expected on or off"),
])
def test_adapter_magic_typos_are_usage_errors(ip, line, match):
    with pytest.raises(UsageError, match=match):
        ip.run_line_magic("adapter", line)


def test_adapter_trace_shows_the_full_table_with_cell_relative_call_sites(ip):
    run(ip, "import torch\nw = torch.randn(4, 4, device='cuda')")
    with capture_output() as cap:
        ip.run_cell_magic("adapter_trace", "", "v = torch.mm(w, w)\nu = v.sum()\n")
    log = ip.user_ns["_adapter_log"]
    ops = {r["op"] for r in log.table()}
    assert "aten::mm" in ops and "aten::sum" in ops
    mm = next(r for r in log.table() if r["op"] == "aten::mm")
    # Line 1 of the cell is %%adapter_trace: the body's first line is the cell's line 2.
    assert mm["site"]["file"].startswith("<ipython-input") and mm["site"]["line"] == 2
    cell = mm["site"]["cell"]
    assert cell == ip.execution_count
    (data,) = [o.data for o in cap.outputs if "text/html" in o.data and "torch-adapter-trace" in o.data["text/html"]]
    # Lab renders application/json first (a JSON tree): the bundle is the table only.
    assert set(data) == {"text/plain", "text/html"}
    assert "aten::mm" in data["text/html"] and f"cell [{cell}], line 2" in data["text/html"]
    assert f"cell [{cell}], line 2" in data["text/plain"] and "ipython-input" not in data["text/plain"]


def test_a_fallback_site_names_the_cell_and_line(ip):
    ip.run_line_magic("adapter", "target mps --simulate")
    _, bundles, _ = run(ip, "import torch\nx = torch.randn(4, 4).cuda()\n"
                            "values, indices = torch.mode((x * 4).round(), dim=1)\n")
    payload = bundles[0][schema.MIME]
    (mode,) = [f for f in payload["top_fallbacks"] if f["op"] == "aten::mode"]
    assert re.fullmatch(r"cell \[\d+\], line 3", mode["site"]), mode["site"]
    assert "cell [" in bundles[0]["text/plain"] and "ipython-input" not in bundles[0]["text/html"]


def test_adapter_compare_interleaves_and_keeps_the_data(ip):
    run(ip, "import torch\nm = torch.nn.Linear(32, 32).cuda()\nxx = torch.randn(16, 32, device='cuda')")
    with capture_output() as cap:
        returned = ip.run_cell_magic("adapter_compare", "--configs redirect,adapted,mps-sim -n 2 --warmup 1 --min-time 0",
                                     "for _ in range(3):\n    m(xx).sum().backward()\n")
    assert returned is None  # no dict of floats echoed under the chart
    result = ip.user_ns["_adapter_compare"]
    assert list(result) == ["redirect", "adapted", "mps-sim"]
    for name, row in result.items():
        assert row["error"] is None and len(row["runs_s"]) == 2 and row["kept"] > 0
    assert result["redirect"]["kept"] == 1.0
    assert extension.router().observing  # restored afterwards
    from torch_adapter.session import current

    assert current().target.name == "cpu" and not current().target.simulated
    (data,) = [o.data for o in cap.outputs if "application/vnd.plotly.v1+json" in o.data]
    assert "application/vnd.jupyter.widget-view+json" not in data  # a saved notebook keeps the chart itself
    fig = data["application/vnd.plotly.v1+json"]
    (bars,) = fig["data"]
    assert bars["x"] == ["redirect", "adapted", "mps-sim"] and bars["y"][0] == 100.0
    assert [round(y, 2) for y in bars["y"]] == [round(result[c]["kept"] * 100, 2) for c in bars["x"]]
    assert len(json.dumps(data)) <= 50_000
    assert data["text/plain"].startswith("throughput kept vs redirect")
    if shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome"):
        assert "src='data:image/png;base64," in data["text/html"]  # the static chart for nbconvert/GitHub
    # the numbers, a second output (JupyterLab draws only the chart of a bundle that has one)
    (table,) = [o.data for o in cap.outputs if "torch-adapter-compare-notes" in o.data.get("text/html", "")]
    for name in ("adapted", "mps-sim"):  # absolute times, run counts and a verdict beside each ratio
        assert re.search(rf"{name}: \d+ % \(\d+-\d+\) +[\d.]+ ms \([\d.]+-[\d.]+\) +2 runs  not resolved",
                         table["text/plain"]), table["text/plain"]
    assert table["text/html"].count("torch-adapter-value") == 3 and "Baseline (100 %): <b>redirect</b>" in table["text/html"]


def test_compare_chart_never_waits_on_a_chrome_that_does_not_answer(tmp_path):
    """A Chrome that never starts (here: a program that sleeps, as kaleido's browser) costs the cell at
    most the start bound, once: the chart's output says why it has no image, the next chart does not try."""
    pytest.importorskip("kaleido")
    hung = tmp_path / "chrome"
    hung.write_text("#!/bin/sh\nsleep 120\n")
    hung.chmod(0o755)
    script = textwrap.dedent("""
        import time
        from torch_adapter.jupyter.compare import summarize
        from torch_adapter_widgets import compare
        compare._CHARTS.START_S = 3
        result = summarize({"redirect": [1.0, 1.1, 0.9, 1.0], "adapted": [2.0, 2.1, 1.9, 2.2]})
        for attempt in (1, 2):
            t = time.perf_counter()
            data = compare.ThroughputComparison(result).chart_bundle()
            print(attempt, round(time.perf_counter() - t, 2), "base64" in data["text/html"], flush=True)
        print(data["text/html"])
    """)
    env = {**os.environ, "BROWSER_PATH": str(hung), "TORCH_ADAPTER_STATIC_CHARTS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second, page = out.stdout.splitlines()[:3]
    n, took, drawn = first.split()
    assert drawn == "False" and 3 <= float(took) < 15, first
    n, took, drawn = second.split()
    assert drawn == "False" and float(took) < 1, second
    assert "no static image: kaleido&#x27;s Chrome did not start in 3 s" in page
    assert "application/vnd.plotly.v1+json" not in page  # (the JSON bundle is a separate key)


def test_adapter_compare_says_why_the_baseline_moved(ip):
    if torch.cuda.is_available() and torch.version.cuda:
        pytest.skip("plain CUDA works on this machine")
    run(ip, "import torch")
    with capture_output() as cap:
        ip.run_cell_magic("adapter_compare", "--configs plain,redirect -n 1 --warmup 0 --min-time 0",
                          "torch.ones(2, device='cuda')\n")
    result = ip.user_ns["_adapter_compare"]
    assert result["redirect"]["error"] is None and result["redirect"]["kept"] == 1.0
    assert result["plain"]["error"] and result["plain"]["median_s"] is None
    (data,) = [o.data for o in cap.outputs if "torch-adapter-compare-notes" in o.data.get("text/html", "")]
    assert "Baseline (100 %): <b>redirect</b> — <b>plain</b>, listed first, could not run here" in data["text/html"]
    assert "plain: could not run" in data["text/plain"]


def test_comparison_rows_are_measurements():
    """The rows' statistics from known runs: median and quartiles, a bootstrap interval of throughput
    kept that the same runs always reproduce, a verdict only where the runs resolve it, stalls named."""
    from torch_adapter.jupyter.compare import summarize

    base = [1.00, 1.02, 0.98, 1.01, 0.99, 1.00, 1.03]
    slow = [2.00, 2.04, 1.96, 2.02, 1.98, 2.00, 2.06]
    same = [1.01, 0.97, 1.03, 0.99, 1.02, 1.00, 0.98]
    noisy = [0.5, 1.5, 0.9, 1.4, 0.6, 1.1, 1.3]
    stall = [1.00, 1.01, 0.99, 1.00, 1.02, 1.01, 9.0]
    rows = summarize({"redirect": base, "adapted": slow, "again": same, "noisy": noisy, "stall": stall,
                      "broken": []}, {"broken": "RuntimeError: no"})
    assert rows["redirect"]["verdict"] == "baseline" and rows["redirect"]["kept"] == 1.0
    a = rows["adapted"]
    assert a["median_s"] == 2.00 and a["q1_s"] == pytest.approx(1.99) and a["q3_s"] == pytest.approx(2.03) and a["n"] == 7
    assert a["kept_low"] < a["kept"] == 0.5 < a["kept_high"] < 0.52
    assert a["verdict"] == f"slower: {a['kept_low'] * 100:.0f}-{a['kept_high'] * 100:.0f} % kept"
    assert summarize({"redirect": base, "adapted": slow})["adapted"]["kept_low"] == a["kept_low"]  # reproducible
    assert rows["again"]["verdict"].startswith("not resolved") and rows["again"]["kept_low"] <= 1.0 <= rows["again"]["kept_high"]
    assert rows["noisy"]["verdict"].startswith("not resolved")
    assert rows["stall"]["outliers"] == [9.0] and not rows["adapted"]["outliers"]
    assert rows["broken"]["verdict"] == "could not run" and rows["broken"]["median_s"] is None
    assert summarize({"a": [1.0, 1.1], "b": [2.0, 2.1]})["b"]["verdict"] == "not resolved (fewer than 3 runs)"


def test_compare_rotates_the_order_and_runs_at_least_min_time():
    """Rounds rotate which configuration runs first; rounds go on until the timed runs add up to
    ``min_time_s`` (a 5 ms cell, 0.2 s: about 40 runs, not -n's 3)."""
    import time as _time

    from torch_adapter.jupyter.compare import compare

    order: list[str] = []
    from torch_adapter.session import current

    def cell():
        s = current()
        order.append("plain" if s is None else "redirect")
        _time.sleep(0.005)

    rows = compare(cell, ["plain", "redirect"], n=3, warmup=1, min_time_s=0.2)
    # the contract is time, not a count: the timed runs add up to min_time_s (however slow a loaded
    # machine makes each), and more runs than -n asked for
    timed = sum(rows["plain"]["runs_s"]) + sum(rows["redirect"]["runs_s"])
    assert rows["plain"]["n"] >= 3 and timed >= 0.2
    # ... and stop once they do: without the last round the runs were short of it
    assert timed - rows["plain"]["runs_s"][-1] - rows["redirect"]["runs_s"][-1] < 0.2
    firsts = order[::2]
    assert "plain" in firsts and "redirect" in firsts  # each takes the first place in some rounds
    assert current() is None


@pytest.mark.parametrize("line,match", [
    ("--configs fast,slow", "unknown configuration 'fast'"),
    ("--configs adapted,adapted", "names a configuration twice"),
    ("-n 0", "expected -n >= 1"),
    ("--min-time -1", "--min-time >= 0"),
])
def test_adapter_compare_bad_arguments(ip, line, match):
    with pytest.raises(UsageError, match=match):
        ip.run_cell_magic("adapter_compare", line, "pass\n")


PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
CONTROLS_GONE = "routing inspector controls: run %adapter_inspector again for them"
HAS_CHROME = any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome"))


def _open_inspector(ip):
    with capture_output() as cap:
        assert ip.run_line_magic("adapter_inspector", "") is None  # displayed once, not echoed again
    return ip.user_ns["_adapter_inspector"], cap


def _outputs(*caps) -> list[dict]:
    """Every display and display update, in order: data, display id, whether it is an update."""
    return [{"data": o.data, "id": (o.transient or {}).get("display_id"), "update": bool(o.update)}
            for cap in caps for o in cap.outputs]


def _last(outputs: list[dict], display_id: str) -> dict:
    """What the output with ``display_id`` shows after the displays and updates in ``outputs``."""
    return [o["data"] for o in outputs if o["id"] == display_id][-1]


def _bars(chart: dict) -> dict[str, list[int]]:
    """The plotly chart's bars: route (each trace's legendgroup) -> one count per cell."""
    return {t["legendgroup"]: t["y"] for t in chart[PLOTLY]["data"]}


def _saved_size(data: dict) -> int:
    """The bytes the output takes in a notebook as nbformat writes it."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%adapter_inspector", outputs=[nbformat.v4.new_output("display_data", data)])]
    empty = nbformat.v4.new_notebook()
    empty.cells = [nbformat.v4.new_code_cell("%adapter_inspector")]
    return len(nbformat.writes(nb).encode()) - len(nbformat.writes(empty).encode())


def test_inspector_chart_and_table_cover_the_same_cells(ip):
    run(ip, CUDA_CELL)  # before the inspector opens: it must still be in the table
    inspector, opened = _open_inspector(ip)
    _, _, plain = run(ip, "q = 1")  # no ops: no update
    ip.run_line_magic("adapter", "target mps --simulate")
    _, _, ran = run(ip, CUDA_CELL + "values, indices = torch.mode((x * 4).round(), dim=1)\n")
    payloads = extension.router().payloads
    assert len(inspector.cells) == len(payloads) == 2
    # The chart's bars, as its output shows them after the last cell, are the payloads' counts, one per cell ...
    outputs = _outputs(opened, plain, ran)
    chart = _last(outputs, inspector.chart_handle.display_id)
    assert _bars(chart) == {r: [p["counts"][r] for p in payloads] for r in ("native", "composite", "fallback")}
    assert chart[PLOTLY]["data"][0]["x"] == [c["label"] for c in inspector.cells] and len(payloads) == 2
    # ... and the table's rows add up to the same totals.
    rows = inspector.rows()
    for route in ("native", "composite", "fallback"):
        assert sum(r["calls"] for r in rows if r["route"] == route) == inspector.totals()[route] == \
            sum(p["counts"][route] for p in payloads)
    # Targets are a column: aten::linear once per target, never mixed.
    linear = [(r["target"], r["route"]) for r in rows if r["op"] == "aten::linear"]
    assert len(linear) == len(set(linear)) == 2 and {t for t, _ in linear} == {"cpu", "mps (simulated)"}
    mode = next(r for r in rows if r["op"] == "aten::mode")
    assert mode["sites"][0].startswith("cell [") and mode["sites"][0].endswith(", line 4")
    inspector.filter.value = "aten::mode"
    assert mode["bytes_copied"] > 0 and f">{format_bytes(mode['bytes_copied'])}</td>" in inspector.table.value


def test_bytes_read_as_the_badge_writes_them():
    from torch_adapter.routing.wording import format_bytes as trace_bytes

    sizes = (0, 1000, 33024, 1536 * 1024)
    assert [format_bytes(n) for n in sizes] == [trace_bytes(n) for n in sizes] == ["0 B", "1000 B", "32.3 KiB", "1.5 MiB"]


def test_registered_and_refused_ops_are_named_so_in_every_rendering(ip):
    ip.run_line_magic("adapter", "target mps --simulate")
    run(ip, "import torch, torch_adapter\nemb = torch.randn(32, 4, device='cuda')\n"
            "h = torch_adapter.register_fallback('aten::_pdist_forward', lambda x, p=2.0: "
            "torch.cdist(x, x, p=p)[tuple(torch.triu_indices(len(x), len(x), 1, device=x.device))])")
    _, bundles, _ = run(ip, "d = torch.pdist(emb)")
    payload = bundles[0][schema.MIME]
    assert payload["version"] == 2 and payload["counts"]["yours"] == 1 and payload["counts"]["fallback"] == 0
    assert [t["op"] for t in payload["top_yours"]] == ["aten::_pdist_forward"] and payload["top_fallbacks"] == []
    assert "1 your implementation" in schema.render_text(payload) and "1 yours" in schema.render_html(payload)
    run(ip, "h.remove()")
    ip.run_line_magic("adapter", "policy error")
    _, bundles, _ = run(ip, "d = torch.pdist(emb)")
    payload = bundles[0][schema.MIME]
    assert (payload["counts"]["refused"], payload["counts"]["fallback"]) == (1, 0)
    assert payload["top_refused"][0]["op"] == "aten::_pdist_forward" and payload["top_fallbacks"] == []
    assert "refused aten::_pdist_forward" in schema.render_text(payload) and "fell back" not in schema.render_html(payload)
    assert payload["session"]["refused"] == 1 and payload["session"]["yours"] == 1
    assert "1 refused" in ip.display_formatter.format(ip.run_line_magic("adapter", ""))[0]["text/plain"]
    ip.run_line_magic("adapter", "policy allow")


def test_inspector_site_column_never_stays_blank(ip):
    """Issue 34: the call-site column was empty on most rows. A row whose site the per-cell trace does
    not record says why (a dash with the reason), the fallback's row names its cell and line."""
    ip.run_line_magic("adapter", "target mps --simulate")
    run(ip, CUDA_CELL + "values, indices = torch.mode((x * 4).round(), dim=1)\n")
    inspector, _ = _open_inspector(ip)
    table = inspector.table.value
    (mode,) = re.findall(r"<tr data-route='fallback'>.*?</tr>", table)
    assert "aten::mode" in mode and re.search(r"cell \[\d+\], line \d+</td></tr>$", mode), mode
    # its reason code, titled with its page (docs/reasons.md), in the row and in the op's details
    assert re.search(r"<code class='torch-adapter-code' title='docs/reasons.md#ta-f\d{3}'>TA-F\d{3}</code>", mode), mode
    inspector.select.value = next(v for _, v in inspector.select.options if v[0] == "aten::mode")
    assert re.search(r">TA-F\d{3}</code> no MPS kernel", inspector.details.value), inspector.details.value
    blank = [row for row in re.findall(r"<tr data-route='\w+'>.*?</tr>", table) if row.endswith("nowrap'></td></tr>")]
    assert not blank
    assert "the per-cell trace records the line of the calls the adapter routes itself" in table


def test_inspector_table_is_capped_filtered_and_sorted(ip):
    run(ip, CUDA_CELL)
    inspector, _ = _open_inspector(ip)
    inspector.max_rows = 3
    inspector._refresh()
    rows = inspector.rows()
    assert len(rows) > 3 and inspector.table.value.count("<tr data-route") == 3
    assert f"{len(rows) - 3} more rows" in inspector.table.value
    assert rows[0]["calls"] >= rows[-1]["calls"]
    inspector.filter.value = "relu"
    assert {r["op"].split(".")[0] for r in inspector.rows()} <= {"aten::relu"}
    inspector.filter.value = ""
    inspector.sort.value = "op"
    assert [r["op"] for r in inspector.rows()] == sorted(r["op"] for r in inspector.rows())
    inspector.target_filter.value = "cpu"
    assert inspector.rows() and {r["target"] for r in inspector.rows()} == {"cpu"}
    inspector.select.value = inspector.select.options[0][1]
    assert "call sites" in inspector.details.value


def test_inspector_chart_is_an_output_of_its_own_that_lasts(ip):
    """Issue 34: the chart was inline SVG inside the widget (stripped from an untrusted notebook, "model
    not found" after a reopen). Now it is an output of its own — plotly's JSON, a static image (or the
    reason there is none) with the totals and the table in its html, a line of text, no widget view —
    that every cell updates (one display id), under 50 kB as a saved notebook stores it."""
    run(ip, CUDA_CELL)
    inspector, opened = _open_inspector(ip)
    first, controls = opened.outputs  # the chart, then the controls
    assert PLOTLY in first.data and WIDGET not in first.data and WIDGET in controls.data
    chart_id, controls_id = first.transient["display_id"], controls.transient["display_id"]
    assert chart_id != controls_id
    caps = [run(ip, CUDA_CELL + f"w{i} = torch.special.zeta(x.abs() + 2, x.abs() + 1).sum()\n")[2] for i in range(3)]
    outputs = _outputs(*caps)
    # Updates, never a new output: per cell, the static image alone (JupyterLab then draws the chart with a
    # new renderer: plotly's ignores a new model once drawn), then the chart.
    updates = [o for o in outputs if o["id"] == chart_id]
    assert [(o["update"], PLOTLY in o["data"]) for o in updates] == [(True, False), (True, True)] * 3
    assert not any(o["id"] == controls_id for o in outputs)  # the live controls are not redrawn
    chart = _last(outputs, chart_id)
    payloads = extension.router().payloads
    assert _bars(chart)["native"] == [p["counts"]["native"] for p in payloads] and len(payloads) == 4
    assert chart["text/plain"] == inspector.text().splitlines()[0]
    assert chart["text/plain"].startswith("torch_adapter RoutingInspector: 4 cells · ")
    page = chart["text/html"]
    assert "<code>aten::" in page and "torch-adapter-table-totals" in page and "4 cells" in page
    if HAS_CHROME:  # the static chart: in the html for nbconvert/GitHub, as image/png for Lab's plotly renderer
        assert "src='data:image/png;base64," in page and chart["image/png"] in page
    else:
        assert "no static image" in page and "image/png" not in chart
    assert _saved_size(chart) <= 50_000
    # The controls' own output, where no widget is drawn (an export), says what they are.
    assert controls.data["text/plain"] == controls.data["text/html"].replace("<code>", "").replace("</code>", "")\
        .split(">", 1)[1].rsplit("<", 1)[0] == CONTROLS_GONE
    # The widget state holds no chart.
    import ipywidgets

    size = len(json.dumps(ipywidgets.Widget.get_manager_state(widgets=[inspector, *inspector.children])))
    assert size < 30_000, size


def test_inspector_chart_stays_under_50_kb_with_many_cells_and_long_names(ip):
    """The chart's output as saved: the newest 60 cells as bars (the totals over all of them), the table's
    first rows; more rows, or no image, only where that keeps it under 50 kB."""
    from torch_adapter_widgets.inspector import MAX_BARS

    inspector, _ = _open_inspector(ip)
    with capture_output() as cap:
        for i in range(MAX_BARS + 12):
            ip.run_cell(f"v{i} = torch.ones(3, device='cuda') * {i}\n", store_history=True)
    chart = _last(_outputs(cap), inspector.chart_handle.display_id)
    x = chart[PLOTLY]["data"][0]["x"]
    assert len(x) == MAX_BARS and x[-1] == f"[{extension.router().payloads[-1]['execution_count']}]"
    assert f"the newest {MAX_BARS} of {MAX_BARS + 12} cells" in chart[PLOTLY]["layout"]["title"]["subtitle"]["text"]
    assert _saved_size(chart) <= 50_000, _saved_size(chart)
    assert "(72 cells)" in chart["text/html"]  # an op's cells column says how many, not all 72


def test_closed_or_replaced_inspector_leaves_no_widget_view(ip):
    """Issue 34: a notebook saved after the kernel lost the widget showed "Error displaying widget: model
    not found". A newer %adapter_inspector and %unload_ext close the controls: their output (its display
    handle) becomes a line saying what it was, with no widget view; the chart's output keeps its last state."""
    run(ip, CUDA_CELL)
    first, one = _open_inspector(ip)
    second, two = _open_inspector(ip)
    outputs = _outputs(one, two)
    chart1, controls1, chart2, controls2 = (o["id"] for o in outputs if not o["update"])
    replaced = _last(outputs, controls1)
    assert WIDGET not in replaced and PLOTLY not in replaced
    assert replaced["text/plain"] == f"{CONTROLS_GONE} (a newer %adapter_inspector replaced them)"
    assert "run <code>%adapter_inspector</code> again for them" in replaced["text/html"]
    assert PLOTLY in _last(outputs, chart1) and first.comm is None and first.table.comm is None
    with capture_output() as cap:
        ip.run_line_magic("unload_ext", "torch_adapter")
    (gone,) = _outputs(cap)  # the second's controls, and nothing else: the charts stay as they were
    assert gone["id"] == controls2 and gone["update"] and WIDGET not in gone["data"]
    assert gone["data"]["text/plain"] == f"{CONTROLS_GONE} (the extension was unloaded)"
    assert second.comm is None and second.rows()  # closed, its data still there
    ip.run_line_magic("load_ext", "torch_adapter")  # (the fixture unloads it)


def test_inspector_footer_names_the_object_the_user_has(ip):
    """Issue 34: the footer named ``inspector.rows()``, which a notebook does not have."""
    run(ip, CUDA_CELL)
    inspector, _ = _open_inspector(ip)
    inspector.max_rows = 3
    inspector._refresh()
    more = re.search(r"(\d+) more rows: filter or sort to see them \(<code>(\w+)\.rows\(\)</code> has them all\)",
                     inspector.table.value)
    assert more and more.group(2) == "_adapter_inspector", inspector.table.value
    result = ip.run_cell(f"_n_rows = len({more.group(2)}.rows())")
    assert result.success and ip.user_ns["_n_rows"] == 3 + int(more.group(1))


def test_inspector_without_plotly_still_shows_its_numbers(ip, monkeypatch):
    """A chart that cannot be drawn (here: plotly not importable) never fails the cell: the chart's output
    keeps its totals, table and text, and says why there is no chart."""
    inspector, _ = _open_inspector(ip)
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    result, _, cap = run(ip, CUDA_CELL)
    assert result.success
    chart = _last(_outputs(cap), inspector.chart_handle.display_id)
    assert PLOTLY not in chart and "chart not drawn: ModuleNotFoundError" in chart["text/plain"]
    assert "aten::linear" in chart["text/html"] and "torch-adapter-table-totals" in chart["text/html"]


def test_adapter_check_shows_the_report_inline(ip, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\nimport flash_attn\n")
    with capture_output() as cap:
        report = ip.run_line_magic("adapter_check", str(script))
    lines = {(f.rule_id if hasattr(f, "rule_id") else f.rule, f.start_line) for f in report.findings}
    assert any(line == 2 for _, line in lines) and any(line == 3 for _, line in lines)
    html = next(o.data["text/html"] for o in cap.outputs if "text/html" in o.data)
    assert html.startswith("<iframe") and "srcdoc=" in html
    with pytest.raises(UsageError, match="no such path"):
        ip.run_line_magic("adapter_check", str(tmp_path / "missing"))


def test_dtype_findings_are_their_own_kind_in_the_pill_trace_and_inspector(ip):
    ip.run_line_magic("adapter", "target mps --simulate")
    with pytest.raises(TypeError, match="Cannot convert a MPS Tensor to float64"):  # the default: as MPS raises
        ip.run_cell("import torch\nx = torch.ones(3, dtype=torch.float64, device='cuda')\n").raise_error()
    ip.run_line_magic("adapter", "dtypes record")
    result, bundles, _ = run(ip, "import torch\nx = torch.ones(3, dtype=torch.float64, device='cuda')\ny = x * 2\n")
    assert result.success
    payload = bundles[-1][schema.MIME]
    d = payload["dtypes"]
    assert d["judged"] and d["calls"] >= 2 and {f["dtype"] for f in d["findings"]} == {"float64"}
    assert all(re.fullmatch(r"cell \[\d+\], line [23]", f["site"]) for f in d["findings"])
    assert "dtype refused" in bundles[-1]["text/plain"] and "dtype float64 not on mps" in bundles[-1]["text/plain"]
    assert sum(payload["counts"].values()) == sum(payload["counts"][r] for r in schema.ROUTES)  # not a route
    with capture_output() as cap:
        ip.run_cell("%%adapter_trace\nz = torch.zeros(2, device='cuda').double()\n")
    assert any("dtype float64" in o.data.get("text/html", "") for o in cap.outputs)
    inspector, _ = _open_inspector(ip)
    assert "dtype float64 not on mps" in inspector.text() and "dtype refused" in inspector.html()
    ip.run_line_magic("adapter", "dtypes raise")
    ip.run_line_magic("adapter", "target npu --simulate")
    _, bundles, _ = run(ip, "x = torch.ones(3, dtype=torch.float64, device='cuda')\n")
    assert bundles[-1][schema.MIME]["dtypes"]["judged"] is False
    assert "dtypes not judged" in bundles[-1]["text/plain"]
    ip.run_line_magic("adapter", "target auto")


def test_each_inspector_replaces_the_last_ones_listener(ip):
    """Before: every %adapter_inspector added a listener that stayed (n inspectors, n updates a cell)."""
    router = extension._ROUTER
    before = len(router.listeners)
    first, _ = _open_inspector(ip)
    second, _ = _open_inspector(ip)
    assert len(router.listeners) == before + 1 and second._on_cell in router.listeners
    run(ip, CUDA_CELL)
    assert len(second.cells) == 1 and len(first.cells) == 0  # the earlier one keeps what it showed
    second.close()
    assert len(router.listeners) == before
    third, _ = _open_inspector(ip)
    ip.run_line_magic("unload_ext", "torch_adapter")
    assert router.listeners == []


def test_the_kept_cells_are_bounded_and_a_refresh_gets_each_cells_latest(ip):
    """Before: payloads and op tables grew for the kernel's life, and front_end_state sent them all."""
    router = extension.router()
    for i in range(3):  # one cell run three times: one badge's worth in a refresh
        ip.run_cell("torch.ones(2, device='cuda') + 1", cell_id="same-cell")
    state = extension.front_end_state()
    assert [p["cell_id"] for p in state["payloads"]].count("same-cell") == 1
    assert state["payloads"][-1]["execution_count"] == router.payloads[-1]["execution_count"]
    with capture_output():
        for i in range(extension.KEEP_CELLS + 20):
            ip.run_cell("torch.ones(1, device='cuda')", cell_id=f"cell-{i}")
    assert len(router.payloads) == len(router.tables) == extension.KEEP_CELLS
    assert router.payloads[-1]["cell_id"] == f"cell-{extension.KEEP_CELLS + 19}"
    assert len(extension.front_end_state()["payloads"]) == extension.KEEP_CELLS


def test_a_cell_says_what_it_compiled(ip):
    """Issue 35, item 4 in a notebook: a cell that ran compiled code says what compiled (its ops are not
    counted per op), even when no aten op ran eagerly; a later cell that compiles nothing says nothing
    of it."""
    import torch

    torch._dynamo.reset()
    run(ip, "import torch\nx = torch.randn(8).cuda()\n@torch.compile\ndef twice_sin(a):\n    return (a * 2).sin().sum()\n")
    _, bundles, _ = run(ip, "y = twice_sin(x)")
    (data,) = bundles
    compiled = data[schema.MIME]["compiled"]
    assert compiled["graphs"] == 1 and compiled["graph_breaks"] == 0 and compiled["failures"] == 0
    assert compiled["line"].startswith("compiled: 1 graph (twice_sin, cell [") and "not counted per op" in compiled["line"]
    assert compiled["line"] in data["text/plain"] and "torch-adapter-compiled" in data["text/html"]
    _, again, _ = run(ip, "y = twice_sin(x)\nz = x + 1")  # compiled already: the cell reports its eager op only
    (data,) = again
    assert "compiled" not in data[schema.MIME] and "compiled:" not in data["text/plain"]
    torch._dynamo.reset()


def test_adapter_redirects_shows_the_migration_log_per_cell_line(ip):
    """Issue 36, item 2 in a notebook: each rewritten call of the session once per site — its cell and
    line, its source line, what it became, its class and code — as a table and as text."""
    run(ip, "import torch\nx = torch.ones(3).cuda()\nfor _ in range(2):\n    torch.cuda.synchronize()\n")
    view = ip.run_line_magic("adapter", "redirects")
    rows = {r["asked"]: r for r in view.rows() if r["source"] in ("x = torch.ones(3).cuda()", "torch.cuda.synchronize()")}
    cuda, sync = rows["Tensor.cuda()"], rows["torch.cuda.synchronize()"]
    assert re.fullmatch(r"cell \[\d+\], line 2", cuda["site"]), cuda
    assert (cuda["class"], cuda["code"], cuda["count"]) == ("changed", "TA-X001", 1)
    assert re.fullmatch(r"cell \[\d+\], line 4", sync["site"]), sync
    assert (sync["class"], sync["code"], sync["count"]) == ("dummy", "TA-X014", 2)
    text = ip.display_formatter.format(view)[0]["text/plain"]
    assert f"{cuda['site']}: Tensor.cuda() ×1 → cpu [TA-X001 changed]  | x = torch.ones(3).cuda()" in text
    page = view._repr_html_()
    assert "<code>x = torch.ones(3).cuda()</code>" in page and "title=\"docs/reasons.md#ta-x014\"" in page
    assert "ipykernel" not in page and "/tmp/" not in text  # no kernel temp file names a cell
